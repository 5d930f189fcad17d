"""Choosing (batch size, GPU frequency) under a power cap: Eq. 4 of the paper and its baselines.

Pure functions over the two lookup tables the profiler measures (``fl_client.profiler``):
``lut_time_s[i, j]`` is the time per training sample and ``lut_power_w[i, j]`` the peak power
at batch size ``batch_sizes[i]`` and GPU frequency ``freqs_mhz[j]``; NaN marks a cell that
was not profiled (efficient mode). NumPy only: no torch, no Flower.

Methods (``METHODS``):

* ``power-aware`` — Eq. 4 / Algorithm 1: for each b the highest frequency whose peak power
  is below P_max (less an optional ``cap-margin``), then the b minimising time per sample ×
  r_b (r from the server's proxy).
* ``oracle`` — the same with r measured on the client's own data (the paper's "fastest
  configuration").
* ``b1`` — largest b, highest table frequency at or below the device's fixed safe cap.
* ``b2`` — b with the smallest proxy r, same fixed frequency cap as B1.
* ``fixed`` — a given (b, f), checked against the tables' axes.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

METHODS = ("power-aware", "b1", "b2", "oracle", "fixed")

# Fixed frequency caps and fixed frequencies are often quoted in whole MHz (the paper's
# "307 / 614 / 921 MHz" are the Nano's 307.2 / 614.4 / 921.6 MHz); table steps are ≥ 25 MHz
# apart, so matching within 1 MHz cannot pick a neighbouring step.
FREQ_TOLERANCE_MHZ = 1.0

FloatArray = npt.NDArray[np.float64]


class InfeasibleCapError(ValueError):
    """No profiled (b, f) runs below P_max.

    Attributes
    ----------
    p_max_w : float
        The cap that could not be met.
    min_power_w : float
        The lowest peak power measured anywhere in the table.
    batch_size : int
        Batch size of the cell where ``min_power_w`` was measured.
    freq_mhz : float
        GPU frequency of that cell.
    cap_margin : float
        The share of P_max that was kept free (``margin_cap_w``); 0 for the bare cap.
    """

    def __init__(
        self,
        p_max_w: float,
        min_power_w: float,
        batch_size: int,
        freq_mhz: float,
        cap_margin: float = 0.0,
    ):
        self.p_max_w = p_max_w
        self.min_power_w = min_power_w
        self.batch_size = batch_size
        self.freq_mhz = freq_mhz
        self.cap_margin = cap_margin
        limit = f"P_max = {p_max_w:g} W"
        fix = f"Raise p-max-w above {min_power_w:.3f} W"
        if cap_margin > 0:
            limit += (
                f" less cap-margin {100 * cap_margin:g}% "
                f"({margin_cap_w(p_max_w, cap_margin):.3f} W)"
            )
            fix = f"Raise p-max-w above {min_power_w / (1 - cap_margin):.3f} W, lower cap-margin"
        super().__init__(
            f"p-max-w: no (batch size, GPU frequency) runs below {limit}; the "
            f"lowest measured peak power is {min_power_w:.3f} W (b={batch_size}, "
            f"f={freq_mhz:g} MHz). {fix} or add smaller batch sizes / lower frequencies."
        )


@dataclass(frozen=True)
class Candidate:
    """One row of Eq. 4's candidate set C: a batch size and its feasible frequency.

    ``freq_mhz`` is None when no profiled frequency of this b is below the cap; the
    predictions are NaN when there is no frequency or no profiled cell to predict from.
    """

    batch_size: int
    freq_mhz: float | None
    time_per_sample_s: float
    peak_power_w: float
    score: float


@dataclass(frozen=True)
class Selection:
    """The chosen (b*, f*) with what the tables predict for it.

    Attributes
    ----------
    method : str
        One of ``METHODS``.
    batch_size : int
        b*.
    freq_mhz : float
        f*, a value of the frequency table.
    time_per_sample_s : float
        Predicted training time per sample at (b*, f*); NaN if that cell was not profiled
        (or no table was given, for the baselines).
    peak_power_w : float
        Predicted peak power at (b*, f*); NaN likewise.
    score : float
        ``time_per_sample_s × r_b*``, proportional to TT_acc (Eq. 2 with Eq. 3); NaN when
        r or the time is unknown.
    p_max_w : float or None
        The cap the choice was made under (None: no cap, or a method that ignores it).
    candidates : tuple of Candidate
        Per b, the frequency the method would use with it and the predictions there, in
        the order of ``batch_sizes`` (Eq. 4's C for power-aware and oracle).
    """

    method: str
    batch_size: int
    freq_mhz: float
    time_per_sample_s: float
    peak_power_w: float
    score: float
    p_max_w: float | None
    candidates: tuple[Candidate, ...]

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case, JSON-ready summary (NaN becomes None) for reports and messages."""
        return {
            "method": self.method,
            "batch-size": self.batch_size,
            "gpu-freq-mhz": self.freq_mhz,
            "predicted-time-per-sample-s": _none_if_nan(self.time_per_sample_s),
            "predicted-peak-power-w": _none_if_nan(self.peak_power_w),
            "predicted-score": _none_if_nan(self.score),
            "p-max-w": self.p_max_w,
            "candidates": [
                {
                    "batch-size": c.batch_size,
                    "gpu-freq-mhz": c.freq_mhz,
                    "time-per-sample-s": _none_if_nan(c.time_per_sample_s),
                    "peak-power-w": _none_if_nan(c.peak_power_w),
                    "score": _none_if_nan(c.score),
                }
                for c in self.candidates
            ],
        }


def _none_if_nan(x: float) -> float | None:
    return None if math.isnan(x) else x


# --------------------------------------------------------------------------- validation


def validate_p_max_w(p_max_w: object) -> float | None:
    """Check a power cap; return it in watts, or None for "no cap".

    Parameters
    ----------
    p_max_w : float, str or None
        ``p-max-w``: a finite number > 0 (a numeric string is accepted), or None, ``"none"``
        or infinity meaning no cap.

    Returns
    -------
    float or None
        The cap in watts, None when there is no cap.

    Raises
    ------
    ValueError
        For a non-number, NaN, zero or a negative value.
    """
    allowed = "a finite number of watts > 0, or none/inf for no cap"
    if p_max_w is None:
        return None
    value: float
    if isinstance(p_max_w, str):
        text = p_max_w.strip().lower()
        if text in ("none", "inf", "+inf", "infinity"):
            return None
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"p-max-w: must be {allowed}; got {p_max_w!r}") from None
    elif isinstance(p_max_w, numbers.Real) and not isinstance(p_max_w, bool):
        value = float(p_max_w)
    else:
        raise ValueError(f"p-max-w: must be {allowed}; got {p_max_w!r}")
    if value == math.inf:
        return None
    if math.isnan(value) or value <= 0:
        raise ValueError(f"p-max-w: must be {allowed}; got {p_max_w!r}")
    return value


def validate_cap_margin(cap_margin: object) -> float:
    """Check ``cap-margin``: the share of P_max kept free of profiled peak power, in [0, 1).

    Raises
    ------
    ValueError
        For a non-number, NaN, a negative value or one ≥ 1.
    """
    allowed = "a number in [0, 1) (a share of P_max, e.g. 0.05)"
    if isinstance(cap_margin, bool) or not isinstance(cap_margin, numbers.Real):
        raise ValueError(f"cap-margin: must be {allowed}; got {cap_margin!r}")
    value = float(cap_margin)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"cap-margin: must be {allowed}; got {cap_margin!r}")
    return value


def margin_cap_w(p_max_w: float, cap_margin: float) -> float:
    """The power a profiled peak must stay below: ``P_max · (1 − cap_margin)`` (inf: no cap).

    One profiled peak is a noisy sample of a cell's power, and training runs many more
    steps than profiling: keeping profiled peaks ``cap_margin`` below P_max leaves room for
    the sensor's excursions above what profiling saw.
    """
    return math.inf if math.isinf(p_max_w) else p_max_w * (1.0 - cap_margin)


def validate_batch_sizes(batch_sizes: Sequence[object]) -> list[int]:
    """Check ``batch-sizes``: non-empty, positive integers, strictly ascending.

    Parameters
    ----------
    batch_sizes : sequence of int
        The candidate batch sizes B. Integral floats (``8.0``) are accepted.

    Returns
    -------
    list of int

    Raises
    ------
    ValueError
        Naming ``batch-sizes`` and what is allowed.
    """
    allowed = "a non-empty, strictly ascending list of positive integers"
    if isinstance(batch_sizes, np.ndarray):
        batch_sizes = batch_sizes.tolist()
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Sequence):
        raise ValueError(f"batch-sizes: must be {allowed}; got {batch_sizes!r}")
    if len(batch_sizes) == 0:
        raise ValueError(f"batch-sizes: must be {allowed}; got an empty list")
    out: list[int] = []
    for b in batch_sizes:
        if type(b) is int and b >= 1:  # the common case, without the ABC checks below
            out.append(b)
            continue
        if isinstance(b, bool) or not isinstance(b, numbers.Real):
            raise ValueError(f"batch-sizes: {b!r} is not an integer; must be {allowed}")
        if not float(b).is_integer() or b < 1:
            raise ValueError(f"batch-sizes: {b!r} is not a positive integer; must be {allowed}")
        out.append(int(float(b)))
    if any(a >= b for a, b in itertools.pairwise(out)):
        raise ValueError(f"batch-sizes: {out} is not strictly ascending; must be {allowed}")
    return out


def validate_r(r: Sequence[object], batch_sizes: Sequence[object]) -> list[float]:
    """Check the batch-size efficiency vector r (Eq. 3) against ``batch-sizes``.

    Parameters
    ----------
    r : sequence of float
        ``r``: one value per batch size, each in (0, 1].
    batch_sizes : sequence of int
        ``batch-sizes`` the values are aligned with.

    Returns
    -------
    list of float

    Raises
    ------
    ValueError
        When the lengths differ or a value is not a number in (0, 1].
    """
    b = validate_batch_sizes(batch_sizes)
    return _validate_r_for(r, b)


def _validate_r_for(r: Sequence[object], b: list[int]) -> list[float]:
    """``validate_r`` against batch sizes that are already validated."""
    if isinstance(r, np.ndarray):
        r = r.tolist()
    if isinstance(r, (str, bytes)) or not isinstance(r, Sequence):
        raise ValueError(f"r: must be a list of numbers in (0, 1], one per batch size; got {r!r}")
    if len(r) != len(b):
        raise ValueError(
            f"r: has {len(r)} values but batch-sizes has {len(b)} ({b}); "
            "r must give one value in (0, 1] per batch size"
        )
    out: list[float] = []
    for bi, x in zip(b, r, strict=True):
        if type(x) is float and 0 < x <= 1:  # the common case, without the ABC checks
            out.append(x)
            continue
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not 0 < float(x) <= 1:
            raise ValueError(f"r: value {x!r} for batch size {bi} is not in (0, 1]")
        out.append(float(x))
    return out


def validate_freqs_mhz(freqs_mhz: Sequence[object]) -> list[float]:
    """Check a frequency table: non-empty, finite values > 0 MHz, strictly ascending.

    Raises
    ------
    ValueError
        Naming ``freqs-mhz`` and what is allowed.
    """
    allowed = "a non-empty, strictly ascending list of positive MHz values"
    try:
        out = [float(f) for f in freqs_mhz]  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"freqs-mhz: must be {allowed}; got {freqs_mhz!r}") from None
    if not out or not all(math.isfinite(f) and f > 0 for f in out):
        raise ValueError(f"freqs-mhz: must be {allowed}; got {freqs_mhz!r}")
    if any(a >= b for a, b in itertools.pairwise(out)):
        raise ValueError(f"freqs-mhz: {out} is not strictly ascending; must be {allowed}")
    return out


def validate_tables(
    lut_time_s: npt.ArrayLike, lut_power_w: npt.ArrayLike, n_b: int, n_f: int
) -> tuple[FloatArray, FloatArray]:
    """Check LUT_time and LUT_power; return them as |B|×|F| float arrays.

    Both must have shape (n_b, n_f), be NaN (not profiled) at the same cells, have
    finite times > 0 s and finite powers ≥ 0 W elsewhere, and at least one profiled cell.

    Raises
    ------
    ValueError
        Naming the table and what is wrong.
    """
    time_s = np.asarray(lut_time_s, dtype=np.float64)
    power_w = np.asarray(lut_power_w, dtype=np.float64)
    for name, table in (("lut_time_s", time_s), ("lut_power_w", power_w)):
        if table.shape != (n_b, n_f):
            raise ValueError(
                f"{name}: shape {table.shape} does not match |batch-sizes| × |freqs-mhz| = "
                f"({n_b}, {n_f})"
            )
    if not np.array_equal(np.isnan(time_s), np.isnan(power_w)):
        raise ValueError("lut_time_s and lut_power_w: NaN (not profiled) at different cells")
    measured = ~np.isnan(time_s)
    t, p = time_s[measured], power_w[measured]
    if not (np.isfinite(t).all() and (t > 0).all()):
        raise ValueError("lut_time_s: profiled cells must be finite and > 0 seconds per sample")
    if not (np.isfinite(p).all() and (p >= 0).all()):
        raise ValueError("lut_power_w: profiled cells must be finite and ≥ 0 W")
    if not t.size:
        raise ValueError("lut_time_s / lut_power_w: no cell was profiled")
    return time_s, power_w


def _table_freq_at_or_below(freqs_mhz: Sequence[float], cap_mhz: float, key: str) -> int:
    """Index of the highest table frequency ≤ ``cap_mhz`` (within FREQ_TOLERANCE_MHZ)."""
    if isinstance(cap_mhz, bool) or not isinstance(cap_mhz, numbers.Real):
        raise ValueError(f"{key}: must be a frequency in MHz; got {cap_mhz!r}")
    cap = float(cap_mhz)
    if math.isnan(cap) or cap <= 0:
        raise ValueError(f"{key}: must be a frequency in MHz > 0; got {cap_mhz!r}")
    j = int(np.searchsorted(np.asarray(freqs_mhz), cap + FREQ_TOLERANCE_MHZ, side="right")) - 1
    if j < 0:
        raise ValueError(
            f"{key}: {cap:g} MHz is below the lowest table frequency {freqs_mhz[0]:g} MHz"
        )
    return j


# --------------------------------------------------------------------------- Eq. 4


def feasible_freq_index(power_row_w: npt.ArrayLike, p_max_w: float | None) -> int | None:
    """Eq. 4's j_i: the highest frequency index whose peak power is below P_max.

    Measured rows are noisy and not always monotone, and efficient profiling leaves cells
    NaN. The rule is therefore defined on the running maximum over measured cells,
    ``m[j] = max{P[k] : k ≤ j, P[k] measured}``: the answer is the highest *measured*
    index j with ``m[j] < P_max``. So a frequency is feasible only if it and every measured
    lower frequency are below the cap. This is

    * equal to Eq. 4 on rows that are non-decreasing over their measured cells (the
      paper's premise: power rises with f), since then ``m`` is the row itself;
    * conservative on noisy rows: a dip below the cap above a cell that broke it is not
      trusted (the efficient profiler stops at the first infeasible f for the same reason);
    * what the efficient profiler finds, so efficient and full tables agree.

    ``m`` is non-decreasing, so the boundary is found by binary search (O(log |F|) after
    the O(|F|) vectorised running maximum).

    Parameters
    ----------
    power_row_w : array_like of float
        Peak power in W per frequency (ascending frequencies) for one batch size; NaN =
        not profiled.
    p_max_w : float or None
        The cap in W; None or infinity means no cap (the highest measured index).

    Returns
    -------
    int or None
        The index j_i, or None when no measured cell is feasible.
    """
    row = np.asarray(power_row_w, dtype=np.float64)
    if row.ndim != 1:
        raise ValueError(f"power_row_w: must be one row (1-D), got shape {row.shape}")
    cap = math.inf if p_max_w is None else float(p_max_w)
    measured = ~np.isnan(row)
    running_max = np.maximum.accumulate(np.where(measured, row, -np.inf))
    # First index whose running maximum reaches the cap; everything before it is feasible.
    first_bad = int(np.searchsorted(running_max, cap, side="left"))
    if first_bad == 0:
        return None
    last_measured = np.maximum.accumulate(np.where(measured, np.arange(row.size), -1))
    j = int(last_measured[first_bad - 1])
    return None if j < 0 else j


def feasible_freq_indices(power_w: FloatArray, p_max_w: float | None) -> list[int | None]:
    """``feasible_freq_index`` of every row of a (|B|, |F|) table, vectorised.

    The running maxima and last-measured indices of all rows are computed in one pass;
    each row's boundary is then a binary search (``searchsorted``) on its running maximum.
    """
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


def _nan_if_none(table: FloatArray | None, i: int, j: int) -> float:
    return math.nan if table is None else float(table[i, j])


def _candidates_at(
    batch_sizes: list[int],
    freqs_mhz: list[float],
    freq_index: Sequence[int | None],
    lut_time_s: FloatArray | None,
    lut_power_w: FloatArray | None,
    r: list[float] | None,
) -> tuple[Candidate, ...]:
    out = []
    for i, (b, j) in enumerate(zip(batch_sizes, freq_index, strict=True)):
        if j is None:
            out.append(Candidate(b, None, math.nan, math.nan, math.nan))
            continue
        t = _nan_if_none(lut_time_s, i, j)
        score = t * r[i] if r is not None else math.nan
        out.append(Candidate(b, freqs_mhz[j], t, _nan_if_none(lut_power_w, i, j), score))
    return tuple(out)


def _selection(
    method: str, chosen: Candidate, p_max_w: float | None, candidates: tuple[Candidate, ...]
) -> Selection:
    assert chosen.freq_mhz is not None
    return Selection(
        method=method,
        batch_size=chosen.batch_size,
        freq_mhz=chosen.freq_mhz,
        time_per_sample_s=chosen.time_per_sample_s,
        peak_power_w=chosen.peak_power_w,
        score=chosen.score,
        p_max_w=p_max_w,
        candidates=candidates,
    )


def _select_eq4(
    method: str,
    lut_time_s: npt.ArrayLike,
    lut_power_w: npt.ArrayLike,
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    r: Sequence[float],
    p_max_w: float | str | None,
    cap_margin: float,
) -> Selection:
    b_list = validate_batch_sizes(batch_sizes)
    f_list = validate_freqs_mhz(freqs_mhz)
    r_list = _validate_r_for(r, b_list)
    cap = validate_p_max_w(p_max_w)
    margin = validate_cap_margin(cap_margin)
    time_s, power_w = validate_tables(lut_time_s, lut_power_w, len(b_list), len(f_list))
    index = feasible_freq_indices(power_w, None if cap is None else margin_cap_w(cap, margin))
    candidates = _candidates_at(b_list, f_list, index, time_s, power_w, r_list)
    feasible = [c for c in candidates if c.freq_mhz is not None]
    if not feasible:
        assert cap is not None  # without a cap every row with a measured cell is feasible
        i, j = np.unravel_index(int(np.nanargmin(power_w)), power_w.shape)
        raise InfeasibleCapError(cap, float(power_w[i, j]), b_list[i], f_list[j], margin)
    # Ties in the score go to the lower power (same time, less energy), then the larger b.
    best = min(feasible, key=lambda c: (c.score, c.peak_power_w, -c.batch_size))
    return _selection(method, best, cap, candidates)


def select_power_aware(
    lut_time_s: npt.ArrayLike,
    lut_power_w: npt.ArrayLike,
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    r: Sequence[float],
    p_max_w: float | str | None,
    *,
    cap_margin: float = 0.0,
) -> Selection:
    """Eq. 4 / Algorithm 1: the (b, f) minimising time per sample × r_b under P_max.

    For each b the frequency is ``feasible_freq_index`` of its power row (the highest f
    below the cap, less ``cap_margin``); among those candidates the smallest
    ``lut_time_s[b, f] × r_b`` wins (ties: lower peak power, then larger b).

    Parameters
    ----------
    lut_time_s : array_like, shape (|B|, |F|)
        Time per training sample in seconds; NaN where not profiled.
    lut_power_w : array_like, shape (|B|, |F|)
        Peak power in W; NaN exactly where ``lut_time_s`` is NaN.
    batch_sizes : sequence of int
        B, strictly ascending (rows of the tables).
    freqs_mhz : sequence of float
        F in MHz, strictly ascending (columns of the tables).
    r : sequence of float
        Eq. 3's r_b per batch size, each in (0, 1], from the server's proxy training.
    p_max_w : float, str or None
        The cap P_max in W; None / "none" / infinity for no cap.
    cap_margin : float
        Share of P_max kept free (``validate_cap_margin``): a cell is feasible when its
        profiled peak is below ``P_max · (1 − cap_margin)``; 0 is the paper's rule.

    Returns
    -------
    Selection
        With ``method="power-aware"``, ``p_max_w`` the cap itself, and the candidate set C.

    Raises
    ------
    InfeasibleCapError
        When no profiled cell is below the cap.
    ValueError
        For malformed inputs (the message names the key).
    """
    return _select_eq4(
        "power-aware", lut_time_s, lut_power_w, batch_sizes, freqs_mhz, r, p_max_w, cap_margin
    )


def select_oracle(
    lut_time_s: npt.ArrayLike,
    lut_power_w: npt.ArrayLike,
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    r: Sequence[float],
    p_max_w: float | str | None,
    *,
    cap_margin: float = 0.0,
) -> Selection:
    """The paper's "fastest configuration": Eq. 4 with r measured on the client's own data.

    Same parameters as ``select_power_aware``; ``r`` is the true r of the target data.
    Returns a Selection with ``method="oracle"``.
    """
    return _select_eq4(
        "oracle", lut_time_s, lut_power_w, batch_sizes, freqs_mhz, r, p_max_w, cap_margin
    )


def _select_at_fixed_cap(
    method: str,
    batch_index: int,
    batch_sizes: list[int],
    freqs_mhz: Sequence[float],
    b1_freq_cap_mhz: float,
    lut_time_s: npt.ArrayLike | None,
    lut_power_w: npt.ArrayLike | None,
    r: list[float] | None,
) -> Selection:
    """B1/B2: every b runs at the highest table frequency at or below the fixed cap."""
    f_list = validate_freqs_mhz(freqs_mhz)
    j = _table_freq_at_or_below(f_list, b1_freq_cap_mhz, "b1-freq-cap-mhz")
    time_s, power_w = _optional_tables(lut_time_s, lut_power_w, len(batch_sizes), len(f_list))
    candidates = _candidates_at(batch_sizes, f_list, [j] * len(batch_sizes), time_s, power_w, r)
    return _selection(method, candidates[batch_index], None, candidates)


def _optional_tables(
    lut_time_s: npt.ArrayLike | None, lut_power_w: npt.ArrayLike | None, n_b: int, n_f: int
) -> tuple[FloatArray | None, FloatArray | None]:
    if lut_time_s is None and lut_power_w is None:
        return None, None
    if lut_time_s is None or lut_power_w is None:
        raise ValueError("lut_time_s and lut_power_w: give both tables or neither")
    return validate_tables(lut_time_s, lut_power_w, n_b, n_f)


def select_b1(
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    b1_freq_cap_mhz: float,
    lut_time_s: npt.ArrayLike | None = None,
    lut_power_w: npt.ArrayLike | None = None,
    *,
    r: Sequence[float] | None = None,
) -> Selection:
    """Baseline 1 (state of practice): the largest b at a fixed, model-agnostic safe frequency.

    Parameters
    ----------
    batch_sizes : sequence of int
        B; pass only the batch sizes that fit in the device's memory — the largest is used.
    freqs_mhz : sequence of float
        The device's frequency table in MHz, ascending.
    b1_freq_cap_mhz : float
        The device's fixed safe frequency for the P_max band (Nano: 307 / 614 / 921.6 MHz
        for 4.5 W / 7 W / no cap); the highest table frequency ≤ it (within
        ``FREQ_TOLERANCE_MHZ``) is used.
    lut_time_s, lut_power_w : array_like, optional
        The profiled tables; when given, the predictions are read from them (NaN where the
        cell was not profiled). Not needed for the choice itself.
    r : sequence of float, optional
        When given, the prediction's score is time per sample × r_b.

    Returns
    -------
    Selection
        With ``method="b1"``; ``p_max_w`` is None (B1 does not look at the cap).
    """
    b_list = validate_batch_sizes(batch_sizes)
    r_list = None if r is None else validate_r(r, b_list)
    return _select_at_fixed_cap(
        "b1", len(b_list) - 1, b_list, freqs_mhz, b1_freq_cap_mhz, lut_time_s, lut_power_w, r_list
    )


def select_b2(
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    r: Sequence[float],
    b1_freq_cap_mhz: float,
    lut_time_s: npt.ArrayLike | None = None,
    lut_power_w: npt.ArrayLike | None = None,
) -> Selection:
    """Baseline 2: the b with the smallest proxy r (fewest samples to accuracy), B1's frequency.

    Ties in r go to the larger b. Parameters as ``select_b1``, plus ``r`` (Eq. 3, from
    the server's proxy training, one value in (0, 1] per batch size).

    Returns
    -------
    Selection
        With ``method="b2"``; ``p_max_w`` is None.
    """
    b_list = validate_batch_sizes(batch_sizes)
    r_list = validate_r(r, b_list)
    best = min(range(len(b_list)), key=lambda i: (r_list[i], -b_list[i]))
    return _select_at_fixed_cap(
        "b2", best, b_list, freqs_mhz, b1_freq_cap_mhz, lut_time_s, lut_power_w, r_list
    )


def select_fixed(
    batch_size: int,
    freq_mhz: float,
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    lut_time_s: npt.ArrayLike | None = None,
    lut_power_w: npt.ArrayLike | None = None,
    *,
    r: Sequence[float] | None = None,
) -> Selection:
    """A given (b, f), checked to be in B and in the frequency table.

    Parameters
    ----------
    batch_size : int
        ``fixed-batch-size``; must be one of ``batch_sizes``.
    freq_mhz : float
        ``fixed-freq-mhz``; must match a table frequency within ``FREQ_TOLERANCE_MHZ`` (the
        table's value is used).
    batch_sizes, freqs_mhz, lut_time_s, lut_power_w, r
        As in ``select_b1``.

    Returns
    -------
    Selection
        With ``method="fixed"``; only the chosen b appears in ``candidates``.
    """
    b_list = validate_batch_sizes(batch_sizes)
    f_list = validate_freqs_mhz(freqs_mhz)
    r_list = None if r is None else validate_r(r, b_list)
    if isinstance(batch_size, bool) or batch_size not in b_list:
        raise ValueError(f"fixed-batch-size: {batch_size!r} is not one of batch-sizes {b_list}")
    if isinstance(freq_mhz, bool) or not isinstance(freq_mhz, numbers.Real):
        raise ValueError(f"fixed-freq-mhz: must be a frequency in MHz; got {freq_mhz!r}")
    gaps = np.abs(np.asarray(f_list) - float(freq_mhz))
    j = int(np.argmin(gaps))
    if not gaps[j] <= FREQ_TOLERANCE_MHZ:
        raise ValueError(
            f"fixed-freq-mhz: {freq_mhz!r} is not in the device's frequency table "
            f"({', '.join(f'{f:g}' for f in f_list)} MHz)"
        )
    i = b_list.index(int(batch_size))
    time_s, power_w = _optional_tables(lut_time_s, lut_power_w, len(b_list), len(f_list))
    all_candidates = _candidates_at(b_list, f_list, [j] * len(b_list), time_s, power_w, r_list)
    return _selection("fixed", all_candidates[i], None, (all_candidates[i],))


def select(
    method: str,
    *,
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    lut_time_s: npt.ArrayLike | None = None,
    lut_power_w: npt.ArrayLike | None = None,
    r: Sequence[float] | None = None,
    p_max_w: float | str | None = None,
    cap_margin: float = 0.0,
    b1_freq_cap_mhz: float | None = None,
    fixed_batch_size: int | None = None,
    fixed_freq_mhz: float | None = None,
) -> Selection:
    """Dispatch to the selection ``method`` (one of ``METHODS``).

    Parameters
    ----------
    method : str
        ``power-aware`` and ``oracle`` need both tables, ``r`` (for the oracle: measured on
        the client's data) and ``p_max_w`` (pass ``math.inf`` or ``"none"`` for no cap:
        a forgotten cap is an error here, not "no cap"); ``b1`` needs ``b1_freq_cap_mhz``;
        ``b2`` needs ``r`` and ``b1_freq_cap_mhz``; ``fixed`` needs ``fixed_batch_size`` and
        ``fixed_freq_mhz``. The tables are optional for the baselines (predictions only).
    batch_sizes, freqs_mhz, lut_time_s, lut_power_w, r, p_max_w, cap_margin, b1_freq_cap_mhz
        As in the per-method functions (``cap_margin``: power-aware and oracle only).
    fixed_batch_size, fixed_freq_mhz
        The (b, f) of ``fixed``.

    Returns
    -------
    Selection

    Raises
    ------
    ValueError
        Unknown method, or a parameter the method needs is missing (named in kebab-case).
    """
    if method not in METHODS:
        raise ValueError(f"method: unknown value {method!r}; allowed: {', '.join(METHODS)}")

    def need(name: str, value: Any) -> Any:
        if value is None:
            raise ValueError(f"{name}: required by method {method!r}")
        return value

    if method in ("power-aware", "oracle"):
        eq4 = select_power_aware if method == "power-aware" else select_oracle
        return eq4(
            need("lut-time-s", lut_time_s),
            need("lut-power-w", lut_power_w),
            batch_sizes,
            freqs_mhz,
            need("r", r),
            need("p-max-w", p_max_w),
            cap_margin=cap_margin,
        )
    if method == "b1":
        cap = need("b1-freq-cap-mhz", b1_freq_cap_mhz)
        return select_b1(batch_sizes, freqs_mhz, cap, lut_time_s, lut_power_w, r=r)
    if method == "b2":
        cap = need("b1-freq-cap-mhz", b1_freq_cap_mhz)
        return select_b2(batch_sizes, freqs_mhz, need("r", r), cap, lut_time_s, lut_power_w)
    return select_fixed(
        need("fixed-batch-size", fixed_batch_size),
        need("fixed-freq-mhz", fixed_freq_mhz),
        batch_sizes,
        freqs_mhz,
        lut_time_s,
        lut_power_w,
        r=r,
    )
