"""CUDA-graph replay of a plan's micro-batch sequence.

With ``graph=True`` a kernel's whole micro-batch sequence is captured once as
a CUDA graph and replayed on later calls, so N micro-batches cost one graph
launch instead of N library calls. A captured graph bakes in every pointer and
scalar, so the key is (bound plan, tensor pointers, workspace pointer and
size): a call with new pointers (e.g. a framework handing over freshly
allocated tensors) captures again. The cache keeps the most recent
:data:`MAX_GRAPHS` graphs per kernel and closes the rest.

Graphs are captured on the backend's home stream (a created, non-blocking
stream, which capture needs) and launched on the call's stream, which may be
the legacy default stream.

Backends without a stream (NumPy) have nothing to capture: there ``graph=True``
is a documented no-op (the plan runs as usual), so code written with
``graph=True`` also runs on machines without a GPU. :func:`supports_graphs`
says which is the case.
"""

from __future__ import annotations

import logging
from typing import Any

from ..backends.base import Backend
from ..caches import LRU
from ..cuda import CudaGraph
from .runner import BoundPlan

__all__ = ["GraphCache", "supports_graphs", "MAX_GRAPHS"]

log = logging.getLogger("mucudnn")

MAX_GRAPHS = 8


def supports_graphs(backend: Backend) -> bool:
    """True when ``backend`` runs on a CUDA stream that graphs can capture."""
    return bool(backend.supports_graphs)


def _close(_key: Any, g: CudaGraph) -> None:
    g.close()


def _key_part(address: Any) -> Any:
    """A hashable stand-in for a launcher address: the pointer itself, or a host
    array's data pointer (host backends with graphs exist only in tests)."""
    if address is None or type(address) is int:
        return address
    return (address.__array_interface__["data"][0], address.shape)


class GraphCache:
    """Captured graphs of one kernel, keyed by everything a graph bakes in."""

    def __init__(self, backend: Backend, max_graphs: int = MAX_GRAPHS) -> None:
        self.backend = backend
        self._graphs: LRU[tuple, CudaGraph] = LRU("exec.graphs", max_graphs, on_evict=_close)
        #: Counters for tests and the benchmark: captures and replays.
        self.captures = 0
        self.replays = 0

    @property
    def max_graphs(self) -> int:
        return self._graphs.maxsize

    def run(self, bound: BoundPlan, x: Any, w: Any, y: Any, workspace: Any,
            workspace_bytes: int, stream: int) -> bool:
        """Replay the graph of ``bound`` at these addresses on ``stream``,
        capturing it first when there is none. Returns True when this call
        captured. The backend must be active on ``stream``."""
        key = (id(bound), _key_part(x), _key_part(w), _key_part(y), _key_part(workspace),
               workspace_bytes)
        g = self._graphs.get(key)
        captured = g is None
        if g is None:
            be = self.backend
            with be.on_home_stream():  # type: ignore[attr-defined]
                with CudaGraph.capture(be.stream) as g:
                    bound.launch(x, w, y, workspace, workspace_bytes)
            g.keep(bound)  # id(bound) in the key stays unique while the graph lives
            self._graphs.put(key, g)
            self.captures += 1
            log.debug("mucudnn: captured a CUDA graph of %d micro-batches",
                      len(bound.launchers))
        g.launch(stream)
        self.replays += 1
        return captured

    def clear(self) -> None:
        """Close every captured graph."""
        self._graphs.clear()

    def __len__(self) -> int:
        return len(self._graphs)
