"""The argument types of the planning functions: what ``backend=``, ``policy=``,
``cache=`` and ``devices=`` accept, named once (instead of ``Any``) for every
public function of :mod:`mucudnn.optimizer`, :mod:`mucudnn.api` and
:mod:`mucudnn.bench`. :func:`~.options.plan_options` turns them into checked
values (a :class:`~.options.PlanOptions`)."""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence, Union

from ..backends import Backend
from ..typing_aliases import PolicyLike
from .cache import BenchmarkCache

__all__ = ["BackendLike", "CacheLike", "DevicesLike", "PolicyLike"]

#: A Backend (or anything :func:`mucudnn.backends.adapt` completes), a backend
#: name, a factory called as ``factory(device=i)`` (with ``devices=``), or None
#: (the default backend).
BackendLike = Union[Backend, str, Callable[..., Backend], None]
#: None (or True): the default benchmark cache; False or "off": none; a path;
#: a BenchmarkCache.
CacheLike = Union[BenchmarkCache, str, os.PathLike[str], bool, None]
#: CUDA device ordinals to spread benchmarking over, or None (this process).
DevicesLike = Optional[Sequence[int]]
