"""Streams and events: :class:`Stream`, :func:`default_stream`, :class:`Event`."""

from __future__ import annotations

import threading
import weakref

from . import _lifetime, _runtime
from .device import current_device, require_device, using_device
from ._runtime import check
from ..errors import InvalidTypeError, InvalidValueError

__all__ = ["Stream", "default_stream", "stream_handle", "is_capturing", "Event"]


def _destroy_stream(handle: int) -> None:
    check(_runtime.get().cudaStreamDestroy(handle), "cudaStreamDestroy")


class Stream:
    """A CUDA stream created with ``cudaStreamNonBlocking``, owned by this object.

    ``handle`` is the integer value of the ``cudaStream_t`` (what cuDNN's
    ``cudnnSetStream`` and the ``stream`` field of ``__cuda_array_interface__``
    want). Destroyed by :meth:`close`, by the context manager, or by a
    ``weakref.finalize`` safety net. :meth:`wrap` makes a non-owning Stream
    around any existing handle (a torch stream's ``cuda_stream``, say).
    """

    __slots__ = ("handle", "device", "_owned", "_finalizer", "__weakref__")

    def __init__(self, device: int | None = None):
        require_device()
        rt = _runtime.get()
        with using_device(device):
            dev = current_device()
            raw = check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking),
                        "cudaStreamCreateWithFlags")
        self.handle = int(raw)
        self.device = dev
        self._owned = True
        self._finalizer = weakref.finalize(self, _lifetime.release, _destroy_stream, self.handle)
        # Process teardown frees everything; calling into a half-unloaded
        # runtime from atexit would only risk a crash.
        self._finalizer.atexit = False

    @classmethod
    def wrap(cls, handle: int, device: int | None = None) -> "Stream":
        """A non-owning Stream around an existing ``cudaStream_t`` value; close() never destroys it."""
        if isinstance(handle, Stream):
            return handle
        self = cls.__new__(cls)
        self.handle = int(handle)
        self.device = None if device is None else int(device)  # type: ignore[assignment]
        self._owned = False
        self._finalizer = None  # type: ignore[assignment]
        return self

    @property
    def owned(self) -> bool:
        return self._owned

    @property
    def closed(self) -> bool:
        return self._finalizer is not None and not self._finalizer.alive

    def _check_open(self) -> None:
        if self.closed:
            raise InvalidValueError("use of a closed Stream")

    def synchronize(self) -> None:
        """Block the host until all work queued on the stream has finished."""
        self._check_open()
        check(_runtime.get().cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def query(self) -> bool:
        """True when all queued work has finished (cudaStreamQuery), without blocking."""
        self._check_open()
        rt = _runtime.get()
        result = rt.cudaStreamQuery(self.handle)
        if result[0] == rt.cudaError_t.cudaErrorNotReady:
            return False
        check(result, "cudaStreamQuery")
        return True

    def wait_event(self, event: "Event") -> None:
        """Make later work on this stream wait for ``event`` (cudaStreamWaitEvent), no host sync."""
        self._check_open()
        check(_runtime.get().cudaStreamWaitEvent(self.handle, event._event, 0), "cudaStreamWaitEvent")

    def wait_stream(self, other) -> None:
        """Make later work on this stream wait for all work queued so far on ``other``."""
        ev = Event(timing=False)
        try:
            ev.record(other)
            self.wait_event(ev)
        finally:
            ev.close()

    def close(self) -> None:
        """Destroy an owned stream (queued work still completes); idempotent."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __int__(self) -> int:
        return self.handle

    def __index__(self) -> int:
        return self.handle

    def __eq__(self, other) -> bool:
        if isinstance(other, Stream):
            return self.handle == other.handle
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.handle)

    def __reduce__(self):
        raise InvalidTypeError("a Stream cannot be pickled")

    def __repr__(self) -> str:
        kind = "owned" if self._owned else "wrapped"
        state = ", closed" if self.closed else ""
        return f"<Stream 0x{self.handle:x} device={self.device} {kind}{state}>"


# Note: default_stream() is a stream we create (non-blocking), one per device,
# not the legacy NULL stream (handle 0). The legacy stream implicitly
# synchronises with every blocking stream of the context, so anything queued
# there serialises with unrelated work of other libraries (PyTorch uses the
# legacy stream by default); it cannot be captured into a CUDA graph
# (cudaStreamBeginCapture on it fails), which our graph replay needs; and the
# meaning of "stream 0" changes with the per-thread-default-stream compile
# option, which we cannot see from Python. A created non-blocking stream has
# none of these problems. The price: work on it is NOT ordered with work that
# other libraries queue on their own streams. Order explicitly (synchronize(),
# Stream.wait_event/wait_stream) at the boundary with torch and friends.
_default_lock = threading.Lock()
_default_streams: dict[int, Stream] = {}


def default_stream(device: int | None = None) -> Stream:
    """The per-device shared Stream that operations use when given ``stream=None``.

    Created on first use and kept for the life of the process (never close it).
    """
    require_device()
    dev = current_device() if device is None else int(device)
    s = _default_streams.get(dev)
    if s is not None:
        return s
    with _default_lock:
        s = _default_streams.get(dev)
        if s is None:
            s = Stream(dev)
            _default_streams[dev] = s
    return s


def stream_handle(stream, device: int | None = None) -> int:
    """The integer ``cudaStream_t`` value of ``stream`` (the one place that reads streams).

    Accepts ``None`` (the device's :func:`default_stream`), a :class:`Stream`,
    an ``int`` handle (0 is the legacy default stream), anything with an
    integer ``cuda_stream`` attribute (``torch.cuda.Stream``), ``ptr``
    attribute (``cupy.cuda.Stream``) or ``handle`` attribute, an object with the ``__cuda_stream__``
    protocol (returns ``(version, handle)``), or a cuda-python
    ``cudaStream_t``/``CUstream``. TypeError for anything else.
    """
    if stream is None:
        return default_stream(device).handle
    if isinstance(stream, Stream):
        if stream.closed:
            raise InvalidValueError("use of a closed Stream")
        return stream.handle
    if isinstance(stream, bool):
        raise InvalidTypeError("stream: a bool is not a CUDA stream")
    if isinstance(stream, int):
        if stream < 0:
            raise InvalidValueError(f"stream: expected a non-negative cudaStream_t value, got {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        if isinstance(value, tuple) and len(value) == 2:
            return int(value[1])
        raise InvalidTypeError(f"stream: __cuda_stream__ of {type(stream).__name__} returned {value!r}, "
                        "expected (version, handle)")
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    if type(stream).__name__ in ("cudaStream_t", "CUstream"):
        return int(stream)
    raise InvalidTypeError(f"stream: expected a mucudnn.cuda.Stream, a torch/CuPy stream, an int "
                    f"cudaStream_t or None, got {type(stream).__name__}")


def is_capturing(stream: int) -> bool:
    """True while ``stream`` (an int handle) is being captured into a CUDA graph."""
    rt = _runtime.get()
    status = check(rt.cudaStreamIsCapturing(int(stream)), "cudaStreamIsCapturing")
    return int(status) != int(rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone)


def as_stream(stream, device: int | None = None) -> Stream:
    """``stream`` as a :class:`Stream` (non-owning wrap for foreign handles)."""
    if stream is None:
        return default_stream(device)
    if isinstance(stream, Stream):
        return stream
    return Stream.wrap(stream_handle(stream), device)


def _destroy_event(event) -> None:
    check(_runtime.get().cudaEventDestroy(event), "cudaEventDestroy")


class Event:
    """A CUDA event; ``timing=False`` creates a cheaper event for ordering only."""

    __slots__ = ("_event", "handle", "timing", "_finalizer", "__weakref__")

    def __init__(self, timing: bool = True):
        require_device()
        rt = _runtime.get()
        flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
        ev = check(rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags")
        self._event = ev
        self.handle = int(ev)
        self.timing = bool(timing)
        self._finalizer = weakref.finalize(self, _lifetime.release, _destroy_event, ev)
        self._finalizer.atexit = False

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if self.closed:
            raise InvalidValueError("use of a closed Event")

    def record(self, stream=None) -> "Event":
        """Record the event on ``stream`` (default: the current device's default stream)."""
        self._check_open()
        check(_runtime.get().cudaEventRecord(self._event, stream_handle(stream)), "cudaEventRecord")
        return self

    def synchronize(self) -> None:
        """Block the host until the work before the recorded event has finished."""
        self._check_open()
        check(_runtime.get().cudaEventSynchronize(self._event), "cudaEventSynchronize")

    def query(self) -> bool:
        """True when the recorded work has finished, without blocking."""
        self._check_open()
        rt = _runtime.get()
        result = rt.cudaEventQuery(self._event)
        if result[0] == rt.cudaError_t.cudaErrorNotReady:
            return False
        check(result, "cudaEventQuery")
        return True

    @staticmethod
    def elapsed_ms(start: "Event", end: "Event") -> float:
        """Milliseconds between two recorded, completed timing events."""
        start._check_open()
        end._check_open()
        if not (start.timing and end.timing):
            raise InvalidValueError("elapsed_ms needs events created with timing=True")
        return float(check(_runtime.get().cudaEventElapsedTime(start._event, end._event),
                           "cudaEventElapsedTime"))

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> "Event":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        raise InvalidTypeError("an Event cannot be pickled")

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ""
        return f"<Event 0x{self.handle:x} timing={self.timing}{state}>"
