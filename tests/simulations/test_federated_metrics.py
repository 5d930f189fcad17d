"""The figures of a federated study read from its records (``federated_metrics``): each
run's headline numbers as the recorder wrote them, and B1's time to target over ours split
into three factors."""

from __future__ import annotations

import pytest

from simulations.experiments.federated_metrics import cell_metrics, time_factors
from tests.simulations.test_federated_report import cell


def test_cell_metrics_read_the_recorders_totals():
    m = cell_metrics(cell("power-aware", 0, [["methods", "power-aware"]]))
    assert (m["round-to-target"], m["time-to-target-s"]) == (2, 18.0)
    # energy: training + profiling + idle waiting, from the recorded parts
    assert m["energy-to-target-j"] == 84.0 and m["energy-j"] == 126.0
    assert m["busy-energy-to-target-j"] == 80.0 and m["idle-energy-to-target-j"] == 4.0
    assert m["node-rounds-failed"] == 1 and m["over-cap-node-rounds"] == 3  # from the summary
    assert m["profile-energy-j"] == 20.0 and m["energy-saved-j"] == 4.0
    assert m["time-over-cap-s"] == pytest.approx(0.75)  # the nodes' totals
    assert m["saved-to-target-j"] == 1.5 and m["saved-per-round-after-1-j"] == 2.0
    assert m["round-time-after-1-s"] == 5.0 and m["time-to-target-after-1-s"] == 4.0
    assert m["busy-per-round-after-1-j"] == 40.0 and m["energy-per-round-after-1-j"] == 42.0
    assert m["critical-per-round-after-1-j"] == 25.0 and m["slack-per-round-after-1-j"] == 17.0


def test_cell_metrics_count_idle_waiting_whatever_the_runs_idle_accounting():
    """A run recorded with idle-accounting = off has a headline without idle waiting; the
    study sums the recorded parts, so its energy is comparable with an "on" run's."""
    off = cell(
        "b1",
        0,
        [["methods", "b1"]],
        **{"idle-accounting": "off", "fleet-energy-to-target-j": 80.0, "fleet-energy-j": 120.0},
    )
    m = cell_metrics(off)
    assert m["energy-to-target-j"] == 84.0 and m["energy-j"] == 126.0


def test_b1_over_ours_splits_exactly_into_rounds_per_round_and_profiling():
    ours = cell_metrics(cell("power-aware", 0, [["methods", "power-aware"]]))
    b1 = cell_metrics(
        cell(
            "b1",
            0,
            [["methods", "b1"]],
            **{"round-to-target": 3, "sim-time-to-target-s": 27.0},
        )
    )
    f = time_factors(ours, b1)
    assert f is not None
    assert f["ratio"] == pytest.approx(27.0 / 18.0)
    assert f["rounds"] == pytest.approx(1.5)
    assert f["per-round"] == pytest.approx((27.0 / 3) / (16.0 / 2))
    assert f["profiling"] == pytest.approx(16.0 / 18.0)
    assert f["rounds"] * f["per-round"] * f["profiling"] == pytest.approx(f["ratio"])
    missed = cell_metrics(cell("b1", 0, [["methods", "b1"]], **{"round-to-target": None}))
    assert time_factors(ours, missed) is None
