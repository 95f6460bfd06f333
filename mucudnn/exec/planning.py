"""What the engine asks of a planner: the one seam between ``exec/`` and ``optimizer/``.

``exec/`` never imports the optimizer. Whoever builds a
:class:`~mucudnn.exec.kernel.Kernel` or a
:class:`~mucudnn.exec.handle.MicroBatchHandle` hands it a :class:`Planner`
(``api/`` hands :class:`mucudnn.optimizer.Planner`), and every plan the
engine runs comes from it: the first plan, a re-plan when workspace runs out or
a backend refuses a configuration at run time, and the joint (WD) plans of a
handle. So ``optimizer/`` is the one owner of plan decisions and the engine
only runs what it is given.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Protocol, runtime_checkable

from ..problem import ConvProblem, Direction, Plan

__all__ = ["Planner"]


@runtime_checkable
class Planner(Protocol):
    """Plans for kernels of one backend, workspace limit and policy."""

    #: The per-kernel workspace limit in bytes that plans respect (None: unlimited).
    workspace_limit: int | None

    def plan(self, problem: ConvProblem, direction: Direction) -> Plan:
        """The preferred plan of (problem, direction): the fastest under the limit."""
        ...

    def replan(self, problem: ConvProblem, direction: Direction, available: int,
               exclude: Collection[Any] = ()) -> Plan:
        """The fastest plan whose workspace fits ``available`` bytes and uses no
        algorithm in ``exclude``; never fails while ``available >= 0`` and some
        algorithm is left (a zero-workspace plan is the last resort)."""
        ...

    def plan_jointly(self, kernels: Mapping[str, tuple[ConvProblem, Direction]],
                     total_workspace: int) -> dict[str, Plan]:
        """One plan per named kernel, their workspaces summing to at most
        ``total_workspace`` bytes (WD)."""
        ...
