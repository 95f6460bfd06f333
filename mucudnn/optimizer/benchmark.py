"""Benchmarking through a Backend: every micro-batch size of a policy, once, through the cache.

For each size the policy allows (largest first) the cache is consulted; on a
miss ``backend.find(problem.with_batch(size), direction, workspace_cap)`` runs
and its results (every algorithm that succeeded, with its workspace) are
stored. A limit only filters afterwards (WR and WD do that), so one benchmark
serves every limit up to the cap. A warm cache makes no backend call at all.
``deterministic=True`` likewise filters what the cache (or Find) answered:
:func:`deterministic_only`, Note [deterministic plans].
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, Iterable, Mapping

from ..backends import Backend, get_backend
from ..errors import InvalidValueError
from ..problem import AlgoPerf, ConvProblem, Direction
from .cache import BenchmarkCache, resolve
from .options import PlanOptions, check_byte_count, check_deterministic, plan_options
from .types import BackendLike, CacheLike, PolicyLike
from .policies import DEFAULT_POLICY, batch_sizes, fitted_sizes

__all__ = ["benchmark", "resolve_cache", "resolve_backend", "deterministic_only",
           "is_deterministic", "check_deterministic"]

log = logging.getLogger("mucudnn")

#: More sizes than this get a progress bar (unless progress=False).
PROGRESS_MIN_SIZES = 8
#: Seconds a progress bar waits before it shows: a benchmark the cache answers
#: (warm, or offline) is done sooner and draws no bar.
PROGRESS_DELAY_S = 0.5

#: prune_sizes: stop halving once the best time per sample under the cap is this
#: much worse than at a larger size (Note [size pruning]).
PRUNE_MARGIN = 0.10


# Note [size pruning]
# ~~~~~~~~~~~~~~~~~~~
# A cold benchmark times every candidate at every size of the policy, and the
# sizes below the best one rarely win: under a per-kernel cap, halving a
# micro-batch helps while the fast algorithms do not fit, and once they do,
# smaller calls only cost more per sample. So with ``prune_sizes`` the sizes
# are benchmarked largest first and the descent stops at the first size whose
# best time per sample is more than PRUNE_MARGIN worse than a larger size's;
# the smaller sizes that the remainder of the batch needs are still
# benchmarked, so every split the descent reached can be completed. Before it
# stops, the descent asks the backend (``Backend.blocked_workspace``, no
# timing) whether configurations that heuristics rank ahead of every one that
# fits were left out for their workspace; if one would fit a smaller size
# (workspace taken as proportional to the batch, down to an eighth), the
# descent goes on there. A warm run goes on as far as the cold run went,
# without asking the backend. Pruning is for WR under the cap it was decided
# at; WD and re-plans under less memory benchmark every size.


# Note [deterministic plans]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# CuDNN marks some algorithms (legacy ``determinism``, graph numerical note
# NONDETERMINISTIC) as giving results that may differ run to run (atomics that
# accumulate in whatever order threads finish); backends report them as
# ``AlgoPerf.determinism == 0`` (None, unknown, counts as deterministic).
# ``deterministic=True`` (optimize, Planner, Convolution, mucudnn.torch under
# torch's deterministic settings) drops those entries after the cache answers,
# in one place, :func:`deterministic_only`: the cache keeps every entry, so one
# benchmark serves both modes. Micro-batching keeps a deterministic plan
# bitwise reproducible: forward and backward-data micro-batches write disjoint
# slices, and backward-filter accumulates its micro-batches into dw in the
# plan's fixed order on one stream (the caller's beta first, then beta = 1;
# exec.runner.micro_batch_betas). When no deterministic configuration fits,
# the errors say ``deterministic=True`` (:func:`check_deterministic`).

#: ``determinism`` values meaning "not deterministic": the int, and the string
#: forms a cache entry may hold (cache_entries accepts short strings): the
#: cudnnDeterminism_t value and names, and the graph API's numerical note.
_NON_DETERMINISTIC = frozenset({"0", "NON_DETERMINISTIC", "CUDNN_NON_DETERMINISTIC",
                                "NONDETERMINISTIC", "CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC"})


def is_deterministic(a: AlgoPerf) -> bool:
    """False for an entry cuDNN marks non-deterministic (``determinism`` 0, or a
    string form of it); True for 1 and for None (unknown: the NumPy backend's
    algorithms are deterministic). Note [deterministic plans].

    >>> is_deterministic(AlgoPerf(1, 0.5, 0, determinism=0)), is_deterministic(AlgoPerf(1, 0.5, 0))
    (False, True)
    """
    d = a.determinism
    if isinstance(d, str):
        return d.strip().upper() not in _NON_DETERMINISTIC
    return d is None or d != 0


def deterministic_only(results: Iterable[AlgoPerf]) -> list[AlgoPerf]:
    """``results`` without the entries that are not deterministic, order kept
    (the one filter of ``deterministic=True``; Note [deterministic plans]).

    >>> [a.algo for a in deterministic_only([AlgoPerf(1, 0.1, 0, 0, 0), AlgoPerf(0, 0.9, 0, 0, 1)])]
    [0]
    """
    return [a for a in results if is_deterministic(a)]


def _remainder_sizes(batch: int, smallest: int, sizes: list[int]) -> list[int]:
    """The sizes (below ``smallest``, from ``sizes``) that complete ``batch`` once
    it is cut into pieces of ``smallest``: a greedy decomposition of the rest.

    >>> _remainder_sizes(100, 32, [100, 64, 32, 16, 8, 4, 2, 1])
    [4]
    """
    rest = batch % smallest
    out = []
    for s in sorted((x for x in sizes if x < smallest), reverse=True):
        if s <= rest:
            out.append(s)
            rest -= s
    return out


# Note [one zero-workspace find per kernel]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Every kernel's benchmark holds a configuration that needs no workspace at
# some size that tiles the batch: the plan for a budget of nothing, the first
# plan of a WD front, and what a re-plan falls back to when memory runs out.
# Timing the best-ranked such config at every size (cudnn-graph's
# ``find_zero="each"``) costs seconds where heuristics rank it far behind, as
# they do for engine 0. So where no size's results hold one (a backend whose
# ``Backend.finds_zero_once`` says so), benchmark() makes one find() under a
# cap of 0 at the smallest size found that divides the batch (a multiple of
# its alignment quantum where there is one), after the descent, and adds those
# results to that size's entry (they fit any cap). Other backends' find()
# reports such configs itself. Where each size is its own benchmark (several
# devices with a ``benchmark_cap`` over the limit), each size makes its own.


def _fitted_sizes(out: Mapping[int, list[AlgoPerf]], problem: ConvProblem, limit: int,
                  sizes: list[int]) -> list[int]:
    """See Note [fitted sizes]: the sizes ``"fitted"`` adds to the measured ``out``:
    the fitted sizes and the sizes their remainders need, those not measured.

    >>> from mucudnn.problem import AlgoPerf
    >>> p = ConvProblem((256, 3, 227, 227), (96, 3, 11, 11), stride=4)
    >>> out = {256: [AlgoPerf(9, 40.0, 0)], 64: [AlgoPerf(2, 8.0, 20 << 20)],
    ...        32: [AlgoPerf(1, 2.0, 55 << 20)], 16: [AlgoPerf(1, 1.3, 27 << 20)]}
    >>> _fitted_sizes(out, p, 64 << 20, [256, 128, 64, 32, 16, 8, 4, 2, 1])
    [36, 4]
    """
    need: list[int] = []
    for fitted in fitted_sizes(out, problem.batch, limit, problem.batch_quantum()):
        need += [fitted] + _remainder_sizes(problem.batch, fitted, sizes)
    return [s for s in dict.fromkeys(need) if s not in out]


def _zero_size(sizes: list[int], problem: ConvProblem) -> int:
    """See Note [one zero-workspace find per kernel]: the smallest of ``sizes``
    (micro-batch sizes, among them ``problem.batch``) that divides the batch,
    preferring multiples of its alignment quantum.

    >>> p = ConvProblem((96, 3, 8, 8), (4, 3, 3, 3))
    >>> _zero_size([96, 64, 32, 16], p)
    16
    >>> _zero_size([96, 64], p)
    96
    """
    n, q = problem.batch, problem.batch_quantum()
    tiling = [s for s in sizes if n % s == 0]
    aligned = [s for s in tiling if s % q == 0]
    return min(aligned or tiling)


def _zero_find(be: Backend, store: BenchmarkCache, p: ConvProblem, direction: Direction,
               cap: int) -> list[AlgoPerf]:
    """See Note [one zero-workspace find per kernel]: ``be.find(p, direction, 0)``'s
    zero-workspace results, added to ``p``'s cache entry (made under ``cap``)."""
    zero = [r for r in be.find(p, direction, 0) if r.workspace_bytes == 0]
    if zero:
        have = store.get(be, p, direction, cap) or []
        ids = {(r.algo, r.math_type) for r in have}
        store.put(be, p, direction, have + [r for r in zero if (r.algo, r.math_type) not in ids],
                  cap)
        log.debug("benchmark %s %s: %d zero-workspace configurations at size %d",
                  direction.value, p.key(), len(zero), p.batch)
    return zero


def _blocked_reach(backend: Backend, problem: ConvProblem, direction: Direction, cap: int,
                   smaller: list[int]) -> int | None:
    """See Note [size pruning]: the largest of ``smaller`` (sizes below
    ``problem.batch``, largest first) at which a configuration that heuristics
    prefer but that is over ``cap`` at ``problem.batch`` fits, its workspace
    taken as proportional to the batch; None if no such size is at least an
    eighth of the batch.

    >>> class B:
    ...     def blocked_workspace(self, problem, direction, cap): return 200
    >>> p = ConvProblem((256, 3, 8, 8), (4, 3, 3, 3))
    >>> _blocked_reach(B(), p, Direction.FORWARD, 64, [128, 64, 32, 16, 8])
    64
    >>> _blocked_reach(B(), p, Direction.FORWARD, 4, [128, 64, 32, 16, 8]) is None
    True
    """
    blocked = backend.blocked_workspace(problem, direction, cap)
    if blocked is None or blocked <= cap:
        return None
    for size in smaller:
        if size * 8 < problem.batch:
            break
        if blocked * size <= cap * problem.batch:
            return size
    return None


def resolve_backend(backend: "str | Backend | None") -> Backend:
    """A complete Backend from a Backend (or anything
    :func:`~mucudnn.backends.adapt` accepts), a name, or None (the default)."""
    return get_backend(backend)


def resolve_cache(cache: CacheLike) -> BenchmarkCache:
    """None -> the default cache (``MUCUDNN_CACHE``); False or "off" -> none; a path
    (str or os.PathLike) -> that file; a BenchmarkCache -> itself; anything else:
    :class:`~mucudnn.optimizer.cache.CacheArgumentError` (a TypeError) naming ``cache``."""
    return resolve(cache)


def _retime(backend: Any, problem: ConvProblem, direction: Direction, cap: int,
            results: list[AlgoPerf], k: int, repeats: int) -> list[AlgoPerf]:
    """Re-time the best ``k`` results: median of the first timing and ``repeats`` more.

    The Backend protocol has no single-algorithm timing call, so this runs
    ``backend.find`` ``repeats`` more times and takes each algorithm's median.
    """
    top = sorted(results, key=lambda r: r.time_ms)[:k]
    samples: dict[tuple[Any, Any], list[float]] = {(r.algo, r.math_type): [r.time_ms] for r in top}
    for _ in range(repeats):
        for r in backend.find(problem, direction, cap):
            key = (r.algo, r.math_type)
            if key in samples:
                samples[key].append(r.time_ms)
    out = []
    for r in results:
        key = (r.algo, r.math_type)
        if key in samples and any(r is t for t in top):
            out.append(AlgoPerf(r.algo, float(statistics.median(samples[key])),
                                r.workspace_bytes, r.math_type, r.determinism))
        else:
            out.append(r)
    return sorted(out, key=lambda r: r.time_ms)


#: ``on_size(size, results, from_cache)``, called per size benchmark() measures.
OnSize = Callable[[int, list[AlgoPerf], bool], None]


def benchmark(backend: BackendLike, problem: ConvProblem, direction: "Direction | str",
              policy: PolicyLike = DEFAULT_POLICY, workspace_cap: int = 64 << 20,
              cache: CacheLike = None, retime: int = 0, progress: "bool | None" = None, *,
              repeats: int = 4, prune_sizes: bool = False,
              on_size: OnSize | None = None,
              deterministic: bool = False,
              fit_limit: int | None = None) -> dict[int, list[AlgoPerf]]:
    """Find results for every micro-batch size of ``policy``: ``{size: [AlgoPerf, ...]}``.

    ``backend``: a Backend, a backend name, or None (the default). ``problem``
    is the full mini-batch problem; sizes come from ``batch_sizes(policy,
    problem.batch)`` and are benchmarked largest first. ``workspace_cap``
    (bytes) is passed to ``find``; results needing more are dropped, also when
    they come from a cache entry made under a larger cap. ``cache``: None for
    the default cache (``MUCUDNN_CACHE``), False for none, a
    :class:`BenchmarkCache` or a path.

    ``retime=k`` re-times the ``k`` fastest algorithms of each size (on a
    cache miss only) as the median of ``repeats + 1`` timings, by running
    ``find`` ``repeats`` more times (the Backend protocol has no
    single-algorithm timing call). ``prune_sizes``: stop at the sizes that
    cannot win a WR plan under ``workspace_cap`` (Note [size pruning]); the
    result then lacks them. ``progress``: a tqdm bar; None shows one
    when there are more than 8 sizes (and stderr is a terminal), True always,
    False never. ``on_size(size, results, from_cache)`` is called per size.
    ``deterministic``: leave out the entries cuDNN marks non-deterministic
    (:func:`deterministic_only`, after the cache answered: the cache stores
    every entry; Note [deterministic plans]).
    ``fit_limit``: the per-kernel limit ``"fitted"`` stretches configurations
    to (Note [fitted sizes]; default ``workspace_cap``): the plan's limit
    where the benchmark runs under a larger cap.
    """
    opts = plan_options(policy, backend, cache, deterministic=deterministic, retime=retime,
                        progress=progress)
    return measure_kernel(opts, problem, direction, workspace_cap, repeats=repeats,
                          prune_sizes=prune_sizes, on_size=on_size, fit_limit=fit_limit)


def measure_kernel(options: PlanOptions, problem: ConvProblem, direction: "Direction | str",
                   workspace_cap: int, *, repeats: int = 4, prune_sizes: bool = False,
                   on_size: OnSize | None = None,
                   fit_limit: int | None = None) -> dict[int, list[AlgoPerf]]:
    """:func:`benchmark` with checked ``options`` (in this process: ``options.backend``)."""
    direction = Direction.parse(direction)
    be = options.backend
    if be is None:
        raise InvalidValueError("measure_kernel: options with devices= benchmark through "
                                "spread.measure")
    store = options.cache
    policy, deterministic, retime = options.policy, options.deterministic, options.retime
    progress = options.progress
    cap = check_byte_count("workspace_cap", workspace_cap)
    fit = cap if fit_limit is None else min(cap, check_byte_count("fit_limit", fit_limit))
    sizes = batch_sizes(policy, problem.batch)
    bar = None
    if progress is not False and (progress or len(sizes) > PROGRESS_MIN_SIZES):
        from tqdm.auto import tqdm  # Note [heavy imports where they are used]
        bar = tqdm(total=len(sizes), desc=f"mucudnn benchmark {direction.value}", unit="size",
                   leave=False, disable=None if progress is None else False,
                   delay=PROGRESS_DELAY_S)
    out: dict[int, list[AlgoPerf]] = {}
    hits = 0
    # See Note [one zero-workspace find per kernel]: whether some size's results
    # (before the determinism filter) hold one; whether benchmark() found them
    has_zero = zero_found = False
    t0 = time.perf_counter()
    best_per_sample = float("inf")
    needed: set[int] | None = None  # once pruning stopped the descent: the remainder's sizes
    floor = problem.batch  # pruning judges sizes at or below this (Note [size pruning])
    peeked: dict[int, Any] = {}  # a size's cache answer, read once by the warm descent

    def measure(s: int) -> bool:
        """Benchmark size ``s`` into ``out``; whether the cache answered."""
        nonlocal hits, has_zero
        p = problem.with_batch(s)
        found = peeked.pop(s) if s in peeked else store.get(be, p, direction, cap)
        if not found:  # an entry without results (hand-made, imported) tells nothing: measure
            found = None
        from_cache = found is not None
        if found is None:
            found = list(be.find(p, direction, cap))
            if retime:
                found = _retime(be, p, direction, cap, found, int(retime), int(repeats))
            store.put(be, p, direction, found, cap)
        else:
            hits += 1
        found = sorted((r for r in found if r.workspace_bytes <= cap), key=lambda r: r.time_ms)
        has_zero = has_zero or any(r.workspace_bytes == 0 for r in found)
        if deterministic:
            found = deterministic_only(found)
        out[s] = found
        log.debug("benchmark %s %s size %d: %d algorithms%s", direction.value, problem.key(),
                  s, len(found), " (cache)" if from_cache else "")
        if on_size is not None:
            on_size(s, found, from_cache)
        if bar is not None:
            bar.update(1)
        return from_cache

    try:
        for s in sizes:
            if needed is not None and s not in needed:
                if bar is not None:
                    bar.update(1)
                continue
            from_cache = measure(s)
            found = out[s]
            if prune_sizes and needed is None and found:
                per_sample = found[0].time_ms / s
                if s <= floor and per_sample > (1 + PRUNE_MARGIN) * best_per_sample:
                    smaller = [x for x in sizes if x < s]
                    if from_cache:  # warm: the descent goes as far as the cold one did
                        reach = None
                        if smaller:
                            peeked[smaller[0]] = store.get(
                                be, problem.with_batch(smaller[0]), direction, cap)
                            if peeked[smaller[0]] is not None:
                                reach = smaller[0]
                    else:
                        reach = _blocked_reach(be, problem.with_batch(s), direction, cap,
                                               smaller)
                    if reach is None:
                        needed = set(_remainder_sizes(problem.batch, s, sizes))
                        log.debug("benchmark %s %s: sizes below %d pruned (remainder needs %s)",
                                  direction.value, problem.key(), s, sorted(needed))
                    else:
                        floor = reach
                        log.debug("benchmark %s %s: descending to %d, where configurations "
                                  "over the cap at %d may fit", direction.value, problem.key(),
                                  reach, s)
                best_per_sample = min(best_per_sample, per_sample)
        if be.finds_zero_once and cap > 0 and out and not has_zero:
            s0 = _zero_size(list(out), problem)
            zero = _zero_find(be, store, problem.with_batch(s0), direction, cap)
            zero_found = True
            zero = deterministic_only(zero) if deterministic else zero
            out[s0] = sorted(out[s0] + zero, key=lambda r: r.time_ms)
        # after the zero-workspace find, whose results a warm run reads with
        # s0's: both then see the same measurements (Note [fitted sizes])
        if policy == "fitted" and fit > 0:  # Note [fitted sizes]
            extra = _fitted_sizes(out, problem, fit, sizes)
            if bar is not None and extra:
                bar.total += len(extra)
            for s in extra:
                try:
                    measure(s)
                except LookupError as exc:  # offline: CachedBackend's CacheMissError
                    log.debug("benchmark %s %s: fitted size %d left out (%s)",
                              direction.value, problem.key(), s, exc)
    finally:
        if bar is not None:
            bar.close()
        # Note: GPU backends keep Find's scratch (random inputs, workspace)
        # across the sizes of one benchmark; hand it back once it is done.
        if hits < len(out) or zero_found:
            be.release_find_buffers()
    log.debug("benchmark %s: %d of %d sizes (%d from cache) in %.2f s", direction.value,
              len(out), len(sizes), hits, time.perf_counter() - t0)
    return out
