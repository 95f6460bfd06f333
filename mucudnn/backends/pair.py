"""Micro-batches in pairs on two streams (Note [micro-batches in pairs]).

What every backend shares: the ids of pair configurations (:func:`pair_id`,
:func:`parse_pair_id`), which problems and directions find() pairs
(:func:`searched`, :func:`pairs`), and where a pair call keeps its two
lanes' workspace and its second partial filter gradient (:func:`lanes`).
The cuDNN graph backend issues the second lane on a stream of its own
(:mod:`.graph_bind`); the NumPy backend runs the two halves in turn.

>>> from mucudnn.problem import ConvProblem
>>> p = ConvProblem((64, 14, 14, 1024), (1024, 3, 3, 32), padding=1, groups=32, layout="NHWC")
>>> pairs(p, Direction.BACKWARD_FILTER), pairs(p, Direction.FORWARD)
(True, False)
>>> pair_id("e30;k3=1"), parse_pair_id("pair|e30;k3=1"), parse_pair_id("split2|e1")
('pair|e30;k3=1', 'e30;k3=1', None)
>>> lanes(p, Direction.BACKWARD_FILTER, 32, 1000)
Lanes(half=16, lane=1024, scratch=2048, need=1181696)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Union

from ..errors import UnsupportedConfigError
from ..problem import ConvProblem, Direction

__all__ = ["Lanes", "CACHE_SUFFIX", "PAIR_TOP", "ALIGNMENT", "cache_name", "searched", "pairs",
           "pair_id", "parse_pair_id", "lanes", "halves"]

# Note [micro-batches in pairs]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Under a workspace cap a layer whose fastest engine needs more than the cap
# at the whole batch runs micro-batches, and a small micro-batch often fills
# the GPU badly: the grouped 3x3 backward-filters of ResNeXt and RegNet run
# implicit GEMMs over a few groups of few channels, whose blocks at 16 or 32
# rows leave much of the machine idle, so a plan of such micro-batches runs
# slower a sample than the whole batch. Two such calls at once fill it: two
# streams of quarter-batch calls ran about as fast as one whole-batch call, in
# a quarter of its workspace each (docs/BENCHMARKS.md, "Micro-batches in
# pairs"). So a pair configuration (id ``pair|{inner id}``) runs a
# micro-batch of 2h rows as two calls of the inner configuration at h rows,
# the first on the caller's stream and the second on a stream of the
# backend's own, ordered after what the caller queued before it by an event
# and joined back by another, each with a workspace lane of its own. For
# backward-filter the second call writes its partial gradient into scratch
# in the workspace (alpha applied, beta 0) and the join adds it to dw, whose
# own call took the caller's alpha and beta; forward and backward-data
# halves write rows of their own. Its workspace is both lanes and the
# scratch; its time is measured as one call, both lanes included, since two
# concurrent calls take neither one call's time nor two. find() times pairs
# only for the backward-filter of a grouped convolution that is not
# depthwise (the layers measured; depthwise ones split their groups
# instead, Note [split groups]) and only where the cap leaves out some
# configuration heuristics rank high (the limit bites) at the micro-batch or
# at twice it: a plan of micro-batches that fit the cap one at a time may
# still gain from pairs of half their size. It times the inner
# configurations that led the half-size find(), at most :data:`PAIR_TOP`.

#: Inner configurations timed as pairs at each find() that pairs.
PAIR_TOP = 2
#: Where the second lane and the scratch start in a pair's workspace (bytes).
ALIGNMENT = 256
#: See Note [candidate sets in keys]: what a backend that pairs appends to its
#: name in the keys of problems it pairs.
CACHE_SUFFIX = "+pair"
_PREFIX = "pair|"


@dataclasses.dataclass(frozen=True)
class Lanes:
    """A pair call's halves (``half`` rows each) and workspace: lane one at 0,
    lane two at ``lane``, the scratch gradient at ``scratch`` (backward-filter;
    else equal to ``need``'s lanes), ``need`` bytes in all."""

    half: int
    lane: int
    scratch: int
    need: int


def _aligned(n: int) -> int:
    return -(-int(n) // ALIGNMENT) * ALIGNMENT


def searched(problem: ConvProblem) -> bool:
    """Whether find() may pair ``problem`` (in some direction): a grouped
    convolution of more than one input channel per group (Note [micro-batches
    in pairs]).

    >>> from mucudnn.problem import ConvProblem
    >>> searched(ConvProblem((8, 64, 56, 56), (64, 8, 3, 3), groups=8))
    True
    >>> searched(ConvProblem((8, 64, 56, 56), (64, 1, 3, 3), groups=64))  # depthwise
    False
    >>> searched(ConvProblem((8, 64, 56, 56), (64, 64, 3, 3)))
    False
    """
    return problem.groups > 1 and problem.w_dims[1] > 1


def pairs(problem: ConvProblem, direction: Direction) -> bool:
    """Whether find() times pairs of ``problem`` in ``direction`` at its own
    batch: :func:`searched`, backward-filter, and a batch of two or more rows
    that halves evenly."""
    return (Direction.parse(direction) is Direction.BACKWARD_FILTER and searched(problem)
            and problem.batch >= 2 and problem.batch % 2 == 0)


def cache_name(name: str, problem: ConvProblem) -> str:
    """The name a backend ``name`` that pairs keeps ``problem``'s measurements
    and plans under: with :data:`CACHE_SUFFIX` where find() may pair it.

    >>> from mucudnn.problem import ConvProblem
    >>> cache_name("g", ConvProblem((8, 64, 56, 56), (64, 8, 3, 3), groups=8))
    'g+pair'
    >>> cache_name("g", ConvProblem((8, 64, 56, 56), (64, 64, 3, 3)))
    'g'
    """
    return name + CACHE_SUFFIX if searched(problem) else name


def pair_id(inner: Union[int, str]) -> str:
    """The id of ``inner`` run in pairs."""
    return f"{_PREFIX}{inner}"


def parse_pair_id(algo: Union[int, str]) -> Optional[str]:
    """The inner id of a pair id; None for any other id. A pair's inner
    configuration is a plain one (no rewrite of its own)."""
    if not isinstance(algo, str) or not algo.startswith(_PREFIX):
        return None
    inner = algo[len(_PREFIX):]
    if not inner or "|" in inner:
        raise UnsupportedConfigError(f"algo: expected 'pair|<engine config id>', got {algo!r}",
                                     algo=algo, reason="malformed pair id")
    return inner


def halves(size: int, algo: Union[int, str]) -> int:
    """The rows of each half of a pair call of ``size`` rows;
    :class:`~mucudnn.errors.UnsupportedConfigError` where ``size`` does not
    halve evenly (a plan that ran a pair at such a size was not made by
    find(), which pairs only even sizes).

    >>> halves(32, "pair|e1")
    16
    """
    if size < 2 or size % 2:
        raise UnsupportedConfigError(
            f"algo: pair configuration {algo} runs an even micro-batch of 2 or more rows, "
            f"got {size} (Note [micro-batches in pairs])", algo=algo, reason="odd micro-batch")
    return size // 2


def lanes(problem: ConvProblem, direction: Direction, size: int, inner_need: int,
          algo: Union[int, str] = "pair") -> Lanes:
    """Where a pair call of ``size`` rows of ``problem`` keeps its lanes
    (``inner_need`` bytes each: the inner configuration's at half the rows)
    and, for backward-filter, the second half's filter gradient."""
    half = halves(int(size), algo)
    lane = _aligned(inner_need)
    wgrad = Direction.parse(direction) is Direction.BACKWARD_FILTER
    dw = math.prod(problem.w_shape) * problem.itemsize if wgrad else 0
    return Lanes(half, lane, 2 * lane, 2 * lane + dw)
