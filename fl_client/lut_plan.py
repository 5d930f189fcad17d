"""Fewer profiled cells: an active choice of the cells to measure, guided by the fitted model
of the LUT (``fl_client.lut_fit``). NumPy only (no torch, no Flower); of the selector it uses
the choice itself (``choose_cell``, ``Objective``).

``plan_cells``: a few seed cells spread over the grid (corners and every b, ≤ 8),
a fit, then only cells with a real chance of changing a cap's choice: the fit's own choice
when not yet measured, then the cell with the best chance of being feasible and better
(faster to accuracy, or a tie with less energy) than the best measured one, then the cell
above the chosen one in its row (the cap's boundary) while it may be feasible; refitting
after each. The extra cells are one pool of 2 per distinct cap by default, each going to
the cap whose candidate ranks highest. The choice for each cap is made on the measured cells
alone, so the chosen cell is always a measured (verified) one, and a fitted cell never
decides feasibility.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fl_client.lut_fit import (
    BoolArray,
    FitOptions,
    FloatArray,
    GridTables,
    LUTFit,
    fit_lut,
    grid_axes,
    refit_lut,
    valid_cells,
)
from fl_client.power import PowerLimit
from fl_client.selection import Tables
from fl_client.selector import TIE_TOLERANCE, Objective, choose_cell

#: A cell as (row, column): (index into batch sizes, index into frequencies).
GridCell = tuple[int, int]
#: A cell as its values: (batch size, GPU frequency in MHz).
BF = tuple[int, float]
#: ``measure(b, f_mhz) -> (time per sample s, peak power W, average power W)``.
MeasureFn = Callable[[int, float], tuple[float, float, float]]
#: ``select(time, peak, avg, limit_w) -> (i, j) or None``: the cell Eq. 4 picks from tables
#: with NaN where not measured, under a cap with its margin (``PowerLimit.limit_w``;
#: ``math.inf``: no cap); None when no cell is feasible. ``eq4_selector`` makes the default.
SelectFn = Callable[[FloatArray, FloatArray, FloatArray, float], "GridCell | None"]

__all__ = [
    "BF",
    "CapChoice",
    "GridCell",
    "PlanOptions",
    "PlannedLUT",
    "eq4_selector",
    "next_cell",
    "plan_cells",
    "seed_cells",
]

_SQRT2 = math.sqrt(2.0)


# --------------------------------------------------------------------------- Eq. 4
#: Eq. 4 on tables whose peak is already the robust one (k = 0): what planning picks by.
PLANNING_EQ4 = Objective(peak_sigma_k=0.0)


def eq4_selector(r: Sequence[float], objective: Objective = PLANNING_EQ4) -> SelectFn:
    """A ``SelectFn`` for ``plan_cells``: the selector's own choice (``choose_cell``) by
    ``objective`` with this r, on tables whose peak is already the robust one (k = 0);
    energy is average power × time, as the selector's tie-break with an average table."""
    r_list = [float(x) for x in r]

    def select(
        time_s: FloatArray, peak_w: FloatArray, avg_w: FloatArray, limit_w: float
    ) -> GridCell | None:
        return choose_cell(Tables(time_s, peak_w, avg_w), r_list, limit_w, objective=objective)

    return select


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class PlanOptions:
    """Budgets and judgement of ``plan_cells``.

    Attributes
    ----------
    seed_cells : int
        Cells measured before the first fit, spread over the grid (``seed_cells``).
    cells_per_cap : int
        More cells per distinct cap, for its boundary and optimum.
    pool_budget : bool
        True: the ``cells_per_cap × caps`` extra cells are one pool, each next cell going to
        the cap whose candidate has the highest priority (a cap that needs none leaves its
        share to the others). False: at most ``cells_per_cap`` for each cap.
    min_chance : float
        Stop for a cap when no unmeasured cell has at least this chance of being a feasible
        cell better than the best measured one (by the fit and its uncertainty).
    boundary_chance : float
        Also measure the cell above the chosen one in its row (its boundary) while that
        cell has at least this chance of being feasible.
    tie_tolerance : float
        The selector's tie tolerance (``objective``).
    fit : FitOptions
    select : SelectFn, optional
        How a choice is made from tables; default ``eq4_selector(r, objective)``, the
        selector's own choice (``fl_client.selector.choose_cell``).
    """

    seed_cells: int = 8
    cells_per_cap: int = 2
    pool_budget: bool = True
    min_chance: float = 0.1
    boundary_chance: float = 0.02
    tie_tolerance: float = TIE_TOLERANCE
    fit: FitOptions = field(default_factory=FitOptions)
    select: SelectFn | None = None

    def __post_init__(self) -> None:
        for name in ("seed_cells", "cells_per_cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be an integer ≥ 0; got {value!r}")
        if self.seed_cells < 2:
            raise ValueError(
                f"seed_cells: must be ≥ 2 (the fit needs 2 cells); got {self.seed_cells}"
            )
        for name in ("min_chance", "boundary_chance", "tie_tolerance"):
            value = getattr(self, name)
            if not (0.0 <= value < 1.0):
                raise ValueError(f"{name}: must be in [0, 1); got {value!r}")

    @property
    def objective(self) -> Objective:
        """``PLANNING_EQ4`` with this tie tolerance: what planning picks and judges by."""
        return PLANNING_EQ4.but(tie_tolerance=self.tie_tolerance)


@dataclass(frozen=True)
class CapChoice:
    """What ``plan_cells`` decided for one cap.

    ``batch_size`` / ``knob_value`` are the measured cell Eq. 4 picks from the measured cells
    (None: no measured cell is feasible), ``cells`` how many cells this cap added and
    ``settled`` whether the fit left no cell with a real chance of being better (False:
    the budget ran out first).
    """

    cap_w: float
    batch_size: int | None
    knob_value: float | None
    cells: int
    settled: bool


@dataclass(frozen=True, eq=False)
class PlannedLUT(GridTables):
    """``plan_cells``' result: a LUT-shaped table, measured cells marked, the rest fitted
    (the axes: ``GridTables``).

    Attributes
    ----------
    time_per_sample_s, peak_power_w, avg_power_w : ndarray, shape (|B|, |F|)
        Measured values where ``measured``, the fit's predictions elsewhere.
    measured : ndarray of bool
        Cells measured (successfully).
    cells : tuple of (int, float)
        Every (b, f) measured, in order, failed measurements included.
    choices : tuple of CapChoice
        Per distinct cap, ascending (no cap last).
    fit : LUTFit
        The last fit (to all measured cells).
    seed_count : int
        How many of ``cells`` were seeds.
    """

    measured: BoolArray
    cells: tuple[BF, ...]
    choices: tuple[CapChoice, ...]
    fit: LUTFit
    seed_count: int

    def measured_tables(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Time, peak and average power with NaN where not measured (the profiler's LUT form:
        what a node should select from)."""
        keep = self.measured
        return (
            np.where(keep, self.time_per_sample_s, np.nan),
            np.where(keep, self.peak_power_w, np.nan),
            np.where(keep, self.avg_power_w, np.nan),
        )


def seed_cells(n_b: int, n_f: int, count: int = 8) -> list[GridCell]:
    """``count`` cells spread over a (n_b, n_f) grid: corners, every row, then max-min.

    First the four corners (lowest and highest b at the lowest and highest f), then one
    cell in each row still without one (rows spread evenly when there are more rows than
    cells), then any cell; each time the cell farthest from those chosen (distances in the
    unit square of (row, column) scaled to [0, 1]; ties: the higher f, then the larger b).
    Every b measured once anchors the fit's shape across b; the corners its shape in f.
    Deterministic.
    """
    if n_b < 1 or n_f < 1:
        raise ValueError(f"grid: needs at least one row and column, got {n_b}×{n_f}")
    count = min(max(count, 0), n_b * n_f)
    ys = np.arange(n_b) / max(n_b - 1, 1)
    xs = np.arange(n_f) / max(n_f - 1, 1)
    chosen: list[GridCell] = []

    def farthest(rows: Sequence[int]) -> GridCell:
        best, best_d = (rows[0], n_f - 1), -1.0
        for i in sorted(rows, reverse=True):
            for j in range(n_f - 1, -1, -1):
                if (i, j) in chosen:
                    continue
                d = min(
                    ((ys[i] - ys[a]) ** 2 + (xs[j] - xs[b]) ** 2 for a, b in chosen), default=1.0
                )
                if d > best_d + 1e-12:
                    best, best_d = (i, j), d
        return best

    for c in ((0, 0), (n_b - 1, n_f - 1), (n_b - 1, 0), (0, n_f - 1)):
        if c not in chosen and len(chosen) < count:
            chosen.append(c)
    empty_rows = [i for i in range(n_b) if all(a != i for a, _ in chosen)]
    slots = count - len(chosen)
    if 0 < slots < len(empty_rows):  # keep rows spread evenly over B
        picks = np.linspace(0, len(empty_rows) - 1, slots + 2)[1:-1]
        empty_rows = [empty_rows[round(float(x))] for x in picks]
    while empty_rows and len(chosen) < count:
        cell = farthest(empty_rows)
        chosen.append(cell)
        empty_rows.remove(cell[0])
    while len(chosen) < count:
        chosen.append(farthest(range(n_b)))
    return chosen


def _normal_cdf(z: FloatArray) -> FloatArray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return np.asarray(0.5 * (1.0 + erf(z / _SQRT2)), dtype=np.float64)


class _State:
    """Measured cells of one plan and the measuring itself."""

    def __init__(self, b: tuple[int, ...], f: tuple[float, ...], measure: MeasureFn) -> None:
        shape = (len(b), len(f))
        self.b, self.f, self._measure = b, f, measure
        self.time = np.full(shape, np.nan)
        self.peak = np.full(shape, np.nan)
        self.avg = np.full(shape, np.nan)
        self.tried = np.zeros(shape, dtype=bool)
        self.cells: list[BF] = []

    @property
    def measured(self) -> BoolArray:
        return valid_cells(self.time, self.peak, self.avg)

    def measure(self, cell: GridCell) -> None:
        i, j = cell
        self.tried[i, j] = True
        self.cells.append((self.b[i], self.f[j]))
        t, p, a = (float(x) for x in self._measure(self.b[i], self.f[j]))
        if all(math.isfinite(x) and x > 0 for x in (t, p, a)):
            self.time[i, j], self.peak[i, j], self.avg[i, j] = t, p, min(a, p)

    def fit(self, opts: FitOptions, warm: LUTFit | None) -> LUTFit | None:
        if int(self.measured.sum()) < 2:
            return None
        if warm is None:
            return fit_lut(self.b, self.f, self.time, self.peak, self.avg, opts)
        return refit_lut(warm, self.time, self.peak, self.avg, opts)

    def filled(self, fit: LUTFit) -> tuple[FloatArray, FloatArray, FloatArray]:
        keep = self.measured
        return (
            np.where(keep, self.time, fit.time_per_sample_s),
            np.where(keep, self.peak, fit.peak_power_w),
            np.where(keep, self.avg, fit.avg_power_w),
        )


def _candidate(
    state: _State, fit: LUTFit, limit_w: float, ctx: _Ctx
) -> tuple[GridCell, float] | None:
    """The unmeasured cell most worth measuring under ``limit_w`` (a cap with its margin,
    ``PowerLimit.limit_w``) and its priority, or None.

    Priority: the fit's own choice when not measured yet (2 + its chance of being
    feasible); else the chance, by the fit and its uncertainty, that a cell is feasible
    and better than the best measured one (at least ``min_chance``), or, for the cell just
    above that one in its row (its boundary), that it is feasible (at least
    ``boundary_chance``).
    """
    untried = ~state.tried
    t, p, a = state.filled(fit)
    sensor = ctx.opts.fit.sensor_sigma
    if math.isinf(limit_w):
        p_feas = np.ones_like(t)
    else:
        sd_p = np.sqrt(fit.peak_sigma**2 + sensor**2)
        p_feas = _normal_cdf((math.log(limit_w) - np.log(p)) / sd_p)
    model_pick = ctx.select(t, p, a, limit_w)
    if model_pick is not None and untried[model_pick]:
        return model_pick, 2.0 + float(p_feas[model_pick])
    picked = ctx.select(state.time, state.peak, state.avg, limit_w)
    if picked is None:  # nothing measured is feasible: the likeliest feasible cell
        chance = np.where(untried, p_feas, 0.0)
        k = np.unravel_index(int(np.argmax(chance)), chance.shape)
        return ((int(k[0]), int(k[1])), float(chance[k])) if chance[k] > 0.0 else None
    chance = np.where(untried, p_feas * _chance_better(fit, (t, a), picked, ctx), 0.0)
    k = np.unravel_index(int(np.argmax(chance)), chance.shape)
    if chance[k] >= ctx.opts.min_chance:
        return (int(k[0]), int(k[1])), float(chance[k])
    i, j = picked
    if j + 1 < len(state.f) and untried[i, j + 1] and p_feas[i, j + 1] >= ctx.opts.boundary_chance:
        return (i, j + 1), float(p_feas[i, j + 1]) * 0.01  # confirm the boundary, last
    return None


def next_cell(
    fit: LUTFit,
    tables: tuple[FloatArray, FloatArray, FloatArray],
    tried: BoolArray,
    limit: PowerLimit,
    r: Sequence[float],
    options: PlanOptions | None = None,
) -> GridCell | None:
    """The unmeasured cell most worth measuring next under ``limit``, as ``plan_cells`` picks
    it (``_candidate``), from tables measured elsewhere (NaN: not measured) and the cells
    already tried; None: the cap is settled.

    ``tables`` are time per sample, the peak the selection judges (the robust peak, where
    the caller's rule adds σ) and average power.
    """
    opts = options or PlanOptions()
    b, f = fit.batch_sizes, fit.knob_values
    state = _State(b, f, lambda *_: (math.nan, math.nan, math.nan))
    state.time, state.peak, state.avg = (np.array(t, dtype=np.float64) for t in tables)
    state.tried = np.asarray(tried, dtype=bool) | state.measured
    select = opts.select or eq4_selector(r, opts.objective)
    ctx = _Ctx(select, np.asarray(r, dtype=np.float64)[:, None], opts)
    cand = _candidate(state, fit, limit.limit_w, ctx)
    return None if cand is None else cand[0]


def _chance_better(
    fit: LUTFit, tables: tuple[FloatArray, FloatArray], picked: GridCell, ctx: _Ctx
) -> FloatArray:
    """Per cell, the chance (if feasible) that the selector would prefer it to ``picked``:
    a better score (``Objective.scores``), or a tie within the objective's tolerance with
    less energy to accuracy (average power × time × r_b), as the selector's tie-break."""
    t, a = tables
    sensor = ctx.opts.fit.sensor_sigma
    sd_t = np.sqrt(fit.time_sigma**2 + sensor**2)
    sd_e = np.sqrt(fit.time_sigma**2 + fit.peak_sigma**2 + 2 * sensor**2)
    log_score = np.log(ctx.opts.objective.scores(t, ctx.r_col, a))
    log_energy = np.log(t * ctx.r_col) + np.log(a)
    best, best_energy = log_score[picked], log_energy[picked]
    faster = _normal_cdf((best - log_score) / sd_t)
    tie = _normal_cdf((best + math.log1p(ctx.opts.objective.tie_tolerance) - log_score) / sd_t)
    return np.maximum(faster, tie * _normal_cdf((best_energy - log_energy) / sd_e))


@dataclass(frozen=True)
class _Ctx:
    select: SelectFn
    r_col: FloatArray
    opts: PlanOptions


def plan_cells(
    batch_sizes: Sequence[int],
    knob_values: Sequence[float],
    limits: Sequence[PowerLimit],
    r: Sequence[float],
    measure: MeasureFn,
    options: PlanOptions | None = None,
) -> PlannedLUT:
    """Measure a few cells, fit, then measure only where the fit is unsure; per cap a choice.

    1. ``options.seed_cells`` seed cells spread over the grid (``seed_cells``), then a fit.
    2. While extra cells are left (``cells_per_cap`` per distinct cap, pooled unless
       ``pool_budget`` is False), each cap names its candidate (``_candidate``): the fit's
       own choice when it is not measured yet (first); else the unmeasured cell with the
       best chance of being feasible and better than the best measured cell (at least
       ``min_chance``); else the cell above the best measured one in its row while it may
       be feasible (the cap's boundary, last). The highest-ranked candidate of all caps is
       measured and the model refitted; a cap with no candidate is settled. Stop when the
       cells run out or every cap is settled.
    3. Each cap's choice is Eq. 4 on the measured cells alone: always a measured cell.

    Failed measurements (a value NaN, infinite or ≤ 0) count against the budget, are never
    selected and are not measured again; exceptions from ``measure`` propagate.

    Parameters
    ----------
    batch_sizes, knob_values : sequence
        B and F, strictly ascending.
    limits : sequence of PowerLimit
        The caps to serve, each with its margin (``PowerLimit()``: no cap); a cap given
        twice is served once.
    r : sequence of float
        Eq. 3's r_b per batch size.
    measure : callable
        ``measure(b, f) -> (time per sample s, peak W, average W)`` of one cell, measured
        as the profiler measures a cell (e.g. ``cell_measure.measure_cell``).
    options : PlanOptions, optional

    Returns
    -------
    PlannedLUT
    """
    opts = options or PlanOptions()
    b = tuple(int(x) for x in batch_sizes)
    f = tuple(float(x) for x in knob_values)
    grid_axes(b, f)
    if len(r) != len(b) or not all(0 < float(x) <= 1 for x in r):
        raise ValueError(f"r: expected {len(b)} values in (0, 1], got {list(r)!r}")
    limits_w = _distinct_limits(limits)
    caps = list(limits_w)
    select = opts.select or eq4_selector(r, opts.objective)
    ctx = _Ctx(select, np.asarray(r, dtype=np.float64)[:, None], opts)
    state = _State(b, f, measure)
    seeds = seed_cells(len(b), len(f), opts.seed_cells)
    for cell in seeds:
        state.measure(cell)
    fit = _first_fit(state, opts.fit)
    spent = dict.fromkeys(caps, 0)
    extra = len(state.cells) - len(seeds)  # cells measured for failed seeds count too
    while extra < opts.cells_per_cap * len(caps):
        ranked = []
        for k, cap in enumerate(caps):
            if opts.pool_budget or spent[cap] < opts.cells_per_cap:
                cand = _candidate(state, fit, limits_w[cap], ctx)
                if cand is not None:
                    ranked.append((cand[1], -k, cap, cand[0]))
        if not ranked:
            break
        _, _, cap, cell = max(ranked)
        state.measure(cell)
        spent[cap] += 1
        extra += 1
        fit = state.fit(opts.fit, fit) or fit
    settled = [_candidate(state, fit, limits_w[cap], ctx) is None for cap in caps]
    return _result(
        state, fit, limits_w, list(zip(spent.values(), settled, strict=True)), select, len(seeds)
    )


def _first_fit(state: _State, opts: FitOptions) -> LUTFit:
    """The fit to the seeds; while fewer than 2 succeeded, one more untried cell each."""
    fit = state.fit(opts, None)
    while fit is None:
        free = np.argwhere(~state.tried)
        if free.size == 0:
            raise ValueError("plan_cells: fewer than 2 cells could be measured; cannot fit")
        state.measure((int(free[0][0]), int(free[0][1])))
        fit = state.fit(opts, None)
    return fit


def _distinct_limits(limits: Sequence[PowerLimit]) -> dict[float, float]:
    """Each distinct cap in W → what a robust peak must stay below under it
    (``PowerLimit.limit_w``), by ascending cap (no cap last)."""
    by_cap: dict[float, PowerLimit] = {}
    for limit in limits:
        if not isinstance(limit, PowerLimit):
            raise TypeError(f"limits: expected PowerLimit values, got {limit!r}")
        seen = by_cap.setdefault(limit.p_max_w, limit)
        if seen != limit:
            raise ValueError(
                f"cap-margin: the cap {limit.p_max_w:g} W is given with two margins, "
                f"{seen.cap_margin:g} and {limit.cap_margin:g}"
            )
    if not by_cap:
        raise ValueError("limits: give at least one cap (PowerLimit(): no cap)")
    return {cap: by_cap[cap].limit_w for cap in sorted(by_cap)}


def _result(
    state: _State,
    fit: LUTFit,
    limits: dict[float, float],
    spent_by_cap: list[tuple[int, bool]],
    select: SelectFn,
    n_seeds: int,
) -> PlannedLUT:
    choices = []
    for (cap, limit_w), (spent, settled) in zip(limits.items(), spent_by_cap, strict=True):
        pick = select(state.time, state.peak, state.avg, limit_w)
        b_pick = None if pick is None else state.b[pick[0]]
        f_pick = None if pick is None else state.f[pick[1]]
        choices.append(CapChoice(cap, b_pick, f_pick, spent, settled))
    t, p, a = state.filled(fit)
    return PlannedLUT(
        batch_sizes=state.b,
        knob_values=state.f,
        time_per_sample_s=t,
        peak_power_w=p,
        avg_power_w=a,
        measured=state.measured,
        cells=tuple(state.cells),
        choices=tuple(choices),
        fit=fit,
        seed_count=n_seeds,
    )
