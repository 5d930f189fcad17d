"""Target and proxy data of the experiments, built from ``fl_client.task``'s digits slices.

* target ``digits``: the client pool of ``task.load_digits_splits(0)`` (1,047 images),
  split per seed, stratified, into train / test (``target-test-fraction``, 80/20 as in
  the paper); ``target-train-size`` > 0 keeps a stratified subset of the train split.
* proxy ``digits-rotated``: the proxy slices (``proxy-train`` 300 / ``proxy-eval`` 150
  images, disjoint from the target's images), each image rotated by its own angle drawn
  uniformly from ±``proxy-rotate-deg`` and given N(0, ``proxy-noise-std``²) pixel noise
  (in the standardised pixel units), with a fixed generator (seed 20250218), so the proxy
  is a differently transformed copy of other digits.
* proxy ``digits``: the same proxy slices untransformed (a same-distribution proxy).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.data import TensorDataset

from fl_client import task

#: The fixed slices of the digits set every experiment uses (disjointness of proxy/target).
SPLIT_SEED = 0
TRANSFORM_SEED = 20250218


@dataclass(frozen=True)
class DataSettings:
    """Which target and proxy sets, and how they are cut and transformed (see the module
    docstring); the kebab-case ``to_dict`` is part of the training records' keys."""

    target: str
    proxy: str
    target_test_fraction: float
    target_train_size: int = 0  # 0: the whole train split
    proxy_train_size: int = 0  # 0: the whole proxy-train slice
    proxy_eval_size: int = 0
    proxy_rotate_deg: float = 25.0
    proxy_noise_std: float = 0.3

    def to_dict(self) -> dict[str, Any]:
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class StudyData:
    """One seed's target (train, test) and the proxy (train, eval) sets."""

    target_train: TensorDataset
    target_test: TensorDataset
    proxy_train: TensorDataset
    proxy_eval: TensorDataset

    def sizes(self) -> dict[str, int]:
        return {
            "target-train": len(self.target_train),
            "target-test": len(self.target_test),
            "proxy-train": len(self.proxy_train),
            "proxy-eval": len(self.proxy_eval),
        }


def rotate_and_noise(x: torch.Tensor, max_deg: float, noise_std: float, seed: int) -> torch.Tensor:
    """Each image rotated by its own uniform angle in ±``max_deg`` plus Gaussian noise."""
    gen = torch.Generator().manual_seed(seed)
    n = len(x)
    out = x
    if max_deg:
        angles = (torch.rand(n, generator=gen) * 2 - 1) * math.radians(max_deg)
        cos, sin = torch.cos(angles), torch.sin(angles)
        theta = torch.zeros(n, 2, 3)
        theta[:, 0, 0], theta[:, 0, 1] = cos, -sin
        theta[:, 1, 0], theta[:, 1, 1] = sin, cos
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        # Fill outside the rotated image with the background value (the set's minimum).
        bg = float(x.min())
        out = F.grid_sample(x - bg, grid, align_corners=False, padding_mode="zeros") + bg
    if noise_std:
        out = out + noise_std * torch.randn(out.shape, generator=gen)
    return out.contiguous()


def _stratified_subset(ds: TensorDataset, size: int, seed: int) -> TensorDataset:
    if size <= 0 or size >= len(ds):
        return ds
    from sklearn.model_selection import train_test_split

    x, y = task.as_tensors(ds)
    idx = np.arange(len(y))
    keep, _ = train_test_split(idx, train_size=size, stratify=y.numpy(), random_state=seed)
    t = torch.from_numpy(np.sort(keep))
    return TensorDataset(x[t], y[t])


def study_data(settings: DataSettings, seed: int) -> StudyData:
    """The target and proxy sets of one seed (see the module docstring)."""
    from sklearn.model_selection import train_test_split

    if settings.target != "digits":
        raise ValueError(f"target: unknown dataset {settings.target!r}; allowed: digits")
    if settings.proxy not in ("digits-rotated", "digits"):
        raise ValueError(
            f"proxy: unknown dataset {settings.proxy!r}; allowed: digits-rotated, digits"
        )
    splits = task.load_digits_splits(SPLIT_SEED)
    x, y = task.as_tensors(splits.pool)
    idx = np.arange(len(y))
    tr, te = train_test_split(
        idx, test_size=settings.target_test_fraction, stratify=y.numpy(), random_state=seed
    )
    t_tr, t_te = torch.from_numpy(np.sort(tr)), torch.from_numpy(np.sort(te))
    target_train = _stratified_subset(
        TensorDataset(x[t_tr], y[t_tr]), settings.target_train_size, seed
    )
    target_test = TensorDataset(x[t_te], y[t_te])

    def proxy_set(ds: TensorDataset, size: int, offset: int) -> TensorDataset:
        ds = _stratified_subset(ds, size, SPLIT_SEED)
        px, py = task.as_tensors(ds)
        if settings.proxy == "digits-rotated":
            px = rotate_and_noise(
                px, settings.proxy_rotate_deg, settings.proxy_noise_std, TRANSFORM_SEED + offset
            )
        return TensorDataset(px, py)

    return StudyData(
        target_train=target_train,
        target_test=target_test,
        proxy_train=proxy_set(splits.proxy_train, settings.proxy_train_size, 0),
        proxy_eval=proxy_set(splits.proxy_eval, settings.proxy_eval_size, 1),
    )
