"""The round plan: predicted best round times, the deadline, the pace-setter, misses; and
the strategy sending each node its deadline and role."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_client.contract import TrainConfig
from fl_client.lut import LUT
from fl_client.power import PowerLimit
from fl_client.selection import Tables
from fl_client.selector import EQ4, Method, Objective, select_eq4
from strategies.power_aware import PowerAwareFedAvg
from strategies.round_plan import (
    NodeForecast,
    PlanSettings,
    RoundPlanner,
    best_round_time_s,
    missed,
    plan_round,
)
from tests.strategies.test_power_aware import (
    FLEET,
    FakeGrid,
    _handler,
    _strategy,
    _train_round,
    report,
)

pytestmark = pytest.mark.usefixtures("flower_task_identity")

TIME = np.array([[4.0, 2.0, 1.0], [3.0, 1.5, 0.8]])  # s per sample: rows b, columns f
PEAK = np.array([[1.0, 2.0, 3.0], [1.5, 2.5, 5.0]])


# --------------------------------------------------------------------------- pure plan


def test_best_round_time_is_the_fastest_feasible_cell_times_the_work() -> None:
    assert best_round_time_s(Tables(TIME, PEAK), PowerLimit(), 10) == pytest.approx(8.0)
    # 5 W less 5%: the 5 W cell is out, the 3 W one is the fastest left
    assert best_round_time_s(Tables(TIME, PEAK), PowerLimit(5.0, 0.05), 10) == pytest.approx(10.0)
    # σ of the per-step peaks counts as the selector counts it (peak + 2σ)
    sigma = np.full_like(PEAK, 0.6)
    limit = PowerLimit(4.0)
    assert best_round_time_s(Tables(TIME, PEAK, peak_sigma_w=sigma), limit, 10) == pytest.approx(
        15.0
    )
    assert best_round_time_s(
        Tables(TIME, PEAK, peak_sigma_w=sigma), limit, 10, calibration=1.2
    ) == pytest.approx(18.0)
    assert math.isinf(best_round_time_s(Tables(TIME, PEAK), PowerLimit(0.9), 10))


def test_with_an_r_weight_the_pace_cell_is_the_least_time_times_r_to_that_weight() -> None:
    no_cap = PowerLimit()
    # r 0.5 for the first row: time × r is 2, 1, 0.5 there against 3, 1.5, 0.8 (w = 1)
    r = [0.5, 1.0]
    assert best_round_time_s(Tables(TIME, PEAK), no_cap, 10, r=r) == pytest.approx(8.0)  # w = 0
    assert best_round_time_s(
        Tables(TIME, PEAK), no_cap, 10, r=r, objective=EQ4.for_pace(1.0)
    ) == pytest.approx(10.0)
    # w = 0.5: 1 × 0.5^0.5 = 0.71 still beats 0.8
    assert best_round_time_s(
        Tables(TIME, PEAK), no_cap, 10, r=r, objective=EQ4.for_pace(0.5)
    ) == pytest.approx(10.0)
    # r 0.9: 0.9 > 0.8, the fastest cell again; a b without r (NaN) is left out
    assert (
        best_round_time_s(Tables(TIME, PEAK), no_cap, 10, r=[0.9, 1.0], objective=EQ4.for_pace(1.0))
        == 8.0
    )
    nan_r = [0.9, math.nan]
    assert (
        best_round_time_s(Tables(TIME, PEAK), no_cap, 10, r=nan_r, objective=EQ4.for_pace(1.0))
        == 10.0
    )
    # the cap still decides what is feasible: under 2.6 W each row's last cell is out, and
    # 2 s × 0.5 = 1 beats 1.5 s × 1 (without r the 1.5 s cell is the fastest)
    capped = best_round_time_s(
        Tables(TIME, PEAK), PowerLimit(2.6), 10, r=r, objective=EQ4.for_pace(1.0)
    )
    assert capped == pytest.approx(20.0)
    assert best_round_time_s(Tables(TIME, PEAK), PowerLimit(2.6), 10, r=r) == pytest.approx(15.0)


def test_the_forecast_cell_is_the_pace_setters_own_cell_within_the_tie_tolerance() -> None:
    """The server forecasts the cell the node itself runs: within ``tie-tolerance`` of the
    fastest cell the node takes the least energy to accuracy, and so does the forecast (an
    exact argmin, the rule before, said 1.00 s where the node runs 1.01 s)."""
    time = np.array([[4.0, 2.0, 1.00], [3.0, 1.5, 1.01]])
    peak = np.array([[1.0, 2.0, 5.0], [1.0, 2.5, 3.0]])  # the 1.01 s cell draws less
    node = select_eq4(
        Tables(time, peak, peak),
        [8, 16],
        [300.0, 600.0, 900.0],
        [1.0, 1.0],
        6.0,
        method=Method(objective=EQ4.for_pace()),
    )
    assert (node.batch_size, node.knob_value) == (16, 900.0)
    forecast = best_round_time_s(Tables(time, peak, peak), PowerLimit(6.0), 10)
    assert forecast == pytest.approx(node.time_per_sample_s * 10) == pytest.approx(10.1)
    # with no tie tolerance both take the exact fastest cell
    exact = Objective(tie_tolerance=0.0).for_pace()
    assert best_round_time_s(Tables(time, peak), PowerLimit(6.0), 10, objective=exact) == 10.0


def test_the_forecast_and_the_nodes_choice_agree_on_random_tables() -> None:
    rng = np.random.default_rng(0)
    b, f = [8, 16, 32], [300.0, 600.0, 900.0, 1200.0]
    for _ in range(200):
        time = np.sort(rng.uniform(0.5, 1.0, (3, 4)), axis=1)[:, ::-1]  # faster as f rises
        peak = np.sort(rng.uniform(1.0, 6.0, (3, 4)), axis=1)
        avg = peak * rng.uniform(0.5, 1.0, (3, 4))
        sigma = rng.uniform(0.0, 0.3, (3, 4))
        r = rng.uniform(0.3, 1.0, 3).tolist()
        limit = PowerLimit(float(rng.uniform(2.0, 7.0)), 0.05)
        for w in (0.0, 0.5, 1.0):
            objective = Objective(tie_tolerance=0.02, peak_sigma_k=2.0).for_pace(w)
            forecast = best_round_time_s(
                Tables(time, peak, avg, sigma), limit, 100, objective=objective, r=r
            )
            try:
                node = select_eq4(
                    Tables(time, peak, avg, sigma),
                    b,
                    f,
                    r,
                    limit,
                    method=Method(objective=objective),
                )
            except ValueError:  # no feasible cell
                assert math.isinf(forecast)
                continue
            assert forecast == node.time_per_sample_s * 100


def test_the_deadline_is_the_critical_nodes_best_time_and_equal_paces_plan_together() -> None:
    plan = plan_round(
        [
            NodeForecast(1, 2.0, "lut"),
            NodeForecast(2, 10.0, "lut"),
            NodeForecast(3, 9.9, "reported"),  # within 2%: sets the pace too
            NodeForecast(4, math.inf, "none"),  # nothing known: not held back, not pacing
        ]
    )
    assert plan.deadline_s == 10.0 and not plan.fixed
    assert plan.critical == {2, 3} and plan.unmeetable == set()
    assert 1 not in plan.critical and 3 in plan.critical


def test_a_fixed_deadline_no_node_meets_is_said_so() -> None:
    plan = plan_round([NodeForecast(1, 2.0, "lut"), NodeForecast(2, 10.0, "lut")], 1.0)
    assert plan.fixed and plan.deadline_s == 1.0 and plan.unmeetable == {1, 2}
    looser = plan_round([NodeForecast(1, 2.0, "lut"), NodeForecast(2, 10.0, "lut")], 5.0)
    assert looser.unmeetable == {2}
    with pytest.raises(ValueError, match="round-deadline-s"):
        plan_round([], -1.0)
    assert plan_round([NodeForecast(1, math.inf, "none")]).deadline_s is None


def test_a_miss_counts_beyond_the_margin_only() -> None:
    assert missed({1: 10.4, 2: 10.6, 3: math.nan}, 10.0, 0.05) == {2: 10.6}
    assert missed({1: 10.6}, None, 0.05) == {}  # no deadline: nobody missed it


class _Fleet:
    """The planner's view of a fleet: one node capped at 2.6 W, r 0.5 and 1 by row."""

    def limit_of(self, node_id: int, server_round: int) -> PowerLimit | None:
        return PowerLimit(2.6) if node_id == 1 else None

    def r_rows(self, batch_sizes: Sequence[int]) -> list[float]:
        return [{8: 0.5, 16: 1.0}.get(b, math.nan) for b in batch_sizes]


def _lut() -> LUT:
    return LUT(
        device_kind="jetson-nano",
        backend="simulated",
        model_name="cnn",
        input_shape=(3, 32, 32),
        batch_sizes=(8, 16),
        knob_values=(100.0, 200.0, 300.0),
        time_per_sample_s=TIME,
        peak_power_w=PEAK,
        avg_power_w=PEAK,
        profile_time_s=1.0,
        profile_energy_j=1.0,
    )


def test_the_planner_forecasts_by_lut_times_work_and_calibration_else_the_report() -> None:
    planner = RoundPlanner(PlanSettings("samples"), local_epochs=2)
    lut_of = {1: _lut()}.get
    assert planner.begin(1, [1, 2], _Fleet(), lut_of) is None  # round 1: nothing known
    assert planner.deadline_s is None and planner.calibration_of(1) == 1.0
    planner.observe(1, report(11, num_examples=10.0, train_time_s=18.0, predicted_time_s=15.0))
    planner.observe(2, report(12, num_examples=10.0, fastest_time_s=4.0))
    plan = planner.begin(2, [1, 2], _Fleet(), lut_of)
    assert plan is not None
    # node 1: the fastest cell under 2.6 W is 1.5 s per sample, × 2 epochs × 10 samples,
    # × its calibration 18 / 15; node 2 has no LUT (and no cap): its own report
    by_node = {f.node_id: f for f in plan.forecasts}
    assert by_node[1].source == "lut" and by_node[1].best_time_s == pytest.approx(36.0)
    assert (by_node[2].source, by_node[2].best_time_s) == ("reported", 4.0)
    assert planner.deadline_s == pytest.approx(36.0) and planner.is_critical(1)
    assert planner.calibration_of(1) == pytest.approx(1.2) and planner.calibration_of(2) == 1.0
    # the pace-setter took 40 s, over its margin: the next plan uses that, once
    assert planner.record(2, {1: 40.0, 2: 3.0}, {1: "a", 2: "b"})[0].startswith(
        "balance: a missed round 2's deadline"
    )
    assert planner.log[-1]["missed"] == ["a"]
    third = planner.begin(3, [1, 2], _Fleet(), lut_of)
    assert third is not None and third.forecasts[0] == NodeForecast(1, 40.0, "measured")
    fourth = planner.begin(4, [1, 2], _Fleet(), lut_of)
    assert fourth is not None and fourth.forecasts[0].source == "lut"


def test_with_critical_r_weight_the_planner_forecasts_the_cell_r_weighs() -> None:
    settings = PlanSettings("samples", critical_r_weight=1.0)
    planner = RoundPlanner(settings, local_epochs=1)
    planner.observe(1, report(11, num_examples=10.0))
    plan = planner.begin(2, [1], _Fleet(), {1: _lut()}.get)
    # under 2.6 W: 2 s × r 0.5 = 1 beats 1.5 s × r 1 (the r of ``_Fleet``'s rows)
    assert plan is not None and plan.forecasts[0].best_time_s == pytest.approx(20.0)


# --------------------------------------------------------------------------- the strategy


def _planned(**planning: Any) -> tuple[PowerAwareFedAvg, RoundPlanner, FakeGrid]:
    strategy = _strategy(planning=PlanSettings(**{"balance": "samples", **planning}))
    grid = FakeGrid(list(FLEET), _handler())
    strategy.fleet.query(grid, timeout_s=5)
    assert strategy.planner is not None
    return strategy, strategy.planner, grid


def _configs(strategy: PowerAwareFedAvg, grid: FakeGrid, rnd: int) -> dict[int, TrainConfig]:
    msgs = strategy.configure_train(rnd, ArrayRecord([np.zeros(3)]), ConfigRecord(), grid)
    return {
        m.metadata.dst_node_id: TrainConfig.from_config(dict(m.content["config"])) for m in msgs
    }


def _reply(handler: Any, times: dict[int, float]) -> Any:
    """The fake nodes' replies with each node's ``fastest-time-s`` and measured time."""

    def handle(msg: Message) -> Message | None:
        reply = handler(msg)
        if reply is None or reply.has_error() or "metrics" not in reply.content:
            return reply
        node = msg.metadata.dst_node_id
        metrics = dict(reply.content["metrics"])
        metrics.update({"fastest-time-s": times[node], "train-time-s": times[node]})
        content = RecordDict({"arrays": reply.content["arrays"], "metrics": MetricRecord(metrics)})
        return Message(content, reply_to=msg)

    return handle


def test_round_one_has_no_plan_and_round_two_sends_the_deadline_and_the_roles() -> None:
    strategy, planner, grid = _planned()
    grid.handler = _reply(grid.handler, {11: 2.0, 12: 6.0, 13: 1.0})
    first = _configs(strategy, grid, 1)
    assert all(c.deadline_s is None and not c.critical for c in first.values())
    _train_round(strategy, grid, 1)
    second = _configs(strategy, grid, 2)
    assert {n: c.deadline_s for n, c in second.items()} == {11: 6.0, 12: 6.0, 13: 6.0}
    assert {n for n, c in second.items() if c.critical} == {12}
    assert planner.plan is not None
    assert {f.source for f in planner.plan.forecasts} == {"reported"}  # no kind LUT here


def test_a_node_late_beyond_its_margin_is_recorded_and_planned_by_its_measured_time() -> None:
    strategy, planner, grid = _planned(margin=0.05)
    handler = grid.handler
    grid.handler = _reply(handler, {11: 2.0, 12: 6.0, 13: 1.0})
    _train_round(strategy, grid, 1)
    grid.handler = _reply(handler, {11: 9.0, 12: 6.0, 13: 1.0})  # nano-a: 9 s for a 6 s plan
    _train_round(strategy, grid, 2)
    (warning,) = strategy.rounds[-1].warnings
    assert warning.startswith("balance: nano-a missed round 2's deadline of 6 s by more than 5%")
    assert planner.log[-1]["missed"] == ["nano-a"]
    third = _configs(strategy, grid, 3)
    assert third[11].deadline_s == 9.0 and third[11].critical
    assert planner.plan is not None
    assert {f.node_id: f.source for f in planner.plan.forecasts}[11] == "measured"


def test_a_deadline_no_node_can_meet_is_in_the_rounds_record() -> None:
    strategy, planner, grid = _planned(round_deadline_s=0.5)
    grid.handler = _reply(grid.handler, {11: 2.0, 12: 6.0, 13: 1.0})
    _train_round(strategy, grid, 1)
    second = _configs(strategy, grid, 2)
    assert all(c.deadline_s == 0.5 for c in second.values())
    _train_round(strategy, grid, 2)
    assert any(
        w.startswith("round-deadline-s: 0.5 s is under the best round time of nano-a, nano-b, orin")
        for w in strategy.rounds[-1].warnings
    )
    assert planner.log[-1]["unmeetable"] == ["nano-a", "nano-b", "orin"]


def test_a_node_failing_mid_round_does_not_stall_the_plan() -> None:
    strategy, planner, grid = _planned()
    handler = grid.handler
    grid.handler = _reply(handler, {11: 2.0, 12: 6.0, 13: 1.0})
    _train_round(strategy, grid, 1)
    grid.handler = _reply(_handler(fail=[12]), {11: 2.0, 12: 6.0, 13: 1.0})
    arrays, _ = _train_round(strategy, grid, 2)  # the pace-setter crashed
    assert arrays is not None and [n.ok for n in strategy.rounds[-1].nodes] == [True, False, True]
    assert planner.log[-1]["missed"] == []
    # the next plan goes on from what it knows (the crashed node's last report still counts)
    third = _configs(strategy, grid, 3)
    assert set(third) == {11, 12, 13} and third[12].critical


def test_a_node_bounded_by_max_work_share_is_named_once_per_run() -> None:
    planner = RoundPlanner(PlanSettings("steps"), local_epochs=2)
    lut_of = {1: _lut()}.get
    planner.begin(1, [1, 2], _Fleet(), lut_of)
    planner.observe(1, report(11, num_examples=10.0, train_time_s=18.0, predicted_time_s=15.0))
    planner.observe(2, report(12, num_examples=10.0, fastest_time_s=4.0))
    for rnd in (2, 3):
        assert planner.begin(rnd, [1, 2], _Fleet(), lut_of) is not None
        planner.observe(1, report(11, num_examples=10.0, train_time_s=30.0))
        capped = report(12, num_examples=10.0, work_share=8.0, work_share_capped=1.0)
        planner.observe(2, capped)
        warnings = planner.record(rnd, {1: 30.0, 2: 3.0}, {1: "a", 2: "b"})
        named = [w for w in warnings if w.startswith("max-work-share")]
        if rnd == 2:
            assert named == [
                "max-work-share: b ran the most extra work it allows in round 2; the "
                "deadline left room for more"
            ]
        else:
            assert named == []
