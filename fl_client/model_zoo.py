"""The models of powerfl, image and text, and what a node needs to know of them before it
trains one: FLOPs per sample, memory at a batch size, a synthetic batch. Plain PyTorch, no
Flower import."""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torchvision
from torch import nn

from fl_client.text_model import SEQ_LEN, TEXT_MODELS, VOCAB, CharTransformer, build_text_model

#: Image models (3×32×32 inputs, 10 classes).
MODEL_NAMES = ("cnn", "resnet18", "mobilenetv2")
IMAGE_SHAPE = (3, 32, 32)
#: Classes of the image models' heads (the labels of every image dataset powerfl reads).
NUM_CLASSES = 10
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


def model_device(model: nn.Module) -> torch.device:
    """The device the model's parameters live on (CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


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
