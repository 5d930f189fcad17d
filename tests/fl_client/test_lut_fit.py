"""fl_client.lut_fit: the fitted LUT model and the active choice of cells to measure.

Synthetic tables here are generic DVFS shapes (a per-step overhead, compute ∝ 1/f, a static
floor and dynamic power with a voltage knee), none of them the digital twin's formula. No
test is timed.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fl_client import lut_fit
from fl_client.lut_fit import (
    FitOptions,
    PlanOptions,
    eq4_selector,
    fit_error,
    fit_lut,
    mape,
    next_cell,
    plan_cells,
    seed_cells,
)
from fl_client.power import PowerLimit

B6 = (4, 8, 16, 32, 64, 128)
F12 = tuple(round(76.8 * k, 1) for k in range(1, 13))  # 76.8 … 921.6 MHz
REPO = Path(__file__).resolve().parents[2]


def _limit_w(cap_w: float) -> float:
    """A cap with the 5% margin the tests' plans are made with (``PowerLimit.limit_w``)."""
    return PowerLimit(cap_w, 0.05).limit_w


def synthetic(
    batch_sizes: tuple[int, ...] = B6,
    freqs: tuple[float, ...] = F12,
    *,
    knee: bool = True,
    noise: float = 0.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time per sample, peak and average power of a made-up board (not the twin's model)."""
    b = np.asarray(batch_sizes, dtype=float)[:, None]
    f = np.asarray(freqs, dtype=float)[None, :]
    phi = f / f.max()
    work = 4e-3 * (1.0 + (12.0 / b) ** 0.8)  # per-sample GPU work: small b leaves units idle
    time_s = 6e-3 / b + work * 100.0 / f
    # knee: flat, then rising to 1.0 (a kink the smooth fit cannot follow exactly)
    volt = np.where(phi < 0.5, 0.8, 0.8 + 0.4 * (phi - 0.5)) if knee else 0.8 + 0.2 * phi
    load = (b / b.max()) ** 0.35
    peak = 1.8 + 9.0 * load * phi * volt**2
    avg = 1.8 + 0.9 * (peak - 1.8)
    if noise:
        rng = np.random.default_rng(seed)
        time_s = time_s * (1 + noise * rng.standard_normal(time_s.shape))
        peak = peak * (1 + noise * rng.standard_normal(peak.shape))
        avg = np.minimum(avg * (1 + noise * rng.standard_normal(avg.shape)), peak)
    return time_s, peak, avg


def grid_measure(tables: tuple[np.ndarray, ...], log: list[tuple[int, float]] | None = None):
    time_s, peak, avg = tables

    def measure(b: int, f: float) -> tuple[float, float, float]:
        if log is not None:
            log.append((b, f))
        i, j = B6.index(b), F12.index(f)
        return float(time_s[i, j]), float(peak[i, j]), float(avg[i, j])

    return measure


Tables = tuple[np.ndarray, np.ndarray, np.ndarray]


def only(mask_cells: list[tuple[int, int]], tables: Tables) -> Tables:
    """``tables`` with NaN outside ``mask_cells`` (what was measured)."""
    mask = np.zeros(tables[0].shape, dtype=bool)
    for cell in mask_cells:
        mask[cell] = True
    t, p, a = (np.where(mask, x, np.nan) for x in tables)
    return t, p, a


R_SQRT = [(b / 128) ** 0.5 for b in B6]
CAPS = (3.0, 4.0, 6.0, math.inf)


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
    with pytest.raises(ValueError, match="freqs_mhz"):
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


# --------------------------------------------------------------------------- seeds


def test_seed_cells_cover_corners_and_every_row() -> None:
    cells = seed_cells(6, 12, 8)
    assert len(cells) == len(set(cells)) == 8
    assert {(0, 0), (0, 11), (5, 0), (5, 11)} <= set(cells)
    assert {i for i, _ in cells} == set(range(6))
    assert seed_cells(6, 12, 8) == cells  # deterministic
    assert len(seed_cells(2, 2, 8)) == 4  # never more than the grid
    rows = sorted({i for i, _ in seed_cells(15, 7, 8)})  # more rows than cells
    assert rows[0] == 0 and rows[-1] == 14 and len(rows) == 6
    assert max(np.diff(rows)) <= 3  # spread over B


# --------------------------------------------------------------------------- planning


def _measured_cells(plan: lut_fit.PlannedLUT) -> set[tuple[int, float]]:
    return {(plan.batch_sizes[i], plan.freqs_mhz[j]) for i, j in np.argwhere(plan.measured)}


@pytest.mark.parametrize("pool", [True, False])
@pytest.mark.parametrize(("seeds", "per_cap"), [(8, 2), (6, 1), (8, 0)])
def test_plan_respects_budgets(pool: bool, seeds: int, per_cap: int) -> None:
    log: list[tuple[int, float]] = []
    truth = synthetic(noise=0.01)
    opts = PlanOptions(seed_cells=seeds, cells_per_cap=per_cap, pool_budget=pool)
    plan = plan_cells(B6, F12, CAPS, R_SQRT, grid_measure(truth, log), 0.05, opts)
    assert len(log) == len(plan.cells) <= seeds + per_cap * len(CAPS)
    assert len(set(log)) == len(log)  # no cell measured twice
    assert plan.seed_count == seeds
    assert sum(c.cells for c in plan.choices) == len(log) - seeds
    if not pool:
        assert all(c.cells <= per_cap for c in plan.choices)


def test_plan_caps_are_served_once_sorted() -> None:
    plan = plan_cells(B6, F12, [6.0, 3.0, math.inf, 6.0], R_SQRT, grid_measure(synthetic()))
    assert [c.cap_w for c in plan.choices] == [3.0, 6.0, math.inf]
    assert plan.choice_for(math.inf).cap_w == math.inf
    with pytest.raises(KeyError):
        plan.choice_for(5.0)


@pytest.mark.parametrize("seed", range(4))
def test_chosen_cell_is_measured_and_eq4_on_the_measured_cells(seed: int) -> None:
    truth = synthetic(noise=0.015, seed=seed)
    rng = np.random.default_rng(seed)
    r = sorted(rng.uniform(0.2, 1.0, 6))
    plan = plan_cells(B6, F12, CAPS, r, grid_measure(truth), cap_margin=0.05)
    m_t, m_p, m_a = plan.measured_tables()
    assert np.array_equal(np.isnan(m_t), ~plan.measured)
    select = eq4_selector(r)
    for choice in plan.choices:
        assert choice.batch_size is not None and choice.freq_mhz is not None
        assert (choice.batch_size, choice.freq_mhz) in _measured_cells(plan)
        i, j = B6.index(choice.batch_size), F12.index(choice.freq_mhz)
        assert select(m_t, m_p, m_a, _limit_w(choice.cap_w)) == (i, j)
        # measured values are kept as measured in the LUT-shaped result
        assert plan.time_per_sample_s[i, j] == truth[0][i, j]
        if not math.isinf(choice.cap_w):
            assert truth[1][i, j] < choice.cap_w * 0.95


def _boundary_cells(peak: np.ndarray, limit: float) -> set[tuple[int, int]]:
    """Cells on a row's feasibility boundary: feasible with an infeasible right neighbour,
    or infeasible with a feasible left neighbour."""
    ok = peak < limit
    out = set()
    for i, j in np.argwhere(ok[:, :-1] != ok[:, 1:]):
        out |= {(int(i), int(j)), (int(i), int(j) + 1)}
    return out


@pytest.mark.parametrize("seed", range(3))
def test_a_boundary_cell_is_measured_for_each_cap(seed: int) -> None:
    truth = synthetic(noise=0.01, seed=seed)
    plan = plan_cells(B6, F12, CAPS, R_SQRT, grid_measure(truth), cap_margin=0.05)
    measured = {(int(i), int(j)) for i, j in np.argwhere(plan.measured)}
    for cap in CAPS[:-1]:
        boundary = _boundary_cells(truth[1], cap * 0.95)
        assert boundary, "the test caps must bind inside the grid"
        assert measured & boundary, f"no boundary cell measured for {cap} W"


def test_plan_matches_the_full_grid_choice() -> None:
    """Mostly the same cell; where not, a knife-edge cell (peak within noise of the cap) or
    a tie. The kinked power curve is the fit's hardest case here."""
    hits, cases, worst = 0, 0, 1.0
    for seed in range(4):
        truth = synthetic(noise=0.01, seed=seed)
        for gamma in (0.0, 0.5, 0.8):
            r = [(b / 128) ** gamma for b in B6]
            plan = plan_cells(B6, F12, CAPS, r, grid_measure(truth), cap_margin=0.05)
            select = eq4_selector(r)
            for choice in plan.choices:
                full = select(*truth, _limit_w(choice.cap_w))
                assert full is not None
                cases += 1
                got = (B6.index(choice.batch_size), F12.index(choice.freq_mhz))
                hits += got == full
                ratio = truth[0][got] * r[got[0]] / (truth[0][full] * r[full[0]])
                worst = max(worst, ratio)
    assert hits / cases >= 0.9
    assert worst < 1.2


def test_next_cell_names_the_cell_plan_cells_measures_next() -> None:
    """From tables measured elsewhere (a kind's shared cells), ``next_cell`` names the same
    cell the planner measures next for a cap; None once nothing is worth measuring."""
    truth = synthetic(noise=0.01, seed=3)
    r = R_SQRT
    log: list[tuple[int, float]] = []
    opts = PlanOptions(pool_budget=False, cells_per_cap=1)
    plan_cells(B6, F12, [3.0], r, grid_measure(truth, log), cap_margin=0.05, options=opts)
    seeds = [(B6.index(b), F12.index(f)) for b, f in log[:-1]]  # all but the planned cell
    tables = only(seeds, truth)
    tried = ~np.isnan(tables[0])
    fit = fit_lut(B6, F12, *tables)
    cell = next_cell(fit, tables, tried, PowerLimit(3.0, 0.05), r, opts)
    assert cell is not None and (B6[cell[0]], F12[cell[1]]) == log[-1]
    # nothing left untried: settled
    assert next_cell(fit, tables, np.ones_like(tried), PowerLimit(3.0, 0.05), r, opts) is None


def test_plan_survives_failed_cells() -> None:
    truth = synthetic(noise=0.01)
    failing = {(128, 921.6), (64, 921.6), (4, 76.8), (32, 460.8)}
    log: list[tuple[int, float]] = []
    inner = grid_measure(truth, log)

    def measure(b: int, f: float) -> tuple[float, float, float]:
        t, p, a = inner(b, f)
        return (math.nan, p, a) if (b, f) in failing else (t, p, a)

    plan = plan_cells(B6, F12, CAPS, R_SQRT, measure, cap_margin=0.05)
    assert len(log) <= 8 + 2 * len(CAPS)
    assert Counter(log).most_common(1)[0][1] == 1  # a failed cell is not measured again
    assert not _measured_cells(plan) & failing
    assert set(log) & failing  # some seeds did fail
    for choice in plan.choices:
        assert (choice.batch_size, choice.freq_mhz) in _measured_cells(plan)
    assert np.all(np.isfinite(plan.time_per_sample_s))


def test_plan_with_every_seed_failing_but_two() -> None:
    truth = synthetic()
    good = {(4, 921.6), (128, 76.8)}

    def measure(b: int, f: float) -> tuple[float, float, float]:
        i, j = B6.index(b), F12.index(f)
        if (b, f) not in good:
            return (math.nan, math.nan, math.nan)
        return float(truth[0][i, j]), float(truth[1][i, j]), float(truth[2][i, j])

    plan = plan_cells(B6, F12, [math.inf], [1.0] * 6, measure)
    assert int(plan.measured.sum()) == 2
    assert len(plan.cells) <= 8 + 2
    with pytest.raises(ValueError, match="fewer than 2"):
        plan_cells(B6, F12, [math.inf], [1.0] * 6, lambda b, f: (math.nan,) * 3)


def test_plan_when_no_cell_is_feasible_reports_none() -> None:
    plan = plan_cells(B6, F12, [1.0, math.inf], R_SQRT, grid_measure(synthetic()))
    assert plan.choice_for(1.0).batch_size is None
    assert plan.choice_for(math.inf).batch_size is not None


def test_plan_on_the_replay_table_matches_its_full_grid() -> None:
    """The repository's replay table (illustrative, not made by the twin)."""
    path = REPO / "configs" / "replay" / "example-illustrative-jetson-nano-resnet18.csv"
    rows = list(
        csv.DictReader(x for x in path.read_text().splitlines() if x and not x.startswith("#"))
    )
    b_axis = tuple(sorted({int(r["batch_size"]) for r in rows}))
    f_axis = tuple(sorted({float(r["freq_mhz"]) for r in rows}))
    t, p, a = (np.full((len(b_axis), len(f_axis)), np.nan) for _ in range(3))
    for r in rows:
        i, j = b_axis.index(int(r["batch_size"])), f_axis.index(float(r["freq_mhz"]))
        t[i, j] = float(r["time_per_step_s"]) / b_axis[i]
        p[i, j], a[i, j] = float(r["peak_power_w"]), float(r["avg_power_w"])

    def measure(b: int, f: float) -> tuple[float, float, float]:
        i, j = b_axis.index(b), f_axis.index(f)
        return float(t[i, j]), float(p[i, j]), float(a[i, j])

    for gamma in (0.0, 0.5):
        r_vec = [(b / b_axis[-1]) ** gamma for b in b_axis]
        caps = (4.5, 5.0, 7.0, math.inf)
        plan = plan_cells(b_axis, f_axis, caps, r_vec, measure, cap_margin=0.05)
        assert len(plan.cells) <= 8 + 2 * len(caps)
        assert fit_error(plan.fit, t, p).time_mape_pct < 2.0
        select = eq4_selector(r_vec)
        for choice in plan.choices:
            got = (b_axis.index(choice.batch_size), f_axis.index(choice.freq_mhz))
            assert got == select(t, p, a, _limit_w(choice.cap_w))


def test_plan_input_errors() -> None:
    measure = grid_measure(synthetic())
    with pytest.raises(ValueError, match="r:"):
        plan_cells(B6, F12, CAPS, [1.0] * 5, measure)
    with pytest.raises(ValueError, match="r:"):
        plan_cells(B6, F12, CAPS, [0.0] + [1.0] * 5, measure)
    with pytest.raises(ValueError, match="p-max-w"):
        plan_cells(B6, F12, [0.0], R_SQRT, measure)
    with pytest.raises(ValueError, match="p-max-w"):
        plan_cells(B6, F12, [math.nan], R_SQRT, measure)
    with pytest.raises(ValueError, match="caps_w"):
        plan_cells(B6, F12, [], R_SQRT, measure)
    with pytest.raises(ValueError, match="seed_cells"):
        PlanOptions(seed_cells=1)
    with pytest.raises(ValueError, match="cells_per_cap"):
        PlanOptions(cells_per_cap=-1)
    with pytest.raises(ValueError, match="min_chance"):
        PlanOptions(min_chance=1.5)
    with pytest.raises(ValueError, match="cap-margin"):
        plan_cells(B6, F12, CAPS, R_SQRT, measure, cap_margin=1.0)


# --------------------------------------------------------------------------- Eq. 4


@pytest.mark.parametrize("seed", range(6))
def test_the_plans_choice_is_the_selectors(seed: int) -> None:
    """``eq4_selector`` (what planning picks by) is the node's ``selector.select``."""
    from fl_client import selector
    from fl_client.selection import InfeasibleCapError, Tables

    rng = np.random.default_rng(seed)
    truth = synthetic(noise=0.03, seed=seed)
    time_s, peak = truth[0], truth[1]
    keep = rng.random(time_s.shape) < 0.6
    keep[0, 0] = True
    time_s, peak = np.where(keep, time_s, np.nan), np.where(keep, peak, np.nan)
    r = sorted(rng.uniform(0.2, 1.0, 6))
    for cap in (2.5, 3.5, 5.0, math.inf):
        mine = eq4_selector(r)(time_s, peak, peak, _limit_w(cap))
        try:
            sel = selector.select(
                "power-aware",
                batch_sizes=list(B6),
                freqs_mhz=list(F12),
                tables=Tables(time_s, peak),
                r=r,
                limit=PowerLimit(cap, 0.05),
            )
        except InfeasibleCapError:
            assert mine is None
            continue
        assert mine == (B6.index(sel.batch_size), F12.index(sel.freq_mhz))
