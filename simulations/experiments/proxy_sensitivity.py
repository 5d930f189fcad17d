"""Proxy sensitivity (the paper's Figs. 5–6, §5.4): every proxy × target pair of a task.

How much slower is training on target T when r comes from proxy P instead of from T itself?
For every dataset D of the study (each one serves as proxy and as target):

1. **Training runs** (per dataset, seed, batch size b; real runs, the r estimation): the
   model trains from the seed's initial weights at lr_ref·sqrt(b/b_ref) until D's accuracy
   target, giving N_D(b) and r_D (Eq. 3). Images: Adam, ``fl_client.r_estimation``; text:
   AdamW on random windows, ``simulations.experiments.text``.
2. **Full-grid LUT** (per device): every (b, f) profiled once on the device's digital twin
   (real training steps of the model on the host, time and power from the twin).
3. **Selection and time** (in the report, from the records): for each cap, ours with r_P
   (Eq. 4) picks (b_P, f_P); the fastest configuration for T is Eq. 4 with r_T. Training
   time on T is N_T(b)·t(b, f) from the LUT (evaluation and profiling excluded, as in the
   paper's figures), and the cell's value is the time increase in % of ours with proxy P
   over the fastest configuration, paired by seed. The same LUT gives a Table 2/3-style
   comparison (B1, B2, ours, oracle) for the study's ``reference-proxy``.

Image datasets are views of scikit-learn's digits (the same 1,047-image pool, split 80/20
per seed): ``digits``, ``digits-rotated`` (rotation ±25° + noise), ``digits-inverted``
(inverted contrast + noise) and ``digits-parity`` (even/odd labels, a different task on the
same images); the data kit's real image subsets ``cifar10-subset`` and ``mnist-subset``
(npz files under ``data-root``, default ``../shared/data``; a file without the expected keys
or shapes is refused, naming the file and what it lacks); or, for users who hold them under
``data-root``, the paper's kind of datasets read with torchvision and never downloaded
(``cifar10``, ``svhn``, ``fashion-mnist``, ``stl10``). Real sets use a stratified
``image-subset-size`` subset of their train split, split 80/20 per seed, at 3×32×32,
standardised per channel. Text datasets are the data kit's corpora (``data-root``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import TensorDataset

from fl_client import data_splits, image_data, model_zoo
from simulations.experiments import sensitivity_report
from simulations.experiments.config import ExperimentConfigError
from simulations.experiments.datasets import rotate_and_noise
from simulations.experiments.sensitivity_config import (
    DIGITS_VIEWS,
    NAME,
    NPZ_DATASETS,
    TORCHVISION_DATASETS,
    SensitivityConfig,
    parse_sensitivity,
)
from simulations.experiments.study import Outcome, Preflight, RunOptions, StudyPlugin
from simulations.experiments.text import (
    TextDataError,
    TextSplits,
    load_text,
    samples_to_target_text,
    windows,
)
from simulations.experiments.units import (
    CODE_VERSION,
    TargetRun,
    TrainingRecord,
    TrainingResult,
    Unit,
    checked_torch_device,
    full_lut_record,
    initial_state,
    lut_key,
    resolve_torch_device,
    run_units,
    train_images,
    training_key,
    training_line,
)

#: Transform noise of the image views (fixed, so a view is the same data for every run).
VIEW_SEED = 20250218
NOTE_IMAGE = (
    "Data: views of scikit-learn's bundled digits upsampled to 3×32×32: the same 1,047-image "
    "pool, split 80/20 per seed (stratified); `digits-rotated` rotates each image by its own "
    "angle in ±rotate-deg and adds N(0, noise-std²) noise, `digits-inverted` inverts the "
    "contrast and adds the same noise, `digits-parity` relabels to even/odd. They share "
    "images, unlike the paper's CIFAR-10/SVHN/CINIC/FMNIST/STL, so they are closer to each "
    "other than the paper's datasets. Models start from random weights seeded per seed (the "
    "paper fine-tunes pretrained weights). Time and power come from the digital twins in "
    "configs/devices."
)
NOTE_REAL = (
    "Data: real images at 3×32×32, each set a stratified subset of image-subset-size images "
    "of its train split (all of it if smaller), split 80/20 per seed (stratified), pixels "
    "standardised per channel over the subset. `cifar10-subset`: the data kit's CIFAR-10 "
    "subset (10,000 train images, 1,000 per class; JPEG-decoded pixels, see "
    "../shared/data/MANIFEST.md); `mnist-subset`: the kit's MNIST subset (28×28 grey digits "
    "zero-padded to 32×32, repeated over RGB). Torchvision sets (cifar10, svhn, "
    "fashion-mnist, stl10) are read from data-root, never downloaded. Models start from "
    "random weights seeded per seed (the paper fine-tunes pretrained weights), so accuracy "
    "targets are far below the paper's. Time and power come from the digital twins in "
    "configs/devices."
)


def image_note(cfg: SensitivityConfig) -> str:
    """The report's data note for the study's image datasets (digits views, real sets)."""
    notes = []
    if any(d in DIGITS_VIEWS for d in cfg.datasets):
        notes.append(NOTE_IMAGE)
    if any(d not in DIGITS_VIEWS for d in cfg.datasets):
        notes.append(NOTE_REAL if not notes else NOTE_REAL.replace("Data: real", "Real"))
    return " ".join(notes)


NOTE_TEXT = (
    "Data: the data kit's public-domain corpora (tiny Shakespeare; Austen: Emma, Persuasion, "
    "Sense and Sensibility; Dickens: Great Expectations, Oliver Twist), the paper's "
    "vocabulary rule, 90/10 split by position; accuracy is next-character accuracy over "
    "eval-windows random test windows of 64 characters. Models start from random weights "
    "seeded per seed (the paper pre-trains on WikiText-2). Time and power come from the "
    "digital twins in configs/devices."
)


# --------------------------------------------------------------------------- data


def check_data(cfg: SensitivityConfig) -> dict[str, dict[str, int]]:
    """Load every dataset once (a missing corpus is an error naming the path and layout);
    return their sizes."""
    sizes: dict[str, dict[str, int]] = {}
    for d in cfg.datasets:
        try:
            if cfg.task == "text":
                splits = _text(cfg, d)
                sizes[d] = {"train-chars": len(splits.train), "test-chars": len(splits.test)}
            else:
                tr, te = image_sets(cfg, d, 0)
                sizes[d] = {"train": len(tr), "test": len(te)}
        except (TextDataError, DataMissingError) as err:
            raise ExperimentConfigError(f"data-root: {err}") from None
        except image_data.ImageDataError as err:
            raise ExperimentConfigError(f"data-root: {d}: {err}") from None
    return sizes


class DataMissingError(FileNotFoundError):
    """A torchvision dataset that is not under ``data-root``; names the path and layout."""


def _stratified_keep(y: np.ndarray, size: int) -> np.ndarray:
    """Positions of a stratified ``size``-subset of labels ``y`` (seed 0), sorted; all of
    them for ``size`` 0 or ≥ len(y)."""
    from sklearn.model_selection import train_test_split

    keep = np.arange(len(y))
    if 0 < size < len(y):
        keep, _ = train_test_split(keep, train_size=size, stratify=y, random_state=0)
        keep = np.sort(keep)
    return keep


@lru_cache(maxsize=8)
def _npz_subset(cfg: SensitivityConfig, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A stratified ``image-subset-size`` subset of the data kit's npz ``name`` (train split,
    under ``data-root``), standardised per channel, at 3×32×32."""
    arrays = image_data.load_npz(name, cfg.data_root or None)
    keep = _stratified_keep(arrays.y_train, cfg.image_subset_size)
    x, _, _ = data_splits.standardise(data_splits.images_to_tensor(arrays.x_train[keep]))
    return x, torch.from_numpy(arrays.y_train[keep])


def npz_source(cfg: SensitivityConfig, name: str) -> str:
    """The file npz dataset ``name`` is read from (part of its training records' key)."""
    return str(image_data.npz_path(name, cfg.data_root or None).resolve())


@lru_cache(maxsize=8)
def _torchvision_subset(cfg: SensitivityConfig, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A stratified ``image-subset-size`` subset of ``name``'s train split as standardised
    3×32×32 float images and int64 labels (grey images repeated over 3 channels and padded,
    larger ones resized)."""
    import torchvision.datasets as tvd

    cls_name, layout = TORCHVISION_DATASETS[name]
    if not cfg.data_root:
        raise DataMissingError(f"{name}: set data-root to a folder holding {layout}")
    root = Path(cfg.data_root).expanduser()
    cls = getattr(tvd, cls_name)
    try:
        ds = (
            cls(str(root), split="train", download=False)
            if name in ("svhn", "stl10")
            else (cls(str(root), train=True, download=False))
        )
    except RuntimeError as err:
        raise DataMissingError(
            f"{name}: not found under {root.resolve()} ({err}); expected {layout}"
        ) from None
    data = ds.data
    x = torch.as_tensor(np.asarray(data))
    labels = getattr(ds, "targets", None)
    if labels is None:
        labels = ds.labels
    y = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    if x.ndim == 3:  # N×H×W grey (FashionMNIST)
        x = x[:, None].repeat(1, 3, 1, 1)
    elif x.shape[-1] == 3:  # N×H×W×C (CIFAR)
        x = x.permute(0, 3, 1, 2)
    idx = torch.from_numpy(_stratified_keep(y.numpy(), cfg.image_subset_size))
    xf = x[idx].float() / 255.0
    h = xf.shape[-1]
    if h < 32:
        pad = (32 - h) // 2
        xf = torch.nn.functional.pad(xf, (pad, 32 - h - pad, pad, 32 - h - pad))
    elif h > 32:
        xf = torch.nn.functional.interpolate(xf, size=(32, 32), mode="area")
    mean = xf.mean(dim=(0, 2, 3), keepdim=True)
    std = xf.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return ((xf - mean) / std).contiguous(), y[idx]


def _text(cfg: SensitivityConfig, name: str) -> TextSplits:
    s = load_text(name, cfg.data_root or None)
    if cfg.text_train_chars and cfg.text_train_chars < len(s.train):
        s = TextSplits(s.name, s.train[: cfg.text_train_chars], s.test, s.chars_dropped)
    return s


def image_sets(cfg: SensitivityConfig, name: str, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) of image view ``name`` for ``seed`` (see the module docstring)."""
    from sklearn.model_selection import train_test_split

    if name in TORCHVISION_DATASETS:
        x, y = _torchvision_subset(cfg, name)
    elif name in NPZ_DATASETS:
        x, y = _npz_subset(cfg, name)
    else:
        x, y = data_splits.as_tensors(data_splits.load_digits_splits(0).pool)
    idx = np.arange(len(y))
    tr, te = train_test_split(
        idx, test_size=cfg.test_fraction, stratify=y.numpy(), random_state=seed
    )
    if name == "digits-rotated":
        x = rotate_and_noise(x, cfg.rotate_deg, cfg.noise_std, VIEW_SEED)
    elif name == "digits-inverted":
        x = rotate_and_noise(-x, 0.0, cfg.noise_std, VIEW_SEED + 1)
    elif name == "digits-parity":
        y = y % 2
    t_tr, t_te = torch.from_numpy(np.sort(tr)), torch.from_numpy(np.sort(te))
    return TensorDataset(x[t_tr], y[t_tr]), TensorDataset(x[t_te], y[t_te])


# --------------------------------------------------------------------------- units


class TrainSpec(NamedTuple):
    """One training run: a dataset, a seed and a batch size."""

    dataset: str
    seed: int
    batch_size: int


@dataclass(frozen=True)
class Layout:
    root: Path

    def train(self, model: str, t: TrainSpec) -> Path:
        name = f"{t.dataset}-seed{t.seed}-b{t.batch_size}.json"
        return self.root / "records" / "train" / model / name

    def lut(self, model: str, device: str) -> Path:
        return self.root / "records" / "lut" / model / f"{device}-full.json"


def train_key(cfg: SensitivityConfig, t: TrainSpec) -> str:
    data: dict[str, Any] = {"dataset": t.dataset}
    if cfg.task == "text":
        data.update(
            {
                "data-root": cfg.data_root,
                "text-train-chars": cfg.text_train_chars,
                "eval-windows": cfg.eval_windows,
            }
        )
    else:
        data.update(
            {"test-fraction": cfg.test_fraction, "rotate": cfg.rotate_deg, "noise": cfg.noise_std}
        )
        if t.dataset in TORCHVISION_DATASETS:
            data.update({"data-root": cfg.data_root, "subset": cfg.image_subset_size})
        elif t.dataset in NPZ_DATASETS:
            data.update({"file": npz_source(cfg, t.dataset), "subset": cfg.image_subset_size})
    unit = {"code": CODE_VERSION, "unit": "sensitivity-train", "model": cfg.model}
    unit.update({"seed": t.seed, "batch-size": t.batch_size})
    return training_key(cfg, unit, cfg.accuracy_of(t.dataset), data)


def _train_text(
    cfg: SensitivityConfig, t: TrainSpec, run: TargetRun, on_eval: Callable[[int], None] | None
) -> tuple[TrainingResult, dict[str, int]]:
    device = resolve_torch_device(cfg.torch_device)
    splits = _text(cfg, t.dataset)
    tx, ty = windows(splits.test, cfg.eval_windows, seed=VIEW_SEED)
    net = model_zoo.build_model(cfg.model)
    net.load_state_dict(initial_state(cfg.model, t.seed))
    result = samples_to_target_text(
        net.to(device),
        splits.train.to(device),
        tx.to(device),
        ty.to(device),
        run,
        on_eval,
    )
    return result, {"train-chars": len(splits.train), "eval-windows": len(tx)}


def _train_images(
    cfg: SensitivityConfig, t: TrainSpec, run: TargetRun, on_eval: Callable[[int], None] | None
) -> tuple[TrainingResult, dict[str, int]]:
    train_set, test_set = image_sets(cfg, t.dataset, t.seed)
    device = resolve_torch_device(cfg.torch_device)
    result = train_images(cfg.model, (train_set, test_set), run, on_eval, device)
    return result, {"train": len(train_set), "test": len(test_set)}


def run_training(
    cfg: SensitivityConfig, t: TrainSpec, on_eval: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """One real training run of ``cfg.model`` on ``t.dataset`` with batch size b."""
    run = TargetRun.of(cfg, t.batch_size, cfg.accuracy_of(t.dataset), t.seed)
    started = time.perf_counter()
    train = _train_text if cfg.task == "text" else _train_images
    result, sizes = train(cfg, t, run, on_eval)
    head = {"key": train_key(cfg, t), "unit": "sensitivity-train", "model": cfg.model}
    record = TrainingRecord(
        run, result, {"sizes": sizes}, started, resolve_torch_device(cfg.torch_device)
    )
    return record.to_record({**head, "dataset": t.dataset, "seed": t.seed})


def run_lut(cfg: SensitivityConfig, device_kind: str) -> dict[str, Any]:
    """Every (b, f) of ``device_kind``'s twin for ``cfg.model`` (seed 0), with B1's bands
    and the average power (the energy of a choice)."""
    rec, lut = full_lut_record(cfg, "sensitivity-lut", cfg.model, device_kind)
    return {**rec, "avg-power-w": lut.avg_power_w.tolist()}


def plan_units(cfg: SensitivityConfig, out: Path) -> dict[str, list[Unit]]:
    """The study's training runs and full-grid LUTs."""
    lay = Layout(out)

    def train(t: TrainSpec) -> Unit:
        return Unit(
            lay.train(cfg.model, t),
            train_key(cfg, t),
            f"train {cfg.model} {t.dataset} seed {t.seed} b={t.batch_size}",
            lambda bar: run_training(
                cfg, t, lambda n: bar.detail(f"{n}/{cfg.max_samples} samples")
            ),
            lambda rec: training_line(
                f"train {cfg.model} {t.dataset:<15} seed {t.seed} b={t.batch_size:<4}", rec
            ),
        )

    def lut(dev: str) -> Unit:
        return Unit(
            lay.lut(cfg.model, dev),
            lut_key(cfg, "sensitivity-lut", cfg.model, dev),
            f"full-grid LUT {cfg.model} {dev}",
            lambda _bar: run_lut(cfg, dev),
            lambda _rec: f"full-grid LUT {cfg.model} {dev} profiled",
        )

    return {
        "train": [
            train(TrainSpec(d, s, b))
            for s in cfg.seed_list()
            for d in cfg.datasets
            for b in cfg.batch_sizes
        ],
        "luts": [lut(dev) for dev in cfg.devices],
    }


# --------------------------------------------------------------------------- the study


def _preflight(cfg: SensitivityConfig, where: str) -> Preflight:
    device = checked_torch_device(cfg.torch_device, where)
    sizes = check_data(cfg)  # a missing corpus is an error before any training
    note = NOTE_TEXT if cfg.task == "text" else image_note(cfg)
    return Preflight(note=note, data_sizes=sizes, torch_device=device)


def _run(cfg: SensitivityConfig, out: Path, options: RunOptions) -> Outcome:
    torch.set_num_threads(cfg.torch_threads)
    return Outcome(dict(run_units(plan_units(cfg, out), options.progress)))


STUDY = StudyPlugin(NAME, parse_sensitivity, _preflight, _run, sensitivity_report.render)
