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
from .policies import DEFAULT_POLICY, Policy, batch_sizes, normalize_policy
from .spread import check_devices
from .spread import run as spread_run

__all__ = ["optimize", "optimize_kernels", "optimize_network", "plan_jointly",
           "DEFAULT_WORKSPACE_LIMIT"]

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


def _wr_plan(problem: ConvProblem, direction: Direction, perf: Mapping[int, list], limit: int,
             policy: Policy, deterministic: bool, bench_s: float, backend_name: str) -> Plan:
    """WR over ``perf`` (measured in ``bench_s`` seconds), with the Plan's
    context and the log line :func:`optimize` gives."""
    t1 = time.perf_counter()
    plan = _solve(optimize_wr, deterministic, perf, problem.batch, limit, policy,
                  quantum=problem.batch_quantum())
    t2 = time.perf_counter()
    plan = dataclasses.replace(plan, problem=problem, direction=direction,
                               extra={**plan.extra, "benchmark_s": bench_s,
                                      "solve_s": t2 - t1, "backend": backend_name})
    _log_plan(f"{problem.key()} {direction.value}", plan, perf, limit, bench_s, t2 - t1)
    return plan


def optimize(problem: ConvProblem, direction: "Direction | str",
             workspace_limit: int = DEFAULT_WORKSPACE_LIMIT, policy: Policy = DEFAULT_POLICY,
             backend: Any = None, cache: Any = None, *, benchmark_cap: int | None = None,
             retime: int = 0, progress: "bool | None" = None,
             deterministic: bool = False, devices: Any = None) -> Plan:
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

    ``devices=[0, 1]`` benchmarks on those CUDA devices
    (``backend`` then a name, None or a factory; Note [benchmarking on
    several devices]): with a ``benchmark_cap`` above the limit the sizes
    are spread over the devices; without one, sizes are pruned (Note [size
    pruning]) and each depends on the last, so this process benchmarks them
    all on ``devices[0]``.
    """
    policy = normalize_policy(policy)  # a one-shot iterable is read once
    direction = Direction.parse(direction)
    check_deterministic(deterministic)
    limit = _check_bytes("workspace_limit", workspace_limit)
    cap = max(limit, _check_bytes("benchmark_cap", benchmark_cap or 0))
    sizes = batch_sizes(policy, problem.batch)  # validate the policy before any work
    if devices is not None:
        devs = check_devices(devices)
        t0 = time.perf_counter()
        if cap == limit:  # pruned: the sizes depend on each other (Note [size pruning])
            res = spread_run([(problem, direction)], policy, cap, backend, cache,
                             devices=devs[:1], retime=retime, prune_sizes=True,
                             deterministic=deterministic, progress=progress)
            perf = res.perfs[0]
        else:  # every size, each its own task: the same cache entries as benchmark()'s
            res = spread_run([(problem.with_batch(s), direction) for s in sizes], "undivided",
                             cap, backend, cache, devices=devs, retime=retime,
                             deterministic=deterministic, progress=progress)
            perf = {s: r[s] for s, r in zip(sizes, res.perfs)}
        assert res.identity is not None
        return _wr_plan(problem, direction, perf, limit, policy, deterministic,
                        time.perf_counter() - t0, res.identity[0])
    be = resolve_backend(backend)
    t0 = time.perf_counter()
    # See Note [size pruning]: WR under this cap needs only the sizes that can win.
    perf = benchmark(be, problem, direction, policy, cap, cache=resolve_cache(cache),
                     retime=retime, progress=progress, prune_sizes=cap == limit,
                     deterministic=deterministic, fit_limit=limit)
    return _wr_plan(problem, direction, perf, limit, policy, deterministic,
                    time.perf_counter() - t0, be.name)


K = TypeVar("K", bound=Hashable)


def optimize_kernels(kernels: Mapping[K, tuple[ConvProblem, "Direction | str"]],
                     workspace_limit: int = DEFAULT_WORKSPACE_LIMIT,
                     policy: Policy = DEFAULT_POLICY, backend: Any = None, cache: Any = None, *,
                     benchmark_cap: int | None = None, retime: int = 0,
                     progress: "bool | None" = None, deterministic: bool = False,
                     devices: Any = None) -> dict[K, Plan]:
    """:func:`optimize` for many kernels, each under its own ``workspace_limit``
    (WR): ``{key: (problem, direction)}`` -> ``{key: Plan}``, each Plan the one
    ``optimize(problem, direction, ...)`` gives; a repeated (problem,
    direction) is planned once and shares its Plan.

    ``devices=[0, 1]``: the distinct kernels are benchmarked on those CUDA
    devices (this process on the first, a worker process on each other),
    longest first (each kernel's sizes in one worker, pruned as
    :func:`optimize` prunes them), then solved here (Note
    [benchmarking on several devices]); ``backend`` is then a name, None or a
    factory. Arguments otherwise as :func:`optimize`.
    """
    policy = normalize_policy(policy)  # a one-shot iterable is read once
    check_deterministic(deterministic)
    limit = _check_bytes("workspace_limit", workspace_limit)
    cap = max(limit, _check_bytes("benchmark_cap", benchmark_cap or 0))
    items = {name: (p, Direction.parse(d)) for name, (p, d) in kernels.items()}
    for p, _ in items.values():
        batch_sizes(policy, p.batch)
    out: dict[K, Plan] = {}
    memo: dict[tuple[ConvProblem, Direction], Plan] = {}
    if devices is None:
        be = resolve_backend(backend)
        store = resolve_cache(cache)
        for name, (p, d) in items.items():
            if (p, d) not in memo:
                memo[p, d] = optimize(p, d, limit, policy, be, store, benchmark_cap=benchmark_cap,
                                      retime=retime, progress=progress,
                                      deterministic=deterministic)
            out[name] = memo[p, d]
        return out
    # See Note [size pruning]: as optimize(), WR under this cap needs only the sizes that can win.
    # (spread_run checks ``devices`` before any work.)
    res = spread_run(list(items.values()), policy, cap, backend, cache, devices=devices,
                     retime=retime, prune_sizes=cap == limit, deterministic=deterministic,
                     progress=progress)
    for (name, (p, d)), perf, secs in zip(items.items(), res.perfs, res.seconds):
        if (p, d) not in memo:
            assert res.identity is not None
            memo[p, d] = _wr_plan(p, d, perf, limit, policy, deterministic, secs,
                                  res.identity[0])
        out[name] = memo[p, d]
    return out


def optimize_network(problems: "Mapping[Any, ConvProblem] | Iterable[tuple[Any, ConvProblem]]",
                     total_workspace: int,
                     directions: "Iterable[Direction | str] | None" = None,
                     policy: Policy = DEFAULT_POLICY, backend: Any = None, cache: Any = None, *,
                     retime: int = 0, progress: "bool | None" = None,
                     deterministic: bool = False,
                     devices: Any = None) -> dict[tuple[Any, Direction], Plan]:
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
    ``devices=[0, 1]`` benchmarks the distinct kernels on those CUDA devices,
    one worker each (this process on the first; ``backend`` then a name, None
    or a factory; Note [benchmarking on several devices]) and solves as
    without it.
    """
    items = list(problems.items()) if isinstance(problems, Mapping) else list(problems)
    dirs = [Direction.parse(d) for d in (ALL_DIRECTIONS if directions is None else directions)]
    kernels = {(name, d): (p, d) for name, p in items for d in dirs}
    return plan_jointly(kernels, total_workspace, policy, backend, cache, retime=retime,
                        progress=progress, deterministic=deterministic, devices=devices)


def plan_jointly(kernels: Mapping[K, tuple[ConvProblem, Direction]], total_workspace: int,
                 policy: Policy = DEFAULT_POLICY, backend: Any = None, cache: Any = None, *,
                 retime: int = 0, progress: "bool | None" = None,
                 deterministic: bool = False, devices: Any = None) -> dict[K, Plan]:
    """WD over named kernels: ``{key: (problem, direction)}`` -> ``{key: Plan}``,
    the plans' workspaces summing to at most ``total_workspace`` bytes with the
    least total time (see :func:`optimize_network`, which calls this;
    ``deterministic`` and ``devices`` as there)."""
    policy = normalize_policy(policy)  # a one-shot iterable is read once
    check_deterministic(deterministic)
    total = _check_bytes("total_workspace", total_workspace)
    for p, _ in kernels.values():
        batch_sizes(policy, p.batch)
    # See Note [benchmarking on several devices]: with devices, every distinct
    # kernel is measured first, spread over the devices; the fronts and WD
    # below are then made from those tables exactly as from benchmark()'s.
    t_all = time.perf_counter()
    measured: dict[tuple[ConvProblem, Direction], tuple[Any, float]] | None = None
    if devices is not None:  # spread_run checks ``devices`` before any work
        tasks = list(dict.fromkeys((p, Direction.parse(d)) for p, d in kernels.values()))
        res = spread_run(tasks, policy, total, backend, cache, devices=devices, retime=retime,
                         progress=progress, deterministic=deterministic)
        measured = {t: (perf, s) for t, perf, s in zip(tasks, res.perfs, res.seconds)}
        backend_name = res.identity[0] if res.identity is not None else ""
    else:
        be = resolve_backend(backend)
        store = resolve_cache(cache)
        backend_name = be.name
    fronts: dict[Any, list[Plan]] = {}
    perfs: dict[Any, Any] = {}
    times: dict[Any, tuple[float, float]] = {}
    # Note: a network repeats layers (ResNet-50: 159 kernels, 60 distinct); a
    # repeated (problem, direction) shares the first occurrence's benchmark and
    # front (plans are immutable) and costs nothing more.
    seen: dict[tuple[ConvProblem, Direction], tuple[Any, list[Plan]]] = {}
    for name, (p, d) in kernels.items():
        d = Direction.parse(d)
        t0 = time.perf_counter()
        if (p, d) not in seen:
            if measured is None:
                perf = benchmark(be, p, d, policy, total, cache=store, retime=retime,
                                 progress=progress, deterministic=deterministic)
                t1 = time.perf_counter()
            else:  # measured in a worker, in this many seconds
                perf, bench_s = measured[p, d]
                t1 = time.perf_counter()
                t0 = t1 - bench_s
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
                                          "backend": backend_name})
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
