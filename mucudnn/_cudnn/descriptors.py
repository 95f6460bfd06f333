"""Tensor, filter and convolution descriptors as Python objects.

Each wraps one cuDNN descriptor: created in ``__init__``, freed by ``close()``,
by leaving a ``with`` block, or (safety net) by ``weakref.finalize`` when the
object is collected. ``_as_parameter_`` is the typed opaque handle
(:mod:`~mucudnn._cudnn.structs`), so a descriptor of the wrong kind is refused
by ctypes before cuDNN sees it.

Every int goes through :mod:`~mucudnn._cudnn.intrange` before the call: the
legacy API's fields are C ``int``, and ctypes would silently drop the high
bits of a larger value (a dim of 4294967301 became 5).
:class:`~mucudnn._cudnn.errors.Int32RangeError` names the field and the value,
as it does for a tensor spanning more than 2**31 - 1 elements (cuDNN's own
limit, which it reports as a bare NOT_SUPPORTED); the graph backend
(``backend="cudnn-graph"``, 64-bit dims) handles such tensors.

>>> TensorDescriptor((1, 1, 4294967301, 1))
Traceback (most recent call last):
  ...
mucudnn._cudnn.errors.Int32RangeError: dims[2]: 4294967301 does not fit the int32 field of \
cudnnSetTensorNdDescriptor (-2147483648..2147483647) and would be truncated; the legacy cuDNN \
API stores it in 32 bits. The graph backend (backend="cudnn-graph") takes 64-bit dims and \
handles tensors this large.

The ``for_x`` / ``for_y`` / ``for_w`` / ``for_problem`` constructors build
descriptors from a :class:`~mucudnn.problem.ConvProblem` using the Nd calls with
canonical (N, C, spatial...) dims and :func:`~mucudnn.problem.packed_strides`,
so NCHW, NHWC and the 3-D layouts all come from one place.

:func:`live_descriptors` counts descriptors created and not yet destroyed (for
leak tests).
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Sequence, Union

from ..problem import packed_strides
from ._lifetime import CudnnObject, LiveCount
from .enums import (
    ConvolutionMode, DataType, MathType, TensorFormat,
    data_type, math_type as _math_type,
)
from .errors import CudnnError, IntFieldTypeError
from .intrange import as_int, check_span, int32, int32s
from .prototypes import lib
from .structs import (
    cudnnConvolutionDescriptor_t, cudnnFilterDescriptor_t, cudnnTensorDescriptor_t,
    cudnnTensorTransformDescriptor_t,
)
from ..errors import InvalidValueError, UnsupportedOperationError

__all__ = ["TensorDescriptor", "FilterDescriptor", "ConvolutionDescriptor",
           "TensorTransformDescriptor",
           "live_descriptors", "live_descriptor_counts", "tensor_format", "output_dims",
           "DIM_MAX"]

#: CUDNN_DIM_MAX (cudnn_graph.h).
DIM_MAX = 8

_live = LiveCount("tensor", "filter", "convolution", "transform")


def live_descriptors() -> int:
    """Descriptors created and not yet destroyed, all kinds together."""
    return _live.total()


def live_descriptor_counts() -> dict[str, int]:
    """Live descriptors by kind: ``{"tensor": .., "filter": .., "convolution": ..}``."""
    return _live.by_kind()


def tensor_format(fmt: Union[str, int, TensorFormat, None]) -> TensorFormat:
    """"NCHW"/"NCDHW" -> NCHW, "NHWC"/"NDHWC" -> NHWC; ints and TensorFormats as they are."""
    if fmt is None:
        return TensorFormat.NCHW
    if isinstance(fmt, str):
        f = fmt.upper()
        if f in ("NCHW", "NCDHW", "NCW"):
            return TensorFormat.NCHW
        if f in ("NHWC", "NDHWC", "NWC"):
            return TensorFormat.NHWC
        if f == "NCHW_VECT_C":
            return TensorFormat.NCHW_VECT_C
        raise InvalidValueError(f"format: expected 'NCHW' or 'NHWC' (or a 3-D form), got {fmt!r}")
    return TensorFormat(int(fmt))


def _ints(name: str, values: Sequence[int], function: str,
          n: Optional[int] = None) -> tuple[int, ...]:
    """``values`` as a tuple of ints, each checked for the int32 field ``name[i]``
    of ``function``; ``n`` values when given, else 1..DIM_MAX."""
    try:
        seq = tuple(values)
    except TypeError:
        raise IntFieldTypeError(f"{name}: expected a sequence of ints, got {values!r}") from None
    if n is not None and len(seq) != n:
        raise InvalidValueError(f"{name}: expected {n} values, got {len(seq)} ({seq})")
    if not 1 <= len(seq) <= DIM_MAX:
        raise InvalidValueError(f"{name}: expected 1..{DIM_MAX} values, got {len(seq)} ({seq})")
    return int32s(name, seq, function)


def _strides(strides: Sequence[int], dims: tuple[int, ...], function: str) -> tuple[int, ...]:
    """Strides for ``dims``: the span is checked before each stride's own range,
    so a tensor too large for int32 offsets says so rather than naming a stride."""
    try:
        seq = tuple(strides)
    except TypeError:
        raise IntFieldTypeError(f"strides: expected a sequence of ints, got {strides!r}") from None
    if len(seq) != len(dims):
        raise InvalidValueError(f"strides: expected {len(dims)} values, got {len(seq)} ({seq})")
    seq = tuple(as_int(f"strides[{i}]", v) for i, v in enumerate(seq))
    check_span(dims, seq, function)
    return int32s("strides", seq, function)


def _carray(values: Sequence[int]):
    return (ctypes.c_int * len(values))(*values)


def _packed(dims: Sequence[int], fmt: TensorFormat) -> tuple[int, ...]:
    return packed_strides(dims, "NHWC" if fmt == TensorFormat.NHWC else "NCHW")


def _nd_field(index: int, doc: str) -> Any:
    """A read-only property: item ``index`` of ``self.get_nd()``."""
    return property(lambda self: self.get_nd()[index], doc=doc)


def _size_in_bytes(fn: str) -> Any:
    """A read-only property: the size_t that ``fn`` reports, in bytes."""
    def get(self: "_Descriptor") -> int:
        size = ctypes.c_size_t()
        self._call(fn, ctypes.byref(size))
        return size.value
    return property(get, doc=f"{fn}.")


class _Descriptor(CudnnObject):
    """Owns one legacy-API cuDNN descriptor (lifetime: :class:`CudnnObject`)."""

    _kind = ""
    _live = _live

    def __init__(self) -> None:
        self._create(self._kind)

    def _call(self, fn: str, *args: Any, **details: Any) -> None:
        param = self._as_parameter_  # ValueError when closed
        try:
            getattr(lib, fn)(param, *args)
        except CudnnError as exc:
            exc.add_details(**details)
            raise

    def _describe(self) -> str:
        """The fields shown by ``repr`` (CudnnError when the descriptor is unset)."""
        raise UnsupportedOperationError

    def __repr__(self) -> str:
        name = type(self).__name__
        if self.closed:
            return f"{name}(<closed>)"
        try:
            return f"{name}({self._describe()})"
        except CudnnError:
            return f"{name}(<unset>)"


# -- tensors --------------------------------------------------------------------------

class TensorDescriptor(_Descriptor):
    """cudnnTensorDescriptor_t.

    ``TensorDescriptor(dims, strides=None, dtype="float32", format=None)`` sets an
    Nd descriptor: dims in canonical (N, C, spatial...) order, strides in the same
    order (packed in ``format``'s memory order when omitted). With no ``dims`` the
    descriptor is created unset (use the ``set_*`` methods).
    """

    _kind = "tensor"
    _ctype = cudnnTensorDescriptor_t
    _create_fn = "cudnnCreateTensorDescriptor"
    _destroy_fn = "cudnnDestroyTensorDescriptor"

    def __init__(self, dims: Optional[Sequence[int]] = None,
                 strides: Optional[Sequence[int]] = None, dtype: Any = "float32",
                 format: Any = None) -> None:
        super().__init__()
        if dims is not None:
            try:
                if strides is None:
                    d = _ints("dims", dims, "cudnnSetTensorNdDescriptor")
                    strides = _packed(d, tensor_format(format))
                    check_span(d, strides, "cudnnSetTensorNdDescriptor")
                self.set_nd(dims, strides, dtype)
            except BaseException:
                self.close()
                raise

    # construction from a problem
    @classmethod
    def for_x(cls, problem) -> "TensorDescriptor":
        """x (dx) of ``problem``: canonical dims, packed strides of its layout."""
        return cls._for(problem, problem.x_dims)

    @classmethod
    def for_y(cls, problem) -> "TensorDescriptor":
        """y (dy) of ``problem``."""
        return cls._for(problem, problem.y_dims)

    @classmethod
    def _for(cls, problem, dims: Sequence[int]) -> "TensorDescriptor":
        return cls(dims, packed_strides(dims, problem.layout), problem.dtype)

    # setters
    def set_4d(self, dims: Sequence[int], dtype: Any = "float32", format: Any = "NCHW") -> None:
        """cudnnSetTensor4dDescriptor: dims (n, c, h, w), packed in ``format``."""
        n, c, h, w = _ints("dims", dims, "cudnnSetTensor4dDescriptor", 4)
        check_span((n, c, h, w), _packed((n, c, h, w), tensor_format(format)),
                   "cudnnSetTensor4dDescriptor")
        fmt, dt = tensor_format(format), data_type(dtype)
        self._call("cudnnSetTensor4dDescriptor", fmt, dt, n, c, h, w,
                   dims=(n, c, h, w), format=fmt.name, dtype=dt.name)

    def set_4d_ex(self, dims: Sequence[int], strides: Sequence[int],
                  dtype: Any = "float32") -> None:
        """cudnnSetTensor4dDescriptorEx: dims and strides in (n, c, h, w) order."""
        fn = "cudnnSetTensor4dDescriptorEx"
        d = _ints("dims", dims, fn, 4)
        s = _strides(strides, d, fn)
        dt = data_type(dtype)
        self._call("cudnnSetTensor4dDescriptorEx", dt, *d, *s, dims=d, strides=s, dtype=dt.name)

    def set_nd(self, dims: Sequence[int], strides: Sequence[int], dtype: Any = "float32") -> None:
        """cudnnSetTensorNdDescriptor."""
        fn = "cudnnSetTensorNdDescriptor"
        d = _ints("dims", dims, fn)
        s = _strides(strides, d, fn)
        dt = data_type(dtype)
        self._call("cudnnSetTensorNdDescriptor", dt, len(d), _carray(d), _carray(s),
                   dims=d, strides=s, dtype=dt.name)

    def set_nd_ex(self, dims: Sequence[int], dtype: Any = "float32", format: Any = "NCHW") -> None:
        """cudnnSetTensorNdDescriptorEx: packed in ``format``; dims in canonical order."""
        d = _ints("dims", dims, "cudnnSetTensorNdDescriptorEx")
        check_span(d, _packed(d, tensor_format(format)), "cudnnSetTensorNdDescriptorEx")
        fmt, dt = tensor_format(format), data_type(dtype)
        self._call("cudnnSetTensorNdDescriptorEx", fmt, dt, len(d), _carray(d),
                   dims=d, format=fmt.name, dtype=dt.name)

    # getters
    def get_4d(self) -> tuple[DataType, tuple[int, ...], tuple[int, ...]]:
        """cudnnGetTensor4dDescriptor -> (dtype, (n, c, h, w), (strides...))."""
        dt = ctypes.c_int()
        v = [ctypes.c_int() for _ in range(8)]
        self._call("cudnnGetTensor4dDescriptor", ctypes.byref(dt), *map(ctypes.byref, v))
        return DataType(dt.value), tuple(x.value for x in v[:4]), tuple(x.value for x in v[4:])

    def get_nd(self, max_dims: int = DIM_MAX) -> tuple[DataType, tuple[int, ...], tuple[int, ...]]:
        """cudnnGetTensorNdDescriptor -> (dtype, dims, strides)."""
        dt, nb = ctypes.c_int(), ctypes.c_int()
        d = (ctypes.c_int * max_dims)()
        s = (ctypes.c_int * max_dims)()
        self._call("cudnnGetTensorNdDescriptor", max_dims, ctypes.byref(dt), ctypes.byref(nb), d, s)
        n = min(nb.value, max_dims)
        return DataType(dt.value), tuple(d[:n]), tuple(s[:n])

    dtype = _nd_field(0, "The DataType (cudnnGetTensorNdDescriptor).")
    dims = _nd_field(1, "Dims in canonical order (cudnnGetTensorNdDescriptor).")
    strides = _nd_field(2, "Strides in dims order (cudnnGetTensorNdDescriptor).")
    size_in_bytes = _size_in_bytes("cudnnGetTensorSizeInBytes")

    def _describe(self) -> str:
        dt, d, s = self.get_nd()
        return f"dims={d}, strides={s}, dtype={dt.name}"


# -- filters ----------------------------------------------------------------------------

class FilterDescriptor(_Descriptor):
    """cudnnFilterDescriptor_t.

    ``FilterDescriptor(dims, dtype="float32", format="NCHW")``: dims always in
    (K, C/groups, spatial...) order; ``format`` NHWC says the memory is
    channels-last (K, spatial..., C/groups), as cuDNN's NHWC filter format.
    """

    _kind = "filter"
    _ctype = cudnnFilterDescriptor_t
    _create_fn = "cudnnCreateFilterDescriptor"
    _destroy_fn = "cudnnDestroyFilterDescriptor"

    def __init__(self, dims: Optional[Sequence[int]] = None, dtype: Any = "float32",
                 format: Any = "NCHW") -> None:
        super().__init__()
        if dims is not None:
            try:
                self.set_nd(dims, dtype, format)
            except BaseException:
                self.close()
                raise

    @classmethod
    def for_w(cls, problem) -> "FilterDescriptor":
        """w (dw) of ``problem``: canonical dims; NHWC format for channels-last layouts."""
        return cls(problem.w_dims, problem.dtype, "NHWC" if problem.channels_last else "NCHW")

    def set_4d(self, dims: Sequence[int], dtype: Any = "float32", format: Any = "NCHW") -> None:
        """cudnnSetFilter4dDescriptor: dims (k, c, h, w)."""
        k, c, h, w = _ints("dims", dims, "cudnnSetFilter4dDescriptor", 4)
        fmt, dt = tensor_format(format), data_type(dtype)
        self._call("cudnnSetFilter4dDescriptor", dt, fmt, k, c, h, w,
                   dims=(k, c, h, w), format=fmt.name, dtype=dt.name)

    def set_nd(self, dims: Sequence[int], dtype: Any = "float32", format: Any = "NCHW") -> None:
        """cudnnSetFilterNdDescriptor."""
        d = _ints("dims", dims, "cudnnSetFilterNdDescriptor")
        fmt, dt = tensor_format(format), data_type(dtype)
        self._call("cudnnSetFilterNdDescriptor", dt, fmt, len(d), _carray(d),
                   dims=d, format=fmt.name, dtype=dt.name)

    def get_4d(self) -> tuple[DataType, TensorFormat, tuple[int, ...]]:
        """cudnnGetFilter4dDescriptor -> (dtype, format, (k, c, h, w))."""
        dt, fmt = ctypes.c_int(), ctypes.c_int()
        v = [ctypes.c_int() for _ in range(4)]
        self._call("cudnnGetFilter4dDescriptor", ctypes.byref(dt), ctypes.byref(fmt),
                   *map(ctypes.byref, v))
        return DataType(dt.value), TensorFormat(fmt.value), tuple(x.value for x in v)

    def get_nd(self, max_dims: int = DIM_MAX) -> tuple[DataType, TensorFormat, tuple[int, ...]]:
        """cudnnGetFilterNdDescriptor -> (dtype, format, dims)."""
        dt, fmt, nb = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        d = (ctypes.c_int * max_dims)()
        self._call("cudnnGetFilterNdDescriptor", max_dims, ctypes.byref(dt), ctypes.byref(fmt),
                   ctypes.byref(nb), d)
        n = min(nb.value, max_dims)
        return DataType(dt.value), TensorFormat(fmt.value), tuple(d[:n])

    dtype = _nd_field(0, "The DataType (cudnnGetFilterNdDescriptor).")
    format = _nd_field(1, "The TensorFormat (cudnnGetFilterNdDescriptor).")
    dims = _nd_field(2, "Dims in (K, C/groups, spatial...) order (cudnnGetFilterNdDescriptor).")
    size_in_bytes = _size_in_bytes("cudnnGetFilterSizeInBytes")

    def _describe(self) -> str:
        dt, fmt, d = self.get_nd()
        return f"dims={d}, dtype={dt.name}, format={fmt.name}"


# -- convolutions -------------------------------------------------------------------------

class ConvolutionDescriptor(_Descriptor):
    """cudnnConvolutionDescriptor_t.

    ``ConvolutionDescriptor(padding, stride, dilation, mode=CROSS_CORRELATION,
    compute_type="float32", groups=1, math_type="default")`` sets an Nd descriptor
    (one value per spatial dimension). Cross-correlation is what every deep
    learning framework (and :mod:`tests.reference`) calls convolution.
    """

    _kind = "convolution"
    _ctype = cudnnConvolutionDescriptor_t
    _create_fn = "cudnnCreateConvolutionDescriptor"
    _destroy_fn = "cudnnDestroyConvolutionDescriptor"

    def __init__(self, padding: Optional[Sequence[int]] = None,
                 stride: Optional[Sequence[int]] = None,
                 dilation: Optional[Sequence[int]] = None, *,
                 mode: Any = ConvolutionMode.CROSS_CORRELATION, compute_type: Any = "float32",
                 groups: int = 1, math_type: Any = "default") -> None:
        super().__init__()
        if padding is None and stride is None and dilation is None:
            return
        try:
            nd = len(padding if padding is not None else stride if stride is not None
                     else dilation)  # type: ignore[arg-type]
            self.set_nd(padding if padding is not None else (0,) * nd,
                        stride if stride is not None else (1,) * nd,
                        dilation if dilation is not None else (1,) * nd,
                        mode=mode, compute_type=compute_type)
            if groups != 1:
                self.group_count = groups
            self.math_type = math_type
        except BaseException:
            self.close()
            raise

    @classmethod
    def for_problem(cls, problem, math_type: Any = None) -> "ConvolutionDescriptor":
        """Padding, stride, dilation, groups, compute type of ``problem``; math type
        ``math_type`` (a cudnnMathType_t value or a ConvProblem math name), else
        ``problem.math``."""
        return cls(problem.padding, problem.stride, problem.dilation,
                   mode=ConvolutionMode.CROSS_CORRELATION,
                   compute_type=data_type(problem.compute_type), groups=problem.groups,
                   math_type=problem.math if math_type is None else math_type)

    def set_2d(self, padding: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
               mode: Any = ConvolutionMode.CROSS_CORRELATION,
               compute_type: Any = "float32") -> None:
        """cudnnSetConvolution2dDescriptor."""
        fn = "cudnnSetConvolution2dDescriptor"
        p = _ints("padding", padding, fn, 2)
        s = _ints("stride", stride, fn, 2)
        d = _ints("dilation", dilation, fn, 2)
        m, ct = ConvolutionMode(int(mode)), data_type(compute_type)
        self._call("cudnnSetConvolution2dDescriptor", *p, *s, *d, m, ct,
                   padding=p, stride=s, dilation=d, mode=m.name, compute_type=ct.name)

    def set_nd(self, padding: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
               mode: Any = ConvolutionMode.CROSS_CORRELATION,
               compute_type: Any = "float32") -> None:
        """cudnnSetConvolutionNdDescriptor."""
        fn = "cudnnSetConvolutionNdDescriptor"
        p = _ints("padding", padding, fn)
        s = _ints("stride", stride, fn, len(p))
        d = _ints("dilation", dilation, fn, len(p))
        m, ct = ConvolutionMode(int(mode)), data_type(compute_type)
        self._call("cudnnSetConvolutionNdDescriptor", len(p), _carray(p), _carray(s),
                   _carray(d), m, ct,
                   padding=p, stride=s, dilation=d, mode=m.name, compute_type=ct.name)

    def get_2d(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int],
                              ConvolutionMode, DataType]:
        """cudnnGetConvolution2dDescriptor -> (padding, stride, dilation, mode, compute_type)."""
        v = [ctypes.c_int() for _ in range(6)]
        m, ct = ctypes.c_int(), ctypes.c_int()
        self._call("cudnnGetConvolution2dDescriptor", *map(ctypes.byref, v),
                   ctypes.byref(m), ctypes.byref(ct))
        x = [i.value for i in v]
        return ((x[0], x[1]), (x[2], x[3]), (x[4], x[5]), ConvolutionMode(m.value),
                DataType(ct.value))

    def get_nd(self, max_dims: int = DIM_MAX - 2) -> tuple[tuple[int, ...], tuple[int, ...],
                                                          tuple[int, ...], ConvolutionMode,
                                                          DataType]:
        """cudnnGetConvolutionNdDescriptor -> (padding, stride, dilation, mode, compute_type)."""
        n = ctypes.c_int()
        p = (ctypes.c_int * max_dims)()
        s = (ctypes.c_int * max_dims)()
        d = (ctypes.c_int * max_dims)()
        m, ct = ctypes.c_int(), ctypes.c_int()
        self._call("cudnnGetConvolutionNdDescriptor", max_dims, ctypes.byref(n), p, s, d,
                   ctypes.byref(m), ctypes.byref(ct))
        k = min(n.value, max_dims)
        return (tuple(p[:k]), tuple(s[:k]), tuple(d[:k]), ConvolutionMode(m.value),
                DataType(ct.value))

    @property
    def group_count(self) -> int:
        """cudnnGetConvolutionGroupCount / cudnnSetConvolutionGroupCount."""
        g = ctypes.c_int()
        self._call("cudnnGetConvolutionGroupCount", ctypes.byref(g))
        return g.value

    @group_count.setter
    def group_count(self, groups: int) -> None:
        g = int32("groups", groups, "cudnnSetConvolutionGroupCount")
        self._call("cudnnSetConvolutionGroupCount", g, groups=g)

    @property
    def math_type(self) -> MathType:
        """cudnnGetConvolutionMathType / cudnnSetConvolutionMathType; set with a
        MathType, its int, or a ConvProblem math name ("fma", ...)."""
        m = ctypes.c_int()
        self._call("cudnnGetConvolutionMathType", ctypes.byref(m))
        return MathType(m.value)

    @math_type.setter
    def math_type(self, value: Any) -> None:
        m = _math_type(value)
        self._call("cudnnSetConvolutionMathType", m, math_type=m.name)

    def output_dims(self, x: TensorDescriptor, w: FilterDescriptor) -> tuple[int, ...]:
        """cudnnGetConvolutionNdForwardOutputDim: y dims in canonical order."""
        nb = len(x.dims)
        out = (ctypes.c_int * nb)()
        try:
            lib.cudnnGetConvolutionNdForwardOutputDim(self, x, w, nb, out)
        except CudnnError as exc:
            exc.add_details(x=x.dims, w=w.dims)
            raise
        return tuple(out)

    def output_dims_2d(self, x: TensorDescriptor, w: FilterDescriptor) -> tuple[int, int, int, int]:
        """cudnnGetConvolution2dForwardOutputDim -> (n, c, h, w)."""
        v = [ctypes.c_int() for _ in range(4)]
        try:
            lib.cudnnGetConvolution2dForwardOutputDim(self, x, w, *map(ctypes.byref, v))
        except CudnnError as exc:
            exc.add_details(x=x.dims, w=w.dims)
            raise
        return tuple(i.value for i in v)  # type: ignore[return-value]

    def _describe(self) -> str:
        p, s, d, m, ct = self.get_nd()
        return (f"padding={p}, stride={s}, dilation={d}, mode={m.name}, "
                f"compute_type={ct.name}, groups={self.group_count}, "
                f"math_type={self.math_type.name}")


# -- tensor transforms (padding and folding) -------------------------------------------
#: cudnnFoldingDirection_t
FOLD, UNFOLD = 0, 1


class TensorTransformDescriptor(_Descriptor):
    """cudnnTensorTransformDescriptor_t: how ``cudnnTransformTensorEx`` pads and
    folds a 4-D tensor (Note [folded first layers] in
    :mod:`mucudnn.backends.fold`).

    ``pad_before`` and ``pad_after`` have an entry per dimension (N, C, H, W),
    ``fold`` one per spatial dimension (cuDNN reads them so, as measured on a
    GPU). Folding (``unfold=False``)
    pads, then moves each fold x fold block of pixels into the channels, in
    the order (row phase, column phase, channel); unfolding does the reverse
    and then pads, so negative pads crop what folding added. ``destination``
    is the memory format of the result (NHWC by default).

    >>> t = TensorTransformDescriptor([0, 0, 3, 3], [0, 0, 3, 3], [2, 2])
    >>> t.get()
    ('NHWC', (0, 0, 3, 3), (0, 0, 3, 3), (2, 2), 'fold')
    >>> src = TensorDescriptor((8, 3, 224, 224), format="NHWC")
    >>> dims, strides, nbytes = t.destination_of(src)
    >>> dims, strides[1]  # folded: 12 channels of 115 x 115, channels-last
    ((8, 12, 115, 115), 1)
    >>> t.close(); src.close()
    """

    _kind = "transform"
    _ctype = cudnnTensorTransformDescriptor_t
    _create_fn = "cudnnCreateTensorTransformDescriptor"
    _destroy_fn = "cudnnDestroyTensorTransformDescriptor"

    def __init__(self, pad_before: Sequence[int], pad_after: Sequence[int],
                 fold: Sequence[int], unfold: bool = False, destination: Any = "NHWC") -> None:
        super().__init__()
        try:
            fn = "cudnnSetTensorTransformDescriptor"
            before = _ints("pad_before", pad_before, fn, 4)
            after = _ints("pad_after", pad_after, fn, 4)
            folds = _ints("fold", fold, fn, 2)
            if any(f < 1 for f in folds):
                raise InvalidValueError(f"fold: expected factors >= 1 per spatial dimension, got {folds}")
            fmt = tensor_format(destination)
            pads = ctypes.c_int32 * 4
            self._call(fn, 4, fmt, pads(*before), pads(*after), (ctypes.c_uint32 * 2)(*folds),
                       UNFOLD if unfold else FOLD, pad_before=before, pad_after=after,
                       fold=folds, unfold=bool(unfold))
        except BaseException:
            self.close()
            raise

    def get(self) -> tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...], str]:
        """cudnnGetTensorTransformDescriptor -> (destination format, pad_before,
        pad_after, fold, "fold" or "unfold")."""
        fmt, direction = ctypes.c_int(), ctypes.c_int()
        before, after = (ctypes.c_int32 * 4)(), (ctypes.c_int32 * 4)()
        folds = (ctypes.c_uint32 * 2)()
        self._call("cudnnGetTensorTransformDescriptor", 4, ctypes.byref(fmt), before, after,
                   folds, ctypes.byref(direction))
        return (TensorFormat(fmt.value).name.replace("CUDNN_TENSOR_", ""), tuple(before),
                tuple(after), tuple(folds), "unfold" if direction.value == UNFOLD else "fold")

    def destination_of(self, src: "TensorDescriptor") -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """cudnnInitTransformDest: the (dims, strides, bytes) of the result of
        transforming a tensor described by ``src``."""
        dst = TensorDescriptor()
        try:
            size = ctypes.c_size_t()
            self._call("cudnnInitTransformDest", src, dst, ctypes.byref(size))
            _, dims, strides = dst.get_nd()
            return dims, strides, size.value
        finally:
            dst.close()

    def _describe(self) -> str:
        fmt, before, after, folds, direction = self.get()
        return f"{direction}={folds}, pad_before={before}, pad_after={after}, {fmt}"


def output_dims(problem) -> tuple[int, ...]:
    """cuDNN's own output dims (canonical order) for ``problem``."""
    with TensorDescriptor.for_x(problem) as x, FilterDescriptor.for_w(problem) as w, \
            ConvolutionDescriptor.for_problem(problem) as c:
        return c.output_dims(x, w)


