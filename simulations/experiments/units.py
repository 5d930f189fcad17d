"""Units of work the single-device and proxy-sensitivity studies share: resumable records,
training runs to an accuracy target, and full-grid LUTs on a device's digital twin."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.utils.data import TensorDataset

from fl_client import model_zoo, r_estimation, task
from fl_client.devices import open_device
from fl_client.devices.descriptors import load_device_spec
from fl_client.node import max_batch_size, workload_for
from fl_client.profiler import ProfileOptions, profile
from fl_client.r_estimation import InitialModel, samples_to_target
from fl_client.selection import Tables
from simulations.experiments.config import ExperimentConfigError
from simulations.experiments.progress import Progress
from simulations.experiments.records import digest, read_record, write_json
from simulations.experiments.report_kit import cap_label

if TYPE_CHECKING:
    from fl_client.lut import LUT

#: Version of the training-run and full-grid LUT records (part of their keys).
CODE_VERSION = 1
#: Every run of seed s starts from the weights drawn with seed INIT_SEED_OFFSET + s.
INIT_SEED_OFFSET = 1000

#: (samples when the target was first reached or None, evaluation curve, samples processed)
TrainingResult = tuple[int | None, list[tuple[int, float]], int]


class TrainingSettings(Protocol):
    """The settings of a study's training runs."""

    @property
    def lr_ref(self) -> float: ...
    @property
    def b_ref(self) -> int: ...
    @property
    def eval_every_samples(self) -> int: ...
    @property
    def max_samples(self) -> int: ...


class ProfileSettings(Protocol):
    """The settings of a study's full-grid LUTs."""

    @property
    def batch_sizes(self) -> tuple[int, ...]: ...
    @property
    def caps_w(self) -> tuple[float | None, ...]: ...
    @property
    def profile_warmup_steps(self) -> int: ...
    @property
    def profile_steps(self) -> int: ...


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Unit:
    """One resumable piece of work: its record file and key, what computes the record, and
    how the progress display names it."""

    path: Path
    key: str
    title: str  # while it runs
    compute: Callable[[Progress], dict[str, Any]]
    summary: Callable[[dict[str, Any]], str]  # the line once it is done


def run_units(groups: Mapping[str, Sequence[Unit]], progress: bool) -> dict[str, int]:
    """Compute, in order, every unit of ``groups`` (kind → units) whose record is missing or
    stale; return ``<kind>-done`` / ``<kind>-reused`` counts."""
    todo = {
        kind: [u for u in units if read_record(u.path, u.key) is None]
        for kind, units in groups.items()
    }
    counts: dict[str, int] = {}
    for kind, units in groups.items():
        counts[f"{kind}-done"] = len(todo[kind])
        counts[f"{kind}-reused"] = len(units) - len(todo[kind])
    bar = Progress(sum(len(t) for t in todo.values()), enabled=progress)
    with bar.running():
        for unit in itertools.chain.from_iterable(todo.values()):
            bar.start(unit.title)
            rec = unit.compute(bar)
            write_json(unit.path, rec)
            bar.done(unit.summary(rec))
    return counts


# --------------------------------------------------------------------------- training runs


def initial_state(model_name: str, seed: int) -> dict[str, torch.Tensor]:
    """The weights every run of ``seed`` starts from (proxy and target alike)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED_OFFSET + seed)
        model = model_zoo.build_model(model_name)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def resolve_torch_device(setting: str) -> torch.device:
    """``torch-device`` → a torch device; ``cuda`` without a usable GPU is an error."""
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("torch-device: 'cuda' asked for, but torch sees no CUDA GPU")
    return torch.device("cuda")


def torch_device_name(device: torch.device) -> str:
    """``cpu`` or the GPU's name (``cuda: NVIDIA H100 80GB HBM3``), for the records."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return device.type


def checked_torch_device(setting: str, where: str) -> str:
    """The ``torch-device`` as recorded; 'cuda' without a GPU is an error before any run."""
    try:
        return torch_device_name(resolve_torch_device(setting))
    except RuntimeError as err:
        raise ExperimentConfigError(f"{where}: {err}") from None


class TargetRun(r_estimation.TargetRun):
    """One training run to an accuracy target (``fl_client.r_estimation.TargetRun``, what
    the training functions train), built from a study's settings."""

    @classmethod
    def of(cls, cfg: TrainingSettings, batch_size: int, target: float, seed: int) -> TargetRun:
        """Batch size b at lr_ref·sqrt(b/b_ref) (the paper's rule)."""
        return cls(
            batch_size=batch_size,
            lr=task.scaled_lr(cfg.lr_ref, cfg.b_ref, batch_size),
            target_accuracy=target,
            eval_every_samples=cfg.eval_every_samples,
            max_samples=cfg.max_samples,
            seed=seed,
        )


def train_images(
    model: str,
    sets: tuple[TensorDataset, TensorDataset],
    run: TargetRun,
    on_eval: Callable[[int], None] | None,
    device: torch.device,
) -> TrainingResult:
    """``run`` of an image ``model`` from its seed's initial weights on (train, eval) sets
    (Adam, ``fl_client.r_estimation.samples_to_target``)."""
    train_set, eval_set = sets
    return samples_to_target(
        InitialModel(model, initial_state(model, run.seed)),
        train_set,
        eval_set,
        run,
        on_eval=on_eval,
        device=device,
    )


def training_key(
    cfg: TrainingSettings, unit: Mapping[str, Any], accuracy: float, data: Mapping[str, Any]
) -> str:
    """sha256 of everything a training run depends on: ``unit`` (code version, kind, model,
    seed, batch size, …), the training settings, the accuracy target and the data."""
    return digest(
        {
            **unit,
            "lr-ref": cfg.lr_ref,
            "b-ref": cfg.b_ref,
            "accuracy": accuracy,
            "eval-every-samples": cfg.eval_every_samples,
            "max-samples": cfg.max_samples,
            "data": dict(data),
        }
    )


@dataclass(frozen=True)
class TrainingRecord:
    """A finished training run, before it becomes its record."""

    run: TargetRun
    result: TrainingResult
    sizes: Mapping[str, Any]  # the data the run saw (keys as in the record)
    started: float  # ``time.perf_counter()`` at its start
    device: torch.device

    def to_record(self, head: Mapping[str, Any]) -> dict[str, Any]:
        """``head`` (key, unit, model, …, seed), then the run's outcome."""
        n_acc, curve, used = self.result
        return {
            **head,
            "batch-size": self.run.batch_size,
            "lr": self.run.lr,
            "accuracy-target": self.run.target_accuracy,
            "samples-to-target": n_acc,
            "samples-used": used,
            "best-accuracy": max((a for _, a in curve), default=None),
            "curve": [[s, a] for s, a in curve],
            **self.sizes,
            "host-wall-s": time.perf_counter() - self.started,
            "torch-device": torch_device_name(self.device),
        }


def training_line(label: str, rec: Mapping[str, Any]) -> str:
    """The progress line of a finished training run."""
    n = rec["samples-to-target"]
    reach = (
        f"{n} samples to {rec['accuracy-target']}"
        if n is not None
        else f"NOT reached in {rec['samples-used']} (best {rec['best-accuracy']:.3f})"
    )
    return f"{label} lr={rec['lr']:.2e}: {reach} ({rec['host-wall-s']:.1f} s)"


# --------------------------------------------------------------------------- the twin's LUT


def fitting_batch_sizes(model: str, batch_sizes: Sequence[int], device: str) -> list[int]:
    """The b of ``batch_sizes`` whose training footprint fits ``device``'s memory."""
    spec = load_device_spec(device)
    b_max = max_batch_size(model, list(batch_sizes), spec.memory_bytes)
    return [b for b in batch_sizes if b <= b_max]


def lut_dict(lut: LUT) -> dict[str, Any]:
    """The tables and costs of a LUT as a record."""
    return {
        "batch-sizes": list(lut.batch_sizes),
        "freqs-mhz": list(lut.knob_values),
        "time-per-sample-s": lut.time_per_sample_s.tolist(),
        "peak-power-w": lut.peak_power_w.tolist(),
        # σ of each cell's per-step peaks (null: not recorded), read by the selection rule
        "peak-sigma-w": [
            [None if math.isnan(x) else x for x in row] for row in lut.peak_sigma_w.tolist()
        ],
        "grid": lut.grid,
        "p-max-w": lut.limit.cap_w,
        "profile-time-s": lut.profile_time_s,
        "profile-energy-j": lut.profile_energy_j,
        "cells-profiled": lut.cells_profiled,
    }


def lut_rows(lut: LUT, keep: Sequence[int]) -> Tables:
    """The rows of the batch sizes ``keep`` as the node's selector reads them: time, peak and
    average power, σ of the per-step peaks and the knob."""
    idx = [list(lut.batch_sizes).index(b) for b in keep]
    return Tables(
        lut.time_per_sample_s[idx],
        lut.peak_power_w[idx],
        lut.avg_power_w[idx],
        lut.peak_sigma_w[idx],
        knob=lut.knob,
    )


def profile_full_grid(
    model: str, device_kind: str, batch_sizes: Sequence[int], *, warmup_steps: int, steps: int
) -> LUT:
    """Every (b, f) of ``device_kind``'s twin (seed 0) for ``model``, real steps on the host."""
    shape = model_zoo.input_shape_for(model)
    device = open_device(device_kind, "simulated", seed=0)
    try:
        return profile(
            device,
            workload_for(model),
            list(batch_sizes),
            lambda b: task.make_train_step(model, shape, b, seed=0),
            ProfileOptions(warmup_steps=warmup_steps, steps=steps, progress=False),
        )
    finally:
        device.close()


def b1_bands(device_kind: str, caps_w: Sequence[float | None]) -> dict[str, float | None]:
    """B1's fixed safe frequency per cap label (None where the board has no band for it)."""
    spec = load_device_spec(device_kind)
    out: dict[str, float | None] = {}
    for cap in caps_w:
        try:
            out[cap_label(cap)] = spec.b1_max_knob_value(cap)
        except ValueError:
            out[cap_label(cap)] = None
    return out


def lut_key(cfg: ProfileSettings, unit: str, model: str, device: str) -> str:
    """sha256 of what a full-grid LUT record depends on."""
    return digest(
        {
            "code": CODE_VERSION,
            "unit": unit,
            "model": model,
            "device": device,
            "batch-sizes": list(cfg.batch_sizes),
            "profile": [cfg.profile_warmup_steps, cfg.profile_steps],
        }
    )


def full_lut_record(
    cfg: ProfileSettings, unit: str, model: str, device_kind: str
) -> tuple[dict[str, Any], LUT]:
    """The full-grid LUT of (model, device) on its twin (seed 0) as a record, with B1's
    bands for the study's caps; and the LUT."""
    sizes = fitting_batch_sizes(model, cfg.batch_sizes, device_kind)
    if not sizes:
        raise ExperimentConfigError(
            f"batch-sizes: none of {list(cfg.batch_sizes)} fits {device_kind}'s memory"
        )
    lut = profile_full_grid(
        model, device_kind, sizes, warmup_steps=cfg.profile_warmup_steps, steps=cfg.profile_steps
    )
    rec = {
        "key": lut_key(cfg, unit, model, device_kind),
        "unit": unit,
        "model": model,
        "device": device_kind,
        "display-name": load_device_spec(device_kind).display_name,
        "b1-freq-mhz": b1_bands(device_kind, cfg.caps_w),
        "lut": lut_dict(lut),
    }
    return rec, lut
