"""The optimizer's front door: ``optimize`` (one kernel, WR) and ``optimize_network`` (WD).

Both benchmark through the cache first (see :mod:`.benchmark`), then solve,
and log one INFO line per kernel on the ``mucudnn`` logger: the candidates,
the chosen micro-batches, the predicted time and speedup over the best
undivided call under the same limit, the workspace used / limit, and the time
spent benchmarking and solving.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, Hashable, Iterable, Mapping, TypeVar

from ..errors import InvalidValueError
from ..problem import ConvProblem, Direction, Plan
from ..units import format_bytes, parse_bytes
from .benchmark import benchmark, check_deterministic, resolve_backend, resolve_cache
from .dp import optimize_wr, pareto_front
from .ilp import optimize_wd
from .policies import Policy, batch_sizes, normalize_policy

__all__ = ["optimize", "optimize_network", "plan_jointly", "DEFAULT_WORKSPACE_LIMIT"]

log = logging.getLogger("mucudnn")

#: The default per-kernel workspace limit (64 MiB).
DEFAULT_WORKSPACE_LIMIT = 64 << 20
ALL_DIRECTIONS = (Direction.FORWARD, Direction.BACKWARD_DATA, Direction.BACKWARD_FILTER)


_mib = format_bytes


def _algos(plan: Plan) -> str:
    algos = []
    for m in plan.micro_batches:
        a = str(int(m.algo)) if isinstance(m.algo, int) else str(m.algo)
        if a not in algos:
            algos.append(a)
    return ("algo " if len(algos) == 1 else "algos ") + ", ".join(algos)


def _log_plan(name: str, plan: Plan, perf: Mapping[int, list], limit: int | None,
              bench_s: float, solve_s: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    n_cand = sum(len(v) for v in perf.values())
    und = plan.undivided_time_ms
    speed = f"{plan.speedup:.2f}x over undivided {und:.3f} ms" if math.isfinite(und) \
        else "no undivided call fits"
    log.info("%s: %d candidates over %d sizes; plan %s, %s; predicted %.3f ms (%s); "
             "workspace %s / %s; benchmark %.2f s, solve %.3f s",
             name, n_cand, len(perf), plan.describe(), _algos(plan), plan.time_ms, speed,
             _mib(plan.workspace_bytes), _mib(limit), bench_s, solve_s)


def _check_bytes(name: str, v: Any) -> int:
    """A byte count argument (int or size string), checked as everywhere else."""
    return parse_bytes(v, name)


R = TypeVar("R")


def _solve(solver: Callable[..., R], deterministic: bool, *args: Any, **kw: Any) -> R:
    """``solver(*args, **kw)``; when only deterministic configurations were
    allowed, its "no plan" ValueError says so (an InvalidValueError, a
    ValueError, naming ``deterministic``; Note [deterministic plans])."""
    try:
        return solver(*args, **kw)
    except ValueError as exc:
        if deterministic:
            raise InvalidValueError(f"{exc} (deterministic=True: the configurations cuDNN "
                                    "marks non-deterministic were left out)") from exc
        raise


def optimize(problem: ConvProblem, direction: "Direction | str",
             workspace_limit: int = DEFAULT_WORKSPACE_LIMIT, policy: Policy = "powerOfTwo",
             backend: Any = None, cache: Any = None, *, benchmark_cap: int | None = None,
             retime: int = 0, progress: "bool | None" = None,
             deterministic: bool = False) -> Plan:
    """The fastest micro-batch plan for ``problem`` in ``direction`` under a
    per-kernel ``workspace_limit`` (bytes).

    Benchmarks every size of ``policy`` through ``backend`` (a Backend, a name,
    or None for the default) and the cache (None: the default cache, False:
    none), under the workspace cap ``max(workspace_limit, benchmark_cap)``,
    then solves WR (:func:`optimize_wr`). The Plan carries ``problem`` and
    ``direction``. A larger ``benchmark_cap`` makes the cache entries reusable
    for later, larger limits. ``deterministic=True`` plans with the
    configurations cuDNN marks deterministic only (Note [deterministic plans]
    in :mod:`.benchmark`). Raises ValueError when no plan fits the limit
    (naming ``deterministic`` when that left configurations out).
    """
    policy = normalize_policy(policy)  # a one-shot iterable is read once
    direction = Direction.parse(direction)
    check_deterministic(deterministic)
    limit = _check_bytes("workspace_limit", workspace_limit)
    cap = max(limit, _check_bytes("benchmark_cap", benchmark_cap or 0))
    batch_sizes(policy, problem.batch)  # validate the policy before any work
    be = resolve_backend(backend)
    t0 = time.perf_counter()
    # Note [size pruning]: WR under this cap needs only the sizes that can win.
    perf = benchmark(be, problem, direction, policy, cap, cache=resolve_cache(cache),
                     retime=retime, progress=progress, prune_sizes=cap == limit,
                     deterministic=deterministic)
    t1 = time.perf_counter()
    plan = _solve(optimize_wr, deterministic, perf, problem.batch, limit, policy,
                  quantum=problem.batch_quantum())
    t2 = time.perf_counter()
    plan = dataclasses.replace(plan, problem=problem, direction=direction,
                               extra={**plan.extra, "benchmark_s": t1 - t0,
                                      "solve_s": t2 - t1, "backend": be.name})
    _log_plan(f"{problem.key()} {direction.value}", plan, perf, limit, t1 - t0, t2 - t1)
    return plan


def optimize_network(problems: "Mapping[Any, ConvProblem] | Iterable[tuple[Any, ConvProblem]]",
                     total_workspace: int,
                     directions: "Iterable[Direction | str] | None" = None,
                     policy: Policy = "powerOfTwo", backend: Any = None, cache: Any = None, *,
                     retime: int = 0, progress: "bool | None" = None,
                     deterministic: bool = False) -> dict[tuple[Any, Direction], Plan]:
    """One plan per (layer, direction) sharing one workspace budget (WD).

    ``problems`` maps a layer name to its ConvProblem; ``directions`` defaults
    to all three. Every kernel is benchmarked under the cap
    ``total_workspace`` (no single kernel can use more), its Pareto front is
    computed (:func:`pareto_front`), and :func:`optimize_wd` picks one plan per
    kernel so that the workspaces sum to at most ``total_workspace`` bytes with
    the least total time. Returns ``{(name, Direction): Plan}``; each Plan's
    ``workspace_limit`` is its own workspace (the kernel's share of the budget).
    ``deterministic=True`` plans with deterministic configurations only (as
    :func:`optimize`). Raises ValueError when even the smallest plans do not
    fit together (naming ``deterministic`` when that left configurations out).
    """
    items = list(problems.items()) if isinstance(problems, Mapping) else list(problems)
    dirs = [Direction.parse(d) for d in (ALL_DIRECTIONS if directions is None else directions)]
    kernels = {(name, d): (p, d) for name, p in items for d in dirs}
    return plan_jointly(kernels, total_workspace, policy, backend, cache, retime=retime,
                        progress=progress, deterministic=deterministic)


K = TypeVar("K", bound=Hashable)


def plan_jointly(kernels: Mapping[K, tuple[ConvProblem, Direction]], total_workspace: int,
                 policy: Policy = "powerOfTwo", backend: Any = None, cache: Any = None, *,
                 retime: int = 0, progress: "bool | None" = None,
                 deterministic: bool = False) -> dict[K, Plan]:
    """WD over named kernels: ``{key: (problem, direction)}`` -> ``{key: Plan}``,
    the plans' workspaces summing to at most ``total_workspace`` bytes with the
    least total time (see :func:`optimize_network`, which calls this;
    ``deterministic`` as there)."""
    policy = normalize_policy(policy)  # a one-shot iterable is read once
    check_deterministic(deterministic)
    total = _check_bytes("total_workspace", total_workspace)
    for p, _ in kernels.values():
        batch_sizes(policy, p.batch)
    be = resolve_backend(backend)
    store = resolve_cache(cache)
    fronts: dict[Any, list[Plan]] = {}
    perfs: dict[Any, Any] = {}
    times: dict[Any, tuple[float, float]] = {}
    # Note: a network repeats layers (ResNet-50: 159 kernels, 60 distinct); a
    # repeated (problem, direction) shares the first occurrence's benchmark and
    # front (plans are immutable) and costs nothing more.
    seen: dict[tuple[ConvProblem, Direction], tuple[Any, list[Plan]]] = {}
    t_all = time.perf_counter()
    for name, (p, d) in kernels.items():
        d = Direction.parse(d)
        t0 = time.perf_counter()
        if (p, d) not in seen:
            perf = benchmark(be, p, d, policy, total, cache=store, retime=retime,
                             progress=progress, deterministic=deterministic)
            t1 = time.perf_counter()
            seen[(p, d)] = (perf, _solve(pareto_front, deterministic, perf, p.batch, policy,
                                         quantum=p.batch_quantum()))
        else:
            t1 = t0
        perfs[name], fronts[name] = seen[(p, d)]
        times[name] = (t1 - t0, time.perf_counter() - t1)
    t0 = time.perf_counter()
    chosen = _solve(optimize_wd, deterministic, fronts, total)
    wd_s = time.perf_counter() - t0
    out: dict[Any, Plan] = {}
    for name, plan in chosen.items():
        p, d = kernels[name]
        b, s = times[name]
        plan = dataclasses.replace(plan, problem=p, direction=Direction.parse(d),
                                   extra={**plan.extra, "benchmark_s": b, "solve_s": s,
                                          "front_size": len(fronts[name]),
                                          "backend": be.name})
        label = " ".join(str(v) for v in name) if isinstance(name, tuple) else str(name)
        _log_plan(label, plan, perfs[name], plan.workspace_limit, b, s)
        out[name] = plan
    used = sum(p.workspace_bytes for p in out.values())
    fastest = sum(f[-1].time_ms for f in fronts.values())
    log.info("network: %d kernels, predicted %.3f ms (%.3f ms with unlimited workspace); "
             "workspace %s / %s; WD solved in %.3f s; %.2f s in all",
             len(out), sum(p.time_ms for p in out.values()), fastest, _mib(used), _mib(total),
             wd_s, time.perf_counter() - t_all)
    return out
