"""The settings of the proxy-sensitivity study (``study = "proxy-sensitivity"``): datasets,
keys, defaults and validation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_client import model_zoo
from fl_client.devices.descriptors import available_device_kinds
from fl_client.image_data import SHARED_SUBSETS
from simulations.experiments.config import (
    TORCH_DEVICES,
    Fields,
    FileOptions,
    StudyConfig,
    config_error,
    merge_scale,
)

NAME = "proxy-sensitivity"
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
#: The data kit's real image subsets (npz, ``fl_client.image_data``), read from
#: ``data-root`` (default ``../shared/data`` beside the repository).
NPZ_DATASETS = tuple(SHARED_SUBSETS)
IMAGE_DATASETS = DIGITS_VIEWS + tuple(TORCHVISION_DATASETS) + NPZ_DATASETS
TEXT_DATASETS = ("tinyshakespeare", "austen", "dickens")

DEFAULTS: dict[str, Any] = {
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
    # text and npz subsets: the data kit (default ../shared/data beside the repository);
    # torchvision sets: the folder holding them (required)
    "data-root": "",
    "text-train-chars": 0,  # text: keep the first N training characters (0: all)
    "eval-windows": 512,  # text: test windows the character accuracy is measured on
    # torchvision sets and npz subsets: a stratified subset of the train split (0: all)
    "image-subset-size": 5000,
    "profile-warmup-steps": 1,
    "profile-steps": 3,
    "torch-threads": 1,
    "torch-device": "cpu",
}


@dataclass(frozen=True)
class SensitivityConfig(StudyConfig):
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


def _task_of(datasets: tuple[str, ...], where: str) -> str:
    kinds = {"text" if d in TEXT_DATASETS else "image" for d in datasets}
    if len(kinds) != 1:
        raise config_error(where, "datasets", "mixes image and text datasets; one task per study")
    return kinds.pop()


def _accuracy(acc: Any, datasets: tuple[str, ...], where: str) -> tuple[tuple[str, float], ...]:
    """The ``accuracy`` table: one target in (0, 1) per dataset, nothing else."""
    if not isinstance(acc, Mapping):
        raise config_error(where, "accuracy", "must be a table of dataset = accuracy target")
    unknown = sorted(set(acc) - set(datasets))
    if unknown:
        raise config_error(
            where, "accuracy", f"{', '.join(unknown)} not in datasets {list(datasets)!r}"
        )
    missing = [d for d in datasets if d not in acc]
    if missing:
        raise config_error(where, "accuracy", f"no accuracy target for {', '.join(missing)}")
    for d in datasets:
        a = acc[d]
        if isinstance(a, bool) or not isinstance(a, int | float) or not 0 < float(a) < 1:
            raise config_error(where, f"accuracy.{d}", f"must be > 0 and < 1, got {a!r}")
    return tuple((d, float(acc[d])) for d in datasets)


def parse_sensitivity(
    data: Mapping[str, Any], where: str, options: FileOptions
) -> SensitivityConfig:
    """Validate a parsed proxy-sensitivity experiment (errors name the key, before any run)."""
    m = merge_scale(data, where, DEFAULTS, options)
    f = Fields(m, where, DEFAULTS)
    text, integer, number = f.text, f.integer, f.number
    ds = f.str_list("datasets", IMAGE_DATASETS + TEXT_DATASETS, min_len=2)
    kind = _task_of(ds, where)
    accuracy = _accuracy(m["accuracy"], ds, where)
    models = model_zoo.TEXT_MODEL_NAMES if kind == "text" else model_zoo.MODEL_NAMES
    caps = f.caps()
    devices = f.str_list("devices", tuple(available_device_kinds()))
    return SensitivityConfig(
        name=text("name"),
        study=text("study", (NAME,)),
        description=text("description"),
        scale=options.scale,
        task=kind,
        datasets=ds,
        accuracy=accuracy,
        reference_proxy=text("reference-proxy", ds),
        model=text("model", models),
        devices=devices,
        caps_w=caps,
        seeds=integer("seeds", 1),
        batch_sizes=f.batch_sizes(),
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
