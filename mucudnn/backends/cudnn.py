"""The cuDNN backend (legacy convolution API) for ``get_backend("cudnn")``.

``find()`` runs ``cudnnFind*AlgorithmEx`` on real device buffers holding random
non-zero data, with a workspace of ``min(workspace_limit, cap)`` where the cap
defaults to the smaller of half the free device memory and 4 GiB (set it with
``find_workspace_limit``), and returns every algorithm that succeeded within
the limit, fastest first. ``run()`` issues one convolution on the backend's
stream with no host synchronisation; descriptors are cached per problem (LRU,
bounded, closed on eviction) so the hot path creates none.

>>> be = CudnnBackend()                      # doctest: +SKIP
>>> be.find(p, Direction.FORWARD, 64 << 20)  # doctest: +SKIP
[AlgoPerf(algo=1, time_ms=0.21, workspace_bytes=..., math_type=0, determinism=1), ...]
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from typing import Any, Callable, Optional, Union

import numpy as np

from .._cudnn import enums
from .._cudnn.descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor
from .._cudnn.enums import MathType
from .._cudnn.errors import CudnnError
from .._cudnn.handle import Handle, using_device
from .._cudnn.loader import version_string
from .._cudnn.prototypes import lib
from .._cudnn.structs import (
    cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdFilterAlgoPerf_t,
    cudnnConvolutionFwdAlgoPerf_t,
)
from ..problem import AlgoPerf, ConvProblem, Direction
from .base import ConvTensors

__all__ = ["CudnnBackend", "DEFAULT_FIND_WORKSPACE_CAP"]

#: Upper bound of the default Find workspace (the other bound is half the free memory).
DEFAULT_FIND_WORKSPACE_CAP = 4 << 30

_FWD, _BWD_DATA, _BWD_FILTER = Direction.FORWARD, Direction.BACKWARD_DATA, Direction.BACKWARD_FILTER

#: Per direction: (max-count fn, find-Ex fn, workspace-size fn, run fn, perf struct).
_API = {
    _FWD: ("cudnnGetConvolutionForwardAlgorithmMaxCount",
           "cudnnFindConvolutionForwardAlgorithmEx",
           "cudnnGetConvolutionForwardWorkspaceSize",
           "cudnnConvolutionForward", cudnnConvolutionFwdAlgoPerf_t),
    _BWD_DATA: ("cudnnGetConvolutionBackwardDataAlgorithmMaxCount",
                "cudnnFindConvolutionBackwardDataAlgorithmEx",
                "cudnnGetConvolutionBackwardDataWorkspaceSize",
                "cudnnConvolutionBackwardData", cudnnConvolutionBwdDataAlgoPerf_t),
    _BWD_FILTER: ("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
                  "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                  "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                  "cudnnConvolutionBackwardFilter", cudnnConvolutionBwdFilterAlgoPerf_t),
}


class _Descriptors:
    """x, w, y descriptors of one problem, one convolution descriptor per math
    type, and the workspace sizes already asked for."""

    __slots__ = ("problem", "x", "w", "y", "convs", "ws_sizes")

    def __init__(self, problem: ConvProblem) -> None:
        self.problem = problem
        self.x = self.w = self.y = None
        self.convs: dict[int, ConvolutionDescriptor] = {}
        self.ws_sizes: dict[tuple, int] = {}
        try:
            self.x = TensorDescriptor.for_x(problem)
            self.w = FilterDescriptor.for_w(problem)
            self.y = TensorDescriptor.for_y(problem)
        except BaseException:
            self.close()
            raise

    def conv(self, math_type: int) -> ConvolutionDescriptor:
        c = self.convs.get(math_type)
        if c is None:
            c = ConvolutionDescriptor.for_problem(self.problem, math_type=math_type)
            self.convs[math_type] = c
        return c

    def close(self) -> None:
        for d in (self.x, self.w, self.y, *self.convs.values()):
            if d is not None:
                d.close()
        self.convs.clear()
        self.ws_sizes.clear()


def _math_int(math_type: Union[int, str, MathType, None]) -> int:
    if math_type is None:
        return int(MathType.DEFAULT_MATH)
    return int(enums.math_type(math_type))


def _array_ptr(name: str, a: Any, shape: tuple, dtype: str) -> int:
    """The device pointer of ``a``, after checking its shape and dtype."""
    s = getattr(a, "shape", None)
    if s is None or tuple(s) != shape:
        raise ValueError(f"tensors.{name}: expected shape {shape}, got "
                         f"{None if s is None else tuple(s)}")
    dn = getattr(a, "dtype_name", None)
    if dn is not None and dn != dtype:
        raise ValueError(f"tensors.{name}: expected dtype {dtype}, got {dn}")
    ptr = getattr(a, "ptr", None)
    if ptr is None:
        cai = getattr(a, "__cuda_array_interface__", None)
        if cai is None:
            raise TypeError(f"tensors.{name}: expected a DeviceArray (or an object with "
                            f"__cuda_array_interface__), got {type(a).__name__}")
        if cai.get("strides") is not None:
            raise ValueError(f"tensors.{name}: expected a packed (C-contiguous) array")
        ptr = cai["data"][0]
    return int(ptr)


def _bfloat16_dtype() -> np.dtype:
    try:
        from ..cuda.dtypes import normalize_dtype

        return normalize_dtype("bfloat16")
    except ImportError:  # pragma: no cover - mucudnn.cuda always has it
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)


class CudnnBackend:
    """cuDNN's legacy convolution API as a :class:`~mucudnn.backends.base.Backend`.

    ``device``: the CUDA device (default: the current one). ``stream``: the
    stream every call of this backend runs on (default: the device's
    :func:`mucudnn.cuda.default_stream`); the cuDNN handle is bound to it.
    ``find_workspace_limit``: the most workspace ``find()`` gives cuDNN (default:
    min(half the free memory, 4 GiB)). ``descriptor_cache_size``: how many
    problems keep their descriptors (LRU).

    Raises :class:`mucudnn.cuda.NoDeviceError` where there is no GPU or driver.
    """

    name = "cudnn"

    def __init__(self, device: Optional[int] = None, stream: Any = None,
                 find_workspace_limit: Optional[int] = None,
                 descriptor_cache_size: int = 256) -> None:
        from .. import cuda

        if find_workspace_limit is not None and int(find_workspace_limit) < 0:
            raise ValueError(f"find_workspace_limit: expected bytes >= 0, got {find_workspace_limit}")
        self.find_workspace_limit = None if find_workspace_limit is None else int(find_workspace_limit)
        if int(descriptor_cache_size) < 1:
            raise ValueError(f"descriptor_cache_size: expected >= 1, got {descriptor_cache_size}")
        self.descriptor_cache_size = int(descriptor_cache_size)
        cuda.require_device()
        self._cuda = cuda
        self.device = cuda.current_device() if device is None else int(device)
        with using_device(self.device):
            if stream is None:
                self.stream = cuda.default_stream(self.device)
            elif isinstance(stream, cuda.Stream) or not hasattr(cuda, "as_stream"):
                self.stream = stream
            else:  # a raw handle or a foreign stream (torch): wrap it, non-owning
                self.stream = cuda.as_stream(stream, self.device)
            self.handle = Handle(self.device, self.stream)
        self.device_name = cuda.device_name(self.device)
        self.version = version_string()
        self._descs: "OrderedDict[str, _Descriptors]" = OrderedDict()
        self._lock = threading.RLock()
        self._multi_device = cuda.device_count() > 1
        self._rng = np.random.default_rng(0x6d75)
        #: find()'s scratch: random inputs per dtype, an output buffer, a workspace.
        self._find_src: dict[str, Any] = {}
        self._find_out: Any = None
        self._find_ws: Any = None

    def __repr__(self) -> str:
        return (f"CudnnBackend(device={self.device} {self.device_name!r}, cuDNN {self.version}, "
                f"stream={hex(getattr(self.stream, 'handle', 0) or 0)})")

    # -- descriptors ----------------------------------------------------------------
    def descriptors(self, problem: ConvProblem) -> _Descriptors:
        """The cached descriptors of ``problem`` (created on first use)."""
        key = problem.key()
        with self._lock:
            d = self._descs.get(key)
            if d is not None:
                self._descs.move_to_end(key)
                return d
            d = _Descriptors(problem)
            self._descs[key] = d
            while len(self._descs) > self.descriptor_cache_size:
                _, old = self._descs.popitem(last=False)
                old.close()
            return d

    def clear_cache(self) -> None:
        """Close every cached descriptor."""
        with self._lock:
            while self._descs:
                _, d = self._descs.popitem()
                d.close()

    def release_find_buffers(self) -> None:
        """Free the device scratch find() keeps between calls (inputs, output, workspace)."""
        bufs = [*self._find_src.values(), self._find_out, self._find_ws]
        self._find_src, self._find_out, self._find_ws = {}, None, None
        for b in bufs:
            if b is not None:
                b.close()

    def close(self) -> None:
        """Release descriptors, find()'s scratch and the cuDNN handle (the stream
        is not ours to close)."""
        self.clear_cache()
        self.release_find_buffers()
        self.handle.close()

    def __enter__(self) -> "CudnnBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- find ---------------------------------------------------------------------------
    def _random(self, shape: tuple, dtype: str):
        """A device array of ``shape`` filled with random non-zero values."""
        n = int(np.prod(shape))
        f = self._rng.random(n, dtype=np.float32) * np.float32(1.5) + np.float32(0.25)
        f *= np.where(self._rng.random(n) < 0.5, np.float32(-1), np.float32(1))
        if dtype == "bfloat16":
            bits = (f.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
            host = bits.view(_bfloat16_dtype())
        else:
            host = f.astype(dtype)
        return self._cuda.DeviceArray.from_numpy(host.reshape(shape), stream=self.stream)

    def _find_pointers(self, problem: ConvProblem, direction: Direction) -> tuple[int, int, int]:
        """Device pointers for x, w, y of ``problem`` in find(): the two inputs of
        ``direction`` point into one random buffer per dtype (only read), the
        output into a separate buffer (only written, beta = 0).

        Note: kept between calls and grown on demand. A benchmark runs Find for
        many batch sizes, largest first, so after the first call no allocation
        and no host random numbers are needed; release_find_buffers() frees them.
        """
        item = 2 if problem.dtype in ("float16", "bfloat16") else np.dtype(problem.dtype).itemsize
        nbytes = {name: int(np.prod(problem.shape_of(name))) * item for name in "xwy"}
        out = {_FWD: "y", _BWD_DATA: "x", _BWD_FILTER: "w"}[direction]
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
            self._find_out = self._cuda.DeviceArray((max(nbytes[out], 1 << 20),), "uint8",
                                                    stream=self.stream)
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
        with using_device(self.device):
            free, _total = self._cuda.mem_get_info()
        return int(min(free // 2, DEFAULT_FIND_WORKSPACE_CAP))

    def _alloc_find_workspace(self, nbytes: int):
        """A workspace of up to ``nbytes`` (halved while allocation fails, down to 1 MiB)."""
        while nbytes > 0:
            try:
                return self.alloc_workspace(nbytes)
            except self._cuda.CudaOutOfMemoryError:
                if nbytes <= (1 << 20):
                    return None
                nbytes //= 2
        return None

    def find(self, problem: ConvProblem, direction: Direction,
             workspace_limit: Optional[int]) -> list[AlgoPerf]:
        """Every algorithm ``cudnnFind*AlgorithmEx`` ran successfully for ``problem``
        (at its own batch) with workspace <= ``workspace_limit``, fastest first.

        ``workspace_bytes`` is the larger of Find's ``memory`` and
        ``cudnnGet*WorkspaceSize`` for that algorithm and math type (what
        :meth:`run` checks). With ``problem.math == "fma"`` only FMA-math results
        are kept. Find sees a workspace of ``min(workspace_limit,
        find_workspace_cap())``; algorithms needing more are not reported.
        """
        direction = Direction.parse(direction)
        limit = None if workspace_limit is None else int(workspace_limit)
        if limit is not None and limit < 0:
            raise ValueError(f"workspace_limit: expected bytes >= 0, got {workspace_limit}")
        max_count_fn, find_fn, _, _, perf_t = _API[direction]
        math = int(enums.math_type(problem.math))
        with self._lock, using_device(self.device):
            d = self.descriptors(problem)
            conv = d.conv(math)
            count = ctypes.c_int()
            getattr(lib, max_count_fn)(self.handle, ctypes.byref(count))
            xp, wp, yp = self._find_pointers(problem, direction)
            cap = self.find_workspace_cap()
            want = cap if limit is None else min(limit, cap)
            ws_ptr, ws_size = self._find_workspace(want)
            perf = (perf_t * max(1, count.value))()
            returned = ctypes.c_int()
            if direction is _FWD:
                args = (d.x, xp, d.w, wp, conv, d.y, yp)
            elif direction is _BWD_DATA:
                args = (d.w, wp, d.y, yp, conv, d.x, xp)
            else:
                args = (d.x, xp, d.y, yp, conv, d.w, wp)
            try:
                getattr(lib, find_fn)(self.handle, *args, len(perf), ctypes.byref(returned),
                                      perf, ws_ptr, ws_size)
            except CudnnError as exc:
                exc.add_details(problem=problem, direction=str(direction),
                                workspace_bytes=ws_size)
                raise
        fma = problem.math == "fma"
        out = []
        for p in perf[:returned.value]:
            if p.status != 0 or p.time < 0:
                continue
            if fma and p.mathType != MathType.FMA_MATH:
                continue
            # What run() will ask for: never less than Get*WorkspaceSize, so a plan
            # sized from these numbers always runs.
            try:
                need = self._workspace_size(d, direction, int(p.algo), int(p.mathType))
            except CudnnError:
                continue  # cuDNN would refuse to run it
            memory = max(int(p.memory), need)
            if limit is not None and memory > limit:
                continue
            out.append(AlgoPerf(algo=int(p.algo), time_ms=float(p.time),
                                workspace_bytes=memory, math_type=int(p.mathType),
                                determinism=int(p.determinism)))
        out.sort(key=lambda a: a.time_ms)
        return out

    # -- workspace size --------------------------------------------------------------------
    def workspace_size(self, problem: ConvProblem, direction: Direction,
                       algo: Union[int, str], math_type: Union[int, str] = 0) -> int:
        """``cudnnGet*WorkspaceSize`` of ``algo`` with ``math_type`` for ``problem``."""
        direction = Direction.parse(direction)
        d = self.descriptors(problem)
        return self._workspace_size(d, direction, int(algo), _math_int(math_type))

    def _workspace_size(self, d: _Descriptors, direction: Direction, algo: int, math: int) -> int:
        key = (direction, algo, math)
        n = d.ws_sizes.get(key)
        if n is not None:
            return n
        conv = d.conv(math)
        size = ctypes.c_size_t()
        fn = _API[direction][2]
        if direction is _FWD:
            args = (d.x, d.w, conv, d.y)
        elif direction is _BWD_DATA:
            args = (d.w, d.y, conv, d.x)
        else:
            args = (d.x, d.y, conv, d.w)
        try:
            getattr(lib, fn)(self.handle, *args, algo, ctypes.byref(size))
        except CudnnError as exc:
            exc.add_details(problem=d.problem, direction=str(direction), algo=algo, math_type=math)
            raise
        d.ws_sizes[key] = size.value
        return size.value

    # -- run -------------------------------------------------------------------------------
    def run(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
            tensors: ConvTensors, alpha: float = 1.0, beta: float = 0.0,
            workspace: Any = None) -> None:
        """One convolution on the backend's stream (asynchronous):
        forward ``y = alpha*conv(x, w) + beta*y``, backward-data writes ``tensors.x``,
        backward-filter writes ``tensors.w``."""
        self.bind(direction, algo, math_type, tensors, alpha, beta, workspace)()

    def bind(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
             tensors: ConvTensors, alpha: float = 1.0, beta: float = 0.0,
             workspace: Any = None) -> Callable[[], None]:
        """Check one call once and return a launcher that only issues it.

        The launcher holds device pointers (ints), the cached descriptors and
        the scalars, never the arrays: calling it costs one ctypes call. The
        engine caches launchers per (plan, pointers, scalars), so a repeated
        call of a plan pays no Python checks per micro-batch.
        """
        direction = Direction.parse(direction)
        p = tensors.problem
        algo = int(algo)
        math = _math_int(math_type)
        d = self.descriptors(p)
        conv = d.conv(math)
        if workspace is None:
            ws_ptr, ws_size = None, 0
        else:
            ws_size = int(workspace.nbytes)
            ws_ptr = int(workspace.ptr) if ws_size else None
        need = self._workspace_size(d, direction, algo, math)
        if ws_size < need:
            raise ValueError(
                f"workspace: algorithm {algo} ({direction}, math type {math}) needs {need} bytes "
                f"for {p!r}, got {ws_size}")
        xp = _array_ptr("x", tensors.x, p.x_shape, p.dtype)
        wp = _array_ptr("w", tensors.w, p.w_shape, p.dtype)
        yp = _array_ptr("y", tensors.y, p.output_shape, p.dtype)
        if p.dtype == "float64":
            a, b = ctypes.c_double(alpha), ctypes.c_double(beta)
        else:
            a, b = ctypes.c_float(alpha), ctypes.c_float(beta)
        fn = getattr(lib, _API[direction][3])
        if direction is _FWD:
            args = (d.x, xp, d.w, wp, conv, algo, ws_ptr, ws_size, ctypes.byref(b), d.y, yp)
        elif direction is _BWD_DATA:
            args = (d.w, wp, d.y, yp, conv, algo, ws_ptr, ws_size, ctypes.byref(b), d.x, xp)
        else:
            args = (d.x, xp, d.y, yp, conv, algo, ws_ptr, ws_size, ctypes.byref(b), d.w, wp)
        args = (self.handle, ctypes.byref(a)) + args
        device = self.device if self._multi_device else None
        keep = (a, b, d)  # the launcher keeps the scalars and descriptors alive

        def launch() -> None:
            try:
                if device is not None:
                    with using_device(device):
                        fn(*args)
                else:
                    fn(*args)
            except CudnnError as exc:
                exc.add_details(problem=p, direction=str(direction), algo=algo, math_type=math,
                                workspace_bytes=ws_size)
                raise

        launch.keep = keep  # type: ignore[attr-defined]
        launch.alive = lambda: not (d.x.closed or d.w.closed or d.y.closed  # type: ignore
                                    or conv.closed)
        return launch

    # -- arrays ------------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: str):
        """An uninitialised DeviceArray on this backend's device and stream."""
        with using_device(self.device):
            return self._cuda.DeviceArray(tuple(shape), dtype, stream=self.stream)

    def from_host(self, array: Any):
        """A DeviceArray copy of a NumPy array (queued on this backend's stream)."""
        with using_device(self.device):
            return self._cuda.DeviceArray.from_numpy(np.asarray(array), stream=self.stream)

    def to_host(self, array: Any) -> np.ndarray:
        """A NumPy copy; waits for everything queued on this backend's stream."""
        if not hasattr(array, "to_numpy"):
            array = self._cuda.as_device_array(array)
        return array.to_numpy(stream=self.stream)

    def alloc_workspace(self, nbytes: int):
        """A 1-D uint8 DeviceArray of ``nbytes`` (slices are views)."""
        with using_device(self.device):
            return self._cuda.DeviceArray((int(nbytes),), "uint8", stream=self.stream)

    def synchronize(self) -> None:
        """Wait for everything queued on this backend's stream."""
        self.stream.synchronize()
