"""The run's data: scikit-learn's bundled digits (the embedded default), or an image dataset
the user has (a data-kit npz, a Hugging Face dataset), shaped like the 3×32×32 images the
models expect, split into the server's proxy and test sets and the clients' pool, and the
pool split over the nodes. Plain PyTorch, no Flower import."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812  (the PyTorch convention)
from torch.utils.data import TensorDataset

from fl_client import image_data, partitions
from fl_client.contract import SettingsError
from fl_client.model_zoo import IMAGE_SHAPE, NUM_CLASSES

if TYPE_CHECKING:
    from fl_client.settings import RunSettings

#: The ``partitioning`` values (Flower Datasets' partitioners, ``fl_client.partitions``).
PARTITIONINGS = partitions.PARTITIONINGS
#: The embedded dataset, the default of the ``dataset`` run setting.
DEFAULT_DATASET = "digits"

#: Fixed slices of the 1,797 digits images (stratified by label, seeded). The proxy set is
#: the server's public data D_S (split into proxy-train / proxy-eval for r estimation), the
#: test set is the server's held-out evaluation set, and the rest (1,047 images) is the
#: pool that is partitioned over the clients. Other datasets: the proxy slices come out of
#: their train split (the rest is the pool); their test split (else ``TEST_SIZE`` more
#: images of the train split) is the test set.
PROXY_TRAIN_SIZE = 300
PROXY_EVAL_SIZE = 150
TEST_SIZE = 300
#: Share of each client's partition held back as its local validation set (used by the
#: oracle's r, which is measured on the client's own data).
VAL_FRACTION = 0.2
#: Smallest Dirichlet partition accepted before resampling.
MIN_PARTITION_SIZE = partitions.MIN_PARTITION_SIZE
#: Classes per node with ``partitioning = "pathological"``.
CLASSES_PER_NODE = partitions.CLASSES_PER_NODE

Data = TensorDataset | tuple[torch.Tensor, torch.Tensor]
"""A labelled image set: a ``TensorDataset`` of (images, labels) or the two tensors."""


@dataclass(frozen=True)
class DataSplits:
    """The fixed slices of a run's dataset, each a ``TensorDataset`` of (x, y).

    ``indices`` maps each slice's name (``proxy-train``, ``proxy-eval``, ``test``,
    ``pool``) to the sorted positions of its samples in the source: scikit-learn's
    ``load_digits()`` for digits; for other datasets the train split (``test``: the test
    split when the dataset has one).
    """

    proxy_train: TensorDataset
    proxy_eval: TensorDataset
    test: TensorDataset
    pool: TensorDataset
    seed: int
    indices: Mapping[str, np.ndarray]
    dataset: str = DEFAULT_DATASET
    class_names: tuple[str, ...] = tuple(str(c) for c in range(NUM_CLASSES))

    def sizes(self) -> dict[str, int]:
        """Number of samples in each slice."""
        return {
            "proxy-train": len(self.proxy_train),
            "proxy-eval": len(self.proxy_eval),
            "test": len(self.test),
            "pool": len(self.pool),
        }


@lru_cache(maxsize=1)
def _digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as normalised 3×32×32 float32 images and int64 labels.

    The 8×8 images (0…16) are scaled to [0, 1], upsampled bilinearly to 32×32, replicated
    to three channels and standardised with the set's global pixel mean and std (a fixed
    preprocessing constant of the bundled data, the same for every split).
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.from_numpy(np.asarray(bunch.images, dtype=np.float32) / 16.0).unsqueeze(1)
    x = F.interpolate(x, size=IMAGE_SHAPE[1:], mode="bilinear", align_corners=False)
    x = (x - x.mean()) / x.std()
    x = x.expand(-1, IMAGE_SHAPE[0], -1, -1).contiguous()
    y = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))
    return x, y


def _slice(
    x: torch.Tensor, y: torch.Tensor, indices: Mapping[str, np.ndarray], name: str
) -> TensorDataset:
    t = torch.from_numpy(indices[name])
    return TensorDataset(x[t], y[t])


@lru_cache(maxsize=8)
def load_digits_splits(seed: int = 0) -> DataSplits:
    """Split the bundled digits into proxy-train, proxy-eval, test and the client pool.

    Sizes are fixed (``PROXY_TRAIN_SIZE`` = 300, ``PROXY_EVAL_SIZE`` = 150, ``TEST_SIZE`` =
    300, pool = the remaining 1,047); each slice is stratified by label and the assignment
    depends only on ``seed``, so the server and every client derive the same slices.

    Parameters
    ----------
    seed : int
        Seed of the stratified shuffles.

    Returns
    -------
    DataSplits
        The four disjoint slices as ``TensorDataset``s of (3×32×32 float32, int64 label).
    """
    from sklearn.model_selection import train_test_split

    x, y = _digits_tensors()
    labels = y.numpy()
    idx = np.arange(len(labels))
    proxy_size = PROXY_TRAIN_SIZE + PROXY_EVAL_SIZE
    rest, proxy = train_test_split(idx, test_size=proxy_size, stratify=labels, random_state=seed)
    pool, test = train_test_split(
        rest, test_size=TEST_SIZE, stratify=labels[rest], random_state=seed + 1
    )
    proxy_train, proxy_eval = train_test_split(
        proxy, test_size=PROXY_EVAL_SIZE, stratify=labels[proxy], random_state=seed + 2
    )

    indices = {
        "proxy-train": np.sort(proxy_train),
        "proxy-eval": np.sort(proxy_eval),
        "test": np.sort(test),
        "pool": np.sort(pool),
    }
    return DataSplits(
        proxy_train=_slice(x, y, indices, "proxy-train"),
        proxy_eval=_slice(x, y, indices, "proxy-eval"),
        test=_slice(x, y, indices, "test"),
        pool=_slice(x, y, indices, "pool"),
        seed=seed,
        indices=indices,
    )


def images_to_tensor(x: np.ndarray) -> torch.Tensor:
    """uint8 N×H×W×C images (C = 1 or 3) as float32 N×3×32×32 in [0, 1]: grey repeated over
    three channels; a side 28–31 zero-padded to 32 (MNIST's convention), any other size
    resized (bilinear up, area down)."""
    t = torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2).float() / 255.0
    if t.shape[1] == 1:
        t = t.expand(-1, 3, -1, -1)
    h, w = t.shape[-2:]
    if (h, w) != IMAGE_SHAPE[1:]:
        if 28 <= h <= 32 and 28 <= w <= 32:
            top, left = (32 - h) // 2, (32 - w) // 2
            t = F.pad(t, (left, 32 - w - left, top, 32 - h - top))
        else:
            mode = "area" if h > 32 or w > 32 else "bilinear"
            kwargs = {} if mode == "area" else {"align_corners": False}
            t = F.interpolate(t, size=IMAGE_SHAPE[1:], mode=mode, **kwargs)
    return t.contiguous()


def standardise(
    x: torch.Tensor, reference: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` standardised per channel with the mean and std of ``reference`` (default
    ``x``); returns (standardised x, mean, std)."""
    ref = x if reference is None else reference
    mean = ref.mean(dim=(0, 2, 3), keepdim=True)
    std = ref.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return ((x - mean) / std).contiguous(), mean, std


def dataset_min_train_size() -> int:
    """The fewest training images a non-digits dataset may have: the server's proxy slices,
    ``TEST_SIZE`` if it has no test split, and ``MIN_PARTITION_SIZE`` for one node."""
    return PROXY_TRAIN_SIZE + PROXY_EVAL_SIZE + MIN_PARTITION_SIZE


@lru_cache(maxsize=4)
def load_splits(dataset: str = DEFAULT_DATASET, seed: int = 0) -> DataSplits:
    """The run's data (the ``dataset`` run setting) as proxy-train, proxy-eval, test and pool.

    ``digits`` is ``load_digits_splits(seed)``. Any other name is read with
    ``fl_client.image_data.load_image_dataset`` (a data-kit subset such as
    ``cifar10-subset`` under ``../shared/data``, an npz path, or a Hugging Face dataset; never
    downloaded with ``HF_DATASETS_OFFLINE=1``): ``PROXY_TRAIN_SIZE`` + ``PROXY_EVAL_SIZE``
    images of its train split, stratified and seeded, are the proxy slices, the rest is the
    pool; the test split is the test set (without one, ``TEST_SIZE`` more images of the
    train split). Pixels are scaled to [0, 1], made 3×32×32 (``images_to_tensor``) and
    standardised per channel with the train split's mean and std.

    Raises
    ------
    fl_client.image_data.ImageDataError
        (a SettingsError naming ``dataset``) not available here, without the expected
        columns or keys, or too small.
    """
    if dataset == DEFAULT_DATASET:
        return load_digits_splits(seed)
    from sklearn.model_selection import train_test_split

    arrays = image_data.load_image_dataset(dataset)
    n = len(arrays.y_train)
    need = dataset_min_train_size() + (0 if arrays.y_test is not None else TEST_SIZE)
    if n < need:
        raise image_data.ImageDataError(
            f"dataset: {dataset!r} has {n} training images; powerfl needs at least {need} "
            f"(proxy-train {PROXY_TRAIN_SIZE}, proxy-eval {PROXY_EVAL_SIZE}"
            + ("" if arrays.y_test is not None else f", test {TEST_SIZE}")
            + f", and a pool of ≥ {MIN_PARTITION_SIZE})"
        )
    x_all, _, _ = standardise(images_to_tensor(arrays.x_train))
    labels = arrays.y_train
    y_all = torch.from_numpy(labels)
    counts = np.bincount(labels, minlength=NUM_CLASSES)
    strat = labels if counts[counts > 0].min() >= 2 else None
    idx = np.arange(n)
    proxy_size = PROXY_TRAIN_SIZE + PROXY_EVAL_SIZE
    rest, proxy = train_test_split(idx, test_size=proxy_size, stratify=strat, random_state=seed)
    strat_p = None if strat is None else labels[proxy]
    proxy_train, proxy_eval = train_test_split(
        proxy, test_size=PROXY_EVAL_SIZE, stratify=strat_p, random_state=seed + 2
    )
    indices = {"proxy-train": np.sort(proxy_train), "proxy-eval": np.sort(proxy_eval)}
    if arrays.x_test is not None and arrays.y_test is not None:
        ref = images_to_tensor(arrays.x_train)
        x_test = standardise(images_to_tensor(arrays.x_test), ref)[0]
        del ref
        indices["test"] = np.arange(len(arrays.y_test))
        indices["pool"] = np.sort(rest)
        test = TensorDataset(x_test, torch.from_numpy(arrays.y_test))
    else:
        strat_r = None if strat is None else labels[rest]
        pool, test_ids = train_test_split(
            rest, test_size=TEST_SIZE, stratify=strat_r, random_state=seed + 1
        )
        indices["test"], indices["pool"] = np.sort(test_ids), np.sort(pool)
        test = _slice(x_all, y_all, indices, "test")
    return DataSplits(
        proxy_train=_slice(x_all, y_all, indices, "proxy-train"),
        proxy_eval=_slice(x_all, y_all, indices, "proxy-eval"),
        test=test,
        pool=_slice(x_all, y_all, indices, "pool"),
        seed=seed,
        indices=indices,
        dataset=dataset,
        class_names=arrays.classes,
    )


def check_dataset(name: str) -> None:
    """Refuse a ``dataset`` run setting that cannot be used, before any engine starts.

    ``digits`` always works (embedded). Other names are loaded once here (an npz or a
    Hugging Face dataset; see ``load_splits``), so a missing dataset, one without an image
    and a label column (or the npz keys), labels outside [0, 10) or too few images is a
    ``SettingsError`` naming ``dataset``.
    """
    if not isinstance(name, str) or not name.strip():
        raise SettingsError(f"dataset: must be a dataset name, got {name!r}")
    if name != DEFAULT_DATASET:
        load_splits(name, 0)


def as_tensors(data: Data) -> tuple[torch.Tensor, torch.Tensor]:
    """The (images, labels) tensors of ``data``."""
    if isinstance(data, TensorDataset):
        x, y = data.tensors[0], data.tensors[1]
    else:
        x, y = data
    if len(x) != len(y):
        raise ValueError(f"data: {len(x)} images but {len(y)} labels")
    return x, y


@dataclass(frozen=True)
class PartitionSpec(partitions.Partitioning):
    """How the run's pool is split over the nodes: a ``partitions.Partitioning`` (the run
    settings ``partitioning``, ``dirichlet-alpha``, ``seed`` and ``classes-per-node``) of
    the run's ``dataset`` (``of(settings)``); ``seed`` also seeds the slices and each node's
    local split.

    The defaults are those of ``client_data`` and ``split_report`` without a spec.
    """

    #: ``dataset``: ``digits`` (the embedded default) or another; see ``load_splits``.
    dataset: str = DEFAULT_DATASET

    @classmethod
    def of(cls, settings: RunSettings) -> PartitionSpec:
        """The split the run settings ``settings`` ask for."""
        return cls(
            partitioning=settings.partitioning,
            alpha=settings.dirichlet_alpha,
            seed=settings.seed,
            dataset=settings.dataset,
            classes_per_node=settings.classes_per_node,
        )

    def check(self, partition_id: int, num_partitions: int) -> None:
        """``partitioning``, ``dirichlet-alpha`` (with ``dirichlet``) and ``partition_id``
        in ``[0, num_partitions)``; a SettingsError naming the key."""
        if self.partitioning not in PARTITIONINGS:
            raise SettingsError(
                f"partitioning: unknown value {self.partitioning!r}; "
                f"allowed: {', '.join(PARTITIONINGS)}"
            )
        if self.partitioning == "dirichlet":
            partitions.check_alpha(self.alpha)
        if not 0 <= partition_id < num_partitions:
            raise SettingsError(
                f"partition-id: must be in [0, {num_partitions - 1}] for {num_partitions} "
                f"partitions, got {partition_id!r}"
            )

    def parts(self, num_partitions: int) -> tuple[np.ndarray, ...]:
        """Each node's positions in the pool (cached per split)."""
        return _partitions(self, num_partitions)


@lru_cache(maxsize=16)
def _partitions(spec: PartitionSpec, num_partitions: int) -> tuple[np.ndarray, ...]:
    labels = as_tensors(load_splits(spec.dataset, spec.seed).pool)[1].numpy()
    return tuple(partitions.partition(labels, num_partitions, spec))


def client_data(
    partition_id: int,
    num_partitions: int,
    *,
    spec: PartitionSpec = PartitionSpec(),
) -> tuple[TensorDataset, TensorDataset]:
    """One client's share of the pool, split into local train and local validation data.

    The pool of ``load_splits(spec.dataset, spec.seed)`` is split over the nodes with a
    Flower Datasets partitioner (``fl_client.partitions.partition``: ``dirichlet`` with
    ``spec.alpha`` and at least ``MIN_PARTITION_SIZE`` samples each, ``iid``, or
    ``pathological`` with ``spec.classes_per_node``); the client's part is shuffled (seeded)
    and ``VAL_FRACTION`` of it (at least one sample) is held back as local validation data.

    Parameters
    ----------
    partition_id : int
        This client's partition, in ``[0, num_partitions)``.
    num_partitions : int
        Number of clients the pool is split over.
    spec : PartitionSpec
        How the pool is split (``PartitionSpec.of(settings)`` for a run's settings).

    Returns
    -------
    (TensorDataset, TensorDataset)
        Local train data and local validation data.
    """
    spec.check(partition_id, num_partitions)
    parts = spec.parts(num_partitions)
    ids = np.random.default_rng([spec.seed, partition_id]).permutation(parts[partition_id])
    n_val = max(1, round(VAL_FRACTION * len(ids))) if len(ids) > 1 else 0
    x, y = as_tensors(load_splits(spec.dataset, spec.seed).pool)
    val_ids = torch.from_numpy(np.sort(ids[:n_val]))
    train_ids = torch.from_numpy(np.sort(ids[n_val:]))
    return TensorDataset(x[train_ids], y[train_ids]), TensorDataset(x[val_ids], y[val_ids])


def split_report(
    num_partitions: int,
    *,
    spec: PartitionSpec = PartitionSpec(),
    names: Sequence[str] | None = None,
) -> partitions.SplitReport:
    """Each node's share of the pool as ``client_data`` makes it with the same ``spec``
    (training + validation): ``.lines()`` for the console (one line per node: name,
    samples, label histogram) and ``.save(run_dir)`` for ``split.png`` (Flower Datasets'
    label-distribution plot) and ``split.json``. ``names[i]`` names partition i (default:
    its id)."""
    spec.check(0, num_partitions)
    splits = load_splits(spec.dataset, spec.seed)
    parts = spec.parts(num_partitions)
    return partitions.SplitReport.of(
        as_tensors(splits.pool)[1].numpy(),
        list(parts),
        spec,
        dataset=spec.dataset,
        names=names,
        class_names=splits.class_names,
    )
