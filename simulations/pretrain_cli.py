"""The ``powerfl pretrain`` command's parser (no PyTorch import: a wrong command fails at
once); the work is ``simulations.pretrain``."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_client.preflight import check_writable_file
from fl_client.settings import MODEL_NAMES, SettingsError

if TYPE_CHECKING:
    from simulations.run import RunInterrupted

TORCH_DEVICES = ("auto", "cuda", "cpu")


def _accuracy(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected an accuracy in (0, 1], got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def add_pretrain_command(sub: Any) -> None:
    """``powerfl pretrain``: see ``simulations.pretrain``."""
    p = sub.add_parser(
        "pretrain",
        help="train a model on a dataset and write the checkpoint a fine-tuning run starts "
        "from (-c initial-weights=FILE)",
        description="Train MODEL on DATASET (the names of the dataset run setting) with Adam "
        "and write FILE (safetensors) with FILE.json beside it (model, dataset, test "
        "accuracy, seed, the command). Runs on the GPU when there is one (--torch-device). "
        "Resumable: every finished epoch is kept in FILE.resume.pt, and the same command "
        "run again goes on from there.",
    )
    p.add_argument("--model", required=True, choices=MODEL_NAMES)
    p.add_argument(
        "--dataset",
        required=True,
        help="digits, a data-kit subset (cifar10-subset, mnist-subset), an npz path or a "
        "Hugging Face dataset",
    )
    stop = p.add_mutually_exclusive_group(required=True)
    stop.add_argument("--epochs", type=_positive_int, help="train this many epochs")
    stop.add_argument(
        "--target-accuracy",
        type=_accuracy,
        help="train until the test accuracy reaches this (at most --max-epochs; exit 1 if not)",
    )
    p.add_argument("--max-epochs", type=_positive_int, default=100, help="(default: 100)")
    p.add_argument("--out", required=True, type=Path, help="the checkpoint to write")
    p.add_argument("--torch-device", choices=TORCH_DEVICES, default="auto")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="(default: 64)")
    p.add_argument("--lr", type=_positive, default=1e-3, help="Adam learning rate (1e-3)")
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_pretrain)


def command_of(args: argparse.Namespace) -> list[str]:
    """The command that reproduces this pre-training, every option spelt out."""
    stop = (
        ["--epochs", str(args.epochs)]
        if args.epochs is not None
        else ["--target-accuracy", str(args.target_accuracy), "--max-epochs", str(args.max_epochs)]
    )
    return [
        "powerfl", "pretrain", "--model", args.model, "--dataset", args.dataset, *stop,
        "--out", str(args.out), "--torch-device", args.torch_device,
        "--batch-size", str(args.batch_size), "--lr", f"{args.lr:g}", "--seed", str(args.seed),
    ]  # fmt: skip


def cmd_pretrain(args: argparse.Namespace) -> int:
    """Handler of ``powerfl pretrain``: 0 done, 1 target not reached, 128 + the signal's
    number when a signal stopped it (one line: what is kept, how to go on)."""
    out = check_writable_file(Path(args.out).expanduser().absolute(), "--out")
    from simulations.run import RunInterrupted, interruptible

    try:
        with interruptible():
            return _pretrain(args, out)
    except RunInterrupted as intr:
        print(interrupted_line(intr, out), file=sys.stderr, flush=True)
        return intr.exit_code


def interrupted_line(intr: RunInterrupted, out: Path) -> str:
    """What an interrupted pre-training kept and how to go on, in one line."""
    name = intr.name
    pretrain = sys.modules.get("simulations.pretrain")
    resume_path = getattr(pretrain, "resume_path", None)
    if resume_path is None:  # stopped while PyTorch loaded: nothing was touched
        return f"powerfl pretrain: interrupted by {name} before training started; nothing written"
    resume = resume_path(out)
    if not resume.is_file():
        return (
            f"powerfl pretrain: interrupted by {name} before its first epoch finished; no "
            "epoch to keep"
        )
    return (
        f"powerfl pretrain: interrupted by {name}; its finished epochs are kept in {resume}: "
        "run the same command again to go on from there"
    )


def _pretrain(args: argparse.Namespace, out: Path) -> int:
    from simulations import pretrain
    from simulations.experiments.units import resolve_torch_device

    try:
        device = resolve_torch_device(args.torch_device)
    except RuntimeError as err:
        raise SettingsError(f"--{err}") from None
    settings = pretrain.PretrainSettings(
        model=args.model,
        dataset=args.dataset,
        epochs=args.epochs,
        target_accuracy=args.target_accuracy,
        max_epochs=args.max_epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )
    record = pretrain.pretrain(settings, out, device, command_of(args), progress=not args.quiet)
    print(
        f"wrote {out} ({record['model']} on {record['dataset']}: test accuracy "
        f"{record['accuracy']:.3f} after {record['epochs']} epochs, sha256 "
        f"{record['sha256'][:12]}…) and {pretrain.sidecar(out)}"
    )
    if record["target-reached"] is False:
        print(
            f"powerfl pretrain: error: test accuracy {record['accuracy']:.3f} did not reach "
            f"--target-accuracy {args.target_accuracy} in {record['epochs']} epochs",
            file=sys.stderr,
        )
        return 1
    return 0
