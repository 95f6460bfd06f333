"""The cuDNN graph (backend) API backend for ``get_backend("cudnn-graph")``.

``find()`` builds the operation graph of the problem (one convolution
operation), takes engine configurations from heuristics mode A, mode B (where
supported: 2-D, ungrouped, undilated) and FALLBACK, de-duplicates them by
engine-config id, builds and finalizes an execution plan for each from its id
(the same path ``run()`` takes), drops those that fail to finalize and those
whose workspace exceeds ``min(workspace_limit, find cap)``, and times each on
real random buffers (CUDA events on the backend's stream, 1 warm-up, median of
``find_repeat`` >= 3 runs). ``AlgoPerf.algo`` is the engine-config id
``"e<engine global index>;k<knob type>=<value>..."`` (knob types ascending),
from which ``run()`` rebuilds the plan. With ``fold`` (the default) a strided
first layer over few channels in channels-last also gets the configs of its
problem folded by space-to-depth, ``"fold<s>|<engine config id>"``, timed
with their transforms (Note [folded first layers] in :mod:`.fold`).

Numerics follow the problem's math mode, from each engine's numerical notes:
``"fma"`` drops engines noted TENSOR_CORE (TF32 for float32) or
DOWN_CONVERT_INPUTS; ``"default"`` and ``"tensor_op"`` drop DOWN_CONVERT_INPUTS;
all but ``"tensor_op_allow_conversion"`` drop REDUCED_PRECISION_REDUCTION
(the problem's compute type is the accumulation type, as in the legacy API).
``determinism`` is 0 for engines noted NONDETERMINISTIC, else 1.

Alpha and beta are baked into the operation, and cuDNN sees each tensor's byte
alignment (the largest power of two <= 16 dividing its pointer), so finalized
plans are cached per (problem at that batch, direction, id, alpha, beta,
alignments of x, w, y): LRU, bounded, closed on eviction, as are the operation
graphs they are built on and the variant packs (pointers baked in) of each
plan. ``bind()`` returns a launcher that only calls
``cudnnBackendExecute(handle, plan, variant_pack)``.

The workspace contract is :meth:`workspace_size` (the plan with 16-byte
aligned tensors, alpha 1, beta 0), which planning uses. A launcher's own
``workspace_bytes`` is that of the plan for its alignments and scalars. Where
an engine config cannot run at the call's alignments or scalars, ``bind``
raises :class:`~mucudnn.errors.UnsupportedConfigError`; it never substitutes
another config (the engine asks the planner, so ``Convolution.plans`` always
names what runs).
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import functools
import logging
import math
import os
import statistics
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence, Union

from .._cudnn import graph_descriptors as gd
from .._cudnn.backend_api import BackendDescriptor
from .._cudnn.enums import BackendBehaviorNote as Behavior
from .._cudnn.errors import CudnnError
from .._cudnn.prototypes import lib, raise_status
from ..caches import LRU
from ..cuda import time_on_stream, using_device
from ..errors import InvalidValueError, UnsupportedConfigError
from ..problem import AlgoPerf, ConvProblem, Direction
from . import fold as _fold
from ._device import DeviceBackend, array_pointer
from .base import ConvTensors, Launcher
from .find_options import FindOptions
from .fold_cudnn import FoldTransforms
from .graph_candidates import (SEARCH_MODES, FirstTimed,
                               carried_ids, cold_out, far_cut, fitting, knob_variants,
                               long_run, note_ratios, numerics_allowed, over_cap, remember,
                               rtc_cut, top_k_cut)

__all__ = ["CudnnGraphBackend", "CudnnGraphKnobsBackend", "SEARCH_MODES", "knob_variants", "numerics_allowed",
           "format_engine_config_id", "parse_engine_config_id"]

log = logging.getLogger("mucudnn")

format_engine_config_id = gd.format_engine_config_id
parse_engine_config_id = gd.parse_engine_config_id

_MAX = gd.MAX_ALIGNMENT
_FULL = (_MAX, _MAX, _MAX)

def canonical_id(algo: Any) -> str:
    """The canonical form of an engine-config id (ValueError if it is none):
    knob types ascending.

    >>> canonical_id("e5;k3=1;k2=0")
    'e5;k2=0;k3=1'
    """
    idx, knobs = gd.parse_engine_config_id(algo)
    return gd.format_engine_config_id(idx, knobs)


class _Graph:
    """A cached operation graph; closed once evicted and no cached plan uses it."""

    __slots__ = ("conv", "refs", "cached", "ids", "mode_ids", "knob_space", "_refs_lock")

    def __init__(self, conv: gd.ConvGraph) -> None:
        self.conv = conv
        self.refs = 0
        self.cached = True
        self.ids: Optional[list[gd.EngineConfigInfo]] = None  # heuristics, once asked
        self.mode_ids: dict[str, list[str]] = {}  # each mode's ranking (config ids)
        self.knob_space: Optional[list[gd.EngineConfigInfo]] = None  # search="knobs", once
        # Plans are finalized on worker threads (Note [parallel finalization]).
        self._refs_lock = threading.Lock()

    def acquire(self) -> None:
        with self._refs_lock:
            self.refs += 1

    def release(self) -> None:
        with self._refs_lock:
            self.refs -= 1
        self._maybe_close()

    def evict(self) -> None:
        self.cached = False
        self._maybe_close()

    def _maybe_close(self) -> None:
        with self._refs_lock:
            close = self.refs <= 0 and not self.cached
        if close:
            self.conv.close()


class _Plan:
    """A finalized execution plan, its engine config pieces, its workspace size,
    its engine's notes and its variant packs (LRU by pointers).

    Note [plan lifetimes]: a plan is held by the backend's plan cache and by
    every bound launcher that executes it (``holders``). It is closed, its
    descriptors destroyed in dependency order (plan, config, knobs, engine,
    then the operation graph once no plan uses it), when it is neither cached
    nor held. Variant packs reference no other descriptor, so the pack cache
    simply drops them (their finalizers destroy them).
    """

    __slots__ = ("id", "graph", "engine", "knobs", "cfg", "plan", "workspace_bytes",
                 "info", "packs", "holders", "cached", "closed", "__weakref__")

    def __init__(self, graph: _Graph, algo_id: str, handle: Any, max_packs: int) -> None:
        idx, knobs = gd.parse_engine_config_id(algo_id)
        self.id = gd.format_engine_config_id(idx, knobs)
        self.graph = graph
        self.engine: Any = None  # descriptors, set below (None until built)
        self.cfg: Any = None
        self.plan: Any = None
        self.knobs: list[BackendDescriptor] = []
        self.packs: LRU[tuple, BackendDescriptor] = LRU("cudnn_graph.packs", max_packs)
        self.holders = 0
        self.cached = True
        self.closed = False
        graph.acquire()
        try:
            self.engine = gd.engine(graph.conv.graph, idx)
            try:
                _, notes, behavior = gd.engine_info(self.engine)
            except CudnnError:  # pragma: no cover - notes are informative only here
                notes, behavior = (), ()
            self.info = gd.EngineConfigInfo(idx, knobs, notes, behavior)
            self.knobs = [gd.knob_choice(t, v) for t, v in knobs]
            self.cfg = gd.engine_config(self.engine, self.knobs)
            self.plan = gd.execution_plan(handle, self.cfg)
            self.workspace_bytes = gd.plan_workspace_size(self.plan)
        except BaseException:
            self.close()
            raise

    def acquire(self) -> None:
        self.holders += 1

    def release(self) -> None:
        self.holders -= 1
        self._maybe_close()

    def evict(self) -> None:
        self.cached = False
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self.holders <= 0 and not self.cached:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.packs.clear()
        for d in (self.plan, self.cfg, *self.knobs, self.engine):
            if d is not None:
                d.close()
        self.graph.release()


def _lowbit(n: int) -> int:
    """The largest power of two dividing ``n`` (capped at the graph API's 16 bytes)."""
    return gd.MAX_ALIGNMENT if n == 0 else min(gd.MAX_ALIGNMENT, n & -n)


def _row_offsets(problem: ConvProblem, offset: int) -> tuple[int, int]:
    """Byte offsets of row ``offset`` in ``problem``'s x (dx) and y (dy)."""
    item = problem.itemsize
    return (offset * math.prod(problem.x_shape[1:]) * item,
            offset * math.prod(problem.output_shape[1:]) * item)


class CudnnGraphBackend(DeviceBackend):
    """cuDNN's graph (backend) API as a :class:`~mucudnn.backends.base.Backend`.

    ``device``, ``stream``, ``find_workspace_limit``: see
    :class:`~mucudnn.backends._device.DeviceBackend` (device, streams, handle and
    arrays are shared with the legacy backend). ``find``: how find() searches,
    a :class:`~mucudnn.backends.find_options.FindOptions` (default: its
    defaults); keyword options are its fields, by name or by the backend's
    keyword names (``find_rtc="all"`` is ``FindOptions(rtc="all")``). Its
    ``key()`` enters :meth:`cache_name`, so two differently configured
    backends never share benchmark-cache entries or plans (Note [candidate
    sets in keys]). ``find_threads``: host threads that finalize find()'s
    candidate plans (default: the CPU count, at most 16; 1 finalizes on the
    calling thread; Note [parallel finalization]); it changes no result.
    ``plan_cache_size``, ``graph_cache_size``, ``pack_cache_size``: LRU
    bounds (plans, operation graphs, variant packs per plan).

    Raises :class:`mucudnn.cuda.NoDeviceError` where there is no GPU or driver.

    >>> CudnnGraphBackend.name
    'cudnn-graph'
    """

    name = "cudnn-graph"

    def __init__(self, device: Optional[int] = None, stream: Any = None,
                 find_workspace_limit: Optional[int] = None, *,
                 find: Optional[FindOptions] = None, find_threads: Optional[int] = None,
                 plan_cache_size: int = 256, graph_cache_size: int = 256,
                 pack_cache_size: int = 64, **find_options: Any) -> None:
        opts = FindOptions.from_kwargs(find, **find_options)
        if find_threads is None:
            find_threads = min(16, os.cpu_count() or 1)
        for n, v in (("plan_cache_size", plan_cache_size), ("graph_cache_size", graph_cache_size),
                     ("pack_cache_size", pack_cache_size), ("find_threads", find_threads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidValueError(f"{n}: expected an int >= 1, got {v!r}")
        super().__init__(device=device, stream=stream, find_workspace_limit=find_workspace_limit)
        #: the search, one frozen value (its key() enters cache_name)
        self.find_options = opts
        self.heuristic_modes = opts.heuristic_modes
        self.find_warmup, self.find_repeat = opts.warmup, opts.repeat
        self.find_threads = int(find_threads)
        self.find_prefilter = opts.prefilter
        self.find_top_k = opts.top_k
        self.find_probe_ratio = opts.probe_ratio
        self.find_cold_ratio = opts.cold_ratio
        self.find_rtc = opts.rtc
        self.find_parity = opts.parity
        self.find_retime = opts.retime
        self.find_skip_ratio = opts.skip_ratio
        self.find_long_ms = opts.long_ms
        self.find_zero = opts.zero
        self.finds_zero_once = opts.zero == "once"
        self.find_carry = opts.carry
        self.fold = opts.fold
        self.search = opts.search
        # Note [knob search]: a different candidate set measures differently, so
        # its benchmark-cache entries and memoised plans are kept apart.
        self.name = "cudnn-graph+knobs" if opts.search == "knobs" else "cudnn-graph"
        self._search_key = self.name + opts.key()
        self.search_knob_values = opts.knob_values
        self.search_max_configs = opts.max_configs
        self._pool: Optional[ThreadPoolExecutor] = None
        #: plans handed back by launcher finalizers (Note [releases from finalizers])
        self._releases: collections.deque[_Plan] = collections.deque()
        self.plan_cache_size = int(plan_cache_size)
        self.graph_cache_size = int(graph_cache_size)
        self.pack_cache_size = int(pack_cache_size)
        self._graphs: LRU[tuple, _Graph] = LRU("cudnn_graph.graphs", self.graph_cache_size,
                                               on_evict=lambda _k, g: g.evict())
        self._plans: LRU[tuple, _Plan] = LRU("cudnn_graph.plans", self.plan_cache_size,
                                             on_evict=lambda _k, p: p.evict())
        #: Note [far behind at another size]: per kernel (batch 1) and direction,
        #: each config's least time over its find()'s best
        self._behind: LRU[tuple, dict[str, float]] = LRU("cudnn_graph.behind",
                                                         self.graph_cache_size)
        #: Note [carried to other sizes]: per kernel (batch 1) and direction,
        #: the configs that led, or were preferred over the cap, at sizes found before
        self._carry: LRU[tuple, dict[str, None]] = LRU("cudnn_graph.carry",
                                                       self.graph_cache_size)
        #: Note [search parity]: the kernels (batch 1, direction) found before
        self._searched: LRU[tuple, bool] = LRU("cudnn_graph.searched", self.graph_cache_size)

    def cache_name(self, problem: ConvProblem) -> str:
        """``name`` with the search's key (:meth:`FindOptions.key`), and
        ``"+fold"`` for problems that fold while ``fold`` is on (Note
        [candidate sets in keys])."""
        return _fold.cache_name(self._search_key, problem) if self.fold else self._search_key

    # -- caches ------------------------------------------------------------------------
    @staticmethod
    def _graph_key(problem: ConvProblem, direction: Direction, alpha: float, beta: float,
                   aligns: tuple) -> tuple:
        return (problem.key(), direction.value, float(alpha), float(beta), tuple(aligns))

    def _graph(self, problem: ConvProblem, direction: Direction, alpha: float, beta: float,
               aligns: tuple) -> _Graph:
        key = self._graph_key(problem, direction, alpha, beta, aligns)
        g = self._graphs.get(key)
        if g is not None:
            return g
        with using_device(self.device):
            g = _Graph(gd.ConvGraph(problem, direction, alpha, beta, aligns, handle=self.handle))
        self._graphs.put(key, g)
        return g

    def _plan(self, problem: ConvProblem, direction: Direction, algo_id: str, alpha: float,
              beta: float, aligns: tuple) -> _Plan:
        """The cached finalized plan (built on first use; CudnnError if cuDNN refuses)."""
        key = self._graph_key(problem, direction, alpha, beta, aligns) + (algo_id,)
        with self._lock:
            if self._releases:
                self._drain_releases()
            p = self._plans.get(key)
            if p is not None and not p.closed:
                return p
            g = self._graph(problem, direction, alpha, beta, aligns)
            with using_device(self.device):
                try:
                    p = _Plan(g, algo_id, self.handle, self.pack_cache_size)
                except CudnnError as exc:
                    exc.add_details(problem=problem, direction=str(direction), algo=algo_id,
                                    alignments=aligns)
                    raise
            self._plans.put(key, p)
            return p

    def clear_cache(self) -> None:
        """Drop every cached plan and operation graph (those no launcher holds are
        closed now, Note [plan lifetimes])."""
        with self._lock:
            self._drain_releases()
            self._plans.clear()
            self._graphs.clear()
            self._behind.clear()
            self._carry.clear()
            self._searched.clear()

    def close(self) -> None:
        """Release plans, graphs, find()'s finalizing threads and scratch, and the
        cuDNN handle."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.clear_cache()
        super().close()

    def cache_sizes(self) -> dict[str, int]:
        """How many plans, graphs and variant packs are cached (for tests)."""
        with self._lock:
            return {"plans": len(self._plans), "graphs": len(self._graphs),
                    "packs": sum(len(p.packs) for p in self._plans.values())}

    # -- heuristics ---------------------------------------------------------------------
    def _modes_for(self, problem: ConvProblem) -> list[str]:
        modes = []
        for m in self.heuristic_modes:
            if m == "B" and (problem.nd != 2 or problem.groups != 1
                             or any(d != 1 for d in problem.dilation)):
                continue  # cudnn_graph.h: mode B has no 3-D, grouped or dilated convolutions
            modes.append(m)
        return modes

    def engine_configs(self, problem: ConvProblem, direction: Union[Direction, str],
                       alpha: float = 1.0, beta: float = 0.0,
                       aligns: tuple = _FULL) -> list[gd.EngineConfigInfo]:
        """The heuristics' engine configs for ``problem`` (modes in order, de-duplicated
        by id), with their engines' notes, before any numerics filter."""
        direction = Direction.parse(direction)
        with self._lock, using_device(self.device):
            g = self._graph(problem, direction, alpha, beta, aligns)
            if g.ids is not None:
                return list(g.ids)
            seen: dict[str, gd.EngineConfigInfo] = {}
            modes_s = self.find_profile.modes_s
            for m in self._modes_for(problem):
                t = time.perf_counter()
                try:
                    infos = g.conv.engine_config_infos(m)
                except CudnnError as exc:
                    modes_s[m] = modes_s.get(m, 0.0) + time.perf_counter() - t
                    log.debug("mucudnn: heuristics mode %s refused %s %s: %s", m, problem,
                              direction, exc)
                    continue
                ranking = g.mode_ids.setdefault(m, [])
                for info in infos:
                    if info is None:  # pragma: no cover - unreadable result
                        continue
                    seen.setdefault(info.id, info)
                    ranking.append(info.id)
                modes_s[m] = modes_s.get(m, 0.0) + time.perf_counter() - t
            g.ids = list(seen.values())
            return list(g.ids)

    def blocked_workspace(self, problem: ConvProblem, direction: Direction,
                          workspace_limit: int) -> Optional[int]:
        """The least workspace over ``workspace_limit`` of the engine configs that
        heuristics rank ahead of the first one that fits it (numerics allowed),
        from the heuristics' own workspace figures (Note [size pruning]).

        On the H200, AlexNet conv1's bf16 channels-last backward-filter at
        batch 256 has 35 such configs (206-239 MB at 256, 52-85 MB at 64) ahead
        of the one engine that fits 64 MiB, which is 5x slower.
        """
        direction = Direction.parse(direction)
        limit = int(workspace_limit)
        least: Optional[int] = None
        with self.on_home_stream():
            infos = self.engine_configs(problem, direction)
        for info in infos:
            if not numerics_allowed(problem.math, info.numerical_notes):
                continue
            ws = info.workspace_bytes
            if ws is None or ws <= limit:
                break
            least = ws if least is None else min(least, ws)
        return least

    # -- knob search ---------------------------------------------------------------------
    # Note [knob search]: heuristics name a few dozen engine configs, each an
    # engine with one setting of its knobs (tile sizes, split-K, swizzle, ...).
    # Under a tight workspace cap the best of those can be far behind what the
    # same engines reach with other knob values (a smaller split-K buffer, a
    # tile that needs less scratch). ``search="knobs"`` adds, for every engine
    # of the operation graph (CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT) that
    # the problem's numerics allow, the settings around each config heuristics
    # named for it (or around its defaults where they named none): each knob
    # moved alone through up to ``search_knob_values`` of the values its
    # CUDNN_ATTR_ENGINE_KNOB_INFO range allows (a coordinate neighbourhood, not
    # the full product, which runs to millions). Each setting's engine config is
    # finalized and its workspace read (CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE)
    # before any plan is built, so configs over the cap and settings cuDNN
    # refuses cost microseconds. Engines that compile kernels at run time
    # (RUNTIME_COMPILATION) keep only the configs heuristics named: each new
    # setting would be a new compilation. Added configs are ordered by their
    # engine's best heuristics rank, and at most ``search_max_configs`` of those
    # fitting the cap are timed per find() call; probing (``find_probe_ratio``)
    # keeps the slow ones cheap. The backend is named "cudnn-graph+knobs", so
    # its measurements and plans never mix with heuristics-only ones (the
    # benchmark cache and the plan memo key on the backend's name).
    #
    # Measured on the H200 (tools/knob_search.py, docs/BENCHMARKS.md "Knob
    # search"): executed totals of the eight kernels that keep 64 MiB plans
    # behind PyTorch fall 8% at 64 MiB and 4% at 128 MiB, up to 25% on one
    # kernel, for 1.5-11x the optimisation time: an option, not the default.
    def _knob_space(self, problem: ConvProblem, direction: Direction,
                    heuristic: Sequence[gd.EngineConfigInfo]) -> list[gd.EngineConfigInfo]:
        """The knob-space configs of Note [knob search] (cached per graph), each
        with its engine config's workspace; heuristics' own configs left out."""
        with self._lock, using_device(self.device):
            g = self._graph(problem, direction, 1.0, 0.0, _FULL)
            if g.knob_space is not None:
                return list(g.knob_space)
            t = time.perf_counter()
            rank: dict[int, int] = {}
            bases: dict[int, list[tuple[tuple[int, int], ...]]] = {}
            for r, info in enumerate(heuristic):
                rank.setdefault(info.global_index, r)
                bases.setdefault(info.global_index, []).append(info.knobs)
            seen = {info.id for info in heuristic}
            found: list[tuple[int, int, gd.EngineConfigInfo]] = []
            for idx in range(int(g.conv.global_engine_count())):
                try:
                    eng = gd.engine(g.conv.graph, idx)
                except CudnnError:
                    continue  # not an engine for this graph
                with eng:
                    try:
                        _, notes, behavior = gd.engine_info(eng)
                        knobs = gd.engine_knob_infos(eng)
                    except CudnnError as exc:  # pragma: no cover - unreadable engine
                        log.debug("mucudnn: engine %d of %s %s unreadable: %s", idx, problem,
                                  direction, exc)
                        continue
                    if not numerics_allowed(problem.math, notes):
                        continue
                    if int(Behavior.RUNTIME_COMPILATION) in behavior:
                        continue
                    for base in bases.get(idx) or [()]:
                        for setting in knob_variants(base, knobs, self.search_knob_values):
                            info = gd.EngineConfigInfo(idx, setting, notes, behavior)
                            if info.id in seen:
                                continue
                            seen.add(info.id)
                            try:
                                ws = self._config_workspace(eng, setting)
                            except (CudnnError, ValueError):
                                continue  # cuDNN refuses this setting
                            info = dataclasses.replace(info, workspace_bytes=ws)
                            found.append((rank.get(idx, len(heuristic)), len(found), info))
            found.sort(key=lambda e: e[:2])
            g.knob_space = [info for *_, info in found]
            self.find_profile.knob_s += time.perf_counter() - t
            return list(g.knob_space)

    @staticmethod
    def _config_workspace(eng: BackendDescriptor,
                          setting: Sequence[tuple[int, int]]) -> Optional[int]:
        """The workspace of ``eng`` with knob ``setting`` (None where cuDNN does not
        report it before a plan); CudnnError where cuDNN refuses the setting."""
        knobs: list[BackendDescriptor] = []
        try:
            for t, v in setting:
                knobs.append(gd.knob_choice(t, v))
            with gd.engine_config(eng, knobs) as cfg:
                return gd.engine_config_workspace(cfg)
        finally:
            for k in knobs:
                k.close()

    # -- find -----------------------------------------------------------------------------
    # Note [parallel finalization]: finalizing an execution plan is where a cold
    # find() spends its time (cuDNN compiles or loads the engine's kernels), and it
    # is one ctypes call that releases the GIL. So find() finalizes its candidates
    # on a thread pool, as cudnn-frontend's build_plan_at_index is meant to be
    # used when autotuning, and times them one at a time on the GPU. Candidates
    # whose engine config already says it needs more workspace than the cap
    # (CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, cuDNN >= 9.2) are never finalized.
    # Workers only build plans (descriptors of their own on a graph the calling
    # thread holds); the caches are filled by the calling thread under the lock.
    def _build_plans(self, problem: ConvProblem, direction: Direction,
                     wanted: Sequence[tuple[str, float]]) -> dict[tuple[str, float], _Plan]:
        """Finalized plans (alpha 1, 16-byte alignment) for ``(engine config id,
        beta)`` pairs, from the cache or built on the pool; pairs that do not
        finalize are left out."""
        out: dict[tuple[str, float], _Plan] = {}
        todo: list[tuple[str, float, tuple, _Graph]] = []
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

        def build(item: tuple[str, float, tuple, _Graph]) -> tuple[Optional[_Plan], float]:
            algo_id, beta, _key, g = item
            t = time.perf_counter()
            with using_device(device):
                try:
                    return _Plan(g, algo_id, handle, packs), time.perf_counter() - t
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

    def _accumulate_need(self, problem: ConvProblem, direction: Direction,
                         algo_id: str) -> Optional[int]:
        """Note [beta and workspace]: the workspace of ``algo_id`` on the beta = 1
        graph, read from its engine config without finalizing a plan (a plan
        only where cuDNN does not report it before one); None where cuDNN
        refuses the config with beta = 1 (it cannot accumulate)."""
        idx, knobs = gd.parse_engine_config_id(algo_id)
        with self._lock, using_device(self.device):
            g = self._graph(problem, direction, 1.0, 1.0, _FULL)
            try:
                with gd.engine(g.conv.graph, idx) as eng:
                    ws = self._config_workspace(eng, knobs)
                if ws is None:
                    ws = int(self._plan(problem, direction, algo_id, 1.0, 1.0,
                                        _FULL).workspace_bytes)
                return ws
            except (CudnnError, ValueError):
                return None

    def find(self, problem: ConvProblem, direction: Direction,
             workspace_limit: Optional[int]) -> list[AlgoPerf]:
        """Every engine config that finalized and ran for ``problem`` (at its own
        batch) with workspace <= ``workspace_limit`` (and the find cap), fastest
        first; with ``fold``, also those of the problem folded (Note [folded
        first layers])."""
        direction = Direction.parse(direction)
        limit = None if workspace_limit is None else int(workspace_limit)
        if limit is not None and limit < 0:
            raise ValueError(f"workspace_limit: expected bytes >= 0, got {workspace_limit}")
        out = self._find_configs(problem, direction, limit)
        if self.fold:
            folded = self._find_folded(problem, direction, limit)
            if folded:
                self.find_profile.folded += len(folded)
                out = sorted(out + folded, key=lambda a: a.time_ms)
        self.find_profile.calls += 1
        return out

    def _find_folded(self, problem: ConvProblem, direction: Direction,
                     limit: Optional[int]) -> list[AlgoPerf]:
        """Note [folded first layers]: the configs of ``problem`` folded, each
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
        src = dst = None
        try:
            with self.on_home_stream():
                src_bytes, dst_bytes = tf.scratch_bytes
                src = self.alloc_workspace(src_bytes)
                dst = self.alloc_workspace(dst_bytes)
                h = self.handle

                def run(a: int = src.ptr, b: int = dst.ptr) -> None:
                    tf.run_all(h, direction, a, b)

                times = time_on_stream(run, self.stream, warmup=1, repeat=self.find_repeat)
                self.stream.synchronize()
        finally:
            for buf in (src, dst):
                if buf is not None:
                    buf.close()
            tf.close()
        return float(statistics.median(times))

    def _find_configs(self, problem: ConvProblem, direction: Direction,
                      limit: Optional[int]) -> list[AlgoPerf]:
        """find() of ``problem`` as it is (the engine configs heuristics, carried
        configs and the knob search name)."""
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
            cands = [i for i in infos if not self.find_prefilter or i.workspace_bytes is None
                     or i.workspace_bytes <= want]
            prof.configs += len(infos)
            prof.skipped += len(infos) - len(cands)
            with self._lock:
                rankings = dict(self._graph(problem, direction, 1.0, 0.0, _FULL).mode_ids)
            # Note [one zero-workspace find per kernel]: "once" leaves the
            # zero-workspace config to a find() under a cap of 0
            keep_zero = not self.finds_zero_once or want == 0
            rtc = int(Behavior.RUNTIME_COMPILATION)
            kernel = (problem.with_batch(1).key(), direction.value)
            # Note [search parity]: a kernel's first find() times every candidate
            with self._lock:
                first = self.find_parity and self._searched.get(kernel) is None
                self._searched.put(kernel, True)
            if first:
                prof.parity += 1
                top = {c.id for c in top_k_cut(cands, self.find_top_k, rankings, keep_zero)}
                kept = [c for c in cands if c.id in top or rtc not in c.behavior_notes]
                prof.cut += len(cands) - len(kept)
                cands = kept
            else:
                kept = top_k_cut(cands, self.find_top_k, rankings, keep_zero)
                prof.cut += len(cands) - len(kept)
                cands = rtc_cut(kept, self.find_rtc, rankings)
                prof.rtc_cut += len(kept) - len(cands)
            with self._lock:
                behind = dict(self._behind.get(kernel) or {})
            extra: list[gd.EngineConfigInfo] = []  # Note [carried to other sizes]
            if self.find_skip_ratio is not None:
                near = far_cut(cands, behind, self.find_skip_ratio, keep_zero)
                prof.far_cut += len(cands) - len(near)
                cands = near
            if self.find_carry:
                # Note [carried to other sizes]
                with self._lock:
                    memory = self._carry.get_or_create(kernel, dict)
                    carry = carried_ids(list(memory), {c.id for c in cands}, behind,
                                        self.find_skip_ratio)
                    for i in over_cap(infos, want, rankings, self.find_top_k):
                        memory.setdefault(i, None)
                extra = self._carried_configs(problem, direction, carry, infos, want)
                prof.carried += len(extra)
                cands = cands + extra
            if self.search == "knobs":
                # Note [knob search]: the knob space after heuristics' own configs.
                have = {c.id for c in cands}
                extra = [i for i in self._knob_space(problem, direction, infos)
                         if i.id not in have and (i.workspace_bytes is None
                                                  or i.workspace_bytes <= want)]
                extra = extra[:self.search_max_configs]
                prof.knob_configs += len(extra)
                cands = cands + extra
            timed: dict[str, _Plan] = {}
            out = self._find_round(problem, direction, cands, want, timed)
            if self.find_retime and out:
                t = time.perf_counter()
                out = self._retime_best(problem, direction, out, timed)
                prof.timing_s += time.perf_counter() - t
            if self.find_skip_ratio is not None and out:
                with self._lock:
                    note_ratios(self._behind.get_or_create(kernel, dict), out)
            if self.find_carry and out:
                with self._lock:  # Note [carried to other sizes]
                    remember(self._carry.get_or_create(kernel, dict), out,
                             {c.id for c in extra})
        prof.timed += len(out)
        prof.total_s += time.perf_counter() - t_start
        out.sort(key=lambda a: a.time_ms)
        return out

    def _carried_configs(self, problem: ConvProblem, direction: Direction,
                         ids: Sequence[str], infos: Sequence[gd.EngineConfigInfo],
                         want: int) -> list[gd.EngineConfigInfo]:
        """Note [carried to other sizes]: the configs of ``ids`` on this
        problem's operation graph (heuristics' own where they name one) that
        cuDNN accepts, whose numerics the problem allows, that compile no
        kernels at run time (unless ``find_rtc="all"``) and whose engine
        config needs at most ``want`` bytes (or does not say)."""
        if not ids:
            return []
        named = {i.id: i for i in infos}
        rtc = int(Behavior.RUNTIME_COMPILATION)
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
                if self.find_rtc != "all" and not self.find_parity \
                        and rtc in info.behavior_notes:
                    continue  # Note [search parity]: carried ones compile where they led
                if info.workspace_bytes is not None and info.workspace_bytes > want:
                    continue
                out.append(info)
        return out

    def _find_round(self, problem: ConvProblem, direction: Direction,
                    cands: list[gd.EngineConfigInfo], want: int,
                    timed: dict[str, _Plan]) -> list[AlgoPerf]:
        """Finalize ``cands`` (on the pool), keep those that fit ``want`` (Note
        [beta and workspace]) and time them; the plans that ran go into
        ``timed`` by id."""
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
            # Note [beta and workspace]: backward-filter's beta = 1 need too
            acc = (self._accumulate_need(problem, direction, info.id)
                   if direction is Direction.BACKWARD_FILTER else 0)
            found.append((p, info, p.workspace_bytes, acc))
        plans, refused = fitting(found, want)
        prof.no_accumulate += refused
        t = time.perf_counter()
        out = self._time_plans(problem, direction, plans, timed) if plans else []
        prof.timing_s += time.perf_counter() - t
        return out

    def _time_plans(self, problem: ConvProblem, direction: Direction,
                    plans: list[tuple[_Plan, gd.EngineConfigInfo, int]],
                    timed: dict[str, _Plan]) -> list[AlgoPerf]:
        """Time each (plan, its config, its workspace need) on Find's scratch (home
        stream, held by the caller); the plans that ran go into ``timed``."""
        prof = self.find_profile
        t = time.perf_counter()
        ptrs = self._find_pointers(problem, direction)
        aligns = tuple(gd.pointer_alignment(q) for q in ptrs)
        if aligns != _FULL:  # pragma: no cover - fresh allocations are 256-aligned
            raise RuntimeError(f"find buffers are not 16-byte aligned: {aligns}")
        ws_ptr, have = self._find_workspace(max(p.workspace_bytes for p, _, _ in plans))
        prof.scratch_s += time.perf_counter() - t
        out: list[AlgoPerf] = []
        ratio, cold, best = self.find_probe_ratio, self.find_cold_ratio, math.inf
        for p, info, need in plans:
            if p.workspace_bytes > have:
                continue
            p, pack, run = self._find_run(problem, direction, p, ptrs, ws_ptr)
            try:
                call = FirstTimed(run, prof)
                warmup = self.find_warmup
                times = []
                if warmup > 0:
                    # Note [cold probe], Note [long runs]: the warm-up run, timed
                    first = time_on_stream(call, self.stream, warmup=0, repeat=1)[0]
                    warmup -= 1
                    prof.gpu_s += first / 1e3
                    launch_ms = call.host_s * 1e3
                    if (cold is not None and best < math.inf
                            and cold_out(first, launch_ms, best, cold)):
                        prof.cold_out += 1
                        times = [first]
                    elif (once := long_run(first, launch_ms, self.find_long_ms)) is not None:
                        prof.long_runs += 1
                        times = [once]
                if not times:
                    times = time_on_stream(call, self.stream, warmup=warmup, repeat=1)
                    if ratio is None or times[0] <= ratio * best:
                        times += time_on_stream(run, self.stream, warmup=0,
                                                repeat=self.find_repeat - 1)
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

    def _find_run(self, problem: ConvProblem, direction: Direction, p: _Plan, ptrs: tuple,
                  ws_ptr: Optional[int]) -> tuple[_Plan, BackendDescriptor, Any]:
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

    # Note [re-timing the winners]: on the H200 the default find() predicted the
    # same AlexNet plan 4-14% slower than a run that timed every configuration
    # (conv2 forward, 8 x 32 of one engine config: 1.07 vs 0.94 ms), and
    # over-predicted its own plans' execution by 4.1% against 1.6%
    # (docs/BENCHMARKS.md, "Seventh session"). Its best candidates are timed
    # first, right after the host work of heuristics and finalization, with
    # the GPU idle before them; timing everything warms the GPU before most
    # winners run. Biased unevenly between micro-batch sizes, that steered
    # AlexNet's size choices (+5.3% executed). ``find_retime=k`` times the k
    # best of each find() call again once every candidate has run (warm-up and
    # ``find_repeat`` runs) and reports that median. On by default (k = 2): in
    # one H200 run (docs/BENCHMARKS.md, "Eighth session") it took AlexNet's
    # executed plans from 15.41 to 14.73 ms (every config timed: 14.13) and
    # ResNet-18's prediction error from +4.8% to -1.2% (executed 16.09 vs
    # 16.07 ms), with no measurable cost in optimisation time (13.1 vs 12.8 s,
    # 9.7 vs 9.3 s).
    def _retime_best(self, problem: ConvProblem, direction: Direction, out: list[AlgoPerf],
                     timed: dict[str, _Plan]) -> list[AlgoPerf]:
        """``out`` with its ``find_retime`` fastest entries timed again (Note
        [re-timing the winners]); ``timed``: their plans, by config id."""
        best = sorted(range(len(out)), key=lambda i: out[i].time_ms)[:self.find_retime]
        # Note [long runs]: their biases are microseconds; not run again
        long_ms = math.inf if self.find_long_ms is None else self.find_long_ms
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
                times = time_on_stream(run, self.stream, warmup=self.find_warmup,
                                       repeat=self.find_repeat)
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

    # -- workspace size ------------------------------------------------------------------
    def workspace_size(self, problem: ConvProblem, direction: Direction,
                       algo: Union[int, str], math_type: Union[int, str] = 0) -> int:
        """CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE of engine config ``algo`` for
        ``problem`` (16-byte aligned tensors, alpha 1); see Note [beta and workspace]."""
        direction = Direction.parse(direction)
        folded = _fold.split_fold_id(algo)
        if folded is not None:  # Note [folded first layers]
            f = _fold.folding(problem, folded[0])
            return (_fold.regions(f, problem.batch).inner
                    + self._workspace_need(f.inner, direction, canonical_id(folded[1])))
        return self._workspace_need(problem, direction, canonical_id(algo))

    def _workspace_need(self, problem: ConvProblem, direction: Direction, algo_id: str) -> int:
        """The workspace planning uses for ``algo_id``.

        Note [beta and workspace]: beta is baked into a graph plan, and a plan
        that accumulates (beta != 0) can need more workspace than the beta = 0
        one. Every micro-batch of a backward-filter plan but the first runs with
        beta = 1, so for that direction the need is the larger of the two, the
        beta = 1 one read from its engine config (CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE,
        equal to the plan's: test_accumulate_need_is_the_beta_one_plans) so that
        find() finalizes one plan per candidate, not two. An engine config that
        cuDNN refuses with beta = 1 cannot run a micro-batch after the first:
        find() leaves it out of backward-filter results unless no other config
        is left (the H200 once chose one for ResNet-50's strided 1x1
        backward-filter at batch 32, and its plan could not be bound); here it
        keeps its beta = 0 need, and binding it with beta = 1 is refused and
        re-planned. Forward and
        backward-data run with the caller's beta; a launcher reports its own
        need, which the engine checks before running.
        """
        need = int(self._plan(problem, direction, algo_id, 1.0, 0.0, _FULL).workspace_bytes)
        if direction is Direction.BACKWARD_FILTER:
            need = max(need, self._accumulate_need(problem, direction, algo_id) or 0)
        return need

    # -- run ----------------------------------------------------------------------------------
    def run(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
            tensors: ConvTensors, alpha: float = 1.0, beta: float = 0.0,
            workspace: Any = None) -> None:
        """One convolution on the home stream (asynchronous); see :meth:`bind`."""
        p = tensors.problem
        ptrs = (array_pointer("x", tensors.x, p.x_shape, p.dtype),
                array_pointer("w", tensors.w, p.w_shape, p.dtype),
                array_pointer("y", tensors.y, p.output_shape, p.dtype))
        ax, aw, ay = (gd.pointer_alignment(q, p.itemsize) for q in ptrs)
        aligns = (ax, aw, ay)
        ws_size = 0 if workspace is None else int(workspace.nbytes)
        ws_ptr = int(workspace.ptr) if ws_size else 0
        launch = self.bind(direction, algo, math_type, p, 0, p.batch, alpha, beta, aligns)
        if ws_size < launch.workspace_bytes:
            raise ValueError(
                f"workspace: engine config {launch.algo} ({Direction.parse(direction)}) needs "
                f"{launch.workspace_bytes} bytes for {p!r}, got {ws_size}")
        with self.on_home_stream():
            launch(*ptrs, ws_ptr, ws_size)

    def bind(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
             problem: ConvProblem, offset: int, size: int, alpha: float = 1.0,
             beta: float = 0.0, aligns: tuple[int, int, int] = _FULL) -> Launcher:
        """A launcher for rows ``[offset, offset + size)`` of ``problem``:
        ``launch(x, w, y, workspace, workspace_bytes)`` with whole-batch device
        pointers calls ``cudnnBackendExecute(handle, plan, variant_pack)``.

        The plan is the cached one for (the micro-batch's problem, direction,
        ``algo``, alpha, beta, the micro-batch pointers' alignments: ``aligns``
        of the whole-batch tensors lowered by the rows' byte offset); the
        launcher holds it (Note [plan lifetimes]). Variant packs (pointers baked
        in) are cached per plan. Raises
        :class:`~mucudnn.errors.UnsupportedConfigError` when the engine config
        does not finalize for these alignments and scalars.
        """
        direction = Direction.parse(direction)
        alpha, beta = float(alpha), float(beta)
        if offset < 0 or size < 1 or offset + size > problem.batch:
            raise ValueError(f"micro-batch rows [{offset}, {offset + size}) outside the batch "
                             f"of {problem.batch}")
        folded = _fold.split_fold_id(algo)
        if folded is not None:
            return self._bind_folded(direction, folded, math_type, problem, offset, size,
                                     alpha, beta, aligns)
        algo_id = canonical_id(algo)
        sub = problem.with_batch(size)
        ox, oy = _row_offsets(problem, offset)
        mb_aligns = (min(int(aligns[0]), _lowbit(ox)), int(aligns[1]),
                     min(int(aligns[2]), _lowbit(oy)))
        with self._lock:
            try:
                plan = self._plan(sub, direction, algo_id, alpha, beta, mb_aligns)
            except CudnnError as exc:
                raise UnsupportedConfigError(
                    f"algo: engine config {algo_id} cannot run {sub!r} {direction} with "
                    f"pointers aligned to {mb_aligns} bytes (alpha {alpha}, beta {beta}): {exc}",
                    algo=algo_id, reason=str(exc)) from exc
            plan.acquire()
        execute = lib.raw("cudnnBackendExecute")
        h = self.handle.handle
        pd = plan.plan.handle
        packs = plan.packs
        uids = gd.uid_array((gd.UID_X, gd.UID_W, gd.UID_Y))
        make_pack = gd.fast_variant_pack
        # the previous call's pointers, its pack's handle and the pack (held, so
        # that the handle stays valid while the packs cache may evict it)
        last: list[Any] = [None, None, None]

        def fail(status: int, ws_size: int) -> None:
            raise_status(status, "cudnnBackendExecute", problem=sub, direction=str(direction),
                         algo=algo_id, workspace_bytes=ws_size)

        def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
            key = (x + ox, w, y + oy, ws)  # the micro-batch's own pointers: the plan's
            if key == last[0]:             # packs serve every micro-batch that uses it
                ph = last[1]
            else:
                pack = packs.peek(key)  # lock-free: a miss only builds the pack again
                if pack is None:  # Note [variant packs on the hot path]
                    pack = make_pack(uids, key[0], key[1], key[2], ws)
                    packs.put(key, pack)
                ph = pack.handle
                last[0], last[1], last[2] = key, ph, pack
            st = execute(h, pd, ph)
            if st:
                fail(st, ws_size)

        launch = self._launcher(call, (plan, self.handle), plan.workspace_bytes, plan.id)
        weakref.finalize(launch, self._release_plan, plan)
        return launch

    def _bind_folded(self, direction: Direction, folded: tuple[int, Union[int, str]],
                     math_type: Union[int, str], problem: ConvProblem, offset: int, size: int,
                     alpha: float, beta: float, aligns: tuple[int, int, int]) -> Launcher:
        """Note [folded first layers]: a launcher that folds this micro-batch's
        operands into the workspace's regions, runs the inner config's launcher
        there, and unfolds its result (alpha and beta applied there)."""
        s, inner_algo = folded
        f = _fold.folding(problem, s)
        reg = _fold.regions(f, size)
        ox, oy = _row_offsets(problem, offset)
        y_align = min(int(aligns[2]), _lowbit(oy))
        fwd = direction is Direction.FORWARD
        inner = self.bind(direction, inner_algo, math_type, f.inner.with_batch(size), 0, size,
                          alpha if fwd else 1.0, beta if fwd else 0.0, (_MAX, _MAX, y_align))
        try:
            tf = FoldTransforms(f, size)
        except CudnnError as exc:
            raise UnsupportedConfigError(
                f"algo: cannot fold {problem!r} for {direction}: {exc}",
                algo=_fold.fold_id(s, inner_algo), reason=str(exc)) from exc
        need = reg.inner + int(inner.workspace_bytes)
        handle = self.handle
        ca, cb = ctypes.c_float(alpha), ctypes.c_float(beta)
        a_off, b_off, i_off = reg.a, reg.b, reg.inner
        fold_x, fold_w, unfold_x, unfold_w = tf.fold_x, tf.fold_w, tf.unfold_x, tf.unfold_w
        name = _fold.fold_id(s, inner_algo)

        def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
            if ws_size < need:
                raise ValueError(f"workspace: folded config {name} ({direction}) needs {need} "
                                 f"bytes for {size} rows of {problem!r}, got {ws_size}")
            a, b = ws + a_off, ws + b_off
            if direction is Direction.FORWARD:
                fold_x(handle, x + ox, a)
                fold_w(handle, w, b)
                inner(a, b, y + oy, ws + i_off, ws_size - i_off)
            elif direction is Direction.BACKWARD_DATA:
                fold_w(handle, w, b)
                inner(a, b, y + oy, ws + i_off, ws_size - i_off)
                unfold_x(handle, a, x + ox, ca, cb)
            else:
                fold_x(handle, x + ox, a)
                inner(a, b, y + oy, ws + i_off, ws_size - i_off)
                unfold_w(handle, b, w, ca, cb)

        return self._launcher(call, (inner, tf, handle), need, name)

    # Note [releases from finalizers]: a bound launcher's finalizer hands its plan
    # back (plan.release, under the backend's lock). Finalizers run wherever the
    # garbage collector happens to run, including a find() worker thread that
    # is finalizing plans while the calling thread holds the lock and waits for
    # it: taking the lock there deadlocked the GPU suite on the H200
    # (docs/BENCHMARKS.md, "Seventh session"). So the finalizer only queues the
    # plan, and releases the queue itself when it gets the lock without waiting;
    # otherwise whoever takes the lock next (_plan, clear_cache) releases it.
    def _release_plan(self, plan: _Plan) -> None:
        self._releases.append(plan)
        if self._lock.acquire(blocking=False):
            try:
                self._drain_releases()
            finally:
                self._lock.release()

    def _drain_releases(self) -> None:
        """Release the plans queued by launcher finalizers (the lock is held)."""
        while True:
            try:
                plan = self._releases.popleft()
            except IndexError:
                return
            plan.release()


class CudnnGraphKnobsBackend(CudnnGraphBackend):
    """``get_backend("cudnn-graph+knobs")``: :class:`CudnnGraphBackend` with
    ``search="knobs"`` (Note [knob search]); the same options otherwise."""

    name = "cudnn-graph+knobs"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("search", "knobs")
        super().__init__(*args, **kwargs)
