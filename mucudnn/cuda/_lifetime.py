"""Release of CUDA resources, aware of stream capture in the calling thread.

While a thread captures a stream into a CUDA graph (ThreadLocal mode), it must
not make "potentially unsafe" calls such as cudaFree, cudaStreamDestroy or
cudaEventDestroy: the call fails and invalidates the capture. A DeviceArray's
finalizer can run at any moment (garbage collection), also inside a capture, so
every release goes through :func:`release`, which defers it to the end of the
capture when the calling thread is capturing.
"""

from __future__ import annotations

import threading

_tls = threading.local()


def capturing() -> bool:
    """True while the calling thread is inside CudaGraph.capture()."""
    return getattr(_tls, "depth", 0) > 0


def begin_capture() -> None:
    _tls.depth = getattr(_tls, "depth", 0) + 1
    if not hasattr(_tls, "pending"):
        _tls.pending = []


def end_capture() -> None:
    _tls.depth = max(0, getattr(_tls, "depth", 0) - 1)
    if _tls.depth == 0:
        pending, _tls.pending = getattr(_tls, "pending", []), []
        for fn, args in pending:
            _call_quietly(fn, args)


def release(fn, *args) -> None:
    """Call ``fn(*args)`` now, or at the end of this thread's capture."""
    if capturing():
        _tls.pending.append((fn, args))
    else:
        _call_quietly(fn, args)


def _call_quietly(fn, args) -> None:
    # Releases run from finalizers and close(); a failure there (for example a
    # context already torn down at interpreter exit) must not raise.
    try:
        fn(*args)
    except Exception:
        pass
