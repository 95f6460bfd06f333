"""Byte sizes and integers: the one parser every size, count and shape argument
(and environment variable) goes through.

Units (case-insensitive except where noted):

* none or ``B``: bytes;
* ``K``, ``M``, ``G``, ``T`` and ``KiB``, ``MiB``, ``GiB``, ``TiB``: powers of 1024;
* ``kB``/``KB``, ``MB``, ``GB``, ``TB``: powers of 1000 (SI).

So ``64M`` and ``64MiB`` are 67,108,864 bytes and ``64MB`` is 64,000,000.
A number may have a fraction or an exponent (``1.5GiB``, ``1e6``); the result
is rounded down to whole bytes (computed exactly: ``"9007199254740993"`` is
that many bytes) and must be finite, non-negative and below 2**63. Errors
are :class:`~mucudnn.errors.InvalidValueError` (a ValueError) or
:class:`~mucudnn.errors.InvalidTypeError` (a TypeError), one line naming the
argument.

>>> parse_bytes("64MiB"), parse_bytes("64M"), parse_bytes("64MB")
(67108864, 67108864, 64000000)
>>> parse_bytes(" 1.5 GiB "), parse_bytes("0"), parse_bytes(4096)
(1610612736, 0, 4096)
>>> format_bytes(67108864), format_bytes(1536), format_bytes(100)
('64 MiB', '1.5 KiB', '100 B')

Counts (:func:`parse_count`) and per-dimension tuples (:func:`int_tuple`) are
exact integers: an int, a NumPy integer or a 0-d integer array, a float only
where it is a whole number that a float holds exactly, a string of digits
parsed exactly; 2.5 or ``"2.5"`` is refused, never truncated.

>>> parse_count(np.int64(3), "retime"), parse_count("9007199254740993", "n")
(3, 9007199254740993)
>>> int_tuple("padding", np.array(1), 2, 0)
(1, 1)
"""

from __future__ import annotations

import math
import operator
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any, Sequence, SupportsIndex, Union

import numpy as np

from .errors import InvalidTypeError, InvalidValueError

__all__ = ["parse_bytes", "format_bytes", "MAX_BYTES", "UNITS", "is_integer", "parse_count",
           "int_tuple", "shape_tuple", "IntOrTuple", "ByteSize"]

IntOrTuple = Union[int, Sequence[int]]
#: What :func:`parse_bytes` accepts: an int (or anything with ``__index__``,
#: such as a NumPy integer), a float, or a size string such as ``"64MiB"``.
ByteSize = Union[SupportsIndex, float, str]
#: Floats above this may not be the integer that was meant (2**53 + 1 has no float).
_EXACT_FLOAT = 1 << 53

#: Exclusive upper bound of a size (an int64 must hold it).
MAX_BYTES = 1 << 63

#: Lower-case unit -> multiplier.
UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10 ** 3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10 ** 6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10 ** 9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10 ** 12,
}

# Note: the number has one way to match ("12" cannot split as "1" + "2"), so a
# long string that fails fails in linear time (the old [0-9]*\.?[0-9]+ took
# seconds on 8000 digits).
_SIZE = re.compile(r"\s*((?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_bytes(value: Any, name: str = "size") -> int:
    """``value`` (an int, or a string such as ``"64MiB"``) in bytes.

    Raises InvalidValueError (a ValueError) naming ``name`` for anything else:
    a negative or non-finite number, an unknown unit, a size of 2**63 bytes or
    more. A bool, None or other non-size is an InvalidTypeError (a TypeError).
    """
    if isinstance(value, bool):
        raise InvalidTypeError(f"{name}: expected a size in bytes (an int or a string like "
                               f"'64MiB'), got {value!r}")
    if isinstance(value, int) or (hasattr(value, "__index__") and not isinstance(value, str)):
        n = int(value)
        if not 0 <= n < MAX_BYTES:
            raise InvalidValueError(f"{name}: expected a size in bytes in [0, 2**63), got {n}")
        return n
    if isinstance(value, float):
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise InvalidTypeError(f"{name}: expected a size in bytes (an int or a string like "
                               f"'64MiB'), got {type(value).__name__}")
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in UNITS:
        raise InvalidValueError(f"{name}: expected a size such as 64MiB, 1GiB, 512K, 64MB or a "
                                f"number of bytes, got {value!r}")
    # Exact arithmetic: a float would round "9007199254740993" to ...992. The
    # exponent is bounded first, so that "1e999999999" costs nothing.
    number = Decimal(m.group(1))
    if number and number.adjusted() > 40:
        raise InvalidValueError(f"{name}: {value!r} is too large (sizes must be below 2**63 bytes)")
    total = 0 if number.adjusted() < -40 else math.floor(Fraction(number) * UNITS[unit])
    if total >= MAX_BYTES:
        raise InvalidValueError(f"{name}: {value!r} is too large (sizes must be below 2**63 bytes)")
    return total


def format_bytes(n: float | None) -> str:
    """A short human form with binary units (``"64 MiB"``); ``"unlimited"`` for None."""
    if n is None:
        return "unlimited"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def is_integer(v: Any) -> bool:
    """An integer value (int, NumPy integer, 0-d integer array), not a bool,
    float, string or array of several values."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    try:
        operator.index(v)
    except TypeError:
        return False
    return True


def parse_count(value: Any, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as an exact int in [minimum, maximum]: an integer (see
    :func:`is_integer`), a whole float below 2**53, or a string of decimal
    digits. InvalidValueError naming ``name`` for another number or string
    (2.5, "2.5") and for an int out of range; InvalidTypeError for anything
    else (True, None)."""
    what = f"an int >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    if is_integer(value):
        n = operator.index(value)
    elif isinstance(value, (float, np.floating, str)):
        whole = (re.fullmatch(r"\s*[+-]?[0-9]{1,40}\s*", value) is not None
                 if isinstance(value, str) else
                 float(value).is_integer() and abs(float(value)) <= _EXACT_FLOAT)
        if not whole:  # 2.5, 1e300, nan, "2.5": a number, but not an exact integer
            raise InvalidValueError(f"{name}: expected {what} (a whole number), got {value!r}")
        n = int(value)
    else:
        raise InvalidTypeError(f"{name}: expected {what}, got {value!r}")
    if n < minimum or (maximum is not None and n > maximum):
        raise InvalidValueError(f"{name}: expected {what}, got {n}")
    return n


def int_tuple(name: str, value: IntOrTuple, nd: int, minimum: int, *,
              one_for_all: bool = False) -> tuple[int, ...]:
    """Expand an int (a 0-d integer array too) or a per-dimension sequence of
    ints into an nd-tuple of ints >= minimum, naming ``name`` otherwise. With
    ``one_for_all``, a one-element sequence stands for every dimension (the
    rule of PyTorch's convolutions: ``stride=(2,)`` is ``stride=2``).

    >>> int_tuple("stride", [2], 2, 1, one_for_all=True)
    (2, 2)
    """
    if is_integer(value):
        t = (operator.index(value),) * nd  # type: ignore[arg-type]
    else:
        # Note: each element must be an integer itself (not 2.9, "2" or True):
        # int() would silently truncate or parse it.
        try:
            items = None if isinstance(value, (str, bytes)) else list(value)  # type: ignore[arg-type]
        except TypeError:  # not iterable (a float, a 0-d float array, None, ...)
            items = None
        if items is None or not all(is_integer(v) for v in items):
            raise InvalidTypeError(
                f"{name}: expected an int or a tuple of {nd} ints, got {value!r}")
        t = tuple(operator.index(v) for v in items)
        if one_for_all and len(t) == 1:
            t = t * nd
        if len(t) != nd:
            raise InvalidValueError(
                f"{name}: expected {nd} values (one per spatial dimension), got {value!r}")
    for v in t:
        if v < minimum:
            raise InvalidValueError(f"{name}: expected every value >= {minimum}, got {value!r}")
    return t


def shape_tuple(name: str, value: Sequence[int]) -> tuple[int, ...]:
    """A shape: a sequence of positive ints, naming ``name`` otherwise."""
    ndim = getattr(value, "ndim", 1)
    # Note: an array is described by its shape; its repr spans lines.
    got = (f"a {ndim}-D array of shape {tuple(getattr(value, 'shape', ()))}" if ndim != 1
           else repr(value))
    try:
        t = tuple(value)
    except TypeError:
        raise InvalidTypeError(f"{name}: expected a sequence of ints, got {got}") from None
    for v in t:
        if not is_integer(v):
            raise InvalidTypeError(f"{name}: expected a sequence of ints, got {got}")
    t = tuple(operator.index(v) for v in t)
    if any(v <= 0 for v in t):
        raise InvalidValueError(f"{name}: expected positive sizes, got {t}")
    return t
