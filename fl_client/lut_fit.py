"""Fewer profiled cells: a small fitted model of the LUT.

Issue 15, part 2. A full LUT measures every (batch size b, GPU frequency f) cell; Eq. 4 only
needs the cells around each cap's feasibility boundary and the optimum. This module fits a
small model of time per sample and peak (and average) power over (b, f) to a few measured
cells. NumPy only (no torch, no Flower).

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

The planning that chooses the cells is ``fl_client.lut_plan``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "FitError",
    "FitOptions",
    "GridTables",
    "LUTFit",
    "fit_error",
    "fit_lut",
    "grid_axes",
    "mape",
    "refit_lut",
    "valid_cells",
]

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
    batch_sizes, knob_values : tuple
        The axes (rows, columns).
    time_per_sample_s, peak_power_w, avg_power_w : ndarray, shape (|B|, |F|)
        The cells: what ``LUTFit`` predicts, what ``PlannedLUT`` measured or fitted.
    """

    batch_sizes: tuple[int, ...]
    knob_values: tuple[float, ...]
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


def grid_axes(
    batch_sizes: Sequence[int], knob_values: Sequence[float]
) -> tuple[FloatArray, FloatArray]:
    """u (scaled log2 b) and log φ (log f / f_max) on the grid, each (|B|, |F|)."""
    b = np.asarray(batch_sizes, dtype=np.float64)
    f = np.asarray(knob_values, dtype=np.float64)
    if b.ndim != 1 or f.ndim != 1 or b.size == 0 or f.size == 0:
        raise ValueError("batch_sizes and knob_values: need non-empty 1-D axes")
    if not (np.all(np.isfinite(b)) and np.all(b > 0) and np.all(np.diff(b) > 0)):
        raise ValueError(f"batch_sizes: must be > 0 and strictly ascending; got {list(b)}")
    if not (np.all(np.isfinite(f)) and np.all(f > 0) and np.all(np.diff(f) > 0)):
        raise ValueError(f"knob_values: must be > 0 and strictly ascending; got {list(f)}")
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


def valid_cells(time_s: FloatArray, peak_w: FloatArray, avg_w: FloatArray) -> BoolArray:
    """Cells measured successfully: finite and > 0 in all three tables."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(time_s) & np.isfinite(peak_w) & np.isfinite(avg_w)
        return ok & (time_s > 0) & (peak_w > 0) & (avg_w > 0)


def fit_lut(
    batch_sizes: Sequence[int],
    knob_values: Sequence[float],
    time_s: npt.ArrayLike,
    peak_w: npt.ArrayLike,
    avg_w: npt.ArrayLike | None = None,
    options: FitOptions | None = None,
) -> LUTFit:
    """Fit the model to the measured cells of a LUT; predict every cell.

    Parameters
    ----------
    batch_sizes, knob_values : sequence
        The axes, strictly ascending.
    time_s, peak_w : array_like, shape (|B|, |F|)
        Measured time per sample (s) and peak power (W); NaN where not measured. Cells that
        are NaN, infinite or ≤ 0 in any table are ignored (a failed measurement).
    avg_w : array_like, optional
        Measured average power (W); the peak where not given.
    options : FitOptions, optional

    Returns
    -------
    LUTFit

    Raises
    ------
    ValueError
        Bad axes or table shapes, or fewer than 2 usable cells.
    """
    cells = _Cells.of(batch_sizes, knob_values, (time_s, peak_w, avg_w))
    return _fit(cells, options or FitOptions(), None)


def refit_lut(
    warm: LUTFit,
    time_s: npt.ArrayLike,
    peak_w: npt.ArrayLike,
    avg_w: npt.ArrayLike | None = None,
    options: FitOptions | None = None,
) -> LUTFit:
    """``fit_lut`` on the axes of an earlier fit ``warm`` (e.g. before one more cell was
    measured), started from its parameters only: faster than ``fit_lut``'s several starts.
    """
    cells = _Cells.of(warm.batch_sizes, warm.knob_values, (time_s, peak_w, avg_w))
    return _fit(cells, options or FitOptions(), warm)


@dataclass(frozen=True)
class _Cells:
    """The measured tables of ``fit_lut`` on their grid: the axes, u and log φ of every
    cell, time, peak and average power, and which cells are usable."""

    batch_sizes: tuple[int, ...]
    knob_values: tuple[float, ...]
    u: FloatArray
    lphi: FloatArray
    tables: tuple[FloatArray, FloatArray, FloatArray]
    ok: BoolArray

    @classmethod
    def of(
        cls,
        batch_sizes: Sequence[int],
        knob_values: Sequence[float],
        tables: tuple[npt.ArrayLike, npt.ArrayLike, npt.ArrayLike | None],
    ) -> _Cells:
        u, lphi = grid_axes(batch_sizes, knob_values)
        shape = u.shape
        t = np.asarray(tables[0], dtype=np.float64)
        p = np.asarray(tables[1], dtype=np.float64)
        a = p if tables[2] is None else np.asarray(tables[2], dtype=np.float64)
        if t.shape != shape or p.shape != shape or a.shape != shape:
            raise ValueError(f"tables: expected shape {shape}, got {t.shape}, {p.shape}, {a.shape}")
        ok = valid_cells(t, p, a)
        if int(ok.sum()) < 2:
            raise ValueError(f"fit_lut: needs at least 2 measured cells, got {int(ok.sum())}")
        b = tuple(int(x) for x in batch_sizes)
        return cls(b, tuple(float(x) for x in knob_values), u, lphi, (t, p, a), ok)


def _fit(cells: _Cells, opts: FitOptions, warm: LUTFit | None) -> LUTFit:
    """``fit_lut``: each quantity's parametric fit (from ``warm``'s parameters when given,
    else from several starts), then its residual correction."""
    u, lphi, ok = cells.u, cells.lphi, cells.ok
    shape = u.shape
    rows = np.broadcast_to(np.arange(shape[0])[:, None], shape)
    u_axis = u[:, 0].copy()
    b_ratio = max(float(cells.batch_sizes[-1]) / float(cells.batch_sizes[0]), 1.0 + 1e-9)
    x_all = np.stack([u.ravel(), np.exp(lphi).ravel()], axis=1)
    x_meas = x_all[ok.ravel()]
    low = float(lphi.min())
    grid = _Data(rows.ravel(), u.ravel(), lphi.ravel(), np.zeros(u.size), u_axis, low)

    out: dict[str, tuple[FloatArray, FloatArray, FloatArray]] = {}
    for name, values in zip(("time", "peak", "avg"), cells.tables, strict=True):
        data = _Data(rows[ok], u[ok], lphi[ok], np.log(values[ok]), u_axis, low)
        if name == "time":
            problem, starts = _time_problem(data, opts, b_ratio)
        else:
            problem, starts = _power_problem(data, opts)
        if warm is not None:
            starts = [np.array(getattr(warm, f"{name}_params"))]
        params = _best_fit(problem, starts, opts.max_iter)
        log_pred = problem.model(params, grid)[0].reshape(shape)
        res = data.log_y - log_pred[ok]
        mean, sd = _residual_gp(x_meas, res, x_all, opts)
        out[name] = (np.exp(log_pred + mean.reshape(shape)), sd.reshape(shape), params)
    return LUTFit(
        batch_sizes=cells.batch_sizes,
        knob_values=cells.knob_values,
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
