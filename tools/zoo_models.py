"""The torchvision zoo as tools/zoo_bench.py and tools/search_parity.py build it:
a model's task, classes and input size, and the untrained model (``tiny``:
train_bench's small CNN).

    >>> model_spec("tiny", None)
    ModelSpec(name='tiny', task='classification', num_classes=1000, size=32)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

import train_steps as ts  # tools/, beside this module: the tiny CNN, torchvision if present

torchvision = ts.torchvision


#: The zoo's mini-batch (zoo_bench's default, and step_profile's for a zoo model).
BATCH = 64


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
    task = "segmentation" if name in zoo_names()[1] else "classification"
    return ModelSpec(name, task, 21 if task == "segmentation" else 1000, size or 224)


class SegmentationLogits(nn.Module):
    """A torchvision segmentation model's ``out`` logits (its forward returns a dict)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["out"]


def build_model(spec: ModelSpec) -> nn.Module:
    """The untrained model (random weights from torch's global generator)."""
    if spec.name == "tiny":
        return ts.TinyCNN(spec.num_classes)
    if torchvision is None:
        raise RuntimeError(f"model {spec.name!r} needs torchvision")
    kwargs: dict[str, Any] = {"weights": None}
    if spec.name in ("inception_v3", "googlenet"):
        kwargs.update(aux_logits=False, init_weights=True)
    if spec.task == "segmentation":
        return SegmentationLogits(torchvision.models.get_model(spec.name, weights_backbone=None,
                                                               **kwargs))
    return torchvision.models.get_model(spec.name, **kwargs)
