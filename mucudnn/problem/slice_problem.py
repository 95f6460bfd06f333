"""SliceProblem: one chunk of a grouped convolution's groups, run in place on
channel slices of the whole tensors (Note [chunks as slices]).

Note [chunks as slices]
~~~~~~~~~~~~~~~~~~~~~~~
A split (Note [split groups] in :mod:`mucudnn.backends.split`) copies each
chunk's slices of x and y into packed tensors and runs the chunk problem
there. The same chunk can instead be described in place: its x and y
tensors with the whole tensors' strides (a slice of ``whole_channels``
channels' rows), so no copy runs and no region is kept. cuDNN's heuristics
then list other engines: on MobileNet-V3's and MNASNet's bf16 depthwise 5x5
backward-filters they list a runtime-compiled one for the slices that they
list for neither the packed chunk nor the whole layer, several times faster
than PyTorch's kernel (docs/BENCHMARKS.md, "Chunks as slices"); elsewhere
slices run slower or lose the specialised engines. So a
slice is its own problem: its key names ``whole_channels``, and what is
found for it is never taken for the packed chunk's.

>>> from mucudnn.problem import ConvProblem
>>> chunk = ConvProblem((8, 14, 14, 336), (336, 5, 5, 1), stride=2, padding=2,
...                     groups=336, layout="NHWC")
>>> s = SliceProblem.of(chunk, 672)
>>> s.x_strides, chunk.x_strides
((131712, 1, 9408, 672), (65856, 1, 4704, 336))
>>> s.key().endswith(":slice=672"), s.with_batch(4).whole_channels
(True, 672)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidTypeError, InvalidValueError
from ..units import is_integer
from .conv_problem import ConvProblem
from .layouts import packed_strides

__all__ = ["SliceProblem"]


@dataclass(frozen=True, repr=False, eq=True)
class SliceProblem(ConvProblem):
    """A chunk problem whose x and y are channel slices of tensors of
    ``whole_channels`` input channels (Note [chunks as slices]); every other
    field is the chunk's own. The whole output has as many more channels as
    the whole input (the chunks are whole groups)."""

    whole_channels: int = 0

    def __init__(self, x_shape: Any, w_shape: Any, *, whole_channels: int,
                 **fields: Any) -> None:
        super().__init__(x_shape, w_shape, **fields)
        if not is_integer(whole_channels) or isinstance(whole_channels, bool):
            raise InvalidTypeError(f"whole_channels: expected an int, got {whole_channels!r}")
        c = self.x_dims[1]
        whole = int(whole_channels)
        if whole <= c or whole % c:
            raise InvalidValueError(
                f"whole_channels: expected a multiple of the chunk's {c} input channels "
                f"above it, got {whole}")
        object.__setattr__(self, "whole_channels", whole)

    @classmethod
    def of(cls, chunk: ConvProblem, whole_channels: int) -> "SliceProblem":
        """``chunk`` as a slice of tensors of ``whole_channels`` input channels."""
        fields = {f.name: getattr(chunk, f.name) for f in dataclasses.fields(ConvProblem)}
        return cls(whole_channels=whole_channels, **fields)

    @property
    def chunks(self) -> int:
        """How many chunks of this size the whole tensors hold."""
        return self.whole_channels // self.x_dims[1]

    @property
    def whole_x_dims(self) -> tuple[int, ...]:
        """The whole x's canonical dims (what a buffer for the slice must span)."""
        d = self.x_dims
        return (d[0], self.whole_channels) + d[2:]

    @property
    def whole_y_dims(self) -> tuple[int, ...]:
        """The whole y's canonical dims."""
        d = self.y_dims
        return (d[0], d[1] * self.chunks) + d[2:]

    @property
    def x_strides(self) -> tuple[int, ...]:
        return packed_strides(self.whole_x_dims, self.layout)

    @property
    def y_strides(self) -> tuple[int, ...]:
        return packed_strides(self.whole_y_dims, self.layout)

    def extent(self, which: str) -> int:
        """Elements of the whole tensor for x and y (a slice spans its rows), of
        the filter for w."""
        if which == "w":
            return super().extent(which)
        return math.prod({"x": self.whole_x_dims, "y": self.whole_y_dims}[which])

    def key(self) -> str:
        """The chunk's key and ``:slice=<whole_channels>``: never the packed chunk's."""
        return f"{super().key()}:slice={self.whole_channels}"

    def to_dict(self) -> dict[str, Any]:
        return dict(super().to_dict(), whole_channels=self.whole_channels)

    def __repr__(self) -> str:
        inner = super().__repr__()[len("ConvProblem("):-1]
        return f"SliceProblem({inner}, whole_channels={self.whole_channels})"
