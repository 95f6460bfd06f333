"""Batch-size policies: which micro-batch sizes are benchmarked and may be used.

>>> batch_sizes("powerOfTwo", 100)
[100, 64, 32, 16, 8, 4, 2, 1]
>>> batch_sizes("undivided", 100)
[100]
>>> batch_sizes([32, 48, 500], 100)
[100, 48, 32]
"""

from __future__ import annotations

from typing import Any, Iterable, Union

#: The named policies (matched case-insensitively; "_" and "-" ignored).
POLICIES = ("all", "powerOfTwo", "undivided")

Policy = Union[str, Iterable[int]]

_ALIASES = {"all": "all", "poweroftwo": "powerOfTwo", "pow2": "powerOfTwo",
            "undivided": "undivided"}


def policy_name(policy: Any) -> str | None:
    """The canonical name of a named policy, or None for an explicit list of sizes.

    Raises ValueError for a string that names no policy.
    """
    if isinstance(policy, str):
        key = policy.replace("_", "").replace("-", "").lower()
        if key in _ALIASES:
            return _ALIASES[key]
        raise ValueError(
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
        raise ValueError(
            f"policy: expected one of {list(POLICIES)} or an iterable of positive batch "
            f"sizes, got {policy!r}") from None
    sizes = []
    for v in items:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise ValueError(f"policy: explicit batch sizes must be ints, got {v!r} in {policy!r}")
        if int(v) < 1:
            raise ValueError(f"policy: explicit batch sizes must be positive, got {v!r}")
        sizes.append(int(v))
    return sizes


def batch_sizes(policy: Policy, n: int) -> list[int]:
    """The micro-batch sizes ``policy`` allows for a mini-batch of ``n``, largest first.

    - ``"all"``: every size 1..n;
    - ``"powerOfTwo"``: 1, 2, 4, ... up to n, plus n itself;
    - ``"undivided"``: n only;
    - an explicit iterable of positive ints: those <= n, **plus n itself**
      (always, so that the undivided call is a candidate and a plan can
      always be formed from sizes that tile n; sizes above n are dropped).

    Anything else raises ValueError listing the valid policies.
    """
    if isinstance(n, bool) or not hasattr(n, "__index__") or int(n) < 1:
        raise ValueError(f"n: expected a positive batch size, got {n!r}")
    n = int(n)
    name = policy_name(policy)
    if name == "all":
        sizes = set(range(1, n + 1))
    elif name == "powerOfTwo":
        sizes = {n}
        s = 1
        while s <= n:
            sizes.add(s)
            s *= 2
    elif name == "undivided":
        sizes = {n}
    else:
        sizes = {s for s in _explicit_sizes(policy) if s <= n} | {n}
    return sorted(sizes, reverse=True)
