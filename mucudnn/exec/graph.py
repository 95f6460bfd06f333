"""CUDA-graph replay of a plan's micro-batch sequence.

With ``graph=True`` a kernel's whole micro-batch sequence is captured once on
the backend's stream as a CUDA graph and replayed on later calls, so N
micro-batches cost one graph launch instead of N library calls. A captured
graph bakes in every pointer and scalar, so the key is (plan, tensor pointers,
workspace pointer, alpha, beta, stream): a call with new pointers (e.g. a
framework handing over freshly allocated tensors) captures again. The cache
keeps the most recent :data:`MAX_GRAPHS` graphs per kernel and closes the rest.

Backends without a stream (NumPy) have nothing to capture: there ``graph=True``
is a documented no-op (the plan runs as usual), so code written with
``graph=True`` also runs on machines without a GPU. :func:`supports_graphs`
says which is the case.
"""

from __future__ import annotations

import ctypes
import logging
from collections import OrderedDict
from typing import Any, Callable

from ..backends.base import Backend, ConvTensors

__all__ = ["GraphCache", "LaunchCache", "launch_key", "supports_graphs", "pointer_of", "MAX_GRAPHS"]

log = logging.getLogger("mucudnn")

MAX_GRAPHS = 8


def supports_graphs(backend: Backend) -> bool:
    """True when ``backend`` runs on a CUDA stream that graphs can capture."""
    flag = getattr(backend, "supports_graphs", None)
    if flag is not None:
        return bool(flag() if callable(flag) else flag)
    return getattr(backend, "stream", None) is not None


def pointer_of(array: Any) -> int:
    """The device address of an array of a GPU backend's kind (0 for None)."""
    if array is None:
        return 0
    ptr = getattr(array, "ptr", None)
    if ptr is None and hasattr(array, "__array_interface__"):  # host arrays (fakes in tests)
        ptr = array.__array_interface__["data"][0]
    if ptr is None:
        cai = getattr(array, "__cuda_array_interface__", None)
        if cai is None:
            raise TypeError(f"not a device array: {type(array).__name__}")
        ptr = cai["data"][0]
    return int(ptr)


def launch_key(backend: Backend, plan: Any, tensors: ConvTensors, workspace: Any,
               alpha: float, beta: float) -> tuple:
    """Everything a captured graph or a bound launcher bakes in: the plan,
    every pointer, the workspace, the scalars and the stream."""
    stream = getattr(backend, "stream", None)
    return (id(plan), pointer_of(tensors.x), pointer_of(tensors.w), pointer_of(tensors.y),
            pointer_of(workspace), getattr(workspace, "nbytes", 0) if workspace is not None else 0,
            float(alpha), float(beta), getattr(stream, "handle", id(stream)))


class _PlanLru:
    """An LRU map from :func:`launch_key` keys to ``(value, plan)``.

    Holding the plan keeps it alive, so ``id(plan)`` in a key cannot be reused
    by another plan while the entry exists. ``on_evict(value)`` runs for each
    value dropped (over ``max_entries``, or by :meth:`clear`).
    """

    def __init__(self, max_entries: int, on_evict: Callable[[Any], None] | None = None) -> None:
        self.max_entries = max_entries
        self._on_evict = on_evict
        self._entries: "OrderedDict[tuple, tuple[Any, Any]]" = OrderedDict()

    def get(self, key: tuple) -> Any:
        """The value for ``key`` (now the most recent), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: tuple, value: Any, plan: Any) -> None:
        self._entries[key] = (value, plan)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            _, (old, _) = self._entries.popitem(last=False)
            self._evict(old)

    def clear(self) -> None:
        while self._entries:
            _, (old, _) = self._entries.popitem()
            self._evict(old)

    def _evict(self, value: Any) -> None:
        if self._on_evict is not None:
            self._on_evict(value)

    def __len__(self) -> int:
        return len(self._entries)


class LaunchCache:
    """Bound launchers of one kernel (see :func:`~mucudnn.exec.runner.prepare`),
    keyed like graphs, for backends that can ``bind`` a call ahead of time.

    Note: a launcher holds pointers, not arrays. The key holds every pointer,
    so a launcher only ever runs on the memory it was bound to; a freed and
    re-allocated buffer at the same address is the same memory to cuDNN.
    """

    def __init__(self, backend: Backend, max_entries: int = MAX_GRAPHS) -> None:
        self.backend = backend
        self._launchers = _PlanLru(max_entries)

    @property
    def max_entries(self) -> int:
        return self._launchers.max_entries

    def run(self, plan: Any, tensors: ConvTensors, workspace: Any, alpha: float, beta: float,
            make: Callable[[], Callable[[], None]]) -> None:
        key = launch_key(self.backend, plan, tensors, workspace, alpha, beta)
        launcher = self._launchers.get(key)
        if launcher is not None and not getattr(launcher, "alive", lambda: True)():
            # Note: a descriptor a launcher holds was evicted and closed by the
            # backend's cache. Checked before anything runs: a plan stopped
            # half-way and run again would apply beta twice.
            launcher = None
        if launcher is None:
            launcher = make()
            self._launchers.put(key, launcher, plan)
        try:
            launcher()
        except (ValueError, ctypes.ArgumentError):
            # Safety net for launchers without alive(): a closed descriptor's
            # _as_parameter_ raises ValueError (wrapped by ctypes in
            # ArgumentError) before that call is issued. Rebind once.
            launcher = make()
            self._launchers.put(key, launcher, plan)
            launcher()

    def clear(self) -> None:
        self._launchers.clear()

    def __len__(self) -> int:
        return len(self._launchers)


class GraphCache:
    """Captured graphs of one kernel, keyed by everything a graph bakes in."""

    def __init__(self, backend: Backend, max_graphs: int = MAX_GRAPHS) -> None:
        self.backend = backend
        self._graphs = _PlanLru(max_graphs, on_evict=_close)
        #: Counters for tests and the benchmark: captures and replays.
        self.captures = 0
        self.replays = 0

    @property
    def max_graphs(self) -> int:
        return self._graphs.max_entries

    def key(self, plan: Any, tensors: ConvTensors, workspace: Any, alpha: float,
            beta: float) -> tuple:
        return launch_key(self.backend, plan, tensors, workspace, alpha, beta)

    def run(self, plan: Any, tensors: ConvTensors, workspace: Any, alpha: float, beta: float,
            body: Callable[[], None]) -> bool:
        """Replay the graph for this key, capturing ``body`` first when there is
        none. Returns True when a graph was captured by this call."""
        from ..cuda import CudaGraph  # type: ignore[attr-defined]

        stream = self.backend.stream  # type: ignore[attr-defined]
        key = self.key(plan, tensors, workspace, alpha, beta)
        g = self._graphs.get(key)
        captured = g is None
        if g is None:
            with CudaGraph.capture(stream) as g:
                body()
            self._graphs.put(key, g, plan)
            self.captures += 1
            log.debug("mucudnn: captured a CUDA graph of %d micro-batches",
                      len(getattr(plan, "micro_batches", ())))
        g.launch(stream)
        self.replays += 1
        return captured

    def clear(self) -> None:
        """Close every captured graph."""
        self._graphs.clear()

    def __len__(self) -> int:
        return len(self._graphs)

    def __del__(self) -> None:  # best effort
        try:
            self.clear()
        except Exception:
            pass


def _close(g: Any) -> None:
    close = getattr(g, "close", None)
    if close is not None:
        try:
            close()
        except Exception as exc:  # pragma: no cover - best effort
            log.debug("mucudnn: closing a CUDA graph failed: %s", exc)
