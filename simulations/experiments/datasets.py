"""Target and proxy data of the experiments, built from ``fl_client.data_splits``' digits slices.

* target ``digits``: the client pool of ``data_splits.load_digits_splits(0)`` (1,047 images),
  split per seed, stratified, into train / test (``target-test-fraction``, 80/20 as in
  the paper); ``target-train-size`` > 0 keeps a stratified subset of the train split.
* proxy ``digits-rotated``: the proxy slices (``proxy-train`` 300 / ``proxy-eval`` 150
  images, disjoint from the target's images), each image rotated by its own angle drawn
  uniformly from ±``proxy-rotate-deg`` and given N(0, ``proxy-noise-std``²) pixel noise
  (in the standardised pixel units), with a fixed generator (seed 20250218), so the proxy
  is a differently transformed copy of other digits.
* proxy ``digits``: the same proxy slices untransformed (a same-distribution proxy).
* ``cifar10-subset`` / ``mnist-subset`` (target or proxy): the data kit's real images, npz
  files under ``data-root`` (default ``../shared/data`` beside the repository; see its
  MANIFEST.md), read with ``fl_client.image_data`` (a file without the expected keys or
  shapes is refused, naming the file and what it lacks), made 3×32×32 and standardised per
  channel with the train split's statistics. As target: a stratified ``image-subset-size``
  subset of the train split (0: all of it) split per seed into train / test like digits.
  As proxy: the train split is proxy-train and the test split proxy-eval (each a stratified
  ``proxy-train-size`` / ``proxy-eval-size`` subset when > 0). Target and proxy must be
  different files.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.data import TensorDataset

from fl_client import data_splits, image_data

#: The fixed slices of the digits set every experiment uses (disjointness of proxy/target).
SPLIT_SEED = 0
TRANSFORM_SEED = 20250218
#: Targets and proxies read from the data kit's npz files.
NPZ_DATASETS = tuple(image_data.SHARED_SUBSETS)
TARGETS = ("digits", *NPZ_DATASETS)
PROXIES = ("digits-rotated", "digits", *NPZ_DATASETS)


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
    data_root: str = ""  # npz sets: the data kit's folder ("": ../shared/data)
    image_subset_size: int = 0  # npz target: a stratified subset of its train split

    def uses_npz(self) -> bool:
        return self.target in NPZ_DATASETS or self.proxy in NPZ_DATASETS

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case settings; the npz keys (the resolved files instead of ``data-root``)
        only when an npz set is used, so digits records keep their keys."""
        d = {k.replace("_", "-"): v for k, v in asdict(self).items()}
        d.pop("data-root")
        if not self.uses_npz():
            d.pop("image-subset-size")
        else:
            d["files"] = {
                name: str(image_data.npz_path(name, self.data_root or None).resolve())
                for name in (self.target, self.proxy)
                if name in NPZ_DATASETS
            }
        return d


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

    x, y = data_splits.as_tensors(ds)
    idx = np.arange(len(y))
    keep, _ = train_test_split(idx, train_size=size, stratify=y.numpy(), random_state=seed)
    t = torch.from_numpy(np.sort(keep))
    return TensorDataset(x[t], y[t])


def _npz(settings: DataSettings, name: str) -> image_data.ImageArrays:
    return image_data.load_npz(name, settings.data_root or None)


@lru_cache(maxsize=4)
def _npz_target_pool(settings: DataSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """The npz target's train split (a stratified ``image-subset-size`` subset), 3×32×32,
    standardised per channel."""
    arrays = _npz(settings, settings.target)
    y = arrays.y_train
    keep = np.arange(len(y))
    if 0 < settings.image_subset_size < len(y):
        from sklearn.model_selection import train_test_split

        keep, _ = train_test_split(
            keep, train_size=settings.image_subset_size, stratify=y, random_state=SPLIT_SEED
        )
        keep = np.sort(keep)
    x, _, _ = data_splits.standardise(data_splits.images_to_tensor(arrays.x_train[keep]))
    return x, torch.from_numpy(y[keep])


@lru_cache(maxsize=4)
def _npz_proxy(settings: DataSettings) -> tuple[TensorDataset, TensorDataset]:
    """The npz proxy's (proxy-train, proxy-eval): its train and test splits, standardised
    with the train split's statistics, each cut to its size setting when > 0."""
    arrays = _npz(settings, settings.proxy)
    assert arrays.x_test is not None and arrays.y_test is not None  # an npz has both
    ref = data_splits.images_to_tensor(arrays.x_train)
    x_tr, mean, std = data_splits.standardise(ref)
    x_ev = ((data_splits.images_to_tensor(arrays.x_test) - mean) / std).contiguous()
    train = TensorDataset(x_tr, torch.from_numpy(arrays.y_train))
    ev = TensorDataset(x_ev, torch.from_numpy(arrays.y_test))
    return (
        _stratified_subset(train, settings.proxy_train_size, SPLIT_SEED),
        _stratified_subset(ev, settings.proxy_eval_size, SPLIT_SEED),
    )


def check_settings(settings: DataSettings) -> None:
    """Names, and target ≠ proxy for the npz sets (they would share images)."""
    if settings.target not in TARGETS:
        raise ValueError(
            f"target: unknown dataset {settings.target!r}; allowed: {', '.join(TARGETS)}"
        )
    if settings.proxy not in PROXIES:
        raise ValueError(
            f"proxy: unknown dataset {settings.proxy!r}; allowed: {', '.join(PROXIES)}"
        )
    if settings.proxy == settings.target and settings.proxy in NPZ_DATASETS:
        raise ValueError(
            f"proxy: {settings.proxy!r} is also the target; the proxy must be other data "
            f"(allowed: {', '.join(p for p in PROXIES if p != settings.target)})"
        )


def study_data(settings: DataSettings, seed: int) -> StudyData:
    """The target and proxy sets of one seed (see the module docstring).

    Raises
    ------
    ValueError
        Unknown names, or the same npz as target and proxy (naming the key).
    fl_client.image_data.ImageDataError
        An npz that is missing or lacks the expected keys or shapes (naming the file).
    """
    from sklearn.model_selection import train_test_split

    check_settings(settings)
    splits = data_splits.load_digits_splits(SPLIT_SEED)
    if settings.target in NPZ_DATASETS:
        x, y = _npz_target_pool(settings)
    else:
        x, y = data_splits.as_tensors(splits.pool)
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
        px, py = data_splits.as_tensors(ds)
        if settings.proxy == "digits-rotated":
            px = rotate_and_noise(
                px, settings.proxy_rotate_deg, settings.proxy_noise_std, TRANSFORM_SEED + offset
            )
        return TensorDataset(px, py)

    if settings.proxy in NPZ_DATASETS:
        proxy_train, proxy_eval = _npz_proxy(settings)
    else:
        proxy_train = proxy_set(splits.proxy_train, settings.proxy_train_size, 0)
        proxy_eval = proxy_set(splits.proxy_eval, settings.proxy_eval_size, 1)
    return StudyData(
        target_train=target_train,
        target_test=target_test,
        proxy_train=proxy_train,
        proxy_eval=proxy_eval,
    )
