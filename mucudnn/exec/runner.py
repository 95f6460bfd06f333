"""Run a Plan on a Backend: one bound launcher per micro-batch, one stream, no host sync.

Alpha/beta follow DESIGN.md ("Semantics every direction keeps"):

* forward and backward-data: micro-batch i writes only rows
  ``[offset, offset + size)`` of y (dx), which no other micro-batch touches, so
  every call gets the caller's ``alpha`` and ``beta``;
* backward-filter: every call writes the whole dw, so the first call gets the
  caller's ``beta`` and every later one ``beta = 1`` (accumulate). ``alpha``
  scales each partial sum, hence the total. With ``beta = 0`` the prior dw is
  never read (NaN in it does no harm), as in cuDNN.

:func:`bind_plan` turns a plan into a :class:`BoundPlan` for one (alpha, beta,
pointer-alignment) class: calling it with the whole-batch addresses issues
every micro-batch. It is what a warm call runs; :func:`execute` and
:func:`prepare` are the conveniences that start from arrays.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from ..backends.base import Backend, ConvTensors, Launcher
from ..problem import Direction, Plan
from .views import check_micro_batches
from ..errors import InvalidValueError
from ..typing_aliases import ArrayLike

__all__ = ["BoundPlan", "bind_plan", "execute", "prepare", "micro_batch_betas",
           "resolve_workspace", "nbytes_of", "FULL_ALIGNMENT",
           "alignment_of"]

log = logging.getLogger("mucudnn")

#: The alignment class of pointers aligned to 16 bytes or more (x, w, y).
FULL_ALIGNMENT = (16, 16, 16)


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


def nbytes_of(workspace: ArrayLike) -> int:
    """Size in bytes of a workspace array (0 for None)."""
    if workspace is None:
        return 0
    n = getattr(workspace, "nbytes", None)
    if n is None:
        n = len(workspace)
    return int(n)


class BoundPlan:
    """A plan bound to a backend for one (alpha, beta, alignment) class.

    ``bound(x, w, y, workspace, workspace_bytes)`` issues every micro-batch in
    order on the backend's active stream; the addresses are the whole-batch
    tensors' (device pointers, or arrays on a host backend). ``workspace_bytes``
    is the most any micro-batch needs.
    """

    __slots__ = ("plan", "launchers", "workspace_bytes", "launch")

    def __init__(self, plan: Plan, launchers: list[Launcher]) -> None:
        self.plan = plan
        self.launchers = launchers
        self.workspace_bytes = max((int(l.workspace_bytes) for l in launchers), default=0)
        #: The fastest way to issue it: the launcher itself for one micro-batch.
        self.launch: Callable[..., None] = launchers[0] if len(launchers) == 1 else self.__call__

    def __call__(self, x: Any, w: Any, y: Any, workspace: Any, workspace_bytes: int) -> None:
        for launch in self.launchers:
            launch(x, w, y, workspace, workspace_bytes)

    @property
    def algos(self) -> list[Any]:
        return [l.algo for l in self.launchers]


def bind_plan(plan: Plan, backend: Backend, alpha: float = 1.0, beta: float = 0.0,
              aligns: tuple[int, int, int] = FULL_ALIGNMENT) -> BoundPlan:
    """Bind every micro-batch of ``plan`` (which carries its problem and
    direction) for these scalars and whole-batch pointer alignments.

    Raises :class:`~mucudnn.errors.UnsupportedConfigError` when the backend
    cannot run one of the plan's algorithms this way.
    """
    p, d = plan.problem, plan.direction
    if p is None or d is None:
        raise InvalidValueError("plan: has no problem or direction; attach them with "
                         "plan.with_context(problem, direction)")
    check_micro_batches(plan.micro_batches, p.batch)
    betas = micro_batch_betas(d, len(plan.micro_batches), beta)
    launchers = [backend.bind(d, mb.algo, mb.math_type, p, mb.offset, mb.size, float(alpha), b,
                              aligns)
                 for mb, b in zip(plan.micro_batches, betas)]
    return BoundPlan(plan, launchers)


def _direction_of(plan: Plan, direction: Direction | None) -> Direction:
    d = direction if direction is not None else plan.direction
    if d is None:
        raise InvalidValueError("direction: the plan has none; pass direction= or attach one with "
                         "plan.with_context(problem, direction)")
    return d


def _addresses(backend: Backend, tensors: ConvTensors, workspace: Any) -> tuple[Any, ...]:
    ws = None if workspace is None or nbytes_of(workspace) == 0 else backend.address(workspace)
    return (backend.address(tensors.x), backend.address(tensors.w), backend.address(tensors.y),
            ws, nbytes_of(workspace))


def alignment_of(address: int) -> int:
    """The alignment in bytes (at most 16, what cuDNN's kernels care about) of
    a device address; 16 for a null one."""
    return 16 if not address & 15 else address & -address


def _aligns(backend: Backend, addresses: tuple[Any, ...]) -> tuple[int, int, int]:
    if backend.is_host:
        return FULL_ALIGNMENT
    x, w, y = addresses[:3]
    return alignment_of(x), alignment_of(w), alignment_of(y)


def prepare(plan: Plan, backend: Backend, tensors: ConvTensors, alpha: float = 1.0,
            beta: float = 0.0, workspace: ArrayLike = None,
            direction: Direction | None = None) -> Callable[[], None]:
    """Check ``plan`` against ``tensors`` and ``workspace`` once; return a
    zero-argument launcher that issues every micro-batch, in order, on the
    backend's home stream (what the benchmarks time: a bound plan, as a warm
    :class:`~mucudnn.Convolution` call runs it). ``direction`` defaults to
    ``plan.direction``."""
    d = Direction.parse(_direction_of(plan, direction))
    if plan.direction is not None and direction is not None and plan.direction is not d:
        raise InvalidValueError(f"plan: built for {plan.direction}, asked to run {d}")
    check_micro_batches(plan.micro_batches, tensors.problem.batch)
    plan = plan.with_context(tensors.problem, d)
    addresses = _addresses(backend, tensors, workspace)
    bound = bind_plan(plan, backend, alpha, beta, _aligns(backend, addresses))
    if addresses[4] < bound.workspace_bytes:
        raise InvalidValueError(f"workspace: the plan needs {bound.workspace_bytes} bytes, got "
                         f"{addresses[4]}")

    activate = backend.activate

    def launch() -> None:
        activate(None)
        bound(*addresses)

    launch.bound = bound  # type: ignore[attr-defined]
    return launch


def execute(plan: Plan, backend: Backend, tensors: ConvTensors, alpha: float = 1.0,
            beta: float = 0.0, workspace: ArrayLike = None,
            direction: Direction | None = None) -> None:
    """Run every micro-batch of ``plan`` on ``backend``, in order, in place.

    ``tensors`` are the whole-batch tensors (backend kind, forward naming);
    ``workspace`` is a 1-D uint8 array of at least the plan's need (or None
    when it needs none). All calls go on the backend's home stream one after
    another; nothing here waits for the device.
    """
    prepare(plan, backend, tensors, alpha, beta, workspace, direction)()


def resolve_workspace(plan: Plan, backend: Backend, direction: Direction | None = None) -> Plan:
    """``plan`` with each micro-batch's workspace set to at least what the
    backend reports for its algorithm at its size (hand-built plans often say 0).

    Plans whose numbers already cover the backend's are returned as they are.
    """
    d = Direction.parse(_direction_of(plan, direction))
    p = plan.problem
    if p is None:
        raise InvalidValueError("plan: has no problem; attach one with plan.with_context(problem, direction)")
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
