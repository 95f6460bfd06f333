"""MicroBatchHandle: a framework-facing stand-in for a cuDNN handle.

A framework that calls cuDNN's convolution functions can call the same-named
methods of a :class:`MicroBatchHandle` instead: the arguments are cuDNN's
(descriptors from :mod:`mucudnn._cudnn`, device pointers as ints, alpha/beta
as Python floats). The handle rebuilds the :class:`~mucudnn.problem.ConvProblem`
from the descriptors, **ignores the algorithm the caller asks for**, runs the
micro-batched plan, and answers ``get_*_workspace_size`` with the plan's
workspace need, so a framework that allocates what the handle asks for gives
the plan exactly its workspace. A caller workspace that is too small (or none)
is made up from the backend's workspace pool (or a WD segment).

An optional ``layer_id`` (keyword) names the layer a call belongs to; kernels
are the (layer, direction) pairs seen so far (or registered with
:meth:`MicroBatchHandle.register`). :meth:`MicroBatchHandle.optimize_wd`
re-plans all of them jointly under one total workspace (WD) and gives each
its own segment of one allocation.

The raw :class:`mucudnn._cudnn.Handle` stays policy-free; this is the one
with micro-batch policy.

Example (GPU; pointers as ints)::

    from mucudnn._cudnn import TensorDescriptor, FilterDescriptor, ConvolutionDescriptor
    h = MicroBatchHandle("cudnn", workspace_limit=64 << 20)
    need = h.get_convolution_forward_workspace_size(xd, wd, cd, yd, algo=0)
    h.convolution_forward(1.0, xd, x.data_ptr(), wd, w.data_ptr(), cd, 0, ws_ptr, need,
                          0.0, yd, y.data_ptr(), layer_id="conv1")
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from ..backends import get_backend
from ..backends.base import Backend, ConvTensors
from ..problem import (UNLIMITED_WORKSPACE, ConvProblem, Direction, Plan, conv_dtype,
                       from_canonical, packed_strides)
from ..optimizer.policies import normalize_policy
from .kernel import Kernel
from .workspace import SegmentedWorkspace, get_pool

__all__ = ["MicroBatchHandle", "problem_from_descriptors", "DescriptorInfo"]

log = logging.getLogger("mucudnn")


# -- descriptors -> ConvProblem -----------------------------------------------------------
class DescriptorInfo(dict):
    """Plain values read from a descriptor (dims, strides, dtype, ...)."""


def _first(obj: Any, names: Sequence[str]) -> Any:
    for n in names:
        if hasattr(obj, n):
            v = getattr(obj, n)
            return v() if callable(v) and not isinstance(v, type) else v
    return None


def _as_dict(v: Any) -> dict:
    if v is None:
        return {}
    if isinstance(v, Mapping):
        return dict(v)
    if hasattr(v, "_asdict"):
        return dict(v._asdict())
    if hasattr(v, "__dataclass_fields__"):
        return {k: getattr(v, k) for k in v.__dataclass_fields__}
    return {}


def _dtype_of(v: Any) -> str | None:
    if v is None:
        return None
    name = getattr(v, "name", v)  # enums: DataType.FLOAT
    try:
        return conv_dtype(name)
    except ValueError:
        pass
    s = str(name).upper().replace("CUDNN_DATA_", "").replace("DATATYPE.", "")
    table = {"FLOAT": "float32", "DOUBLE": "float64", "HALF": "float16", "BFLOAT16": "bfloat16"}
    return table.get(s)


def _tensor(desc: Any) -> dict:
    info = _as_dict(_first(desc, ("get", "info", "describe")))
    dims = info.get("dims") or info.get("shape") or _first(desc, ("dims", "dim", "shape"))
    strides = info.get("strides") or _first(desc, ("strides", "stride"))
    dtype = info.get("dtype") or info.get("data_type") or _first(desc, ("dtype", "data_type", "dtype_name"))
    fmt = info.get("format") or info.get("layout") or _first(desc, ("format", "layout", "tensor_format"))
    return {"dims": tuple(int(d) for d in dims) if dims is not None else None,
            "strides": tuple(int(s) for s in strides) if strides is not None else None,
            "dtype": _dtype_of(dtype), "format": fmt}


def _conv(desc: Any) -> dict:
    info = _as_dict(_first(desc, ("get", "info", "describe")))

    def pick(keys: Sequence[str]) -> Any:
        for k in keys:
            if k in info and info[k] is not None:
                return info[k]
        return _first(desc, keys)

    out = {"padding": None, "stride": None, "dilation": None, "compute_type": None}
    get_nd = getattr(desc, "get_nd", None)
    if callable(get_nd):  # mucudnn._cudnn.ConvolutionDescriptor
        pad, stride, dil, mode, ct = get_nd()
        if str(getattr(mode, "name", mode)).upper() not in ("CROSS_CORRELATION", "1"):
            raise ValueError(f"conv_desc: mode {mode!r} is not supported; expected "
                             "CROSS_CORRELATION (what frameworks call convolution)")
        out.update(padding=pad, stride=stride, dilation=dil, compute_type=_dtype_of(ct))
    else:
        out.update(padding=pick(("pads", "padding", "pad", "paddings")),
                   stride=pick(("strides", "stride", "filter_strides")),
                   dilation=pick(("dilations", "dilation")),
                   compute_type=_dtype_of(pick(("compute_type", "data_type", "dtype"))))
    out["groups"] = pick(("group_count", "groups", "groupCount"))
    out["math"] = pick(("math_type", "math"))
    return out


def _format_name(fmt: Any) -> str:
    return str(getattr(fmt, "name", fmt)).upper()


def _is_channels_last(fmt: Any) -> bool:
    """True for cuDNN's NHWC tensor format (by name or its value, 1)."""
    s = _format_name(fmt)
    return "NHWC" in s or s in ("NDHWC", "1")


def _layout_from(dims: tuple[int, ...], strides: tuple[int, ...] | None, fmt: Any) -> str:
    nd = len(dims) - 2
    cf, cl = ("NCHW", "NHWC") if nd == 2 else ("NCDHW", "NDHWC")
    if strides is not None:
        if tuple(strides) == packed_strides(dims, cf):
            return cf
        if tuple(strides) == packed_strides(dims, cl):
            return cl
        raise ValueError(f"descriptor: strides {strides} for dims {dims} are not a packed "
                         f"{cf} or {cl} tensor")
    if fmt is not None and _is_channels_last(fmt):
        return cl
    return cf


_MATH = {0: "default", 1: "tensor_op", 2: "tensor_op_allow_conversion", 3: "fma"}


def _math_of(v: Any) -> str:
    if v is None:
        return "default"
    if isinstance(v, str):
        s = v.lower().replace("cudnn_", "").replace("_math", "")
        return {"default": "default", "fma": "fma", "tensor_op": "tensor_op",
                "tensor_op_allow_conversion": "tensor_op_allow_conversion"}.get(s, "default")
    name = getattr(v, "name", None)
    if name is not None:
        return _math_of(name)
    return _MATH.get(int(v), "default")


def problem_from_descriptors(x_desc: Any, w_desc: Any, conv_desc: Any,
                             y_desc: Any = None) -> ConvProblem:
    """Rebuild the ConvProblem that a cuDNN call's descriptors describe.

    ``x_desc``/``y_desc`` are tensor descriptors (dims in N, C, spatial order
    with strides that tell the layout), ``w_desc`` a filter descriptor (dims
    K, C/groups, spatial and a format), ``conv_desc`` a convolution descriptor
    (pads, strides, dilations, groups, compute type, math type). Descriptors
    that carry ``.problem`` (built with ``for_x(problem)`` etc.) are used
    directly when they agree.
    """
    probs = [getattr(d, "problem", None) for d in (x_desc, w_desc, conv_desc, y_desc)
             if d is not None]
    probs = [p for p in probs if isinstance(p, ConvProblem)]
    t = _tensor(x_desc)
    if probs and all(p == probs[0] for p in probs) and (
            t["dims"] is None or t["dims"] == probs[0].x_dims):
        return probs[0]
    f = _tensor(w_desc)
    c = _conv(conv_desc)
    if t["dims"] is None or f["dims"] is None:
        raise TypeError("descriptors: cannot read dims from the given descriptors "
                        f"({type(x_desc).__name__}, {type(w_desc).__name__})")
    layout = _layout_from(t["dims"], t["strides"], t["format"])
    dtype = t["dtype"] or f["dtype"] or "float32"
    groups = int(c["groups"] or 1)
    nd = len(t["dims"]) - 2

    def tup(v: Any, default: int) -> Any:
        if v is None:
            return default
        return tuple(int(a) for a in v)[:nd] if not isinstance(v, int) else v

    compute = c["compute_type"]
    if compute is not None and compute not in ("float16", "float32", "float64"):
        compute = None
    p = ConvProblem(from_canonical(t["dims"], layout), from_canonical(f["dims"], layout),
                    stride=tup(c["stride"], 1), padding=tup(c["padding"], 0),
                    dilation=tup(c["dilation"], 1), groups=groups, dtype=dtype, layout=layout,
                    math=_math_of(c["math"]), compute_type=compute)
    # Note: cuDNN accepts mixed layouts (say NHWC x with an NCHW-format filter
    # or NCHW-strided y); a ConvProblem has one layout, so refuse them rather
    # than compute in x's layout and write y in the wrong order.
    if f["format"] is not None and _is_channels_last(f["format"]) != p.channels_last:
        raise ValueError(f"w_desc: filter format {_format_name(f['format'])} does not match "
                         f"x_desc's {layout} layout; mixed layouts are not supported")
    if y_desc is not None:
        yt = _tensor(y_desc)
        yd = yt["dims"]
        if yd is not None and tuple(yd) != p.y_dims:
            raise ValueError(f"y_desc: dims {tuple(yd)} do not match the convolution's output "
                             f"dims {p.y_dims} (from x_desc, w_desc and conv_desc)")
        if yt["strides"] is not None and tuple(yt["strides"]) != packed_strides(p.y_dims, layout):
            raise ValueError(f"y_desc: strides {tuple(yt['strides'])} are not a packed {layout} "
                             f"tensor like x_desc's (expected {packed_strides(p.y_dims, layout)}); "
                             "mixed layouts are not supported")
    return p


# -- device pointers as arrays -------------------------------------------------------------
class _Pointer:
    """A __cuda_array_interface__ view of raw device memory (for as_device_array)."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (int(ptr), False), "strides": None,
                                         "version": 3, "stream": None}


def _typestr(dtype: str) -> str:
    if dtype == "bfloat16":
        return "<V2"
    return np.dtype(dtype).str


# -- the handle ------------------------------------------------------------------------------
class MicroBatchHandle:
    """cuDNN-handle-shaped entry point whose convolutions run micro-batched.

    ``backend``: "cudnn" (default where a GPU is present), a Backend, or
    "numpy" (then pass NumPy arrays where cuDNN takes pointers; for tests).
    ``workspace_limit``/``policy``/``cache``/``graph`` as for
    :class:`mucudnn.Convolution`.
    """

    def __init__(self, backend: "str | Backend | None" = None, *,
                 workspace_limit: int | None = 64 << 20, policy: Any = "powerOfTwo",
                 graph: bool = False, cache: Any = None) -> None:
        self.backend: Backend = get_backend(backend)
        self.workspace_limit = workspace_limit
        self.policy = normalize_policy(policy)  # a one-shot iterable is read once
        self.graph = graph
        self.cache = cache
        self._kernels: dict[str, Kernel] = {}
        self._layers: dict[str, list[str]] = {}
        self._segments: SegmentedWorkspace | None = None
        self._lock = threading.RLock()
        self._host = self.backend.name == "numpy" or not hasattr(self.backend, "stream")

    @property
    def stream(self) -> Any:
        """The backend's stream (every call of this handle runs on it)."""
        return getattr(self.backend, "stream", None)

    # -- kernels -------------------------------------------------------------------------
    @staticmethod
    def kernel_name(problem: ConvProblem, direction: Direction, layer_id: Any = None) -> str:
        d = Direction.parse(direction)
        return f"{layer_id}/{d.value}" if layer_id is not None else f"{problem.key()}/{d.value}"

    def _plan_for(self, problem: ConvProblem, direction: Direction) -> Plan:
        from ..optimizer import optimize  # type: ignore[attr-defined]

        # None means unlimited, as for Convolution (the optimizer takes bytes).
        limit = self.workspace_limit if self.workspace_limit is not None else UNLIMITED_WORKSPACE
        return optimize(problem, direction, limit, self.policy, self.backend, cache=self.cache)

    def register(self, problem: ConvProblem, direction: "Direction | str",
                 layer_id: Any = None) -> Kernel:
        """The kernel for (problem, direction, layer_id), created on first sight."""
        d = Direction.parse(direction)
        name = self.kernel_name(problem, d, layer_id)
        with self._lock:
            k = self._kernels.get(name)
            if k is not None and k.problem != problem:
                log.info("mucudnn: handle: layer %r changed its problem; re-planning", layer_id)
                k = None
            if k is None:
                k = Kernel(self.backend, problem, d, lambda: self._plan_for(problem, d),
                           policy=self.policy, workspace_limit=self.workspace_limit,
                           cache=self.cache, graph=self.graph, name=name)
                self._kernels[name] = k
                self._layers.setdefault(str(layer_id), []).append(name)
                if self._segments is not None and name not in self._segments:
                    log.info("mucudnn: handle: new kernel %s after optimize_wd; it uses the "
                             "shared pool until the next optimize_wd", name)
            return k

    @property
    def kernels(self) -> dict[str, Kernel]:
        """Kernel name -> Kernel, for every kernel seen so far."""
        return dict(self._kernels)

    @property
    def plans(self) -> dict[str, Plan]:
        """Kernel name -> the plan in use (kernels planned so far)."""
        return {n: k.plan for n, k in self._kernels.items() if k.planned}

    def optimize_wd(self, total_workspace: int) -> dict[str, Plan]:
        """Re-plan every registered kernel jointly so that their workspaces sum
        to at most ``total_workspace`` bytes (WD), and give each its own
        256-byte-aligned segment of one allocation. Returns name -> Plan."""
        from ..optimizer.benchmark import benchmark
        from ..optimizer.dp import pareto_front
        from ..optimizer.ilp import optimize_wd

        total = int(total_workspace)
        with self._lock:
            fronts: dict[str, list[Plan]] = {}
            for name, k in self._kernels.items():
                perf = benchmark(self.backend, k.problem, k.direction, self.policy, total,
                                 cache=self.cache)
                fronts[name] = pareto_front(perf, k.problem.batch, self.policy,
                                            quantum=k.problem.batch_quantum())
            chosen = optimize_wd(fronts, total)
            self._segments = None  # free the old segments first
            for name, plan in chosen.items():
                k = self._kernels[name]
                k.set_plan(plan.with_context(k.problem, k.direction))
            sizes = {n: self._kernels[n].plan.workspace_bytes for n in chosen}
            self._segments = SegmentedWorkspace(self.backend, sizes, pool=get_pool(self.backend))
            log.info("mucudnn: handle: WD over %d kernels, %d bytes in segments (budget %d)",
                     len(sizes), self._segments.total_bytes, total)
            return {n: self._kernels[n].plan for n in chosen}

    @property
    def segments(self) -> SegmentedWorkspace | None:
        """The WD segments (None before :meth:`optimize_wd`)."""
        return self._segments

    # -- arrays --------------------------------------------------------------------------
    def _array(self, name: str, obj: Any, shape: tuple[int, ...], dtype: str) -> Any:
        if isinstance(obj, bool):
            raise TypeError(f"{name}: expected a device pointer (int), got {obj!r}")
        if isinstance(obj, (int, np.integer)):
            if self._host:
                raise TypeError(f"{name}: the numpy backend takes NumPy arrays, not pointers")
            if int(obj) == 0:
                raise ValueError(f"{name}: null pointer")
            from ..cuda import as_device_array  # type: ignore[attr-defined]

            return as_device_array(_Pointer(int(obj), shape, _typestr(dtype)), sync=False)
        if isinstance(obj, np.ndarray):
            if not self._host:
                raise TypeError(f"{name}: expected a device pointer (int), got a NumPy array")
            if obj.shape != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {obj.shape}")
            if not obj.flags.c_contiguous:
                raise ValueError(f"{name}: expected a C-contiguous array")
            return obj
        from ..cuda import as_device_array  # type: ignore[attr-defined]

        a = as_device_array(obj)
        if tuple(a.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {tuple(a.shape)}")
        return a

    def _workspace(self, workspace: Any, workspace_size: Any, kernel: Kernel) -> Any:
        size = int(workspace_size or 0)
        if workspace is not None and size > 0 and size >= kernel.plan.workspace_bytes:
            if isinstance(workspace, (int, np.integer)):
                if int(workspace) == 0:
                    return self._own_workspace(kernel)
                from ..cuda import as_device_array  # type: ignore[attr-defined]

                return as_device_array(_Pointer(int(workspace), (size,), "|u1"), sync=False)
            return workspace[:size]
        return self._own_workspace(kernel)

    def _own_workspace(self, kernel: Kernel) -> Any:
        seg = self._segments
        if seg is not None and kernel.name in seg:
            off, n = seg.segments[kernel.name]
            if n >= kernel.plan.workspace_bytes:
                return seg.segment(kernel.name)
        return None  # the kernel takes it from the pool

    def _run(self, direction: Direction, problem: ConvProblem, arrays: dict[str, Any],
             alpha: float, beta: float, workspace: Any, workspace_size: Any,
             layer_id: Any) -> None:
        k = self.register(problem, direction, layer_id)
        t = ConvTensors(problem, arrays["x"], arrays["w"], arrays["y"])
        k.run(t, float(alpha), float(beta), self._workspace(workspace, workspace_size, k))

    # -- cuDNN's convolution calls ---------------------------------------------------------
    def convolution_forward(self, alpha: float, x_desc: Any, x: Any, w_desc: Any, w: Any,
                            conv_desc: Any, algo: Any, workspace: Any, workspace_size: int,
                            beta: float, y_desc: Any, y: Any, *, layer_id: Any = None) -> None:
        """cudnnConvolutionForward: y = alpha * conv(x, w) + beta * y (``algo`` ignored)."""
        p = problem_from_descriptors(x_desc, w_desc, conv_desc, y_desc)
        arrays = {"x": self._array("x", x, p.x_shape, p.dtype),
                  "w": self._array("w", w, p.w_shape, p.dtype),
                  "y": self._array("y", y, p.output_shape, p.dtype)}
        self._run(Direction.FORWARD, p, arrays, alpha, beta, workspace, workspace_size, layer_id)

    def convolution_backward_data(self, alpha: float, w_desc: Any, w: Any, dy_desc: Any, dy: Any,
                                  conv_desc: Any, algo: Any, workspace: Any, workspace_size: int,
                                  beta: float, dx_desc: Any, dx: Any, *,
                                  layer_id: Any = None) -> None:
        """cudnnConvolutionBackwardData: dx = alpha * conv_bd(w, dy) + beta * dx (``algo`` ignored)."""
        p = problem_from_descriptors(dx_desc, w_desc, conv_desc, dy_desc)
        arrays = {"x": self._array("dx", dx, p.x_shape, p.dtype),
                  "w": self._array("w", w, p.w_shape, p.dtype),
                  "y": self._array("dy", dy, p.output_shape, p.dtype)}
        self._run(Direction.BACKWARD_DATA, p, arrays, alpha, beta, workspace, workspace_size,
                  layer_id)

    def convolution_backward_filter(self, alpha: float, x_desc: Any, x: Any, dy_desc: Any, dy: Any,
                                    conv_desc: Any, algo: Any, workspace: Any,
                                    workspace_size: int, beta: float, dw_desc: Any, dw: Any, *,
                                    layer_id: Any = None) -> None:
        """cudnnConvolutionBackwardFilter: dw = alpha * sum_n conv_bf(x_n, dy_n) + beta * dw
        (``algo`` ignored; beta applies once, micro-batches accumulate)."""
        p = problem_from_descriptors(x_desc, dw_desc, conv_desc, dy_desc)
        arrays = {"x": self._array("x", x, p.x_shape, p.dtype),
                  "w": self._array("dw", dw, p.w_shape, p.dtype),
                  "y": self._array("dy", dy, p.output_shape, p.dtype)}
        self._run(Direction.BACKWARD_FILTER, p, arrays, alpha, beta, workspace, workspace_size,
                  layer_id)

    # -- workspace queries -------------------------------------------------------------------
    def _need(self, direction: Direction, p: ConvProblem, layer_id: Any) -> int:
        return self.register(p, direction, layer_id).plan.workspace_bytes

    def get_convolution_forward_workspace_size(self, x_desc: Any, w_desc: Any, conv_desc: Any,
                                               y_desc: Any, algo: Any = None, *,
                                               layer_id: Any = None) -> int:
        """The plan's workspace need in bytes (whatever ``algo`` says)."""
        p = problem_from_descriptors(x_desc, w_desc, conv_desc, y_desc)
        return self._need(Direction.FORWARD, p, layer_id)

    def get_convolution_backward_data_workspace_size(self, w_desc: Any, dy_desc: Any,
                                                     conv_desc: Any, dx_desc: Any,
                                                     algo: Any = None, *,
                                                     layer_id: Any = None) -> int:
        """The plan's workspace need in bytes (whatever ``algo`` says)."""
        p = problem_from_descriptors(dx_desc, w_desc, conv_desc, dy_desc)
        return self._need(Direction.BACKWARD_DATA, p, layer_id)

    def get_convolution_backward_filter_workspace_size(self, x_desc: Any, dy_desc: Any,
                                                       conv_desc: Any, dw_desc: Any,
                                                       algo: Any = None, *,
                                                       layer_id: Any = None) -> int:
        """The plan's workspace need in bytes (whatever ``algo`` says)."""
        p = problem_from_descriptors(x_desc, dw_desc, conv_desc, dy_desc)
        return self._need(Direction.BACKWARD_FILTER, p, layer_id)
