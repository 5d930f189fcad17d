"""End to end: a small fleet in Flower's real simulation engine, every node under its cap."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from simulations.cli import main
from simulations.report import load_run
from tests.simulations.conftest import REPO, SmallRun
from tests.simulations.test_report import check_timeline_matches_records
from tests.simulations.test_report_plots import png_size

FLEET = """
[[node]]
name = "nano-4.5w"
device = "jetson-nano"
p-max-w = 4.5

[[node]]
name = "tx2nx-7w"
device = "jetson-tx2-nx"
p-max-w = 7.0

[[node]]
name = "orin-free"
device = "jetson-orin-nano"
p-max-w = "none"
"""


@pytest.mark.slow
def test_small_fleet_trains_under_caps_with_rising_accuracy(
    tmp_path: Path, small_run: Callable[..., SmallRun]
) -> None:
    run = small_run(FLEET, "aggregation='fedavg'")  # synchronous rounds (B1's default)
    proc, run_dir, summary = run.proc, run.run_dir, run.summary
    rounds, nodes = run.rounds, run.nodes

    assert summary["record-version"] == 4
    assert [r["server-round"] for r in rounds] == [1, 2, 3]
    # the headline counts idle waiting (idle-accounting = on): its parts, round by round
    assert summary["fleet-energy-j"] == pytest.approx(
        summary["fleet-busy-energy-j"] + summary["fleet-idle-energy-j"]
    )
    assert summary["fleet-idle-energy-j"] == pytest.approx(
        sum(r["round-idle-energy-j"] for r in rounds)
    )
    assert all(r["critical-node"] is not None for r in rounds)
    assert all(r["nodes-ok"] == 3 and r["nodes-failed"] == 0 for r in rounds)
    # accuracy rises well above the untrained model's
    assert summary["final-accuracy"] > summary["initial-accuracy"] + 0.2
    # every node trained under its own cap, every round, on the twin's sensor
    assert len(nodes) == 9
    for n in nodes:
        cap = math.inf if n["p-max-w"] is None else float(n["p-max-w"])  # null: no cap
        assert n["ok"] and n["peak-power-w"] < cap, n
        assert n["train-time-s"] > 0 and n["train-energy-j"] > 0
    by_name = {n["node-name"]: n for n in nodes if n["server-round"] == 1}
    assert set(by_name) == {"nano-4.5w", "tx2nx-7w", "orin-free"}
    # profiling happened once per node (first round: its slices of the fleet-shared profile,
    # shared-time-s, and the check of its chosen cell) and is accounted as device time
    assert all(n["profile-time-s"] + n["shared-time-s"] > 0 for n in by_name.values())
    later = [n for n in nodes if n["server-round"] > 1]
    assert all(n["profile-time-s"] == 0 and n["shared-time-s"] == 0 for n in later)
    # the capped Nano cannot run where the uncapped Orin does
    assert by_name["nano-4.5w"]["peak-power-w"] < 4.5
    assert "results:" in proc.stdout
    # its pictures, drawn at its end from its records, and `powerfl report` of the run
    for name in ("timeline.png", "progress.png"):
        assert f"{name[:-4]:<12} {run_dir.resolve() / name}" in proc.stdout
        assert png_size(run_dir / name)[0] > 500
    check_timeline_matches_records(load_run(run_dir))
    assert main(["report", str(run_dir), "--out", str(tmp_path / "report")]) == 0
    assert png_size(tmp_path / "report" / run_dir.name / "timeline.png")[0] > 500


@pytest.mark.slow
def test_simulate_through_flowers_simulation_runtime(tmp_path):
    """``powerfl simulate --engine runtime``: a 2-node fleet, one round, through Flower's
    Simulation Runtime (its own SuperLink, ``flwr run``). The console shows the run as the
    in-process engine does, and the run's folder is ``<output-dir>/<UTC time>-<method>``
    (the ``run-dir`` the command hands the run), with its summary and data split."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("\n\n".join(FLEET.strip().split("\n\n")[:2]) + "\n")
    out = tmp_path / "runs"
    cmd = [
        sys.executable, "-m", "simulations", "simulate", "--engine", "runtime",
        "--methods", "power-aware", "--fleet", str(fleet), "--rounds", "1",
        "--output-dir", str(out),
        "-c", f"cache-dir={json.dumps(str(tmp_path / 'cache'))}",
        "-c", "local-epochs=1", "-c", "batch-sizes='32,64'", "-c", "partitioning='iid'",
        "-c", "proxy-target-accuracy=0.3", "-c", "target-accuracy=1.0",
        "-c", "aggregation='fedavg'",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]  # no folder of the runtime's own
    assert run_dir.name.endswith("-power-aware")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run-dir"] == str(run_dir.resolve())
    assert summary["rounds"] == 1
    assert {n: v["rounds-ok"] for n, v in summary["nodes"].items()} == {
        "nano-4.5w": 1,
        "tx2nx-7w": 1,
    }
    assert (run_dir / "split.json").is_file()  # the data split, saved as in-process
    text = proc.stdout
    assert "data split of digits over 2 nodes: iid" in text
    for expected in ("powerfl method=power-aware", "fleet: 2 nodes answered", "round   1"):
        assert expected in text
    assert f"  power-aware  {run_dir.resolve()}" in text  # the results line
    for absent in ("Starting logstream", "simulated SuperNodes"):
        assert absent not in text


@pytest.mark.slow
def test_the_default_runs_power_aware_asynchronously(small_run: Callable[..., SmallRun]) -> None:
    """``aggregation = "auto"`` (the default) resolves to ``fedbuff`` for power-aware: no
    rounds, every node kept busy, on the engine; the start line, ``settings.json`` and the
    summary say so, and every node trains under its cap."""
    run = small_run(FLEET)
    summary = run.summary
    assert "aggregation=fedbuff" in run.proc.stdout
    assert json.loads((run.run_dir / "settings.json").read_text())["aggregation"] == "fedbuff"
    assert summary["aggregation"] == "fedbuff" and (run.run_dir / "updates.jsonl").is_file()
    assert summary["idle-share"] is not None and 0.0 <= summary["idle-share"] < 1.0
    assert all(n["rounds-ok"] > 0 for n in summary["nodes"].values())
    assert all(n["over-cap-rounds"] == 0 for n in summary["nodes"].values())
