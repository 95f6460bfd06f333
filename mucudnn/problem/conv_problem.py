"""ConvProblem: everything that determines a convolution's algorithms and cost
(shapes, geometry, data type, layout, math mode), checked when it is made, and
the data types and bounds a problem must keep."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

from ..dtypes import dtype_name
from ..errors import InvalidTypeError, InvalidValueError, UnsupportedDtypeError
from ..typing_aliases import DTypeLike
from ..units import format_bytes, int_tuple, is_integer, shape_tuple
from .dict_form import check_keys, construct
from .layouts import LAYOUTS, channels_last, from_canonical, packed_strides, to_canonical

__all__ = ["ConvProblem", "conv_dtype", "problem_from_dict", "transposed_spatial", "DTYPES",
           "ITEMSIZE",
           "MICRO_BATCH_ALIGNMENT", "MATH_MODES", "MAX_DIM", "MAX_TENSOR_BYTES", "IntOrTuple"]

IntOrTuple = Union[int, Sequence[int]]

#: Supported data types and the compute (accumulation) type each uses by default.
DTYPES: dict[str, str] = {
    "float32": "float32",
    "float16": "float32",
    "bfloat16": "float32",
    "float64": "float64",
}
#: Bytes per element of each data type.
ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
#: The pointer alignment (bytes) micro-batch offsets keep; see ConvProblem.batch_quantum.
MICRO_BATCH_ALIGNMENT = 16
#: Math modes, named after cuDNN's cudnnMathType_t without the prefix.
#: "default" lets the library pick (TF32 tensor cores allowed for float32, as
#: PyTorch does); "fma" forbids tensor cores; "tensor_op" asks for them.
MATH_MODES = ("default", "fma", "tensor_op", "tensor_op_allow_conversion")
#: Exclusive bound of every dimension, padding, stride, dilation and group count
#: (Note [sizes that cannot exist]).
MAX_DIM = 1 << 63
#: Exclusive bound of the bytes of x, w and y (Note [sizes that cannot exist]).
MAX_TENSOR_BYTES = 1 << 42


@dataclass(frozen=True)
class ConvProblem:
    """A convolution problem: shapes, geometry, data type, layout, math mode.

    Shapes are given in the layout's own order: NCHW x is (N, C, H, W) with
    filter (K, C/groups, R, S); NHWC x is (N, H, W, C) with filter
    (K, R, S, C/groups); likewise NCDHW/NDHWC in 3-D.

    >>> p = ConvProblem((256, 96, 27, 27), (256, 96, 5, 5), padding=2)
    >>> p.output_shape
    (256, 256, 27, 27)
    >>> p.with_batch(32).x_shape
    (32, 96, 27, 27)
    """

    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    stride: tuple[int, ...] = 1  # type: ignore[assignment]
    padding: tuple[int, ...] = 0  # type: ignore[assignment]
    dilation: tuple[int, ...] = 1  # type: ignore[assignment]
    groups: int = 1
    dtype: str = "float32"
    layout: str = "NCHW"
    math: str = "default"
    compute_type: str | None = None

    def __init__(self, x_shape: Sequence[int], w_shape: Sequence[int], *,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, dtype: DTypeLike = "float32", layout: str = "NCHW",
                 math: str = "default", compute_type: str | None = None) -> None:
        x = shape_tuple("x_shape", x_shape)
        w = shape_tuple("w_shape", w_shape)
        if not isinstance(layout, str) or layout.upper() not in LAYOUTS:
            raise InvalidValueError(f"layout: expected one of {list(LAYOUTS)}, got {layout!r}")
        layout = layout.upper()
        nd = LAYOUTS[layout]
        if len(x) != nd + 2:
            raise InvalidValueError(
                f"x_shape: layout {layout} needs {nd + 2} dimensions, got {len(x)} ({x})")
        if len(w) != nd + 2:
            raise InvalidValueError(
                f"w_shape: layout {layout} needs {nd + 2} dimensions, got {len(w)} ({w})")
        dtype_name_ = conv_dtype(dtype)
        if compute_type is None:
            compute_type = DTYPES[dtype_name_]
        elif compute_type not in ("float32", "float64", "float16"):
            raise InvalidValueError(
                f"compute_type: expected 'float16', 'float32' or 'float64', got {compute_type!r}")
        if not isinstance(math, str) or math.lower() not in MATH_MODES:
            raise InvalidValueError(f"math: expected one of {list(MATH_MODES)}, got {math!r}")
        if not is_integer(groups):
            raise InvalidTypeError(f"groups: expected a positive int, got {groups!r}")
        groups = int(groups)
        if groups < 1:
            raise InvalidValueError(f"groups: expected a positive int, got {groups}")
        stride_t = int_tuple("stride", stride, nd, 1)
        padding_t = int_tuple("padding", padding, nd, 0)
        dilation_t = int_tuple("dilation", dilation, nd, 1)
        xc = to_canonical(x, layout)
        wc = to_canonical(w, layout)
        if xc[1] != groups * wc[1]:
            raise InvalidValueError(
                f"w_shape: input channels ({xc[1]}) must equal groups ({groups}) x filter "
                f"channels ({wc[1]}); expected filter channels "
                f"{xc[1] // groups if xc[1] % groups == 0 else '?'}"
                f" for x_shape {x}")
        if wc[0] % groups:
            raise InvalidValueError(
                f"w_shape: output channels ({wc[0]}) must be divisible by groups ({groups})")
        set_ = object.__setattr__
        set_(self, "x_shape", x)
        set_(self, "w_shape", w)
        set_(self, "stride", stride_t)
        set_(self, "padding", padding_t)
        set_(self, "dilation", dilation_t)
        set_(self, "groups", groups)
        set_(self, "dtype", dtype_name_)
        set_(self, "layout", layout)
        set_(self, "math", math.lower())
        set_(self, "compute_type", compute_type)
        self._check_fields()
        out = self._spatial_out()
        if any(o < 1 for o in out):
            raise InvalidValueError(
                f"x_shape: output size would be {out} (< 1) for input spatial {xc[2:]}, filter "
                f"{wc[2:]}, padding {padding_t}, stride {stride_t}, dilation {dilation_t}; "
                "expected an input at least as large as the dilated filter")
        self._check_bytes()

    # Note [sizes that cannot exist]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A problem is refused when it is made if no backend could describe it or
    # no memory could hold it, so that it fails at once with its argument's
    # name instead of late, in an allocation (a MemoryError for 14.6 TiB from
    # padding=10**6), a C conversion (an OverflowError for stride=2**63) or
    # after minutes of benchmarking. Every dimension (of x, w and y), padding,
    # stride, dilation and the group count must fit the widest of cuDNN's fields,
    # the graph API's int64 (the legacy API's int32 descriptors check their own
    # fields: Int32RangeError, naming the graph backend), and each of x, w and
    # y must take fewer than 2**42 bytes (4 TiB: over twenty times the memory
    # of the largest GPU, more than any buffer a host here allocates), which
    # also keeps every element offset, product and byte count inside int64.
    # Planning bounds the batch itself (Note [bounded size lists]).
    def _check_fields(self) -> None:
        for name, values in (("x_shape", self.x_shape), ("w_shape", self.w_shape),
                             ("stride", self.stride), ("padding", self.padding),
                             ("dilation", self.dilation), ("groups", (self.groups,))):
            if max(values) >= MAX_DIM:
                raise InvalidValueError(f"{name}: expected values below 2**63 (cuDNN's int64 "
                                        f"fields), got {values if len(values) > 1 else values[0]}")

    def _check_bytes(self) -> None:
        # y too large from the padding alone names the padding, else the input
        bare = [max(1, (i - d * (r - 1) - 1) // s + 1) for i, r, s, d in
                zip(self.x_dims[2:], self.w_dims[2:], self.stride, self.dilation)]
        bare_y = self.itemsize * self.batch * self.w_dims[0] * math.prod(bare)
        y_name = "padding" if bare_y < MAX_TENSOR_BYTES else "x_shape"
        for t, name in (("x", "x_shape"), ("w", "w_shape"), ("y", y_name)):
            nbytes = self.itemsize * math.prod(self.shape_of(t))
            if nbytes >= MAX_TENSOR_BYTES:
                raise InvalidValueError(
                    f"{name}: {t} of shape {self.shape_of(t)} would take {format_bytes(nbytes)} "
                    f"({self.dtype}); a tensor must take less than "
                    f"{format_bytes(MAX_TENSOR_BYTES)} (Note [sizes that cannot exist])")

    # -- geometry ---------------------------------------------------------------
    @property
    def nd(self) -> int:
        """Number of spatial dimensions (2 or 3)."""
        return LAYOUTS[self.layout]

    @property
    def channels_last(self) -> bool:
        return channels_last(self.layout)

    @property
    def batch(self) -> int:
        return self.x_shape[0]

    @property
    def x_dims(self) -> tuple[int, ...]:
        """x shape in canonical (N, C, spatial...) order."""
        return to_canonical(self.x_shape, self.layout)

    @property
    def w_dims(self) -> tuple[int, ...]:
        """Filter shape in canonical (K, C/groups, spatial...) order."""
        return to_canonical(self.w_shape, self.layout)

    @property
    def y_dims(self) -> tuple[int, ...]:
        """Output shape in canonical (N, K, spatial...) order."""
        return (self.x_dims[0], self.w_dims[0]) + self._spatial_out()

    @property
    def x_strides(self) -> tuple[int, ...]:
        """x's element strides in canonical order: packed here; a
        :class:`~mucudnn.problem.slice_problem.SliceProblem`'s are its whole tensor's."""
        return packed_strides(self.x_dims, self.layout)

    @property
    def y_strides(self) -> tuple[int, ...]:
        """y's element strides in canonical order (as :attr:`x_strides`)."""
        return packed_strides(self.y_dims, self.layout)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Output (y) shape in the layout's own order."""
        return from_canonical(self.y_dims, self.layout)

    y_shape = output_shape

    def _spatial_out(self) -> tuple[int, ...]:
        xs = to_canonical(self.x_shape, self.layout)[2:]
        ws = to_canonical(self.w_shape, self.layout)[2:]
        return tuple((i + 2 * p - d * (r - 1) - 1) // s + 1
                     for i, r, p, s, d in zip(xs, ws, self.padding, self.stride, self.dilation))

    def shape_of(self, which: str) -> tuple[int, ...]:
        """Shape of tensor ``"x"``, ``"w"`` or ``"y"`` in the layout's own order."""
        return {"x": self.x_shape, "w": self.w_shape, "y": self.output_shape}[which]

    def extent(self, which: str) -> int:
        """Elements a buffer of tensor ``"x"``, ``"w"`` or ``"y"`` must span for
        its strides: its size here; a slice's whole tensor
        (:class:`~mucudnn.problem.slice_problem.SliceProblem`)."""
        return math.prod(self.shape_of(which))

    def flops(self) -> int:
        """Multiply-adds x 2 of one direction (all three are equal)."""
        y = self.y_dims
        w = self.w_dims
        n = 1
        for v in y:
            n *= v
        for v in w[1:]:
            n *= v
        return 2 * n

    @property
    def itemsize(self) -> int:
        """Bytes per element of ``dtype``."""
        return ITEMSIZE[self.dtype]

    def batch_quantum(self, alignment: int = MICRO_BATCH_ALIGNMENT) -> int:
        """The smallest number of samples whose x and y both span a multiple of
        ``alignment`` bytes.

        A micro-batch at row ``k`` starts ``k`` samples into x and y; if every
        offset is a multiple of this quantum, every micro-batch's pointers are
        as aligned as the whole tensors' (up to ``alignment``).

        Note: cuDNN's kernels can be far slower on pointers aligned to less
        than 16 bytes, and Find times aligned buffers, so a plan with such
        offsets runs slower than predicted: AlexNet conv1's float32 sample is
        618348 bytes (4 mod 16), and its legacy backward passes ran up to
        hundreds of times slower at odd offsets (docs/BENCHMARKS.md).

        >>> ConvProblem((256, 3, 227, 227), (96, 3, 11, 11), stride=4).batch_quantum()
        4
        >>> ConvProblem((8, 64, 56, 56), (64, 64, 3, 3), padding=1).batch_quantum()
        1
        """
        if not is_integer(alignment) or int(alignment) < 1:
            raise InvalidValueError(f"alignment: expected a positive int (bytes), got {alignment!r}")
        a = int(alignment)
        q = 1
        for shape in (self.x_shape, self.output_shape):
            per_sample = self.itemsize * math.prod(shape[1:])
            step = a // math.gcd(per_sample, a)
            q = q * step // math.gcd(q, step)
        return q

    # -- derived problems and keys ---------------------------------------------
    def with_batch(self, n: int) -> "ConvProblem":
        """The same problem with batch size ``n``."""
        if not is_integer(n) or int(n) < 1:
            raise InvalidValueError(f"n: expected a positive batch size, got {n!r}")
        if int(n) == self.batch:
            return self
        return dataclasses.replace(self, x_shape=(int(n),) + self.x_shape[1:])

    def key(self) -> str:
        """A stable string naming every field (batch included), for caches.

        >>> ConvProblem((8, 3, 5, 5), (4, 3, 3, 3)).key()
        'conv2d:x=8x3x5x5:w=4x3x3x3:stride=1x1:pad=0x0:dil=1x1:g=1:float32:acc=float32:NCHW:math=default'
        """
        j = lambda t: "x".join(str(v) for v in t)  # noqa: E731
        return (f"conv{self.nd}d:x={j(self.x_shape)}:w={j(self.w_shape)}:stride={j(self.stride)}"
                f":pad={j(self.padding)}:dil={j(self.dilation)}:g={self.groups}:{self.dtype}"
                f":acc={self.compute_type}:{self.layout}:math={self.math}")

    @classmethod
    def from_key(cls, key: str) -> "ConvProblem":
        """The inverse of :meth:`key`: a cache's problem column back to a problem.

        >>> p = ConvProblem((8, 5, 5, 6), (4, 3, 3, 3), stride=2, groups=2, layout="NHWC")
        >>> ConvProblem.from_key(p.key()) == p
        True
        >>> ConvProblem.from_key("conv2d:x=8x3x5x5")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mucudnn.errors.InvalidValueError: key: expected 'conv<N>d:x=...' (...), got 'conv2d:x=8x3x5x5'
        """
        form = ("conv<N>d:x=...:w=...:stride=...:pad=...:dil=...:g=...:<dtype>:acc=<type>:"
                "<layout>:math=<mode>")
        if not isinstance(key, str):
            raise InvalidTypeError(f"key: expected a str (ConvProblem.key()), got {key!r}")
        parts = key.split(":")
        names = ("x", "w", "stride", "pad", "dil", "g")
        try:
            if len(parts) != 11 or not parts[0].startswith("conv"):
                raise InvalidValueError
            fields = dict(part.split("=", 1) for part in parts[1:7])
            if tuple(fields) != names or not parts[8].startswith("acc=") \
                    or not parts[10].startswith("math="):
                raise InvalidValueError
            dims = {k: tuple(int(v) for v in fields[k].split("x")) for k in names[:5]}
            groups = int(fields["g"])
        except ValueError:
            raise InvalidValueError(f"key: expected {form!r} (ConvProblem.key()), got {key!r}"
                                    ) from None
        return cls(dims["x"], dims["w"], stride=dims["stride"], padding=dims["pad"],
                   dilation=dims["dil"], groups=groups, dtype=parts[7], layout=parts[9],
                   math=parts[10][len("math="):], compute_type=parts[8][len("acc="):])

    def to_dict(self) -> dict[str, Any]:
        return {"x_shape": list(self.x_shape), "w_shape": list(self.w_shape),
                "stride": list(self.stride), "padding": list(self.padding),
                "dilation": list(self.dilation), "groups": self.groups, "dtype": self.dtype,
                "layout": self.layout, "math": self.math, "compute_type": self.compute_type}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ConvProblem":
        """The inverse of :meth:`to_dict`; PlanFormatError naming the field otherwise."""
        return problem_from_dict(d, "")

    def __repr__(self) -> str:
        return (f"ConvProblem(x_shape={self.x_shape}, w_shape={self.w_shape}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"dtype={self.dtype!r}, layout={self.layout!r}, math={self.math!r})")


def transposed_spatial(spatial: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                       padding: Sequence[int], dilation: Sequence[int],
                       output_padding: Sequence[int]) -> tuple[int, ...]:
    """The output spatial sizes of a transposed convolution of ``spatial``:
    the input sizes of the convolution it is the adjoint of, ``(in - 1) *
    stride - 2 * padding + dilation * (k - 1) + output_padding + 1`` (below 1
    where the padding leaves nothing).

    >>> transposed_spatial((4, 4), (3, 3), (2, 2), (1, 1), (1, 1), (1, 0))
    (8, 7)
    """
    return tuple((i - 1) * s - 2 * p + d * (k - 1) + o + 1 for i, k, s, p, d, o
                 in zip(spatial, kernel, stride, padding, dilation, output_padding))


def conv_dtype(dtype: DTypeLike, name: str = "dtype") -> str:
    """The name of a convolution data type (one of :data:`DTYPES`) from anything
    :func:`mucudnn.dtypes.dtype_name` reads; UnsupportedDtypeError naming ``name`` otherwise.

    >>> conv_dtype("half"), conv_dtype("f4")
    ('float16', 'float32')
    """
    n = dtype_name(dtype, name)
    if n not in DTYPES:
        raise UnsupportedDtypeError(f"{name}: expected one of {list(DTYPES)}, got {dtype!r}")
    return n


def problem_from_dict(d: Any, where: str) -> ConvProblem:
    """A ConvProblem from its dict form at the path ``where`` (``""`` at the top);
    PlanFormatError naming the field otherwise."""
    args = check_keys(d, where, "problem", ("x_shape", "w_shape"),
                      ("stride", "padding", "dilation", "groups", "dtype", "layout", "math",
                       "compute_type"))
    return construct(ConvProblem, args, where)
