"""PowerAwareFedAvg: per-node messages, QUERY round, aggregation and failure accounting."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from strategies.power_aware import TRAIN_METRIC_KEYS, PowerAwareFedAvg, RoundReport

pytestmark = pytest.mark.usefixtures("flower_task_identity")


class FakeGrid:
    """A Grid whose nodes answer with a Python function (no SuperLink)."""

    def __init__(self, node_ids: list[int], handler: Callable[[Message], Message | None]):
        self.node_ids = node_ids
        self.handler = handler
        self.sent: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float) -> list[Message]:
        replies = []
        for msg in messages:
            self.sent.append(msg)
            reply = self.handler(msg)
            if reply is not None:
                replies.append(reply)
        return replies


FLEET = {
    11: {"node-name": "nano-a", "device": "jetson-nano", "max-batch-size": 64},
    12: {"node-name": "nano-b", "device": "jetson-nano", "max-batch-size": 128},
    13: {"node-name": "orin", "device": "jetson-agx-orin", "max-batch-size": 128},
}


def _metrics(node_id: int, **over: float) -> dict[str, float]:
    base = {k: 1.0 for k in TRAIN_METRIC_KEYS}
    base.update({"num-examples": 10.0 * node_id, "train-time-s": float(node_id)})
    base.update({"energy-j": 2.0 * node_id, "profile-time-s": 0.5, "profile-energy-j": 1.0})
    base.update(over)
    return base


def _handler(fail: set[int] = frozenset(), silent: set[int] = frozenset()):
    def handle(msg: Message) -> Message | None:
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type == MessageType.QUERY:
            return Message(RecordDict({"device": ConfigRecord(FLEET[node])}), reply_to=msg)
        if node in silent:
            return None
        if node in fail:
            return Message(Error(code=1, reason=f"node {node} crashed"), reply_to=msg)
        arrays = ArrayRecord([np.full(3, float(node))])
        return Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord(_metrics(node))}),
            reply_to=msg,
        )

    return handle


def _strategy(**kw) -> PowerAwareFedAvg:
    return PowerAwareFedAvg(
        batch_sizes=[16, 32, 64, 128],
        r=[0.4, 0.5, 0.8, 1.0],
        method=kw.pop("method", "power-aware"),
        train_config={"lr-ref": 0.003, "b-ref": 128, "local-epochs": 1},
        query_config={"model": "cnn"},
        **kw,
    )


def test_query_round_learns_every_node():
    grid = FakeGrid([11, 12, 13], _handler())
    strategy = _strategy()
    fleet = strategy.query_fleet(grid, timeout_s=5)
    assert set(fleet) == {11, 12, 13}
    assert fleet[13]["device"] == "jetson-agx-orin"
    assert all(m.metadata.message_type == MessageType.QUERY for m in grid.sent)


def test_each_node_gets_its_own_record_with_r_aligned_to_what_fits():
    grid = FakeGrid([11, 12, 13], _handler())
    strategy = _strategy(method="b2")
    strategy.query_fleet(grid, timeout_s=5)
    arrays = ArrayRecord([np.zeros(3)])
    msgs = {
        m.metadata.dst_node_id: m for m in strategy.configure_train(4, arrays, ConfigRecord(), grid)
    }
    assert set(msgs) == {11, 12, 13}
    cfg_a, cfg_b = msgs[11].content["config"], msgs[12].content["config"]
    assert list(cfg_a["batch-sizes"]) == [16, 32, 64]  # nano-a fits up to 64
    assert list(cfg_a["r"]) == [0.4, 0.5, 0.8]
    assert list(cfg_b["batch-sizes"]) == [16, 32, 64, 128]
    assert cfg_a["server-round"] == 4 and cfg_a["method"] == "b2" and cfg_a["lr-ref"] == 0.003
    # fresh RecordDict per node: changing one node's config leaves the others alone
    assert msgs[11].content is not msgs[12].content
    cfg_a["r"] = [1.0, 1.0, 1.0]
    assert list(msgs[12].content["config"]["r"]) == [0.4, 0.5, 0.8, 1.0]


def test_aggregation_is_fedavg_and_round_accounting_is_synchronous():
    grid = FakeGrid([11, 12, 13], _handler())
    strategy = _strategy()
    strategy.query_fleet(grid, timeout_s=5)
    msgs = strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), grid)
    arrays, agg = strategy.aggregate_train(1, grid.send_and_receive(msgs, timeout=5))
    assert arrays is not None and agg is not None
    weights = np.array([110.0, 120.0, 130.0])
    expected = (weights * np.array([11.0, 12.0, 13.0])).sum() / weights.sum()
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.full(3, expected))
    report = strategy.rounds[-1]
    assert report.round_time_s == pytest.approx(13.0 + 0.5)  # slowest node incl. profiling
    assert report.energy_j == pytest.approx(2 * (11 + 12 + 13) + 3 * 1.0)
    assert agg["nodes-ok"] == 3 and agg["nodes-failed"] == 0


def test_failed_node_costs_only_its_update_and_is_recorded():
    grid = FakeGrid([11, 12, 13], _handler(fail={12}))
    strategy = _strategy()
    strategy.query_fleet(grid, timeout_s=5)
    msgs = strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), grid)
    arrays, _agg = strategy.aggregate_train(1, grid.send_and_receive(msgs, timeout=5))
    assert arrays is not None
    weights = np.array([110.0, 130.0])
    expected = (weights * np.array([11.0, 13.0])).sum() / weights.sum()
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.full(3, expected))
    failed = [n for n in strategy.rounds[-1].nodes if not n.ok]
    assert [(n.node_name, n.error) for n in failed] == [("nano-b", "node 12 crashed")]


def test_run_stops_at_target_and_records_silent_nodes():
    grid = FakeGrid([11, 12, 13], _handler(silent={13}))
    seen: list[tuple[RoundReport, dict[str, float]]] = []
    strategy = _strategy(on_round=lambda rep, ev: seen.append((rep, ev)))
    accuracies = iter([0.1, 0.5, 0.95, 0.99])
    strategy.run(
        grid,
        ArrayRecord([np.zeros(3)]),
        num_rounds=10,
        timeout_s=5,
        evaluate_fn=lambda rnd, arr: {"accuracy": next(accuracies), "loss": 1.0},
        target_accuracy=0.9,
    )
    assert [rep.server_round for rep, _ in seen] == [1, 2]
    missing = [n for n in seen[0][0].nodes if not n.ok]
    assert [(n.node_name, n.error) for n in missing] == [("orin", "no reply (timeout)")]


def test_r_must_match_batch_sizes():
    with pytest.raises(ValueError, match="r: has 2 values but batch-sizes has 4"):
        PowerAwareFedAvg(
            batch_sizes=[16, 32, 64, 128],
            r=[0.5, 1.0],
            method="power-aware",
            train_config={},
            query_config={},
        )


def test_a_node_gone_from_the_superlink_is_named_absent_and_counted_back_when_it_rejoins():
    grid = FakeGrid([11, 12, 13], _handler())
    seen: list[RoundReport] = []
    strategy = _strategy(on_round=lambda rep, ev: seen.append(rep))
    strategy.query_fleet(grid, timeout_s=5)
    online = iter([[11, 12, 13], [11, 12], [11, 12, 13]])

    def evaluate(rnd: int, arr: ArrayRecord) -> dict[str, float]:
        if rnd < 3:  # the SuperLink's view of who is connected in the next round
            grid.node_ids = next(online)
        return {"accuracy": 0.1, "loss": 1.0}

    strategy.run(grid, ArrayRecord([np.zeros(3)]), num_rounds=3, timeout_s=5, evaluate_fn=evaluate)
    absent = [[(n.node_name, n.error) for n in rep.nodes if not n.ok] for rep in seen]
    assert absent[0] == [] and absent[2] == []
    assert absent[1] == [("orin", "not connected this round (absent from the SuperLink)")]
    assert [len(rep.ok_nodes) for rep in seen] == [3, 2, 3]


def test_aggregation_order_does_not_depend_on_arrival_order():
    rng = np.random.default_rng(0)
    # values over 16 orders of magnitude: float sums then depend on the order of terms
    arrays = {
        n: (rng.normal(size=1000) * 10 ** rng.uniform(-8, 8, 1000)).astype(np.float32)
        for n in (11, 12, 13)
    }

    def aggregate(reverse: bool) -> np.ndarray:
        grid = FakeGrid([11, 12, 13], _handler())
        strategy = _strategy()
        strategy.query_fleet(grid, timeout_s=5)
        msgs = strategy.configure_train(1, ArrayRecord([np.zeros(1000)]), ConfigRecord(), grid)
        replies = [
            Message(
                RecordDict(
                    {
                        "arrays": ArrayRecord([arrays[m.metadata.dst_node_id]]),
                        "metrics": MetricRecord(_metrics(m.metadata.dst_node_id)),
                    }
                ),
                reply_to=m,
            )
            for m in msgs
        ]
        out, _ = strategy.aggregate_train(1, replies[::-1] if reverse else replies)
        assert out is not None
        return out.to_numpy_ndarrays()[0]

    np.testing.assert_array_equal(aggregate(False), aggregate(True))
