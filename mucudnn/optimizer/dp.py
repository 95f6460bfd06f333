"""WR (workspace reuse): the best micro-batch split of one kernel under a per-kernel limit.

``t(s)`` is the fastest algorithm of micro-batch size ``s`` whose workspace fits
the limit. ``T(0) = 0``, ``T(n) = min over s <= n of T(n - s) + t(s)``: a
shortest path from node 0 to node ``batch`` in the DAG whose edge ``n -> n + s``
weighs ``t(s)``. :func:`optimize_wr` and :func:`pareto_front` (which solves WR
once per distinct workspace value) relax it with a vectorised NumPy
recurrence; ``method="networkx"`` builds the DAG with networkx and relaxes it
in topological order, the reference the tests hold the recurrence to (same
tie-breaking, so the two give identical plans). See Note [no networkx on the
planning path].

Note [no networkx on the planning path]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A converted model plans its first kernel inside its first training step, and
importing networkx (hundreds of modules) costs that step about as much as the
search of a kernel. The NumPy recurrence gives the same plan at every DAG
size, so planning never imports networkx; it stays the independent reference
the tests compare with.

Ties are broken deterministically: among splits whose times agree to a relative
1e-10, fewer micro-batches win, then a larger last step (so larger sizes tend
to come first). The plan lists its micro-batches largest first, contiguous from
offset 0. For one size, ties between algorithms go to the smaller workspace,
then to the one listed first.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..problem import AlgoPerf, MicroBatch, Plan, make_plan
from .policies import Policy, allowed_sizes, normalize_policy
from ..errors import InvalidValueError

__all__ = ["optimize_wr", "pareto_front", "best_algo"]

log = logging.getLogger("mucudnn")

Perf = Mapping[int, Sequence[AlgoPerf]]

#: Two totals within this relative distance count as a tie.
_REL_TIE = 1e-10


def _tie(m: float) -> float:
    return m + _REL_TIE * abs(m) + 1e-300


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 1:
        raise InvalidValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


def _check_limit(limit: Any) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not hasattr(limit, "__index__"):
        if isinstance(limit, float) and math.isinf(limit) and limit > 0:
            return None
        raise InvalidValueError(f"workspace_limit: expected an int >= 0 or None, got {limit!r}")
    if int(limit) < 0:
        raise InvalidValueError(f"workspace_limit: expected an int >= 0 (bytes), got {limit!r}")
    return int(limit)


def _as_perf(perf: Perf) -> dict[int, list[AlgoPerf]]:
    """Normalise keys to int and entries to AlgoPerf (tuples/lists/dicts accepted)."""
    out: dict[int, list[AlgoPerf]] = {}
    for k, entries in perf.items():
        s = int(k)
        lst = []
        for e in entries:
            if isinstance(e, AlgoPerf):
                lst.append(e)
            elif isinstance(e, Mapping):
                lst.append(AlgoPerf(**e))
            else:
                lst.append(AlgoPerf(*e))
        out[s] = lst
    return out


def best_algo(entries: Sequence[AlgoPerf], limit: int | None) -> AlgoPerf | None:
    """The fastest entry whose workspace fits ``limit`` (None = unlimited), or None.

    Ties on time go to the smaller workspace, then to the entry listed first.
    """
    best = None
    for e in entries:
        if limit is not None and e.workspace_bytes > limit:
            continue
        if not math.isfinite(e.time_ms) or e.time_ms < 0:
            continue
        if best is None or (e.time_ms, e.workspace_bytes) < (best.time_ms, best.workspace_bytes):
            best = e
    return best


# -- the two solvers ------------------------------------------------------------------

#: Up to this many usable sizes the recurrence runs on Python floats; above it,
#: on NumPy vectors (per-call overhead beats the arithmetic on short vectors).
_SCALAR_MAX_SIZES = 24


def _solve_numpy(tv: np.ndarray, batch: int, quantum: int = 1) -> list[int] | None:
    """Sizes of the best split, the last micro-batch first, or None when batch
    is unreachable.

    ``tv[s]`` is t(s) (inf where size s is unusable), length batch + 1. Every
    micro-batch but the last has a size that is a multiple of ``quantum``
    (the recurrence visits only n = multiples of quantum, and batch).
    """
    sizes = np.flatnonzero(np.isfinite(tv[1:])) + 1  # ascending
    if sizes.size == 0:
        return None
    choice: Any
    if sizes.size <= _SCALAR_MAX_SIZES:
        choice = _recur_scalar(sizes.tolist(), tv[sizes].tolist(), batch, quantum)
    else:
        choice = _recur_vector(sizes, tv[sizes], batch, quantum)
    if choice is None:
        return None
    out = []
    n = batch
    while n > 0:
        out.append(int(choice[n]))
        n -= int(choice[n])
    return out


def _recur_scalar(sizes: list[int], ts: list[float], batch: int,
                  quantum: int = 1) -> list[int] | None:
    """The recurrence on Python floats; returns choice[n] (the last step of n)."""
    inf = math.inf
    T = [inf] * (batch + 1)
    T[0] = 0.0
    cnt = [0] * (batch + 1)
    choice = [0] * (batch + 1)
    for n in range(sizes[0], batch + 1):
        if n % quantum and n != batch:
            continue  # T(n) stays inf: no micro-batch may end off the quantum
        m = inf
        for s, t in zip(sizes, ts):
            if s > n:
                break
            c = T[n - s] + t
            if c < m:
                m = c
        if m == inf:
            continue
        lim = _tie(m)
        best_s = best_c = 0
        best_v = inf
        for s, t in zip(sizes, ts):  # ascending: a later equal count is a larger size
            if s > n:
                break
            c = T[n - s] + t
            if c <= lim and (best_s == 0 or cnt[n - s] <= best_c):
                best_s, best_c, best_v = s, cnt[n - s], c
        T[n] = best_v
        cnt[n] = best_c + 1
        choice[n] = best_s
    return choice if T[batch] < inf else None


def _recur_vector(sizes: np.ndarray, tvs: np.ndarray, batch: int,
                  quantum: int = 1) -> np.ndarray | None:
    """The same recurrence on NumPy vectors over the sizes."""
    T = np.full(batch + 1, np.inf)
    T[0] = 0.0
    cnt = np.zeros(batch + 1, dtype=np.int64)
    choice = np.zeros(batch + 1, dtype=np.int64)
    ks = np.searchsorted(sizes, np.arange(batch + 1), side="right")
    for n in range(int(sizes[0]), batch + 1):
        if n % quantum and n != batch:
            continue
        k = int(ks[n])
        S = sizes[:k]
        cand = T[n - S] + tvs[:k]
        j = int(cand.argmin())
        m = cand[j]
        if not math.isfinite(m):
            continue
        near = np.flatnonzero(cand <= _tie(m))
        if near.size > 1:
            c = cnt[n - S[near]]
            near = near[c == c.min()]
            j = int(near[-1])  # the largest size among the remaining ties
        s = int(S[j])
        T[n] = cand[j]
        cnt[n] = cnt[n - s] + 1
        choice[n] = s
    return choice if math.isfinite(T[batch]) else None


def _lower(T: np.ndarray, s: int, t: float) -> None:
    """Update the best-time table ``T`` in place after t(s) fell to ``t``.

    With the old table optimal for the old times, the new optimum of n either
    uses no size-s micro-batch (then it is at least the old T(n)) or is the new
    optimum of n - s plus one size-s micro-batch: T(n) = min(T(n), T(n-s) + t),
    relaxed for n = s, s+1, ... in blocks of s (each block reads the block
    before it, already updated).
    """
    n = T.size - 1
    for k in range(s, n + 1, s):
        blk = T[k:k + s]
        np.minimum(blk, T[k - s:k - s + blk.size] + t, out=blk)


def wr_graph(tv: Mapping[int, float], batch: int, quantum: int = 1):
    """The WR DAG as a ``networkx.DiGraph``: nodes 0..batch, an edge n -> n + s
    with ``weight`` t(s) and ``size`` s for every usable size s, from every
    node n that is a multiple of ``quantum`` to one that is, or to batch."""
    import networkx as nx  # Note [heavy imports where they are used]
    g = nx.DiGraph()
    g.add_nodes_from(range(batch + 1))
    usable = sorted(s for s, t in tv.items() if math.isfinite(t) and 1 <= s <= batch)
    g.add_edges_from((n, n + s, {"weight": float(tv[s]), "size": s})
                     for s in usable for n in range(0, batch + 1 - s, quantum)
                     if (n + s) % quantum == 0 or n + s == batch)
    return g


def _solve_networkx(tv: np.ndarray, batch: int, quantum: int = 1) -> list[int] | None:
    """Shortest path 0 -> batch over the networkx DAG, relaxed in topological order."""
    import networkx as nx  # Note [heavy imports where they are used]
    g = wr_graph({s: float(tv[s]) for s in range(1, batch + 1)}, batch, quantum)
    INF = math.inf
    T = {0: 0.0}
    cnt = {0: 0}
    choice: dict[int, int] = {}
    for v in nx.topological_sort(g):
        if v == 0:
            continue
        cands = [(T[u] + d["weight"], cnt[u] + 1, d["size"])
                 for u, d in g.pred[v].items() if u in T]
        if not cands:
            continue
        m = min(c[0] for c in cands)
        if not math.isfinite(m):
            continue
        near = [c for c in cands if c[0] <= _tie(m)]
        cmin = min(c[1] for c in near)
        best = max((c for c in near if c[1] == cmin), key=lambda c: c[2])
        T[v], cnt[v], choice[v] = best
    if T.get(batch, INF) == INF:
        return None
    out = []
    n = batch
    while n > 0:
        out.append(choice[n])
        n -= choice[n]
    return out


_SOLVERS = {"numpy": _solve_numpy, "networkx": _solve_networkx}


def _no_plan_message(perf: dict[int, list[AlgoPerf]], sizes: list[int], batch: int,
                     limit: int | None, policy: Any) -> str:
    if not sizes:
        return (f"no plan: the perf table has no size allowed by policy {policy!r} for "
                f"batch {batch} (table sizes: {sorted(perf)[:20]})")
    mins = {s: min((e.workspace_bytes for e in perf[s]), default=None) for s in sizes}
    shown = ", ".join(f"{s}: {m}" for s, m in list(mins.items())[:12])
    return (f"no plan for batch {batch} under workspace_limit={limit} bytes with policy "
            f"{policy!r}: the sizes that fit cannot make up {batch}. Smallest workspace "
            f"per size (bytes): {shown}. Raise the limit or allow smaller sizes.")


def _build_plan(split: list[int], choice: dict[int, AlgoPerf], undivided: float,
                limit: int | None, policy: Policy, quantum: int = 1) -> Plan:
    # Largest first, except that a size off the quantum (at most one: the
    # solver's last step) stays last, so that every offset is on the quantum.
    order = sorted((s for s in split if s % quantum == 0), reverse=True)
    order += [s for s in split if s % quantum]
    mbs = []
    off = 0
    for s in order:
        a = choice[s]
        mbs.append(MicroBatch(offset=off, size=s, algo=a.algo, math_type=a.math_type,
                              workspace_bytes=int(a.workspace_bytes), time_ms=float(a.time_ms)))
        off += s
    return make_plan(mbs, undivided_time_ms=undivided, workspace_limit=limit, policy=policy)


def _tvec(choice: dict[int, AlgoPerf], batch: int) -> np.ndarray:
    tv = np.full(batch + 1, np.inf)
    for s, a in choice.items():
        tv[s] = a.time_ms
    return tv


def optimize_wr(perf: Perf, batch: int, workspace_limit: int | None,
                policy: Policy = "all", *, method: str = "auto",
                quantum: int = 1) -> Plan:
    """The fastest micro-batch plan of one kernel under a per-kernel workspace limit.

    ``perf`` maps micro-batch size -> the algorithms measured at that size
    (:class:`AlgoPerf`; every algorithm that ran, with its workspace). Only
    sizes allowed by ``policy`` (see :func:`allowed_sizes`) *and* present in
    ``perf`` are used. ``workspace_limit`` is in bytes (None: unlimited).

    ``quantum`` (samples): every micro-batch but the last has a size that is
    a multiple of it, so that every offset is (pass
    ``ConvProblem.batch_quantum()`` to keep the micro-batches' pointers
    aligned). When no plan fits the limit that way, the best plan without
    the constraint is returned.

    Returns a :class:`Plan` with ``problem=None``, ``direction=None``,
    micro-batches largest first (a size off the quantum last) and contiguous
    from offset 0, ``time_ms`` the sum and ``workspace_bytes`` the max of the
    micro-batches', and ``undivided_time_ms`` the best single call of size
    ``batch`` under the same limit (``inf`` if none fits). ``method`` is
    "networkx" (shortest path over the DAG, the reference), "numpy" (the
    same recurrence, vectorised; the same plan, tie-breaking included) or
    "auto" (numpy: Note [no networkx on the planning path]).

    Raises ValueError when no combination of sizes fits the limit.

    >>> from mucudnn.problem import AlgoPerf
    >>> perf = {4: [AlgoPerf(1, 1.0, 100), AlgoPerf(0, 8.0, 0)],
    ...         2: [AlgoPerf(1, 0.6, 50), AlgoPerf(0, 4.0, 0)]}
    >>> optimize_wr(perf, batch=4, workspace_limit=64, policy="powerOfTwo").describe()
    '2 x 2'
    """
    policy = normalize_policy(policy)  # a one-shot iterable is read once
    batch = _positive_int("batch", batch)
    limit = _check_limit(workspace_limit)
    q = _positive_int("quantum", quantum)
    if method not in _SOLVERS and method != "auto":
        raise InvalidValueError(f"method: expected one of {list(_SOLVERS) + ['auto']}, got {method!r}")
    table = _as_perf(perf)
    sizes = allowed_sizes(policy, batch, table)
    pol = normalize_policy(policy)
    if method == "auto":  # Note [no networkx on the planning path]
        method = "numpy"
    choice = {}
    for s in sizes:
        a = best_algo(table[s], limit)
        if a is not None:
            choice[s] = a
    und = best_algo(table.get(batch, ()), limit)
    undivided = und.time_ms if und is not None else math.inf
    solver = _SOLVERS[method]
    split = solver(_tvec(choice, batch), batch, q) if choice else None
    if split is None and choice and q > 1:
        log.info("no plan for batch %d under %s bytes keeps micro-batch offsets on "
                 "multiples of %d samples; planning without that constraint",
                 batch, limit, q)
        q = 1
        split = solver(_tvec(choice, batch), batch, q)
    if split is None:
        raise InvalidValueError(_no_plan_message(table, sizes, batch, limit, policy))
    return _build_plan(split, choice, undivided, limit, pol, q)


def pareto_front(perf: Perf, batch: int, policy: Policy = "all", *,
                 method: str = "numpy", quantum: int = 1) -> list[Plan]:
    """Every Pareto-optimal plan of one kernel in (time, workspace).

    WR is solved at every distinct workspace value occurring in ``perf`` (for
    the sizes the policy allows); the plans not dominated are returned in
    ascending workspace with strictly decreasing time. Each plan's
    ``workspace_limit`` is the limit it was solved under, which equals its
    ``workspace_bytes``. The first plan is the best zero-workspace plan where
    one exists; the last is the unlimited optimum. ``quantum`` is as in
    :func:`optimize_wr` (when no plan at all keeps to it, the front is that
    of plans without the constraint).

    Raises ValueError when no plan exists at any limit.
    """
    policy = normalize_policy(policy)  # a one-shot iterable is read once
    batch = _positive_int("batch", batch)
    q = _positive_int("quantum", quantum)
    if method not in _SOLVERS:
        raise InvalidValueError(f"method: expected one of {list(_SOLVERS)}, got {method!r}")
    table = _as_perf(perf)
    sizes = allowed_sizes(policy, batch, table)
    pol = normalize_policy(policy)
    entries = sorted(
        ((int(e.workspace_bytes), s, i, e) for s in sizes for i, e in enumerate(table[s])
         if math.isfinite(e.time_ms) and e.time_ms >= 0),
        key=lambda r: (r[0], r[1], r[2]))
    und_entries = table.get(batch, [])
    choice: dict[int, AlgoPerf] = {}
    front: list[Plan] = []
    solver = _SOLVERS[method]
    # Note: the sweep keeps Tq(m), the best time of m * q samples from sizes
    # on the quantum seen so far, up to date incrementally (_lower), and from
    # it the best time of the batch (a last step of any size that lands on
    # it). The exact solver, which breaks ties and returns the split, runs
    # only where that time beats the front. On the 'all' policy (256 sizes,
    # ~1000 workspace values) that is the difference between seconds and
    # milliseconds per kernel.
    Tq = np.full(batch // q + 1, np.inf)
    Tq[0] = 0.0
    tv = np.full(batch + 1, np.inf)
    last = np.arange(batch % q or q, batch + 1, q)  # sizes a last step can have
    i = 0
    while i < len(entries):
        limit = entries[i][0]
        changed: set[int] = set()
        while i < len(entries) and entries[i][0] == limit:
            _, s, _, e = entries[i]
            cur = choice.get(s)
            if cur is None or e.time_ms < cur.time_ms:
                choice[s] = e
                changed.add(s)
            i += 1
        if not changed:
            continue
        for s in sorted(changed):
            tv[s] = choice[s].time_ms
            if s % q == 0:
                _lower(Tq, s // q, tv[s])
        best = float(np.min(Tq[(batch - last) // q] + tv[last]))
        if not math.isfinite(best):
            continue
        # Half the tie tolerance: the exact total may differ from T in the last
        # bits, and a plan within the tolerance is not appended anyway.
        if front and best >= front[-1].time_ms * (1 - _REL_TIE / 2):
            continue
        split = solver(tv, batch, q)
        if split is None:
            continue
        und = best_algo(und_entries, limit)
        plan = _build_plan(split, choice, und.time_ms if und is not None else math.inf,
                           limit, pol, q)
        if not front or plan.time_ms < front[-1].time_ms * (1 - _REL_TIE):
            if front and plan.workspace_bytes <= front[-1].workspace_bytes:
                front.pop()  # cannot happen for exact WR; guards float ties
            front.append(plan)
    if not front and q > 1 and entries:
        log.info("no plan for batch %d keeps micro-batch offsets on multiples of %d "
                 "samples; the front is that of plans without the constraint", batch, q)
        return pareto_front(table, batch, pol, method=method)
    if not front:
        raise InvalidValueError(_no_plan_message(table, sizes, batch, None, policy))
    return front
