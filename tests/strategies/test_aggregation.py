"""The strategy's aggregation path (``aggregation`` = fedavg | fednova): Flower messages in,
the new global ArrayRecord out, through ``PowerAwareFedAvg.aggregate_train``.

The nodes are the quadratics of ``test_fednova``: each TRAIN reply carries the node's model
after ``local-steps`` gradient steps at ``local-lr`` on f_i, and ``num-examples`` ∝ p_i.
Tolerances are the ones derived there.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from fl_client.contract import SettingsError
from fl_client.settings import RunSettings
from strategies.aggregation import aggregate_round, check_aggregation, is_iterate
from tests.strategies import test_fednova as quad
from tests.strategies.test_power_aware import FakeGrid, _handler, _strategy, report

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NODES = (11, 12, 13)
STEPS = {11: 1, 12: 5, 13: 20}
LR = 0.005
BN = {11: 1.0, 12: 2.0, 13: 3.0}  # a BatchNorm running mean each node reports


def _quad_handler(with_work: bool = True) -> Callable[[Message], Message | None]:
    query = _handler()

    def handle(msg: Message) -> Message | None:
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type == MessageType.QUERY:
            return query(msg)
        i = NODES.index(node)
        sent = msg.content.array_records["arrays"]
        x = sent["x"].numpy()
        y = quad.local_gd(x, i, STEPS[node], LR)
        extra = {"local_steps": float(STEPS[node]), "local_lr": LR} if with_work else {}
        metrics = report(node, num_examples=1000.0 * quad.P[i], **extra).to_metrics()
        arrays = ArrayRecord(
            {
                "x": Array(y),
                "bn.running_mean": Array(np.array([BN[node]])),
                "bn.num_batches_tracked": Array(np.array(STEPS[node], dtype=np.int64)),
            }
        )
        return Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord(dict(metrics))}), reply_to=msg
        )

    return handle


def _start() -> ArrayRecord:
    return ArrayRecord(
        {
            "x": Array(quad.X0.copy()),
            "bn.running_mean": Array(np.array([0.0])),
            "bn.num_batches_tracked": Array(np.array(0, dtype=np.int64)),
        }
    )


def _rounds(mode: str, rounds: int, with_work: bool = True) -> tuple[ArrayRecord, list[str]]:
    grid = FakeGrid(list(NODES), _quad_handler(with_work))
    strategy = _strategy(aggregation=mode)
    strategy.fleet.query(grid, timeout_s=5)
    arrays = _start()
    for rnd in range(1, rounds + 1):
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid))
        new, _ = strategy.aggregate_train(rnd, grid.send_and_receive(msgs, timeout=5))
        assert new is not None
        arrays = new
    return arrays, [w for r in strategy.rounds for w in r.warnings]


def test_fednova_through_the_strategy_reaches_the_optimum_fedavg_does_not() -> None:
    steps, lrs = [STEPS[n] for n in NODES], [LR] * 3
    work = [t * LR for t in steps]
    x_star = quad.global_optimum()
    eps = quad.eps_max(steps, lrs)
    wi = quad.w(steps, lrs)
    tau_eff = float(quad.P @ np.array(work))
    nova_bound = eps / (1 - eps) * quad.spread(x_star)
    rho = quad.contraction(tau_eff * quad.P * wi / np.array(work))
    left = rho**quad.ROUNDS * (np.linalg.norm(quad.X0 - x_star) + nova_bound)

    nova, warnings = _rounds("fednova", quad.ROUNDS)
    assert warnings == []
    x_nova = nova["x"].numpy()
    assert np.linalg.norm(x_nova - x_star) <= nova_bound + left + 1e-9
    # the strategy's rounds are the pure function's rounds, float for float
    np.testing.assert_allclose(x_nova, quad.run("fednova", steps, lrs, quad.ROUNDS, work))

    avg, _ = _rounds("fedavg", quad.ROUNDS)
    x_avg = avg["x"].numpy()
    np.testing.assert_allclose(x_avg, quad.run("fedavg", steps, lrs, quad.ROUNDS, work))
    assert np.linalg.norm(x_avg - x_star) > 5 * (nova_bound + left)

    # state that is not an iterate is FedAvg'ed under both: BN statistics, the step counter
    mean_bn = float(quad.P @ np.array([BN[n] for n in NODES]))
    for arrays in (nova, avg):
        assert arrays["bn.running_mean"].numpy() == pytest.approx([mean_bn])
    # the step counter's mean, under both the weighted mean's dtype rule (float64)
    for arrays in (nova, avg):
        counter = arrays["bn.num_batches_tracked"].numpy()
        assert counter.dtype == np.float64 and float(counter) == pytest.approx(quad.P @ steps)


def test_a_round_without_reported_work_falls_back_to_fedavg_and_says_so() -> None:
    nova, warnings = _rounds("fednova", 2, with_work=False)
    avg, _ = _rounds("fedavg", 2, with_work=False)
    np.testing.assert_array_equal(nova["x"].numpy(), avg["x"].numpy())
    assert len(warnings) == 2
    assert "aggregation: fednova: 3 of 3 nodes reported no local-steps and local-lr" in warnings[0]
    assert "round 1 aggregated with FedAvg" in warnings[0]


def test_equal_work_takes_flowers_fedavg_exactly() -> None:
    def reply(x: float) -> RecordDict:
        metrics = report(11, num_examples=x, local_steps=3.0, local_lr=0.1).to_metrics()
        arrays = ArrayRecord({"w": Array(np.array([x, 2 * x], dtype=np.float32))})
        return RecordDict({"arrays": arrays, "metrics": MetricRecord(dict(metrics))})

    base = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    replies = [reply(1.0), reply(3.0)]
    nova, warning = aggregate_round("fednova", base, replies, "num-examples")
    avg, _ = aggregate_round("fedavg", base, replies, "num-examples")
    assert warning is None
    np.testing.assert_array_equal(nova["w"].numpy(), avg["w"].numpy())


def test_iterates_are_floating_arrays_that_are_not_batchnorm_statistics() -> None:
    x = np.zeros(2)
    assert is_iterate("conv.weight", x)
    assert not is_iterate("bn.running_var", x)
    assert not is_iterate("layer.steps", np.zeros(2, dtype=np.int64))


def test_an_unknown_aggregation_is_refused_before_start_naming_the_key() -> None:
    with pytest.raises(ValueError, match="aggregation: unknown value 'fednva'; allowed"):
        check_aggregation("fednva")
    with pytest.raises(ValueError, match="aggregation: unknown value"):
        _strategy(aggregation="mean")
    with pytest.raises(SettingsError, match="aggregation: unknown value 'nova'"):
        RunSettings.from_config({"aggregation": "nova"})
    assert RunSettings.from_config({"method": "b1"}).aggregation == "fedavg"  # auto, for B1
    assert RunSettings.from_config({"aggregation": "fednova"}).aggregation == "fednova"


def test_a_round_is_never_aggregated_with_fedbuff_which_has_no_rounds() -> None:
    with pytest.raises(ValueError, match="aggregation: 'fedbuff' has no rounds to aggregate"):
        _strategy(aggregation="fedbuff")


def _reply(x: float, samples: float, steps: float, bn: float = 0.0) -> RecordDict:
    metrics = report(11, num_examples=samples, local_steps=steps, local_lr=0.1).to_metrics()
    arrays = ArrayRecord(
        {"w": Array(np.array([x], dtype=np.float64)), "bn.running_mean": Array(np.array([bn]))}
    )
    return RecordDict({"arrays": arrays, "metrics": MetricRecord(dict(metrics))})


def test_fedavg_capped_is_a_weighted_mean_that_caps_extra_work() -> None:
    # equal data; works 1 and 3 (τ_eff = 2): the short node keeps its data weight, the long
    # one counts as if it had done 2 (weight 2/3 of its share), normalised: 0.6 and 0.4
    base = ArrayRecord({"w": Array(np.zeros(1)), "bn.running_mean": Array(np.zeros(1))})
    replies = [_reply(1.0, 10.0, 1.0, bn=1.0), _reply(10.0, 10.0, 3.0, bn=3.0)]
    capped, warning = aggregate_round("fedavg-capped", base, replies, "num-examples")
    nova, _ = aggregate_round("fednova", base, replies, "num-examples")
    avg, _ = aggregate_round("fedavg", base, replies, "num-examples")
    assert warning is None
    assert capped["w"].numpy()[0] == pytest.approx(0.6 * 1.0 + 0.4 * 10.0)
    assert capped["bn.running_mean"].numpy()[0] == pytest.approx(2.0)  # data weights, as FedAvg
    assert avg["w"].numpy()[0] == pytest.approx(5.5)
    # FedNova scales the short node's update up (1 → 2/1 of it): a point no node reached
    assert nova["w"].numpy()[0] == pytest.approx(2 * (0.5 * 1.0 + 0.5 * 10.0 / 3.0))
    # the capped model lies between the nodes' models (a weighted mean)
    assert 1.0 <= capped["w"].numpy()[0] <= 10.0


def test_fedavg_capped_with_equal_work_is_flowers_fedavg_exactly() -> None:
    base = ArrayRecord({"w": Array(np.zeros(1)), "bn.running_mean": Array(np.zeros(1))})
    replies = [_reply(1.0, 10.0, 2.0), _reply(4.0, 30.0, 2.0)]
    capped, _ = aggregate_round("fedavg-capped", base, replies, "num-examples")
    avg, _ = aggregate_round("fedavg", base, replies, "num-examples")
    np.testing.assert_array_equal(capped["w"].numpy(), avg["w"].numpy())


def test_fedavg_capped_through_the_strategy_stays_near_the_optimum() -> None:
    capped, warnings = _rounds("fedavg-capped", quad.ROUNDS)
    assert not warnings
    x = capped["x"].numpy()
    gap_capped = float(np.linalg.norm(x - quad.global_optimum()))
    avg, _ = _rounds("fedavg", quad.ROUNDS)
    gap_avg = float(np.linalg.norm(avg["x"].numpy() - quad.global_optimum()))
    assert gap_capped < gap_avg  # extra work pulls it less toward one node's optimum


def test_replies_with_other_arrays_are_refused_naming_them() -> None:
    other = _reply(2.0, 10.0, 1.0)
    del other.array_records["arrays"]["bn.running_mean"]
    with pytest.raises(ValueError, match="the replies' arrays differ"):
        aggregate_round("fedavg", None, [_reply(1.0, 10.0, 1.0), other], "num-examples")
