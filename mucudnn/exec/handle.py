"""The engine behind MicroBatchHandle: a framework-facing stand-in for a cuDNN handle.

A framework that calls cuDNN's convolution functions can call the same-named
methods of :class:`mucudnn.MicroBatchHandle` instead: the arguments are cuDNN's
(descriptors from :mod:`mucudnn._cudnn`, device pointers as ints, alpha/beta
as Python floats). The handle rebuilds the :class:`~mucudnn.problem.ConvProblem`
from the descriptors, **ignores the algorithm the caller asks for**, runs the
micro-batched plan, and answers ``get_*_workspace_size`` with the plan's
workspace need, so a framework that allocates what the handle asks for gives
the plan exactly its workspace. A caller workspace that is too small (or none)
is made up from the backend's workspace pool (or a WD segment).

An optional ``layer_id`` (keyword) names the layer a call belongs to; kernels
are the (layer, direction) pairs seen so far (or registered with
:meth:`HandleEngine.register`). :meth:`HandleEngine.optimize_wd` re-plans all
of them jointly under one total workspace (WD, by the planner it was handed)
and gives each its own segment of one allocation.

Everything is validated before any device work: the descriptors must agree
(one data type for x, w and y; y's dims what x, w and the convolution give; one
layout), and the data type, math type, group count, paddings, strides and
dilations must be ones mucudnn supports; outputs must not overlap inputs.

This class takes its :class:`~mucudnn.exec.planning.Planner` from the caller;
:class:`mucudnn.MicroBatchHandle` (``api/handle.py``) is the public one that builds
the optimizer's.

Example (GPU; pointers as ints)::

    from mucudnn._cudnn import TensorDescriptor, FilterDescriptor, ConvolutionDescriptor
    h = mu.MicroBatchHandle("cudnn", workspace_limit=64 << 20)
    need = h.get_convolution_forward_workspace_size(xd, wd, cd, yd, algo=0)
    h.convolution_forward(1.0, xd, x.data_ptr(), wd, w.data_ptr(), cd, 0, ws_ptr, need,
                          0.0, yd, y.data_ptr(), layer_id="conv1")
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from ..backends.base import Backend
from ..errors import InvalidTypeError, InvalidValueError, UnsupportedDtypeError
from ..typing_aliases import AddressOrArray, DescriptorLike
from ..problem import MATH_MODES, ConvProblem, Direction, Plan, conv_dtype, from_canonical, \
    packed_strides
from .kernel import Kernel
from .planning import Planner
from .workspace import SegmentedWorkspace, get_pool

__all__ = ["HandleEngine", "problem_from_descriptors", "DescriptorInfo"]

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


#: cuDNN data type names (cudnnDataType_t without the prefix) of the supported dtypes.
_CUDNN_DTYPES = {"FLOAT": "float32", "DOUBLE": "float64", "HALF": "float16",
                 "BFLOAT16": "bfloat16"}


def _dtype_of(v: Any, what: str) -> str | None:
    """Our dtype name for a descriptor's data type (a cuDNN enum, its name or
    value, or a dtype); None when absent. UnsupportedDtypeError naming ``what``
    for anything else (INT8, FP8, ...), never a silent float32."""
    if v is None:
        return None
    name = getattr(v, "name", None)
    if isinstance(v, int) and not isinstance(v, bool) and name is None:
        from_int = {0: "float32", 1: "float64", 2: "float16", 9: "bfloat16"}
        if v in from_int:
            return from_int[v]
        raise UnsupportedDtypeError(f"{what}: data type {v} is not one mucudnn convolves "
                                    f"(supported: {sorted(_CUDNN_DTYPES.values())})")
    key = str(name if name is not None else v).upper()
    key = key.replace("CUDNN_DATA_", "").replace("DATATYPE.", "")
    if key in _CUDNN_DTYPES:
        return _CUDNN_DTYPES[key]
    try:
        return conv_dtype(v, what)
    except UnsupportedDtypeError:
        raise UnsupportedDtypeError(
            f"{what}: data type {v!r} is not one mucudnn convolves (supported: "
            f"{sorted(_CUDNN_DTYPES.values())})") from None


def _tensor(desc: Any) -> dict:
    info = _as_dict(_first(desc, ("get", "info", "describe")))
    dims = info.get("dims") or info.get("shape") or _first(desc, ("dims", "dim", "shape"))
    strides = info.get("strides") or _first(desc, ("strides", "stride"))
    dtype = info.get("dtype") or info.get("data_type") or _first(desc, ("dtype", "data_type", "dtype_name"))
    fmt = info.get("format") or info.get("layout") or _first(desc, ("format", "layout", "tensor_format"))
    return {"dims": _int_tuple("dims", dims), "strides": _int_tuple("strides", strides),
            "dtype": dtype, "format": fmt}


def _int_tuple(what: str, values: Any) -> tuple[int, ...] | None:
    """``values`` as ints, refusing fractions and bools (never truncating)."""
    if values is None:
        return None
    out = []
    for v in values:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise InvalidTypeError(f"descriptor {what}: expected ints, got {v!r} in {tuple(values)!r}")
        out.append(int(v))
    return tuple(out)


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
            raise InvalidValueError(f"conv_desc: mode {mode!r} is not supported; expected "
                             "CROSS_CORRELATION (what frameworks call convolution)")
        out.update(padding=pad, stride=stride, dilation=dil, compute_type=ct)
    else:
        out.update(padding=pick(("pads", "padding", "pad", "paddings")),
                   stride=pick(("strides", "stride", "filter_strides")),
                   dilation=pick(("dilations", "dilation")),
                   compute_type=pick(("compute_type", "data_type", "dtype")))
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
        raise InvalidValueError(f"descriptor: strides {strides} for dims {dims} are not a packed "
                         f"{cf} or {cl} tensor")
    if fmt is not None and _is_channels_last(fmt):
        return cl
    return cf


_MATH = {0: "default", 1: "tensor_op", 2: "tensor_op_allow_conversion", 3: "fma"}


def _math_of(v: Any) -> str:
    """Our math mode for a cudnnMathType_t (enum, name or value); ValueError otherwise."""
    if v is None:
        return "default"
    name = getattr(v, "name", None)
    if name is not None:
        return _math_of(str(name))
    if isinstance(v, str):
        s = v.lower().replace("cudnn_", "").replace("_math", "")
        if s in MATH_MODES:
            return s
    elif not isinstance(v, bool) and hasattr(v, "__index__") and int(v) in _MATH:
        return _MATH[int(v)]
    raise InvalidValueError(f"conv_desc: math type {v!r} is not a cudnnMathType_t (expected one of "
                     f"{sorted(_MATH)} or {list(MATH_MODES)})")


def problem_from_descriptors(x_desc: DescriptorLike, w_desc: DescriptorLike, conv_desc: DescriptorLike,
                             y_desc: DescriptorLike = None) -> ConvProblem:
    """Rebuild the ConvProblem that a cuDNN call's descriptors describe.

    ``x_desc``/``y_desc`` are tensor descriptors (dims in N, C, spatial order
    with strides that tell the layout), ``w_desc`` a filter descriptor (dims
    K, C/groups, spatial and a format), ``conv_desc`` a convolution descriptor
    (pads, strides, dilations, groups, compute type, math type). Descriptors
    that carry ``.problem`` (built with ``for_x(problem)`` etc.) are used
    directly when they agree.
    """
    probs: list[ConvProblem] = [
        q for q in (getattr(d, "problem", None) for d in (x_desc, w_desc, conv_desc, y_desc)
                    if d is not None) if isinstance(q, ConvProblem)]
    t = _tensor(x_desc)
    if probs and all(p == probs[0] for p in probs) and (
            t["dims"] is None or t["dims"] == probs[0].x_dims):
        return probs[0]
    f = _tensor(w_desc)
    c = _conv(conv_desc)
    if t["dims"] is None or f["dims"] is None:
        raise InvalidTypeError("descriptors: cannot read dims from the given descriptors "
                        f"({type(x_desc).__name__}, {type(w_desc).__name__})")
    layout = _layout_from(t["dims"], t["strides"], t["format"])
    yt = _tensor(y_desc) if y_desc is not None else None
    dtypes = {n: _dtype_of(d["dtype"], n) for n, d in
              (("x_desc", t), ("w_desc", f), ("y_desc", yt)) if d is not None}
    known = {n: d for n, d in dtypes.items() if d is not None}
    if len(set(known.values())) > 1:
        raise InvalidValueError(f"descriptors: data types differ ({known}); mucudnn convolves one "
                         "data type (a y of another type would be written with the wrong size)")
    dtype = next(iter(known.values()), None)
    if dtype is None:
        raise InvalidValueError("descriptors: no data type given (x_desc, w_desc and y_desc have none)")
    groups = c["groups"]
    groups = 1 if groups is None else groups
    nd = len(t["dims"]) - 2

    def tup(v: Any, default: int) -> Any:
        if v is None:
            return default
        return tuple(v)[:nd] if not isinstance(v, int) else v

    compute = _dtype_of(c["compute_type"], "conv_desc") if c["compute_type"] is not None \
        else None
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
        raise InvalidValueError(f"w_desc: filter format {_format_name(f['format'])} does not match "
                         f"x_desc's {layout} layout; mixed layouts are not supported")
    if yt is not None:
        yd = yt["dims"]
        if yd is not None and tuple(yd) != p.y_dims:
            raise InvalidValueError(f"y_desc: dims {tuple(yd)} do not match the convolution's output "
                             f"dims {p.y_dims} (from x_desc, w_desc and conv_desc)")
        if yt["strides"] is not None and tuple(yt["strides"]) != packed_strides(p.y_dims, layout):
            raise InvalidValueError(f"y_desc: strides {tuple(yt['strides'])} are not a packed {layout} "
                             f"tensor like x_desc's (expected {packed_strides(p.y_dims, layout)}); "
                             "mixed layouts are not supported")
    return p


# -- the handle ------------------------------------------------------------------------------
_OUT_ROLE = {Direction.FORWARD: "y", Direction.BACKWARD_DATA: "x", Direction.BACKWARD_FILTER: "w"}


class HandleEngine:
    """cuDNN-handle-shaped entry point whose convolutions run micro-batched.

    ``backend``: a complete Backend; ``planner``: decides every plan (see
    :mod:`mucudnn.exec.planning`); ``graph`` as for :class:`mucudnn.Convolution`.
    Calls run on the backend's home stream (``stream``); on a host backend pass
    NumPy arrays where cuDNN takes pointers.
    """

    def __init__(self, backend: Backend, planner: Planner, *, graph: bool = False) -> None:
        self.backend = backend
        self.planner = planner
        self.graph = bool(graph)
        self._kernels: dict[str, Kernel] = {}
        self._segments: SegmentedWorkspace | None = None
        self._lock = threading.RLock()
        self._host = bool(backend.is_host)

    @property
    def workspace_limit(self) -> int | None:
        return self.planner.workspace_limit

    @property
    def stream(self) -> Any:
        """The backend's home stream (every call of this handle runs on it)."""
        return self.backend.stream

    # -- kernels -------------------------------------------------------------------------
    @staticmethod
    def kernel_name(problem: ConvProblem, direction: Direction, layer_id: object = None) -> str:
        d = Direction.parse(direction)
        return f"{layer_id}/{d.value}" if layer_id is not None else f"{problem.key()}/{d.value}"

    def register(self, problem: ConvProblem, direction: "Direction | str",
                 layer_id: object = None) -> Kernel:
        """The kernel for (problem, direction, layer_id), created on first sight."""
        d = Direction.parse(direction)
        name = self.kernel_name(problem, d, layer_id)
        with self._lock:
            k = self._kernels.get(name)
            if k is not None and k.problem != problem:
                log.info("mucudnn: handle: layer %r changed its problem; re-planning", layer_id)
                k = None
            if k is None:
                k = Kernel(self.backend, problem, d, self.planner, graph=self.graph, name=name)
                self._kernels[name] = k
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
        to at most ``total_workspace`` bytes (WD, decided by the planner), and
        give each its own 256-byte-aligned segment of one allocation. Returns
        name -> Plan."""
        if isinstance(total_workspace, bool) or not hasattr(total_workspace, "__index__") \
                or int(total_workspace) < 0:
            raise InvalidValueError(f"total_workspace: expected an int >= 0 (bytes), got "
                             f"{total_workspace!r}")
        total = int(total_workspace)
        with self._lock:
            chosen = self.planner.plan_jointly(
                {n: (k.problem, k.direction) for n, k in self._kernels.items()}, total)
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
    def _address(self, name: str, obj: Any, shape: tuple[int, ...]) -> Any:
        """A launcher address: a device pointer (int) or, on a host backend, the array."""
        if isinstance(obj, bool):
            raise InvalidTypeError(f"{name}: expected a device pointer (int), got {obj!r}")
        if isinstance(obj, (int, np.integer)):
            if self._host:
                raise InvalidTypeError(f"{name}: the {self.backend.name} backend takes NumPy arrays, "
                                "not pointers")
            if int(obj) <= 0:
                raise InvalidValueError(f"{name}: expected a non-null device pointer, got {int(obj)}")
            return int(obj)
        if isinstance(obj, np.ndarray):
            if not self._host:
                raise InvalidTypeError(f"{name}: expected a device pointer (int), got a NumPy array")
            if obj.shape != shape:
                raise InvalidValueError(f"{name}: expected shape {shape}, got {obj.shape}")
            if not obj.flags.c_contiguous:
                raise InvalidValueError(f"{name}: expected a C-contiguous array")
            return obj
        kinds = "a device pointer (int)" + (" or a NumPy array" if self._host else "")
        raise InvalidTypeError(f"{name}: expected {kinds}, got {type(obj).__name__}")

    def _workspace(self, workspace: Any, workspace_size: Any, kernel: Kernel) -> Any:
        """The caller's (address, size) when usable, else a WD segment, else None (pool)."""
        if isinstance(workspace_size, bool) or (workspace_size is not None and (
                not hasattr(workspace_size, "__index__") or int(workspace_size) < 0)):
            raise InvalidValueError(f"workspace_size: expected bytes >= 0, got {workspace_size!r}")
        size = int(workspace_size or 0)
        if workspace is not None and size > 0:
            if self._host:
                if not isinstance(workspace, np.ndarray) or workspace.nbytes < size:
                    raise InvalidValueError("workspace: on a host backend pass a uint8 NumPy array of "
                                     "at least workspace_size bytes")
                return (workspace, size)
            if isinstance(workspace, bool) or not isinstance(workspace, (int, np.integer)):
                raise InvalidTypeError(f"workspace: expected a device pointer (int), got "
                                f"{type(workspace).__name__}")
            if int(workspace) > 0:
                return (int(workspace), size)
        seg = self._segments
        if seg is not None and kernel.name in seg:
            addr, n = seg.address(kernel.name)
            if n > 0:
                return (addr, n)
        return None

    def _run(self, direction: Direction, p: ConvProblem, args: Mapping[str, Any], alpha: float,
             beta: float, workspace: Any, workspace_size: Any, layer_id: Any) -> None:
        for n, v in (("alpha", alpha), ("beta", beta)):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) \
                    or not math.isfinite(float(v)):
                raise InvalidTypeError(f"{n}: expected a finite real number, got {v!r}")
        shapes = {"x": p.x_shape, "w": p.w_shape, "y": p.output_shape}
        addr = {role: self._address(name, obj, shapes[role]) for role, (name, obj) in args.items()}
        # Note: cuDNN writes the output while reading the inputs; overlapping
        # memory gives a silently wrong result, so refuse it here.
        out = _OUT_ROLE[direction]
        size = {r: math.prod(shapes[r]) * p.itemsize for r in shapes}
        for r in shapes:
            if r == out:
                continue
            if self._host:
                overlap = bool(np.may_share_memory(addr[out], addr[r]))
            else:
                overlap = addr[out] < addr[r] + size[r] and addr[r] < addr[out] + size[out]
            if overlap:
                raise InvalidValueError(f"{args[out][0]}: overlaps {args[r][0]} in memory; the "
                                 "output must not alias an input")
        k = self.register(p, direction, layer_id)
        ws = self._workspace(workspace, workspace_size, k)
        k.launch(addr["x"], addr["w"], addr["y"], float(alpha), float(beta), None, ws)

    # -- cuDNN's convolution calls ---------------------------------------------------------
    def convolution_forward(self, alpha: float, x_desc: DescriptorLike, x: AddressOrArray,
                            w_desc: DescriptorLike, w: AddressOrArray, conv_desc: DescriptorLike,
                            algo: object, workspace: "AddressOrArray | None", workspace_size: int,
                            beta: float, y_desc: DescriptorLike, y: AddressOrArray, *,
                            layer_id: object = None) -> None:
        """cudnnConvolutionForward: y = alpha * conv(x, w) + beta * y (``algo`` ignored)."""
        p = problem_from_descriptors(x_desc, w_desc, conv_desc, y_desc)
        self._run(Direction.FORWARD, p, {"x": ("x", x), "w": ("w", w), "y": ("y", y)},
                  alpha, beta, workspace, workspace_size, layer_id)

    def convolution_backward_data(self, alpha: float, w_desc: DescriptorLike, w: AddressOrArray,
                                  dy_desc: DescriptorLike, dy: AddressOrArray,
                                  conv_desc: DescriptorLike, algo: object,
                                  workspace: "AddressOrArray | None", workspace_size: int,
                                  beta: float, dx_desc: DescriptorLike, dx: AddressOrArray, *,
                                  layer_id: object = None) -> None:
        """cudnnConvolutionBackwardData: dx = alpha * conv_bd(w, dy) + beta * dx (``algo`` ignored)."""
        p = problem_from_descriptors(dx_desc, w_desc, conv_desc, dy_desc)
        self._run(Direction.BACKWARD_DATA, p, {"x": ("dx", dx), "w": ("w", w), "y": ("dy", dy)},
                  alpha, beta, workspace, workspace_size, layer_id)

    def convolution_backward_filter(self, alpha: float, x_desc: DescriptorLike, x: AddressOrArray,
                                    dy_desc: DescriptorLike, dy: AddressOrArray,
                                    conv_desc: DescriptorLike, algo: object,
                                    workspace: "AddressOrArray | None", workspace_size: int,
                                    beta: float, dw_desc: DescriptorLike, dw: AddressOrArray, *,
                                    layer_id: object = None) -> None:
        """cudnnConvolutionBackwardFilter: dw = alpha * sum_n conv_bf(x_n, dy_n) + beta * dw
        (``algo`` ignored; beta applies once, micro-batches accumulate)."""
        p = problem_from_descriptors(x_desc, dw_desc, conv_desc, dy_desc)
        self._run(Direction.BACKWARD_FILTER, p, {"x": ("x", x), "w": ("dw", dw), "y": ("dy", dy)},
                  alpha, beta, workspace, workspace_size, layer_id)

    # -- workspace queries -------------------------------------------------------------------
    def _need(self, direction: Direction, p: ConvProblem, layer_id: Any) -> int:
        return self.register(p, direction, layer_id).plan.workspace_bytes

    def get_convolution_forward_workspace_size(self, x_desc: DescriptorLike, w_desc: DescriptorLike,
                                               conv_desc: DescriptorLike, y_desc: DescriptorLike,
                                               algo: object = None, *,
                                               layer_id: object = None) -> int:
        """The plan's workspace need in bytes (whatever ``algo`` says)."""
        p = problem_from_descriptors(x_desc, w_desc, conv_desc, y_desc)
        return self._need(Direction.FORWARD, p, layer_id)

    def get_convolution_backward_data_workspace_size(self, w_desc: DescriptorLike,
                                                     dy_desc: DescriptorLike,
                                                     conv_desc: DescriptorLike,
                                                     dx_desc: DescriptorLike, algo: object = None,
                                                     *, layer_id: object = None) -> int:
        """The plan's workspace need in bytes (whatever ``algo`` says)."""
        p = problem_from_descriptors(dx_desc, w_desc, conv_desc, dy_desc)
        return self._need(Direction.BACKWARD_DATA, p, layer_id)

    def get_convolution_backward_filter_workspace_size(self, x_desc: DescriptorLike,
                                                       dy_desc: DescriptorLike,
                                                       conv_desc: DescriptorLike,
                                                       dw_desc: DescriptorLike, algo: object = None,
                                                       *, layer_id: object = None) -> int:
        """The plan's workspace need in bytes (whatever ``algo`` says)."""
        p = problem_from_descriptors(x_desc, dw_desc, conv_desc, dy_desc)
        return self._need(Direction.BACKWARD_FILTER, p, layer_id)
