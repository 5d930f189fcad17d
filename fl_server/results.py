"""Run records: per-round and per-node JSON lines, a summary, and the console table."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from strategies.power_aware import NodeReport, RoundReport


def new_run_dir(output_dir: str | Path, method: str) -> Path:
    """A fresh folder ``<output_dir>/<UTC time>-<method>`` (suffixed if it exists)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = Path(output_dir).expanduser().resolve() / f"{stamp}-{method}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    path.mkdir(parents=True)
    return path


def _json_default(obj: object) -> Any:
    if isinstance(obj, float) and math.isinf(obj):
        return "inf"
    if hasattr(obj, "tolist"):
        return obj.tolist()  # numpy
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON (atomically)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    tmp.replace(path)


@dataclass
class RoundRow:
    """One line of ``rounds.jsonl``."""

    server_round: int
    accuracy: float
    loss: float
    round_time_s: float
    sim_time_s: float
    round_energy_j: float
    fleet_energy_j: float
    # Idle energy of the nodes waiting for the slowest one (this round / cumulative)
    round_wait_energy_j: float
    fleet_wait_energy_j: float
    nodes_ok: int
    nodes_failed: int
    failed: list[str] = field(default_factory=list)
    # Pacing (None / 0 without a deadline this round)
    deadline_s: float | None = None
    deadline_misses: int = 0
    predicted_energy_saved_j: float = 0.0
    warnings: list[str] = field(default_factory=list)


def make_console() -> Console:
    """A console for run output: 120 columns when not on a terminal (logs, CI), so
    tables are not squeezed to rich's default of 80."""
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(highlight=False, width=None if wide else 120)


class RunRecorder:
    """Writes the records of one run as they happen, so a crash loses nothing written.

    Files in ``run_dir``: ``settings.json``, ``fleet.json``, ``r.json``, ``rounds.jsonl``
    (one line per round), ``nodes.jsonl`` (one line per node and round), ``summary.json``.
    Simulated time is device time: each synchronous round lasts as long as its slowest
    node (training plus, in the node's first round, profiling).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        method: str,
        target_accuracy: float,
        console: Console | None = None,
        pacing: str = "off",
    ) -> None:
        self.run_dir = run_dir
        self.pacing = pacing
        self.predicted_energy_saved_j = 0.0
        self.deadline_misses = 0
        self.drift_reprofiles = 0
        self.method = method
        self.target_accuracy = target_accuracy
        self.console = console or make_console()
        self._last_choices: list[str] = []
        self.rows: list[RoundRow] = []
        self.initial: dict[str, float] = {}
        self.sim_time_s = 0.0
        self.fleet_energy_j = 0.0
        self.fleet_wait_energy_j = 0.0
        self.wait_energy_to_target_j: float | None = None
        self.profile_time_s = 0.0
        self.train_time_s = 0.0
        self.node_totals: dict[str, dict[str, Any]] = {}
        self.time_to_target_s: float | None = None
        self.energy_to_target_j: float | None = None
        self.round_to_target: int | None = None

    def write(self, name: str, data: Any) -> None:
        write_json(self.run_dir / name, data)

    def _append(self, name: str, row: dict[str, Any]) -> None:
        with (self.run_dir / name).open("a") as fh:
            fh.write(json.dumps(row, default=_json_default) + "\n")

    def initial_eval(self, metrics: dict[str, float]) -> None:
        self.initial = dict(metrics)
        self.console.print(f"round   0  accuracy {metrics['accuracy']:.3f}  (initial global model)")

    def record_round(self, report: RoundReport, metrics: dict[str, float]) -> RoundRow:
        """Account one finished round, append its records and print its line."""
        self.sim_time_s += report.round_time_s
        self.fleet_energy_j += report.energy_j
        self.fleet_wait_energy_j += report.wait_energy_j
        self.profile_time_s += report.profile_time_s
        self.train_time_s += report.train_time_s
        failed = [f"{n.node_name}: {n.error}" for n in report.nodes if not n.ok]
        row = RoundRow(
            server_round=report.server_round,
            accuracy=float(metrics["accuracy"]),
            loss=float(metrics["loss"]),
            round_time_s=report.round_time_s,
            sim_time_s=self.sim_time_s,
            round_energy_j=report.energy_j,
            fleet_energy_j=self.fleet_energy_j,
            round_wait_energy_j=report.wait_energy_j,
            fleet_wait_energy_j=self.fleet_wait_energy_j,
            nodes_ok=len(report.ok_nodes),
            nodes_failed=len(failed),
            failed=failed,
            deadline_s=report.deadline_s,
            deadline_misses=report.deadline_misses,
            predicted_energy_saved_j=report.predicted_energy_saved_j,
            warnings=list(report.warnings),
        )
        self.predicted_energy_saved_j += report.predicted_energy_saved_j
        self.deadline_misses += report.deadline_misses
        self.drift_reprofiles += sum(
            int(n.metrics.get("drift-reprofiled", 0.0)) for n in report.ok_nodes
        )
        self.rows.append(row)
        self._append("rounds.jsonl", asdict(row))
        for node in report.nodes:
            self._record_node(node)
        if self.time_to_target_s is None and row.accuracy >= self.target_accuracy:
            self.time_to_target_s = self.sim_time_s
            self.energy_to_target_j = self.fleet_energy_j
            self.wait_energy_to_target_j = self.fleet_wait_energy_j
            self.round_to_target = row.server_round
        self._print_round(report, row)
        return row

    def _record_node(self, node: NodeReport) -> None:
        self._append(
            "nodes.jsonl",
            {
                "server-round": node.server_round,
                "node-name": node.node_name,
                "node-id": node.node_id,
                "device": node.device,
                "ok": node.ok,
                "error": node.error,
                **node.metrics,
            },
        )
        tot = self.node_totals.setdefault(
            node.node_name,
            {
                "device": node.device,
                "rounds-ok": 0,
                "rounds-failed": 0,
                "train-time-s": 0.0,
                "profile-time-s": 0.0,
                "energy-j": 0.0,
                "peak-power-w": 0.0,
                "p-max-w": math.inf,
                "batch-size": None,
                "gpu-freq-mhz": None,
            },
        )
        if not node.ok:
            tot["rounds-failed"] += 1
            return
        m = node.metrics
        tot["rounds-ok"] += 1
        tot["train-time-s"] += m["train-time-s"]
        tot["profile-time-s"] += m["profile-time-s"]
        tot["energy-j"] += m["energy-j"] + m["profile-energy-j"]
        tot["peak-power-w"] = max(tot["peak-power-w"], m["peak-power-w"])
        tot["p-max-w"] = m["p-max-w"]
        tot["batch-size"] = int(m["batch-size"])
        tot["gpu-freq-mhz"] = m["gpu-freq-mhz"]
        tot["predicted-energy-saved-j"] = tot.get("predicted-energy-saved-j", 0.0) + m.get(
            "predicted-energy-saved-j", 0.0
        )
        tot["deadline-misses"] = tot.get("deadline-misses", 0) + int(m.get("deadline-miss", 0.0))

    def _print_round(self, report: RoundReport, row: RoundRow) -> None:
        choices = sorted(
            {
                f"b{int(n.metrics['batch-size'])}@{n.metrics['gpu-freq-mhz']:g}"
                for n in report.ok_nodes
            }
        )
        over = sum(1 for n in report.ok_nodes if n.metrics["peak-power-w"] > n.metrics["p-max-w"])
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
        device_time_s = self.train_time_s + self.profile_time_s
        final = self.rows[-1] if self.rows else None
        return {
            "method": self.method,
            "rounds": len(self.rows),
            "initial-accuracy": self.initial.get("accuracy"),
            "final-accuracy": final.accuracy if final else None,
            "target-accuracy": self.target_accuracy,
            "round-to-target": self.round_to_target,
            "sim-time-to-target-s": self.time_to_target_s,
            "fleet-energy-to-target-j": self.energy_to_target_j,
            "sim-time-s": self.sim_time_s,
            "fleet-energy-j": self.fleet_energy_j,
            # Idle energy while waiting for the slowest node (not in fleet-energy-j)
            "fleet-wait-energy-j": self.fleet_wait_energy_j,
            "fleet-wait-energy-to-target-j": self.wait_energy_to_target_j,
            "device-train-time-s": self.train_time_s,
            "device-profile-time-s": self.profile_time_s,
            "profile-share": self.profile_time_s / device_time_s if device_time_s else 0.0,
            "pacing": self.pacing,
            "fleet-predicted-energy-saved-j": self.predicted_energy_saved_j,
            "deadline-misses": self.deadline_misses,
            "drift-reprofiles": self.drift_reprofiles,
            "nodes": self.node_totals,
            "run-dir": str(self.run_dir),
        }

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write ``summary.json`` and print the summary tables."""
        summ = {**self.summary(), **(extra or {})}
        self.write("summary.json", summ)
        self.print_summary(summ)
        return summ

    def print_summary(self, summ: dict[str, Any]) -> None:
        table = Table(title=f"Per node ({summ['method']})", title_justify="left")
        for col in (
            "node",
            "device",
            "cap",
            "b*",
            "f* MHz",
            "peak W",
            "train s",
            "profile s",
            "energy J",
            "failed",
        ):
            table.add_column(col, justify="left" if col in ("node", "device") else "right")
        for name, t in summ["nodes"].items():
            cap = t["p-max-w"]
            table.add_row(
                name,
                t["device"],
                "none" if math.isinf(cap) else f"{cap:g} W",
                str(t["batch-size"]),
                f"{t['gpu-freq-mhz']:g}" if t["gpu-freq-mhz"] is not None else "-",
                f"{t['peak-power-w']:.2f}",
                f"{t['train-time-s']:.1f}",
                f"{t['profile-time-s']:.1f}",
                f"{t['energy-j']:.1f}",
                str(t["rounds-failed"]),
            )
        self.console.print(table)
        ttt = summ["sim-time-to-target-s"]
        e2t = summ["fleet-energy-to-target-j"]
        self.console.print(
            f"[bold]{summ['method']}[/bold]: accuracy {summ['initial-accuracy']:.3f} → "
            f"{summ['final-accuracy']:.3f} in {summ['rounds']} rounds; "
            + (
                f"target {summ['target-accuracy']:.2f} reached in round "
                f"{summ['round-to-target']} after {ttt:.1f} s simulated device time "
                f"using {e2t:.1f} J fleet energy"
                if ttt is not None
                else f"target {summ['target-accuracy']:.2f} not reached"
            )
        )
        self.console.print(
            f"profiling took {summ['device-profile-time-s']:.1f} s of "
            f"{summ['device-profile-time-s'] + summ['device-train-time-s']:.1f} s device time "
            f"({100 * summ['profile-share']:.1f}%)"
        )
        self.console.print(
            f"waiting for the slowest node at idle power: {summ['fleet-wait-energy-j']:.1f} J "
            "(not in fleet energy)"
        )
        if summ.get("pacing", "off") != "off":
            self.console.print(
                f"pacing ({summ['pacing']}): {summ['fleet-predicted-energy-saved-j']:.1f} J "
                "predicted saving against running every node at f* (from the LUTs, not "
                f"measured), {summ['deadline-misses']} deadline misses"
            )
        if summ.get("drift-reprofiles"):
            self.console.print(f"drift checks re-profiled {summ['drift-reprofiles']} time(s)")
        self.console.print(f"results: {summ['run-dir']}")
