"""Range checks for Python ints headed into C integer fields.

ctypes converts a Python int to a C ``int`` or ``int64_t`` by dropping the high
bits, without a word: an x dim of 4294967301 reached cuDNN as 5, and a different
convolution ran than the one planned. Every int mucudnn passes into a C integer
field goes through one of these checks first:

- :func:`int32s` / :func:`int32`: the legacy descriptors' dims, strides,
  paddings, filter strides, dilations and group count (C ``int``);
- :func:`check_span`: the elements a legacy tensor descriptor spans
  (``1 + sum((dim - 1) * stride)``, the element count for packed tensors),
  which cuDNN indexes with int32 offsets and refuses above 2**31 - 1 with a
  bare ``CUDNN_STATUS_NOT_SUPPORTED``;
- :func:`int64s`: the graph API's int64 attribute arrays.

Floats and other non-integral values are refused (:class:`IntFieldTypeError`)
rather than rounded by ``int()``.

>>> int32s("padding", (1, 2), "cudnnSetConvolutionNdDescriptor")
(1, 2)
>>> int32s("dims", (1, 1, 4294967301, 1), "cudnnSetTensorNdDescriptor")
Traceback (most recent call last):
  ...
mucudnn._cudnn.errors.Int32RangeError: dims[2]: 4294967301 does not fit the int32 field of \
cudnnSetTensorNdDescriptor (-2147483648..2147483647) and would be truncated; the legacy cuDNN \
API stores it in 32 bits. The graph backend (backend="cudnn-graph") takes 64-bit dims and \
handles tensors this large.
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Sequence

from .errors import Int32RangeError, Int64RangeError, IntFieldTypeError

__all__ = ["INT32_MIN", "INT32_MAX", "INT64_MIN", "INT64_MAX", "GRAPH_HINT", "as_int",
           "int32", "int32s", "int64s", "check_span"]

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1

#: What to do about a value the legacy API cannot hold.
GRAPH_HINT = ("The graph backend (backend=\"cudnn-graph\") takes 64-bit dims and handles "
              "tensors this large.")


def as_int(field: str, value: Any) -> int:
    """``value`` as an int, through ``operator.index`` (ints, NumPy ints, bools);
    IntFieldTypeError for anything else (a float would be rounded)."""
    try:
        return operator.index(value)
    except TypeError:
        raise IntFieldTypeError(f"{field}: expected an int, got {value!r} "
                                f"({type(value).__name__})") from None


def int32(field: str, value: Any, function: str, hint: str = GRAPH_HINT) -> int:
    """``value`` checked for a C ``int`` field of ``function``."""
    v = as_int(field, value)
    if not INT32_MIN <= v <= INT32_MAX:
        raise Int32RangeError(
            f"{field}: {v} does not fit the int32 field of {function} ({INT32_MIN}..{INT32_MAX}) "
            f"and would be truncated; the legacy cuDNN API stores it in 32 bits."
            + (f" {hint}" if hint else ""), field, v)
    return v


def _plain(vals: tuple, lo: int, hi: int) -> bool:
    """Fast path: every value an exact int in [lo, hi] (the common case)."""
    for v in vals:
        if type(v) is not int or not lo <= v <= hi:
            return False
    return True


def int32s(field: str, values: Iterable[Any], function: str,
           hint: str = GRAPH_HINT) -> tuple[int, ...]:
    """Each of ``values`` checked as ``field[i]``."""
    vals = tuple(values)
    if _plain(vals, INT32_MIN, INT32_MAX):
        return vals
    return tuple(int32(f"{field}[{i}]", v, function, hint) for i, v in enumerate(vals))


def int64s(field: str, values: Iterable[Any], function: str) -> tuple[int, ...]:
    """Each of ``values`` checked for an ``int64_t`` array of ``function`` as ``field[i]``."""
    vals = tuple(values)
    if _plain(vals, INT64_MIN, INT64_MAX):
        return vals
    out = []
    for i, value in enumerate(vals):
        name = f"{field}[{i}]"
        v = as_int(name, value)
        if not INT64_MIN <= v <= INT64_MAX:
            raise Int64RangeError(f"{name}: {v} does not fit the int64 field of {function} "
                                  f"({INT64_MIN}..{INT64_MAX}) and would be truncated.", name, v)
        out.append(v)
    return tuple(out)


def check_span(dims: Sequence[int], strides: Sequence[int], function: str) -> None:
    """Int32RangeError (field ``"span"``) when a tensor of ``dims`` and
    ``strides`` (elements) spans more than 2**31 - 1 elements. Tensors with a
    dim or stride below 1 are left to cuDNN, which refuses them itself."""
    if any(d < 1 for d in dims) or any(s < 1 for s in strides):
        return
    span = 1 + sum((d - 1) * s for d, s in zip(dims, strides))
    if span > INT32_MAX:
        raise Int32RangeError(
            f"span: a tensor of dims {tuple(dims)} and strides {tuple(strides)} spans {span} "
            f"elements; {function} (the legacy cuDNN API) indexes tensors with int32 offsets, "
            f"at most {INT32_MAX} elements. {GRAPH_HINT}", "span", span)
