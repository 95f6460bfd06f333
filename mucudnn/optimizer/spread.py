"""Benchmarking many kernels at once, in this process or spread over several GPUs of one host.

:func:`benchmark_many` benchmarks a list of ``(problem, direction)`` tasks
(each distinct task once) exactly as :func:`~.benchmark.benchmark` does one,
and returns the perf tables in task order. With ``devices=[0, 1]`` this process (on
the first device) and one worker process per other device do the
benchmarking and the results come back merged
(Note [benchmarking on several devices]); :func:`~.api.optimize`,
:func:`~.api.optimize_network`, :func:`~.api.plan_jointly`,
:func:`~.api.optimize_kernels`, :func:`mucudnn.bench.run_network` and the
command line's ``--devices`` go through it.

>>> from mucudnn.problem import ConvProblem, Direction
>>> p = ConvProblem((4, 3, 6, 6), (2, 3, 3, 3), padding=1)
>>> fwd, bwd, again = benchmark_many([(p, "forward"), (p, "backward_data"), (p, "forward")],
...                                  "powerOfTwo", 1 << 20, "numpy", cache=False)
>>> sorted(fwd), fwd is again
([1, 2, 4], True)
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import time
from collections import deque
from concurrent.futures import (FIRST_COMPLETED, Future, ProcessPoolExecutor,
                                ThreadPoolExecutor, wait)
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

from ..backends import get_backend
from ..cuda import set_device
from ..errors import InvalidTypeError, InvalidValueError
from ..problem import AlgoPerf, ConvProblem, Direction
from .benchmark import PROGRESS_MIN_SIZES, OnSize, measure_kernel, resolve_backend
from .options import PlanOptions, check_byte_count, check_devices, plan_options
from .policies import Policy, batch_sizes
from .types import BackendLike, CacheLike, DevicesLike, PolicyLike

__all__ = ["benchmark_many", "check_devices"]

log = logging.getLogger("mucudnn")

Perf = dict[int, list[AlgoPerf]]
Identity = tuple[str, str, str]


# Note [benchmarking on several devices]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A cold optimisation is almost all Find, one kernel after another on one GPU.
# Kernels are independent, so ``devices=[0, 1]`` spreads them over the GPUs of
# one host. This process benchmarks on the first device (in a thread, so it
# works while the others start) and one worker *process* per other device
# ("spawn": a forked CUDA context is unusable; processes, so the Python around
# Find never queues for one GIL). A worker builds its backend on its first
# task, not in the initializer, so that its errors come back with their type.
# The unit of work is a distinct (problem, direction): with size pruning each
# size decides whether the next is measured, so ``benchmark()`` runs there
# unchanged and plans come from the measurements the one-device path makes.
# Tasks go longest first (FLOPs) to whichever worker is free. Workers write
# the one SQLite cache (WAL, retried UPSERTs) and return their perf tables.
# Workers must agree on (backend, device name, library version), or
# InvalidValueError names them: plans from mixed GPUs hold on neither. A host
# backend ("numpy") gives one host worker per ``devices`` entry (the CPU tests).
# Each worker's start (Python, import, CUDA context) costs seconds, even for a
# cached call: run warm calls without ``devices``.


class _Task(NamedTuple):
    number: int  # among the distinct tasks
    problem: ConvProblem
    direction: Direction


class _Done(NamedTuple):
    number: int
    perf: Perf
    seconds: float  # benchmarking this task, in its worker
    startup: float  # from the pool's start to the worker's backend built (first task; else 0)
    device: int
    identity: Identity


@dataclass
class SpreadResult:
    """What :func:`run` measured: ``perfs`` per task (in task order; a repeated
    task shares its first occurrence's dict), ``seconds`` per task (the time
    benchmarking it, 0 for a repeat), ``identity`` (backend name, device name,
    library version; None when there were no tasks) and ``per_device``
    ({device: (tasks, seconds)}; empty in-process) and ``startup`` ({device:
    seconds from the pool's start until the worker's backend was built})."""

    perfs: list[Perf]
    seconds: list[float]
    identity: Identity | None
    per_device: dict[int, tuple[int, float]] = field(default_factory=dict)
    startup: dict[int, float] = field(default_factory=dict)


# -- checking arguments ----------------------------------------------------------------------------
def _check_tasks(policy: Policy, tasks: list[tuple[ConvProblem, Direction]]) -> None:
    for p, _d in tasks:
        if not isinstance(p, ConvProblem):
            raise InvalidTypeError(f"tasks: expected (ConvProblem, Direction) pairs, got {p!r}")
        batch_sizes(policy, p.batch)


# -- the worker process ----------------------------------------------------------------------------
#: This worker process's state (set by _init_worker; one worker per devices entry).
_WORKER: dict[str, Any] = {}


def _init_worker(devices: Any, spec: Any, host: bool, gpu: bool,
                 settings: dict[str, Any]) -> None:
    _WORKER.clear()
    _WORKER.update(settings, device=devices.get(), spec=spec, host=host, gpu=gpu, backend=None)


def _build(spec: Any, host: bool, gpu: bool, device: int) -> Any:
    """The worker's backend: a host backend without a device, else on ``device``
    (which a library GPU backend's worker also makes its main thread's current
    device, so that nothing in it makes a context on device 0)."""
    if gpu:
        set_device(device)
    if isinstance(spec, str):
        return get_backend(spec) if host else get_backend(spec, device=device)
    return resolve_backend(spec() if host else spec(device=device))


def _work(task: _Task, state: "dict[str, Any] | None" = None) -> _Done:
    """Benchmark ``task`` with a worker's ``state`` (its settings, device and
    backend; default: this worker process's, set by :func:`_init_worker`),
    building the backend on the first task."""
    w = _WORKER if state is None else state
    startup = 0.0
    if w["backend"] is None:
        w["backend"] = _build(w["spec"], w["host"], w["gpu"], w["device"])
        # wall clock: the pool started in the parent (process start, imports,
        # CUDA context and cuDNN handle all count)
        startup = time.time() - w["t_spawn"]
    be = w["backend"]
    t0 = time.perf_counter()
    opts = dataclasses.replace(w["options"], backend=be, devices=None, progress=False)
    perf = measure_kernel(opts, task.problem, task.direction, w["cap"],
                          prune_sizes=w["prune_sizes"], fit_limit=w["fit_limit"])
    return _Done(task.number, perf, time.perf_counter() - t0, startup, w["device"],
                 (str(be.name), str(be.device_name), str(be.version)))


# -- the parent ------------------------------------------------------------------------------------
def _distinct(tasks: Iterable[tuple[ConvProblem, "Direction | str"]]
              ) -> tuple[list[tuple[ConvProblem, Direction]], list[int]]:
    """The distinct tasks in first-seen order, and each task's index among them."""
    index: dict[tuple[ConvProblem, Direction], int] = {}
    where = []
    for item in tasks:
        try:
            p, d = item
        except (TypeError, ValueError):
            raise InvalidTypeError(f"tasks: expected (ConvProblem, Direction) pairs, "
                                   f"got {item!r}") from None
        key = (p, Direction.parse(d))
        where.append(index.setdefault(key, len(index)))
    return list(index), where


def _cost(p: ConvProblem) -> int:
    """The order tasks are submitted in: longest first, estimated by FLOPs."""
    return int(p.flops())


def _mismatch(devices: tuple[int, ...], seen: dict[int, Identity]) -> InvalidValueError:
    names = "; ".join(f"device {d}: {b} on {n} ({v})" for d, (b, n, v) in sorted(seen.items()))
    return InvalidValueError(
        f"devices: the workers on devices {list(devices)} do not measure on one kind of device "
        f"and library ({names}); plans measured on one would not hold on another: pass "
        "devices of one model, with one cuDNN version")


def run(tasks: Iterable[tuple[ConvProblem, "Direction | str"]], policy: PolicyLike, cap: int,
        backend: BackendLike = None, cache: CacheLike = None, *, devices: DevicesLike = None,
        retime: int = 0, prune_sizes: bool = False, deterministic: bool = False,
        progress: "bool | None" = None) -> SpreadResult:
    """:func:`benchmark_many` with the times per task and the workers' identity
    (what :mod:`.api` and :mod:`mucudnn.bench` need to label their plans)."""
    opts = plan_options(policy, backend, cache, deterministic=deterministic, retime=retime,
                        progress=progress, devices=devices)
    return measure(tasks, opts, cap, prune_sizes=prune_sizes)


def measure(tasks: Iterable[tuple[ConvProblem, "Direction | str"]], options: PlanOptions,
            cap: int, *, prune_sizes: bool = False, fit_limit: int | None = None,
            on_size: OnSize | None = None) -> SpreadResult:
    """Benchmark ``tasks`` with checked ``options``: in this process through
    ``options.backend``, or spread over ``options.devices`` (the one place
    that chooses; Note [benchmarking on several devices]). ``cap``,
    ``prune_sizes`` and ``fit_limit`` as :func:`~.benchmark.benchmark` takes
    them; ``on_size`` is called per size measured in this process (not by
    the workers)."""
    distinct, where = _distinct(tasks)
    cap = check_byte_count("workspace_cap", cap)
    fit = None if fit_limit is None else check_byte_count("fit_limit", fit_limit)
    _check_tasks(options.policy, distinct)
    if options.devices is None:
        be = options.backend
        assert be is not None
        perfs: list[Perf] = []
        secs: list[float] = []
        for p, d in distinct:
            t0 = time.perf_counter()
            perfs.append(measure_kernel(options, p, d, cap, prune_sizes=prune_sizes,
                                        fit_limit=fit, on_size=on_size))
            secs.append(time.perf_counter() - t0)
        return _in_task_order(perfs, secs, where, (be.name, be.device_name, be.version))
    if not distinct:
        return SpreadResult([], [], None)
    store = options.cache
    if store.enabled:
        store.read_only  # noqa: B018 (opens the file, and creates its schema, once, here)
    settings = dict(options=options, cap=cap, prune_sizes=bool(prune_sizes), fit_limit=fit)
    return _spread(distinct, where, options.devices, options.spec, options.host, options.gpu,
                   settings, options.progress)


def _in_task_order(perfs: list[Perf], secs: list[float], where: list[int],
                   identity: Identity | None,
                   per_device: dict[int, tuple[int, float]] | None = None,
                   startup: dict[int, float] | None = None) -> SpreadResult:
    first: set[int] = set()
    seconds = []
    for i in where:
        seconds.append(0.0 if i in first else secs[i])
        first.add(i)
    return SpreadResult([perfs[i] for i in where], seconds, identity, per_device or {},
                        startup or {})


def _spread(distinct: list[tuple[ConvProblem, Direction]], where: list[int],
            devs: tuple[int, ...], spec: Any, host: bool, gpu: bool,
            settings: dict[str, Any], progress: "bool | None") -> SpreadResult:
    ctx = multiprocessing.get_context("spawn")
    workers = min(len(devs), len(distinct))
    here, remote = devs[0], devs[1:workers]
    queue = ctx.SimpleQueue()
    for d in remote:
        queue.put(d)
    # longest first; each worker is handed the next one when it is free
    order = deque(sorted(range(len(distinct)), key=lambda i: -_cost(distinct[i][0])))
    perfs: list[Perf | None] = [None] * len(distinct)
    secs = [0.0] * len(distinct)
    seen: dict[int, Identity] = {}
    busy: dict[int, list[float]] = {}  # device -> [tasks, seconds benchmarking, startup]
    bar = None
    if progress is not False and (progress or len(distinct) > PROGRESS_MIN_SIZES):
        from tqdm.auto import tqdm  # Note [heavy imports where they are used]
        bar = tqdm(total=len(distinct), unit="kernel", leave=False,
                   desc=f"mucudnn benchmark on devices {','.join(map(str, devs))}",
                   disable=None if progress is None else False)
    t_all = time.perf_counter()
    settings = dict(settings, t_spawn=time.time())
    state = dict(settings, device=here, spec=spec, host=host, gpu=gpu, backend=None)
    local = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mucudnn-benchmark")
    pool = ProcessPoolExecutor(max_workers=len(remote), mp_context=ctx,
                               initializer=_init_worker,
                               initargs=(queue, spec, host, gpu, settings)) if remote else None
    slots: dict[Future, Any] = {}

    def hand_out(executor: Any) -> None:
        """The next task (if any) to ``executor``'s one worker, which is free."""
        if order:
            n = order.popleft()
            if executor is local:
                fut = local.submit(_work, _Task(n, *distinct[n]), state)
            else:
                fut = executor.submit(_work, _Task(n, *distinct[n]))
            slots[fut] = executor

    try:
        hand_out(local)
        for _ in remote:
            hand_out(pool)
        while slots:
            done, _pending = wait(list(slots), return_when=FIRST_COMPLETED)
            for fut in done:
                executor = slots.pop(fut)
                r: _Done = fut.result()  # a worker's exception, re-raised with its type
                seen.setdefault(r.device, r.identity)
                if len(set(seen.values())) > 1:
                    raise _mismatch(devs, seen)
                perfs[r.number], secs[r.number] = r.perf, r.seconds
                b = busy.setdefault(r.device, [0, 0.0, 0.0])
                b[0] += 1
                b[1] += r.seconds
                b[2] += r.startup
                if bar is not None:
                    bar.update(1)
                hand_out(executor)
    finally:
        # on an error the tasks not handed out are dropped; the running ones
        # (one per worker) finish, and every worker process is joined
        order.clear()
        local.shutdown(wait=True)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
    total = time.perf_counter() - t_all
    for d in devs:
        if d in busy:
            n, s, start = busy[d]
            log.info("benchmark %s %d (%s): %d of %d kernels, %.2f s benchmarking "
                     "(backend ready %.2f s after the pool started)",
                     "host worker" if host else "on device", d,
                     seen[d][1], int(n), len(distinct), s, start)
    log.info("benchmark: %d kernels on %d devices in %.2f s", len(distinct), workers, total)
    identity = next(iter(seen.values()))
    assert all(p is not None for p in perfs)
    return _in_task_order(perfs, secs, where, identity,  # type: ignore[arg-type]
                          {d: (int(b[0]), b[1]) for d, b in busy.items()},
                          {d: b[2] for d, b in busy.items()})


def benchmark_many(tasks: Iterable[tuple[ConvProblem, "Direction | str"]], policy: PolicyLike,
                   cap: int, backend: BackendLike = None, cache: CacheLike = None, *,
                   devices: DevicesLike = None,
                   retime: int = 0, prune_sizes: bool = False, deterministic: bool = False,
                   progress: "bool | None" = None) -> list[Perf]:
    """Find results for many ``(problem, direction)`` tasks: one
    ``{size: [AlgoPerf, ...]}`` per task, in task order, each as
    :func:`~.benchmark.benchmark` gives it (``policy``, workspace cap ``cap``,
    ``cache``, ``retime``, ``prune_sizes``, ``deterministic`` as there). A task
    that occurs again is benchmarked once; its entries are the same dict.

    ``devices=None``: in this process, through ``backend`` (a Backend, a name,
    or None for the default), one task after another. ``devices=[0, 1]``: this
    process on the first device and one worker process per other device
    benchmark the distinct tasks, longest first,
    and the results are merged (and written to the one cache by the workers);
    ``backend`` is then a name, None (``MUCUDNN_BACKEND``, else
    cudnn-graph), or a picklable factory called as ``factory(device=i)`` (a
    Backend class, ``functools.partial(CudnnGraphBackend, find_top_k=4)``);
    with a host backend ("numpy") each entry is one host worker.
    Note [benchmarking on several devices].

    Raises InvalidTypeError/InvalidValueError naming ``devices`` or
    ``backend`` before any work for a bad argument (an instance as
    ``backend`` with ``devices``), InvalidValueError naming the devices when
    the workers report different devices or library versions, and a worker's
    exception with its own type.
    """
    return run(tasks, policy, cap, backend, cache, devices=devices, retime=retime,
               prune_sizes=prune_sizes, deterministic=deterministic, progress=progress).perfs
