"""The records of a ``fedbuff`` run: the synchronous run's files, each global model version
in place of a round, plus one line per update (``updates.jsonl``).

A version's "round" is the virtual time since the previous version: ``rounds.jsonl`` holds
one line per version (its accuracy, its virtual time as ``sim-time-s``, the fleet's
energy so far), ``nodes.jsonl`` one line per update it applied, and ``summary.json`` the
synchronous run's keys (``round-to-target`` is the version, ``sim-time-to-target-s`` its
virtual time) with the buffer's own: ``idle-share``, staleness, updates.

**One accounting** (``AsyncRecorder.account_to``): the energy the devices spent in [0, a
version's virtual time], from the run's clock (``VirtualClock.account``): every work's
energy pro rata of its part inside, whether its update was applied, still buffered or not
taken yet (a device that trained spent it), and each node's idle time at its idle power.
The fleet's figures so far (``rounds.jsonl``, ``summary.json``), each node's totals
(``summary.json`` → ``nodes``: busy, training and profiling, idle) and ``idle-share`` are all
that one account, so the nodes' totals add up to the fleet's figures. Some of it is known
only later: a node's idle power comes with its first training reply (its wait for its
kind's LUT before it counts from then), and in a deployment a work still in flight when a
version is made counts once it replies. A version's energy (``round-*-energy-j``) is what
the account grew by since the previous version: the interval's, plus what became known of
the time before it; so the energy so far never decreases, and the last version's is the
summary's. A work with no reply when the run stops (``works-in-flight-at-end``) counts
neither busy nor idle from its start: its cost is not known.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import astuple, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from fl_client.contract import NodeRow, TrainReport
from fl_server.results import NodeTotals, RoundAccount, RunRecorder, choice_label
from fl_server.target import Target
from strategies.fedbuff import Applied, NodeTime, Update, VirtualClock, Work, staleness_weight
from strategies.power_aware import RoundReport


def update_record(
    update: Update, names: Mapping[int, str], applied: Applied | None, form: str
) -> dict[str, Any]:
    """One line of ``updates.jsonl``: the node, its work, virtual start and end, the version
    it started from and (``applied``) the one it went into, its staleness and weight, and
    the wall time its reply arrived at (``arrival`` ordering; else null)."""
    report: TrainReport | None = update.payload[1]  # None: fleet-shared profiling
    work = update.work
    return {
        "node": names.get(update.node_id, str(update.node_id)),
        "node-id": str(update.node_id),
        "work": work.number,
        "base-version": work.base_version,
        "version": None if applied is None else applied.version,
        "start-s": work.start_s,
        "end-s": update.end_s,
        "device-time-s": update.cost.time_s,
        "profile-time-s": update.cost.profile_time_s,
        "energy-j": update.cost.energy_j,
        "num-examples": update.samples,
        "staleness": None if applied is None else applied.staleness,
        "staleness-factor": (
            None if applied is None else staleness_weight(form, applied.staleness)
        ),
        "weight": None if applied is None else applied.weight,
        "step-scale": None if applied is None else applied.step_scale,
        "choice": "profiling" if report is None else choice_label(report),
        "arrival-wall-s": update.wall_s,
    }


def _interval_account(
    times: Mapping[int, NodeTime], names: Mapping[int, str], round_s: float
) -> RoundAccount:
    """A version's interval of virtual time as a ``RoundAccount``: each node's busy time
    and energy in it, training and profiling apart, and its idle time at idle power."""
    # by name, not Flower's ids (they change from run to run): the busiest of equals is stable
    named = sorted(((names.get(n, str(n)), t) for n, t in times.items()), key=lambda p: p[0])
    busy = {name: t.busy_s for name, t in named}
    profile_s = math.fsum(t.profile_s for t in times.values())
    profile_j = math.fsum(t.profile_j for t in times.values())
    return RoundAccount(  # fsum: the same figure whatever ids Flower gave the nodes
        round_time_s=round_s,
        train_time_s=math.fsum(t.busy_s for t in times.values()) - profile_s,
        profile_time_s=profile_s,
        train_energy_j=math.fsum(t.busy_j for t in times.values()) - profile_j,
        profile_energy_j=profile_j,
        idle_energy_j=math.fsum(t.idle_j for t in times.values()),
        busy_s=busy,
        deadline_misses=0,
        predicted_energy_saved_j=0.0,
        free_profiling_round_s=round_s,
    )


class AsyncRecorder(RunRecorder):
    """``RunRecorder`` for ``aggregation = "fedbuff"`` (see the module docstring): the
    server calls ``record_version`` per new global version and ``record_update`` per update
    taken; the accounting of a version comes from the run's ``VirtualClock``."""

    def __init__(
        self,
        run_dir: Path,
        *,
        method: str,
        target: Target,
        console: Console | None = None,
        idle_accounting: str = "on",
    ) -> None:
        super().__init__(
            run_dir,
            method=method,
            target=target,
            console=console,
            idle_accounting=idle_accounting,
        )
        self.clock: VirtualClock | None = None
        self.names: dict[int, str] = {}
        self.version_s: list[float] = [0.0]  # virtual time of each version
        self.updates: list[dict[str, Any]] = []
        #: works sent that had neither replied nor been dropped when the run stopped
        self.in_flight_at_end: list[Work] = []
        self._pending_account: RoundAccount | None = None
        #: node id -> its time and energy in [0, the last version's time] (``account_to``)
        self.accounted: dict[int, NodeTime] = {}
        #: the fleet's (busy s, idle s) in [0, each version's time], as accounted then
        self._on_s: list[tuple[float, float]] = [(0.0, 0.0)]
        self._templates: dict[int, NodeRow] = {}

    def start(
        self,
        clock: VirtualClock,
        names: Mapping[int, str],
        templates: Mapping[int, NodeRow] | None = None,
    ) -> None:
        """The run's clock, the nodes' names and (``templates``: ``Fleet.failed_row``) each
        node's device and cap, for the totals of a node none of whose updates was applied."""
        self.clock, self.names = clock, dict(names)
        self._templates = dict(templates or {})

    def record_update(self, update: Update, applied: Applied | None) -> None:
        """One update taken (``applied``: the version it went into; None: still buffered
        when the run stopped) as a line of ``updates.jsonl``."""
        assert self.clock is not None
        line = update_record(update, self.names, applied, self.clock.staleness_form)
        self.updates.append(line)
        self._append("updates.jsonl", line)

    def record_version(
        self, rows: Sequence[NodeRow], metrics: dict[str, float], warnings: Sequence[str] = ()
    ) -> None:
        """A new global version at the clock's current virtual time: its rows (one per
        update it applied, and any node that failed since the last), evaluation and
        accounting (``account_to``), through ``RunRecorder.record_round``."""
        assert self.clock is not None
        t0, t1 = self.version_s[-1], self.clock.now_s
        grown = self.account_to(t1)
        self._pending_account = _interval_account(grown, self.names, t1 - t0)
        self.version_s.append(t1)
        times = self.accounted.values()
        self._on_s.append((math.fsum(t.busy_s for t in times), math.fsum(t.idle_s for t in times)))
        report = RoundReport(self.clock.version, list(rows), warnings=list(warnings))
        self.record_round(report, metrics)

    def account_to(self, until_s: float) -> dict[int, NodeTime]:
        """Account [0, ``until_s``] again with all the clock knows now
        (``VirtualClock.account``) and return what each node's account grew by since the
        last call: its new part of the interval, and what became known of the time before
        (an idle power learned from a first training reply; in a deployment a work that was
        in flight). ``accounted`` keeps each node's account, field by field never lower
        than before, so the fleet's figures summed over the versions are the nodes'."""
        assert self.clock is not None
        grown: dict[int, NodeTime] = {}
        for node_id, now in self.clock.account(0.0, until_s).items():
            before = astuple(self.accounted.get(node_id, NodeTime()))
            after = NodeTime(*map(max, before, astuple(now)))
            self.accounted[node_id] = after
            grown[node_id] = NodeTime(*(b - a for a, b in zip(before, astuple(after), strict=True)))
        return grown

    def account_of(self, report: RoundReport) -> RoundAccount:
        account, self._pending_account = self._pending_account, None
        if account is None:
            raise RuntimeError("a fedbuff version is recorded by record_version")
        return account

    def _fix_node_totals(self) -> None:
        """Each node's time and energy over the run, training, profiling and idle
        (``wait-s``), from the run's one account (``accounted``, not from the rows of the
        updates applied: a version's rows hold only those, and no row holds a work that
        was not applied), a node none of whose updates was applied included; and no
        "slowest node": no one waits for it."""
        for node_id, t in self.accounted.items():
            name = self.names.get(node_id, str(node_id))
            totals = self.node_totals.get(name)
            if totals is None and t.busy_s + t.idle_s == 0:
                continue  # no row and no time on: nothing to show
            if totals is None:
                totals = self.node_totals[name] = _no_rows_totals(self._templates.get(node_id))
            totals.train_time_s = t.busy_s - t.profile_s
            totals.profile_time_s = t.profile_s
            totals.train_energy_j = t.busy_j - t.profile_j
            totals.profile_energy_j = t.profile_j
            totals.wait_s, totals.idle_energy_j = t.idle_s, t.idle_j
            totals.slowest_rounds, totals.slowest_time_s = 0, 0.0

    def summary(self) -> dict[str, Any]:
        """The synchronous summary's keys, those without meaning here null, and the
        buffer's: ``versions``, ``updates-applied``, ``idle-share`` (of the fleet's time,
        over the run and to the target), staleness, and the works still in flight when the
        run stopped (``works-in-flight-at-end``: a deployment does not wait for them; a node
        that died with its work is named there if its failure was not known yet)."""
        self._fix_node_totals()
        summ = super().summary()
        for key in (
            "sim-time-to-target-free-profiling-s",
            "critical-busy-energy-per-round-j",
            "critical-idle-energy-per-round-j",
            "slack-busy-energy-per-round-j",
            "slack-idle-energy-per-round-j",
        ):
            summ[key] = None
        applied = [u for u in self.updates if u["version"] is not None]
        stale = [int(u["staleness"]) for u in applied]
        upto = self.version_to_target()
        summ.update(
            {
                "aggregation": "fedbuff",
                "buffer-size": None if self.clock is None else self.clock.buffer_size,
                "staleness-weight": None if self.clock is None else self.clock.staleness_form,
                "rate-weight": None if self.clock is None else self.clock.rate_weight,
                "buffer-step": None if self.clock is None else self.clock.buffer_step,
                "versions": len(self.rows),
                # the nodes' training while they waited for their kinds' LUTs (work 0)
                "trained-while-waiting-s": math.fsum(
                    float(u["device-time-s"]) - float(u["profile-time-s"])
                    for u in applied
                    if u["work"] == 0
                ),
                "updates-applied": len(applied),
                "updates-buffered-at-end": len(self.updates) - len(applied),
                "mean-staleness": sum(stale) / len(stale) if stale else None,
                "max-staleness": max(stale, default=None),
                "idle-share": self.idle_share(len(self.version_s) - 1),
                "idle-share-to-target": self.idle_share(upto) if upto is not None else None,
                "works-in-flight-at-end": [
                    {
                        "node": self.names.get(w.node_id, str(w.node_id)),
                        "work": w.number,
                        "base-version": w.base_version,
                    }
                    for w in self.in_flight_at_end
                ],
            }
        )
        return summ

    def version_to_target(self) -> int | None:
        """The version at which the run reached its target, by the run's target rule
        (``fl_server.target``: the mean over ``target-window`` versions); None: not yet."""
        return self.target.round_reached([row.accuracy for row in self.rows])

    def idle_share(self, version: int) -> float | None:
        """The fleet's idle time over its time on (busy + idle) in [0, ``version``'s time],
        as its energy is accounted (``account_to``); None before the first version."""
        if not 0 < version < len(self._on_s):
            return None
        busy_s, idle_s = self._on_s[version]
        return idle_s / (busy_s + idle_s) if busy_s + idle_s else None

    def print_summary(self, summ: dict[str, Any]) -> None:
        super().print_summary(summ)
        share = summ.get("idle-share")
        stale = summ.get("mean-staleness")
        self.console.print(
            f"fedbuff: {summ['versions']} versions from {summ['updates-applied']} updates "
            f"(buffer-size {summ['buffer-size']}, staleness-weight {summ['staleness-weight']}"
            + (f", rate-weight {summ['rate-weight']}" if summ.get("rate-weight") else "")
            + (f", buffer-step {summ['buffer-step']}" if summ.get("buffer-step") else "")
            + ")"
            + (f", mean staleness {stale:.2f}" if stale is not None else "")
            + (f", idle share of the fleet {100 * share:.1f}%" if share is not None else "")
            + "; rounds above are model versions, times are virtual device time"
        )


def _no_rows_totals(template: NodeRow | None) -> NodeTotals:
    """The totals of a node none of whose updates was applied: its device and cap from its
    row template (None: unknown), no rounds."""
    if template is None:
        return NodeTotals("?")
    label = template.p_max.label
    return NodeTotals(
        template.device, p_max_w=template.p_max.to_record(), cap_label=label, caps=[label]
    )


def update_row(row: NodeRow, report: TrainReport, shared: tuple[float, float]) -> NodeRow:
    """A node's row for an applied update (``row``: its failed-row template), with its
    fleet-shared profiling slices on its first update only (``shared``)."""
    return replace(
        row,
        ok=True,
        report=report,
        p_max=report.cap,
        shared_time_s=shared[0],
        shared_energy_j=shared[1],
    )
