"""Micro-batches in pairs on two streams (Note [micro-batches in pairs]).

What every backend shares: the ids of pair configurations (:func:`pair_id`,
:func:`parse_pair_id`), which problems and directions find() pairs
(:func:`searched`, :func:`pairs`), and where a pair call keeps its two
lanes' workspace and its second partial filter gradient (:func:`lanes`).
The cuDNN graph backend issues the second lane on a stream of its own
(:mod:`.graph_bind`); the NumPy backend runs the two lanes in turn.

>>> from mucudnn.problem import ConvProblem
>>> p = ConvProblem((64, 14, 14, 1024), (1024, 3, 3, 32), padding=1, groups=32, layout="NHWC")
>>> pairs(p, Direction.BACKWARD_FILTER), pairs(p, Direction.FORWARD)
(True, False)
>>> pair_id("e30;k3=1"), pair_id("e30;k3=1", 2), parse_pair_id("pair2|e30;k3=1")
('pair|e30;k3=1', 'pair2|e30;k3=1', (2, 'e30;k3=1'))
>>> parse_pair_id("split2|e1") is None
True
>>> lanes(p, Direction.BACKWARD_FILTER, 32, 1000, 2)
Lanes(part=8, calls=2, lane=1024, scratch=2048, need=1181696)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Union

from ..errors import UnsupportedConfigError
from ..problem import ConvProblem, Direction

__all__ = ["Lanes", "CACHE_SUFFIX", "PAIR_TOP", "PAIR_CALLS", "ALIGNMENT", "cache_name",
           "searched", "pairs", "pair_id", "parse_pair_id", "divides", "lanes", "part_rows",
           "part_betas", "scratch_bytes"]

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
# pairs"). So a pair configuration (id ``pair{j}|{inner id}``, ``pair|``
# for j = 1) runs a micro-batch of 2jh rows as 2j calls of the inner
# configuration at h rows, j in turn on each of two lanes: the caller's
# stream and a stream of the backend's own, ordered after what the caller
# queued before it by an event and joined back by another, each lane with a
# workspace of its own. For backward-filter the second lane accumulates its
# partial gradient into scratch in the workspace (alpha applied, beta 0 at
# its first call) and the join adds it to dw, into which the first lane
# accumulated after its first call took the caller's alpha and beta;
# forward and backward-data calls write rows of their own. More calls a
# lane (j = 2) join fewer times a plan, where each join waits for the slower
# lane. Its workspace is both lanes and the scratch; its time is measured as
# one call, both lanes included, since two concurrent calls take neither one
# call's time nor two. find() times pairs
# only for the backward-filter of a grouped convolution that is not
# depthwise (the layers measured; depthwise ones split their groups
# instead, Note [split groups]) and only where the cap leaves out some
# configuration heuristics rank high (the limit bites) at the micro-batch or
# at twice it: a plan of micro-batches that fit the cap one at a time may
# still gain from pairs of half their size. For each j of :data:`PAIR_CALLS`
# that divides the batch it times the inner configurations that led the
# find() at h rows, at most :data:`PAIR_TOP`. The graph backend searches
# pairs only with its ``pair`` option on, off by default: in training steps
# pairs sped some grouped networks up and slowed others, whose first calls
# had timed the paired plans at or below the unpaired ones, so a pair's time
# alone does not rank it as the step does (docs/BENCHMARKS.md, "Micro-batches
# in pairs").

#: Inner configurations timed as pairs at each find() that pairs, per calls a lane.
PAIR_TOP = 2
#: The calls a lane that find() tries (j of ``pair{j}|``).
PAIR_CALLS = (1, 2)
#: Where the second lane and the scratch start in a pair's workspace (bytes).
ALIGNMENT = 256
#: See Note [candidate sets in keys]: what a backend that pairs appends to its
#: name in the keys of problems it pairs.
CACHE_SUFFIX = "+pair"
_PREFIX = "pair"


@dataclasses.dataclass(frozen=True)
class Lanes:
    """A pair call's inner calls (``part`` rows each, ``calls`` a lane) and
    workspace: lane one at 0, lane two at ``lane``, the scratch gradient at
    ``scratch`` (backward-filter; else equal to ``need``), ``need`` bytes in all."""

    part: int
    calls: int
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
            and divides(problem.batch, 1))


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


def pair_id(inner: Union[int, str], calls: int = 1) -> str:
    """The id of ``inner`` run in pairs, ``calls`` calls a lane."""
    return f"{_PREFIX}{'' if calls == 1 else int(calls)}|{inner}"


def parse_pair_id(algo: Union[int, str]) -> Optional[tuple[int, str]]:
    """(calls a lane, inner id) of a pair id; None for any other id. A pair's
    inner configuration is a plain one (no rewrite of its own)."""
    if not isinstance(algo, str) or not algo.startswith(_PREFIX):
        return None
    head, _, inner = algo.partition("|")
    digits = head[len(_PREFIX):]
    if not inner or "|" in inner or not (digits == "" or (digits.isdigit() and int(digits) >= 1)):
        raise UnsupportedConfigError(
            f"algo: expected 'pair[<calls>]|<engine config id>', got {algo!r}",
            algo=algo, reason="malformed pair id")
    return (int(digits) if digits else 1), inner


def divides(size: int, calls: int) -> bool:
    """Whether a pair of ``calls`` calls a lane runs ``size`` rows: the 2 x
    ``calls`` parts of equal rows, at least one each.

    >>> divides(32, 2), divides(6, 2), divides(0, 1)
    (True, False, False)
    """
    return size >= 2 * calls and size % (2 * calls) == 0


def part_rows(size: int, calls: int, algo: Union[int, str]) -> int:
    """The rows of each of a pair call's ``2 * calls`` inner calls at ``size``
    rows; :class:`~mucudnn.errors.UnsupportedConfigError` where ``size`` does
    not divide evenly (a plan that ran a pair at such a size was not made by
    find(), which pairs only sizes that divide).

    >>> part_rows(32, 1, "pair|e1"), part_rows(32, 2, "pair2|e1")
    (16, 8)
    """
    if not divides(size, calls):
        raise UnsupportedConfigError(
            f"algo: pair configuration {algo} runs a micro-batch of a multiple of {2 * calls} "
            f"rows, got {size} (Note [micro-batches in pairs])", algo=algo,
            reason="micro-batch does not divide")
    return size // (2 * calls)


def lanes(problem: ConvProblem, direction: Direction, size: int, inner_need: int,
          calls: int = 1, algo: Union[int, str] = "pair") -> Lanes:
    """Where a pair call of ``size`` rows of ``problem`` keeps its lanes
    (``inner_need`` bytes each: the inner configuration's at the part's rows)
    and, for backward-filter, the second lane's filter gradient."""
    part = part_rows(int(size), calls, algo)
    lane = _aligned(inner_need)
    return Lanes(part, int(calls), lane, 2 * lane, 2 * lane + scratch_bytes(problem, direction))


def scratch_bytes(problem: ConvProblem, direction: Direction) -> int:
    """Bytes of a pair call's scratch: one filter gradient for backward-filter
    (the second lane's), none for the other directions."""
    if Direction.parse(direction) is Direction.BACKWARD_FILTER:
        return math.prod(problem.w_shape) * problem.itemsize
    return 0


def part_betas(direction: Direction, calls: int, beta: float) -> tuple[list[float], list[float]]:
    """The beta of each call of lane one and lane two: backward-filter
    accumulates within each lane (lane two into its scratch, from 0);
    forward and backward-data calls each take the caller's.

    >>> part_betas(Direction.BACKWARD_FILTER, 2, 0.5)
    ([0.5, 1.0], [0.0, 1.0])
    >>> part_betas(Direction.FORWARD, 1, 0.5)
    ([0.5], [0.5])
    """
    if Direction.parse(direction) is Direction.BACKWARD_FILTER:
        return [float(beta)] + [1.0] * (calls - 1), [0.0] + [1.0] * (calls - 1)
    return [float(beta)] * calls, [float(beta)] * calls
