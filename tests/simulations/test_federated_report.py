"""The federated report reads the recorder's accounting (records version 3) and never
re-derives it; cells run in a child process with their own log and timeout.

The records here are synthetic, in the form ``fl_server.results`` writes them, so every
number the report shows can be traced to one key of a run's summary or rounds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from simulations.experiments.federated import run_in_child
from simulations.experiments.federated_config import CELL_VERSION
from simulations.experiments.federated_report import render
from simulations.experiments.records import write_json


def node_totals(device: str, **over: Any) -> dict[str, Any]:
    """One node's totals as the recorder writes them (``summary["nodes"][name]``)."""
    t: dict[str, Any] = {
        "device": device,
        "p-max-w": 4.5,
        "cap-label": "4.5 W",
        "rounds": 3,
        "rounds-ok": 3,
        "rounds-failed": 0,
        "train-time-s": 30.0,
        "profile-time-s": 6.0,
        "train-energy-j": 100.0,
        "profile-energy-j": 20.0,
        "wait-s": 3.0,
        "idle-energy-j": 1.5,
        "mean-wait-s": 1.0,
        "slowest-rounds": 1,
        "slowest-time-s": 14.0,
        "slowest-share": 1 / 3,
        "slowest-time-share": 0.5,
        "over-cap-rounds": 0,
        "violation-rounds": 0,
        "peak-power-w": 4.4,
        "time-over-cap-s": 0.0,
        "drift-reprofiles": 0,
        "caps": ["4.5 W"],
        "choices": {"b64@921.6": 3},
        "errors": {},
        "batch-size": 64,
        "gpu-freq-mhz": 921.6,
        "predicted-energy-saved-j": 0.0,
        "deadline-misses": 0,
    }
    t.update(over)
    return t


def round_row(rnd: int, **over: Any) -> dict[str, Any]:
    """One line of rounds.jsonl (kebab-case)."""
    r: dict[str, Any] = {
        "server-round": rnd,
        "accuracy": 0.5 + 0.1 * rnd,
        "loss": 1.0,
        "round-time-s": 10.0,
        "sim-time-s": 10.0 * rnd,
        "round-energy-j": 42.0,
        "fleet-energy-j": 42.0 * rnd,
        "round-busy-energy-j": 40.0,
        "fleet-busy-energy-j": 40.0 * rnd,
        "round-idle-energy-j": 2.0,
        "fleet-idle-energy-j": 2.0 * rnd,
        "nodes-ok": 2,
        "nodes-failed": 0,
        "failed": [],
        "deadline-s": None,
        "deadline-misses": 0,
        "predicted-energy-saved-j": 0.0,
        "warnings": [],
        "critical-node": "nano",
        "critical-busy-energy-j": 25.0,
        "critical-idle-energy-j": 0.0,
        "slack-busy-energy-j": 15.0,
        "slack-idle-energy-j": 2.0,
    }
    r.update(over)
    return r


def cell(method: str, seed: int, uses: list[list[str]], **summary: Any) -> dict[str, Any]:
    """A version-3 cell record: a 3-round run of two nodes that reached the target in 2."""
    rounds = [
        round_row(1, **{"round-time-s": 14.0, "predicted-energy-saved-j": 0.0}),
        round_row(2, **{"round-time-s": 4.0, "predicted-energy-saved-j": 1.5}),
        round_row(3, **{"round-time-s": 6.0, "predicted-energy-saved-j": 2.5}),
    ]
    nodes = {
        "nano": node_totals("jetson-nano", caps=["4.5 W", "7 W"], **{"time-over-cap-s": 0.5}),
        "orin": node_totals(
            "jetson-orin-nano",
            **{"p-max-w": None, "cap-label": "none", "caps": ["none"], "time-over-cap-s": 0.25},
        ),
    }
    s: dict[str, Any] = {
        "record-version": 4,
        "method": method,
        "rounds": 3,
        "initial-accuracy": 0.1,
        "final-accuracy": 0.8,
        "target-accuracy": 0.7,
        "round-to-target": 2,
        "sim-time-to-target-s": 18.0,
        "sim-time-to-target-free-profiling-s": 16.0,
        "idle-accounting": "on",
        "fleet-energy-to-target-j": 84.0,
        "fleet-busy-energy-to-target-j": 80.0,
        "fleet-idle-energy-to-target-j": 4.0,
        "sim-time-s": 24.0,
        "fleet-energy-j": 126.0,
        "fleet-busy-energy-j": 120.0,
        "fleet-train-energy-j": 100.0,
        "fleet-profile-energy-j": 20.0,
        "fleet-idle-energy-j": 6.0,
        "device-train-time-s": 60.0,
        "device-profile-time-s": 12.0,
        "profile-share": 12.0 / 72.0,
        "balance": "off",
        "fleet-predicted-energy-saved-j": 4.0,
        "deadline-misses": 0,
        "drift-reprofiles": 0,
        "node-rounds-failed": 1,
        "over-cap-node-rounds": 3,
        "nodes": nodes,
        "run-dir": "/nowhere",
    }
    s.update(summary)
    failed = {"server-round": 2, "node-name": "nano", "ok": False, "error": "cap too low"}
    return {
        "key": "-".join([*(x for u in uses for x in u), str(seed)]),
        "study": "federated",
        "cell-version": CELL_VERSION,
        "settings": {"method": method, "seed": seed},
        "uses": uses,
        "seed": seed,
        "method": method,
        "summary": s,
        "rounds": rounds,
        # nodes.jsonl rows: only the failures are read (for their reasons), never summed
        "nodes": [
            failed,
            {"server-round": 1, "node-name": "nano", "ok": True, "train-energy-j": 1e9},
        ],
        "fleet": None,
        "host-wall-s": 12.0,
    }


def _output(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    out = tmp_path / "out"
    config = {
        "name": "synthetic",
        "study": "federated",
        "description": "",
        "scale": "mini",
        "fleet": "fleet.toml",
        "model": "cnn",
        "partitioning": "iid",
        "num-rounds": 3,
        "local-epochs": 1,
        "target-accuracy": 0.7,
        "seeds": 1,
        "scenario-method": "power-aware",
        "deadline-margin": 0.05,
    }
    manifest = {"study": "federated", "config": config, "complete": True, "command": "x"}
    write_json(out / "manifest.json", manifest)
    for rec in records:
        write_json(out / "records" / "cells" / f"{rec['key']}.json", rec)
    return out


def test_report_shows_the_recorded_node_totals(tmp_path):
    recs = [
        cell("b1", 0, [["methods", "b1"]]),
        cell("power-aware", 0, [["methods", "power-aware"], ["balance-energy", "off"]]),
        cell("power-aware", 0, [["balance-energy", "energy"]], balance="energy"),
    ]
    report = render(_output(tmp_path, recs)).read_text()
    # energy J = training + profiling, straight from the summary's node totals
    assert "| nano | jetson-nano | 4.5–7 W | b64@921.6 ×3 | 30.0 | 6.00 | 120 |" in report
    assert "| orin | jetson-orin-nano | none |" in report
    assert "| nano | jetson-nano | 33% / 50% / 1.00 | 33% / 50% / 1.00 |" in report
    assert "- b1 seed 0: nano round 2: cap too low" in report  # reasons from nodes.jsonl
    assert (
        "| Ours | 1/1 | 2.0 ± 0.0 | 18.0 ± 0.0 | 84.0 ± 0.0 | 80.0 ± 0.0 | 4.00 ± 0.00 |" in report
    )
    assert "## The round plan's energy mode: balance off vs energy" in report
    assert 'with `balance = "off"` and `balance = "energy"` (deadline-margin 0.05)' in report
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["methods"]["b1"]["over-cap-node-rounds-mean"] == 3


def test_report_checks_ours_against_b1_seed_by_seed(tmp_path):
    # seed 0: B1 spends less on training + profiling (78 J < 80 J) but waits more (10 J)
    b1_waits = {"fleet-busy-energy-to-target-j": 78.0, "fleet-idle-energy-to-target-j": 10.0}
    recs = [
        cell("b1", 0, [["methods", "b1"]], **{"sim-time-to-target-s": 20.0, **b1_waits}),
        cell("power-aware", 0, [["methods", "power-aware"]]),
        cell("b1", 1, [["methods", "b1"]], **{"sim-time-to-target-s": 17.0}),
        cell("power-aware", 1, [["methods", "power-aware"]]),
    ]
    report = render(_output(tmp_path, recs)).read_text()
    assert "### Ours against B1, seed by seed (profiling counted)" in report
    # seed 0: 18 s ≤ 20 s and, idle waiting counted, 84 J ≤ 88 J; seed 1: 18 s > 17 s
    assert "| 0 | 18.0 | 20.0 | 84.0 | 88.0 | yes | 16.0 | 12.5% | 1.11× |" in report
    assert "| 1 | 18.0 | 17.0 | 84.0 | 84.0 | no | 16.0 | 12.5% | 0.94× |" in report


def test_cells_of_an_older_record_version_are_not_mixed_in(tmp_path):
    old = cell("b1", 0, [["methods", "b1"]])
    old.update({"key": "old", "cell-version": CELL_VERSION - 1})
    new = cell("b1", 0, [["methods", "b1"]])
    render(_output(tmp_path, [old, new]))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["methods"]["b1"]["seeds"] == 1


# --------------------------------------------------------------------------- the child


def fake_simulate(overrides: dict[str, Any]) -> dict[str, Any]:
    """Stands in for ``simulations.run.simulate`` in a spawned child."""
    print("round   1  accuracy 0.500", flush=True)
    if overrides.get("fail"):
        raise RuntimeError("the engine broke")
    time.sleep(float(overrides.get("sleep-s", 0.0)))
    return {"pid": os.getpid(), "cwd": os.getcwd(), "settings": overrides}


def test_a_cell_runs_in_its_own_process_with_its_log(tmp_path):
    lines: list[str] = []
    result, why = run_in_child(fake_simulate, {"seed": 3}, tmp_path, 60, lines.append)
    assert why == "" and result is not None
    assert result["pid"] != os.getpid() and result["settings"] == {"seed": 3}
    assert "round   1  accuracy 0.500" in lines
    log = (tmp_path / "simulate.log").read_text()
    assert '"seed": 3' in log and "accuracy 0.500" in log


def test_a_failing_cell_leaves_its_traceback_in_the_log(tmp_path):
    result, why = run_in_child(fake_simulate, {"fail": True}, tmp_path, 60)
    assert result is None and why == "exit status 1"
    assert "RuntimeError: the engine broke" in (tmp_path / "simulate.log").read_text()


@pytest.mark.skipif(sys.platform == "win32", reason="process groups")
def test_a_cell_past_its_timeout_is_ended(tmp_path):
    t0 = time.perf_counter()
    result, why = run_in_child(fake_simulate, {"sleep-s": 120}, tmp_path, 3)
    assert result is None and why == "timed out"
    assert time.perf_counter() - t0 < 60
