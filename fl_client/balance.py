"""``balance`` modes as data: what a node with slack before the round's deadline does with it.

Each mode is one ``Mode`` entry of ``BALANCE_MODES``: its doc line, its label in reports, how
it re-chooses the node's cell (the objective's changes), the share of its local work it runs
and the report fields it adds. The node (``node._balance``) applies the entry; the settings'
allowed values, the balance study's report and docs/method.md read the keys from here. The
parts common to every mode but ``off`` stay on the node: the fastest feasible cell it
reports, the pace-setter's cell and ``straggler-work``, the reserve ``deadline-margin``.

No Flower, no torch: pure values over the selector's ``Selection``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fl_client.selection import Selection


@dataclass(frozen=True)
class Slack:
    """What a node with slack knows when it spends it.

    ``choice`` is its Eq. 4 cell, ``fastest`` its fastest feasible cell; ``budget_s`` the
    round's deadline less its reserve (``deadline-margin``); ``work`` the round's training
    samples × its time calibration; ``idle_power_w`` its board's idle power (NaN: unknown);
    ``max_work_share`` the most of its local work it may run (``max-work-share``).
    """

    choice: Selection
    fastest: Selection
    budget_s: float
    work: float
    idle_power_w: float
    max_work_share: float = math.inf


@dataclass(frozen=True)
class Reselect:
    """How a mode re-chooses a slack node's cell within its budget
    (``RoundContext.budget_s``): the changes to the node's objective (``selector.Objective``
    fields, e.g. ``time_weight`` 0) and, when set, the only batch size it may take."""

    changes: Mapping[str, float] = field(default_factory=dict)
    batch_size: int | None = None


def _all_of_it(slack: Slack, chosen: Selection) -> float:
    return 1.0


def _nothing(slack: Slack, chosen: Selection) -> Mapping[str, float]:
    return {}


@dataclass(frozen=True)
class Mode:
    """One ``balance`` mode.

    Attributes
    ----------
    doc : str
        Its doc line (settings help, docs/method.md).
    label : str
        Its arm's name in reports.
    plans : bool
        Whether the round plan runs at all (False: ``off``, each node its own Eq. 4 cell,
        no deadline).
    reselect : callable, optional
        ``Slack`` → ``Reselect``: the slack node's cell is chosen again with these changes
        to its objective, among the cells that meet its budget. None keeps its Eq. 4 cell.
    work_share : callable
        (``Slack``, the cell it runs) → the share of its local work it runs (default 1).
    report : callable
        (``Slack``, the cell it runs) → ``TrainReport`` fields the mode adds.
    reads : tuple of str
        The run settings only this mode reads (a run with another mode refuses or warns
        about them: ``fl_client.effective``).
    """

    doc: str
    label: str
    plans: bool = True
    reselect: Callable[[Slack], Reselect] | None = None
    work_share: Callable[[Slack, Selection], float] = _all_of_it
    report: Callable[[Slack, Selection], Mapping[str, float]] = _nothing
    reads: tuple[str, ...] = ()


#: A local time counts as over its deadline only beyond this share of it, whatever the
#: tolerance (float rounding: the pace-setter's deadline is its own predicted time, summed
#: in another order, and a twin run that matches it can come out one ulp over it).
DEADLINE_RTOL = 1e-9


def missed_deadline(time_s: float, deadline_s: float | None, tolerance: float = 0.0) -> bool:
    """Whether a round's local time missed its deadline: over it by more than
    ``tolerance`` (a share of it; the server's ``deadline-margin``), and never by the last
    bit of a float sum (``DEADLINE_RTOL``). The one rule of the node's ``deadline-miss``,
    the server's late nodes and the reports; no deadline (None) is never missed, nor a
    time that is not finite (not measured)."""
    if deadline_s is None or not math.isfinite(time_s):
        return False
    return time_s > deadline_s * (1.0 + max(tolerance, DEADLINE_RTOL))


def energy_saved_j(
    fastest: Selection, chosen: Selection, samples: float, idle_power_w: float
) -> float:
    """What ``chosen`` saves against ``fastest`` over a round of ``samples`` (× the node's
    calibration), by the LUT: a node that finishes sooner waits at its idle power until
    the round ends, so the saving is ``E(fastest) − E(chosen) + P_idle · (t(chosen) −
    t(fastest))`` (``idle_power_w`` NaN, unknown: 0). A prediction, not a measurement: the
    node never runs its fastest cell in that round."""
    idle = 0.0 if math.isnan(idle_power_w) else idle_power_w
    t_fast, t_chosen = fastest.time_per_sample_s * samples, chosen.time_per_sample_s * samples
    e_fast = fastest.energy_per_sample_j * samples
    e_chosen = chosen.energy_per_sample_j * samples
    return float(e_fast - e_chosen + idle * (t_chosen - t_fast))


def _least_r(slack: Slack) -> Reselect:
    return Reselect({"time_weight": 0.0})


def _fitting_share(slack: Slack, chosen: Selection) -> float:
    """The share of its local work that fits the budget at ``chosen`` (at least 1)."""
    at_choice = chosen.time_per_sample_s * slack.work
    return max(1.0, slack.budget_s / at_choice) if at_choice > 0 else 1.0


def _more_steps(slack: Slack, chosen: Selection) -> float:
    """Extra work that still fits the budget, at most ``max_work_share`` of it."""
    return min(_fitting_share(slack, chosen), slack.max_work_share)


def _share_report(slack: Slack, chosen: Selection) -> Mapping[str, float]:
    fits = _fitting_share(slack, chosen)
    return {
        "work_share": min(fits, slack.max_work_share),
        "work_share_capped": float(fits > slack.max_work_share),
    }


def _least_energy_at_own_b(slack: Slack) -> Reselect:
    idle = 0.0 if math.isnan(slack.idle_power_w) else slack.idle_power_w
    changes = {"energy_weight": 1.0, "idle_power_w": idle}
    return Reselect(changes, batch_size=slack.choice.batch_size)  # the same updates as off


def _energy_saved(slack: Slack, chosen: Selection) -> Mapping[str, float]:
    saved = energy_saved_j(slack.fastest, chosen, slack.work, slack.idle_power_w)
    return {"predicted_energy_saved_j": saved}


#: ``balance``: the modes by name, ``off`` (the default) first.
BALANCE_MODES: dict[str, Mode] = {
    "off": Mode(
        doc="`off`: each node its own Eq. 4 choice (the per-device rule); no round plan",
        label="power-aware, balance off (per-device rule)",
        plans=False,
    ),
    "samples": Mode(
        doc="`samples`: the least r_b that meets the deadline (time's weight 0; among its "
        "cells the least energy to accuracy)",
        label="balance = samples",
        reselect=_least_r,
    ),
    "steps": Mode(
        doc="`steps`: its Eq. 4 cell with more local steps, as many whole minibatches as fit, "
        "at most `max-work-share` times its local work",
        label="balance = steps",
        work_share=_more_steps,
        report=_share_report,
        reads=("max-work-share",),
    ),
    "energy": Mode(
        doc="`energy`: at its own b* (so its updates are those of `off`), the frequency of "
        "least energy above idle power that meets the deadline, reporting its predicted "
        "saving (`predicted-energy-saved-j`)",
        label="balance = energy",
        reselect=_least_energy_at_own_b,
        report=_energy_saved,
    ),
}


__all__ = [
    "BALANCE_MODES",
    "DEADLINE_RTOL",
    "Mode",
    "Reselect",
    "Slack",
    "energy_saved_j",
    "missed_deadline",
]
