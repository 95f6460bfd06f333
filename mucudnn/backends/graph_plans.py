"""The lifetimes of cudnn-graph's operation graphs and finalized execution
plans: :class:`CachedGraph` and :class:`CachedPlan`, the backend's graph and
plan caches (:class:`GraphPlans`), and the plans launcher finalizers hand
back (Notes [plan lifetimes] and [releases from finalizers]).

Alpha and beta are baked into the operation, and cuDNN sees each tensor's byte
alignment (the largest power of two <= 16 dividing its pointer), so finalized
plans are cached per (problem at that batch, direction, id, alpha, beta,
alignments of x, w, y): LRU, bounded, closed on eviction, as are the operation
graphs they are built on and the variant packs (pointers baked in) of each
plan.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from .._cudnn import graph_descriptors as gd
from .._cudnn.backend_api import BackendDescriptor
from .._cudnn.errors import CudnnError
from ..caches import LRU
from ..cuda import using_device
from ..problem import ConvProblem, Direction
from ._device import DeviceBackend
from .find_options import FindOptions

__all__ = ["CachedGraph", "CachedPlan", "GraphPlans", "FULL_ALIGNMENT", "canonical_id"]

#: The alignments (bytes) of x, w and y that planning and find() assume.
FULL_ALIGNMENT = (gd.MAX_ALIGNMENT,) * 3


def canonical_id(algo: Any) -> str:
    """The canonical form of an engine-config id (ValueError if it is none):
    knob types ascending.

    >>> canonical_id("e5;k3=1;k2=0")
    'e5;k2=0;k3=1'
    """
    idx, knobs = gd.parse_engine_config_id(algo)
    return gd.format_engine_config_id(idx, knobs)


class CachedGraph:
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


# Note [plan lifetimes]
# ~~~~~~~~~~~~~~~~~~~~~
# A plan is held by the backend's plan cache and by every bound launcher that
# executes it (``holders``). It is closed, its descriptors destroyed in
# dependency order (plan, config, knobs, engine, then the operation graph once
# no plan uses it), when it is neither cached nor held: eviction from a cache
# never closes something a launcher still uses. Variant packs reference no
# other descriptor, so the pack cache simply drops them (their finalizers
# destroy them).


class CachedPlan:
    """A finalized execution plan, its engine config pieces, its workspace size,
    its engine's notes and its variant packs (LRU by pointers); see Note [plan
    lifetimes]."""

    __slots__ = ("id", "graph", "engine", "knobs", "cfg", "plan", "workspace_bytes",
                 "info", "packs", "holders", "cached", "closed", "__weakref__")

    def __init__(self, graph: CachedGraph, algo_id: str, handle: Any, max_packs: int) -> None:
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



# Note [releases from finalizers]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A bound launcher's finalizer hands its plan back (plan.release, under the
# backend's lock). Finalizers run wherever the garbage collector happens to
# run, including a find() worker thread that is finalizing plans while the
# calling thread holds the lock and waits for it: taking the lock there
# deadlocks. So the finalizer only queues the plan, and releases the queue
# itself when it gets the lock without waiting; otherwise whoever takes the
# lock next (_plan, clear_cache) releases it.


class GraphPlans(DeviceBackend):
    """The graph and plan caches of the cudnn-graph backend (Note [plan
    lifetimes]): operation graphs per (problem, direction, alpha, beta,
    alignments), finalized plans per graph and engine config id."""

    #: the search, one frozen value (its key() enters cache_name)
    find_options: FindOptions
    find_threads: int
    plan_cache_size: int
    graph_cache_size: int
    pack_cache_size: int
    _pool: Optional[ThreadPoolExecutor]

    def _init_plan_caches(self) -> None:
        """The empty graph and plan caches and the release queue (sizes set)."""
        #: plans handed back by launcher finalizers (Note [releases from finalizers])
        self._releases: collections.deque[CachedPlan] = collections.deque()
        self._graphs: LRU[tuple, CachedGraph] = LRU("cudnn_graph.graphs", self.graph_cache_size,
                                                    on_evict=lambda _k, g: g.evict())
        self._plans: LRU[tuple, CachedPlan] = LRU("cudnn_graph.plans", self.plan_cache_size,
                                                  on_evict=lambda _k, p: p.evict())

    @staticmethod
    def _graph_key(problem: ConvProblem, direction: Direction, alpha: float, beta: float,
                   aligns: tuple) -> tuple:
        return (problem.key(), direction.value, float(alpha), float(beta), tuple(aligns))

    def _graph(self, problem: ConvProblem, direction: Direction, alpha: float, beta: float,
               aligns: tuple) -> CachedGraph:
        key = self._graph_key(problem, direction, alpha, beta, aligns)
        g = self._graphs.get(key)
        if g is not None:
            return g
        with using_device(self.device):
            g = CachedGraph(gd.ConvGraph(problem, direction, alpha, beta, aligns, handle=self.handle))
        self._graphs.put(key, g)
        return g

    def _plan(self, problem: ConvProblem, direction: Direction, algo_id: str, alpha: float,
              beta: float, aligns: tuple) -> CachedPlan:
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
                    p = CachedPlan(g, algo_id, self.handle, self.pack_cache_size)
                except CudnnError as exc:
                    exc.add_details(problem=problem, direction=str(direction), algo=algo_id,
                                    alignments=aligns)
                    raise
            self._plans.put(key, p)
            return p

    def cache_sizes(self) -> dict[str, int]:
        """How many plans, graphs and variant packs are cached (for tests)."""
        with self._lock:
            return {"plans": len(self._plans), "graphs": len(self._graphs),
                    "packs": sum(len(p.packs) for p in self._plans.values())}

    # See Note [releases from finalizers].
    def _release_plan(self, plan: CachedPlan) -> None:
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

