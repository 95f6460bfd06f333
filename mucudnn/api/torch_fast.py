"""The warm path of a Convolution called with CUDA torch tensors: a handful of
attribute reads, then the kernel's launch (Note [two torch warm paths])."""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Sequence

from ..exec.arrays import torch_workspace
from ..typing_aliases import ArrayLike

__all__ = ["TorchFast"]


# Note [two torch warm paths]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# CUDA torch tensors have two warm paths, one per entry point: TorchFast here
# (a Convolution called with torch tensors) and _Warm in torch/engine.py
# (mucudnn.torch's functions, modules and autograd). They stay two because
# they start from different things: TorchFast belongs to one Convolution and
# direction, and only checks that the call matches what its full path
# established; _Warm starts from a conv signature (strides, options, TF32,
# determinism), finds or makes the Convolution, packs channels-last views,
# allocates outputs and serves the backward's two directions (or PyTorch's own
# call). Both end in Kernel.launch with exec.arrays.torch_workspace (Note
# [torch workspace]), which stays in exec/: exec's torch Framework (the full
# path) allocates from it too, and exec/ may not import api or torch/.
class TorchFast:
    """The warm path for CUDA torch tensors (installed after a full call succeeded).

    Returns None, without side effects, whenever anything differs from what
    the full path established (kind, shape, dtype, device, contiguity, scalar
    types, an output that overlaps an input); the caller then takes the full
    path, which validates and raises. The stream is torch's current stream,
    read per call; the workspace comes from torch's caching allocator.

    ``launch`` is the direction's ``Kernel.launch``; ``shapes`` the shapes of
    (input 1, input 2, output) and ``perm`` where x, w and y (their forward
    roles) sit among them; ``like`` the call's first input (dtype and device).
    """

    __slots__ = ("launch", "sa", "sb", "so", "dtype", "dev", "tdev", "perm", "na", "nb", "no",
                 "empty", "stream_of", "ws")

    def __init__(self, launch: Callable[..., Any], shapes: Sequence[Sequence[int]],
                 perm: tuple[int, int, int], like: ArrayLike) -> None:
        torch = sys.modules["torch"]
        self.launch = launch
        self.sa, self.sb, self.so = (torch.Size(s) for s in shapes)
        self.dtype = like.dtype
        self.dev = like.get_device()
        self.tdev = like.device
        self.perm = perm
        item = like.element_size()
        self.na, self.nb, self.no = (math.prod(s) * item for s in shapes)
        self.empty = torch.empty
        self.stream_of = torch._C._cuda_getCurrentRawStream
        self.ws = torch_workspace(self.tdev)

    def __call__(self, a: ArrayLike, b: ArrayLike, out: ArrayLike, alpha: Any, beta: Any) -> ArrayLike:
        dt, dev = self.dtype, self.dev
        try:
            if (a.dtype is not dt or b.dtype is not dt or a.shape != self.sa
                    or b.shape != self.sb or a.get_device() != dev or b.get_device() != dev
                    or not a.is_contiguous() or not b.is_contiguous()
                    or alpha.__class__ is not float or beta.__class__ is not float):
                return None
            pa, pb = a.data_ptr(), b.data_ptr()
            if out is None:
                if beta != 0.0:
                    return None
                out = self.empty(self.so, dtype=dt, device=self.tdev)
                po = out.data_ptr()
            else:
                if (out.dtype is not dt or out.shape != self.so or out.get_device() != dev
                        or not out.is_contiguous()):
                    return None
                po, no = out.data_ptr(), self.no
                if (po < pa + self.na and pa < po + no) or (po < pb + self.nb and pb < po + no):
                    return None
        except AttributeError:  # not a torch tensor
            return None
        t = (pa, pb, po)
        i, j, k = self.perm
        self.launch(t[i], t[j], t[k], alpha, beta, self.stream_of(dev), self.ws)
        return out

