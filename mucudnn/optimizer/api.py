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
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Iterable, Mapping, TypeVar

from ..errors import InvalidValueError
from ..problem import ConvProblem, Direction, Plan
from ..units import format_bytes, parse_bytes
from .dp import optimize_wr, pareto_front
from .ilp import optimize_wd
from .options import PlanOptions, plan_options
from .policies import DEFAULT_POLICY, Policy, batch_sizes
from .spread import Perf, SpreadResult, measure
from .types import BackendLike, CacheLike, DevicesLike, PolicyLike

__all__ = ["optimize", "optimize_kernels", "optimize_network", "plan_jointly", "plan_kernels",
           "Planned", "DEFAULT_WORKSPACE_LIMIT"]

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
             workspace_limit: int = DEFAULT_WORKSPACE_LIMIT, policy: PolicyLike = DEFAULT_POLICY,
             backend: BackendLike = None, cache: CacheLike = None, *,
             benchmark_cap: int | None = None, retime: int = 0, progress: "bool | None" = None,
             deterministic: bool = False, devices: DevicesLike = None) -> Plan:
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
    direction = Direction.parse(direction)
    limit = _check_bytes("workspace_limit", workspace_limit)
    options = plan_options(policy, backend, cache, deterministic=deterministic, retime=retime,
                           progress=progress, devices=devices)
    return plan_kernels({0: (problem, direction)}, options, workspace_limit=limit,
                        benchmark_cap=benchmark_cap, split_sizes=True).plans[0]


K = TypeVar("K", bound=Hashable)


def optimize_kernels(kernels: Mapping[K, tuple[ConvProblem, "Direction | str"]],
                     workspace_limit: int = DEFAULT_WORKSPACE_LIMIT,
                     policy: PolicyLike = DEFAULT_POLICY, backend: BackendLike = None,
                     cache: CacheLike = None, *, benchmark_cap: int | None = None,
                     retime: int = 0, progress: "bool | None" = None,
                     deterministic: bool = False, devices: DevicesLike = None) -> dict[K, Plan]:
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
    limit = _check_bytes("workspace_limit", workspace_limit)
    options = plan_options(policy, backend, cache, deterministic=deterministic, retime=retime,
                           progress=progress, devices=devices)
    return plan_kernels(kernels, options, workspace_limit=limit,
                        benchmark_cap=benchmark_cap).plans


def optimize_network(problems: "Mapping[Any, ConvProblem] | Iterable[tuple[Any, ConvProblem]]",
                     total_workspace: int,
                     directions: "Iterable[Direction | str] | None" = None,
                     policy: PolicyLike = DEFAULT_POLICY, backend: BackendLike = None,
                     cache: CacheLike = None, *, retime: int = 0,
                     progress: "bool | None" = None, deterministic: bool = False,
                     devices: DevicesLike = None) -> dict[tuple[Any, Direction], Plan]:
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
                 policy: PolicyLike = DEFAULT_POLICY, backend: BackendLike = None,
                 cache: CacheLike = None, *, retime: int = 0, progress: "bool | None" = None,
                 deterministic: bool = False, devices: DevicesLike = None) -> dict[K, Plan]:
    """WD over named kernels: ``{key: (problem, direction)}`` -> ``{key: Plan}``,
    the plans' workspaces summing to at most ``total_workspace`` bytes with the
    least total time (see :func:`optimize_network`, which calls this;
    ``deterministic`` and ``devices`` as there)."""
    total = _check_bytes("total_workspace", total_workspace)
    options = plan_options(policy, backend, cache, deterministic=deterministic, retime=retime,
                           progress=progress, devices=devices)
    return plan_kernels(kernels, options, total_workspace=total).plans


@dataclass(frozen=True)
class Planned(Generic[K]):
    """What :func:`plan_kernels` gives: a Plan per key, the measurements it was
    solved from per key (a repeated kernel shares its dict), and who measured
    them (backend name, device name, library version; None without kernels)."""

    plans: dict[K, Plan]
    perfs: dict[K, Perf]
    identity: "tuple[str, str, str] | None"


def plan_kernels(kernels: Mapping[K, tuple[ConvProblem, "Direction | str"]],
                 options: PlanOptions, *, workspace_limit: int | None = None,
                 total_workspace: int | None = None, benchmark_cap: int | None = None,
                 fit_limit: int | None = None,
                 on_size: "Callable[[int, list, bool], None] | None" = None,
                 split_sizes: bool = False) -> Planned[K]:
    """The one planning path: measure ``kernels`` (each distinct (problem,
    direction) once, in this process or over ``options.devices``: one branch,
    :func:`.spread.measure`), then solve WR (each kernel under
    ``workspace_limit``) or, with ``total_workspace``, WD (one budget for all;
    a repeated kernel shares its measurements and front, each occurrence gets
    its own plan).

    The cap is the limit (or budget), raised to ``benchmark_cap``; WR under
    its own limit prunes sizes (Note [size pruning]). ``fit_limit``: the
    limit ``"fitted"`` stretches configurations to (WR: ``workspace_limit``;
    WD: the cap). ``on_size`` as :func:`~.benchmark.benchmark` (sizes measured
    in this process). ``split_sizes``: a single kernel spread over devices,
    unpruned, is measured size by size, each size its own task
    (:func:`optimize`'s rule). :func:`optimize`, :func:`optimize_kernels`,
    :func:`plan_jointly` and :func:`mucudnn.bench.run_network` all plan here.
    """
    items = {name: (p, Direction.parse(d)) for name, (p, d) in kernels.items()}
    wd = total_workspace is not None
    budget = (_check_bytes("total_workspace", total_workspace) if wd else
              _check_bytes("workspace_limit", DEFAULT_WORKSPACE_LIMIT if workspace_limit is None
                           else workspace_limit))
    cap = max(budget, _check_bytes("benchmark_cap", benchmark_cap or 0))
    for p, _ in items.values():
        batch_sizes(options.policy, p.batch)  # validate the policy before any work
    prune = not wd and cap == budget
    fit = fit_limit if fit_limit is not None else (None if wd else budget)
    t_all = time.perf_counter()
    res = _measure(list(items.values()), options, cap, prune, fit, on_size, split_sizes)
    name = res.identity[0] if res.identity is not None else options.backend_name
    perfs = {k: perf for k, perf in zip(items, res.perfs)}
    seconds = dict(zip(items, res.seconds))
    if wd:
        plans = _wd_plans(items, perfs, seconds, budget, options, name, t_all)
    else:
        plans = {}
        memo: dict[tuple[ConvProblem, Direction], Plan] = {}
        for k, (p, d) in items.items():
            if (p, d) not in memo:
                memo[p, d] = _wr_plan(p, d, perfs[k], budget, options.policy,
                                      options.deterministic, seconds[k], name)
            plans[k] = memo[p, d]
    return Planned(plans, perfs, res.identity)


def _measure(tasks: list[tuple[ConvProblem, Direction]], options: PlanOptions, cap: int,
             prune: bool, fit: int | None, on_size: Any, split_sizes: bool) -> SpreadResult:
    """:func:`.spread.measure`; with ``split_sizes``, one unpruned kernel over
    several devices goes size by size (every size its own task: the same
    cache entries as benchmark()'s)."""
    if split_sizes and options.devices is not None and not prune and len(set(tasks)) == 1:
        (p, d) = tasks[0]
        sizes = batch_sizes(options.policy, p.batch)
        t0 = time.perf_counter()
        res = measure([(p.with_batch(s), d) for s in sizes],
                      dataclasses.replace(options, policy="undivided"), cap)
        perf = {s: r[s] for s, r in zip(sizes, res.perfs)}
        return SpreadResult([perf] * len(tasks), [time.perf_counter() - t0] +
                            [0.0] * (len(tasks) - 1), res.identity)
    return measure(tasks, options, cap, prune_sizes=prune, fit_limit=fit, on_size=on_size)


def _wd_plans(items: Mapping[K, tuple[ConvProblem, Direction]], perfs: Mapping[K, Perf],
              seconds: Mapping[K, float], total: int, options: PlanOptions, backend_name: str,
              t_all: float) -> dict[K, Plan]:
    """WD over measured kernels: one front per kernel, a repeated (problem,
    direction) sharing the first occurrence's (plans are immutable), then
    :func:`optimize_wd`."""
    fronts: dict[Any, list[Plan]] = {}
    times: dict[Any, tuple[float, float]] = {}
    seen: dict[tuple[ConvProblem, Direction], list[Plan]] = {}
    for k, (p, d) in items.items():
        t1 = time.perf_counter()
        if (p, d) not in seen:
            seen[p, d] = _solve(pareto_front, options.deterministic, perfs[k], p.batch,
                                options.policy, quantum=p.batch_quantum())
        fronts[k] = seen[p, d]
        times[k] = (seconds[k], time.perf_counter() - t1)
    t0 = time.perf_counter()
    chosen = _solve(optimize_wd, options.deterministic, fronts, total)
    wd_s = time.perf_counter() - t0
    out: dict[K, Plan] = {}
    for k, plan in chosen.items():
        p, d = items[k]
        b, s = times[k]
        plan = dataclasses.replace(plan, problem=p, direction=d,
                                   extra={**plan.extra, "benchmark_s": b, "solve_s": s,
                                          "front_size": len(fronts[k]),
                                          "backend": backend_name})
        label = " ".join(str(v) for v in k) if isinstance(k, tuple) else str(k)
        _log_plan(label, plan, perfs[k], plan.workspace_limit, b, s)
        out[k] = plan
    used = sum(p.workspace_bytes for p in out.values())
    fastest = sum(f[-1].time_ms for f in fronts.values())
    log.info("network: %d kernels, predicted %.3f ms (%.3f ms with unlimited workspace); "
             "workspace %s / %s; WD solved in %.3f s; %.2f s in all",
             len(out), sum(p.time_ms for p in out.values()), fastest, _mib(used), _mib(total),
             wd_s, time.perf_counter() - t_all)
    return out
