"""Train and evaluate for powerfl: the training loops of a round, of r estimation and of the
profiler's step, and the hashes of weights and data its caches are keyed by. Plain PyTorch,
no Flower import (the models: ``fl_client.model_zoo``; the data: ``fl_client.data_splits``)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812  (the PyTorch convention)
from torch import nn

from fl_client.data_splits import Data, as_tensors
from fl_client.model_zoo import NUM_CLASSES, SmallCNN, build_model, model_device, synthetic_batch

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


#: Models whose CPU training step runs faster on channels_last input batches with the same
#: results (``benchmarks/bench_train_step.py``). Not ResNet18: its step was 0.8–1.0× as fast
#: (slower) at b = 4..64. Not MobileNetV2: 1.2–1.5× faster, but its first step's gradients
#: were 1% (relative, all tensors) from a float64 reference, against 8e-6 contiguous.
#: SmallCNN's were 4e-7 either way.
CHANNELS_LAST_MODELS: tuple[type[nn.Module], ...] = (SmallCNN,)


def host_layout(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The batch ``x`` for ``model`` in the memory layout its step runs fastest in.

    On the CPU an image batch (4-D, N×C×H×W) of a ``CHANNELS_LAST_MODELS`` model is returned
    in ``torch.channels_last`` (N×H×W×C in memory; shape and values unchanged): PyTorch's CPU
    convolution and max-pool kernels then run in that layout, and a single-threaded SmallCNN
    Adam step got 1.5× faster per sample at b ≥ 16, 1.3–1.4× at b = 4 and 8
    (``benchmarks/bench_train_step.py``). Only the input changes: the weights stay
    contiguous, so state dicts, their hashes and the arrays a node sends are as before. The
    kernels sum in another order: one step's loss and gradients agree with the contiguous
    step's to about 1e-6 (relative), but over many Adam steps the weights drift apart as
    far as they do from a 1e-7 relative nudge of the initial weights, so a run's per-round
    accuracies differ (docs/benchmarks.md).
    Anything else (text models' 2-D batches, the other image models, any CUDA tensor) is
    returned as it is, and so is a batch already in channels_last (no copy).
    """
    if x.device.type == "cpu" and x.dim() == 4 and isinstance(model, CHANNELS_LAST_MODELS):
        return x.contiguous(memory_format=torch.channels_last)
    return x


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """One minibatch: forward, cross-entropy, backward, optimizer step; returns the loss as
    a detached tensor on the model's device. ``x`` is put in its ``host_layout`` first.

    On a GPU the call only queues the work: it neither synchronizes nor reads the loss back,
    so the next step is queued while this one runs and the GPU never idles between steps.
    Whoever times steps brackets a whole window with synchronizes (the device meters do), and
    whoever needs the loss as a number reads it once, at the end.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(host_layout(model, x)), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _run_step(step_runner: StepRunner | None, batch_size: int, fn: Callable[[], object]) -> None:
    if step_runner is None:
        fn()
    else:
        step_runner(batch_size, fn)


@dataclass(frozen=True)
class TrainOptions:
    """How ``train`` trains: minibatch size b, Adam's learning rate (see ``scaled_lr``), the
    passes over the data, the seed of the minibatch order, and an optional budget: stop
    after the minibatch that brings the processed samples to ``max_samples``."""

    batch_size: int
    lr: float
    epochs: int = 1
    seed: int = 0
    max_samples: int | None = None


def train(
    model: nn.Module,
    data: Data,
    options: TrainOptions,
    step_runner: StepRunner | None = None,
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
    options : TrainOptions
        Minibatch size, learning rate, epochs, seed of the minibatch order, sample budget.
    step_runner : callable, optional
        ``step_runner(actual_batch_size, fn)`` is called for every minibatch with a zero-arg
        ``fn`` doing forward, backward and the optimizer step; a device meter uses it to
        account for device time and power. By default ``fn`` is just called.

    Returns
    -------
    TrainResult
        Examples, steps, samples processed and the mean training loss.
    """
    batch_size, epochs, max_samples = options.batch_size, options.epochs, options.max_samples
    if batch_size < 1:
        raise ValueError(f"batch-size: must be ≥ 1, got {batch_size!r}")
    if epochs < 1:
        raise ValueError(f"local-epochs: must be ≥ 1, got {epochs!r}")
    x_all, y_all = as_tensors(data)
    n = len(x_all)
    device = model_device(model)
    optimizer = make_optimizer(model, options.lr)
    gen = torch.Generator().manual_seed(options.seed)
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
            xb = host_layout(model, x_all[start : start + batch_size].to(device))
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
    x, y = host_layout(model, x.to(dev)), y.to(dev)  # converted once, not at every step
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
