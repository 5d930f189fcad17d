"""ServerApp: builds the model, estimates r on the proxy set, runs PowerAwareFedAvg."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from fl_client import checkpoint, task
from fl_client.contract import TrainConfig
from fl_client.files import check_run_records
from fl_client.r_estimation import estimate_run_r, round0_model
from fl_client.settings import (
    NodeSettings,
    RunSettings,
    app_defaults,
    fleet_path,
    load_fleet,
    resolve_path,
    translate_deprecated,
)
from fl_server.lut_library import LUTLibrary
from fl_server.results import RunRecorder, new_run_dir, untrained_label
from strategies.power_aware import PowerAwareFedAvg
from strategies.round_plan import PlanSettings
from strategies.shared_profiling import SharedOptions, SharedProfiling

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
    rec: RunRecorder,
    weights: checkpoint.InitialWeights | None = None,
) -> PowerAwareFedAvg:
    """The run's strategy: its TRAIN config template (with the checkpoint's sha256 when the
    run starts from ``weights``), QUERY config and round plan."""
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
    strategy = PowerAwareFedAvg(
        template=template,
        query_config={"model": settings.model, "batch-sizes": list(r_est.batch_sizes)},
        on_round=rec.record_round,
        fraction_train=settings.fraction_train,
        min_train_nodes=settings.min_train_nodes,
        min_available_nodes=settings.min_train_nodes,
        aggregation=settings.aggregation,
    )
    if settings.balance != "off":
        strategy.planning = PlanSettings(
            settings.balance,
            round_deadline_s=settings.round_deadline_s,
            margin=settings.deadline_margin,
            peak_sigma_k=settings.peak_sigma_k,
            critical_r_weight=settings.critical_r_weight,
            tie_tolerance=settings.tie_tolerance,
        )
    if settings.shared_profiling == "fleet":
        strategy.shared = SharedProfiling(
            library=LUTLibrary(resolve_path(settings.cache_dir) / "library"),
            input_shape=task.input_shape_for(settings.model),
            options=SharedOptions(
                seed_cells=settings.shared_seed_cells,
                cells_per_cap=settings.shared_cells_per_cap,
                tie_tolerance=settings.tie_tolerance,
                peak_sigma_k=settings.peak_sigma_k,
            ),
            steps_train=settings.profile_steps_train,
        )
    return strategy


def left_out_nodes(
    strategy: PowerAwareFedAvg, fleet: Sequence[NodeSettings] | None
) -> list[dict[str, Any]]:
    """The nodes whose QUERY failed, as ``untrained-nodes`` records with the reason.

    A failed node has no name on the server, only Flower's numeric id. When the fleet is
    known (a simulation: ``fleet``), the nodes of the fleet that did not answer are the
    failed ones: one failure is that node, named with its device and real cap; several are
    each "one of" those names.
    """
    answered = {d.node_name for d in strategy.fleet.values()}
    missing = [n for n in fleet or () if n.name not in answered]
    failures = sorted(strategy.query_failures.items())
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
    strategy: PowerAwareFedAvg, rec: RunRecorder, fleet: Sequence[NodeSettings] | None = None
) -> None:
    """``fleet.json`` and the console lines naming every node that answered the QUERY and
    every node left out, with the reason."""
    rec.left_out = left_out_nodes(strategy, fleet)
    rec.write(
        "fleet.json",
        {
            "nodes": {str(k): v.to_record() for k, v in strategy.fleet.items()},
            "query-failures": {str(k): v for k, v in strategy.query_failures.items()},
        },
    )
    descs = sorted(strategy.fleet.values(), key=lambda d: d.node_name)
    rec.console.print(
        f"fleet: {len(descs)} nodes answered "
        + ", ".join(f"{d.node_name} ({d.device}, cap {d.p_max.label})" for d in descs)
    )
    for node in rec.left_out:
        rec.console.print(f"fleet: [yellow]left out[/yellow] {untrained_label(node)}")


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
    rec = RunRecorder(
        run_dir,
        method=settings.method,
        target_accuracy=settings.target_accuracy,
        balance=settings.balance,
        idle_accounting=settings.idle_accounting,
    )
    rec.console.print(
        f"[bold]powerfl[/bold] method={settings.method} model={settings.model} "
        f"rounds≤{settings.num_rounds} target={settings.target_accuracy:.2f} "
        + (f"balance={settings.balance} " if settings.balance != "off" else "")
        + f"→ {run_dir}"
    )
    for note in translate_deprecated(run_config, app_defaults())[1]:
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
    test_set = task.load_splits(settings.dataset, seed=settings.seed).test

    def evaluate(server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = task.evaluate(model, test_set)
        metrics = {"loss": float(loss), "accuracy": float(acc)}
        if server_round == 0:
            rec.initial_eval(metrics)
        return metrics

    strategy = make_strategy(settings, r_est, rec, weights)
    strategy.query_fleet(grid, settings.round_timeout_s)
    record_fleet(strategy, rec, fleet)
    final = strategy.run(
        grid,
        ArrayRecord(model.state_dict()),
        num_rounds=settings.num_rounds,
        timeout_s=settings.round_timeout_s,
        evaluate_fn=evaluate,
        target_accuracy=settings.target_accuracy,
    )
    torch.save(final.to_torch_state_dict(), run_dir / "final_model.pt")
    rec.left_out = left_out_nodes(strategy, fleet)  # with any that joined late and failed
    return rec.finish(
        {
            "r": dict(zip(map(str, r_est.batch_sizes), r_est.r, strict=True)),
            "r-unreached": list(r_est.unreached),
            "r-cost-s": r_est.cost_time_s,
            "fleet-file": str(fleet_path(settings.fleet)),
            "num-fleet-nodes": len(load_fleet(settings.fleet)) if settings.fleet else None,
            "shared-profiling": strategy.shared_log,
            **({"round-plan": strategy.plan_log} if strategy.planning is not None else {}),
            "query-failures": {str(k): v for k, v in strategy.query_failures.items()},
            **(weights.to_record() if weights else {}),
        }
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
