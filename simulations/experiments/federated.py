"""The federated study (issue 5 §3, issue 7's measured scenarios) on Flower's simulation engine.

The same heterogeneous fleet, the same non-IID data split and the same seeds for every
method (B1, B2, ours, oracle); each run is one real ``powerfl simulate`` (Flower's
simulation engine with a digital twin per node: the model really trains on the host, device
time, power and energy come from the twins). Each run is a *cell*: a set of run settings
(``-c key=value`` overrides of ``[tool.flwr.app.config]``) and a seed.

Issue 7's scenarios are extra cells on the same data and seeds:

* ``pacing``: ``scenario-method`` with ``pacing = "off"`` against ``pacing = "deadline"``;
* ``varying-cap``: ``varying-cap-fleet`` (nodes with ``p-max-schedule``) against the same
  fleet with every scheduled node fixed at its schedule's minimum (the safe choice a user
  would otherwise make; the derived fleet file is written into the output folder);
* ``drift``: ``drift-fleet`` (nodes whose twin slows down / draws more from some round)
  with ``drift-check-every`` against the check off.

Cells with identical settings are run once (e.g. pacing "off" is the ``power-aware`` cell of
the method comparison). Each cell runs as its own process (``python -m simulations simulate
…``: one Ray instance per run), with a fresh per-cell cache (every method that profiles pays
for its profiling; a node's oracle r is computed on its own split) except the server's proxy
r, which is shared across cells (it is host time, not device time, and does not depend on
the method). A finished cell is one JSON record under ``records/cells/``; rerunning the
same command skips finished cells.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fl_client.settings import (
    PARTITIONINGS,
    PROFILE_GRIDS,
    REPO_ROOT,
    RunSettings,
    SettingsError,
    load_fleet,
    resolve_path,
    tomllib,
)
from simulations.experiments.config import (
    STUDY_METHODS,
    ExperimentConfigError,
    Fields,
    merge_scale,
    read_experiment_file,
)
from simulations.experiments.records import digest, read_record, write_json

log = logging.getLogger(__name__)

STUDY = "federated"
SCENARIOS = ("pacing", "varying-cap", "drift")
#: Variants of each scenario, in report order (the first is the reference).
SCENARIO_VARIANTS = {
    "pacing": ("off", "deadline"),
    "varying-cap": ("fixed-at-minimum", "schedule"),
    "drift": ("off", "check"),
}
CELL_VERSION = 1

#: Allowed keys and their defaults (None: required).
FED_DEFAULTS: dict[str, Any] = {
    "name": None,
    "study": None,
    "description": "",
    "fleet": "configs/fleets/default.toml",
    "methods": list(STUDY_METHODS),
    "seeds": 3,
    "model": "cnn",
    "partitioning": "dirichlet",
    "dirichlet-alpha": 0.5,
    "num-rounds": 20,
    "target-accuracy": 0.85,
    "local-epochs": 5,
    "batch-sizes": [4, 8, 16, 32, 64, 128],
    "lr-ref": 0.005,
    "b-ref": 128,
    "proxy-target-accuracy": 0.8,
    "r-max-samples": 40_000,
    "r-eval-every-samples": 256,
    "profile-grid": "efficient",
    "scenarios": list(SCENARIOS),
    "scenario-method": "power-aware",
    "pacing-margin": 0.05,
    "varying-cap-fleet": "configs/fleets/varying-cap.toml",
    "drift-fleet": "configs/fleets/drift.toml",
    "drift-check-every": 2,
    "drift-threshold": 0.15,
    "cell-timeout-s": 1800,
}


@dataclass(frozen=True)
class FederatedConfig:
    """The resolved settings of one federated study at one scale (all from the TOML)."""

    name: str
    study: str
    description: str
    scale: str
    fleet: str
    methods: tuple[str, ...]
    seeds: int
    model: str
    partitioning: str
    dirichlet_alpha: float
    num_rounds: int
    target_accuracy: float
    local_epochs: int
    batch_sizes: tuple[int, ...]
    lr_ref: float
    b_ref: int
    proxy_target_accuracy: float
    r_max_samples: int
    r_eval_every_samples: int
    profile_grid: str
    scenarios: tuple[str, ...]
    scenario_method: str
    pacing_margin: float
    varying_cap_fleet: str
    drift_fleet: str
    drift_check_every: int
    drift_threshold: float
    cell_timeout_s: int

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case, JSON-ready settings."""
        return {
            k.replace("_", "-"): list(v) if isinstance(v, tuple) else v
            for k, v in asdict(self).items()
        }

    def seed_list(self) -> list[int]:
        return list(range(self.seeds))

    def base_overrides(self) -> dict[str, Any]:
        """The run settings every cell shares (before its own fleet/method/scenario)."""
        return {
            "model": self.model,
            "partitioning": self.partitioning,
            "dirichlet-alpha": self.dirichlet_alpha,
            "num-rounds": self.num_rounds,
            "target-accuracy": self.target_accuracy,
            "local-epochs": self.local_epochs,
            "batch-sizes": ",".join(str(b) for b in self.batch_sizes),
            "lr-ref": self.lr_ref,
            "b-ref": self.b_ref,
            "proxy-target-accuracy": self.proxy_target_accuracy,
            "max-samples": self.r_max_samples,
            "eval-every-samples": self.r_eval_every_samples,
            "profile-grid": self.profile_grid,
            "pacing": "off",
            "drift-check-every": 0,
        }


def _err(where: str, key: str, message: str) -> ExperimentConfigError:
    return ExperimentConfigError(f"{where}: {key}: {message}")


def load_federated(
    path: str | Path, *, scale: str = "mini", seeds: int | None = None
) -> FederatedConfig:
    """Read and validate a federated experiment file (see ``parse_federated``)."""
    data, where = read_experiment_file(path)
    return parse_federated(data, where, scale=scale, seeds=seeds)


def parse_federated(
    data: Mapping[str, Any],
    where: str,
    *,
    scale: str = "mini",
    seeds: int | None = None,
    sets: Mapping[str, Any] | None = None,
) -> FederatedConfig:
    """Validate a parsed federated experiment: unknown keys, bad values, empty sweeps, fleet
    files that do not load or do not fit the scenario are errors naming the key, raised
    before any training starts."""
    merged = merge_scale(data, where, FED_DEFAULTS, scale=scale, seeds=seeds, sets=sets)
    return _build(merged, where, scale)


def _build(m: Mapping[str, Any], where: str, scale: str) -> FederatedConfig:
    from fl_client import task

    f = Fields(m, where, FED_DEFAULTS)
    text, str_list, integer, number = f.text, f.str_list, f.integer, f.number
    study = text("study", (STUDY,))
    batch_sizes = f.batch_sizes()
    scenarios = str_list("scenarios", SCENARIOS, empty_ok=True)
    cfg = FederatedConfig(
        name=text("name"),
        study=study,
        description=text("description"),
        scale=scale,
        fleet=text("fleet"),
        methods=str_list("methods", STUDY_METHODS),
        seeds=integer("seeds", 1),
        model=text("model", tuple(task.MODEL_NAMES)),
        partitioning=text("partitioning", PARTITIONINGS),
        dirichlet_alpha=number("dirichlet-alpha", 0.0),
        num_rounds=integer("num-rounds", 1),
        target_accuracy=number("target-accuracy", 0.0, 1.0),
        local_epochs=integer("local-epochs", 1),
        batch_sizes=batch_sizes,
        lr_ref=number("lr-ref", 0.0),
        b_ref=integer("b-ref", 1),
        proxy_target_accuracy=number("proxy-target-accuracy", 0.0, 1.0),
        r_max_samples=integer("r-max-samples", 1),
        r_eval_every_samples=integer("r-eval-every-samples", 1),
        profile_grid=text("profile-grid", PROFILE_GRIDS),
        scenarios=scenarios,
        scenario_method=text("scenario-method", STUDY_METHODS),
        pacing_margin=number("pacing-margin", 0.0, 1.0, open_lo=False),
        varying_cap_fleet=text("varying-cap-fleet"),
        drift_fleet=text("drift-fleet"),
        drift_check_every=integer("drift-check-every", 1),
        drift_threshold=number("drift-threshold", 0.0),
        cell_timeout_s=integer("cell-timeout-s", 1),
    )
    _check_fleets(cfg, where)
    return cfg


def _fleet_nodes(path: str, where: str, key: str) -> list[Any]:
    try:
        return load_fleet(path)
    except SettingsError as exc:
        raise _err(where, key, str(exc)) from None


def _check_fleets(cfg: FederatedConfig, where: str) -> None:
    """Every fleet file the study needs loads, fits its scenario and its data split."""
    from simulations.cli import check_partitions

    fleets = {"fleet": cfg.fleet}
    if "varying-cap" in cfg.scenarios:
        fleets["varying-cap-fleet"] = cfg.varying_cap_fleet
    if "drift" in cfg.scenarios:
        fleets["drift-fleet"] = cfg.drift_fleet
    for key, path in fleets.items():
        nodes = _fleet_nodes(path, where, key)
        if key == "varying-cap-fleet" and not any(n.p_max_schedule for n in nodes):
            raise _err(where, key, f"{path}: no node has a p-max-schedule (nothing varies)")
        if key == "drift-fleet" and not any(_drifts(n.options) for n in nodes):
            raise _err(
                where,
                key,
                f"{path}: no node has twin-slowdown > 1 or twin-extra-power-w > 0 (no drift)",
            )
        for seed in cfg.seed_list():
            overrides = {**cfg.base_overrides(), "fleet": str(resolve_path(path)), "seed": seed}
            try:
                check_partitions(RunSettings.from_config(overrides), len(nodes))
            except SettingsError as exc:
                raise _err(where, key, str(exc)) from None


def _drifts(options: Mapping[str, Any]) -> bool:
    try:
        slow = float(options.get("twin-slowdown", 1.0))
        extra = float(options.get("twin-extra-power-w", 0.0))
    except (TypeError, ValueError):
        return False
    return slow > 1.0 or extra > 0.0


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Cell:
    """One simulation run: its settings (overrides), and where the report uses it."""

    overrides: tuple[tuple[str, Any], ...]  # sorted (key, value) pairs, JSON scalars
    fleet_text: str  # the fleet file's content (part of the key)
    uses: tuple[tuple[str, str], ...]  # (scenario, variant): ("methods", "b1"), ("pacing", "off")

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


def fixed_at_minimum_fleet(path: str | Path) -> str:
    """The fleet file ``path`` with every ``p-max-schedule`` replaced by ``p-max-w`` = the
    schedule's lowest cap (TOML text; node order, names and counts unchanged)."""
    from fl_client.settings import parse_p_max_schedule

    p = resolve_path(str(path))
    data = tomllib.loads(p.read_text(encoding="utf-8"))
    lines = [
        f"# Derived by the federated study from {p.name}: every p-max-schedule replaced by",
        "# its minimum cap (the safe fixed cap a user would otherwise pick).",
    ]
    for i, entry in enumerate(data.get("node", [])):
        entry = dict(entry)
        if "p-max-schedule" in entry:
            steps = parse_p_max_schedule(entry.pop("p-max-schedule"), f"{p.name} node #{i + 1}")
            low = min(c for _, c in steps)
            entry["p-max-w"] = "none" if math.isinf(low) else low
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


def plan(cfg: FederatedConfig, out: Path) -> list[Cell]:
    """Every cell of the study (deduplicated; cells with identical settings share one run).

    Writes the derived fixed-at-minimum fleet to ``out/fleets/`` when the varying-cap
    scenario is on.
    """
    fleets: dict[str, Path] = {"main": resolve_path(cfg.fleet)}
    if "varying-cap" in cfg.scenarios:
        fleets["schedule"] = resolve_path(cfg.varying_cap_fleet)
        derived = out / "fleets" / f"{fleets['schedule'].stem}-fixed-at-minimum.toml"
        derived.parent.mkdir(parents=True, exist_ok=True)
        text = fixed_at_minimum_fleet(fleets["schedule"])
        if not derived.is_file() or derived.read_text(encoding="utf-8") != text:
            derived.write_text(text, encoding="utf-8")
        fleets["fixed-min"] = derived.resolve()
    if "drift" in cfg.scenarios:
        fleets["drift"] = resolve_path(cfg.drift_fleet)

    wanted: list[tuple[str, str, int, dict[str, Any]]] = []
    sm = cfg.scenario_method
    for seed in cfg.seed_list():
        base = {**cfg.base_overrides(), "seed": seed, "fleet": str(fleets["main"])}
        for method in cfg.methods:
            wanted.append(("methods", method, seed, {**base, "method": method}))
        if "pacing" in cfg.scenarios:
            wanted.append(("pacing", "off", seed, {**base, "method": sm}))
            wanted.append(
                (
                    "pacing",
                    "deadline",
                    seed,
                    {
                        **base,
                        "method": sm,
                        "pacing": "deadline",
                        "pacing-margin": cfg.pacing_margin,
                    },
                )
            )
        if "varying-cap" in cfg.scenarios:
            for variant, fleet in (("fixed-at-minimum", "fixed-min"), ("schedule", "schedule")):
                wanted.append(
                    (
                        "varying-cap",
                        variant,
                        seed,
                        {**base, "method": sm, "fleet": str(fleets[fleet])},
                    )
                )
        if "drift" in cfg.scenarios:
            drift = {
                **base,
                "method": sm,
                "fleet": str(fleets["drift"]),
                "drift-threshold": cfg.drift_threshold,
            }
            wanted.append(("drift", "off", seed, {**drift, "drift-check-every": 0}))
            wanted.append(
                ("drift", "check", seed, {**drift, "drift-check-every": cfg.drift_check_every})
            )
    fleet_texts = {str(p): p.read_text(encoding="utf-8") for p in fleets.values()}
    cells: dict[tuple[tuple[str, Any], ...], list[tuple[str, str]]] = {}
    for scenario, variant, _seed, ov in wanted:
        cells.setdefault(tuple(sorted(ov.items())), []).append((scenario, variant))
    return [Cell(ov, fleet_texts[dict(ov)["fleet"]], tuple(uses)) for ov, uses in cells.items()]


def check_plan(cells: list[Cell]) -> None:
    """Every cell's run settings validate (before any training)."""
    for c in cells:
        try:
            RunSettings.from_config(c.settings)
        except SettingsError as exc:
            raise ExperimentConfigError(f"cell {c.record_name()}: {exc}") from None


# --------------------------------------------------------------------------- running


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _toml_arg(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def run_cell(cell: Cell, out: Path, *, timeout_s: float, on_line: Any = None) -> dict[str, Any]:
    """Run one cell as ``python -m simulations simulate`` and return its record.

    Raises RuntimeError (naming the log file) when the run fails or writes no summary.
    """
    work = out / "runs" / cell.key()[:16]
    if work.exists():  # a crashed earlier attempt: start clean (fresh node caches)
        shutil.rmtree(work)
    cache = work / "cache"
    shared_r = out / "cache" / "r"
    shared_r.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True)
    (cache / "r").symlink_to(shared_r.resolve(), target_is_directory=True)
    settings = {**cell.settings, "cache-dir": str(cache.resolve())}
    method = settings.pop("method")
    cmd = [sys.executable, "-m", "simulations", "simulate", "--methods", str(method)]
    cmd += ["--output-dir", str((work / "run").resolve())]
    for k, v in settings.items():
        cmd += ["-c", f"{k}={_toml_arg(v)}"]
    env = dict(os.environ)
    for k, v in (
        ("FLWR_TELEMETRY_ENABLED", "0"),
        ("FLWR_DISABLE_UPDATE_CHECK", "1"),
        ("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1"),
        ("FLWR_HOME", str(REPO_ROOT / ".flwr")),
    ):
        env.setdefault(k, v)
    log_path = work / "simulate.log"
    t0 = time.perf_counter()
    with log_path.open("w", encoding="utf-8") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        assert proc.stdout is not None
        deadline = t0 + timeout_s
        for line in proc.stdout:
            fh.write(line)
            if on_line is not None:
                on_line(line)
            if time.perf_counter() > deadline:
                proc.kill()
                break
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    wall = time.perf_counter() - t0
    summaries = sorted((work / "run").glob("*/summary.json"))
    if rc != 0 or not summaries:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-1500:]
        why = "timed out" if wall >= timeout_s else f"exit status {rc}"
        raise RuntimeError(f"cell {cell.record_name()} failed ({why}); log {log_path}:\n{tail}")
    run_dir = summaries[-1].parent
    summary = json.loads(summaries[-1].read_text())
    return {
        "key": cell.key(),
        "study": STUDY,
        "settings": cell.settings,
        "uses": [list(u) for u in cell.uses],
        "seed": cell.seed,
        "method": cell.method,
        "summary": summary,
        "rounds": _read_jsonl(run_dir / "rounds.jsonl"),
        "nodes": _read_jsonl(run_dir / "nodes.jsonl"),
        "fleet": json.loads((run_dir / "fleet.json").read_text())
        if (run_dir / "fleet.json").is_file()
        else None,
        "fleet-text": cell.fleet_text,
        "run-dir": str(run_dir),
        "log": str(log_path),
        "host-wall-s": wall,
    }


def record_path(out: Path, cell: Cell) -> Path:
    return out / "records" / "cells" / cell.record_name()


def run_study(cfg: FederatedConfig, out: Path, *, progress: bool = True) -> dict[str, Any]:
    """Run every missing cell of ``cfg`` under ``out``; return counts and the plan."""
    from simulations.experiments.single_device import Progress

    cells = plan(cfg, out)
    check_plan(cells)
    todo = [c for c in cells if read_record(record_path(out, c), c.key()) is None]
    counts: dict[str, Any] = {
        "cells": len(cells),
        "cells-done": 0,
        "cells-reused": len(cells) - len(todo),
        "cells-failed": 0,
    }
    failures: list[str] = []
    bar = Progress(len(todo), enabled=progress)
    round_re = re.compile(r"^round\s+(\d+)\s+accuracy\s+([0-9.]+)")

    def on_line(line: str) -> None:
        mt = round_re.match(line.strip())
        if mt:
            bar.detail(f"round {mt.group(1)}/{cfg.num_rounds} acc {float(mt.group(2)):.3f}")

    with bar.running():
        for cell in todo:
            label = ", ".join(f"{s}:{v}" for s, v in cell.uses)
            bar.start(f"{cell.method} seed {cell.seed} [{label}]")
            try:
                rec = run_cell(cell, out, timeout_s=cfg.cell_timeout_s, on_line=on_line)
            except RuntimeError as exc:
                log.error("%s", exc)
                failures.append(str(exc).splitlines()[0])
                counts["cells-failed"] += 1
                bar.done(f"FAILED {cell.record_name()}: see {out / 'runs'}")
                continue
            write_json(record_path(out, cell), rec)
            counts["cells-done"] += 1
            s = rec["summary"]
            reach = (
                f"target in round {s['round-to-target']} ({s['sim-time-to-target-s']:.1f} s, "
                f"{s['fleet-energy-to-target-j']:.0f} J)"
                if s.get("round-to-target")
                else f"target not reached (final {s['final-accuracy']:.3f})"
            )
            bar.done(
                f"{cell.method} seed {cell.seed} [{label}]: {reach}, {rec['host-wall-s']:.0f} s"
            )
    counts["failures"] = failures
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
