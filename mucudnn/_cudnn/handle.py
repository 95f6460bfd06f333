"""The cuDNN handle (cudnnHandle_t): one per device, bound to a CUDA stream.

``Handle(device=None, stream=None)`` creates a handle on ``device`` (the current
device when None) and binds it to ``stream`` (a :class:`mucudnn.cuda.Stream`, a
raw ``cudaStream_t`` int, anything with ``.handle``, ``.cuda_stream`` or
``__cuda_stream__``; None = the device's :func:`mucudnn.cuda.default_stream`,
which is what every mucudnn operation given ``stream=None`` uses).
:func:`get_handle` caches one handle per device on that default stream.

Without a GPU (or driver), ``Handle()`` raises :class:`mucudnn.cuda.NoDeviceError`
before cuDNN is touched.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional

from ..cuda import current_device, default_stream, require_device, stream_handle, using_device
from ._lifetime import CudnnObject, LiveCount
from .errors import CudnnError
from .prototypes import lib
from .structs import cudaStream_t, cudnnHandle_t

__all__ = ["Handle", "get_handle", "live_handles"]

_live = LiveCount("handle")


def live_handles() -> int:
    """cuDNN handles created and not yet destroyed."""
    return _live.total()


class Handle(CudnnObject):
    """A cuDNN handle on one device, bound to one stream. ``close()`` calls
    cudnnDestroy now (idempotent); cuDNN synchronises the device."""

    _ctype = cudnnHandle_t
    _create_fn = "cudnnCreate"
    _destroy_fn = "cudnnDestroy"
    _live = _live

    def __init__(self, device: Optional[int] = None, stream: Any = None) -> None:
        require_device()  # NoDeviceError without a GPU or driver
        with using_device(device):
            self.device = current_device()
            self._create("handle")
        self._stream: Any = None
        try:
            with using_device(self.device):
                self.set_stream(stream)
        except BaseException:
            self.close()
            raise

    def set_stream(self, stream: Any) -> None:
        """cudnnSetStream; keeps a reference to ``stream`` so it outlives the binding.
        None means the device's :func:`mucudnn.cuda.default_stream`; 0 the legacy
        default stream."""
        if stream is None:
            stream = default_stream(self.device)
        raw = stream_handle(stream, self.device)
        try:
            lib.cudnnSetStream(self, cudaStream_t(raw))
        except CudnnError as exc:
            exc.add_details(stream=hex(raw or 0), device=self.device)
            raise
        self._stream = stream

    @property
    def stream(self) -> Any:
        """The stream object this handle was bound to (None: the default stream)."""
        return self._stream

    @property
    def stream_handle(self) -> int:
        """cudnnGetStream, as an int (0 for the default stream)."""
        s = cudaStream_t()
        lib.cudnnGetStream(self, ctypes.byref(s))
        return s.value or 0

    def __repr__(self) -> str:
        state = "closed" if self.closed else hex(self.handle)
        stream = hex(stream_handle(self._stream, self.device))
        return f"Handle(device={self.device}, {state}, stream={stream})"


_cache_lock = threading.Lock()
_cache: dict[int, Handle] = {}


def get_handle(device: Optional[int] = None) -> Handle:
    """The process-wide handle of ``device`` (current device when None), bound to
    :func:`mucudnn.cuda.default_stream`. Callers wanting their own stream create
    their own Handle (a handle must not be re-bound while another user relies on it)."""
    require_device()
    dev = current_device() if device is None else int(device)
    with _cache_lock:
        h = _cache.get(dev)
        if h is None or h.closed:
            h = _cache[dev] = Handle(dev)
        return h
