"""The settings of the single-device study (``study = "single-device"``): keys, defaults
and validation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fl_client import model_zoo
from simulations.experiments.config import (
    STUDY_METHODS,
    TORCH_DEVICES,
    Fields,
    FileOptions,
    StudyConfig,
    config_error,
    merge_scale,
)
from simulations.experiments.datasets import NPZ_DATASETS, PROXIES, TARGETS, DataSettings

NAME = "single-device"
UNCAPPED_GRIDS = ("highest", "full")

#: Allowed keys and their defaults (None: required). Values are validated in ``parse``.
DEFAULTS: dict[str, Any] = {
    "name": None,
    "study": None,
    "description": "",
    "devices": None,
    "caps-w": None,
    "models": ["cnn"],
    "methods": list(STUDY_METHODS),
    "target": "digits",
    "proxy": "digits-rotated",
    "seeds": 3,
    "batch-sizes": [4, 8, 16, 32, 64, 128],
    "lr-ref": 5e-4,
    "b-ref": 128,
    "target-accuracy": 0.9,
    "proxy-target-accuracy": 0.9,
    "eval-every-samples": 512,
    "max-samples": 40_000,
    "target-test-fraction": 0.2,
    "target-train-size": 0,  # 0: the whole train split
    "proxy-train-size": 0,  # 0: the whole proxy-train slice
    "proxy-eval-size": 0,
    "proxy-rotate-deg": 25.0,
    "proxy-noise-std": 0.3,
    # cifar10-subset / mnist-subset: the data kit's folder ("" = ../shared/data beside the
    # repository), and a stratified subset of an npz target's train split (0: all of it)
    "data-root": "",
    "image-subset-size": 0,
    "profile-warmup-steps": 1,
    "profile-steps": 3,
    "profile-uncapped": "highest",
    "ts-samples": 4096,
    "torch-threads": 1,
    "torch-device": "cpu",  # where the r-estimation training runs: cpu | cuda | auto
}


@dataclass(frozen=True)
class SingleDeviceConfig(StudyConfig):
    """The resolved settings of one single-device study at one scale (all from the TOML).

    Attributes mirror the kebab-case keys (``caps-w`` → ``caps_w``); a cap of None is
    "no cap".
    """

    name: str
    study: str
    description: str
    scale: str
    devices: tuple[str, ...]
    caps_w: tuple[float | None, ...]
    models: tuple[str, ...]
    methods: tuple[str, ...]
    target: str
    proxy: str
    seeds: int
    batch_sizes: tuple[int, ...]
    lr_ref: float
    b_ref: int
    target_accuracy: float
    proxy_target_accuracy: float
    eval_every_samples: int
    max_samples: int
    target_test_fraction: float
    target_train_size: int
    proxy_train_size: int
    proxy_eval_size: int
    proxy_rotate_deg: float
    proxy_noise_std: float
    profile_warmup_steps: int
    profile_steps: int
    profile_uncapped: str
    ts_samples: int
    torch_threads: int
    torch_device: str = "cpu"
    data_root: str = ""
    image_subset_size: int = 0

    def data_settings(self) -> DataSettings:
        """The data settings of the study (``DataSettings``' fields, same names here)."""
        return DataSettings(**{f.name: getattr(self, f.name) for f in fields(DataSettings)})

    def accuracy_for(self, role: str) -> float:
        """The accuracy target of the ``proxy`` or the ``target`` runs."""
        return self.proxy_target_accuracy if role == "proxy" else self.target_accuracy


def parse_single_device(
    data: Mapping[str, Any], where: str, options: FileOptions
) -> SingleDeviceConfig:
    """Validate a parsed single-device experiment file (errors name ``where`` and the key)."""
    from fl_client.devices.descriptors import available_device_kinds

    m = merge_scale(data, where, DEFAULTS, options)
    f = Fields(m, where, DEFAULTS)
    text, str_list, integer, number = f.text, f.str_list, f.integer, f.number
    target, proxy = text("target", TARGETS), text("proxy", PROXIES)
    if proxy == target and proxy in NPZ_DATASETS:
        raise config_error(
            where,
            "proxy",
            f"{proxy!r} is also the target; the proxy must be other data "
            f"(allowed: {', '.join(p for p in PROXIES if p != target)})",
        )
    return SingleDeviceConfig(
        name=text("name"),
        study=text("study", (NAME,)),
        description=text("description"),
        scale=options.scale,
        devices=str_list("devices", tuple(available_device_kinds())),
        caps_w=f.caps(),
        models=str_list("models", model_zoo.MODEL_NAMES),
        methods=str_list("methods", STUDY_METHODS),
        target=target,
        proxy=proxy,
        seeds=integer("seeds", 1),
        batch_sizes=f.batch_sizes(),
        lr_ref=number("lr-ref", 0.0),
        b_ref=integer("b-ref", 1),
        target_accuracy=number("target-accuracy", 0.0, 1.0),
        proxy_target_accuracy=number("proxy-target-accuracy", 0.0, 1.0),
        eval_every_samples=integer("eval-every-samples", 1),
        max_samples=integer("max-samples", 1),
        target_test_fraction=number("target-test-fraction", 0.0, 1.0),
        target_train_size=integer("target-train-size", 0),
        proxy_train_size=integer("proxy-train-size", 0),
        proxy_eval_size=integer("proxy-eval-size", 0),
        proxy_rotate_deg=number("proxy-rotate-deg", -180.0, 180.0, open_lo=False),
        proxy_noise_std=number("proxy-noise-std", 0.0, open_lo=False),
        profile_warmup_steps=integer("profile-warmup-steps", 0),
        profile_steps=integer("profile-steps", 1),
        profile_uncapped=text("profile-uncapped", UNCAPPED_GRIDS),
        ts_samples=integer("ts-samples", 1),
        torch_threads=integer("torch-threads", 1),
        torch_device=text("torch-device", TORCH_DEVICES),
        data_root=text("data-root"),
        image_subset_size=integer("image-subset-size", 0),
    )
