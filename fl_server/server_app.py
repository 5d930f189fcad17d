"""ServerApp: builds the model, estimates r on the proxy set, runs PowerAwareFedAvg."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from fl_client import task
from fl_client.settings import RunSettings, load_fleet, resolve_path
from fl_server.results import RunRecorder, new_run_dir
from strategies.power_aware import PowerAwareFedAvg, RoundReport
from fl_client.r_estimation import estimate_r

log = logging.getLogger(__name__)


def run_server(grid: Grid, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The whole server side of a run; returns the summary that was written."""
    settings = RunSettings.from_config(run_config)
    torch.manual_seed(settings.seed)
    cache_dir = resolve_path(settings.cache_dir)
    run_dir = new_run_dir(settings.output_dir, settings.method)
    rec = RunRecorder(
        run_dir,
        method=settings.method,
        target_accuracy=settings.target_accuracy,
        pacing=settings.pacing,
    )
    rec.console.print(
        f"[bold]powerfl[/bold] method={settings.method} model={settings.model} "
        f"rounds≤{settings.num_rounds} target={settings.target_accuracy:.2f} "
        + (f"pacing={settings.pacing} " if settings.pacing != "off" else "")
        + f"→ {run_dir}"
    )
    rec.write("settings.json", {**{k: v for k, v in vars(settings).items()}})

    splits = task.load_digits_splits(seed=settings.seed)
    model = task.build_model(settings.model)
    initial_state = {k: v.clone() for k, v in model.state_dict().items()}

    t0 = time.perf_counter()
    r_est = estimate_r(
        settings.model,
        initial_state,
        splits.proxy_train,
        splits.proxy_eval,
        settings.batch_sizes,
        target_accuracy=settings.proxy_target_accuracy,
        lr_ref=settings.lr_ref,
        b_ref=settings.b_ref,
        eval_every_samples=int(settings.extra.get("eval-every-samples", 256)),
        max_samples=int(settings.extra.get("max-samples", 40_000)),
        seeds=tuple(range(settings.r_seeds)),
        cache_dir=cache_dir / "r",
        progress=True,
    )
    rec.write("r.json", r_est.to_json())
    rec.console.print(
        "r on the proxy set: "
        + ", ".join(f"b{b}={r:.2f}" for b, r in zip(r_est.batch_sizes, r_est.r, strict=True))
        + f"  ({time.perf_counter() - t0:.1f} s)"
    )

    test_set = splits.test

    def evaluate(server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = task.evaluate(model, test_set)
        metrics = {"loss": float(loss), "accuracy": float(acc)}
        if server_round == 0:
            rec.initial_eval(metrics)
        return metrics

    def on_round(report: RoundReport, metrics: dict[str, float]) -> None:
        rec.record_round(report, metrics)

    strategy = PowerAwareFedAvg(
        batch_sizes=list(r_est.batch_sizes),
        r=list(r_est.r),
        method=settings.method,
        train_config={
            "lr-ref": settings.lr_ref,
            "b-ref": settings.b_ref,
            "local-epochs": settings.local_epochs,
            "model": settings.model,
            **(
                {
                    "fixed-batch-size": settings.fixed_batch_size,
                    "fixed-freq-mhz": settings.fixed_freq_mhz,
                }
                if settings.method == "fixed"
                else {}
            ),
        },
        query_config={"model": settings.model, "batch-sizes": list(r_est.batch_sizes)},
        on_round=on_round,
        fraction_train=settings.fraction_train,
        min_train_nodes=settings.min_train_nodes,
        min_available_nodes=settings.min_train_nodes,
        pacing=settings.pacing,
        pacing_deadline_s=settings.pacing_deadline_s,
    )
    strategy.query_fleet(grid, settings.round_timeout_s)
    rec.write(
        "fleet.json",
        {
            "nodes": {str(k): v for k, v in strategy.fleet.items()},
            "query-failures": {str(k): v for k, v in strategy.query_failures.items()},
        },
    )
    rec.console.print(
        f"fleet: {len(strategy.fleet)} nodes answered "
        + ", ".join(
            f"{v.get('node-name')} ({v.get('device')}, cap {v.get('p-max-label')})"
            for _, v in sorted(strategy.fleet.items(), key=lambda kv: str(kv[1].get("node-name")))
        )
    )
    final = strategy.run(
        grid,
        ArrayRecord(model.state_dict()),
        num_rounds=settings.num_rounds,
        timeout_s=settings.round_timeout_s,
        evaluate_fn=evaluate,
        target_accuracy=settings.target_accuracy,
    )
    torch.save(final.to_torch_state_dict(), run_dir / "final_model.pt")
    return rec.finish(
        {
            "r": dict(zip(map(str, r_est.batch_sizes), r_est.r, strict=True)),
            "r-unreached": list(r_est.unreached),
            "r-cost-s": r_est.cost_time_s,
            "fleet-file": str(resolve_path(settings.fleet)),
            "num-fleet-nodes": len(load_fleet(settings.fleet)) if settings.fleet else None,
        }
    )


def make_server_app(overrides: Mapping[str, Any] | None = None) -> ServerApp:
    """A ServerApp; ``overrides`` (used by ``powerfl simulate``) win over run_config."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, {**dict(context.run_config), **dict(overrides or {})})

    return server_app


app = make_server_app()
