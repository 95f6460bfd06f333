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
import math
import operator
import time
from typing import Any, Optional, Union

from .._cudnn import enums
from .._cudnn.descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor
from .._cudnn.enums import MathType
from .._cudnn.errors import CudnnError
from .._cudnn.prototypes import lib, raise_status
from .._cudnn.structs import (
    cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdFilterAlgoPerf_t,
    cudnnConvolutionFwdAlgoPerf_t,
)
from ..caches import LRU
from ..errors import InvalidValueError, UnsupportedConfigError
from ..problem import AlgoPerf, ConvProblem, Direction
from ._device import DEFAULT_FIND_WORKSPACE_CAP, DeviceBackend, array_pointer
from .base import ConvTensors, Launcher

__all__ = ["CudnnBackend", "DEFAULT_FIND_WORKSPACE_CAP"]

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
    type, and the workspace sizes already asked for.

    Note [shared descriptors]
    ~~~~~~~~~~~~~~~~~~~~~~~~~
    The backend's descriptor cache and every bound launcher that uses them
    hold this object. Eviction drops only the cache's reference; the
    descriptors are destroyed when the last holder lets go (their
    ``weakref.finalize``, which CPython runs at that moment: nothing here
    forms a cycle), or at once by :meth:`close`. So a warm launcher never
    finds its descriptors closed under it and needs no liveness check.
    """

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


def _algo_int(direction: Direction, algo: Union[int, str]) -> int:
    """``algo`` as a legacy-API algorithm number for ``direction``: an int (not
    a bool), its digits, or an algorithm's name (``"implicit_gemm"``); another
    backend's id (``"e19"``, ``"split2|0"``) raises InvalidValueError naming
    ``algo``, before any cuDNN call.

    >>> _algo_int(Direction.FORWARD, "winograd"), _algo_int(Direction.FORWARD, "1")
    (6, 1)
    >>> _algo_int(Direction.BACKWARD_FILTER, "slice2|e19;k2=0")
    Traceback (most recent call last):
    ...
    mucudnn.errors.InvalidValueError: algo: expected a backward_filter algorithm of cuDNN's \
legacy API, an int or one of ['ALGO_0=0', 'ALGO_1=1', 'FFT=2', 'ALGO_3=3', 'WINOGRAD=4', \
'WINOGRAD_NONFUSED=5', 'FFT_TILING=6'], got 'slice2|e19;k2=0'
    """
    kinds = enums.algo_enum(direction)
    members = [k for k in kinds if k.name != "COUNT"]
    if isinstance(algo, str):
        text = algo.strip()
        if text.isdigit():
            return int(text)
        for k in members:
            if k.name == text.upper():
                return int(k)
    elif not isinstance(algo, bool):
        try:
            return operator.index(algo)  # an int, a NumPy integer, an enum member
        except TypeError:
            pass
    raise InvalidValueError(
        f"algo: expected a {direction.value} algorithm of cuDNN's legacy API, an int or one of "
        f"{[f'{k.name}={int(k)}' for k in members]}, got {algo!r}")


def _math_int(math_type: Union[int, str, MathType, None]) -> int:
    if math_type is None:
        return int(MathType.DEFAULT_MATH)
    return int(enums.math_type(math_type))


class CudnnBackend(DeviceBackend):
    """cuDNN's legacy convolution API as a :class:`~mucudnn.backends.base.Backend`.

    ``device``, ``stream``, ``find_workspace_limit``: see
    :class:`~mucudnn.backends._device.DeviceBackend`. ``descriptor_cache_size``:
    how many problems keep their descriptors (LRU).

    Raises :class:`mucudnn.cuda.NoDeviceError` where there is no GPU or driver.
    """

    name = "cudnn"

    def __init__(self, device: Optional[int] = None, stream: Any = None,
                 find_workspace_limit: Optional[int] = None,
                 descriptor_cache_size: int = 256) -> None:
        if int(descriptor_cache_size) < 1:
            raise InvalidValueError(f"descriptor_cache_size: expected >= 1, got {descriptor_cache_size}")
        super().__init__(device=device, stream=stream, find_workspace_limit=find_workspace_limit)
        self.descriptor_cache_size = int(descriptor_cache_size)
        self._descs: LRU[str, _Descriptors] = LRU("cudnn.descriptors", self.descriptor_cache_size)

    # -- descriptors ------------------------------------------------------------------
    def descriptors(self, problem: ConvProblem) -> _Descriptors:
        """The cached descriptors of ``problem`` (created on first use)."""
        return self._descs.get_or_create(problem.key(), lambda: _Descriptors(problem))

    def clear_cache(self) -> None:
        """Drop every cached descriptor (Note [shared descriptors])."""
        self._descs.clear()

    def close(self) -> None:
        """Release descriptors, find()'s scratch and the cuDNN handle (the stream
        is not ours to close)."""
        self.clear_cache()
        super().close()

    # -- find ---------------------------------------------------------------------------
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
            raise InvalidValueError(f"workspace_limit: expected bytes >= 0, got {workspace_limit}")
        max_count_fn, find_fn, _, _, perf_t = _API[direction]
        math = int(enums.math_type(problem.math))
        prof = self.find_profile
        t_start = time.perf_counter()
        with self.on_home_stream():
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
            args: tuple[Any, ...]
            if direction is _FWD:
                args = (d.x, xp, d.w, wp, conv, d.y, yp)
            elif direction is _BWD_DATA:
                args = (d.w, wp, d.y, yp, conv, d.x, xp)
            else:
                args = (d.x, xp, d.y, yp, conv, d.w, wp)
            t_find = time.perf_counter()
            try:
                getattr(lib, find_fn)(self.handle, *args, len(perf), ctypes.byref(returned),
                                      perf, ws_ptr, ws_size)
            except CudnnError as exc:
                exc.add_details(problem=problem, direction=str(direction),
                                workspace_bytes=ws_size)
                raise
            finally:
                prof.timing_s += time.perf_counter() - t_find
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
        prof.calls += 1
        prof.timed += len(out)
        prof.total_s += time.perf_counter() - t_start
        return out

    # -- workspace size --------------------------------------------------------------------
    def workspace_size(self, problem: ConvProblem, direction: Direction,
                       algo: Union[int, str], math_type: Union[int, str] = 0) -> int:
        """``cudnnGet*WorkspaceSize`` of ``algo`` with ``math_type`` for ``problem``."""
        direction = Direction.parse(direction)
        algo_int = _algo_int(direction, algo)
        d = self.descriptors(problem)
        return self._workspace_size(d, direction, algo_int, _math_int(math_type))

    def _workspace_size(self, d: _Descriptors, direction: Direction, algo: int, math: int) -> int:
        key = (direction, algo, math)
        n = d.ws_sizes.get(key)
        if n is not None:
            return n
        conv = d.conv(math)
        size = ctypes.c_size_t()
        fn = _API[direction][2]
        args: tuple[Any, ...]
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

    # -- run ----------------------------------------------------------------------------
    def run(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
            tensors: ConvTensors, alpha: float = 1.0, beta: float = 0.0,
            workspace: Any = None) -> None:
        """One convolution on the home stream (asynchronous):
        forward ``y = alpha*conv(x, w) + beta*y``, backward-data writes ``tensors.x``,
        backward-filter writes ``tensors.w``."""
        p = tensors.problem
        ptrs = (array_pointer("x", tensors.x, p.x_shape, p.dtype),
                array_pointer("w", tensors.w, p.w_shape, p.dtype),
                array_pointer("y", tensors.y, p.output_shape, p.dtype))
        ws_size = 0 if workspace is None else int(workspace.nbytes)
        ws_ptr = int(workspace.ptr) if ws_size else 0
        launch = self.bind(direction, algo, math_type, p, 0, p.batch, alpha, beta)
        if ws_size < launch.workspace_bytes:
            raise InvalidValueError(
                f"workspace: algorithm {algo} ({Direction.parse(direction)}) needs "
                f"{launch.workspace_bytes} bytes for {p!r}, got {ws_size}")
        with self.on_home_stream():
            launch(*ptrs, ws_ptr, ws_size)

    def bind(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
             problem: ConvProblem, offset: int, size: int, alpha: float = 1.0,
             beta: float = 0.0, aligns: tuple[int, int, int] = (16, 16, 16)) -> Launcher:
        """A launcher for rows ``[offset, offset + size)`` of ``problem``:
        ``launch(x, w, y, workspace, workspace_bytes)`` with whole-batch device
        pointers issues one ``cudnnConvolution*`` call on the active stream.

        The launcher holds the descriptors, the algorithm and the scalars
        (Note [shared descriptors]) and calls the raw binding (Note [raw
        bindings]), so a warm call costs one ctypes call. Any alignment runs
        (the legacy API has no alignment constraint; ``aligns`` is unused).
        Raises :class:`~mucudnn.errors.UnsupportedConfigError` when cuDNN
        refuses the algorithm for this problem.
        """
        direction = Direction.parse(direction)
        algo = _algo_int(direction, algo)
        mt = _math_int(math_type)
        if problem.math == "fma" and mt == int(MathType.DEFAULT_MATH):
            # Note: a plan's default math type on an "fma" problem means the
            # problem's math: never tensor cores (TF32) where FMA was asked for.
            mt = int(MathType.FMA_MATH)
        if offset < 0 or size < 1 or offset + size > problem.batch:
            raise InvalidValueError(f"micro-batch rows [{offset}, {offset + size}) outside the batch "
                             f"of {problem.batch}")
        sub = problem.with_batch(size)
        d = self.descriptors(sub)
        conv = d.conv(mt)
        try:
            need = self._workspace_size(d, direction, algo, mt)
        except CudnnError as exc:
            raise UnsupportedConfigError(
                f"algo: cuDNN refuses algorithm {algo} ({direction}, math type {mt}) for "
                f"{sub!r}: {exc}", algo=algo, reason=str(exc)) from exc
        item = problem.itemsize
        ox = offset * math.prod(problem.x_shape[1:]) * item
        oy = offset * math.prod(problem.output_shape[1:]) * item
        scalar = ctypes.c_double if problem.compute_type == "float64" else ctypes.c_float
        a, b = scalar(alpha), scalar(beta)
        pa, pb = ctypes.addressof(a), ctypes.addressof(b)
        name = _API[direction][3]
        fn = lib.raw(name)
        h = self.handle.handle
        assert d.x is not None and d.w is not None and d.y is not None
        xd, wd, yd, cd = d.x.handle, d.w.handle, d.y.handle, conv.handle

        def fail(status: int, ws_size: int) -> None:
            raise_status(status, name, problem=sub, direction=str(direction), algo=algo,
                         math_type=mt, workspace_bytes=ws_size)

        if direction is _FWD:
            def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
                st = fn(h, pa, xd, x + ox, wd, w, cd, algo, ws, ws_size, pb, yd, y + oy)
                if st:
                    fail(st, ws_size)
        elif direction is _BWD_DATA:
            def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
                st = fn(h, pa, wd, w, yd, y + oy, cd, algo, ws, ws_size, pb, xd, x + ox)
                if st:
                    fail(st, ws_size)
        else:
            def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
                st = fn(h, pa, xd, x + ox, yd, y + oy, cd, algo, ws, ws_size, pb, wd, w)
                if st:
                    fail(st, ws_size)

        return self._launcher(call, (a, b, d, conv, self.handle), need, algo)
