"""The Backend protocol: everything the optimizer and the engine call, and the
one place that adapts what a backend lacks.

:class:`Backend` (a :class:`typing.Protocol`) lists every member ``exec/``,
``optimizer/`` and ``api/`` use. :class:`BackendBase` gives every optional
member its default (a host backend: no device, no stream, no graphs,
``bind`` through ``run``); the library's backends derive from it, and
:func:`adapt` wraps any other object that has the required members (name,
name and find, enough to plan with; workspace_size, run and the array helpers
to execute) so
that nothing else ever probes a backend with ``hasattr``.

Addresses
---------
A *launcher* (what :meth:`Backend.bind` returns) takes the whole-batch
tensors' *addresses* in the backend's kind: device pointers (ints) on a GPU
backend, NumPy arrays on a host backend; :meth:`Backend.address` turns an
array of the backend's kind into one. A launcher knows its micro-batch's
rows and offsets the addresses itself, so one launcher serves any buffers of
the right shape, dtype and alignment: a warm call passes pointers, it does not
rebind.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager, NoReturn, Protocol, Union, runtime_checkable

from ..problem import AlgoPerf, ConvProblem, Direction
from . import fold as _fold
from . import pair as _pair
from . import split as _split
from ..errors import InvalidTypeError, MissingAttributeError, UnsupportedOperationError

__all__ = ["Backend", "BackendBase", "ConvTensors", "Launcher", "OUTPUT_OF", "adapt",
           "REQUIRED"]

Algo = Union[int, str]


@dataclass(frozen=True)
class ConvTensors:
    """The three tensors of one convolution call, in forward naming.

    ``x`` is the input (dx for backward-data), ``w`` the filter (dw for
    backward-filter), ``y`` the output (dy for the backward passes). Which one
    is written depends on the direction: forward writes y, backward-data writes
    x, backward-filter writes w. Arrays are of the backend's own kind (NumPy
    arrays for "numpy", DeviceArrays for the GPU backends), packed in the
    problem's layout with the problem's shapes.
    """

    problem: ConvProblem
    x: Any
    w: Any
    y: Any


#: Which tensor each direction writes.
OUTPUT_OF = {Direction.FORWARD: "y", Direction.BACKWARD_DATA: "x",
             Direction.BACKWARD_FILTER: "w"}


class Launcher(Protocol):
    """One bound micro-batch call: ``launcher(x, w, y, workspace, workspace_bytes)``.

    ``x``, ``w``, ``y`` are the whole-batch addresses (see the module doc),
    ``workspace`` the workspace's address (0/None for none) and
    ``workspace_bytes`` its size. ``workspace_bytes`` (attribute) is what the
    call needs, ``algo`` what it runs.
    """

    workspace_bytes: int
    algo: Algo

    def __call__(self, x: Any, w: Any, y: Any, workspace: Any, workspace_bytes: int) -> None:
        ...


# Note [candidate sets in keys]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A benchmark-cache entry (and a memoised plan) stands for "every configuration
# this backend's find() reports for this problem". An option that changes that
# set for some problems must change their key, or a backend with the option
# reads entries measured without it (and a backend without it, plans with
# configurations it was asked not to use). ``cache_name(problem)`` is that
# key's backend name: ``name``, or a variant for the problems the option
# reaches. Folding (Note [folded first layers] in :mod:`.fold`) adds
# ``"+fold"`` for the problems that fold, so caches written before folding
# existed, or with ``fold=False``, are measured again for those problems only:
# the first layers, a few seconds, not the whole network; splitting (Note
# [split groups] in :mod:`.split`) adds ``"+split"`` for depthwise problems
# likewise, and the graph backend's ``parity`` ``"+wgrad-rtc"`` (before
# ``"+split"``) for the 16-bit depthwise problems whose backward-filter it
# compiles (``graph_candidates.parity_cache_name``), and ``"+slice"`` after
# ``"+split"`` for those whose chunks find() also times as slices (Note
# [which slices are searched] in :mod:`.split`). The knob search
# changes every problem's set and so changes ``name`` itself
# (``"cudnn-graph+knobs"``, Note [knob search]); every other search option of
# the graph backend enters through ``FindOptions.key()`` (Note [search parity]
# in :mod:`.find_options`). A cache read offline
# (:class:`~mucudnn.optimizer.offline.CachedBackend`) prefers a variant's
# entries where it holds them (``optimizer.cache.VARIANT_SUFFIXES``). Raw
# string problem keys (the cache's own tools) use ``name`` as it is.


@runtime_checkable
class Backend(Protocol):
    """What the optimizer and the engine need of a convolution library.

    Arrays are of the backend's own kind; ``workspace`` is a 1-D uint8 array of
    that kind (or None for zero bytes) whose slices are views, so WD plans can
    hand each kernel a segment of one allocation.
    """

    name: str
    device_name: str
    version: str
    #: True when arrays are host (NumPy) arrays and calls finish before returning.
    is_host: bool
    #: The CUDA device ordinal, None on a host backend.
    device: int | None
    #: The backend's own stream (a mucudnn.cuda.Stream; None on a host backend):
    #: what find() times on and what graphs are captured on.
    stream: Any
    #: Whether plans can be captured as CUDA graphs on ``stream``.
    supports_graphs: bool
    #: Whether find() leaves out the configurations that need no workspace
    #: unless its ``workspace_limit`` is 0, so that benchmark() asks for them
    #: once per kernel (Note [one zero-workspace find per kernel] in
    #: :mod:`mucudnn.optimizer.benchmark`).
    finds_zero_once: bool

    def find(self, problem: ConvProblem, direction: Direction,
             workspace_limit: int | None) -> list[AlgoPerf]:
        """Every algorithm that ran for ``problem`` (at its own batch) within
        ``workspace_limit``, fastest first."""
        ...

    def cache_name(self, problem: ConvProblem) -> str:
        """The name ``problem``'s measurements and plans are kept under in the
        benchmark cache and the plan memo: ``name``, or a variant of it where
        an option of this backend changes which configurations find() reports
        for ``problem`` (Note [candidate sets in keys])."""
        ...

    def workspace_size(self, problem: ConvProblem, direction: Direction, algo: Algo,
                       math_type: Algo = 0) -> int:
        """Bytes of workspace ``algo`` needs for ``problem``."""
        ...

    def blocked_workspace(self, problem: ConvProblem, direction: Direction,
                          workspace_limit: int) -> int | None:
        """The least workspace over ``workspace_limit`` among the configurations
        that the library's heuristics rank ahead of every one that fits it, for
        ``problem`` at its own batch; None when there is none or the backend
        cannot tell. Cheap (no timing): size pruning descends to smaller
        micro-batches while such a configuration would fit one (Note [size
        pruning] in :mod:`mucudnn.optimizer.benchmark`)."""
        ...

    def run(self, direction: Direction, algo: Algo, math_type: Algo, tensors: ConvTensors,
            alpha: float, beta: float, workspace: Any) -> None:
        """One call: output = alpha * conv(...) + beta * output, in place."""
        ...

    def bind(self, direction: Direction, algo: Algo, math_type: Algo, problem: ConvProblem,
             offset: int, size: int, alpha: float, beta: float,
             aligns: tuple[int, int, int]) -> Launcher:
        """A launcher for rows ``[offset, offset + size)`` of ``problem``, valid for
        base addresses aligned to at least ``aligns`` bytes (x, w, y).

        Raises :class:`~mucudnn.errors.UnsupportedConfigError` when ``algo``
        cannot run this way (it never substitutes another configuration)."""
        ...

    def address(self, array: Any) -> Any:
        """The address a launcher takes for an array of the backend's kind."""
        ...

    def activate(self, stream: int | None) -> None:
        """Issue later launches on the CUDA stream ``stream`` (an int handle;
        None: the backend's home stream)."""
        ...

    def on_home_stream(self) -> ContextManager[None]:
        """A context in which the backend is held (its lock) and launches go to
        its home stream (Find's timing, CUDA-graph capture)."""
        ...

    def mem_get_info(self) -> tuple[int, int] | None:
        """(free, total) device bytes, or None where unknown (host)."""
        ...

    def release_find_buffers(self) -> None:
        """Free scratch that find() keeps between calls."""
        ...

    # -- arrays of the backend's kind -------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        """An uninitialised packed array of the backend's kind."""
        ...

    def from_host(self, array: Any) -> Any:
        """A copy of a NumPy array as an array of the backend's kind."""
        ...

    def to_host(self, array: Any) -> Any:
        """A NumPy copy of an array of the backend's kind (waits for pending work)."""
        ...

    def alloc_workspace(self, nbytes: int) -> Any:
        """A 1-D uint8 array of ``nbytes`` of the backend's kind; slices are views."""
        ...

    def synchronize(self) -> None:
        """Wait until every call issued so far has finished."""
        ...


class BackendBase:
    """Defaults for every optional member of :class:`Backend` (a host backend).

    Subclasses set ``name``, ``device_name``, ``version`` and implement
    ``find`` (enough to plan with), and ``workspace_size``, ``run`` and the
    array helpers to execute; GPU backends override the rest.
    """

    name: str = "?"
    device_name: str = ""
    version: str = ""
    is_host: bool = True
    device: int | None = None
    stream: Any = None
    supports_graphs: bool = False
    finds_zero_once: bool = False
    #: Whether find() also reports the configurations of problems folded by
    #: space-to-depth (Note [folded first layers] in :mod:`.fold`); it names
    #: their keys (:meth:`cache_name`).
    fold: bool = False
    #: Whether find() also reports the configurations of depthwise problems split
    #: into chunks of their groups (Note [split groups] in :mod:`.split`); it
    #: names their keys (:meth:`cache_name`).
    split: bool = False
    #: Whether find() also reports the backward-filter of grouped problems in
    #: pairs of half micro-batches (Note [micro-batches in pairs] in
    #: :mod:`.pair`); it names their keys (:meth:`cache_name`).
    pair: bool = False

    def cache_name(self, problem: ConvProblem) -> str:
        """``name``, with ``"+fold"`` for problems that fold while ``fold`` is on,
        ``"+split"`` for problems that split while ``split`` is on and
        ``"+pair"`` for problems paired while ``pair`` is on (Note [candidate
        sets in keys])."""
        name = _fold.cache_name(self.name, problem) if self.fold else self.name
        return self._group_suffixes(name, problem)

    def _group_suffixes(self, name: str, problem: ConvProblem) -> str:
        """``name`` with ``"+split"`` where ``split`` is on and ``problem``
        splits, then ``"+pair"`` where ``pair`` is on and it pairs: the
        suffixes every backend's :meth:`cache_name` ends with, in one order
        (Note [candidate sets in keys])."""
        name = _split.cache_name(name, problem) if self.split else name
        return _pair.cache_name(name, problem) if self.pair else name

    def bind(self, direction: Direction, algo: Algo, math_type: Algo, problem: ConvProblem,
             offset: int, size: int, alpha: float, beta: float,
             aligns: tuple[int, int, int] = (16, 16, 16)) -> Launcher:
        """A launcher through :meth:`run` (host addresses are the arrays themselves)."""
        return _run_launcher(self, Direction.parse(direction), algo, math_type, problem,
                             offset, size, float(alpha), float(beta))

    def address(self, array: Any) -> Any:
        return array

    def activate(self, stream: int | None) -> None:
        return None

    def on_home_stream(self) -> ContextManager[None]:
        return contextlib.nullcontext()

    def mem_get_info(self) -> tuple[int, int] | None:
        return None

    def release_find_buffers(self) -> None:
        return None

    def run(self, direction: Direction, algo: Algo, math_type: Algo, tensors: ConvTensors,
            alpha: float, beta: float, workspace: Any) -> None:
        self._cannot("run convolutions")

    def workspace_size(self, problem: ConvProblem, direction: Direction, algo: Algo,
                       math_type: Algo = 0) -> int:
        raise UnsupportedOperationError(f"backend {self.name!r} does not know workspace sizes")

    def blocked_workspace(self, problem: ConvProblem, direction: Direction,
                          workspace_limit: int) -> int | None:
        return None  # no heuristics to ask

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        self._cannot("allocate arrays")

    def from_host(self, array: Any) -> Any:
        self._cannot("copy arrays")

    def to_host(self, array: Any) -> Any:
        self._cannot("copy arrays")

    def alloc_workspace(self, nbytes: int) -> Any:
        self._cannot("allocate workspace")

    def synchronize(self) -> None:
        return None

    def _cannot(self, what: str) -> NoReturn:
        raise UnsupportedOperationError(f"backend {self.name!r} cannot {what}; it only plans")


def _run_launcher(backend: Any, direction: Direction, algo: Algo, math_type: Algo,
                  problem: ConvProblem, offset: int, size: int, alpha: float,
                  beta: float) -> Launcher:
    """A host launcher: slices the micro-batch rows of x and y and calls ``run``."""
    sub = problem.with_batch(size)
    whole = offset == 0 and size == problem.batch
    stop = offset + size
    need = int(backend.workspace_size(sub, direction, algo, math_type))
    run = backend.run

    def launch(x: Any, w: Any, y: Any, workspace: Any, workspace_bytes: int) -> None:
        if not whole:
            x, y = x[offset:stop], y[offset:stop]
        ws = workspace if need > 0 else None
        run(direction, algo, math_type, ConvTensors(sub, x, w, y), alpha, beta, ws)

    launch.workspace_bytes = need  # type: ignore[attr-defined]
    launch.algo = algo  # type: ignore[attr-defined]
    return launch  # type: ignore[return-value]


#: What an object must have to be adapted into a Backend (enough to plan with).
REQUIRED = ("name", "find")
#: Members an adapted object may bring; the rest take BackendBase's defaults.
_OPTIONAL_ATTRS = ("device_name", "version", "is_host", "device", "stream", "supports_graphs",
                   "finds_zero_once")
_OPTIONAL_METHODS = ("cache_name", "workspace_size", "blocked_workspace", "run", "bind",
                     "address", "activate", "on_home_stream", "mem_get_info", "release_find_buffers", "empty",
                     "from_host", "to_host", "alloc_workspace", "synchronize")


class _Adapted(BackendBase):
    """A BackendBase around another object: its own members win, missing ones
    take :class:`BackendBase`'s defaults."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name = str(inner.name)
        for attr in _OPTIONAL_ATTRS:
            if hasattr(inner, attr):
                setattr(self, attr, getattr(inner, attr))
        self.device_name = str(self.device_name)
        self.version = str(self.version)
        if getattr(inner, "stream", None) is not None and not hasattr(inner, "is_host"):
            self.is_host = False
        for m in _OPTIONAL_METHODS:
            fn = getattr(inner, m, None)
            if callable(fn):
                setattr(self, m, fn)

    def find(self, problem: ConvProblem, direction: Direction,
             workspace_limit: int | None) -> list[AlgoPerf]:
        return self._inner.find(problem, direction, workspace_limit)

    def __getattr__(self, attr: str) -> Any:  # anything else: the wrapped object's
        if attr == "_inner":
            raise MissingAttributeError(attr)
        return getattr(self._inner, attr)

    def __repr__(self) -> str:
        return f"adapt({self._inner!r})"


def adapt(obj: Any) -> Any:
    """``obj`` as a complete Backend: a :class:`BackendBase` is returned as it is;
    any other object with :data:`REQUIRED` is wrapped (its own members win,
    missing ones take :class:`BackendBase`'s defaults). TypeError otherwise.

    The wrapper is remembered on the object, so adapting twice gives the same
    Backend (and so the same workspace pool).
    """
    if isinstance(obj, BackendBase):
        return obj
    missing = [a for a in REQUIRED if not hasattr(obj, a)]
    if missing:
        raise InvalidTypeError(f"backend: {type(obj).__name__} is not a Backend (it lacks "
                        f"{', '.join(missing)})")
    cached = getattr(obj, "_mucudnn_adapted", None)
    if isinstance(cached, _Adapted) and cached._inner is obj:
        return cached
    wrapped = _Adapted(obj)
    try:
        obj._mucudnn_adapted = wrapped
    except AttributeError:  # __slots__: adapt again next time
        pass
    return wrapped


