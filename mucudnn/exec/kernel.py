"""One kernel (a problem and a direction on a backend): plan, workspace, fallback, graphs.

:class:`Kernel` is what :class:`mucudnn.Convolution` and
:class:`~mucudnn.exec.handle.MicroBatchHandle` run through. It holds the plan
in use (obtained lazily from a planner callable), takes workspace from the
backend's :class:`~mucudnn.exec.workspace.WorkspacePool` (or from a workspace
the caller supplies), falls back to a smaller plan when the workspace cannot be
allocated (warning once per kernel), and replays CUDA graphs when asked.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Callable

from ..backends.base import Backend, ConvTensors
from ..problem import ConvProblem, Direction, Plan
from .fallback import replan_under
from .graph import GraphCache, LaunchCache, supports_graphs
from .runner import execute, nbytes_of, prepare, resolve_workspace
from .views import check_micro_batches
from .workspace import WorkspacePool, WorkspaceUnavailable, get_pool

__all__ = ["Kernel", "WorkspaceFallbackWarning"]

log = logging.getLogger("mucudnn")


class WorkspaceFallbackWarning(RuntimeWarning):
    """A plan's workspace could not be allocated; a smaller plan ran instead."""


class Kernel:
    """A (problem, direction) on a backend, with its plan and execution state.

    ``planner()`` returns the preferred Plan (called once, lazily). ``policy``,
    ``workspace_limit`` and ``cache`` are used only to re-plan in a fallback.
    """

    def __init__(self, backend: Backend, problem: ConvProblem, direction: Direction,
                 planner: Callable[[], Plan], *, policy: Any = "powerOfTwo",
                 workspace_limit: int | None = None, cache: Any = None, graph: bool = False,
                 pool: WorkspacePool | None = None, name: str | None = None) -> None:
        self.backend = backend
        self.problem = problem
        self.direction = Direction.parse(direction)
        self._planner = planner
        self.policy = policy
        self.workspace_limit = workspace_limit
        self.cache = cache
        self.pool = pool if pool is not None else get_pool(backend)
        self.graph = bool(graph) and supports_graphs(backend)
        self.name = name or f"{problem.key()}/{self.direction}"
        self._plan: Plan | None = None
        self._preferred: Plan | None = None
        self._graphs: GraphCache | None = GraphCache(backend) if self.graph else None
        self._launchers: LaunchCache | None = (
            LaunchCache(backend) if getattr(backend, "bind", None) is not None else None)
        self._warned = False
        self._lock = threading.RLock()
        #: How many times a fallback plan was used (tests, logging).
        self.fallbacks = 0

    # -- plans ------------------------------------------------------------------
    def _install(self, plan: Plan) -> Plan:
        if plan.problem is None or plan.direction is None:
            plan = plan.with_context(self.problem if plan.problem is None else plan.problem,
                                     self.direction if plan.direction is None else plan.direction)
        if plan.direction is not self.direction:
            raise ValueError(f"plans: a plan for {plan.direction} given for {self.direction}")
        if plan.problem.with_batch(self.problem.batch) != self.problem:
            raise ValueError(
                f"plans: the plan's problem {plan.problem} is not this kernel's {self.problem}")
        if plan.problem != self.problem:
            plan = plan.with_context(self.problem, self.direction)
        check_micro_batches(plan.micro_batches, self.problem.batch)
        return resolve_workspace(plan, self.backend, self.direction)

    @property
    def plan(self) -> Plan:
        """The plan in use (planned on first access)."""
        with self._lock:
            if self._plan is None:
                self._plan = self._preferred = self._install(self._planner())
                log.debug("mucudnn: %s plan %s (%d bytes workspace)", self.name,
                          self._plan.describe(), self._plan.workspace_bytes)
            return self._plan

    @property
    def planned(self) -> bool:
        return self._plan is not None

    def set_plan(self, plan: Plan) -> None:
        """Use ``plan`` from now on (e.g. one chosen by WD)."""
        with self._lock:
            self._plan = self._preferred = self._install(plan)
            if self._graphs is not None:
                self._graphs.clear()
            if self._launchers is not None:
                self._launchers.clear()

    def reset(self) -> None:
        """Return from a fallback plan to the preferred one (tried on the next call)."""
        with self._lock:
            if self._preferred is not None:
                self._plan = self._preferred

    # -- workspace --------------------------------------------------------------
    def _workspace(self, plan: Plan, given: Any) -> tuple[Plan, Any]:
        """(plan to run, workspace for it): the caller's workspace when large
        enough, else the pool's, else a fallback plan under what is free."""
        if nbytes_of(given) >= plan.workspace_bytes:
            return plan, (given if nbytes_of(given) > 0 else None)
        try:
            return plan, self.pool.get(plan.workspace_bytes)
        except WorkspaceUnavailable as exc:
            available = max(exc.available, nbytes_of(given))
            return self._fall_back(plan, available, str(exc), given)

    def _fall_back(self, plan: Plan, available: int, why: str, given: Any) -> tuple[Plan, Any]:
        new = replan_under(self.problem, self.direction, self.backend, available,
                           policy=self.policy, workspace_limit=self.workspace_limit,
                           cache=self.cache)
        msg = (f"mucudnn: {self.name}: {why}; running plan {new.describe()} "
               f"({new.workspace_bytes} bytes of workspace) instead of {plan.describe()} "
               f"({plan.workspace_bytes} bytes); the result is the same convolution")
        if not self._warned:
            self._warned = True
            warnings.warn(msg, WorkspaceFallbackWarning, stacklevel=4)
        else:
            log.info(msg)
        self.fallbacks += 1
        if nbytes_of(given) >= new.workspace_bytes:
            ws = given if nbytes_of(given) > 0 else None
        else:
            try:
                ws = self.pool.get(new.workspace_bytes)
            except WorkspaceUnavailable:
                new = replan_under(self.problem, self.direction, self.backend, 0,
                                   policy=self.policy, workspace_limit=self.workspace_limit,
                                   cache=self.cache)
                ws = None
        new = self._install(new)
        with self._lock:
            self._plan = new
        return new, ws

    # -- running ----------------------------------------------------------------
    def run(self, tensors: ConvTensors, alpha: float = 1.0, beta: float = 0.0,
            workspace: Any = None) -> Plan:
        """Run the plan on ``tensors`` (whole batch, backend kind, forward
        naming). Returns the plan that ran. Asynchronous on GPU backends."""
        if tensors.problem != self.problem:
            raise ValueError(f"tensors: problem {tensors.problem} is not this kernel's {self.problem}")
        if getattr(self.backend, "stream", None) is None:
            # Note: a host backend computes in the pool's buffer while run()
            # runs, so callers on other threads must wait for it; on a GPU the
            # one stream orders every use of the shared buffer instead.
            with self.pool.lock:
                return self._run(tensors, alpha, beta, workspace)
        return self._run(tensors, alpha, beta, workspace)

    def _run(self, tensors: ConvTensors, alpha: float, beta: float, workspace: Any) -> Plan:
        plan, ws = self._workspace(self.plan, workspace)
        if self._graphs is not None:
            self._graphs.run(plan, tensors, ws, alpha, beta,
                             lambda: execute(plan, self.backend, tensors, alpha, beta, ws,
                                             self.direction))
        elif self._launchers is not None:
            self._launchers.run(plan, tensors, ws, alpha, beta,
                                lambda: prepare(plan, self.backend, tensors, alpha, beta, ws,
                                                self.direction))
        else:
            execute(plan, self.backend, tensors, alpha, beta, ws, self.direction)
        return plan

    @property
    def graphs(self) -> GraphCache | None:
        """The kernel's graph cache (None unless graphs are on and supported)."""
        return self._graphs
