"""What one node does for the server: describe itself, and profile → select → lock → train.

No Flower import: ``client_app.py`` unpacks messages and calls these two functions, so they
are tested directly and run the same in simulation and on a real Jetson.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_client import selector, task
from fl_client.devices import Device, DeviceOptions, Workload, cap_guard, locked, open_device
from fl_client.profiler import (
    LUT,
    add_measured_cell,
    load_on_demand,
    load_or_profile,
    lut_cache_path,
    measure_cell,
    merge_cells,
    on_demand_path,
    profile,
    scale_cells,
    time_per_sample_s,
)
from fl_client.settings import (
    NodeSettings,
    RunSettings,
    SettingsError,
    load_fleet,
    node_settings,
    parse_batch_sizes,
    resolve_path,
)

log = logging.getLogger(__name__)

#: Methods that select from the profiled LUTs; B1, B2 and fixed use fixed rules and never
#: profile, so a comparison charges profiling only to the methods that need it.
NEEDS_LUT = ("power-aware", "oracle")

# A Jetson's CPU and GPU share memory: leave half of it to the OS, CUDA and the data.
MEMORY_SHARE_FOR_TRAINING = 0.5


@dataclass(frozen=True)
class NodeContext:
    settings: RunSettings
    node: NodeSettings
    partition_id: int
    num_partitions: int
    cache_dir: Path

    @property
    def cap_margin(self) -> float:
        """This node's ``cap-margin`` if it has one, else the run setting."""
        return self.settings.cap_margin if self.node.cap_margin is None else self.node.cap_margin

    def selection_cap_w(self, p_max_w: float) -> float:
        """What profiled peaks must stay below under ``p_max_w``: P_max less ``cap-margin``."""
        return selector.margin_cap_w(p_max_w, self.cap_margin)


def node_context(run_config: Mapping[str, Any], node_config: Mapping[str, Any]) -> NodeContext:
    """Validated run settings and this node's settings (from node_config or the fleet)."""
    settings = RunSettings.from_config(run_config)
    fleet = None if "device" in node_config else load_fleet(settings.fleet)
    node, pid, num = node_settings(node_config, fleet)
    cache_dir = resolve_path(settings.cache_dir) / "nodes" / node.name
    return NodeContext(settings, node, pid, num, cache_dir)


def _open(ctx: NodeContext, server_round: int = 0) -> Device:
    return open_device(
        ctx.node.device,
        ctx.node.backend,
        seed=ctx.settings.seed * 1000 + ctx.partition_id,
        options=DeviceOptions.from_config(ctx.node.options).at_round(server_round),
    )


def idle_power_w(device: Device) -> float:
    """The board's idle power in W where the backend knows it (the twin's descriptor), else NaN.

    It prices the time a node waits for the slowest one at the end of a synchronous round.
    """
    spec = getattr(device, "spec", None)
    value = getattr(spec, "idle_power_w", None)
    return float(value) if isinstance(value, (int, float)) else math.nan


def _workload(model_name: str) -> Workload:
    shape = task.input_shape_for(model_name)
    return Workload(
        model_name=model_name,
        input_shape=shape,
        flops_per_sample=task.train_flops_per_sample(model_name, shape),
        param_count=task.param_count(task.build_model(model_name)),
    )


def max_batch_size(model_name: str, batch_sizes: list[int], memory_bytes: int) -> int:
    """Largest b in ``batch_sizes`` whose training footprint fits the device (0 if none)."""
    model = task.build_model(model_name)
    shape = task.input_shape_for(model_name)
    budget = MEMORY_SHARE_FOR_TRAINING * memory_bytes
    fitting = [
        b for b in batch_sizes if task.estimate_train_memory_bytes(model, shape, b) <= budget
    ]
    return max(fitting, default=0)


def describe_node(
    run_config: Mapping[str, Any], node_config: Mapping[str, Any], query: Mapping[str, Any]
) -> dict[str, Any]:
    """The QUERY reply: device descriptor, cap, and the largest batch size that fits."""
    ctx = node_context(run_config, node_config)
    model_name = str(query.get("model", ctx.settings.model))
    batch_sizes = parse_batch_sizes(query.get("batch-sizes", ctx.settings.batch_sizes))
    device = _open(ctx)
    try:
        info = device.info
    finally:
        device.close()
    return {
        "node-name": ctx.node.name,
        "partition-id": ctx.partition_id,
        "device": info.kind,
        "backend": info.backend,
        "p-max-w": ctx.node.p_max_w,
        "p-max-label": ctx.node.p_max_label,
        "p-max-schedule": ",".join(
            f"{r}:{'none' if math.isinf(c) else f'{c:g}'}" for r, c in ctx.node.p_max_schedule
        ),
        "gpu-freqs-mhz": [float(f) for f in info.gpu_freqs_mhz],
        "memory-bytes": int(info.memory_bytes),
        "power-rail": info.power_rail,
        "max-batch-size": max_batch_size(model_name, batch_sizes, info.memory_bytes),
    }


def b1_freq_cap_mhz(device: Device, p_max_w: float) -> float:
    """The device's fixed safe frequency for the cap's band (B1/B2's state of practice)."""
    info = device.info
    try:
        from fl_client.devices.simulated import load_device_spec

        return float(load_device_spec(info.kind).b1_freq_cap_mhz(p_max_w))
    except (ValueError, FileNotFoundError):
        log.warning("no B1 frequency bands for %s: using its highest frequency", info.kind)
        return float(max(info.gpu_freqs_mhz))


def _oracle_r(
    ctx: NodeContext,
    model_name: str,
    state: Mapping[str, torch.Tensor],
    batch_sizes: list[int],
    train_data: Any,
    val_data: Any,
) -> list[float]:
    """r measured on this node's own data (the oracle): computed once, kept on disk."""
    from fl_client.r_estimation import estimate_r

    key = f"oracle-r-{model_name}-{'-'.join(map(str, batch_sizes))}.json"
    path = ctx.cache_dir / key
    if path.is_file():
        try:
            return [float(x) for x in json.loads(path.read_text())["r"]]
        except (ValueError, KeyError, TypeError):
            log.warning("corrupt oracle r cache %s: recomputing", path)
    s = ctx.settings
    est = estimate_r(
        model_name,
        dict(state),
        train_data,
        val_data,
        batch_sizes,
        target_accuracy=s.proxy_target_accuracy,
        lr_ref=s.lr_ref,
        b_ref=s.b_ref,
        eval_every_samples=int(s.extra.get("eval-every-samples", 256)),
        max_samples=int(s.extra.get("max-samples", 40_000)),
        seeds=(s.seed,),
        cache_dir=ctx.cache_dir / "r",
        progress=False,
    )
    # Batch sizes that never reach the target on this node's data get r = 1 (the worst).
    r_by_b = dict(zip(est.batch_sizes, est.r, strict=True))
    r = [float(r_by_b.get(b, 1.0)) for b in batch_sizes]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"batch-sizes": batch_sizes, "r": r}))
    return r


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


def _freq_index(freqs_mhz: tuple[float, ...], freq_mhz: float) -> int:
    return min(range(len(freqs_mhz)), key=lambda j: abs(freqs_mhz[j] - freq_mhz))


def plan_pacing(
    lut: LUT,
    batch_size: int,
    f_star_mhz: float,
    p_max_w: float,
    samples: int,
    deadline_s: float | None,
    *,
    margin: float = 0.05,
    time_calibration: float = 1.0,
    idle_power_w: float = 0.0,
    reserved_s: float = 0.0,
) -> PacePlan:
    """Deadline-aware pacing: the frequency of least predicted energy that meets the deadline.

    Candidates are the measured frequencies of ``batch_size``'s row at or below f* that are
    feasible under ``p_max_w`` (``selector.feasible_freq_index``), and f* itself. Pacing
    only ever slows a node down: b* and the cap are kept. A candidate meets the deadline
    when ``reserved_s`` (device time this round spent before training, e.g. measuring
    cells for pacing) plus its predicted time is ≤ ``deadline_s × (1 − margin)``; among
    those the one with the least predicted energy (LUT average power × time) wins. Without
    a deadline, or when no candidate meets it, the node runs at f* (its fastest).

    In a synchronous round a node that finishes early idles until the round ends, so its
    energy over the round is ``(P_avg(f) − P_idle) · t(f) + P_idle · T`` with T the round's
    length: the frequency chosen minimises ``(P_avg − idle_power_w) · t``. With
    ``idle_power_w`` 0 (unknown) that is the training energy alone.
    """
    i = lut.batch_sizes.index(batch_size)
    j_star = _freq_index(lut.freqs_mhz, f_star_mhz)
    row_t, row_peak, row_avg = (
        lut.time_per_sample_s[i],
        lut.peak_power_w[i],
        lut.avg_power_w[i],
    )
    if math.isnan(row_t[j_star]):
        raise ValueError(f"gpu-freq-mhz: the LUT has no cell at b={batch_size}, f*={f_star_mhz:g}")
    j_hi = selector.feasible_freq_index(row_peak, None if math.isinf(p_max_w) else p_max_w)
    top = j_star if j_hi is None else min(j_hi, j_star)
    cands = [j for j in range(top + 1) if not math.isnan(row_t[j]) and j_hi is not None]
    if j_star not in cands:
        cands.append(j_star)

    def time_s(j: int) -> float:
        return float(row_t[j]) * samples * time_calibration

    def energy_j(j: int) -> float:
        return float(row_avg[j]) * time_s(j)

    def energy_above_idle_j(j: int) -> float:
        return (float(row_avg[j]) - idle_power_w) * time_s(j)

    chosen, meets = j_star, deadline_s is None
    if deadline_s is not None:
        budget_s = deadline_s * (1.0 - margin) - reserved_s
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


def _lut(
    ctx: NodeContext,
    device: Device,
    workload: Workload,
    batch_sizes: list[int],
    model_name: str,
    p_max_w: float,
) -> tuple[LUT, bool, float, float]:
    """The LUT for this round's cap, whether it came from the cache, and the profiling time
    and energy this call spent.

    Each LUT is profiled in efficient mode for the cap less ``cap-margin``
    (``NodeContext.selection_cap_w``) and cached. A node with a cap schedule profiles every
    cap of it now under ``schedule-profiling = "upfront"`` (round 1 in practice), or only
    this round's cap under ``"lazy"`` (each cap the first round it applies); later rounds
    under a cap seen before re-select from the cache without profiling.
    """
    upfront = ctx.settings.schedule_profiling == "upfront" and ctx.node.p_max_schedule
    caps = ctx.node.scheduled_caps_w if upfront else (p_max_w,)
    time_s = energy_j = 0.0
    this: tuple[LUT, bool] | None = None
    for cap in dict.fromkeys((p_max_w, *caps)):
        select_cap_w = ctx.selection_cap_w(cap)
        lut, cached = load_or_profile(
            device,
            workload,
            batch_sizes,
            lambda b: task.make_train_step(model_name, task.IMAGE_SHAPE, b),
            ctx.cache_dir / "lut",
            p_max_w=None if math.isinf(select_cap_w) else select_cap_w,
            uncapped="full" if ctx.settings.profile_grid == "full" else "highest",
            progress=False,
        )
        if not cached:
            time_s += lut.profile_time_s
            energy_j += lut.profile_energy_j
        if cap == p_max_w:
            this = (lut, cached)
    assert this is not None
    return this[0], this[1] and time_s == 0.0, time_s, energy_j


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
    j_star = _freq_index(lut.freqs_mhz, f_star_mhz)
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


def _pacing_cells(
    ctx: NodeContext,
    device: Device,
    workload: Workload,
    model_name: str,
    lut: LUT,
    choice: selector.Selection,
    samples: int,
    deadline_s: float | None,
    time_calibration: float,
    idle_power_w: float,
) -> PacingCells:
    """``lut`` with the cells of b*'s row that pacing needs, measured lazily and cached.

    Without a deadline (round 1) nothing is measured: pacing runs at f*, whose cell the LUT
    has. With one, ``pacing_walk`` goes down b*'s row from f* (reusing the cells efficient
    profiling measured); new cells go to this node's on-demand cache, kept apart from the
    selection LUT so they never change (b*, f*).
    """
    cache = ctx.cache_dir / "lut"
    cells = load_on_demand(cache, device, workload, lut.batch_sizes)
    plan = lut if cells is None else merge_cells(lut, cells, overwrite=False)
    if deadline_s is None:
        return PacingCells(plan, cells, 0.0, 0.0, 0)
    step = task.make_train_step(model_name, task.IMAGE_SHAPE, choice.batch_size)
    time_s = energy_j = 0.0
    measured = 0

    def measure(freq_mhz: float) -> tuple[LUT, float]:
        nonlocal cells, time_s, energy_j, measured
        cells, cell_time_s, cell_energy_j = add_measured_cell(
            cells,
            device,
            workload,
            lut.batch_sizes,
            choice.batch_size,
            step,
            freq_mhz,
            warmup_steps=lut.warmup_steps,
            steps=lut.steps,
        )
        time_s, energy_j, measured = time_s + cell_time_s, energy_j + cell_energy_j, measured + 1
        return merge_cells(lut, cells, overwrite=False), cell_time_s

    plan = pacing_walk(
        plan,
        choice.batch_size,
        choice.freq_mhz,
        deadline_s * (1.0 - ctx.settings.pacing_margin),
        measure,
        samples=samples * time_calibration,
        cell_samples=(lut.warmup_steps + lut.steps) * choice.batch_size,
        idle_power_w=idle_power_w,
    )
    if cells is not None and measured:
        _save(cells, on_demand_path(cache, device, workload, lut.batch_sizes))
    return PacingCells(plan, cells, time_s, energy_j, measured)


def _save(lut: LUT, path: Path) -> None:
    """Write a LUT to the cache; a cache that cannot be written only costs a warning."""
    try:
        lut.save(path)
    except OSError as err:
        log.warning("could not update the LUT cache %s (%s)", path, err)


@dataclass(frozen=True)
class DriftCheck:
    """One drift check at the operating point (b, f)."""

    deviation: float  # largest relative deviation of time, peak and average power
    reprofiled: bool
    lut: LUT  # the selection LUT after the check (updated if re-profiled)
    cells: LUT | None  # the on-demand cells after the check (scaled if re-profiled)
    time_s: float  # device time of the check and any re-profiling
    energy_j: float


def check_drift(
    ctx: NodeContext,
    device: Device,
    workload: Workload,
    model_name: str,
    lut: LUT,
    batch_size: int,
    freq_mhz: float,
    p_max_w: float,
    cells: LUT | None = None,
) -> DriftCheck:
    """Measure (b, f) as the profiler did and compare with the LUT; re-profile b's row if off.

    The prediction is the selection LUT's cell, or the on-demand ``cells``' where the LUT
    has none (a paced frequency). Beyond ``drift-threshold`` (relative, on time per sample,
    peak or average power), b's row is profiled again from the lowest frequency up to
    ``p_max_w`` (the selection cap), merged over the LUT (fresh cells win; the other rows,
    and the on-demand cells, scaled by the change measured on this row) and both are
    written to the cache, so the node re-selects from them.
    """
    known = lut if cells is None else merge_cells(lut, cells, overwrite=False)
    i = known.batch_sizes.index(batch_size)
    j = _freq_index(known.freqs_mhz, freq_mhz)
    step = task.make_train_step(model_name, task.IMAGE_SHAPE, batch_size)
    m, time_s, energy_j = measure_cell(
        device,
        workload,
        batch_size,
        step,
        freq_mhz,
        warmup_steps=lut.warmup_steps,
        steps=lut.steps,
    )
    measured = (time_per_sample_s(m, batch_size, lut.steps), m.peak_power_w, m.avg_power_w)
    predicted = (
        known.time_per_sample_s[i, j],
        known.peak_power_w[i, j],
        known.avg_power_w[i, j],
    )
    deviation = max(abs(x / float(p) - 1.0) for x, p in zip(measured, predicted, strict=True))
    if not deviation > ctx.settings.drift_threshold:
        return DriftCheck(deviation, False, lut, cells, time_s, energy_j)
    cap = None if math.isinf(p_max_w) else p_max_w
    row = profile(
        device,
        workload,
        [batch_size],
        lambda b: task.make_train_step(model_name, task.IMAGE_SHAPE, b),
        p_max_w=cap,
        warmup_steps=lut.warmup_steps,
        steps=lut.steps,
        progress=False,
        uncapped="full",
    )
    # The other rows are scaled by the change measured on b's row (a uniform drift, such as
    # throttling or a busy neighbour, moves every b alike) until they are measured again, so
    # fresh and stale rows stay comparable for Eq. 4.
    both = ~np.isnan(known.time_per_sample_s[i]) & ~np.isnan(row.time_per_sample_s[0])
    factors = {
        name: float(np.median(getattr(row, attr)[0, both] / getattr(known, attr)[i, both]))
        if both.any()
        else 1.0
        for name, attr in (
            ("time_factor", "time_per_sample_s"),
            ("peak_factor", "peak_power_w"),
            ("avg_factor", "avg_power_w"),
        )
    }
    new_lut = merge_cells(scale_cells(lut, **factors), row, overwrite=True)
    info = device.info
    cache = ctx.cache_dir / "lut"
    _save(
        new_lut,
        lut_cache_path(
            cache, info.kind, info.backend, workload, list(lut.batch_sizes), lut.p_max_w, lut.grid
        ),
    )
    new_cells = None if cells is None else scale_cells(cells, **factors)
    if new_cells is not None:
        _save(new_cells, on_demand_path(cache, device, workload, lut.batch_sizes))
    log.info(
        "drift check: b=%d f=%g MHz off by %.0f%% (> %.0f%%): re-profiled that row",
        batch_size,
        freq_mhz,
        100 * deviation,
        100 * ctx.settings.drift_threshold,
    )
    return DriftCheck(
        deviation,
        True,
        new_lut,
        new_cells,
        time_s + row.profile_time_s,
        energy_j + row.profile_energy_j,
    )


def train_node(
    run_config: Mapping[str, Any],
    node_config: Mapping[str, Any],
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    step_hook: Callable[[], None] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float], dict[str, Any]]:
    """One TRAIN round on this node.

    Profile once per cap (LUTs cached on disk), select (b*, f*) with the round's ``method``
    under this node's P_max (this round's step of its ``p-max-schedule`` if it has one; a
    step whose cap no configuration meets is skipped with the reason), lock the
    GPU at f* (or, with ``pacing = "deadline"`` and a ``deadline-s`` in the config, at the
    frequency ``plan_pacing`` picks), train ``local-epochs`` with b*, restore the GPU; every
    ``drift-check-every`` rounds compare the operating point with the LUT.
    Returns the new weights, the metrics of DESIGN §5 and what was chosen.
    """
    ctx = node_context(run_config, node_config)
    s = ctx.settings
    method = str(config.get("method", s.method))
    if method not in selector.METHODS:
        raise SettingsError(
            f"method: unknown value {method!r}; allowed: {', '.join(selector.METHODS)}"
        )
    model_name = str(config.get("model", s.model))
    batch_sizes = parse_batch_sizes(config.get("batch-sizes", s.batch_sizes))
    r = selector.validate_r([float(x) for x in config["r"]], batch_sizes)
    lr_ref = float(config.get("lr-ref", s.lr_ref))
    b_ref = int(config.get("b-ref", s.b_ref))
    local_epochs = int(config.get("local-epochs", s.local_epochs))
    server_round = int(config.get("server-round", 0))
    p_max_w = ctx.node.p_max_at(server_round)
    select_cap_w = ctx.selection_cap_w(p_max_w)
    deadline_s = float(config["deadline-s"]) if "deadline-s" in config else None
    if deadline_s is not None and not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise SettingsError(f"deadline-s: must be a finite number of seconds > 0, got {deadline_s}")
    time_calibration = float(config.get("time-calibration", 1.0))
    if not (time_calibration > 0 and math.isfinite(time_calibration)):
        time_calibration = 1.0
    torch.set_num_threads(1)  # simulated nodes share the host's cores

    train_data, val_data = task.client_data(
        ctx.partition_id,
        ctx.num_partitions,
        partitioning=s.partitioning,
        alpha=s.dirichlet_alpha,
        seed=s.seed,
    )
    device = _open(ctx, server_round)
    idle_w = idle_power_w(device)
    pace: PacePlan | None = None
    paced: PacingCells | None = None
    drift: DriftCheck | None = None
    try:
        workload = _workload(model_name)
        lut: LUT | None = None
        profile_time_s = profile_energy_j = 0.0
        from_cache = False
        if method in NEEDS_LUT:
            lut, from_cache, profile_time_s, profile_energy_j = _lut(
                ctx, device, workload, batch_sizes, model_name, p_max_w
            )
        r_true = (
            _oracle_r(ctx, model_name, state, batch_sizes, train_data, val_data)
            if method == "oracle"
            else None
        )
        try:
            choice = _select(method, lut, batch_sizes, r, r_true, p_max_w, ctx, device, config)
        except selector.InfeasibleCapError as err:
            if not ctx.node.p_max_schedule:
                raise
            spent = (
                f"; profiling for this cap took {profile_time_s:.2f} s and {profile_energy_j:.2f} J"
                if profile_time_s > 0
                else ""
            )
            raise RuntimeError(
                f"p-max-schedule: no configuration fits round {server_round}'s cap of "
                f"{p_max_w:g} W; this node skips the round ({err}){spent}"
            ) from err
        run_freq_mhz = choice.freq_mhz
        if s.pacing == "deadline" and lut is not None:
            paced = _pacing_cells(
                ctx,
                device,
                workload,
                model_name,
                lut,
                choice,
                local_epochs * len(train_data),
                deadline_s,
                time_calibration,
                0.0 if math.isnan(idle_w) else idle_w,
            )
            profile_time_s += paced.time_s
            profile_energy_j += paced.energy_j
            pace = plan_pacing(
                paced.plan_lut,
                choice.batch_size,
                choice.freq_mhz,
                select_cap_w,
                local_epochs * len(train_data),
                deadline_s,
                margin=s.pacing_margin,
                time_calibration=time_calibration,
                idle_power_w=0.0 if math.isnan(idle_w) else idle_w,
                reserved_s=paced.time_s,
            )
            run_freq_mhz = pace.freq_mhz

        model = task.build_model(model_name)
        model.load_state_dict(dict(state))
        lr = task.scaled_lr(lr_ref, b_ref, choice.batch_size)
        with (
            locked(device, run_freq_mhz),
            cap_guard(device, p_max_w),
            device.measure(workload) as meter,
        ):
            result = task.train(
                model,
                train_data,
                batch_size=choice.batch_size,
                lr=lr,
                epochs=local_epochs,
                seed=s.seed * 10_000 + server_round,
                step_runner=meter.step,
            )
            if step_hook is not None:
                step_hook()
        m = meter.measurement
        k = s.drift_check_every
        if lut is not None and k > 0 and server_round % k == 0 and from_cache:
            drift = check_drift(
                ctx,
                device,
                workload,
                model_name,
                lut,
                choice.batch_size,
                run_freq_mhz,
                select_cap_w,
                cells=None if paced is None else paced.cells,
            )
            profile_time_s += drift.time_s
            profile_energy_j += drift.energy_j
    finally:
        device.close()

    metrics = {
        "num-examples": float(len(train_data)),
        "train-time-s": m.time_s,
        "energy-j": m.energy_j,
        "avg-power-w": m.avg_power_w,
        "peak-power-w": m.peak_power_w,
        # Board power when idle (NaN: unknown), for the energy spent waiting for the round
        "idle-power-w": idle_w,
        "p-max-w": p_max_w,
        "cap-margin": ctx.cap_margin,
        "batch-size": float(choice.batch_size),
        "gpu-freq-mhz": float(run_freq_mhz),
        "profile-time-s": profile_time_s,
        "profile-energy-j": profile_energy_j,
        # The cap guard's step-downs: power above P_max for longer than its window.
        "cap-violations": float(m.cap_violations),
        "time-over-cap-s": float(m.time_over_cap_s),
        "train-loss": float(result.mean_loss),
    }
    if lut is not None:  # what the LUT predicted for this local work
        metrics["predicted-time-s"] = (
            pace.predicted_time_s / time_calibration
            if pace is not None
            else choice.time_per_sample_s * result.samples
        )
    if pace is not None:
        metrics.update(
            _pacing_metrics(
                pace,
                choice.freq_mhz,
                m.time_s,
                m.energy_j,
                deadline_s,
                idle_power_w=0.0 if math.isnan(idle_w) else idle_w,
            )
        )
    if paced is not None:  # cells of b*'s row measured for pacing this round (profiling)
        metrics["pacing-cells-measured"] = float(paced.measured)
    if drift is not None:
        metrics["drift-deviation"] = drift.deviation
        metrics["drift-reprofiled"] = float(drift.reprofiled)
        if drift.reprofiled:
            again = _select(method, drift.lut, batch_sizes, r, r_true, p_max_w, ctx, device, config)
            metrics["drift-batch-size"] = float(again.batch_size)
            metrics["drift-freq-mhz"] = float(again.freq_mhz)
    info = {
        "node-name": ctx.node.name,
        "device": device.info.kind,
        "method": method,
        "lut-from-cache": bool(from_cache),
    }
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics, info


def _pacing_metrics(
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


def _select(
    method: str,
    lut: LUT | None,
    batch_sizes: list[int],
    r: list[float],
    r_true: list[float] | None,
    p_max_w: float,
    ctx: NodeContext,
    device: Device,
    config: Mapping[str, Any],
) -> selector.Selection:
    """The round's (b*, f*): Eq. 4 under P_max less the node's ``cap-margin`` (power-aware,
    oracle), or the baselines' rules (B1 and B2 take their frequency band from P_max)."""
    freqs_mhz = [float(f) for f in device.gpu_freqs_mhz]
    lut_time_s = None if lut is None else lut.time_per_sample_s
    lut_power_w = None if lut is None else lut.peak_power_w
    if method in ("power-aware", "oracle"):
        assert lut_time_s is not None and lut_power_w is not None
        r_eq4 = r if method == "power-aware" else r_true
        assert r_eq4 is not None
        return selector.select(
            method,
            lut_time_s=lut_time_s,
            lut_power_w=lut_power_w,
            batch_sizes=batch_sizes,
            freqs_mhz=freqs_mhz,
            r=r_eq4,
            p_max_w=p_max_w,
            cap_margin=ctx.cap_margin,
        )
    if method in ("b1", "b2"):
        cap = b1_freq_cap_mhz(device, p_max_w)
        if method == "b1":
            return selector.select_b1(batch_sizes, freqs_mhz, cap, lut_time_s, lut_power_w)
        return selector.select_b2(batch_sizes, freqs_mhz, r, cap, lut_time_s, lut_power_w)
    return selector.select_fixed(
        int(config["fixed-batch-size"]),
        float(config["fixed-freq-mhz"]),
        batch_sizes,
        freqs_mhz,
        lut_time_s,
        lut_power_w,
    )
