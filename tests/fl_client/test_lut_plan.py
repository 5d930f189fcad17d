"""fl_client.lut_plan: the active choice of cells to measure (synthetic tables:
``lut_tables``). No test is timed.
"""

from __future__ import annotations

import csv
import math
from collections import Counter

import numpy as np
import pytest

from fl_client import lut_plan
from fl_client.lut_fit import fit_error, fit_lut
from fl_client.lut_plan import PlanOptions, eq4_selector, next_cell, plan_cells, seed_cells
from fl_client.power import PowerLimit
from fl_client.selection import InfeasibleCapError, Tables
from tests.fl_client.lut_tables import (
    B6,
    CAPS,
    F12,
    R_SQRT,
    REPO,
    _limit_w,
    grid_measure,
    limits,
    only,
    synthetic,
)

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


def _measured_cells(plan: lut_plan.PlannedLUT) -> set[tuple[int, float]]:
    return {(plan.batch_sizes[i], plan.knob_values[j]) for i, j in np.argwhere(plan.measured)}


@pytest.mark.parametrize("pool", [True, False])
@pytest.mark.parametrize(("seeds", "per_cap"), [(8, 2), (6, 1), (8, 0)])
def test_plan_respects_budgets(pool: bool, seeds: int, per_cap: int) -> None:
    log: list[tuple[int, float]] = []
    truth = synthetic(noise=0.01)
    opts = PlanOptions(seed_cells=seeds, cells_per_cap=per_cap, pool_budget=pool)
    plan = plan_cells(B6, F12, limits(CAPS, 0.05), R_SQRT, grid_measure(truth, log), opts)
    assert len(log) == len(plan.cells) <= seeds + per_cap * len(CAPS)
    assert len(set(log)) == len(log)  # no cell measured twice
    assert plan.seed_count == seeds
    assert sum(c.cells for c in plan.choices) == len(log) - seeds
    if not pool:
        assert all(c.cells <= per_cap for c in plan.choices)


def test_plan_caps_are_served_once_sorted() -> None:
    plan = plan_cells(B6, F12, limits([6.0, 3.0, math.inf, 6.0]), R_SQRT, grid_measure(synthetic()))
    assert [c.cap_w for c in plan.choices] == [3.0, 6.0, math.inf]
    assert 5.0 not in {c.cap_w for c in plan.choices}


@pytest.mark.parametrize("seed", range(4))
def test_chosen_cell_is_measured_and_eq4_on_the_measured_cells(seed: int) -> None:
    truth = synthetic(noise=0.015, seed=seed)
    rng = np.random.default_rng(seed)
    r = sorted(rng.uniform(0.2, 1.0, 6))
    plan = plan_cells(B6, F12, limits(CAPS, 0.05), r, grid_measure(truth))
    m_t, m_p, m_a = plan.measured_tables()
    assert np.array_equal(np.isnan(m_t), ~plan.measured)
    select = eq4_selector(r)
    for choice in plan.choices:
        assert choice.batch_size is not None and choice.knob_value is not None
        assert (choice.batch_size, choice.knob_value) in _measured_cells(plan)
        i, j = B6.index(choice.batch_size), F12.index(choice.knob_value)
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
    plan = plan_cells(B6, F12, limits(CAPS, 0.05), R_SQRT, grid_measure(truth))
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
            plan = plan_cells(B6, F12, limits(CAPS, 0.05), r, grid_measure(truth))
            select = eq4_selector(r)
            for choice in plan.choices:
                full = select(*truth, _limit_w(choice.cap_w))
                assert full is not None
                cases += 1
                got = (B6.index(choice.batch_size), F12.index(choice.knob_value))
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
    plan_cells(B6, F12, limits([3.0], 0.05), r, grid_measure(truth, log), options=opts)
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

    plan = plan_cells(B6, F12, limits(CAPS, 0.05), R_SQRT, measure)
    assert len(log) <= 8 + 2 * len(CAPS)
    assert Counter(log).most_common(1)[0][1] == 1  # a failed cell is not measured again
    assert not _measured_cells(plan) & failing
    assert set(log) & failing  # some seeds did fail
    for choice in plan.choices:
        assert (choice.batch_size, choice.knob_value) in _measured_cells(plan)
    assert np.all(np.isfinite(plan.time_per_sample_s))


def test_plan_with_every_seed_failing_but_two() -> None:
    truth = synthetic()
    good = {(4, 921.6), (128, 76.8)}

    def measure(b: int, f: float) -> tuple[float, float, float]:
        i, j = B6.index(b), F12.index(f)
        if (b, f) not in good:
            return (math.nan, math.nan, math.nan)
        return float(truth[0][i, j]), float(truth[1][i, j]), float(truth[2][i, j])

    plan = plan_cells(B6, F12, limits([math.inf]), [1.0] * 6, measure)
    assert int(plan.measured.sum()) == 2
    assert len(plan.cells) <= 8 + 2
    with pytest.raises(ValueError, match="fewer than 2"):
        plan_cells(B6, F12, limits([math.inf]), [1.0] * 6, lambda b, f: (math.nan,) * 3)


def test_plan_when_no_cell_is_feasible_reports_none() -> None:
    plan = plan_cells(B6, F12, limits([1.0, math.inf]), R_SQRT, grid_measure(synthetic()))
    low, uncapped = plan.choices
    assert (low.cap_w, uncapped.cap_w) == (1.0, math.inf)
    assert low.batch_size is None
    assert uncapped.batch_size is not None


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
        plan = plan_cells(b_axis, f_axis, limits(caps, 0.05), r_vec, measure)
        assert len(plan.cells) <= 8 + 2 * len(caps)
        assert fit_error(plan.fit, t, p).time_mape_pct < 2.0
        select = eq4_selector(r_vec)
        for choice in plan.choices:
            got = (b_axis.index(choice.batch_size), f_axis.index(choice.knob_value))
            assert got == select(t, p, a, _limit_w(choice.cap_w))


def test_plan_input_errors() -> None:
    measure = grid_measure(synthetic())
    with pytest.raises(ValueError, match="r:"):
        plan_cells(B6, F12, limits(CAPS), [1.0] * 5, measure)
    with pytest.raises(ValueError, match="r:"):
        plan_cells(B6, F12, limits(CAPS), [0.0] + [1.0] * 5, measure)
    with pytest.raises(ValueError, match="limits"):
        plan_cells(B6, F12, [], R_SQRT, measure)
    with pytest.raises(TypeError, match="limits"):
        plan_cells(B6, F12, [3.0], R_SQRT, measure)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="cap-margin: the cap 3 W is given with two margins"):
        plan_cells(B6, F12, [PowerLimit(3.0, 0.05), PowerLimit(3.0)], R_SQRT, measure)
    with pytest.raises(ValueError, match="seed_cells"):
        PlanOptions(seed_cells=1)
    with pytest.raises(ValueError, match="cells_per_cap"):
        PlanOptions(cells_per_cap=-1)
    with pytest.raises(ValueError, match="min_chance"):
        PlanOptions(min_chance=1.5)


# --------------------------------------------------------------------------- Eq. 4


@pytest.mark.parametrize("seed", range(6))
def test_the_plans_choice_is_the_selectors(seed: int) -> None:
    """``eq4_selector`` (what planning picks by) is the node's ``selector.select``."""
    from fl_client import selector

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
                knob_values=list(F12),
                tables=Tables(time_s, peak),
                r=r,
                limit=PowerLimit(cap, 0.05),
            )
        except InfeasibleCapError:
            assert mine is None
            continue
        assert mine == (B6.index(sel.batch_size), F12.index(sel.knob_value))
