"""Convolution: a layer whose three directions run micro-batched, each planned on
first use, and the full path of its calls: every argument checked before any
device work, then the kernel launched on the stream its inputs' producer
orders work on. What a call takes (array kinds, streams, workspace) is
:mod:`mucudnn.api`'s overview."""

from __future__ import annotations

import logging
import math
import numbers
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from ..backends import Backend, get_backend
from ..cuda import Event, Stream, synchronize as device_synchronize
from ..cuda.dlpack import release_after
from ..errors import InvalidTypeError, InvalidValueError
from ..exec.arrays import UNKNOWN_STREAM, ArrayInfo, check_writable_dlpack, framework_for, \
    inspect_array, overlaps
from ..exec.kernel import Kernel
from ..exec.workspace import WorkspacePool, pool_for
from ..optimizer.benchmark import check_deterministic
from ..optimizer.types import CacheLike, PolicyLike
from ..optimizer.planner import Planner
from ..optimizer.policies import DEFAULT_POLICY
from ..problem import ConvProblem, Direction, Plan
from ..typing_aliases import ArrayLike, DTypeLike
from ..units import ByteSize, IntOrTuple
from .torch_fast import TorchFast

__all__ = ["Convolution", "Given"]

log = logging.getLogger("mucudnn")

#: The arguments a caller inspected already (input 1, input 2, output; None
#: where not), which the call validates without importing them again (Note
#: [each input imported once]).
Given = tuple["ArrayInfo | None", "ArrayInfo | None", "ArrayInfo | None"]

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
                  beta: Any, given: Given = (None, None, None)
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
              beta: Any, given: Given = (None, None, None)) -> ArrayLike:
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
            shapes = tuple(p.shape_of(role) for _, role in _ARGS[direction])
            self._fast[direction] = TorchFast(kernel.launch, shapes, _PERM[direction],
                                              infos[0].obj)
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

