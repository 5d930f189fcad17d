"""What one node does for the server: describe itself, and run one TRAIN round.

A round follows the paper: parse the TRAIN config → the LUT for this round's cap (profiled
once, cached) → select (b*, f*) → the round plan's choice (``balance``, optional) → train
with the GPU locked → check drift (optional) → report. Drift checks live in ``drift``, the
LUT file and cache in ``lut``, measuring in ``profiler``, the selection rules in
``selector``.

No Flower import: ``client_app.py`` unpacks messages and calls ``describe_node`` and
``train_node``, so they are tested directly and run the same in simulation and on a Jetson.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fl_client import model_zoo, selector, task
from fl_client.balance import BALANCE_MODES, Slack, missed_deadline
from fl_client.cell_measure import MeasureContext
from fl_client.contract import (
    Cap,
    NodeDescriptor,
    TrainConfig,
    TrainReport,
    format_schedule,
)
from fl_client.devices import GPU_POWER_LIMIT_W, Device, cap_guard, locked
from fl_client.devices.base import device_knob
from fl_client.drift import DriftCheck, check_drift, trained_time_deviation
from fl_client.feasibility import robust_peak_w
from fl_client.files import set_aside
from fl_client.lut import LUT
from fl_client.node_context import (
    NodeContext,
    RoundCost,
    idle_power_w,
    max_batch_size,
    node_context,
    workload_for,
)
from fl_client.power import PowerLimit
from fl_client.profiler import ProfileOptions, load_or_profile
from fl_client.r_estimation import InitialModel, ROptions, estimate_r
from fl_client.selection import InfeasibleCapError, Selection, Tables
from fl_client.settings import (
    SettingsError,
    parse_batch_sizes,
)
from fl_client.shared import (
    REFUSED,
    VERIFIED,
    keep_verified,
    own_cell_check,
    profile_cells,
    refuse,
    shared_lut,
)

log = logging.getLogger(__name__)

#: Methods that select from the profiled LUTs; B1, B2 and fixed use fixed rules and never
#: profile, so a comparison charges profiling only to the methods that need it.
NEEDS_LUT = ("power-aware", "oracle")


# --------------------------------------------------------------------------- QUERY


def describe_node(
    run_config: Mapping[str, Any], node_config: Mapping[str, Any], query: Mapping[str, Any]
) -> NodeDescriptor:
    """The QUERY reply: device descriptor, cap, and the largest batch size that fits."""
    ctx = node_context(run_config, node_config)
    for key in ("model", "batch-sizes"):
        if key not in query:
            raise SettingsError(f"{key}: missing from the QUERY config")
    model_name = str(query["model"])
    batch_sizes = parse_batch_sizes(query["batch-sizes"])
    device = ctx.open_device()
    try:
        info = device.info
    finally:
        device.close()
    caps = ctx.node.scheduled_caps
    return NodeDescriptor(
        node_name=ctx.node.name,
        partition_id=ctx.partition_id,
        device=info.kind,
        backend=info.backend,
        p_max=ctx.node.p_max,
        p_max_schedule=format_schedule(ctx.node.p_max_schedule),
        gpu_freqs_mhz=tuple(float(f) for f in info.gpu_freqs_mhz),
        memory_bytes=int(info.memory_bytes),
        power_rail=info.power_rail,
        max_batch_size=max_batch_size(model_name, batch_sizes, info.memory_bytes),
        cap_margin=ctx.cap_margin,
        profile_floor_mhz=info.profile_floor_mhz(cap.watts for cap in caps),
        knob=device_knob(device).setting,
    )


# --------------------------------------------------------------------------- TRAIN steps


@dataclass
class NodeRoundState:
    """What a round decided before training, and what it measured on the way."""

    cfg: TrainConfig
    #: The round's cap with the node's ``cap-margin``: the one value the node's choice,
    #: profiling and drift checks judge peaks by
    limit: PowerLimit
    lut: LUT | None = None
    lut_from_cache: bool = False
    r_true: list[float] | None = None
    choice: Selection | None = None
    run_freq_mhz: float = 0.0
    #: The drift check of this node's own LUT (``drift-check-every``)
    drift: DriftCheck | None = None
    #: Fleet-shared profiling: the check of the chosen cell of its kind's LUT on this board
    kind_check: DriftCheck | None = None
    #: The kind's LUT is checked by this round's own training steps (``_settle_shared``)
    verify_by_training: bool = False
    cost: RoundCost = field(default_factory=RoundCost)
    #: The trained round's peak against the LUT cell it ran at: (deviation, set aside)
    power_check: tuple[float, bool] | None = None
    #: The round plan (``balance``): the share of its local work this node runs (more than
    #: 1 with ``steps``, ``straggler-work`` for the node that sets the pace) and its
    #: predicted local time at its fastest feasible cell
    work_share: float = 1.0
    fastest_time_s: float | None = None
    #: The ``TrainReport`` fields its ``balance`` mode adds (``Mode.report``; ``energy``:
    #: ``predicted_energy_saved_j``)
    mode_report: dict[str, float] = field(default_factory=dict)

    @property
    def cap(self) -> Cap:
        """The round's bare cap (what the cap guard holds and the records show)."""
        return Cap(self.limit.p_max_w)


def lut_for_cap(
    ctx: NodeContext, measure: MeasureContext, batch_sizes: list[int], cap: Cap
) -> tuple[LUT, bool, RoundCost]:
    """The LUT for ``cap`` (with the node's ``cap-margin``), whether it came from the cache,
    and what profiling cost.

    Each LUT is profiled in efficient mode for the cap with the node's ``cap-margin`` and
    cached. A node with a cap schedule profiles every cap of it now under
    ``schedule-profiling = "upfront"`` (round 1 in practice), or only this round's cap
    under ``"lazy"`` (each cap the first round it applies); later rounds under a cap seen
    before re-select from the cache without profiling.
    """
    upfront = ctx.settings.schedule_profiling == "upfront" and ctx.node.p_max_schedule
    caps = ctx.node.scheduled_caps if upfront else (cap,)
    cost = RoundCost()
    this: tuple[LUT, bool] | None = None
    for each in dict.fromkeys((cap, *caps)):
        options = ProfileOptions(
            each.with_margin(ctx.cap_margin),
            progress=False,
            uncapped="full" if ctx.settings.profile_grid == "full" else "highest",
            peak_sigma_k=ctx.settings.peak_sigma_k,
        )
        lut, cached = load_or_profile(
            measure.device,
            measure.workload,
            batch_sizes,
            measure.step_factory,
            measure.cache_dir,
            options,
        )
        if not cached:
            cost.add(lut.profile_time_s, lut.profile_energy_j)
        if each == cap:
            this = (lut, cached)
    assert this is not None
    return this[0], this[1] and cost.time_s == 0.0, cost


def oracle_r_key(ctx: NodeContext, cfg: TrainConfig, data: tuple[Any, Any]) -> str:
    """sha256 (hex) of what the oracle's r depends on: the run's starting weights (the
    checkpoint's sha256 from the TRAIN config, or the seed of the model's random ones), this
    node's data, and r's settings, so an r from other weights or data is never reused."""
    s = ctx.settings
    inputs = {
        "model": cfg.model,
        "batch-sizes": list(cfg.batch_sizes),
        "initial-weights-sha256": cfg.initial_weights_sha256,
        "seed": s.seed,
        "proxy-target-accuracy": s.proxy_target_accuracy,
        "lr-ref": cfg.lr_ref,
        "b-ref": cfg.b_ref,
        "r-eval-every-samples": s.r_eval_every_samples,
        "r-max-samples": s.r_max_samples,
        "train-data": task.data_hash(data[0]),
        "eval-data": task.data_hash(data[1]),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def oracle_r(
    ctx: NodeContext, cfg: TrainConfig, state: Mapping[str, torch.Tensor], data: tuple[Any, Any]
) -> list[float]:
    """r measured on this node's own data (the oracle): computed once per ``oracle_r_key``,
    kept on disk."""
    batch_sizes = list(cfg.batch_sizes)
    key = oracle_r_key(ctx, cfg, data)
    path = ctx.cache_dir / f"oracle-r-{cfg.model}-{key[:24]}.json"
    if path.is_file():
        try:
            cached = json.loads(path.read_text())
            if cached["key"] == key:
                return [float(x) for x in cached["r"]]
            log.warning("oracle r cache %s has another key: recomputing", path)
        except (ValueError, KeyError, TypeError):
            log.warning("corrupt oracle r cache %s: recomputing", path)
    s = ctx.settings
    est = estimate_r(
        InitialModel(cfg.model, dict(state), cfg.initial_weights_sha256 or ""),
        data[0],
        data[1],
        batch_sizes,
        ROptions(
            target_accuracy=s.proxy_target_accuracy,
            lr_ref=cfg.lr_ref,
            b_ref=cfg.b_ref,
            eval_every_samples=s.r_eval_every_samples,
            max_samples=s.r_max_samples,
            seeds=(s.seed,),
            progress=False,
        ),
        cache_dir=ctx.cache_dir / "r",
    )
    # Batch sizes that never reach the target on this node's data get r = 1 (the worst).
    r_by_b = dict(zip(est.batch_sizes, est.r, strict=True))
    r = [float(r_by_b.get(b, 1.0)) for b in batch_sizes]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "batch-sizes": batch_sizes, "r": r}))
    return r


def select_for(
    plan: NodeRoundState,
    lut: LUT | None,
    device: Device,
    objective: selector.Objective = selector.EQ4,
    context: selector.RoundContext = selector.ANY_ROUND,
) -> Selection:
    """The round's (b*, f*) by ``selector.select``, the one dispatch of every method.

    Power-aware and the oracle take Eq. 4 on the LUT's measured cells under ``plan.limit``
    (the cap less the node's ``cap-margin``; the oracle with r measured on the node's
    data): each cell judged by its peak + ``objective.peak_sigma_k``·σ of its per-step peaks
    (the LUT's ``peak_sigma_w``), the least time × r, near-ties within
    ``objective.tie_tolerance`` to the least energy (the LUT's average power × time). B1 and B2
    take their fixed frequency from the device descriptor's band for the cap; ``fixed``
    takes the configured (b, f). ``context``: the round plan's (``_balance``).
    """
    cfg = plan.cfg
    tables = (
        None
        if lut is None
        else Tables(
            lut.time_per_sample_s, lut.peak_power_w, lut.avg_power_w, lut.peak_sigma_w, lut.knob
        )
    )
    method = selector.Method(
        cfg.method,
        objective,
        context,
        b1_max_freq_mhz=(
            device.info.b1_max_freq_mhz(plan.cap.watts) if cfg.method in ("b1", "b2") else None
        ),
        fixed_batch_size=cfg.fixed_batch_size,
        fixed_freq_mhz=cfg.fixed_freq_mhz,
    )
    return selector.select(
        method,
        batch_sizes=list(cfg.batch_sizes),
        freqs_mhz=[float(f) for f in device.gpu_freqs_mhz],
        tables=tables,
        r=plan.r_true if cfg.method == "oracle" else list(cfg.r),
        limit=plan.limit,
    )


def _skip_reason(plan: NodeRoundState, err: InfeasibleCapError) -> RuntimeError:
    """A scheduled cap no configuration meets: the node skips that round, saying why."""
    spent = (
        f"; profiling for this cap took {plan.cost.time_s:.2f} s and {plan.cost.energy_j:.2f} J"
        if plan.cost.time_s > 0
        else ""
    )
    return RuntimeError(
        f"p-max-schedule: no configuration fits round {plan.cfg.server_round}'s cap of "
        f"{plan.cap.label}; this node skips the round ({err}){spent}"
    )


def _choose(
    ctx: NodeContext,
    measure: MeasureContext,
    plan: NodeRoundState,
    state: Mapping[str, torch.Tensor],
    data: tuple[Any, Any],
) -> None:
    """LUT for the cap (methods that need one), the oracle's r, then (b*, f*).

    A kind's LUT with no cell this node can run under its cap (most of the kind's slices
    failed, or this board draws more) gives way to the node's own profiling: the board may
    still meet the cap where the kind's nodes measured nothing."""
    shared = None
    if plan.cfg.method in NEEDS_LUT and plan.cfg.kind_lut is not None:
        shared = shared_lut(plan.cfg.kind_lut, measure, list(plan.cfg.batch_sizes))
    if plan.cfg.method == "oracle":
        plan.r_true = oracle_r(ctx, plan.cfg, state, data)
    if shared is not None:
        plan.lut, known = shared
        plan.lut_from_cache = known == VERIFIED
        try:
            plan.choice = select_for(plan, plan.lut, measure.device, ctx.objective)
            if known != VERIFIED:
                before = known == REFUSED or ctx.settings.shared_verify == "before"
                _verify_shared(ctx, measure, plan, before=before)
            plan.run_freq_mhz = plan.choice.freq_mhz
            return
        except InfeasibleCapError as err:
            log.warning("kind-lut: %s; profiling this node's own", err)
    if plan.cfg.method in NEEDS_LUT:
        plan.lut, plan.lut_from_cache, cost = lut_for_cap(
            ctx, measure, list(plan.cfg.batch_sizes), plan.cap
        )
        plan.cost.add(cost.time_s, cost.energy_j)
    try:
        plan.choice = select_for(plan, plan.lut, measure.device, ctx.objective)
    except InfeasibleCapError as err:
        if not ctx.node.p_max_schedule:
            raise
        raise _skip_reason(plan, err) from err
    plan.run_freq_mhz = plan.choice.freq_mhz


def _verify_shared(
    ctx: NodeContext, measure: MeasureContext, plan: NodeRoundState, *, before: bool
) -> None:
    """Check the chosen cell of a kind's LUT on this board.

    A cell this node measured in its own slice is checked at no cost. Otherwise, unless
    ``before``, the round's own training steps check it (``_settle_shared``, after the
    round: nothing measured for it; the cap guard holds the cap meanwhile). With
    ``before`` (``shared-verify = "before"``, or a board a trained round found off the
    LUT) the cell is measured first (the drift check's machinery); beyond
    ``drift-threshold`` that row is re-profiled under this node's own cap and the choice
    made again. The checked (or corrected) copy is kept, so later rounds measure nothing."""
    assert plan.lut is not None and plan.choice is not None and plan.cfg.kind_lut is not None
    point = (plan.choice.batch_size, plan.choice.freq_mhz)
    check = own_cell_check(measure, plan.lut, point, ctx.settings.drift_threshold)
    if check is None and not before:
        plan.verify_by_training = True
        return
    if check is None:
        options = ProfileOptions(
            plan.limit,
            warmup_steps=plan.lut.warmup_steps,
            steps=plan.lut.steps,
            progress=False,
            peak_sigma_k=ctx.settings.peak_sigma_k,
        )
        check = check_drift(measure, plan.lut, point, ctx.settings.drift_threshold, options)
    plan.kind_check, plan.lut = check, check.lut
    plan.cost.add(check.time_s, check.energy_j)
    if check.reprofiled:
        plan.choice = select_for(plan, plan.lut, measure.device, ctx.objective)
    keep_verified(measure, plan.lut, plan.cfg.kind_lut)


def _settle_shared(ctx: NodeContext, measure: MeasureContext, plan: NodeRoundState, m: Any) -> None:
    """The kind's LUT checked by the round's own training at the chosen cell: its device
    time against the cell's time per sample (``drift.trained_time_deviation``) and its
    peak against the cell's promise (``check_power``), with no step-down of the cap guard.
    Within ``drift-threshold`` the copy is kept as verified; beyond it the board is off its
    kind's LUT: the next round measures the cell first and re-profiles the row."""
    if not plan.verify_by_training:
        return
    assert plan.lut is not None and plan.choice is not None and plan.cfg.kind_lut is not None
    time_dev = trained_time_deviation(plan.choice.time_per_sample_s, plan.choice.batch_size, m)
    parts = [d for d in (time_dev, plan.power_check and plan.power_check[0]) if d is not None]
    deviation = max(parts, default=math.nan)
    ok = bool(parts) and deviation <= ctx.settings.drift_threshold and m.cap_violations == 0
    plan.kind_check = DriftCheck(deviation, False, plan.lut, 0.0, 0.0)
    if ok:
        keep_verified(measure, plan.lut, plan.cfg.kind_lut)
        return
    refuse(measure, LUT.from_json(plan.cfg.kind_lut))
    log.warning(
        "kind-lut: this board ran (b=%d, %g MHz) %.0f%% off its kind's LUT (time %s, peak "
        "%s, cap-guard step-downs %d; drift-threshold %.0f%%): the next round measures the "
        "cell first and re-profiles the row if it is still off",
        plan.choice.batch_size,
        plan.run_freq_mhz,
        100 * deviation if math.isfinite(deviation) else math.nan,
        "n/a" if time_dev is None else f"{100 * time_dev:+.0f}%",
        "n/a" if plan.power_check is None else f"{100 * plan.power_check[0]:+.0f}%",
        m.cap_violations,
        100 * ctx.settings.drift_threshold,
    )


def _balance(ctx: NodeContext, device: Device, plan: NodeRoundState, samples: int) -> None:
    """The round plan on the node (a ``balance`` mode that plans, methods that select from
    a LUT): the node's objective (``selector.Objective``) with the mode's changes and the
    round's budget.

    The node's fastest feasible cell (time alone, ``r_weight`` 0) gives the best round
    time it reports (``fastest-time-s``, what the server plans the next deadline from).
    With a deadline (from round 2): the node that sets the pace (``critical``) runs that
    fastest cell (with ``critical-r-weight`` w > 0 its least time × r_b^w) with
    ``straggler-work`` of its local work; a node with slack keeps ``deadline-margin`` of
    the deadline in reserve and spends the rest as its mode's entry says
    (``balance.BALANCE_MODES``). When no cell meets the deadline the choice is the fastest
    cell (the selector's fallback)."""
    s, cfg = ctx.settings, plan.cfg
    mode = BALANCE_MODES[s.balance]
    if not mode.plans or plan.lut is None or plan.choice is None:
        return
    if cfg.method not in ("power-aware", "oracle"):
        return
    work = samples * cfg.time_calibration
    fastest = select_for(plan, plan.lut, device, ctx.objective.for_pace())
    plan.fastest_time_s = fastest.time_per_sample_s * work
    if cfg.deadline_s is None:
        return
    if cfg.critical:
        pace = fastest
        if s.critical_r_weight > 0:  # r still weighs: the cell the server planned it with
            pace_objective = ctx.objective.for_pace(s.critical_r_weight)
            pace = select_for(plan, plan.lut, device, pace_objective)
        plan.choice, plan.work_share = pace, s.straggler_work
    else:
        budget_s = cfg.deadline_s * (1.0 - s.deadline_margin)
        slack = Slack(plan.choice, fastest, budget_s, work, idle_power_w(device), s.max_work_share)
        if mode.reselect is not None:
            ask = mode.reselect(slack)
            objective = ctx.objective.but(**ask.changes)
            context = selector.RoundContext(budget_s, work, batch_size=ask.batch_size)
            plan.choice = select_for(plan, plan.lut, device, objective, context)
        plan.work_share = mode.work_share(slack, plan.choice)
        plan.mode_report = dict(mode.report(slack, plan.choice))
    plan.run_freq_mhz = plan.choice.freq_mhz


def _local_work(cfg: TrainConfig, plan: NodeRoundState, n_samples: int) -> tuple[int, int | None]:
    """Epochs and the sample budget of this round's local training (``task.train``):
    ``local-epochs`` over the data, scaled by the plan's ``work_share`` in whole minibatches
    of b* (at least one; ``task.train`` stops after the minibatch that reaches the budget,
    so a share never runs past its time)."""
    if plan.work_share == 1.0 or plan.choice is None:
        return cfg.local_epochs, None
    b = plan.choice.batch_size
    total = max(b, math.floor(cfg.local_epochs * n_samples * plan.work_share / b) * b)
    return max(1, math.ceil(total / max(n_samples, 1))), total


def _check_drift(ctx: NodeContext, measure: MeasureContext, plan: NodeRoundState) -> None:
    """Every ``drift-check-every`` rounds, compare the operating point with a cached LUT."""
    k = ctx.settings.drift_check_every
    if plan.lut is None or plan.choice is None or not plan.lut_from_cache:
        return
    if k <= 0 or plan.cfg.server_round % k != 0:
        return
    point = (plan.choice.batch_size, plan.run_freq_mhz)
    plan.drift = check_drift(
        measure,
        plan.lut,
        point,
        ctx.settings.drift_threshold,
        peak_sigma_k=ctx.settings.peak_sigma_k,
    )
    plan.cost.add(plan.drift.time_s, plan.drift.energy_j)


# --------------------------------------------------------------------------- TRAIN


def check_power(
    ctx: NodeContext, measure: MeasureContext, plan: NodeRoundState, peak_w: float
) -> tuple[float, bool] | None:
    """Every trained round, at no cost: the round's measured peak power against the peak its
    LUT promised at the cell it ran at (peak + ``peak-sigma-k``·σ). Beyond
    ``drift-threshold`` above it, the LUT does not describe this board (a wrong or stale
    file): its cache file is set aside, so the next round profiles (or verifies) again.
    Returns (relative deviation, whether the file was set aside); None without a LUT cell."""
    lut, choice = plan.lut, plan.choice
    if lut is None or choice is None or not math.isfinite(peak_w) or peak_w <= 0:
        return None
    try:
        i = lut.batch_sizes.index(choice.batch_size)
        j = lut.freqs_mhz.index(plan.run_freq_mhz)
    except ValueError:
        return None
    sigma = float(lut.peak_sigma_w[i, j]) if lut.peak_sigma_w.size else math.nan
    promised = float(robust_peak_w(lut.peak_power_w[i, j], sigma, ctx.settings.peak_sigma_k))
    if not math.isfinite(promised) or promised <= 0:
        return None
    deviation = peak_w / promised - 1.0
    if deviation <= ctx.settings.drift_threshold:
        return deviation, False
    if plan.drift is not None and plan.drift.reprofiled:
        return deviation, False  # this round's drift check has just re-profiled the file
    path = lut.key.path(measure.cache_dir)
    moved = set_aside(path) if path.is_file() else ""
    log.warning(
        "LUT %s: this round peaked at %.2f W where it promised %.2f W (+%.0f%%, beyond "
        "drift-threshold %.0f%%)%s",
        path.name,
        peak_w,
        promised,
        100 * deviation,
        100 * ctx.settings.drift_threshold,
        f"; {moved}; the next round profiles again" if moved else "",
    )
    return deviation, bool(moved)


def train_node(
    run_config: Mapping[str, Any],
    node_config: Mapping[str, Any],
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    step_hook: Callable[[], None] | None = None,
) -> tuple[dict[str, torch.Tensor], TrainReport]:
    """One TRAIN round on this node: parse → LUT for the cap → select → the round plan's
    choice → run locked → drift → report.

    The cap is this round's step of the node's ``p-max-schedule`` if it has one (a step
    whose cap no configuration meets is skipped with the reason). The GPU is locked at f*
    (or, with ``balance`` and a ``deadline-s`` in the config, at the frequency of the round
    plan's cell) and restored whatever happens. Returns the new weights and the
    round's ``TrainReport``.
    """
    ctx = node_context(run_config, node_config)
    cfg = TrainConfig.from_config(config)
    s = ctx.settings
    plan = NodeRoundState(
        cfg=cfg, limit=ctx.node.p_max_at(cfg.server_round).with_margin(ctx.cap_margin)
    )
    torch.set_num_threads(1)  # simulated nodes share the host's cores
    data = ctx.local_data()
    device = ctx.open_device(cfg.server_round)
    workload = workload_for(cfg.model)
    measure = MeasureContext(
        device,
        workload,
        functools.partial(task.make_train_step, cfg.model, workload.input_shape),
        ctx.cache_dir / "lut",
    )
    try:
        _choose(ctx, measure, plan, state, data)
        _balance(ctx, device, plan, cfg.local_epochs * len(data[0]))
        epochs, max_samples = _local_work(cfg, plan, len(data[0]))
        model = model_zoo.build_model(cfg.model).to(task.compute_device())  # where it was profiled
        model.load_state_dict(dict(state))
        assert plan.choice is not None
        lr = task.scaled_lr(cfg.lr_ref, cfg.b_ref, plan.choice.batch_size)
        with (
            locked(device, plan.run_freq_mhz),
            cap_guard(device, plan.cap.watts),
            device.measure(workload) as meter,
        ):
            result = task.train(
                model,
                data[0],
                task.TrainOptions(
                    batch_size=plan.choice.batch_size,
                    lr=lr,
                    epochs=epochs,
                    seed=s.seed * 10_000 + cfg.server_round,
                    max_samples=max_samples,
                ),
                step_runner=meter.step,
            )
            if step_hook is not None:
                step_hook()
        _check_drift(ctx, measure, plan)
        plan.power_check = check_power(ctx, measure, plan, meter.measurement.peak_power_w)
        _settle_shared(ctx, measure, plan, meter.measurement)
        report = _report(ctx, plan, device, meter.measurement, result, lr)
    finally:
        device.close()
    return task.cpu_state(model), report


def _report(
    ctx: NodeContext,
    plan: NodeRoundState,
    device: Device,
    m: Any,
    result: task.TrainResult,
    lr: float,
) -> TrainReport:
    """The round's ``TrainReport``: the measurement, the choice, the round plan and drift,
    and the local work (``local-steps`` optimizer steps at learning rate ``lr``)."""
    assert plan.choice is not None
    choice, idle_w = plan.choice, idle_power_w(device)
    extra: dict[str, float] = {}
    # The knob in its own unit: a power limit goes under gpu-power-limit-w, and
    # gpu-freq-mhz then holds the clock sampled during training (NaN: not read)
    limit_w = float(plan.run_freq_mhz) if device_knob(device) == GPU_POWER_LIMIT_W else None
    sampled_mhz = float(getattr(m, "clock_mhz", math.nan))
    if limit_w is not None:
        extra["gpu_power_limit_w"] = limit_w
    if plan.lut is not None:  # what the LUT predicted for this local work
        extra["predicted_time_s"] = choice.time_per_sample_s * result.samples
    if plan.fastest_time_s is not None:  # the round plan: the node's best round time
        extra["fastest_time_s"] = plan.fastest_time_s
        if plan.cfg.deadline_s is not None:
            extra["deadline_s"] = plan.cfg.deadline_s
            extra["slack_s"] = plan.cfg.deadline_s - m.time_s
            extra["deadline_miss"] = float(missed_deadline(m.time_s, plan.cfg.deadline_s))
    extra.update(plan.mode_report)
    if plan.kind_check is not None:
        extra["kind_verify_deviation"] = plan.kind_check.deviation
        extra["kind_reprofiled"] = float(plan.kind_check.reprofiled)
    if plan.power_check is not None:
        extra["lut_power_deviation"] = plan.power_check[0]
        extra["lut_set_aside"] = float(plan.power_check[1])
    if plan.drift is not None:
        extra["drift_deviation"] = plan.drift.deviation
        extra["drift_reprofiled"] = float(plan.drift.reprofiled)
        if plan.drift.reprofiled:
            again = select_for(plan, plan.drift.lut, device, ctx.objective)
            extra["drift_batch_size"] = float(again.batch_size)
            extra["drift_freq_mhz"] = float(again.freq_mhz)
    if limit_w is not None and "drift_freq_mhz" in extra:  # the knob's value in W, its own key
        extra["drift_power_limit_w"] = extra.pop("drift_freq_mhz")
    return TrainReport(
        num_examples=float(result.num_examples),
        train_time_s=m.time_s,
        train_energy_j=m.energy_j,
        avg_power_w=m.avg_power_w,
        peak_power_w=m.peak_power_w,
        idle_power_w=idle_w,
        p_max_w=plan.cap.to_wire(),
        cap_margin=ctx.cap_margin,
        batch_size=float(choice.batch_size),
        gpu_freq_mhz=float(plan.run_freq_mhz) if limit_w is None else sampled_mhz,
        profile_time_s=plan.cost.time_s,
        profile_energy_j=plan.cost.energy_j,
        cap_violations=float(m.cap_violations),
        time_over_cap_s=float(m.time_over_cap_s),
        train_loss=float(result.mean_loss),
        lut_from_cache=float(plan.lut_from_cache),
        lut_shared=float(
            plan.cfg.kind_lut is not None and plan.lut is not None and plan.lut.grid == "shared"
        ),
        local_steps=float(result.steps),
        local_lr=float(lr),
        **extra,
    )


__all__ = [
    "NEEDS_LUT",
    "NodeContext",
    "SettingsError",
    "describe_node",
    "lut_for_cap",
    "max_batch_size",
    "node_context",
    "oracle_r",
    "profile_cells",
    "select_for",
    "train_node",
    "workload_for",
]
