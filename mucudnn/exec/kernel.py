"""One kernel (a problem and a direction on a backend): its plan, bound launchers,
workspace, run-time re-plans and CUDA graphs.

:class:`Kernel` is what :class:`mucudnn.Convolution` and
:class:`~mucudnn.exec.handle.MicroBatchHandle` run through. It holds the plan
in use (from the :class:`~mucudnn.exec.planning.Planner` it was handed),
keeps the plan bound per (alpha, beta, pointer-alignment) class, takes
workspace from the caller's allocator, a WD segment or the backend's pool for
the stream, and asks the planner for another plan when the workspace cannot
be had or the backend refuses a configuration (warning once per kernel).

The warm call (:meth:`Kernel.launch` with the same scalars and alignment
class as the previous call) is: one tuple compare, the pool's size check and
the bound launchers; nothing else.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Callable, cast

from ..backends.base import Backend, ConvTensors
from ..caches import LRU
from ..cuda import is_capturing
from ..errors import (InvalidValueError, MucudnnError, PlanningInCaptureError, UnsupportedConfigError,
                      WorkspaceUnavailable)
from ..problem import ConvProblem, Direction, Plan
from ..typing_aliases import AddressOrArray, ArrayLike
from .graph import GraphCache
from .planning import Planner
from .runner import FULL_ALIGNMENT, BoundPlan, alignment_of, bind_plan, resolve_workspace
from .views import check_micro_batches
from .workspace import WorkspacePool, pool_for

__all__ = ["Kernel", "FallbackWarning", "WorkspaceFallbackWarning", "WorkspaceAllocator",
           "MAX_REPLANS"]

log = logging.getLogger("mucudnn")

#: Re-plans one call may try before giving up (each excludes one more configuration).
MAX_REPLANS = 16

#: ``alloc(nbytes) -> (keepalive, address, size)``: a per-call workspace from the
#: caller's framework (see mucudnn.api); the keepalive lives until the launch returns.
WorkspaceAllocator = Callable[[int], tuple[Any, Any, int]]


class FallbackWarning(RuntimeWarning):
    """The planned configuration could not run; the planner's next best plan ran
    instead (the result is the same convolution)."""


class WorkspaceFallbackWarning(FallbackWarning):
    """A plan's workspace could not be allocated; a smaller plan ran instead."""


class Kernel:
    """A (problem, direction) on a backend, with its plan and execution state.

    ``planner`` decides every plan (first, re-plans); ``graph`` turns on CUDA
    graph replay (ignored where the backend has no graphs); ``pool`` pins a
    workspace pool (default: the backend's pool for each call's stream).
    """

    def __init__(self, backend: Backend, problem: ConvProblem, direction: Direction,
                 planner: Planner, *, graph: bool = False, pool: WorkspacePool | None = None,
                 name: str | None = None, plan: Plan | None = None) -> None:
        self.backend = backend
        self.problem = problem
        self.direction = Direction.parse(direction)
        self.planner = planner
        self.graph = bool(graph) and bool(backend.supports_graphs)
        self.name = name or f"{problem.key()}/{self.direction}"
        self._host = bool(backend.is_host)
        self._pinned_pool = pool
        self._plan: Plan | None = None
        self._preferred: Plan | None = None
        self._forced = plan
        self._bound: LRU[tuple, BoundPlan] = LRU("exec.bound_plans", 8)
        self._last_key: tuple | None = None
        self._last_bound: BoundPlan | None = None
        self._pool_stream: Any = _UNSET
        self._pool: WorkspacePool | None = None
        self._graphs: GraphCache | None = GraphCache(backend) if self.graph else None
        #: launches take the workspace the caller gives: always without graphs, and
        #: with them where its address is in their key (:meth:`replay_repeated`);
        #: else graphs take the pool's, whose address holds
        self._caller_workspace = self._graphs is None
        self._excluded: set[Any] = set()
        self._warned = False
        self._lock = threading.RLock()
        #: How many times a fallback plan was used (tests, logging).
        self.fallbacks = 0

    # -- plans ------------------------------------------------------------------
    def _install(self, plan: Plan) -> Plan:
        """``plan`` checked against this kernel and the limit, workspace resolved."""
        if plan.problem is None or plan.direction is None:
            plan = plan.with_context(self.problem if plan.problem is None else plan.problem,
                                     self.direction if plan.direction is None else plan.direction)
        if plan.direction is not self.direction:
            raise InvalidValueError(f"plans: a plan for {plan.direction} given for {self.direction}")
        assert plan.problem is not None
        if plan.problem.with_batch(self.problem.batch) != self.problem:
            raise InvalidValueError(
                f"plans: the plan's problem {plan.problem} is not this kernel's {self.problem}")
        if plan.problem != self.problem:
            plan = plan.with_context(self.problem, self.direction)
        check_micro_batches(plan.micro_batches, self.problem.batch)
        self._check_configs(plan)
        return resolve_workspace(plan, self.backend, self.direction)

    def _check_configs(self, plan: Plan) -> None:
        """UnsupportedConfigError naming the first configuration of ``plan`` the
        backend does not know (a plan loaded for another backend, or planned
        from a cache entry the planner could not measure again), before any
        device work; the callers then ask the planner for a plan without it."""
        for mb in plan.micro_batches:
            try:
                self.backend.workspace_size(self.problem.with_batch(mb.size), self.direction,
                                            mb.algo, mb.math_type)
            except NotImplementedError:
                continue
            except MemoryError:
                raise
            except (MucudnnError, ValueError, TypeError, LookupError, OverflowError) as exc:
                raise UnsupportedConfigError(
                    f"algo: backend {self.backend.name} has no configuration {mb.algo!r} "
                    f"(math_type {mb.math_type!r}) for {self.name} ({type(exc).__name__}: {exc})",
                    algo=mb.algo, reason="unknown") from None

    @property
    def plan(self) -> Plan:
        """The plan in use (planned on first access)."""
        p = self._plan
        if p is None:
            with self._lock:
                if self._plan is None:
                    if self._forced is not None:
                        p = self._install_or_replan(self._forced,
                                                    f"plans[{self.direction.value}]")
                        limit = self.planner.workspace_limit
                        if limit is not None and p.workspace_bytes > limit:
                            raise InvalidValueError(
                                f"plans[{self.direction.value}]: the plan needs "
                                f"{p.workspace_bytes} bytes of workspace, over workspace_limit="
                                f"{limit}; raise the limit or give a smaller plan")
                    else:
                        p = self._install_or_replan(
                            self.planner.plan(self.problem, self.direction), "the plan")
                    self._plan = self._preferred = p
                    log.debug("mucudnn: %s plan %s (%d bytes workspace)", self.name,
                              p.describe(), p.workspace_bytes)
                p = self._plan
        return p

    def _install_or_replan(self, plan: Plan, what: str) -> Plan:
        """``plan`` installed; where the backend has no configuration of it
        (:meth:`_check_configs`), the planner's plan without that configuration,
        with a FallbackWarning naming ``what`` (a plan given or made)."""
        for _ in range(MAX_REPLANS):
            try:
                return self._install(plan)
            except UnsupportedConfigError as exc:
                self._excluded.add(exc.algo)
                limit = self.planner.workspace_limit
                avail = limit if limit is not None else self._available()
                new = self.planner.replan(self.problem, self.direction, avail,
                                          exclude=frozenset(self._excluded))
                self._warn(FallbackWarning, f"{what}: {exc}", plan, new)
                plan = new
        raise UnsupportedConfigError(
            f"{self.name}: no plan the backend knows after {MAX_REPLANS} re-plans "
            f"(excluded {sorted(map(str, self._excluded))})")

    @property
    def planned(self) -> bool:
        return self._plan is not None

    def set_plan(self, plan: Plan) -> None:
        """Use ``plan`` from now on (e.g. one chosen by WD)."""
        with self._lock:
            self._plan = self._preferred = self._install(plan)
            self._forget_bindings()

    def reset(self) -> None:
        """Return from a fallback plan to the preferred one (tried on the next call)."""
        with self._lock:
            if self._preferred is not None and self._plan is not self._preferred:
                self._plan = self._preferred
                self._excluded.clear()
                self._forget_bindings()

    def _forget_bindings(self) -> None:
        self._bound.clear()
        self._last_key = self._last_bound = None
        if self._graphs is not None:
            self._graphs.clear()

    # -- binding ----------------------------------------------------------------
    def _bind(self, key: tuple, stream: Any) -> BoundPlan:
        """The bound plan for (alpha, beta, alignments) ``key`` (slow path)."""
        with self._lock:
            bound = self._bound.get(key)
            if bound is None:
                self._guard_capture(stream, "bind a plan")
                alpha, beta, aligns = key[0], key[1], key[2:]
                bound = self._bind_with_replans(alpha, beta, aligns)
                self._bound.put(key, bound)
            self._last_key, self._last_bound = key, bound
            return bound

    def _bind_with_replans(self, alpha: float, beta: float, aligns: tuple) -> BoundPlan:
        limit = self.planner.workspace_limit
        plan = self.plan
        for _ in range(MAX_REPLANS):
            try:
                bound = bind_plan(plan, self.backend, alpha, beta, aligns)
                if limit is not None and bound.workspace_bytes > limit:
                    # Note [checked workspace]
                    # ~~~~~~~~~~~~~~~~~~~~~~~~
                    # A plan is never run with more workspace than its limit,
                    # whatever a cache entry claimed.
                    worst = max(bound.launchers, key=lambda l: l.workspace_bytes)
                    raise UnsupportedConfigError(
                        f"algo: {worst.algo} needs {worst.workspace_bytes} bytes here, over "
                        f"workspace_limit={limit}", algo=worst.algo, reason="workspace")
                return bound
            except UnsupportedConfigError as exc:
                self._excluded.add(exc.algo)
                avail = limit if limit is not None else self._available()
                new = self._install_or_replan(
                    self.planner.replan(self.problem, self.direction, avail,
                                        exclude=frozenset(self._excluded)), "a re-plan")
                self._warn(FallbackWarning, f"{exc}", plan, new)
                plan = self._plan = new
        raise UnsupportedConfigError(
            f"{self.name}: no plan runs at pointer alignments {aligns} with alpha {alpha}, "
            f"beta {beta} after {MAX_REPLANS} re-plans (excluded {sorted(map(str, self._excluded))})")

    def _available(self) -> int:
        return self._pool_for(None).available_bytes()

    def _warn(self, category: type[Warning], why: str, old: Plan, new: Plan) -> None:
        msg = (f"mucudnn: {self.name}: {why}; running plan {new.describe()} "
               f"({new.workspace_bytes} bytes of workspace) instead of {old.describe()} "
               f"({old.workspace_bytes} bytes); the result is the same convolution")
        self.fallbacks += 1
        if not self._warned:
            self._warned = True
            warnings.warn(msg, category, stacklevel=5)
        else:
            log.info(msg)

    def replay_repeated(self, after: int = 2) -> bool:
        """Replay each micro-batch sequence as a CUDA graph from the ``after``-th
        call at the same addresses on (Note [replay after repeated addresses]
        in :mod:`mucudnn.exec.graph`), the workspace the caller gives included
        in them; earlier calls launch directly, and so do all calls once a
        capture failed (with a warning). False (and nothing changes) where the
        backend has no graphs."""
        if not self.backend.supports_graphs:
            return False
        with self._lock:
            if self._graphs is None or self._graphs.after != after:
                if self._graphs is not None:
                    self._graphs.clear()
                self._graphs = GraphCache(self.backend, after=after, fall_back=True)
            self.graph = True
            self._caller_workspace = True
        return True

    def _guard_capture(self, stream: Any, what: str) -> None:
        if stream is not None and not self._host and is_capturing(stream):
            raise PlanningInCaptureError(
                f"{self.name}: a call inside CUDA-graph capture would {what}; run the same "
                "calls once before capturing (a warm-up step) so that plans, bindings and "
                "workspace exist, then capture")

    # -- workspace --------------------------------------------------------------
    def _pool_for(self, stream: Any) -> WorkspacePool:
        if self._pinned_pool is not None:
            return self._pinned_pool
        pool = self._pool
        if pool is None or not pool.alive or self._pool_stream != stream:
            pool = self._pool = pool_for(self.backend, stream)
            self._pool_stream = stream
        return pool

    def _acquire(self, bound: BoundPlan, key: tuple, stream: Any,
                 get: WorkspaceAllocator) -> tuple[BoundPlan, Any, Any, int]:
        """Workspace for ``bound`` from ``get``, or a re-planned plan whose
        workspace can be had: ``(bound, keepalive, address, size)`` (slow path)."""
        try:
            keep, addr, size = get(bound.workspace_bytes)
            return bound, keep, addr, size
        except WorkspaceUnavailable as exc:
            self._guard_capture(stream, "re-plan")
            with self._lock:
                old = self._plan or bound.plan
                for attempt in (max(0, exc.available), 0):
                    new = self._install_or_replan(self.planner.replan(
                        self.problem, self.direction, attempt, exclude=frozenset(self._excluded)),
                        "a re-plan")
                    self._plan = new
                    self._bound.clear()
                    nb = self._bind(key, stream)
                    try:
                        keep, addr, size = get(nb.workspace_bytes) if nb.workspace_bytes else \
                            (None, None, 0)
                    except WorkspaceUnavailable:
                        continue
                    self._warn(WorkspaceFallbackWarning, str(exc), old, new)
                    return nb, keep, addr, size
            raise

    # -- running ----------------------------------------------------------------
    def launch(self, x: AddressOrArray, w: AddressOrArray, y: AddressOrArray,
               alpha: float = 1.0, beta: float = 0.0,
               stream: Any = None, workspace: "WorkspaceAllocator | tuple[Any, int] | None" = None
               ) -> Plan:
        """Run the plan on whole-batch addresses ``x``, ``w``, ``y`` (forward
        naming; device pointers, or arrays on a host backend) on ``stream`` (an
        int handle; None: the backend's home stream). Returns the plan that ran.

        ``workspace``: None (the pool of the stream), an ``(address, size)``
        the caller owns (used when large enough), or a
        :data:`WorkspaceAllocator` called with the bytes needed.
        Asynchronous on GPU backends; the caller has validated the arrays.
        """
        if self._host:
            with self._pool_for(None).lock:
                # Note: a host backend computes in the pool's buffer while the
                # launch runs, so callers on other threads wait for it; on a GPU
                # the stream orders every use of a buffer instead.
                return self._launch(x, w, y, alpha, beta, None, workspace, FULL_ALIGNMENT)
        if not (x | w | y) & 15:  # the usual case, without three calls
            return self._launch(x, w, y, alpha, beta, stream, workspace, FULL_ALIGNMENT)
        # on a device backend the three are addresses (ints)
        return self._launch(x, w, y, alpha, beta, stream, workspace,
                            (alignment_of(cast(int, x)), alignment_of(cast(int, w)),
                             alignment_of(cast(int, y))))

    def _launch(self, x: Any, w: Any, y: Any, alpha: float, beta: float, stream: Any,
                workspace: Any, aligns: tuple) -> Plan:
        key = (alpha, beta) + aligns
        bound = self._last_bound if key == self._last_key else self._bind(key, stream)
        assert bound is not None
        self.backend.activate(stream)
        need = bound.workspace_bytes
        keep = None
        if need == 0:
            ws, size = None, 0
        elif callable(workspace) and self._caller_workspace:
            try:
                keep, ws, size = workspace(need)
            except WorkspaceUnavailable:
                bound, keep, ws, size = self._acquire(bound, key, stream, workspace)
        elif type(workspace) is tuple and workspace[1] >= need and self._caller_workspace:
            ws, size = workspace
        else:
            pool = self._pool_for(stream)
            if pool.size >= need:
                ws, size = pool.address, pool.size
            else:
                self._guard_capture(stream, "allocate workspace")
                bound, keep, ws, size = self._acquire(
                    bound, key, stream, lambda n: (None, *pool.ensure(n)))
        if self._graphs is not None and not is_capturing(stream if stream is not None
                                                         else self.backend.stream.handle):
            self._graphs.run(bound, x, w, y, ws, size, self.backend.stream.handle
                             if stream is None else stream)
        else:
            bound.launch(x, w, y, ws, size)
        del keep
        return bound.plan

    def run(self, tensors: ConvTensors, alpha: float = 1.0, beta: float = 0.0,
            workspace: ArrayLike = None) -> Plan:
        """:meth:`launch` on arrays of the backend's kind (whole batch, forward
        naming), on the backend's home stream; ``workspace`` an array of the
        backend's kind (used when large enough) or None. Returns the plan that ran."""
        if tensors.problem != self.problem:
            raise InvalidValueError(f"tensors: problem {tensors.problem} is not this kernel's "
                             f"{self.problem}")
        be = self.backend
        ws = None
        if workspace is not None:
            n = int(workspace.nbytes)
            ws = (be.address(workspace) if n else None, n)
        return self.launch(be.address(tensors.x), be.address(tensors.w), be.address(tensors.y),
                           float(alpha), float(beta), None, ws)

    @property
    def graphs(self) -> GraphCache | None:
        """The kernel's graph cache (None unless graphs are on and supported)."""
        return self._graphs


class _Unset:
    pass


_UNSET: Any = _Unset()
