"""Tiny image npz files in the data kit's layout (``../shared/data/MANIFEST.md``), so tests
never need the real ``cifar10-subset.npz`` / ``mnist-subset.npz``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

REAL_DATA_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"


def banded_images(n: int, seed: int, size: int = 32, grey: bool = False) -> tuple[Any, Any]:
    """``n`` uint8 images, class k (= i % 10) with a bright horizontal band at row 2 + 3k on
    a dark noisy background: a small CNN learns them in a few hundred samples."""
    rng = np.random.default_rng(seed)
    y = np.arange(n, dtype=np.int64) % 10
    x = rng.integers(0, 60, size=(n, size, size, 3), dtype=np.uint8)
    step = max(1, (size - 4) // 10)
    for i, k in enumerate(y):
        x[i, 2 + step * k : 2 + step * k + max(1, step - 1), :, :] = 250
    if grey:
        x[..., 1] = x[..., 0]
        x[..., 2] = x[..., 0]
    return x, y


def write_image_npz(
    path: Path,
    n_train: int = 200,
    n_test: int = 60,
    *,
    seed: int = 0,
    grey: bool = False,
    drop: tuple[str, ...] = (),
    **replace: Any,
) -> Path:
    """An npz with x_train, y_train, x_test, y_test and classes (``drop`` leaves keys out,
    ``replace`` overrides arrays), like the data kit's files."""
    x_tr, y_tr = banded_images(n_train, seed, grey=grey)
    x_te, y_te = banded_images(n_test, seed + 1, grey=grey)
    arrays: dict[str, Any] = {
        "x_train": x_tr,
        "y_train": y_tr,
        "x_test": x_te,
        "y_test": y_te,
        "classes": np.array([f"class{k}" for k in range(10)]),
    }
    arrays.update(replace)
    for key in drop:
        arrays.pop(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)
    return path


def write_kit(root: Path, n_train: int = 200, n_test: int = 60) -> Path:
    """A data root holding tiny ``cifar10-subset.npz`` (colour) and ``mnist-subset.npz``
    (grey repeated over RGB)."""
    write_image_npz(root / "cifar10-subset.npz", n_train, n_test, seed=0)
    write_image_npz(root / "mnist-subset.npz", n_train, n_test, seed=10, grey=True)
    return root
