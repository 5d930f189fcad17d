"""The federated study (issue 5 §3, issue 7's measured scenarios) on Flower's simulation engine.

The same heterogeneous fleet, the same non-IID data split and the same seeds for every
method (B1, B2, ours, oracle); each run is one real simulation (``simulations.run.simulate``:
Flower's simulation engine with a digital twin per node; the model really trains on the
host, device time, power and energy come from the twins). Each run is a *cell*: a set of
run settings (overrides of ``[tool.flwr.app.config]``) and a seed.

Issue 7's scenarios are extra cells on the same data and seeds:

* ``balance-energy``: ``scenario-method`` with ``balance = "off"`` against the round plan's
  ``balance = "energy"`` (with ``deadline-margin``), both in synchronous FedAvg rounds
  (``aggregation = "fedavg"`` spelled out for ``off``, which ``auto`` would make
  asynchronous);
* ``varying-cap``: ``varying-cap-fleet`` (nodes with ``p-max-schedule``) against the same
  fleet with every scheduled node fixed at its schedule's minimum (the safe choice a user
  would otherwise make; the derived fleet file is written into the output folder);
* ``drift``: ``drift-fleet`` (nodes whose twin slows down / draws more from some round)
  with ``drift-check-every`` against the check off.

Cells with identical settings are run once. Each cell runs in its own process (spawned,
one Ray instance per run, its output in the cell's log, ended with everything it started
when it runs past ``cell-timeout-s``), with a fresh per-cell cache (every method that
profiles pays for its profiling; a node's oracle r is computed on its own split) except
the server's proxy r, which is shared across cells (it is host time, not device time, and
does not depend on the method). A finished cell is one JSON record under
``records/cells/``, holding the run's summary, rounds.jsonl, nodes.jsonl and fleet.json as
the recorder wrote them; rerunning the same command skips finished cells.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_client.settings import (
    RunSettings,
    SettingsError,
    fleet_entry_paths,
    fleet_path,
    parse_p_max_schedule,
    tomllib,
)
from simulations.experiments import federated_report
from simulations.experiments.config import ExperimentConfigError
from simulations.experiments.federated_config import (
    CELL_VERSION,
    NAME,
    FederatedConfig,
    parse_federated,
    weighted_arm_name,
)
from simulations.experiments.progress import Progress
from simulations.experiments.records import digest, read_record, set_aside, write_json
from simulations.experiments.settings_drift import Identity, drift, runs_by_identity
from simulations.experiments.study import Outcome, Preflight, RunOptions, StudyPlugin

log = logging.getLogger(__name__)

NOTE = (
    "Data: scikit-learn's bundled digits upsampled to 3×32×32 (fl_client.task): the server "
    "keeps a test split, the clients' pool is split over the fleet's nodes by the run's "
    "partitioning (Dirichlet over labels for non-IID) per seed; the server's proxy set for r "
    "is a disjoint slice. Models start from random weights seeded per seed. Device time, "
    "power and energy come from the digital twins in configs/devices (calibrated to the "
    "paper's Nano points; the other twins' coefficients are assumptions, see their TOML)."
)
#: A round's console line (``fl_server.results``), for the progress display.
ROUND_LINE = re.compile(r"^round\s+(\d+)\s+accuracy\s+([0-9.]+)", re.MULTILINE)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Cell:
    """One simulation run: its settings (overrides), and where the report uses it."""

    overrides: tuple[tuple[str, Any], ...]  # sorted (key, value) pairs, JSON scalars
    fleet_text: str  # the fleet file's content (part of the key)
    uses: tuple[tuple[str, str], ...]  # (scenario, variant): ("methods", "b1"), ("drift", "off")

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.overrides)

    @property
    def seed(self) -> int:
        return int(self.settings["seed"])

    @property
    def method(self) -> str:
        return str(self.settings["method"])

    def key(self) -> str:
        return digest(
            {
                "code": CELL_VERSION,
                "settings": {k: v for k, v in self.overrides if k not in ("fleet",)},
                "fleet": self.fleet_text,
            }
        )

    def record_name(self) -> str:
        s = self.settings
        tag = re.sub(r"[^a-z0-9.-]+", "-", Path(str(s["fleet"])).stem.lower())
        return f"{s['method']}-{tag}-seed{s['seed']}-{self.key()[:12]}.json"

    def label(self) -> str:
        uses = ", ".join(f"{s}:{v}" for s, v in self.uses)
        return f"{self.method} seed {self.seed} [{uses}]"


def fixed_at_minimum_fleet(path: str | Path) -> str:
    """The fleet file ``path`` with every ``p-max-schedule`` replaced by ``p-max-w`` = the
    schedule's lowest cap (TOML text; node order, names and counts unchanged)."""
    p = fleet_path(str(path))
    data = tomllib.loads(p.read_text(encoding="utf-8"))
    lines = [
        f"# Derived by the federated study from {p.name}: every p-max-schedule replaced by",
        "# its minimum cap (the safe fixed cap a user would otherwise pick).",
    ]
    for i, entry in enumerate(data.get("node", [])):
        entry = fleet_entry_paths(entry, p.parent)  # its paths, as the run would read them
        if "p-max-schedule" in entry:
            steps = parse_p_max_schedule(entry.pop("p-max-schedule"), f"{p.name} node #{i + 1}")
            low = min(c for _, c in steps)
            entry["p-max-w"] = low.watts if low.capped else "none"
        lines.append("")
        lines.append("[[node]]")
        for k, v in entry.items():
            lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    raise ExperimentConfigError(f"fleet: value {v!r} cannot be written back to TOML")


def _fleets(cfg: FederatedConfig, out: Path) -> dict[str, Path]:
    """The fleet files the cells run on; writes the derived fixed-at-minimum fleet to
    ``out/fleets/`` when the varying-cap scenario is on."""
    fleets: dict[str, Path] = {"main": fleet_path(cfg.fleet)}
    if "varying-cap" in cfg.scenarios:
        fleets["schedule"] = fleet_path(cfg.varying_cap_fleet)
        derived = out / "fleets" / f"{fleets['schedule'].stem}-fixed-at-minimum.toml"
        derived.parent.mkdir(parents=True, exist_ok=True)
        text = fixed_at_minimum_fleet(fleets["schedule"])
        if not derived.is_file() or derived.read_text(encoding="utf-8") != text:
            derived.write_text(text, encoding="utf-8")
        fleets["fixed-min"] = derived.resolve()
    if "drift" in cfg.scenarios:
        fleets["drift"] = fleet_path(cfg.drift_fleet)
    return fleets


def _variants(
    cfg: FederatedConfig, base: dict[str, Any], fleets: Mapping[str, Path]
) -> list[tuple[str, str, dict[str, Any]]]:
    """(scenario, variant, run settings) of one seed: the methods, then each scenario."""
    sm = cfg.scenario_method
    out = [("methods", m, {**base, "method": m}) for m in cfg.methods]
    if "balance-energy" in cfg.scenarios:
        energy = {"balance": "energy", "deadline-margin": cfg.deadline_margin}
        sync = {"aggregation": "fedavg"}  # the round plan's reference: rounds without a plan
        out.append(("balance-energy", "off", {**base, "method": sm, **sync}))
        out.append(("balance-energy", "energy", {**base, "method": sm, **energy}))
    if "varying-cap" in cfg.scenarios:
        for variant, fleet in (("fixed-at-minimum", "fixed-min"), ("schedule", "schedule")):
            out.append(
                ("varying-cap", variant, {**base, "method": sm, "fleet": str(fleets[fleet])})
            )
    if "drift" in cfg.scenarios:
        drift = {**base, "method": sm, "fleet": str(fleets["drift"])}
        drift["drift-threshold"] = cfg.drift_threshold
        out.append(("drift", "off", {**drift, "drift-check-every": 0}))
        out.append(("drift", "check", {**drift, "drift-check-every": cfg.drift_check_every}))
    return out


def balance_arm_settings(base: dict[str, Any], arm: str) -> dict[str, Any]:
    """The run settings of one arm of the balance scenario (``BALANCE_ARMS``): B1, or
    power-aware with ``balance = arm``; ``off`` spells out synchronous FedAvg rounds
    (``aggregation = "auto"``, the default, would make it asynchronous), the per-device rule
    the round plans are compared with."""
    if arm == "b1":
        return {**base, "method": "b1"}
    own = {"aggregation": "fedavg"} if arm == "off" else {"balance": arm}
    return {**base, "method": "power-aware", **own}


def _balance_cells(cfg: FederatedConfig) -> list[tuple[str, str, dict[str, Any]]]:
    """(scenario, variant, run settings) of the balance scenario, fleet by fleet in the
    order of ``balance-fleets``, seed by seed; the variant is ``FLEET/ARM`` (FLEET: the
    fleet file's name without .toml)."""
    out = []
    for name in cfg.balance_fleets:
        path = fleet_path(name)
        for seed in cfg.seed_list():
            base = {**cfg.base_overrides(), "seed": seed, "fleet": str(path)}
            for arm in ("b1", *cfg.balance_modes):
                out.append(("balance", f"{path.stem}/{arm}", balance_arm_settings(base, arm)))
            for mode, weight in cfg.critical_r_arms:
                ov = {**balance_arm_settings(base, mode), "critical-r-weight": weight}
                out.append(("balance", f"{path.stem}/{weighted_arm_name(mode, weight)}", ov))
    return out


def plan(cfg: FederatedConfig, out: Path) -> list[Cell]:
    """Every cell of the study (deduplicated; cells with identical settings share one run).

    With the balance scenario, cells run fleet by fleet (the main fleet first, then
    ``balance-fleets`` in their order) and seed by seed within a fleet, so that a study cut
    short has whole fleets and seeds."""
    fleets = _fleets(cfg, out)
    cells: dict[tuple[tuple[str, Any], ...], list[tuple[str, str]]] = {}
    for seed in cfg.seed_list():
        base = {**cfg.base_overrides(), "seed": seed, "fleet": str(fleets["main"])}
        for scenario, variant, ov in _variants(cfg, base, fleets):
            cells.setdefault(tuple(sorted(ov.items())), []).append((scenario, variant))
    paths = list(fleets.values())
    if "balance" in cfg.scenarios:
        for scenario, variant, ov in _balance_cells(cfg):
            cells.setdefault(tuple(sorted(ov.items())), []).append((scenario, variant))
        paths += [fleet_path(name) for name in cfg.balance_fleets]
    fleet_texts = {str(p): p.read_text(encoding="utf-8") for p in paths}
    planned = [Cell(ov, fleet_texts[dict(ov)["fleet"]], tuple(uses)) for ov, uses in cells.items()]
    if "balance" in cfg.scenarios:
        order = list(dict.fromkeys([str(fleets["main"]), *(str(p) for p in paths)]))
        planned.sort(key=lambda c: (order.index(str(c.settings["fleet"])), c.seed))
    return planned


def check_plan(cells: list[Cell]) -> None:
    """Every cell's run settings validate (before any training)."""
    for c in cells:
        try:
            RunSettings.from_config(c.settings)
        except SettingsError as exc:
            raise ExperimentConfigError(f"cell {c.record_name()}: {exc}") from None


# --------------------------------------------------------------------------- one cell


Simulate = Callable[[dict[str, Any]], dict[str, Any]]


def _child(simulate: Simulate, overrides: dict[str, Any], work: str) -> None:
    """A cell's process: ``simulate(overrides)``, its output appended to the cell's log and
    its summary written to ``result.json``."""
    from simulations.run import flower_env, interruptible

    os.setsid()  # its own process group: a timeout ends the engine's processes with it
    fd = os.open(Path(work) / "simulate.log", os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    flower_env(Path.cwd() / ".flwr")
    # SIGTERM (a timeout, Ctrl-C on the study) stops the engine's own processes too: the
    # Simulation Runtime's SuperLink and SuperExec run in sessions of their own, beyond
    # this process group
    with interruptible():
        write_json(Path(work) / "result.json", simulate(overrides))


class LogTail:
    """Complete new lines of a growing log, handed to ``on_line``."""

    def __init__(self, path: Path, on_line: Callable[[str], None] | None) -> None:
        self.fh = path.open(encoding="utf-8", errors="replace")
        self.on_line, self.rest = on_line, ""

    def feed(self) -> None:
        *lines, self.rest = (self.rest + self.fh.read()).split("\n")
        if self.on_line is not None:
            for line in lines:
                self.on_line(line)

    def close(self) -> None:
        self.fh.close()


def stop_process(proc: Any) -> None:
    """End a cell's process and its process group (the simulation engine's workers)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        proc.join(10)
        if not proc.is_alive():
            return
    proc.kill()
    proc.join()


def run_in_child(
    simulate: Simulate,
    overrides: dict[str, Any],
    work: Path,
    timeout_s: float,
    on_line: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """``simulate(overrides)`` in a spawned process with its output in ``work/simulate.log``
    (each line also to ``on_line``), ended after ``timeout_s``; (its result or None, why
    there is none). ``simulate`` must be importable by name (a module-level function)."""
    log_path, result_path = work / "simulate.log", work / "result.json"
    log_path.write_text(
        "# run settings:\n" + json.dumps(overrides, indent=1) + "\n", encoding="utf-8"
    )
    result_path.unlink(missing_ok=True)
    proc = multiprocessing.get_context("spawn").Process(
        target=_child, args=(simulate, overrides, str(work))
    )
    deadline = time.perf_counter() + timeout_s
    proc.start()
    tail = LogTail(log_path, on_line)
    try:
        while proc.is_alive() and time.perf_counter() < deadline:
            proc.join(0.5)
            tail.feed()
        timed_out = proc.is_alive()
        if timed_out:
            stop_process(proc)
        tail.feed()
    finally:
        tail.close()
    if timed_out:
        return None, "timed out"
    if proc.exitcode != 0 or not result_path.is_file():
        return None, f"exit status {proc.exitcode}"
    return json.loads(result_path.read_text(encoding="utf-8")), ""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


#: Ray gives its raylet a fixed 30 s to register when the engine starts; on a loaded host
#: it can miss that, and the run ends before round 1 (nothing of the cell ran). Such a
#: cell is started again, this many times, before it counts as failed.
ENGINE_START_RETRIES = 2
ENGINE_START_FAILURE = "The current node timed out during startup"


def engine_did_not_start(log_path: Path) -> bool:
    """The cell's log says Ray's node timed out during startup (before any round ran)."""
    if not log_path.is_file():
        return False
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return ENGINE_START_FAILURE in text and ROUND_LINE.search(text) is None


#: How a cell's simulation is run: (overrides, work folder, timeout_s, on_line) → (its
#: summary or None, why there is none); ``run_in_child`` with ``simulate`` by default.
CellRunner = Callable[
    [dict[str, Any], Path, float, Callable[[str], None] | None], tuple[dict[str, Any] | None, str]
]


def run_cell(
    cell: Cell,
    out: Path,
    *,
    timeout_s: float,
    on_line: Callable[[str], None] | None = None,
    runner: CellRunner | None = None,
) -> dict[str, Any]:
    """Run one cell's simulation and return its record.

    ``runner`` runs it (default: a process of its own, ``run_in_child``; the robustness
    study passes a long-lived worker's, ``cell_worker.CellWorker.run``). Raises
    RuntimeError (naming the log file) when the run fails, runs past ``timeout_s``,
    writes no summary or no node trained in any round.
    """
    work = out / "runs" / cell.key()[:16]
    if work.exists():  # a crashed earlier attempt: start clean (fresh node caches)
        shutil.rmtree(work)
    cache = work / "cache"
    shared_r = out / "cache" / "r"
    shared_r.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True)
    (cache / "r").symlink_to(shared_r.resolve(), target_is_directory=True)
    overrides = {
        **cell.settings,
        "cache-dir": str(cache.resolve()),
        "output-dir": str((work / "run").resolve()),
    }
    from simulations.run import simulate

    t0 = time.perf_counter()
    for attempt in range(1 + ENGINE_START_RETRIES):
        if runner is None:
            summary, why = run_in_child(simulate, overrides, work, timeout_s, on_line)
        else:
            summary, why = runner(overrides, work, timeout_s, on_line)
        if summary is not None or not engine_did_not_start(work / "simulate.log"):
            break
        log.warning(
            "cell %s: the simulation engine did not start (attempt %d of %d); trying again",
            cell.record_name(),
            attempt + 1,
            1 + ENGINE_START_RETRIES,
        )
    wall = time.perf_counter() - t0
    if summary is not None and not any(
        n.get("rounds-ok", 0) > 0 for n in summary["nodes"].values()
    ):
        summary, why = None, "no node trained in any round"
    if summary is None:
        log_path = work / "simulate.log"
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-1500:]
        raise RuntimeError(f"cell {cell.record_name()} failed ({why}); log {log_path}:\n{tail}")
    run_dir = Path(summary["run-dir"])
    fleet_json = run_dir / "fleet.json"
    return {
        "key": cell.key(),
        "study": NAME,
        "cell-version": CELL_VERSION,
        "settings": cell.settings,
        "uses": [list(u) for u in cell.uses],
        "seed": cell.seed,
        "method": cell.method,
        "summary": summary,
        "rounds": _read_jsonl(run_dir / "rounds.jsonl"),
        "nodes": _read_jsonl(run_dir / "nodes.jsonl"),
        "fleet": json.loads(fleet_json.read_text()) if fleet_json.is_file() else None,
        "fleet-text": cell.fleet_text,
        "run-dir": str(run_dir),
        "log": str(work / "simulate.log"),
        "host-wall-s": wall,
    }


def record_path(out: Path, cell: Cell) -> Path:
    return out / "records" / "cells" / cell.record_name()


# --------------------------------------------------------------------------- the study


def _reach(s: Mapping[str, Any]) -> str:
    """A cell's progress line: the round that reached the target (by the mean over
    ``target-window`` rounds) and, where it differs, the first round at it."""
    first = s["first-round-at-target"]
    also = f"; first round at it: {first}" if first and first != s["round-to-target"] else ""
    if s["round-to-target"]:
        energy_j = s["fleet-busy-energy-to-target-j"] + s["fleet-idle-energy-to-target-j"]
        return (
            f"target in round {s['round-to-target']} ({s['sim-time-to-target-s']:.1f} s, "
            f"{energy_j:.0f} J with idle waiting){also}"
        )
    return f"target not reached (final {s['final-accuracy']:.3f}){also}"


@contextlib.contextmanager
def claim(out: Path, cell: Cell) -> Iterator[str]:
    """Hold ``cell`` for this process while it runs, so that several processes can run one
    study into the same ``out`` (each takes the next cell nobody holds): yields ``"mine"``,
    ``"held"`` (another process runs it) or ``"done"`` (its record appeared since the plan
    was made). The hold is an OS lock on ``out/locks/<key>.lock``, let go when the process
    ends however it ends; where the OS has no such lock, every cell is ``"mine"``."""
    locks = out / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{cell.key()[:16]}.lock", "a+b") as handle:
        try:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # no POSIX locks (Windows): one process per folder
            pass
        except OSError:
            yield "held"
            return
        yield "done" if read_record(record_path(out, cell), cell.key()) is not None else "mine"


def skip_claimed(state: str, cell: Cell, counts: dict[str, Any], bar: Progress) -> bool:
    """Whether a cell ``claim`` did not give this process is skipped; counted either way:
    ``cells-reused`` (done meanwhile) or ``cells-held-elsewhere`` (still running there,
    so this process's run of the study is not complete)."""
    if state == "mine":
        return False
    bar.start(cell.label())
    if state == "done":
        counts["cells-reused"] += 1
        bar.done(f"{cell.label()}: done by another process")
    else:
        counts["cells-held-elsewhere"] += 1
        bar.done(f"{cell.label()}: another process runs it")
    return True


@dataclass
class CellLoop:
    """A study's pending cells run in turn into ``out``, each ``claim``-ed first, its record
    written when it finishes; ``counts`` (``pending``'s) and ``failures`` kept up to date.
    ``runner`` runs a cell (``run_cell``'s default: a process of its own)."""

    out: Path
    timeout_s: float
    counts: dict[str, Any]
    bar: Progress
    on_line: Callable[[str], None] | None = None
    runner: CellRunner | None = None

    def __post_init__(self) -> None:
        self.failures: list[str] = []

    def run(self, todo: list[Cell], finish: Callable[[Cell, dict[str, Any]], str]) -> None:
        """Run ``todo``; ``finish`` completes each record before it is written and gives the
        cell's progress line."""
        counts, bar = self.counts, self.bar
        for cell in todo:
            with claim(self.out, cell) as state:
                if skip_claimed(state, cell, counts, bar):
                    continue
                bar.start(cell.label())
                try:
                    rec = run_cell(
                        cell, self.out, timeout_s=self.timeout_s, on_line=self.on_line,
                        runner=self.runner,
                    )  # fmt: skip
                except RuntimeError as exc:
                    log.error("%s", exc)
                    self.failures.append(str(exc).splitlines()[0])
                    counts["cells-failed"] += 1
                    bar.done(f"FAILED {cell.record_name()}: see {self.out / 'runs'}")
                    continue
                line = finish(cell, rec)
                write_json(record_path(self.out, cell), rec)
                counts["cells-done"] += 1
                bar.done(line)


def _finished(out: Path, cell: Cell) -> bool:
    """Whether ``cell`` has a record under ``out`` made with the settings it runs with now;
    one made before a default it leaves implicit changed is set aside (``settings_drift``).
    A record reused takes the cell's ``uses`` (the arms that name it in this plan: a plan
    may rename an arm whose settings stay), so the report finds it under today's names."""
    path = record_path(out, cell)
    rec = read_record(path, cell.key())
    if rec is None:
        return False
    changed = drift(rec, cell.settings)
    if changed:
        made = ", ".join(f"{k} = {then!r} (now {now!r})" for k, (then, now) in changed.items())
        set_aside(path, f"made with {made}: a default changed since")
        return False
    uses = [list(u) for u in cell.uses]
    if rec.get("uses") != uses:
        write_json(path, {**rec, "uses": uses})
    return True


def _adopt(out: Path, cells: list[Cell], planned: set[Path]) -> set[Cell]:
    """Those of ``cells`` (none with a record at its key) given a record of the study under
    another key whose run resolved what the cell resolves to now (the same method, seed,
    cell version and fleet text, its ``settings.json`` at hand, no ``drift``; the first by
    file name): a copy written at the cell's record path with the cell's key, settings and
    uses, and ``adopted-from`` (the record's file name). A record adopted that is no planned
    cell's (``planned``: their record paths) is set aside, so the folder holds one run of
    each (fleet, seed, arm) for the report."""

    def ran_as(cell: Cell) -> Identity:
        return (cell.method, cell.seed, CELL_VERSION, cell.fleet_text)

    found = runs_by_identity(out / "records" / "cells", {ran_as(c) for c in cells})
    adopted: set[Cell] = set()
    for cell in cells:
        for name, rec in found.get(ran_as(cell), []):
            if not drift(rec, cell.settings):
                uses = [list(u) for u in cell.uses]
                copy = {**rec, "key": cell.key(), "settings": cell.settings, "uses": uses}
                write_json(record_path(out, cell), {**copy, "adopted-from": name})
                adopted.add(cell)
                source = out / "records" / "cells" / name
                if source.suffix == ".json" and source not in planned and source.is_file():
                    # out of the report's way, where a later plan may still adopt it
                    why = f"as {record_path(out, cell).name}; no cell of this plan holds it"
                    set_aside(source, why, state="was adopted")
                break
    return adopted


def pending(cells: list[Cell], out: Path) -> tuple[list[Cell], dict[str, Any]]:
    """The cells (validated first) without a finished record under ``out`` (nor one
    ``_adopt``-ed), and the run's counts: cells, done, reused (adopted among them), failed."""
    check_plan(cells)
    missing = [c for c in cells if not _finished(out, c)]
    planned = {record_path(out, c) for c in cells}
    adopted = _adopt(out, missing, planned) if missing else set()
    todo = [c for c in missing if c not in adopted]
    counts: dict[str, Any] = {
        "cells": len(cells),
        "cells-done": 0,
        "cells-reused": len(cells) - len(todo),
        "cells-adopted": len(adopted),
        "cells-failed": 0,
        "cells-held-elsewhere": 0,
    }
    return todo, counts


def run_study(cfg: FederatedConfig, out: Path, *, progress: bool = True) -> dict[str, Any]:
    """Run every missing cell of ``cfg`` under ``out``; return counts and the plan."""
    cells = plan(cfg, out)
    todo, counts = pending(cells, out)
    bar = Progress(len(todo), enabled=progress)

    def on_line(line: str) -> None:
        mt = ROUND_LINE.match(line.strip())
        if mt:
            bar.detail(f"round {mt.group(1)}/{cfg.num_rounds} acc {float(mt.group(2)):.3f}")

    def finish(cell: Cell, rec: dict[str, Any]) -> str:
        return f"{cell.label()}: {_reach(rec['summary'])}, {rec['host-wall-s']:.0f} s"

    loop = CellLoop(out, cfg.cell_timeout_s, counts, bar, on_line)
    with bar.running():
        loop.run(todo, finish)
    counts["failures"] = loop.failures
    counts["plan"] = [
        {
            "record": c.record_name(),
            "seed": c.seed,
            "method": c.method,
            "uses": [list(u) for u in c.uses],
        }
        for c in cells
    ]
    return counts


def _preflight(cfg: FederatedConfig, where: str) -> Preflight:
    return Preflight(note=NOTE)  # the fleets and data splits were checked by ``parse``


def _run(cfg: FederatedConfig, out: Path, options: RunOptions) -> Outcome:
    counts = run_study(cfg, out, progress=options.progress)
    return Outcome(counts, complete=complete(counts))


def complete(counts: Mapping[str, Any]) -> bool:
    """Whether a study's run left every cell recorded: none failed, none still running in
    another process."""
    return counts["cells-failed"] == 0 and counts.get("cells-held-elsewhere", 0) == 0


STUDY = StudyPlugin(NAME, parse_federated, _preflight, _run, federated_report.render)
