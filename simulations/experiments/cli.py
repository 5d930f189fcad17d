"""``powerfl experiment run FILE`` and ``powerfl experiment report DIR``.

Both go through the study registry (``simulations.experiments.registry``): this module knows
output folders and manifests, not the studies.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fl_client.preflight import check_writable_dir
from fl_client.settings import SettingsError, key_values
from simulations.experiments.config import (
    SCALES,
    ExperimentConfigError,
    FileOptions,
    StudyConfig,
    config_key,
    given_keys,
    read_experiment_file,
)
from simulations.experiments.fleet_gen import add_fleet_command
from simulations.experiments.records import write_json
from simulations.experiments.report_kit import ReportError, load_output
from simulations.experiments.study import Outcome, Preflight, RunOptions


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("torch", "torchvision", "numpy", "scikit-learn", "matplotlib", "flwr", "rich"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    out["platform"] = platform.platform()
    return out


def default_out(cfg: StudyConfig) -> Path:
    """``runs/experiments/NAME-SCALE`` in the current folder, like ``simulate``'s ``runs``
    (an ``--out`` a user types is relative to the current directory too)."""
    return Path.cwd() / "runs" / "experiments" / f"{cfg.name}-{cfg.scale}"


def output_folder(path: str | Path, file: FileOptions | None = None) -> Path:
    """Where ``experiment run`` writes the file ``path`` without ``--out``
    (runs/experiments/NAME-SCALE); the file must read."""
    from simulations.experiments.registry import load_config

    return default_out(load_config(path, file))


def check_own_folder(out_dir: Path, cfg: StudyConfig) -> None:
    """An output folder that holds another experiment's output (its manifest.json names
    another study, name or scale) is refused, naming both: a run there would overwrite its
    manifest.json and experiment.toml. The same experiment's folder is resumed."""
    path = out_dir / "manifest.json"
    if not path.is_file():
        return
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        old = manifest.get("config", {})
        theirs = (manifest.get("study"), old.get("name"), old.get("scale"))
    except (OSError, ValueError, AttributeError) as err:
        raise ExperimentConfigError(
            f"--out: {path} is not a readable manifest ({err}); give another folder"
        ) from None
    mine = (cfg.study, cfg.name, cfg.scale)
    if theirs != mine:
        raise ExperimentConfigError(
            f"--out: {out_dir} holds the output of another experiment (study {theirs[0]}, "
            f"name {theirs[1]}, scale {theirs[2]}), and this one is study {mine[0]}, name "
            f"{mine[1]}, scale {mine[2]}: its manifest.json, experiment.toml and records "
            "would be overwritten; give another --out, or move that folder away"
        )


def _start(
    cfg: StudyConfig, path: str | Path, out_dir: Path, command: str | None, pre: Preflight
) -> dict[str, Any]:
    """Create the output folder (with a copy of the experiment file) and its manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "experiment.toml").write_text(Path(path).read_text(encoding="utf-8"))
    host: dict[str, Any] = {"cpus": os.cpu_count()}
    if pre.torch_device is not None:
        host["torch-device"] = pre.torch_device
    manifest: dict[str, Any] = {
        "study": cfg.study,
        "experiment-file": str(path),
        "command": command or "powerfl " + shlex.join(sys.argv[1:]),
        "config": cfg.to_dict(),
        "config-key": config_key(cfg),
        **({"data-sizes": dict(pre.data_sizes)} if pre.data_sizes is not None else {}),
        "data-note": pre.note,
        "versions": _versions(),
        "host": host,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "complete": False,
    }
    write_json(out_dir / "manifest.json", manifest)
    return manifest


def _finish(out_dir: Path, manifest: dict[str, Any], outcome: Outcome, t0: float) -> None:
    manifest.update(
        complete=outcome.complete,
        counts=dict(outcome.counts),
        **{"wall-s": time.perf_counter() - t0},
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    if outcome.stage is not None:
        manifest["stage"] = outcome.stage
    write_json(out_dir / "manifest.json", manifest)


def run_experiment(
    path: str | Path,
    *,
    out: str | Path | None = None,
    file: FileOptions | None = None,
    run: RunOptions | None = None,
    command: str | None = None,
) -> Path:
    """Run (or resume) the experiment file ``path``; write records and the report; return
    the output folder.

    ``file`` reads the file at a scale with the command's overrides (``--seeds``, ``--set``);
    ``run.only_training`` (studies with a training stage) runs the proxy and target training
    runs (the r estimation) and stops there, so they can run on a GPU host and the rest
    elsewhere from the same records. Every check runs before the output folder exists.
    """
    from simulations.experiments.registry import study_for

    run = run or RunOptions()
    data, where = read_experiment_file(path)
    study = study_for(data, where)
    file = file or FileOptions()
    cfg = study.parse(data, where, file)
    unused = cfg.unused_keys(given_keys(data, file))
    if unused:  # an experiment file is shared across scenarios: named, not refused
        print(
            f"powerfl experiment: warning: {where}: keys that take no effect in this run: "
            + ", ".join(unused),
            file=sys.stderr,
            flush=True,
        )
    if run.only_training and not study.has_training_stage:
        raise ExperimentConfigError(
            f"--only-training: the {study.name} study has no separate training stage"
        )
    pre = study.preflight(cfg, where)
    out_dir = Path(out).expanduser().absolute() if out is not None else default_out(cfg)
    try:
        check_writable_dir(out_dir, "--out")
    except SettingsError as err:
        raise ExperimentConfigError(str(err)) from None
    check_own_folder(out_dir, cfg)
    manifest = _start(cfg, path, out_dir, command, pre)
    t0 = time.perf_counter()
    outcome = study.run(cfg, out_dir, run)
    _finish(out_dir, manifest, outcome, t0)
    if outcome.stage is None:
        study.render(out_dir)
    return out_dir


def render_report(out: str | Path) -> Path:
    """Re-render the report of an output folder with its own study's renderer."""
    from simulations.experiments.registry import get_study

    output = load_output(Path(out))
    return get_study(output.study, f"{output.folder / 'manifest.json'}: study").render(
        output.folder
    )


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items → a mapping (``settings.key_values``); VALUE is TOML
    (``4``, ``"cuda"``, ``["resnet18"]``), or a bare string when it is not valid TOML. A
    key given twice with different values is an error."""
    try:
        return key_values(items, "--set")
    except SettingsError as err:
        raise ExperimentConfigError(str(err)) from None


def cmd_run(args: argparse.Namespace) -> int:
    command = shlex.join(
        ["powerfl", "experiment", "run", args.experiment, "--scale", args.scale]
        + (["--out", args.out] if args.out else [])
        + (["--seeds", str(args.seeds)] if args.seeds is not None else [])
        + [f"--set={s}" for s in args.set]
        + (["--only-training"] if args.only_training else [])
        + (["--no-progress"] if args.no_progress else [])
    )
    try:
        out = run_experiment(
            args.experiment,
            out=args.out,
            file=FileOptions(scale=args.scale, seeds=args.seeds, sets=parse_sets(args.set)),
            run=RunOptions(progress=not args.no_progress, only_training=args.only_training),
            command=command,
        )
    except ExperimentConfigError as err:
        print(f"powerfl experiment: error: {err}", file=sys.stderr)
        return 2
    if args.only_training:
        print(f"training records: {out / 'records' / 'train'}")
    else:
        print(f"report: {out / 'report.md'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    try:
        path = render_report(args.dir)
    except (ReportError, ExperimentConfigError) as err:
        print(f"powerfl experiment: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def add_experiment_commands(sub: Any) -> None:
    """Register ``experiment run`` / ``experiment report`` on the ``powerfl`` subparsers."""
    p = sub.add_parser(
        "experiment",
        help="research experiments: run a study from a TOML file, render its report",
        description="Run a study (an experiment TOML file, or a shipped one's name: "
        "configs/experiments) with tables and plots, resumably.",
    )
    esub = p.add_subparsers(dest="experiment_command", required=True)
    r = esub.add_parser("run", help="run (or resume) an experiment file")
    r.add_argument(
        "experiment",
        help="experiment file, or a shipped experiment's name, e.g. single-device or federated",
    )
    r.add_argument(
        "--out",
        help="output folder, relative to the current directory (default: "
        "runs/experiments/NAME-SCALE in the current folder)",
    )
    r.add_argument("--seeds", type=int, help="number of seeds (overrides the file)")
    r.add_argument("--scale", choices=SCALES, default="mini", help="mini (default) or paper")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the file after the scale, VALUE as TOML "
        "(e.g. --set 'models=[\"resnet18\"]' --set torch-device=cuda); repeatable",
    )
    r.add_argument(
        "--only-training",
        action="store_true",
        help="single-device study: only the proxy/target training runs (r estimation), "
        "e.g. on a GPU host; a later run without it reuses them",
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_run)
    rep = esub.add_parser("report", help="re-render report.md and plots from saved records")
    rep.add_argument("dir", help="an output folder of `powerfl experiment run`")
    rep.set_defaults(func=cmd_report)
    add_fleet_command(esub)
