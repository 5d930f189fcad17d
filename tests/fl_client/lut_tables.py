"""Synthetic LUT tables for the tests of ``fl_client.lut_fit`` and ``fl_client.lut_plan``.

They are generic DVFS shapes (a per-step overhead, compute ∝ 1/f, a static floor and dynamic
power with a voltage knee), none of them the digital twin's formula.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fl_client.power import PowerLimit

B6 = (4, 8, 16, 32, 64, 128)
F12 = tuple(round(76.8 * k, 1) for k in range(1, 13))  # 76.8 … 921.6 MHz
REPO = Path(__file__).resolve().parents[2]


def limits(caps_w: Sequence[float], cap_margin: float = 0.0) -> list[PowerLimit]:
    """Each cap with the same margin."""
    return [PowerLimit(cap, cap_margin) for cap in caps_w]


def _limit_w(cap_w: float) -> float:
    """A cap with the 5% margin the tests' plans are made with (``PowerLimit.limit_w``)."""
    return PowerLimit(cap_w, 0.05).limit_w


def synthetic(
    batch_sizes: tuple[int, ...] = B6,
    freqs: tuple[float, ...] = F12,
    *,
    knee: bool = True,
    noise: float = 0.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time per sample, peak and average power of a made-up board (not the twin's model)."""
    b = np.asarray(batch_sizes, dtype=float)[:, None]
    f = np.asarray(freqs, dtype=float)[None, :]
    phi = f / f.max()
    work = 4e-3 * (1.0 + (12.0 / b) ** 0.8)  # per-sample GPU work: small b leaves units idle
    time_s = 6e-3 / b + work * 100.0 / f
    # knee: flat, then rising to 1.0 (a kink the smooth fit cannot follow exactly)
    volt = np.where(phi < 0.5, 0.8, 0.8 + 0.4 * (phi - 0.5)) if knee else 0.8 + 0.2 * phi
    load = (b / b.max()) ** 0.35
    peak = 1.8 + 9.0 * load * phi * volt**2
    avg = 1.8 + 0.9 * (peak - 1.8)
    if noise:
        rng = np.random.default_rng(seed)
        time_s = time_s * (1 + noise * rng.standard_normal(time_s.shape))
        peak = peak * (1 + noise * rng.standard_normal(peak.shape))
        avg = np.minimum(avg * (1 + noise * rng.standard_normal(avg.shape)), peak)
    return time_s, peak, avg


def grid_measure(tables: tuple[np.ndarray, ...], log: list[tuple[int, float]] | None = None):
    time_s, peak, avg = tables

    def measure(b: int, f: float) -> tuple[float, float, float]:
        if log is not None:
            log.append((b, f))
        i, j = B6.index(b), F12.index(f)
        return float(time_s[i, j]), float(peak[i, j]), float(avg[i, j])

    return measure


Tables = tuple[np.ndarray, np.ndarray, np.ndarray]


def only(mask_cells: list[tuple[int, int]], tables: Tables) -> Tables:
    """``tables`` with NaN outside ``mask_cells`` (what was measured)."""
    mask = np.zeros(tables[0].shape, dtype=bool)
    for cell in mask_cells:
        mask[cell] = True
    t, p, a = (np.where(mask, x, np.nan) for x in tables)
    return t, p, a


R_SQRT = [(b / 128) ** 0.5 for b in B6]
CAPS = (3.0, 4.0, 6.0, math.inf)
