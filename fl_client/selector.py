"""Choosing (batch size, GPU knob) under a power cap: Eq. 4 of the paper and its baselines.

Pure functions over the lookup tables the profiler measures (``fl_client.profiler``):
``lut_time_s[i, j]`` is the time per training sample and ``lut_power_w[i, j]`` the peak power
at batch size ``batch_sizes[i]`` and knob value ``freqs_mhz[j]``; NaN marks a cell that was
not profiled (efficient mode). Optional tables: average power (energy tie-break) and σ of the
per-step peaks (feasibility margin). The knob is the GPU frequency in MHz unless the tables
say otherwise (``Knob``: e.g. a GPU power limit in W, as NVML GPUs and Zeus traces have); the
parameter keeps its ``freqs_mhz`` name for the frequency case. NumPy only: no torch, no
Flower.

Methods (``METHODS``):

* ``power-aware`` — Eq. 4 on measured, noisy tables (``select_eq4``): every cell whose own
  robust peak (peak + ``peak-sigma-k``·σ) is below P_max less ``cap-margin`` is feasible;
  the choice is the least time per sample × r_b over all feasible cells, and among the cells
  within ``tie-tolerance`` of that, the least energy (r from the server's proxy).
* ``oracle`` — the same with r measured on the client's own data (the paper's "fastest
  configuration").
* ``b1`` — largest b, highest table frequency at or below the device's fixed safe cap.
* ``b2`` — b with the smallest proxy r, same fixed frequency cap as B1.
* ``fixed`` — a given (b, f), checked against the tables' axes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import numpy as np
import numpy.typing as npt

from fl_client.devices.base import (  # the knob a table is indexed by
    FREQ_TOLERANCE_MHZ,
    GPU_FREQ_MHZ,
    Knob,
)
from fl_client.power import PowerLimit  # the cap with its margin, what feasibility judges

if TYPE_CHECKING:  # typing.Unpack is 3.11+; only the type checker needs it
    from typing_extensions import Unpack

METHODS = ("power-aware", "b1", "b2", "oracle", "fixed")

#: Default ``peak-sigma-k``: a cell's robust peak is its profiled peak + k·σ of its per-step
#: peaks. The profiled peak is the largest of a few steps (≈ mean + 0.85σ for 3 steps);
#: + 2σ puts the estimate near mean + 3σ, about the largest per-step peak expected over the
#: ~1000 steps of a local training (≈ mean + 3.2σ for normal noise).
PEAK_SIGMA_K = 2.0
#: Default ``tie-tolerance``: scores (time × r) within 2% of the best are treated as equal,
#: the noise level of a time per sample profiled from a few steps.
TIE_TOLERANCE = 0.02

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class InfeasibleCapError(ValueError):
    """No profiled (b, f) runs below P_max.

    Attributes
    ----------
    p_max_w : float
        The cap that could not be met.
    min_power_w : float
        The lowest robust peak power in the table (peak + ``peak-sigma-k``·σ; the profiled
        peak where no σ was recorded).
    batch_size : int
        Batch size of the cell where ``min_power_w`` was measured.
    freq_mhz : float
        Knob value of that cell (MHz for the GPU frequency).
    cap_margin : float
        The share of P_max that was kept free (``PowerLimit.cap_margin``); 0 for the bare cap.
    sigma_term_w : float
        The k·σ part of ``min_power_w``.
    knob : Knob
        What ``freq_mhz`` is.
    """

    def __init__(
        self,
        p_max_w: float,
        min_power_w: float,
        batch_size: int,
        freq_mhz: float,
        cap_margin: float = 0.0,
        sigma_term_w: float = 0.0,
        knob: Knob = GPU_FREQ_MHZ,
    ):
        self.p_max_w = p_max_w
        self.min_power_w = min_power_w
        self.batch_size = batch_size
        self.freq_mhz = freq_mhz
        self.cap_margin = cap_margin
        self.sigma_term_w = sigma_term_w
        self.knob = knob
        limit = f"P_max = {p_max_w:g} W"
        fix = f"Raise p-max-w above {min_power_w:.3f} W"
        if cap_margin > 0:
            limit += (
                f" less cap-margin {100 * cap_margin:g}% "
                f"({PowerLimit(p_max_w, cap_margin).limit_w:.3f} W)"
            )
            fix = f"Raise p-max-w above {min_power_w / (1 - cap_margin):.3f} W, lower cap-margin"
        lowest = f"the lowest measured peak power is {min_power_w:.3f} W"
        if sigma_term_w > 0:
            lowest = (
                f"the lowest peak power with its uncertainty (peak + peak-sigma-k·σ) is "
                f"{min_power_w:.3f} W, of which {sigma_term_w:.3f} W is k·σ"
            )
            fix += ", lower peak-sigma-k"
        super().__init__(
            f"p-max-w: no (batch size, {knob.label}) runs below {limit}; {lowest} "
            f"(b={batch_size}, f={freq_mhz:g} {knob.unit}). {fix} or add smaller batch "
            f"sizes / lower {knob.label} values."
        )


class Candidate(NamedTuple):
    """One row of the candidate set C: a batch size and the knob value it would run at.

    ``freq_mhz`` is None when no profiled cell of this b is feasible; the predictions are
    NaN when there is no such cell or no profiled cell to predict from.
    ``energy_per_sample_j`` is the energy basis of the tie-break (average power × time per
    sample, or peak power × time without an average-power table); NaN for the baselines.
    An immutable record (a NamedTuple: a selection builds one per b on every call).
    """

    batch_size: int
    freq_mhz: float | None
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
    freq_mhz : float
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
        What ``freq_mhz`` is: ``GPU_FREQ_MHZ`` unless the tables' knob is another.
    """

    method: str
    batch_size: int
    freq_mhz: float
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
            key: self.freq_mhz,
            "knob-unit": self.knob.unit,
            "predicted-time-per-sample-s": _none_if_nan(self.time_per_sample_s),
            "predicted-peak-power-w": _none_if_nan(self.peak_power_w),
            "predicted-energy-per-sample-j": _none_if_nan(self.energy_per_sample_j),
            "predicted-score": _none_if_nan(self.score),
            "p-max-w": self.p_max_w,
            "candidates": [
                {
                    "batch-size": c.batch_size,
                    key: c.freq_mhz,
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


def _weight(key: str, w: object) -> None:
    if isinstance(w, bool) or not isinstance(w, numbers.Real) or not 0.0 <= float(w) <= 1.0:
        raise ValueError(f"{key}: must be a number in [0, 1]; got {w!r}")


@dataclass(frozen=True)
class Objective:
    """What a choice minimises and how it judges noisy tables: the one objective the node's
    choice (``select_eq4``), the server's forecast of the pace-setter's cell
    (``strategies.round_plan.best_round_time_s``) and fitted profiling's planning
    (``lut_fit``) all call.

    The default is Eq. 4: the least time per sample × r_b.

    Attributes
    ----------
    time_weight, r_weight : float
        The exponents of time per sample and of r_b, each in [0, 1] (default 1): time 0
        and energy 0 choose the most sample-efficient cell (least r_b); r 0 the fastest
        cell, whatever its r (the node that sets the pace).
    energy_weight : float
        w in [0, 1]: the score is time^t_w × r_b^r_w × P^w, P the cell's energy basis
        (average power where known). With the default weights (time and r 1, energy 0) it
        is Eq. 4 (time to accuracy); energy 1 makes it energy to accuracy.
    idle_power_w : float
        The board's idle power (default 0), taken off each cell's power under an energy
        weight: a node that finishes early waits at idle power until the round ends, so
        over a round of fixed length its cell changes only the energy above idle,
        (P − P_idle)·t (docs/method.md, "The round plan").
    tie_tolerance : float
        ``tie-tolerance`` in [0, 1): scores within this share of the best count as ties,
        broken by the least energy to accuracy (default ``TIE_TOLERANCE``); 0 is the exact
        minimum.
    peak_sigma_k : float
        ``peak-sigma-k`` ≥ 0: a cell is feasible when its peak + k·σ of its per-step peaks
        is below the cap (default ``PEAK_SIGMA_K``); 0 judges the profiled peak alone.
    """

    time_weight: float = 1.0
    r_weight: float = 1.0
    energy_weight: float = 0.0
    idle_power_w: float = 0.0
    tie_tolerance: float = TIE_TOLERANCE
    peak_sigma_k: float = PEAK_SIGMA_K

    def __post_init__(self) -> None:
        _weight("energy-weight", self.energy_weight)
        _weight("time-weight", self.time_weight)
        _weight("r-weight", self.r_weight)
        p = self.idle_power_w
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p < math.inf:
            raise ValueError(f"idle-power-w: must be a finite number of watts ≥ 0; got {p!r}")
        k, tol = self.peak_sigma_k, self.tie_tolerance
        if isinstance(k, bool) or not isinstance(k, numbers.Real) or not 0 <= k < math.inf:
            raise ValueError(f"peak-sigma-k: must be a finite number ≥ 0; got {k!r}")
        if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not 0 <= tol < 1:
            raise ValueError(f"tie-tolerance: must be a number in [0, 1) (e.g. 0.02); got {tol!r}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Objective:
        """Eq. 4 with the ``peak-sigma-k`` / ``tie-tolerance`` keys; defaults where absent."""
        return cls(
            peak_sigma_k=config.get("peak-sigma-k", PEAK_SIGMA_K),
            tie_tolerance=config.get("tie-tolerance", TIE_TOLERANCE),
        )

    def but(self, **changes: float) -> Objective:
        """This objective with ``changes`` (field names; checked again)."""
        return dataclasses.replace(self, **changes)

    def for_pace(self, r_weight: float = 0.0) -> Objective:
        """The pace-setter's objective: time × r_b^w (``critical-r-weight`` w; 0: its
        fastest cell), no energy term, the same tie rule and feasibility. The node's
        fastest cell and the server's forecast of it both take this one."""
        return dataclasses.replace(self, time_weight=1.0, r_weight=r_weight, energy_weight=0.0)

    def scores(
        self, time_s: npt.ArrayLike, r: npt.ArrayLike, power_w: npt.ArrayLike | None = None
    ) -> FloatArray:
        """The objective per cell, lower is better: time per sample × r_b (∝ the time to
        accuracy, Eq. 2 with Eq. 3), each with its exponent (``time_weight``,
        ``r_weight``), × P^w with an energy weight w > 0 (``power_w``: the cells' energy
        basis, average power where known; P is the power above ``idle_power_w``, at least
        0). Rows are batch sizes (``r`` one per row)."""
        t = np.asarray(time_s, dtype=np.float64)
        r_col = np.asarray(r, dtype=np.float64).reshape(-1, 1)
        if self.time_weight == 1.0 and self.r_weight == 1.0:
            score: FloatArray = t * r_col  # Eq. 4
        else:
            score = np.where(np.isnan(t), np.nan, t**self.time_weight) * r_col**self.r_weight
        if self.energy_weight > 0:
            if power_w is None:
                raise ValueError("energy-weight: needs the cells' power")
            p = np.asarray(power_w, dtype=np.float64)
            score = score * np.maximum(p - self.idle_power_w, 0.0) ** self.energy_weight
        return score


#: Eq. 4: the least time per sample × r_b, with the default tie rule and feasibility.
EQ4 = Objective()


@dataclass(frozen=True)
class RoundContext:
    """What a round asks of a node's choice beyond its objective (the server's round plan).

    The default asks nothing: no deadline, every batch size.

    Attributes
    ----------
    budget_s : float or None
        The time the round's local work may take: the round's deadline less the node's
        reserve (``deadline-margin``); None: no deadline. Cells whose round time (time per
        sample × ``samples``) is over it are left out while some feasible cell meets it;
        when none does, the choice is the feasible cell of least round time (the node's
        fastest).
    samples : float
        The round's training samples (times the node's time calibration), to turn a time
        per sample into a round time; needed with a budget.
    batch_size : int or None
        Only this b's row (None: every b): the energy mode keeps the node's own b*, so
        its updates, and with them the run's rounds to target, are those of its Eq. 4
        choice; only the frequency changes.
    """

    budget_s: float | None = None
    samples: float = 0.0
    batch_size: int | None = None

    def __post_init__(self) -> None:
        d = self.budget_s
        if d is not None and (isinstance(d, bool) or not isinstance(d, numbers.Real) or not d > 0):
            raise ValueError(f"budget-s: must be a number of seconds > 0; got {d!r}")
        n = self.samples
        if isinstance(n, bool) or not isinstance(n, numbers.Real) or not 0 <= n < math.inf:
            raise ValueError(f"samples: must be a finite number ≥ 0; got {n!r}")
        if d is not None and n <= 0:
            raise ValueError("samples: a budget needs the round's samples (> 0)")
        b = self.batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ValueError(f"batch-size: must be a batch size ≥ 1 or None; got {b!r}")


#: No deadline, every batch size: the objective alone.
ANY_ROUND = RoundContext()


def _none_if_nan(x: float) -> float | None:
    return None if math.isnan(x) else x


# --------------------------------------------------------------------------- validation


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
    return _validate_r_for(r, b)


def _validate_r_for(r: Sequence[object], b: list[int]) -> list[float]:
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
    # The common case: 0 < f0 < f1 < ... < inf (NaN fails every comparison).
    if out and _ascending_above_zero(out, float):
        return out
    if not out or not all(math.isfinite(f) and f > 0 for f in out):
        raise ValueError(f"freqs-mhz: must be {allowed}; got {freqs_mhz!r}")
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


def _validate_aux_table(
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


# --------------------------------------------------------------------------- feasibility


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
    limit_w = _limit_w(limit)
    peak = np.asarray(peak_w, dtype=np.float64)
    if math.isinf(limit_w):
        return ~np.isnan(peak)
    sigma = None if peak_sigma_w is None else np.asarray(peak_sigma_w, dtype=np.float64)
    # NaN compares False: a cell that was not profiled is never feasible.
    return robust_peak_w(peak, sigma, peak_sigma_k) < limit_w


def _limit_w(limit: PowerLimit | float | None) -> float:
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


def feasible_freq_index(power_row_w: npt.ArrayLike, p_max_w: float | None) -> int | None:
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
    return feasible_freq_indices(row[None, :], p_max_w)[0]


def feasible_freq_indices(power_w: FloatArray, p_max_w: float | None) -> list[int | None]:
    """``feasible_freq_index`` of every row of a (|B|, |F|) table, vectorised."""
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


# --------------------------------------------------------------------------- Eq. 4


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
    """The baselines' candidates: each b at the given column (energy not predicted)."""
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
    method: str,
    chosen: Candidate,
    p_max_w: float | None,
    candidates: tuple[Candidate, ...],
    knob: Knob = GPU_FREQ_MHZ,
) -> Selection:
    b, f, t, p, score, energy = chosen
    assert f is not None
    return Selection(method, b, f, t, p, score, p_max_w, candidates, energy, knob)


class _Checked(NamedTuple):
    """Validated Eq. 4 inputs: axes as lists, tables as float arrays."""

    b: list[int]
    f: list[float]
    r: list[float]
    time_s: FloatArray
    peak_w: FloatArray
    energy_w: FloatArray  # avg power where given, else peak power
    sigma_w: FloatArray | None


def _check_eq4(
    tables: Tables, batch_sizes: Sequence[int], freqs_mhz: Sequence[float], r: Sequence[float]
) -> _Checked:
    b_list = validate_batch_sizes(batch_sizes)
    f_list = validate_freqs_mhz(freqs_mhz)
    r_list = _validate_r_for(r, b_list)
    time_s, peak_w = validate_tables(tables.time_s, tables.peak_w, len(b_list), len(f_list))
    energy_w, sigma_w = peak_w, None
    if tables.avg_w is None and tables.peak_sigma_w is None:
        return _Checked(b_list, f_list, r_list, time_s, peak_w, energy_w, sigma_w)
    not_profiled = np.isnan(time_s)
    if tables.avg_w is not None:
        energy_w = _validate_aux_table(
            "lut_avg_power_w", tables.avg_w, not_profiled, nan_in_profiled=False
        )
    if tables.peak_sigma_w is not None:
        sigma_w = _validate_aux_table(
            "lut_peak_sigma_w", tables.peak_sigma_w, not_profiled, nan_in_profiled=True
        )
    return _Checked(b_list, f_list, r_list, time_s, peak_w, energy_w, sigma_w)


def select_eq4(
    tables: Tables,
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    r: Sequence[float],
    p_max_w: PowerLimit | float | str | None,
    *,
    objective: Objective = EQ4,
    method: str = "power-aware",
    context: RoundContext = ANY_ROUND,
) -> Selection:
    """Eq. 4 on measured, noisy tables: the fastest feasible (b, f) to accuracy, then energy.

    Feasibility is per cell (``feasible_cells``): a cell is feasible when its robust peak,
    ``peak + objective.peak_sigma_k·σ`` (σ of its per-step peaks; 0 where not recorded), is below
    ``PowerLimit.limit_w`` (P_max less its margin). No fit across f is applied: a fit
    would either pass a cell that was measured above the cap or reject one measured below
    it, and every guarantee below holds cell by cell.

    The choice, over all feasible cells (not only each b's highest f):

    1. ``score = time per sample × r_b`` (∝ TT_acc, Eq. 2 with Eq. 3; ``Objective.scores``);
       ``best`` is its minimum over the feasible cells.
    2. Cells with ``score ≤ best · (1 + tie_tolerance)`` are ties: profiling noise cannot
       order them. Among them the least **energy to accuracy** wins: energy per sample ×
       r_b, where energy per sample is average power × time per sample when
       ``tables.avg_w`` is given, else peak power × time per sample. Within one b that is
       energy per sample; across b it counts the samples each b needs (r_b).
    3. Exact ties: within one b the lower f; across b the lower score, then the larger b.

    Hence the choice is feasible, it is never slower than literal Eq. 4 on the same
    feasible cells (each b at its highest feasible f) by more than ``tie_tolerance``,
    and there is a choice whenever some profiled cell is feasible. With no cap every
    profiled cell is feasible, and with ``tie_tolerance = 0`` on rows whose time falls as
    f rises the choice is the paper's Eq. 4.

    ``candidates`` has, per b, the cell that b would use: its least-energy tied cell when
    it has one, else its fastest feasible cell (the lower f on equal scores), else
    ``freq_mhz`` None. The selection is one of them.

    Parameters
    ----------
    tables : Tables
        LUT_time, LUT_power, optional average power and σ of per-step peaks, and the knob.
    batch_sizes : sequence of int
        B, strictly ascending (rows of the tables).
    freqs_mhz : sequence of float
        The knob's values, strictly ascending (columns); MHz for the GPU frequency.
    r : sequence of float
        Eq. 3's r_b per batch size, each in (0, 1].
    p_max_w : PowerLimit, float, str or None
        The cap with its margin (``PowerLimit``), or a bare cap P_max in W (no margin);
        None / "none" / infinity for no cap.
    objective : Objective
        The weights, ``peak-sigma-k`` and ``tie-tolerance``; the default, Eq. 4, is the
        rule above.
    method : str
        ``"power-aware"`` (r from the proxy) or ``"oracle"`` (r from the client's data).
    context : RoundContext
        The round's budget and batch size; the default asks nothing.

    Returns
    -------
    Selection

    Raises
    ------
    InfeasibleCapError
        When no profiled cell is feasible (it names the cell of lowest robust peak).
    ValueError
        For malformed inputs (the message names the key).
    """
    if method not in ("power-aware", "oracle"):
        raise ValueError(f"method: {method!r} is not an Eq. 4 method (power-aware, oracle)")
    c = _check_eq4(tables, batch_sizes, freqs_mhz, r)
    limit = PowerLimit.of(p_max_w)
    robust = robust_peak_w(c.peak_w, c.sigma_w, objective.peak_sigma_k)
    feasible = robust < limit.limit_w  # NaN < limit is False
    if context.batch_size is not None:
        if context.batch_size not in c.b:
            raise ValueError(f"batch-size: {context.batch_size} is not one of {c.b}")
        feasible &= (np.asarray(c.b) == context.batch_size)[:, None]
    chosen = _eq4(c.time_s, c.energy_w, c.r, feasible, objective, context)
    if chosen is None:
        raise _infeasible(c, robust, limit, tables.knob)
    picks, fastest, row = chosen
    candidates = _candidates_at_picks(c, picks, fastest, c.time_s.shape[1])
    return _selection(method, candidates[row], limit.cap_w, candidates, tables.knob)


def _eq4(
    time_s: FloatArray,
    energy_w: FloatArray,
    r: list[float],
    feasible: BoolArray,
    objective: Objective,
    context: RoundContext,
) -> tuple[list[int], list[float], int] | None:
    """The choice over feasible cells (rows: ascending b): per row the flat index of the
    cell that b would use and its score (inf: none), and the chosen row; None when no cell
    is feasible. The score is ``objective.scores``; ties (within its ``tie_tolerance``) go
    to the least energy to accuracy.

    With a budget (``context``) the cells over it are left out while a feasible cell
    meets it; when none does the score is the round time alone (the fastest cell)."""
    score = objective.scores(time_s, r, energy_w)
    if context.budget_s is not None:
        on_time = feasible & (time_s * context.samples <= context.budget_s)
        if np.count_nonzero(on_time):
            feasible = on_time
        else:
            score = time_s
    # A few whole-table NumPy operations (each costs about a microsecond on tables this
    # small), then per-b work in Python.
    r_col = np.array(r)[:, None]
    fast = np.where(feasible, score, math.inf)
    n_b, n_f = fast.shape
    row_start = np.arange(0, n_b * n_f, n_f)
    picks = fast.argmin(axis=1) + row_start  # flat index of each b's fastest feasible cell
    fastest = fast.take(picks).tolist()
    best = min(fastest)
    if best == math.inf:
        return None
    threshold = best * (1 + objective.tie_tolerance)
    tied = [i for i, f in enumerate(fastest) if f <= threshold]
    if len(tied) > 1 or np.count_nonzero(fast <= threshold) > 1:
        # rows with ties take their least energy to accuracy among them (the lower f first)
        to_acc = np.where(fast <= threshold, energy_w * time_s * r_col, math.inf)
        picks[tied] = to_acc.argmin(axis=1).take(tied) + row_start.take(tied)
    flat = picks.tolist()
    # across b: the least energy to accuracy, then the lower score, then the larger b
    energy_l = energy_w.take(flat).tolist()
    time_l = time_s.take(flat).tolist()
    score_l = fast.take(flat).tolist()
    row = min(tied, key=lambda i: (energy_l[i] * time_l[i] * r[i], score_l[i], -i))
    return flat, fastest, row


def choose_cell(
    time_s: npt.ArrayLike,
    peak_w: npt.ArrayLike,
    energy_w: npt.ArrayLike,
    r: Sequence[float],
    limit: PowerLimit | float | None,
    *,
    peak_sigma_w: npt.ArrayLike | None = None,
    objective: Objective = EQ4,
    context: RoundContext = ANY_ROUND,
) -> tuple[int, int] | None:
    """The (row, column) ``select_eq4`` chooses from bare tables (rows: ascending b; NaN:
    not measured), None when no cell is feasible: the same feasibility, objective and
    tie-break, without the axes and checks of a node's selection (a fit's planning asks
    this many times; ``fl_client.lut_fit``). ``energy_w`` is the energy basis (average
    power); ``limit`` the cap with its margin, or its ``limit_w``. A row whose r is NaN
    (a b without an r) is never chosen."""
    t = np.asarray(time_s, dtype=np.float64)
    e = np.asarray(energy_w, dtype=np.float64)
    r_list = [float(x) for x in r]
    robust = robust_peak_w(peak_w, peak_sigma_w, objective.peak_sigma_k)
    with np.errstate(invalid="ignore"):
        feasible = np.isfinite(t) & np.isfinite(e) & (robust < _limit_w(limit))
    feasible &= np.isfinite(np.asarray(r_list))[:, None]
    chosen = _eq4(t, e, r_list, feasible, objective, context)
    if chosen is None:
        return None
    flat, _, row = chosen
    return row, flat[row] % t.shape[1]


def _candidates_at_picks(
    c: _Checked, picks: list[int], fastest: list[float], n_f: int
) -> tuple[Candidate, ...]:
    """Per b, the cell at flat index ``picks[i]``; no cell where ``fastest[i]`` is inf."""
    time_l, peak_l, energy_w_l = (a.take(picks).tolist() for a in (c.time_s, c.peak_w, c.energy_w))
    return tuple(
        [
            Candidate(b, c.f[k % n_f], t, p, t * r_b, e * t)
            if f < math.inf
            else Candidate(b, None, math.nan, math.nan, math.nan)
            for b, r_b, k, f, t, p, e in zip(
                c.b, c.r, picks, fastest, time_l, peak_l, energy_w_l, strict=True
            )
        ]
    )


def _infeasible(
    c: _Checked, robust: FloatArray, limit: PowerLimit, knob: Knob
) -> InfeasibleCapError:
    """The error for a table without a feasible cell: it names the lowest robust peak."""
    assert limit.capped  # without a cap every profiled cell is feasible
    i, j = np.unravel_index(int(np.nanargmin(robust)), robust.shape)
    lowest = float(robust[i, j])
    return InfeasibleCapError(
        limit.p_max_w,
        lowest,
        c.b[i],
        c.f[j],
        limit.cap_margin,
        lowest - float(c.peak_w[i, j]),
        knob,
    )


# --------------------------------------------------------------------------- baselines


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


class MethodArgs(TypedDict, total=False):
    """``select``'s per-method keywords. ``context``: power-aware and oracle.
    ``b1_freq_cap_mhz``: b1, b2. ``fixed_batch_size`` and ``fixed_freq_mhz``: fixed.
    ``knob``: what the baselines' choice is when no tables are given (with tables, theirs).
    """

    knob: Knob
    context: RoundContext
    b1_freq_cap_mhz: float | None
    fixed_batch_size: int | None
    fixed_freq_mhz: float | None


_METHOD_ARGS = frozenset(MethodArgs.__annotations__)


def select(
    method: str,
    *,
    batch_sizes: Sequence[int],
    freqs_mhz: Sequence[float],
    tables: Tables | None = None,
    r: Sequence[float] | None = None,
    p_max_w: PowerLimit | float | str | None = None,
    objective: Objective = EQ4,
    **method_args: Unpack[MethodArgs],
) -> Selection:
    """Dispatch to the selection ``method`` (one of ``METHODS``).

    Parameters
    ----------
    method : str
        ``power-aware`` and ``oracle`` need the tables, ``r`` (for the oracle: measured on
        the client's data) and ``p_max_w`` (the cap with its margin, ``PowerLimit``, or a
        bare cap; pass ``math.inf`` or ``"none"`` for no cap: a forgotten cap is an error
        here, not "no cap"); ``b1`` needs ``b1_freq_cap_mhz``;
        ``b2`` needs ``r`` and ``b1_freq_cap_mhz``; ``fixed`` needs ``fixed_batch_size`` and
        ``fixed_freq_mhz``. The tables are optional for the baselines (predictions only).
    batch_sizes, freqs_mhz, r, p_max_w
        As in the per-method functions.
    tables : Tables, optional
        The profiled tables and their knob.
    objective : Objective
        Power-aware's and the oracle's, with ``peak-sigma-k`` and ``tie-tolerance``.
    **method_args
        ``MethodArgs``: context, b1_freq_cap_mhz, fixed_batch_size, fixed_freq_mhz, knob.

    Returns
    -------
    Selection
        Its ``knob`` is the tables' (``GPU_FREQ_MHZ`` when none is named).

    Raises
    ------
    ValueError
        Unknown method, or a parameter the method needs is missing (named in kebab-case).
    """
    if method not in METHODS:
        raise ValueError(f"method: unknown value {method!r}; allowed: {', '.join(METHODS)}")
    unknown = method_args.keys() - _METHOD_ARGS
    if unknown:
        raise TypeError(f"select() got unexpected keyword arguments: {', '.join(sorted(unknown))}")

    def need(name: str, value: Any) -> Any:
        if value is None:
            raise ValueError(f"{name}: required by method {method!r}")
        return value

    if method in ("power-aware", "oracle"):
        return select_eq4(
            need("lut-time-s", tables),
            batch_sizes,
            freqs_mhz,
            need("r", r),
            need("p-max-w", p_max_w),
            objective=objective,
            method=method,
            context=method_args.get("context", ANY_ROUND),
        )
    time_s, peak_w = (None, None) if tables is None else (tables.time_s, tables.peak_w)
    if method == "b1":
        cap = need("b1-freq-cap-mhz", method_args.get("b1_freq_cap_mhz"))
        sel = select_b1(batch_sizes, freqs_mhz, cap, time_s, peak_w, r=r)
    elif method == "b2":
        cap = need("b1-freq-cap-mhz", method_args.get("b1_freq_cap_mhz"))
        sel = select_b2(batch_sizes, freqs_mhz, need("r", r), cap, time_s, peak_w)
    else:
        sel = select_fixed(
            need("fixed-batch-size", method_args.get("fixed_batch_size")),
            need("fixed-freq-mhz", method_args.get("fixed_freq_mhz")),
            batch_sizes,
            freqs_mhz,
            time_s,
            peak_w,
            r=r,
        )
    knob = tables.knob if tables is not None else method_args.get("knob") or GPU_FREQ_MHZ
    return sel if knob == GPU_FREQ_MHZ else dataclasses.replace(sel, knob=knob)
