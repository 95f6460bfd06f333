"""The functional helpers :func:`conv1d`, :func:`conv2d`, :func:`conv3d`,
:func:`conv_transpose1d`/``2d``/``3d``, :func:`conv_backward_data` and
:func:`conv_backward_filter`: each call is a
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
from ..problem import ConvProblem, Direction, transposed_spatial
from ..typing_aliases import ArrayLike
from ..units import ByteSize, IntOrTuple, int_tuple
from .convolution import Convolution, Given

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "conv_backward_data", "conv_backward_filter", "clear_caches"]

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


# Note [1-D arrays as height-1 views]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# cuDNN has no 1-D convolution; a 1-D one is the 2-D one of height 1 (as
# PyTorch runs ``conv1d`` on cuDNN). So :func:`conv1d` and the 1-D forms of
# the backward helpers reshape each array to its height-1 4-D view (NCL ->
# NCHW and NLC -> NHWC: a unit axis before the length; the filter (K, C/g, k)
# or (K, k, C/g) alike), put stride 1, padding 0 and dilation 1 before the
# length's, run the 2-D problem, and return the result with the unit axis
# dropped. Inserting a unit axis is a view in NumPy, CuPy and torch whatever
# the strides (and a DeviceArray is contiguous), so nothing is copied and a
# given output (``out``) is written through its view; the 2-D call refuses a
# non-contiguous one, as for any output. Each array is inspected once, by
# that call (Note [each input imported once]).
_LAYOUTS_1D = {"NCL": "NCHW", "NLC": "NHWC"}


def _layout_1d(layout: Any) -> str:
    """The 2-D layout a 1-D ``layout`` runs in (Note [1-D arrays as height-1 views])."""
    if not isinstance(layout, str):
        raise InvalidTypeError(f"layout: expected a string, got {layout!r}")
    lay = _LAYOUTS_1D.get(layout.upper())
    if lay is None:
        raise InvalidValueError(f"layout: 1-D convolutions take one of {list(_LAYOUTS_1D)}, "
                                f"got {layout!r}")
    return lay


def _unit_axis(layout: str) -> int:
    """Where a 1-D array gets its unit axis in the 2-D ``layout``."""
    return 2 if layout == "NCHW" else 1


def _lifted_shape(name: str, shape: Sequence[int], layout: str) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3:
        raise InvalidValueError(f"{name}: expected 3 dimensions for a 1-D convolution, got "
                                f"shape {shape}")
    a = _unit_axis(layout)
    return shape[:a] + (1,) + shape[a:]


def _lifted(name: str, array: ArrayLike, layout: str) -> ArrayLike:
    """``array``'s height-1 view (Note [1-D arrays as height-1 views])."""
    reshape = getattr(array, "reshape", None)
    if reshape is None or not hasattr(array, "shape"):
        raise InvalidTypeError(f"{name}: a 1-D convolution needs an array with shape and reshape "
                               f"(NumPy, CuPy, torch, JAX, DeviceArray), got {type(array).__name__}")
    return reshape(_lifted_shape(name, array.shape, layout))


def _lifted_out(out: ArrayLike, name: str, layout: str) -> ArrayLike:
    """``out``'s height-1 view, which the call writes through (None: no output given)."""
    return None if out is None else _lifted(name, out, layout)


def _dropped(array: ArrayLike, layout: str) -> ArrayLike:
    """A height-1 result with its unit axis dropped."""
    a = _unit_axis(layout)
    shape = tuple(array.shape)
    return array.reshape(shape[:a] + shape[a + 1:])


def _three_dims(shape: Any) -> bool:
    """Whether ``shape`` (a shape argument as given) has three dimensions."""
    try:
        return len(shape) == 3
    except TypeError:
        return False


def _params_1d(stride: Any, padding: Any, dilation: Any) -> tuple[tuple, tuple, tuple]:
    """1-D stride, padding and dilation with the unit height's put first."""
    return ((1,) + int_tuple("stride", stride, 1, 1, one_for_all=True),
            (0,) + int_tuple("padding", padding, 1, 0, one_for_all=True),
            (1,) + int_tuple("dilation", dilation, 1, 1, one_for_all=True))


def _backward_1d(fn: Any, names: tuple[str, str, str, str], a: ArrayLike, b: ArrayLike,
                 shape: Sequence[int], layout: str | None, params: tuple[Any, Any, Any],
                 out: ArrayLike, **options: Any) -> ArrayLike:
    """The 1-D form of the backward helper ``fn`` (Note [1-D arrays as height-1
    views]): ``fn`` on the height-1 views of its two arrays (``names``: theirs,
    the shape argument's and the output's), the result's unit axis dropped."""
    lay = _layout_1d("NCL" if layout is None else layout)
    st, pad, dil = _params_1d(*params)
    res = fn(_lifted(names[0], a, lay), _lifted(names[1], b, lay),
             _lifted_shape(names[2], shape, lay), stride=st, padding=pad, dilation=dil,
             layout=lay, out=_lifted_out(out, names[3], lay), **options)
    return out if out is not None else _dropped(res, lay)


def conv1d(x: ArrayLike, w: ArrayLike, *, stride: IntOrTuple = 1, padding: IntOrTuple = 0,
           dilation: IntOrTuple = 1, groups: int = 1, layout: str = "NCL",
           math: str = "default", workspace_limit: int | None = 64 << 20,
           policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None,
           alpha: float = 1.0, beta: float = 0.0, out: ArrayLike = None,
           graph: bool = False) -> ArrayLike:
    """1-D convolution, micro-batched: the 2-D one of height 1 (Note [1-D
    arrays as height-1 views]).

    ``x`` is (N, C, L) or, with ``layout="NLC"``, (N, L, C); ``w`` (K,
    C/groups, k) or (K, k, C/groups). The arrays are viewed, not copied (a
    given ``out`` is written through its view). Otherwise as :func:`conv2d`.

    >>> import numpy as np
    >>> y = conv1d(np.ones((2, 3, 7), np.float32), np.ones((4, 3, 3), np.float32), stride=2,
    ...            padding=1, backend="numpy")
    >>> y.shape, y[0, 0].tolist()
    ((2, 4, 4), [6.0, 9.0, 9.0, 6.0])
    """
    lay = _layout_1d(layout)
    st, pad, dil = _params_1d(stride, padding, dilation)
    y = _convnd(2, "conv1d", _lifted("x", x, lay), _lifted("w", w, lay), stride=st,
                padding=pad, dilation=dil, groups=groups, layout=lay, math=math,
                workspace_limit=workspace_limit, policy=policy, backend=backend, alpha=alpha,
                beta=beta, out=_lifted_out(out, "y", lay), graph=graph)
    return out if out is not None else _dropped(y, lay)


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

    ``layout`` defaults to NCHW (4-D w) or NCDHW (5-D w); a 3-D ``x_shape`` is
    a 1-D convolution's (NCL by default, or NLC; Note [1-D arrays as height-1
    views]).

    >>> import numpy as np
    >>> dx = conv_backward_data(np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 3, 3), np.float32),
    ...                         (1, 1, 5, 5), backend="numpy")
    >>> float(dx[0, 0, 2, 2]), float(dx[0, 0, 0, 0])
    (9.0, 1.0)
    """
    if _three_dims(x_shape):  # Note [1-D arrays as height-1 views]
        return _backward_1d(conv_backward_data, ("dy", "w", "x_shape", "dx"), dy, w, x_shape,
                            layout, (stride, padding, dilation), out, groups=groups, math=math,
                            workspace_limit=workspace_limit, policy=policy, backend=backend,
                            alpha=alpha, beta=beta, graph=graph)
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

    ``layout`` as in :func:`conv_backward_data`; a 3-D ``w_shape`` is a 1-D
    convolution's (Note [1-D arrays as height-1 views]).

    >>> import numpy as np
    >>> dw = conv_backward_filter(np.ones((2, 1, 3, 3), np.float32), np.ones((2, 1, 1, 1), np.float32),
    ...                           (1, 1, 3, 3), backend="numpy")
    >>> dw.ravel().tolist()[:3]
    [2.0, 2.0, 2.0]
    """
    if _three_dims(w_shape):  # Note [1-D arrays as height-1 views]
        return _backward_1d(conv_backward_filter, ("x", "dy", "w_shape", "dw"), x, dy, w_shape,
                            layout, (stride, padding, dilation), out, groups=groups, math=math,
                            workspace_limit=workspace_limit, policy=policy, backend=backend,
                            alpha=alpha, beta=beta, graph=graph)
    be = get_backend(backend)
    given = _inspect_once(be, ("x", "dy", "dw"), (x, dy, out))
    assert given[0] is not None
    xs = given[0].shape
    conv = _get_conv(xs, tuple(w_shape), stride=stride, padding=padding, dilation=dilation,
                     groups=groups, dtype=_array_dtype(given[0]),
                     layout=_layout_for(layout, len(xs)), math=math,
                     workspace_limit=workspace_limit, policy=policy, backend=be, graph=graph)
    return conv._call(Direction.BACKWARD_FILTER, x, dy, out, alpha, beta, given)


# Note [transposed convolutions on arrays]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A transposed convolution is the backward-data of the convolution it is the
# adjoint of (as PyTorch runs it on cuDNN; Note [transposed convolutions] in
# mucudnn/torch/transposed.py): its weight (C_in, C_out/groups, *k) is that
# convolution's (K, C/groups, *k), and that convolution's input has the
# transposed one's output shape, (in - 1) * stride - 2 * padding + dilation *
# (k - 1) + output_padding + 1 per spatial axis. So the helpers below size the
# problem from the arrays as inspected once and run its backward-data. An
# output padding must be below the stride: one at least the stride has no
# such convolution (its output would be larger than the input given).
def _conv_transposend(nd: int, fn: str, x: ArrayLike, w: ArrayLike, *, stride: IntOrTuple,
                      padding: IntOrTuple, output_padding: IntOrTuple, dilation: IntOrTuple,
                      groups: int, layout: str, math: str, workspace_limit: int | None,
                      policy: PolicyLike, backend: "str | Backend | None", alpha: float,
                      beta: float, out: ArrayLike, graph: bool) -> ArrayLike:
    lay = _check_layout(layout, nd, fn)
    st = int_tuple("stride", stride, nd, 1, one_for_all=True)
    pad = int_tuple("padding", padding, nd, 0, one_for_all=True)
    dil = int_tuple("dilation", dilation, nd, 1, one_for_all=True)
    op = int_tuple("output_padding", output_padding, nd, 0, one_for_all=True)
    if any(o >= s for o, s in zip(op, st)):
        raise InvalidValueError(f"output_padding: expected each value below the stride {st}, "
                                f"got {op}")
    be = get_backend(backend)
    given = _inspect_once(be, ("x", "w", "y"), (x, w, out))
    assert given[0] is not None and given[1] is not None
    xs, ws = tuple(given[0].shape), tuple(given[1].shape)
    last = lay.endswith("C")
    if len(xs) != nd + 2:
        raise InvalidValueError(f"x: expected a {nd + 2}-D array in {lay}, got shape {xs}")
    if len(ws) != nd + 2:
        raise InvalidValueError(f"w: expected a {nd + 2}-D array (C_in, "
                                f"{'*k, C_out/groups' if last else 'C_out/groups, *k'}), "
                                f"got shape {ws}")
    cin, spatial = (xs[-1], xs[1:-1]) if last else (xs[1], xs[2:])
    kernel = ws[1:-1] if last else ws[2:]
    if ws[0] != cin:
        raise InvalidValueError(f"w: expected {cin} input channels first (x has {cin}), got "
                                f"shape {ws}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or cin % groups:
        raise InvalidValueError(f"groups: expected a positive divisor of the input channels "
                                f"({cin}), got {groups!r}")
    size = transposed_spatial(spatial, kernel, st, pad, dil, op)
    if min(size) < 1:
        raise InvalidValueError(f"x: the output size {size} of spatial size {spatial} with "
                                f"padding {pad} is too small")
    cout = (ws[-1] if last else ws[1]) * groups
    shape = (xs[0],) + size + (cout,) if last else (xs[0], cout) + size
    try:
        conv = _get_conv(shape, ws, stride=st, padding=pad, dilation=dil, groups=groups,
                         dtype=_array_dtype(given[0]), layout=lay, math=math,
                         workspace_limit=workspace_limit, policy=policy, backend=be,
                         graph=graph)
    except InvalidValueError as exc:  # the problem's input is the output: say so
        raise InvalidValueError(f"y: the output of shape {shape}, its convolution's input, "
                                f"cannot be made: {exc}") from None
    return conv._call(Direction.BACKWARD_DATA, x, w, out, alpha, beta, given)


def conv_transpose1d(x: ArrayLike, w: ArrayLike, *, stride: IntOrTuple = 1,
                     padding: IntOrTuple = 0, output_padding: IntOrTuple = 0,
                     dilation: IntOrTuple = 1, groups: int = 1, layout: str = "NCL",
                     math: str = "default", workspace_limit: int | None = 64 << 20,
                     policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None,
                     alpha: float = 1.0, beta: float = 0.0, out: ArrayLike = None,
                     graph: bool = False) -> ArrayLike:
    """1-D transposed convolution (see :func:`conv_transpose2d`), run as the 2-D
    one of height 1 (Note [1-D arrays as height-1 views]): ``x`` (N, C_in, L)
    or (N, L, C_in), ``w`` (C_in, C_out/groups, k) or (C_in, k, C_out/groups).

    >>> import numpy as np
    >>> y = conv_transpose1d(np.ones((1, 2, 3), np.float32), np.ones((2, 1, 3), np.float32),
    ...                      stride=2, backend="numpy")
    >>> y.ravel().tolist()
    [2.0, 2.0, 4.0, 2.0, 4.0, 2.0, 2.0]
    """
    lay = _layout_1d(layout)
    st, pad, dil = _params_1d(stride, padding, dilation)
    op = (0,) + int_tuple("output_padding", output_padding, 1, 0, one_for_all=True)
    y = _conv_transposend(2, "conv_transpose1d", _lifted("x", x, lay), _lifted("w", w, lay),
                          stride=st, padding=pad, output_padding=op, dilation=dil,
                          groups=groups, layout=lay, math=math,
                          workspace_limit=workspace_limit, policy=policy, backend=backend,
                          alpha=alpha, beta=beta, out=_lifted_out(out, "y", lay), graph=graph)
    return out if out is not None else _dropped(y, lay)


def conv_transpose2d(x: ArrayLike, w: ArrayLike, *, stride: IntOrTuple = 1,
                     padding: IntOrTuple = 0, output_padding: IntOrTuple = 0,
                     dilation: IntOrTuple = 1, groups: int = 1, layout: str = "NCHW",
                     math: str = "default", workspace_limit: int | None = 64 << 20,
                     policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None,
                     alpha: float = 1.0, beta: float = 0.0, out: ArrayLike = None,
                     graph: bool = False) -> ArrayLike:
    """2-D transposed convolution, micro-batched: the backward-data of the
    convolution it is the adjoint of (Note [transposed convolutions on arrays]).

    ``x`` is (N, C_in, H, W) / (N, H, W, C_in) and ``w`` (C_in, C_out/groups,
    R, S) / (C_in, R, S, C_out/groups), as PyTorch's ``conv_transpose2d``
    takes them; the output (N, C_out, H', W') / (N, H', W', C_out) with H' =
    (H - 1) * stride - 2 * padding + dilation * (R - 1) + output_padding + 1.
    ``output_padding`` must be below the stride. Otherwise as :func:`conv2d`.

    >>> import numpy as np
    >>> y = conv_transpose2d(np.ones((1, 2, 2, 2), np.float32), np.ones((2, 3, 3, 3), np.float32),
    ...                      stride=2, padding=1, output_padding=1, backend="numpy")
    >>> y.shape, float(y[0, 0, 1, 1]), float(y[0, 0, 0, 0])
    ((1, 3, 4, 4), 8.0, 2.0)
    """
    return _conv_transposend(2, "conv_transpose2d", x, w, stride=stride, padding=padding,
                             output_padding=output_padding, dilation=dilation, groups=groups,
                             layout=layout, math=math, workspace_limit=workspace_limit,
                             policy=policy, backend=backend, alpha=alpha, beta=beta, out=out,
                             graph=graph)


def conv_transpose3d(x: ArrayLike, w: ArrayLike, *, stride: IntOrTuple = 1,
                     padding: IntOrTuple = 0, output_padding: IntOrTuple = 0,
                     dilation: IntOrTuple = 1, groups: int = 1, layout: str = "NCDHW",
                     math: str = "default", workspace_limit: int | None = 64 << 20,
                     policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None,
                     alpha: float = 1.0, beta: float = 0.0, out: ArrayLike = None,
                     graph: bool = False) -> ArrayLike:
    """3-D transposed convolution; as :func:`conv_transpose2d` with NCDHW/NDHWC shapes.

    >>> import numpy as np
    >>> y = conv_transpose3d(np.ones((1, 1, 2, 2, 2), np.float32),
    ...                      np.ones((1, 1, 2, 2, 2), np.float32), backend="numpy")
    >>> y.shape, float(y[0, 0, 1, 1, 1])
    ((1, 1, 3, 3, 3), 8.0)
    """
    return _conv_transposend(3, "conv_transpose3d", x, w, stride=stride, padding=padding,
                             output_padding=output_padding, dilation=dilation, groups=groups,
                             layout=layout, math=math, workspace_limit=workspace_limit,
                             policy=policy, backend=backend, alpha=alpha, beta=beta, out=out,
                             graph=graph)
