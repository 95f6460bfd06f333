"""Direction: the three convolution kernels a layer runs, and the names each is
parsed from (``"fwd"``, ``"dgrad"``, ``"wgrad"``, ...)."""

from __future__ import annotations

import enum

from ..errors import InvalidValueError

__all__ = ["Direction"]


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
