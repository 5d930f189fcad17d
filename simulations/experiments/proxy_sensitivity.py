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
same images); or, for users who hold them under ``data-root``, the paper's kind of datasets
read with torchvision and never downloaded (``cifar10``, ``svhn``, ``fashion-mnist``,
``stl10``: a stratified ``image-subset-size`` subset of the train split, 80/20 per seed, at
3×32×32). Text datasets are the data kit's corpora (``data-root``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from fl_client import selector, task
from fl_client.devices.simulated import available_device_kinds, load_device_spec
from simulations.experiments.config import (
    TORCH_DEVICES,
    ExperimentConfigError,
    Fields,
    _err,
    config_key,
    merge_scale,
)
from simulations.experiments.records import digest, read_record, write_json
from simulations.experiments.single_device import (
    Progress,
    _lut_dict,
    b1_bands,
    fitting_batch_sizes,
    initial_state,
    profile_full_grid,
    resolve_torch_device,
    torch_device_name,
)
from fl_client.r_estimation import r_from_samples

DIGITS_VIEWS = ("digits", "digits-rotated", "digits-inverted", "digits-parity")
#: Datasets read with torchvision from ``data-root`` (never downloaded): name → (torchvision
#: class, the layout it expects under the root).
TORCHVISION_DATASETS: dict[str, tuple[str, str]] = {
    "cifar10": ("CIFAR10", "<data-root>/cifar-10-batches-py/{data_batch_1..5,test_batch}"),
    "svhn": ("SVHN", "<data-root>/{train_32x32.mat,test_32x32.mat}"),
    "fashion-mnist": (
        "FashionMNIST",
        "<data-root>/FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte",
    ),
    "stl10": ("STL10", "<data-root>/stl10_binary/{train,test}_{X,y}.bin"),
}
IMAGE_DATASETS = DIGITS_VIEWS + tuple(TORCHVISION_DATASETS)
TEXT_DATASETS = ("tinyshakespeare", "austen", "dickens")
CODE_VERSION = 1
#: Transform noise of the image views (fixed, so a view is the same data for every run).
VIEW_SEED = 20250218

SENS_DEFAULTS: dict[str, Any] = {
    "name": None,
    "study": None,
    "description": "",
    "datasets": None,
    "accuracy": None,  # table: dataset → accuracy target
    "reference-proxy": None,
    "model": None,
    "devices": ["jetson-nano"],
    "caps-w": [4.5, 7.0, "none"],
    "seeds": 2,
    "batch-sizes": [4, 8, 16, 32, 64, 128],
    "lr-ref": 5e-4,
    "b-ref": 128,
    "eval-every-samples": 512,
    "max-samples": 40_000,
    "test-fraction": 0.2,  # images: per-seed 80/20 split of the pool (text: 90/10 by position)
    "rotate-deg": 25.0,
    "noise-std": 0.3,
    "data-root": "",  # text: the data kit (default ../shared/data beside the repository)
    "text-train-chars": 0,  # text: keep the first N training characters (0: all)
    "eval-windows": 512,  # text: test windows the character accuracy is measured on
    "image-subset-size": 5000,  # torchvision sets: a stratified subset of the train split
    "profile-warmup-steps": 1,
    "profile-steps": 3,
    "torch-threads": 1,
    "torch-device": "cpu",
}


@dataclass(frozen=True)
class SensitivityConfig:
    """The resolved settings of one proxy-sensitivity study at one scale."""

    name: str
    study: str
    description: str
    scale: str
    task: str  # "image" | "text", from the datasets
    datasets: tuple[str, ...]
    accuracy: tuple[tuple[str, float], ...]  # (dataset, target) in dataset order
    reference_proxy: str
    model: str
    devices: tuple[str, ...]
    caps_w: tuple[float | None, ...]
    seeds: int
    batch_sizes: tuple[int, ...]
    lr_ref: float
    b_ref: int
    eval_every_samples: int
    max_samples: int
    test_fraction: float
    rotate_deg: float
    noise_std: float
    data_root: str
    text_train_chars: int
    eval_windows: int
    image_subset_size: int
    profile_warmup_steps: int
    profile_steps: int
    torch_threads: int
    torch_device: str

    def accuracy_of(self, dataset: str) -> float:
        return dict(self.accuracy)[dataset]

    def seed_list(self) -> list[int]:
        return list(range(self.seeds))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in asdict(self).items():
            if k == "caps_w":
                v = ["none" if c is None else c for c in v]
            elif k == "accuracy":
                v = dict(v)
            elif isinstance(v, tuple):
                v = list(v)
            out[k.replace("_", "-")] = v
        return out

    def key(self) -> str:
        return config_key(self)


def parse_sensitivity(
    data: Mapping[str, Any],
    where: str,
    *,
    scale: str = "mini",
    seeds: int | None = None,
    sets: Mapping[str, Any] | None = None,
) -> SensitivityConfig:
    """Validate a parsed proxy-sensitivity experiment (errors name the key, before any run)."""
    m = merge_scale(data, where, SENS_DEFAULTS, scale=scale, seeds=seeds, sets=sets)
    f = Fields(m, where, SENS_DEFAULTS)
    text, integer, number = f.text, f.integer, f.number
    ds = list(f.str_list("datasets", IMAGE_DATASETS + TEXT_DATASETS, min_len=2))
    kinds = {"text" if d in TEXT_DATASETS else "image" for d in ds}
    if len(kinds) != 1:
        raise _err(where, "datasets", "mixes image and text datasets; one task per study")
    kind = kinds.pop()
    acc = m["accuracy"]
    if not isinstance(acc, Mapping):
        raise _err(where, "accuracy", "must be a table of dataset = accuracy target")
    unknown = sorted(set(acc) - set(ds))
    if unknown:
        raise _err(where, "accuracy", f"{', '.join(unknown)} not in datasets {ds!r}")
    missing = [d for d in ds if d not in acc]
    if missing:
        raise _err(where, "accuracy", f"no accuracy target for {', '.join(missing)}")
    for d in ds:
        a = acc[d]
        if isinstance(a, bool) or not isinstance(a, int | float) or not 0 < float(a) < 1:
            raise _err(where, f"accuracy.{d}", f"must be > 0 and < 1, got {a!r}")
    models = task.TEXT_MODEL_NAMES if kind == "text" else task.MODEL_NAMES
    caps = f.caps()
    devs = f.str_list("devices", tuple(available_device_kinds()))
    batch_sizes = f.batch_sizes()
    return SensitivityConfig(
        name=text("name"),
        study=text("study", ("proxy-sensitivity",)),
        description=text("description"),
        scale=scale,
        task=kind,
        datasets=tuple(ds),
        accuracy=tuple((d, float(acc[d])) for d in ds),
        reference_proxy=text("reference-proxy", tuple(ds)),
        model=text("model", models),
        devices=tuple(devs),
        caps_w=tuple(caps),
        seeds=integer("seeds", 1),
        batch_sizes=tuple(batch_sizes),
        lr_ref=number("lr-ref", 0.0),
        b_ref=integer("b-ref", 1),
        eval_every_samples=integer("eval-every-samples", 1),
        max_samples=integer("max-samples", 1),
        test_fraction=number("test-fraction", 0.0, 1.0),
        rotate_deg=number("rotate-deg", -180.0, 180.0, open_lo=False),
        noise_std=number("noise-std", 0.0, open_lo=False),
        data_root=text("data-root"),
        text_train_chars=integer("text-train-chars", 0),
        eval_windows=integer("eval-windows", 1),
        image_subset_size=integer("image-subset-size", 0),
        profile_warmup_steps=integer("profile-warmup-steps", 0),
        profile_steps=integer("profile-steps", 1),
        torch_threads=integer("torch-threads", 1),
        torch_device=text("torch-device", TORCH_DEVICES),
    )


# --------------------------------------------------------------------------- data


def check_data(cfg: SensitivityConfig) -> dict[str, dict[str, int]]:
    """Load every dataset once (a missing corpus is an error naming the path and layout);
    return their sizes."""
    sizes: dict[str, dict[str, int]] = {}
    for d in cfg.datasets:
        if cfg.task == "text":
            from simulations.experiments.text import TextDataError

            try:
                splits = _text(cfg, d)
            except TextDataError as err:
                raise ExperimentConfigError(f"data-root: {err}") from None
            sizes[d] = {"train-chars": len(splits.train), "test-chars": len(splits.test)}
        else:
            try:
                tr, te = image_sets(cfg, d, 0)
            except DataMissingError as err:
                raise ExperimentConfigError(f"data-root: {err}") from None
            sizes[d] = {"train": len(tr), "test": len(te)}
    return sizes


class DataMissingError(FileNotFoundError):
    """A torchvision dataset that is not under ``data-root``; names the path and layout."""


@lru_cache(maxsize=8)
def _torchvision_subset(cfg: SensitivityConfig, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A stratified ``image-subset-size`` subset of ``name``'s train split as standardised
    3×32×32 float images and int64 labels (grey images repeated over 3 channels and padded,
    larger ones resized)."""
    import torchvision.datasets as tvd
    from sklearn.model_selection import train_test_split

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
    keep = np.arange(len(y))
    if 0 < cfg.image_subset_size < len(y):
        keep, _ = train_test_split(
            keep, train_size=cfg.image_subset_size, stratify=y.numpy(), random_state=0
        )
        keep = np.sort(keep)
    idx = torch.from_numpy(keep)
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


def _text(cfg: SensitivityConfig, name: str) -> Any:
    from simulations.experiments.text import TextSplits, load_text

    s = load_text(name, cfg.data_root or None)
    if cfg.text_train_chars and cfg.text_train_chars < len(s.train):
        s = TextSplits(s.name, s.train[: cfg.text_train_chars], s.test, s.chars_dropped)
    return s


def image_sets(cfg: SensitivityConfig, name: str, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) of image view ``name`` for ``seed`` (see the module docstring)."""
    from sklearn.model_selection import train_test_split

    from simulations.experiments.datasets import rotate_and_noise

    if name in TORCHVISION_DATASETS:
        x, y = _torchvision_subset(cfg, name)
    else:
        x, y = task.as_tensors(task.load_digits_splits(0).pool)
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


@dataclass(frozen=True)
class Layout:
    root: Path

    def train(self, model: str, dataset: str, seed: int, b: int) -> Path:
        return self.root / "records" / "train" / model / f"{dataset}-seed{seed}-b{b}.json"

    def lut(self, model: str, device: str) -> Path:
        return self.root / "records" / "lut" / model / f"{device}-full.json"


def train_key(cfg: SensitivityConfig, dataset: str, seed: int, b: int) -> str:
    data: dict[str, Any] = {"dataset": dataset}
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
        if dataset in TORCHVISION_DATASETS:
            data.update({"data-root": cfg.data_root, "subset": cfg.image_subset_size})
    return digest(
        {
            "code": CODE_VERSION,
            "unit": "sensitivity-train",
            "model": cfg.model,
            "seed": seed,
            "batch-size": b,
            "lr-ref": cfg.lr_ref,
            "b-ref": cfg.b_ref,
            "accuracy": cfg.accuracy_of(dataset),
            "eval-every-samples": cfg.eval_every_samples,
            "max-samples": cfg.max_samples,
            "data": data,
        }
    )


def lut_key(cfg: SensitivityConfig, device: str) -> str:
    return digest(
        {
            "code": CODE_VERSION,
            "unit": "sensitivity-lut",
            "model": cfg.model,
            "device": device,
            "batch-sizes": list(cfg.batch_sizes),
            "profile": [cfg.profile_warmup_steps, cfg.profile_steps],
        }
    )


def run_training(
    cfg: SensitivityConfig,
    dataset: str,
    seed: int,
    b: int,
    on_eval: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """One real training run of ``cfg.model`` on ``dataset`` with batch size ``b``."""
    device = resolve_torch_device(cfg.torch_device)
    lr = task.scaled_lr(cfg.lr_ref, cfg.b_ref, b)
    target = cfg.accuracy_of(dataset)
    t0 = time.perf_counter()
    if cfg.task == "text":
        from simulations.experiments.text import samples_to_target_text, windows

        splits = _text(cfg, dataset)
        tx, ty = windows(splits.test, cfg.eval_windows, seed=VIEW_SEED)
        net = task.build_model(cfg.model)
        net.load_state_dict(initial_state(cfg.model, seed))
        n_acc, curve, used = samples_to_target_text(
            net.to(device),
            splits.train.to(device),
            tx.to(device),
            ty.to(device),
            batch_size=b,
            lr=lr,
            target_accuracy=target,
            eval_every_samples=cfg.eval_every_samples,
            max_samples=cfg.max_samples,
            seed=seed,
            on_eval=on_eval,
        )
        sizes = {"train-chars": len(splits.train), "eval-windows": len(tx)}
    else:
        from fl_client.r_estimation import samples_to_target

        train_set, test_set = image_sets(cfg, dataset, seed)
        n_acc, curve, used = samples_to_target(
            cfg.model,
            initial_state(cfg.model, seed),
            train_set,
            test_set,
            batch_size=b,
            lr=lr,
            target_accuracy=target,
            eval_every_samples=cfg.eval_every_samples,
            max_samples=cfg.max_samples,
            seed=seed,
            on_eval=on_eval,
            device=device,
        )
        sizes = {"train": len(train_set), "test": len(test_set)}
    return {
        "key": train_key(cfg, dataset, seed, b),
        "unit": "sensitivity-train",
        "model": cfg.model,
        "dataset": dataset,
        "seed": seed,
        "batch-size": b,
        "lr": lr,
        "accuracy-target": target,
        "samples-to-target": n_acc,
        "samples-used": used,
        "best-accuracy": max((a for _, a in curve), default=None),
        "curve": [[s, a] for s, a in curve],
        "sizes": sizes,
        "host-wall-s": time.perf_counter() - t0,
        "torch-device": torch_device_name(device),
    }


def run_lut(cfg: SensitivityConfig, device_kind: str) -> dict[str, Any]:
    """Every (b, f) of ``device_kind``'s twin for ``cfg.model`` (seed 0), with B1's bands."""
    sizes = fitting_batch_sizes(cfg.model, cfg.batch_sizes, device_kind)
    if not sizes:
        raise ExperimentConfigError(
            f"batch-sizes: none of {list(cfg.batch_sizes)} fits {device_kind}'s memory"
        )
    lut = profile_full_grid(
        cfg.model,
        device_kind,
        sizes,
        warmup_steps=cfg.profile_warmup_steps,
        steps=cfg.profile_steps,
    )
    return {
        "key": lut_key(cfg, device_kind),
        "unit": "sensitivity-lut",
        "model": cfg.model,
        "device": device_kind,
        "display-name": load_device_spec(device_kind).display_name,
        "b1-freq-mhz": b1_bands(device_kind, cfg.caps_w),
        "avg-power-w": lut.avg_power_w.tolist(),
        "lut": _lut_dict(lut),
    }


def run_sensitivity(cfg: SensitivityConfig, out: Path, *, progress: bool = True) -> dict[str, int]:
    """Compute every missing record of ``cfg`` under ``out``; return counts done / reused."""
    torch.set_num_threads(cfg.torch_threads)
    lay = Layout(out)
    train_units = [
        (d, s, b) for s in cfg.seed_list() for d in cfg.datasets for b in cfg.batch_sizes
    ]
    todo_train = [
        u for u in train_units if read_record(lay.train(cfg.model, *u), train_key(cfg, *u)) is None
    ]
    todo_luts = [
        d for d in cfg.devices if read_record(lay.lut(cfg.model, d), lut_key(cfg, d)) is None
    ]
    counts = {
        "train-done": len(todo_train),
        "train-reused": len(train_units) - len(todo_train),
        "luts-done": len(todo_luts),
        "luts-reused": len(cfg.devices) - len(todo_luts),
    }
    bar = Progress(len(todo_train) + len(todo_luts), enabled=progress)
    with bar.running():
        for dev in todo_luts:
            bar.start(f"full-grid LUT {cfg.model} {dev}")
            write_json(lay.lut(cfg.model, dev), run_lut(cfg, dev))
            bar.done(f"full-grid LUT {cfg.model} {dev} profiled")
        for d, s, b in todo_train:
            bar.start(f"train {cfg.model} {d} seed {s} b={b}")
            rec = run_training(
                cfg, d, s, b, on_eval=lambda n: bar.detail(f"{n}/{cfg.max_samples} samples")
            )
            write_json(lay.train(cfg.model, d, s, b), rec)
            n = rec["samples-to-target"]
            bar.done(
                f"train {cfg.model} {d:<15} seed {s} b={b:<4} lr={rec['lr']:.2e}: "
                + (
                    f"{n} samples to {rec['accuracy-target']}"
                    if n is not None
                    else f"NOT reached in {rec['samples-used']} (best {rec['best-accuracy']:.3f})"
                )
                + f" ({rec['host-wall-s']:.1f} s)"
            )
    return counts


# --------------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class Grid:
    """One device's full-grid LUT as arrays (rows: batch sizes, columns: frequencies)."""

    batch_sizes: list[int]
    freqs_mhz: list[float]
    time_per_sample_s: np.ndarray
    peak_power_w: np.ndarray
    avg_power_w: np.ndarray
    b1_freq_mhz: dict[str, float | None]

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Grid:
        lut = rec["lut"]
        return cls(
            batch_sizes=[int(b) for b in lut["batch-sizes"]],
            freqs_mhz=[float(f) for f in lut["freqs-mhz"]],
            time_per_sample_s=np.asarray(lut["time-per-sample-s"], dtype=float),
            peak_power_w=np.asarray(lut["peak-power-w"], dtype=float),
            avg_power_w=np.asarray(rec["avg-power-w"], dtype=float),
            b1_freq_mhz=dict(rec["b1-freq-mhz"]),
        )

    def rows(self, sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        idx = [self.batch_sizes.index(b) for b in sizes]
        return self.time_per_sample_s[idx], self.peak_power_w[idx]

    def cell(self, b: int, f_mhz: float) -> tuple[float, float]:
        """(time per sample s, average power W) at (b, f)."""
        i, j = self.batch_sizes.index(b), self.freqs_mhz.index(f_mhz)
        return float(self.time_per_sample_s[i, j]), float(self.avg_power_w[i, j])


def choose(
    method: str,
    grid: Grid,
    cap_w: float | None,
    cap: str,
    n_proxy: Mapping[int, int | None],
) -> tuple[int, float]:
    """(b, f) of ``method`` given the proxy's samples to target (the target's, for the
    oracle). Raises ValueError (incl. ``selector.InfeasibleCapError``) when it has none."""
    sizes = grid.batch_sizes
    if method in ("b1", "b2"):
        f_cap = grid.b1_freq_mhz.get(cap)
        if f_cap is None:
            raise ValueError("no safe B1 frequency band for this cap")
        if method == "b1":
            sel = selector.select_b1(sizes, grid.freqs_mhz, f_cap)
        else:
            bs, r = r_from_samples(n_proxy, sizes)
            if not bs:
                raise ValueError("no batch size reached the proxy's accuracy target")
            sel = selector.select_b2(bs, grid.freqs_mhz, r, f_cap)
        return sel.batch_size, sel.freq_mhz
    bs, r = r_from_samples(n_proxy, sizes)
    if not bs:
        raise ValueError("no batch size reached the accuracy target")
    t_rows, p_rows = grid.rows(bs)
    sel = selector.select_power_aware(t_rows, p_rows, bs, grid.freqs_mhz, r, cap_w)
    return sel.batch_size, sel.freq_mhz


def time_on_target(
    grid: Grid, b: int, f_mhz: float, n_target: Mapping[int, int | None]
) -> tuple[float, float] | None:
    """(training time s, energy J) of N_T(b) samples at (b, f); None if b never reached T."""
    n = n_target.get(b)
    if n is None:
        return None
    tps, p_avg = grid.cell(b, f_mhz)
    return n * tps, n * tps * p_avg
