"""The chunk copies of a split call on cuDNN (Note [split groups] in
:mod:`mucudnn.backends.split`): ``cudnnTransformTensor`` between a chunk's
slice of a whole tensor (the whole tensor's strides) and a packed chunk in
the workspace, on the handle's stream.

:class:`SplitCopies` holds the descriptors of one split problem at one
micro-batch size (x's and y's chunk, as slices and packed) and issues each
copy from device pointers. A launcher holds its SplitCopies (they are freed
with it, ``weakref.finalize`` through the descriptors).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

from .._cudnn.descriptors import TensorDescriptor
from .._cudnn.prototypes import lib, raise_status
from ..problem import Direction, packed_strides
from .split import Split, copies_of

__all__ = ["SplitCopies"]

#: indices of the four descriptors in ``SplitCopies._descs`` (their creation order)
_X_SLICE, _X_CHUNK, _Y_SLICE, _Y_CHUNK = range(4)


class SplitCopies:
    """The cuDNN copies of ``split``'s chunks at ``size`` rows."""

    def __init__(self, split: Split, size: int) -> None:
        p, c = split.problem.with_batch(size), split.chunk.with_batch(size)
        dt, lay = p.dtype, p.layout
        self.split, self.size = split, int(size)
        self._descs: list[Any] = []

        def tensor(dims: tuple[int, ...], strides: tuple[int, ...]) -> TensorDescriptor:
            d = TensorDescriptor(dims, strides, dt)
            self._descs.append(d)
            return d

        try:
            self.x_slice = tensor(c.x_dims, packed_strides(p.x_dims, lay))
            self.x_chunk = tensor(c.x_dims, packed_strides(c.x_dims, lay))
            self.y_slice = tensor(c.y_dims, packed_strides(p.y_dims, lay))
            self.y_chunk = tensor(c.y_dims, packed_strides(c.y_dims, lay))
        except BaseException:
            self.close()
            raise
        scalar = ctypes.c_double if dt == "float64" else ctypes.c_float
        self.scalar = scalar
        self._one, self._zero = scalar(1.0), scalar(0.0)
        # A launcher issues 2k of these copies a call: the raw binding, with
        # the descriptors' pointers read once (Note [raw bindings]); close()
        # zeroes them, so a call after it fails in cuDNN's check, not on freed memory.
        self._run = lib.raw("cudnnTransformTensor")
        self._ptrs = [d.handle for d in self._descs]
        isz = p.itemsize
        #: (whole, chunk) bytes of the scratch :meth:`run_chunk` needs
        self.scratch_bytes = (max(math.prod(p.x_shape), math.prod(p.output_shape)) * isz,
                              max(math.prod(c.x_shape), math.prod(c.output_shape)) * isz)

    def _go(self, handle: Any, src_d: int, src: int, dst_d: int, dst: int,
            alpha: Any, beta: Any) -> None:
        st = self._run(handle.handle, ctypes.byref(alpha), self._ptrs[src_d], src,
                       ctypes.byref(beta), self._ptrs[dst_d], dst)
        if st:
            raise_status(st, "cudnnTransformTensor", split=self.split.k, size=self.size)

    def gather_x(self, handle: Any, x: int, a: int) -> None:
        """The x chunk starting at ``x`` (a slice of the whole x) packed into ``a``."""
        self._go(handle, _X_SLICE, x, _X_CHUNK, a, self._one, self._zero)

    def gather_y(self, handle: Any, y: int, b: int) -> None:
        """The y (dy) chunk starting at ``y`` packed into ``b``."""
        self._go(handle, _Y_SLICE, y, _Y_CHUNK, b, self._one, self._zero)

    def scatter_x(self, handle: Any, a: int, x: int, alpha: Any, beta: Any) -> None:
        """dx chunk at ``x`` = alpha * (packed chunk at ``a``) + beta * dx chunk."""
        self._go(handle, _X_CHUNK, a, _X_SLICE, x, alpha, beta)

    def scatter_y(self, handle: Any, b: int, y: int, alpha: Any, beta: Any) -> None:
        """y chunk at ``y`` = alpha * (packed chunk at ``b``) + beta * y chunk."""
        self._go(handle, _Y_CHUNK, b, _Y_SLICE, y, alpha, beta)

    def run_chunk(self, handle: Any, direction: Direction, whole: int, chunk: int) -> None:
        """The copies one chunk of a call of ``direction`` makes, on scratch of
        :attr:`scratch_bytes` (for timing them: Note [split groups])."""
        for name in copies_of(direction):
            if name == "x":
                self.gather_x(handle, whole, chunk)
            elif name == "y":
                self.gather_y(handle, whole, chunk)
            elif name == "x_back":
                self.scatter_x(handle, chunk, whole, self._one, self._zero)
            else:
                self.scatter_y(handle, chunk, whole, self._one, self._zero)

    def close(self) -> None:
        """Destroy the descriptors now (idempotent)."""
        self._ptrs = [0] * len(self._descs)
        for d in self._descs:
            d.close()
