"""The round plan: each node's predicted round time, the round's deadline and its pace-setter.

A synchronous round lasts as long as its slowest node. From what the nodes reported (their
kind's LUT, their last round's local work and how its measured time compared with the LUT's
prediction), the plan predicts each node's **best round time**: its local work at the
feasible cell of least time per sample under its cap with its margin (``NodeForecast``).
The node with the largest best time sets the pace (the **critical** node; nodes of equal
pace are planned together: every node within ``EQUAL_PACE`` of it is critical too), and the
round's deadline is its best time, or ``round-deadline-s`` when that is set. A node whose
best time is over a fixed deadline cannot meet it: it runs at its fastest cell and the
plan says so (``RoundPlan.unmeetable``). ``RoundPlanner`` keeps what the plan remembers from
round to round (each node's last report, calibration and missed deadline). No Flower import;
the strategy sends each node its deadline and role with the round's TRAIN config.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fl_client.balance import missed_deadline
from fl_client.contract import TrainReport
from fl_client.feasibility import PEAK_SIGMA_K
from fl_client.lut import LUT
from fl_client.power import PowerLimit
from fl_client.selection import Tables
from fl_client.selector import EQ4, TIE_TOLERANCE, Objective, choose_cell

#: The pace-setter's objective with the default tie rule and feasibility.
PACE = EQ4.for_pace()

#: Nodes whose best round time is within this share of the critical node's set the pace
#: together (noise of a LUT cell is a few percent).
EQUAL_PACE = 0.02


@dataclass(frozen=True)
class NodeForecast:
    """One node's predicted best round time and where it came from.

    ``source`` is ``lut`` (its kind's LUT × its local work × its calibration), ``reported``
    (the node's own prediction, ``fastest-time-s``) or ``measured`` (its last round's
    measured time, after it missed its deadline by more than its margin).
    """

    node_id: int
    best_time_s: float
    source: str


@dataclass(frozen=True)
class RoundPlan:
    """The round's deadline (s of local training time) and who sets the pace.

    ``deadline_s`` is None when there is none (no node has a forecast yet); ``critical``
    are the pace-setting nodes; ``unmeetable`` the nodes whose best round time is over a
    fixed deadline (they run at their fastest cell); ``fixed`` whether
    ``round-deadline-s`` set the deadline.
    """

    deadline_s: float | None
    critical: frozenset[int]
    unmeetable: frozenset[int]
    fixed: bool
    forecasts: tuple[NodeForecast, ...]


def best_round_time_s(
    tables: Tables,
    limit: PowerLimit,
    samples: float,
    *,
    calibration: float = 1.0,
    objective: Objective = PACE,
    r: Sequence[float] | None = None,
) -> float:
    """A node's predicted round time at the cell it would set the pace with: the cell the
    node itself chooses (``selector.choose_cell``) on its ``tables`` with the pace-setter's
    objective (``Objective.for_pace``: by default its fastest feasible cell under ``limit``,
    the least time per sample, near-ties within ``tie_tolerance`` to the least energy to
    accuracy; with ``critical-r-weight`` w > 0 the least time × r_b^w), so the forecast and
    the node's own cell are the same by construction. ``r``: r_b per row (None: 1 each; a
    row without an r, NaN, is never chosen). × ``samples`` (its round's local training
    samples) × ``calibration`` (its measured / predicted time of an earlier round). inf
    when no cell is feasible."""
    t = np.asarray(tables.time_s, dtype=np.float64)
    r_rows = [1.0] * t.shape[0] if r is None else [float(x) for x in r]
    at = choose_cell(tables, r_rows, limit, objective=objective)
    if at is None:
        return math.inf
    return float(t[at]) * float(samples) * float(calibration)


def plan_round(forecasts: Sequence[NodeForecast], round_deadline_s: float = 0.0) -> RoundPlan:
    """The round's plan from each node's forecast (``round_deadline_s`` > 0 fixes the
    deadline). Nodes without a finite forecast are left out of the pace; with none at all
    there is no deadline (None: no node is held back)."""
    if not (round_deadline_s >= 0 and math.isfinite(round_deadline_s)):
        raise ValueError(f"round-deadline-s: must be a number ≥ 0; got {round_deadline_s!r}")
    known = [f for f in forecasts if math.isfinite(f.best_time_s) and f.best_time_s > 0]
    pace = max((f.best_time_s for f in known), default=math.inf)
    critical = frozenset(f.node_id for f in known if f.best_time_s >= pace * (1.0 - EQUAL_PACE))
    fixed = round_deadline_s > 0
    deadline = round_deadline_s if fixed else (pace if known else None)
    unmeetable = frozenset(f.node_id for f in known if fixed and f.best_time_s > round_deadline_s)
    return RoundPlan(deadline, critical, unmeetable, fixed, tuple(forecasts))


def missed(
    measured_time_s: Mapping[int, float], deadline_s: float | None, margin: float
) -> dict[int, float]:
    """Nodes that missed ``deadline_s`` by more than their ``margin`` (a share of it;
    ``balance.missed_deadline``, the node's and the reports' rule): node → its measured
    local time."""
    return {n: t for n, t in measured_time_s.items() if missed_deadline(t, deadline_s, margin)}


@dataclass(frozen=True)
class PlanSettings:
    """The run settings the server's round plan reads (``balance`` not ``off``).

    ``margin`` is a node's reserve (``deadline-margin``): a node whose measured local time is
    over the deadline by more than this share of it has missed it (recorded; the next plan
    uses its measured time). ``peak_sigma_k`` and ``tie_tolerance`` judge cells as the
    nodes do; ``critical_r_weight`` is how much r_b weighs in the pace-setter's cell
    (``best_round_time_s``).
    """

    balance: str
    round_deadline_s: float = 0.0
    margin: float = 0.05
    peak_sigma_k: float = PEAK_SIGMA_K
    critical_r_weight: float = 0.0
    tie_tolerance: float = TIE_TOLERANCE

    @property
    def pace_objective(self) -> Objective:
        """The objective the pace-setter's cell is forecast with (``best_round_time_s``)."""
        base = Objective(peak_sigma_k=self.peak_sigma_k, tie_tolerance=self.tie_tolerance)
        return base.for_pace(self.critical_r_weight)


def round_record(
    plan: RoundPlan,
    settings: PlanSettings,
    server_round: int,
    measured_time_s: Mapping[int, float],
    names: Mapping[int, str],
) -> tuple[list[str], dict[int, float], dict[str, Any]]:
    """What a planned round's record says: its warnings (the nodes that could not meet a
    fixed deadline and ran at their fastest cell; the nodes late beyond their margin), the
    late nodes with their measured time (the next plan forecasts them by it), and the
    plan's entry for ``summary.json`` (``round-plan``). ``names``: node id → node name."""

    def named(ids: Iterable[int]) -> list[str]:
        return sorted(names.get(n, str(n)) for n in ids)

    late = missed(measured_time_s, plan.deadline_s, settings.margin)
    warnings = []
    if plan.unmeetable:
        warnings.append(
            f"round-deadline-s: {plan.deadline_s:.3g} s is under the best round time of "
            f"{', '.join(named(plan.unmeetable))}; they ran at their fastest cell"
        )
    if late:
        warnings.append(
            f"balance: {', '.join(named(late))} missed round {server_round}'s deadline of "
            f"{plan.deadline_s:.3g} s by more than {100 * settings.margin:g}%; the next plan "
            "uses their measured time"
        )
    entry = {
        "round": server_round,
        "deadline-s": plan.deadline_s,
        "fixed": plan.fixed,
        "critical": named(plan.critical),
        "unmeetable": named(plan.unmeetable),
        "missed": named(late),
        "forecasts": {
            names.get(f.node_id, str(f.node_id)): {
                "best-time-s": f.best_time_s,
                "source": f.source,
            }
            for f in plan.forecasts
        },
    }
    return warnings, late, entry


class FleetView(Protocol):
    """What the planner reads of the fleet (``strategies.fleet.Fleet``)."""

    def limit_of(self, node_id: int, server_round: int) -> PowerLimit | None: ...

    def r_rows(self, batch_sizes: Sequence[int]) -> list[float]: ...


@dataclass
class RoundPlanner:
    """The server's round plan from round to round (``balance`` not ``off``).

    It remembers each node's last report and calibration (its measured / LUT-predicted time)
    and the measured time of a node that missed its deadline; from them it plans each round
    after the first (``begin``) and records how the round went against its plan
    (``record``: warnings, and the ``round-plan`` entry of ``summary.json`` in ``log``).
    ``local_epochs`` turns a node's last local samples into its round's work.
    """

    settings: PlanSettings
    local_epochs: int
    #: This round's plan (None: round 1, nothing known yet)
    plan: RoundPlan | None = field(default=None, init=False)
    #: Per planned round: deadline, pace, misses (``round_record``)
    log: list[dict[str, Any]] = field(default_factory=list, init=False)
    #: node -> measured / predicted time of its last round
    calibration: dict[int, float] = field(default_factory=dict, init=False)
    _last: dict[int, TrainReport] = field(default_factory=dict, init=False)  # node -> report
    _measured_s: dict[int, float] = field(default_factory=dict, init=False)  # node -> a miss
    _capped: set[int] = field(default_factory=set, init=False)  # bounded by max-work-share
    _capped_named: set[int] = field(default_factory=set, init=False)  # ... and warned about

    @property
    def deadline_s(self) -> float | None:
        """This round's deadline (None: no plan, or a plan without a finite one)."""
        plan = self.plan
        return None if plan is None else plan.deadline_s

    def is_critical(self, node_id: int) -> bool:
        """Whether ``node_id`` sets this round's pace."""
        return self.plan is not None and node_id in self.plan.critical

    def calibration_of(self, node_id: int) -> float:
        """The node's time calibration to send with a deadline (1.0 without one)."""
        return self.calibration.get(node_id, 1.0) if self.deadline_s else 1.0

    def begin(
        self,
        server_round: int,
        node_ids: Sequence[int],
        fleet: FleetView,
        lut_of: Callable[[int], LUT | None],
    ) -> RoundPlan | None:
        """Plan ``server_round`` over ``node_ids`` (``plan_round``); round 1 has no plan.
        ``lut_of``: a node's kind LUT (None: none yet)."""
        self.plan = None
        if server_round > 1:
            forecasts = [self.forecast(n, server_round, fleet, lut_of) for n in node_ids]
            self.plan = plan_round(forecasts, self.settings.round_deadline_s)
        return self.plan

    def forecast(
        self,
        node_id: int,
        server_round: int,
        fleet: FleetView,
        lut_of: Callable[[int], LUT | None],
    ) -> NodeForecast:
        """A node's predicted best round time: its measured time after a missed deadline;
        else its kind's LUT × its last local work × its calibration; else what it reported
        (``fastest-time-s``); inf when nothing is known yet."""
        if node_id in self._measured_s:
            return NodeForecast(node_id, self._measured_s.pop(node_id), "measured")
        last = self._last.get(node_id)
        lut = lut_of(node_id)
        if (
            lut is not None
            and last is not None
            and (limit := fleet.limit_of(node_id, server_round)) is not None
        ):
            tables = Tables(
                lut.time_per_sample_s, lut.peak_power_w, lut.avg_power_w, lut.peak_sigma_w
            )
            best = best_round_time_s(
                tables,
                limit,
                self.local_epochs * last.num_examples,
                calibration=self.calibration.get(node_id, 1.0),
                objective=self.settings.pace_objective,
                r=fleet.r_rows(lut.batch_sizes),
            )
            if math.isfinite(best):
                return NodeForecast(node_id, best, "lut")
        reported = None if last is None else last.fastest_time_s
        if reported is not None and math.isfinite(reported) and reported > 0:
            return NodeForecast(node_id, reported, "reported")
        return NodeForecast(node_id, math.inf, "none")

    def observe(self, node_id: int, report: TrainReport) -> None:
        """Keep the node's report and calibration (measured / LUT-predicted time of its
        round) for the next plan, and whether ``max-work-share`` bounded its work."""
        if report.work_share_capped:
            self._capped.add(node_id)
        predicted = report.predicted_time_s
        if predicted is not None and predicted > 0 and report.train_time_s > 0:
            self.calibration[node_id] = report.train_time_s / predicted
        self._last[node_id] = report

    def record(
        self, server_round: int, measured_time_s: Mapping[int, float], names: Mapping[int, str]
    ) -> list[str]:
        """The plan's record of the round (``round_record``): its warnings are returned, the
        late nodes' measured times kept for the next plan, its entry added to ``log``."""
        plan = self.plan
        if plan is None or plan.deadline_s is None:
            return []
        warnings, late, entry = round_record(
            plan, self.settings, server_round, measured_time_s, names
        )
        first = sorted(names.get(n, str(n)) for n in self._capped - self._capped_named)
        if first:  # once per node and run
            warnings.append(
                f"max-work-share: {', '.join(first)} ran the most extra work it allows in "
                f"round {server_round}; the deadline left room for more"
            )
            self._capped_named |= self._capped
        self._capped.clear()
        self._measured_s.update(late)
        self.log.append(entry)
        return warnings
