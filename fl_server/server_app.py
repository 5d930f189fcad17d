"""ServerApp: builds the model, estimates r on the proxy set, runs PowerAwareFedAvg's rounds."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fl_client import checkpoint, data_splits, model_zoo, task
from fl_client.contract import TrainConfig
from fl_client.effective import check_effective, named_by_caller_already
from fl_client.files import check_run_records
from fl_client.r_estimation import estimate_run_r, round0_model
from fl_client.settings import (
    NodeSettings,
    RunSettings,
    app_defaults,
    fleet_buffer_size,
    fleet_path,
    load_fleet,
    resolve_path,
    translate_deprecated,
)
from fl_server.async_loop import AsyncRun, run_fedbuff
from fl_server.async_records import AsyncRecorder
from fl_server.lut_library import LUTLibrary
from fl_server.results import RunRecorder, new_run_dir, untrained_label
from fl_server.target import Target
from strategies.fedbuff import UpdateBudget, VirtualClock
from strategies.fleet import Fleet
from strategies.power_aware import PowerAwareFedAvg, RoundReport
from strategies.round_plan import PlanSettings
from strategies.shared_exchange import SharedProfiling
from strategies.shared_profiling import SharedOptions

log = logging.getLogger(__name__)


def estimate_proxy_r(
    settings: RunSettings,
    rec: RunRecorder,
    state: dict[str, Any],
    weights: checkpoint.InitialWeights | None = None,
) -> Any:
    """Eq. 3's r on the server's proxy set (``proxy-dataset``, else the run's ``dataset``)
    from the round-0 weights ``state`` (``estimate_run_r``: cached; a checkpoint's sha256
    keys the cache), written to ``r.json`` and printed. A target not reached within
    ``r-max-samples`` is a SettingsError naming the key (``powerfl simulate`` finds it
    before the engine starts)."""
    t0 = time.perf_counter()
    r_est = estimate_run_r(settings, state, weights.sha256 if weights else "", progress=True)
    rec.write("r.json", r_est.to_json())
    rec.console.print(
        "r on the proxy set: "
        + ", ".join(f"b{b}={r:.2f}" for b, r in zip(r_est.batch_sizes, r_est.r, strict=True))
        + f"  ({time.perf_counter() - t0:.1f} s)"
    )
    return r_est


def make_strategy(
    settings: RunSettings,
    r_est: Any,
    weights: checkpoint.InitialWeights | None = None,
) -> PowerAwareFedAvg:
    """The run's strategy: its TRAIN config template (with the checkpoint's sha256 when the
    run starts from ``weights``), round plan and fleet-shared profiling."""
    fixed = settings.method == "fixed"
    template = TrainConfig(
        server_round=0,
        method=settings.method,
        model=settings.model,
        batch_sizes=tuple(r_est.batch_sizes),
        r=tuple(r_est.r),
        lr_ref=settings.lr_ref,
        b_ref=settings.b_ref,
        local_epochs=settings.local_epochs,
        fixed_batch_size=settings.fixed_batch_size if fixed else None,
        fixed_freq_mhz=settings.fixed_freq_mhz if fixed else None,
        initial_weights_sha256=weights.sha256 if weights else None,
    )
    planning = None
    if settings.balance != "off":
        planning = PlanSettings(
            settings.balance,
            round_deadline_s=settings.round_deadline_s,
            margin=settings.deadline_margin,
            peak_sigma_k=settings.peak_sigma_k,
            critical_r_weight=settings.critical_r_weight,
            tie_tolerance=settings.tie_tolerance,
        )
    shared = None
    if settings.shared_profiling == "fleet":
        shared = SharedProfiling(
            library=LUTLibrary(resolve_path(settings.cache_dir) / "library"),
            input_shape=model_zoo.input_shape_for(settings.model),
            options=SharedOptions(
                seed_cells=settings.shared_seed_cells,
                cells_per_cap=settings.shared_cells_per_cap,
                tie_tolerance=settings.tie_tolerance,
                peak_sigma_k=settings.peak_sigma_k,
            ),
            steps_train=settings.profile_steps_train,
            # fedbuff buffers each node's profiled steps as an update of its own
            per_node=settings.aggregation == "fedbuff",
            waiting=settings.while_waiting,
        )
    return PowerAwareFedAvg(
        template=template,
        min_train_nodes=settings.min_train_nodes,
        fraction_train=settings.fraction_train,
        # fedbuff aggregates its buffer itself, profiled updates included
        aggregation="fedavg" if settings.aggregation == "fedbuff" else settings.aggregation,
        planning=planning,
        shared=shared,
    )


@dataclass(frozen=True)
class Rounds:
    """How long a run goes: at most ``num_rounds`` rounds, each waiting ``timeout_s`` for
    its replies, ending early once the global model reaches ``target`` (by its window
    rule: ``fl_server.target``)."""

    num_rounds: int
    timeout_s: float
    target: Target | None = None


def run_rounds(
    strategy: PowerAwareFedAvg,
    grid: Grid,
    initial_arrays: ArrayRecord,
    rounds: Rounds,
    evaluate_fn: Callable[[int, ArrayRecord], dict[str, float]],
    on_round: Callable[[RoundReport, dict[str, float]], object] | None = None,
) -> ArrayRecord:
    """QUERY round (unless the fleet was queried already), then TRAIN rounds until the
    global model reaches ``rounds.target`` (the mean accuracy over its window of rounds) or
    ``rounds.num_rounds``; returns the final global arrays.

    Each round: QUERY the nodes that joined since, fleet-shared profiling, then the
    strategy's ``configure_train`` and ``aggregate_train``. ``evaluate_fn`` evaluates the
    global model (round 0: the initial one); ``on_round`` gets each ``RoundReport`` and its
    evaluation (the results writer). Flower's ``Strategy.start`` always runs every round;
    stopping at a target accuracy is what time-to-accuracy needs, hence this loop over the
    same hooks.
    """
    fleet, timeout_s = strategy.fleet, rounds.timeout_s
    if not fleet.nodes:
        fleet.query(grid, timeout_s)
    if not fleet.nodes:
        raise RuntimeError("no node answered the QUERY round; nothing to train")
    arrays = initial_arrays
    evaluate_fn(0, arrays)
    accuracies: list[float] = []  # rounds 1, 2, …: the target's window reads them
    for server_round in range(1, rounds.num_rounds + 1):
        if server_round > 1:
            fleet.query_new(grid, timeout_s)
        arrays = strategy.shared_phase(grid, arrays, server_round, timeout_s)
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        replies = fleet.send_and_receive(grid, messages, timeout_s)
        sent = {m.metadata.dst_node_id for m in messages}
        got = {fleet.node_of(m) for m in replies}
        new_arrays, _ = strategy.aggregate_train(server_round, replies)
        _name_the_silent(strategy, server_round, sent, got)
        if new_arrays is not None:
            arrays = new_arrays
        ev = evaluate_fn(server_round, arrays)
        if on_round is not None:
            on_round(strategy.rounds[-1], ev)
        accuracies.append(ev.get("accuracy", math.nan))
        target = rounds.target
        if target is not None and target.round_reached(accuracies) is not None:
            log.info(
                "target accuracy %.3f reached in round %d (mean over %d rounds)",
                target.accuracy,
                server_round,
                target.window,
            )
            break
    return arrays


def _name_the_silent(
    strategy: PowerAwareFedAvg, server_round: int, sent: set[int], got: set[int]
) -> None:
    """Rows in the round's report for nodes that sent no reply, and (all asked) for nodes
    that were absent."""
    nodes = strategy.rounds[-1].nodes
    for node_id in sorted(sent - got):  # no reply at all within the timeout
        nodes.append(strategy.failed_row(server_round, node_id, "no reply (timeout)"))
    if strategy.fraction_train >= 1.0:  # every connected node is asked: name the absent
        for node_id in sorted(set(strategy.fleet.nodes) - sent):
            error = "not connected this round (absent from the SuperLink)"
            nodes.append(strategy.failed_row(server_round, node_id, error))


def left_out_nodes(queried: Fleet, fleet: Sequence[NodeSettings] | None) -> list[dict[str, Any]]:
    """The nodes whose QUERY failed, as ``untrained-nodes`` records with the reason.

    A failed node has no name on the server, only Flower's numeric id. When the fleet is
    known (a simulation: ``fleet``), the nodes of the fleet that did not answer
    (``queried``) are the failed ones: one failure is that node, named with its device and
    real cap; several are each "one of" those names.
    """
    answered = {d.node_name for d in queried.nodes.values()}
    missing = [n for n in fleet or () if n.name not in answered]
    failures = sorted(queried.query_failures.items())
    out: list[dict[str, Any]] = []
    for node_id, reason in failures:
        node = missing[0] if len(failures) == 1 and len(missing) == 1 else None
        out.append(
            {
                "node": node.name if node else None,
                "node-id": str(node_id),
                "device": node.device if node else None,
                "p-max-w": node.p_max.to_record() if node else None,
                "cap-label": node.p_max.label if node else None,
                "stage": "query",
                "rounds-failed": 0,
                "reason": reason,
                **({"one-of": [n.name for n in missing]} if node is None and missing else {}),
            }
        )
    return out


def record_fleet(
    queried: Fleet, rec: RunRecorder, fleet: Sequence[NodeSettings] | None = None
) -> None:
    """``fleet.json`` and the console lines naming every node that answered the QUERY and
    every node left out, with the reason."""
    rec.left_out = left_out_nodes(queried, fleet)
    rec.write(
        "fleet.json",
        {
            "nodes": {str(k): v.to_record() for k, v in queried.nodes.items()},
            "query-failures": {str(k): v for k, v in queried.query_failures.items()},
        },
    )
    descs = sorted(queried.nodes.values(), key=lambda d: d.node_name)
    rec.console.print(
        f"fleet: {len(descs)} nodes answered "
        + ", ".join(f"{d.node_name} ({d.device}, cap {d.p_max.label})" for d in descs)
    )
    for node in rec.left_out:
        rec.console.print(f"fleet: [yellow]left out[/yellow] {untrained_label(node)}")


def settings_notes(settings: RunSettings, run_config: Mapping[str, Any]) -> list[str]:
    """What a user hears of at start, one line each: every deprecated key of the run config
    and what to write instead, a ``target-window`` the run cannot fill (``window_note``),
    and the settings that take no effect in this run (the run config is shared by runs, so
    a line, not a refusal: ``fl_client.effective``)."""
    window = window_note(settings)
    notes = [*translate_deprecated(run_config, app_defaults())[1], *([window] if window else [])]
    if named_by_caller_already():  # powerfl simulate said it once, before its runs
        return notes
    idle = check_effective([settings])
    return notes if idle is None else [*notes, idle]


def window_note(settings: RunSettings) -> str | None:
    """The line a run whose ``target-window`` is longer than ``num-rounds`` gets at start:
    it cannot reach the target by the window rule (allowed: a short trial run keeps the
    default window), though its first round at the target is still recorded."""
    if settings.target_window <= settings.num_rounds:
        return None
    return (
        f"target-window: {settings.target_window} rounds is longer than num-rounds "
        f"({settings.num_rounds}): the run cannot reach target-accuracy by the mean over "
        "target-window rounds (round-to-target stays empty; first-round-at-target is still "
        "recorded); give target-window ≤ num-rounds, or 1 for the first round at the target"
    )


def update_budget(settings: RunSettings, num_nodes: int, clock: VirtualClock) -> UpdateBudget:
    """``fedbuff``'s budget (``update-budget``): ``num-rounds`` of each node's updates, or
    the updates of ``num-rounds`` synchronous rounds of the fleet (``num-rounds`` × its
    nodes) in versions of the clock's K (``fedbuff_clock``), rounded up."""
    versions = math.ceil(settings.num_rounds * num_nodes / clock.buffer_size)
    return UpdateBudget(settings.update_budget, settings.num_rounds, versions)


def fedbuff_clock(
    settings: RunSettings, num_nodes: int, simulated: bool, rec: RunRecorder
) -> VirtualClock:
    """A ``fedbuff`` run's clock: the twins' device time orders a simulation (its fleet is
    known), the wall clock a deployment (docs/async.md); K is ``fleet_buffer_size``, and a
    default larger than the fleet is said."""
    clock = VirtualClock(
        fleet_buffer_size(settings.buffer_size, num_nodes),
        settings.staleness_weight,
        "virtual" if simulated else "arrival",
        settings.rate_weight,
        settings.buffer_step,
    )
    if clock.buffer_size < settings.buffer_size:
        rec.console.print(
            f"fedbuff: buffer-size {settings.buffer_size} (the default) is more than the "
            f"fleet's {num_nodes} nodes: each version takes {clock.buffer_size} updates"
        )
    return clock


def start_line(settings: RunSettings, run_dir: Path) -> str:
    """The run's first console line: method, model, budget, target and folder."""
    fedbuff = settings.aggregation == "fedbuff"
    return (
        f"[bold]powerfl[/bold] method={settings.method} model={settings.model} "
        + (
            f"aggregation=fedbuff buffer-size={settings.buffer_size} "
            + (
                f"updates≤{settings.num_rounds} per node "
                if settings.update_budget == "each-node"
                else f"updates≤{settings.num_rounds} rounds' worth "
            )
            if fedbuff
            else f"rounds≤{settings.num_rounds} "
        )
        + f"target={settings.target_accuracy:.2f} "
        + (
            f"(mean of {settings.target_window} {'versions' if fedbuff else 'rounds'}) "
            if settings.target_window > 1
            else ""
        )
        + (f"balance={settings.balance} " if settings.balance != "off" else "")
        + f"→ {run_dir}"
    )


def run_server(
    grid: Grid, run_config: Mapping[str, Any], fleet: Sequence[NodeSettings] | None = None
) -> dict[str, Any]:
    """The whole server side of a run; returns the summary that was written. ``fleet``:
    the nodes the run has (a simulation's fleet file), to name a node that fails."""
    settings = RunSettings.from_config(run_config)
    if fleet is None and settings.simulated_fleet:
        fleet = load_fleet(settings.fleet)
    run_dir = (
        claim_run_dir(settings.run_dir)
        if settings.run_dir
        else new_run_dir(settings.output_dir, settings.method)
    )
    target = Target(settings.target_accuracy, settings.target_window)
    rec = make_recorder(settings, run_dir, target)
    rec.console.print(start_line(settings, run_dir))
    for note in settings_notes(settings, run_config):
        log.warning(note)
        rec.console.print(f"[yellow]settings:[/yellow] {note}")
    model, weights = round0_model(settings)
    if weights is not None:
        new = f"; new layers: {', '.join(weights.new_layers)}" if weights.new_layers else ""
        rec.console.print(f"initial weights: {weights.path} (sha256 {weights.sha256[:12]}…{new})")
    rec.write(
        "settings.json",
        {
            **vars(settings),
            "initial_weights_sha256": weights.sha256 if weights else None,
            "initial_weights_new_layers": list(weights.new_layers) if weights else [],
        },
    )
    state = {k: v.clone() for k, v in model.state_dict().items()}
    r_est = estimate_proxy_r(settings, rec, state, weights)
    test_set = data_splits.load_splits(settings.dataset, seed=settings.seed).test

    def evaluate(server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = task.evaluate(model, test_set)
        metrics = {"loss": float(loss), "accuracy": float(acc)}
        if server_round == 0:
            rec.initial_eval(metrics)
        return metrics

    strategy = make_strategy(settings, r_est, weights)
    strategy.fleet.query(grid, settings.round_timeout_s)
    record_fleet(strategy.fleet, rec, fleet)
    initial = ArrayRecord(model.state_dict())
    if isinstance(rec, AsyncRecorder):  # aggregation = "fedbuff": no rounds
        clock = fedbuff_clock(settings, len(strategy.fleet.nodes), fleet is not None, rec)
        run = AsyncRun(strategy, grid, clock, rec, settings.round_timeout_s)
        budget = update_budget(settings, len(strategy.fleet.nodes), clock)
        final = run_fedbuff(run, initial, budget, evaluate)
    else:
        rounds = Rounds(settings.num_rounds, settings.round_timeout_s, target)
        final = run_rounds(strategy, grid, initial, rounds, evaluate, rec.record_round)
    torch.save(final.to_torch_state_dict(), run_dir / "final_model.pt")
    rec.left_out = left_out_nodes(strategy.fleet, fleet)  # with any that joined late
    return rec.finish(
        {
            "r": dict(zip(map(str, r_est.batch_sizes), r_est.r, strict=True)),
            "r-unreached": list(r_est.unreached),
            "r-cost-s": r_est.cost_time_s,
            "fleet-file": str(fleet_path(settings.fleet)),
            "num-fleet-nodes": len(load_fleet(settings.fleet)) if settings.fleet else None,
            "shared-profiling": strategy.luts.log,
            **({"round-plan": strategy.planner.log} if strategy.planner is not None else {}),
            "query-failures": {str(k): v for k, v in strategy.fleet.query_failures.items()},
            **(weights.to_record() if weights else {}),
        }
    )


def make_recorder(settings: RunSettings, run_dir: Path, target: Target) -> RunRecorder:
    """The run's recorder: a synchronous run's, or with ``aggregation = "fedbuff"`` the
    asynchronous one's (``fl_server.async_records``)."""
    if settings.aggregation == "fedbuff":
        return AsyncRecorder(
            run_dir,
            method=settings.method,
            target=target,
            idle_accounting=settings.idle_accounting,
        )
    return RunRecorder(
        run_dir,
        method=settings.method,
        target=target,
        balance=settings.balance,
        idle_accounting=settings.idle_accounting,
    )


def claim_run_dir(path: str) -> Path:
    """The run folder its starter named (``run-dir``), created if missing; one that holds
    another run's records (summary.json, rounds.jsonl) is refused, so no run writes into
    another's. ``powerfl simulate`` also holds the folder's lock for the whole run
    (``fl_client.files.claim_run_folder``), so a second run given it is refused at start."""
    run_dir = resolve_path(path).expanduser().resolve()
    check_run_records(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def make_server_app(
    overrides: Mapping[str, Any] | None = None,
    on_summary: Callable[[dict[str, Any]], None] | None = None,
    fleet: Sequence[NodeSettings] | None = None,
) -> ServerApp:
    """A ServerApp; ``overrides`` (used by ``powerfl simulate``) win over run_config,
    ``on_summary`` gets this run's summary (so an in-process caller reads back its own run,
    never the newest folder), and ``fleet`` (a simulation's nodes) names failed nodes."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        config = {**dict(context.run_config), **dict(overrides or {})}
        summary = run_server(grid, config, fleet)
        if on_summary is not None:
            on_summary(summary)

    return server_app


app = make_server_app()
