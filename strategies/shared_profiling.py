"""Fleet-shared profiling: one LUT per node kind, measured in slices by the kind's nodes.

Nodes of one kind (device kind, backend, model, input shape, B, frequency table) see the
same LUT up to unit-to-unit spread, so they measure it together, in a few exchanges:

1. **seed** — a few cells spread over the (b, f) grid (``fl_client.lut_plan.seed_cells``,
   8 by default), dealt round-robin to the kind's nodes, so each measures a disjoint slice;
2. **confirm** (up to three times) — a fit of time and power to the cells measured so
   far (``fl_client.lut_fit.fit_lut``) says, per distinct cap of the kind, where it is
   unsure (``confirm_requests``); one such cell per cap and exchange goes to a node under
   that cap, from a pool of ``cells_per_cap`` per distinct cap shared by the kind's caps.

The kind's LUT holds the measured cells only (the median where slices overlap): a fitted
cell never decides anything, and every node then checks its own chosen cell on its own
board (``shared-verify``: with its training steps, or before it trains; ``fl_client.node``).

This module is the planning (``exchanges``): plain Python over the fleet's descriptors, no
Flower import. ``strategies.shared_exchange`` runs the exchanges over Flower messages,
aggregates the profiled updates with the run's ``aggregation`` and keeps the kinds' LUTs
and what they cost.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from fl_client.contract import Cap, CellsReport, NodeDescriptor
from fl_client.feasibility import robust_peak_w
from fl_client.lut import LUT, KindKey
from fl_client.lut_cells import median_cell
from fl_client.lut_fit import fit_lut
from fl_client.lut_plan import BF, GridCell, PlanOptions, next_cell, seed_cells
from fl_client.power import PowerLimit


@dataclass(frozen=True)
class SharedOptions:
    """Budgets of fleet-shared profiling (run settings ``shared-seed-cells`` and
    ``shared-cells-per-cap``)."""

    seed_cells: int = 8
    cells_per_cap: int = 2
    tie_tolerance: float = 0.02
    #: ``peak-sigma-k``: a measured cell is feasible when peak + k·σ is below the limit
    peak_sigma_k: float = 2.0
    #: Confirm exchanges after the seeds (at most; each adds one synchronous step to round
    #: 1, and none is sent once every cap is settled or the pool is spent)
    confirm_exchanges: int = 3


@dataclass
class KindProfile:
    """One kind's nodes, their caps, and the cells measured for it so far."""

    kind: KindKey
    nodes: list[int]
    caps: dict[int, list[tuple[Cap, float]]]  # node -> every (cap, cap-margin) it runs under
    #: per cell, every measurement of it: (time per sample, peak, average power, σ)
    measured: dict[BF, list[tuple[float, ...]]] = field(default_factory=dict)
    spent: dict[PowerLimit, int] = field(default_factory=dict)  # cap with margin -> cells
    #: cap with its margin -> the (row, column) of the last confirm cell asked for it
    last: dict[PowerLimit, GridCell] = field(default_factory=dict)
    #: The lowest frequency the seeds go to: the lowest of its nodes' ``profile-floor-mhz``
    #: (0: a node without one, seeds over the whole grid)
    floor_mhz: float = 0.0

    def add(self, report: CellsReport) -> None:
        """Cells a node measured (failed measurements — not finite or ≤ 0 — are dropped)."""
        for b, f, values in report.measurements():
            if all(math.isfinite(x) and x > 0 for x in values[:3]):
                self.measured.setdefault((b, f), []).append(values)

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Time per sample, peak and average power and σ of the per-step peaks, NaN where
        not measured; where several nodes measured a cell, ``lut_cells.median_cell`` of them."""
        b, f = self.kind.batch_sizes, self.kind.knob_values
        out = [np.full((len(b), len(f)), np.nan) for _ in range(4)]
        for (bb, ff), values in self.measured.items():
            i, j = b.index(bb), f.index(ff)
            for k, value in enumerate(median_cell(values)):
                out[k][i, j] = value
        return out[0], out[1], out[2], out[3]

    def lut(self, profile_time_s: float, profile_energy_j: float) -> LUT | None:
        """The kind's shared LUT, or None when nothing was measured."""
        if not self.measured:
            return None
        time_s, peak_w, avg_w, sigma_w = self.tables()
        k = self.kind
        return LUT(
            device_kind=k.device_kind,
            backend=k.backend,
            model_name=k.model_name,
            input_shape=k.input_shape,
            batch_sizes=k.batch_sizes,
            knob_values=k.knob_values,
            time_per_sample_s=time_s,
            peak_power_w=peak_w,
            avg_power_w=avg_w,
            peak_sigma_w=sigma_w,
            profile_time_s=profile_time_s,
            profile_energy_j=profile_energy_j,
            grid="shared",
        )


def kinds_of(
    fleet: Mapping[int, NodeDescriptor],
    batch_sizes: Mapping[int, Sequence[int]],
    model: str,
    input_shape: tuple[int, ...],
) -> dict[KindKey, KindProfile]:
    """The fleet grouped by kind, each node with every cap it runs under (its schedule's)."""
    kinds: dict[KindKey, KindProfile] = {}
    for node_id in sorted(fleet, key=lambda n: (fleet[n].node_name, n)):
        d = fleet[node_id]
        kind = KindKey(
            d.device,
            d.backend,
            model,
            tuple(input_shape),
            tuple(batch_sizes[node_id]),
            tuple(d.knob_values),
        )
        prof = kinds.setdefault(kind, KindProfile(kind, [], {}, floor_mhz=d.profile_floor_mhz))
        prof.floor_mhz = min(prof.floor_mhz, d.profile_floor_mhz)
        prof.nodes.append(node_id)
        prof.caps[node_id] = [(cap, d.cap_margin) for cap in d.all_caps()]
    return kinds


def cell_cost(cell: BF) -> float:
    """Relative device time of measuring a cell: its steps process ∝ b samples, each taking
    ∝ 1/f when the GPU clock binds (an upper bound where it does not)."""
    b, f = cell
    return b / f


def cheap_seeds(
    batch_sizes: Sequence[int], knob_values: Sequence[float], count: int, floor_mhz: float = 0.0
) -> list[BF]:
    """``lut_plan.seed_cells`` over the frequencies at or above ``floor_mhz`` (the kind's
    lowest B1 band frequency: no cap of the kind has its choice below it, and the cells
    there are the dearest to measure, every step at the slowest clocks), with one more
    expensive corner moved: the largest b at the lowest f is never a choice, so its row is
    seeded at the middle of the seeded band instead (the first f ≥ (f_low + f_max) / 2).
    The confirm exchanges measure lower in that row where the fit puts a cap's choice
    there, and below the floor too."""
    lowest = next((j for j, f in enumerate(knob_values) if f >= floor_mhz), 0)
    lowest = min(lowest, max(len(knob_values) - 2, 0))  # at least two frequencies to fit
    freqs = list(knob_values[lowest:])
    f_min_useful = next(j for j, f in enumerate(freqs) if f >= (freqs[0] + freqs[-1]) / 2)
    out: list[BF] = []
    for i, j in seed_cells(len(batch_sizes), len(freqs), count):
        if i == len(batch_sizes) - 1 and j < f_min_useful and len(batch_sizes) > 1:
            j = f_min_useful
        cell = (batch_sizes[i], freqs[j])
        if cell not in out:
            out.append(cell)
    return out


def deal(cells: Sequence[BF], nodes: Sequence[int], load: dict[int, float]) -> dict[int, list[BF]]:
    """Cells to nodes, costliest first, each to the node with the least load so far (the
    exchange lasts as long as its busiest node), ties to the node first in ``nodes`` (the
    kind's nodes by name: the same slices in every run, whatever ids Flower gives the
    nodes); ``load`` is updated."""
    out: dict[int, list[BF]] = defaultdict(list)
    order = {n: i for i, n in enumerate(nodes)}
    for cell in sorted(cells, key=cell_cost, reverse=True):
        node = min(nodes, key=lambda n: (load.get(n, 0.0), order[n]))
        out[node].append(cell)
        load[node] = load.get(node, 0.0) + cell_cost(cell)
    return out


def seed_requests(kinds: Mapping[KindKey, KindProfile], opts: SharedOptions) -> dict[int, list[BF]]:
    """Exchange 1: each kind's seed cells (``cheap_seeds``) dealt over its nodes in disjoint
    slices of about equal device time."""
    out: dict[int, list[BF]] = {}
    for prof in kinds.values():
        seeds = cheap_seeds(
            prof.kind.batch_sizes, prof.kind.knob_values, opts.seed_cells, prof.floor_mhz
        )
        out.update(deal(seeds, prof.nodes, {}))
    return out


def exchanges(
    kinds: Mapping[KindKey, KindProfile],
    r_of: Mapping[KindKey, Sequence[float]],
    opts: SharedOptions,
) -> Iterator[dict[int, list[BF]]]:
    """The requests of each exchange in turn: the seeds, then up to
    ``opts.confirm_exchanges`` confirm exchanges, ending early once no cap asks for a cell.

    The caller measures each exchange's requests and adds the replies to ``kinds`` before
    asking for the next one: a confirm exchange is planned from what was measured so far.
    """
    yield seed_requests(kinds, opts)
    for _ in range(opts.confirm_exchanges):
        confirm = confirm_requests(kinds, r_of, opts)
        if not confirm:
            return
        yield confirm


def confirm_requests(
    kinds: Mapping[KindKey, KindProfile],
    r_of: Mapping[KindKey, Sequence[float]],
    opts: SharedOptions,
) -> dict[int, list[BF]]:
    """One confirm exchange: per distinct cap of a kind, ONE cell where a fit to the
    kind's measured cells is unsure, measured by a node under that cap:

    * when the cell last asked for this cap was measured over it (peak + k·σ, the
      selection rule), the next lower frequency of its row: the boundary of the row the
      fit found best, where it was too hopeful;
    * else the cell ``lut_plan.next_cell`` names, as ``plan_cells`` chooses: the fit's Eq. 4
      choice when not measured yet; else the unmeasured cell with the best chance, by the
      fit and its uncertainty, of being feasible and better than the best measured one;
      else the cell above the best measured one in its row while it may be feasible;
    * else nothing: the cap is settled.

    Called once per exchange (``SharedOptions.confirm_exchanges``), refitting each time.
    The kind's caps draw on one pool of ``cells_per_cap`` × distinct caps cells: a settled
    cap leaves its share to a cap the fit is still unsure of.
    """
    out: dict[int, list[BF]] = defaultdict(list)
    load: dict[int, float] = {}
    plan = PlanOptions(tie_tolerance=opts.tie_tolerance)
    for kind, prof in kinds.items():
        time_s, peak_w, avg_w, sigma_w = prof.tables()
        robust_w = robust_peak_w(peak_w, sigma_w, opts.peak_sigma_k)  # the selector's rule
        if np.count_nonzero(~np.isnan(time_s)) < 2:
            continue  # too little to fit: the kind's nodes profile their own
        fit = fit_lut(kind.batch_sizes, kind.knob_values, time_s, peak_w, avg_w)
        by_limit: dict[PowerLimit, list[int]] = defaultdict(list)
        for node_id, caps in prof.caps.items():
            for cap, margin in caps:
                by_limit[cap.with_margin(margin)].append(node_id)
        tried = ~np.isnan(time_s)  # a cell whose measurement failed may be asked again
        for limit, nodes in sorted(by_limit.items(), key=lambda kv: kv[0].limit_w):
            if sum(prof.spent.values()) >= opts.cells_per_cap * len(by_limit):
                break  # the kind's pool of confirm cells is spent
            tables = (time_s, robust_w, avg_w)
            fitted = partial(next_cell, fit, tables, tried, r=r_of[prof.kind], options=plan)
            cell = _confirm_cell(prof, robust_w, tried, limit, fitted)
            if cell is None:
                continue
            i, j = cell
            tried[i, j] = True
            prof.last[limit] = cell
            prof.spent[limit] = prof.spent.get(limit, 0) + 1
            todo = [(kind.batch_sizes[i], kind.knob_values[j])]
            for node, assigned in deal(todo, nodes, load).items():
                out[node].extend(assigned)
    return dict(out)


def waiting_cell(
    measured: Iterable[tuple[int, float, tuple[float, ...]]],
    limits: Sequence[PowerLimit],
    gap_s: float,
    peak_sigma_k: float,
) -> tuple[BF, int] | None:
    """The cell a node trains at while it waits ``gap_s`` of device time for its kind's
    LUT (``fedbuff`` on the devices' time), and how many steps fit in the gap: of the
    ``measured`` cells (``CellsReport.measurements``: those known when the gap begins), the
    one with the least measured time per sample whose robust peak (peak + k·σ, the
    selection rule) is below every limit the node runs under; the steps are the gap over
    that cell's measured step time, rounded down. None: no cell is feasible, or no step
    fits."""
    best: tuple[BF, float] | None = None
    for b, f, (time_per_sample_s, peak_w, _avg_w, sigma_w) in measured:
        if not (math.isfinite(time_per_sample_s) and time_per_sample_s > 0):
            continue
        if not math.isfinite(peak_w):
            continue
        robust_w = float(robust_peak_w(peak_w, sigma_w, peak_sigma_k))
        if any(robust_w >= limit.limit_w for limit in limits):
            continue
        if best is None or time_per_sample_s < best[1]:
            best = ((b, f), time_per_sample_s)
    if best is None:
        return None
    (b, f), time_per_sample_s = best
    steps = math.floor(gap_s / (time_per_sample_s * b))
    return ((b, f), steps) if steps >= 1 else None


def _confirm_cell(
    prof: KindProfile,
    robust_w: np.ndarray,
    tried: np.ndarray,
    limit: PowerLimit,
    fitted_next: Callable[[PowerLimit], GridCell | None],
) -> tuple[int, int] | None:
    """The (row, column) ``confirm_requests`` asks for next for one cap with its margin:
    the cell below the last one asked for when that one proved over the cap (``robust_w``,
    the robust peak), else the fit's next cell (``fitted_next``: ``next_cell``)."""
    prev = prof.last.get(limit)
    if prev is not None and prev[1] > 0 and robust_w[prev] >= limit.limit_w:
        below = (prev[0], prev[1] - 1)
        if not tried[below]:
            return below
    return fitted_next(limit)
