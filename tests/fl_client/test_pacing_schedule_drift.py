"""Issue 7 on the node: deadline-aware pacing, cap schedules and LUT drift checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_client.node import pacing_walk, plan_pacing, train_node
from fl_client.profiler import LUT, LUTFormatError, merge_cells
from fl_client.settings import RunSettings, SettingsError, load_fleet, parse_p_max_schedule
from fl_client.task import build_model

FREQS = (100.0, 200.0, 300.0, 400.0)


def _lut(time_row, peak_row, avg_row, cap=None, grid="") -> LUT:
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


def test_pacing_picks_least_energy_frequency_that_meets_the_deadline():
    lut = _lut(TIME, PEAK, AVG)
    plan = plan_pacing(lut, 16, 400.0, math.inf, samples=10, deadline_s=100.0, margin=0.0)
    assert plan.freq_mhz == 200.0  # 20 s, 60 J; 100 MHz would be 80 J
    assert plan.meets_deadline
    assert plan.predicted_energy_j == pytest.approx(60.0)
    assert plan.fastest_time_s == pytest.approx(12.5)
    assert plan.fastest_energy_j == pytest.approx(100.0)


def test_pacing_keeps_deadline_margin_and_falls_back_to_f_star():
    lut = _lut(TIME, PEAK, AVG)
    # 20 s at 200 MHz does not fit 21 s minus a 10% margin: 300 MHz (15 s, 75 J) does
    tight = plan_pacing(lut, 16, 400.0, math.inf, samples=10, deadline_s=21.0, margin=0.1)
    assert tight.freq_mhz == 300.0
    # nothing meets 5 s: run at f*, reported as not meeting
    miss = plan_pacing(lut, 16, 400.0, math.inf, samples=10, deadline_s=5.0)
    assert miss.freq_mhz == 400.0 and not miss.meets_deadline
    # no deadline (round 1): f*
    assert plan_pacing(lut, 16, 400.0, math.inf, samples=10, deadline_s=None).freq_mhz == 400.0


def test_pacing_never_goes_above_f_star_nor_over_the_cap():
    lut = _lut(TIME, PEAK, AVG, cap=6.0)
    # f* = 300 MHz under the 6 W cap; 400 MHz is faster but above f* and the cap
    plan = plan_pacing(lut, 16, 300.0, 6.0, samples=10, deadline_s=1000.0)
    assert plan.freq_mhz == 200.0
    fast = plan_pacing(lut, 16, 300.0, 6.0, samples=10, deadline_s=16.0, margin=0.0)
    assert fast.freq_mhz == 300.0
    # calibration scales the predicted times: 1.5 × 15 s = 22.5 s misses 20 s
    slow = plan_pacing(lut, 16, 300.0, 6.0, 10, 20.0, margin=0.0, time_calibration=1.5)
    assert slow.freq_mhz == 300.0 and not slow.meets_deadline


def _walker(avg_row, cost_per_sample=0.0):
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
        known["lut"] = merge_cells(known["lut"], _lut(*cell, grid="on-demand"), overwrite=False)
        return known["lut"], cost_per_sample * TIME[j]

    return lut, measure, measured


def _walk(lut, budget_s, measure, *, cell_samples=0, idle_power_w=0.0):
    return pacing_walk(
        lut,
        16,
        400.0,
        budget_s,
        measure,
        samples=1.0,
        cell_samples=cell_samples,
        idle_power_w=idle_power_w,
    )


def test_pacing_walk_measures_down_from_f_star_until_the_deadline_is_missed():
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


def test_pacing_walk_measures_only_what_fits_the_round_with_the_frequency_above():
    # measuring a cell takes as long as 1 sample there; training takes 1 sample as well
    lut, measure, measured = _walker(AVG, cost_per_sample=1.0)
    # 300 MHz: at most 1.25 × 4/3 s to measure + 1.25 s at 400 MHz = 2.9 s fit 4 s; it took
    # 1.5 s. 200 MHz: 1.5 + (at most 2.25 + 1.5 s) > 4 s: left for a later round
    walked = _walk(lut, 4.0, measure, cell_samples=1)
    assert measured == [300.0]
    # next round: 300 MHz is cached, 200 MHz now fits (2.25 + 1.5 s), 100 MHz not after it
    _walk(walked, 4.0, measure, cell_samples=1)
    assert measured == [300.0, 200.0]


def test_pacing_walk_stops_once_energy_rises_past_its_minimum():
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


def test_merge_cells_fills_or_overwrites():
    base = _lut(
        [4.0, 2.0, math.nan, math.nan],
        [2.5, 3.5] + [math.nan] * 2,
        [2, 3] + [math.nan] * 2,
        cap=4.0,
    )
    extra = _lut([5.0, 2.5, 1.5, math.nan], [2.6, 3.6, 5.5, math.nan], [2, 3, 5, math.nan], cap=6.0)
    filled = merge_cells(base, extra, overwrite=False)
    assert filled.time_per_sample_s[0].tolist()[:3] == [4.0, 2.0, 1.5]
    assert math.isnan(filled.time_per_sample_s[0, 3]) and filled.p_max_w == 4.0
    fresh = merge_cells(base, extra, overwrite=True)
    assert fresh.time_per_sample_s[0].tolist()[:3] == [5.0, 2.5, 1.5]
    other = LUT(**{**_lut_kwargs(base), "freqs_mhz": (1.0, 2.0, 3.0, 4.0)})
    with pytest.raises(LUTFormatError, match="freqs-mhz"):
        merge_cells(base, other, overwrite=True)


def _lut_kwargs(lut: LUT) -> dict:
    return {
        k: getattr(lut, k)
        for k in (
            "device_kind",
            "backend",
            "model_name",
            "input_shape",
            "batch_sizes",
            "freqs_mhz",
            "time_per_sample_s",
            "peak_power_w",
            "avg_power_w",
            "p_max_w",
        )
    }


# --------------------------------------------------------------------------- settings


def test_pacing_settings_are_validated_with_the_key():
    assert RunSettings.from_config({}).pacing == "off"
    s = RunSettings.from_config({"pacing": "deadline", "drift-check-every": 2})
    assert s.pacing == "deadline" and s.drift_check_every == 2 and s.drift_threshold == 0.15
    with pytest.raises(
        SettingsError, match=r"pacing: unknown value 'fast'; allowed: off, deadline"
    ):
        RunSettings.from_config({"pacing": "fast"})
    with pytest.raises(SettingsError, match="pacing-margin"):
        RunSettings.from_config({"pacing-margin": 1.5})
    with pytest.raises(SettingsError, match="drift-check-every"):
        RunSettings.from_config({"drift-check-every": -1})
    with pytest.raises(SettingsError, match="drift-threshold"):
        RunSettings.from_config({"drift-threshold": 0})


def test_schedule_parses_steps_and_csv(tmp_path):
    assert parse_p_max_schedule("1:7.0, 5:4.5 ,9:none", "n") == ((1, 7.0), (5, 4.5), (9, math.inf))
    csv = tmp_path / "trace.csv"
    csv.write_text("round,p-max-w\n1,7\n2,6.5\n3,none\n")
    assert parse_p_max_schedule(str(csv), "n") == ((1, 7.0), (2, 6.5), (3, math.inf))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("2:7.0,5:4.5", "must start at round 1"),
        ("1:7.0,5:-4.5", r"p-max-schedule \(round 5\): must be > 0 W"),
        ("1:7.0,5:lots", r"p-max-schedule \(round 5\): expected a number"),
        ("1:7.0,x:4.5", "round 'x' is not an integer"),
        ("1:7.0,5:4.5,5:4.0", "strictly ascending"),
        ("1-7.0", "is not 'round:cap'"),
    ],
)
def test_bad_schedules_name_node_and_key(value, match):
    with pytest.raises(SettingsError, match=match) as err:
        parse_p_max_schedule(value, "fleet f.toml node #2 (nano)")
    assert "fleet f.toml node #2 (nano): p-max-schedule" in str(err.value)


def test_csv_trace_with_gaps_is_refused(tmp_path):
    csv = tmp_path / "trace.csv"
    csv.write_text("round,p-max-w\n1,7\n2,6.5\n5,4.5\n")
    with pytest.raises(SettingsError, match=r"gaps: rounds \[3, 4\] are missing"):
        parse_p_max_schedule(str(csv), "node-config")


def test_fleet_schedule_and_both_keys(tmp_path):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[[node]]\nname = "solar"\ndevice = "jetson-nano"\np-max-schedule = "1:7,3:4.5"\n'
        "count = 2\n"
    )
    nodes = load_fleet(fleet)
    assert [nodes[0].p_max_at(r) for r in (1, 2, 3, 9)] == [7.0, 7.0, 4.5, 4.5]
    assert nodes[1].scheduled_caps_w == (4.5, 7.0) and "p-max-schedule" not in nodes[1].options
    fleet.write_text(
        '[[node]]\nname = "solar"\ndevice = "jetson-nano"\np-max-w = 5\np-max-schedule = "1:7"\n'
    )
    with pytest.raises(SettingsError, match=r"\(solar\): p-max-w and p-max-schedule"):
        load_fleet(fleet)


# --------------------------------------------------------------------------- train_node

NODE = {"device": "jetson-nano", "backend": "simulated", "partition-id": 0, "num-partitions": 4}
CFG = {
    "method": "power-aware",
    "batch-sizes": [8, 16, 32, 64],
    "r": [0.4, 0.5, 0.7, 1.0],
    "local-epochs": 1,
    "model": "cnn",
}


def _run(tmp_path, **over):
    return {"cache-dir": str(tmp_path / "cache"), "output-dir": str(tmp_path / "runs"), **over}


def test_paced_node_reports_deadline_slack_and_saving(tmp_path):
    run = _run(tmp_path, pacing="deadline")
    node = {**NODE, "p-max-w": 7.0}
    state = build_model("cnn").state_dict()
    _, m1, _ = train_node(run, node, {**CFG, "server-round": 1}, state)
    # round 1: f*, the LUT profiled, no deadline yet, nothing measured for pacing
    assert m1["gpu-freq-mhz"] == m1["f-star-mhz"] and m1["profile-time-s"] > 0
    assert m1["pacing-cells-measured"] == 0
    assert m1["fastest-time-s"] == pytest.approx(m1["train-time-s"])
    assert "deadline-s" not in m1 and m1["predicted-energy-saved-j"] == 0.0
    # a generous deadline: slower frequency, no miss, energy saved, nothing profiled
    deadline = 3 * m1["fastest-time-s"]
    _, m2, _ = train_node(run, node, {**CFG, "server-round": 2, "deadline-s": deadline}, state)
    assert m2["batch-size"] == m1["batch-size"]
    assert m2["gpu-freq-mhz"] < m2["f-star-mhz"] == m1["f-star-mhz"]
    assert m2["deadline-s"] == deadline and m2["deadline-miss"] == 0.0
    assert m2["slack-s"] == pytest.approx(deadline - m2["train-time-s"])
    assert m2["predicted-energy-saved-j"] > 0 and m2["profile-time-s"] == 0.0
    # an impossible deadline: f*, reported as a miss with negative slack
    tiny = m1["fastest-time-s"] / 4
    _, m3, _ = train_node(run, node, {**CFG, "server-round": 3, "deadline-s": tiny}, state)
    assert m3["gpu-freq-mhz"] == m3["f-star-mhz"]
    assert m3["deadline-miss"] == 1.0 and m3["slack-s"] < 0


def test_pacing_measures_b_star_row_lazily_below_f_star_and_caches_it(tmp_path):
    run = _run(tmp_path, pacing="deadline")
    node = {**NODE, "p-max-w": "none"}  # its LUT has each b at the top frequency only
    state = build_model("cnn").state_dict()
    _, m1, _ = train_node(run, node, {**CFG, "server-round": 1}, state)
    lut_dir = tmp_path / "cache" / "nodes"
    (lut_file,) = lut_dir.rglob("lut_*_highest_*.json")
    lut = LUT.load(lut_file)
    assert m1["profile-time-s"] == pytest.approx(lut.profile_time_s)  # the LUT alone
    assert m1["pacing-cells-measured"] == 0 and not list(lut_dir.rglob("*on-demand*"))
    # as the server does: a deadline from the slowest node, the node's own calibration
    deadline = 8 * m1["fastest-time-s"]
    paced = {
        "deadline-s": deadline,
        "time-calibration": m1["train-time-s"] / m1["predicted-time-s"],
    }
    rounds = []
    for rnd in range(2, 10):
        _, m, _ = train_node(run, node, {**CFG, "server-round": rnd, **paced}, state)
        rounds.append(m)
        # measuring is part of the round and never makes the node late
        assert m["profile-time-s"] + m["train-time-s"] <= deadline
        assert m["gpu-freq-mhz"] < m["f-star-mhz"] and m["deadline-miss"] == 0.0
        if m["pacing-cells-measured"] == 0:
            break
    counts = [m["pacing-cells-measured"] for m in rounds]
    assert counts[0] >= 1 and counts[-1] == 0  # the walk ends, spread over rounds if need be
    (cells_file,) = lut_dir.rglob("lut_*_on-demand_*.json")
    cells = LUT.load(cells_file)
    assert cells.p_max_w is None and cells.grid == "on-demand"
    assert cells.cells_profiled == sum(counts)
    assert cells.profile_time_s == pytest.approx(sum(m["profile-time-s"] for m in rounds))
    # b*'s row only, from just below f* down, one frequency after the other
    i = cells.batch_sizes.index(int(m1["batch-size"]))
    row = cells.time_per_sample_s[i]
    measured = [j for j in range(len(row)) if not math.isnan(row[j])]
    j_star = cells.freqs_mhz.index(m1["f-star-mhz"])
    assert measured == list(range(j_star - len(measured), j_star))
    # the selection LUT is untouched, so (b*, f*) cannot move
    assert LUT.load(lut_file).to_json() == lut.to_json()
    assert all(m["f-star-mhz"] == m1["f-star-mhz"] for m in rounds)
    # once the walk has ended, the same deadline measures nothing and runs where it ran
    _, again, _ = train_node(run, node, {**CFG, "server-round": 10, **paced}, state)
    assert again["pacing-cells-measured"] == 0 and again["profile-time-s"] == 0.0
    assert again["gpu-freq-mhz"] == rounds[-1]["gpu-freq-mhz"]


def test_unpaced_node_ignores_deadline_and_has_no_pacing_metrics(tmp_path):
    node = {**NODE, "p-max-w": 7.0}
    state = build_model("cnn").state_dict()
    _, m, _ = train_node(
        _run(tmp_path), node, {**CFG, "server-round": 2, "deadline-s": 99.0}, state
    )
    assert "deadline-s" not in m and "predicted-energy-saved-j" not in m


def test_cap_schedule_profiles_each_cap_when_it_first_applies_and_skips_infeasible_rounds(
    tmp_path,
):
    run = _run(tmp_path, **{"schedule-profiling": "lazy"})
    node = {**NODE, "p-max-schedule": "1:7.0,2:4.5,3:1.0,4:none,5:7.0,6:1.0"}
    state = build_model("cnn").state_dict()
    luts = tmp_path / "cache" / "nodes"

    def cached_caps() -> list[float | None]:
        return sorted((LUT.load(f).p_max_w for f in luts.rglob("lut_*.json")), key=str)

    _, m1, _ = train_node(run, node, {**CFG, "server-round": 1}, state)
    assert m1["p-max-w"] == 7.0 and m1["peak-power-w"] < 7.0 and m1["profile-time-s"] > 0
    assert cached_caps() == [pytest.approx(7.0 * 0.95)]  # only round 1's cap so far
    _, m2, _ = train_node(run, node, {**CFG, "server-round": 2}, state)
    assert m2["p-max-w"] == 4.5 and m2["peak-power-w"] < 4.5
    assert m2["profile-time-s"] > 0  # 4.5 W applies for the first time
    assert m2["gpu-freq-mhz"] < m1["gpu-freq-mhz"] or m2["batch-size"] < m1["batch-size"]
    with pytest.raises(RuntimeError, match=r"no configuration fits round 3.s") as e3:
        train_node(run, node, {**CFG, "server-round": 3}, state)
    assert "profiling for this cap took" in str(e3.value)
    _, m4, _ = train_node(run, node, {**CFG, "server-round": 4}, state)
    assert math.isinf(m4["p-max-w"]) and m4["profile-time-s"] > 0
    assert len(cached_caps()) == 4  # 6.65 W, 4.275 W, 0.95 W and no cap
    # caps seen before come from the cache: no profiling, the same choice, the same skip
    _, m5, _ = train_node(run, node, {**CFG, "server-round": 5}, state)
    assert m5["profile-time-s"] == 0.0
    assert (m5["batch-size"], m5["gpu-freq-mhz"]) == (m1["batch-size"], m1["gpu-freq-mhz"])
    with pytest.raises(RuntimeError, match=r"no configuration fits round 6's") as e6:
        train_node(run, node, {**CFG, "server-round": 6}, state)
    assert "profiling for this cap took" not in str(e6.value)


def test_cap_schedule_upfront_profiles_every_cap_in_round_1_then_nothing(tmp_path):
    run = _run(tmp_path)  # schedule-profiling = "upfront", the default
    node = {**NODE, "p-max-schedule": "1:7.0,2:4.5,3:1.0,4:none"}
    state = build_model("cnn").state_dict()
    luts = tmp_path / "cache" / "nodes"
    _, m1, _ = train_node(run, node, {**CFG, "server-round": 1}, state)
    assert len(list(luts.rglob("lut_*.json"))) == 4  # 6.65 W, 4.275 W, 0.95 W and no cap
    lazy_run = _run(tmp_path / "lazy", **{"schedule-profiling": "lazy"})
    _, lazy1, _ = train_node(lazy_run, node, {**CFG, "server-round": 1}, state)
    assert m1["profile-time-s"] > lazy1["profile-time-s"] > 0  # it paid for all four caps
    assert (m1["batch-size"], m1["gpu-freq-mhz"]) == (lazy1["batch-size"], lazy1["gpu-freq-mhz"])
    _, m2, _ = train_node(run, node, {**CFG, "server-round": 2}, state)
    assert m2["p-max-w"] == 4.5 and m2["profile-time-s"] == 0.0
    with pytest.raises(RuntimeError, match=r"no configuration fits round 3.s") as e3:
        train_node(run, node, {**CFG, "server-round": 3}, state)
    assert "profiling for this cap took" not in str(e3.value)
    _, m4, _ = train_node(run, node, {**CFG, "server-round": 4}, state)
    assert math.isinf(m4["p-max-w"]) and m4["profile-time-s"] == 0.0


def test_schedule_profiling_rejects_unknown_values(tmp_path):
    from fl_client.settings import RunSettings, SettingsError

    with pytest.raises(SettingsError, match="schedule-profiling"):
        RunSettings.from_config({"schedule-profiling": "sometimes"})
    assert RunSettings.from_config({}).schedule_profiling == "upfront"


def test_drift_check_reprofiles_only_when_the_twin_drifts(tmp_path):
    run = _run(tmp_path, **{"drift-check-every": 1, "drift-threshold": 0.15})
    node = {**NODE, "p-max-w": 7.0, "twin-drift-from-round": 3}
    node.update({"twin-slowdown": 1.5, "twin-extra-power-w": 2.0})  # throttled, busy
    state = build_model("cnn").state_dict()
    _, m1, _ = train_node(run, node, {**CFG, "server-round": 1}, state)
    assert "drift-reprofiled" not in m1  # the LUT was just profiled
    _, m2, _ = train_node(run, node, {**CFG, "server-round": 2}, state)
    assert m2["drift-reprofiled"] == 0.0 and m2["drift-deviation"] < 0.15
    _, m3, _ = train_node(run, node, {**CFG, "server-round": 3}, state)
    assert m3["drift-reprofiled"] == 1.0 and m3["drift-deviation"] > 0.3
    assert m3["profile-time-s"] > 0 and "drift-freq-mhz" in m3
    # the cache now holds the drifted row: the next check agrees with it
    _, m4, _ = train_node(run, node, {**CFG, "server-round": 4}, state)
    assert m4["drift-reprofiled"] == 0.0 and m4["drift-deviation"] < 0.15
    # +2 W makes the old (b*, f*) break the cap: the node re-selected and runs there
    reselected = (m3["drift-batch-size"], m3["drift-freq-mhz"])
    assert reselected != (m2["batch-size"], m2["gpu-freq-mhz"])
    assert (m4["batch-size"], m4["gpu-freq-mhz"]) == reselected and m4["peak-power-w"] < 7.0


def test_drift_check_at_a_paced_frequency_rescales_the_on_demand_cells(tmp_path):
    run = _run(tmp_path, pacing="deadline", **{"drift-check-every": 3})
    node = {**NODE, "p-max-w": "none", "twin-drift-from-round": 3, "twin-slowdown": 1.5}
    state = build_model("cnn").state_dict()
    _, m1, _ = train_node(run, node, {**CFG, "server-round": 1}, state)
    deadline = 8 * m1["fastest-time-s"]
    train_node(run, node, {**CFG, "server-round": 2, "deadline-s": deadline}, state)
    (cells_file,) = (tmp_path / "cache").rglob("lut_*_on-demand_*.json")
    before = LUT.load(cells_file)
    # round 3: 1.5× slower; the paced frequency's prediction comes from the on-demand cells
    cfg3 = {**CFG, "server-round": 3, "deadline-s": 1.5 * deadline}
    _, m3, _ = train_node(run, node, cfg3, state)
    assert m3["gpu-freq-mhz"] < m3["f-star-mhz"]
    assert m3["drift-reprofiled"] == 1.0 and m3["drift-deviation"] > 0.3
    after = LUT.load(cells_file)
    measured = ~np.isnan(before.time_per_sample_s)
    ratio = after.time_per_sample_s[measured] / before.time_per_sample_s[measured]
    assert np.allclose(ratio, ratio[0]) and 1.3 < ratio[0] < 1.7


def test_pacing_counts_the_idle_wait_so_racing_to_idle_is_not_free():
    # Training energy per sample is least at the top frequency (race to idle) ...
    time_row, avg_row = [4.0, 2.0, 1.5, 1.25], [1.6, 2.6, 3.2, 3.6]  # 6.4, 5.2, 4.8, 4.5 J
    lut = _lut(time_row, [x + 0.5 for x in avg_row], avg_row)
    plan = plan_pacing(lut, 16, 400.0, math.inf, samples=10, deadline_s=100.0, margin=0.0)
    assert plan.freq_mhz == 400.0
    # ... but a node that finishes early idles at 1.5 W until the round ends: above idle,
    # energy per sample is 0.4, 2.2, 2.55, 2.625 J, so the slowest frequency in time wins.
    paced = plan_pacing(
        lut, 16, 400.0, math.inf, samples=10, deadline_s=100.0, margin=0.0, idle_power_w=1.5
    )
    assert paced.freq_mhz == 100.0 and paced.meets_deadline
    # the deadline still rules: 40 s at 100 MHz does not fit 25 s, 20 s at 200 MHz does
    tight = plan_pacing(
        lut, 16, 400.0, math.inf, samples=10, deadline_s=25.0, margin=0.0, idle_power_w=1.5
    )
    assert tight.freq_mhz == 200.0
