"""A ``fedbuff`` run's one accounting (``fl_server.async_records``): the fleet's figures, the
nodes' totals and the idle share are the energy the devices spent in [0, the last version],
whatever was applied, on runs where a per-version account and the applied updates' rows
disagreed: a node's idle power learned after its idle gap, works in flight across a
version's time, updates never applied, works still running at the stop."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from fl_server.async_records import AsyncRecorder
from tests.fl_server.test_async_loop import KINDS, PushGrid, _lines, _run
from tests.strategies.test_power_aware import FLEET

pytestmark = pytest.mark.usefixtures("flower_task_identity")

#: The fake nodes' idle power (``tests.strategies.test_power_aware.report``), W
IDLE_W = 1.0


def _inside_s(start_s: float, end_s: float, until_s: float) -> float:
    return max(0.0, min(end_s, until_s) - start_s)


def _spent_j(works: list[dict[str, Any]], until_s: float) -> float:
    """What ``works`` (updates' records) spent in [0, ``until_s``]: each one's energy pro
    rata of its part inside."""
    return math.fsum(
        w["energy-j"] * _inside_s(w["start-s"], w["end-s"], until_s) / (w["end-s"] - w["start-s"])
        for w in works
    )


@pytest.mark.parametrize("ordering", ["virtual", "arrival"])
def test_node_totals_add_up_to_the_fleet_and_idle_is_idle_time_at_idle_power(
    tmp_path: Path, ordering: str
) -> None:
    # each node profiles its slices from 0 (KINDS: the Nanos 0.3 s and 0.4 s, the Orin 6 s;
    # 1 W) and waits idle for its first work: its kind's LUT (virtual) or the whole
    # exchange (arrival: 6 s); its idle power is known only from its first training reply.
    # Ordered by arrival, the wall order (node 12, the fastest device, replies last) keeps
    # works in flight while versions are made; every run stops with works not applied.
    arrival = ordering == "arrival"
    grid = PushGrid({11: 1, 12: 3, 13: 2}) if arrival else None
    out = _run(tmp_path, grid=grid, versions=5 if arrival else 4, kinds=KINDS)
    rec: AsyncRecorder = out["rec"]
    summ = out["summary"]
    nodes = summ["nodes"]
    until_s = summ["sim-time-s"]

    # the nodes' totals add up to the fleet's figures
    def total(key: str) -> float:
        return math.fsum(t[key] for t in nodes.values())

    assert total("train-energy-j") == pytest.approx(summ["fleet-train-energy-j"], rel=1e-12)
    assert total("profile-energy-j") == pytest.approx(summ["fleet-profile-energy-j"], rel=1e-12)
    assert total("train-energy-j") + total("profile-energy-j") == pytest.approx(
        summ["fleet-busy-energy-j"], rel=1e-12
    )
    assert total("idle-energy-j") == pytest.approx(summ["fleet-idle-energy-j"], rel=1e-12)
    assert total("train-time-s") == pytest.approx(summ["device-train-time-s"], rel=1e-12)
    assert total("profile-time-s") == pytest.approx(summ["device-profile-time-s"], rel=1e-12)
    # every node is in them, one none of whose updates was applied too (its rounds: 0)
    assert set(nodes) == {d.node_name for d in FLEET.values()}

    # idle: each node's wait before its first work, at its idle power, and the idle share
    updates = _lines(tmp_path / "updates.jsonl")
    first_s = {u["node-id"]: u["start-s"] for u in updates if u["work"] == 1}
    exchange_s = max(kind_s for _, kind_s, _ in KINDS.values())
    for node_id, (_, kind_s, own_s) in KINDS.items():
        t = nodes[FLEET[node_id].node_name]
        opened_s = exchange_s if arrival else max(kind_s, own_s)
        assert first_s.get(str(node_id), opened_s) == opened_s  # its first work's start
        waited_s = _inside_s(own_s, opened_s, until_s)
        assert t["wait-s"] == pytest.approx(waited_s, abs=1e-12)
        assert t["idle-energy-j"] == pytest.approx(waited_s * IDLE_W, abs=1e-12)
    assert total("wait-s") > 0.0  # there was an idle gap
    busy_s = total("train-time-s") + total("profile-time-s")
    assert summ["idle-share"] == pytest.approx(total("wait-s") / (busy_s + total("wait-s")))

    # busy: every work's part in [0, the last version], applied or not (updates.jsonl, and
    # the replies never taken: virtual, those ending after it), and each node's slices
    left = [
        {"start-s": u.work.start_s, "end-s": u.end_s, "energy-j": u.cost.energy_j}
        for u in rec.clock.drain()  # type: ignore[union-attr]
    ]
    slices_j = math.fsum(min(own_s, until_s) for _, _, own_s in KINDS.values())  # 1 W
    assert any(u["version"] is None for u in updates) or left  # work never applied
    assert summ["fleet-busy-energy-j"] == pytest.approx(
        _spent_j(updates + left, until_s) + slices_j, rel=1e-12
    )

    # the energy so far never decreases from version to version, and ends at the summary's
    rounds = _lines(tmp_path / "rounds.jsonl")
    made_s = [0.0] + [r["sim-time-s"] for r in rounds]
    # works whose time is partly in versions made before they were applied (ordered by
    # arrival: made while they were in flight, their device time unknown)
    assert any(u["version"] and u["start-s"] < made_s[u["version"] - 1] for u in updates)
    for key in ("fleet-energy-j", "fleet-busy-energy-j", "fleet-idle-energy-j"):
        assert all(a[key] <= b[key] for a, b in itertools.pairwise(rounds)), key
        assert rounds[-1][key] == summ[key]
    assert summ["fleet-energy-j"] == pytest.approx(
        summ["fleet-busy-energy-j"] + summ["fleet-idle-energy-j"]
    )
