"""PowerAwareFedAvg: per-node TRAIN configs, aggregation and the rows of nodes that trained
or failed (the QUERY round: ``test_fleet``; the run loop and accounting: ``tests/fl_server``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

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

from fl_client.contract import (
    Cap,
    NodeDescriptor,
    NodeRow,
    SettingsError,
    TrainConfig,
    TrainReport,
)
from fl_server.results import RoundAccount
from strategies.power_aware import PowerAwareFedAvg, RoundReport

if TYPE_CHECKING:
    from flwr.serverapp import Grid
    from flwr.supercore.run import Run

    _GridBase = Grid
else:  # duck-typed at run time: Grid's abstract methods differ between Flower releases
    _GridBase = object

pytestmark = pytest.mark.usefixtures("flower_task_identity")


class FakeGrid(_GridBase):
    """A Grid whose nodes answer with a Python function (no SuperLink)."""

    def __init__(self, node_ids: list[int], handler: Callable[[Message], Message | None]):
        self.node_ids = node_ids
        self.handler = handler
        self.sent: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        replies = []
        for msg in messages:
            self.sent.append(msg)
            reply = self.handler(msg)
            if reply is not None:
                replies.append(reply)
        return replies

    # What the strategy never calls
    def set_run(self, run: Run) -> None:
        raise NotImplementedError

    @property
    def run(self) -> Run:
        raise NotImplementedError

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        raise NotImplementedError

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError


def _descriptor(name: str, device: str, max_b: int, cap: Cap, schedule: str = "") -> NodeDescriptor:
    return NodeDescriptor(
        node_name=name,
        partition_id=0,
        device=device,
        backend="simulated",
        p_max=cap,
        p_max_schedule=schedule,
        knob_values=(307.2, 614.4, 921.6),
        memory_bytes=4 << 30,
        power_rail="POM_5V_IN",
        max_batch_size=max_b,
    )


FLEET = {
    11: _descriptor("nano-a", "jetson-nano", 64, Cap(5.0)),
    12: _descriptor("nano-b", "jetson-nano", 128, Cap(7.0), "1:7,3:4.5"),
    13: _descriptor("orin", "jetson-agx-orin", 128, Cap.NONE),
}
TEMPLATE = TrainConfig(
    server_round=0,
    method="power-aware",
    model="cnn",
    batch_sizes=(16, 32, 64, 128),
    r=(0.4, 0.5, 0.8, 1.0),
    lr_ref=0.003,
    b_ref=128,
    local_epochs=1,
)


def report(node_id: int, **over: Any) -> TrainReport:
    """A node's TRAIN report: examples 10·id, training id s, 2·id J, profiling 0.5 s, 1 J."""
    fields: dict[str, Any] = {
        "num_examples": 10.0 * node_id,
        "train_time_s": float(node_id),
        "train_energy_j": 2.0 * node_id,
        "avg_power_w": 2.0,
        "peak_power_w": 3.0,
        "idle_power_w": 1.0,
        "p_max_w": FLEET[node_id].p_max.to_wire() if node_id in FLEET else 5.0,
        "cap_margin": 0.05,
        "batch_size": 16.0,
        "gpu_freq_mhz": 614.4,
        "profile_time_s": 0.5,
        "profile_energy_j": 1.0,
        "cap_violations": 0.0,
        "time_over_cap_s": 0.0,
        "train_loss": 1.0,
    }
    return TrainReport(**{**fields, **over})


def _metrics(node_id: int, **over: Any) -> dict[str, float]:
    return report(node_id, **over).to_metrics()


def _handler(
    fail: Iterable[int] = (), silent: Iterable[int] = (), bad: Iterable[int] = ()
) -> Callable[[Message], Message | None]:
    def handle(msg: Message) -> Message | None:
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type == MessageType.QUERY:
            config = ConfigRecord(FLEET[node].to_config())
            return Message(RecordDict({"device": config}), reply_to=msg)
        if node in silent:
            return None
        if node in fail:
            return Message(Error(code=1, reason=f"node {node} crashed"), reply_to=msg)
        metrics = _metrics(node)
        if node in bad:  # an old node: one energy key for training and profiling
            metrics["energy-j"] = metrics.pop("train-energy-j")
        arrays = ArrayRecord([np.full(3, float(node))])
        return Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord(dict(metrics))}),
            reply_to=msg,
        )

    return handle


def _strategy(**kw: Any) -> PowerAwareFedAvg:
    template = dataclasses.replace(TEMPLATE, method=kw.pop("method", "power-aware"))
    return PowerAwareFedAvg(template=template, **kw)


def _train_round(
    strategy: PowerAwareFedAvg, grid: FakeGrid, rnd: int = 1
) -> tuple[ArrayRecord | None, MetricRecord | None]:
    msgs = list(strategy.configure_train(rnd, ArrayRecord([np.zeros(3)]), ConfigRecord(), grid))
    return strategy.aggregate_train(rnd, grid.send_and_receive(msgs, timeout=5))


def test_each_node_gets_its_own_record_with_r_aligned_to_what_fits() -> None:
    grid = FakeGrid([11, 12, 13], _handler())
    strategy = _strategy(method="b2")
    strategy.fleet.query(grid, timeout_s=5)
    arrays = ArrayRecord([np.zeros(3)])
    msgs = {
        m.metadata.dst_node_id: m for m in strategy.configure_train(4, arrays, ConfigRecord(), grid)
    }
    assert set(msgs) == {11, 12, 13}
    cfg_a = msgs[11].content.config_records["config"]
    cfg_b = msgs[12].content.config_records["config"]
    assert cfg_a["batch-sizes"] == [16, 32, 64]  # nano-a fits up to 64
    assert cfg_a["r"] == [0.4, 0.5, 0.8]
    assert cfg_b["batch-sizes"] == [16, 32, 64, 128]
    assert cfg_a["server-round"] == 4 and cfg_a["method"] == "b2" and cfg_a["lr-ref"] == 0.003
    # the whole TRAIN config, as the node parses it: no deadline without the round plan
    parsed = TrainConfig.from_config(dict(cfg_a))
    assert parsed == dataclasses.replace(
        TEMPLATE, server_round=4, method="b2", batch_sizes=(16, 32, 64), r=(0.4, 0.5, 0.8)
    )
    assert parsed.deadline_s is None and "deadline-s" not in cfg_a
    # fresh RecordDict per node: changing one node's config leaves the others alone
    assert msgs[11].content is not msgs[12].content
    cfg_a["r"] = [1.0, 1.0, 1.0]
    assert msgs[12].content.config_records["config"]["r"] == [0.4, 0.5, 0.8, 1.0]


def test_a_node_that_fits_nothing_is_sent_the_smallest_batch_size_to_explain() -> None:
    strategy = _strategy(min_train_nodes=1)
    strategy.fleet.nodes = {11: dataclasses.replace(FLEET[11], max_batch_size=0)}
    cfg = strategy.node_config(2, 11)
    assert (cfg.batch_sizes, cfg.r, cfg.server_round) == ((16,), (0.4,), 2)


def test_aggregation_is_fedavg_and_every_node_has_its_row() -> None:
    grid = FakeGrid([11, 12, 13], _handler())
    strategy = _strategy()
    strategy.fleet.query(grid, timeout_s=5)
    arrays, agg = _train_round(strategy, grid)
    assert arrays is not None and agg is not None
    weights = np.array([110.0, 120.0, 130.0])
    expected = (weights * np.array([11.0, 12.0, 13.0])).sum() / weights.sum()
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.full(3, expected))
    rep = strategy.rounds[-1]
    assert isinstance(rep, RoundReport) and rep.server_round == 1
    assert all(isinstance(n, NodeRow) for n in rep.nodes)
    assert [(n.node_name, n.node_id, n.ok) for n in rep.nodes] == [
        ("nano-a", 11, True),
        ("nano-b", 12, True),
        ("orin", 13, True),
    ]
    assert rep.reports() == [report(11), report(12), report(13)]
    assert [n.p_max for n in rep.nodes] == [Cap(5.0), Cap(7.0), Cap.NONE]
    assert agg["nodes-ok"] == 3 and agg["nodes-failed"] == 0 and agg["num-examples"] == 360
    # the recorder's accounting of it: synchronous, the slowest node incl. profiling
    account = RoundAccount.of(rep)
    assert account.round_time_s == pytest.approx(13.0 + 0.5)
    assert account.busy_energy_j == pytest.approx(2 * (11 + 12 + 13) + 3 * 1.0)


def test_failed_node_costs_only_its_update_and_is_recorded_with_its_real_cap() -> None:
    grid = FakeGrid([11, 12, 13], _handler(fail={12}))
    strategy = _strategy()
    strategy.fleet.query(grid, timeout_s=5)
    arrays, agg = _train_round(strategy, grid, rnd=3)
    assert arrays is not None and agg is not None
    weights = np.array([110.0, 130.0])
    expected = (weights * np.array([11.0, 13.0])).sum() / weights.sum()
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.full(3, expected))
    failed = [n for n in strategy.rounds[-1].nodes if not n.ok]
    assert [(n.node_name, n.error) for n in failed] == [("nano-b", "node 12 crashed")]
    # nano-b's schedule steps from 7 W to 4.5 W in round 3: its row says 4.5 W, not "none"
    (row,) = failed
    assert row.p_max == Cap(4.5) and row.device == "jetson-nano" and row.report is None
    assert row.to_record()["p-max-w"] == 4.5
    assert agg["nodes-ok"] == 2 and agg["nodes-failed"] == 1


def test_a_reply_with_malformed_metrics_is_a_failed_row_naming_the_keys() -> None:
    grid = FakeGrid([11, 12, 13], _handler(bad={13}))
    strategy = _strategy()
    strategy.fleet.query(grid, timeout_s=5)
    arrays, _ = _train_round(strategy, grid)
    assert arrays is not None
    (row,) = [n for n in strategy.rounds[-1].nodes if not n.ok]
    assert row.node_name == "orin" and row.p_max == Cap.NONE
    assert row.error == "reply lacks metrics: train-energy-j"
    # its update is not averaged in
    weights = np.array([110.0, 120.0])
    expected = (weights * np.array([11.0, 12.0])).sum() / weights.sum()
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], np.full(3, expected))


def test_a_round_where_every_node_fails_has_no_update_but_its_rows() -> None:
    grid = FakeGrid([11, 12], _handler(fail={11, 12}))
    strategy = _strategy()
    strategy.fleet.query(grid, timeout_s=5)
    assert _train_round(strategy, grid) == (None, None)
    assert [n.ok for n in strategy.rounds[-1].nodes] == [False, False]


def test_r_must_match_batch_sizes() -> None:
    with pytest.raises(SettingsError, match="r: has 2 values but batch-sizes has 4"):
        PowerAwareFedAvg(template=dataclasses.replace(TEMPLATE, r=(0.5, 1.0)))


def test_a_reply_from_a_node_that_never_answered_the_query_is_named_by_its_id() -> None:
    grid = FakeGrid([11, 12, 13], _handler(fail={13}))
    strategy = _strategy()
    strategy.fleet.query(grid, timeout_s=5)
    del strategy.fleet.nodes[13]
    grid.node_ids = [11, 12]  # only nodes in the fleet are asked ...
    msgs = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), grid))
    # ... a reply for another node is still recorded
    to_13 = Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=13)
    stray = Message(Error(code=1, reason="late"), reply_to=to_13)
    strategy.aggregate_train(1, [*grid.send_and_receive(msgs, timeout=5), stray])
    row = next(n for n in strategy.rounds[-1].nodes if n.node_id == 13)
    assert (row.node_name, row.device, row.p_max, row.ok) == ("13", "?", Cap.NONE, False)


def test_aggregation_order_does_not_depend_on_arrival_order() -> None:
    rng = np.random.default_rng(0)
    # values over 16 orders of magnitude: float sums then depend on the order of terms
    arrays = {
        n: (rng.normal(size=1000) * 10 ** rng.uniform(-8, 8, 1000)).astype(np.float32)
        for n in (11, 12, 13)
    }

    def aggregate(reverse: bool) -> np.ndarray:
        grid = FakeGrid([11, 12, 13], _handler())
        strategy = _strategy()
        strategy.fleet.query(grid, timeout_s=5)
        msgs = strategy.configure_train(1, ArrayRecord([np.zeros(1000)]), ConfigRecord(), grid)
        replies = [
            Message(
                RecordDict(
                    {
                        "arrays": ArrayRecord([arrays[m.metadata.dst_node_id]]),
                        "metrics": MetricRecord(dict(_metrics(m.metadata.dst_node_id))),
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
