"""``powerfl experiment run FILE`` and ``powerfl experiment report DIR``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fl_client.settings import tomllib
from simulations.experiments.config import (
    SCALES,
    ExperimentConfigError,
    SingleDeviceConfig,
    config_key,
    load_any,
)
from simulations.experiments.records import write_json

DATA_NOTE = (
    "Data: scikit-learn's bundled digits (1,797 8×8 images) upsampled to 3×32×32 "
    "(fl_client.task). Target `digits` = the 1,047-image client pool of "
    "`load_digits_splits(0)`, split per seed 80/20 (stratified) into target-train / "
    "target-test. Proxy `digits-rotated` = the 450 proxy images of the same function (disjoint "
    "images: proxy-train 300, proxy-eval 150), each rotated by its own angle in "
    "±`proxy-rotate-deg` and with N(0, `proxy-noise-std`²) noise on the standardised pixels "
    "(fixed seed): a differently transformed copy of other digits. Models start from random "
    "weights seeded per seed (the paper fine-tunes CIFAR100-pretrained weights; no "
    "pretraining here). Device time, power and energy come from the digital twins in "
    "configs/devices (models calibrated to the paper's Nano points; the TX2 NX twin's "
    "coefficients are assumptions, see its TOML)."
)


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


def default_out(cfg: Any) -> Path:
    return Path("runs") / "experiments" / f"{cfg.name}-{cfg.scale}"


def run_experiment(
    path: str | Path,
    *,
    out: str | Path | None = None,
    seeds: int | None = None,
    scale: str = "mini",
    progress: bool = True,
    command: str | None = None,
    sets: Mapping[str, Any] | None = None,
    only_training: bool = False,
) -> Path:
    """Run (or resume) the experiment file ``path``; write records and the report; return
    the output folder.

    ``sets`` override keys of the file (``--set``); ``only_training`` (single-device study)
    runs the proxy and target training runs (the r estimation) and stops before profiling,
    so they can run on a GPU host and the rest elsewhere from the same records.
    """
    cfg = load_any(path, scale=scale, seeds=seeds, sets=sets)  # all validation first
    if not isinstance(cfg, SingleDeviceConfig):
        if only_training:
            raise ExperimentConfigError("--only-training: only the single-device study has it")
        if cfg.study == "proxy-sensitivity":
            return run_sensitivity_experiment(
                cfg, path, out=out, progress=progress, command=command
            )
        return run_federated_experiment(cfg, path, out=out, progress=progress, command=command)
    from simulations.experiments.datasets import study_data
    from simulations.experiments.report import render
    from simulations.experiments.single_device import _data_kwargs, run_study

    device = _torch_device(cfg, path)
    sizes = study_data(seed=0, **_data_kwargs(cfg)).sizes()
    out_dir, manifest = _start(
        cfg, path, out, command, sizes=sizes, note=DATA_NOTE, torch_device=device
    )
    t0 = time.perf_counter()
    counts = run_study(cfg, out_dir, progress=progress, only_training=only_training)
    if only_training:
        _finish(out_dir, manifest, counts, t0, complete=False, stage="training")
        return out_dir
    manifest.pop("stage", None)
    _finish(out_dir, manifest, counts, t0, complete=True)
    render(out_dir)
    return out_dir


def _torch_device(cfg: Any, path: str | Path) -> str:
    """The study's ``torch-device`` as recorded; 'cuda' without a GPU is an error now."""
    from simulations.experiments.single_device import resolve_torch_device, torch_device_name

    try:
        return torch_device_name(resolve_torch_device(cfg.torch_device))
    except RuntimeError as err:
        raise ExperimentConfigError(f"{path}: {err}") from None


def _start(
    cfg: Any,
    path: str | Path,
    out: str | Path | None,
    command: str | None,
    *,
    note: str,
    sizes: Mapping[str, Any] | None = None,
    torch_device: str | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Create the output folder (with a copy of the experiment file) and its manifest."""
    out_dir = Path(out) if out is not None else default_out(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "experiment.toml").write_text(Path(path).read_text(encoding="utf-8"))
    host: dict[str, Any] = {"cpus": os.cpu_count()}
    if torch_device is not None:
        host["torch-device"] = torch_device
    manifest: dict[str, Any] = {
        "study": cfg.study,
        "experiment-file": str(path),
        "command": command or "powerfl " + shlex.join(sys.argv[1:]),
        "config": cfg.to_dict(),
        "config-key": config_key(cfg),
        **({"data-sizes": dict(sizes)} if sizes is not None else {}),
        "data-note": note,
        "versions": _versions(),
        "host": host,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "complete": False,
    }
    write_json(out_dir / "manifest.json", manifest)
    return out_dir, manifest


def _finish(
    out_dir: Path,
    manifest: dict[str, Any],
    counts: Mapping[str, int],
    t0: float,
    *,
    complete: bool,
    **extra: Any,
) -> None:
    manifest.update(
        complete=complete,
        counts=dict(counts),
        **{"wall-s": time.perf_counter() - t0},
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **extra,
    )
    write_json(out_dir / "manifest.json", manifest)


FEDERATED_NOTE = (
    "Data: scikit-learn's bundled digits upsampled to 3×32×32 (fl_client.task): the server "
    "keeps a test split, the clients' pool is split over the fleet's nodes by the run's "
    "partitioning (Dirichlet over labels for non-IID) per seed; the server's proxy set for r "
    "is a disjoint slice. Models start from random weights seeded per seed. Device time, "
    "power and energy come from the digital twins in configs/devices (calibrated to the "
    "paper's Nano points; the other twins' coefficients are assumptions, see their TOML)."
)


def run_federated_experiment(
    cfg: Any,
    path: str | Path,
    *,
    out: str | Path | None = None,
    progress: bool = True,
    command: str | None = None,
) -> Path:
    """Run (or resume) a federated study (``simulations.experiments.federated``)."""
    from simulations.experiments.federated import run_study
    from simulations.experiments.federated_report import render

    out_dir, manifest = _start(cfg, path, out, command, note=FEDERATED_NOTE)
    t0 = time.perf_counter()
    counts = run_study(cfg, out_dir, progress=progress)
    _finish(out_dir, manifest, counts, t0, complete=counts["cells-failed"] == 0)
    render(out_dir)
    return out_dir


def run_sensitivity_experiment(
    cfg: Any,
    path: str | Path,
    *,
    out: str | Path | None = None,
    progress: bool = True,
    command: str | None = None,
) -> Path:
    """Run (or resume) a proxy-sensitivity study; write records, plots and report.md."""
    from simulations.experiments.proxy_sensitivity import check_data, run_sensitivity
    from simulations.experiments.sensitivity_report import render

    device = _torch_device(cfg, path)
    sizes = check_data(cfg)  # a missing corpus is an error before any training
    note = SENSITIVITY_NOTE_TEXT if cfg.task == "text" else SENSITIVITY_NOTE_IMAGE
    out_dir, manifest = _start(cfg, path, out, command, note=note, sizes=sizes, torch_device=device)
    t0 = time.perf_counter()
    counts = run_sensitivity(cfg, out_dir, progress=progress)
    _finish(out_dir, manifest, counts, t0, complete=True)
    render(out_dir)
    return out_dir


SENSITIVITY_NOTE_IMAGE = (
    "Data: views of scikit-learn's bundled digits upsampled to 3×32×32: the same 1,047-image "
    "pool, split 80/20 per seed (stratified); `digits-rotated` rotates each image by its own "
    "angle in ±rotate-deg and adds N(0, noise-std²) noise, `digits-inverted` inverts the "
    "contrast and adds the same noise, `digits-parity` relabels to even/odd. They share "
    "images, unlike the paper's CIFAR-10/SVHN/CINIC/FMNIST/STL, so they are closer to each "
    "other than the paper's datasets. Models start from random weights seeded per seed (the "
    "paper fine-tunes pretrained weights). Time and power come from the digital twins in "
    "configs/devices."
)
SENSITIVITY_NOTE_TEXT = (
    "Data: the data kit's public-domain corpora (tiny Shakespeare; Austen: Emma, Persuasion, "
    "Sense and Sensibility; Dickens: Great Expectations, Oliver Twist), the paper's "
    "vocabulary rule, 90/10 split by position; accuracy is next-character accuracy over "
    "eval-windows random test windows of 64 characters. Models start from random weights "
    "seeded per seed (the paper pre-trains on WikiText-2). Time and power come from the "
    "digital twins in configs/devices."
)


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items → a mapping; VALUE is TOML (``4``, ``"cuda"``,
    ``["resnet18"]``), or a bare string when it is not valid TOML."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ExperimentConfigError(f"--set: expected KEY=VALUE, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = value.strip()
    return out


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
            command=command,
            out=args.out,
            seeds=args.seeds,
            scale=args.scale,
            progress=not args.no_progress,
            sets=parse_sets(args.set),
            only_training=args.only_training,
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
    from simulations.experiments.federated_report import FederatedReportError
    from simulations.experiments.federated_report import render as render_federated
    from simulations.experiments.report import ReportError, render
    from simulations.experiments.sensitivity_report import SensitivityReportError
    from simulations.experiments.sensitivity_report import render as render_sensitivity

    out = Path(args.dir)
    try:
        manifest = out / "manifest.json"
        study = (
            json.loads(manifest.read_text(encoding="utf-8")).get("study")
            if manifest.is_file()
            else None
        )
        if study == "federated":
            path = render_federated(out)
        elif study == "proxy-sensitivity":
            path = render_sensitivity(out)
        else:
            path = render(out)
    except (ReportError, FederatedReportError, SensitivityReportError) as err:
        print(f"powerfl experiment: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def add_experiment_commands(sub: Any) -> None:
    """Register ``experiment run`` / ``experiment report`` on the ``powerfl`` subparsers."""
    p = sub.add_parser(
        "experiment",
        help="research experiments: run a study from a TOML file, render its report",
        description="Run a study (configs/experiments/*.toml) with tables and plots, resumably.",
    )
    esub = p.add_subparsers(dest="experiment_command", required=True)
    r = esub.add_parser("run", help="run (or resume) an experiment file")
    r.add_argument(
        "experiment",
        help="experiment file, e.g. configs/experiments/single-device.toml or federated.toml",
    )
    r.add_argument("--out", help="output folder (default: runs/experiments/NAME-SCALE)")
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
