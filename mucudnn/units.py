"""Byte sizes: the one parser every size argument and environment variable goes through.

Units (case-insensitive except where noted):

* none or ``B``: bytes;
* ``K``, ``M``, ``G``, ``T`` and ``KiB``, ``MiB``, ``GiB``, ``TiB``: powers of 1024;
* ``kB``/``KB``, ``MB``, ``GB``, ``TB``: powers of 1000 (SI).

So ``64M`` and ``64MiB`` are 67,108,864 bytes and ``64MB`` is 64,000,000.
A number may have a fraction or an exponent (``1.5GiB``, ``1e6``); the result
is rounded down to whole bytes and must be finite, non-negative and below
2**63. Errors are :class:`~mucudnn.errors.InvalidValueError` (a ValueError) or
:class:`~mucudnn.errors.InvalidTypeError` (a TypeError), one line naming the
argument.

>>> parse_bytes("64MiB"), parse_bytes("64M"), parse_bytes("64MB")
(67108864, 67108864, 64000000)
>>> parse_bytes(" 1.5 GiB "), parse_bytes("0"), parse_bytes(4096)
(1610612736, 0, 4096)
>>> format_bytes(67108864), format_bytes(1536), format_bytes(100)
('64 MiB', '1.5 KiB', '100 B')
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import InvalidTypeError, InvalidValueError

__all__ = ["parse_bytes", "format_bytes", "MAX_BYTES", "UNITS"]

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
    number = float(m.group(1))
    total = number * UNITS[unit]
    if not math.isfinite(total) or total >= MAX_BYTES:
        raise InvalidValueError(f"{name}: {value!r} is too large (sizes must be below 2**63 bytes)")
    return int(total)


def format_bytes(n: float | None) -> str:
    """A short human form with binary units (``"64 MiB"``); ``"unlimited"`` for None."""
    if n is None:
        return "unlimited"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"
