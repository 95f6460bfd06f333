"""The memory layouts of :mod:`mucudnn.torch`'s convolutions: which one a
call runs in, as PyTorch's cuDNN convolution would (Note [the layout PyTorch
suggests]), and a tensor's views and new outputs in it."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .. import dtypes as _dtypes
from ..errors import UnsupportedDtypeError

__all__ = ["CL", "TO_CL", "BIAS_VIEW", "LAYOUT", "strides_like_cl", "is_cl", "channels_last",
           "view", "empty", "packed", "to_numpy"]

#: torch's channels-last memory format of a 4-d / 5-d tensor.
CL = {4: torch.channels_last, 5: torch.channels_last_3d}
#: The permutation from torch's logical order to the packed channels-last one.
TO_CL = {4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}
#: The view of a bias that broadcasts over an output of 4 or 5 dimensions.
BIAS_VIEW = {4: (-1, 1, 1), 5: (-1, 1, 1, 1)}
#: mucudnn's layout name of (dimensions, channels-last).
LAYOUT = {(4, False): "NCHW", (4, True): "NHWC", (5, False): "NCDHW", (5, True): "NDHWC"}


# Note [the layout PyTorch suggests]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A converted convolution runs in the memory format PyTorch's own cuDNN
# convolution would (cudnn_conv_suggest_memory_format in ATen's ConvUtils.h):
# channels-last where the input or the weight suggests it, and its output
# comes back in that format, so the ops after it see the tensors a native
# model gives them. A tensor suggests channels-last by its strides alone
# (c10's is_channels_last_strides_2d_s4 / _3d_s5), which also holds where the
# tensor is plainly contiguous too: a 1x1 weight (K, C, 1, 1) or a depthwise
# weight (C, 1, kh, kw) of a model moved to channels-last, or an input whose
# spatial size is 1x1. Asking ``is_contiguous(memory_format=...)`` instead
# runs such convolutions NCHW after an NCHW input (a ShuffleNet's channel
# shuffle, a squeeze-and-excitation block), where PyTorch runs them NHWC.
# Float64 on a GPU runs NCHW, as PyTorch's cuDNN path does (its CPU
# convolutions follow the strides in float64 too). The stride test is ported
# here because torch keeps its own Python copy private (torch._prims_common);
# tests/test_torch_cpu.py holds the port to it.
def strides_like_cl(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """c10's is_channels_last_strides_2d_s4 / _3d_s5 on a 4-d / 5-d tensor's
    sizes and strides (dimensions in the order C, innermost spatial ..., N)."""
    nd = len(shape)
    if strides[1] == 0:
        return False  # a trivial (broadcast) C dimension: NCHW
    least = 0
    for d in (1, *range(nd - 1, 1, -1), 0):
        if shape[d] == 0 or strides[d] < least:
            return False
        if d == 0 and least == strides[1]:
            return False  # ambiguous (N111 and the like): NCHW, as c10 falls back
        least = strides[d] * shape[d] if shape[d] > 1 else strides[d]
    return True


def is_cl(t: torch.Tensor) -> bool:
    """Whether ``t`` suggests channels-last (Note [the layout PyTorch suggests])."""
    return t.dim() in CL and strides_like_cl(t.shape, t.stride())


def channels_last(x: torch.Tensor, w: torch.Tensor) -> bool:
    """True when the convolution runs NHWC/NDHWC: ``x`` or ``w`` suggests
    channels-last, as PyTorch's cuDNN convolutions decide (Note [the layout
    PyTorch suggests]).

    >>> x, w = torch.empty(2, 4, 5, 5), torch.empty(8, 4, 1, 1)
    >>> wc = w.to(memory_format=torch.channels_last)  # plainly contiguous too
    >>> wc.is_contiguous(), channels_last(x, wc), channels_last(x, w)
    (True, True, False)
    """
    if x.is_cuda and (x.dtype is torch.float64 or w.dtype is torch.float64):
        return False
    return is_cl(x) or is_cl(w)


def view(t: torch.Tensor, cl: bool) -> torch.Tensor:
    """``t`` packed in the layout's own order (a view where it already is)."""
    if not cl:
        return t.contiguous()
    nd = t.dim()
    return t.contiguous(memory_format=CL[nd]).permute(TO_CL[nd]).contiguous()


def empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device,
          cl: bool) -> torch.Tensor:
    """A new tensor of torch's logical ``shape``, channels-last where ``cl``
    (Note [outputs are not views])."""
    if cl:
        return torch.empty(list(shape), dtype=dtype, device=device,
                           memory_format=CL[len(shape)])
    return torch.empty(list(shape), dtype=dtype, device=device)


def packed(t: torch.Tensor, cl: bool) -> torch.Tensor:
    """The packed NHWC/NDHWC view of a tensor from :func:`empty` (itself where
    not ``cl``): the engine writes through it."""
    return t.permute(TO_CL[t.dim()]) if cl else t


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's data as a NumPy array (bfloat16 through ml_dtypes)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:  # ml_dtypes is imported here: Note [bfloat16 on first use]
        if not _dtypes.HAVE_ML_DTYPES:
            raise UnsupportedDtypeError(
                "input: bfloat16 CPU tensors need ml_dtypes (pip install ml_dtypes)")
        return t.view(torch.int16).numpy().view(_dtypes.BFLOAT16)
    return t.numpy()
