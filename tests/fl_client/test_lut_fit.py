"""fl_client.lut_fit: the fitted LUT model (synthetic tables: ``lut_tables``). No test is
timed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_client.lut_fit import FitOptions, fit_error, fit_lut, mape, refit_lut
from fl_client.lut_plan import seed_cells
from tests.fl_client.lut_tables import (
    B6,
    F12,
    only,
    synthetic,
)

# --------------------------------------------------------------------------- the fit


def test_fit_recovers_a_known_table_from_eight_cells() -> None:
    truth = synthetic(knee=False)
    t, p, a = only(seed_cells(6, 12, 8), truth)
    fit = fit_lut(B6, F12, t, p, a)
    err = fit_error(fit, *truth)
    assert fit.n_cells == 8
    assert err.time_mape_pct < 1.0 and err.time_max_pct < 3.0
    assert err.peak_mape_pct < 2.0 and err.peak_max_pct < 6.0
    assert err.avg_mape_pct < 2.0


def test_fit_of_a_kinked_power_curve_improves_with_cells() -> None:
    truth = synthetic(knee=True)
    seeds = fit_error(fit_lut(B6, F12, *only(seed_cells(6, 12, 8), truth)), *truth)
    assert seeds.time_mape_pct < 1.0
    assert seeds.peak_mape_pct < 6.0
    more = only([(i, j) for i in range(6) for j in (0, 5, 8, 11)], truth)
    err = fit_error(fit_lut(B6, F12, *more), *truth)
    assert err.peak_mape_pct < min(seeds.peak_mape_pct, 2.0)


@pytest.mark.parametrize("knee_at, top_v", [(0.5, 1.3), (0.6, 1.5), (0.4, 1.4)])
def test_fitted_power_never_falls_as_f_rises(knee_at: float, top_v: float) -> None:
    """A voltage knee measured mostly above it bends the fit convex in log-log; the bend may
    not turn the curve up again at low f (power below the knee was predicted higher than at
    the knee, so a cap's cheapest rows looked infeasible there)."""
    freqs: tuple[float, ...] = (114.75, 216.75, 318.75, 420.75, 522.75, 624.75, 726.75)
    freqs += (828.75, 930.75, 1032.75, 1134.75, 1236.75, 1300.5)
    b = np.asarray(B6, dtype=float)[:, None]
    phi = np.asarray(freqs)[None, :] / freqs[-1]
    time_s = 6e-3 / b + 4e-3 * (1 + (12 / b) ** 0.8) * 100 / (phi * freqs[-1])
    volt = np.where(phi < knee_at, 0.7, 0.7 + (top_v - 0.7) * (phi - knee_at) / (1 - knee_at))
    peak = 11.0 + 4.0 * (b / b.max()) ** 0.35 * phi * volt**2
    cells = [(5, 6), (5, 9), (5, 10), (5, 11), (5, 12), (4, 6), (4, 7), (4, 8), (4, 9)]
    cells += [(0, 0), (0, 12), (1, 5), (2, 11), (3, 6)]
    t, p, _ = only(cells, (time_s, peak, peak))
    fit = fit_lut(B6, freqs, t, p)
    assert np.all(np.diff(fit.peak_power_w, axis=1) >= 0.0)
    assert np.all(np.diff(fit.avg_power_w, axis=1) >= 0.0)


def test_fit_uncertainty_is_small_at_measured_cells_and_larger_away() -> None:
    truth = synthetic()
    cells = seed_cells(6, 12, 8)
    fit = fit_lut(B6, F12, *only(cells, truth))
    at = np.array([fit.peak_sigma[c] for c in cells])
    away = np.delete(fit.peak_sigma.ravel(), [i * 12 + j for i, j in cells])
    assert at.max() < away.mean()
    assert np.all(fit.time_sigma > 0) and np.all(np.isfinite(fit.time_sigma))


def test_fit_with_sensor_noise_stays_close_to_the_noiseless_table() -> None:
    truth = synthetic()
    noisy = synthetic(noise=0.02, seed=3)
    cells = [(i, j) for i in range(6) for j in (0, 4, 8, 11)]
    err = fit_error(fit_lut(B6, F12, *only(cells, noisy)), *truth)
    assert err.time_mape_pct < 3.0
    assert err.peak_mape_pct < 3.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, 0.0, -1.0])
def test_fit_ignores_failed_cells(bad: float) -> None:
    truth = synthetic()
    t, p, a = only(seed_cells(6, 12, 8), truth)
    clean = fit_lut(B6, F12, t, p, a)
    t2 = t.copy()
    t2[2, 3] = bad  # a cell that was "measured" but failed
    p2 = p.copy()
    p2[2, 3] = 5.0
    dirty = fit_lut(B6, F12, t2, p2, a)
    assert dirty.n_cells == clean.n_cells == 8
    assert np.allclose(dirty.time_per_sample_s, clean.time_per_sample_s)
    assert np.all(np.isfinite(dirty.peak_power_w))


def test_fit_input_errors() -> None:
    truth = synthetic()
    with pytest.raises(ValueError, match="at least 2"):
        fit_lut(B6, F12, *only([(0, 0)], truth))
    with pytest.raises(ValueError, match="shape"):
        fit_lut(B6, F12[:-1], *truth)
    with pytest.raises(ValueError, match="batch_sizes"):
        fit_lut((8, 4, 16, 32, 64, 128), F12, *truth)
    with pytest.raises(ValueError, match="knob_values"):
        fit_lut(B6, tuple(reversed(F12)), *truth)
    with pytest.raises(ValueError, match="sensor_sigma"):
        FitOptions(sensor_sigma=0.0)


def test_fit_without_average_power_uses_the_peak() -> None:
    truth = synthetic()
    t, p, _ = only(seed_cells(6, 12, 8), truth)
    fit = fit_lut(B6, F12, t, p)
    assert np.allclose(fit.avg_power_w, fit.peak_power_w)


def test_mape() -> None:
    assert mape([1.1, 2.0, np.nan], [1.0, 2.0, 3.0]) == pytest.approx(5.0)
    assert mape([1.1, 2.0], [1.0, 2.0], mask=[False, True]) == 0.0
    assert math.isnan(mape([np.nan], [1.0]))


def test_refit_starts_from_the_earlier_fit_on_its_axes() -> None:
    truth = synthetic()
    cells = seed_cells(6, 12, 8)
    warm = fit_lut(B6, F12, *only(cells, truth))
    more = only([*cells, (2, 5), (3, 9)], truth)
    again = refit_lut(warm, *more)
    fresh = fit_lut(B6, F12, *more)
    assert (again.batch_sizes, again.knob_values) == (warm.batch_sizes, warm.knob_values)
    assert again.n_cells == warm.n_cells + 2 == 10
    assert np.allclose(again.time_per_sample_s, fresh.time_per_sample_s, rtol=0.05)
    assert np.allclose(again.peak_power_w, fresh.peak_power_w, rtol=0.05)
    with pytest.raises(ValueError, match="tables: expected shape"):
        refit_lut(warm, more[0][:, :5], more[1][:, :5], more[2][:, :5])
