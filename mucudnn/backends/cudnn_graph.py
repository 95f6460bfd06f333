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
from which ``run()`` rebuilds the plan.

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
aligned tensors, alpha 1, beta 0): less raises ValueError. Where the plan for
the call's own alignment and scalars cannot run within the workspace given
(e.g. a micro-batch view less aligned than 16 bytes), bind falls back (with a
warning, once per key) to the first heuristics config that can; the result is
the same convolution.
"""

from __future__ import annotations

import logging
import statistics
from collections import OrderedDict
from typing import Any, Callable, Optional, Sequence, Union

from .._cudnn import graph_descriptors as gd
from .._cudnn.backend_api import BackendDescriptor
from .._cudnn.enums import BackendNumericalNote as Note
from .._cudnn.errors import CudnnError
from .._cudnn.handle import using_device
from .._cudnn.prototypes import lib
from ..problem import AlgoPerf, ConvProblem, Direction
from .base import ConvTensors
from .cudnn import CudnnBackend, _array_ptr

__all__ = ["CudnnGraphBackend", "numerics_allowed", "format_engine_config_id",
           "parse_engine_config_id"]

log = logging.getLogger("mucudnn")

format_engine_config_id = gd.format_engine_config_id
parse_engine_config_id = gd.parse_engine_config_id

_MAX = gd.MAX_ALIGNMENT
_FULL = (_MAX, _MAX, _MAX)


def numerics_allowed(math: str, numerical_notes: Sequence[int]) -> bool:
    """Whether an engine with ``numerical_notes`` may run a problem of math mode ``math``."""
    notes = {int(n) for n in numerical_notes}
    if math == "tensor_op_allow_conversion":
        return True
    if int(Note.REDUCED_PRECISION_REDUCTION) in notes or int(Note.DOWN_CONVERT_INPUTS) in notes:
        return False
    if math == "fma" and int(Note.TENSOR_CORE) in notes:
        return False
    return True


def canonical_id(algo: Any) -> str:
    """The canonical form of an engine-config id (ValueError if it is none)."""
    idx, knobs = gd.parse_engine_config_id(algo)
    return gd.format_engine_config_id(idx, knobs)


class _Graph:
    """A cached operation graph; closed once evicted and no cached plan uses it."""

    __slots__ = ("conv", "refs", "cached", "ids")

    def __init__(self, conv: gd.ConvGraph) -> None:
        self.conv = conv
        self.refs = 0
        self.cached = True
        self.ids: Optional[list[gd.EngineConfigInfo]] = None  # heuristics, once asked

    def release(self) -> None:
        self.refs -= 1
        self._maybe_close()

    def evict(self) -> None:
        self.cached = False
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self.refs <= 0 and not self.cached:
            self.conv.close()


class _Plan:
    """A finalized execution plan, its engine config pieces, its workspace size,
    its engine's notes and its variant packs (LRU by pointers)."""

    __slots__ = ("id", "graph", "engine", "knobs", "cfg", "plan", "workspace_bytes",
                 "info", "packs", "max_packs", "closed")

    def __init__(self, graph: _Graph, algo_id: str, handle: Any, max_packs: int) -> None:
        idx, knobs = gd.parse_engine_config_id(algo_id)
        self.id = gd.format_engine_config_id(idx, knobs)
        self.graph = graph
        self.engine = self.cfg = self.plan = None
        self.knobs: list[BackendDescriptor] = []
        self.packs: "OrderedDict[tuple, BackendDescriptor]" = OrderedDict()
        self.max_packs = max_packs
        self.closed = False
        graph.refs += 1
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

    def pack(self, xp: int, wp: int, yp: int, ws: Optional[int]) -> BackendDescriptor:
        key = (xp, wp, yp, ws)
        p = self.packs.get(key)
        if p is not None:
            self.packs.move_to_end(key)
            return p
        p = gd.variant_pack((gd.UID_X, gd.UID_W, gd.UID_Y), (xp, wp, yp), ws)
        self.packs[key] = p
        while len(self.packs) > self.max_packs:
            _, old = self.packs.popitem(last=False)
            old.close()
        return p

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for p in self.packs.values():
            p.close()
        self.packs.clear()
        for d in (self.plan, self.cfg, *self.knobs, self.engine):
            if d is not None:
                d.close()
        self.graph.release()


class CudnnGraphBackend(CudnnBackend):
    """cuDNN's graph (backend) API as a :class:`~mucudnn.backends.base.Backend`.

    ``device``, ``stream``, ``find_workspace_limit``: as
    :class:`~mucudnn.backends.cudnn.CudnnBackend` (arrays, streams and the
    handle are shared code). ``heuristic_modes``: which heuristics ``find``
    asks, in order (mode B is skipped where cuDNN does not support it).
    ``find_warmup`` / ``find_repeat``: untimed and timed runs per candidate
    (the median of ``find_repeat`` >= 3 is reported). ``plan_cache_size``,
    ``graph_cache_size``, ``pack_cache_size``: LRU bounds (plans, operation
    graphs, variant packs per plan).

    Raises :class:`mucudnn.cuda.NoDeviceError` where there is no GPU or driver.
    """

    name = "cudnn-graph"

    def __init__(self, device: Optional[int] = None, stream: Any = None,
                 find_workspace_limit: Optional[int] = None, *,
                 heuristic_modes: Sequence[str] = ("A", "B", "FALLBACK"),
                 find_warmup: int = 1, find_repeat: int = 3, plan_cache_size: int = 256,
                 graph_cache_size: int = 256, pack_cache_size: int = 64,
                 descriptor_cache_size: int = 256) -> None:
        modes = [str(m).upper() for m in heuristic_modes]
        for m in modes:
            if m not in gd.HEUR_MODE_NAMES:
                raise ValueError(f"heuristic_modes: expected some of {list(gd.HEUR_MODE_NAMES)}, "
                                 f"got {m!r}")
        if int(find_repeat) < 3 or int(find_warmup) < 0:
            raise ValueError(f"need find_warmup >= 0 and find_repeat >= 3, got {find_warmup}, "
                             f"{find_repeat}")
        for n, v in (("plan_cache_size", plan_cache_size), ("graph_cache_size", graph_cache_size),
                     ("pack_cache_size", pack_cache_size)):
            if int(v) < 1:
                raise ValueError(f"{n}: expected >= 1, got {v}")
        super().__init__(device=device, stream=stream, find_workspace_limit=find_workspace_limit,
                         descriptor_cache_size=descriptor_cache_size)
        self.heuristic_modes = tuple(modes)
        self.find_warmup, self.find_repeat = int(find_warmup), int(find_repeat)
        self.plan_cache_size = int(plan_cache_size)
        self.graph_cache_size = int(graph_cache_size)
        self.pack_cache_size = int(pack_cache_size)
        self._graphs: "OrderedDict[tuple, _Graph]" = OrderedDict()
        self._plans: "OrderedDict[tuple, _Plan]" = OrderedDict()
        self._fallbacks: dict[tuple, str] = {}

    def __repr__(self) -> str:
        return (f"CudnnGraphBackend(device={self.device} {self.device_name!r}, cuDNN "
                f"{self.version}, stream={hex(getattr(self.stream, 'handle', 0) or 0)})")

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
            self._graphs.move_to_end(key)
            return g
        with using_device(self.device):
            g = _Graph(gd.ConvGraph(problem, direction, alpha, beta, aligns, handle=self.handle))
        self._graphs[key] = g
        while len(self._graphs) > self.graph_cache_size:
            _, old = self._graphs.popitem(last=False)
            old.evict()
        return g

    def _plan(self, problem: ConvProblem, direction: Direction, algo_id: str, alpha: float,
              beta: float, aligns: tuple) -> _Plan:
        """The cached finalized plan (built on first use; CudnnError if cuDNN refuses)."""
        key = self._graph_key(problem, direction, alpha, beta, aligns) + (algo_id,)
        with self._lock:
            p = self._plans.get(key)
            if p is not None and not p.closed:
                self._plans.move_to_end(key)
                return p
            g = self._graph(problem, direction, alpha, beta, aligns)
            with using_device(self.device):
                try:
                    p = _Plan(g, algo_id, self.handle, self.pack_cache_size)
                except CudnnError as exc:
                    exc.add_details(problem=problem, direction=str(direction), algo=algo_id,
                                    alignments=aligns)
                    raise
            self._plans[key] = p
            while len(self._plans) > self.plan_cache_size:
                _, old = self._plans.popitem(last=False)
                old.close()
            return p

    def clear_cache(self) -> None:
        """Close every cached plan, variant pack, operation graph and descriptor."""
        with self._lock:
            while self._plans:
                _, p = self._plans.popitem()
                p.close()
            while self._graphs:
                _, g = self._graphs.popitem()
                g.evict()
            self._fallbacks.clear()
        super().clear_cache()

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
            for m in self._modes_for(problem):
                try:
                    cfgs = g.conv.engine_configs(m)
                except CudnnError as exc:
                    log.debug("mucudnn: heuristics mode %s refused %s %s: %s", m, problem,
                              direction, exc)
                    continue
                for c in cfgs:
                    try:
                        info = gd.engine_config_info(c)
                    except CudnnError as exc:  # pragma: no cover - unreadable result
                        log.debug("mucudnn: unreadable engine config: %s", exc)
                        continue
                    finally:
                        c.close()
                    seen.setdefault(info.id, info)
            g.ids = list(seen.values())
            return list(g.ids)

    # -- find -----------------------------------------------------------------------------
    def find(self, problem: ConvProblem, direction: Direction,
             workspace_limit: Optional[int]) -> list[AlgoPerf]:
        """Every engine config that finalized and ran for ``problem`` (at its own
        batch) with workspace <= ``workspace_limit`` (and the find cap), fastest first."""
        direction = Direction.parse(direction)
        limit = None if workspace_limit is None else int(workspace_limit)
        if limit is not None and limit < 0:
            raise ValueError(f"workspace_limit: expected bytes >= 0, got {workspace_limit}")
        cuda = self._cuda
        with self._lock, using_device(self.device):
            cap = self.find_workspace_cap()
            want = cap if limit is None else min(limit, cap)
            plans: list[tuple[_Plan, gd.EngineConfigInfo]] = []
            for info in self.engine_configs(problem, direction):
                if not numerics_allowed(problem.math, info.numerical_notes):
                    continue
                try:
                    p = self._plan(problem, direction, info.id, 1.0, 0.0, _FULL)
                except CudnnError as exc:
                    log.debug("mucudnn: engine config %s does not finalize for %s %s: %s",
                              info.id, problem, direction, exc)
                    continue
                if p.workspace_bytes <= want:
                    plans.append((p, info))
            if not plans:
                return []
            x = self._random(problem.x_shape, problem.dtype)
            w = self._random(problem.w_shape, problem.dtype)
            y = self._random(problem.output_shape, problem.dtype)
            need = max(p.workspace_bytes for p, _ in plans)
            ws = None
            out: list[AlgoPerf] = []
            try:
                if need > 0:
                    ws = self._alloc_find_workspace(need)
                have = 0 if ws is None else int(ws.nbytes)
                ws_ptr = None if ws is None or have == 0 else int(ws.ptr)
                ptrs = (int(x.ptr), int(w.ptr), int(y.ptr))
                aligns = tuple(gd.pointer_alignment(q) for q in ptrs)
                if aligns != _FULL:  # pragma: no cover - fresh allocations are 256-aligned
                    raise RuntimeError(f"find buffers are not 16-byte aligned: {aligns}")
                handle = self.handle._as_parameter_
                execute = lib.cudnnBackendExecute
                for p, info in plans:
                    if p.workspace_bytes > have:
                        continue
                    if p.closed:  # evicted by a small plan cache meanwhile: rebuild it
                        p = self._plan(problem, direction, p.id, 1.0, 0.0, _FULL)
                    pack = gd.variant_pack((gd.UID_X, gd.UID_W, gd.UID_Y), ptrs, ws_ptr)
                    try:
                        args = (handle, p.plan._as_parameter_, pack._as_parameter_)
                        times = cuda.time_on_stream(lambda: execute(*args), self.stream,
                                                    warmup=self.find_warmup,
                                                    repeat=self.find_repeat)
                    except CudnnError as exc:
                        log.debug("mucudnn: engine config %s failed to run for %s %s: %s",
                                  p.id, problem, direction, exc)
                        continue
                    finally:
                        pack.close()
                    out.append(AlgoPerf(algo=p.id, time_ms=float(statistics.median(times)),
                                        workspace_bytes=int(p.workspace_bytes), math_type=0,
                                        determinism=1 if info.deterministic else 0))
                self.stream.synchronize()
            finally:
                for a in (x, w, y, ws):
                    close = getattr(a, "close", None)
                    if close is not None:
                        close()
        out.sort(key=lambda a: a.time_ms)
        return out

    # -- workspace size ------------------------------------------------------------------
    def workspace_size(self, problem: ConvProblem, direction: Direction,
                       algo: Union[int, str], math_type: Union[int, str] = 0) -> int:
        """CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE of engine config ``algo`` for
        ``problem`` (16-byte aligned tensors, alpha 1, beta 0)."""
        direction = Direction.parse(direction)
        return int(self._plan(problem, direction, canonical_id(algo), 1.0, 0.0,
                              _FULL).workspace_bytes)

    # -- run ----------------------------------------------------------------------------------
    def run(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
            tensors: ConvTensors, alpha: float = 1.0, beta: float = 0.0,
            workspace: Any = None) -> None:
        """One convolution on the backend's stream (asynchronous); see :meth:`bind`."""
        self.bind(direction, algo, math_type, tensors, alpha, beta, workspace)()

    def _fallback(self, problem: ConvProblem, direction: Direction, algo_id: str, alpha: float,
                  beta: float, aligns: tuple, ws_size: int) -> _Plan:
        """A plan that runs at ``aligns`` within ``ws_size`` when ``algo_id`` cannot."""
        key = (self._graph_key(problem, direction, alpha, beta, aligns), algo_id, ws_size)
        chosen = self._fallbacks.get(key)
        if chosen is not None:
            return self._plan(problem, direction, chosen, alpha, beta, aligns)
        for info in self.engine_configs(problem, direction, alpha, beta, aligns):
            if not numerics_allowed(problem.math, info.numerical_notes):
                continue
            try:
                p = self._plan(problem, direction, info.id, alpha, beta, aligns)
            except CudnnError:
                continue
            if p.workspace_bytes <= ws_size:
                log.warning("mucudnn: engine config %s cannot run %s %s with pointers aligned to "
                            "%s bytes (alpha %s, beta %s) in %d bytes of workspace; using %s "
                            "instead", algo_id, problem, direction, aligns, alpha, beta, ws_size,
                            info.id)
                self._fallbacks[key] = info.id
                return p
        raise ValueError(
            f"algo: engine config {algo_id} cannot run {problem!r} {direction} with pointers "
            f"aligned to {aligns} bytes (alpha {alpha}, beta {beta}), and no other engine "
            f"config does within {ws_size} bytes of workspace")

    def bind(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
             tensors: ConvTensors, alpha: float = 1.0, beta: float = 0.0,
             workspace: Any = None) -> Callable[[], None]:
        """Check one call once and return a launcher that only calls
        ``cudnnBackendExecute(handle, plan, variant_pack)``.

        The plan is the cached one for (problem, direction, ``algo``, alpha, beta,
        pointer alignments); the variant pack (pointers baked in) is cached per
        plan. The launcher raises ValueError, before issuing anything, once the
        backend's cache has closed its plan or pack (the engine then rebinds).
        """
        direction = Direction.parse(direction)
        p = tensors.problem
        algo_id = canonical_id(algo)
        alpha, beta = float(alpha), float(beta)
        if workspace is None:
            ws_ptr, ws_size = None, 0
        else:
            ws_size = int(workspace.nbytes)
            ws_ptr = int(workspace.ptr) if ws_size else None
        xp = _array_ptr("x", tensors.x, p.x_shape, p.dtype)
        wp = _array_ptr("w", tensors.w, p.w_shape, p.dtype)
        yp = _array_ptr("y", tensors.y, p.output_shape, p.dtype)
        aligns = tuple(gd.pointer_alignment(q, p.itemsize) for q in (xp, wp, yp))
        with self._lock:
            # the contract: workspace_size() (16-byte aligned, alpha 1, beta 0) is enough
            need = self._plan(p, direction, algo_id, 1.0, 0.0, _FULL).workspace_bytes
            if ws_size < need:
                raise ValueError(
                    f"workspace: engine config {algo_id} ({direction}) needs {need} bytes for "
                    f"{p!r}, got {ws_size}")
            plan: Optional[_Plan]
            try:
                plan = self._plan(p, direction, algo_id, alpha, beta, aligns)
            except CudnnError as exc:
                log.debug("mucudnn: %s does not finalize at %s, alpha %s, beta %s: %s",
                          algo_id, aligns, alpha, beta, exc)
                plan = None
            if plan is None or plan.workspace_bytes > ws_size:
                plan = self._fallback(p, direction, algo_id, alpha, beta, aligns, ws_size)
            pack = plan.pack(xp, wp, yp, ws_ptr)
        fn = lib.cudnnBackendExecute
        handle = self.handle
        plan_d, pack_d = plan.plan, pack
        device = self.device if self._multi_device else None
        used = plan.id

        def launch() -> None:
            try:
                if device is not None:
                    with using_device(device):
                        fn(handle, plan_d, pack_d)
                else:
                    fn(handle, plan_d, pack_d)
            except CudnnError as exc:
                exc.add_details(problem=p, direction=str(direction), algo=used,
                                workspace_bytes=ws_size)
                raise

        launch.keep = (plan, pack)  # type: ignore[attr-defined]
        launch.algo = used  # type: ignore[attr-defined]
        launch.alive = lambda: not (plan_d.closed or pack_d.closed)  # type: ignore
        return launch

    def close(self) -> None:
        """Release plans, graphs, descriptors and the cuDNN handle."""
        self.clear_cache()
        self.handle.close()
