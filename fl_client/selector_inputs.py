"""The checks of a selection's inputs: batch sizes, r, the knob's values and the tables.

Each raises a ValueError naming the key and what is allowed. NumPy only.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


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
    if type(batch_sizes) is list and batch_sizes and _ascending_above_zero(batch_sizes, int):
        return list(batch_sizes)  # the common case, without the checks below
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


def _ascending_above_zero(values: list[Any], kind: type) -> bool:
    """0 < v0 < v1 < ... < inf, each of exactly ``kind`` (NaN fails every comparison)."""
    prev: Any = 0
    for v in values:
        if type(v) is not kind or not prev < v:
            return False
        prev = v
    return prev < math.inf


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
    return validate_r_for(r, b)


def validate_r_for(r: Sequence[object], b: list[int]) -> list[float]:
    """``validate_r`` against batch sizes that are already validated."""
    if isinstance(r, np.ndarray):
        r = r.tolist()
    if type(r) is not list and (isinstance(r, (str, bytes)) or not isinstance(r, Sequence)):
        raise ValueError(f"r: must be a list of numbers in (0, 1], one per batch size; got {r!r}")
    if len(r) != len(b):
        raise ValueError(
            f"r: has {len(r)} values but batch-sizes has {len(b)} ({b}); "
            "r must give one value in (0, 1] per batch size"
        )
    out = [float(x) if isinstance(x, float) else math.nan for x in r]  # the common case
    for v in out:
        if not 0 < v <= 1:
            break
    else:
        return out
    for bi, x in zip(b, r, strict=True):
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not 0 < float(x) <= 1:
            raise ValueError(f"r: value {x!r} for batch size {bi} is not in (0, 1]")
    return [float(x) for x in r]  # type: ignore[arg-type]  # each checked to be Real


def validate_knob_values(knob_values: Sequence[object]) -> list[float]:
    """Check the knob's values (MHz, or W for a power limit): non-empty, finite, > 0,
    strictly ascending.

    Raises
    ------
    ValueError
        Naming ``freqs-mhz`` and what is allowed.
    """
    allowed = "a non-empty, strictly ascending list of positive values (MHz, or W)"
    try:
        out = [float(f) for f in knob_values]  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"freqs-mhz: must be {allowed}; got {knob_values!r}") from None
    # The common case: 0 < f0 < f1 < ... < inf (NaN fails every comparison).
    if out and _ascending_above_zero(out, float):
        return out
    if not out or not all(math.isfinite(f) and f > 0 for f in out):
        raise ValueError(f"freqs-mhz: must be {allowed}; got {knob_values!r}")
    raise ValueError(f"freqs-mhz: {out} is not strictly ascending; must be {allowed}")


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
    not_profiled = np.isnan(time_s)
    if np.count_nonzero(not_profiled ^ np.isnan(power_w)):
        raise ValueError("lut_time_s and lut_power_w: NaN (not profiled) at different cells")
    if np.count_nonzero(not_profiled) == not_profiled.size:
        raise ValueError("lut_time_s / lut_power_w: no cell was profiled")
    # NaN compares False: only profiled cells can fail these.
    if np.count_nonzero(time_s <= 0) or np.count_nonzero(np.isinf(time_s)):
        raise ValueError("lut_time_s: profiled cells must be finite and > 0 seconds per sample")
    if np.count_nonzero(power_w < 0) or np.count_nonzero(np.isinf(power_w)):
        raise ValueError("lut_power_w: profiled cells must be finite and ≥ 0 W")
    return time_s, power_w


def validate_aux_table(
    name: str, table: npt.ArrayLike, not_profiled: BoolArray, *, nan_in_profiled: bool
) -> FloatArray:
    """An optional table beside LUT_time: same shape, finite ≥ 0 W in profiled cells.

    NaN in a profiled cell is allowed only where ``nan_in_profiled`` (σ: not recorded).
    """
    out = np.asarray(table, dtype=np.float64)
    if out.shape != not_profiled.shape:
        raise ValueError(
            f"{name}: shape {out.shape} does not match |batch-sizes| × |freqs-mhz| = "
            f"{not_profiled.shape}"
        )
    # NaN compares False, and isfinite is False for NaN and ±inf: one check each
    bad = np.count_nonzero(out < 0) or (
        np.count_nonzero(out == math.inf)
        if nan_in_profiled
        else np.count_nonzero(np.isfinite(out) == not_profiled)
    )
    if not bad:
        return out
    if np.isinf(out).any() or (out < 0).any():
        raise ValueError(f"{name}: profiled cells must be finite and ≥ 0 W")
    raise ValueError(f"{name}: NaN (not profiled) at different cells than lut_time_s")
