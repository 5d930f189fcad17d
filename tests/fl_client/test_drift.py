"""fl_client.drift: measure the operating point as the profiler did, compare it with the LUT,
re-profile b's row when the board drifted; and drift checks on a node end to end."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fl_client.cell_measure import MeasureContext
from fl_client.devices import Measurement
from fl_client.drift import check_drift, trained_time_deviation
from fl_client.lut import LUT, load_cached
from fl_client.lut_cells import cell_tables
from fl_client.node import train_node
from fl_client.power import PowerLimit
from fl_client.profiler import ProfileOptions, load_or_profile, profile
from tests.fl_client.test_node import (
    NODE,
    R_FOR_B64,
    initial_state,
    run_config,
    train_config,
)
from tests.fl_client.test_profiler import B6, WORKLOAD, CountingSteps, FakeDevice

CAP_W, MARGIN = 6.0, 0.05


def _cached_lut(cache: Path) -> LUT:
    """An efficient LUT for 6 W less 5%, profiled on a cool fake and cached in ``cache``."""
    lut, hit = load_or_profile(
        FakeDevice(),
        WORKLOAD,
        B6,
        CountingSteps(),
        cache,
        ProfileOptions(PowerLimit(CAP_W, MARGIN), progress=False),
    )
    assert not hit
    return lut


def _measured_freqs(lut: LUT, b: int) -> list[float]:
    row = lut.time_per_sample_s[lut.batch_sizes.index(b)]
    return [f for f, t in zip(lut.knob_values, row, strict=True) if not math.isnan(t)]


def test_no_drift_is_measured_as_such_and_changes_nothing(tmp_path: Path) -> None:
    lut = _cached_lut(tmp_path)
    device, steps = FakeDevice(), CountingSteps()
    f = _measured_freqs(lut, 32)[-1]
    check = check_drift(MeasureContext(device, WORKLOAD, steps, tmp_path), lut, (32, f), 0.15)
    assert check.deviation == pytest.approx(0.0, abs=1e-9) and not check.reprofiled
    assert check.lut is lut
    # the check itself is profiling cost: the warm-up and steps of one cell, as profiled
    assert check.time_s > 0 and check.energy_j > 0
    assert steps.calls == {32: lut.warmup_steps + lut.steps}
    assert device.freq == device.initial_freq


def test_a_drifted_board_re_profiles_the_row_and_scales_the_others(tmp_path: Path) -> None:
    lut = _cached_lut(tmp_path)
    path = lut.key.path(tmp_path)
    hot = FakeDevice(a_w=1.5)  # a busy neighbour: +0.5 W at every cell
    f = _measured_freqs(lut, 32)[-1]
    i = B6.index(32)
    ctx = MeasureContext(hot, WORKLOAD, CountingSteps(), tmp_path)
    check = check_drift(ctx, lut, (32, f), 0.15)
    j = lut.knob_values.index(f)
    expected = 0.5 / lut.peak_power_w[i, j]  # the peak is off by 0.5 W, time not at all
    assert check.deviation == pytest.approx(expected) and check.deviation > 0.15
    assert check.reprofiled
    new = check.lut
    # the key is kept: the same cap and margin, written over the cached file
    assert (new.limit.cap_w, new.limit.cap_margin, new.grid) == (CAP_W, MARGIN, "efficient")
    cached = load_cached(path, lut.key)
    assert cached is not None and cached.to_json() == new.to_json()
    # b=32's row is measured again, on the hot board, up to the cap less its margin
    row = profile(
        hot,
        WORKLOAD,
        [32],
        CountingSteps(),
        ProfileOptions(PowerLimit(CAP_W, MARGIN), progress=False),
    )
    measured = ~np.isnan(row.peak_power_w[0])
    np.testing.assert_allclose(new.peak_power_w[i, measured], row.peak_power_w[0, measured])
    # the other rows are scaled by the median change of that row's peak
    both = measured & ~np.isnan(lut.peak_power_w[i])
    factor = float(np.median(row.peak_power_w[0, both] / lut.peak_power_w[i, both]))
    np.testing.assert_allclose(new.peak_power_w[0], lut.peak_power_w[0] * factor)
    np.testing.assert_allclose(new.time_per_sample_s[0], lut.time_per_sample_s[0])  # no slowdown
    # re-profiling is part of the check's cost
    assert check.time_s > row.profile_time_s > 0


def test_a_row_that_shares_no_cell_with_the_lut_scales_the_others_by_the_check(
    tmp_path: Path,
) -> None:
    """A fleet-shared LUT holds a few cells per row. When the hot board's walk of the row
    stops below the checked cell, row and LUT share no cell: the other rows are scaled by
    the check's own measured/predicted, and the row's stale cell above the walk is gone."""
    full = _cached_lut(tmp_path)
    i = B6.index(32)
    f = _measured_freqs(full, 32)[-1]
    j = full.knob_values.index(f)
    keep = np.zeros(full.time_per_sample_s.shape, dtype=bool)
    keep[i, j] = True
    keep[B6.index(16), :] = True  # another row, to be scaled
    tables: dict[str, Any] = {
        name: np.where(keep, table, np.nan) for name, table in cell_tables(full).items()
    }
    sparse = dataclasses.replace(full, grid="shared", limit=PowerLimit(), **tables)
    hot = FakeDevice(a_w=5.0)  # +4 W: b = 32's walk under the cap stops below f
    reprofile = ProfileOptions(PowerLimit(CAP_W, MARGIN), progress=False)
    ctx = MeasureContext(hot, WORKLOAD, CountingSteps(), tmp_path)
    check = check_drift(ctx, sparse, (32, f), 0.15, reprofile)
    assert check.reprofiled
    new = check.lut
    assert np.isnan(new.time_per_sample_s[i, j])  # beyond the cap on this board now
    predicted = sparse.peak_power_w[i, j]
    measured_w = hot.power_w(32, f)  # the check measured this (a deterministic fake)
    row16 = B6.index(16)
    np.testing.assert_allclose(
        new.peak_power_w[row16], sparse.peak_power_w[row16] * measured_w / predicted, rtol=1e-6
    )


def test_the_threshold_is_strict(tmp_path: Path) -> None:
    lut = _cached_lut(tmp_path)
    f = _measured_freqs(lut, 32)[-1]
    hot = FakeDevice(a_w=1.5)
    j = lut.knob_values.index(f)
    deviation = 0.5 / lut.peak_power_w[B6.index(32), j]
    ctx = MeasureContext(hot, WORKLOAD, CountingSteps(), tmp_path)
    assert not check_drift(ctx, lut, (32, f), deviation + 1e-6).reprofiled


# --------------------------------------------------------------------------- on the node


def test_drift_check_reprofiles_only_when_the_twin_drifts(tmp_path: Path) -> None:
    run = run_config(tmp_path, **{"drift-check-every": 1, "drift-threshold": 0.15})
    node = {**NODE, "p-max-w": 7.0, "twin-drift-from-round": 3}
    node.update({"twin-slowdown": 1.5, "twin-extra-power-w": 2.0})  # throttled, busy
    state = initial_state()
    _, m1 = train_node(run, node, train_config(1, r=R_FOR_B64), state)
    assert m1.drift_reprofiled is None  # the LUT was just profiled
    _, m2 = train_node(run, node, train_config(2, r=R_FOR_B64), state)
    assert m2.drift_reprofiled == 0.0
    assert m2.drift_deviation is not None and m2.drift_deviation < 0.15
    assert m2.drift_batch_size is None  # nothing re-selected
    _, m3 = train_node(run, node, train_config(3, r=R_FOR_B64), state)
    assert m3.drift_reprofiled == 1.0
    assert m3.drift_deviation is not None and m3.drift_deviation > 0.3
    assert m3.profile_time_s > 0 and m3.drift_freq_mhz is not None
    assert m3.drift_batch_size is not None
    # the cache now holds the drifted row: the next check agrees with it
    _, m4 = train_node(run, node, train_config(4, r=R_FOR_B64), state)
    assert m4.drift_reprofiled == 0.0
    assert m4.drift_deviation is not None and m4.drift_deviation < 0.15
    # +2 W makes the old (b*, f*) = (64, 921.6 MHz) break the cap: the node re-selected and
    # runs there
    reselected = (m3.drift_batch_size, m3.drift_freq_mhz)
    assert reselected != (m2.batch_size, m2.gpu_freq_mhz)
    assert (m4.batch_size, m4.gpu_freq_mhz) == reselected and m4.peak_power_w < 7.0


@pytest.mark.parametrize(
    ("time_s", "deviation"),
    [
        (0.010 * 100, 0.0),  # every sample at the cell's rate: the bracket's low end
        (0.010 * 128, 0.0),  # the partial step costing a full one: the high end
        (0.010 * 128 * 1.6, 0.6),  # a slower board, beyond even the high end
        (0.010 * 100 * 0.5, 0.5),  # a faster board, below the low end
    ],
)
def test_a_trained_rounds_time_is_judged_against_a_bracket_for_its_partial_step(
    time_s: float, deviation: float
) -> None:
    """100 samples at b = 64: one full step and one of 36 samples, which costs between its
    share and a full step; only time outside that bracket is a deviation."""
    m = Measurement(time_s=time_s, steps=2, samples=100)
    assert trained_time_deviation(0.010, 64, m) == pytest.approx(deviation)


def test_no_trained_time_deviation_without_a_measurement_or_a_prediction() -> None:
    assert trained_time_deviation(0.01, 64, Measurement()) is None
    assert trained_time_deviation(math.nan, 64, Measurement(time_s=1, steps=1, samples=4)) is None
