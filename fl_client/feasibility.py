"""Feasibility under a power cap: a cell's robust peak (peak + ``peak-sigma-k``·σ of its
per-step peaks) against the cap less its margin, the rule the selector, profiling's walk and
the server's forecast all judge cells by. NumPy only.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from fl_client.power import PowerLimit

#: Default ``peak-sigma-k``: a cell's robust peak is its profiled peak + k·σ of its per-step
#: peaks. The profiled peak is the largest of a few steps (≈ mean + 0.85σ for 3 steps);
#: + 2σ puts the estimate near mean + 3σ, about the largest per-step peak expected over the
#: ~1000 steps of a local training (≈ mean + 3.2σ for normal noise).
PEAK_SIGMA_K = 2.0

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def feasible_cells(
    peak_w: npt.ArrayLike,
    limit: PowerLimit | float | None,
    *,
    peak_sigma_w: npt.ArrayLike | None = None,
    peak_sigma_k: float = PEAK_SIGMA_K,
) -> BoolArray:
    """Which cells are feasible, each judged by its own robust peak: the selection's rule.

    A cell is feasible when it was profiled and ``peak + k·σ < limit`` (strictly, as in
    Eq. 4; ``robust_peak_w``). Nothing else in its row matters: a noisy or non-binding cell
    above the cap at a low f does not make the cells above it infeasible.

    Parameters
    ----------
    peak_w : array_like of float, any shape (a row or a |B| × |F| table)
        Profiled peak power in W; NaN = not profiled (never feasible).
    limit : PowerLimit, float or None
        The cap with its margin (its ``limit_w`` is what the robust peak must stay below),
        or that limit in W; None or infinity: no cap (every profiled cell is feasible).
    peak_sigma_w : array_like of float, optional
        σ of each cell's per-step peaks in W, same shape; None or NaN counts as 0.
    peak_sigma_k : float
        ``peak-sigma-k``.

    Returns
    -------
    ndarray of bool, the shape of ``peak_w``
    """
    if not 0 <= peak_sigma_k < math.inf:
        raise ValueError(f"peak-sigma-k: must be a finite number ≥ 0; got {peak_sigma_k!r}")
    limit_w = limit_w_of(limit)
    peak = np.asarray(peak_w, dtype=np.float64)
    if math.isinf(limit_w):
        return ~np.isnan(peak)
    sigma = None if peak_sigma_w is None else np.asarray(peak_sigma_w, dtype=np.float64)
    # NaN compares False: a cell that was not profiled is never feasible.
    return robust_peak_w(peak, sigma, peak_sigma_k) < limit_w


def limit_w_of(limit: PowerLimit | float | None) -> float:
    """What a robust peak must stay below: ``limit.limit_w``, or a limit given in W (None:
    no cap, inf)."""
    if isinstance(limit, PowerLimit):
        return limit.limit_w
    return math.inf if limit is None else float(limit)


def robust_peak_w(
    peak_w: npt.ArrayLike, sigma_w: npt.ArrayLike | None, k: float = PEAK_SIGMA_K
) -> FloatArray:
    """A cell's robust peak, what feasibility and the trained round's check judge:
    peak + k·σ of its per-step peaks (``peak-sigma-k``), σ None or NaN counting as 0."""
    peak = np.asarray(peak_w, dtype=np.float64)
    if sigma_w is None or k == 0:
        return peak
    return peak + k * np.fmax(np.asarray(sigma_w, dtype=np.float64), 0.0)  # fmax(NaN, 0) is 0


def feasible_knob_index(power_row_w: npt.ArrayLike, p_max_w: float | None) -> int | None:
    """The highest index j such that every measured cell at or below j is below P_max.

    This is the paper's Eq. 4 j_i on rows whose power rises with f, kept for code that
    needs a *prefix* of safe frequencies (the single-device study's report of the paper's
    rule). The selection itself no longer uses it: it judges
    each cell on its own (``feasible_cells``), so one noisy low-f cell above the cap costs
    that cell, not the row.

    Defined on the running maximum over measured cells,
    ``m[j] = max{P[k] : k ≤ j, P[k] measured}``: the answer is the highest *measured*
    index j with ``m[j] < P_max``. It is equal to Eq. 4 on rows that are non-decreasing
    over their measured cells, and conservative on noisy rows (a dip below the cap above a
    cell that broke it is not taken). ``m`` is non-decreasing, so the boundary is found by
    binary search.

    Parameters
    ----------
    power_row_w : array_like of float
        Peak power in W per knob value (ascending) for one batch size; NaN = not profiled.
    p_max_w : float or None
        The cap in W; None or infinity means no cap (the highest measured index).

    Returns
    -------
    int or None
        The index j_i, or None when the lowest measured cell is not below the cap.
    """
    row = np.asarray(power_row_w, dtype=np.float64)
    if row.ndim != 1:
        raise ValueError(f"power_row_w: must be one row (1-D), got shape {row.shape}")
    return feasible_knob_indices(row[None, :], p_max_w)[0]


def feasible_knob_indices(power_w: FloatArray, p_max_w: float | None) -> list[int | None]:
    """``feasible_knob_index`` of every row of a (|B|, |F|) table, vectorised."""
    cap = math.inf if p_max_w is None else float(p_max_w)
    measured = ~np.isnan(power_w)
    running_max = np.maximum.accumulate(np.where(measured, power_w, -np.inf), axis=1)
    cols = np.broadcast_to(np.arange(power_w.shape[1]), power_w.shape)
    last_measured = np.maximum.accumulate(np.where(measured, cols, -1), axis=1)
    out: list[int | None] = []
    for row_max, row_last in zip(running_max, last_measured, strict=True):
        first_bad = int(row_max.searchsorted(cap, side="left"))
        j = int(row_last[first_bad - 1]) if first_bad > 0 else -1
        out.append(None if j < 0 else j)
    return out
