"""MicroBatchHandle: the cuDNN-handle-shaped entry point (the engine of
:mod:`mucudnn.exec.handle`), made from a backend and the planning options a
Convolution takes."""

from __future__ import annotations

from ..backends import Backend, get_backend
from ..exec.handle import HandleEngine
from ..optimizer.benchmark import check_deterministic
from ..optimizer.planner import Planner
from ..optimizer.policies import DEFAULT_POLICY
from ..optimizer.types import CacheLike, PolicyLike
from ..units import ByteSize

__all__ = ["MicroBatchHandle"]


class MicroBatchHandle(HandleEngine):
    """cuDNN-handle-shaped entry point whose convolutions run micro-batched
    (see :mod:`mucudnn.exec.handle` for the calls it answers).

    ``backend``: a name ("cudnn-graph", "cudnn", "numpy"), a Backend, or None
    (the default: cudnn-graph where a GPU is present, else numpy). On "numpy",
    pass NumPy arrays where cuDNN takes pointers (tests).
    ``workspace_limit``/``policy``/``cache``/``graph``/``deterministic`` as for
    :class:`Convolution`.

    >>> h = MicroBatchHandle("numpy", workspace_limit="1MiB")
    >>> h.workspace_limit
    1048576
    """

    def __init__(self, backend: "str | Backend | None" = None, *,
                 workspace_limit: "ByteSize | None" = 64 << 20, policy: PolicyLike = DEFAULT_POLICY,
                 graph: bool = False, cache: CacheLike = None, deterministic: bool = False) -> None:
        check_deterministic(deterministic)
        be = get_backend(backend)
        planner = Planner(be, workspace_limit, policy, cache, deterministic=deterministic)
        super().__init__(be, planner, graph=graph)
        self.policy = planner.policy
        self.cache = cache
        self.deterministic = planner.deterministic
