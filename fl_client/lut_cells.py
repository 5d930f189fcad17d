"""Merging and scaling the measured cells of LUTs: a drift check's re-profiled rows, fleet-
shared slices that overlap (``fl_client.lut.LUT``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fl_client.lut import LUT
from fl_client.lut_format import CELL_TABLES, FloatArray, LUTFormatError

# --------------------------------------------------------------------------- merging


def scale_cells(lut: LUT, *, time_factor: float, peak_factor: float, avg_factor: float) -> LUT:
    """``lut`` with every measured cell scaled (an estimate of a uniform drift).

    Used after a drift check re-profiled one row: the other rows are scaled by the change
    measured on that row until they are measured again. σ of the per-step peaks scales
    with the peak (``peak_factor``): a uniform drift stretches the peaks' spread alike.
    """
    for key, factor in (
        ("time-factor", time_factor),
        ("peak-factor", peak_factor),
        ("avg-factor", avg_factor),
    ):
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"{key}: must be a finite number > 0, got {factor!r}")
    return dataclasses.replace(
        lut,
        time_per_sample_s=lut.time_per_sample_s * time_factor,
        peak_power_w=lut.peak_power_w * peak_factor,
        avg_power_w=lut.avg_power_w * avg_factor,
        peak_sigma_w=lut.peak_sigma_w * peak_factor,
    )


def cell_tables(lut: LUT) -> dict[str, FloatArray]:
    """Copies of every per-cell table of ``lut`` by field name: time per sample, peak and
    average power, σ of the per-step peaks and ``CELL_TABLES``; a cell is these taken
    together (``merge_cells``, ``replace_rows``)."""
    names = ("time_per_sample_s", "peak_power_w", "avg_power_w", "peak_sigma_w", *CELL_TABLES)
    return {name: np.array(getattr(lut, name), dtype=np.float64) for name in names}


def merge_cells(base: LUT, extra: LUT, *, overwrite: bool) -> LUT:
    """``base`` with the measured cells of ``extra`` (same device, model, frequencies).

    ``extra`` may cover only some of ``base``'s batch sizes (e.g. one re-profiled row).
    ``overwrite=False`` only fills cells ``base`` left NaN (its own measurements win);
    ``overwrite=True`` replaces every cell ``extra`` measured (fresh measurements win, as
    after a drift check). The result keeps ``base``'s cap, grid and profiling cost. A cell
    is taken whole: its time, peak and average power and the σ of its per-step peaks
    (NaN, not recorded, where ``extra`` has none).

    Raises
    ------
    LUTFormatError
        When the two tables are not of the same device, backend, workload and knob
        values, or ``extra`` has a batch size ``base`` lacks.
    """
    for name in ("device_kind", "backend", "model_name", "input_shape", "knob_values", "knob"):
        if getattr(base, name) != getattr(extra, name):
            key = base.knob.values_key if name == "knob_values" else name.replace("_", "-")
            raise LUTFormatError(
                f"{key}: cannot merge LUTs of {getattr(base, name)!r} and {getattr(extra, name)!r}"
            )
    unknown = sorted(set(extra.batch_sizes) - set(base.batch_sizes))
    if unknown:
        raise LUTFormatError(f"batch-sizes: {unknown} are not rows of the base LUT")
    tables: dict[str, Any] = cell_tables(base)  # splatted into dataclasses.replace
    for i_extra, b in enumerate(extra.batch_sizes):
        i = base.batch_sizes.index(b)
        measured = ~np.isnan(extra.time_per_sample_s[i_extra])
        take = measured if overwrite else measured & np.isnan(tables["time_per_sample_s"][i])
        for name, table in tables.items():
            table[i, take] = getattr(extra, name)[i_extra, take]
    return dataclasses.replace(base, **tables)


def replace_rows(base: LUT, rows: LUT) -> LUT:
    """``base`` with each row of ``rows`` replaced whole: a cell ``rows`` did not measure is
    NaN there, whatever ``base`` held (``merge_cells`` otherwise).

    After a drift check re-profiled a row, a cell of that row the walk did not reach lies
    beyond the cap on this board; the stale value would still offer it to the selector.
    """
    tables: dict[str, Any] = cell_tables(base)  # splatted into dataclasses.replace
    for b in rows.batch_sizes:
        if b in base.batch_sizes:
            for table in tables.values():
                table[base.batch_sizes.index(b)] = np.nan
    return merge_cells(dataclasses.replace(base, **tables), rows, overwrite=True)


def median_cell(
    measurements: Sequence[Sequence[float]],
) -> tuple[float, float, float, float]:
    """One cell from several measurements of it (fleet-shared slices that overlap).

    Each measurement is ``(time per sample, peak, average power[, σ of per-step peaks])``.
    Time, peak and average power are the medians of their own; σ is the one recorded with
    the measurement whose peak is nearest the median peak (the larger σ of two as near),
    so the cell keeps a σ that was measured with a peak like the one it reports. NaN σ:
    not recorded.
    """
    if not measurements:
        raise ValueError("measurements: need at least one (time, peak, avg[, σ]) of the cell")
    rows = np.array(
        [[*m[:3], m[3] if len(m) > 3 else math.nan] for m in measurements], dtype=np.float64
    )
    time_s, peak_w, avg_w = (float(np.median(rows[:, k])) for k in range(3))
    gap = np.abs(rows[:, 1] - peak_w)
    nearest = rows[gap <= gap.min(), 3]
    sigma_w = float(np.nanmax(nearest)) if np.isfinite(nearest).any() else math.nan
    return time_s, peak_w, avg_w, sigma_w
