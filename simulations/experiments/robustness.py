"""The robustness study (issue 32): arms over fleets nobody tuned for.

Every arm of the file (a method and its run-setting overrides: B1, power-aware with each
``balance`` mode, ``steps`` with FedNova and with FedAvg) runs on every fleet, the shipped
ones it lists and ``generated-fleets`` drawn by ``fleet_gen`` from fixed seeds, for every
seed: the same non-IID split and initial weights for every arm of a (fleet, seed) pair, so
the report pairs them. Cells are the federated study's (``federated.Cell``, a record under
``records/cells/`` with the run's summary and per-round records) and run seed by seed,
fleet by fleet, so a study cut short holds whole pairs over every fleet; rerunning the
command skips finished cells. Each cell has a fresh cache (every power-aware run pays its
own profiling) except the proxy r, shared (host time, the same for every arm).

With ``engine = "in-process-warm"`` (the default) the cells run one after another in one
long-lived worker process (``cell_worker.CellWorker``), which loads PyTorch and the app
once and keeps Flower's Ray engine and its actors from one cell to the next;
``in-process`` starts the engine afresh for each cell in that worker; ``runtime`` runs each
cell in a process of its own through Flower's Simulation Runtime, as the federated study
does. Each run stops at the first round whose mean accuracy over ``target-window`` rounds
reaches ``target-accuracy`` (the run's own rule, ``fl_server.target``), by which its first
round at the target is decided too; the report applies both criteria to the per-round
accuracies.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fl_client.settings import RunSettings, SettingsError, fleet_path, load_fleet
from simulations.experiments import robustness_report
from simulations.experiments.cell_worker import CellWorker
from simulations.experiments.config import ExperimentConfigError
from simulations.experiments.federated import (
    NOTE,
    ROUND_LINE,
    Cell,
    CellLoop,
    check_plan,
    complete,
    pending,
)
from simulations.experiments.fleet_gen import fleet_toml, generate_fleet
from simulations.experiments.progress import Progress
from simulations.experiments.robustness_config import NAME, RobustnessConfig, parse_robustness
from simulations.experiments.study import Outcome, Preflight, RunOptions, StudyPlugin

log = logging.getLogger(__name__)


def generated_fleet_name(seed: int) -> str:
    """The label (and file stem) of the generated fleet of ``seed``: ``gen-3``."""
    return f"gen-{seed}"


def fleet_files(cfg: RobustnessConfig, out: Path) -> dict[str, Path]:
    """Every fleet of the study by label, in run order: the shipped ones (label: the file's
    name without .toml), then the generated ones, written to ``out/fleets/gen-S.toml``."""
    fleets: dict[str, Path] = {}
    for name in cfg.fleets:
        path = fleet_path(name)
        fleets[path.stem] = path
    for seed in cfg.generated_fleets:
        label = generated_fleet_name(seed)
        if label in fleets:
            raise ExperimentConfigError(f"fleets: a fleet named {label} is also generated")
        path = out / "fleets" / f"{label}.toml"
        text = fleet_toml(generate_fleet(seed))
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        fleets[label] = path.resolve()
    return fleets


def check_fleets(cfg: RobustnessConfig, fleets: dict[str, Path]) -> None:
    """Every fleet loads and its data split works for every seed (before any training)."""
    from simulations.run import check_partitions

    for label, path in fleets.items():
        try:
            nodes = load_fleet(str(path))
            for seed in cfg.seed_list():
                settings = {**cfg.base_overrides(), "fleet": str(path), "seed": seed}
                check_partitions(RunSettings.from_config(settings), len(nodes))
        except SettingsError as exc:
            raise ExperimentConfigError(f"fleet {label} ({path}): {exc}") from None


def plan(cfg: RobustnessConfig, out: Path) -> list[Cell]:
    """Every cell, seed by seed, fleet by fleet, arm by arm (a study cut short covers every
    fleet at its first seeds); ``uses`` is ``(FLEET, ARM)``. Arms with identical settings
    share one cell."""
    fleets = fleet_files(cfg, out)
    texts = {label: path.read_text(encoding="utf-8") for label, path in fleets.items()}
    cells: dict[tuple[tuple[str, Any], ...], tuple[str, list[tuple[str, str]]]] = {}
    for seed in cfg.seed_list():
        for label, path in fleets.items():
            base = {**cfg.base_overrides(), "seed": seed, "fleet": str(path)}
            for arm in cfg.arms:
                ov = tuple(sorted({**base, **arm.overrides()}.items()))
                cells.setdefault(ov, (label, []))[1].append((label, arm.name))
    return [Cell(ov, texts[label], tuple(uses)) for ov, (label, uses) in cells.items()]


def run_study(cfg: RobustnessConfig, out: Path, *, progress: bool = True) -> dict[str, Any]:
    """Run every missing cell of ``cfg`` under ``out``; return the counts and the plan."""
    fleets = fleet_files(cfg, out)
    check_fleets(cfg, fleets)
    cells = plan(cfg, out)
    todo, counts = pending(cells, out)
    bar = Progress(len(todo), enabled=progress)
    warm = cfg.engine == "in-process-warm"
    worker = CellWorker(warm=warm) if cfg.engine != "runtime" else None

    def on_line(line: str) -> None:
        mt = ROUND_LINE.match(line.strip())
        if mt:
            bar.detail(f"round {mt.group(1)}/{cfg.num_rounds} acc {float(mt.group(2)):.3f}")

    def finish(cell: Cell, rec: dict[str, Any]) -> str:
        rec.update(study=NAME, engine=cfg.engine)
        return f"{cell.label()}: {rec['host-wall-s']:.0f} s"

    runner = worker.run if worker is not None else None
    loop = CellLoop(out, cfg.cell_timeout_s, counts, bar, on_line, runner)
    try:
        with bar.running():
            loop.run(todo, finish)
    finally:
        if worker is not None:
            worker.close()
    counts["failures"] = loop.failures
    counts["fleets"] = {label: str(path) for label, path in fleets.items()}
    counts["plan"] = [
        {"record": c.record_name(), "seed": c.seed, "uses": [list(u) for u in c.uses]}
        for c in cells
    ]
    return counts


def _preflight(cfg: RobustnessConfig, where: str) -> Preflight:
    return Preflight(note=NOTE + " Generated fleets: simulations.experiments.fleet_gen.")


def _run(cfg: RobustnessConfig, out: Path, options: RunOptions) -> Outcome:
    counts = run_study(cfg, out, progress=options.progress)
    return Outcome(counts, complete=complete(counts))


def check(cfg: RobustnessConfig, out: Path) -> None:
    """The plan's cells validate (for tests and dry checks)."""
    check_plan(plan(cfg, out))


STUDY = StudyPlugin(NAME, parse_robustness, _preflight, _run, robustness_report.render)
