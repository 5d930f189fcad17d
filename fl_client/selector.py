"""Choosing (batch size, GPU knob) under a power cap: Eq. 4 of the paper and its baselines.

Pure functions over the lookup tables the profiler measures (``fl_client.profiler``):
``lut_time_s[i, j]`` is the time per training sample and ``lut_power_w[i, j]`` the peak power
at batch size ``batch_sizes[i]`` and knob value ``knob_values[j]``; NaN marks a cell that was
not profiled (efficient mode). Optional tables: average power (energy tie-break) and σ of the
per-step peaks (feasibility margin). The knob is the GPU frequency in MHz unless the tables
say otherwise (``Knob``: e.g. a GPU power limit in W, as NVML GPUs and Zeus traces have).
NumPy only: no torch, no Flower.

The values a choice reads and returns live in ``fl_client.selection``, the input checks in
``fl_client.selector_inputs``, feasibility (the robust peak against the cap) in
``fl_client.feasibility`` and the baselines in ``fl_client.selector_baselines``; ``select``
dispatches to every method.

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
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from fl_client.devices.base import GPU_FREQ_MHZ, Knob  # the knob a table is indexed by
from fl_client.feasibility import PEAK_SIGMA_K, limit_w_of, robust_peak_w
from fl_client.power import PowerLimit  # the cap with its margin, what feasibility judges
from fl_client.selection import (
    Candidate,
    InfeasibleCapError,
    Selection,
    Tables,
    selection_of,
)
from fl_client.selector_baselines import select_b1, select_b2, select_fixed
from fl_client.selector_inputs import (
    validate_aux_table,
    validate_batch_sizes,
    validate_knob_values,
    validate_r_for,
    validate_tables,
)

METHODS = ("power-aware", "b1", "b2", "oracle", "fixed")

#: Default ``tie-tolerance``: scores (time × r) within 2% of the best are treated as equal,
#: the noise level of a time per sample profiled from a few steps.
TIE_TOLERANCE = 0.02

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


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


@dataclass(frozen=True)
class Method:
    """A selection method and what it needs besides the tables, r and the cap.

    Attributes
    ----------
    name : str
        One of ``METHODS``.
    objective : Objective
        Power-aware's and the oracle's, with ``peak-sigma-k`` and ``tie-tolerance``.
    context : RoundContext
        Power-aware's and the oracle's round: its budget and batch size.
    b1_max_knob_value : float or None
        B1's and B2's fixed safe frequency.
    fixed_batch_size, fixed_knob_value : int / float or None
        The (b, f) of ``fixed``.
    knob : Knob or None
        What the baselines' choice is when no tables are given (with tables, theirs).
    """

    name: str = "power-aware"
    objective: Objective = EQ4
    context: RoundContext = ANY_ROUND
    b1_max_knob_value: float | None = None
    fixed_batch_size: int | None = None
    fixed_knob_value: float | None = None
    knob: Knob | None = None

    def __post_init__(self) -> None:
        if self.name not in METHODS:
            allowed = ", ".join(METHODS)
            raise ValueError(f"method: unknown value {self.name!r}; allowed: {allowed}")


#: Eq. 4 with r from the server's proxy, the default objective and no round context.
POWER_AWARE = Method()


# --------------------------------------------------------------------------- Eq. 4


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
    tables: Tables, batch_sizes: Sequence[int], knob_values: Sequence[float], r: Sequence[float]
) -> _Checked:
    b_list = validate_batch_sizes(batch_sizes)
    f_list = validate_knob_values(knob_values)
    r_list = validate_r_for(r, b_list)
    time_s, peak_w = validate_tables(tables.time_s, tables.peak_w, len(b_list), len(f_list))
    energy_w, sigma_w = peak_w, None
    if tables.avg_w is None and tables.peak_sigma_w is None:
        return _Checked(b_list, f_list, r_list, time_s, peak_w, energy_w, sigma_w)
    not_profiled = np.isnan(time_s)
    if tables.avg_w is not None:
        energy_w = validate_aux_table(
            "lut_avg_power_w", tables.avg_w, not_profiled, nan_in_profiled=False
        )
    if tables.peak_sigma_w is not None:
        sigma_w = validate_aux_table(
            "lut_peak_sigma_w", tables.peak_sigma_w, not_profiled, nan_in_profiled=True
        )
    return _Checked(b_list, f_list, r_list, time_s, peak_w, energy_w, sigma_w)


def select_eq4(
    tables: Tables,
    batch_sizes: Sequence[int],
    knob_values: Sequence[float],
    r: Sequence[float],
    limit: PowerLimit | float | str | None,
    method: Method | None = None,
) -> Selection:
    """Eq. 4 on measured, noisy tables: the fastest feasible (b, f) to accuracy, then energy.

    Feasibility is per cell (``feasible_cells``): a cell is feasible when its robust peak,
    ``peak + k·σ`` (``Objective.peak_sigma_k``; σ of its per-step peaks, 0 where not
    recorded), is below ``PowerLimit.limit_w`` (P_max less its margin). No fit across f is
    applied: a fit would either pass a cell that was measured above the cap or reject one
    measured below it, and every guarantee below holds cell by cell.

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
    ``knob_value`` None. The selection is one of them.

    Parameters
    ----------
    tables : Tables
        LUT_time, LUT_power, optional average power and σ of per-step peaks, and the knob.
    batch_sizes : sequence of int
        B, strictly ascending (rows of the tables).
    knob_values : sequence of float
        The knob's values, strictly ascending (columns); MHz for the GPU frequency.
    r : sequence of float
        Eq. 3's r_b per batch size, each in (0, 1].
    limit : PowerLimit, float, str or None
        The cap with its margin, or a bare cap P_max in W (no margin); None / "none" /
        infinity for no cap.
    method : Method, optional
        ``power-aware`` (r from the proxy; the default) or ``oracle`` (r from the client's
        data), with its objective (the default, Eq. 4, is the rule above) and the round's
        context (budget and batch size; the default asks nothing).

    Raises
    ------
    InfeasibleCapError
        When no profiled cell is feasible (it names the cell of lowest robust peak).
    ValueError
        For malformed inputs (the message names the key).
    """
    method = POWER_AWARE if method is None else method
    if method.name not in ("power-aware", "oracle"):
        raise ValueError(f"method: {method.name!r} is not an Eq. 4 method (power-aware, oracle)")
    objective, context = method.objective, method.context
    c = _check_eq4(tables, batch_sizes, knob_values, r)
    limit = PowerLimit.of(limit)
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
    return selection_of(method.name, candidates[row], limit.cap_w, candidates, tables.knob)


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
    tables: Tables,
    r: Sequence[float],
    limit: PowerLimit | float | None,
    *,
    objective: Objective = EQ4,
    context: RoundContext = ANY_ROUND,
) -> tuple[int, int] | None:
    """The (row, column) ``select_eq4`` chooses from bare tables (rows: ascending b; NaN:
    not measured), None when no cell is feasible: the same feasibility, objective and
    tie-break, without the axes and checks of a node's selection (a fit's planning asks
    this many times; ``fl_client.lut_fit``). The energy basis is ``tables.avg_w`` (the
    peak without it); ``limit`` the cap with its margin, or its ``limit_w``. A row whose r
    is NaN (a b without an r) is never chosen."""
    t = np.asarray(tables.time_s, dtype=np.float64)
    e = np.asarray(tables.peak_w if tables.avg_w is None else tables.avg_w, dtype=np.float64)
    r_list = [float(x) for x in r]
    robust = robust_peak_w(tables.peak_w, tables.peak_sigma_w, objective.peak_sigma_k)
    with np.errstate(invalid="ignore"):
        feasible = np.isfinite(t) & np.isfinite(e) & (robust < limit_w_of(limit))
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
    return InfeasibleCapError(limit, lowest, c.b[i], c.f[j], lowest - float(c.peak_w[i, j]), knob)


def select(
    method: Method | str,
    *,
    batch_sizes: Sequence[int],
    knob_values: Sequence[float],
    tables: Tables | None = None,
    r: Sequence[float] | None = None,
    limit: PowerLimit | float | str | None = None,
) -> Selection:
    """Dispatch to the selection ``method`` (a ``Method``, or one of ``METHODS`` by name).

    Parameters
    ----------
    method : Method or str
        ``power-aware`` and ``oracle`` need the tables, ``r`` (for the oracle: measured on
        the client's data) and ``limit`` (the cap with its margin, ``PowerLimit``, or a
        bare cap; pass ``math.inf`` or ``"none"`` for no cap: a forgotten cap is an error
        here, not "no cap"); ``b1`` needs ``Method.b1_max_knob_value``; ``b2`` needs ``r``
        and ``b1_max_knob_value``; ``fixed`` needs ``fixed_batch_size`` and
        ``fixed_knob_value``. The tables are optional for the baselines (predictions only).
    batch_sizes, knob_values, r, limit
        As in the per-method functions.
    tables : Tables, optional
        The profiled tables and their knob.

    Returns
    -------
    Selection
        Its ``knob`` is the tables' (``GPU_FREQ_MHZ`` when none is named).

    Raises
    ------
    ValueError
        Unknown method, or a parameter the method needs is missing (named in kebab-case).
    """
    how = method if isinstance(method, Method) else Method(method)

    def need(name: str, value: Any) -> Any:
        if value is None:
            raise ValueError(f"{name}: required by method {how.name!r}")
        return value

    if how.name in ("power-aware", "oracle"):
        tables = need("lut-time-s", tables)
        return select_eq4(
            tables, batch_sizes, knob_values, need("r", r), need("p-max-w", limit), how
        )
    if how.name == "b1":
        max_mhz = need("b1-freq-cap-mhz", how.b1_max_knob_value)
        sel = select_b1(batch_sizes, knob_values, max_mhz, tables, r=r)
    elif how.name == "b2":
        max_mhz = need("b1-freq-cap-mhz", how.b1_max_knob_value)
        sel = select_b2(batch_sizes, knob_values, need("r", r), max_mhz, tables)
    else:
        b = need("fixed-batch-size", how.fixed_batch_size)
        f = need("fixed-freq-mhz", how.fixed_knob_value)
        sel = select_fixed(b, f, batch_sizes, knob_values, tables, r=r)
    knob = tables.knob if tables is not None else how.knob or GPU_FREQ_MHZ
    return sel if knob == GPU_FREQ_MHZ else dataclasses.replace(sel, knob=knob)
