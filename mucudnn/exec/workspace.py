"""Workspace memory: pools per (backend, stream) shared by WR plans, and WD segments.

* :class:`WorkspacePool` -- one per backend and stream: a single buffer that
  grows to the largest plan run on that stream so far and is reused by every
  plan issued there (their micro-batches run one after another on the one
  stream, so one buffer is enough). It never shrinks on its own;
  :meth:`WorkspacePool.release` frees it. :func:`pool_for` finds a backend's
  pool for a stream; a backend keeps at most :data:`MAX_STREAM_POOLS` of them
  (the least recently used is released), and they go with the backend.
* :class:`SegmentedWorkspace` -- for WD plans: one allocation carved into one
  segment per kernel, offsets aligned to :data:`ALIGN` bytes, so kernels that
  may be in flight together never share bytes.

Note [one pool per stream]
~~~~~~~~~~~~~~~~~~~~~~~~~~
The engine issues each call on the caller's stream (Note [streams] in
``backends/_device.py``). Buffers are never shared between streams, so no
event has to order two streams that once used the same bytes. Calls with
PyTorch or CuPy arrays take their workspace from that framework's own
allocator instead (stream-aware and CUDA-graph aware), see :mod:`mucudnn.api`.

An allocation limit provokes the run-time fallback on purpose (tests, or to
keep headroom for a framework): ``pool.limit_bytes = n`` (applies at once: a
held buffer over the new limit is released) or the environment variable
``MUCUDNN_WORKSPACE_LIMIT`` (a size as :func:`mucudnn.units.parse_bytes` reads
it, e.g. ``64MiB``; read whenever the pool allocates, not on every call). A
request over the limit raises :class:`~mucudnn.errors.WorkspaceUnavailable`
without allocating, as does an out-of-memory error from the backend.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Mapping

from ..backends.base import Backend
from ..caches import LRU
from ..cuda import CudaOutOfMemoryError
from ..errors import InvalidValueError, MucudnnError, WorkspaceUnavailable
from ..units import parse_bytes

__all__ = ["ALIGN", "MAX_STREAM_POOLS", "WorkspaceUnavailable", "WorkspacePool", "PoolOrphanedError",
           "get_pool", "pool_for", "carve_segments", "SegmentedWorkspace", "env_workspace_limit",
           "OUT_OF_MEMORY"]

log = logging.getLogger("mucudnn")

#: Alignment of WD segment offsets (cuDNN wants 16; 256 matches cudaMalloc).
ALIGN = 256
ENV_LIMIT = "MUCUDNN_WORKSPACE_LIMIT"
#: Streams per backend that keep a pool (the least recently used one is released).
MAX_STREAM_POOLS = 8
#: Exceptions that mean "no memory": MemoryError and CUDA's out-of-memory error.
OUT_OF_MEMORY: tuple[type[BaseException], ...] = (MemoryError, CudaOutOfMemoryError)


class PoolOrphanedError(MucudnnError, ReferenceError):
    """A registered pool used after its backend was collected (Note [pools hold
    their backend weakly]); hold the backend while using its pools."""


def env_workspace_limit() -> int | None:
    """``MUCUDNN_WORKSPACE_LIMIT`` in bytes, or None when unset/empty."""
    v = os.environ.get(ENV_LIMIT, "").strip()
    if not v or v.lower() in ("none", "off", "inf"):
        return None
    return parse_bytes(v, ENV_LIMIT)


def _device_free_bytes(backend: Backend) -> int | None:
    """Free device memory of a GPU backend, None where unknown (host)."""
    info = backend.mem_get_info()
    return None if info is None else int(info[0])


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


class WorkspacePool:
    """One growing workspace buffer of a backend on one stream, shared by WR plans.

    >>> from mucudnn.backends import get_backend
    >>> pool = get_pool(get_backend("numpy"))
    >>> addr, size = pool.ensure(1 << 20)      # an address for the backend, >= 1 MiB
    >>> size >= 1 << 20
    True
    """

    def __init__(self, backend: Backend, limit_bytes: int | None = None,
                 stream: int | None = None) -> None:
        # A pool made by hand holds its backend; pool_for's hold it weakly
        # (Note [pools hold their backend weakly]).
        self._backend: Backend | None = backend
        self._backend_ref: "weakref.ref[Any] | None" = None
        self.stream = stream
        self._limit = limit_bytes
        self._buffer: Any = None
        self._size = 0
        #: The buffer's address for launchers (None while empty).
        self.address: Any = None
        self._lock = threading.RLock()
        #: False once released by eviction (holders then ask pool_for again).
        self.alive = True
        #: Number of (re)allocations, for tests and logging.
        self.allocations = 0

    @classmethod
    def _registered(cls, backend: Backend, stream: int | None) -> "WorkspacePool":
        """A pool for :func:`pool_for`'s registry, holding ``backend`` weakly."""
        pool = cls(backend, stream=stream)
        pool._backend, pool._backend_ref = None, weakref.ref(backend)
        return pool

    @property
    def backend(self) -> Backend:
        """The backend whose memory the pool holds."""
        if self._backend is not None:
            return self._backend
        be = self._backend_ref() if self._backend_ref is not None else None
        if be is None:
            raise PoolOrphanedError("pool: its backend no longer exists; a registered pool "
                                    "lives only as long as its backend (pool_for)")
        return be

    # -- limits -----------------------------------------------------------------
    @property
    def limit_bytes(self) -> int | None:
        """Allocation limit in bytes; None defers to MUCUDNN_WORKSPACE_LIMIT (unset: no limit)."""
        return self._limit

    @limit_bytes.setter
    def limit_bytes(self, value: int | None) -> None:
        self._limit = None if value is None else parse_bytes(value, "limit_bytes")
        if self._limit is not None and self._size > self._limit:
            self.release()  # the next call allocates (or falls back) under the new limit

    def effective_limit(self) -> int | None:
        """The allocation limit in force (the attribute, else the environment)."""
        return self._limit if self._limit is not None else env_workspace_limit()

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
    def ensure(self, nbytes: int) -> tuple[Any, int]:
        """``(address, size)`` of the buffer, grown to at least ``nbytes`` first.

        Raises :class:`WorkspaceUnavailable` when ``nbytes`` is over the limit
        or the backend runs out of memory.
        """
        nbytes = int(nbytes)
        limit = self.effective_limit()
        if limit is not None and nbytes > limit:
            raise WorkspaceUnavailable(
                f"workspace: {nbytes} bytes requested, over the pool limit of {limit} bytes",
                nbytes, limit)
        if nbytes <= self._size:
            return self.address, self._size
        with self._lock:
            if nbytes > self._size:
                self._grow(nbytes)
            return self.address, self._size

    def get(self, nbytes: int) -> Any:
        """A 1-D uint8 view of exactly ``nbytes`` of the pool's buffer (None for 0)."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            return None
        self.ensure(nbytes)
        return self._buffer[0:nbytes]

    def _grow(self, nbytes: int) -> None:
        size = _align(nbytes)
        try:
            buf = self.backend.alloc_workspace(size)
        except OUT_OF_MEMORY:
            # Give back what we hold and try once more.
            self.release()
            try:
                buf = self.backend.alloc_workspace(size)
            except OUT_OF_MEMORY as exc:
                avail = self.available_bytes()
                raise WorkspaceUnavailable(
                    f"workspace: out of memory allocating {size} bytes ({exc})", nbytes,
                    avail) from exc
        log.debug("mucudnn: workspace pool on %s (stream %s) grows %d -> %d bytes",
                  self.backend.device_name, self.stream, self._size, size)
        self._buffer = buf
        self._size = size
        self.address = self.backend.address(buf)
        self.allocations += 1

    @property
    def lock(self) -> "threading.RLock":
        """Held while a host backend computes in the pool's buffer (see Kernel.launch)."""
        return self._lock

    def release(self) -> None:
        """Free the buffer (device backends free with cudaFree, which waits for
        the device, so queued work that uses it finishes first)."""
        with self._lock:
            self._buffer = None
            self.address = None
            self._size = 0


# Note [pools hold their backend weakly]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The registry maps each backend weakly to its pools, and a WeakKeyDictionary
# holds its values strongly: a pool that held its backend strongly would keep
# its own key alive, so every backend that ever had a pool (one-off NumPy
# backends, a backend per call) would live, with its pools and buffers, until
# the process ends. So registered pools refer to their backend through a weak
# reference; whoever runs on a pool (a Kernel, a Convolution) holds the backend
# itself, so it is there while the pool is used, and when the last holder goes
# the backend, its registry entry and its pools (buffers included) go with it.
#: backend -> its pools by stream; a pool goes when its backend does.
_POOLS: "weakref.WeakKeyDictionary[Any, LRU[Any, WorkspacePool]]" = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def _evict_pool(_stream: Any, pool: WorkspacePool) -> None:
    pool.alive = False
    pool.release()


def pool_for(backend: Backend, stream: int | None = None) -> WorkspacePool:
    """The workspace pool of ``backend`` on ``stream`` (None: its home stream),
    created on first use (Note [one pool per stream])."""
    pools = _POOLS.get(backend)
    if pools is None:
        with _POOLS_LOCK:
            pools = _POOLS.get(backend)
            if pools is None:
                pools = LRU("exec.workspace_pools", MAX_STREAM_POOLS, on_evict=_evict_pool)
                _POOLS[backend] = pools
    return pools.get_or_create(stream, lambda: WorkspacePool._registered(backend, stream))


def get_pool(backend: Backend) -> WorkspacePool:
    """The workspace pool of ``backend`` on its home stream."""
    return pool_for(backend, None)


def carve_segments(sizes: Mapping[str, int], align: int = ALIGN) -> tuple[int, dict[str, tuple[int, int]]]:
    """Lay out one segment per key: ``(total_bytes, {key: (offset, nbytes)})``.

    Offsets are multiples of ``align``; segments do not overlap; zero-byte
    segments get ``(offset, 0)`` and take no room. Keys keep their order.

    >>> carve_segments({"a": 100, "b": 0, "c": 300})
    (768, {'a': (0, 100), 'b': (256, 0), 'c': (256, 300)})
    """
    if align < 1 or align & (align - 1):
        raise InvalidValueError(f"align: expected a power of two, got {align}")
    out: dict[str, tuple[int, int]] = {}
    pos = 0
    for key, n in sizes.items():
        n = int(n)
        if n < 0:
            raise InvalidValueError(f"sizes[{key!r}]: expected a non-negative size, got {n}")
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
        self._buffer: Any = None  # a backend workspace buffer, or None for 0 bytes
        if self.total_bytes > 0:
            try:
                self._buffer = backend.alloc_workspace(self.total_bytes)
            except OUT_OF_MEMORY as exc:
                raise WorkspaceUnavailable(
                    f"workspace: out of memory allocating {self.total_bytes} bytes of WD "
                    f"segments ({exc})", self.total_bytes, pool.available_bytes()) from exc

    def __contains__(self, key: str) -> bool:
        return key in self.segments

    def segment(self, key: str) -> Any:
        """A uint8 view of the segment of ``key`` (None for a zero-byte segment)."""
        off, n = self.segments[key]
        if n == 0:
            return None
        return self._buffer[off:off + n]

    def address(self, key: str) -> tuple[Any, int]:
        """``(address, size)`` of the segment of ``key`` for a launcher."""
        seg = self.segment(key)
        if seg is None:
            return None, 0
        return self.backend.address(seg), int(seg.nbytes)

    def __repr__(self) -> str:
        return f"SegmentedWorkspace({self.total_bytes} bytes, {len(self.segments)} segments)"
