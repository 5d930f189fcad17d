"""Models, data and train/evaluate for powerfl: plain PyTorch, no Flower import."""

from __future__ import annotations

from functools import lru_cache

import torch
import torchvision
from torch import nn

MODEL_NAMES = ("cnn", "resnet18", "mobilenetv2")
IMAGE_SHAPE = (3, 32, 32)


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
    """Build ``name`` (one of ``MODEL_NAMES``) for 3×32×32 inputs.

    ResNet18 and MobileNetV2 are torchvision's definitions adapted the usual way for
    32×32 images: ResNet18's stem becomes a 3×3 stride-1 conv without max-pool, and
    MobileNetV2's first conv gets stride 1, so the feature maps are not shrunk to nothing.
    """
    if name == "cnn":
        return SmallCNN(num_classes)
    if name == "resnet18":
        model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()  # type: ignore[assignment]
        return model
    if name == "mobilenetv2":
        model = torchvision.models.mobilenet_v2(weights=None, num_classes=num_classes)
        first = model.features[0][0]  # type: ignore[index]
        assert isinstance(first, nn.Conv2d)
        first.stride = (1, 1)
        return model
    raise ValueError(f"model: unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}")


@lru_cache(maxsize=32)
def train_flops_per_sample(name: str, input_shape: tuple[int, ...] = IMAGE_SHAPE) -> float:
    """Forward + backward FLOPs of one training sample of model ``name``.

    Counted with ``torch.utils.flop_counter`` on the real model (batch of 2, divided by 2),
    so the twin's cost follows the actual architecture and input shape.
    """
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(name)
    model.train()
    x = torch.randn(2, *input_shape)
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(x)
        out.sum().backward()
    return float(counter.get_total_flops()) / 2.0


def param_count(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
