"""End to end: the round plan's energy mode (given by its deprecated name, ``pacing =
"deadline"``, which still runs as ``balance = "energy"``), a cap schedule and a drift check in
one small simulated run."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest

from tests.simulations.conftest import SmallRun

FLEET = """
[[node]]
name = "nano-solar"
device = "jetson-nano"
p-max-schedule = "1:7.0,3:4.5"

[[node]]
name = "tx2nx-hot"
device = "jetson-tx2-nx"
p-max-w = 7.0
twin-slowdown = 1.6
twin-drift-from-round = 2

[[node]]
name = "orin-free"
device = "jetson-orin-nano"
p-max-w = "none"
"""


@pytest.mark.slow
def test_energy_mode_run_with_cap_schedule_and_drift_check(
    small_run: Callable[..., SmallRun],
) -> None:
    run = small_run(
        FLEET,
        "pacing='deadline'",  # deprecated: runs as balance = "energy", with a note
        "drift-check-every=2",
    )
    proc, run_dir, summary, rounds = run.proc, run.run_dir, run.summary, run.rounds
    nodes = {(n["node-name"], n["server-round"]): n for n in run.nodes}

    assert all(r["nodes-ok"] == 3 for r in rounds)
    assert summary["final-accuracy"] > summary["initial-accuracy"] + 0.2
    # the deprecated key ran as the round plan's energy mode, and the run said what to write
    assert 'pacing = "deadline": deprecated; it runs as balance = "energy"' in proc.stdout
    settings = json.loads((run_dir / "settings.json").read_text())
    assert settings["balance"] == "energy" and "pacing" not in settings
    assert summary["balance"] == "energy"
    # round 1 has no deadline; from round 2 the plan's (the critical node's best time)
    assert rounds[0]["deadline-s"] is None
    plan = {entry["round"]: entry for entry in summary["round-plan"]}
    assert sorted(plan) == [2, 3]
    for rnd in (2, 3):
        assert rounds[rnd - 1]["deadline-s"] == pytest.approx(plan[rnd]["deadline-s"])
    planned = [n for (name, rnd), n in nodes.items() if rnd > 1]
    assert all(
        n["deadline-s"] == pytest.approx(plan[n["server-round"]]["deadline-s"]) for n in planned
    )
    # the energy mode's predicted saving, per node and in the summary
    # (a node with slack reports it; the pace-setter runs its fastest cell and does not)
    critical = {(name, rnd) for rnd, e in plan.items() for name in e["critical"]}
    slack = [n for key, n in nodes.items() if key[1] > 1 and key not in critical]
    assert slack and all("predicted-energy-saved-j" in n for n in slack)
    saved = [n.get("predicted-energy-saved-j") or 0.0 for n in planned]
    assert summary["fleet-predicted-energy-saved-j"] == pytest.approx(sum(saved))
    assert summary["deadline-misses"] == sum(int(n["deadline-miss"]) for n in planned)
    # cap schedule: 7 W, then 4.5 W from round 3; both caps profiled up front in round 1
    # (schedule-profiling = "upfront"), so round 3 re-selects from the cache
    solar = [nodes[("nano-solar", r)] for r in (1, 2, 3)]
    assert [n["p-max-w"] for n in solar] == [7.0, 7.0, 4.5]
    # (fleet-shared profiling: the node's slices are its shared-time-s, its check profile-time-s)
    profiled = [n["profile-time-s"] + n["shared-time-s"] for n in solar]
    assert profiled[0] > 0 and profiled[2] == 0.0
    assert solar[2]["peak-power-w"] < 4.5
    # drift: the throttled TX2 is re-profiled at the round-2 check, the others are not
    assert nodes[("tx2nx-hot", 2)]["drift-reprofiled"] == 1.0
    assert nodes[("orin-free", 2)]["drift-reprofiled"] == 0.0
    assert summary["drift-reprofiles"] >= 1
    for n in nodes.values():
        cap = math.inf if n["p-max-w"] is None else float(n["p-max-w"])  # null: no cap
        assert n["peak-power-w"] < cap, n
    assert "J predicted saving against every node" in proc.stdout
