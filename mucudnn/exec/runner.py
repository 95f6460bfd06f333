"""Run a Plan on a Backend: one backend call per micro-batch, one stream, no host sync.

Alpha/beta follow DESIGN.md ("Semantics every direction keeps"):

* forward and backward-data: micro-batch i writes only rows
  ``[offset, offset + size)`` of y (dx), which no other micro-batch touches, so
  every call gets the caller's ``alpha`` and ``beta``;
* backward-filter: every call writes the whole dw, so the first call gets the
  caller's ``beta`` and every later one ``beta = 1`` (accumulate). ``alpha``
  scales each partial sum, hence the total. With ``beta = 0`` the prior dw is
  never read (NaN in it does no harm), as in cuDNN.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable

from ..backends.base import Backend, ConvTensors
from ..problem import Direction, Plan
from .views import check_micro_batches, micro_batch_tensors

__all__ = ["execute", "prepare", "micro_batch_betas", "resolve_workspace", "nbytes_of"]

log = logging.getLogger("mucudnn")


def micro_batch_betas(direction: Direction, n: int, beta: float) -> list[float]:
    """The beta each of ``n`` micro-batches runs with.

    >>> micro_batch_betas(Direction.BACKWARD_FILTER, 3, 0.0)
    [0.0, 1.0, 1.0]
    >>> micro_batch_betas(Direction.FORWARD, 2, 0.5)
    [0.5, 0.5]
    """
    if Direction.parse(direction) is Direction.BACKWARD_FILTER:
        return [float(beta)] + [1.0] * (n - 1)
    return [float(beta)] * n


def nbytes_of(workspace: Any) -> int:
    """Size in bytes of a workspace array (0 for None)."""
    if workspace is None:
        return 0
    n = getattr(workspace, "nbytes", None)
    if n is None:
        n = len(workspace)
    return int(n)


def prepare(plan: Plan, backend: Backend, tensors: ConvTensors, alpha: float = 1.0,
            beta: float = 0.0, workspace: Any = None,
            direction: Direction | None = None) -> Callable[[], None]:
    """Check ``plan`` against ``tensors`` and ``workspace`` once; return a
    launcher that issues every micro-batch, in order, on the backend's stream.

    Backends with a ``bind`` method (the GPU backends) turn each micro-batch
    into a pre-checked library call, so calling the launcher costs one ctypes
    call per micro-batch and no Python checks; other backends get a launcher
    that calls ``run`` per micro-batch. ``direction`` defaults to ``plan.direction``.
    """
    d = Direction.parse(direction if direction is not None else plan.direction)
    if plan.direction is not None and direction is not None and plan.direction is not d:
        raise ValueError(f"plan: built for {plan.direction}, asked to run {d}")
    check_micro_batches(plan.micro_batches, tensors.problem.batch)
    have = nbytes_of(workspace)
    need = plan.workspace_bytes
    if have < need:
        raise ValueError(f"workspace: the plan needs {need} bytes, got {have}")
    ws = workspace if have > 0 else None
    betas = micro_batch_betas(d, len(plan.micro_batches), beta)
    bind = getattr(backend, "bind", None)
    calls = []
    for mb, b in zip(plan.micro_batches, betas):
        t = micro_batch_tensors(tensors, d, mb.offset, mb.size)
        if bind is not None:
            calls.append(bind(d, mb.algo, mb.math_type, t, float(alpha), b, ws))
        else:
            calls.append(functools.partial(backend.run, d, mb.algo, mb.math_type, t,
                                           float(alpha), b, ws))
    if len(calls) == 1:
        return calls[0]

    def launch() -> None:
        for c in calls:
            c()

    checks = [c.alive for c in calls if hasattr(c, "alive")]
    if checks:
        launch.alive = lambda: all(check() for check in checks)  # type: ignore[attr-defined]
    return launch


def execute(plan: Plan, backend: Backend, tensors: ConvTensors, alpha: float = 1.0,
            beta: float = 0.0, workspace: Any = None,
            direction: Direction | None = None) -> None:
    """Run every micro-batch of ``plan`` on ``backend``, in order, in place.

    ``tensors`` are the whole-batch tensors (backend kind, forward naming);
    ``workspace`` is a 1-D uint8 array of at least ``plan.workspace_bytes``
    (or None when the plan needs none). All calls go on the backend's stream
    one after another; nothing here waits for the device.

    ``direction`` defaults to ``plan.direction``.
    """
    prepare(plan, backend, tensors, alpha, beta, workspace, direction)()


def resolve_workspace(plan: Plan, backend: Backend, direction: Direction | None = None) -> Plan:
    """``plan`` with each micro-batch's workspace set to at least what the
    backend reports for its algorithm at its size (hand-built plans often say 0).

    Plans whose numbers already cover the backend's are returned as they are.
    """
    d = Direction.parse(direction if direction is not None else plan.direction)
    p = plan.problem
    if p is None:
        raise ValueError("plan: has no problem; attach one with plan.with_context(problem, direction)")
    changed = False
    mbs = []
    for m in plan.micro_batches:
        try:
            need = int(backend.workspace_size(p.with_batch(m.size), d, m.algo, m.math_type))
        except NotImplementedError:
            need = m.workspace_bytes
        if need > m.workspace_bytes:
            changed = True
            m = dataclasses.replace(m, workspace_bytes=need)
        mbs.append(m)
    ws = max((m.workspace_bytes for m in mbs), default=0)
    if not changed and ws <= plan.workspace_bytes:
        return plan
    return dataclasses.replace(plan, micro_batches=tuple(mbs),
                               workspace_bytes=max(ws, plan.workspace_bytes))
