"""The functional helpers :func:`conv2d`, :func:`conv3d`,
:func:`conv_backward_data` and :func:`conv_backward_filter`: each call is a
call of a Convolution kept per problem and options (the cache
``api.functional_convolutions``), sized from the arguments as inspected once;
and :func:`clear_caches`, which empties every in-memory cache."""

from __future__ import annotations

from typing import Any, Sequence

from ..backends import Backend, get_backend
from ..caches import LRU, clear_all
from ..errors import InvalidTypeError, InvalidValueError
from ..exec.arrays import ArrayInfo, inspect_array
from ..optimizer.planner import workspace_limit_bytes
from ..optimizer.policies import DEFAULT_POLICY, normalize_policy
from ..optimizer.types import PolicyLike
from ..problem import ConvProblem, Direction
from ..typing_aliases import ArrayLike
from ..units import ByteSize, IntOrTuple
from .convolution import Convolution, Given

__all__ = ["conv2d", "conv3d", "conv_backward_data", "conv_backward_filter", "clear_caches"]

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
def _inspect_once(be: Backend, names: tuple[str, str, str], objs: tuple[Any, Any, Any]
                  ) -> Given:
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
