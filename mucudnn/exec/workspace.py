"""Workspace memory: a per-device pool shared by WR plans, and WD segments.

* :class:`WorkspacePool` — one per backend (that is, per device): a single
  buffer that grows to the largest plan run so far and is reused by every WR
  plan (their micro-batches run one after another on one stream, so one buffer
  is enough). It never shrinks on its own; :meth:`WorkspacePool.release` frees it.
* :class:`SegmentedWorkspace` — for WD plans: one allocation carved into one
  segment per kernel, offsets aligned to :data:`ALIGN` bytes, so kernels that
  may be in flight together never share bytes.

An allocation limit provokes the run-time fallback on purpose (tests, or to
keep headroom for a framework): ``pool.limit_bytes = n`` or the environment
variable ``MUCUDNN_WORKSPACE_LIMIT`` (a size as :func:`mucudnn.units.parse_bytes`
reads it, e.g. ``64MiB``). A request over the limit raises :class:`WorkspaceUnavailable`
without allocating, as does an out-of-memory error from the backend.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Mapping

from ..backends.base import Backend
from ..errors import WorkspaceUnavailable
from ..units import parse_bytes

__all__ = ["ALIGN", "WorkspaceUnavailable", "WorkspacePool", "get_pool", "carve_segments",
           "SegmentedWorkspace", "env_workspace_limit", "out_of_memory_errors"]

log = logging.getLogger("mucudnn")

#: Alignment of WD segment offsets (cuDNN wants 16; 256 matches cudaMalloc).
ALIGN = 256
ENV_LIMIT = "MUCUDNN_WORKSPACE_LIMIT"


def out_of_memory_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "no memory": MemoryError and CUDA's OOM error."""
    errs: list[type[BaseException]] = [MemoryError]
    try:
        from ..cuda import CudaOutOfMemoryError  # type: ignore[attr-defined]
        errs.append(CudaOutOfMemoryError)
    except Exception:  # cuda package not built / no runtime
        pass
    return tuple(errs)


def env_workspace_limit() -> int | None:
    """``MUCUDNN_WORKSPACE_LIMIT`` in bytes, or None when unset/empty."""
    v = os.environ.get(ENV_LIMIT, "").strip()
    if not v or v.lower() in ("none", "off", "inf"):
        return None
    return parse_bytes(v, ENV_LIMIT)


def _device_free_bytes(backend: Backend) -> int | None:
    """Free device memory for a GPU backend, None where unknown (NumPy)."""
    fn = getattr(backend, "mem_get_info", None)
    try:
        if callable(fn):
            return int(fn()[0])
        if getattr(backend, "stream", None) is not None:
            from ..cuda import mem_get_info  # type: ignore[attr-defined]
            return int(mem_get_info()[0])
    except Exception:
        return None
    return None


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def _view(buffer: Any, start: int, stop: int) -> Any:
    return buffer[start:stop]


class WorkspacePool:
    """One growing workspace buffer for a backend (device), shared by WR plans.

    >>> from mucudnn.backends import get_backend            # doctest: +SKIP
    >>> pool = get_pool(get_backend("numpy"))               # doctest: +SKIP
    >>> ws = pool.get(1 << 20)       # a view of >= 1 MiB   # doctest: +SKIP
    """

    def __init__(self, backend: Backend, limit_bytes: int | None = None) -> None:
        self.backend = backend
        #: Allocation limit in bytes; None defers to MUCUDNN_WORKSPACE_LIMIT (unset: no limit).
        self.limit_bytes = limit_bytes
        self._buffer: Any = None
        self._size = 0
        self._lock = threading.RLock()
        #: Number of (re)allocations, for tests and logging.
        self.allocations = 0

    # -- limits -----------------------------------------------------------------
    def effective_limit(self) -> int | None:
        """The allocation limit in force (the attribute, else the environment)."""
        return self.limit_bytes if self.limit_bytes is not None else env_workspace_limit()

    @property
    def size(self) -> int:
        """Bytes currently held."""
        return self._size

    def available_bytes(self) -> int:
        """Largest request that should succeed now: the limit, else what is
        held plus free device memory, else (unknown, host) what is held."""
        limit = self.effective_limit()
        free = _device_free_bytes(self.backend)
        guess = self._size + free if free is not None else None
        if limit is not None and guess is not None:
            return min(limit, guess)
        if limit is not None:
            return limit
        return guess if guess is not None else self._size

    # -- allocation -------------------------------------------------------------
    def get(self, nbytes: int) -> Any:
        """A 1-D uint8 view of exactly ``nbytes`` of the pool's buffer (None for 0),
        growing the buffer when it is smaller.

        Raises :class:`WorkspaceUnavailable` when ``nbytes`` is over the limit
        or the backend runs out of memory.
        """
        nbytes = int(nbytes)
        if nbytes <= 0:
            return None
        limit = self.effective_limit()
        if limit is not None and nbytes > limit:
            raise WorkspaceUnavailable(
                f"workspace: {nbytes} bytes requested, over the pool limit of {limit} bytes",
                nbytes, limit)
        with self._lock:
            if nbytes > self._size:
                self._grow(nbytes)
            return _view(self._buffer, 0, nbytes)

    def _grow(self, nbytes: int) -> None:
        size = _align(nbytes)
        oom = out_of_memory_errors()
        try:
            buf = self.backend.alloc_workspace(size)
        except oom:
            # Give back what we hold and try once more.
            self.release()
            try:
                buf = self.backend.alloc_workspace(size)
            except oom as exc:
                avail = self.available_bytes()
                raise WorkspaceUnavailable(
                    f"workspace: out of memory allocating {size} bytes ({exc})", nbytes,
                    avail) from exc
        log.debug("mucudnn: workspace pool on %s grows %d -> %d bytes",
                  getattr(self.backend, "device_name", "?"), self._size, size)
        self._buffer = buf
        self._size = size
        self.allocations += 1

    @property
    def lock(self) -> "threading.RLock":
        """Held while a host backend computes in the pool's buffer (see Kernel.run)."""
        return self._lock

    def release(self) -> None:
        """Free the buffer (pending work on the stream must not need it; the
        device backends' free waits for the device)."""
        with self._lock:
            self._buffer = None
            self._size = 0


_POOLS: dict[int, tuple[Backend, WorkspacePool]] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(backend: Backend) -> WorkspacePool:
    """The workspace pool of ``backend`` (one per backend instance, i.e. per
    device and stream), created on first use."""
    with _POOLS_LOCK:
        entry = _POOLS.get(id(backend))
        if entry is None or entry[0] is not backend:
            entry = (backend, WorkspacePool(backend))
            _POOLS[id(backend)] = entry
        return entry[1]


def carve_segments(sizes: Mapping[str, int], align: int = ALIGN) -> tuple[int, dict[str, tuple[int, int]]]:
    """Lay out one segment per key: ``(total_bytes, {key: (offset, nbytes)})``.

    Offsets are multiples of ``align``; segments do not overlap; zero-byte
    segments get ``(offset, 0)`` and take no room. Keys keep their order.

    >>> carve_segments({"a": 100, "b": 0, "c": 300})
    (768, {'a': (0, 100), 'b': (256, 0), 'c': (256, 300)})
    """
    if align < 1 or align & (align - 1):
        raise ValueError(f"align: expected a power of two, got {align}")
    out: dict[str, tuple[int, int]] = {}
    pos = 0
    for key, n in sizes.items():
        n = int(n)
        if n < 0:
            raise ValueError(f"sizes[{key!r}]: expected a non-negative size, got {n}")
        out[key] = (pos, n)
        pos = _align(pos + n, align)
    return pos, out


class SegmentedWorkspace:
    """One allocation carved into per-kernel segments (for WD plans).

    ``segment(key)`` returns a uint8 view of that kernel's bytes (None for a
    zero-byte segment). The allocation goes through the pool's limit check.
    """

    def __init__(self, backend: Backend, sizes: Mapping[str, int], align: int = ALIGN,
                 pool: WorkspacePool | None = None) -> None:
        self.backend = backend
        self.total_bytes, self.segments = carve_segments(sizes, align)
        pool = pool if pool is not None else get_pool(backend)
        limit = pool.effective_limit()
        if limit is not None and self.total_bytes > limit:
            raise WorkspaceUnavailable(
                f"workspace: WD segments need {self.total_bytes} bytes, over the pool limit "
                f"of {limit} bytes", self.total_bytes, limit)
        self._buffer = None
        if self.total_bytes > 0:
            try:
                self._buffer = backend.alloc_workspace(self.total_bytes)
            except out_of_memory_errors() as exc:
                raise WorkspaceUnavailable(
                    f"workspace: out of memory allocating {self.total_bytes} bytes of WD "
                    f"segments ({exc})", self.total_bytes, pool.available_bytes()) from exc

    def __contains__(self, key: str) -> bool:
        return key in self.segments

    def segment(self, key: str) -> Any:
        off, n = self.segments[key]
        if n == 0:
            return None
        return _view(self._buffer, off, off + n)

    def __repr__(self) -> str:
        return f"SegmentedWorkspace({self.total_bytes} bytes, {len(self.segments)} segments)"
