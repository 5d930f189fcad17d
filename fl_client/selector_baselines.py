"""The baselines of the power-aware choice: B1 (the largest b at a fixed safe frequency),
B2 (the b of least proxy r at that frequency) and a fixed (b, f). NumPy only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from fl_client.devices.base import FREQ_TOLERANCE_MHZ
from fl_client.selection import Candidate, Selection, Tables, selection_of
from fl_client.selector_inputs import (
    validate_batch_sizes,
    validate_knob_values,
    validate_r,
    validate_tables,
)

FloatArray = npt.NDArray[np.float64]


class _Grid(NamedTuple):
    """A baseline's validated inputs: the axes, r (None: no score) and the optional tables."""

    b: list[int]
    f: list[float]
    r: list[float] | None
    time_s: FloatArray | None
    power_w: FloatArray | None

    def candidates_at(self, j: int) -> tuple[Candidate, ...]:
        """Each b at column ``j`` with what the tables predict there (energy not predicted)."""
        out = []
        for i, b in enumerate(self.b):
            t = math.nan if self.time_s is None else float(self.time_s[i, j])
            p = math.nan if self.power_w is None else float(self.power_w[i, j])
            score = t * self.r[i] if self.r is not None else math.nan
            out.append(Candidate(b, self.f[j], t, p, score))
        return tuple(out)


def _grid(
    b_list: list[int], f_list: list[float], r_list: list[float] | None, tables: Tables | None
) -> _Grid:
    if tables is None:
        return _Grid(b_list, f_list, r_list, None, None)
    time_s, power_w = validate_tables(tables.time_s, tables.peak_w, len(b_list), len(f_list))
    return _Grid(b_list, f_list, r_list, time_s, power_w)


def _table_freq_at_or_below(knob_values: Sequence[float], max_mhz: float, key: str) -> int:
    """Index of the highest table frequency ≤ ``max_mhz`` (within FREQ_TOLERANCE_MHZ)."""
    if isinstance(max_mhz, bool) or not isinstance(max_mhz, numbers.Real):
        raise ValueError(f"{key}: must be a frequency in MHz; got {max_mhz!r}")
    f_max = float(max_mhz)
    if math.isnan(f_max) or f_max <= 0:
        raise ValueError(f"{key}: must be a frequency in MHz > 0; got {max_mhz!r}")
    j = int(np.searchsorted(np.asarray(knob_values), f_max + FREQ_TOLERANCE_MHZ, side="right")) - 1
    if j < 0:
        raise ValueError(
            f"{key}: {f_max:g} MHz is below the lowest table frequency {knob_values[0]:g} MHz"
        )
    return j


def _select_at_fixed_freq(
    method: str,
    batch_index: int,
    inputs: tuple[list[int], Sequence[float], list[float] | None],
    b1_max_knob_value: float,
    tables: Tables | None,
) -> Selection:
    """B1/B2: every b runs at the highest table frequency at or below the fixed maximum frequency.
    ``inputs``: the validated batch sizes, the frequency table and r (None: no score)."""
    b_list, knob_values, r_list = inputs
    f_list = validate_knob_values(knob_values)
    j = _table_freq_at_or_below(f_list, b1_max_knob_value, "b1-freq-cap-mhz")
    candidates = _grid(b_list, f_list, r_list, tables).candidates_at(j)
    return selection_of(method, candidates[batch_index], None, candidates)


def select_b1(
    batch_sizes: Sequence[int],
    knob_values: Sequence[float],
    b1_max_knob_value: float,
    tables: Tables | None = None,
    *,
    r: Sequence[float] | None = None,
) -> Selection:
    """Baseline 1 (state of practice): the largest b at a fixed, model-agnostic safe frequency.

    Parameters
    ----------
    batch_sizes : sequence of int
        B; pass only the batch sizes that fit in the device's memory — the largest is used.
    knob_values : sequence of float
        The device's frequency table in MHz, ascending.
    b1_max_knob_value : float
        The device's fixed safe frequency for the P_max band (Nano: 307 / 614 / 921.6 MHz
        for 4.5 W / 7 W / no cap); the highest table frequency ≤ it (within
        ``FREQ_TOLERANCE_MHZ``) is used.
    tables : Tables, optional
        The profiled tables (time and peak power); when given, the predictions are read
        from them (NaN where the cell was not profiled). Not needed for the choice itself.
    r : sequence of float, optional
        When given, the prediction's score is time per sample × r_b.

    Returns
    -------
    Selection
        With ``method="b1"``; ``p_max_w`` is None (B1 does not look at the cap).
    """
    b_list = validate_batch_sizes(batch_sizes)
    r_list = None if r is None else validate_r(r, b_list)
    return _select_at_fixed_freq(
        "b1", len(b_list) - 1, (b_list, knob_values, r_list), b1_max_knob_value, tables
    )


def select_b2(
    batch_sizes: Sequence[int],
    knob_values: Sequence[float],
    r: Sequence[float],
    b1_max_knob_value: float,
    tables: Tables | None = None,
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
    return _select_at_fixed_freq(
        "b2", best, (b_list, knob_values, r_list), b1_max_knob_value, tables
    )


def select_fixed(
    batch_size: int,
    knob_value: float,
    batch_sizes: Sequence[int],
    knob_values: Sequence[float],
    tables: Tables | None = None,
    *,
    r: Sequence[float] | None = None,
) -> Selection:
    """A given (b, f), checked to be in B and in the frequency table.

    Parameters
    ----------
    batch_size : int
        ``fixed-batch-size``; must be one of ``batch_sizes``.
    knob_value : float
        ``fixed-freq-mhz``; must match a table frequency within ``FREQ_TOLERANCE_MHZ`` (the
        table's value is used).
    batch_sizes, knob_values, tables, r
        As in ``select_b1``.

    Returns
    -------
    Selection
        With ``method="fixed"``; only the chosen b appears in ``candidates``.
    """
    b_list = validate_batch_sizes(batch_sizes)
    f_list = validate_knob_values(knob_values)
    r_list = None if r is None else validate_r(r, b_list)
    if isinstance(batch_size, bool) or batch_size not in b_list:
        raise ValueError(f"fixed-batch-size: {batch_size!r} is not one of batch-sizes {b_list}")
    if isinstance(knob_value, bool) or not isinstance(knob_value, numbers.Real):
        raise ValueError(f"fixed-freq-mhz: must be a number (the knob's value); got {knob_value!r}")
    gaps = np.abs(np.asarray(f_list) - float(knob_value))
    j = int(np.argmin(gaps))
    if not gaps[j] <= FREQ_TOLERANCE_MHZ:
        raise ValueError(
            f"fixed-freq-mhz: {knob_value!r} is not one of the device's knob values "
            f"({', '.join(f'{f:g}' for f in f_list)}: MHz, or W under the power-limit knob)"
        )
    i = b_list.index(int(batch_size))
    chosen = _grid(b_list, f_list, r_list, tables).candidates_at(j)[i]
    return selection_of("fixed", chosen, None, (chosen,))
