"""fl_client.node: what one node selects and runs under its cap, less its cap margin."""

from __future__ import annotations

import pytest

from fl_client.node import train_node
from fl_client.profiler import LUT
from fl_client.task import build_model
from tests.fl_client import test_pacing_schedule_drift as paced

NODE = {**paced.NODE, "p-max-w": 5.0}
CFG = {**paced.CFG, "server-round": 1}


def _profiled_peak_w(cache, metrics) -> tuple[LUT, float]:
    (path,) = (cache / "nodes").rglob("lut_*.json")
    lut = LUT.load(path)
    i = lut.batch_sizes.index(int(metrics["batch-size"]))
    j = lut.freqs_mhz.index(metrics["gpu-freq-mhz"])
    return lut, float(lut.peak_power_w[i, j])


def test_cap_margin_keeps_the_profiled_peak_of_the_choice_below_the_reduced_cap(tmp_path):
    state = build_model("cnn").state_dict()
    runs = {}
    for margin in (0.0, 0.1):
        cache = tmp_path / f"cache-{margin}"
        run = {"cache-dir": str(cache), "output-dir": str(tmp_path / "runs"), "cap-margin": margin}
        _, m, _ = train_node(run, {**NODE, "p-max-w": 4.0}, CFG, state)
        lut, peak_w = _profiled_peak_w(cache, m)
        runs[margin] = (m, lut, peak_w)
    (m0, lut0, peak0_w), (m1, lut1, peak1_w) = runs[0.0], runs[0.1]
    assert m0["cap-margin"] == 0.0 and m1["cap-margin"] == 0.1
    assert m0["p-max-w"] == m1["p-max-w"] == 4.0  # the guard still watches P_max itself
    # efficient profiling walks up to the reduced cap, and the choice stays below it
    assert lut0.p_max_w == 4.0 and lut1.p_max_w == pytest.approx(3.6)
    assert peak1_w < 3.6
    # without the margin the same node picks a point whose profiled peak is in [3.6, 4) W
    assert 3.6 <= peak0_w < 4.0
    assert (m1["batch-size"], m1["gpu-freq-mhz"]) != (m0["batch-size"], m0["gpu-freq-mhz"])


def test_a_nodes_own_cap_margin_wins_over_the_run_setting(tmp_path):
    run = {"cache-dir": str(tmp_path / "cache"), "output-dir": str(tmp_path / "r")}
    state = build_model("cnn").state_dict()
    _, m, _ = train_node({**run, "cap-margin": 0.2}, {**NODE, "cap-margin": "0.1"}, CFG, state)
    assert m["cap-margin"] == 0.1
    lut, peak_w = _profiled_peak_w(tmp_path / "cache", m)
    assert lut.p_max_w == pytest.approx(4.5) and peak_w < 4.5


def test_a_cap_met_only_without_the_margin_is_refused_naming_the_margin(tmp_path):
    run = {"cache-dir": str(tmp_path / "cache"), "output-dir": str(tmp_path / "r")}
    state = build_model("cnn").state_dict()
    with pytest.raises(ValueError, match=r"less cap-margin 50% \(1\.500 W\).*lower cap-margin"):
        train_node({**run, "cap-margin": 0.5}, {**NODE, "p-max-w": 3.0}, CFG, state)
    _, m, _ = train_node({**run, "cap-margin": 0.0}, {**NODE, "p-max-w": 3.0}, CFG, state)
    assert m["p-max-w"] == 3.0 and m["cap-margin"] == 0.0 and m["train-time-s"] > 0
