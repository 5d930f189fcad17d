"""fl_client.lut_cells: merging LUTs cell by cell (fill, overwrite, whole rows), the median
of a cell measured several times, and scaling every cell."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_client.lut import LUT
from fl_client.lut_cells import median_cell, merge_cells, replace_rows, scale_cells
from fl_client.lut_format import CELL_TABLES, LUTFormatError
from fl_client.power import PowerLimit
from fl_client.profiler import ProfileOptions, profile
from tests.fl_client.test_lut import _lut_fields, _profiled, _row_lut
from tests.fl_client.test_profiler import B6, WORKLOAD, CountingSteps, FakeDevice


def test_merge_cells_fills_or_overwrites() -> None:
    nan = math.nan
    base = _row_lut([4.0, 2.0, nan, nan], [2.5, 3.5, nan, nan], [2, 3, nan, nan], cap=4.0)
    extra = _row_lut([5.0, 2.5, 1.5, nan], [2.6, 3.6, 5.5, nan], [2, 3, 5, nan], cap=6.0)
    filled = merge_cells(base, extra, overwrite=False)
    assert filled.time_per_sample_s[0].tolist()[:3] == [4.0, 2.0, 1.5]
    assert filled.peak_power_w[0].tolist()[:3] == [2.5, 3.5, 5.5]
    assert math.isnan(filled.time_per_sample_s[0, 3]) and filled.limit.cap_w == 4.0
    fresh = merge_cells(base, extra, overwrite=True)
    assert fresh.time_per_sample_s[0].tolist()[:3] == [5.0, 2.5, 1.5]
    assert fresh.avg_power_w[0].tolist()[:3] == [2.0, 3.0, 5.0]
    # the base keeps its cap, grid and cost; inputs are not changed
    assert (fresh.limit.cap_w, fresh.grid) == (4.0, "efficient")
    assert math.isnan(base.time_per_sample_s[0, 2])
    other = LUT(**{**_lut_fields(base), "knob_values": (1.0, 2.0, 3.0, 4.0)})
    with pytest.raises(LUTFormatError, match="freqs-mhz"):
        merge_cells(base, other, overwrite=True)


def test_merge_cells_takes_one_row_into_its_place() -> None:
    lut = _profiled()
    row = profile(
        FakeDevice(a_w=2.0), WORKLOAD, [32], CountingSteps(), ProfileOptions(progress=False)
    )
    merged = merge_cells(lut, row, overwrite=True)
    i = B6.index(32)
    np.testing.assert_array_equal(merged.peak_power_w[i], row.peak_power_w[0])
    np.testing.assert_array_equal(
        np.delete(merged.peak_power_w, i, 0), np.delete(lut.peak_power_w, i, 0)
    )
    alien = profile(FakeDevice(), WORKLOAD, [24], CountingSteps(), ProfileOptions(progress=False))
    with pytest.raises(LUTFormatError, match=r"batch-sizes: \[24\] are not rows"):
        merge_cells(lut, alien, overwrite=True)


def test_replace_rows_drops_what_the_new_row_did_not_measure() -> None:
    """A re-profiled row that stopped below the old row's cells replaces the row whole: the
    stale cells above its walk are gone, every other row is kept."""
    lut = _profiled(p_max_w=4.0)  # every cell of b = 32 feasible on the cool fake
    i = B6.index(32)
    walk = profile(
        FakeDevice(a_w=2.0),
        WORKLOAD,
        [32],
        CountingSteps(),
        ProfileOptions(PowerLimit(2.8), progress=False),
    )
    reached = ~np.isnan(walk.time_per_sample_s[0])
    assert reached.any() and not reached.all()  # the walk stopped below the top
    new = replace_rows(lut, walk)
    np.testing.assert_array_equal(new.peak_power_w[i], walk.peak_power_w[0])
    assert np.isnan(new.time_per_sample_s[i, ~reached]).all()
    assert np.isnan(new.peak_sigma_w[i, ~reached]).all()
    np.testing.assert_array_equal(
        np.delete(new.time_per_sample_s, i, 0), np.delete(lut.time_per_sample_s, i, 0)
    )
    # merge_cells would keep the stale cells above the walk: the difference
    stale = ~reached & ~np.isnan(lut.time_per_sample_s[i])
    assert stale.any()
    assert not np.isnan(merge_cells(lut, walk, overwrite=True).time_per_sample_s[i, stale]).any()


def test_merge_cells_carries_each_cells_sigma() -> None:
    nan = math.nan
    base = LUT(**{**_lut_fields(_row_lut([4.0, 2.0, nan, nan], [2.5, 3.5, nan, nan],
                                         [2, 3, nan, nan], cap=4.0)),
                  "peak_sigma_w": np.array([[0.1, 0.2, nan, nan]])})  # fmt: skip
    extra = LUT(**{**_lut_fields(_row_lut([5.0, 2.5, 1.5, nan], [2.6, 3.6, 5.5, nan],
                                          [2, 3, 5, nan], cap=6.0)),
                   "peak_sigma_w": np.array([[0.3, nan, 0.5, nan]])})  # fmt: skip
    filled = merge_cells(base, extra, overwrite=False)
    np.testing.assert_array_equal(filled.peak_sigma_w, [[0.1, 0.2, 0.5, nan]])
    fresh = merge_cells(base, extra, overwrite=True)  # a cell is taken whole, σ too
    np.testing.assert_array_equal(fresh.peak_sigma_w, [[0.3, nan, 0.5, nan]])
    # a LUT without σ (an older file) merged with one that has it
    plain = _row_lut([4.0, 2.0, nan, nan], [2.5, 3.5, nan, nan], [2, 3, nan, nan], cap=4.0)
    np.testing.assert_array_equal(
        merge_cells(plain, extra, overwrite=False).peak_sigma_w, [[nan, nan, 0.5, nan]]
    )


def test_median_cell_carries_the_sigma_of_the_median_peak() -> None:
    # three nodes measured one cell: the medians, and σ of the one whose peak is the median
    t, p, a, sigma = median_cell([(1.0, 3.0, 2.0, 0.1), (1.2, 3.4, 2.2, 0.4), (1.1, 3.2, 2.1, 0.2)])
    assert (t, p, a, sigma) == pytest.approx((1.1, 3.2, 2.1, 0.2))
    # two: the median peak lies between them, both as near: the larger σ
    assert median_cell([(1.0, 3.0, 2.0, 0.1), (1.2, 3.4, 2.2, 0.4)])[3] == pytest.approx(0.4)
    # σ not recorded (a 3-tuple, or NaN) stays not recorded unless another as near has it
    assert math.isnan(median_cell([(1.0, 3.0, 2.0)])[3])
    assert median_cell([(1.0, 3.0, 2.0, math.nan), (1.0, 3.0, 2.0, 0.2)])[3] == 0.2
    with pytest.raises(ValueError, match="measurements"):
        median_cell([])


def test_scale_cells_scales_every_measured_cell() -> None:
    lut = _profiled(3.5)
    lut = LUT(**{**_lut_fields(lut), "peak_sigma_w": np.where(np.isnan(lut.time_per_sample_s),
                                                              np.nan, 0.2)})  # fmt: skip
    scaled = scale_cells(lut, time_factor=1.5, peak_factor=1.1, avg_factor=1.2)
    np.testing.assert_allclose(scaled.time_per_sample_s, lut.time_per_sample_s * 1.5)
    np.testing.assert_allclose(scaled.peak_power_w, lut.peak_power_w * 1.1)
    np.testing.assert_allclose(scaled.avg_power_w, lut.avg_power_w * 1.2)
    np.testing.assert_allclose(scaled.peak_sigma_w, lut.peak_sigma_w * 1.1)  # with the peak
    np.testing.assert_array_equal(
        np.isnan(scaled.time_per_sample_s), np.isnan(lut.time_per_sample_s)
    )
    assert scaled.key == lut.key
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="time-factor"):
            scale_cells(lut, time_factor=bad, peak_factor=1.0, avg_factor=1.0)


def test_merge_cells_carries_how_each_cell_was_measured() -> None:
    lut = _profiled()
    row = profile(
        FakeDevice(a_w=2.0),
        WORKLOAD,
        [32],
        CountingSteps(),
        ProfileOptions(progress=False, min_power_samples=7),
    )
    merged = merge_cells(lut, row, overwrite=True)
    i = B6.index(32)
    assert (merged.power_samples[i] == 7).all() and (row.power_samples == 7).all()
    np.testing.assert_array_equal(merged.window_s[i], row.window_s[0])
    np.testing.assert_array_equal(np.delete(merged.power_samples, i, 0),
                                  np.delete(lut.power_samples, i, 0))  # fmt: skip
    # an older LUT without the tables, merged with one that has them
    plain = LUT(**{k: v for k, v in _lut_fields(lut).items() if k not in CELL_TABLES})
    half = merge_cells(plain, row, overwrite=True)
    assert (half.power_samples[i] == 7).all() and np.isnan(
        np.delete(half.power_samples, i, 0)
    ).all()
