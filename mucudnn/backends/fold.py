"""Folded first layers: a strided convolution over few input channels, run as a
stride-1 convolution over its input folded by space-to-depth (Note [folded
first layers]).

This module holds what every backend shares: which problems fold and into
what (:func:`fold_of`), the ids of folded configurations (:func:`fold_id`,
:func:`split_fold_id`), where a folded call keeps its folded tensors in its
workspace (:func:`regions`), the folded entries of a find()
(:func:`folded_perfs`), and the transforms on host arrays (NumPy; the
reference, and what :class:`~mucudnn.backends.numpy.NumpyBackend` runs). The
cuDNN backend runs the same transforms with ``cudnnTransformTensorEx``
(:class:`mucudnn._cudnn.descriptors.TensorTransformDescriptor`), whose
folded channel order, (row phase, column phase, channel), is the one used here.

>>> from mucudnn.problem import ConvProblem
>>> p = ConvProblem((256, 227, 227, 3), (96, 11, 11, 3), stride=4, layout="NHWC")
>>> f = fold_of(p)
>>> f.inner.x_shape, f.inner.w_shape, f.inner.stride
((256, 57, 57, 48), (96, 3, 3, 48), (1, 1))
>>> f.inner.output_shape == p.output_shape
True
>>> fold_id(4, "e12;k3=1"), split_fold_id("fold4|e12;k3=1"), split_fold_id(2)
('fold4|e12;k3=1', (4, 'e12;k3=1'), None)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, NamedTuple, Union

import numpy as np

from ..errors import UnsupportedConfigError
from ..problem import AlgoPerf, ConvProblem, Direction

__all__ = ["Fold", "Regions", "FOLD_MAX_CHANNELS", "FOLD_DTYPES", "CACHE_SUFFIX", "cache_name",
           "fold_of", "folding",
           "fold_id", "split_fold_id", "parse_rewritten_id", "regions", "folded_perfs", "fold_x",
           "fold_w", "unfold_x", "unfold_w"]

# Note [folded first layers]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# The first layer of most image networks is a strided convolution over three
# channels. In float32 channels-last its fast engines copy x (padded to four
# channels) and dy into their workspace, megabytes a sample, so under a cap
# they run a few dozen samples a call, slower a sample than one full-batch
# call. The same sum is a stride-1 convolution over x folded by
# space-to-depth (each s x s block of pixels becomes s*s*C channels, the
# filter padded to a multiple of s and folded the same way), which
# tensor-core engines run without padding channels and with little workspace
# (docs/BENCHMARKS.md). A folded configuration (id ``fold{s}|{inner id}``)
# folds its operands into the plan's workspace per micro-batch, runs the inner
# configuration there and unfolds its result (alpha and beta applied there),
# so the folded tensors count against the limit like any engine's scratch and
# find() reports its time with its transforms and its workspace with its
# regions (:func:`regions`). Only 2-D channels-last problems fold, with one
# stride s >= 2, no dilation, one group, C * s * s <= FOLD_MAX_CHANNELS and the
# folded output the original's size.

#: A problem folds only if C * s * s is at most this (the first layers: 48, 12).
FOLD_MAX_CHANNELS = 64
#: The data types a fold runs in (cuDNN's transforms and the NumPy backend's).
FOLD_DTYPES = frozenset({"float32", "float16", "bfloat16"})
#: Each region of a rewritten (folded or split) call's workspace starts at a multiple of this.
REGION_ALIGN = 256
_PREFIX = "fold"
_SEP = "|"

Algo = Union[int, str]


@dataclasses.dataclass(frozen=True)
class Fold:
    """How ``problem`` folds: into ``inner`` (same batch, stride 1, no
    padding), by ``s`` in both spatial dimensions; ``pad_before`` and
    ``pad_after`` are x's padding (rows, columns) before folding, the latter
    including the rows and columns that round up to a multiple of ``s``;
    ``filter_pad_after`` the filter's."""

    problem: ConvProblem
    inner: ConvProblem
    s: int
    pad_before: tuple[int, int]
    pad_after: tuple[int, int]
    filter_pad_after: tuple[int, int]


#: See Note [candidate sets in keys]: what a backend that folds appends to its
#: name in the keys of problems that fold.
CACHE_SUFFIX = "+fold"


def cache_name(name: str, problem: ConvProblem) -> str:
    """The name a backend ``name`` that folds keeps ``problem``'s measurements
    and plans under: with :data:`CACHE_SUFFIX` where ``problem`` folds (its
    find() reports the folded configurations too), else ``name`` (Note
    [candidate sets in keys] in :mod:`mucudnn.backends.base`).

    >>> from mucudnn.problem import ConvProblem
    >>> cache_name("cudnn-graph", ConvProblem((8, 224, 224, 3), (64, 7, 7, 3), stride=2,
    ...                                        padding=3, layout="NHWC"))
    'cudnn-graph+fold'
    >>> cache_name("cudnn-graph", ConvProblem((8, 3, 224, 224), (64, 3, 7, 7), stride=2, padding=3))
    'cudnn-graph'
    """
    return name + CACHE_SUFFIX if fold_of(problem) is not None else name


def fold_of(problem: ConvProblem) -> Fold | None:
    """How ``problem`` folds (Note [folded first layers]); None where it does not.

    >>> from mucudnn.problem import ConvProblem
    >>> fold_of(ConvProblem((8, 224, 224, 3), (64, 7, 7, 3), stride=2, padding=3,
    ...                     layout="NHWC")).inner.x_shape
    (8, 115, 115, 12)
    >>> fold_of(ConvProblem((8, 3, 224, 224), (64, 3, 7, 7), stride=2, padding=3)) is None
    True
    """
    p = problem
    if (p.nd != 2 or p.layout != "NHWC" or p.groups != 1 or p.dtype not in FOLD_DTYPES
            or any(d != 1 for d in p.dilation)):
        return None
    sh, sw = p.stride
    if sh != sw or sh < 2:
        return None
    s = int(sh)
    n, c, h, w = p.x_dims
    k, _, r, q = p.w_dims
    if c * s * s > FOLD_MAX_CHANNELS:
        return None
    ph, pw = p.padding
    hp, wp = h + 2 * ph, w + 2 * pw
    h2, w2 = -(-hp // s), -(-wp // s)
    r2, q2 = -(-r // s), -(-q // s)
    if (h2 - r2 + 1, w2 - q2 + 1) != p.y_dims[2:]:
        return None
    inner = ConvProblem((n, h2, w2, s * s * c), (k, r2, q2, s * s * c), stride=1, padding=0,
                        dilation=1, groups=1, dtype=p.dtype, layout="NHWC", math=p.math,
                        compute_type=p.compute_type)
    return Fold(p, inner, s, (ph, pw), (h2 * s - h - ph, w2 * s - w - pw),
                (r2 * s - r, q2 * s - q))


def folding(problem: ConvProblem, s: int) -> Fold:
    """How ``problem`` folds by ``s``, for running a folded id;
    :class:`~mucudnn.errors.UnsupportedConfigError` (a ValueError) where it
    does not fold so.

    >>> from mucudnn.problem import ConvProblem
    >>> folding(ConvProblem((2, 9, 9, 3), (4, 3, 3, 3), stride=2, layout="NHWC"), 3)
    Traceback (most recent call last):
      ...
    mucudnn.errors.UnsupportedConfigError: algo: a configuration folded by 3 cannot run \
ConvProblem(...) (it folds by 2; Note [folded first layers])
    """
    f = fold_of(problem)
    if f is None or f.s != s:
        raise UnsupportedConfigError(
            f"algo: a configuration folded by {s} cannot run {problem!r} (it folds "
            f"{'by ' + str(f.s) if f is not None else 'not at all'}; "
            "Note [folded first layers])", algo=f"{_PREFIX}{s}", reason="the problem does not fold so")
    return f


def fold_id(s: int, inner: Algo) -> str:
    """The id of inner configuration ``inner`` run folded by ``s``."""
    return f"{_PREFIX}{int(s)}{_SEP}{inner}"


def split_fold_id(algo: Any) -> tuple[int, Algo] | None:
    """(s, inner id) of a folded configuration's id; None for any other id.
    An inner id of digits comes back as an int (the NumPy backend's)."""
    return parse_rewritten_id(algo, _PREFIX)


def parse_rewritten_id(algo: Any, prefix: str) -> tuple[int, Algo] | None:
    """(factor, inner id) of a rewritten configuration's id
    ``{prefix}{factor}|{inner id}`` (a fold's, a split's); None for any other
    id. The factor is ASCII digits; an inner id of ASCII digits comes back as
    an int (the NumPy backend's).

    >>> parse_rewritten_id("split4|e30;k3=1", "split"), parse_rewritten_id("fold2|7", "fold")
    ((4, 'e30;k3=1'), (2, 7))
    >>> parse_rewritten_id("split\u00b2|0", "split"), parse_rewritten_id("fold2|\u00b2", "fold")
    (None, (2, '\xb2'))
    """
    if not isinstance(algo, str) or not algo.startswith(prefix) or _SEP not in algo:
        return None
    head, inner = algo.split(_SEP, 1)
    factor = head[len(prefix):]
    if not _ascii_digits(factor) or not inner:
        return None
    return int(factor), (int(inner) if _ascii_digits(inner) else inner)


def _ascii_digits(text: str) -> bool:
    # str.isdigit() alone also holds for digits int() refuses ("²")
    return text.isascii() and text.isdigit()


class Regions(NamedTuple):
    """Byte offsets and sizes of a rewritten call's workspace (a folded one, or
    a split one: Note [split groups] in :mod:`.split`): two regions, ``a`` and
    ``b``, each starting at a multiple of REGION_ALIGN, and the inner
    configuration's own workspace from ``inner``. What each region holds is
    the rewrite's: for a fold, ``a`` the folded x rows (forward,
    backward-filter) or the folded dx rows (backward-data), ``b`` the folded
    filter (forward, backward-data) or the folded dw (backward-filter)."""

    a: int
    a_bytes: int
    b: int
    b_bytes: int
    inner: int

    @classmethod
    def of(cls, a_bytes: int, b_bytes: int) -> "Regions":
        """``a_bytes`` at 0, then ``b_bytes``, each rounded up to REGION_ALIGN.

        >>> Regions.of(1600, 1600)
        Regions(a=0, a_bytes=1600, b=1792, b_bytes=1600, inner=3584)
        """
        return cls(0, a_bytes, _up(a_bytes), b_bytes, _up(a_bytes) + _up(b_bytes))


def _up(n: int) -> int:
    return -(-n // REGION_ALIGN) * REGION_ALIGN


def regions(fold: Fold, size: int) -> Regions:
    """The workspace regions of a folded call of ``size`` rows (every direction
    uses an ``a`` of folded x rows and a ``b`` of one folded filter).

    >>> from mucudnn.problem import ConvProblem
    >>> p = ConvProblem((256, 227, 227, 3), (96, 11, 11, 3), stride=4, layout="NHWC")
    >>> regions(fold_of(p), 2)  # 2 x 57*57*48 and 96*3*3*48 floats
    Regions(a=0, a_bytes=1247616, b=1247744, b_bytes=165888, inner=1413632)
    """
    inner = fold.inner
    a = int(size) * math.prod(inner.x_shape[1:]) * inner.itemsize
    b = math.prod(inner.w_shape) * inner.itemsize
    return Regions.of(a, b)


def folded_perfs(inner_perfs: Iterable[AlgoPerf], fold: Fold, size: int,
                 transform_ms: float) -> list[AlgoPerf]:
    """The entries of a find() for ``fold``'s problem at ``size`` rows made from
    its inner problem's: each inner configuration's id folded, its time plus
    ``transform_ms`` (the folds and unfolds of one call), its workspace plus
    the regions'."""
    extra = regions(fold, size).inner
    return [AlgoPerf(algo=fold_id(fold.s, a.algo), time_ms=a.time_ms + transform_ms,
                     workspace_bytes=a.workspace_bytes + extra, math_type=a.math_type,
                     determinism=a.determinism) for a in inner_perfs]


def transforms_of(direction: Direction) -> tuple[str, ...]:
    """The transforms one folded call of ``direction`` runs, in order."""
    return {Direction.FORWARD: ("fold_x", "fold_w"),
            Direction.BACKWARD_DATA: ("fold_w", "unfold_x"),
            Direction.BACKWARD_FILTER: ("fold_x", "unfold_w")}[Direction.parse(direction)]


# -- the transforms on host arrays (NHWC) ------------------------------------------------
def _fold(a: np.ndarray, s: int, before: tuple[int, int], after: tuple[int, int]) -> np.ndarray:
    n, h, w, c = a.shape
    a = np.pad(a, ((0, 0), (before[0], after[0]), (before[1], after[1]), (0, 0)))
    h2, w2 = a.shape[1] // s, a.shape[2] // s
    a = a.reshape(n, h2, s, w2, s, c).transpose(0, 1, 3, 2, 4, 5)
    return np.ascontiguousarray(a.reshape(n, h2, w2, s * s * c))


def _unfold(a: np.ndarray, s: int, before: tuple[int, int], after: tuple[int, int]) -> np.ndarray:
    n, h2, w2, cs = a.shape
    c = cs // (s * s)
    a = a.reshape(n, h2, w2, s, s, c).transpose(0, 1, 3, 2, 4, 5).reshape(n, h2 * s, w2 * s, c)
    return a[:, before[0]:h2 * s - after[0], before[1]:w2 * s - after[1], :]


def fold_x(fold: Fold, x: np.ndarray) -> np.ndarray:
    """x rows (m, H, W, C) folded: (m, H', W', s*s*C), a new array.

    >>> from mucudnn.problem import ConvProblem
    >>> f = fold_of(ConvProblem((1, 4, 4, 1), (1, 2, 2, 1), stride=2, layout="NHWC"))
    >>> fold_x(f, np.arange(16.0).reshape(1, 4, 4, 1))[0, 0, 0]  # the top-left 2 x 2 block
    array([0., 1., 4., 5.])
    """
    return _fold(x, fold.s, fold.pad_before, fold.pad_after)


def fold_w(fold: Fold, w: np.ndarray) -> np.ndarray:
    """The filter (K, R, S, C) folded: (K, R', S', s*s*C), a new array."""
    return _fold(w, fold.s, (0, 0), fold.filter_pad_after)


def unfold_x(fold: Fold, dx: np.ndarray) -> np.ndarray:
    """Folded dx rows back to (m, H, W, C), the padding dropped (a view)."""
    return _unfold(dx, fold.s, fold.pad_before, fold.pad_after)


def unfold_w(fold: Fold, dw: np.ndarray) -> np.ndarray:
    """A folded dw back to (K, R, S, C), the padding dropped (a view)."""
    return _unfold(dw, fold.s, (0, 0), fold.filter_pad_after)
