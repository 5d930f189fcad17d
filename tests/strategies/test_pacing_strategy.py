"""PowerAwareFedAvg with deadline-aware pacing: deadlines, calibration, all-miss warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from strategies.power_aware import TRAIN_METRIC_KEYS
from tests.strategies.test_power_aware import FLEET, FakeGrid, _strategy

pytestmark = pytest.mark.usefixtures("flower_task_identity")

FASTEST = {11: 4.0, 12: 9.0, 13: 2.0}  # each node's local time at its f*


def _paced_handler(miss: bool = False):
    def handle(msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type == MessageType.QUERY:
            return Message(RecordDict({"device": ConfigRecord(FLEET[node])}), reply_to=msg)
        cfg = msg.content["config"]
        m = {k: 1.0 for k in TRAIN_METRIC_KEYS}
        m.update({"train-time-s": FASTEST[node], "predicted-time-s": FASTEST[node] / 1.25})
        m.update({"fastest-time-s": FASTEST[node], "predicted-energy-saved-j": 0.0})
        if "deadline-s" in cfg:
            m.update({"deadline-s": cfg["deadline-s"], "predicted-energy-saved-j": 2.0})
            m["deadline-miss"] = 1.0 if miss else 0.0
        reply = RecordDict(
            {"arrays": ArrayRecord([np.full(3, float(node))]), "metrics": MetricRecord(m)}
        )
        return Message(reply, reply_to=msg)

    return handle


def _round(strategy, grid, rnd: int):
    msgs = list(strategy.configure_train(rnd, ArrayRecord([np.zeros(3)]), ConfigRecord(), grid))
    strategy.aggregate_train(rnd, grid.send_and_receive(msgs, timeout=5))
    return {m.metadata.dst_node_id: m.content["config"] for m in msgs}


def test_deadline_is_the_slowest_fastest_time_from_round_two():
    grid = FakeGrid([11, 12, 13], _paced_handler())
    strategy = _strategy(pacing="deadline")
    strategy.query_fleet(grid, timeout_s=5)
    first = _round(strategy, grid, 1)
    assert all("deadline-s" not in c for c in first.values())
    second = _round(strategy, grid, 2)
    assert {c["deadline-s"] for c in second.values()} == {9.0}
    assert second[11]["time-calibration"] == pytest.approx(1.25)
    report = strategy.rounds[-1]
    assert report.deadline_s == 9.0 and report.deadline_misses == 0
    assert report.predicted_energy_saved_j == pytest.approx(6.0) and not report.warnings


def test_pacing_off_sends_no_deadline():
    grid = FakeGrid([11, 12, 13], _paced_handler())
    strategy = _strategy()
    strategy.query_fleet(grid, timeout_s=5)
    _round(strategy, grid, 1)
    assert all("deadline-s" not in c for c in _round(strategy, grid, 2).values())


def test_fixed_deadline_everyone_misses_warns_with_the_key_and_goes_on(caplog):
    grid = FakeGrid([11, 12, 13], _paced_handler(miss=True))
    strategy = _strategy(pacing="deadline", pacing_deadline_s=0.5)
    strategy.query_fleet(grid, timeout_s=5)
    _round(strategy, grid, 1)
    with caplog.at_level(logging.WARNING):
        cfgs = _round(strategy, grid, 2)
    assert {c["deadline-s"] for c in cfgs.values()} == {0.5}
    report = strategy.rounds[-1]
    assert report.deadline_misses == 3 and len(report.ok_nodes) == 3  # the round went on
    (warning,) = report.warnings
    assert warning.startswith("pacing-deadline-s: every node missed round 2's deadline")
    assert "pacing-deadline-s" in caplog.text


def test_bad_pacing_arguments_name_the_key():
    with pytest.raises(ValueError, match="pacing: unknown value 'on'"):
        _strategy(pacing="on")
    with pytest.raises(ValueError, match="pacing-deadline-s"):
        _strategy(pacing="deadline", pacing_deadline_s=-1.0)


def test_wait_energy_prices_each_node_idle_until_the_slowest_finishes():
    from strategies.power_aware import NodeReport, RoundReport

    def node(name: str, train_s: float, profile_s: float, idle_w: float) -> NodeReport:
        metrics = {"train-time-s": train_s, "profile-time-s": profile_s, "energy-j": 1.0}
        metrics["profile-energy-j"] = 0.0
        metrics["idle-power-w"] = idle_w
        return NodeReport(1, hash(name), name, "jetson-nano", True, metrics)

    report = RoundReport(
        1,
        [
            node("slow", 3.0, 1.0, 2.0),  # the straggler: 4 s, waits 0 s
            node("fast", 1.0, 0.5, 2.0),  # waits 2.5 s at 2 W
            node("unknown", 1.0, 0.0, float("nan")),  # idle power unknown: not counted
            NodeReport(1, 9, "failed", "jetson-nano", False, error="boom"),
        ],
    )
    assert report.round_time_s == 4.0
    assert report.wait_energy_j == pytest.approx(2.0 * 2.5)
