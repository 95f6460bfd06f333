"""What both cuDNN backends share: a device, a home stream, a cuDNN handle that
follows the caller's stream, device arrays, and Find's scratch buffers.

:class:`DeviceBackend` is the base of :class:`~mucudnn.backends.cudnn.CudnnBackend`
(legacy API) and :class:`~mucudnn.backends.cudnn_graph.CudnnGraphBackend`
(graph API); neither derives from the other.

Note [streams]
~~~~~~~~~~~~~~
A backend has a *home* stream (``stream``: the device's
:func:`mucudnn.cuda.default_stream` unless given) on which ``find()`` times
and CUDA graphs are captured, and an *active* stream on which launches are
issued. :meth:`DeviceBackend.activate` points the cuDNN handle at the caller's
stream (torch's or CuPy's current stream, a DeviceArray's stream), so a call
is ordered with the caller's other work without events or host waits, as a
native library call is. Workspace is never shared between streams (the engine
keeps one pool per stream, see ``exec/workspace.py``), so switching streams
needs no ordering of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Iterator, Optional

import numpy as np

from .._cudnn.handle import Handle
from .._cudnn.loader import version_string
from .._cudnn.prototypes import lib
from ..cuda import (CudaOutOfMemoryError, DeviceArray, Stream, as_device_array, as_stream,
                    current_device, default_stream, device_count, device_name, mem_get_info,
                    require_device, using_device)
from ..dtypes import normalize_dtype
from ..problem import ConvProblem, Direction
from .base import BackendBase, Launcher
from ..errors import InvalidValueError

__all__ = ["DeviceBackend", "DEFAULT_FIND_WORKSPACE_CAP", "FindProfile", "array_pointer"]

#: Upper bound of the default Find workspace (the other bound is half the free memory).
DEFAULT_FIND_WORKSPACE_CAP = 4 << 30

#: Random values drawn on the host for find()'s scratch; the rest repeats them
#: (Note [find scratch]).
RANDOM_BLOCK = 1 << 20


def array_pointer(name: str, a: Any, shape: tuple, dtype: str) -> int:
    """The device pointer of ``a`` (a DeviceArray or ``__cuda_array_interface__``
    object), after checking its shape, dtype and contiguity."""
    s = getattr(a, "shape", None)
    if s is None or tuple(s) != tuple(shape):
        raise InvalidValueError(f"tensors.{name}: expected shape {tuple(shape)}, got "
                         f"{None if s is None else tuple(s)}")
    if isinstance(a, DeviceArray):
        if a.dtype_name != dtype:
            raise InvalidValueError(f"tensors.{name}: expected dtype {dtype}, got {a.dtype_name}")
        return int(a.ptr)
    try:
        arr = as_device_array(a, sync=False)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"tensors.{name}: {exc}") from None
    if arr.dtype_name != dtype:
        raise InvalidValueError(f"tensors.{name}: expected dtype {dtype}, got {arr.dtype_name}")
    return int(arr.ptr)


@dataclasses.dataclass
class FindProfile:
    """Where a backend's ``find()`` spends its time, accumulated over calls
    (``reset()`` zeroes it). Seconds are host wall time of each phase: building
    operation graphs and asking heuristics, finalizing execution plans, and
    timing them on the GPU (the legacy backend reports its one Find call as
    timing). Counts: candidate configs (after the numerics filter), those
    skipped before finalization (their engine config needs more workspace than
    the cap), those cut by the heuristics' rank (``cut``), plans finalized,
    plans timed, plans timed once only because their first run was already
    far slower than the best (``probed_out``), plans timed by their warm-up run
    only (``cold_out``, Note [cold probe] in cudnn_graph), and configs whose finalized
    workspace differed from their engine config's (``workspace_mismatch``).
    ``knob_configs`` / ``knob_s``: configs the knob-space search added and the
    host seconds spent enumerating them (cudnn-graph's ``search="knobs"``).
    ``first_launch_s``: host seconds spent in each timed plan's first launch
    call (where cuDNN and the driver load or compile the engine's kernels);
    ``gpu_s``: the GPU seconds the timed runs took, by CUDA events;
    ``scratch_s``: making find's scratch inputs, output and workspace (the
    rest of ``timing_s`` is host work and waiting). ``finalize_thread_s``: the
    finalizing threads' seconds, summed over plans (``finalize_s`` is wall
    time); ``finalized_rtc`` / ``finalize_rtc_s``: the plans of engines that
    compile their kernels at run time (behaviour note RUNTIME_COMPILATION) and
    their share of ``finalize_thread_s``; ``rtc_cut``: such configs left out by
    cudnn-graph's ``find_rtc`` (Note [runtime-compiled engines]);
    ``no_accumulate``: backward-filter configs left out because cuDNN refuses
    them with beta = 1 while others remain (Note [beta and workspace]);
    ``retimed``: results timed again by cudnn-graph's ``find_retime`` (Note
    [re-timing the winners]); ``far_cut``: configs not timed because they ran
    far behind at another batch size (cudnn-graph's ``find_skip_ratio``, Note
    [far behind at another size]); ``long_runs``: plans timed by their warm-up
    run only because it was long (Note [long runs]); ``carried``: configs
    added because they led, or heuristics preferred them over the cap, at
    another batch size of the kernel (cudnn-graph's ``find_carry``, Note
    [carried to other sizes]); ``folded``: results of configs run on the
    problem folded by space-to-depth (cudnn-graph's ``fold``; their inner
    find()'s work is counted with the rest, Note [folded first layers]);
    ``split``: results of configs run on chunks of a grouped problem's
    groups (cudnn-graph's ``split``, Note [split groups]), and
    ``split_finds`` the chunk problems found for them; ``pairs``: results of
    configs run in pairs on two streams (cudnn-graph's ``pair``, Note
    [micro-batches in pairs]); ``parity``: finds
    that timed every candidate, as the first find() of a kernel does
    (cudnn-graph's ``parity``, Note [search parity]).

    >>> p = FindProfile(); p.calls += 1; p.as_dict()["calls"]
    1
    """

    calls: int = 0
    folded: int = 0
    split: int = 0
    split_finds: int = 0
    pairs: int = 0
    configs: int = 0
    skipped: int = 0
    finalized: int = 0
    timed: int = 0
    workspace_mismatch: int = 0
    cut: int = 0
    rtc_cut: int = 0
    parity: int = 0
    no_accumulate: int = 0
    retimed: int = 0
    far_cut: int = 0
    carried: int = 0
    probed_out: int = 0
    cold_out: int = 0
    long_runs: int = 0
    knob_configs: int = 0
    heuristics_s: float = 0.0
    knob_s: float = 0.0
    finalize_s: float = 0.0
    timing_s: float = 0.0
    first_launch_s: float = 0.0
    gpu_s: float = 0.0
    scratch_s: float = 0.0
    finalize_thread_s: float = 0.0
    finalized_rtc: int = 0
    finalize_rtc_s: float = 0.0
    total_s: float = 0.0
    #: heuristics seconds per mode ("A", "B", "FALLBACK")
    modes_s: dict[str, float] = dataclasses.field(default_factory=dict)

    def reset(self) -> None:
        fresh = FindProfile()
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(fresh, f.name))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class DeviceBackend(BackendBase):
    """Device, streams, cuDNN handle, arrays and Find scratch of a cuDNN backend.

    ``device``: the CUDA device (default: the current one). ``stream``: the home
    stream (default: the device's :func:`mucudnn.cuda.default_stream`).
    ``find_workspace_limit``: the most workspace ``find()`` gives cuDNN
    (default: min(half the free memory, 4 GiB)).

    Raises :class:`mucudnn.cuda.NoDeviceError` where there is no GPU or driver.
    """

    is_host = False
    supports_graphs = True

    def __init__(self, device: Optional[int] = None, stream: Any = None,
                 find_workspace_limit: Optional[int] = None) -> None:
        if find_workspace_limit is not None and int(find_workspace_limit) < 0:
            raise InvalidValueError(f"find_workspace_limit: expected bytes >= 0, got {find_workspace_limit}")
        self.find_workspace_limit = None if find_workspace_limit is None else int(find_workspace_limit)
        require_device()
        n = device_count()
        self.device = current_device() if device is None else int(device)
        if not 0 <= self.device < n:
            raise InvalidValueError(f"device: expected a CUDA device ordinal in [0, {n}), got {device!r}")
        with using_device(self.device):
            self.stream = default_stream(self.device) if stream is None else as_stream(
                stream, self.device)
            self.handle = Handle(self.device, self.stream)
        self.device_name = device_name(self.device)
        self.version = version_string()
        self._lock = threading.RLock()
        self._active = int(self.stream.handle)
        self._multi_device = n > 1
        self._set_stream = lib.raw("cudnnSetStream")
        #: the second lane's stream of pair calls (Note [micro-batches in pairs]), made at first use
        self._side: Optional[Stream] = None
        self._rng = np.random.default_rng(0x6d75)
        #: find()'s scratch: random inputs per dtype, an output buffer, a workspace.
        self._find_src: dict[str, Any] = {}
        self._find_out: Any = None
        self._find_ws: Any = None
        #: Where find() spent its time (see FindProfile).
        self.find_profile = FindProfile()

    # -- streams (Note [streams]) --------------------------------------------------------
    @property
    def active_stream(self) -> int:
        """The raw ``cudaStream_t`` launches are issued on now."""
        return self._active

    def activate(self, stream: int | None) -> None:
        """Issue later launches on ``stream`` (an int handle; None: the home stream)."""
        h = self.stream.handle if stream is None else stream
        if h == self._active:
            return
        with self._lock:
            st = self._set_stream(self.handle.handle, h)
            if st:
                self.handle.set_stream(h)  # raises the CudnnError with cuDNN's message
            self._active = h

    def side_stream(self) -> Stream:
        """The backend's own stream for the second lane of pair calls (Note
        [micro-batches in pairs] in :mod:`mucudnn.backends.pair`), made at first use."""
        with self._lock:
            if self._side is None:
                self._side = Stream(self.device)
            return self._side

    @contextlib.contextmanager
    def on_home_stream(self) -> Iterator[None]:
        """Hold the backend (its lock) with the handle on the home stream (Find, capture)."""
        with self._lock:
            prev = self._active
            self.activate(None)
            try:
                with using_device(self.device):
                    yield
            finally:
                self.activate(prev)

    # -- arrays ----------------------------------------------------------------------------
    def address(self, array: Any) -> int:
        """The device pointer of a DeviceArray (or ``__cuda_array_interface__`` object)."""
        if isinstance(array, DeviceArray):
            return array.ptr
        return int(as_device_array(array, sync=False).ptr)

    def empty(self, shape: tuple[int, ...], dtype: str) -> DeviceArray:
        """An uninitialised DeviceArray on this backend's device and home stream."""
        with using_device(self.device):
            return DeviceArray(tuple(shape), dtype, stream=self.stream)

    def from_host(self, array: Any) -> DeviceArray:
        """A DeviceArray copy of a NumPy array (queued on the home stream)."""
        with using_device(self.device):
            return DeviceArray.from_numpy(np.asarray(array), stream=self.stream)

    def to_host(self, array: Any) -> np.ndarray:
        """A NumPy copy; waits for everything queued on the home stream."""
        if not isinstance(array, DeviceArray):
            array = as_device_array(array)
        return array.to_numpy(stream=self.stream)

    def alloc_workspace(self, nbytes: int) -> DeviceArray:
        """A 1-D uint8 DeviceArray of ``nbytes`` (slices are views)."""
        with using_device(self.device):
            return DeviceArray((int(nbytes),), "uint8", stream=self.stream)

    def synchronize(self) -> None:
        """Wait for everything queued on the home and the active stream."""
        self.stream.synchronize()
        if self._active != self.stream.handle:
            with using_device(self.device):
                as_stream(self._active, self.device).synchronize()

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of this backend's device."""
        return mem_get_info(self.device)

    # -- Find's scratch ----------------------------------------------------------------------
    def _random(self, shape: tuple, dtype: str) -> DeviceArray:
        """A device array of ``shape`` filled with random non-zero values.

        Note [find scratch]
        ~~~~~~~~~~~~~~~~~~~
        A block of at most ``RANDOM_BLOCK`` random values is drawn on the host
        and repeated over the array by device-to-device copies (doubling).
        Drawing every value on the host cost about 28 ns each, ~3 s for the
        largest ResNet-50 input at batch 128, once per growth of the buffer;
        timing needs values that are not zero or denormal, not values that
        never repeat.
        """
        n = int(np.prod(shape))
        block = min(n, RANDOM_BLOCK)
        f = self._rng.random(block, dtype=np.float32) * np.float32(1.5) + np.float32(0.25)
        f *= np.where(self._rng.random(block) < 0.5, np.float32(-1), np.float32(1))
        if dtype == "bfloat16":
            bits = (f.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
            host = bits.view(normalize_dtype("bfloat16"))
        else:
            host = f.astype(dtype)
        out = DeviceArray(tuple(shape), dtype, stream=self.stream)
        raw = DeviceArray._from_parts(out.ptr, (out.nbytes,), "uint8", out.device,
                                      stream=self.stream, keep=out, kind="view")
        done, total = host.nbytes, out.nbytes
        raw.view_bytes(0, done).copy_from(host.view(np.uint8))
        while done < total:
            k = min(done, total - done)
            raw.view_bytes(done, k).copy_from(raw.view_bytes(0, k))
            done += k
        return out

    def _find_pointers(self, problem: ConvProblem, direction: Direction) -> tuple[int, int, int]:
        """Device pointers for x, w, y of ``problem`` in find(): the two inputs of
        ``direction`` point into one random buffer per dtype (only read), the
        output into a separate buffer (only written, beta = 0).

        Note: kept between calls and grown on demand. A benchmark runs Find for
        many batch sizes, largest first, so after the first call no allocation
        and no host random numbers are needed; release_find_buffers() frees them.
        """
        item = problem.itemsize
        # what each tensor's strides span (a slice's whole tensor; Note [chunks as slices])
        nbytes = {name: problem.extent(name) * item for name in "xwy"}
        out = {Direction.FORWARD: "y", Direction.BACKWARD_DATA: "x",
               Direction.BACKWARD_FILTER: "w"}[direction]
        src_need = max(n for k, n in nbytes.items() if k != out)
        src = self._find_src.get(problem.dtype)
        if src is None or src.nbytes < src_need:
            if src is not None:
                src.close()
            src = self._random((max(src_need, 1 << 20) // item,), problem.dtype)
            self._find_src[problem.dtype] = src
        if self._find_out is None or self._find_out.nbytes < nbytes[out]:
            if self._find_out is not None:
                self._find_out.close()
            self._find_out = DeviceArray((max(nbytes[out], 1 << 20),), "uint8", stream=self.stream)
        return tuple(self._find_out.ptr if k == out else src.ptr for k in "xwy")  # type: ignore

    def _find_workspace(self, nbytes: int) -> tuple[Optional[int], int]:
        """(pointer, size) of a find workspace of up to ``nbytes``, kept between calls."""
        if nbytes <= 0:
            return None, 0
        ws = self._find_ws
        if ws is None or ws.nbytes < nbytes:
            if ws is not None:
                ws.close()
            self._find_ws = ws = self._alloc_find_workspace(nbytes)
        if ws is None:
            return None, 0
        return ws.ptr, min(ws.nbytes, nbytes)

    def find_workspace_cap(self) -> int:
        """The workspace ``find()`` may give cuDNN: ``find_workspace_limit`` when set,
        else min(half the free device memory, 4 GiB)."""
        if self.find_workspace_limit is not None:
            return self.find_workspace_limit
        free, _total = mem_get_info(self.device)
        return int(min(free // 2, DEFAULT_FIND_WORKSPACE_CAP))

    def _alloc_find_workspace(self, nbytes: int) -> Optional[DeviceArray]:
        """A workspace of up to ``nbytes`` (halved while allocation fails, down to 1 MiB)."""
        while nbytes > 0:
            try:
                return self.alloc_workspace(nbytes)
            except CudaOutOfMemoryError:
                if nbytes <= (1 << 20):
                    return None
                nbytes //= 2
        return None

    def release_find_buffers(self) -> None:
        """Free the device scratch find() keeps between calls (inputs, output, workspace)."""
        bufs = [*self._find_src.values(), self._find_out, self._find_ws]
        self._find_src, self._find_out, self._find_ws = {}, None, None
        for b in bufs:
            if b is not None:
                b.close()

    # -- launchers ---------------------------------------------------------------------------
    def _launcher(self, call: Callable[[int, int, int, int, int], None], keep: tuple,
                  workspace_bytes: int, algo: Any) -> Launcher:
        """``call`` as a bound launcher: where the host has several GPUs, the
        backend's device is made current around it; the launcher holds ``keep``
        (what ``call`` executes: Notes [shared descriptors] and [plan lifetimes])
        and carries ``workspace_bytes`` and ``algo``."""
        launch = call
        if self._multi_device:
            device = self.device

            def launch(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
                with using_device(device):
                    call(x, w, y, ws, ws_size)

        launch.keep = keep  # type: ignore[attr-defined]
        launch.workspace_bytes = int(workspace_bytes)  # type: ignore[attr-defined]
        launch.algo = algo  # type: ignore[attr-defined]
        return launch  # type: ignore[return-value]

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release Find's scratch and the cuDNN handle (the stream is not ours to close)."""
        self.release_find_buffers()
        side, self._side = getattr(self, "_side", None), None
        if side is not None:
            side.close()
        self.handle.close()

    def __enter__(self) -> "DeviceBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(device={self.device} {self.device_name!r}, cuDNN "
                f"{self.version}, stream={hex(self.stream.handle)})")

