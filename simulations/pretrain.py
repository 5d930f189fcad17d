"""``powerfl pretrain``: train a model on a dataset on the server and write the checkpoint a
fine-tuning run starts from (the ``initial-weights`` run setting).

The model trains with Adam on every image of the dataset but its test set (for the bundled
digits: the pool and both proxy slices; for an npz or a Hugging Face dataset: its train
split) in seeded minibatches, one epoch at a time, and is evaluated on the test set after
each epoch. It stops after ``--epochs`` epochs, or at the first epoch whose test accuracy
reaches ``--target-accuracy`` (at most ``--max-epochs``).

Files: ``--out`` (safetensors, with the record below as its metadata, less what differs
between two runs of the same settings: the command, which names ``--out``, and the training
time; so the same settings and seed give the same bytes and sha256, and the oracle's r cache,
keyed by that sha256, is reused) and ``--out`` + ``.json`` beside it: model, dataset,
accuracy, seed, epochs, the command, the training time, the file's sha256. While it
runs, ``--out`` + ``.resume.pt`` holds the last finished epoch (weights, optimizer, history,
the settings); the same command run again goes on from there, another command is refused.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from fl_client import checkpoint, data_splits, model_zoo, task
from fl_client.progress import ProgressBar
from fl_client.settings import SettingsError

#: The record's format (in the JSON and the checkpoint's metadata).
RECORD_VERSION = "powerfl-pretrain/1"
#: Record keys kept out of the checkpoint's metadata (in the JSON only): the per-epoch
#: history, and what would make the same tensors hash differently (the path, the time).
NOT_IN_CHECKPOINT = ("history", "command", "train-time-s")


@dataclass(frozen=True)
class PretrainSettings:
    """A pre-training run's settings. Its trajectory depends on ``trajectory()`` only (a
    resume with other values is refused); ``epochs``, ``target_accuracy`` and
    ``max_epochs`` say when it stops, so a resume may give it more epochs."""

    model: str
    dataset: str
    epochs: int | None
    target_accuracy: float | None
    max_epochs: int
    batch_size: int
    lr: float
    seed: int

    def trajectory(self) -> dict[str, Any]:
        stop = ("epochs", "target_accuracy", "max_epochs")
        return {k.replace("_", "-"): v for k, v in asdict(self).items() if k not in stop}


def sidecar(out: Path) -> Path:
    """The JSON record beside the checkpoint."""
    return out.with_name(out.name + ".json")


def resume_path(out: Path) -> Path:
    """The last finished epoch of an unfinished run."""
    return out.with_name(out.name + ".resume.pt")


def training_sets(dataset: str, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """(train, test): every image of ``dataset`` but its test set, and its test set."""
    splits = data_splits.load_splits(dataset, seed)
    parts = [
        data_splits.as_tensors(d) for d in (splits.pool, splits.proxy_train, splits.proxy_eval)
    ]
    train = TensorDataset(torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts]))
    return train, splits.test


def _load_resume(path: Path, settings: PretrainSettings) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a resume file cut short by a crash: start over, say so
        print(f"powerfl pretrain: {path} unreadable ({err}); starting over", file=sys.stderr)
        return None
    if state.get("settings") != settings.trajectory():
        raise SettingsError(
            f"--out: {path} is an unfinished pre-training with other settings "
            f"({json.dumps(state.get('settings'))}); run that command again to finish it, "
            "or remove the file"
        )
    return state


def pretrain(
    settings: PretrainSettings,
    out: Path,
    device: torch.device,
    command: Sequence[str],
    progress: bool = True,
) -> dict[str, Any]:
    """Train, write ``out`` and its JSON record, return the record (see the module)."""
    if settings.model not in model_zoo.MODEL_NAMES:
        allowed = ", ".join(model_zoo.MODEL_NAMES)
        raise SettingsError(f"--model: unknown model {settings.model!r}; allowed: {allowed}")
    data_splits.check_dataset(settings.dataset)
    train_set, test_set = training_sets(settings.dataset, settings.seed)
    x_train, y_train = data_splits.as_tensors(train_set)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(settings.seed)
    model = model_zoo.build_model(settings.model).to(device)
    optimizer = task.make_optimizer(model, settings.lr)
    history: list[dict[str, float]] = []
    elapsed_s = 0.0
    resume = resume_path(out)
    state = _load_resume(resume, settings)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        history = list(state["history"])
        elapsed_s = float(state["elapsed-s"])
    budget = settings.epochs if settings.epochs is not None else settings.max_epochs
    bar = ProgressBar(budget, enabled=progress, title=f"pretrain {settings.model}")
    if len(history) > budget:
        raise SettingsError(
            f"--epochs: {resume} has already trained {len(history)} epochs, more than "
            f"{budget}; give at least --epochs {len(history)}"
        )
    if history:
        bar.report(f"resuming after epoch {len(history)} of {budget} from {resume}")
    with bar.running():
        while len(history) < budget and not _reached(history, settings):
            epoch = len(history) + 1
            bar.start(f"epoch {epoch}/{budget}", f"{len(x_train)} images")
            t0 = time.perf_counter()
            train_loss = _train_epoch(model, optimizer, (x_train, y_train), settings, epoch)
            loss, acc = task.evaluate(model, test_set)
            elapsed_s += time.perf_counter() - t0
            history.append(
                {
                    "epoch": epoch,
                    "train-loss": train_loss,
                    "test-loss": float(loss),
                    "test-accuracy": float(acc),
                }
            )
            _save_resume(resume, settings, model, optimizer, history, elapsed_s)
            bar.done(f"epoch {epoch}: test accuracy {acc:.3f}, train loss {train_loss:.3f}")
    record = _record(settings, history, (len(x_train), len(test_set)), device, elapsed_s)
    record["command"] = shlex.join(command)
    model.cpu()
    meta = {k: v for k, v in record.items() if k not in NOT_IN_CHECKPOINT}
    checkpoint.save(model.state_dict(), out, meta)
    record["sha256"] = checkpoint.file_sha256(out)
    sidecar(out).write_text(json.dumps(record, indent=2) + "\n")
    resume.unlink(missing_ok=True)
    return record


def _train_epoch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: tuple[torch.Tensor, torch.Tensor],
    settings: PretrainSettings,
    epoch: int,
) -> float:
    """One epoch over ``data`` in the epoch's seeded order; its mean training loss."""
    x_train, y_train = data
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(settings.seed * 100_003 + epoch)
    order = torch.randperm(len(x_train), generator=gen)
    model.train()
    losses = []
    for start in range(0, len(x_train), settings.batch_size):
        ids = order[start : start + settings.batch_size]
        xb, yb = x_train[ids].to(device), y_train[ids].to(device)
        losses.append(task.train_step(model, optimizer, xb, yb))
    return float(sum(losses) / len(losses))


def _save_resume(
    resume: Path,
    settings: PretrainSettings,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    history: list[dict[str, float]],
    elapsed_s: float,
) -> None:
    """The last finished epoch, through a temporary file and a rename: an interruption
    leaves the previous epoch's file whole, and no temporary file."""
    tmp = resume.with_name(resume.name + ".tmp")
    try:
        state = {
            "settings": settings.trajectory(),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "history": history,
            "elapsed-s": elapsed_s,
        }
        torch.save(state, tmp)
        tmp.replace(resume)
    finally:
        tmp.unlink(missing_ok=True)


def _record(
    settings: PretrainSettings,
    history: list[dict[str, float]],
    images: tuple[int, int],
    device: torch.device,
    elapsed_s: float,
) -> dict[str, Any]:
    """The record of a finished pre-training (less its command and the file's sha256)."""
    return {
        "record-version": RECORD_VERSION,
        "model": settings.model,
        "dataset": settings.dataset,
        "accuracy": history[-1]["test-accuracy"] if history else float("nan"),
        "seed": settings.seed,
        "epochs": len(history),
        "target-accuracy": settings.target_accuracy,
        "target-reached": None if settings.target_accuracy is None else _reached(history, settings),
        "batch-size": settings.batch_size,
        "lr": settings.lr,
        "train-images": images[0],
        "test-images": images[1],
        "torch-device": str(device),
        "train-time-s": round(elapsed_s, 3),
        "history": history,
    }


def _reached(history: list[dict[str, float]], settings: PretrainSettings) -> bool:
    target = settings.target_accuracy
    return target is not None and bool(history) and history[-1]["test-accuracy"] >= target
