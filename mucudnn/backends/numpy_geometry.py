"""Where the NumPy algorithms read and write: the filter taps and the input and
output windows each one meets, where a tap reads the padding (Note [padding
products]), and the carving of the workspace into aligned views."""

from __future__ import annotations

import itertools
import math
from typing import Iterator, Sequence

import numpy as np

from ..problem import ConvProblem

__all__ = ["prod", "taps", "padding_reads", "taps_cover_all", "grouped", "align", "carve",
           "ALIGN"]

#: The alignment (bytes) of every segment carved from a workspace.
ALIGN = 64


def prod(t: Sequence[int]) -> int:
    """The product of ``t`` as a Python int."""
    return int(math.prod(t))


def taps(p: ConvProblem) -> Iterator[tuple[int, tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]:
    """For each filter tap whose window meets the (unpadded) input: its flat
    index, its index tuple, the output slices it contributes to and the input
    slices it reads (strided).

    Note: computing the valid output range per tap, instead of padding the
    input, keeps DIRECT free of any padded copy and lets IM2COL write straight
    from x into the column buffer.
    """
    xs, out = p.x_dims[2:], p.y_dims[2:]
    for flat, tap in enumerate(itertools.product(*(range(r) for r in p.w_dims[2:]))):
        osl, isl = [], []
        for t, s, d, pad, h, o in zip(tap, p.stride, p.dilation, p.padding, xs, out):
            off = t * d - pad                      # input index = o * s + off
            lo = max(0, -(off // s))               # ceil(-off / s)
            hi = min(o - 1, (h - 1 - off) // s)
            if hi < lo:
                break
            osl.append(slice(lo, hi + 1))
            isl.append(slice(lo * s + off, hi * s + off + 1, s))
        else:
            yield flat, tap, tuple(osl), tuple(isl)


# Note [padding products]
# ~~~~~~~~~~~~~~~~~~~~~~~
# A convolution multiplies every weight by every input of its window, and the
# padding is inputs equal to 0: an output whose window puts a NaN or inf weight
# over the padding is NaN (0 * inf and 0 * NaN are NaN), as the definition over
# the padded input makes it (so PyTorch's convolutions that pad explicitly;
# some of its CPU kernels skip the padding instead), and likewise a weight
# gradient whose tap meets a NaN or inf of dy where the tap reads the padding. DIRECT skips the
# padding (taps), so it adds those products' NaN afterwards, from where each
# tap reads the padding (padding_reads); the other algorithms take DIRECT's
# value wherever it is not finite (Guarded). The data gradient has no padding
# products: it is the adjoint, whose terms land in the padding and are dropped.
def padding_reads(p: ConvProblem) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """See Note [padding products]: each filter tap that reads the padding at some
    output, with a mask over the output's spatial dims, True where it does."""
    xs, out = p.x_dims[2:], p.y_dims[2:]
    nd = len(out)
    for tap in itertools.product(*(range(r) for r in p.w_dims[2:])):
        inside = np.ones((1,) * nd, bool)
        for i, (t, s, d, pad, h, o) in enumerate(zip(tap, p.stride, p.dilation, p.padding,
                                                     xs, out)):
            pos = np.arange(o) * s + t * d - pad
            inside = inside & ((pos >= 0) & (pos < h)).reshape((1,) * i + (o,) + (1,) * (nd - i - 1))
        if not inside.all():
            yield tap, ~np.broadcast_to(inside, out)


def taps_cover_all(p: ConvProblem) -> bool:
    """True when every tap reads a full output window (no padding effects)."""
    out = p.y_dims[2:]
    n = 0
    for _, _, osl, _ in taps(p):
        if any(s.stop - s.start != o for s, o in zip(osl, out)):
            return False
        n += 1
    return n == prod(p.w_dims[2:])


def grouped(a: np.ndarray, g: int) -> np.ndarray:
    """(N, C, ...) -> (N, G, C/G, ...) view."""
    return a.reshape(a.shape[:1] + (g, a.shape[1] // g) + a.shape[2:])


def align(n: int) -> int:
    """``n`` rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN


def carve(ws: np.ndarray, parts: Sequence[tuple[tuple[int, ...], np.dtype]]) -> list[np.ndarray]:
    """Views of consecutive 64-byte-aligned segments of the uint8 workspace."""
    views, off = [], 0
    for shape, dt in parts:
        nbytes = prod(shape) * np.dtype(dt).itemsize
        views.append(ws[off:off + nbytes].view(dt).reshape(shape))
        off += align(nbytes)
    return views
