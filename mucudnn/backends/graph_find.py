"""cudnn-graph's find(): the search and its timing. The candidates (heuristics'
configs allowed by the problem's numerics, cut by rank, by runtime
compilation and by their times at other sizes, plus carried and knob-space
configs: Notes [find cut-offs], [search parity], [carried to other sizes],
[knob search]) are finalized on a thread pool (Note [parallel finalization]),
those that fit the cap are timed one at a time on real random buffers (CUDA
events on the backend's stream, 1 warm-up, median of ``repeat`` >= 3 runs,
probes: Notes [cold probe], [long runs]), the fastest are timed again (Note
[re-timing the winners]), with ``fold`` the problem folded by
space-to-depth is found too (Note [folded first layers] in :mod:`.fold`), and
with ``split`` a grouped problem's chunks (Note [split groups] in
:mod:`.split`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

from .._cudnn import graph_descriptors as gd
from .._cudnn.backend_api import BackendDescriptor
from .._cudnn.enums import BackendBehaviorNote as Behavior
from .._cudnn.errors import CudnnError
from .._cudnn.prototypes import lib
from ..caches import LRU
from ..cuda import CudaError, CudaOutOfMemoryError, time_on_stream, using_device
from ..errors import InvalidValueError
from ..problem import AlgoPerf, ConvProblem, Direction
from ..problem.slice_problem import SliceProblem
from . import fold as _fold
from . import pair as _pair
from . import split as _split
from .fold_cudnn import FoldTransforms
from .graph_candidates import (FirstTimed, carried_ids, cold_out, far_cut, fitting, long_run,
                               note_ratios, numerics_allowed, over_cap, parity_compiles, remember,
                               rtc_cut, top_k_cut)
from .graph_engines import GraphEngines
from .graph_plans import FULL_ALIGNMENT as _FULL
from .graph_plans import CachedGraph, CachedPlan
from .split_cudnn import SplitCopies

__all__ = ["GraphFind"]

log = logging.getLogger("mucudnn")


# Note [parallel finalization]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Finalizing an execution plan is where a cold find() spends its time (cuDNN
# compiles or loads the engine's kernels), and it is one ctypes call that
# releases the GIL. So find() finalizes its candidates on a thread pool, as
# cudnn-frontend's build_plan_at_index is meant to be used when autotuning,
# and times them one at a time on the GPU. Candidates whose engine config
# already says it needs more workspace than the cap
# (CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, cuDNN >= 9.2) are never finalized.
# Workers only build plans (descriptors of their own on a graph the calling
# thread holds); the caches are filled by the calling thread under the lock.


# Note [re-timing the winners]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# find() times its best candidates first, right after the host work of
# heuristics and finalization, with the GPU idle before them; timing
# everything warms the GPU before most winners run. That bias differs between
# micro-batch sizes, so it steers the size choices, and find() over-predicts
# its own plans' execution. ``retime=k`` times the k best of each find() call
# again once every candidate has run (warm-up and ``repeat`` runs) and reports
# that median; runs past ``long_ms`` are not run again (their biases are
# microseconds). On by default (k = 2): it brings the executed plans closer to
# those of timing every config, at no measurable optimisation time
# (docs/BENCHMARKS.md, "re-timing").


# Note [split at the first find]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Each split factor is a find() of another problem, so a search of every
# factor at every micro-batch size would multiply a grouped kernel's cold
# cost. The first find() of a kernel whose limit bites (the largest size,
# asked first) tries every factor of Note [split groups], and the chunks as
# slices where Note [which slices are searched] says; the factor (and
# whether as slices) that gave the fastest configuration of all, split or
# not, is kept per kernel (``cudnn_graph.split_led``), and later finds of the
# kernel try that alone, or none where no split led. A chunk problem's find()
# is an ordinary one (its own first find, carry and cut-offs), except that a
# packed chunk compiles only where ``rtc`` says (Note [search parity]), and
# its first-find state is its own, so a layer whose problem equals a chunk
# keeps its parity.


# Note [far behind in another split]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A split's chunk problems (Note [split groups]) are the layer's convolution
# on fewer groups, each factor a kernel of its own, so each factor's first
# find() would time every candidate again, the configs far behind included:
# most of a depthwise backward-filter's cold GPU time is the first runs of
# such configs. The ratios of Note [far behind at another size] carry over:
# a chunk problem's find() also cuts the configs more than ``skip_ratio``
# times behind at every find() of the whole problem and of the factors found
# before it, and adds its own ratios to the factors' (``_split_key``), not to
# the whole problem's, whose own finds keep their evidence. Configs the cap
# kept out of the whole problem's find() have no ratio there and are timed
# where they fit a chunk. Chunks as slices (Note [chunks as slices]) run
# other engines than packed chunks, so they share ratios only with the whole
# problem's finds and with slices of other sizes (``_split_key(whole, True)``).


# Note [a chunk's time to beat]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A split by k runs its chunk problem k times (Note [split groups]), so a chunk
# configuration slower than 1/k of the whole problem's best time at the size
# cannot give a split that beats it, whatever its copies cost. A chunk
# problem's find() therefore starts the cut-offs of Note [find cut-offs] and
# Note [cold probe] from that time, as if a candidate had already run at it:
# the first candidates are no longer timed in full where they cannot win,
# which, on a depthwise backward-filter, is most of them. Their times (a
# warm-up run, or one probe run) can only overstate, and only for configs
# that lose to the whole problem at this size.


def _split_key(whole: tuple, as_slices: bool = False) -> tuple:
    """The key of the ratios the chunk problems (``as_slices``: the slices) of
    kernel ``whole`` share (Note [far behind in another split])."""
    return ("slice" if as_slices else "split",) + tuple(whole)


class GraphFind(GraphEngines):
    """find() of the cudnn-graph backend and the memory it keeps between calls
    (per kernel: configs far behind, configs carried, kernels searched)."""

    def _init_find_memory(self) -> None:
        """The empty per-kernel memories of find() (the graph cache's bound)."""
        #: See Note [far behind at another size]: per kernel (batch 1) and direction,
        #: each config's least time over its find()'s best; and per split kernel
        #: (:func:`_split_key`), over the finds of its chunk problems
        #: (Note [far behind in another split])
        self._behind: LRU[tuple, dict[str, float]] = LRU("cudnn_graph.behind",
                                                         self.graph_cache_size)
        #: See Note [carried to other sizes]: per kernel (batch 1) and direction,
        #: the configs that led, or were preferred over the cap, at sizes found before
        self._carry: LRU[tuple, dict[str, None]] = LRU("cudnn_graph.carry",
                                                       self.graph_cache_size)
        #: See Note [search parity]: the kernels (batch 1, direction) found before
        self._searched: LRU[tuple, bool] = LRU("cudnn_graph.searched", self.graph_cache_size)
        #: See Note [split at the first find]: per kernel (batch 1) and direction,
        #: the (factor, as slices) that led its first split search (``()``: none)
        self._split_led: LRU[tuple, tuple[int, bool] | tuple[()]] = LRU(
            "cudnn_graph.split_led", self.graph_cache_size)

    def _build_plans(self, problem: ConvProblem, direction: Direction,
                     wanted: Sequence[tuple[str, float]]) -> dict[tuple[str, float], CachedPlan]:
        """Finalized plans (alpha 1, 16-byte alignment) for ``(engine config id,
        beta)`` pairs, from the cache or built on the pool; pairs that do not
        finalize are left out."""
        out: dict[tuple[str, float], CachedPlan] = {}
        todo: list[tuple[str, float, tuple, CachedGraph]] = []
        with self._lock:
            for algo_id, beta in wanted:
                key = self._graph_key(problem, direction, 1.0, beta, _FULL) + (algo_id,)
                p = self._plans.get(key)
                if p is not None and not p.closed:
                    out[algo_id, beta] = p
                    continue
                g = self._graph(problem, direction, 1.0, beta, _FULL)
                g.acquire()  # held while the workers build on it
                todo.append((algo_id, beta, key, g))
        device, handle, packs = self.device, self.handle, self.pack_cache_size

        def build(item: tuple[str, float, tuple, CachedGraph]) -> tuple[Optional[CachedPlan], float]:
            algo_id, beta, _key, g = item
            t = time.perf_counter()
            with using_device(device):
                try:
                    return CachedPlan(g, algo_id, handle, packs), time.perf_counter() - t
                except CudnnError as exc:
                    log.debug("mucudnn: engine config %s does not finalize for %s %s "
                              "(beta %s): %s", algo_id, problem, direction, beta, exc)
                    return None, time.perf_counter() - t

        try:
            if self.find_threads > 1 and len(todo) > 1:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.find_threads,
                                                    thread_name_prefix="mucudnn-finalize")
                built = list(self._pool.map(build, todo))
            else:
                built = [build(item) for item in todo]
        finally:
            for *_rest, g in todo:
                g.release()
        prof = self.find_profile
        with self._lock:
            for (algo_id, beta, key, _g), (p, secs) in zip(todo, built):
                prof.finalize_thread_s += secs
                if p is None:
                    continue
                self._plans.put(key, p)
                out[algo_id, beta] = p
                prof.finalized += 1
                if int(Behavior.RUNTIME_COMPILATION) in p.info.behavior_notes:
                    prof.finalized_rtc += 1
                    prof.finalize_rtc_s += secs
        return out

    def find(self, problem: ConvProblem, direction: Direction,
             workspace_limit: Optional[int]) -> list[AlgoPerf]:
        """Every engine config that finalized and ran for ``problem`` (at its own
        batch) with workspace <= ``workspace_limit`` (and the find cap), fastest
        first; with ``fold``, also those of the problem folded (Note [folded
        first layers])."""
        direction = Direction.parse(direction)
        limit = None if workspace_limit is None else int(workspace_limit)
        if limit is not None and limit < 0:
            raise InvalidValueError(f"workspace_limit: expected bytes >= 0, got {workspace_limit}")
        out = self._find_configs(problem, direction, limit)
        if self.fold:
            folded = self._find_folded(problem, direction, limit)
            if folded:
                self.find_profile.folded += len(folded)
                out = sorted(out + folded, key=lambda a: a.time_ms)
        if self.split and not isinstance(problem, SliceProblem):  # a slice is a chunk already
            split = self._find_split(problem, direction, limit,
                                     out[0].time_ms if out else math.inf)
            if split:
                self.find_profile.split += len(split)
                out = sorted(out + split, key=lambda a: a.time_ms)
        if self.pair and not isinstance(problem, SliceProblem) and _pair.pairs(problem, direction):
            paired = self._find_pairs(problem, direction, limit)
            if paired:
                self.find_profile.pairs += len(paired)
                out = sorted(out + paired, key=lambda a: a.time_ms)
        self.find_profile.calls += 1
        return out

    def _find_pairs(self, problem: ConvProblem, direction: Direction,
                    limit: Optional[int]) -> list[AlgoPerf]:
        """The pair configurations find() adds (Note [micro-batches in pairs]):
        none here; :class:`~mucudnn.backends.graph_pairs.GraphPairs` times them."""
        return []

    def _find_folded(self, problem: ConvProblem, direction: Direction,
                     limit: Optional[int]) -> list[AlgoPerf]:
        """See Note [folded first layers]: the configs of ``problem`` folded, each
        with the time of its transforms and the workspace of its regions (none
        where the problem does not fold or the regions alone exceed the cap)."""
        f = _fold.fold_of(problem)
        if f is None:
            return []
        extra = _fold.regions(f, problem.batch).inner
        with self.on_home_stream():
            cap = self.find_workspace_cap()
        want = cap if limit is None else min(limit, cap)
        if want < extra:
            return []
        inner = self._find_configs(f.inner, direction, want - extra)
        if not inner:
            return []
        try:
            transform_ms = self._time_fold(f, direction, problem.batch)
        except CudnnError as exc:
            log.info("mucudnn: cannot fold %s %s: %s", problem, direction, exc)
            return []
        return _fold.folded_perfs(inner, f, problem.batch, transform_ms)

    def _time_fold(self, fold: _fold.Fold, direction: Direction, size: int) -> float:
        """The median ms of the transforms one folded call of ``direction`` runs
        at ``size`` rows, on scratch buffers (Note [folded first layers])."""
        tf = FoldTransforms(fold, size)
        try:
            return self._time_on_scratch(
                tf.scratch_bytes, lambda h, a, b: tf.run_all(h, direction, a, b))
        finally:
            tf.close()

    def _time_on_scratch(self, scratch_bytes: tuple[int, int],
                         run: Callable[[Any, int, int], None]) -> float:
        """The median ms of ``run(handle, src, dst)`` on the home stream, on two
        scratch buffers of ``scratch_bytes`` (a rewrite's transforms or copies:
        Notes [folded first layers], [split groups]); freed before it returns."""
        src = dst = None
        try:
            with self.on_home_stream():
                src = self.alloc_workspace(scratch_bytes[0])
                dst = self.alloc_workspace(scratch_bytes[1])
                h = self.handle

                def go(a: int = src.ptr, b: int = dst.ptr) -> None:
                    run(h, a, b)

                times = time_on_stream(go, self.stream, warmup=1, repeat=self.find_options.repeat,
                                       held=self.find_options.hold, host=self.find_options.host)
                self.stream.synchronize()
        finally:
            for buf in (src, dst):
                if buf is not None:
                    buf.close()
        return float(statistics.median(times))

    def _limit_bites(self, problem: ConvProblem, direction: Direction, want: int) -> bool:
        """Whether some configuration that a heuristics mode ranks in its top
        ``top_k`` (numerics allowed) needs more than ``want`` bytes."""
        with self.on_home_stream():
            infos = [i for i in self.engine_configs(problem, direction)
                     if numerics_allowed(problem.math, i.numerical_notes)]
            with self._lock:
                rankings = dict(self._graph(problem, direction, 1.0, 0.0, _FULL).mode_ids)
        return bool(over_cap(infos, want, rankings, self.find_options.top_k))

    def _find_split(self, problem: ConvProblem, direction: Direction, limit: Optional[int],
                    best_ms: float) -> list[AlgoPerf]:
        """See Note [split groups] and Note [split at the first find]: the configs
        of ``problem``'s chunk problems, each with its copies' time and its
        regions' workspace, and those of its chunks as slices (Note [which
        slices are searched]: no copies, no regions); none where the problem
        does not split, the limit does not bite, or the regions alone exceed
        the cap. ``best_ms`` is the best time find() has without them."""
        factors = _split.searched_factors(problem)
        if not factors:
            return []
        with self.on_home_stream():
            cap = self.find_workspace_cap()
        want = cap if limit is None else min(limit, cap)
        if not self._limit_bites(problem, direction, want):
            return []
        kernel = (problem.with_batch(1).key(), direction.value)
        with self._lock:
            led = self._split_led.get(kernel)
            if led is None:
                self._split_led.put(kernel, ())
        if led is None:
            sliced = _split.slice_factor(problem, direction)
            tries = [(k, False) for k in factors] + ([(sliced, True)] if sliced else [])
        else:
            tries = [led] if led else []
        out: list[AlgoPerf] = []
        for k, as_slices in tries:
            sp = _split.splitting(problem, k)
            if as_slices:
                self.find_profile.split_finds += 1
                # See Note [a chunk's time to beat]; a slice needs no regions
                inner = self._find_configs(_split.slice_of(sp), direction, want, kernel,
                                           best_ms / k)
                out += _split.slice_perfs(inner, sp)
                continue
            extra = _split.regions(sp, problem.batch).inner
            if want < extra:
                continue
            self.find_profile.split_finds += 1
            inner = self._find_configs(sp.chunk, direction, want - extra, kernel, best_ms / k)
            if not inner:
                continue
            try:
                copy_ms = self._time_split(sp, direction, problem.batch)
            except (CudnnError, CudaOutOfMemoryError) as exc:
                # a split is an extra: without its copies (or memory to time them) find() goes on
                log.info("mucudnn: cannot split %s %s by %d: %s", problem, direction, k, exc)
                continue
            out += _split.split_perfs(inner, sp, problem.batch, copy_ms)
        if led is None and out:
            top = min(out, key=lambda a: a.time_ms)
            if top.time_ms < best_ms:
                as_split = _split.parse_split_id(top.algo)
                parsed = as_split or _split.parse_slice_id(top.algo)
                assert parsed is not None
                with self._lock:
                    self._split_led.put(kernel, (parsed[0], as_split is None))
        return out

    def _time_split(self, split: _split.Split, direction: Direction, size: int) -> float:
        """The median ms of the copies one chunk of a split call of ``direction``
        makes at ``size`` rows, on scratch buffers (Note [split groups])."""
        cp = SplitCopies(split, size)
        try:
            return self._time_on_scratch(
                cp.scratch_bytes, lambda h, a, b: cp.run_chunk(h, direction, a, b))
        finally:
            cp.close()

    def _find_configs(self, problem: ConvProblem, direction: Direction,
                      limit: Optional[int], whole: Optional[tuple] = None,
                      beat_ms: float = math.inf) -> list[AlgoPerf]:
        """find() of ``problem`` as it is (the engine configs heuristics, carried
        configs and the knob search name); ``whole``: for a split's chunk
        problem, the kernel (batch 1, direction) of the problem it splits
        (Note [far behind in another split]), and ``beat_ms`` the time it must
        beat (Note [a chunk's time to beat])."""
        prof = self.find_profile
        t_start = time.perf_counter()
        out: list[AlgoPerf] = []
        with self.on_home_stream():
            cap = self.find_workspace_cap()
            want = cap if limit is None else min(limit, cap)
            t = time.perf_counter()
            infos = [i for i in self.engine_configs(problem, direction)
                     if numerics_allowed(problem.math, i.numerical_notes)]
            prof.heuristics_s += time.perf_counter() - t
            cands = [i for i in infos if not self.find_options.prefilter or i.workspace_bytes is None
                     or i.workspace_bytes <= want]
            prof.configs += len(infos)
            prof.skipped += len(infos) - len(cands)
            with self._lock:
                rankings = dict(self._graph(problem, direction, 1.0, 0.0, _FULL).mode_ids)
            # See Note [one zero-workspace find per kernel]: "once" leaves the
            # zero-workspace config to a find() under a cap of 0
            keep_zero = not self.finds_zero_once or want == 0
            rtc = int(Behavior.RUNTIME_COMPILATION)
            kernel = (problem.with_batch(1).key(), direction.value)
            # See Note [search parity]: a kernel's first find() times every candidate,
            # and compiles only for a layer's own problem and a chunk as slices
            # (Note [which slices are searched]), never a split's packed chunk
            as_slices = isinstance(problem, SliceProblem)
            compiles = (whole is None or as_slices) and parity_compiles(problem, direction)
            shared = None if whole is None else _split_key(whole, as_slices)
            searched = kernel if shared is None else (shared, kernel)
            with self._lock:
                first = self.find_options.parity and self._searched.get(searched) is None
                self._searched.put(searched, True)
            if first:
                prof.parity += 1
                top = {c.id for c in top_k_cut(cands, self.find_options.top_k, rankings, keep_zero)}
                kept = [c for c in cands if c.id in top or rtc not in c.behavior_notes]
                prof.cut += len(cands) - len(kept)
                cands = kept
                if not compiles:
                    cands = rtc_cut(kept, self.find_options.rtc, rankings)
                    prof.rtc_cut += len(kept) - len(cands)
            else:
                kept = top_k_cut(cands, self.find_options.top_k, rankings, keep_zero)
                prof.cut += len(cands) - len(kept)
                cands = rtc_cut(kept, self.find_options.rtc, rankings)
                prof.rtc_cut += len(kept) - len(cands)
            with self._lock:
                behind = dict(self._behind.get(kernel) or {})
                if whole is not None and shared is not None:  # Note [far behind in another split]
                    for other in (self._behind.get(whole), self._behind.get(shared)):
                        for algo, r in (other or {}).items():
                            behind[algo] = min(behind.get(algo, math.inf), r)
            extra: list[gd.EngineConfigInfo] = []  # Note [carried to other sizes]
            if self.find_options.skip_ratio is not None:
                near = far_cut(cands, behind, self.find_options.skip_ratio, keep_zero)
                prof.far_cut += len(cands) - len(near)
                cands = near
            if self.find_options.carry:
                # Note [carried to other sizes]
                with self._lock:
                    memory = self._carry.get_or_create(kernel, dict)
                    carry = carried_ids(list(memory), {c.id for c in cands}, behind,
                                        self.find_options.skip_ratio)
                    for i in over_cap(infos, want, rankings, self.find_options.top_k):
                        memory.setdefault(i, None)
                extra = self._carried_configs(problem, direction, carry, infos, want, compiles)
                prof.carried += len(extra)
                cands = cands + extra
            if self.find_options.search == "knobs":
                # See Note [knob search]: the knob space after heuristics' own configs.
                have = {c.id for c in cands}
                extra = [i for i in self._knob_space(problem, direction, infos)
                         if i.id not in have and (i.workspace_bytes is None
                                                  or i.workspace_bytes <= want)]
                extra = extra[:self.find_options.max_configs]
                prof.knob_configs += len(extra)
                cands = cands + extra
            timed: dict[str, CachedPlan] = {}
            out = self._find_round(problem, direction, cands, want, timed, beat_ms)
            if self.find_options.retime and out:
                t = time.perf_counter()
                out = self._retime_best(problem, direction, out, timed)
                prof.timing_s += time.perf_counter() - t
            if self.find_options.skip_ratio is not None and out:
                with self._lock:
                    note_ratios(self._behind.get_or_create(kernel, dict), out)
                    if shared is not None:
                        note_ratios(self._behind.get_or_create(shared, dict), out)
            if self.find_options.carry and out:
                with self._lock:  # Note [carried to other sizes]
                    remember(self._carry.get_or_create(kernel, dict), out,
                             {c.id for c in extra})
        prof.timed += len(out)
        prof.total_s += time.perf_counter() - t_start
        out.sort(key=lambda a: a.time_ms)
        return out

    def _carried_configs(self, problem: ConvProblem, direction: Direction,
                         ids: Sequence[str], infos: Sequence[gd.EngineConfigInfo],
                         want: int, parity: bool) -> list[gd.EngineConfigInfo]:
        """See Note [carried to other sizes]: the configs of ``ids`` on this
        problem's operation graph (heuristics' own where they name one) that
        cuDNN accepts, whose numerics the problem allows, that compile no
        kernels at run time (unless ``find_rtc="all"``, or ``parity``: parity
        compiles for this problem, Note [search parity]) and whose engine
        config needs at most ``want`` bytes (or does not say)."""
        if not ids:
            return []
        named = {i.id: i for i in infos}
        rtc = int(Behavior.RUNTIME_COMPILATION)
        compiles = self.find_options.rtc == "all" or (self.find_options.parity and parity)
        out: list[gd.EngineConfigInfo] = []
        with self._lock, using_device(self.device):
            g = self._graph(problem, direction, 1.0, 0.0, _FULL)
            for algo_id in ids:
                info = named.get(algo_id)
                if info is None:
                    idx, knobs = gd.parse_engine_config_id(algo_id)
                    try:
                        with gd.engine(g.conv.graph, idx) as eng:
                            _, notes, behavior = gd.engine_info(eng)
                            ws = self._config_workspace(eng, knobs)
                    except (CudnnError, ValueError) as exc:
                        log.debug("mucudnn: carried config %s refused for %s %s: %s",
                                  algo_id, problem, direction, exc)
                        continue
                    info = gd.EngineConfigInfo(idx, knobs, notes, behavior, workspace_bytes=ws)
                if not numerics_allowed(problem.math, info.numerical_notes):
                    continue
                if not compiles and rtc in info.behavior_notes:
                    continue  # See Note [search parity]: carried ones compile where parity does
                if info.workspace_bytes is not None and info.workspace_bytes > want:
                    continue
                out.append(info)
        return out

    def _find_round(self, problem: ConvProblem, direction: Direction,
                    cands: list[gd.EngineConfigInfo], want: int,
                    timed: dict[str, CachedPlan], beat_ms: float = math.inf) -> list[AlgoPerf]:
        """Finalize ``cands`` (on the pool), keep those that fit ``want`` (Note
        [beta and workspace]) and time them (``beat_ms``: Note [a chunk's time
        to beat]); the plans that ran go into ``timed`` by id."""
        prof = self.find_profile
        t = time.perf_counter()
        built = self._build_plans(problem, direction, [(i.id, 0.0) for i in cands])
        prof.finalize_s += time.perf_counter() - t
        found = []
        for info in cands:
            p = built.get((info.id, 0.0))
            if p is None:
                continue
            if info.workspace_bytes is not None and info.workspace_bytes != p.workspace_bytes:
                prof.workspace_mismatch += 1
            # See Note [beta and workspace]: backward-filter's beta = 1 need too
            acc = (self._accumulate_need(problem, direction, info.id)
                   if direction is Direction.BACKWARD_FILTER else 0)
            found.append((p, info, p.workspace_bytes, acc))
        plans, refused = fitting(found, want)
        prof.no_accumulate += refused
        t = time.perf_counter()
        out = self._time_plans(problem, direction, plans, timed, beat_ms) if plans else []
        prof.timing_s += time.perf_counter() - t
        return out

    def _time_plans(self, problem: ConvProblem, direction: Direction,
                    plans: list[tuple[CachedPlan, gd.EngineConfigInfo, int]],
                    timed: dict[str, CachedPlan], beat_ms: float = math.inf) -> list[AlgoPerf]:
        """Time each (plan, its config, its workspace need) on Find's scratch (home
        stream, held by the caller), the cut-offs judging against ``beat_ms``
        until a candidate beats it (Note [a chunk's time to beat]); the plans
        that ran go into ``timed``."""
        prof = self.find_profile
        t = time.perf_counter()
        ptrs = self._find_pointers(problem, direction)
        aligns = tuple(gd.pointer_alignment(q) for q in ptrs)
        if aligns != _FULL:  # pragma: no cover - fresh allocations are 256-aligned
            raise CudaError("cudaMalloc", "misaligned",
                            f"find buffers are not 16-byte aligned: {aligns}")
        ws_ptr, have = self._find_workspace(max(p.workspace_bytes for p, _, _ in plans))
        prof.scratch_s += time.perf_counter() - t
        out: list[AlgoPerf] = []
        ratio, cold, best = self.find_options.probe_ratio, self.find_options.cold_ratio, beat_ms
        for p, info, need in plans:
            if p.workspace_bytes > have:
                continue
            p, pack, run = self._find_run(problem, direction, p, ptrs, ws_ptr)
            try:
                call = FirstTimed(run, prof)
                warmup = self.find_options.warmup
                times = []
                if warmup > 0:
                    # See Note [cold probe] and Note [long runs]: the warm-up run, timed
                    first = time_on_stream(call, self.stream, warmup=0, repeat=1)[0]
                    warmup -= 1
                    prof.gpu_s += first / 1e3
                    launch_ms = call.host_s * 1e3
                    if (cold is not None and best < math.inf
                            and cold_out(first, launch_ms, best, cold)):
                        prof.cold_out += 1
                        times = [first]
                    elif (once := long_run(first, launch_ms, self.find_options.long_ms)) is not None:
                        prof.long_runs += 1
                        times = [once]
                if not times:
                    # See Note [held timing]: runs after the first, which loaded the kernels
                    held = self.find_options.hold and not call.first
                    host = self.find_options.host  # Note [the host's share of a find]
                    times = time_on_stream(call, self.stream, warmup=warmup, repeat=1, held=held,
                                           host=host)
                    if ratio is None or times[0] <= ratio * best:
                        times += time_on_stream(run, self.stream, warmup=0,
                                                repeat=self.find_options.repeat - 1, held=held,
                                                host=host)
                    else:
                        prof.probed_out += 1
                    prof.gpu_s += sum(times) / 1e3
            except CudnnError as exc:
                log.debug("mucudnn: engine config %s failed to run for %s %s: %s",
                          p.id, problem, direction, exc)
                continue
            finally:
                pack.close()
            t_ms = float(statistics.median(times))
            best = min(best, t_ms)
            out.append(AlgoPerf(algo=p.id, time_ms=t_ms, workspace_bytes=need, math_type=0,
                                determinism=1 if info.deterministic else 0))
            timed[p.id] = p
        self.stream.synchronize()
        return out

    def _find_run(self, problem: ConvProblem, direction: Direction, p: CachedPlan, ptrs: tuple,
                  ws_ptr: Optional[int]) -> tuple[CachedPlan, BackendDescriptor, Any]:
        """``(plan, its variant pack on find's scratch, the call that executes
        it)`` for timing ``p``, rebuilt where a small plan cache evicted it
        meanwhile; the caller closes the pack."""
        if p.closed:
            p = self._plan(problem, direction, p.id, 1.0, 0.0, _FULL)
        pack = gd.variant_pack((gd.UID_X, gd.UID_W, gd.UID_Y), ptrs,
                               ws_ptr if p.workspace_bytes else None)
        run = functools.partial(lib.cudnnBackendExecute, self.handle._as_parameter_,
                                p.plan._as_parameter_, pack._as_parameter_)
        return p, pack, run


    def _retime_best(self, problem: ConvProblem, direction: Direction, out: list[AlgoPerf],
                     timed: dict[str, CachedPlan]) -> list[AlgoPerf]:
        """``out`` with its ``find_retime`` fastest entries timed again (Note
        [re-timing the winners]); ``timed``: their plans, by config id."""
        best = sorted(range(len(out)), key=lambda i: out[i].time_ms)[:self.find_options.retime]
        # See Note [long runs]: their biases are microseconds; not run again
        long_ms = math.inf if self.find_options.long_ms is None else self.find_options.long_ms
        plans = {i: timed[str(out[i].algo)] for i in best if out[i].time_ms < long_ms}
        if not plans:
            return out
        out = list(out)
        ptrs = self._find_pointers(problem, direction)
        ws_ptr, have = self._find_workspace(max(p.workspace_bytes for p in plans.values()))
        for i, plan in plans.items():
            if plan.workspace_bytes > have:  # pragma: no cover
                continue  # the scratch shrank meanwhile (allocation failed): keep the time
            p, pack, run = self._find_run(problem, direction, plan, ptrs, ws_ptr)
            try:
                times = time_on_stream(run, self.stream, warmup=self.find_options.warmup,
                                       repeat=self.find_options.repeat,
                                       held=self.find_options.hold, host=self.find_options.host)
            except CudnnError as exc:  # pragma: no cover - it ran a moment ago
                log.debug("mucudnn: re-timing %s failed: %s", p.id, exc)
                continue
            finally:
                pack.close()
            self.find_profile.gpu_s += sum(times) / 1e3
            self.find_profile.retimed += 1
            out[i] = dataclasses.replace(out[i], time_ms=float(statistics.median(times)))
        self.stream.synchronize()
        return out
