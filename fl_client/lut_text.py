"""The device tools' tables as text: a LUT (``powerfl profile``: time, peak and average
power per cell, how each cell was measured) and a choice with its candidates (``powerfl
select``), each knob named in its unit and each cap with its margin."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from fl_client.contract import Cap
from fl_client.devices.base import GPU_FREQ_MHZ, Knob
from fl_client.feasibility import PEAK_SIGMA_K


def knob_symbol(knob: Knob) -> str:
    """How the knob is written in the tables and the choice: ``f`` for the GPU frequency,
    else its label without "GPU " (``power limit``)."""
    return "f" if knob == GPU_FREQ_MHZ else knob.label.removeprefix("GPU ")


def cap_text(cap: Cap, cap_margin: float) -> str:
    """``"P_max 5 W"`` or ``"P_max 5 W less cap-margin 5% (4.75 W)"``."""
    text = f"P_max {cap.label}"
    if cap.capped and cap_margin > 0:
        text += (
            f" less cap-margin {100 * cap_margin:g}% ({cap.with_margin(cap_margin).limit_w:.4g} W)"
        )
    return text


def format_lut(lut: Any, p_max_w: float | None = None, peak_sigma_k: float = PEAK_SIGMA_K) -> str:
    """The tables of a LUT as text: rows = batch sizes, columns = the knob's values (in
    ``lut.knob.unit``: MHz, or W for a power limit).

    Cells not profiled (efficient mode) show ``-``; cells that are not feasible by the
    selector's rule (peak + ``peak_sigma_k``·σ of the per-step peaks) against what
    efficient mode compared them with (the LUT's cap less its cap margin), or against
    ``p_max_w`` when given, are marked ``*`` in the peak power table. σ is printed when the
    LUT recorded it.
    """
    import numpy as np

    from fl_client.feasibility import feasible_cells

    cap = p_max_w if p_max_w is not None else (lut.limit.limit_w if lut.limit.capped else None)
    sigma_w = lut.peak_sigma_w
    has_sigma = bool(np.isfinite(sigma_w).any())
    infeasible = ~feasible_cells(lut.peak_power_w, cap, peak_sigma_w=sigma_w,
                                 peak_sigma_k=peak_sigma_k)  # fmt: skip
    heads = [f"{f:g}" for f in lut.knob_values]
    width = max(8, *(len(h) + 1 for h in heads))

    corner = f"b \\ {lut.knob.unit}"

    def block(title: str, table: Any, fmt: Callable[[float], str], mark: bool) -> list[str]:
        lines = [title, f"{corner:>8}" + "".join(f"{h:>{width}}" for h in heads)]
        for i, b in enumerate(lut.batch_sizes):
            cells = []
            for j in range(len(lut.knob_values)):
                x = float(table[i, j])
                text = "-" if math.isnan(x) else fmt(x)
                if mark and cap is not None and not math.isnan(x) and infeasible[i, j]:
                    text += "*"
                cells.append(f"{text:>{width}}")
            lines.append(f"{b:>8}" + "".join(cells))
        return lines

    lut_cap = Cap.parse(lut.limit.cap_w)
    under = cap_text(lut_cap, lut.limit.cap_margin)
    mode = "full grid" if not lut_cap.capped else f"efficient mode for {under}"
    if lut.grid in ("highest", "on-demand"):
        mode = {"highest": "no cap, highest frequency per b", "on-demand": "cells on demand"}[
            lut.grid
        ]
    windows = np.isfinite(lut.window_s).any()
    at_least = "≥ " if windows else ""
    lines = [
        f"LUT {lut.device_kind} ({lut.backend}) {lut.workload_key}: {mode}, "
        f"{lut.cells_profiled} cells, {lut.warmup_steps} warm-up + {at_least}{lut.steps} steps "
        f"per cell, profiling took {lut.profile_time_s:.1f} s and {lut.profile_energy_j:.1f} J",
        "",
    ]
    lines += block("time per sample (ms)", lut.time_per_sample_s, lambda x: f"{1e3 * x:.4g}", False)
    lines.append("")
    robust = f"peak + {peak_sigma_k:g}·σ " if has_sigma and peak_sigma_k > 0 else ""
    if cap is None:
        mark_title = ""
    elif p_max_w is not None:
        mark_title = f"; * = {robust}not below P_max {Cap.parse(p_max_w).label}"
    else:
        mark_title = f"; * = {robust}not below {under}"
    lines += block("peak power (W)" + mark_title, lut.peak_power_w, lambda x: f"{x:.2f}", True)
    lines.append("")
    lines += block("average power (W)", lut.avg_power_w, lambda x: f"{x:.2f}", False)
    if has_sigma:
        lines.append("")
        title = "σ of the per-step peak power (W; - = not profiled or not recorded)"
        lines += block(title, sigma_w, lambda x: f"{x:.3f}", False)
    return "\n".join(lines + _cell_window_lines(lut, block))


def _cell_window_lines(lut: Any, block: Callable[..., list[str]]) -> list[str]:
    """How each cell was measured (power samples, window, settled, the real board's
    window), where the LUT recorded it, and the profiling time the board's windows imply."""
    import numpy as np

    lines: list[str] = []
    if np.isfinite(lut.power_samples).any():
        lines += [
            "",
            *block("power samples per cell", lut.power_samples, lambda x: f"{x:.0f}", False),
        ]
    if np.isfinite(lut.window_s).any():
        unsettled = lut.settled == 0
        title = "measured window per cell (s)"
        if unsettled.any():
            title += f"; ~ = unsettled: stopped at the cap ({int(unsettled.sum())} cells)"
        marked = np.where(unsettled, -1.0 - np.asarray(lut.window_s), lut.window_s)
        lines += [
            "",
            *block(title, marked, lambda x: f"{-1 - x:.3g}~" if x < 0 else f"{x:.3g}", False),
        ]
    if np.isfinite(lut.needed_window_s).any():
        title = "window the real board's power sensor would need per cell (s)"
        lines += ["", *block(title, lut.needed_window_s, lambda x: f"{x:.3g}", False)]
    board_s = lut.board_profile_time_s
    if board_s is not None:
        lines += [
            "",
            f"on the real board, profiling these cells would take about {board_s:.1f} s "
            f"(sensor windows; {lut.backend} took {lut.profile_time_s:.1f} s, report only)",
        ]
    return lines


def format_selection(
    selection: Any,
    r: Sequence[float],
    *,
    b1_max_knob_value: float | None = None,
    cap_margin: float = 0.0,
) -> str:
    """The choice and the candidate set (Eq. 4's C) as text; the knob named in its unit
    (``f* = 921.6 MHz``, ``power limit* = 250 W``)."""
    knob = getattr(selection, "knob", GPU_FREQ_MHZ)
    symbol, unit = knob_symbol(knob), knob.unit
    if selection.method in ("power-aware", "oracle"):
        under = f" under {cap_text(Cap.parse(selection.p_max_w), cap_margin)}"
    elif b1_max_knob_value is not None:
        under = f" at the fixed frequency cap {b1_max_knob_value:g} {unit}"
    else:
        under = ""
    head = f"{symbol} {unit}"
    lines = [
        f"{selection.method}: b* = {selection.batch_size}, {symbol}* = "
        f"{selection.knob_value:g} {unit}{under}; predicted "
        f"{1e3 * selection.time_per_sample_s:.4g} ms/sample, peak {selection.peak_power_w:.2f} W",
        "",
        f"{'':2}{'b':>6} {head:>9} {'ms/sample':>10} {'peak W':>8} {'r':>7} {'score':>10}",
    ]
    r_by_b = dict(zip([c.batch_size for c in selection.candidates], r, strict=False))
    for c in selection.candidates:
        chosen = "*" if c.batch_size == selection.batch_size else " "
        f = "-" if c.knob_value is None else f"{c.knob_value:g}"
        t = "-" if math.isnan(c.time_per_sample_s) else f"{1e3 * c.time_per_sample_s:.4g}"
        pw = "-" if math.isnan(c.peak_power_w) else f"{c.peak_power_w:.2f}"
        rb = r_by_b.get(c.batch_size)
        rs = "-" if rb is None else f"{rb:.3g}"
        sc = "-" if math.isnan(c.score) else f"{1e3 * c.score:.4g}"
        lines.append(f"{chosen:2}{c.batch_size:>6} {f:>9} {t:>10} {pw:>8} {rs:>7} {sc:>10}")
    lines.append("")
    lines.append("score = ms/sample × r_b (smaller trains to accuracy sooner); * = chosen")
    return "\n".join(lines)
