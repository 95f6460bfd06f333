"""Network benchmarks: optimise every conv layer and direction, execute the plans, time them.

This is the harness behind ``python -m mucudnn bench`` and the scripts in
``tools/``. For each distinct problem of a network and each direction it
benchmarks the policy's batch sizes through the cache, builds three plans --
the best undivided call under the limit, the micro-batched plan (WR, or WD for
the whole network) and the best undivided call with unlimited workspace --,
executes the three on real buffers and times them interleaved (device events
on a GPU backend, ``perf_counter`` on NumPy; warm-up, then ``repeat`` rounds
running each plan once; each plan's median: Note [interleaved timing]).

>>> r = run_network("alexnet", batch=1, backend="numpy", repeat=1, warmup=0,
...                 layers=["conv5"], directions=["forward"], progress=False)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from tqdm import tqdm

from ._optional import require
from .backends import Backend, ConvTensors, get_backend
from .cuda import CudaGraph, time_interleaved
from .exec import prepare
from .networks import select as select_layers
from .networks import unique_problems
from .errors import InvalidValueError
from .optimizer import DEFAULT_POLICY, PlanOptions, check_devices, optimize_wr, plan_options
from .optimizer.api import Planned, plan_kernels
from .optimizer.benchmark import PROGRESS_DELAY_S, resolve_cache
from .optimizer.types import CacheLike, PolicyLike
from .problem import ConvProblem, Direction, Plan

log = logging.getLogger("mucudnn")

ALL_DIRECTIONS = (Direction.FORWARD, Direction.BACKWARD_DATA, Direction.BACKWARD_FILTER)
#: Workspace cap for benchmarking the "unlimited" column (the backend may cap lower).
UNLIMITED = 1 << 40


@dataclass
class KernelResult:
    """One (distinct problem, direction): executed times of its three plans."""

    layer: str
    names: list[str]
    direction: Direction
    problem: ConvProblem
    plan: Plan
    undivided: Plan | None
    unlimited: Plan
    micro_ms: float
    undivided_ms: float
    unlimited_ms: float
    kernels_alone_ms: float = float("nan")

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def speedup(self) -> float:
        return self.undivided_ms / self.micro_ms if self.micro_ms > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer, "names": self.names, "direction": self.direction.value,
            "problem": self.problem.to_dict(), "plan": self.plan.to_dict(),
            "undivided_plan": self.undivided.to_dict() if self.undivided else None,
            "unlimited_plan": self.unlimited.to_dict(),
            "micro_ms": self.micro_ms, "undivided_ms": _finite(self.undivided_ms),
            "unlimited_ms": self.unlimited_ms, "kernels_alone_ms": _finite(self.kernels_alone_ms),
            "speedup": _finite(self.speedup), "count": self.count,
        }


@dataclass
class NetworkResult:
    """A whole network's benchmark; totals weigh each distinct problem by its count."""

    net: str
    batch: int
    dtype: str
    backend: str
    device: str
    version: str
    workspace_limit: int
    policy: PolicyLike
    mode: str
    total_workspace: int | None
    kernels: list[KernelResult] = field(default_factory=list)
    optimize_cold_s: float = float("nan")
    optimize_warm_s: float = float("nan")
    graph: bool = False
    #: The CUDA devices the cold benchmark was spread over (None: this process's backend).
    devices: list[int] | None = None
    #: Sizes the first (cold) optimisation measured; 0: the cache held them all
    #: (None: not counted, as when spread over devices).
    cold_measured: int | None = None
    #: Timed on the host (NumPy): times of a few milliseconds, whose differences are noise.
    host: bool = False
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%d"))

    def total(self, attr: str) -> float:
        return sum(getattr(k, attr) * k.count for k in self.kernels)

    @property
    def speedup(self) -> float:
        micro = self.total("micro_ms")
        return self.total("undivided_ms") / micro if micro > 0 else float("nan")

    @property
    def dispatch_overhead(self) -> float:
        """Executed micro-batched time over the sum of its kernels timed alone, minus 1."""
        alone = self.total("kernels_alone_ms")
        return self.total("micro_ms") / alone - 1 if alone > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "kernels"}
        d["policy"] = self.policy if isinstance(self.policy, str) else list(self.policy)
        d["kernels"] = [k.to_dict() for k in self.kernels]
        d["totals"] = {a: _finite(self.total(a)) for a in
                       ("undivided_ms", "micro_ms", "unlimited_ms", "kernels_alone_ms")}
        d["speedup"] = _finite(self.speedup)
        d["dispatch_overhead"] = _finite(self.dispatch_overhead)
        return {k: _finite(v) if isinstance(v, float) else v for k, v in d.items()}


def _finite(v: float) -> float | None:
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


# -- timing ---------------------------------------------------------------------
# Note [interleaved timing]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# A GPU's clock is not constant: isolated convolutions run at the top clock,
# while a second of back-to-back ones reaches the power cap and throttles. So
# two plans timed one after the other are not compared on the same clock: the
# same plan timed first can read tens of percent slower than when timed next
# (docs/BENCHMARKS.md). When a kernel's plan is compared with its undivided
# and unlimited plans, they are timed interleaved: warm-up of each, then
# ``repeat`` rounds that each run every plan once, in turn
# (time_interleaved); each plan's time is its median. Clock drift then moves
# them together, and their ratios hold.


def make_interleaved_timer(backend: Backend
                           ) -> Callable[[Sequence[Callable[[], None]], int, int], list[float]]:
    """A function ``timer(fns, warmup, repeat) -> [median ms per fn]`` timing the
    functions in turn, round by round (Note [interleaved timing]).

    GPU backends time with CUDA events on their home stream; host backends
    (NumPy) with ``time.perf_counter``.
    """
    stream = backend.stream
    if not backend.is_host:
        def gpu_timer(fns: Sequence[Callable[[], None]], warmup: int, repeat: int) -> list[float]:
            return [statistics.median(ts)
                    for ts in time_interleaved(fns, stream, warmup=warmup, repeat=repeat)]
        return gpu_timer

    def cpu_timer(fns: Sequence[Callable[[], None]], warmup: int, repeat: int) -> list[float]:
        for fn in fns:
            for _ in range(warmup):
                fn()
        ts: list[list[float]] = [[] for _ in fns]
        for _ in range(max(1, repeat)):
            for fn, t in zip(fns, ts):
                t0 = time.perf_counter()
                fn()
                backend.synchronize()
                t.append((time.perf_counter() - t0) * 1e3)
        return [statistics.median(t) for t in ts]
    return cpu_timer


def make_timer(backend: Backend) -> Callable[[Callable[[], None], int, int], float]:
    """A function ``timer(fn, warmup, repeat) -> median ms`` for the backend
    (:func:`make_interleaved_timer` with one function)."""
    timer = make_interleaved_timer(backend)

    def one(fn: Callable[[], None], warmup: int, repeat: int) -> float:
        return timer([fn], warmup, repeat)[0]
    return one


def random_tensors(backend: Backend, problem: ConvProblem, seed: int = 0) -> ConvTensors:
    """x, w, y of ``problem`` filled with random normals (never zeros), on the backend."""
    rng = np.random.default_rng(seed)
    # Note: a block of 2**20 random normals tiled to size: non-zero, irregular
    # data as timing needs, without minutes of host RNG for VGG-sized tensors.
    block = rng.standard_normal(1 << 20, dtype=np.float32)

    def arr(shape: tuple[int, ...]) -> Any:
        a = np.resize(block, shape)
        if problem.dtype == "bfloat16":
            ml_dtypes = require("ml_dtypes", "bfloat16", "bfloat16 arrays on the host")
            a = a.astype(ml_dtypes.bfloat16)
        else:
            a = a.astype(problem.dtype, copy=False)
        return backend.from_host(a)

    return ConvTensors(problem, arr(problem.x_shape), arr(problem.w_shape),
                       arr(problem.output_shape))


def single_call_plan(perf: dict[int, list], batch: int, limit: int | None) -> Plan | None:
    """The best undivided call within ``limit`` (None where none fits)."""
    try:
        return optimize_wr(perf, batch, limit, "undivided")
    except ValueError:
        return None


# -- the harness ----------------------------------------------------------------
def run_network(net: str, batch: int, *, dtype: str = "float32", layout: str = "NCHW",
                math_mode: str = "default", workspace_limit: int = 64 << 20,
                policy: PolicyLike = DEFAULT_POLICY, mode: str = "wr",
                total_workspace: int | None = None, backend: "str | Backend | None" = None,
                repeat: int = 10, warmup: int = 3, cache: CacheLike = None,
                layers: Sequence[str] | None = None,
                directions: Iterable["Direction | str"] | None = None,
                progress: bool = True, time_alone: bool = True,
                graph: bool = False, tensors: dict | None = None,
                devices: Sequence[int] | None = None) -> NetworkResult:
    """Benchmark, optimise, execute and time every conv layer of ``net``.

    ``mode`` is "wr" (each kernel under ``workspace_limit``) or "wd" (one
    budget ``total_workspace`` for all kernels; default: the per-layer limit
    times the number of kernels). ``layers`` restricts to some layer names.
    ``graph=True`` times each plan as ``Convolution(graph=True)`` runs it: its
    micro-batch sequence captured once as a CUDA graph and replayed.
    ``tensors`` (a dict) keeps the random device tensors of each problem
    between calls, so several limits and modes reuse them.
    ``devices=[0, 1]``: the cold benchmark runs on those CUDA devices (this
    process on the first, a worker process on each other), the distinct
    kernels spread over them (Note [benchmarking on several devices] in
    :mod:`mucudnn.optimizer.spread`); the warm pass, the plans and their
    execution stay in this process, on ``backend``'s device,
    which must be of the same kind as the workers' (InvalidValueError
    otherwise). ``backend`` is then a name or None.
    Returns a :class:`NetworkResult`; :func:`format_table` prints it.
    """
    if mode not in ("wr", "wd"):
        raise InvalidValueError(f"mode: expected 'wr' or 'wd', got {mode!r}")
    devs = check_devices(devices) if devices is not None else None
    be = get_backend(backend)
    store = resolve_cache(cache)
    dirs = [Direction.parse(d) for d in (directions or ALL_DIRECTIONS)]
    ls = select_layers(net, layers)
    probs = {l.name: l.problem(batch, dtype=dtype, layout=layout, math=math_mode) for l in ls}
    groups = unique_problems(probs)
    kernels = [(names[0], names, p, d) for p, names in groups.items() for d in dirs]
    if mode == "wd" and total_workspace is None:
        total_workspace = workspace_limit * len(ls) * len(dirs)
    result = NetworkResult(net=net, batch=batch, dtype=dtype, backend=be.name,
                           device=be.device_name, version=be.version,
                           workspace_limit=workspace_limit, policy=policy, mode=mode,
                           total_workspace=total_workspace if mode == "wd" else None,
                           devices=list(devs) if devs is not None else None,
                           host=bool(getattr(be, "is_host", False)))
    if mode == "wr":
        keyed = {(layer, d): (p, d) for layer, _names, p, d in kernels}
        budget: dict[str, Any] = {"workspace_limit": workspace_limit}
    else:
        # Note: a layer that occurs k times needs k segments; WD gets one
        # kernel (and front) per occurrence, so repeated layers may take different plans.
        keyed = {(n, d): (p, d) for _layer, names, p, d in kernels for n in names}
        budget = {"total_workspace": total_workspace, "fit_limit": workspace_limit}
    misses = 0

    def count(_size: int, _found: list, from_cache: bool) -> None:
        nonlocal misses
        misses += not from_cache

    def optimise(options: PlanOptions) -> Planned:
        # the plans through the optimizer's one path; measured under the
        # "unlimited" cap, so that the same tables give the undivided calls
        return plan_kernels(keyed, options, benchmark_cap=max(workspace_limit, UNLIMITED),
                            on_size=count, **budget)

    stored = len(store)
    t0 = time.perf_counter()
    # See Note [benchmarking on several devices]: the workers measure under
    # the key this process's backend reads back in the warm pass.
    planned = optimise(plan_options(
        policy, be if devs is None else backend if backend is not None else be.name, store,
        progress=None if progress else False, devices=devs))
    result.optimize_cold_s = time.perf_counter() - t0
    here = (be.name, be.device_name, be.version)
    if devs is not None and planned.identity is not None and tuple(planned.identity) != here:
        ident = planned.identity
        raise InvalidValueError(
            f"devices: the workers on devices {list(devs)} measured with "
            f"{ident[0]} on {ident[1]} ({ident[2]}), but the "
            f"plans run here with {here[0]} on {here[1]} ({here[2]}): pass devices "
            "of the same model as the backend's")
    if devs is None:
        # a find that on_size does not see (a zero-workspace find) still stores an entry
        result.cold_measured = misses if misses or len(store) == stored else None
    t0 = time.perf_counter()
    optimise(plan_options(policy, be, store, progress=False))  # again, answered from the cache
    result.optimize_warm_s = time.perf_counter() - t0
    perfs = {(layer, d): planned.perfs[layer, d] for layer, _names, _p, d in kernels}
    # a repeated layer's slowest chosen plan stands for all its rows (conservative)
    plans = {(layer, d): max((planned.plans[n, d] for n in (names if mode == "wd" else [layer])),
                             key=lambda q: q.time_ms)
             for layer, names, _p, d in kernels}

    timer = make_interleaved_timer(be)
    tensors_cache = tensors if tensors is not None else {}
    use_graph = graph and bool(be.supports_graphs)
    result.graph = use_graph
    bar = _progress(len(kernels), progress, f"{net}: executing")
    for i, (layer, names, p, d) in enumerate(kernels):
        perf = perfs[layer, d]
        plan = plans[layer, d].with_context(p, d)
        und = single_call_plan(perf, batch, workspace_limit)
        unl = single_call_plan(perf, batch, None)
        assert unl is not None
        if tensors is not None:
            # Note: one set per direction: a direction writes one of the three
            # tensors, which must not become another direction's input.
            if (p, d) not in tensors_cache:
                tensors_cache[p, d] = random_tensors(be, p, seed=i)
            data = tensors_cache[p, d]
        else:
            data = random_tensors(be, p, seed=i)
        ws = be.alloc_workspace(max(plan.workspace_bytes, unl.workspace_bytes,
                                    und.workspace_bytes if und else 0) or 1)

        def timed(jobs: Sequence[tuple[Plan, ConvTensors]], ws: Any = ws,
                  d: Direction = d) -> list[float]:
            # Note: timed as Convolution runs a repeated call: through a
            # launcher bound once (exec.prepare), so no Python checks per call;
            # several plans are timed interleaved (Note [interleaved timing]).
            with be.on_home_stream(), contextlib.ExitStack() as stack:
                launches = [prepare(q, be, t, 1.0, 0.0, ws, direction=d) for q, t in jobs]
                if use_graph:
                    launches = [_captured(launch, be, stack) for launch in launches]
                return timer(launches, warmup, repeat)

        # the plan, then the best undivided call under the limit, then unlimited
        jobs = [(plan, data)] + ([(und, data)] if und is not None else []) + [(unl, data)]
        times = timed(jobs)
        micro_ms, unl_ms = times[0], times[-1]
        und_ms = times[1] if und is not None else float("inf")
        alone = float("nan")
        if time_alone:
            alone = 0.0
            for mb in plan.micro_batches:
                one = dataclasses.replace(plan, micro_batches=(dataclasses.replace(mb, offset=0),))
                sub = ConvTensors(p.with_batch(mb.size), *_rows(data, mb.size))
                alone += timed([(one, sub)])[0]
        result.kernels.append(KernelResult(layer, names, d, p, plan, und, unl, micro_ms, und_ms,
                                           unl_ms, alone))
        del data, ws, timed, jobs  # free this kernel's buffers before the next one's
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return result


def _captured(launch: Callable[[], None], be: Backend,
              stack: contextlib.ExitStack) -> Callable[[], None]:
    """``launch`` captured once in a CUDA graph on the backend's stream, closed
    with ``stack``; the function that replays it."""
    with CudaGraph.capture(be.stream) as g:
        launch()
    stack.callback(g.close)
    return lambda: g.launch(be.stream)


def _rows(t: ConvTensors, size: int) -> tuple[Any, Any, Any]:
    """x, w, y restricted to the first ``size`` samples (w is whole)."""
    return t.x[0:size], t.w, t.y[0:size]


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    return tqdm(total=total, desc=desc, leave=False, delay=PROGRESS_DELAY_S)


# -- output -----------------------------------------------------------------------
def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.1f}"


def _ms(v: float) -> str:
    return f"{v:.3f}" if math.isfinite(v) else "n/a"


def format_table(r: NetworkResult) -> str:
    """The per-layer table and the network totals, as plain text."""
    budget = (f"{_mib(r.total_workspace)} MiB total (WD)" if r.mode == "wd"
              else f"{_mib(r.workspace_limit)} MiB per kernel (WR)")
    head = (f"{r.net}, batch {r.batch}, {r.dtype}, {r.backend} {r.version} on {r.device}; "
            f"workspace {budget}; policy {r.policy}"
            f"{'; CUDA-graph replay' if r.graph else ''}")
    cols = ["layer", "direction", "x", "undiv<=lim ms", "micro ms", "speedup", "plan",
            "ws MiB", "unlimited ms"]
    rows = []
    for k in r.kernels:
        rows.append([k.layer, k.direction.value, str(k.count), _ms(k.undivided_ms),
                     _ms(k.micro_ms), f"{k.speedup:.2f}x" if math.isfinite(k.speedup) else "n/a",
                     k.plan.describe(), _mib(k.plan.workspace_bytes), _ms(k.unlimited_ms)])
    und, mic, unl = (r.total(a) for a in ("undivided_ms", "micro_ms", "unlimited_ms"))
    rows.append(["TOTAL", "all", "", _ms(und), _ms(mic),
                 f"{und / mic:.2f}x" if math.isfinite(und) and mic > 0 else "n/a", "", "",
                 _ms(unl)])
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    fmt = lambda row: "  ".join(v.ljust(w) if i in (0, 1, 6) else v.rjust(w)  # noqa: E731
                                for i, (v, w) in enumerate(zip(row, widths)))
    lines = [head, fmt(cols), fmt(["-" * w for w in widths])]
    lines += [fmt(row) for row in rows[:-1]] + [fmt(["-" * w for w in widths]), fmt(rows[-1])]
    lines.append(_optimisation_line(r))
    return "\n".join(lines)


def _optimisation_line(r: NetworkResult) -> str:
    """How long optimising took, cold (or answered from the cache) and warm, and on a
    GPU the dispatch overhead (Note [overhead on the host])."""
    on = f" on devices {','.join(map(str, r.devices))}" if r.devices else ""
    if r.cold_measured == 0:
        line = (f"optimisation: cached {r.optimize_cold_s:.2f} s (every size was in the cache), "
                f"warm {r.optimize_warm_s:.3f} s")
    else:
        measured = (f" ({r.cold_measured} size{'s' if r.cold_measured != 1 else ''} measured)"
                    if r.cold_measured else "")
        line = (f"optimisation: cold {r.optimize_cold_s:.2f} s{on}{measured}, warm (cached) "
                f"{r.optimize_warm_s:.3f} s")
    # Note [overhead on the host]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # On the NumPy backend a micro-batch takes milliseconds of host time, and the
    # executed plan and its kernels timed alone differ by as much as their
    # run-to-run spread: the figure is noise there, so it is printed for GPUs only.
    if not r.host and math.isfinite(r.dispatch_overhead):
        line += (f"; dispatch overhead {100 * r.dispatch_overhead:+.1f}% over the micro-batch "
                 "kernels timed alone")
    return line


def save_json(results: Sequence[NetworkResult], path: str) -> None:
    with open(path, "w") as f:
        json.dump([r.to_dict() for r in results], f, indent=1)
