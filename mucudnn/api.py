"""The public API: :class:`Convolution` (a layer with cached micro-batch plans)
and the functional helpers :func:`conv2d`, :func:`conv3d`,
:func:`conv_backward_data`, :func:`conv_backward_filter`.

>>> import numpy as np
>>> from mucudnn.api import Convolution
>>> conv = Convolution((8, 3, 9, 9), (4, 3, 3, 3), padding=1, backend="numpy")
>>> x = np.ones((8, 3, 9, 9), np.float32); w = np.ones((4, 3, 3, 3), np.float32)
>>> y = conv.forward(x, w)
>>> y.shape, float(y[0, 0, 4, 4])
((8, 4, 9, 9), 27.0)
>>> conv.plans[Direction.FORWARD].batch
8

Arrays
------
``x``, ``w``, ``dy`` (and the optional outputs) may be

* NumPy arrays. On the NumPy backend they are used in place. On a GPU backend
  they are copied to the device and the result is copied back: a NumPy array
  comes back (the given output array, written in place, when one is given).
  Non-contiguous NumPy *inputs* are copied (``np.ascontiguousarray``); a
  non-contiguous NumPy *output* is a ValueError (it could not be written in place).
* :class:`mucudnn.cuda.DeviceArray` (GPU backends): used in place; a result
  allocated for you is a DeviceArray. The call is asynchronous on the
  backend's stream (``conv.backend.stream``); ``to_numpy``/``backend.synchronize()`` wait.
* Any object with ``__cuda_array_interface__`` (PyTorch, CuPy, Numba): used
  zero-copy. A given output is written in place and returned. With no output
  given, a torch input gets a ``torch.empty`` tensor on the same device and a
  CuPy input a ``cupy.empty`` array; other producers get a DeviceArray. The
  backend's stream is ordered after the producer's stream (torch's or CuPy's
  current stream, a DeviceArray's stream, the interface's v3 ``stream``)
  before the call, and that stream after ours afterwards (events, no host
  wait); for a producer whose stream is unknown (interface v2, not torch or
  CuPy) the device is synchronised before the call and the backend's stream
  before returning. Device arrays
  must be C-contiguous (no copy is made) and on the backend's device.

Every argument is validated before any device work (planning included):
wrong shapes, dtypes, kinds, devices, contiguity, ``beta != 0`` without an
output all raise ValueError/TypeError naming the argument.

``graph=True`` captures each direction's micro-batch sequence as a CUDA graph
and replays it (re-captured when pointers, alpha or beta change); on the NumPy
backend it is a documented no-op (:attr:`Convolution.graph_active` is False).
"""

from __future__ import annotations

import logging
import numbers
import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence, Union

import numpy as np

from .backends import get_backend
from .backends.base import Backend, ConvTensors
from .exec.arrays import ArrayInfo, framework_of, inspect_array, producer_stream
from .exec.graph import supports_graphs
from .exec.kernel import Kernel
from .exec.workspace import WorkspacePool, get_pool
from .optimizer.policies import normalize_policy
from .problem import UNLIMITED_WORKSPACE, ConvProblem, Direction, Plan

__all__ = ["Convolution", "conv2d", "conv3d", "conv_backward_data", "conv_backward_filter",
           "clear_caches"]

log = logging.getLogger("mucudnn")

IntOrTuple = Union[int, Sequence[int]]

#: (role in forward naming, is output) of each argument, per direction.
_ARGS: dict[Direction, tuple[tuple[str, str], tuple[str, str], tuple[str, str]]] = {
    # (input 1, input 2, output): (argument name, forward role)
    Direction.FORWARD: (("x", "x"), ("w", "w"), ("y", "y")),
    Direction.BACKWARD_DATA: (("dy", "y"), ("w", "w"), ("dx", "x")),
    Direction.BACKWARD_FILTER: (("x", "x"), ("dy", "y"), ("dw", "w")),
}

# Plans shared between Convolution objects of one process (the SQLite cache
# below it is shared between processes): key -> (backend, plan).
_PLAN_MEMO: dict[tuple, tuple[Backend, Plan]] = {}
_MEMO_LOCK = threading.Lock()


def _policy_key(policy: Any) -> Any:
    if isinstance(policy, str) or policy is None:
        return policy
    try:
        return tuple(int(v) for v in policy)
    except TypeError:
        return repr(policy)


def _scalar(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {v!r}")
    return float(v)


def _host_backend(backend: Backend) -> bool:
    """True for backends that take NumPy arrays (numpy, or any without a CUDA stream)."""
    return backend.name == "numpy" or not hasattr(backend, "stream")


def _backend_device(backend: Backend) -> int | None:
    for attr in ("device", "device_id", "device_index"):
        v = getattr(backend, attr, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


class Convolution:
    """A convolution layer whose three directions run micro-batched.

    Parameters mirror :class:`~mucudnn.problem.ConvProblem` (shapes in the
    layout's own order) plus:

    workspace_limit
        Per-kernel workspace limit in bytes for planning (default 64 MiB).
    policy
        Micro-batch sizes considered: "powerOfTwo" (default), "all", "undivided",
        or an explicit list of sizes.
    backend
        "numpy", "cudnn", "cudnn-graph", a Backend instance, or None
        (``$MUCUDNN_BACKEND`` if set, else cudnn-graph where a GPU is present,
        else numpy with a one-line notice).
    graph
        Replay each direction's micro-batch sequence as a CUDA graph (a no-op
        on the NumPy backend).
    plans
        Optional ``{Direction: Plan}`` forcing plans (e.g. hand-made mixes of
        sizes and algorithms); other directions are optimised as usual. A
        forced plan's workspace is raised to what the backend reports.
    cache
        Benchmark cache passed to the optimizer (None: the default SQLite file,
        or ``MUCUDNN_CACHE``; "off" disables it there).

    Each direction is optimised on first use (in-memory and SQLite cache), so
    constructing a Convolution is cheap.

    >>> conv = Convolution((4, 2, 5, 5), (3, 2, 3, 3), backend="numpy", policy="undivided")
    >>> conv.output_shape
    (4, 3, 3, 3)
    """

    def __init__(self, x_shape: Sequence[int], w_shape: Sequence[int], *,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, dtype: Any = "float32", layout: str = "NCHW",
                 math: str = "default", workspace_limit: int | None = 64 << 20,
                 policy: Any = "powerOfTwo", backend: "str | Backend | None" = None,
                 graph: bool = False, plans: Mapping[Any, Plan] | None = None,
                 cache: Any = None) -> None:
        self.problem = ConvProblem(x_shape, w_shape, stride=stride, padding=padding,
                                   dilation=dilation, groups=groups, dtype=dtype, layout=layout,
                                   math=math)
        if workspace_limit is not None:
            if isinstance(workspace_limit, bool) or not isinstance(workspace_limit, numbers.Integral):
                raise TypeError(f"workspace_limit: expected an int (bytes) or None, got {workspace_limit!r}")
            if workspace_limit < 0:
                raise ValueError(f"workspace_limit: expected >= 0 bytes, got {workspace_limit}")
            workspace_limit = int(workspace_limit)
        self.workspace_limit = workspace_limit
        # Note: normalised once, so a one-shot iterable of sizes is read once.
        self.policy = normalize_policy(policy)
        self.cache = cache
        self.backend: Backend = get_backend(backend)
        self.graph = bool(graph)
        forced: dict[Direction, Plan] = {}
        for k, v in (plans or {}).items():
            d = Direction.parse(k)
            if not isinstance(v, Plan):
                raise TypeError(f"plans[{d.value}]: expected a Plan, got {type(v).__name__}")
            forced[d] = v
        self._forced = forced
        self._kernels: dict[Direction, Kernel] = {}
        self._lock = threading.RLock()
        if self.graph and not supports_graphs(self.backend):
            log.info("mucudnn: graph=True has no effect on the %s backend (no CUDA stream)",
                     self.backend.name)

    # -- description --------------------------------------------------------------
    @property
    def output_shape(self) -> tuple[int, ...]:
        """Shape of y in the layout's own order."""
        return self.problem.output_shape

    @property
    def graph_active(self) -> bool:
        """True when graph replay is on and the backend supports it."""
        return self.graph and supports_graphs(self.backend)

    @property
    def pool(self) -> WorkspacePool:
        """The backend's workspace pool (shared with every other user of the backend)."""
        return get_pool(self.backend)

    def __repr__(self) -> str:
        return (f"Convolution({self.problem!r}, workspace_limit={self.workspace_limit}, "
                f"policy={self.policy!r}, backend={self.backend.name!r}, graph={self.graph})")

    # -- plans ------------------------------------------------------------------------
    def _optimize(self, direction: Direction) -> Plan:
        if direction in self._forced:
            return self._forced[direction]
        key = (id(self.backend), self.problem.key(), direction.value, self.workspace_limit,
               _policy_key(self.policy), id(self.cache) if self.cache is not None else None)
        with _MEMO_LOCK:
            hit = _PLAN_MEMO.get(key)
            if hit is not None and hit[0] is self.backend:
                return hit[1]
        from .optimizer import optimize  # type: ignore[attr-defined]

        limit = self.workspace_limit if self.workspace_limit is not None else UNLIMITED_WORKSPACE
        plan = optimize(self.problem, direction, limit, self.policy, self.backend,
                        cache=self.cache)
        log.info("mucudnn: %s %s: plan %s, %d bytes workspace, %.3g ms (undivided %.3g ms)",
                 self.problem.key(), direction, plan.describe(), plan.workspace_bytes,
                 plan.time_ms, plan.undivided_time_ms)
        with _MEMO_LOCK:
            _PLAN_MEMO[key] = (self.backend, plan)
        return plan

    def kernel(self, direction: "Direction | str") -> Kernel:
        """The execution state of one direction (plan, workspace, graphs)."""
        d = Direction.parse(direction)
        with self._lock:
            k = self._kernels.get(d)
            if k is None:
                k = Kernel(self.backend, self.problem, d, lambda: self._optimize(d),
                           policy=self.policy, workspace_limit=self.workspace_limit,
                           cache=self.cache, graph=self.graph)
                self._kernels[d] = k
            return k

    def plan(self, direction: "Direction | str") -> Plan:
        """The plan of ``direction``, optimising it now if needed."""
        return self.kernel(direction).plan

    @property
    def plans(self) -> dict[Direction, Plan]:
        """Direction -> the Plan in use, for the directions used (or planned) so far.
        After a run-time fallback this is the fallback plan."""
        return {d: k.plan for d, k in self._kernels.items() if k.planned}

    # -- the three directions ----------------------------------------------------------
    def forward(self, x: Any, w: Any, y: Any = None, alpha: float = 1.0, beta: float = 0.0) -> Any:
        """``y = alpha * conv(x, w) + beta * y``; returns y (see the module doc for kinds).

        >>> conv = Convolution((2, 1, 3, 3), (1, 1, 3, 3), backend="numpy", policy="undivided")
        >>> float(conv.forward(np.ones((2, 1, 3, 3), np.float32), np.ones((1, 1, 3, 3), np.float32))[1, 0, 0, 0])
        9.0
        """
        return self._call(Direction.FORWARD, x, w, y, alpha, beta)

    def backward_data(self, dy: Any, w: Any, dx: Any = None, alpha: float = 1.0,
                      beta: float = 0.0) -> Any:
        """``dx = alpha * conv_backward_data(w, dy) + beta * dx``; returns dx."""
        return self._call(Direction.BACKWARD_DATA, dy, w, dx, alpha, beta)

    def backward_filter(self, x: Any, dy: Any, dw: Any = None, alpha: float = 1.0,
                        beta: float = 0.0) -> Any:
        """``dw = alpha * sum_n conv_backward_filter(x_n, dy_n) + beta * dw``; returns dw.

        With ``beta = 0`` the prior dw is never read (it may hold NaN).
        """
        return self._call(Direction.BACKWARD_FILTER, x, dy, dw, alpha, beta)

    __call__ = forward

    # -- validation and dispatch -------------------------------------------------------
    def _validate(self, direction: Direction, a: Any, b: Any, out: Any, alpha: Any,
                  beta: Any) -> tuple[list[ArrayInfo], ArrayInfo | None, float, float, str]:
        """Check every argument; return (input infos, output info, alpha, beta, mode).

        mode is "host" (NumPy arrays) or "device". No device work happens here.
        """
        alpha = _scalar("alpha", alpha)
        beta = _scalar("beta", beta)
        p = self.problem
        (n1, r1), (n2, r2), (no, ro) = _ARGS[direction]
        infos = [inspect_array(n1, a), inspect_array(n2, b)]
        oinfo = inspect_array(no, out) if out is not None else None
        if out is None and beta != 0:
            raise ValueError(
                f"{no}: beta={beta} reads the prior {no}, but no {no} was given; pass {no}= "
                "or use beta=0")
        for info, role in zip(infos + ([oinfo] if oinfo else []), (r1, r2, ro)):
            want = p.shape_of(role)
            if info.shape != want:
                raise ValueError(
                    f"{info.name}: expected shape {want} ({p.layout}) for this Convolution, "
                    f"got {info.shape}")
            if info.dtype != p.dtype:
                raise ValueError(
                    f"{info.name}: expected dtype {p.dtype}, got "
                    f"{info.dtype or getattr(info.obj, 'dtype', '?')}")
        host = [i for i in infos if i.kind == "numpy"]
        dev = [i for i in infos if i.kind != "numpy"]
        if host and dev:
            raise TypeError(
                f"{host[0].name} is a NumPy array but {dev[0].name} is a device array; "
                "pass all inputs as NumPy arrays or all as device arrays")
        mode = "host" if host else "device"
        on_gpu = not _host_backend(self.backend)
        if mode == "device" and not on_gpu:
            raise TypeError(
                f"{dev[0].name}: the {self.backend.name} backend takes NumPy arrays, got "
                f"{type(dev[0].obj).__name__}; copy it to the host or use a GPU backend")
        if oinfo is not None:
            if mode == "host" and oinfo.kind != "numpy":
                raise TypeError(
                    f"{no}: the inputs are NumPy arrays, so {no} must be a NumPy array too, "
                    f"got {type(out).__name__} (pass device inputs for a device output)")
            if mode == "device" and oinfo.kind == "numpy":
                raise TypeError(
                    f"{no}: the inputs are device arrays, so {no} must be one too, got a NumPy array")
            if not oinfo.contiguous:
                raise ValueError(f"{no}: expected a C-contiguous array (it is written in place)")
            if oinfo.kind == "numpy" and not out.flags.writeable:
                raise ValueError(f"{no}: the output array is read-only")
        for info in infos:
            if not info.contiguous and info.kind != "numpy":
                raise ValueError(
                    f"{info.name}: expected a C-contiguous device array (no copy is made); "
                    "call .contiguous() / make a packed copy first")
        if mode == "device":
            want_dev = _backend_device(self.backend)
            for info in infos + ([oinfo] if oinfo else []):
                if want_dev is not None and info.device is not None and info.device != want_dev:
                    raise ValueError(
                        f"{info.name}: is on CUDA device {info.device}, but the backend runs "
                        f"on device {want_dev}")
        if oinfo is not None:
            for info in infos:
                if _overlap(oinfo, info):
                    raise ValueError(f"{no}: overlaps {info.name} in memory; the output must "
                                     "not alias an input")
        return infos, oinfo, alpha, beta, mode

    def _call(self, direction: Direction, a: Any, b: Any, out: Any, alpha: Any,
              beta: Any) -> Any:
        infos, oinfo, alpha, beta, mode = self._validate(direction, a, b, out, alpha, beta)
        p = self.problem
        (n1, r1), (n2, r2), (no, ro) = _ARGS[direction]
        kernel = self.kernel(direction)
        be = self.backend
        if mode == "host":
            arrs = [np.ascontiguousarray(i.obj) for i in infos]
            if _host_backend(be):
                res = out if out is not None else be.empty(p.shape_of(ro), p.dtype)
                roles = {r1: arrs[0], r2: arrs[1], ro: res}
                kernel.run(ConvTensors(p, roles["x"], roles["w"], roles["y"]), alpha, beta)
                return res
            dev = [be.from_host(a_) for a_ in arrs]
            dout = be.from_host(out) if (out is not None and beta != 0) else be.empty(
                p.shape_of(ro), p.dtype)
            roles = {r1: dev[0], r2: dev[1], ro: dout}
            kernel.run(ConvTensors(p, roles["x"], roles["w"], roles["y"]), alpha, beta)
            host = be.to_host(dout)
            if out is not None:
                np.copyto(out, host)
                return out
            return host
        # device mode
        from .cuda import Stream, as_device_array  # type: ignore[attr-defined]

        result = out if out is not None else self._alloc_like(infos, p.shape_of(ro))
        everything = infos + [oinfo if oinfo is not None else inspect_array(no, result)]
        ours = int(getattr(be.stream, "handle", 0) or 0)  # type: ignore[attr-defined]
        producers, unknown = set(), False
        for i in everything:
            h = producer_stream(i)
            if h is not None and h != ours:
                producers.add(h)
            elif h is None and i.kind == "cai":
                unknown = True
        dev = [_wrap(as_device_array, i.name, i.obj) for i in infos]
        dout = _wrap(as_device_array, no, result)
        roles = {r1: dev[0], r2: dev[1], ro: dout}
        # Order our stream after the producers' (events, no host wait) and theirs after ours.
        if unknown:  # a producer whose stream we cannot know: let its work finish first
            from .cuda import synchronize as device_synchronize  # type: ignore[attr-defined]

            device_synchronize(_backend_device(be))
        for h in sorted(producers):
            be.stream.wait_stream(Stream.wrap(h))  # type: ignore[attr-defined]
        kernel.run(ConvTensors(p, roles["x"], roles["w"], roles["y"]), alpha, beta)
        for h in sorted(producers):
            Stream.wrap(h).wait_stream(be.stream)  # type: ignore[attr-defined]
        if unknown:  # a producer whose stream we cannot know: finish before returning
            be.synchronize()
        return result

    def _alloc_like(self, infos: list[ArrayInfo], shape: tuple[int, ...]) -> Any:
        """A new output of the kind of the first foreign input (torch/CuPy), else a DeviceArray."""
        for i in infos:
            if i.kind != "cai":
                continue
            fw = framework_of(i.obj)
            if fw == "torch":
                import torch  # type: ignore[import-not-found]

                return torch.empty(shape, dtype=i.obj.dtype, device=i.obj.device)
            if fw == "cupy":
                import cupy  # type: ignore[import-not-found]

                with i.obj.device:
                    return cupy.empty(shape, dtype=i.obj.dtype)
        return self.backend.empty(shape, self.problem.dtype)


def _wrap(as_device_array: Any, name: str, obj: Any) -> Any:
    try:
        return as_device_array(obj, sync=False)  # streams are ordered by _call
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None


def _overlap(a: ArrayInfo, b: ArrayInfo) -> bool:
    if a.kind == "numpy" and b.kind == "numpy":
        return bool(np.may_share_memory(a.obj, b.obj)) if (a.contiguous and b.contiguous) \
            else bool(np.shares_memory(a.obj, b.obj, max_work=10_000)) if _cheap(a, b) else False
    if a.kind != "numpy" and b.kind != "numpy" and a.ptr and b.ptr:
        return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes
    return False


def _cheap(a: ArrayInfo, b: ArrayInfo) -> bool:
    return a.nbytes + b.nbytes < (1 << 26)


# -- functional helpers -----------------------------------------------------------------
_CONV_CACHE: "OrderedDict[tuple, Convolution]" = OrderedDict()
_CONV_CACHE_SIZE = 128
_CONV_LOCK = threading.Lock()


def clear_caches() -> None:
    """Forget the functional helpers' Convolution objects and the in-memory plans
    (the SQLite benchmark cache is untouched)."""
    with _CONV_LOCK:
        _CONV_CACHE.clear()
    with _MEMO_LOCK:
        _PLAN_MEMO.clear()


def _array_dtype(name: str, obj: Any) -> str:
    info = inspect_array(name, obj)
    if info.dtype is None:
        raise ValueError(f"{name}: unsupported dtype {getattr(obj, 'dtype', '?')}")
    return info.dtype


def _shape_of(name: str, obj: Any) -> tuple[int, ...]:
    return inspect_array(name, obj).shape


def _get_conv(x_shape: Sequence[int], w_shape: Sequence[int], *, stride: Any, padding: Any,
              dilation: Any, groups: int, dtype: str, layout: str, math: str,
              workspace_limit: int | None, policy: Any, backend: Any, graph: bool) -> Convolution:
    be = get_backend(backend)
    p = ConvProblem(x_shape, w_shape, stride=stride, padding=padding, dilation=dilation,
                    groups=groups, dtype=dtype, layout=layout, math=math)
    key = (p.key(), workspace_limit, _policy_key(policy), id(be), bool(graph))
    with _CONV_LOCK:
        conv = _CONV_CACHE.get(key)
        if conv is not None and conv.backend is be:
            _CONV_CACHE.move_to_end(key)
            return conv
    conv = Convolution(p.x_shape, p.w_shape, stride=p.stride, padding=p.padding,
                       dilation=p.dilation, groups=p.groups, dtype=p.dtype, layout=p.layout,
                       math=p.math, workspace_limit=workspace_limit, policy=policy, backend=be,
                       graph=graph)
    with _CONV_LOCK:
        _CONV_CACHE[key] = conv
        while len(_CONV_CACHE) > _CONV_CACHE_SIZE:
            _CONV_CACHE.popitem(last=False)
    return conv


def _check_layout(layout: str, nd: int, fn: str) -> str:
    if not isinstance(layout, str):
        raise TypeError(f"layout: expected a string, got {layout!r}")
    lay = layout.upper()
    ok = ("NCHW", "NHWC") if nd == 2 else ("NCDHW", "NDHWC")
    if lay not in ok:
        raise ValueError(f"layout: {fn} takes one of {list(ok)}, got {layout!r}")
    return lay


def _convnd(nd: int, fn: str, x: Any, w: Any, *, stride: IntOrTuple, padding: IntOrTuple,
            dilation: IntOrTuple, groups: int, layout: str, math: str,
            workspace_limit: int | None, policy: Any, backend: Any, alpha: float, beta: float,
            out: Any, graph: bool) -> Any:
    lay = _check_layout(layout, nd, fn)
    xs, ws = _shape_of("x", x), _shape_of("w", w)
    dt = _array_dtype("x", x)
    conv = _get_conv(xs, ws, stride=stride, padding=padding, dilation=dilation, groups=groups,
                     dtype=dt, layout=lay, math=math, workspace_limit=workspace_limit,
                     policy=policy, backend=backend, graph=graph)
    return conv.forward(x, w, out, alpha=alpha, beta=beta)


def conv2d(x: Any, w: Any, *, stride: IntOrTuple = 1, padding: IntOrTuple = 0,
           dilation: IntOrTuple = 1, groups: int = 1, layout: str = "NCHW",
           math: str = "default", workspace_limit: int | None = 64 << 20,
           policy: Any = "powerOfTwo", backend: Any = None, alpha: float = 1.0,
           beta: float = 0.0, out: Any = None, graph: bool = False) -> Any:
    """2-D convolution (cross-correlation, as cuDNN and PyTorch), micro-batched.

    Shapes and dtype come from ``x`` (N, C, H, W) / (N, H, W, C) and ``w``
    (K, C/groups, R, S) / (K, R, S, C/groups). The Convolution behind the call
    is cached per problem and options, so repeated calls do not re-plan.

    >>> import numpy as np
    >>> y = conv2d(np.ones((2, 3, 5, 5), np.float32), np.ones((4, 3, 3, 3), np.float32),
    ...            padding=1, backend="numpy")
    >>> y.shape, float(y[0, 0, 2, 2])
    ((2, 4, 5, 5), 27.0)
    """
    return _convnd(2, "conv2d", x, w, stride=stride, padding=padding, dilation=dilation,
                   groups=groups, layout=layout, math=math, workspace_limit=workspace_limit,
                   policy=policy, backend=backend, alpha=alpha, beta=beta, out=out, graph=graph)


def conv3d(x: Any, w: Any, *, stride: IntOrTuple = 1, padding: IntOrTuple = 0,
           dilation: IntOrTuple = 1, groups: int = 1, layout: str = "NCDHW",
           math: str = "default", workspace_limit: int | None = 64 << 20,
           policy: Any = "powerOfTwo", backend: Any = None, alpha: float = 1.0,
           beta: float = 0.0, out: Any = None, graph: bool = False) -> Any:
    """3-D convolution; as :func:`conv2d` with NCDHW/NDHWC shapes.

    >>> import numpy as np
    >>> conv3d(np.ones((1, 2, 3, 3, 3), np.float32), np.ones((1, 2, 3, 3, 3), np.float32),
    ...        backend="numpy").ravel().tolist()
    [54.0]
    """
    return _convnd(3, "conv3d", x, w, stride=stride, padding=padding, dilation=dilation,
                   groups=groups, layout=layout, math=math, workspace_limit=workspace_limit,
                   policy=policy, backend=backend, alpha=alpha, beta=beta, out=out, graph=graph)


def _layout_for(layout: str | None, ndim: int) -> str:
    if layout is not None:
        return layout.upper() if isinstance(layout, str) else layout
    return "NCHW" if ndim == 4 else "NCDHW"


def conv_backward_data(dy: Any, w: Any, x_shape: Sequence[int], *, stride: IntOrTuple = 1,
                       padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1,
                       layout: str | None = None, math: str = "default",
                       workspace_limit: int | None = 64 << 20, policy: Any = "powerOfTwo",
                       backend: Any = None, alpha: float = 1.0, beta: float = 0.0,
                       out: Any = None, graph: bool = False) -> Any:
    """Gradient of the convolution with respect to its input: dx of shape ``x_shape``.

    ``layout`` defaults to NCHW (4-D w) or NCDHW (5-D w).

    >>> import numpy as np
    >>> dx = conv_backward_data(np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 3, 3), np.float32),
    ...                         (1, 1, 5, 5), backend="numpy")
    >>> float(dx[0, 0, 2, 2]), float(dx[0, 0, 0, 0])
    (9.0, 1.0)
    """
    ws = _shape_of("w", w)
    lay = _layout_for(layout, len(ws))
    dt = _array_dtype("dy", dy)
    conv = _get_conv(tuple(x_shape), ws, stride=stride, padding=padding, dilation=dilation,
                     groups=groups, dtype=dt, layout=lay, math=math,
                     workspace_limit=workspace_limit, policy=policy, backend=backend, graph=graph)
    return conv.backward_data(dy, w, out, alpha=alpha, beta=beta)


def conv_backward_filter(x: Any, dy: Any, w_shape: Sequence[int], *, stride: IntOrTuple = 1,
                         padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1,
                         layout: str | None = None, math: str = "default",
                         workspace_limit: int | None = 64 << 20, policy: Any = "powerOfTwo",
                         backend: Any = None, alpha: float = 1.0, beta: float = 0.0,
                         out: Any = None, graph: bool = False) -> Any:
    """Gradient of the convolution with respect to its filter: dw of shape ``w_shape``.

    >>> import numpy as np
    >>> dw = conv_backward_filter(np.ones((2, 1, 3, 3), np.float32), np.ones((2, 1, 1, 1), np.float32),
    ...                           (1, 1, 3, 3), backend="numpy")
    >>> dw.ravel().tolist()[:3]
    [2.0, 2.0, 2.0]
    """
    xs = _shape_of("x", x)
    lay = _layout_for(layout, len(xs))
    dt = _array_dtype("x", x)
    conv = _get_conv(xs, tuple(w_shape), stride=stride, padding=padding, dilation=dilation,
                     groups=groups, dtype=dt, layout=lay, math=math,
                     workspace_limit=workspace_limit, policy=policy, backend=backend, graph=graph)
    return conv.backward_filter(x, dy, out, alpha=alpha, beta=beta)
