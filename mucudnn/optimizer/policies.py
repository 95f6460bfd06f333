"""Batch-size policies: which micro-batch sizes are benchmarked and may be used.

>>> batch_sizes("powerOfTwo", 100)
[100, 64, 32, 16, 8, 4, 2, 1]
>>> batch_sizes("undivided", 100)
[100]
>>> batch_sizes([32, 48, 500], 100)
[100, 48, 32]
>>> batch_sizes("fitted", 100)  # and, per kernel, its fitted sizes (Note [fitted sizes])
[100, 64, 32, 16, 8, 4, 2, 1]
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence, Union

from ..problem import AlgoPerf
from ..typing_aliases import PolicyLike
from ..errors import InvalidValueError

#: The named policies (matched case-insensitively; "_" and "-" ignored).
POLICIES = ("all", "powerOfTwo", "fitted", "undivided")

#: The policy every planning entry point uses unless told otherwise: powerOfTwo's
#: sizes and each kernel's fitted ones (Note [fitted sizes]).
DEFAULT_POLICY = "fitted"

#: What ``policy=`` accepts (:data:`mucudnn.typing_aliases.PolicyLike`).
Policy = PolicyLike

#: The most micro-batch sizes one kernel may benchmark (Note [bounded size lists]).
MAX_SIZES = 4096
#: The largest batch a plan is made for (Note [bounded size lists]).
MAX_BATCH = 1 << 20

# Note [bounded size lists]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# Every size a policy lists is benchmarked (a find of every algorithm), and a
# plan is solved over every batch size up to the batch (tables of batch + 1
# entries, a loop over them: optimizer/dp.py), so both are bounded before any
# work: "all" at a batch of 10**8 built 10**8 sizes and failed with a
# MemoryError after most of a minute, and a batch of 2**31 allocated 16 GiB of
# tables under any policy. A policy listing more than MAX_SIZES sizes, or a
# batch above MAX_BATCH (a million samples: tables of 8 MiB each), is refused
# at once with what to do instead; "powerOfTwo" and "fitted" list about log2(n)
# sizes.

_ALIASES = {"all": "all", "poweroftwo": "powerOfTwo", "pow2": "powerOfTwo",
            "fitted": "fitted", "undivided": "undivided"}


def policy_name(policy: Any) -> str | None:
    """The canonical name of a named policy, or None for an explicit list of sizes.

    Raises ValueError for a string that names no policy.
    """
    if isinstance(policy, str):
        key = policy.replace("_", "").replace("-", "").lower()
        if key in _ALIASES:
            return _ALIASES[key]
        raise InvalidValueError(
            f"policy: expected one of {list(POLICIES)} or an iterable of positive batch "
            f"sizes, got {policy!r}")
    return None


def normalize_policy(policy: Policy) -> Union[str, tuple[int, ...]]:
    """A hashable, JSON-friendly form of ``policy``: the canonical name, or the
    explicit sizes as a tuple sorted descending (n not added; see batch_sizes)."""
    name = policy_name(policy)
    if name is not None:
        return name
    return tuple(sorted(set(_explicit_sizes(policy)), reverse=True))


def _explicit_sizes(policy: Any) -> list[int]:
    try:
        items = list(policy)
    except TypeError:
        raise InvalidValueError(
            f"policy: expected one of {list(POLICIES)} or an iterable of positive batch "
            f"sizes, got {policy!r}") from None
    sizes = []
    for v in items:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise InvalidValueError(f"policy: explicit batch sizes must be ints, got {v!r} in {policy!r}")
        if int(v) < 1:
            raise InvalidValueError(f"policy: explicit batch sizes must be positive, got {v!r}")
        sizes.append(int(v))
    return sizes


def batch_sizes(policy: Policy, n: int) -> list[int]:
    """The micro-batch sizes ``policy`` allows for a mini-batch of ``n``, largest first.

    - ``"all"``: every size 1..n (n at most :data:`MAX_SIZES`);
    - ``"powerOfTwo"``: 1, 2, 4, ... up to n, plus n itself;
    - ``"fitted"``: powerOfTwo's sizes; :func:`~mucudnn.optimizer.benchmark`
      adds each kernel's fitted sizes (Note [fitted sizes]);
    - ``"undivided"``: n only;
    - an explicit iterable of positive ints: those <= n, **plus n itself**
      (always, so that the undivided call is a candidate and a plan can
      always be formed from sizes that tile n; sizes above n are dropped).

    Anything else raises ValueError listing the valid policies, and so does a
    policy that lists more than :data:`MAX_SIZES` sizes (Note [bounded size lists]).
    """
    n = check_batch(n)
    name = policy_name(policy)
    if name == "all":
        _check_count(n, policy, n)
        sizes = set(range(1, n + 1))
    elif name in ("powerOfTwo", "fitted"):
        sizes = {n}
        s = 1
        while s <= n:
            sizes.add(s)
            s *= 2
    elif name == "undivided":
        sizes = {n}
    else:
        sizes = {s for s in _explicit_sizes(policy) if s <= n} | {n}
        _check_count(len(sizes), policy, n)
    return sorted(sizes, reverse=True)


def check_batch(n: Any) -> int:
    """A batch a plan can be made for: an int in [1, MAX_BATCH] (Note [bounded
    size lists]); InvalidValueError naming ``n`` otherwise."""
    if isinstance(n, bool) or not hasattr(n, "__index__") or int(n) < 1:
        raise InvalidValueError(f"n: expected a positive batch size, got {n!r}")
    if int(n) > MAX_BATCH:
        raise InvalidValueError(
            f"batch: {int(n)} samples are over the {MAX_BATCH} a plan is made for "
            "(Note [bounded size lists]); plan a part of it (with_batch) and run the parts")
    return int(n)


def _check_count(count: int, policy: Any, n: int) -> None:
    """See Note [bounded size lists]: refuse a policy that lists too many sizes."""
    if count > MAX_SIZES:
        what = "'all'" if isinstance(policy, str) else "the explicit list"
        raise InvalidValueError(
            f"policy: {what} lists {count} sizes for a batch of {n}, over the {MAX_SIZES} "
            "one kernel may benchmark (Note [bounded size lists]); use 'fitted' (the "
            "default), 'powerOfTwo' or a shorter list")


def allowed_sizes(policy: Policy, n: int, measured: Iterable[int]) -> list[int]:
    """The ``measured`` sizes a plan for a mini-batch of ``n`` may use under
    ``policy``, largest first: those :func:`batch_sizes` lists, and for
    ``"fitted"`` every measured size up to ``n`` (its fitted sizes differ per
    kernel; Note [fitted sizes]).

    >>> allowed_sizes("powerOfTwo", 100, [100, 64, 36, 32])
    [100, 64, 32]
    >>> allowed_sizes("fitted", 100, [100, 64, 36, 32, 200])
    [100, 64, 36, 32]
    """
    have = set(measured)
    n = check_batch(n)
    if policy_name(policy) == "fitted":
        return sorted((s for s in have if 1 <= s <= int(n)), reverse=True)
    return [s for s in batch_sizes(policy, n) if s in have]


# Note [fitted sizes]
# ~~~~~~~~~~~~~~~~~~~
# Under a per-kernel limit the fastest configurations of the big backward
# passes often need workspace in proportion to the batch, and powerOfTwo runs
# them at the largest power of two that fits, which can be far below what
# fits (32 samples where 36 fit): the calls per batch, and so the time, grow
# by up to the ratio. Timing every size (``"all"``) finds such sizes at many
# times powerOfTwo's cost. ``"fitted"`` times at most FIT_MOST more sizes per
# kernel: at each measured size whose best configuration within the limit is
# within FIT_MARGIN of the best time per sample, that configuration stretched
# to the limit (workspace taken as proportional to the batch; a multiple of
# the alignment quantum), where that lies between the size and the next larger
# measured one; then the sizes each one's remainder needs. It is computed from
# the measurements alone, so a warm run finds the same sizes in the cache; a
# plan may use any size measured (:func:`allowed_sizes`). Where each size is
# its own benchmark (several devices with a ``benchmark_cap`` over the limit)
# no fitted size is added.

#: "fitted": stretch the best configurations of sizes this close to the best
#: time per sample (Note [fitted sizes])
FIT_MARGIN = 0.10
#: "fitted": at most this many fitted sizes per kernel
FIT_MOST = 2


def fitted_sizes(results: Mapping[int, Sequence[AlgoPerf]], n: int, limit: int,
                 quantum: int = 1, margin: float = FIT_MARGIN,
                 most: int = FIT_MOST) -> list[int]:
    """See Note [fitted sizes]: the sizes (multiples of ``quantum``) to which the
    best configurations of ``results`` (``{size: [AlgoPerf, ...]}``) stretch
    under ``limit``, best time per sample first, at most ``most``.

    The best time per sample is at 32 (2.0 ms, 55 MiB): 37 samples would fit
    64 MiB, so 36 on a quantum of 4; 16's best is 10% slower a sample and
    would fit 30:

    >>> from mucudnn.problem import AlgoPerf
    >>> MiB = 1 << 20
    >>> r = {256: [AlgoPerf(9, 40.0, 0)], 64: [AlgoPerf(2, 8.0, 20 * MiB)],
    ...      32: [AlgoPerf(1, 2.0, 55 * MiB), AlgoPerf(2, 4.1, 10 * MiB)],
    ...      16: [AlgoPerf(1, 1.1, 34 * MiB)]}
    >>> fitted_sizes(r, 256, 64 * MiB, quantum=4)
    [36, 28]
    >>> fitted_sizes(r, 256, 34 * MiB)  # 32's best does not fit: 16's fills it
    []
    """
    per_sample: dict[int, tuple[float, AlgoPerf]] = {}
    for s, rs in results.items():
        ok = [r for r in rs if r.workspace_bytes <= limit and math.isfinite(r.time_ms)]
        if ok and 1 <= s <= n:
            best = min(ok, key=lambda r: (r.time_ms, r.workspace_bytes))
            per_sample[s] = (best.time_ms / s, best)
    if not per_sample:
        return []
    top = min(t for t, _ in per_sample.values())
    q = max(1, int(quantum))
    ranked: list[tuple[float, int]] = []
    for s, (t, best) in per_sample.items():
        ws = int(best.workspace_bytes)
        larger = [x for x in results if x > s]
        if ws <= 0 or not larger or t > (1 + margin) * top:
            continue
        reach = s * int(limit) // ws
        if reach >= min(larger):
            continue
        fitted = reach - reach % q if reach >= q else reach
        if fitted > s and fitted not in results:
            ranked.append((t, fitted))
    out: list[int] = []
    for _, f in sorted(ranked):
        if f not in out and len(out) < most:
            out.append(f)
    return out
