"""Statistics of interleaved rounds, for the benchmark tools and the results page.

A benchmark that alternates two sides in rounds (Note [interleaved steps] in
train_bench.py) reports per round the ratio of their median step times, and
the median of those ratios. :func:`median_interval` says how well those
rounds pin that median down; :func:`geomean` summarises ratios over models;
:func:`ratio_text` is a row's ratio as the tools print it.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

__all__ = ["geomean", "median_interval", "extra_rounds", "ratio_text", "CONFIDENCE",
           "STEP_TARGET"]

#: the confidence of the intervals the tools report
CONFIDENCE = 0.95
#: the zoo's target: converted step time at most this many times native's
STEP_TARGET = 1.02


def ratio_text(st: dict) -> str:
    """A row's converted/native ratio (``st``: a zoo row's step figures) with the
    interval of its median over the rounds (:func:`median_interval`; none with
    too few rounds) and the A/A ratio where a control side ran.

    >>> ratio_text({"ratio": 1.0161, "control_ratio": 0.9997})
    '1.016 (A/A 1.000)'
    >>> ratio_text({})
    '-'
    """
    r = "-" if st.get("ratio") is None else f"{st['ratio']:.3f}"
    iv = median_interval(st.get("round_ratios") or [])
    if iv is not None:
        r += f" [{iv[0]:.3f}, {iv[1]:.3f}]"
    return r if st.get("control_ratio") is None else f"{r} (A/A {st['control_ratio']:.3f})"


def geomean(values: Iterable[Optional[float]]) -> Optional[float]:
    """The geometric mean of the positive finite values (None when there are none).

    >>> round(geomean([1.0, 4.0, None, math.nan]), 6)
    2.0
    """
    vs = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, vs)) / len(vs)) if vs else None


# Note [interval of a median]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Round ratios of host-bound training steps spread far more widely than the
# zoo's 2% target, so a median of a dozen rounds can sit further from where
# more rounds would put it than the target allows: a ratio read against the
# target needs its uncertainty beside it. The
# interval is the distribution-free one for a median from order statistics:
# each value falls below the population median with probability 1/2, so the
# k-th smallest of n is below it with probability P(Bin(n, 1/2) >= k), and
# [x(k), x(n+1-k)] holds it with probability 1 - 2 P(Bin(n, 1/2) <= k - 1),
# whatever the distribution (no normality, no resampling: the same rounds
# give the same interval). k is the largest whose coverage is at least the
# confidence asked; below 6 rounds no 95% interval exists.
def median_interval(values: Sequence[float], confidence: float = CONFIDENCE
                    ) -> Optional[tuple[float, float, float]]:
    """(low, high, coverage): the interval of order statistics that holds the
    median of the population ``values`` are drawn from with probability
    ``coverage`` >= ``confidence`` (Note [interval of a median]); None where
    there are too few values for that confidence.

    >>> median_interval([1.0, 1.1, 0.9, 1.05, 0.95, 1.2, 0.85, 1.0, 1.02, 0.98, 1.01, 0.99])
    (0.95, 1.05, 0.961)
    >>> median_interval([1.0, 1.1, 0.9, 1.05, 0.95]) is None
    True
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: expected a probability in (0, 1), got {confidence!r}")
    xs = sorted(float(v) for v in values)
    n = len(xs)
    tail = (1 - confidence) / 2
    below = 0  # P(Bin(n, 1/2) <= k - 1), summed as k grows
    k = 0
    while k < n // 2:
        p = below + math.comb(n, k) / 2 ** n
        if p > tail:
            break
        below, k = p, k + 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k], round(1 - 2 * below, 3)


# Note [resolving a ratio]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# A GPU-bound row pins its ratio within a fraction of a percent in a dozen
# rounds; a host-bound one can leave the target inside its interval after as
# many. Rounds are spent where they decide something, in two stages: after
# the first ``rounds``, a row whose interval holds the target gets one second
# stage of as many rounds as ``seconds`` buy at the first stage's pace (at
# most ``limit``), and its ratio and interval are then read over all rounds.
# The second stage's length is fixed before it runs, not extended round by
# round until the interval clears the target: stopping at the first round
# that looks decisive would pick the noise that made it so.
def extra_rounds(ratios: Sequence[float], seconds: float, round_s: float,
                 target: float = STEP_TARGET, limit: int = 400) -> int:
    """The rounds of Note [resolving a ratio]'s second stage for a row with the
    first stage's round ``ratios``, each round having taken ``round_s``
    seconds: 0 where the interval lies wholly on one side of ``target`` (or
    ``seconds`` buys no round), else what ``seconds`` buys, up to ``limit``.

    >>> extra_rounds([1.00, 1.001, 0.999, 1.0, 1.002, 0.998, 1.0, 1.001], 60, 0.5)
    0
    >>> extra_rounds([0.9, 1.1, 1.0, 1.05, 0.95, 1.2, 0.85, 1.0], 60, 0.5)
    120
    >>> extra_rounds([0.9, 1.1, 1.0], 60, 0.5, limit=50)  # too few rounds for an interval
    50
    """
    if seconds <= 0 or round_s <= 0:
        return 0
    iv = median_interval(ratios)
    if iv is not None and not iv[0] <= target <= iv[1]:
        return 0
    return max(0, int(min(float(limit), seconds / round_s)))  # a tiny round_s: the limit
