"""Deadline-aware pacing: a node that would wait for the slowest one runs at the frequency of
least predicted energy that still meets the round's deadline (b* and the cap are kept).

``pacing_cells`` measures, lazily and cached, the cells of b*'s row pacing needs;
``plan_pacing`` picks the frequency; ``pacing_metrics`` is the round's pacing report.
No Flower import.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fl_client import selector
from fl_client.lut import LUT, load_on_demand, merge_cells, on_demand_key, save_quietly
from fl_client.profiler import MeasureContext, add_measured_cell


@dataclass(frozen=True)
class PacingWork:
    """The round's local work as pacing sees it.

    ``samples`` is the round's training samples; ``deadline_s`` the round's deadline (None:
    none yet, run at f*); ``margin`` the share of the deadline kept in reserve against noise;
    ``time_calibration`` the node's measured / LUT-predicted time of its last round;
    ``idle_power_w`` the board's idle power (0: unknown); ``reserved_s`` device time this
    round spent before training (e.g. measuring cells for pacing).
    """

    samples: float
    deadline_s: float | None
    margin: float = 0.05
    time_calibration: float = 1.0
    idle_power_w: float = 0.0
    reserved_s: float = 0.0

    @property
    def budget_s(self) -> float:
        """The deadline less its margin (inf without a deadline)."""
        return math.inf if self.deadline_s is None else self.deadline_s * (1.0 - self.margin)


@dataclass(frozen=True)
class PacePlan:
    """The frequency a paced node runs at, and what its LUT predicts there and at f*.

    Times and energies are for the round's local work, from the LUT (time per sample ×
    samples × ``time_calibration``; energy = average power × that time).
    """

    freq_mhz: float
    predicted_time_s: float
    predicted_energy_j: float
    fastest_time_s: float  # at f*
    fastest_energy_j: float  # at f*
    meets_deadline: bool


def freq_index(freqs_mhz: tuple[float, ...], freq_mhz: float) -> int:
    return min(range(len(freqs_mhz)), key=lambda j: abs(freqs_mhz[j] - freq_mhz))


def plan_pacing(
    lut: LUT,
    batch_size: int,
    f_star_mhz: float,
    limit: selector.PowerLimit,
    work: PacingWork,
    *,
    rule: selector.SelectionRule = selector.DEFAULT_RULE,
) -> PacePlan:
    """Deadline-aware pacing: the frequency of least predicted energy that meets the deadline.

    Candidates are the measured frequencies of ``batch_size``'s row at or below f* that are
    feasible under ``limit`` (the cap with its margin) by the selector's own rule
    (``selector.feasible_cells``: each cell's peak + ``rule.peak_sigma_k``·σ of its
    per-step peaks, so a noisy cell costs that cell, not the cells below it), and f*
    itself. Pacing only ever slows a node down: b* and the cap are kept. A candidate meets
    the deadline when ``reserved_s`` (device time this round spent before training, e.g.
    measuring cells for pacing) plus its predicted time is ≤ ``deadline_s × (1 − margin)``;
    among those the one with the least predicted energy (LUT average power × time) wins.
    Without a deadline, or when no candidate meets it, the node runs at f* (its fastest).

    In a synchronous round a node that finishes early idles until the round ends, so its
    energy over the round is ``(P_avg(f) − P_idle) · t(f) + P_idle · T`` with T the round's
    length: the frequency chosen minimises ``(P_avg − idle_power_w) · t``. With
    ``idle_power_w`` 0 (unknown) that is the training energy alone.
    """
    i = lut.batch_sizes.index(batch_size)
    j_star = freq_index(lut.freqs_mhz, f_star_mhz)
    row_t, row_avg = lut.time_per_sample_s[i], lut.avg_power_w[i]
    if math.isnan(row_t[j_star]):
        raise ValueError(f"gpu-freq-mhz: the LUT has no cell at b={batch_size}, f*={f_star_mhz:g}")
    feasible = selector.feasible_cells(
        lut.peak_power_w[i],
        limit,
        peak_sigma_w=lut.peak_sigma_w[i],
        peak_sigma_k=rule.peak_sigma_k,
    )  # False where not measured
    cands = [j for j in range(j_star) if feasible[j]]
    cands.append(j_star)

    samples, idle_power_w, reserved_s = work.samples, work.idle_power_w, work.reserved_s
    deadline_s = work.deadline_s

    def time_s(j: int) -> float:
        return float(row_t[j]) * samples * work.time_calibration

    def energy_j(j: int) -> float:
        return float(row_avg[j]) * time_s(j)

    def energy_above_idle_j(j: int) -> float:
        return (float(row_avg[j]) - idle_power_w) * time_s(j)

    chosen, meets = j_star, deadline_s is None
    if deadline_s is not None:
        budget_s = work.budget_s - reserved_s
        meeting = [j for j in cands if time_s(j) <= budget_s]
        if meeting:
            chosen, meets = min(meeting, key=lambda j: (energy_above_idle_j(j), -j)), True
        else:
            meets = reserved_s + time_s(j_star) <= deadline_s
    return PacePlan(
        freq_mhz=float(lut.freqs_mhz[chosen]),
        predicted_time_s=time_s(chosen),
        predicted_energy_j=energy_j(chosen),
        fastest_time_s=time_s(j_star),
        fastest_energy_j=energy_j(j_star),
        meets_deadline=meets,
    )


#: The pacing walk stops once a cell's predicted energy above idle is this share above the
#: least found so far: energy over f has one minimum (static power × time grows as f falls,
#: dynamic energy shrinks), and a measured cell is noisy by a few percent, so a smaller rise
#: is not yet proof of having passed the minimum.
PACING_ENERGY_RISE_STOP = 0.05


def pacing_walk(
    lut: LUT,
    batch_size: int,
    f_star_mhz: float,
    budget_s: float,
    measure: Callable[[float], tuple[LUT, float]],
    *,
    samples: float,
    cell_samples: int,
    idle_power_w: float = 0.0,
) -> LUT:
    """The cells pacing can use: b*'s row from f* down while slowing down can still pay.

    Walks b*'s row one frequency at a time from f* down. A cell the LUT lacks is measured
    (``measure(freq_mhz)`` returns the LUT with that cell and the device time it took)
    only if, after what this walk already measured, measuring it (``cell_samples``: warm-up
    and measured steps × b, at most the next higher frequency's time per sample × their f
    ratio, as time = a + c/f with a ≥ 0) and then training (``samples``: the round's samples
    × time calibration) at the next higher frequency still fit in ``budget_s`` (the
    deadline less its margin). So measuring never makes a node the round's straggler: the
    frequency above always remains to run at; what does not fit this round is measured in
    a later one.

    The walk stops at the first frequency the node cannot afford to measure, whose time
    does not fit ``budget_s`` (time rises as f falls, so no lower frequency fits either; a
    node whose f* already misses it measures nothing), or whose predicted energy per sample
    above ``idle_power_w`` is ``PACING_ENERGY_RISE_STOP`` above the least seen (past the
    energy minimum lower frequencies only cost more). Cells already in ``lut`` cost
    nothing, so with a cache only a looser deadline measures anything new. Returns the LUT
    with every cell the walk measured.
    """
    i = lut.batch_sizes.index(batch_size)
    least_j = math.inf
    spent_s = 0.0
    j_star = freq_index(lut.freqs_mhz, f_star_mhz)
    for j in range(j_star, -1, -1):
        if math.isnan(lut.time_per_sample_s[i, j]):
            above = float(lut.time_per_sample_s[i, j + 1])
            bound = above * lut.freqs_mhz[j + 1] / lut.freqs_mhz[j]
            if spent_s + cell_samples * bound + samples * above > budget_s:
                break
            lut, cell_s = measure(lut.freqs_mhz[j])
            spent_s += cell_s
        t = float(lut.time_per_sample_s[i, j])
        if not spent_s + samples * t <= budget_s:
            break
        energy_j = (float(lut.avg_power_w[i, j]) - idle_power_w) * t
        if energy_j > least_j * (1.0 + PACING_ENERGY_RISE_STOP):
            break
        least_j = min(least_j, energy_j)
    return lut


@dataclass(frozen=True)
class PacingCells:
    """What pacing plans from: the LUT with the on-demand cells, and what measuring cost."""

    plan_lut: LUT  # the selection LUT, gaps filled from ``cells``
    cells: LUT | None  # this node's on-demand cells (cached), None if there are none
    time_s: float  # device time and energy of the cells measured this round
    energy_j: float
    measured: int  # how many cells were measured this round


def pacing_cells(
    ctx: MeasureContext, lut: LUT, choice: selector.Selection, work: PacingWork
) -> PacingCells:
    """``lut`` with the cells of b*'s row that pacing needs, measured lazily and cached.

    Without a deadline (round 1) nothing is measured: pacing runs at f*, whose cell the LUT
    has. With one, ``pacing_walk`` goes down b*'s row from f* (reusing the cells efficient
    profiling measured); new cells go to this node's on-demand cache, kept apart from the
    selection LUT so they never change (b*, f*).
    """
    cells = load_on_demand(ctx.cache_dir, ctx.device, ctx.workload, lut.batch_sizes)
    plan = lut if cells is None else merge_cells(lut, cells, overwrite=False)
    if work.deadline_s is None:
        return PacingCells(plan, cells, 0.0, 0.0, 0)
    step = ctx.step_factory(choice.batch_size)
    time_s = energy_j = 0.0
    measured = 0

    def measure(freq_mhz: float) -> tuple[LUT, float]:
        nonlocal cells, time_s, energy_j, measured
        cells, cell_time_s, cell_energy_j = add_measured_cell(
            cells, lut, ctx.device, ctx.workload, (choice.batch_size, freq_mhz), step
        )
        time_s, energy_j, measured = time_s + cell_time_s, energy_j + cell_energy_j, measured + 1
        return merge_cells(lut, cells, overwrite=False), cell_time_s

    plan = pacing_walk(
        plan,
        choice.batch_size,
        choice.freq_mhz,
        work.budget_s,
        measure,
        samples=work.samples * work.time_calibration,
        cell_samples=(lut.warmup_steps + lut.steps) * choice.batch_size,
        idle_power_w=work.idle_power_w,
    )
    if cells is not None and measured:
        key = on_demand_key(ctx.device, ctx.workload, lut.batch_sizes)
        save_quietly(cells, key.path(ctx.cache_dir))
    return PacingCells(plan, cells, time_s, energy_j, measured)


def pacing_metrics(
    pace: PacePlan,
    f_star_mhz: float,
    time_s: float,
    energy_j: float,
    deadline_s: float | None,
    idle_power_w: float = 0.0,
) -> dict[str, float]:
    """Per-round pacing report.

    ``predicted-energy-saved-j`` is a prediction, not a measurement: the node never runs at
    f* in a paced round, so what f* would have used comes from its LUT cell. It counts the
    whole round: running at f* would have finished sooner and then idled at
    ``idle_power_w`` for the difference, so the saving is
    ``E(f*) − E(f) + P_idle · (t(f) − t(f*))`` (0 W: training energy alone), with E(f) and
    t(f) measured and E(f*), t(f*) the LUT's cell at f* scaled by how the measurement at the
    frequency run compares with its own LUT cell (a LUT off by a constant factor, such as a
    partial last batch, cancels out). Each LUT cell comes from a few profiled steps and is
    noisy by about a percent in time and power, as much as the few percent a paced node
    saves, so a single node's prediction can be off by more than its size; a paired run
    with pacing off measures the saving itself. ``fastest-time-s`` (the node's local time
    at f*, from which the server sets the next deadline) is predicted the same way; at f*
    both are the measurement itself and 0.
    """
    time_ratio = time_s / pace.predicted_time_s if pace.predicted_time_s > 0 else 1.0
    energy_ratio = energy_j / pace.predicted_energy_j if pace.predicted_energy_j > 0 else 1.0
    fastest_time_s = pace.fastest_time_s * time_ratio
    saved_j = (
        pace.fastest_energy_j * energy_ratio - energy_j + idle_power_w * (time_s - fastest_time_s)
    )
    out = {
        "f-star-mhz": float(f_star_mhz),
        "fastest-time-s": fastest_time_s,
        "predicted-energy-saved-j": 0.0 if pace.freq_mhz == f_star_mhz else saved_j,
    }
    if deadline_s is not None:
        out["deadline-s"] = deadline_s
        out["slack-s"] = deadline_s - time_s
        out["deadline-miss"] = float(time_s > deadline_s)
    return out
