"""Grouped convolutions split into chunks of their groups (Note [split groups]).

This module holds what every backend shares: which factors a problem splits
by (:func:`split_factors`), which of them find() tries
(:func:`searched_factors`), and into what (:func:`split_of`), the ids of split
configurations (:func:`split_id`, :func:`parse_split_id`), where a split call
keeps its chunk copies in its workspace (:func:`regions`), the split entries
of a find() (:func:`split_perfs`), and where chunk ``i`` of each operand
starts (:func:`chunk_offsets`). The cuDNN backends copy chunks with
``cudnnTransformTensor`` (:mod:`.split_cudnn`); the NumPy backend slices.

>>> from mucudnn.problem import ConvProblem
>>> p = ConvProblem((64, 56, 56, 96), (96, 7, 7, 1), padding=3, groups=96, layout="NHWC")
>>> split_factors(p)
(2, 4, 8, 16)
>>> s = split_of(p, 4)
>>> s.chunk.x_shape, s.chunk.w_shape, s.chunk.groups
((64, 56, 56, 24), (24, 7, 7, 1), 24)
>>> split_id(4, "e30;k3=1"), parse_split_id("split4|e30;k3=1"), parse_split_id("fold2|e1")
('split4|e30;k3=1', (4, 'e30;k3=1'), None)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Union

from ..errors import UnsupportedConfigError
from ..problem import AlgoPerf, ConvProblem, Direction, channels_last
from ..problem.slice_problem import SliceProblem
from .fold import Regions, parse_rewritten_id

__all__ = ["Split", "Regions", "SPLIT_FACTORS", "FILTER_ALIGNMENT", "CACHE_SUFFIX",
           "cache_name", "split_factors", "searched_factors", "split_of", "splitting",
           "split_id", "parse_split_id", "regions", "split_perfs", "chunk_offsets",
           "copies_of", "SLICE_SUFFIX", "slice_factor", "slice_id", "parse_slice_id", "slice_of",
           "slice_perfs"]

# Note [split groups]
# ~~~~~~~~~~~~~~~~~~~
# A convolution of G groups is G independent convolutions; k consecutive
# chunks of G/k groups each are k convolutions of their own, over a slice of
# x's channels, a slice of the filter's output channels (contiguous in every
# layout) and a slice of y's channels. The engines PyTorch runs for depthwise
# backward-filter keep transformed copies of the whole of x and dy in their
# workspace (hundreds of MiB at a training batch), so under a cap they run a
# few samples a call, slower a sample than one call; a chunk of the channels
# needs 1/k of that workspace at the whole batch, and such chunks ran
# about as fast as the whole call, in one layer faster (docs/BENCHMARKS.md,
# "Splitting the groups"). A
# split configuration (id ``split{k}|{inner id}``) copies each chunk's input
# slices into packed tensors in the plan's workspace, runs the inner
# configuration of the chunk problem there (its filter slice and, for
# backward-filter, its dw slice in place), and copies a chunk's output back
# (alpha and beta applied there; backward-filter applies them in the inner
# call). Its workspace is the chunk copies' regions plus the inner
# configuration's, its time k chunks of both. find() searches splits only
# for depthwise problems (Note [which convolutions split]) where the cap
# leaves out some configuration heuristics list (the limit bites); the first
# such find() of a kernel tries every factor, later ones (other micro-batch
# sizes) only the factor that led there (Note [split at the first find] in
# graph_find.py). Any split id of a grouped problem runs, whoever found it.

# Note [which convolutions split]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Splitting pays where a layer's engines work channel by channel: depthwise
# convolutions (one input channel per group), whose engines' workspace is
# copies of x and dy and whose chunks run as fast as the whole. Grouped
# convolutions of several channels per group (ResNeXt's and RegNet's 3x3s)
# run on implicit GEMMs over the groups: their chunks ran slower than
# micro-batches of the whole, and searching their factors added planning
# time that no plan used (docs/BENCHMARKS.md, "Splitting the groups"). So
# find() searches only depthwise problems
# (:func:`searched_factors`), and only those are keyed ``+split``. It also
# leaves out a factor whose filter slices would start less aligned than
# FILTER_ALIGNMENT bytes: the chunks run in place on those slices, while
# find() times the chunk problem on aligned buffers (and cuDNN may refuse,
# or slow down, a less aligned pointer).

#: The chunk counts a split tries (those that divide the groups).
SPLIT_FACTORS = (2, 4, 8, 16)
#: find() tries only factors whose filter slices start at multiples of this
#: many bytes (the graph API's largest pointer alignment; Note [which
#: convolutions split]).
FILTER_ALIGNMENT = 16
_PREFIX = "split"
_SEP = "|"

Algo = Union[int, str]

#: See Note [candidate sets in keys]: what a backend that splits appends to its
#: name in the keys of problems that split.
CACHE_SUFFIX = "+split"
#: ... and, after it, in the keys of problems whose chunks it also times as
#: slices (:func:`slice_factor`).
SLICE_SUFFIX = "+slice"


def cache_name(name: str, problem: ConvProblem) -> str:
    """The name a backend ``name`` that splits keeps ``problem``'s measurements
    and plans under: with :data:`CACHE_SUFFIX` where find() searches
    ``problem``'s splits (:func:`searched_factors`), else ``name``.

    >>> from mucudnn.problem import ConvProblem
    >>> cache_name("cudnn-graph", ConvProblem((8, 32, 56, 56), (32, 1, 3, 3), groups=32))
    'cudnn-graph+split'
    >>> cache_name("cudnn-graph", ConvProblem((8, 32, 56, 56), (32, 4, 3, 3), groups=8))
    'cudnn-graph'
    >>> cache_name("g", ConvProblem((8, 56, 56, 32), (32, 3, 3, 1), groups=32, layout="NHWC",
    ...                             dtype="bfloat16"))
    'g+split+slice'
    """
    if not searched_factors(problem):
        return name
    sliced = slice_factor(problem, Direction.BACKWARD_FILTER) is not None
    return name + CACHE_SUFFIX + (SLICE_SUFFIX if sliced else "")


@dataclasses.dataclass(frozen=True)
class Split:
    """``problem`` split into ``k`` chunks of its groups, each the problem ``chunk``."""

    problem: ConvProblem
    chunk: ConvProblem
    k: int


def split_factors(problem: ConvProblem) -> tuple[int, ...]:
    """The factors of :data:`SPLIT_FACTORS` that ``problem``'s groups divide by.

    >>> from mucudnn.problem import ConvProblem
    >>> split_factors(ConvProblem((8, 64, 56, 56), (64, 8, 3, 3), groups=8))
    (2, 4, 8)
    >>> split_factors(ConvProblem((8, 64, 56, 56), (64, 64, 3, 3)))
    ()
    """
    g = problem.groups
    return tuple(k for k in SPLIT_FACTORS if g > 1 and g % k == 0)


def searched_factors(problem: ConvProblem) -> tuple[int, ...]:
    """The factors find() tries for ``problem`` (Note [which convolutions
    split]): those of its :func:`split_factors` whose filter slices start at
    multiples of :data:`FILTER_ALIGNMENT` bytes, where it is depthwise (one
    input channel per group); none otherwise.

    >>> from mucudnn.problem import ConvProblem
    >>> searched_factors(ConvProblem((8, 64, 56, 56), (64, 1, 3, 3), groups=64))
    (2, 4, 8, 16)
    >>> searched_factors(ConvProblem((8, 96, 56, 56), (96, 1, 7, 7), groups=96))  # 6 x 196 B
    (2, 4, 8)
    >>> searched_factors(ConvProblem((8, 64, 56, 56), (64, 8, 3, 3), groups=8))
    ()
    """
    if problem.w_dims[1] != 1:
        return ()
    per_filter = math.prod(problem.w_shape[1:]) * problem.itemsize
    return tuple(k for k in split_factors(problem)
                 if (problem.w_shape[0] // k * per_filter) % FILTER_ALIGNMENT == 0)


# Note [which slices are searched]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Chunks as slices (Note [chunks as slices] in
# mucudnn/problem/slice_problem.py) won where cuDNN's heuristics list a
# runtime-compiled engine for the slices: the backward-filter of 16-bit
# depthwise convolutions in a channels-last layout. Elsewhere they ran
# slower than packed chunks or lost the specialised engines. A slice's
# find() is a find of its own, compilations included, so find() times
# slices only there, and at one factor, the fewest chunks (the fewer calls,
# the less host time a step; on the layers probed two chunks ran faster
# than four). A slice's x and y pointers start at multiples of its chunk's
# channels, so the factor must also leave those FILTER_ALIGNMENT-aligned, as
# find() times it on aligned buffers.


def slice_factor(problem: ConvProblem, direction: Direction) -> int | None:
    """The factor find() times ``problem``'s chunks as slices at in
    ``direction`` (Note [which slices are searched]): the fewest chunks among
    its :func:`searched_factors` whose x and y slices start
    FILTER_ALIGNMENT-aligned, for the backward-filter of a 16-bit depthwise
    convolution in a channels-last layout; None elsewhere.

    >>> from mucudnn.problem import ConvProblem
    >>> p = ConvProblem((64, 14, 14, 672), (672, 5, 5, 1), stride=2, padding=2, groups=672,
    ...                 layout="NHWC", dtype="bfloat16")
    >>> slice_factor(p, Direction.BACKWARD_FILTER), slice_factor(p, Direction.FORWARD)
    (2, None)
    >>> f32 = ConvProblem((64, 14, 14, 672), (672, 5, 5, 1), stride=2, padding=2, groups=672,
    ...                   layout="NHWC")
    >>> slice_factor(f32, Direction.BACKWARD_FILTER) is None
    True
    """
    if (Direction.parse(direction) is not Direction.BACKWARD_FILTER or problem.itemsize != 2
            or not channels_last(problem.layout)):
        return None
    channels = (problem.x_dims[1], problem.y_dims[1])
    return next((k for k in searched_factors(problem)
                 if all(c // k * problem.itemsize % FILTER_ALIGNMENT == 0 for c in channels)),
                None)


def split_of(problem: ConvProblem, k: int) -> Split | None:
    """``problem`` split into ``k`` chunks of its groups (Note [split groups]);
    None where ``k`` is not one of its :func:`split_factors`."""
    if int(k) not in split_factors(problem):
        return None
    k = int(k)
    p = problem
    c_axis = p.nd + 1 if channels_last(p.layout) else 1
    x = list(p.x_shape)
    x[c_axis] //= k
    w = list(p.w_shape)
    w[0] //= k
    chunk = dataclasses.replace(p, x_shape=tuple(x), w_shape=tuple(w), groups=p.groups // k)
    return Split(p, chunk, k)


def splitting(problem: ConvProblem, k: int) -> Split:
    """``problem`` split by ``k``, for running a split id;
    :class:`~mucudnn.errors.UnsupportedConfigError` (a ValueError) where it
    does not split so.

    >>> from mucudnn.problem import ConvProblem
    >>> splitting(ConvProblem((2, 6, 9, 9), (6, 1, 3, 3), groups=6), 4)
    Traceback (most recent call last):
      ...
    mucudnn.errors.UnsupportedConfigError: algo: a configuration split into 4 chunks \
cannot run ConvProblem(...) (its 6 groups split by (2,); Note [split groups])
    """
    s = split_of(problem, k)
    if s is None:
        raise UnsupportedConfigError(
            f"algo: a configuration split into {k} chunks cannot run {problem!r} (its "
            f"{problem.groups} groups split by {split_factors(problem)}; Note [split groups])",
            algo=f"{_PREFIX}{k}", reason="the problem does not split so")
    return s


def split_id(k: int, inner: Algo) -> str:
    """The id of inner configuration ``inner`` run on ``k`` chunks of the groups."""
    return f"{_PREFIX}{int(k)}{_SEP}{inner}"


def parse_split_id(algo: Any) -> tuple[int, Algo] | None:
    """(k, inner id) of a split configuration's id; None for any other id. An
    inner id of digits comes back as an int (the NumPy backend's)."""
    return parse_rewritten_id(algo, _PREFIX)


#: The id prefix of a split run in place on slices (Note [chunks as slices]).
_SLICE_PREFIX = "slice"


def slice_id(k: int, inner: Algo) -> str:
    """The id of inner configuration ``inner`` run on ``k`` chunks of the groups
    in place, each a slice of the whole tensors (Note [chunks as slices] in
    :mod:`mucudnn.problem.slice_problem`): no copies and no regions.

    >>> slice_id(2, "e19;k2=0"), parse_slice_id("slice2|e19;k2=0"), parse_slice_id("split2|e0")
    ('slice2|e19;k2=0', (2, 'e19;k2=0'), None)
    """
    return f"{_SLICE_PREFIX}{int(k)}{_SEP}{inner}"


def parse_slice_id(algo: Any) -> tuple[int, Algo] | None:
    """(k, inner id) of a slice configuration's id; None for any other id."""
    return parse_rewritten_id(algo, _SLICE_PREFIX)


def slice_of(split: Split) -> SliceProblem:
    """``split``'s chunk problem in place: x and y slices of the whole tensors.

    >>> from mucudnn.problem import ConvProblem
    >>> p = ConvProblem((64, 14, 14, 672), (672, 5, 5, 1), stride=2, padding=2, groups=672,
    ...                 layout="NHWC", dtype="bfloat16")
    >>> s = slice_of(split_of(p, 2))
    >>> s.x_shape, s.whole_channels, s.x_strides
    ((64, 14, 14, 336), 672, (131712, 1, 9408, 672))
    """
    return SliceProblem.of(split.chunk, split.problem.x_dims[1])


def slice_perfs(inner_perfs: Iterable[AlgoPerf], split: Split) -> list[AlgoPerf]:
    """The entries of a find() for ``split``'s problem made from its slice
    problem's (:func:`slice_of`): each inner configuration's id as a slice
    configuration's, its time taken ``k`` times, its own workspace (no copies,
    no regions)."""
    return [AlgoPerf(algo=slice_id(split.k, a.algo), time_ms=split.k * a.time_ms,
                     workspace_bytes=a.workspace_bytes, math_type=a.math_type,
                     determinism=a.determinism) for a in inner_perfs]


def regions(split: Split, size: int) -> Regions:
    """The workspace regions of a split call of ``size`` rows: ``a`` holds one
    chunk of x (forward, backward-filter) or of dx (backward-data), ``b`` one
    chunk of y (forward) or of dy (backward-data, backward-filter).

    >>> from mucudnn.problem import ConvProblem
    >>> p = ConvProblem((8, 4, 5, 5), (4, 1, 3, 3), padding=1, groups=4)
    >>> regions(split_of(p, 2), 8)  # 8 x 2 x 5 x 5 floats, twice
    Regions(a=0, a_bytes=1600, b=1792, b_bytes=1600, inner=3584)
    """
    c = split.chunk.with_batch(int(size))
    a = math.prod(c.x_shape) * c.itemsize
    b = math.prod(c.output_shape) * c.itemsize
    return Regions.of(a, b)


def chunk_offsets(split: Split, i: int) -> tuple[int, int, int]:
    """Byte offsets of chunk ``i``'s first element in x, w and y (the whole
    tensors' rows start at 0).

    >>> from mucudnn.problem import ConvProblem
    >>> p = ConvProblem((8, 5, 5, 4), (4, 3, 3, 1), padding=1, groups=4, layout="NHWC")
    >>> chunk_offsets(split_of(p, 2), 1)  # 2 channels in; 2 filters of 3 x 3 x 1
    (8, 72, 8)
    >>> chunk_offsets(split_of(p.with_batch(8), 2), 1) == chunk_offsets(split_of(p, 2), 1)
    True
    """
    p, c = split.problem, split.chunk
    isz = p.itemsize
    cl = channels_last(p.layout)
    xs, ys = math.prod(p.x_dims[2:]), math.prod(p.y_dims[2:])
    cx, cy = c.x_dims[1], c.y_dims[1]
    ox = i * cx * isz * (1 if cl else xs)
    oy = i * cy * isz * (1 if cl else ys)
    ow = i * math.prod(c.w_shape) * isz
    return ox, ow, oy


def split_perfs(inner_perfs: Iterable[AlgoPerf], split: Split, size: int,
                copy_ms: float) -> list[AlgoPerf]:
    """The entries of a find() for ``split``'s problem at ``size`` rows made
    from its chunk problem's: each inner configuration's id split, its time
    and ``copy_ms`` (one chunk's copies) taken ``k`` times, its workspace plus
    the regions'."""
    extra = regions(split, size).inner
    return [AlgoPerf(algo=split_id(split.k, a.algo), time_ms=split.k * (a.time_ms + copy_ms),
                     workspace_bytes=a.workspace_bytes + extra, math_type=a.math_type,
                     determinism=a.determinism) for a in inner_perfs]


def copies_of(direction: Direction) -> tuple[str, ...]:
    """The copies one chunk of a split call of ``direction`` makes, in order:
    ``"x"``/``"y"`` into the workspace, ``"x_back"``/``"y_back"`` out of it."""
    return {Direction.FORWARD: ("x", "y_back"),
            Direction.BACKWARD_DATA: ("y", "x_back"),
            Direction.BACKWARD_FILTER: ("x", "y")}[Direction.parse(direction)]
