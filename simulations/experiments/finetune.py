"""The fine-tuning study (``study = "finetune"``, issue 24): the paper's protocol with the
data kit. Pre-train on one dataset (``pretrain-dataset``, on the server, ``powerfl
pretrain``), take r from a second (``proxy-dataset``), fine-tune on the devices' data
(``dataset``), and compare with the same federated runs from random weights.

Every cell is a federated run (``simulations.experiments.federated.run_cell``: Flower's
simulation engine, a digital twin per node, a fresh per-cell cache except the server's
proxy r) of one method (B1, B2, ours, the oracle) and one start: ``fine-tuning`` (the
checkpoint as the round-0 global model and r's starting point) or ``from-scratch`` (the
model's seeded random weights). The cells run one after another in one long-lived worker
process that keeps Flower's Ray engine and its actors from one cell to the next
(``cell_worker.CellWorker``, the robustness study's ``in-process-warm`` engine), so the
study starts PyTorch, the app and Ray once, not once per cell. The checkpoint is made by
the study's first stage (kept in ``<out>/checkpoints``, resumable) unless
``initial-weights`` names one; the cells use a copy named by its sha256, so another
checkpoint never reuses a cell. The report compares rounds, device time, fleet energy and
samples to target (profiling counted), profiling's share of device time, and the proxy r
per batch size from both starts.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fl_client.settings import RunSettings, SettingsError, resolve_path
from simulations.experiments.cell_worker import CellWorker
from simulations.experiments.config import (
    Fields,
    FileOptions,
    config_error,
    merge_scale,
)
from simulations.experiments.federated import (
    Cell,
    CellLoop,
    complete,
    pending,
)
from simulations.experiments.federated_config import DEFAULTS as FEDERATED_DEFAULTS
from simulations.experiments.federated_config import FederatedConfig, parse_federated
from simulations.experiments.progress import Progress
from simulations.experiments.records import load_all
from simulations.experiments.study import Outcome, Preflight, RunOptions, StudyPlugin

NAME = "finetune"
STARTS = ("fine-tuning", "from-scratch")
#: The federated study's keys but its scenarios, and the fine-tuning keys.
#: The federated study's keys that the fine-tuning study leaves out (its scenarios).
_SCENARIO_KEYS = (
    "scenarios",
    "scenario-method",
    "deadline-margin",
    "varying-cap-fleet",
    "drift-fleet",
    "drift-check-every",
    "drift-threshold",
    "balance-fleets",
    "balance-modes",
    "critical-r-arms",
)
#: The federated study's keys but its scenarios, and the fine-tuning keys.
DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in FEDERATED_DEFAULTS.items() if k not in _SCENARIO_KEYS},
    "dataset": "digits",
    "proxy-dataset": "",
    "initial-weights": "",
    "pretrain-dataset": "mnist-subset",
    "pretrain-epochs": 2,
    "pretrain-batch-size": 64,
    "pretrain-lr": 0.001,
    "torch-device": "auto",
}
NOTE = (
    "Each cell is one federated run in Flower's simulation engine with a digital twin per "
    "node (device time, power and energy from configs/devices); the model really trains on "
    "the host. Fine-tuning cells start from the study's checkpoint (round-0 global model and "
    "the proxy r's starting point), from-scratch cells from the model's seeded random "
    "weights; everything else (fleet, data split, seeds, settings) is the same."
)


@dataclass(frozen=True)
class FinetuneConfig(FederatedConfig):
    """The federated study's settings (no scenarios) and the fine-tuning protocol's."""

    dataset: str
    proxy_dataset: str
    initial_weights: str
    pretrain_dataset: str
    pretrain_epochs: int
    pretrain_batch_size: int
    pretrain_lr: float
    torch_device: str

    def base_overrides(self) -> dict[str, Any]:
        return {
            **super().base_overrides(),
            "dataset": self.dataset,
            "proxy-dataset": self.proxy_dataset,
        }


def parse_finetune(data: Mapping[str, Any], where: str, options: FileOptions) -> FinetuneConfig:
    """Validate a fine-tuning experiment: the federated keys (checked as the federated study
    checks them, with no scenarios) and the protocol's keys; errors name the key."""
    m = merge_scale(data, where, DEFAULTS, options)
    f = Fields(m, where, DEFAULTS)
    if m.get("study") != NAME:
        raise config_error(where, "study", f"expected {NAME!r}")
    federated = {k: v for k, v in m.items() if k in FEDERATED_DEFAULTS}
    base = parse_federated(
        {"experiment": {**federated, "study": "federated", "scenarios": []}},
        where,
        FileOptions(scale=options.scale),
    )
    values = {fl.name: getattr(base, fl.name) for fl in fields(FederatedConfig)}
    cfg = FinetuneConfig(
        **{**values, "study": NAME},
        dataset=f.text("dataset"),
        proxy_dataset=f.text("proxy-dataset"),
        initial_weights=f.text("initial-weights"),
        pretrain_dataset=f.text("pretrain-dataset"),
        pretrain_epochs=f.integer("pretrain-epochs", 1),
        pretrain_batch_size=f.integer("pretrain-batch-size", 1),
        pretrain_lr=f.number("pretrain-lr", 0.0),
        torch_device=f.text("torch-device", ("auto", "cuda", "cpu")),
    )
    if not cfg.initial_weights and not cfg.pretrain_dataset:
        raise config_error(where, "pretrain-dataset", "give it, or initial-weights")
    for seed in cfg.seed_list():
        try:
            RunSettings.from_config({**cfg.base_overrides(), "seed": seed, "fleet": cfg.fleet})
        except SettingsError as exc:
            raise config_error(where, str(exc).split(":")[0], str(exc)) from None
    return cfg


def _preflight(cfg: FinetuneConfig, where: str) -> Preflight:
    """The datasets load (the data kit's subsets need ``../shared/data``), the fleet splits
    the data, a given checkpoint fits the model."""
    from fl_client import checkpoint, data_splits
    from fl_client.settings import load_fleet
    from simulations.experiments.units import checked_torch_device
    from simulations.run import check_partitions

    named = {"dataset": cfg.dataset, "proxy-dataset": cfg.proxy_dataset}
    if not cfg.initial_weights:
        named["pretrain-dataset"] = cfg.pretrain_dataset
    for key, name in named.items():
        if name:
            try:
                data_splits.check_dataset(name)
            except SettingsError as exc:
                raise config_error(where, key, str(exc)) from None
    nodes = load_fleet(cfg.fleet)
    for seed in cfg.seed_list():
        settings = RunSettings.from_config(
            {**cfg.base_overrides(), "seed": seed, "fleet": str(resolve_path(cfg.fleet))}
        )
        try:
            check_partitions(settings, len(nodes))
        except SettingsError as exc:
            raise config_error(where, "fleet", str(exc)) from None
    if cfg.initial_weights:
        try:
            checkpoint.check(resolve_path(cfg.initial_weights), cfg.model)
        except SettingsError as exc:
            raise config_error(where, "initial-weights", str(exc)) from None
    return Preflight(note=NOTE, torch_device=checked_torch_device(cfg.torch_device, where))


def make_checkpoint(cfg: FinetuneConfig, out: Path, progress: bool) -> Path:
    """The fine-tuning cells' checkpoint: ``initial-weights``, else pre-trained here
    (``powerfl pretrain``, resumable), copied to ``<out>/checkpoints/<sha256>.safetensors``."""
    from fl_client import checkpoint

    folder = out / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    if cfg.initial_weights:
        source = resolve_path(cfg.initial_weights)
    else:
        from simulations import pretrain
        from simulations.experiments.units import resolve_torch_device

        source = folder / f"{cfg.model}-{cfg.pretrain_dataset}-e{cfg.pretrain_epochs}.safetensors"
        if not pretrain.sidecar(source).is_file():
            settings = pretrain.PretrainSettings(
                model=cfg.model,
                dataset=cfg.pretrain_dataset,
                epochs=cfg.pretrain_epochs,
                target_accuracy=None,
                max_epochs=cfg.pretrain_epochs,
                batch_size=cfg.pretrain_batch_size,
                lr=cfg.pretrain_lr,
                seed=0,
            )
            command = [
                "powerfl", "pretrain", "--model", cfg.model, "--dataset", cfg.pretrain_dataset,
                "--epochs", str(cfg.pretrain_epochs), "--out", str(source),
                "--batch-size", str(cfg.pretrain_batch_size), "--lr", f"{cfg.pretrain_lr:g}",
                "--seed", "0",
            ]  # fmt: skip
            device = resolve_torch_device(cfg.torch_device)
            pretrain.pretrain(settings, source, device, command, progress=progress)
    sha = checkpoint.file_sha256(source)
    target = folder / f"{sha[:16]}.safetensors"
    if not target.is_file():
        shutil.copyfile(source, target)
    return target.resolve()


def plan(cfg: FinetuneConfig, weights: Path | None, fleet: Path) -> list[Cell]:
    """Every (seed, start, method) cell; without ``weights`` only the from-scratch ones."""
    fleet_text = fleet.read_text(encoding="utf-8")
    cells = []
    for seed in cfg.seed_list():
        base = {**cfg.base_overrides(), "seed": seed, "fleet": str(fleet)}
        for start in STARTS:
            if start == "fine-tuning" and weights is None:
                continue
            extra = {"initial-weights": str(weights)} if start == "fine-tuning" else {}
            for method in cfg.methods:
                ov = {**base, **extra, "method": method}
                cells.append(Cell(tuple(sorted(ov.items())), fleet_text, ((start, method),)))
    return cells


def _run(cfg: FinetuneConfig, out: Path, options: RunOptions) -> Outcome:
    """Make the checkpoint, then run every missing cell, one after another, in one warm
    worker process (``cell_worker.CellWorker``: PyTorch, the app, Ray and its actors are
    started once for the study, not once per cell)."""
    weights = make_checkpoint(cfg, out, options.progress)
    cells = plan(cfg, weights, resolve_path(cfg.fleet))
    todo, counts = pending(cells, out)
    counts["checkpoint"] = str(weights)
    bar = Progress(len(todo), enabled=options.progress)
    worker = CellWorker(warm=True)

    def finish(cell: Cell, rec: dict[str, Any]) -> str:
        rec.update(start=cell.uses[0][0], engine=worker.engine)
        reached = rec["summary"].get("round-to-target") or "-"
        return f"{cell.label()}: round→target {reached}, {rec['host-wall-s']:.0f} s"

    loop = CellLoop(out, cfg.cell_timeout_s, counts, bar, runner=worker.run)
    try:
        with bar.running():
            loop.run(todo, finish)
    finally:
        worker.close()
    return Outcome(counts, complete=complete(counts))


# --------------------------------------------------------------------------- the report


def samples_to_target(rec: Mapping[str, Any]) -> int | None:
    """Training samples the fleet processed until the round that reached the target:
    every node's local set × local epochs, summed over the rounds it trained (None: the
    target was not reached)."""
    last = rec["summary"].get("round-to-target")
    if not last:
        return None
    epochs = int(rec["settings"]["local-epochs"])
    return sum(
        int(n.get("num-examples") or 0) * epochs
        for n in rec["nodes"]
        if n.get("ok") and int(n["server-round"]) <= int(last)
    )


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if len(vals) == len(xs) and vals else None


def rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (start, method): means over seeds (None when a seed missed the target)."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for rec in records:
        groups.setdefault((str(rec["start"]), str(rec["method"])), []).append(rec)
    out = []
    for (start, method), recs in sorted(
        groups.items(), key=lambda kv: (STARTS.index(kv[0][0]), kv[0][1])
    ):
        s = [r["summary"] for r in recs]
        device = [x["device-train-time-s"] + x["device-profile-time-s"] for x in s]
        out.append(
            {
                "start": start,
                "method": method,
                "seeds": len(recs),
                "initial-accuracy": _mean([x["initial-accuracy"] for x in s]),
                "final-accuracy": _mean([x["final-accuracy"] for x in s]),
                "round-to-target": _mean([x.get("round-to-target") for x in s]),
                "time-to-target-s": _mean([x.get("sim-time-to-target-s") for x in s]),
                "energy-to-target-j": _mean([x.get("fleet-energy-to-target-j") for x in s]),
                "busy-energy-to-target-j": _mean(
                    [x.get("fleet-busy-energy-to-target-j") for x in s]
                ),
                "samples-to-target": _mean([samples_to_target(r) for r in recs]),
                "profile-share": _mean(
                    [
                        x["device-profile-time-s"] / d if d > 0 else None
                        for x, d in zip(s, device, strict=True)
                    ]
                ),
                "r": s[0].get("r") or {},
                "r-cost-s": _mean([x.get("r-cost-s") for x in s]),
            }
        )
    return out


def proxy_r_by_start(table: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Per start, the row whose server r (the proxy's, the same for every method of a start
    and seed) the report shows: ours' cell, else the first cell of that start that has r."""
    out: dict[str, Mapping[str, Any]] = {}
    for r in sorted(table, key=lambda r: r["method"] != "power-aware"):
        if r["r"] and r["start"] not in out:
            out[r["start"]] = r
    return {start: out[start] for start in STARTS if start in out}


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def render(out: Path) -> Path:
    """``report.md`` of the study's records: the comparison table and r from both starts."""
    records = [r for r in load_all(out / "records" / "cells") if r.get("start") in STARTS]
    table = rows(records)
    lines = [
        f"# Fine-tuning against training from scratch ({out.name})",
        "",
        NOTE,
        "",
        "Means over seeds; time and energy to target count profiling (device time: training "
        "+ profiling). Energy→target is the run's headline fleet energy (with "
        "`idle-accounting = on`, the default, it counts the idle power of nodes waiting for "
        "the round's slowest); busy energy is the fleet's training and profiling energy "
        "alone. Samples to target: training samples the fleet processed until the target "
        "round; '–': a seed did not reach the target.",
        "",
        "| start | method | seeds | round-0 acc | final acc | rounds→target | time→target s "
        "| energy→target J | busy energy→target J | samples→target | profiling share |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        samples = r["samples-to-target"]
        lines.append(
            f"| {r['start']} | {r['method']} | {r['seeds']} | {_fmt(r['initial-accuracy'], 3)} "
            f"| {_fmt(r['final-accuracy'], 3)} | {_fmt(r['round-to-target'])} "
            f"| {_fmt(r['time-to-target-s'])} | {_fmt(r['energy-to-target-j'])} "
            f"| {_fmt(r['busy-energy-to-target-j'])} "
            f"| {'–' if samples is None else f'{samples:,.0f}'} "
            f"| {_fmt(None if r['profile-share'] is None else 100 * r['profile-share'])}% |"
        )
    lines += ["", "## r on the proxy set (Eq. 3), by start", ""]
    by_start = proxy_r_by_start(table)
    sizes = sorted({int(b) for row in by_start.values() for b in row["r"]})
    if sizes:
        lines += [
            "Host s: the estimate's host time in the cell that computed it (the start's other "
            "cells read it from the study's r cache).",
            "",
            "| start | " + " | ".join(f"b={b}" for b in sizes) + " | host s |",
            "|---|" + "---|" * (len(sizes) + 1),
        ]
        for start, row in by_start.items():
            cells = [_fmt(row["r"].get(str(b)), 2) for b in sizes]
            costs = [x["r-cost-s"] for x in table if x["start"] == start and x["r-cost-s"]]
            cost = _fmt(max(costs) if costs else None)
            lines.append(f"| {start} | " + " | ".join(cells) + f" | {cost} |")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


STUDY = StudyPlugin(NAME, parse_finetune, _preflight, _run, render)
