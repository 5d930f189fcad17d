"""LUT drift checks: measure the operating point as the profiler did, compare it with the
LUT, and re-profile the batch size's row when the board has drifted (throttling, a busy
neighbour). No Flower import.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from fl_client.cell_measure import CellOptions, MeasureContext, measure_cell
from fl_client.cell_measure import time_per_sample_s as measured_time_per_sample_s
from fl_client.devices import Measurement
from fl_client.feasibility import PEAK_SIGMA_K
from fl_client.lut import LUT, save_quietly
from fl_client.lut_cells import replace_rows, scale_cells
from fl_client.profiler import ProfileOptions, profile

log = logging.getLogger(__name__)


def knob_index(knob_values: tuple[float, ...], knob_value: float) -> int:
    """The index of the knob value in ``knob_values`` nearest ``knob_value``."""
    return min(range(len(knob_values)), key=lambda j: abs(knob_values[j] - knob_value))


@dataclass(frozen=True)
class DriftCheck:
    """One drift check at the operating point (b, f)."""

    deviation: float  # largest relative deviation of time, peak and average power
    reprofiled: bool
    lut: LUT  # the selection LUT after the check (updated if re-profiled)
    time_s: float  # device time of the check and any re-profiling
    energy_j: float


def check_drift(
    ctx: MeasureContext,
    lut: LUT,
    point: tuple[int, float],
    threshold: float,
    reprofile: ProfileOptions | None = None,
    *,
    peak_sigma_k: float = PEAK_SIGMA_K,
) -> DriftCheck:
    """Measure ``point`` = (b, f) as the profiler did and compare with the LUT; re-profile
    b's row if off.

    The prediction is the selection LUT's cell. Beyond ``threshold`` (relative, on time per
    sample, peak or average power), b's row is profiled again from the lowest frequency up
    to the LUT's cap less its margin, and replaces that row of the LUT whole
    (``lut_cells.replace_rows``: a cell the walk did not reach is beyond the cap on this board);
    the other rows are scaled by the change measured on this row (or at ``point`` where the
    row and the LUT share no cell), and the LUT is written to the cache, so the node
    re-selects from it. ``reprofile`` overrides how the row is profiled again (a shared LUT
    has no cap of its own: the node's cap is given here); otherwise the row's walk judges
    cells with ``peak_sigma_k`` (``peak-sigma-k``). The re-profiled cells bring their own σ
    of per-step peaks; the other rows' σ scale with their peaks (``lut_cells.scale_cells``).
    """
    batch_size, knob_value = point
    i = lut.batch_sizes.index(batch_size)
    j = knob_index(lut.knob_values, knob_value)
    measured, time_s, energy_j = _measure_point(ctx, lut, point)
    predicted = (
        lut.time_per_sample_s[i, j],
        lut.peak_power_w[i, j],
        lut.avg_power_w[i, j],
    )
    deviation = max(abs(x / float(p) - 1.0) for x, p in zip(measured, predicted, strict=True))
    if not deviation > threshold:
        return DriftCheck(deviation, False, lut, time_s, energy_j)
    row = _reprofile_row(ctx, lut, batch_size, reprofile, peak_sigma_k)
    ratios = [x / float(p) for x, p in zip(measured, predicted, strict=True)]
    at_point = dict(zip(_FACTORS, ratios, strict=True))
    factors = _drift_factors(lut, row, i, at_point)
    new_lut = replace_rows(scale_cells(lut, **factors), row)
    save_quietly(new_lut, new_lut.key.path(ctx.cache_dir))
    log.info(
        "drift check: b=%d f=%g %s off by %.0f%% (> %.0f%%): re-profiled that row",
        batch_size,
        knob_value,
        lut.knob.unit,
        100 * deviation,
        100 * threshold,
    )
    return DriftCheck(
        deviation,
        True,
        new_lut,
        time_s + row.profile_time_s,
        energy_j + row.profile_energy_j,
    )


def _measure_point(
    ctx: MeasureContext, lut: LUT, point: tuple[int, float]
) -> tuple[tuple[float, float, float], float, float]:
    """``point`` = (b, f) measured as the profiler measured the LUT's cells: (time per
    sample, peak, average power), and the device time and energy the measuring took."""
    batch_size, knob_value = point
    m, time_s, energy_j = measure_cell(
        ctx.device,
        ctx.workload,
        batch_size,
        ctx.step_factory(batch_size),
        knob_value,
        CellOptions(lut.warmup_steps, lut.steps),
    )
    measured = (
        measured_time_per_sample_s(m, batch_size, lut.steps),
        m.peak_power_w,
        m.avg_power_w,
    )
    return measured, time_s, energy_j


def _reprofile_row(
    ctx: MeasureContext,
    lut: LUT,
    batch_size: int,
    reprofile: ProfileOptions | None,
    peak_sigma_k: float,
) -> LUT:
    """b's row profiled again: with ``reprofile``, else under the LUT's own cap and margin
    with its steps, judging cells with ``peak_sigma_k``."""
    return profile(
        ctx.device,
        ctx.workload,
        [batch_size],
        ctx.step_factory,
        reprofile
        or ProfileOptions(
            lut.limit,
            warmup_steps=lut.warmup_steps,
            steps=lut.steps,
            progress=False,
            uncapped="full",
            peak_sigma_k=peak_sigma_k,
        ),
    )


#: The factors of ``lut_cells.scale_cells`` and the tables each is measured on
_FACTORS = {
    "time_factor": "time_per_sample_s",
    "peak_factor": "peak_power_w",
    "avg_factor": "avg_power_w",
}


def _drift_factors(known: LUT, row: LUT, i: int, at_point: dict[str, float]) -> dict[str, float]:
    """How b's re-profiled row compares with the LUT (median ratio per table).

    The other rows are scaled by this change (a uniform drift, such as throttling or a busy
    neighbour, moves every b alike) until they are measured again, so fresh and stale rows
    stay comparable for Eq. 4. Where the row shares no cell with the LUT (a fleet-shared
    LUT holds a few cells per row), the check's own cell says it (``at_point``: measured
    over predicted).
    """
    both = ~np.isnan(known.time_per_sample_s[i]) & ~np.isnan(row.time_per_sample_s[0])
    if not both.any():
        return dict(at_point)
    return {
        name: float(np.median(getattr(row, attr)[0, both] / getattr(known, attr)[i, both]))
        for name, attr in _FACTORS.items()
    }


def trained_time_deviation(
    time_per_sample_s: float, batch_size: int, m: Measurement
) -> float | None:
    """How far a trained round's device time lies outside what its LUT cell predicts, as
    a relative deviation (0 inside). The round's steps are full batches but for a last
    partial one, which costs between its share and a full step, so the prediction is a
    bracket: ``time_per_sample_s`` × the samples (every step charged per sample) to ×
    ``batch_size`` × the steps (every step charged as full). None without a measurement or
    a finite prediction."""
    if not (math.isfinite(time_per_sample_s) and time_per_sample_s > 0):
        return None
    if m.steps <= 0 or m.samples <= 0 or m.time_s <= 0:
        return None
    low_s = time_per_sample_s * m.samples
    high_s = time_per_sample_s * batch_size * m.steps
    if m.time_s > high_s:
        return m.time_s / high_s - 1.0
    if m.time_s < low_s:
        return 1.0 - m.time_s / low_s
    return 0.0
