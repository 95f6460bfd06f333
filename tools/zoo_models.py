"""The torchvision zoo as tools/zoo_bench.py and tools/search_parity.py build it:
a model's task, classes and input size, and the untrained model (``tiny``:
train_bench's small CNN; ``unet``: the U-Net of Ronneberger et al., whose
decoder up-samples with transposed convolutions, which torchvision's models
do not have).

    >>> model_spec("tiny", None)
    ModelSpec(name='tiny', task='classification', num_classes=1000, size=32)
    >>> model_spec("unet", None)
    ModelSpec(name='unet', task='segmentation', num_classes=21, size=224)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

import train_steps as ts  # tools/, beside this module: the tiny CNN, torchvision if present

torchvision = ts.torchvision


#: The zoo's mini-batch (zoo_bench's default, and step_profile's for a zoo model).
BATCH = 64
#: Models built here rather than by torchvision (``tiny``: for smoke tests).
BUILT_IN = ("tiny", "unet")


class ModelSpec(NamedTuple):
    name: str
    task: str  # "classification" or "segmentation"
    num_classes: int
    size: int


def zoo_names() -> tuple[list[str], list[str]]:
    """torchvision's classification and segmentation model names (none without it)."""
    if torchvision is None:
        return [], []
    tm = torchvision.models
    return tm.list_models(module=tm), tm.list_models(module=tm.segmentation)


def model_spec(name: str, size: int | None) -> ModelSpec:
    """``name``'s task, classes and input size: ``size`` (default 224; 32 for
    tiny), but 299 for inception_v3 (its design size)."""
    if name == "inception_v3":
        size = 299
    if name == "tiny":
        return ModelSpec(name, "classification", ts.NUM_CLASSES, size or 32)
    if name == "unet":
        return ModelSpec(name, "segmentation", 21, size or 224)
    task = "segmentation" if name in zoo_names()[1] else "classification"
    return ModelSpec(name, task, 21 if task == "segmentation" else 1000, size or 224)


class SegmentationLogits(nn.Module):
    """A torchvision segmentation model's ``out`` logits (its forward returns a dict)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["out"]


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """The U-Net (Ronneberger et al., 2015) as it is commonly trained: padded 3x3
    convolutions with batch norm, four 2x2 max-pool steps down (64 to 1024
    channels), four 2x2 stride-2 transposed convolutions up, each followed by
    the skip connection's concatenation, and a 1x1 classifier. The side must be
    a multiple of 16.

    >>> tuple(UNet(3, width=4)(torch.randn(1, 3, 32, 32)).shape)
    (1, 3, 32, 32)
    """

    def __init__(self, num_classes: int, width: int = 64) -> None:
        super().__init__()
        ch = [width * 2 ** i for i in range(5)]
        self.inc = _double_conv(3, ch[0])
        self.down = nn.ModuleList(_double_conv(ch[i], ch[i + 1]) for i in range(4))
        self.up = nn.ModuleList(nn.ConvTranspose2d(ch[i + 1], ch[i], 2, stride=2)
                                for i in reversed(range(4)))
        self.dec = nn.ModuleList(_double_conv(ch[i + 1], ch[i]) for i in reversed(range(4)))
        self.outc = nn.Conv2d(ch[0], num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.down:
            skips.append(down(nn.functional.max_pool2d(skips[-1], 2)))
        y = skips.pop()
        for up, dec in zip(self.up, self.dec):
            y = dec(torch.cat([skips.pop(), up(y)], dim=1))
        return self.outc(y)


def build_model(spec: ModelSpec) -> nn.Module:
    """The untrained model (random weights from torch's global generator)."""
    if spec.name == "tiny":
        return ts.TinyCNN(spec.num_classes)
    if spec.name == "unet":
        return UNet(spec.num_classes)
    if torchvision is None:
        raise RuntimeError(f"model {spec.name!r} needs torchvision")
    kwargs: dict[str, Any] = {"weights": None}
    if spec.name in ("inception_v3", "googlenet"):
        kwargs.update(aux_logits=False, init_weights=True)
    if spec.task == "segmentation":
        return SegmentationLogits(torchvision.models.get_model(spec.name, weights_backbone=None,
                                                               **kwargs))
    return torchvision.models.get_model(spec.name, **kwargs)
