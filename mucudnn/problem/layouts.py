"""Tensor layouts: which exist, and the one conversion between a layout's own
order and the canonical (N, C, spatial...) order that cuDNN's Nd descriptors,
the NumPy algorithms and the engine compute in.

>>> to_canonical((8, 5, 5, 3), "NHWC"), from_canonical((8, 3, 5, 5), "NHWC")
((8, 3, 5, 5), (8, 5, 5, 3))
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["LAYOUTS", "channels_last", "to_canonical", "from_canonical", "packed_strides"]


# Note [fp32 transposes in workspace]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# With TF32 allowed, the fastest float32 NCHW engines are NHWC kernels that
# first copy their operands to NHWC in the workspace: for most large kernels
# the fastest config's workspace is about the bytes of x, y and w together
# (tools/workspace_anatomy.py). Such a workspace grows with the batch, so a
# cap only splits the batch into small micro-batches, on which the kernels run
# slower. In float32 NHWC (channels-last) few kernels need those copies and
# plans under a cap run the whole batch in one call for all but the first
# layers (docs/BENCHMARKS.md). So float32 work under a workspace cap should be
# channels-last: NHWC arrays here, `model.to(memory_format=
# torch.channels_last)` in PyTorch (mucudnn.torch runs its NHWC plans without
# copies).

#: Layouts by number of spatial dimensions; the channels-first form comes first.
LAYOUTS: dict[str, int] = {"NCHW": 2, "NHWC": 2, "NCDHW": 3, "NDHWC": 3}


def channels_last(layout: str) -> bool:
    """True for NHWC/NDHWC."""
    return layout[1] != "C"


def to_canonical(shape: Sequence[int], layout: str) -> tuple[int, ...]:
    """A shape in the layout's own order -> (N, C, spatial...) order."""
    s = tuple(shape)
    return (s[0], s[-1]) + s[1:-1] if channels_last(layout) else s


def from_canonical(shape: Sequence[int], layout: str) -> tuple[int, ...]:
    """(N, C, spatial...) order -> the layout's own order."""
    s = tuple(shape)
    return (s[0],) + s[2:] + (s[1],) if channels_last(layout) else s


def packed_strides(canonical_shape: Sequence[int], layout: str) -> tuple[int, ...]:
    """Element strides of a packed tensor, listed in canonical (N, C, spatial...) order.

    This is what cuDNN's Nd tensor descriptors take: dims always in NCHW order,
    strides saying where each dim lives in memory.

    >>> packed_strides((2, 3, 4, 5), "NHWC")
    (60, 1, 15, 3)
    """
    own = from_canonical(canonical_shape, layout)
    strides_own = [1] * len(own)
    for i in range(len(own) - 2, -1, -1):
        strides_own[i] = strides_own[i + 1] * own[i + 1]
    return to_canonical(strides_own, layout)
