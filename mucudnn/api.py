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
  allocated for you is a DeviceArray. The call runs on the array's stream
  (``x.stream``, else the backend's home stream ``conv.backend.stream``),
  asynchronously; ``to_numpy``/``backend.synchronize()`` wait.
* CUDA torch tensors, CuPy arrays and any other object with
  ``__cuda_array_interface__`` (Numba, ...): used zero-copy. A given output is
  written in place and returned. With no output given, a torch input gets a
  ``torch.empty`` tensor on the same device and a CuPy input a ``cupy.empty``
  array; other producers get a DeviceArray.
* Anything else with ``__dlpack__``/``__dlpack_device__`` (JAX arrays, CPU
  torch tensors, other libraries' arrays behind the protocol): CUDA arrays are
  used zero-copy, their producer asked to order its pending work before the
  backend's home stream (the call runs there); their memory is held until the
  call's work is done. Host (CPU) arrays are taken as NumPy views, zero-copy,
  and treated as NumPy arrays. A result allocated for you comes back in the
  caller's kind through the producer's ``from_dlpack`` (a JAX array for JAX
  inputs, a torch tensor for CPU torch tensors), else as a DeviceArray (or
  NumPy array); a given output is written in place and returned as given
  (read-only ones, and JAX arrays, which are immutable, are refused).

Streams (Note [streams] in ``backends/_device.py``): a call runs on the
stream its inputs' producer orders work on, as a native library call does:
torch's current stream, CuPy's current stream, a DeviceArray's stream, the v3
``stream`` field of ``__cuda_array_interface__``, the backend's home stream for
DLPack arrays (whose producer ordered its work before it). No event and no
host wait is added (for DLPack arrays, one event marks when their memory may be
given back). For a producer whose stream is unknown (interface v2) the device is
synchronised before the call and the call's stream before returning. Device
arrays must be C-contiguous (no copy is made) and on the backend's device.

Workspace: calls with torch tensors or CuPy arrays take their workspace from
that framework's allocator (so it is counted in ``torch.cuda.memory_allocated``,
and CUDA-graph capture by torch works; for torch one buffer per device and
stream is kept between calls, Note [torch workspace] in exec/arrays.py);
every other call, and every call with ``graph=True``, uses the backend's
workspace pool for the stream (``conv.pool``), which is never more
than the plan's workspace and is freed by ``conv.pool.release()``.

The warm path: a call whose arguments have the kinds, shapes, dtypes, device
and contiguity of the previous call's goes straight to the bound launchers
(for torch tensors a handful of attribute reads); anything that differs takes
the full validation below, so every change is noticed.

Every argument is validated before any device work (planning included):
wrong shapes, dtypes, kinds, devices, contiguity, ``beta != 0`` without an
output all raise ValueError/TypeError naming the argument.

``graph=True`` captures each direction's micro-batch sequence as a CUDA graph
and replays it (re-captured when pointers, alpha or beta change); on the NumPy
backend it is a documented no-op (:attr:`Convolution.graph_active` is False).
"""

from __future__ import annotations

import logging
import math
import numbers
import sys
import threading
from typing import Any, Mapping, Sequence, Union

import numpy as np

from .backends import Backend, get_backend
from .caches import LRU, clear_all
from .cuda import Event, Stream, synchronize as device_synchronize
from .cuda.dlpack import release_after
from .errors import InvalidTypeError, InvalidValueError
from .exec.arrays import UNKNOWN_STREAM, ArrayInfo, check_writable_dlpack, framework_for, \
    inspect_array, overlaps, torch_workspace
from .exec.handle import HandleEngine
from .exec.kernel import Kernel
from .exec.workspace import WorkspacePool, pool_for
from .optimizer.benchmark import check_deterministic
from .optimizer.types import CacheLike, PolicyLike
from .optimizer.planner import Planner, workspace_limit_bytes
from .optimizer.policies import DEFAULT_POLICY, normalize_policy
from .problem import ConvProblem, Direction, Plan
from .typing_aliases import ArrayLike, DTypeLike
from .units import ByteSize

__all__ = ["Convolution", "MicroBatchHandle", "conv2d", "conv3d", "conv_backward_data",
           "conv_backward_filter", "clear_caches"]

log = logging.getLogger("mucudnn")

IntOrTuple = Union[int, Sequence[int]]

#: Per direction: (input 1, input 2, output) as (argument name, forward role).
_ARGS: dict[Direction, tuple[tuple[str, str], tuple[str, str], tuple[str, str]]] = {
    Direction.FORWARD: (("x", "x"), ("w", "w"), ("y", "y")),
    Direction.BACKWARD_DATA: (("dy", "y"), ("w", "w"), ("dx", "x")),
    Direction.BACKWARD_FILTER: (("x", "x"), ("dy", "y"), ("dw", "w")),
}
#: Per direction: where x, w, y (forward roles) sit among (input 1, input 2, output).
_PERM: dict[Direction, tuple[int, int, int]] = {
    Direction.FORWARD: (0, 1, 2),
    Direction.BACKWARD_DATA: (2, 1, 0),
    Direction.BACKWARD_FILTER: (0, 2, 1),
}


def _scalar(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InvalidTypeError(f"{name}: expected a real number, got {v!r}")
    f = float(v)
    if not math.isfinite(f):
        raise InvalidValueError(f"{name}: expected a finite number, got {v!r}")
    return f


class Convolution:
    """A convolution layer whose three directions run micro-batched.

    Parameters mirror :class:`~mucudnn.problem.ConvProblem` (shapes in the
    layout's own order) plus:

    workspace_limit
        Per-kernel workspace limit (default 64 MiB): bytes, a size string such
        as ``"64MiB"``, or None for unlimited.
    policy
        Micro-batch sizes considered: "fitted" (the default: powerOfTwo's
        and, per kernel, the sizes its best configurations stretch to under
        the limit; Note [fitted sizes]), "powerOfTwo" (1, 2, 4, ... and the
        batch), "all", "undivided", or an explicit list of sizes.
    backend
        "numpy", "cudnn", "cudnn-graph", a Backend instance, or None
        (``$MUCUDNN_BACKEND`` if set, else cudnn-graph where a GPU is present,
        else numpy with a one-line notice).
    graph
        Replay each direction's micro-batch sequence as a CUDA graph (a no-op
        on the NumPy backend).
    plans
        Optional ``{Direction: Plan}`` forcing plans (e.g. hand-made mixes of
        sizes and algorithms, or plans loaded from JSON); other directions are
        optimised as usual. A forced plan's workspace is raised to what the
        backend reports, and must fit ``workspace_limit``.
    cache
        Benchmark cache passed to the optimizer (None: the default SQLite file,
        or ``MUCUDNN_CACHE``; False or "off" disables it).
    deterministic
        Plan only with configurations cuDNN marks deterministic, so results are
        bitwise reproducible run to run (default False; Note [deterministic
        plans] in :mod:`mucudnn.optimizer.benchmark`).

    Each direction is planned on first use (by :class:`mucudnn.optimizer.Planner`,
    which remembers plans per process and reads the SQLite cache), so
    constructing a Convolution is cheap.

    >>> conv = Convolution((4, 2, 5, 5), (3, 2, 3, 3), backend="numpy", policy="undivided")
    >>> conv.output_shape
    (4, 3, 3, 3)
    """

    def __init__(self, x_shape: Sequence[int], w_shape: Sequence[int], *,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, dtype: DTypeLike = "float32", layout: str = "NCHW",
                 math: str = "default", workspace_limit: "ByteSize | None" = 64 << 20,
                 policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None,
                 graph: bool = False, plans: "Mapping[Direction, Plan] | Mapping[str, Plan] | None" = None,
                 cache: CacheLike = None, deterministic: bool = False) -> None:
        self.problem = ConvProblem(x_shape, w_shape, stride=stride, padding=padding,
                                   dilation=dilation, groups=groups, dtype=dtype, layout=layout,
                                   math=math)
        if not isinstance(graph, bool):
            raise InvalidTypeError(f"graph: expected True or False, got {graph!r}")
        check_deterministic(deterministic)
        forced: dict[Direction, Plan] = {}
        for k, v in (plans or {}).items():
            d = Direction.parse(k)
            if not isinstance(v, Plan):
                raise InvalidTypeError(f"plans[{d.value}]: expected a Plan, got {type(v).__name__}")
            forced[d] = v
        self.backend: Backend = get_backend(backend)
        self.planner = Planner(self.backend, workspace_limit, policy, cache,
                               deterministic=deterministic)
        self.workspace_limit = self.planner.workspace_limit
        self.deterministic = self.planner.deterministic
        self.policy = self.planner.policy
        self.cache = cache
        self.graph = graph
        self._forced = forced
        self._kernels: dict[Direction, Kernel] = {}
        self._fast: dict[Direction, Any] = {}
        self._lock = threading.RLock()
        if self.graph and not self.backend.supports_graphs:
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
        return self.graph and bool(self.backend.supports_graphs)

    @property
    def pool(self) -> WorkspacePool:
        """The backend's workspace pool on its home stream (shared with every
        other user of the backend on that stream)."""
        return pool_for(self.backend, None)

    def __repr__(self) -> str:
        return (f"Convolution({self.problem!r}, workspace_limit={self.workspace_limit}, "
                f"policy={self.policy!r}, backend={self.backend.name!r}, graph={self.graph})")

    # -- plans ------------------------------------------------------------------------
    def kernel(self, direction: "Direction | str") -> Kernel:
        """The execution state of one direction (plan, bindings, graphs)."""
        d = Direction.parse(direction)
        k = self._kernels.get(d)
        if k is None:
            with self._lock:
                k = self._kernels.get(d)
                if k is None:
                    k = Kernel(self.backend, self.problem, d, self.planner, graph=self.graph,
                               plan=self._forced.get(d))
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
    def forward(self, x: ArrayLike, w: ArrayLike, y: ArrayLike = None, alpha: float = 1.0,
                beta: float = 0.0) -> ArrayLike:
        """``y = alpha * conv(x, w) + beta * y``; returns y (see the module doc for kinds).

        >>> conv = Convolution((2, 1, 3, 3), (1, 1, 3, 3), backend="numpy", policy="undivided")
        >>> x, w = np.ones((2, 1, 3, 3), np.float32), np.ones((1, 1, 3, 3), np.float32)
        >>> float(conv.forward(x, w)[1, 0, 0, 0])
        9.0
        """
        fast = self._fast.get(Direction.FORWARD)
        if fast is not None:
            r = fast(x, w, y, alpha, beta)
            if r is not None:
                return r
        return self._call(Direction.FORWARD, x, w, y, alpha, beta)

    def backward_data(self, dy: ArrayLike, w: ArrayLike, dx: ArrayLike = None, alpha: float = 1.0,
                      beta: float = 0.0) -> ArrayLike:
        """``dx = alpha * conv_backward_data(w, dy) + beta * dx``; returns dx."""
        fast = self._fast.get(Direction.BACKWARD_DATA)
        if fast is not None:
            r = fast(dy, w, dx, alpha, beta)
            if r is not None:
                return r
        return self._call(Direction.BACKWARD_DATA, dy, w, dx, alpha, beta)

    def backward_filter(self, x: ArrayLike, dy: ArrayLike, dw: ArrayLike = None, alpha: float = 1.0,
                        beta: float = 0.0) -> ArrayLike:
        """``dw = alpha * sum_n conv_backward_filter(x_n, dy_n) + beta * dw``; returns dw.

        With ``beta = 0`` the prior dw is never read (it may hold NaN).
        """
        fast = self._fast.get(Direction.BACKWARD_FILTER)
        if fast is not None:
            r = fast(x, dy, dw, alpha, beta)
            if r is not None:
                return r
        return self._call(Direction.BACKWARD_FILTER, x, dy, dw, alpha, beta)

    __call__ = forward

    # -- validation and dispatch (the full path) ---------------------------------------
    def _validate(self, direction: Direction, a: ArrayLike, b: ArrayLike, out: ArrayLike, alpha: Any,
                  beta: Any, given: "_Given" = (None, None, None)
                  ) -> tuple[list[ArrayInfo], ArrayInfo | None, float, float, str]:
        """Check every argument; return (input infos, output info, alpha, beta, mode).

        mode is "host" (NumPy arrays) or "device". No device work happens here,
        but for what a CUDA DLPack producer's ``__dlpack__`` queues (its pending
        work ordered before the backend's home stream). ``given`` holds the
        arguments the functional helpers inspected already (Note [each input
        imported once]).
        """
        alpha = _scalar("alpha", alpha)
        beta = _scalar("beta", beta)
        p = self.problem
        (n1, r1), (n2, r2), (no, ro) = _ARGS[direction]
        # A CUDA DLPack producer orders its pending work before the stream handed
        # to __dlpack__: the backend's home stream (the call runs there, or waits for it).
        be = self.backend
        home = None if be.is_host else int(be.stream.handle)
        g1, g2, go = given
        infos = [g1 or inspect_array(n1, a, stream=home), g2 or inspect_array(n2, b, stream=home)]
        oinfo = (go or inspect_array(no, out, stream=home)) if out is not None else None
        if out is None and beta != 0:
            raise InvalidValueError(
                f"{no}: beta={beta} reads the prior {no}, but no {no} was given; pass {no}= "
                "or use beta=0")
        for info, role in zip(infos + ([oinfo] if oinfo else []), (r1, r2, ro)):
            want = p.shape_of(role)
            if info.shape != want:
                raise InvalidValueError(
                    f"{info.name}: expected shape {want} ({p.layout}) for this Convolution, "
                    f"got {info.shape}")
            if info.dtype != p.dtype:
                raise InvalidValueError(
                    f"{info.name}: expected dtype {p.dtype}, got "
                    f"{info.dtype or getattr(info.obj, 'dtype', '?')}")
        host = [i for i in infos if i.kind == "numpy"]
        dev = [i for i in infos if i.kind != "numpy"]
        if host and dev:
            what = ("a NumPy array" if host[0].source is None
                    else f"host memory ({type(host[0].source).__name__})")
            raise InvalidTypeError(
                f"{host[0].name} is {what} but {dev[0].name} is a device array; "
                "pass all inputs as NumPy arrays or all as device arrays")
        mode = "host" if host else "device"
        if mode == "device" and self.backend.is_host:
            raise InvalidTypeError(
                f"{dev[0].name}: the {self.backend.name} backend takes NumPy arrays, got "
                f"{type(dev[0].obj).__name__}; copy it to the host or use a GPU backend")
        if oinfo is not None:
            if mode == "host" and oinfo.kind != "numpy":
                raise InvalidTypeError(
                    f"{no}: the inputs are NumPy arrays, so {no} must be a NumPy array too, "
                    f"got {type(out).__name__} (pass device inputs for a device output)")
            if mode == "device" and oinfo.kind == "numpy":
                raise InvalidTypeError(
                    f"{no}: the inputs are device arrays, so {no} must be one too, got a NumPy array")
            if not oinfo.contiguous:
                raise InvalidValueError(f"{no}: expected a C-contiguous array (it is written in place)")
            if oinfo.kind == "numpy" and not oinfo.obj.flags.writeable:
                if oinfo.source is not None:  # NumPy imports legacy capsules read-only too
                    raise InvalidValueError(
                        f"{no}: the output is read-only as NumPy imports it through DLPack "
                        "(flagged read-only, or a legacy capsule that cannot say it is "
                        "writable)")
                raise InvalidValueError(f"{no}: the output array is read-only")
            check_writable_dlpack(no, oinfo)
        for info in infos:
            if not info.contiguous and info.kind != "numpy":
                raise InvalidValueError(
                    f"{info.name}: expected a C-contiguous device array (no copy is made); "
                    "call .contiguous() / make a packed copy first")
        if mode == "device":
            want_dev = self.backend.device
            for info in infos + ([oinfo] if oinfo else []):
                if want_dev is not None and info.device is not None and info.device != want_dev:
                    raise InvalidValueError(
                        f"{info.name}: is on CUDA device {info.device}, but the backend runs "
                        f"on device {want_dev}")
        if oinfo is not None:
            for info in infos:
                if overlaps(oinfo, info):
                    raise InvalidValueError(f"{no}: overlaps {info.name} in memory; the output must "
                                     "not alias an input")
        return infos, oinfo, alpha, beta, mode

    def _call(self, direction: Direction, a: ArrayLike, b: ArrayLike, out: ArrayLike, alpha: Any,
              beta: Any, given: "_Given" = (None, None, None)) -> ArrayLike:
        infos, oinfo, alpha, beta, mode = self._validate(direction, a, b, out, alpha, beta,
                                                         given)
        p = self.problem
        ro = _ARGS[direction][2][1]
        i0, i1, i2 = _PERM[direction]
        kernel = self.kernel(direction)
        be = self.backend
        if mode == "host":
            # oinfo.obj is the NumPy array to write (a view of a DLPack output);
            # a given output is returned as the caller passed it.
            arrs = [np.ascontiguousarray(i.obj) for i in infos]
            hout = oinfo.obj if oinfo is not None else None
            if be.is_host:
                res = hout if hout is not None else be.empty(p.shape_of(ro), p.dtype)
                t = (arrs[0], arrs[1], res)
                kernel.launch(t[i0], t[i1], t[i2], alpha, beta)
                return out if out is not None else framework_for(infos[0]).adopt(infos[0], res)
            dev = [be.from_host(a_) for a_ in arrs]
            dout = be.from_host(hout) if (hout is not None and beta != 0) else be.empty(
                p.shape_of(ro), p.dtype)
            t = (be.address(dev[0]), be.address(dev[1]), be.address(dout))
            kernel.launch(t[i0], t[i1], t[i2], alpha, beta, None)
            host = be.to_host(dout)
            if hout is not None:
                np.copyto(hout, host)
                return out
            return framework_for(infos[0]).adopt(infos[0], host)
        # device mode
        fw = framework_for(infos[0])
        stream = fw.stream(infos[0])
        unknown = stream == UNKNOWN_STREAM
        if unknown:  # a producer whose stream we cannot know: let its work finish first
            device_synchronize(be.device)
            stream = None
        result = out if out is not None else fw.empty(infos[0], p.shape_of(ro), p.dtype, be)
        rinfo = oinfo if oinfo is not None else inspect_array(_ARGS[direction][2][0], result)
        self._order_producers(infos + [rinfo], stream)
        ptrs = (infos[0].ptr, infos[1].ptr, rinfo.ptr)
        owners = [i.owner for i in (infos[0], infos[1], rinfo) if i.owner is not None]
        try:
            kernel.launch(ptrs[i0], ptrs[i1], ptrs[i2], alpha, beta, stream,
                          fw.workspace(infos[0]))
        finally:
            if owners:  # DLPack imports: let go once the queued work is done
                release_after(be.stream.handle if stream is None else stream, owners,
                              be.device)
        if unknown:  # ... and finish before returning
            be.synchronize()
        elif infos[0].framework == "torch" and all(i.framework == "torch" for i in infos) \
                and rinfo.framework == "torch":
            self._fast[direction] = _TorchFast(self, direction, infos[0].obj)
        return result if out is not None else fw.adopt(infos[0], result)

    def _order_producers(self, infos: list[ArrayInfo], stream: int | None) -> None:
        """Make ``stream`` wait for arguments produced on other known streams
        (DeviceArrays on several streams, say): events, no host wait."""
        target = self.backend.stream.handle if stream is None else stream
        others = set()
        for i in infos[1:]:
            if i.framework == "torch" and infos[0].framework == "torch":
                continue  # one current stream per device
            s = framework_for(i).stream(i)
            s = self.backend.stream.handle if s is None else s
            if s not in (target, UNKNOWN_STREAM):
                others.add(s)
        for s in sorted(others):
            with Event(timing=False) as ev:
                ev.record(s)
                Stream.wrap(target).wait_event(ev)


# Note [two torch warm paths]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# CUDA torch tensors have two warm paths, one per entry point: _TorchFast here
# (a Convolution called with torch tensors) and _Warm in torch/engine.py
# (mucudnn.torch's functions, modules and autograd). They stay two because
# they start from different things: _TorchFast belongs to one Convolution and
# direction, and only checks that the call matches what its full path
# established; _Warm starts from a conv signature (strides, options, TF32,
# determinism), finds or makes the Convolution, packs channels-last views,
# allocates outputs and serves the backward's two directions (or PyTorch's own
# call). Both end in Kernel.launch with exec.arrays.torch_workspace (Note
# [torch workspace]), which stays in exec/: exec's torch Framework (the full
# path) allocates from it too, and exec/ may not import api or torch/.
class _TorchFast:
    """The warm path for CUDA torch tensors (installed after a full call succeeded).

    Returns None, without side effects, whenever anything differs from what
    the full path established (kind, shape, dtype, device, contiguity, scalar
    types, an output that overlaps an input); the caller then takes the full
    path, which validates and raises. The stream is torch's current stream,
    read per call; the workspace comes from torch's caching allocator.
    """

    __slots__ = ("launch", "sa", "sb", "so", "dtype", "dev", "tdev", "perm", "na", "nb", "no",
                 "empty", "stream_of", "ws")

    def __init__(self, conv: Convolution, direction: Direction, like: ArrayLike) -> None:
        torch = sys.modules["torch"]
        p = conv.problem
        (_, r1), (_, r2), (_, ro) = _ARGS[direction]
        self.launch = conv.kernel(direction).launch
        self.sa, self.sb, self.so = (torch.Size(p.shape_of(r)) for r in (r1, r2, ro))
        self.dtype = like.dtype
        self.dev = like.get_device()
        self.tdev = like.device
        self.perm = _PERM[direction]
        item = like.element_size()
        self.na, self.nb, self.no = (math.prod(p.shape_of(r)) * item for r in (r1, r2, ro))
        self.empty = torch.empty
        self.stream_of = torch._C._cuda_getCurrentRawStream
        self.ws = torch_workspace(self.tdev)

    def __call__(self, a: ArrayLike, b: ArrayLike, out: ArrayLike, alpha: Any, beta: Any) -> ArrayLike:
        dt, dev = self.dtype, self.dev
        try:
            if (a.dtype is not dt or b.dtype is not dt or a.shape != self.sa
                    or b.shape != self.sb or a.get_device() != dev or b.get_device() != dev
                    or not a.is_contiguous() or not b.is_contiguous()
                    or alpha.__class__ is not float or beta.__class__ is not float):
                return None
            pa, pb = a.data_ptr(), b.data_ptr()
            if out is None:
                if beta != 0.0:
                    return None
                out = self.empty(self.so, dtype=dt, device=self.tdev)
                po = out.data_ptr()
            else:
                if (out.dtype is not dt or out.shape != self.so or out.get_device() != dev
                        or not out.is_contiguous()):
                    return None
                po, no = out.data_ptr(), self.no
                if (po < pa + self.na and pa < po + no) or (po < pb + self.nb and pb < po + no):
                    return None
        except AttributeError:  # not a torch tensor
            return None
        t = (pa, pb, po)
        i, j, k = self.perm
        self.launch(t[i], t[j], t[k], alpha, beta, self.stream_of(dev), self.ws)
        return out


class MicroBatchHandle(HandleEngine):
    """cuDNN-handle-shaped entry point whose convolutions run micro-batched
    (see :mod:`mucudnn.exec.handle` for the calls it answers).

    ``backend``: a name ("cudnn-graph", "cudnn", "numpy"), a Backend, or None
    (the default: cudnn-graph where a GPU is present, else numpy). On "numpy",
    pass NumPy arrays where cuDNN takes pointers (tests).
    ``workspace_limit``/``policy``/``cache``/``graph``/``deterministic`` as for
    :class:`Convolution`.

    >>> h = MicroBatchHandle("numpy", workspace_limit="1MiB")
    >>> h.workspace_limit
    1048576
    """

    def __init__(self, backend: "str | Backend | None" = None, *,
                 workspace_limit: "ByteSize | None" = 64 << 20, policy: PolicyLike = DEFAULT_POLICY,
                 graph: bool = False, cache: CacheLike = None, deterministic: bool = False) -> None:
        check_deterministic(deterministic)
        be = get_backend(backend)
        planner = Planner(be, workspace_limit, policy, cache, deterministic=deterministic)
        super().__init__(be, planner, graph=graph)
        self.policy = planner.policy
        self.cache = cache
        self.deterministic = planner.deterministic


# -- functional helpers -----------------------------------------------------------------
#: The functional helpers' Convolution objects (their plans live in the planner's memo).
_CONVS: LRU[tuple, Convolution] = LRU("api.functional_convolutions", 128)


def clear_caches() -> None:
    """Empty every in-memory cache of mucudnn: plans, the functional helpers'
    Convolution objects, bound launchers, descriptors, execution plans, graphs
    and workspace pools (docs/DESIGN.md lists them). The SQLite benchmark cache
    on disk is untouched (``mucudnn.BenchmarkCache().clear()`` empties it).

    >>> clear_caches()
    """
    clear_all()


# Note [each input imported once]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A DLPack producer may export its data once only (a stream, a consumed buffer),
# and each export of a CUDA one orders its work before a stream again. So the
# functional helpers inspect each argument once, with the stream the call runs
# on (the backend's home stream, as Convolution does), size their Convolution
# from what was read, and hand the inspected arguments to the call, which
# validates them without importing again.
_Given = tuple["ArrayInfo | None", "ArrayInfo | None", "ArrayInfo | None"]


def _inspect_once(be: Backend, names: tuple[str, str, str], objs: tuple[Any, Any, Any]
                  ) -> _Given:
    """Each argument inspected once (Note [each input imported once]); None for no output."""
    home = None if be.is_host else int(be.stream.handle)
    i1, i2, io = (None if o is None else inspect_array(n, o, stream=home)
                  for n, o in zip(names, objs))
    return i1, i2, io


def _array_dtype(info: ArrayInfo | None) -> str:
    assert info is not None
    if info.dtype is None:
        raise InvalidValueError(
            f"{info.name}: unsupported dtype {getattr(info.obj, 'dtype', '?')}")
    return info.dtype


def _get_conv(x_shape: Sequence[int], w_shape: Sequence[int], *, stride: Any, padding: Any,
              dilation: Any, groups: int, dtype: str, layout: str, math: str,
              workspace_limit: "ByteSize | None", policy: PolicyLike, backend: Backend,
              graph: bool) -> Convolution:
    be = backend
    p = ConvProblem(x_shape, w_shape, stride=stride, padding=padding, dilation=dilation,
                    groups=groups, dtype=dtype, layout=layout, math=math)
    key = (p, workspace_limit_bytes(workspace_limit), normalize_policy(policy), id(be),
           bool(graph))
    conv = _CONVS.get(key)
    if conv is None or conv.backend is not be:
        conv = Convolution(p.x_shape, p.w_shape, stride=p.stride, padding=p.padding,
                           dilation=p.dilation, groups=p.groups, dtype=p.dtype,
                           layout=p.layout, math=p.math, workspace_limit=workspace_limit,
                           policy=policy, backend=be, graph=graph)
        _CONVS.put(key, conv)
    return conv


def _check_layout(layout: str, nd: int, fn: str) -> str:
    if not isinstance(layout, str):
        raise InvalidTypeError(f"layout: expected a string, got {layout!r}")
    lay = layout.upper()
    ok = ("NCHW", "NHWC") if nd == 2 else ("NCDHW", "NDHWC")
    if lay not in ok:
        raise InvalidValueError(f"layout: {fn} takes one of {list(ok)}, got {layout!r}")
    return lay


def _convnd(nd: int, fn: str, x: ArrayLike, w: ArrayLike, *, stride: IntOrTuple,
            padding: IntOrTuple, dilation: IntOrTuple, groups: int, layout: str, math: str,
            workspace_limit: int | None, policy: PolicyLike, backend: "str | Backend | None",
            alpha: float, beta: float, out: ArrayLike, graph: bool) -> ArrayLike:
    lay = _check_layout(layout, nd, fn)
    be = get_backend(backend)
    given = _inspect_once(be, ("x", "w", "y"), (x, w, out))
    assert given[0] is not None and given[1] is not None
    conv = _get_conv(given[0].shape, given[1].shape, stride=stride, padding=padding,
                     dilation=dilation, groups=groups, dtype=_array_dtype(given[0]), layout=lay,
                     math=math, workspace_limit=workspace_limit, policy=policy, backend=be,
                     graph=graph)
    return conv._call(Direction.FORWARD, x, w, out, alpha, beta, given)


def conv2d(x: ArrayLike, w: ArrayLike, *, stride: IntOrTuple = 1, padding: IntOrTuple = 0,
           dilation: IntOrTuple = 1, groups: int = 1, layout: str = "NCHW",
           math: str = "default", workspace_limit: int | None = 64 << 20,
           policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None, alpha: float = 1.0,
           beta: float = 0.0, out: ArrayLike = None, graph: bool = False) -> ArrayLike:
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


def conv3d(x: ArrayLike, w: ArrayLike, *, stride: IntOrTuple = 1, padding: IntOrTuple = 0,
           dilation: IntOrTuple = 1, groups: int = 1, layout: str = "NCDHW",
           math: str = "default", workspace_limit: int | None = 64 << 20,
           policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None, alpha: float = 1.0,
           beta: float = 0.0, out: ArrayLike = None, graph: bool = False) -> ArrayLike:
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


def conv_backward_data(dy: ArrayLike, w: ArrayLike, x_shape: Sequence[int], *, stride: IntOrTuple = 1,
                       padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1,
                       layout: str | None = None, math: str = "default",
                       workspace_limit: int | None = 64 << 20, policy: PolicyLike = DEFAULT_POLICY,
                       backend: "str | Backend | None" = None, alpha: float = 1.0, beta: float = 0.0,
                       out: ArrayLike = None, graph: bool = False) -> ArrayLike:
    """Gradient of the convolution with respect to its input: dx of shape ``x_shape``.

    ``layout`` defaults to NCHW (4-D w) or NCDHW (5-D w).

    >>> import numpy as np
    >>> dx = conv_backward_data(np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 3, 3), np.float32),
    ...                         (1, 1, 5, 5), backend="numpy")
    >>> float(dx[0, 0, 2, 2]), float(dx[0, 0, 0, 0])
    (9.0, 1.0)
    """
    be = get_backend(backend)
    given = _inspect_once(be, ("dy", "w", "dx"), (dy, w, out))
    assert given[1] is not None
    ws = given[1].shape
    conv = _get_conv(tuple(x_shape), ws, stride=stride, padding=padding, dilation=dilation,
                     groups=groups, dtype=_array_dtype(given[0]),
                     layout=_layout_for(layout, len(ws)), math=math,
                     workspace_limit=workspace_limit, policy=policy, backend=be, graph=graph)
    return conv._call(Direction.BACKWARD_DATA, dy, w, out, alpha, beta, given)


def conv_backward_filter(x: ArrayLike, dy: ArrayLike, w_shape: Sequence[int], *, stride: IntOrTuple = 1,
                         padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1,
                         layout: str | None = None, math: str = "default",
                         workspace_limit: int | None = 64 << 20, policy: PolicyLike = DEFAULT_POLICY,
                         backend: "str | Backend | None" = None, alpha: float = 1.0, beta: float = 0.0,
                         out: ArrayLike = None, graph: bool = False) -> ArrayLike:
    """Gradient of the convolution with respect to its filter: dw of shape ``w_shape``.

    >>> import numpy as np
    >>> dw = conv_backward_filter(np.ones((2, 1, 3, 3), np.float32), np.ones((2, 1, 1, 1), np.float32),
    ...                           (1, 1, 3, 3), backend="numpy")
    >>> dw.ravel().tolist()[:3]
    [2.0, 2.0, 2.0]
    """
    be = get_backend(backend)
    given = _inspect_once(be, ("x", "dy", "dw"), (x, dy, out))
    assert given[0] is not None
    xs = given[0].shape
    conv = _get_conv(xs, tuple(w_shape), stride=stride, padding=padding, dilation=dilation,
                     groups=groups, dtype=_array_dtype(given[0]),
                     layout=_layout_for(layout, len(xs)), math=math,
                     workspace_limit=workspace_limit, policy=policy, backend=be, graph=graph)
    return conv._call(Direction.BACKWARD_FILTER, x, dy, out, alpha, beta, given)
