"""fl_client.pacing: the frequency a paced node runs at, the walk down b*'s row that measures
the cells pacing needs, its report, and pacing on a node end to end."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from fl_client import selector
from fl_client.lut import LUT, load_on_demand, merge_cells
from fl_client.node import train_node
from fl_client.pacing import (
    PacePlan,
    PacingWork,
    freq_index,
    pacing_cells,
    pacing_metrics,
    pacing_walk,
    plan_pacing,
)
from fl_client.profiler import MeasureContext, profile
from fl_client.selector import PowerLimit
from fl_client.settings import RunSettings, SettingsError
from tests.fl_client.test_node import (
    NODE,
    R_FOR_B64,
    initial_state,
    run_config,
    train_config,
)
from tests.fl_client.test_profiler import NANO_FREQS_MHZ, WORKLOAD, CountingSteps, FakeDevice

FREQS = (100.0, 200.0, 300.0, 400.0)


def _lut(
    time_row: list[float],
    peak_row: list[float],
    avg_row: list[float],
    cap: float | None = None,
    grid: str = "",
) -> LUT:
    return LUT(
        device_kind="jetson-nano",
        backend="simulated",
        model_name="cnn",
        input_shape=(1, 8, 8),
        batch_sizes=(16,),
        freqs_mhz=FREQS,
        time_per_sample_s=np.array([time_row], dtype=float),
        peak_power_w=np.array([peak_row], dtype=float),
        avg_power_w=np.array([avg_row], dtype=float),
        p_max_w=cap,
        grid=grid,
    )


# time per sample falls with f; energy per sample (avg × time) is least at 200 MHz
TIME = [4.0, 2.0, 1.5, 1.25]
AVG = [2.0, 3.0, 5.0, 8.0]  # energy per sample: 8, 6, 7.5, 10
PEAK = [2.5, 3.5, 5.5, 8.5]


def _work(deadline_s: float | None, **kw: float) -> PacingWork:
    return PacingWork(samples=10, deadline_s=deadline_s, **kw)


def test_pacing_work_budget_is_the_deadline_less_its_margin() -> None:
    assert _work(100.0).margin == 0.05 and _work(100.0).budget_s == pytest.approx(95.0)
    assert _work(100.0, margin=0.0).budget_s == 100.0
    assert math.isinf(_work(None).budget_s)


def test_freq_index_is_the_nearest_table_frequency() -> None:
    assert freq_index(FREQS, 300.0) == 2 and freq_index(FREQS, 310.0) == 2
    assert freq_index(FREQS, 0.0) == 0 and freq_index(FREQS, 1e6) == 3


def test_pacing_picks_least_energy_frequency_that_meets_the_deadline() -> None:
    lut = _lut(TIME, PEAK, AVG)
    plan = plan_pacing(lut, 16, 400.0, PowerLimit(math.inf), _work(100.0, margin=0.0))
    assert plan.freq_mhz == 200.0  # 20 s, 60 J; 100 MHz would be 80 J
    assert plan.meets_deadline
    assert plan.predicted_time_s == pytest.approx(20.0)
    assert plan.predicted_energy_j == pytest.approx(60.0)
    assert plan.fastest_time_s == pytest.approx(12.5)
    assert plan.fastest_energy_j == pytest.approx(100.0)


def test_pacing_keeps_deadline_margin_and_falls_back_to_f_star() -> None:
    lut = _lut(TIME, PEAK, AVG)
    # 20 s at 200 MHz does not fit 21 s minus a 10% margin: 300 MHz (15 s, 75 J) does
    tight = plan_pacing(lut, 16, 400.0, PowerLimit(math.inf), _work(21.0, margin=0.1))
    assert tight.freq_mhz == 300.0
    # nothing meets 5 s: run at f*, reported as not meeting
    miss = plan_pacing(lut, 16, 400.0, PowerLimit(math.inf), _work(5.0))
    assert miss.freq_mhz == 400.0 and not miss.meets_deadline
    # no deadline (round 1): f*
    free = plan_pacing(lut, 16, 400.0, PowerLimit(math.inf), _work(None))
    assert free.freq_mhz == 400.0 and free.meets_deadline


def test_pacing_never_goes_above_f_star_nor_over_the_cap() -> None:
    lut = _lut(TIME, PEAK, AVG, cap=6.0)
    # f* = 300 MHz under the 6 W cap; 400 MHz is faster but above f* and the cap
    plan = plan_pacing(lut, 16, 300.0, PowerLimit(6.0), _work(1000.0))
    assert plan.freq_mhz == 200.0
    fast = plan_pacing(lut, 16, 300.0, PowerLimit(6.0), _work(16.0, margin=0.0))
    assert fast.freq_mhz == 300.0
    # calibration scales the predicted times: 1.5 × 15 s = 22.5 s misses 20 s
    slow = plan_pacing(
        lut, 16, 300.0, PowerLimit(6.0), _work(20.0, margin=0.0, time_calibration=1.5)
    )
    assert slow.freq_mhz == 300.0 and not slow.meets_deadline
    assert slow.predicted_time_s == pytest.approx(22.5)
    # a cap below every cell below f*: only f* itself is left
    assert plan_pacing(lut, 16, 300.0, PowerLimit(2.0), _work(1000.0)).freq_mhz == 300.0


def test_pacing_judges_each_cell_below_f_star_as_the_selector_does() -> None:
    # 100 MHz reads above the 6 W cap (a noisy cell): it is left out, not the cells above
    # it (the old running-maximum rule left only f* itself).
    lut = _lut(TIME, [7.0, 3.5, 5.5, 8.5], AVG, cap=6.0)
    plan = plan_pacing(lut, 16, 300.0, PowerLimit(6.0), _work(1000.0))
    assert plan.freq_mhz == 200.0
    # σ of 200 MHz's per-step peaks of 1.3 W: 3.5 + 2 × 1.3 = 6.1 W is not below 6 W
    noisy = dataclasses.replace(lut, peak_sigma_w=np.array([[0.0, 1.3, 0.0, math.nan]]))
    assert plan_pacing(noisy, 16, 300.0, PowerLimit(6.0), _work(1000.0)).freq_mhz == 300.0
    lenient = selector.SelectionRule(peak_sigma_k=1.0)  # 4.8 W: feasible again
    assert (
        plan_pacing(noisy, 16, 300.0, PowerLimit(6.0), _work(1000.0), rule=lenient).freq_mhz
        == 200.0
    )


def test_time_spent_before_training_counts_against_the_deadline() -> None:
    lut = _lut(TIME, PEAK, AVG)
    # 20 s at 200 MHz fits 25 s, but not after 6 s spent measuring: 300 MHz (15 s) does
    assert (
        plan_pacing(lut, 16, 400.0, PowerLimit(math.inf), _work(25.0, margin=0.0)).freq_mhz == 200.0
    )
    late = plan_pacing(
        lut, 16, 400.0, PowerLimit(math.inf), _work(25.0, margin=0.0, reserved_s=6.0)
    )
    assert late.freq_mhz == 300.0 and late.meets_deadline


def test_pacing_needs_the_f_star_cell() -> None:
    nan = math.nan
    lut = _lut([4.0, 2.0, nan, nan], [2.5, 3.5, nan, nan], [2, 3, nan, nan], grid="on-demand")
    with pytest.raises(ValueError, match="gpu-freq-mhz: the LUT has no cell at b=16, f\\*=400"):
        plan_pacing(lut, 16, 400.0, PowerLimit(math.inf), _work(100.0))


def test_pacing_counts_the_idle_wait_so_racing_to_idle_is_not_free() -> None:
    # Training energy per sample is least at the top frequency (race to idle) ...
    time_row, avg_row = [4.0, 2.0, 1.5, 1.25], [1.6, 2.6, 3.2, 3.6]  # 6.4, 5.2, 4.8, 4.5 J
    lut = _lut(time_row, [x + 0.5 for x in avg_row], avg_row)
    plan = plan_pacing(lut, 16, 400.0, PowerLimit(math.inf), _work(100.0, margin=0.0))
    assert plan.freq_mhz == 400.0
    # ... but a node that finishes early idles at 1.5 W until the round ends: above idle,
    # energy per sample is 0.4, 2.2, 2.55, 2.625 J, so the slowest frequency in time wins.
    paced = plan_pacing(
        lut, 16, 400.0, PowerLimit(math.inf), _work(100.0, margin=0.0, idle_power_w=1.5)
    )
    assert paced.freq_mhz == 100.0 and paced.meets_deadline
    # the deadline still rules: 40 s at 100 MHz does not fit 25 s, 20 s at 200 MHz does
    tight = plan_pacing(
        lut, 16, 400.0, PowerLimit(math.inf), _work(25.0, margin=0.0, idle_power_w=1.5)
    )
    assert tight.freq_mhz == 200.0


# --------------------------------------------------------------------------- the walk


def _walker(avg_row: list[float], cost_per_sample: float = 0.0) -> tuple[LUT, object, list[float]]:
    """A LUT that knows only f* = 400 MHz (an uncapped node's), and a ``measure`` that fills
    in cells of the TIME / ``avg_row`` row at a device time of ``cost_per_sample`` × the
    cell's time per sample, recording which frequencies it measured."""
    nan = math.nan
    peak_row = [a + 0.5 for a in avg_row]
    lut = _lut(
        [nan] * 3 + [TIME[3]], [nan] * 3 + [peak_row[3]], [nan] * 3 + [avg_row[3]], grid="highest"
    )
    known = {"lut": lut}
    measured: list[float] = []

    def measure(freq_mhz: float) -> tuple[LUT, float]:
        measured.append(freq_mhz)
        j = FREQS.index(freq_mhz)
        cell = [[row[j] if k == j else nan for k in range(4)] for row in (TIME, peak_row, avg_row)]
        one = _lut(cell[0], cell[1], cell[2], grid="on-demand")
        known["lut"] = merge_cells(known["lut"], one, overwrite=False)
        return known["lut"], cost_per_sample * TIME[j]

    return lut, measure, measured


def _walk(
    lut: LUT, budget_s: float, measure: object, *, cell_samples: int = 0, idle_power_w: float = 0.0
) -> LUT:
    return pacing_walk(
        lut,
        16,
        400.0,
        budget_s,
        measure,  # type: ignore[arg-type]
        samples=1.0,
        cell_samples=cell_samples,
        idle_power_w=idle_power_w,
    )


def test_pacing_walk_measures_down_from_f_star_until_the_deadline_is_missed() -> None:
    lut, measure, measured = _walker(AVG)  # energy per sample 8, 6, 7.5, 10
    # 1.5 s fits a budget of 1.8 s, 2.0 s does not: 300 and 200 MHz measured, not 100
    walked = _walk(lut, 1.8, measure)
    assert measured == [300.0, 200.0]
    assert math.isnan(walked.time_per_sample_s[0, 0])
    assert walked.time_per_sample_s[0, 1:].tolist() == [2.0, 1.5, 1.25]
    # the same or a tighter budget measures nothing new; a looser one only what it needs
    assert _walk(walked, 1.8, measure) is walked
    assert _walk(walked, 1.3, measure) is walked
    assert len(measured) == 2
    _walk(walked, 5.0, measure)
    assert measured == [300.0, 200.0, 100.0]
    # a node whose f* already misses the budget (the straggler) measures nothing
    lut, measure, measured = _walker(AVG)
    assert _walk(lut, 1.0, measure) is lut and measured == []


def test_pacing_walk_measures_only_what_fits_the_round_with_the_frequency_above() -> None:
    # measuring a cell takes as long as 1 sample there; training takes 1 sample as well
    lut, measure, measured = _walker(AVG, cost_per_sample=1.0)
    # 300 MHz: at most 1.25 × 4/3 s to measure + 1.25 s at 400 MHz = 2.9 s fit 4 s; it took
    # 1.5 s. 200 MHz: 1.5 + (at most 2.25 + 1.5 s) > 4 s: left for a later round
    walked = _walk(lut, 4.0, measure, cell_samples=1)
    assert measured == [300.0]
    # next round: 300 MHz is cached, 200 MHz now fits (2.25 + 1.5 s), 100 MHz not after it
    _walk(walked, 4.0, measure, cell_samples=1)
    assert measured == [300.0, 200.0]


def test_pacing_walk_stops_once_energy_rises_past_its_minimum() -> None:
    # energy per sample at 100, 200, 300, 400 MHz: 20, 9, 6, 10 J; every frequency meets
    # the budget, but 9 J at 200 MHz is past the minimum at 300 MHz: 100 MHz is never measured
    avg = [5.0, 4.5, 4.0, 8.0]
    lut, measure, measured = _walker(avg)
    _walk(lut, 100.0, measure)
    assert measured == [300.0, 200.0]
    # above an idle power of 2 W: 12, 5, 3, 7.5 J, the same minimum
    lut, measure, measured = _walker(avg)
    _walk(lut, 100.0, measure, idle_power_w=2.0)
    assert measured == [300.0, 200.0]
    # energy falling all the way down: nothing stops the walk before the lowest frequency;
    # rising right below f*: one cell, then stop
    lut, measure, measured = _walker([1.0, 2.0, 3.0, 8.0])  # 4, 4, 4.5, 10 J
    _walk(lut, 100.0, measure)
    assert measured == [300.0, 200.0, 100.0]
    lut, measure, measured = _walker([5.0, 6.0, 8.0, 7.0])  # 20, 12, 12, 8.75 J
    _walk(lut, 100.0, measure)
    assert measured == [300.0]


# --------------------------------------------------------------------------- pacing_cells


def _highest_lut_and_choice() -> tuple[LUT, selector.Selection]:
    """An uncapped node's LUT (each b at the top frequency) and its (b*, f*)."""
    lut = profile(
        FakeDevice(), WORKLOAD, [16, 32], CountingSteps(), uncapped="highest", progress=False
    )
    choice = selector.select_power_aware(
        lut.time_per_sample_s, lut.peak_power_w, [16, 32], NANO_FREQS_MHZ, [1.0, 0.5], None
    )
    return lut, choice


def test_pacing_cells_measure_b_star_row_lazily_and_cache_it(tmp_path: Path) -> None:
    lut, choice = _highest_lut_and_choice()
    assert (choice.batch_size, choice.freq_mhz) == (32, 921.6)
    device, steps = FakeDevice(), CountingSteps()
    ctx = MeasureContext(device, WORKLOAD, steps, tmp_path)
    samples = 32 * 400
    # no deadline (round 1): nothing measured, the plan is the LUT itself
    first = pacing_cells(ctx, lut, choice, PacingWork(samples, None))
    assert first.measured == 0 and first.cells is None and first.time_s == 0.0
    assert first.plan_lut is lut and not steps.calls
    # above an idle power of 1.2 W the fake's energy per sample falls as f falls, so the
    # walk goes down b*'s row as far as the deadline allows
    fastest_s = samples * device.time_per_sample_s(32, 921.6)
    work = PacingWork(samples, deadline_s=1.4 * fastest_s, margin=0.0, idle_power_w=1.2)
    paced = pacing_cells(ctx, lut, choice, work)
    assert paced.measured >= 2 and paced.cells is not None
    assert paced.cells.cells_profiled == paced.measured
    assert paced.time_s > 0 and paced.energy_j > 0
    assert paced.cells.profile_time_s == pytest.approx(paced.time_s)
    row = paced.plan_lut.time_per_sample_s[1]
    measured = [j for j in range(len(row)) if not math.isnan(row[j])]
    top = len(NANO_FREQS_MHZ) - 1
    assert measured == list(range(top - paced.measured, top + 1))  # from f* down, in a row
    assert np.isnan(paced.plan_lut.time_per_sample_s[0, :-1]).all()  # only b*'s row
    # measuring never makes the node late: the frequency above the lowest cell measured
    # still fits the budget after all the measuring, and pacing plans within it
    assert samples * row[measured[1]] + paced.time_s <= work.budget_s
    after = dataclasses.replace(work, reserved_s=paced.time_s)
    plan = plan_pacing(paced.plan_lut, 32, 921.6, PowerLimit(math.inf), after)
    assert plan.meets_deadline and plan.freq_mhz < 921.6
    # cached apart from the selection LUT
    cached = load_on_demand(tmp_path, device, WORKLOAD, lut.batch_sizes)
    assert cached is not None and cached.to_json() == paced.cells.to_json()
    assert list(tmp_path.glob("*highest*")) == []
    # later rounds measure only what did not fit before, from the cache on, until the
    # walk ends; then a round measures nothing and plans from the same cells
    counts = [paced.measured]
    for _ in range(10):
        later = pacing_cells(ctx, lut, choice, work)
        counts.append(later.measured)
        if later.measured == 0:
            break
    assert counts[-1] == 0 and later.time_s == 0.0
    cached = load_on_demand(tmp_path, device, WORKLOAD, lut.batch_sizes)
    assert cached is not None and cached.cells_profiled == sum(counts)
    again = pacing_cells(ctx, lut, choice, work)
    assert again.measured == 0
    np.testing.assert_array_equal(
        again.plan_lut.time_per_sample_s, later.plan_lut.time_per_sample_s
    )


def test_pacing_metrics_report_deadline_slack_and_predicted_saving() -> None:
    plan = PacePlan(
        freq_mhz=200.0,
        predicted_time_s=20.0,
        predicted_energy_j=60.0,
        fastest_time_s=12.5,
        fastest_energy_j=100.0,
        meets_deadline=True,
    )
    # measured 10% slower and 20% more energy than the LUT said: f*'s prediction scales alike
    out = pacing_metrics(plan, 400.0, 22.0, 72.0, 30.0)
    assert out["f-star-mhz"] == 400.0
    assert out["fastest-time-s"] == pytest.approx(12.5 * 1.1)
    assert out["predicted-energy-saved-j"] == pytest.approx(100.0 * 1.2 - 72.0)
    assert out["deadline-s"] == 30.0 and out["slack-s"] == pytest.approx(8.0)
    assert out["deadline-miss"] == 0.0
    # idle power prices the wait that running at f* would have had
    idle = pacing_metrics(plan, 400.0, 22.0, 72.0, 30.0, idle_power_w=1.0)
    assert idle["predicted-energy-saved-j"] == pytest.approx(48.0 + (22.0 - 12.5 * 1.1))
    late = pacing_metrics(plan, 400.0, 31.0, 72.0, 30.0)
    assert late["deadline-miss"] == 1.0 and late["slack-s"] == pytest.approx(-1.0)
    # without a deadline: no deadline keys; at f* nothing is saved
    at_f_star = PacePlan(400.0, 12.5, 100.0, 12.5, 100.0, True)
    free = pacing_metrics(at_f_star, 400.0, 13.0, 104.0, None)
    assert set(free) == {"f-star-mhz", "fastest-time-s", "predicted-energy-saved-j"}
    assert free["predicted-energy-saved-j"] == 0.0
    assert free["fastest-time-s"] == pytest.approx(13.0)  # the measurement itself


# --------------------------------------------------------------------------- settings


def test_pacing_settings_are_validated_with_the_key() -> None:
    assert RunSettings.from_config({}).pacing == "off"
    s = RunSettings.from_config({"pacing": "deadline", "drift-check-every": 2})
    assert s.pacing == "deadline" and s.drift_check_every == 2 and s.drift_threshold == 0.15
    assert s.pacing_margin == 0.05 and s.pacing_deadline_s == 0.0
    with pytest.raises(
        SettingsError, match=r"pacing: unknown value 'fast'; allowed: off, deadline"
    ):
        RunSettings.from_config({"pacing": "fast"})
    with pytest.raises(SettingsError, match="pacing-margin"):
        RunSettings.from_config({"pacing-margin": 1.5})
    with pytest.raises(SettingsError, match="pacing-deadline-s"):
        RunSettings.from_config({"pacing-deadline-s": -1})
    with pytest.raises(SettingsError, match="drift-check-every"):
        RunSettings.from_config({"drift-check-every": -1})
    with pytest.raises(SettingsError, match="drift-threshold"):
        RunSettings.from_config({"drift-threshold": 0})


# --------------------------------------------------------------------------- on the node


def test_paced_node_reports_deadline_slack_and_saving(tmp_path: Path) -> None:
    run = run_config(tmp_path, pacing="deadline")
    node = {**NODE, "p-max-w": 7.0}
    state = initial_state()
    _, m1 = train_node(run, node, train_config(1, r=R_FOR_B64), state)
    assert m1.batch_size == 64
    # round 1: f*, the LUT profiled, no deadline yet, nothing measured for pacing
    assert m1.gpu_freq_mhz == m1.f_star_mhz and m1.profile_time_s > 0
    assert m1.pacing_cells_measured == 0
    assert m1.fastest_time_s == pytest.approx(m1.train_time_s)
    assert m1.deadline_s is None and m1.slack_s is None and m1.deadline_miss is None
    assert m1.predicted_energy_saved_j == 0.0
    # a generous deadline: slower frequency, no miss, energy saved, nothing profiled
    assert m1.fastest_time_s is not None
    deadline = 3 * m1.fastest_time_s
    _, m2 = train_node(run, node, train_config(2, r=R_FOR_B64, deadline_s=deadline), state)
    assert m2.batch_size == m1.batch_size
    assert m2.f_star_mhz is not None and m2.gpu_freq_mhz < m2.f_star_mhz == m1.f_star_mhz
    assert m2.deadline_s == deadline and m2.deadline_miss == 0.0
    assert m2.slack_s == pytest.approx(deadline - m2.train_time_s)
    assert m2.predicted_energy_saved_j is not None and m2.predicted_energy_saved_j > 0
    assert m2.profile_time_s == 0.0
    # an impossible deadline: f*, reported as a miss with negative slack
    tiny = m1.fastest_time_s / 4
    _, m3 = train_node(run, node, train_config(3, r=R_FOR_B64, deadline_s=tiny), state)
    assert m3.gpu_freq_mhz == m3.f_star_mhz
    assert m3.deadline_miss == 1.0 and m3.slack_s is not None and m3.slack_s < 0


def test_pacing_measures_b_star_row_lazily_below_f_star_and_caches_it(tmp_path: Path) -> None:
    run = run_config(tmp_path, pacing="deadline")
    node = {**NODE, "p-max-w": "none"}  # its LUT has each b at the top frequency only
    state = initial_state()
    _, m1 = train_node(run, node, train_config(1), state)
    lut_dir = tmp_path / "cache" / "nodes"
    (lut_file,) = lut_dir.rglob("lut_*_highest_*.json")
    lut = LUT.load(lut_file)
    assert m1.profile_time_s == pytest.approx(lut.profile_time_s)  # the LUT alone
    assert m1.pacing_cells_measured == 0 and not list(lut_dir.rglob("*on-demand*"))
    # as the server does: a deadline from the slowest node, the node's own calibration
    assert m1.fastest_time_s is not None and m1.predicted_time_s is not None
    deadline = 8 * m1.fastest_time_s
    calibration = m1.train_time_s / m1.predicted_time_s
    rounds = []
    for rnd in range(2, 10):
        cfg = train_config(rnd, deadline_s=deadline, time_calibration=calibration)
        _, m = train_node(run, node, cfg, state)
        rounds.append(m)
        # measuring is part of the round and never makes the node late
        assert m.profile_time_s + m.train_time_s <= deadline
        assert m.f_star_mhz is not None and m.gpu_freq_mhz < m.f_star_mhz
        assert m.deadline_miss == 0.0
        if m.pacing_cells_measured == 0:
            break
    counts = [m.pacing_cells_measured for m in rounds]
    assert counts[0] is not None and counts[0] >= 1 and counts[-1] == 0  # the walk ends
    (cells_file,) = lut_dir.rglob("lut_*_on-demand_*.json")
    cells = LUT.load(cells_file)
    assert cells.p_max_w is None and cells.grid == "on-demand"
    assert cells.cells_profiled == sum(c or 0 for c in counts)
    assert cells.profile_time_s == pytest.approx(sum(m.profile_time_s for m in rounds))
    # b*'s row only, from just below f* down, one frequency after the other
    i = cells.batch_sizes.index(int(m1.batch_size))
    row = cells.time_per_sample_s[i]
    measured = [j for j in range(len(row)) if not math.isnan(row[j])]
    assert m1.f_star_mhz is not None
    j_star = cells.freqs_mhz.index(m1.f_star_mhz)
    assert measured == list(range(j_star - len(measured), j_star))
    # the selection LUT is untouched, so (b*, f*) cannot move
    assert LUT.load(lut_file).to_json() == lut.to_json()
    assert all(m.f_star_mhz == m1.f_star_mhz for m in rounds)
    # once the walk has ended, the same deadline measures nothing and runs where it ran
    cfg = train_config(10, deadline_s=deadline, time_calibration=calibration)
    _, again = train_node(run, node, cfg, state)
    assert again.pacing_cells_measured == 0 and again.profile_time_s == 0.0
    assert again.gpu_freq_mhz == rounds[-1].gpu_freq_mhz


def test_unpaced_node_ignores_deadline_and_has_no_pacing_metrics(tmp_path: Path) -> None:
    node = {**NODE, "p-max-w": 7.0}
    _, m = train_node(run_config(tmp_path), node, train_config(2, deadline_s=99.0), initial_state())
    assert m.deadline_s is None and m.predicted_energy_saved_j is None
    assert m.f_star_mhz is None and m.pacing_cells_measured is None
    assert "deadline-s" not in m.to_metrics()
