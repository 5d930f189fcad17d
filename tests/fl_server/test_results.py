"""Run records: synchronous time, fleet energy, time-to-target and files written as we go."""

from __future__ import annotations

import io
import json
import math

from rich.console import Console

from fl_server.results import RunRecorder, new_run_dir
from strategies.power_aware import TRAIN_METRIC_KEYS, NodeReport, RoundReport


def _node(
    rnd: int, name: str, train_s: float, energy_j: float, profile_s: float = 0.0
) -> NodeReport:
    m = {k: 0.0 for k in TRAIN_METRIC_KEYS}
    m.update(
        {
            "train-time-s": train_s,
            "energy-j": energy_j,
            "profile-time-s": profile_s,
            "profile-energy-j": profile_s * 2,
            "peak-power-w": 4.0,
            "p-max-w": 4.5,
            "batch-size": 16,
            "gpu-freq-mhz": 460.8,
            "num-examples": 100,
        }
    )
    return NodeReport(rnd, hash(name) % 100, name, "jetson-nano", True, m)


def test_records_accumulate_and_time_to_target(tmp_path):
    run_dir = new_run_dir(tmp_path, "power-aware")
    out = io.StringIO()
    rec = RunRecorder(
        run_dir,
        method="power-aware",
        target_accuracy=0.8,
        console=Console(file=out),
    )
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    r1 = RoundReport(1, [_node(1, "a", 10, 50, profile_s=2), _node(1, "b", 30, 60)])
    r1.nodes.append(NodeReport(1, 5, "c", "jetson-tx2-nx", False, error="boom"))
    rec.record_round(r1, {"accuracy": 0.5, "loss": 1.0})
    r2 = RoundReport(2, [_node(2, "a", 10, 50), _node(2, "b", 20, 60)])
    rec.record_round(r2, {"accuracy": 0.85, "loss": 0.5})
    rec.record_round(RoundReport(3, [_node(3, "a", 5, 5)]), {"accuracy": 0.9, "loss": 0.4})
    summ = rec.finish()

    assert summ["sim-time-to-target-s"] == 30 + 20  # slowest node per round
    assert summ["fleet-energy-to-target-j"] == (50 + 4 + 60) + (50 + 60)
    assert summ["round-to-target"] == 2
    assert summ["profile-share"] == 2 / (2 + 10 + 30 + 10 + 20 + 5)
    assert summ["nodes"]["c"]["rounds-failed"] == 1
    rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert rounds[0]["failed"] == ["c: boom"]
    nodes = (run_dir / "nodes.jsonl").read_text().splitlines()
    assert len(nodes) == 3 + 2 + 1
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["final-accuracy"] == 0.9 and not math.isnan(on_disk["sim-time-s"])
    assert "target 0.80 reached in round 2" in out.getvalue()


def test_pacing_totals_in_rounds_and_summary(tmp_path):
    run_dir = new_run_dir(tmp_path, "power-aware")
    out = io.StringIO()
    rec = RunRecorder(
        run_dir,
        method="power-aware",
        target_accuracy=0.9,
        console=Console(file=out),
        pacing="deadline",
    )
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    rec.record_round(RoundReport(1, [_node(1, "a", 10, 50)]), {"accuracy": 0.5, "loss": 1.0})
    a, b = _node(2, "a", 10, 40), _node(2, "b", 12, 60)
    a.metrics.update({"deadline-miss": 0.0, "predicted-energy-saved-j": 7.5})
    b.metrics.update({"deadline-miss": 1.0, "predicted-energy-saved-j": 0.0})
    report = RoundReport(2, [a, b], deadline_s=11.0, warnings=["pacing: w"])
    row = rec.record_round(report, {"accuracy": 0.6, "loss": 0.9})
    assert (
        row.deadline_s == 11.0 and row.deadline_misses == 1 and row.predicted_energy_saved_j == 7.5
    )
    summ = rec.finish()
    assert summ["pacing"] == "deadline" and summ["fleet-predicted-energy-saved-j"] == 7.5
    assert summ["deadline-misses"] == 1 and summ["nodes"]["a"]["predicted-energy-saved-j"] == 7.5
    rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert rounds[1]["deadline_s"] == 11.0 and rounds[1]["warnings"] == ["pacing: w"]
    assert "7.5 J predicted saving" in out.getvalue() and "warning" in out.getvalue()
