"""CUDA graphs: capture work queued on a stream once, replay it with one launch."""

from __future__ import annotations

import contextlib
import time
import weakref

from . import _lifetime, _runtime
from .device import require_device
from ._runtime import check
from .stream import as_stream
from ..errors import InvalidTypeError, InvalidValueError

__all__ = ["CudaGraph"]


def _destroy(graph, graph_exec) -> None:
    rt = _runtime.get()
    try:
        if graph_exec is not None:
            check(rt.cudaGraphExecDestroy(graph_exec), "cudaGraphExecDestroy")
    finally:
        if graph is not None:
            check(rt.cudaGraphDestroy(graph), "cudaGraphDestroy")


class CudaGraph:
    """An instantiated CUDA graph made by stream capture.

    >>> with CudaGraph.capture(stream) as g:       # doctest: +SKIP
    ...     y.fill_zero(stream=stream); y.copy_from(x, stream=stream)
    >>> g.launch(stream)                            # doctest: +SKIP

    Inside the ``with`` block nothing runs: work queued on ``stream`` is
    recorded. Pointers are baked in, so every buffer the graph touches must
    outlive it: hand them to :meth:`keep` (or keep them alive yourself).
    ``close()`` (or the context manager, or the finalizer) frees the graph and
    its executable instance.
    """

    __slots__ = ("_graph", "_exec", "_finalizer", "_keep", "stream", "instantiate_s",
                 "__weakref__")

    def __init__(self):
        self._graph = None
        self._exec = None
        self._finalizer = None
        self._keep: list = []
        self.stream = None
        #: host seconds ``cudaGraphInstantiate`` took (0.0 until the capture ends)
        self.instantiate_s = 0.0

    @classmethod
    @contextlib.contextmanager
    def capture(cls, stream=None):
        """Capture the work the calling thread queues on ``stream`` (default: the
        default stream) into a new CudaGraph, instantiated when the block ends.

        If the block raises, the capture is ended and discarded and the
        exception propagates.
        """
        # Note: cudaStreamCaptureModeThreadLocal, not Global. During a capture
        # "potentially unsafe" calls (cudaMalloc, cudaFree, synchronising calls)
        # are prohibited; in Global mode they are prohibited in EVERY thread of
        # the process, so an unrelated thread (another layer's engine, PyTorch's
        # caching allocator, a data-loader thread pinning memory) would fail, or
        # invalidate our capture, just because we are capturing. ThreadLocal
        # restricts only the capturing thread, which is the one whose calls we
        # control. Relaxed would allow unsafe calls even here and silently leave
        # them out of the graph. Our own frees/destroys issued by this thread
        # during the capture (finalizers, close()) are deferred to its end.
        require_device()
        rt = _runtime.get()
        s = as_stream(stream)
        if s.handle in (0, 1, 2):
            raise InvalidValueError("cannot capture the legacy or per-thread default stream (handle "
                             f"{s.handle}); use a created Stream such as default_stream()")
        graph = cls()
        graph.stream = s
        check(rt.cudaStreamBeginCapture(s.handle, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal),
              "cudaStreamBeginCapture")
        _lifetime.begin_capture()
        ok = False
        try:
            yield graph
            ok = True
        finally:
            try:
                result = rt.cudaStreamEndCapture(s.handle)
            finally:
                _lifetime.end_capture()
            if not ok:
                if int(result[0]) == 0 and result[1] is not None:
                    _lifetime.release(_destroy, result[1], None)
            else:
                raw = check(result, "cudaStreamEndCapture",
                            "the capture was invalidated if this is cudaErrorStreamCaptureInvalidated")
                try:
                    start = time.perf_counter()
                    graph_exec = check(rt.cudaGraphInstantiate(raw, 0), "cudaGraphInstantiate")
                    graph.instantiate_s = time.perf_counter() - start
                except BaseException:
                    _lifetime.release(_destroy, raw, None)
                    raise
                graph._graph = raw
                graph._exec = graph_exec
                graph._finalizer = weakref.finalize(graph, _lifetime.release, _destroy, raw, graph_exec)
                graph._finalizer.atexit = False

    def keep(self, *objects) -> "CudaGraph":
        """Keep ``objects`` (buffers the graph reads or writes) alive as long as the graph."""
        self._keep.extend(objects)
        return self

    @property
    def closed(self) -> bool:
        return self._finalizer is None or not self._finalizer.alive

    def launch(self, stream=None) -> None:
        """Queue one replay of the graph on ``stream`` (default: the stream it was
        captured on; an int is taken as a raw ``cudaStream_t``, the fast path)."""
        if self._finalizer is None or not self._finalizer.alive:
            raise InvalidValueError("the CudaGraph is closed (or its capture has not finished)")
        if type(stream) is int:
            h = stream
        elif stream is None:
            assert self.stream is not None  # set by capture()
            h = self.stream.handle
        else:
            h = as_stream(stream).handle
        check(_runtime.get().cudaGraphLaunch(self._exec, h), "cudaGraphLaunch")

    def close(self) -> None:
        """Free the executable graph and the graph; idempotent."""
        if self._finalizer is not None:
            self._finalizer()
        self._keep = []

    def __enter__(self) -> "CudaGraph":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        raise InvalidTypeError("a CudaGraph cannot be pickled")

    def __repr__(self) -> str:
        state = "closed" if self.closed else "ready"
        return f"<CudaGraph {state}>"
