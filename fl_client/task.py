"""Models, data and train/evaluate for powerfl: plain PyTorch, no Flower import."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812  (the PyTorch convention)
import torchvision
from torch import nn
from torch.utils.data import TensorDataset

from fl_client import image_data, partitions
from fl_client.contract import SettingsError
from fl_client.text_model import SEQ_LEN, TEXT_MODELS, VOCAB, CharTransformer, build_text_model

if TYPE_CHECKING:
    from fl_client.settings import RunSettings

#: Image models (3×32×32 inputs, 10 classes).
MODEL_NAMES = ("cnn", "resnet18", "mobilenetv2")
IMAGE_SHAPE = (3, 32, 32)
#: Next-character models (``SEQ_LEN`` character ids in, a distribution over ``VOCAB`` out
#: at every position); see ``fl_client.text_model``.
TEXT_MODEL_NAMES = tuple(TEXT_MODELS)
ALL_MODEL_NAMES = MODEL_NAMES + TEXT_MODEL_NAMES


def is_text_model(name: str) -> bool:
    """Whether ``name`` is one of ``TEXT_MODEL_NAMES``."""
    return name in TEXT_MODELS


def input_shape_for(name: str) -> tuple[int, ...]:
    """The shape of one sample of model ``name``: ``(SEQ_LEN,)`` for text, else 3×32×32."""
    return (SEQ_LEN,) if is_text_model(name) else IMAGE_SHAPE


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head: the default model for 3×32×32 inputs."""

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        w = width
        self.features = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * w, 4 * w, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(4 * w * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    """Build ``name`` (one of ``ALL_MODEL_NAMES``): image models for 3×32×32 inputs, text
    models (``TEXT_MODEL_NAMES``, ``num_classes`` ignored) for ``SEQ_LEN`` character ids.

    ResNet18 and MobileNetV2 are torchvision's definitions adapted the usual way for
    32×32 images: ResNet18's stem becomes a 3×3 stride-1 conv without max-pool, and
    MobileNetV2's first conv gets stride 1, so the feature maps are not shrunk to nothing.
    """
    if is_text_model(name):
        return build_text_model(name)
    if name == "cnn":
        return SmallCNN(num_classes)
    if name == "resnet18":
        model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()  # type: ignore[assignment, unused-ignore]
        return model
    if name == "mobilenetv2":
        model = torchvision.models.mobilenet_v2(weights=None, num_classes=num_classes)
        first = model.features[0][0]  # type: ignore[index, unused-ignore]
        assert isinstance(first, nn.Conv2d)
        first.stride = (1, 1)
        return model
    raise ValueError(f"model: unknown model {name!r}; allowed: {', '.join(ALL_MODEL_NAMES)}")


@lru_cache(maxsize=32)
def train_flops_per_sample(name: str, input_shape: tuple[int, ...] = IMAGE_SHAPE) -> float:
    """Forward + backward FLOPs of one training sample of model ``name``.

    Counted with ``torch.utils.flop_counter`` on the real model (batch of 2, divided by 2),
    so the twin's cost follows the actual architecture and input shape.
    """
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(name)
    model.train()
    x, _ = synthetic_batch(name, input_shape, 2, NUM_CLASSES, torch.Generator().manual_seed(0))
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(x)
        out.sum().backward()
    return float(counter.get_total_flops()) / 2.0


def param_count(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------------------
# Data: scikit-learn's bundled digits (the embedded default), or an image dataset the user
# has (a data-kit npz, a Hugging Face dataset), shaped like the 3×32×32 images the models
# expect and split into the server's proxy and test sets and the clients' pool.
# ---------------------------------------------------------------------------------------

NUM_CLASSES = 10
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


#: The digits splits' former name.
DigitsSplits = DataSplits


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
class PartitionSpec:
    """How the pool is split over the nodes: the run settings ``partitioning``,
    ``dirichlet-alpha``, ``seed``, ``dataset`` and ``classes-per-node`` (``of(settings)``).

    The defaults are those of ``client_data`` and ``split_report`` without a spec.
    """

    #: ``partitioning``: one of ``PARTITIONINGS``.
    partitioning: str = "dirichlet"
    #: ``dirichlet-alpha``: Dirichlet concentration, > 0; only for ``dirichlet``.
    alpha: float = 0.5
    #: ``seed``: seed of the slices, the partition and each node's local split.
    seed: int = 0
    #: ``dataset``: ``digits`` (the embedded default) or another; see ``load_splits``.
    dataset: str = DEFAULT_DATASET
    #: ``classes-per-node``: classes each node holds; only for ``pathological``.
    classes_per_node: int = CLASSES_PER_NODE

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
        return _partitions(
            num_partitions,
            self.partitioning,
            float(self.alpha),
            self.seed,
            self.dataset,
            int(self.classes_per_node),
        )


@lru_cache(maxsize=16)
def _partitions(
    num_partitions: int,
    partitioning: str,
    alpha: float,
    seed: int,
    dataset: str = DEFAULT_DATASET,
    classes_per_node: int = CLASSES_PER_NODE,
) -> tuple[np.ndarray, ...]:
    labels = as_tensors(load_splits(dataset, seed).pool)[1].numpy()
    return tuple(
        partitions.partition(
            labels,
            num_partitions,
            partitioning,
            alpha=alpha,
            seed=seed,
            classes_per_node=classes_per_node,
        )
    )


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
    detail = {
        "dirichlet": f"dirichlet-alpha {spec.alpha:g}, ",
        "pathological": f"classes-per-node {spec.classes_per_node}, ",
    }.get(spec.partitioning, "")
    return partitions.SplitReport.of(
        as_tensors(splits.pool)[1].numpy(),
        list(parts),
        dataset=spec.dataset,
        partitioning=spec.partitioning,
        detail=f"{detail}seed {spec.seed}",
        names=names,
        class_names=splits.class_names,
    )


# ---------------------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------------------

StepRunner = Callable[[int, Callable[[], object]], object]
"""``step_runner(batch_size, fn)`` runs ``fn`` (one minibatch) and may account for it."""


@dataclass(frozen=True)
class TrainResult:
    """What one call of ``train`` did."""

    num_examples: int  # size of the local training set
    steps: int  # optimizer steps taken
    samples: int  # samples processed (sum of minibatch sizes)
    mean_loss: float  # mean training loss over the minibatches (nan if none)


def scaled_lr(lr_ref: float, b_ref: int, batch_size: int) -> float:
    """Learning rate for ``batch_size`` by square-root scaling from (``lr_ref``, ``b_ref``).

    ``lr = lr_ref · sqrt(batch_size / b_ref)``, the rule the paper uses for Adam/AdamW.
    """
    if not lr_ref > 0:
        raise ValueError(f"lr-ref: must be > 0, got {lr_ref!r}")
    if not b_ref > 0:
        raise ValueError(f"b-ref: must be > 0, got {b_ref!r}")
    if not batch_size > 0:
        raise ValueError(f"batch-size: must be > 0, got {batch_size!r}")
    return float(lr_ref) * math.sqrt(batch_size / b_ref)


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """The optimizer of every training in powerfl: Adam at ``lr``."""
    return torch.optim.Adam(model.parameters(), lr=lr)


def model_device(model: nn.Module) -> torch.device:
    """The device the model's parameters live on (CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """One minibatch: forward, cross-entropy, backward, optimizer step; returns the loss as
    a detached tensor on the model's device.

    On a GPU the call only queues the work: it neither synchronizes nor reads the loss back,
    so the next step is queued while this one runs and the GPU never idles between steps.
    Whoever times steps brackets a whole window with synchronizes (the device meters do), and
    whoever needs the loss as a number reads it once, at the end.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _run_step(step_runner: StepRunner | None, batch_size: int, fn: Callable[[], object]) -> None:
    if step_runner is None:
        fn()
    else:
        step_runner(batch_size, fn)


def train(
    model: nn.Module,
    data: Data,
    *,
    batch_size: int,
    lr: float,
    epochs: int = 1,
    seed: int = 0,
    step_runner: StepRunner | None = None,
    max_samples: int | None = None,
) -> TrainResult:
    """Train ``model`` in place with Adam on shuffled minibatches of ``data``.

    A fresh optimizer is made for each call (local training in a federated round starts
    from the received weights without optimizer state). Each epoch visits the data once in
    a seeded random order; the last minibatch of an epoch may be smaller.

    Parameters
    ----------
    model : torch.nn.Module
        The model; trained on the device its parameters live on.
    data : TensorDataset or (Tensor, Tensor)
        Training images and labels.
    batch_size : int
        Minibatch size b.
    lr : float
        Adam learning rate (see ``scaled_lr``).
    epochs : int
        Passes over ``data``.
    seed : int
        Seed of the minibatch order.
    step_runner : callable, optional
        ``step_runner(actual_batch_size, fn)`` is called for every minibatch with a zero-arg
        ``fn`` doing forward, backward and the optimizer step; a device meter uses it to
        account for device time and power. By default ``fn`` is just called.
    max_samples : int, optional
        Stop after the minibatch that brings the processed samples to this many.

    Returns
    -------
    TrainResult
        Examples, steps, samples processed and the mean training loss.
    """
    if batch_size < 1:
        raise ValueError(f"batch-size: must be ≥ 1, got {batch_size!r}")
    if epochs < 1:
        raise ValueError(f"local-epochs: must be ≥ 1, got {epochs!r}")
    x_all, y_all = as_tensors(data)
    n = len(x_all)
    device = model_device(model)
    optimizer = make_optimizer(model, lr)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    losses: list[torch.Tensor] = []  # read back once, after the last step
    samples = 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            ids = order[start : start + batch_size]
            xb, yb = x_all[ids].to(device), y_all[ids].to(device)

            def fn(xb: torch.Tensor = xb, yb: torch.Tensor = yb) -> torch.Tensor:
                loss = train_step(model, optimizer, xb, yb)
                losses.append(loss)
                return loss

            _run_step(step_runner, len(ids), fn)
            samples += len(ids)
            if max_samples is not None and samples >= max_samples:
                break
        if max_samples is not None and samples >= max_samples:
            break
    mean_loss = float(torch.stack(losses).double().mean()) if losses else math.nan
    return TrainResult(num_examples=n, steps=len(losses), samples=samples, mean_loss=mean_loss)


@torch.no_grad()
def evaluate(model: nn.Module, data: Data, batch_size: int = 256) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``model`` on ``data``.

    Parameters
    ----------
    model : torch.nn.Module
        The model (evaluated in eval mode; its previous mode is restored).
    data : TensorDataset or (Tensor, Tensor)
        Images and labels.
    batch_size : int
        Evaluation minibatch size (does not change the result).

    Returns
    -------
    (float, float)
        Loss and accuracy in [0, 1]; (nan, nan) for empty data.
    """
    x_all, y_all = as_tensors(data)
    n = len(x_all)
    if n == 0:
        return math.nan, math.nan
    device = model_device(model)
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    try:
        for start in range(0, n, batch_size):
            xb = x_all[start : start + batch_size].to(device)
            yb = y_all[start : start + batch_size].to(device)
            logits = model(xb)
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(dim=1) == yb).sum())
    finally:
        model.train(was_training)
    return loss_sum / n, correct / n


def compute_device() -> torch.device:
    """Where a node's training runs: CUDA when this host has it, else the CPU. Profiling
    (``make_train_step``), a round's training and fleet-shared profiling all run here, so
    the measured loop and the trained loop run on one processor."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as CPU tensors of their own (what a node sends back)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def make_train_step(
    model_name: str,
    input_shape: tuple[int, ...],
    batch_size: int,
    num_classes: int = NUM_CLASSES,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> Callable[[], None]:
    """A zero-arg function running one real training step of ``model_name`` at ``batch_size``.

    The model, an Adam optimizer and one synthetic batch (seeded) are built once; every call
    does forward, backward and the optimizer step on that batch. Time and power of a step do
    not depend on the data (paper §4.1), so the on-device profiler uses this.

    Parameters
    ----------
    model_name : str
        One of ``MODEL_NAMES``.
    input_shape : tuple of int
        Shape of one sample, e.g. ``IMAGE_SHAPE``.
    batch_size : int
        Minibatch size b.
    num_classes : int
        Classes of the model's head.
    seed : int
        Seed of the model's initial weights and the synthetic batch.
    device : str or torch.device, optional
        Where to run; CUDA when available, else CPU.
    """
    if batch_size < 1:
        raise ValueError(f"batch-size: must be ≥ 1, got {batch_size!r}")
    dev = torch.device(device) if device else compute_device()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(model_name, num_classes).to(dev)
    gen = torch.Generator().manual_seed(seed)
    x, y = synthetic_batch(model_name, input_shape, batch_size, num_classes, gen)
    x, y = x.to(dev), y.to(dev)
    optimizer = make_optimizer(model, lr=1e-4)
    model.train()

    def step() -> None:
        train_step(model, optimizer, x, y)

    return step


@dataclass
class DataSteps:
    """Training steps on a node's own data that keep their updates (fleet-shared profiling).

    ``factory(b)`` returns a zero-arg function running ONE Adam step at ``b`` on ``model``
    with the next ``b`` samples of a seeded shuffle of ``data`` (wrapping around), at the
    learning rate scaled for ``b`` from (``lr_ref``, ``b_ref``); one optimizer per b, as a
    round's training makes a fresh one. ``samples`` counts the samples processed.
    """

    model: nn.Module
    data: Data
    lr_ref: float
    b_ref: int
    seed: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        self._x, self._y = as_tensors(self.data)
        gen = torch.Generator().manual_seed(self.seed)
        self._order = torch.randperm(len(self._x), generator=gen)
        self._pos = 0
        self._optimizers: dict[int, torch.optim.Optimizer] = {}

    def _next_ids(self, batch_size: int) -> torch.Tensor:
        n = len(self._order)
        ids = torch.cat([self._order, self._order])[self._pos : self._pos + min(batch_size, n)]
        self._pos = (self._pos + len(ids)) % n
        return ids

    def factory(self, batch_size: int) -> Callable[[], None]:
        if batch_size not in self._optimizers:
            lr = scaled_lr(self.lr_ref, self.b_ref, batch_size)
            self._optimizers[batch_size] = make_optimizer(self.model, lr)
        optimizer = self._optimizers[batch_size]
        device = model_device(self.model)
        self.model.train()

        def step() -> None:
            ids = self._next_ids(batch_size)
            xb, yb = self._x[ids].to(device), self._y[ids].to(device)
            train_step(self.model, optimizer, xb, yb)
            self.samples += len(ids)

        return step


def synthetic_batch(
    model_name: str,
    input_shape: tuple[int, ...],
    batch_size: int,
    num_classes: int,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A random (inputs, targets) batch shaped for ``model_name``: Gaussian images and class
    labels, or random character ids with a next-character target at every position."""
    if is_text_model(model_name):
        shape = (batch_size, *input_shape)
        return (
            torch.randint(0, len(VOCAB), shape, generator=gen),
            torch.randint(0, len(VOCAB), shape, generator=gen),
        )
    return (
        torch.randn(batch_size, *input_shape, generator=gen),
        torch.randint(0, num_classes, (batch_size,), generator=gen),
    )


def estimate_train_memory_bytes(
    model: nn.Module, input_shape: tuple[int, ...], batch_size: int
) -> int:
    """Approximate memory of training ``model`` with Adam at ``batch_size``, in bytes.

    Weights + gradients + Adam's two moment buffers (4 × parameter bytes), plus activations:
    the outputs of every leaf module for one sample, recorded with forward hooks, times
    ``batch_size``, plus the input batch. This is an approximation: in-place ops are counted
    as new tensors and framework workspace is ignored; it is meant to drop batch sizes that
    clearly do not fit, not to predict the allocator's peak.

    Parameters
    ----------
    model : torch.nn.Module
        The model (its mode is restored; its weights are not changed).
    input_shape : tuple of int
        Shape of one sample.
    batch_size : int
        Minibatch size b.

    Returns
    -------
    int
        Estimated bytes.
    """
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    per_sample = 0

    def hook(_m: nn.Module, _inp: object, out: object) -> None:
        nonlocal per_sample
        tensors = out if isinstance(out, tuple | list) else (out,)
        per_sample += sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    was_training = model.training
    model.eval()  # batch of one: BatchNorm in train mode would refuse it
    try:
        text = isinstance(model, CharTransformer)
        x = torch.zeros(
            1, *input_shape, device=model_device(model), dtype=torch.int64 if text else None
        )
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    input_bytes = math.prod(input_shape) * x.element_size()
    return int(4 * param_bytes + buffer_bytes + batch_size * (per_sample + input_bytes))


# ---------------------------------------------------------------------------------------
# Hashes of weights and data (cache keys)
# ---------------------------------------------------------------------------------------


def hash_tensors(items: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 (hex) over names, dtypes, shapes and bytes of named tensors (order matters)."""
    h = hashlib.sha256()
    for name, t in items:
        arr = t.detach().cpu().contiguous().numpy()
        h.update(f"{name}|{arr.dtype}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def state_hash(model_or_state: nn.Module | Mapping[str, torch.Tensor]) -> str:
    """sha256 (hex) of a model's weights (or of a state dict), for cache keys.

    Entries are hashed in key order, so the same weights give the same hash however the
    mapping was built.
    """
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    return hash_tensors(sorted(state.items()))


def data_hash(data: Data) -> str:
    """sha256 (hex) of a labelled data set, for cache keys."""
    x, y = as_tensors(data)
    return hash_tensors([("x", x), ("y", y)])
