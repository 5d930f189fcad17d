"""Run one Flower simulation of a fleet as a function: the ``simulate`` command and the
studies call it the same way, and get back that run's own summary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fl_client.settings import SettingsError

FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


def flower_env(flwr_home: Path | None = None) -> None:
    """Quiet, offline Flower with its home inside the work tree."""
    for key, value in FLOWER_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("FLWR_HOME", str(flwr_home or Path.cwd() / ".flwr"))
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


def check_partitions(settings: Any, num_nodes: int) -> None:
    """Refuse a fleet the embedded data cannot be split over, before any engine starts."""
    from fl_client import task

    try:
        task.client_data(
            0,
            num_nodes,
            partitioning=settings.partitioning,
            alpha=settings.dirichlet_alpha,
            seed=settings.seed,
        )
    except ValueError as err:
        raise SettingsError(
            f"fleet: the {task.load_digits_splits(settings.seed).sizes()['pool']} training "
            f"images cannot be split over {num_nodes} nodes: {err}"
        ) from None


def simulate(
    overrides: dict[str, Any], *, backend: str = "ray", num_cpus_per_node: float = 1.0
) -> dict[str, Any]:
    """Run one Flower simulation of the fleet with these run settings; return its summary."""
    from flwr.simulation import run_simulation

    from fl_client.client_app import make_client_app
    from fl_client.settings import RunSettings, load_fleet
    from fl_server.server_app import make_server_app

    settings = RunSettings.from_config(overrides)  # fail fast, before any engine starts
    fleet = load_fleet(settings.fleet)
    check_partitions(settings, len(fleet))
    summaries: list[dict[str, Any]] = []
    run_simulation(
        server_app=make_server_app(overrides, on_summary=summaries.append),
        client_app=make_client_app(overrides),
        num_supernodes=len(fleet),
        backend_name=backend,
        backend_config={
            "client_resources": {"num_cpus": num_cpus_per_node, "num_gpus": 0.0},
            "init_args": {"num_cpus": os.cpu_count() or 2, "include_dashboard": False},
        },
    )
    if not summaries:
        raise RuntimeError(
            "the simulation finished without writing a summary: see the log above for the "
            "server's error"
        )
    return summaries[-1]
