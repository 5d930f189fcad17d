"""PowerAwareFedAvg with deadline-aware pacing: deadlines, calibration, all-miss warning."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fl_client.contract import TrainConfig
from fl_server.results import RoundAccount
from strategies.power_aware import PowerAwareFedAvg
from tests.strategies.test_power_aware import FLEET, FakeGrid, _strategy, report

pytestmark = pytest.mark.usefixtures("flower_task_identity")

FASTEST = {11: 4.0, 12: 9.0, 13: 2.0}  # each node's local time at its f*


def _paced_handler(miss: bool = False) -> Callable[[Message], Message]:
    def handle(msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type == MessageType.QUERY:
            config = ConfigRecord(FLEET[node].to_config())
            return Message(RecordDict({"device": config}), reply_to=msg)
        cfg = TrainConfig.from_config(dict(msg.content.config_records["config"]))  # as a node
        paced = cfg.deadline_s is not None
        m = report(
            node,
            train_time_s=FASTEST[node],
            predicted_time_s=FASTEST[node] / 1.25,
            fastest_time_s=FASTEST[node],
            f_star_mhz=921.6,
            predicted_energy_saved_j=2.0 if paced else 0.0,
            deadline_s=cfg.deadline_s,
            deadline_miss=(1.0 if miss else 0.0) if paced else None,
        )
        reply = RecordDict(
            {
                "arrays": ArrayRecord([np.full(3, float(node))]),
                "metrics": MetricRecord(dict(m.to_metrics())),
            }
        )
        return Message(reply, reply_to=msg)

    return handle


def _round(strategy: PowerAwareFedAvg, grid: FakeGrid, rnd: int) -> dict[int, ConfigRecord]:
    msgs = list(strategy.configure_train(rnd, ArrayRecord([np.zeros(3)]), ConfigRecord(), grid))
    strategy.aggregate_train(rnd, grid.send_and_receive(msgs, timeout=5))
    return {m.metadata.dst_node_id: m.content.config_records["config"] for m in msgs}


def test_deadline_is_the_slowest_fastest_time_from_round_two() -> None:
    grid = FakeGrid([11, 12, 13], _paced_handler())
    strategy = _strategy(pacing="deadline")
    strategy.query_fleet(grid, timeout_s=5)
    first = _round(strategy, grid, 1)
    assert all("deadline-s" not in c for c in first.values())
    assert all("time-calibration" not in c or c["time-calibration"] == 1.0 for c in first.values())
    second = _round(strategy, grid, 2)
    assert {c["deadline-s"] for c in second.values()} == {9.0}
    assert second[11]["time-calibration"] == pytest.approx(1.25)
    assert TrainConfig.from_config(dict(second[11])).time_calibration == pytest.approx(1.25)
    rep = strategy.rounds[-1]
    assert rep.deadline_s == 9.0 and not rep.warnings
    account = RoundAccount.of(rep)  # the recorder's figures of it
    assert account.deadline_misses == 0
    assert account.predicted_energy_saved_j == pytest.approx(6.0)


def test_pacing_off_sends_no_deadline() -> None:
    grid = FakeGrid([11, 12, 13], _paced_handler())
    strategy = _strategy()
    strategy.query_fleet(grid, timeout_s=5)
    _round(strategy, grid, 1)
    assert all("deadline-s" not in c for c in _round(strategy, grid, 2).values())
    assert strategy.rounds[-1].deadline_s is None


def test_fixed_deadline_everyone_misses_warns_with_the_key_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    grid = FakeGrid([11, 12, 13], _paced_handler(miss=True))
    strategy = _strategy(pacing="deadline", pacing_deadline_s=0.5)
    strategy.query_fleet(grid, timeout_s=5)
    _round(strategy, grid, 1)
    with caplog.at_level(logging.WARNING):
        cfgs = _round(strategy, grid, 2)
    assert {c["deadline-s"] for c in cfgs.values()} == {0.5}
    rep = strategy.rounds[-1]
    assert RoundAccount.of(rep).deadline_misses == 3
    assert len(rep.ok_nodes) == 3  # the round went on
    (warning,) = rep.warnings
    assert warning.startswith("pacing-deadline-s: every node missed round 2's deadline")
    assert "the fastest node needs 2.0 s at f*" in warning
    assert "pacing-deadline-s" in caplog.text


def test_bad_pacing_arguments_name_the_key() -> None:
    with pytest.raises(ValueError, match="pacing: unknown value 'on'"):
        _strategy(pacing="on")
    with pytest.raises(ValueError, match="pacing-deadline-s"):
        _strategy(pacing="deadline", pacing_deadline_s=-1.0)
