"""Pure values: ConvProblem, Direction, AlgoPerf, MicroBatch, Plan.

Everything that determines a convolution's algorithms and cost lives in
:class:`ConvProblem`; shapes, strides and layouts are computed here and nowhere
else, so the cuDNN descriptors, the NumPy reference and the engine agree.

Every value checks its fields when it is made and names the field it refuses
(:class:`~mucudnn.errors.InvalidValueError`, a ValueError, or
:class:`~mucudnn.errors.InvalidTypeError`, a TypeError):

>>> MicroBatch(offset=0, size="one", algo=1)
Traceback (most recent call last):
...
mucudnn.errors.InvalidTypeError: size: expected an int >= 1, got 'one'
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import numbers
import operator
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

from .dtypes import dtype_name
from .errors import InvalidTypeError, InvalidValueError, UnsupportedDtypeError
from .typing_aliases import DTypeLike, PolicyLike
from .units import format_bytes, int_tuple, is_integer, shape_tuple

IntOrTuple = Union[int, Sequence[int]]

# Note [fp32 transposes in workspace]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# With TF32 allowed, the fastest float32 NCHW engines are NHWC kernels that
# first copy their operands to NHWC in the workspace: for most large kernels
# the fastest config's workspace is about the bytes of x, y and w together
# (tools/workspace_anatomy.py). Such a workspace grows with the batch, so a
# cap only splits the batch into small micro-batches, on which the kernels run
# slower. In float32 NHWC (channels-last) few kernels need those copies and
# plans under a cap run the whole batch in one call for all but the first
# layers (docs/BENCHMARKS.md). So float32 work under a workspace cap should be
# channels-last: NHWC arrays here, `model.to(memory_format=
# torch.channels_last)` in PyTorch (mucudnn.torch runs its NHWC plans without
# copies).

#: Layouts by number of spatial dimensions; the channels-first form comes first.
LAYOUTS: dict[str, int] = {"NCHW": 2, "NHWC": 2, "NCDHW": 3, "NDHWC": 3}
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
#: The workspace limit that stands for "unlimited" where an API takes None (1 PiB).
UNLIMITED_WORKSPACE = 1 << 50
#: Exclusive bound of every dimension, padding, stride, dilation and group count
#: (Note [sizes that cannot exist]).
MAX_DIM = 1 << 63
#: Exclusive bound of the bytes of x, w and y (Note [sizes that cannot exist]).
MAX_TENSOR_BYTES = 1 << 42


class Direction(str, enum.Enum):
    """The three convolution kernels a layer runs."""

    FORWARD = "forward"
    BACKWARD_DATA = "backward_data"
    BACKWARD_FILTER = "backward_filter"

    def __str__(self) -> str:  # "forward", not "Direction.FORWARD"
        return self.value

    @classmethod
    def parse(cls, value: "Direction | str") -> "Direction":
        """Accept a Direction, its value or its name (case-insensitive); e.g. ``"fwd"``."""
        if isinstance(value, Direction):
            return value
        if isinstance(value, str):
            v = value.strip().lower().replace("-", "_")
            aliases = {"fwd": "forward", "bwd_data": "backward_data", "dgrad": "backward_data",
                       "bwd_filter": "backward_filter", "wgrad": "backward_filter"}
            v = aliases.get(v, v)
            for d in cls:
                if d.value == v:
                    return d
        raise InvalidValueError(
            f"direction: expected one of {[d.value for d in cls]}, got {value!r}")


def channels_last(layout: str) -> bool:
    """True for NHWC/NDHWC."""
    return layout[1] != "C"


def to_canonical(shape: Sequence[int], layout: str) -> tuple[int, ...]:
    """A shape in the layout's own order -> (N, C, spatial...) order."""
    s = tuple(shape)
    return (s[0], s[-1]) + s[1:-1] if channels_last(layout) else s


def from_canonical(shape: Sequence[int], layout: str) -> tuple[int, ...]:
    """(N, C, spatial...) order -> the layout's own order."""
    s = tuple(shape)
    return (s[0],) + s[2:] + (s[1],) if channels_last(layout) else s


def packed_strides(canonical_shape: Sequence[int], layout: str) -> tuple[int, ...]:
    """Element strides of a packed tensor, listed in canonical (N, C, spatial...) order.

    This is what cuDNN's Nd tensor descriptors take: dims always in NCHW order,
    strides saying where each dim lives in memory.

    >>> packed_strides((2, 3, 4, 5), "NHWC")
    (60, 1, 15, 3)
    """
    own = from_canonical(canonical_shape, layout)
    strides_own = [1] * len(own)
    for i in range(len(own) - 2, -1, -1):
        strides_own[i] = strides_own[i + 1] * own[i + 1]
    return to_canonical(strides_own, layout)


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
        return _problem_from_dict(d, "")

    def __repr__(self) -> str:
        return (f"ConvProblem(x_shape={self.x_shape}, w_shape={self.w_shape}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"dtype={self.dtype!r}, layout={self.layout!r}, math={self.math!r})")


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


@dataclass(frozen=True)
class AlgoPerf:
    """One measured algorithm: ``algo`` is backend-specific (an int for the
    legacy cuDNN API and NumPy, a string engine-config id for the graph API)."""

    algo: Union[int, str]
    time_ms: float
    workspace_bytes: int
    math_type: Union[int, str] = 0
    determinism: Union[int, str, None] = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AlgoPerf":
        return cls(**d)


class PlanFormatError(InvalidValueError, KeyError):
    """A dict or JSON text that should describe a Plan (or its problem) does
    not: not an object, a missing or unknown key, or a field of the wrong type
    or value. The message names the field (``micro_batches[1].size: ...``).

    A ValueError, and a KeyError for code that caught the bare KeyError a
    missing key used to raise (with a readable message, unlike KeyError's).
    """

    __str__ = Exception.__str__  # KeyError would quote the message


def _int_field(name: str, v: Any, minimum: int) -> int:
    if not is_integer(v):
        raise InvalidTypeError(f"{name}: expected an int >= {minimum}, got {v!r}")
    n = operator.index(v)
    if n < minimum:
        raise InvalidValueError(f"{name}: expected an int >= {minimum}, got {n}")
    return n


def _id_field(name: str, v: Any) -> Union[int, str]:
    """An algorithm or math-type id: an int (legacy API, NumPy) or a string (graph API)."""
    if isinstance(v, str):
        return v
    if is_integer(v):
        return operator.index(v)
    raise InvalidTypeError(f"{name}: expected an int or a string (the backend's id), got {v!r}")


def _time_field(name: str, v: Any, allow_inf: bool = False) -> float:
    what = "a number >= 0 (milliseconds)" + (" or inf" if allow_inf else ", finite")
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InvalidTypeError(f"{name}: expected {what}, got {v!r}")
    t = float(v)
    if math.isnan(t) or t < 0 or (math.isinf(t) and not allow_inf):
        raise InvalidValueError(f"{name}: expected {what}, got {t!r}")
    return t


@dataclass(frozen=True)
class MicroBatch:
    """One call of a plan: rows [offset, offset + size) with one algorithm.

    ``offset`` is an int >= 0, ``size`` an int >= 1, ``algo`` and ``math_type``
    the backend's ids (ints, or strings for the graph API), ``workspace_bytes``
    an int >= 0 and ``time_ms`` a finite number >= 0; NumPy numbers become
    Python ones.

    >>> MicroBatch(0, 32, algo=1, workspace_bytes=1 << 20, time_ms=0.25).size
    32
    """

    offset: int
    size: int
    algo: Union[int, str]
    math_type: Union[int, str] = 0
    workspace_bytes: int = 0
    time_ms: float = 0.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "offset", _int_field("offset", self.offset, 0))
        set_(self, "size", _int_field("size", self.size, 1))
        set_(self, "algo", _id_field("algo", self.algo))
        set_(self, "math_type", _id_field("math_type", self.math_type))
        set_(self, "workspace_bytes", _int_field("workspace_bytes", self.workspace_bytes, 0))
        set_(self, "time_ms", _time_field("time_ms", self.time_ms))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MicroBatch":
        """The inverse of :meth:`to_dict`; PlanFormatError naming the field otherwise."""
        return _micro_from_dict(d, "")


@dataclass(frozen=True)
class Plan:
    """A micro-batch sequence for one kernel.

    ``workspace_bytes`` is the max over the micro-batches (they run one after
    another on one stream); ``undivided_time_ms`` is the best single call under
    the same limit (``inf`` where none fits), so every plan reports its speedup.
    Fields are checked when a Plan is made (``micro_batches`` a non-empty
    sequence of MicroBatch, becoming a tuple; ``direction`` a Direction or its
    name; times finite and >= 0 except ``undivided_time_ms``, which may be
    ``inf``; ``workspace_limit`` an int >= 0 or None). Whether the micro-batches
    tile a batch is checked where the plan meets its problem (the engine,
    :func:`mucudnn.load_plans`).
    """

    problem: ConvProblem | None
    direction: Direction | None
    micro_batches: tuple[MicroBatch, ...]
    workspace_bytes: int
    time_ms: float
    undivided_time_ms: float
    workspace_limit: int | None
    policy: Any = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.problem is not None and not isinstance(self.problem, ConvProblem):
            raise InvalidTypeError(
                f"problem: expected a ConvProblem or None, got {type(self.problem).__name__}")
        d = self.direction
        if d is not None and not isinstance(d, Direction):
            if not isinstance(d, str):
                raise InvalidTypeError(f"direction: expected a Direction, its name or None, "
                                       f"got {d!r}")
            set_(self, "direction", Direction.parse(d))
        mbs = self.micro_batches
        if isinstance(mbs, (str, bytes, Mapping)) or not hasattr(mbs, "__iter__"):
            raise InvalidTypeError(
                f"micro_batches: expected a sequence of MicroBatch, got {type(mbs).__name__}")
        mbs = tuple(mbs)
        if not mbs:
            raise InvalidValueError("micro_batches: expected at least one MicroBatch, got none")
        for i, m in enumerate(mbs):
            if not isinstance(m, MicroBatch):
                raise InvalidTypeError(
                    f"micro_batches[{i}]: expected a MicroBatch, got {type(m).__name__}")
        set_(self, "micro_batches", mbs)
        set_(self, "workspace_bytes", _int_field("workspace_bytes", self.workspace_bytes, 0))
        set_(self, "time_ms", _time_field("time_ms", self.time_ms))
        set_(self, "undivided_time_ms",
             _time_field("undivided_time_ms", self.undivided_time_ms, allow_inf=True))
        if self.workspace_limit is not None:
            set_(self, "workspace_limit", _int_field("workspace_limit", self.workspace_limit, 0))

    @property
    def batch(self) -> int:
        return sum(m.size for m in self.micro_batches)

    @property
    def speedup(self) -> float:
        """undivided_time_ms / time_ms (``inf`` where no undivided call fits)."""
        return self.undivided_time_ms / self.time_ms if self.time_ms > 0 else float("nan")

    def describe(self) -> str:
        """A short human form: ``"2 x 128"`` or ``"52 + 52 + 48"``."""
        sizes = [m.size for m in self.micro_batches]
        if sizes and all(s == sizes[0] for s in sizes):
            return f"{len(sizes)} x {sizes[0]}" if len(sizes) > 1 else f"{sizes[0]}"
        return " + ".join(str(s) for s in sizes)

    def with_context(self, problem: ConvProblem | None, direction: Direction | None) -> "Plan":
        return dataclasses.replace(self, problem=problem, direction=direction)

    def to_dict(self) -> dict[str, Any]:
        policy = self.policy if isinstance(self.policy, (str, type(None))) else list(self.policy)
        return {
            "problem": self.problem.to_dict() if self.problem is not None else None,
            "direction": self.direction.value if self.direction is not None else None,
            "micro_batches": [m.to_dict() for m in self.micro_batches],
            "workspace_bytes": self.workspace_bytes,
            "time_ms": self.time_ms,
            "undivided_time_ms": _json_float(self.undivided_time_ms),
            "workspace_limit": self.workspace_limit,
            "policy": policy,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        """The inverse of :meth:`to_dict`. Anything else raises
        :class:`PlanFormatError` naming the field; a list (what ``python -m
        mucudnn optimize --json`` writes) points to :func:`mucudnn.load_plans`."""
        return _plan_from_dict(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, s: "str | bytes") -> "Plan":
        """One plan from :meth:`to_json`'s text; :class:`PlanFormatError` otherwise."""
        try:
            d = json.loads(s)
        except ValueError as exc:
            raise PlanFormatError(f"plan: not valid JSON ({exc})") from None
        return cls.from_dict(d)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_keys(d: Any, where: str, what: str, required: Sequence[str],
                optional: Sequence[str] = ()) -> dict[str, Any]:
    """``d`` as a dict after checking it has every required key and no other;
    errors name the path ``where`` (``""`` at the top)."""
    if not isinstance(d, Mapping):
        raise PlanFormatError(f"{where or what}: expected an object (a dict), "
                              f"got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    if missing:
        raise PlanFormatError(f"{_join(where, missing[0])}: missing from the {what}")
    unknown = [k for k in d if k not in required and k not in optional]
    if unknown:
        raise PlanFormatError(f"{where or what}: unknown key {unknown[0]!r}; expected keys "
                              f"{', '.join(list(required) + list(optional))}")
    return dict(d)


def _construct(cls: type, args: dict[str, Any], where: str) -> Any:
    """``cls(**args)``, its field errors re-raised as PlanFormatError under ``where``."""
    try:
        return cls(**args)
    except PlanFormatError:
        raise
    except (InvalidValueError, InvalidTypeError, UnsupportedDtypeError) as exc:
        raise PlanFormatError(f"{where + '.' if where else ''}{exc}") from None


def _problem_from_dict(d: Any, where: str) -> ConvProblem:
    args = _check_keys(d, where, "problem", ("x_shape", "w_shape"),
                       ("stride", "padding", "dilation", "groups", "dtype", "layout", "math",
                        "compute_type"))
    return _construct(ConvProblem, args, where)


def _micro_from_dict(d: Any, where: str) -> MicroBatch:
    args = _check_keys(d, where, "micro-batch", ("offset", "size", "algo"),
                       ("math_type", "workspace_bytes", "time_ms"))
    return _construct(MicroBatch, args, where)


def _plan_from_dict(d: Any, where: str = "") -> "Plan":
    if isinstance(d, list):
        raise PlanFormatError(
            f"{where or 'plan'}: expected one plan (a JSON object), got a list; a list of plans "
            "as 'python -m mucudnn optimize --json' writes it is read by mucudnn.load_plans")
    args = _check_keys(d, where, "plan", ("micro_batches", "workspace_bytes", "time_ms",
                                          "undivided_time_ms"),
                       ("problem", "direction", "workspace_limit", "policy"))
    raw = args["micro_batches"]
    if not isinstance(raw, list):
        raise PlanFormatError(f"{_join(where, 'micro_batches')}: expected a list, "
                              f"got {type(raw).__name__}")
    args["micro_batches"] = tuple(_micro_from_dict(m, _join(where, f"micro_batches[{i}]"))
                                  for i, m in enumerate(raw))
    if args.get("problem") is not None:
        args["problem"] = _problem_from_dict(args["problem"], _join(where, "problem"))
    if args["undivided_time_ms"] is None:
        args["undivided_time_ms"] = float("inf")
    if isinstance(args.get("policy"), list):
        args["policy"] = tuple(args["policy"])
    for k in ("problem", "direction", "workspace_limit"):
        args.setdefault(k, None)
    return _construct(Plan, args, where)


def _json_float(v: float) -> float | None:
    return None if v == float("inf") else v


def make_plan(micro_batches: Iterable[MicroBatch], *, undivided_time_ms: float,
              workspace_limit: int | None, policy: "PolicyLike | None" = None,
              problem: ConvProblem | None = None, direction: Direction | None = None) -> Plan:
    """Build a Plan from its micro-batches, deriving total time and workspace."""
    mbs = tuple(micro_batches)
    return Plan(problem=problem, direction=direction, micro_batches=mbs,
                workspace_bytes=max((m.workspace_bytes for m in mbs), default=0),
                time_ms=sum(m.time_ms for m in mbs), undivided_time_ms=undivided_time_ms,
                workspace_limit=workspace_limit, policy=policy)
