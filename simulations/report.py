"""A finished run read back from its folder's JSON records, and the numbers its pictures
draw: who was busy, profiling or waiting in each round on the device clock, and accuracy
against device time and fleet energy. Pure data: ``report_plots`` draws it.

The records are the recorder's (``fl_server.results.RunRecorder``), never re-derived: a
round starts where the previous one ended on the fleet's device clock (``sim-time-s`` less
``round-time-s``); a fleet-shared profiling step, when the round had one, comes first and
lasts as long as its slowest node's slices; then each node profiles (``profile-time-s``),
trains (``train-time-s``) and waits at idle power until the round's slowest node is done.

A ``fedbuff`` run (``aggregation = "fedbuff"``, ``fl_server.async_records``) has no rounds:
its timeline is drawn from ``updates.jsonl``, each node of ``fleet.json`` on its own
virtual clock (``fedbuff_segments``), and its "rounds" are global versions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fl_client.contract import RECORD_VERSION
from fl_client.files import RUN_LOCK
from fl_client.settings import SettingsError

#: The records a finished run folder holds that a report reads.
SUMMARY, ROUNDS, NODES = "summary.json", "rounds.jsonl", "nodes.jsonl"
RUN_FILES = (SUMMARY, ROUNDS, NODES)
#: A ``fedbuff`` run's one line per update taken (``fl_server.async_records``), and the
#: nodes that answered its QUERY (``fl_server.server_app.record_fleet``; a run started
#: without the server app has none): its timeline has a row for each, also for a node
#: whose first update was never taken.
UPDATES, FLEET = "updates.jsonl", "fleet.json"
#: What each record must carry for the pictures and the table.
SUMMARY_KEYS = (
    "method",
    "rounds",
    "initial-accuracy",
    "target-accuracy",
    "target-window",
    "round-to-target",
    "first-round-at-target",
    "sim-time-to-target-s",
    "fleet-busy-energy-to-target-j",
    "fleet-idle-energy-to-target-j",
    "sim-time-s",
    "fleet-busy-energy-j",
    "fleet-idle-energy-j",
    "profile-share",
)
ROUND_KEYS = (
    "server-round",
    "accuracy",
    "round-time-s",
    "sim-time-s",
    "fleet-busy-energy-j",
    "fleet-idle-energy-j",
    "deadline-s",
)
NODE_KEYS = ("server-round", "node-name", "ok", "shared-time-s")
OK_NODE_KEYS = ("train-time-s", "profile-time-s")
UPDATE_KEYS = ("node", "work", "start-s", "end-s", "profile-time-s")
#: What a timeline bar shows: fleet-shared and own profiling, training, waiting for the
#: round's slowest node (``fedbuff``: a node with no work), the rest of a round in which
#: the node sent no update (``fedbuff``: from the work it was dropped with on), and
#: (``fedbuff`` only) a work still running when the run stopped, not in the records.
KINDS = ("profiling", "training", "idle", "failed", "running")
#: Times below this (s) are float noise of the recorder's sums, not a bar.
_EPS_S = 1e-9


class RunRecordsError(SettingsError):
    """A folder that is not a finished run's (the message names what is missing)."""


@dataclass(frozen=True)
class RunRecords:
    """One finished run's records: ``summary.json``, ``rounds.jsonl``, ``nodes.jsonl``, and a
    ``fedbuff`` run's ``updates.jsonl`` (empty for a run in rounds)."""

    folder: Path
    summary: dict[str, Any]
    rounds: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    updates: list[dict[str, Any]] = field(default_factory=list)
    #: A ``fedbuff`` run's nodes by name from its ``fleet.json`` (none read for a run in
    #: rounds, whose every node has a row each round)
    fleet: list[str] = field(default_factory=list)

    @property
    def is_fedbuff(self) -> bool:
        """Whether the run had no rounds (``aggregation = "fedbuff"``): its rounds are global
        versions, and its nodes' time is in ``updates``."""
        return self.summary.get("aggregation") == "fedbuff"

    @property
    def name(self) -> str:
        """The run folder's name (``20261129-021500-power-aware``)."""
        return self.folder.name

    @property
    def method(self) -> str:
        return str(self.summary["method"])


def load_run(folder: str | Path) -> RunRecords:
    """Read a finished run folder; a RunRecordsError says what is missing, or that the
    run is still in progress (or was stopped before its end: no ``summary.json``)."""
    path = Path(folder).expanduser().absolute()
    if not path.exists():
        raise RunRecordsError(f"run folder {path}: no such folder")
    if not path.is_dir():
        raise RunRecordsError(f"run folder {path}: a file, not a run folder; {_WHAT_A_RUN_IS}")
    if not (path / SUMMARY).is_file():
        raise RunRecordsError(_unfinished(path))
    for name in (ROUNDS, NODES):
        if not (path / name).is_file():
            raise RunRecordsError(
                f"run folder {path}: has {SUMMARY} but no {name}; {_WHAT_A_RUN_IS}"
            )
    summary = _read_json(path / SUMMARY)
    if not isinstance(summary, dict):
        raise RunRecordsError(f"{path / SUMMARY}: not a JSON object; {_WHAT_A_RUN_IS}")
    summary = current_summary(summary)
    _check_keys(summary, SUMMARY_KEYS, path / SUMMARY, summary)
    rounds = _read_jsonl(path / ROUNDS, ROUND_KEYS, summary)
    nodes = _read_jsonl(path / NODES, NODE_KEYS, summary)
    for at, node in enumerate(nodes, 1):
        if node["ok"]:
            _check_keys(node, OK_NODE_KEYS, path / NODES, summary, at)
    run = RunRecords(path, summary, rounds, nodes)
    return _with_fedbuff_records(run) if run.is_fedbuff else run


def _with_fedbuff_records(run: RunRecords) -> RunRecords:
    """``run`` with its ``updates.jsonl`` (required) and the names in its ``fleet.json``."""
    path = run.folder
    if not (path / UPDATES).is_file():
        raise RunRecordsError(
            f"run folder {path}: a fedbuff run (summary.json's aggregation) with no {UPDATES}; "
            f'{_WHAT_A_RUN_IS}, and for aggregation = "fedbuff" also {UPDATES}'
        )
    updates = _read_jsonl(path / UPDATES, UPDATE_KEYS, run.summary)
    fleet = _read_json(path / FLEET) if (path / FLEET).is_file() else {"nodes": {}}
    nodes = fleet.get("nodes") if isinstance(fleet, dict) else None
    if not isinstance(nodes, dict) or not all(
        isinstance(n, dict) and "node-name" in n for n in nodes.values()
    ):
        raise RunRecordsError(
            f"{path / FLEET}: not a fleet record (a 'nodes' object, each node with its "
            f"'node-name'); {_WHAT_A_RUN_IS}"
        )
    names = sorted({str(n["node-name"]) for n in nodes.values()})
    return replace(run, updates=updates, fleet=names)


def current_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` in the current record version's form. A version 3 summary reached the
    target at its first round at it, with no window: it reads as version 4 with
    ``target-window`` 1 and its first round at the target the same round (nothing guessed).
    Any other version is returned as it is (``_check_keys`` names what it lacks)."""
    if summary.get("record-version") != 3 or "target-window" in summary:
        return summary
    return {
        **summary,
        "target-window": 1,
        "first-round-at-target": summary.get("round-to-target"),
        "sim-time-to-first-target-s": summary.get("sim-time-to-target-s"),
        "fleet-energy-to-first-target-j": summary.get("fleet-energy-to-target-j"),
    }


_WHAT_A_RUN_IS = (
    f"a run folder is what `powerfl simulate` writes (runs/<time>-<method>), with "
    f"{', '.join(RUN_FILES)}"
)


def _unfinished(path: Path) -> str:
    """Why a folder without ``summary.json`` cannot be reported."""
    owner = _lock_owner(path / RUN_LOCK)
    if owner is not None:
        return (
            f"run folder {path}: the run is still in progress (process {owner}, {RUN_LOCK}); "
            f"report it once it has finished and written {SUMMARY}"
        )
    if (path / ROUNDS).is_file():
        return (
            f"run folder {path}: no {SUMMARY} yet: the run is still in progress, or it was "
            f"stopped before its end (its rounds so far are in {ROUNDS}); report a run once "
            f"it has finished"
        )
    return f"run folder {path}: not a run folder, it has no {SUMMARY}; {_WHAT_A_RUN_IS}"


def _lock_owner(lock: Path) -> int | None:
    """The live process that holds a run folder's lock, if any."""
    try:
        pid = int(lock.read_text(encoding="utf-8").split()[0])
        os.kill(pid, 0)
    except PermissionError:  # alive, another user's
        return pid
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _read_json(path: Path, line: int | None = None, text: str | None = None) -> Any:
    where = f"{path} line {line}" if line is not None else str(path)
    try:
        return json.loads(path.read_text(encoding="utf-8") if text is None else text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunRecordsError(f"{where}: not readable as JSON ({err})") from None


def _read_jsonl(path: Path, keys: Sequence[str], summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    text = path.read_text(encoding="utf-8")
    for at, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = _read_json(path, at, line)
        if not isinstance(row, dict):
            raise RunRecordsError(f"{path} line {at}: not a JSON object")
        _check_keys(row, keys, path, summary, at)
        rows.append(row)
    return rows


def _check_keys(
    row: dict[str, Any],
    keys: Sequence[str],
    path: Path,
    summary: dict[str, Any],
    line: int | None = None,
) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        where = f"{path} line {line}" if line is not None else str(path)
        version = summary.get("record-version", "unknown")
        raise RunRecordsError(
            f"{where}: lacks {', '.join(repr(k) for k in missing)} (record version {version}; "
            f"a report reads the records of version {RECORD_VERSION})"
        )


# ------------------------------------------------------------------------------ timeline


@dataclass(frozen=True)
class Segment:
    """One bar of a timeline: a node's ``kind`` (``KINDS``) from ``start_s`` for
    ``duration_s``, on the fleet's device clock, in round ``server_round`` (a ``fedbuff``
    run: the node's work number, as its ``nodes.jsonl`` rows have it)."""

    node: str
    server_round: int
    kind: str
    start_s: float
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class RoundSpan:
    """One round on the fleet's device clock: ``start_s`` … ``end_s``; its training starts at
    ``training_start_s`` (after a fleet-shared profiling step, if the round had one), and
    ``deadline_at_s`` is where the round plan's deadline fell (None without one)."""

    server_round: int
    start_s: float
    end_s: float
    training_start_s: float
    deadline_at_s: float | None


def _by_round(nodes: Sequence[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for n in nodes:
        out.setdefault(int(n["server-round"]), []).append(n)
    return out


def _num(x: Any) -> float:
    """A record's number; null (a NaN or missing value) as 0."""
    return 0.0 if x is None else float(x)


def round_spans(
    rounds: Sequence[dict[str, Any]], nodes: Sequence[dict[str, Any]]
) -> list[RoundSpan]:
    """Each round's place on the device clock. The fleet-shared profiling step is what the
    round lasted beyond its slowest node's own profiling and training
    (``RoundAccount.of``: round time = that step + the slowest node's busy time)."""
    per_round = _by_round(nodes)
    spans = []
    for r in rounds:
        end = float(r["sim-time-s"])
        start = end - float(r["round-time-s"])
        ok = [n for n in per_round.get(int(r["server-round"]), []) if n["ok"]]
        slowest = max(
            (_num(n["train-time-s"]) + _num(n["profile-time-s"]) for n in ok), default=0.0
        )
        training_start = max(start, end - slowest) if ok else end
        deadline = r.get("deadline-s")
        spans.append(
            RoundSpan(
                int(r["server-round"]),
                start,
                end,
                training_start,
                None if deadline is None else training_start + float(deadline),
            )
        )
    return spans


def timeline_segments(
    rounds: Sequence[dict[str, Any]], nodes: Sequence[dict[str, Any]]
) -> list[Segment]:
    """Every bar of a run's timeline, round by round, node by node: fleet-shared profiling
    and the wait for that step's slowest node, then the node's own profiling, its training
    and its wait for the round's slowest node. A node without an update that round
    (``ok`` false) gets its shared profiling and a ``failed`` bar over the training part of
    the round. A node's busy and idle bars fill its round; for a node with an update, its
    idle bars are the waiting the recorder counts at idle power."""
    per_round = _by_round(nodes)
    out: list[Segment] = []
    for span in round_spans(rounds, nodes):
        for n in per_round.get(span.server_round, []):
            name, t = str(n["node-name"]), span.start_s
            parts = [("profiling", _num(n["shared-time-s"]))]
            if span.training_start_s > span.start_s:  # a fleet-shared profiling step
                parts.append(("idle", span.training_start_s - span.start_s - parts[0][1]))
            if n["ok"]:
                own = _num(n["profile-time-s"]), _num(n["train-time-s"])
                parts += [("profiling", own[0]), ("training", own[1])]
                parts.append(("idle", span.end_s - span.training_start_s - sum(own)))
            else:
                parts.append(("failed", span.end_s - span.training_start_s))
            for kind, duration_s in parts:
                if duration_s > _EPS_S:
                    out.append(Segment(name, span.server_round, kind, t, duration_s))
                t += max(duration_s, 0.0)
    return out


def node_names(nodes: Sequence[dict[str, Any]]) -> list[str]:
    """The run's nodes in the order the records first name them (the fleet's order)."""
    return list(dict.fromkeys(str(n["node-name"]) for n in nodes))


def fedbuff_segments(run: RunRecords) -> list[Segment]:
    """Every bar of a ``fedbuff`` run's timeline, node by node on its own virtual clock, from
    its records: its slices of the fleet-shared profiling from 0 (those its first work's
    row carries) and the wait for the step's end, where the first works start; then each
    update taken (``updates.jsonl``) from its ``start-s``: its own profiling, then its
    training to its ``end-s``; a gap between two works as idle; a node dropped (a failed
    row) as ``failed`` from the start of the work it was dropped with (its last work's
    end, or its first's start) to the last version; and a work still running when the run
    stopped (``_running_at_stop``) as ``running`` from its start to the last version. A
    node whose first work's row is not in the records (its first update never applied)
    has no bar before that work: its slices of the shared profiling are not recorded. Where
    the profiled steps trained, a node's slices are its update of work 0 (from 0, its
    ``profile-time-s``), followed by what it trained while it waited for its kind's LUT
    (the rest of its ``device-time-s``, ending at its ``end-s``), and each kind's first
    works start when its LUT was merged;
    a node none of whose training works was taken is drawn running from the first works'
    start (its kind's is not recorded)."""
    first_rows = {str(n["node-name"]): n for n in run.nodes if int(n["server-round"]) == 1}
    works: dict[str, list[dict[str, Any]]] = {}
    for u in sorted(run.updates, key=lambda u: int(u["work"])):
        works.setdefault(str(u["node"]), []).append(u)
    starts = [float(u["start-s"]) for u in run.updates if int(u["work"]) == 1]
    shared = [_num(n["shared-time-s"]) for n in first_rows.values()]
    opened_s = min(starts) if starts else max(shared, default=0.0)  # the first works' start
    end_s = float(run.rounds[-1]["sim-time-s"]) if run.rounds else 0.0
    failed = {str(n["node-name"]): int(n["server-round"]) for n in run.nodes if not n["ok"]}
    running = _running_at_stop(run)
    out: list[Segment] = []
    for name in fedbuff_node_names(run):
        row = first_rows.get(name)
        profiled = any(int(u["work"]) == 0 for u in works.get(name, []))
        if profiled:
            row = None  # its slices are its work 0
        parts = [] if row is None else [(1, "profiling", 0.0, _num(row["shared-time-s"]))]
        t = parts[0][3] if parts else (0.0 if profiled else opened_s)
        for u in works.get(name, []):
            start, work = float(u["start-s"]), int(u["work"])
            profile_s, end = _num(u["profile-time-s"]), float(u["end-s"])
            # a work's training ends it; only a profiled update (work 0) can have idle time
            # between its slices and its training while it waited (``device-time-s``)
            train_s = _num(u.get("device-time-s", end - start)) - profile_s
            parts.append((work, "idle", t, start - t))
            parts.append((work, "profiling", start, profile_s))
            parts.append((work, "idle", start + profile_s, end - train_s - start - profile_s))
            parts.append((work, "training", end - train_s, train_s))
            t = end
        if name in failed or name in running:  # its last work, dropped or not taken
            number = failed.get(
                name, max((int(u["work"]) for u in works.get(name, [])), default=0) + 1
            )
            parts.append((number, "idle", t, opened_s - t))  # in its first work
            t = max(t, opened_s)
            parts.append((number, "failed" if name in failed else "running", t, end_s - t))
        out += [Segment(name, w, kind, a, d) for w, kind, a, d in parts if d > _EPS_S]
    return out


def _running_at_stop(run: RunRecords) -> set[str]:
    """The nodes of a ``fedbuff`` run ordered by device time (a simulation: no update has an
    ``arrival-wall-s``) with a work running at the last version: every node not dropped,
    since each was sent its next work at its last update's end and the replies not taken
    end after the stop. Ordered by arrival (a deployment), none is drawn: a work in flight
    (the summary's ``works-in-flight-at-end``) has no known device time, and each node's
    clock runs at its own pace, not up to the last version's."""
    if any(u.get("arrival-wall-s") is not None for u in run.updates):
        return set()
    dropped = {str(n["node-name"]) for n in run.nodes if not n["ok"]}
    return set(fedbuff_node_names(run)) - dropped


def fedbuff_node_names(run: RunRecords) -> list[str]:
    """A ``fedbuff`` run's nodes by name (the order their first works were sent in): its
    fleet's and any other its records name."""
    named = {str(n["node-name"]) for n in run.nodes} | {str(u["node"]) for u in run.updates}
    return sorted(named | set(run.fleet))


def run_segments(run: RunRecords) -> list[Segment]:
    """``run``'s timeline bars: ``fedbuff_segments`` for a run without rounds, else
    ``timeline_segments``."""
    return fedbuff_segments(run) if run.is_fedbuff else timeline_segments(run.rounds, run.nodes)


def run_node_names(run: RunRecords) -> list[str]:
    """``run``'s timeline rows: ``fedbuff_node_names`` or ``node_names``."""
    return fedbuff_node_names(run) if run.is_fedbuff else node_names(run.nodes)


# ------------------------------------------------------------------------------ progress


@dataclass(frozen=True)
class Progress:
    """A run's accuracy after each round (round 0: the initial model, when recorded)
    against the fleet's device time and its energy, idle waiting included (training +
    profiling + idle, whatever ``idle-accounting`` the run counted in its headline)."""

    label: str
    time_s: tuple[float, ...]
    energy_j: tuple[float, ...]
    accuracy: tuple[float, ...]
    target_accuracy: float
    #: The point at which the run reached the target by its window rule (its
    #: ``round-to-target``; None: not reached)
    target_index: int | None


def progress(run: RunRecords, label: str | None = None) -> Progress:
    """``run``'s progress curve, labelled ``label`` (default: its method)."""
    time_s, energy_j, accuracy, rounds = [], [], [], []
    initial = run.summary.get("initial-accuracy")
    if initial is not None:
        time_s.append(0.0)
        energy_j.append(0.0)
        accuracy.append(float(initial))
        rounds.append(0)
    for r in run.rounds:
        time_s.append(float(r["sim-time-s"]))
        energy_j.append(float(r["fleet-busy-energy-j"]) + float(r["fleet-idle-energy-j"]))
        accuracy.append(float(r["accuracy"]))
        rounds.append(int(r["server-round"]))
    reached = run.summary["round-to-target"]
    at = rounds.index(int(reached)) if reached is not None and int(reached) in rounds else None
    return Progress(
        label=run.method if label is None else label,
        time_s=tuple(time_s),
        energy_j=tuple(energy_j),
        accuracy=tuple(accuracy),
        target_accuracy=float(run.summary["target-accuracy"]),
        target_index=at,
    )


def energy_with_idle_to_target_j(summary: dict[str, Any]) -> float | None:
    """Fleet energy to the target, idle waiting included (None: target not reached)."""
    busy, idle = summary["fleet-busy-energy-to-target-j"], summary["fleet-idle-energy-to-target-j"]
    return None if busy is None or idle is None else float(busy) + float(idle)


# --------------------------------------------------------------------------------- table

#: Columns of ``powerfl report``'s table.
TABLE_COLUMNS = (
    "run",
    "method",
    "rounds",
    "round\n→target",
    "time→\ntarget s",
    "energy→\ntarget J",
    "energy J\nall rounds",
    "profiling",
)


def _rounds_to_target(s: dict[str, Any]) -> str:
    r2t, first = s["round-to-target"], s["first-round-at-target"]
    text = "-" if r2t is None else str(r2t)
    return text if first is None or first == r2t else f"{text} (first {first})"


def table_row(run: RunRecords) -> tuple[str, ...]:
    """One run's line of the report table: rounds, the round that reached the target (by
    the mean over ``target-window`` rounds; ``16 (first 13)`` where the first round at the
    target came before), time and energy (idle waiting included) to the target, all
    rounds' energy, and the share of device time profiling took. A ``fedbuff`` run's method
    reads ``power-aware (fedbuff)``: its rounds are global versions."""
    s = run.summary
    e2t = energy_with_idle_to_target_j(s)
    energy = float(s["fleet-busy-energy-j"]) + float(s["fleet-idle-energy-j"])
    ttt = s["sim-time-to-target-s"]
    return (
        run.name,
        f"{run.method} (fedbuff)" if run.is_fedbuff else run.method,
        str(s["rounds"]),
        _rounds_to_target(s),
        "-" if ttt is None else f"{float(ttt):.1f}",
        "-" if e2t is None else f"{e2t:.1f}",
        f"{energy:.1f}",
        f"{100 * float(s['profile-share']):.1f}%",
    )
