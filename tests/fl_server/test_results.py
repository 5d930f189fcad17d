"""Run records: the round's accounting (done once, here), synchronous time, fleet energy,
time-to-target, per-node totals, and files that are standard JSON written as we go."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fl_client.contract import RECORD_VERSION, Cap, NodeRow, TrainReport
from fl_server.results import (
    NodeTotals,
    RoundAccount,
    RunRecorder,
    new_run_dir,
    target_text,
    write_json,
)
from fl_server.target import Target
from strategies.power_aware import RoundReport


def _report(train_s: float, energy_j: float, profile_s: float = 0.0, **over: Any) -> TrainReport:
    fields: dict[str, Any] = {
        "num_examples": 100.0,
        "train_time_s": train_s,
        "train_energy_j": energy_j,
        "avg_power_w": energy_j / train_s if train_s else 0.0,
        "peak_power_w": 4.0,
        "idle_power_w": 1.0,
        "p_max_w": 4.5,
        "cap_margin": 0.05,
        "batch_size": 16.0,
        "gpu_freq_mhz": 460.8,
        "profile_time_s": profile_s,
        "profile_energy_j": profile_s * 2,
        "cap_violations": 0.0,
        "time_over_cap_s": 0.0,
        "train_loss": 0.5,
    }
    return TrainReport(**{**fields, **over})


def _node(
    rnd: int, name: str, train_s: float, energy_j: float, profile_s: float = 0.0, **over: Any
) -> NodeRow:
    rep = _report(train_s, energy_j, profile_s, **over)
    return NodeRow(rnd, sum(map(ord, name)), name, "jetson-nano", rep.cap, True, rep)


def _failed(rnd: int, name: str, cap: Cap | None = None, error: str = "boom") -> NodeRow:
    return NodeRow(rnd, 5, name, "jetson-tx2-nx", cap or Cap(7.0), False, error=error)


def _recorder(run_dir: Path, out: io.StringIO, **kw: Any) -> RunRecorder:
    return RunRecorder(
        run_dir,
        method="power-aware",
        target=Target(kw.pop("target_accuracy", 0.8), kw.pop("target_window", 1)),
        console=Console(file=out, width=200),
        **kw,
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_round_account_is_synchronous_and_prices_the_wait() -> None:
    rep = RoundReport(
        1,
        [
            _node(1, "slow", 3.0, 6.0, profile_s=1.0, idle_power_w=2.0),  # the straggler: 4 s
            _node(1, "fast", 1.0, 2.0, profile_s=0.5, idle_power_w=2.0),  # waits 2.5 s at 2 W
            _node(1, "unknown", 1.0, 2.0, idle_power_w=math.nan),  # idle unknown: not counted
            _failed(1, "failed"),
        ],
    )
    account = RoundAccount.of(rep)
    assert account.round_time_s == 4.0 and account.slowest == "slow"
    assert account.busy_s == {"slow": 4.0, "fast": 1.5, "unknown": 1.0}
    assert account.idle_energy_j == pytest.approx(2.0 * 2.5)
    assert account.train_time_s == 5.0 and account.profile_time_s == 1.5
    assert account.train_energy_j == 10.0 and account.profile_energy_j == 3.0
    assert account.busy_energy_j == 13.0  # training and profiling, over the nodes that ran
    # the headline counts the idle waiting by idle-accounting
    assert account.energy_j("on") == pytest.approx(13.0 + 2.0 * 2.5)
    assert account.energy_j("off") == 13.0
    # roles: the straggler is critical (its training and profiling: 6 + 2·1 J), the rest slack
    assert (account.critical.busy_j, account.critical.idle_j) == (8.0, 0.0)
    assert account.slack.busy_j == (2.0 + 1.0) + 2.0
    assert account.slack.idle_j == pytest.approx(2.0 * 2.5)
    assert account.critical.busy_j + account.slack.busy_j == account.busy_energy_j
    empty = RoundAccount.of(RoundReport(2, [_failed(2, "x")]))
    assert empty.round_time_s == 0.0 and empty.busy_energy_j == 0.0 and empty.slowest is None


def test_records_accumulate_and_time_to_target(tmp_path: Path) -> None:
    run_dir = new_run_dir(tmp_path, "power-aware")
    out = io.StringIO()
    rec = _recorder(run_dir, out)
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    r1 = RoundReport(1, [_node(1, "a", 10, 50, profile_s=2), _node(1, "b", 30, 60)])
    r1.nodes.append(_failed(1, "c"))
    row1 = rec.record_round(r1, {"accuracy": 0.5, "loss": 1.0})
    assert (row1.nodes_ok, row1.nodes_failed, row1.failed) == (2, 1, ["c: boom"])
    r2 = RoundReport(2, [_node(2, "a", 10, 50), _node(2, "b", 20, 60)])
    rec.record_round(r2, {"accuracy": 0.85, "loss": 0.5})
    rec.record_round(RoundReport(3, [_node(3, "a", 5, 5)]), {"accuracy": 0.9, "loss": 0.4})
    summ = rec.finish()

    assert summ["record-version"] == RECORD_VERSION == 4
    assert summ["sim-time-to-target-s"] == 30 + 20  # slowest node per round
    # a waits for b at 1 W: 30 − (10 + 2) s in round 1, 20 − 10 s in round 2
    idle = (30 - 12) * 1.0 + (20 - 10) * 1.0
    assert summ["idle-accounting"] == "on"
    assert summ["fleet-busy-energy-to-target-j"] == (50 + 4 + 60) + (50 + 60)
    assert summ["fleet-idle-energy-to-target-j"] == idle
    assert summ["fleet-energy-to-target-j"] == (50 + 4 + 60) + (50 + 60) + idle
    assert summ["fleet-energy-j"] == (50 + 4 + 60) + (50 + 60) + 5 + idle
    assert summ["fleet-busy-energy-j"] == (50 + 4 + 60) + (50 + 60) + 5
    assert summ["fleet-train-energy-j"] == 50 + 60 + 50 + 60 + 5
    assert summ["fleet-profile-energy-j"] == 4
    assert summ["round-to-target"] == 2 and summ["rounds"] == 3
    assert summ["profile-share"] == 2 / (2 + 10 + 30 + 10 + 20 + 5)
    assert summ["device-train-time-s"] == 75 and summ["device-profile-time-s"] == 2
    assert summ["nodes"]["c"]["rounds-failed"] == 1 and summ["nodes"]["c"]["rounds-ok"] == 0
    assert summ["nodes"]["c"]["errors"] == {"boom": 1}
    assert summ["node-rounds-failed"] == 1 and summ["over-cap-node-rounds"] == 0
    rounds = _lines(run_dir / "rounds.jsonl")
    assert rounds[0]["failed"] == ["c: boom"]
    assert rounds[0]["server-round"] == 1 and rounds[0]["nodes-ok"] == 2
    assert rounds[0]["round-time-s"] == 30 and rounds[1]["sim-time-s"] == 50
    assert rounds[1]["fleet-energy-j"] == (50 + 4 + 60) + (50 + 60) + idle
    assert rounds[1]["fleet-busy-energy-j"] == (50 + 4 + 60) + (50 + 60)
    assert rounds[0]["round-idle-energy-j"] == 18 and rounds[1]["fleet-idle-energy-j"] == idle
    # roles: b is critical in rounds 1 and 2; a alone is critical in round 3
    assert [r["critical-node"] for r in rounds] == ["b", "b", "a"]
    assert (rounds[0]["critical-busy-energy-j"], rounds[0]["slack-busy-energy-j"]) == (60, 54)
    assert (rounds[0]["critical-idle-energy-j"], rounds[0]["slack-idle-energy-j"]) == (0, 18)
    assert summ["critical-busy-energy-per-round-j"] == pytest.approx((60 + 60 + 5) / 3)
    assert summ["slack-idle-energy-per-round-j"] == pytest.approx((18 + 10 + 0) / 3)
    assert all("_" not in key for row in rounds for key in row)  # kebab-case
    nodes = _lines(run_dir / "nodes.jsonl")
    assert len(nodes) == 3 + 2 + 1
    assert nodes[0]["node-name"] == "a" and nodes[0]["train-energy-j"] == 50
    assert nodes[0]["profile-energy-j"] == 4 and "energy-j" not in nodes[0]
    assert nodes[2]["ok"] is False and nodes[2]["p-max-w"] == 7.0  # the failed node's cap
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["final-accuracy"] == 0.9 and not math.isnan(on_disk["sim-time-s"])
    assert on_disk == json.loads(json.dumps(summ))
    assert "target 0.80 reached in round 2" in out.getvalue()


def test_target_not_reached_leaves_to_target_figures_null(tmp_path: Path) -> None:
    rec = _recorder(tmp_path, io.StringIO(), target_accuracy=0.99)
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    rec.record_round(RoundReport(1, [_node(1, "a", 10, 50)]), {"accuracy": 0.5, "loss": 1.0})
    summ = rec.finish()
    assert summ["round-to-target"] is None and summ["sim-time-to-target-s"] is None
    assert summ["fleet-energy-to-target-j"] is None
    assert summ["fleet-busy-energy-to-target-j"] is None
    assert summ["fleet-idle-energy-to-target-j"] is None
    assert summ["first-round-at-target"] is None
    assert summ["sim-time-to-first-target-s"] is None
    assert summ["fleet-energy-to-first-target-j"] is None
    assert summ["sim-time-s"] == 10


#: Round accuracies where a lucky round (2) reaches 0.85 long before a 3-round mean does:
#: rounds 2–4 average 0.8267, 3–5 0.8333, 4–6 (0.84 + 0.88 + 0.87) / 3 = 0.8633.
LUCKY = (0.70, 0.86, 0.78, 0.84, 0.88, 0.87)


def _lucky_run(tmp_path: Path, out: io.StringIO, window: int) -> dict[str, Any]:
    """A run over ``LUCKY`` (round r: one node, r s and 10·r J) with target 0.85."""
    rec = _recorder(tmp_path, out, target_accuracy=0.85, target_window=window)
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    for rnd, acc in enumerate(LUCKY, 1):
        report = RoundReport(rnd, [_node(rnd, "a", float(rnd), 10.0 * rnd)])
        rec.record_round(report, {"accuracy": acc, "loss": 1.0})
    return rec.finish()


def test_the_summary_reaches_the_target_by_the_window_and_gives_the_first_round_apart(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    summ = _lucky_run(tmp_path, out, window=3)
    assert (summ["target-accuracy"], summ["target-window"]) == (0.85, 3)
    assert summ["round-to-target"] == 6 and summ["first-round-at-target"] == 2
    assert summ["sim-time-to-target-s"] == 1 + 2 + 3 + 4 + 5 + 6
    assert summ["fleet-energy-to-target-j"] == 10 * (1 + 2 + 3 + 4 + 5 + 6)
    assert summ["fleet-busy-energy-to-target-j"] == 10 * 21
    assert summ["fleet-idle-energy-to-target-j"] == 0  # one node: nobody waits
    assert summ["sim-time-to-first-target-s"] == 1 + 2
    assert summ["fleet-energy-to-first-target-j"] == 10 * (1 + 2)
    printed = " ".join(out.getvalue().split())
    assert "target 0.85 reached in round 6 (mean of rounds 4–6) after 21.0 s" in printed
    assert "; first round at 0.85: 2 (3.0 s, 30.0 J)" in printed


def test_a_window_of_one_is_the_first_round_at_the_target(tmp_path: Path) -> None:
    out = io.StringIO()
    summ = _lucky_run(tmp_path, out, window=1)
    assert summ["target-window"] == 1
    assert summ["round-to-target"] == summ["first-round-at-target"] == 2
    assert summ["sim-time-to-target-s"] == summ["sim-time-to-first-target-s"] == 3
    assert summ["fleet-energy-to-target-j"] == summ["fleet-energy-to-first-target-j"] == 30
    printed = " ".join(out.getvalue().split())
    assert "target 0.85 reached in round 2 after 3.0 s" in printed
    assert "mean of" not in printed and "first round at" not in printed


def test_a_window_the_run_never_fills_leaves_only_the_first_round(tmp_path: Path) -> None:
    summ = _lucky_run(tmp_path, io.StringIO(), window=4)  # best 4-round mean: 0.8425
    assert summ["round-to-target"] is None and summ["sim-time-to-target-s"] is None
    assert summ["first-round-at-target"] == 2
    text = target_text(summ)
    assert text.startswith("target 0.85 not reached (mean of 4 rounds); first round at 0.85: 2")


@pytest.mark.parametrize("idle_accounting", ["on", "off"])
def test_idle_accounting_sets_the_headline_and_the_records_keep_both_parts(
    tmp_path: Path, idle_accounting: str
) -> None:
    """A board waiting for the round is on: ``on`` counts its idle energy in the headline,
    ``off`` gives training + profiling alone (the figure before the setting)."""
    out = io.StringIO()
    rec = _recorder(tmp_path, out, idle_accounting=idle_accounting)
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    slow, fast = (
        _node(1, "slow", 8, 40, idle_power_w=1.5),
        _node(1, "fast", 2, 10, idle_power_w=1.5),
    )
    row = rec.record_round(RoundReport(1, [slow, fast]), {"accuracy": 0.9, "loss": 0.2})
    summ = rec.finish()
    busy, idle = 40.0 + 10.0, 1.5 * (8 - 2)
    headline = busy + idle if idle_accounting == "on" else busy
    assert summ["idle-accounting"] == idle_accounting
    assert summ["fleet-energy-to-target-j"] == summ["fleet-energy-j"] == headline
    assert summ["fleet-busy-energy-to-target-j"] == summ["fleet-busy-energy-j"] == busy
    assert summ["fleet-idle-energy-to-target-j"] == summ["fleet-idle-energy-j"] == idle
    assert row.round_energy_j == row.fleet_energy_j == headline
    assert (row.round_busy_energy_j, row.round_idle_energy_j) == (busy, idle)
    assert row.critical_node == "slow" and row.slack_idle_energy_j == idle
    assert (
        summ["critical-busy-energy-per-round-j"] == 40
        and summ["slack-busy-energy-per-round-j"] == 10
    )
    text = out.getvalue()
    assert f"using {headline:.1f} J fleet energy ({busy:.1f} J training + profiling" in text
    counted = "counted: idle-accounting = on" if idle_accounting == "on" else "not counted"
    assert f"at idle power {idle:.1f} J ({counted}" in text
    assert "energy per round: critical node (the slowest) 40.00 J busy + 0.00 J idle" in text


def test_an_unknown_idle_accounting_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="idle-accounting: unknown value 'yes'; allowed: on, off"):
        _recorder(tmp_path, io.StringIO(), idle_accounting="yes")


def test_node_totals_are_written_once_with_waits_caps_and_choices(tmp_path: Path) -> None:
    rec = _recorder(tmp_path, io.StringIO(), target_accuracy=1.0)
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    rec.record_round(
        RoundReport(
            1,
            [
                _node(1, "slow", 10, 50, idle_power_w=2.0),
                _node(1, "fast", 4, 20, idle_power_w=2.0, peak_power_w=4.6, cap_violations=2.0),
            ],
        ),
        {"accuracy": 0.3, "loss": 1.0},
    )
    rec.record_round(
        RoundReport(
            2,
            [
                _node(2, "slow", 6, 30, p_max_w=math.inf, drift_reprofiled=1.0),
                _failed(2, "fast", cap=Cap(4.5), error="no configuration fits"),
            ],
        ),
        {"accuracy": 0.4, "loss": 0.9},
    )
    summ = rec.finish()
    slow, fast = summ["nodes"]["slow"], summ["nodes"]["fast"]
    assert slow["rounds"] == 2 and slow["slowest-rounds"] == 2
    assert slow["slowest-share"] == 1.0 and slow["slowest-time-share"] == 1.0
    assert slow["caps"] == ["4.5 W", "none"] and slow["cap-label"] == "none"
    assert slow["p-max-w"] is None  # its last round had no cap: null, never Infinity
    assert slow["drift-reprofiles"] == 1 and summ["drift-reprofiles"] == 1
    assert slow["choices"] == {"b16@460.8": 2}
    assert fast["wait-s"] == 6 and fast["idle-energy-j"] == 12 and fast["mean-wait-s"] == 6
    assert fast["over-cap-rounds"] == 1 and fast["violation-rounds"] == 1
    assert fast["peak-power-w"] == 4.6 and fast["rounds-failed"] == 1
    assert fast["p-max-w"] == 4.5 and fast["cap-label"] == "4.5 W"
    assert fast["errors"] == {"no configuration fits": 1}
    assert summ["fleet-idle-energy-j"] == 12 and summ["over-cap-node-rounds"] == 1
    totals = NodeTotals("jetson-nano")
    assert totals.to_record(0.0)["mean-wait-s"] is None


def test_a_power_limit_node_is_recorded_in_watts(tmp_path: Path) -> None:
    """A node whose knob is the GPU power limit: its choice, summary and console carry W,
    and gpu-freq-mhz is the clock sampled during training, never the W value."""
    out = io.StringIO()
    rec = _recorder(tmp_path, out, target_accuracy=1.0)
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    limit = {"gpu_power_limit_w": 300.0, "gpu_freq_mhz": 1755.0}
    rec.record_round(
        RoundReport(1, [_node(1, "gpu", 10, 50, **limit), _node(1, "nano", 10, 50)]),
        {"accuracy": 0.3, "loss": 1.0},
    )
    summ = rec.finish()
    gpu, nano = summ["nodes"]["gpu"], summ["nodes"]["nano"]
    assert gpu["choices"] == {"b16@300W": 1} and gpu["gpu-power-limit-w"] == 300.0
    assert gpu["gpu-freq-mhz"] == 1755.0
    assert nano["choices"] == {"b16@460.8": 1} and "gpu-power-limit-w" not in nano
    [row] = [r for r in _lines(tmp_path / "nodes.jsonl") if r["node-name"] == "gpu"]
    assert row["gpu-power-limit-w"] == 300.0 and row["gpu-freq-mhz"] == 1755.0
    [other] = [r for r in _lines(tmp_path / "nodes.jsonl") if r["node-name"] == "nano"]
    assert "gpu-power-limit-w" not in other  # the frequency path's records are unchanged
    text = out.getvalue()
    assert "b16@300W" in text and "300 W" in text


def test_round_plan_totals_in_rounds_and_summary(tmp_path: Path) -> None:
    run_dir = new_run_dir(tmp_path, "power-aware")
    out = io.StringIO()
    rec = _recorder(run_dir, out, target_accuracy=0.9, balance="energy")
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    rec.record_round(RoundReport(1, [_node(1, "a", 10, 50)]), {"accuracy": 0.5, "loss": 1.0})
    a = _node(2, "a", 10, 40, deadline_miss=0.0, predicted_energy_saved_j=7.5, deadline_s=11.0)
    b = _node(2, "b", 12, 60, deadline_miss=1.0, predicted_energy_saved_j=0.0, deadline_s=11.0)
    report = RoundReport(2, [a, b], deadline_s=11.0, warnings=["balance: w"])
    row = rec.record_round(report, {"accuracy": 0.6, "loss": 0.9})
    assert (
        row.deadline_s == 11.0 and row.deadline_misses == 1 and row.predicted_energy_saved_j == 7.5
    )
    summ = rec.finish()
    assert summ["balance"] == "energy" and summ["fleet-predicted-energy-saved-j"] == 7.5
    assert summ["deadline-misses"] == 1 and summ["nodes"]["a"]["predicted-energy-saved-j"] == 7.5
    assert summ["nodes"]["b"]["deadline-misses"] == 1
    rounds = _lines(run_dir / "rounds.jsonl")
    assert rounds[0]["deadline-s"] is None and rounds[0]["deadline-misses"] == 0
    assert rounds[1]["deadline-s"] == 11.0 and rounds[1]["warnings"] == ["balance: w"]
    assert rounds[1]["predicted-energy-saved-j"] == 7.5
    assert "7.5 J predicted saving" in out.getvalue() and "warning" in out.getvalue()
    assert "round plan (balance = energy)" in out.getvalue()


def test_records_are_standard_json_without_inf_or_nan(tmp_path: Path) -> None:
    rec = _recorder(tmp_path, io.StringIO())
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    uncapped = _node(1, "a", 10, 50, p_max_w=math.inf, idle_power_w=math.nan)
    rec.record_round(
        RoundReport(1, [uncapped, _failed(1, "b", cap=Cap.NONE)]),
        {"accuracy": 0.5, "loss": math.nan},
    )
    rec.finish()
    for name in ("rounds.jsonl", "nodes.jsonl", "summary.json"):
        text = (tmp_path / name).read_text()
        assert "Infinity" not in text and "NaN" not in text, name
    nodes = _lines(tmp_path / "nodes.jsonl")
    assert [n["p-max-w"] for n in nodes] == [None, None]
    assert nodes[0]["idle-power-w"] is None
    assert _lines(tmp_path / "rounds.jsonl")[0]["loss"] is None
    write_json(tmp_path / "x.json", {"cap": Cap.NONE, "w": [math.inf, 1.0]})
    assert json.loads((tmp_path / "x.json").read_text()) == {"cap": None, "w": [None, 1.0]}


def test_new_run_dirs_never_collide(tmp_path: Path) -> None:
    dirs = {new_run_dir(tmp_path, "b1") for _ in range(3)}
    assert len(dirs) == 3 and all(d.is_dir() and d.name.split("-")[-1] for d in dirs)


def test_nodes_that_never_trained_are_listed_with_their_real_cap_and_reason(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    rec = _recorder(tmp_path, out)
    rec.left_out = [
        {
            "node": "ghost",
            "node-id": "17",
            "device": "jetson-nano",
            "p-max-w": 4.5,
            "cap-label": "4.5 W",
            "stage": "query",
            "rounds-failed": 0,
            "reason": "DeviceUnavailableError: no such board",
        }
    ]
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    for rnd in (1, 2):
        failed = _failed(rnd, "c", cap=Cap(7.0), error="SettingsError: no cell under the cap")
        flaky = _failed(rnd, "d", cap=Cap.NONE) if rnd == 1 else _node(rnd, "d", 5, 5)
        rec.record_round(
            RoundReport(rnd, [_node(rnd, "a", 10, 50), failed, flaky]),
            {
                "accuracy": 0.5,
                "loss": 1.0,
            },
        )
    summ = rec.finish()
    untrained = summ["untrained-nodes"]
    assert [n["node"] for n in untrained] == ["ghost", "c"]  # d trained in round 2
    assert untrained[1] == {
        "node": "c",
        "device": "jetson-tx2-nx",
        "p-max-w": 7.0,  # its real cap, not "none"
        "cap-label": "7 W",
        "stage": "train",
        "rounds-failed": 2,
        "reason": "SettingsError: no cell under the cap",
    }
    assert summ["nodes"]["c"]["p-max-w"] == 7.0
    text = (tmp_path / "summary.json").read_text()
    assert json.loads(text, parse_constant=pytest.fail)["untrained-nodes"] == untrained
    console = out.getvalue()
    assert (
        "never trained ghost (jetson-nano, cap 4.5 W): it could not describe its device "
        "(QUERY failed): DeviceUnavailableError: no such board"
    ) in console
    assert (
        "never trained c (jetson-tx2-nx, cap 7 W): its TRAIN failed in all 2 rounds it was "
        "asked: SettingsError: no cell under the cap"
    ) in console
    assert console.rstrip().splitlines()[-1].startswith("results: ")


def test_a_run_where_every_node_trained_lists_none(tmp_path: Path) -> None:
    rec = _recorder(tmp_path, io.StringIO())
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    rec.record_round(RoundReport(1, [_node(1, "a", 10, 50)]), {"accuracy": 0.5, "loss": 1.0})
    assert rec.finish()["untrained-nodes"] == []


def test_an_untrained_nodes_reason_is_not_cut(tmp_path: Path) -> None:
    rec = _recorder(tmp_path, io.StringIO())
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    long = "ValueError: p-max-w: 0.5 W is below the lowest B1 band " + "x" * 200
    rec.record_round(
        RoundReport(1, [_node(1, "a", 10, 50), _failed(1, "c", error=long)]),
        {"accuracy": 0.5, "loss": 1.0},
    )
    summ = rec.finish()
    assert summ["untrained-nodes"][0]["reason"] == long
    assert summ["nodes"]["c"]["errors"] == {long[:120]: 1}  # the per-node tally stays short
