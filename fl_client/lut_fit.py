"""Fewer profiled cells: a small fitted model of the LUT and an active choice of cells.

Issue 15, part 2. A full LUT measures every (batch size b, GPU frequency f) cell; Eq. 4 only
needs the cells around each cap's feasibility boundary and the optimum. This module fits a
small model of time per sample and peak (and average) power over (b, f) to a few measured
cells, and chooses which cells to measure next where the fit is unsure. NumPy only (no
torch, no Flower); of the selector it uses the choice itself (``choose_cell``, ``Objective``).

The model (u = log2 b scaled to [0, 1] over B, φ = f / f_max, one level per b row)::

    time per sample   t(b, f) = exp(a0 + a1·u) + exp(c_b) / φ
    peak power        P(b, f) = exp(s) + exp(k_b) · φ^e(u) · exp(c·(log φ)²),  e(u) = exp(e0 + e1·u)
    average power     the same form as the peak, fitted on its own

The time form is the generic DVFS split: a part that does not scale with the GPU clock
(host work, launches, memory stalls; per sample it falls as a power of b, since per-step
overhead is shared by the batch) and GPU cycles ∝ 1/f. Power is a static floor plus a
dynamic part growing as a power law in f (CMOS f·V², V rising with f), bent in log-log by
one shared curvature (V flat at low f, rising later), never so far that power falls as f
rises (the curvature is held where the log-log slope would turn negative above the grid's
lowest frequency). The per-b levels c_b and k_b are free, tied only by a smoothness
penalty across log b (a penalised spline: rows without a measured cell are interpolated),
so any shape of throughput and power over b fits; the f-shape is shared. Nothing in it is
the digital twin's formula (no efficiency or activity saturation, no voltage knee, no busy
fraction). It is fitted in log space (relative errors) by Levenberg–Marquardt with weak
priors (a1 near −log(b_max/b_min), the f exponent near 1.5, the static floor near 80% of
the least power measured). A Gaussian-process correction of the log residuals over (u, φ)
then makes it agree with the measured cells and their neighbours and gives every cell a
relative uncertainty, small next to measured cells and at least ``model_sigma_floor`` far
from them.

``plan_cells`` uses it: a few seed cells spread over the grid (corners and every b, ≤ 8),
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
import numpy.typing as npt

from fl_client.selector import TIE_TOLERANCE, Objective, PowerLimit, Tables, choose_cell

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
#: A cell as (row, column): (index into batch sizes, index into frequencies).
Cell = tuple[int, int]
#: ``measure(b, f_mhz) -> (time per sample s, peak power W, average power W)``.
MeasureFn = Callable[[int, float], tuple[float, float, float]]
#: ``select(time, peak, avg, limit_w) -> (i, j) or None``: the cell Eq. 4 picks from tables
#: with NaN where not measured, under a cap with its margin (``PowerLimit.limit_w``;
#: ``math.inf``: no cap); None when no cell is feasible. ``eq4_selector`` makes the default.
SelectFn = Callable[[FloatArray, FloatArray, FloatArray, float], "Cell | None"]

__all__ = [
    "CapChoice",
    "FitError",
    "FitOptions",
    "GridTables",
    "LUTFit",
    "PlanOptions",
    "PlannedLUT",
    "eq4_selector",
    "fit_error",
    "fit_lut",
    "mape",
    "plan_cells",
    "seed_cells",
]

_SQRT2 = math.sqrt(2.0)


# --------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class FitOptions:
    """How ``fit_lut`` fits.

    Attributes
    ----------
    sensor_sigma : float
        Relative standard deviation of one measured value (time or power), e.g. 0.02.
    model_sigma_floor : float
        Least relative uncertainty of a prediction away from measured cells: the model is
        never trusted more than this where nothing was measured.
    length_b, length_f : float
        Correlation lengths of the residual correction along u = log2 b scaled to [0, 1]
        over B, and along φ = f / f_max: how far a measured cell's residual reaches. Short
        across b (a row's level is its own), long along f (a row's shape in f is smooth).
    shared_f_share, length_shared_f : float
        Share in [0, 1) of the residual correction that is one shape in f common to all b
        (e.g. a voltage step every row sees), and its correlation length along φ.
    prior_weight : float
        Scales the weak priors (≥ 0; 0 leaves the parameters free).
    curvature_sd : float
        How much the per-b levels may bend over u: the standard deviation of their change of
        slope per unit u (larger: rows more independent; smaller: smoother across b).
    max_iter : int
        Levenberg–Marquardt iterations per start.
    """

    sensor_sigma: float = 0.02
    model_sigma_floor: float = 0.03
    length_b: float = 0.12
    length_f: float = 0.6
    shared_f_share: float = 0.5
    length_shared_f: float = 0.25
    prior_weight: float = 1.0
    curvature_sd: float = 10.0
    max_iter: int = 80

    def __post_init__(self) -> None:
        for name in ("sensor_sigma", "model_sigma_floor", "length_b", "length_f", "curvature_sd"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a finite number > 0; got {value!r}")
        if not 0.0 <= self.shared_f_share < 1.0 or not self.length_shared_f > 0:
            raise ValueError(
                f"shared_f_share, length_shared_f: need [0, 1) and > 0; got "
                f"{self.shared_f_share!r}, {self.length_shared_f!r}"
            )
        if not (math.isfinite(self.prior_weight) and self.prior_weight >= 0):
            raise ValueError(f"prior_weight: must be ≥ 0; got {self.prior_weight!r}")
        if isinstance(self.max_iter, bool) or self.max_iter < 1:
            raise ValueError(f"max_iter: must be an integer ≥ 1; got {self.max_iter!r}")


@dataclass(frozen=True, eq=False)
class GridTables:
    """A LUT-shaped grid: the axes, and time per sample, peak and average power per cell.

    Attributes
    ----------
    batch_sizes, freqs_mhz : tuple
        The axes (rows, columns).
    time_per_sample_s, peak_power_w, avg_power_w : ndarray, shape (|B|, |F|)
        The cells: what ``LUTFit`` predicts, what ``PlannedLUT`` measured or fitted.
    """

    batch_sizes: tuple[int, ...]
    freqs_mhz: tuple[float, ...]
    time_per_sample_s: FloatArray
    peak_power_w: FloatArray
    avg_power_w: FloatArray


@dataclass(frozen=True, eq=False)
class LUTFit(GridTables):
    """A fitted LUT: predictions for every cell and their relative uncertainty (the axes:
    ``GridTables``).

    Attributes
    ----------
    time_per_sample_s, peak_power_w, avg_power_w : ndarray, shape (|B|, |F|)
        The fit's prediction of each cell, measured cells included (not overwritten).
    time_sigma, peak_sigma : ndarray, shape (|B|, |F|)
        Relative (log-space) standard deviation of each prediction.
    time_params, peak_params, avg_params : tuple of float
        The parametric model's parameters (see the module docstring): time
        ``[a0, a1, c_b …]``, power ``[s, e0, e1, c, k_b …]``.
    n_cells : int
        How many measured cells the fit used.
    """

    time_sigma: FloatArray
    peak_sigma: FloatArray
    time_params: tuple[float, ...]
    peak_params: tuple[float, ...]
    avg_params: tuple[float, ...]
    n_cells: int


def _axes(batch_sizes: Sequence[int], freqs_mhz: Sequence[float]) -> tuple[FloatArray, FloatArray]:
    """u (scaled log2 b) and log φ (log f / f_max) on the grid, each (|B|, |F|)."""
    b = np.asarray(batch_sizes, dtype=np.float64)
    f = np.asarray(freqs_mhz, dtype=np.float64)
    if b.ndim != 1 or f.ndim != 1 or b.size == 0 or f.size == 0:
        raise ValueError("batch_sizes and freqs_mhz: need non-empty 1-D axes")
    if not (np.all(np.isfinite(b)) and np.all(b > 0) and np.all(np.diff(b) > 0)):
        raise ValueError(f"batch_sizes: must be > 0 and strictly ascending; got {list(b)}")
    if not (np.all(np.isfinite(f)) and np.all(f > 0) and np.all(np.diff(f) > 0)):
        raise ValueError(f"freqs_mhz: must be > 0 and strictly ascending; got {list(f)}")
    lb = np.log2(b)
    span = lb[-1] - lb[0]
    u = (lb - lb[0]) / span if span > 0 else np.zeros_like(lb)
    lphi = np.log(f / f[-1])
    return np.broadcast_to(u[:, None], (b.size, f.size)), np.broadcast_to(
        lphi[None, :], (b.size, f.size)
    )


IntArray = npt.NDArray[np.intp]


@dataclass(frozen=True)
class _Data:
    """Measured cells of one quantity: row index, u and log φ per cell, and log values."""

    rows: IntArray
    u: FloatArray
    lphi: FloatArray
    log_y: FloatArray
    u_axis: FloatArray  # u of every row of the grid
    lphi_low: float = 0.0  # log φ of the grid's lowest frequency (≤ 0)


def _log_time(p: FloatArray, d: _Data) -> tuple[FloatArray, FloatArray]:
    """log t = log(exp(a0 + a1·u) + exp(c_row) / φ), p = [a0, a1, c_0 … c_{|B|-1}];
    with its Jacobian."""
    fixed = p[0] + p[1] * d.u
    scaled = p[2 + d.rows] - d.lphi
    out = np.logaddexp(fixed, scaled)
    w_fixed = np.exp(fixed - out)
    jac = np.zeros((d.u.size, p.size))
    jac[:, 0] = w_fixed
    jac[:, 1] = w_fixed * d.u
    jac[np.arange(d.u.size), 2 + d.rows] = 1.0 - w_fixed
    return out, jac


def _log_power(p: FloatArray, d: _Data) -> tuple[FloatArray, FloatArray]:
    """log P = log(exp(s) + exp(k_row + e(u)·log φ + c·(log φ)²)), p = [s, e0, e1, c, k_0 …]
    with e(u) = exp(e0 + e1·u); with its Jacobian."""
    exponent = np.exp(np.clip(p[1] + p[2] * d.u, -5.0, 3.0))
    # power never falls as f rises: the log-log slope e(u) + 2c·log φ stays ≥ 0 down to the
    # grid's lowest frequency (a convex bend may not turn the curve up at low f)
    span = -d.lphi_low
    c_cap = exponent / (2.0 * span) if span > 0 else math.inf
    clipped = p[3] > c_cap
    curv = np.where(clipped, c_cap, p[3])
    dynamic = p[4 + d.rows] + exponent * d.lphi + curv * d.lphi * d.lphi
    out = np.logaddexp(p[0], dynamic)
    w_dyn = np.exp(dynamic - out)
    jac = np.zeros((d.u.size, p.size))
    jac[:, 0] = 1.0 - w_dyn
    # where held, the curvature is c_cap ∝ e(u): it moves with e0 and e1 as e(u) does
    jac[:, 1] = w_dyn * (exponent * d.lphi + np.where(clipped, curv, 0.0) * d.lphi * d.lphi)
    jac[:, 2] = jac[:, 1] * d.u
    jac[:, 3] = np.where(clipped, 0.0, w_dyn * d.lphi * d.lphi)
    jac[np.arange(d.u.size), 4 + d.rows] = w_dyn
    return out, jac


ModelFn = Callable[[FloatArray, _Data], tuple[FloatArray, FloatArray]]


@dataclass(frozen=True)
class _Problem:
    """One least-squares problem: a log model, data, and linear priors ``(L·p − m) / sd``."""

    model: ModelFn
    data: _Data
    sigma: float
    prior_matrix: FloatArray
    prior_mean: FloatArray
    prior_sd: FloatArray

    def residual(self, p: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Residuals and their Jacobian."""
        log_y, jac = self.model(p, self.data)
        fit = (log_y - self.data.log_y) / self.sigma
        prior = (self.prior_matrix @ p - self.prior_mean) / self.prior_sd
        full_jac = np.vstack([jac / self.sigma, self.prior_matrix / self.prior_sd[:, None]])
        return np.concatenate([fit, prior]), full_jac


def _levenberg_marquardt(
    problem: _Problem, p0: FloatArray, max_iter: int
) -> tuple[FloatArray, float]:
    """Minimise ``|residual(p)|²`` from ``p0`` (Levenberg–Marquardt). (p, cost)."""
    p = p0.astype(np.float64).copy()
    res, jac = problem.residual(p)
    cost = float(res @ res)
    lam = 1e-2
    for _ in range(max_iter):
        grad = jac.T @ res
        hess = jac.T @ jac
        improved = False
        while lam < 1e10:
            damp = hess + lam * np.diag(np.diag(hess) + 1e-9)
            try:
                delta = np.linalg.solve(damp, -grad)
            except np.linalg.LinAlgError:
                lam *= 10.0
                continue
            trial = p + delta
            res_t, jac_t = problem.residual(trial)
            cost_t = float(res_t @ res_t)
            if np.isfinite(cost_t) and cost_t < cost:
                gain = cost - cost_t
                p, res, jac, cost = trial, res_t, jac_t, cost_t
                lam = max(lam / 3.0, 1e-9)
                improved = gain > 1e-9 * (1.0 + cost)
                break
            lam *= 4.0
        if not improved:
            break
    return p, cost


def _best_fit(problem: _Problem, starts: Sequence[FloatArray], max_iter: int) -> FloatArray:
    best_p, best_cost = starts[0], math.inf
    for p0 in starts:
        p, cost = _levenberg_marquardt(problem, p0, max_iter)
        if cost < best_cost:
            best_p, best_cost = p, cost
    return best_p


def _priors(
    n_params: int,
    fixed: Sequence[tuple[int, float, float]],
    first_row: int,
    d: _Data,
    curv_sd: float,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Prior rows: ``(index, mean, sd)`` on single parameters, and smoothness of the per-row
    levels ``p[first_row:]`` over u (their change of slope per unit u has sd ``curv_sd``)."""
    rows, means, sds = [], [], []
    for k, mean, sd in fixed:
        row = np.zeros(n_params)
        row[k] = 1.0
        rows.append(row)
        means.append(mean)
        sds.append(sd)
    u = d.u_axis
    for i in range(1, u.size - 1):
        h0, h1 = u[i] - u[i - 1], u[i + 1] - u[i]
        row = np.zeros(n_params)
        row[first_row + i - 1] = 1.0 / h0
        row[first_row + i] = -1.0 / h0 - 1.0 / h1
        row[first_row + i + 1] = 1.0 / h1
        rows.append(row / (0.5 * (h0 + h1)))
        means.append(0.0)
        sds.append(curv_sd)
    if not rows:
        return np.zeros((0, n_params)), np.zeros(0), np.ones(0)
    return np.array(rows), np.array(means), np.array(sds)


def _row_levels(d: _Data, values: FloatArray) -> FloatArray:
    """Per row of the grid, the mean of ``values`` over its measured cells; rows without a
    measured cell interpolated over u."""
    n_b = d.u_axis.size
    sums = np.bincount(d.rows, weights=values, minlength=n_b)
    counts = np.bincount(d.rows, minlength=n_b)
    has = counts > 0
    levels = np.where(has, sums / np.maximum(counts, 1), 0.0)
    return np.interp(d.u_axis, d.u_axis[has], levels[has])


def _time_problem(d: _Data, opts: FitOptions, b_ratio: float) -> tuple[_Problem, list[FloatArray]]:
    n_b = d.u_axis.size
    w = opts.prior_weight
    # a1: per-sample overhead falls as 1/b (fixed per-step work shared by the batch).
    fixed = [(1, -math.log(b_ratio), 2.0 / w)] if w > 0 else []
    matrix, mean, sd = _priors(2 + n_b, fixed, 2, d, opts.curvature_sd / max(w, 1e-9))
    problem = _Problem(_log_time, d, opts.sensor_sigma, matrix, mean, sd)
    levels = _row_levels(d, d.log_y + d.lphi)
    c0 = float(np.median(levels))
    starts = [
        np.concatenate([[c0 - 2.0, -math.log(b_ratio)], levels]),
        np.concatenate([[c0 - 5.0, -math.log(b_ratio)], levels]),
        np.concatenate([[c0 + 1.0, -math.log(b_ratio)], levels - 1.0]),
    ]
    return problem, starts


def _power_problem(d: _Data, opts: FitOptions) -> tuple[_Problem, list[FloatArray]]:
    n_b = d.u_axis.size
    w = opts.prior_weight
    # a power law in f near f^1.5 (f·V², V rising with f), alike for every b, straight in
    # log-log
    # and a static floor of most of the least power measured (idle board, memory, CPU)
    y = np.exp(d.log_y)
    static = math.log(0.8 * float(y.min()))
    fixed = [(0, static, 0.5), (1, math.log(1.5), 0.7), (2, 0.0, 0.5), (3, 0.0, 1.0)]
    fixed = [(k, m, sd / w) for k, m, sd in fixed] if w > 0 else []
    matrix, mean, sd = _priors(4 + n_b, fixed, 4, d, opts.curvature_sd / max(w, 1e-9))
    problem = _Problem(_log_power, d, opts.sensor_sigma, matrix, mean, sd)
    starts = []
    for floor_share, e0 in ((0.8, math.log(1.5)), (0.5, 0.0), (0.95, 0.7)):
        floor = floor_share * float(y.min())
        dyn = np.log(np.maximum(y - floor, 1e-3 * y)) - math.exp(e0) * d.lphi
        starts.append(np.concatenate([[math.log(floor), e0, 0.0, 0.0], _row_levels(d, dyn)]))
    return problem, starts


def _residual_gp(
    x_meas: FloatArray, res: FloatArray, x_all: FloatArray, opts: FitOptions
) -> tuple[FloatArray, FloatArray]:
    """Posterior mean and sd of the log residual at ``x_all`` (GP with an RBF kernel).

    The signal variance is the residuals' mean square, at least ``model_sigma_floor``²; the
    noise is the sensor's.
    """
    n = res.size
    signal = max(opts.model_sigma_floor**2, float(res @ res) / n)
    noise = opts.sensor_sigma**2

    scale = np.array([opts.length_b, opts.length_f])
    shared = opts.shared_f_share

    def kernel(a: FloatArray, b: FloatArray) -> FloatArray:
        d = a[:, None, :] - b[None, :, :]
        own = np.exp(-0.5 * ((d / scale) ** 2).sum(axis=2))
        common = np.exp(-0.5 * (d[:, :, 1] / opts.length_shared_f) ** 2)
        return signal * ((1.0 - shared) * own + shared * common)

    k_mm = kernel(x_meas, x_meas) + noise * np.eye(n)
    k_am = kernel(x_all, x_meas)
    chol = np.linalg.cholesky(k_mm)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, res))
    mean = k_am @ alpha
    v = np.linalg.solve(chol, k_am.T)
    var = np.maximum(signal - (v * v).sum(axis=0), 0.0)
    return mean, np.sqrt(var)


def _valid_cells(time_s: FloatArray, peak_w: FloatArray, avg_w: FloatArray) -> BoolArray:
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(time_s) & np.isfinite(peak_w) & np.isfinite(avg_w)
        return ok & (time_s > 0) & (peak_w > 0) & (avg_w > 0)


def fit_lut(
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    time_s: npt.ArrayLike,
    peak_w: npt.ArrayLike,
    avg_w: npt.ArrayLike | None = None,
    options: FitOptions | None = None,
    warm: LUTFit | None = None,
) -> LUTFit:
    """Fit the model to the measured cells of a LUT; predict every cell.

    Parameters
    ----------
    batch_sizes, freqs_mhz : sequence
        The axes, strictly ascending.
    time_s, peak_w : array_like, shape (|B|, |F|)
        Measured time per sample (s) and peak power (W); NaN where not measured. Cells that
        are NaN, infinite or ≤ 0 in any table are ignored (a failed measurement).
    avg_w : array_like, optional
        Measured average power (W); the peak where not given.
    options : FitOptions, optional
    warm : LUTFit, optional
        An earlier fit of the same axes (e.g. before one more cell was measured): its
        parameters are the only start (faster); otherwise several starts are tried.

    Returns
    -------
    LUTFit

    Raises
    ------
    ValueError
        Bad axes or table shapes, or fewer than 2 usable cells.
    """
    opts = options or FitOptions()
    u, lphi = _axes(batch_sizes, freqs_mhz)
    shape = u.shape
    t = np.asarray(time_s, dtype=np.float64)
    p = np.asarray(peak_w, dtype=np.float64)
    a = p if avg_w is None else np.asarray(avg_w, dtype=np.float64)
    if t.shape != shape or p.shape != shape or a.shape != shape:
        raise ValueError(f"tables: expected shape {shape}, got {t.shape}, {p.shape}, {a.shape}")
    ok = _valid_cells(t, p, a)
    if int(ok.sum()) < 2:
        raise ValueError(f"fit_lut: needs at least 2 measured cells, got {int(ok.sum())}")
    rows = np.broadcast_to(np.arange(shape[0])[:, None], shape)
    u_axis = u[:, 0].copy()
    b_ratio = max(float(batch_sizes[-1]) / float(batch_sizes[0]), 1.0 + 1e-9)
    x_all = np.stack([u.ravel(), np.exp(lphi).ravel()], axis=1)
    x_meas = x_all[ok.ravel()]
    low = float(lphi.min())
    grid = _Data(rows.ravel(), u.ravel(), lphi.ravel(), np.zeros(u.size), u_axis, low)

    out: dict[str, tuple[FloatArray, FloatArray, FloatArray]] = {}
    for name, values in (("time", t), ("peak", p), ("avg", a)):
        data = _Data(rows[ok], u[ok], lphi[ok], np.log(values[ok]), u_axis, low)
        if name == "time":
            problem, starts = _time_problem(data, opts, b_ratio)
        else:
            problem, starts = _power_problem(data, opts)
        same_axes = warm is not None and (warm.batch_sizes, warm.freqs_mhz) == (
            tuple(int(x) for x in batch_sizes),
            tuple(float(x) for x in freqs_mhz),
        )
        if warm is not None and same_axes:
            starts = [np.array(getattr(warm, f"{name}_params"))]
        params = _best_fit(problem, starts, opts.max_iter)
        log_pred = problem.model(params, grid)[0].reshape(shape)
        res = data.log_y - log_pred[ok]
        mean, sd = _residual_gp(x_meas, res, x_all, opts)
        out[name] = (np.exp(log_pred + mean.reshape(shape)), sd.reshape(shape), params)
    return LUTFit(
        batch_sizes=tuple(int(b) for b in batch_sizes),
        freqs_mhz=tuple(float(f) for f in freqs_mhz),
        time_per_sample_s=out["time"][0],
        peak_power_w=out["peak"][0],
        avg_power_w=out["avg"][0],
        time_sigma=out["time"][1],
        peak_sigma=out["peak"][1],
        time_params=tuple(float(x) for x in out["time"][2]),
        peak_params=tuple(float(x) for x in out["peak"][2]),
        avg_params=tuple(float(x) for x in out["avg"][2]),
        n_cells=int(ok.sum()),
    )


# --------------------------------------------------------------------------- error report


def mape(
    predicted: npt.ArrayLike, truth: npt.ArrayLike, mask: npt.ArrayLike | None = None
) -> float:
    """Mean absolute percentage error of ``predicted`` against ``truth`` in % (NaN if no cell).

    Over the cells where both are finite, ``truth`` is non-zero and ``mask`` (if given) is
    True.
    """
    pred = np.asarray(predicted, dtype=np.float64)
    true = np.asarray(truth, dtype=np.float64)
    keep = np.isfinite(pred) & np.isfinite(true) & (true != 0)
    if mask is not None:
        keep &= np.asarray(mask, dtype=bool)
    if not keep.any():
        return math.nan
    return float(100.0 * np.mean(np.abs(pred[keep] - true[keep]) / np.abs(true[keep])))


@dataclass(frozen=True)
class FitError:
    """A fit's error against a full grid, in % (``fit_error``)."""

    time_mape_pct: float
    peak_mape_pct: float
    avg_mape_pct: float
    time_max_pct: float
    peak_max_pct: float
    cells: int


def fit_error(
    fit: LUTFit,
    time_s: npt.ArrayLike,
    peak_w: npt.ArrayLike,
    avg_w: npt.ArrayLike | None = None,
    mask: npt.ArrayLike | None = None,
) -> FitError:
    """MAPE (and worst cell) of the fit's time and power against a full measured grid.

    ``mask`` restricts the cells (e.g. ``~planned.measured``: the cells the fit predicted).
    """
    true_t = np.asarray(time_s, dtype=np.float64)
    true_p = np.asarray(peak_w, dtype=np.float64)
    keep = np.isfinite(true_t) & np.isfinite(true_p)
    if mask is not None:
        keep &= np.asarray(mask, dtype=bool)

    def worst(pred: FloatArray, true: FloatArray) -> float:
        if not keep.any():
            return math.nan
        return float(100.0 * np.max(np.abs(pred[keep] - true[keep]) / true[keep]))

    avg = math.nan if avg_w is None else mape(fit.avg_power_w, avg_w, keep)
    return FitError(
        time_mape_pct=mape(fit.time_per_sample_s, true_t, keep),
        peak_mape_pct=mape(fit.peak_power_w, true_p, keep),
        avg_mape_pct=avg,
        time_max_pct=worst(fit.time_per_sample_s, true_t),
        peak_max_pct=worst(fit.peak_power_w, true_p),
        cells=int(keep.sum()),
    )


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
    ) -> Cell | None:
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

    ``batch_size`` / ``freq_mhz`` are the measured cell Eq. 4 picks from the measured cells
    (None: no measured cell is feasible), ``cells`` how many cells this cap added and
    ``settled`` whether the fit left no cell with a real chance of being better (False:
    the budget ran out first).
    """

    cap_w: float
    batch_size: int | None
    freq_mhz: float | None
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
    cells: tuple[tuple[int, float], ...]
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

    def choice_for(self, cap_w: float) -> CapChoice:
        """The choice for ``cap_w`` (``math.inf``: no cap); KeyError if it was not planned."""
        for c in self.choices:
            if c.cap_w == cap_w or (math.isinf(c.cap_w) and math.isinf(cap_w)):
                return c
        raise KeyError(f"p-max-w: {cap_w!r} was not among the planned caps")


def seed_cells(n_b: int, n_f: int, count: int = 8) -> list[Cell]:
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
    chosen: list[Cell] = []

    def farthest(rows: Sequence[int]) -> Cell:
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
        self.cells: list[tuple[int, float]] = []

    @property
    def measured(self) -> BoolArray:
        return _valid_cells(self.time, self.peak, self.avg)

    def measure(self, cell: Cell) -> None:
        i, j = cell
        self.tried[i, j] = True
        self.cells.append((self.b[i], self.f[j]))
        t, p, a = (float(x) for x in self._measure(self.b[i], self.f[j]))
        if all(math.isfinite(x) and x > 0 for x in (t, p, a)):
            self.time[i, j], self.peak[i, j], self.avg[i, j] = t, p, min(a, p)

    def fit(self, opts: FitOptions, warm: LUTFit | None) -> LUTFit | None:
        if int(self.measured.sum()) < 2:
            return None
        return fit_lut(self.b, self.f, self.time, self.peak, self.avg, opts, warm)

    def filled(self, fit: LUTFit) -> tuple[FloatArray, FloatArray, FloatArray]:
        keep = self.measured
        return (
            np.where(keep, self.time, fit.time_per_sample_s),
            np.where(keep, self.peak, fit.peak_power_w),
            np.where(keep, self.avg, fit.avg_power_w),
        )


def _candidate(state: _State, fit: LUTFit, limit_w: float, ctx: _Ctx) -> tuple[Cell, float] | None:
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
) -> Cell | None:
    """The unmeasured cell most worth measuring next under ``limit``, as ``plan_cells`` picks
    it (``_candidate``), from tables measured elsewhere (NaN: not measured) and the cells
    already tried; None: the cap is settled.

    ``tables`` are time per sample, the peak the selection judges (the robust peak, where
    the caller's rule adds σ) and average power.
    """
    opts = options or PlanOptions()
    b, f = fit.batch_sizes, fit.freqs_mhz
    state = _State(b, f, lambda *_: (math.nan, math.nan, math.nan))
    state.time, state.peak, state.avg = (np.array(t, dtype=np.float64) for t in tables)
    state.tried = np.asarray(tried, dtype=bool) | state.measured
    select = opts.select or eq4_selector(r, opts.objective)
    ctx = _Ctx(select, np.asarray(r, dtype=np.float64)[:, None], opts)
    cand = _candidate(state, fit, limit.limit_w, ctx)
    return None if cand is None else cand[0]


def _chance_better(
    fit: LUTFit, tables: tuple[FloatArray, FloatArray], picked: Cell, ctx: _Ctx
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
    freqs_mhz: Sequence[float],
    caps_w: Sequence[float],
    r: Sequence[float],
    measure: MeasureFn,
    cap_margin: float = 0.0,
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
    batch_sizes, freqs_mhz : sequence
        B and F, strictly ascending.
    caps_w : sequence of float
        The caps to serve in W (``math.inf``: no cap); duplicates are served once.
    r : sequence of float
        Eq. 3's r_b per batch size.
    measure : callable
        ``measure(b, f) -> (time per sample s, peak W, average W)`` of one cell, measured
        as the profiler measures a cell (e.g. ``profiler.measure_cell``).
    cap_margin : float
        Share of each cap kept free (the selector's ``cap-margin``).
    options : PlanOptions, optional

    Returns
    -------
    PlannedLUT
    """
    opts = options or PlanOptions()
    b = tuple(int(x) for x in batch_sizes)
    f = tuple(float(x) for x in freqs_mhz)
    _axes(b, f)
    if len(r) != len(b) or not all(0 < float(x) <= 1 for x in r):
        raise ValueError(f"r: expected {len(b)} values in (0, 1], got {list(r)!r}")
    caps = _distinct_caps(caps_w)
    limits = {cap: PowerLimit(cap, cap_margin).limit_w for cap in caps}  # margin checked
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
                cand = _candidate(state, fit, limits[cap], ctx)
                if cand is not None:
                    ranked.append((cand[1], -k, cap, cand[0]))
        if not ranked:
            break
        _, _, cap, cell = max(ranked)
        state.measure(cell)
        spent[cap] += 1
        extra += 1
        fit = state.fit(opts.fit, fit) or fit
    settled = [_candidate(state, fit, limits[cap], ctx) is None for cap in caps]
    return _result(
        state, fit, limits, list(zip(spent.values(), settled, strict=True)), select, len(seeds)
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


def _distinct_caps(caps_w: Sequence[float]) -> list[float]:
    caps: list[float] = []
    for c in caps_w:
        x = math.inf if c is None else float(c)
        if math.isnan(x) or x <= 0:
            raise ValueError(f"p-max-w: must be > 0 W or inf (no cap), got {c!r}")
        if x not in caps:
            caps.append(x)
    if not caps:
        raise ValueError("caps_w: give at least one cap (inf: no cap)")
    return sorted(caps)


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
        freqs_mhz=state.f,
        time_per_sample_s=t,
        peak_power_w=p,
        avg_power_w=a,
        measured=state.measured,
        cells=tuple(state.cells),
        choices=tuple(choices),
        fit=fit,
        seed_count=n_seeds,
    )
