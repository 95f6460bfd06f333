"""Run-time fallback: a plan for the workspace that is actually free.

When a plan's workspace cannot be allocated (over the pool limit, or out of
device memory), the engine asks for a plan under what is available: WR on the
kernel's perf table (from the benchmark cache, so nothing is re-measured when
the cache is on) with the smaller limit. A zero-workspace plan always exists,
so this always yields something that runs; the result is the same convolution.
``exec`` never decides a plan itself: it asks the optimizer (or, where the
optimizer is unavailable, takes the backend's fastest zero-workspace algorithm).
"""

from __future__ import annotations

import logging
from typing import Any

from ..backends.base import Backend
from ..problem import ConvProblem, Direction, MicroBatch, Plan, make_plan
from .runner import resolve_workspace

__all__ = ["replan_under", "zero_workspace_plan"]

log = logging.getLogger("mucudnn")


def zero_workspace_plan(problem: ConvProblem, direction: Direction, backend: Backend,
                        policy: Any = None) -> Plan:
    """One undivided call with the backend's fastest algorithm needing no workspace."""
    perfs = backend.find(problem, direction, 0)
    zero = [a for a in perfs if int(a.workspace_bytes) == 0]
    if not zero:
        raise RuntimeError(
            f"no zero-workspace algorithm for {problem} {direction} on backend {backend.name}")
    a = min(zero, key=lambda e: e.time_ms)
    mb = MicroBatch(0, problem.batch, a.algo, a.math_type, 0, float(a.time_ms))
    return make_plan([mb], undivided_time_ms=float(a.time_ms), workspace_limit=0,
                     policy=policy, problem=problem, direction=direction)


def replan_under(problem: ConvProblem, direction: Direction, backend: Backend, available: int,
                 *, policy: Any = "powerOfTwo", workspace_limit: int | None = None,
                 cache: Any = None) -> Plan:
    """The best plan whose workspace fits ``available`` bytes (never fails for
    ``available >= 0``: falls back to a zero-workspace plan).

    ``workspace_limit`` is the limit the kernel was benchmarked under (its perf
    table's cap); ``cache`` is passed to the optimizer's benchmark.
    """
    available = max(0, int(available))
    # The cache serves any cap up to the one the kernel was benchmarked under.
    cap = available if workspace_limit is None else min(int(workspace_limit), available)
    try:
        from ..optimizer.benchmark import benchmark
        from ..optimizer.dp import optimize_wr
    except ImportError:
        benchmark = optimize_wr = None  # type: ignore[assignment]
    if benchmark is not None and optimize_wr is not None:
        try:
            perf = benchmark(backend, problem, direction, policy, cap, cache=cache)
            plan = optimize_wr(perf, problem.batch, cap, policy,
                               quantum=problem.batch_quantum())
            plan = resolve_workspace(plan.with_context(problem, direction), backend, direction)
            if plan.workspace_bytes <= available:
                return plan
        except (ValueError, KeyError) as exc:
            log.info("mucudnn: no WR plan under %d bytes for %s %s (%s); using a "
                     "zero-workspace plan", available, problem, direction, exc)
    return zero_workspace_plan(problem, direction, backend, policy)
