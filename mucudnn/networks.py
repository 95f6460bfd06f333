"""Convolution layers of well-known networks, for any batch size.

Each network is an ordered list of :class:`ConvLayer` (name, channels, kernel,
stride, padding, input size, groups); :func:`network` turns it into
``{name: ConvProblem}`` at a batch size. Identical layers (ResNet blocks repeat)
share one problem, so :func:`unique_problems` lets a benchmark measure each
distinct problem once and weigh it by how often it occurs.

>>> probs = network("alexnet", batch=256)
>>> probs["conv2"].x_shape, probs["conv2"].w_shape
((256, 96, 27, 27), (256, 96, 5, 5))
>>> len(network("resnet50", batch=8))
53
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .errors import InvalidValueError
from .problem import ConvProblem


@dataclass(frozen=True)
class ConvLayer:
    """One convolution layer of a network (square inputs and kernels)."""

    name: str
    in_channels: int
    out_channels: int
    kernel: int
    stride: int
    padding: int
    input_size: int
    groups: int = 1

    def problem(self, batch: int, *, dtype: str = "float32", layout: str = "NCHW",
                math: str = "default") -> ConvProblem:
        """This layer as a ConvProblem at ``batch`` (NCHW or NHWC)."""
        c, k, r, h = self.in_channels, self.out_channels, self.kernel, self.input_size
        cg = c // self.groups
        if layout.upper() == "NHWC":
            x, w = (batch, h, h, c), (k, r, r, cg)
        else:
            x, w = (batch, c, h, h), (k, cg, r, r)
        return ConvProblem(x, w, stride=self.stride, padding=self.padding, groups=self.groups,
                           dtype=dtype, layout=layout, math=math)

    @property
    def output_size(self) -> int:
        return (self.input_size + 2 * self.padding - self.kernel) // self.stride + 1


def _alexnet() -> list[ConvLayer]:
    # Note: the original (Krizhevsky 2012 / Caffe) geometry with a 227x227
    # input and no channel groups, as μ-cuDNN and ../shared/data measured it.
    return [
        ConvLayer("conv1", 3, 96, 11, 4, 0, 227),
        ConvLayer("conv2", 96, 256, 5, 1, 2, 27),
        ConvLayer("conv3", 256, 384, 3, 1, 1, 13),
        ConvLayer("conv4", 384, 384, 3, 1, 1, 13),
        ConvLayer("conv5", 384, 256, 3, 1, 1, 13),
    ]


def _resnet_basic(blocks: Iterable[int]) -> list[ConvLayer]:
    """ResNet-18/34: BasicBlocks of two 3x3 convolutions, 1x1 downsample."""
    layers = [ConvLayer("conv1", 3, 64, 7, 2, 3, 224)]
    c_in, size = 64, 56
    for stage, (n_blocks, width) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
        for b in range(n_blocks):
            stride = 2 if (b == 0 and stage > 1) else 1
            p = f"layer{stage}.{b}"
            layers.append(ConvLayer(f"{p}.conv1", c_in, width, 3, stride, 1, size))
            out = (size + 2 - 3) // stride + 1
            layers.append(ConvLayer(f"{p}.conv2", width, width, 3, 1, 1, out))
            if stride != 1 or c_in != width:
                layers.append(ConvLayer(f"{p}.downsample", c_in, width, 1, stride, 0, size))
            c_in, size = width, out
    return layers


def _resnet_bottleneck(blocks: Iterable[int]) -> list[ConvLayer]:
    """ResNet-50/101/152 (torchvision "v1.5": the stride sits on the 3x3 convolution)."""
    layers = [ConvLayer("conv1", 3, 64, 7, 2, 3, 224)]
    c_in, size = 64, 56
    for stage, (n_blocks, width) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
        c_out = width * 4
        for b in range(n_blocks):
            stride = 2 if (b == 0 and stage > 1) else 1
            p = f"layer{stage}.{b}"
            out = (size + 2 - 3) // stride + 1
            layers.append(ConvLayer(f"{p}.conv1", c_in, width, 1, 1, 0, size))
            layers.append(ConvLayer(f"{p}.conv2", width, width, 3, stride, 1, size))
            layers.append(ConvLayer(f"{p}.conv3", width, c_out, 1, 1, 0, out))
            if b == 0:
                layers.append(ConvLayer(f"{p}.downsample", c_in, c_out, 1, stride, 0, size))
            c_in, size = c_out, out
    return layers


def _vgg16() -> list[ConvLayer]:
    cfg = [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]
    layers, c_in, size = [], 3, 224
    for block, (width, n) in enumerate(cfg, start=1):
        for i in range(1, n + 1):
            layers.append(ConvLayer(f"conv{block}_{i}", c_in, width, 3, 1, 1, size))
            c_in = width
        size //= 2
    return layers


NETWORKS: dict[str, list[ConvLayer]] = {
    "alexnet": _alexnet(),
    "resnet18": _resnet_basic((2, 2, 2, 2)),
    "resnet50": _resnet_bottleneck((3, 4, 6, 3)),
    "vgg16": _vgg16(),
}

#: The batch sizes of the μ-cuDNN paper's experiments.
DEFAULT_BATCH: dict[str, int] = {"alexnet": 256, "resnet18": 128, "resnet50": 128, "vgg16": 64}


def layers(name: str) -> list[ConvLayer]:
    """The conv layers of network ``name`` ("alexnet", "resnet18", "resnet50", "vgg16")."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in NETWORKS:
        raise InvalidValueError(f"net: expected one of {list(NETWORKS)}, got {name!r}")
    return NETWORKS[key]


def select(name: str, names: "Iterable[str] | None" = None) -> list[ConvLayer]:
    """The layers of network ``name`` called ``names`` (all when None), in
    network order; an unknown name raises InvalidValueError (a ValueError)
    listing the valid ones.

    >>> [l.name for l in select("alexnet", ["conv5", "conv2"])]
    ['conv2', 'conv5']
    """
    ls = layers(name)
    if names is None:
        return ls
    wanted = list(names)
    known = {l.name for l in ls}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise InvalidValueError(f"layers: {unknown or wanted} not among the layers of {name}: "
                         f"{', '.join(l.name for l in ls)}")
    return [l for l in ls if l.name in wanted]


def network(name: str, batch: int | None = None, *, dtype: str = "float32",
            layout: str = "NCHW", math: str = "default") -> dict[str, ConvProblem]:
    """``{layer name: ConvProblem}`` of network ``name`` at ``batch`` (default: the paper's)."""
    ls = layers(name)
    if batch is None:
        batch = DEFAULT_BATCH[name.lower().replace("-", "").replace("_", "")]
    return {l.name: l.problem(batch, dtype=dtype, layout=layout, math=math) for l in ls}


def unique_problems(problems: dict[str, ConvProblem]) -> dict[ConvProblem, list[str]]:
    """Group layer names by identical problem, keeping first-seen order."""
    out: dict[ConvProblem, list[str]] = {}
    for name, p in problems.items():
        out.setdefault(p, []).append(name)
    return out
