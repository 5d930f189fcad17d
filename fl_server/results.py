"""Run records: per-round and per-node JSON lines, a summary, and the console table."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fl_client.contract import (
    RECORD_VERSION,
    NodeRow,
    RoundRow,
    TrainReport,
    key_of,
    to_record,
)
from fl_client.settings import IDLE_ACCOUNTING
from fl_server.target import Target
from strategies.power_aware import RoundReport

#: Set by the process that runs the simulation when a signal ended the run: a ServerApp
#: thread that still winds down then writes no summary.json (the run did not finish; its
#: rounds so far stay in rounds.jsonl and nodes.jsonl).
RUN_STOPPED = threading.Event()


def new_run_dir(output_dir: str | Path, method: str) -> Path:
    """A fresh folder ``<output_dir>/<UTC time>-<method>``, created atomically (suffixed if
    it exists), so two runs started at once never share one."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    parent = Path(output_dir).expanduser().resolve()
    parent.mkdir(parents=True, exist_ok=True)
    for k in range(1, 10_000):
        path = parent / (f"{stamp}-{method}" if k == 1 else f"{stamp}-{method}-{k}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"output-dir: no free run folder for {stamp}-{method} in {parent}")


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented standard JSON (no Infinity/NaN: null), atomically."""
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(to_record(data), indent=2, allow_nan=False) + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class RoleEnergy:
    """One role's energy in a round: ``busy_j`` training and profiling, ``idle_j`` waiting at
    idle power for the rest of the round."""

    busy_j: float = 0.0
    idle_j: float = 0.0


@dataclass(frozen=True)
class RoundAccount:
    """The accounting of one synchronous round, done once: the round lasts as long as its
    slowest node's device time (training plus profiling); energy is the fleet's sum; a node
    that finishes early waits at idle power for the rest of the round (its board is on; an
    unknown idle power counts 0; a node without a report this round counts no idle energy:
    its board may be off). The round's **critical** node is its slowest (it sets the round
    time); the **slack** nodes are the others that reported."""

    round_time_s: float
    train_time_s: float
    profile_time_s: float
    train_energy_j: float
    profile_energy_j: float
    idle_energy_j: float
    busy_s: dict[str, float]  # node -> training + profiling time
    deadline_misses: int
    predicted_energy_saved_j: float
    #: The round's length had profiling cost nothing: the slowest node's training alone
    free_profiling_round_s: float = 0.0
    critical: RoleEnergy = RoleEnergy()
    slack: RoleEnergy = RoleEnergy()

    @property
    def busy_energy_j(self) -> float:
        """Training and profiling, summed over the fleet (no idle waiting)."""
        return self.train_energy_j + self.profile_energy_j

    def energy_j(self, idle_accounting: str) -> float:
        """The round's fleet energy as ``idle-accounting`` counts it: training and profiling,
        plus idle waiting when ``on``."""
        return self.busy_energy_j + (self.idle_energy_j if idle_accounting == "on" else 0.0)

    @property
    def slowest(self) -> str | None:
        return max(self.busy_s, key=lambda k: self.busy_s[k]) if self.busy_s else None

    @classmethod
    def of(cls, report: RoundReport) -> RoundAccount:
        """Fleet-shared profiling exchanges before the training are synchronous steps of
        their own: they add their slowest node's time to the round, and every node's own
        slice time to its busy time and its profiling."""
        ok = [(n.node_name, n.report) for n in report.nodes if n.ok and n.report is not None]
        shared = {n.node_name: (n.shared_time_s, n.shared_energy_j) for n in report.nodes}
        train_round_s = max((r.train_time_s + r.profile_time_s for _, r in ok), default=0.0)
        round_s = report.shared_round_s + train_round_s
        busy = {name: shared[name][0] + r.train_time_s + r.profile_time_s for name, r in ok}
        idle_j = {
            name: r.idle_power_w * (round_s - busy[name]) if math.isfinite(r.idle_power_w) else 0.0
            for name, r in ok
        }
        busy_j = {name: shared[name][1] + r.train_energy_j + r.profile_energy_j for name, r in ok}
        critical = max(busy, key=lambda k: busy[k]) if busy else None
        slack = [name for name in busy if name != critical]
        return cls(
            round_time_s=round_s,
            train_time_s=sum(r.train_time_s for _, r in ok),
            profile_time_s=sum(r.profile_time_s for _, r in ok)
            + sum(t for t, _ in shared.values()),
            train_energy_j=sum(r.train_energy_j for _, r in ok),
            profile_energy_j=sum(r.profile_energy_j for _, r in ok)
            + sum(e for _, e in shared.values()),
            idle_energy_j=sum(idle_j.values()),
            busy_s=busy,
            deadline_misses=sum(int(r.deadline_miss or 0) for _, r in ok),
            free_profiling_round_s=max((r.train_time_s for _, r in ok), default=0.0),
            predicted_energy_saved_j=sum(r.predicted_energy_saved_j or 0.0 for _, r in ok),
            critical=(RoleEnergy(busy_j[critical], idle_j[critical]) if critical else RoleEnergy()),
            slack=RoleEnergy(sum(busy_j[n] for n in slack), sum(idle_j[n] for n in slack)),
        )


@dataclass
class NodeTotals:
    """One node over the run (``summary.json`` → ``nodes``): written once, read by reports.

    In a ``fedbuff`` run (``fl_server.async_records``) its time and energy (training,
    profiling, ``wait_s``: idle time, ``idle_energy_j``) are its part of the run's one
    account instead of its rows' sums: every work's part in [0, the last version], applied
    or not, and its idle time at idle power; ``rounds`` still count its rows."""

    device: str
    p_max_w: float | None = None  # the cap of its last round (null: none)
    cap_label: str = "none"
    rounds: int = 0
    rounds_ok: int = 0
    rounds_failed: int = 0
    train_time_s: float = 0.0
    profile_time_s: float = 0.0
    train_energy_j: float = 0.0
    profile_energy_j: float = 0.0
    wait_s: float = 0.0
    idle_energy_j: float = 0.0  # at idle power while waiting for the round's slowest node
    slowest_rounds: int = 0
    slowest_time_s: float = 0.0
    over_cap_rounds: int = 0  # rounds whose peak power was above the cap
    violation_rounds: int = 0  # rounds the cap guard had to step down in
    peak_power_w: float = 0.0
    time_over_cap_s: float = 0.0
    drift_reprofiles: int = 0
    predicted_energy_saved_j: float = 0.0
    deadline_misses: int = 0
    batch_size: int | None = None
    gpu_freq_mhz: float | None = None
    gpu_power_limit_w: float | None = None  # the knob, when it is the GPU power limit
    caps: list[str] = field(default_factory=list)
    choices: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, row: NodeRow, account: RoundAccount) -> None:
        self.rounds += 1
        self.p_max_w, self.cap_label = row.p_max.to_record(), row.p_max.label
        if row.p_max.label not in self.caps:
            self.caps.append(row.p_max.label)
        r = row.report
        if not row.ok or r is None:
            self.profile_time_s += row.shared_time_s
            self.profile_energy_j += row.shared_energy_j
            self.rounds_failed += 1
            reason = row.error[:120]
            self.errors[reason] = self.errors.get(reason, 0) + 1
            return
        self.rounds_ok += 1
        self.train_time_s += r.train_time_s
        self.profile_time_s += r.profile_time_s + row.shared_time_s
        self.train_energy_j += r.train_energy_j
        self.profile_energy_j += r.profile_energy_j + row.shared_energy_j
        wait = account.round_time_s - account.busy_s[row.node_name]
        self.wait_s += wait
        if math.isfinite(r.idle_power_w):
            self.idle_energy_j += r.idle_power_w * wait
        if account.slowest == row.node_name:
            self.slowest_rounds += 1
            self.slowest_time_s += account.round_time_s
        self.over_cap_rounds += int(r.peak_power_w > r.p_max_w)
        self.violation_rounds += int(r.cap_violations > 0)
        self.peak_power_w = max(self.peak_power_w, r.peak_power_w)
        self.time_over_cap_s += r.time_over_cap_s
        self.drift_reprofiles += int(r.drift_reprofiled or 0)
        self.predicted_energy_saved_j += r.predicted_energy_saved_j or 0.0
        self.deadline_misses += int(r.deadline_miss or 0)
        self.batch_size, self.gpu_freq_mhz = int(r.batch_size), r.gpu_freq_mhz
        self.gpu_power_limit_w = r.gpu_power_limit_w
        choice = choice_label(r)
        self.choices[choice] = self.choices.get(choice, 0) + 1

    def to_record(self, sim_time_s: float) -> dict[str, Any]:
        out = {key_of(f.name): getattr(self, f.name) for f in fields(self)}
        if self.gpu_power_limit_w is None:  # the GPU frequency was the knob
            del out["gpu-power-limit-w"]
        out["mean-wait-s"] = self.wait_s / self.rounds_ok if self.rounds_ok else None
        out["slowest-share"] = self.slowest_rounds / self.rounds if self.rounds else 0.0
        out["slowest-time-share"] = self.slowest_time_s / sim_time_s if sim_time_s else 0.0
        return dict(to_record(out))


def choice_label(r: TrainReport) -> str:
    """A node's choice: ``b32@921.6`` (b at the GPU frequency in MHz) or ``b32@300W`` (at
    a GPU power limit)."""
    if r.gpu_power_limit_w is not None:
        return f"b{int(r.batch_size)}@{r.gpu_power_limit_w:g}W"
    return f"b{int(r.batch_size)}@{r.gpu_freq_mhz:g}"


def knob_label(totals: dict[str, Any]) -> str:
    """The ``f*`` column of a node's summary: MHz, or ``300 W`` for a power limit."""
    if totals.get("gpu-power-limit-w") is not None:
        return f"{totals['gpu-power-limit-w']:g} W"
    return f"{totals['gpu-freq-mhz']:g}" if totals["gpu-freq-mhz"] is not None else "-"


def knob_header(nodes: dict[str, dict[str, Any]]) -> str:
    """The heading of the ``f*`` column: ``f* MHz`` when every node's knob is the GPU
    frequency, ``limit* W`` when every node's is the GPU power limit, both when mixed."""
    limits = [t.get("gpu-power-limit-w") is not None for t in nodes.values()]
    if limits and all(limits):
        return "limit* W"
    return "f* MHz / limit* W" if any(limits) else "f* MHz"


def make_console() -> Console:
    """A console for run output: 120 columns when not on a terminal (logs, CI), so
    tables are not squeezed to rich's default of 80."""
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(highlight=False, width=None if wide else 120)


class RunRecorder:
    """Writes the records of one run as they happen, so a crash loses nothing written.

    Files in ``run_dir``: ``settings.json``, ``fleet.json``, ``r.json``, ``rounds.jsonl``
    (one ``RoundRow`` per round), ``nodes.jsonl`` (one ``NodeRow`` per node and round),
    ``summary.json``; all standard JSON, kebab-case (see ``fl_client.contract``). The
    recorder is the one place that accounts time and energy (``RoundAccount``, ``NodeTotals``);
    reports read its records and never re-derive them. Simulated time is device time: each
    synchronous round lasts as long as its slowest node (training plus profiling). The
    headline fleet energy counts idle waiting when ``idle_accounting`` is ``on`` (a board
    that waits for the round is switched on); the records hold training + profiling
    (``busy``) and idle waiting (``idle``) apart either way.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        method: str,
        target: Target,
        console: Console | None = None,
        balance: str = "off",
        idle_accounting: str = "on",
    ) -> None:
        RUN_STOPPED.clear()  # a new run: nothing has stopped it yet
        if idle_accounting not in IDLE_ACCOUNTING:
            raise ValueError(
                f"idle-accounting: unknown value {idle_accounting!r}; "
                f"allowed: {', '.join(IDLE_ACCOUNTING)}"
            )
        self.run_dir = run_dir
        self.balance = balance
        self.idle_accounting = idle_accounting
        self.method = method
        self.target = target
        self.console = console or make_console()
        self._last_choices: list[str] = []
        self.rows: list[RoundRow] = []
        self.accounts: list[RoundAccount] = []
        self.initial: dict[str, float] = {}
        self.node_totals: dict[str, NodeTotals] = {}
        #: Nodes left out at the QUERY (their device could not be opened, …): records of
        #: ``untrained-nodes``, set by the server once the fleet has answered.
        self.left_out: list[dict[str, Any]] = []
        self._full_errors: dict[tuple[str, str], str] = {}  # (node, error[:120]) -> error

    def write(self, name: str, data: Any) -> None:
        write_json(self.run_dir / name, data)

    def _append(self, name: str, row: dict[str, Any]) -> None:
        with (self.run_dir / name).open("a") as fh:
            fh.write(json.dumps(to_record(row), allow_nan=False) + "\n")

    def initial_eval(self, metrics: dict[str, float]) -> None:
        self.initial = dict(metrics)
        self.console.print(f"round   0  accuracy {metrics['accuracy']:.3f}  (initial global model)")

    @property
    def sim_time_s(self) -> float:
        return sum(a.round_time_s for a in self.accounts)

    def _sum(self, attr: str, upto: int | None = None) -> float:
        """Sum of one ``RoundAccount`` figure over the rounds (up to round index ``upto``)."""
        return float(sum(getattr(a, attr) for a in self.accounts[:upto]))

    def _energy(self, upto: int | None = None) -> float:
        """The fleet's energy over the rounds (up to round index ``upto``) as
        ``idle-accounting`` counts it."""
        return float(sum(a.energy_j(self.idle_accounting) for a in self.accounts[:upto]))

    def _per_round(self, role: str, part: str) -> float | None:
        """A role's (``critical``, ``slack``) mean energy per round, ``busy_j`` or ``idle_j``,
        over the rounds in which some node reported."""
        held = [getattr(getattr(a, role), part) for a in self.accounts if a.busy_s]
        return sum(held) / len(held) if held else None

    def account_of(self, report: RoundReport) -> RoundAccount:
        """The round's accounting: a synchronous round's (``RoundAccount.of``); a recorder
        of another schedule (``fl_server.async_records``) accounts its own."""
        return RoundAccount.of(report)

    def record_round(self, report: RoundReport, metrics: dict[str, float]) -> RoundRow:
        """Account one finished round, append its records and print its line."""
        account = self.account_of(report)
        self.accounts.append(account)
        failed = [f"{n.node_name}: {n.error}" for n in report.nodes if not n.ok]
        row = RoundRow(
            server_round=report.server_round,
            accuracy=float(metrics["accuracy"]),
            loss=float(metrics["loss"]),
            round_time_s=account.round_time_s,
            sim_time_s=self.sim_time_s,
            round_energy_j=account.energy_j(self.idle_accounting),
            fleet_energy_j=self._energy(),
            round_busy_energy_j=account.busy_energy_j,
            fleet_busy_energy_j=self._sum("busy_energy_j"),
            round_idle_energy_j=account.idle_energy_j,
            fleet_idle_energy_j=self._sum("idle_energy_j"),
            nodes_ok=len(report.ok_nodes),
            nodes_failed=len(failed),
            failed=failed,
            deadline_s=report.deadline_s,
            deadline_misses=account.deadline_misses,
            predicted_energy_saved_j=account.predicted_energy_saved_j,
            warnings=list(report.warnings),
            critical_node=account.slowest,
            critical_busy_energy_j=account.critical.busy_j,
            critical_idle_energy_j=account.critical.idle_j,
            slack_busy_energy_j=account.slack.busy_j,
            slack_idle_energy_j=account.slack.idle_j,
        )
        self.rows.append(row)
        self._append("rounds.jsonl", row.to_record())
        for node in report.nodes:
            self._append("nodes.jsonl", node.to_record())
            if not node.ok:
                self._full_errors.setdefault((node.node_name, node.error[:120]), node.error)
            self.node_totals.setdefault(node.node_name, NodeTotals(node.device)).add(node, account)
        self._print_round(report, row)
        return row

    def _print_round(self, report: RoundReport, row: RoundRow) -> None:
        reports = report.reports()
        choices = sorted({choice_label(r) for r in reports})
        over = sum(1 for r in reports if r.peak_power_w > r.p_max_w)
        line = (
            f"round {row.server_round:3d}  accuracy {row.accuracy:.3f}  "
            f"round {row.round_time_s:7.1f} s  sim time {row.sim_time_s:8.1f} s  "
            f"fleet energy {row.fleet_energy_j:8.1f} J  "
            f"nodes {row.nodes_ok}/{row.nodes_ok + row.nodes_failed}"
        )
        if over:
            line += f"  [red]{over} over cap[/red]"
        if row.deadline_s is not None:
            line += (
                f"  deadline {row.deadline_s:.1f} s, predicted saving "
                f"{row.predicted_energy_saved_j:.1f} J, "
                f"misses {row.deadline_misses}"
            )
        self.console.print(line)
        for w in row.warnings:
            self.console.print(f"           [yellow]warning[/yellow] {w}")
        if choices != self._last_choices:  # (b*, f*) per node: shown when they change
            self.console.print(f"           (b*, f*): {', '.join(choices)}", style="dim")
            self._last_choices = choices
        for f in row.failed:
            self.console.print(f"           [yellow]failed[/yellow] {f}")

    def summary(self) -> dict[str, Any]:
        """The run's headline numbers (also written to ``summary.json``)."""
        train_s, profile_s = self._sum("train_time_s"), self._sum("profile_time_s")
        device_time_s = train_s + profile_s
        final = self.rows[-1] if self.rows else None
        totals = self.node_totals.values()
        return {
            "record-version": RECORD_VERSION,
            "method": self.method,
            "rounds": len(self.rows),
            "initial-accuracy": self.initial.get("accuracy"),
            "final-accuracy": final.accuracy if final else None,
            "idle-accounting": self.idle_accounting,
            **self._to_target(),
            "sim-time-s": self.sim_time_s,
            "fleet-energy-j": self._energy(),
            "fleet-busy-energy-j": self._sum("busy_energy_j"),
            "fleet-train-energy-j": self._sum("train_energy_j"),
            "fleet-profile-energy-j": self._sum("profile_energy_j"),
            "fleet-idle-energy-j": self._sum("idle_energy_j"),
            # Energy per round by node role: the critical node (the round's slowest) and the
            # slack nodes (the rest), training + profiling and idle waiting apart
            "critical-busy-energy-per-round-j": self._per_round("critical", "busy_j"),
            "critical-idle-energy-per-round-j": self._per_round("critical", "idle_j"),
            "slack-busy-energy-per-round-j": self._per_round("slack", "busy_j"),
            "slack-idle-energy-per-round-j": self._per_round("slack", "idle_j"),
            "device-train-time-s": train_s,
            "device-profile-time-s": profile_s,
            "profile-share": profile_s / device_time_s if device_time_s else 0.0,
            "balance": self.balance,
            "fleet-predicted-energy-saved-j": self._sum("predicted_energy_saved_j"),
            "deadline-misses": int(self._sum("deadline_misses")),
            "drift-reprofiles": sum(t.drift_reprofiles for t in totals),
            "node-rounds-failed": sum(t.rounds_failed for t in totals),
            "over-cap-node-rounds": sum(t.over_cap_rounds for t in totals),
            "fleet-time-over-cap-s": sum(t.time_over_cap_s for t in totals),
            "nodes": {name: t.to_record(self.sim_time_s) for name, t in self.node_totals.items()},
            "untrained-nodes": self.untrained_nodes(),
            "run-dir": str(self.run_dir),
        }

    def _to_target(self) -> dict[str, Any]:
        """The target's figures: ``round-to-target`` and the time and energy up to it by the
        window rule (the first round whose mean accuracy over ``target-window`` rounds
        reaches the target), and the first round at the target with its time and energy
        (``first-round-at-target``: the rule of record version 3, which a lucky round can
        decide). None where the run did not reach the target by that rule."""
        accuracies = [row.accuracy for row in self.rows]
        upto, first = self.target.round_reached(accuracies), self.target.first_round(accuracies)

        def upto_target(value: float) -> float | None:
            return value if upto is not None else None

        def upto_first(value: float) -> float | None:
            return value if first is not None else None

        return {
            "target-accuracy": self.target.accuracy,
            "target-window": self.target.window,
            "round-to-target": self.rows[upto - 1].server_round if upto else None,
            "sim-time-to-target-s": upto_target(self._sum("round_time_s", upto)),
            # The same rounds had profiling cost nothing (the limit of cheaper profiling)
            "sim-time-to-target-free-profiling-s": upto_target(
                self._sum("free_profiling_round_s", upto)
            ),
            # The headline: training, profiling and (idle-accounting = on) idle waiting
            "fleet-energy-to-target-j": upto_target(self._energy(upto)),
            # Its parts: training + profiling (busy), idle waiting for the slowest node
            "fleet-busy-energy-to-target-j": upto_target(self._sum("busy_energy_j", upto)),
            "fleet-idle-energy-to-target-j": upto_target(self._sum("idle_energy_j", upto)),
            "first-round-at-target": self.rows[first - 1].server_round if first else None,
            "sim-time-to-first-target-s": upto_first(self._sum("round_time_s", first)),
            "fleet-energy-to-first-target-j": upto_first(self._energy(first)),
        }

    def untrained_nodes(self) -> list[dict[str, Any]]:
        """Every node that never trained in this run: those left out at the QUERY, then
        those whose every TRAIN failed, each with its real cap and the reason."""
        failed = []
        for name, t in self.node_totals.items():
            if t.rounds and not t.rounds_ok:
                top = max(t.errors, key=lambda e: t.errors[e]) if t.errors else ""
                failed.append(
                    {
                        "node": name,
                        "device": t.device,
                        "p-max-w": t.p_max_w,
                        "cap-label": t.cap_label,
                        "stage": "train",
                        "rounds-failed": t.rounds_failed,
                        "reason": self._full_errors.get((name, top), top),  # the most frequent
                    }
                )
        return [*self.left_out, *failed]

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write ``summary.json`` and print the summary tables."""
        summ = to_record({**self.summary(), **(extra or {})})
        if RUN_STOPPED.is_set():
            return dict(summ)
        self.write("summary.json", summ)
        self.print_summary(summ)
        return dict(summ)

    def print_summary(self, summ: dict[str, Any]) -> None:
        self.console.print(node_table(summ))
        self.console.print(
            f"[bold]{summ['method']}[/bold]: accuracy {summ['initial-accuracy']:.3f} → "
            f"{summ['final-accuracy']:.3f} in {summ['rounds']} rounds; {target_text(summ)}"
        )
        self.console.print(
            f"profiling took {summ['device-profile-time-s']:.1f} s of "
            f"{summ['device-profile-time-s'] + summ['device-train-time-s']:.1f} s device time "
            f"({100 * summ['profile-share']:.1f}%)"
        )
        counted = summ.get("idle-accounting") == "on"
        self.console.print(
            f"fleet energy {summ['fleet-energy-j']:.1f} J: training + profiling "
            f"{summ['fleet-busy-energy-j']:.1f} J, waiting for the slowest node at idle power "
            f"{summ['fleet-idle-energy-j']:.1f} J "
            + (
                "(counted: idle-accounting = on)"
                if counted
                else "(not counted: idle-accounting = off)"
            )
        )
        if summ.get("critical-busy-energy-per-round-j") is not None:
            self.console.print(
                "energy per round: critical node (the slowest) "
                f"{summ['critical-busy-energy-per-round-j']:.2f} J busy + "
                f"{summ['critical-idle-energy-per-round-j']:.2f} J idle; slack nodes "
                f"{summ['slack-busy-energy-per-round-j']:.2f} J busy + "
                f"{summ['slack-idle-energy-per-round-j']:.2f} J idle"
            )
        if summ.get("balance", "off") != "off":
            saving = (
                f"{summ['fleet-predicted-energy-saved-j']:.1f} J predicted saving against "
                "every node at its fastest cell (from the LUTs), "
                if summ["balance"] == "energy"
                else ""
            )
            self.console.print(
                f"round plan (balance = {summ['balance']}): {saving}"
                f"{summ['deadline-misses']} deadline misses"
            )
        if summ.get("drift-reprofiles"):
            self.console.print(f"drift checks re-profiled {summ['drift-reprofiles']} time(s)")
        for node in summ.get("untrained-nodes", []):
            self.console.print(f"[red]never trained[/red] {untrained_label(node)}")
        self.console.print(f"results: {summ['run-dir']}")


def target_text(summ: dict[str, Any]) -> str:
    """The end-of-run words on the target: the round that reached it by the window rule
    (``reached 0.85 in round 16 (mean of rounds 14–16) after …``) and, where it differs,
    the first round at the target (``first round at 0.85: 13 (…)``)."""
    target, window = summ["target-accuracy"], summ["target-window"]
    r2t, first = summ["round-to-target"], summ["first-round-at-target"]
    if r2t is None:
        text = f"target {target:.2f} not reached" + (
            f" (mean of {window} rounds)" if window > 1 else ""
        )
    else:
        idle = summ["fleet-idle-energy-to-target-j"]
        text = (
            f"target {target:.2f} reached in round {r2t}"
            + (f" (mean of rounds {r2t - window + 1}–{r2t})" if window > 1 else "")
            + f" after {summ['sim-time-to-target-s']:.1f} s simulated device time using "
            f"{summ['fleet-energy-to-target-j']:.1f} J fleet energy ("
            f"{summ['fleet-busy-energy-to-target-j']:.1f} J training + profiling"
            + (
                f", {idle:.1f} J idle waiting)"
                if summ.get("idle-accounting") == "on"
                else f"; {idle:.1f} J idle waiting not counted)"
            )
        )
    if first is not None and first != r2t:
        text += (
            f"; first round at {target:.2f}: {first} "
            f"({summ['sim-time-to-first-target-s']:.1f} s, "
            f"{summ['fleet-energy-to-first-target-j']:.1f} J)"
        )
    return text


def node_table(summ: dict[str, Any]) -> Table:
    """The per-node table of a run's summary: choice, peak, time and energy of each node."""
    table = Table(title=f"Per node ({summ['method']})", title_justify="left")
    for col in (
        "node",
        "device",
        "cap",
        "b*",
        knob_header(summ["nodes"]),
        "peak W",
        "train s",
        "profile s",
        "energy J",
        "idle J",
        "failed",
    ):
        table.add_column(col, justify="left" if col in ("node", "device") else "right")
    for name, t in summ["nodes"].items():
        table.add_row(
            name,
            t["device"],
            t["cap-label"],
            str(t["batch-size"]),
            knob_label(t),
            f"{t['peak-power-w']:.2f}",
            f"{t['train-time-s']:.1f}",
            f"{t['profile-time-s']:.1f}",
            f"{t['train-energy-j'] + t['profile-energy-j']:.1f}",
            f"{t['idle-energy-j']:.1f}",
            str(t["rounds-failed"]),
        )
    return table


def untrained_label(node: dict[str, Any]) -> str:
    """``ghost (jetson-nano, cap 4.5 W): its device could not be opened: <reason>``: one
    entry of ``untrained-nodes``, for a console line."""
    if node.get("node") is not None:
        who = f"{node['node']} ({node.get('device') or '?'}, cap {node.get('cap-label') or '?'})"
    elif node.get("one-of"):
        who = f"node {node['node-id']} (one of {', '.join(node['one-of'])})"
    else:
        who = f"node {node['node-id']}"
    if node.get("stage") == "query":
        why = "it could not describe its device (QUERY failed)"
    else:
        n = int(node.get("rounds-failed") or 0)
        why = f"its TRAIN failed in all {n} round{'s' if n != 1 else ''} it was asked"
    return f"{who}: {why}: {node.get('reason', '')}"
