"""The values of a choice of (batch size, GPU knob): the tables it reads (``Tables``), the
choice with what the tables predict for it (``Selection``, one ``Candidate`` per batch size),
and the error of a cap no profiled cell meets (``InfeasibleCapError``). NumPy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy.typing as npt

from fl_client.devices.base import GPU_FREQ_MHZ, Knob
from fl_client.power import PowerLimit


class InfeasibleCapError(ValueError):
    """No profiled (b, f) runs below P_max.

    Attributes
    ----------
    limit : PowerLimit
        The cap with its margin that could not be met (``limit.cap_margin``: the share of
        P_max kept free; 0 for the bare cap).
    min_power_w : float
        The lowest robust peak power in the table (peak + ``peak-sigma-k``·σ; the profiled
        peak where no σ was recorded).
    batch_size : int
        Batch size of the cell where ``min_power_w`` was measured.
    knob_value : float
        Knob value of that cell (MHz for the GPU frequency).
    sigma_term_w : float
        The k·σ part of ``min_power_w``.
    knob : Knob
        What ``knob_value`` is.
    """

    def __init__(
        self,
        limit: PowerLimit,
        min_power_w: float,
        batch_size: int,
        knob_value: float,
        sigma_term_w: float = 0.0,
        knob: Knob = GPU_FREQ_MHZ,
    ):
        self.limit = limit
        self.min_power_w = min_power_w
        self.batch_size = batch_size
        self.knob_value = knob_value
        self.sigma_term_w = sigma_term_w
        self.knob = knob
        margin = limit.cap_margin
        cap = f"P_max = {limit.p_max_w:g} W"
        fix = f"Raise p-max-w above {min_power_w:.3f} W"
        if margin > 0:
            cap += f" less cap-margin {100 * margin:g}% ({limit.limit_w:.3f} W)"
            fix = f"Raise p-max-w above {min_power_w / (1 - margin):.3f} W, lower cap-margin"
        lowest = f"the lowest measured peak power is {min_power_w:.3f} W"
        if sigma_term_w > 0:
            lowest = (
                f"the lowest peak power with its uncertainty (peak + peak-sigma-k·σ) is "
                f"{min_power_w:.3f} W, of which {sigma_term_w:.3f} W is k·σ"
            )
            fix += ", lower peak-sigma-k"
        super().__init__(
            f"p-max-w: no (batch size, {knob.label}) runs below {cap}; {lowest} "
            f"(b={batch_size}, f={knob_value:g} {knob.unit}). {fix} or add smaller batch "
            f"sizes / lower {knob.label} values."
        )


class Candidate(NamedTuple):
    """One row of the candidate set C: a batch size and the knob value it would run at.

    ``knob_value`` is None when no profiled cell of this b is feasible; the predictions are
    NaN when there is no such cell or no profiled cell to predict from.
    ``energy_per_sample_j`` is the energy basis of the tie-break (average power × time per
    sample, or peak power × time without an average-power table); NaN for the baselines.
    An immutable record (a NamedTuple: a selection builds one per b on every call).
    """

    batch_size: int
    knob_value: float | None
    time_per_sample_s: float
    peak_power_w: float
    score: float
    energy_per_sample_j: float = math.nan


@dataclass(frozen=True)
class Selection:
    """The chosen (b*, f*) with what the tables predict for it.

    Attributes
    ----------
    method : str
        One of ``METHODS``.
    batch_size : int
        b*.
    knob_value : float
        f*, a value of the knob's table (MHz for the GPU frequency; see ``knob``).
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
        Per b, the knob value the method would use with it and the predictions there, in
        the order of ``batch_sizes`` (Eq. 4's C for power-aware and oracle).
    energy_per_sample_j : float
        Predicted energy per sample at (b*, f*) (see ``Candidate``); NaN for the baselines.
    knob : Knob
        What ``knob_value`` is: ``GPU_FREQ_MHZ`` unless the tables' knob is another.
    """

    method: str
    batch_size: int
    knob_value: float
    time_per_sample_s: float
    peak_power_w: float
    score: float
    p_max_w: float | None
    candidates: tuple[Candidate, ...]
    energy_per_sample_j: float = math.nan
    knob: Knob = GPU_FREQ_MHZ

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case, JSON-ready summary (NaN becomes None) for reports and messages.

        The chosen knob value is under ``knob.config_key`` (``gpu-freq-mhz`` by default).
        """
        key = self.knob.config_key
        return {
            "method": self.method,
            "batch-size": self.batch_size,
            key: self.knob_value,
            "knob-unit": self.knob.unit,
            "predicted-time-per-sample-s": _none_if_nan(self.time_per_sample_s),
            "predicted-peak-power-w": _none_if_nan(self.peak_power_w),
            "predicted-energy-per-sample-j": _none_if_nan(self.energy_per_sample_j),
            "predicted-score": _none_if_nan(self.score),
            "p-max-w": self.p_max_w,
            "candidates": [
                {
                    "batch-size": c.batch_size,
                    key: c.knob_value,
                    "time-per-sample-s": _none_if_nan(c.time_per_sample_s),
                    "peak-power-w": _none_if_nan(c.peak_power_w),
                    "energy-per-sample-j": _none_if_nan(c.energy_per_sample_j),
                    "score": _none_if_nan(c.score),
                }
                for c in self.candidates
            ],
        }


@dataclass(frozen=True, eq=False)
class Tables:
    """The profiled tables Eq. 4 reads, |B| × |F| each (rows: batch sizes, columns: knob).

    Attributes
    ----------
    time_s : array_like
        Time per training sample in s (LUT_time); NaN where not profiled.
    peak_w : array_like
        Peak power in W (LUT_power); NaN exactly where ``time_s`` is.
    avg_w : array_like, optional
        Average power in W (energy / time), same NaN cells; when given, the tie-break's
        energy is average power × time, otherwise peak power × time.
    peak_sigma_w : array_like, optional
        Standard deviation of the per-step peak powers of each cell in W; None, or NaN in
        a cell, counts as 0 (no uncertainty recorded).
    knob : Knob
        What the columns are; ``GPU_FREQ_MHZ`` by default.
    """

    time_s: npt.ArrayLike
    peak_w: npt.ArrayLike
    avg_w: npt.ArrayLike | None = None
    peak_sigma_w: npt.ArrayLike | None = None
    knob: Knob = GPU_FREQ_MHZ


def _none_if_nan(x: float) -> float | None:
    return None if math.isnan(x) else x


def selection_of(
    method: str,
    chosen: Candidate,
    p_max_w: float | None,
    candidates: tuple[Candidate, ...],
    knob: Knob = GPU_FREQ_MHZ,
) -> Selection:
    b, f, t, p, score, energy = chosen
    assert f is not None
    return Selection(method, b, f, t, p, score, p_max_w, candidates, energy, knob)
