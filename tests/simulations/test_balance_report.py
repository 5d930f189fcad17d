"""The balance study's report on synthetic records (the form ``fl_server.results`` writes):
paired per-seed ratios, runs that missed the target counted apart, the attribution, the
deadline share and the goals' verdicts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from simulations.experiments.balance_report import (
    Goal,
    _fleet_groups,
    deadline_node_rounds,
    goals,
    measured_straggler_ratio,
    paired,
    time_attribution,
)
from simulations.experiments.federated_metrics import aggregate, cell_metrics
from simulations.experiments.federated_report import render
from tests.simulations.test_federated_report import _output, cell, round_row


def arm(fleet: str, name: str, seed: int, time_s: float, energy_j: float, **over: Any) -> dict:
    """A cell of the balance scenario: time and energy to target (busy + idle) as given,
    reached in round 2 with 2 s of profiling in the time (free profiling: time − 2)."""
    method = "b1" if name == "b1" else "power-aware"
    uses = [["balance", f"{fleet}/{name}"]]
    rec = cell(
        method,
        seed,
        uses,
        **{
            "sim-time-to-target-s": time_s,
            "sim-time-to-target-free-profiling-s": time_s - 2.0,
            "fleet-busy-energy-to-target-j": energy_j - 4.0,
            "fleet-idle-energy-to-target-j": 4.0,
            **over,
        },
    )
    rec["key"] = f"{fleet}-{name}-{seed}"
    return rec


def missed_target(rec: dict) -> dict:
    rec["summary"].update({"round-to-target": None, "sim-time-to-target-s": None})
    rec["summary"].update({"final-accuracy": 0.71})
    return rec


def study(fleet: str = "default") -> list[dict]:
    """3 seeds: B1 20 s / 100 J, off 10 s / 90 J; samples 7 s / 81 J in seeds 0 and 1 and
    misses the target in seed 2; energy 10 s / 72 J."""
    recs = []
    for s in range(3):
        recs += [
            arm(fleet, "b1", s, 20.0, 100.0),
            arm(fleet, "off", s, 10.0, 90.0),
            arm(fleet, "energy", s, 10.0, 72.0),
        ]
        samples = arm(fleet, "samples", s, 7.0 if s == 0 else 6.0, 81.0)
        recs.append(missed_target(samples) if s == 2 else samples)
    return recs


def groups_of(recs: list[dict]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for variant, g in aggregate(recs)["scenarios"]["balance"].items():
        fleet, _, name = variant.rpartition("/")
        out.setdefault(fleet, {})[name] = g
    return out


def test_paired_ratios_leave_out_a_seed_that_missed_the_target():
    g = groups_of(study())["default"]
    t = paired(g["samples"], g["off"], "time-to-target-s")
    assert t.ratios == pytest.approx((0.7, 0.6)) and t.seeds == 3
    assert t.mean == pytest.approx(0.65)
    assert t.text() == "0.65× (0.60–0.70, 2/3)"
    assert g["samples"]["seeds-reached"] == 2  # the mean is over the seeds that reached it
    assert g["samples"]["time-to-target-s-mean"] == pytest.approx(6.5)


def test_time_attribution_multiplies_to_the_ratio():
    a = cell_metrics(arm("d", "steps", 0, 9.0, 1.0, **{"round-to-target": 3}))
    ref = cell_metrics(arm("d", "b1", 0, 20.0, 1.0, **{"round-to-target": 4}))
    f = time_attribution(a, ref)
    assert f is not None
    assert f["ratio"] == pytest.approx(9.0 / 20.0)
    assert f["rounds"] == pytest.approx(3 / 4)
    assert f["per-round"] == pytest.approx((7.0 / 3) / (18.0 / 4))
    assert f["profiling"] == pytest.approx((9.0 / 7.0) / (20.0 / 18.0))
    assert f["rounds"] * f["per-round"] * f["profiling"] == pytest.approx(f["ratio"])
    assert time_attribution(a, cell_metrics(missed_target(arm("d", "b1", 0, 1.0, 1.0)))) is None


def test_goals_are_checked_on_the_mean_of_the_paired_ratios():
    checks = {(g.fleet, g.arm, g.goal): g for g in goals(groups_of(study()), "default")}
    samples = checks[("default", "samples", "time ≤ 0.77× off, energy ≤ 1×")]
    assert samples.value == pytest.approx(0.65) and samples.verdict() == "met"
    # energy mode: 0.8× the energy at the same time is met; its time goal is missed by 30%
    energy = checks[("default", "energy", "energy ≤ 0.85× off at time ≤ 1.01×")]
    assert energy.value == pytest.approx(0.8) and energy.verdict() == "met"
    time = checks[("default", "energy", "time ≤ 0.77× off, energy ≤ 1×")]
    assert time.verdict() == "missed by 30% (1.00×)"
    # against B1 on the default fleet: 0.5× is the goal, off is at 0.50× and met
    assert checks[("default", "off", "time ≤ 0.5× B1")].verdict() == "met"


def test_a_goal_met_on_time_but_not_on_its_side_condition_is_missed():
    g = Goal("f", "steps", "time ≤ 0.77× off, energy ≤ 1×", 0.7, 0.77, "energy 1.10× off", False)
    assert g.met is False and g.verdict() == "missed: energy 1.10× off"
    assert Goal("f", "steps", "x", None, 0.77).verdict() == "not measured (no paired seed)"


def test_other_fleets_must_not_be_later_than_b1():
    recs = study("straggler-5x")
    recs.append(arm("straggler-5x", "steps", 0, 24.0, 90.0))  # later than B1 (20 s)
    checks = {(g.arm, g.goal): g for g in goals(groups_of(recs), "default")}
    assert checks[("steps", "time ≤ 1× B1")].verdict() == "missed by 20% (1.20×)"
    assert checks[("off", "time ≤ 1× B1")].verdict() == "met"


def test_deadline_share_counts_node_rounds_with_a_deadline():
    """Late: training time over the round's deadline (beyond a 1e-9 share: a pace-setter
    that matched its own forecast to one ulp over is on time, though its flag says late)."""
    rec = arm("default", "steps", 0, 9.0, 80.0)
    rec["rounds"] = [
        round_row(1, **{"deadline-s": None}),  # round 1: no plan yet
        round_row(2, **{"deadline-s": 0.2, "deadline-misses": 1}),
        round_row(3, **{"deadline-s": 0.2, "deadline-misses": 2}),
    ]
    rec["summary"]["round-plan"] = [
        {"round": 2, "critical": ["nano"]},
        {"round": 3, "critical": ["nano"]},
    ]

    def row(rnd: int, name: str, t: float, ok: bool = True) -> dict:
        return {"server-round": rnd, "node-name": name, "ok": ok, "train-time-s": t}

    rec["nodes"] = [
        row(1, "nano", 5.0),  # no deadline in round 1
        row(1, "orin", 1.0),
        row(2, "nano", 0.2 * (1 + 1e-12)),  # a hair over its own forecast: on time
        row(2, "orin", 0.1),
        row(3, "nano", 0.25),  # the pace-setter, late
        row(3, "orin", 0.21),  # a slack node, late
        row(3, "tx2", 0.0, ok=False),  # failed: not a node-round that had to keep it
    ]
    c = deadline_node_rounds(rec)
    assert (c.node_rounds, c.met, c.late, c.late_pace_setters) == (4, 2, 2, 1)
    assert c.recorded_misses == 3
    assert deadline_node_rounds(arm("default", "off", 0, 9.0, 80.0)).node_rounds == 0


def test_the_measured_straggler_ratio_is_slowest_over_median_training_time_per_round():
    rec = arm("default", "off", 0, 9.0, 80.0)
    nodes = rec["summary"]["nodes"]
    nodes["nano"].update({"train-time-s": 30.0, "profile-time-s": 6.0, "rounds-ok": 3})  # 10
    nodes["orin"].update({"train-time-s": 3.0, "profile-time-s": 9.0, "rounds-ok": 3})  # 1
    nodes["tx2"] = {**nodes["orin"], "train-time-s": 12.0, "rounds-ok": 2}  # 6 s per round
    assert measured_straggler_ratio(rec) == pytest.approx(10.0 / 6.0)


def test_a_weighted_arm_is_reported_and_checked_after_its_mode(tmp_path):
    recs = study("default")
    recs += [arm("default", "steps@0.5", s, 7.5, 88.0) for s in range(3)]
    g = groups_of(recs)["default"]
    checks = {(c.arm, c.goal): c for c in goals(groups_of(recs), "default")}
    assert checks[("steps@0.5", "time ≤ 0.77× off, energy ≤ 1×")].verdict() == "met"
    assert checks[("steps@0.5", "time ≤ 0.5× B1")].value == pytest.approx(0.375)
    assert paired(g["steps@0.5"], g["off"], "time-to-target-s").mean == pytest.approx(0.75)
    report = render(_output(tmp_path, recs)).read_text()
    rows = [ln for ln in report.splitlines() if ln.startswith("| balance = ")]
    assert [ln.split(" | ")[0] for ln in rows[:3]] == [
        "| balance = samples",
        "| balance = energy",
        "| balance = steps, critical-r-weight 0.5",
    ]


def test_fleet_groups_order_the_arms_and_leave_out_unknown_ones():
    balance: dict[str, dict[str, Any]] = {
        f"d/{a}": {} for a in ("steps@1", "energy", "fast", "steps@0.5", "b1")
    }
    assert list(_fleet_groups({"scenarios": {"balance": balance}})["d"]) == [
        "b1",
        "energy",
        "steps@0.5",
        "steps@1",
    ]


def test_the_report_has_a_table_per_fleet_and_the_goals(tmp_path):
    recs = study("default") + study("straggler-2x")
    out = _output(tmp_path, recs)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["config"]["fleet"] = "/somewhere/configs/fleets/default.toml"
    (out / "manifest.json").write_text(json.dumps(manifest))
    report = render(out).read_text()
    assert "## Balance modes across fleets" in report
    assert "### Fleet `default`" in report and "### Fleet `straggler-2x`" in report
    row = next(ln for ln in report.splitlines() if ln.startswith("| balance = samples | 2/3 |"))
    assert "0.65× (0.60–0.70, 2/3)" in row  # time ÷ off, seed 2 left out
    assert row.rstrip(" |").endswith("seed 2 (0.710)")  # the missed run, named
    assert "| `straggler-2x` | samples | time ≤ 1× B1 | met |" in report
    # the study's own fleet (a resolved path in the settings) is held to 0.5× B1
    assert "| `default` | off | time ≤ 0.5× B1 | met |" in report
    assert "Straggler ratio: twins (equal data shares) " in report
