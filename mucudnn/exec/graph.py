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

Note [replay after repeated addresses]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A plan's launch costs the host what cuDNN spends issuing its kernels, and
some engines issue many: those of a grouped convolution that fit a small
workspace loop over the groups, a few kernels each, and a plan of several
micro-batches repeats its calls. In an eager step bound by its host that
time is the step's (docs/BENCHMARKS.md, RegNet-Y's step profile). A graph
replays the whole sequence in one launch, but a capture costs more than the
launch it replaces, and an eager caller's addresses (a framework's fresh
outputs and transient workspace) need not repeat. So with ``after`` > 1 a
cache captures an address set only the ``after``-th time it is seen (earlier
calls launch directly), which the steady steps of a training loop reach
where its allocator hands out the same blocks step after step (a caching
allocator tends to), and a caller whose addresses never repeat does not: it
pays one dictionary update a call (the counts are bounded: Note [more
address sets than graphs]). A caller that
replays without having asked for graphs (``MUCUDNN_TORCH_REPLAY``) makes the
cache with ``fall_back``: where a capture fails (an engine that cannot be
captured), that call and every later one launch directly, with one warning,
so that replay never fails a call that runs without it.

Note [more address sets than graphs]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Layers of one shape share a kernel (``mucudnn.torch`` keeps one convolution
per signature), so in a training step a kernel sees one address set per layer
that shares it: a ResNeXt's many identical blocks of a stage give one each.
Where they outnumber the graphs kept, the LRU evicts each graph before its
address set comes round again, and every such call would capture anew (a
capture costs more than the launches it replaces). So a cache that captures
repeated addresses (``after`` > 1) marks each address set it captures among
its sightings, and when a marked set comes back without its graph (evicted:
the graph was worth keeping) while the graphs kept fill the bound, doubles
the bound, up to :data:`MAX_GROWN_GRAPHS`. The sightings are counted for
:data:`SEEN_PER_GRAPH` times that many address sets from the start (an
address set forgotten before it comes round again would never be
captured). Graphs are made only of address sets that repeat, so a grown
bound holds no more graphs than the layers that share the kernel.

Note [what replay costs the host]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Replay is worth its captures where the launches it saves cost the host more
than the captures do, and that depends on how often a caller's addresses
repeat, which only a running loop shows. So a cache keeps, beside its counts,
the host seconds of each kind of call: a capture (the capture and the graph's
instantiation, not the launch that follows it; the instantiation also on its
own), a graph launch and a direct launch. :func:`mucudnn.torch.report` and
the benchmarks read them, so that a step that keeps capturing (new addresses
every few steps) shows what that costs against the direct launches it would
otherwise make.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

from ..backends.base import Backend
from ..caches import LRU
from ..cuda import CudaGraph
from ..errors import InvalidValueError, MucudnnError
from .runner import BoundPlan

__all__ = ["GraphCache", "supports_graphs", "MAX_GRAPHS", "SEEN_PER_GRAPH", "MAX_GROWN_GRAPHS"]

log = logging.getLogger("mucudnn")

MAX_GRAPHS = 8
#: Address sets counted per graph kept (Note [replay after repeated addresses]).
SEEN_PER_GRAPH = 4
#: The most graphs a cache that captures repeated addresses grows to (Note
#: [more address sets than graphs]).
MAX_GROWN_GRAPHS = 128
#: A sighting count meaning: this address set was captured (Note [more address
#: sets than graphs]).
_CAPTURED = -1


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
    """Captured graphs of one kernel, keyed by everything a graph bakes in;
    an address set is captured the ``after``-th time it is seen (Note [replay
    after repeated addresses])."""

    def __init__(self, backend: Backend, max_graphs: int = MAX_GRAPHS, after: int = 1,
                 fall_back: bool = False) -> None:
        if isinstance(after, bool) or not isinstance(after, int) or after < 1:
            raise InvalidValueError(f"after: expected an int >= 1, got {after!r}")
        self.backend = backend
        self.after = after
        self.fall_back = bool(fall_back)
        #: why a capture failed, where ``fall_back`` then launches directly (None: none did)
        self.failed: "str | None" = None
        self._graphs: LRU[tuple, CudaGraph] = LRU("exec.graphs", max_graphs, on_evict=_close)
        #: times each address set was seen, where ``after`` > 1 (``_CAPTURED``:
        #: it was captured; Note [more address sets than graphs])
        self._seen: "LRU[tuple, int] | None" = LRU(
            "exec.graph_sightings", SEEN_PER_GRAPH * max(max_graphs, MAX_GROWN_GRAPHS)
        ) if after > 1 else None
        #: Counters for tests and the benchmark: captures, replays and direct launches.
        self.captures = 0
        self.replays = 0
        self.direct = 0
        #: Host seconds spent in them (Note [what replay costs the host])
        self.capture_s = 0.0
        self.instantiate_s = 0.0  #: the part of ``capture_s`` that instantiated graphs
        self.replay_s = 0.0
        self.direct_s = 0.0

    @property
    def max_graphs(self) -> int:
        return self._graphs.maxsize

    def run(self, bound: BoundPlan, x: Any, w: Any, y: Any, workspace: Any,
            workspace_bytes: int, stream: int) -> bool:
        """Replay the graph of ``bound`` at these addresses on ``stream``,
        capturing it first when there is none; before the ``after``-th call at
        these addresses, launch ``bound`` directly instead. Returns True when
        this call captured. The backend must be active on ``stream``."""
        if self.failed is not None:  # Note [replay after repeated addresses]
            return self._direct(bound, x, w, y, workspace, workspace_bytes)
        key = (id(bound), _key_part(x), _key_part(w), _key_part(y), _key_part(workspace),
               workspace_bytes)
        g = self._graphs.get(key)
        captured = g is None
        if g is None and self._seen is not None:
            seen = self._seen.get(key, 0)
            if seen == _CAPTURED:  # evicted since: Note [more address sets than graphs]
                self._grow()
            elif seen + 1 < self.after:  # Note [replay after repeated addresses]
                self._seen.put(key, seen + 1)
                return self._direct(bound, x, w, y, workspace, workspace_bytes)
            self._seen.put(key, _CAPTURED)
        if g is None:
            be = self.backend
            start = time.perf_counter()
            try:
                with be.on_home_stream():  # type: ignore[attr-defined]
                    with CudaGraph.capture(be.stream) as g:
                        bound.launch(x, w, y, workspace, workspace_bytes)
            except MucudnnError as exc:
                if not self.fall_back:
                    raise
                self.failed = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"mucudnn: a CUDA-graph capture of the plan "
                              f"{bound.plan.describe()} ({bound.plan.direction}) failed; its "
                              f"kernel launches directly from now on ({self.failed})",
                              RuntimeWarning, stacklevel=2)
                return self._direct(bound, x, w, y, workspace, workspace_bytes)
            g.keep(bound)  # id(bound) in the key stays unique while the graph lives
            self._graphs.put(key, g)
            self.captures += 1
            self.capture_s += time.perf_counter() - start
            self.instantiate_s += g.instantiate_s
            log.debug("mucudnn: captured a CUDA graph of %d micro-batches",
                      len(bound.launchers))
        start = time.perf_counter()
        g.launch(stream)
        self.replay_s += time.perf_counter() - start
        self.replays += 1
        return captured

    def _grow(self) -> None:
        """Where the graphs kept are as many as the bound, double it, up to
        :data:`MAX_GROWN_GRAPHS` (Note [more address sets than graphs])."""
        have = self._graphs.maxsize
        n = min(2 * have, max(MAX_GROWN_GRAPHS, have))
        if len(self._graphs) >= have and n > have:
            log.debug("mucudnn: a kernel's repeated address sets outnumber its %d graphs; "
                      "keeping %d", have, n)
            self._graphs.maxsize = n

    def _direct(self, bound: BoundPlan, x: Any, w: Any, y: Any, workspace: Any,
                workspace_bytes: int) -> bool:
        """Launch ``bound`` without a graph (False: nothing was captured)."""
        start = time.perf_counter()
        bound.launch(x, w, y, workspace, workspace_bytes)
        self.direct_s += time.perf_counter() - start
        self.direct += 1
        return False

    def clear(self) -> None:
        """Close every captured graph and forget the addresses seen."""
        self._graphs.clear()
        if self._seen is not None:
            self._seen.clear()

    def __len__(self) -> int:
        return len(self._graphs)
