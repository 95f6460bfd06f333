"""The transforms of a folded call on cuDNN (Note [folded first layers] in
:mod:`mucudnn.backends.fold`): ``cudnnTransformTensorEx`` with fold
descriptors, on the handle's stream.

:class:`FoldTransforms` holds the descriptors of one folded problem at one
micro-batch size (x rows and filter, folded and not, and the four transform
descriptors) and issues each transform from device pointers. A launcher holds
its FoldTransforms (they are freed with it, ``weakref.finalize`` through the
descriptors).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

from .._cudnn.descriptors import TensorDescriptor, TensorTransformDescriptor
from .._cudnn.prototypes import lib, raise_status
from ..problem import Direction, packed_strides
from .fold import Fold, transforms_of

__all__ = ["FoldTransforms"]


class FoldTransforms:
    """The cuDNN transforms of ``fold``'s problem at ``size`` rows."""

    def __init__(self, fold: Fold, size: int) -> None:
        p, inner = fold.problem, fold.inner.with_batch(size)
        n, c, h, w = p.with_batch(size).x_dims
        k, _, r, q = p.w_dims
        dt = p.dtype
        self.fold, self.size = fold, int(size)
        self._descs: list[Any] = []

        def tensor(dims: tuple[int, ...]) -> TensorDescriptor:
            d = TensorDescriptor(dims, packed_strides(dims, "NHWC"), dt)
            self._descs.append(d)
            return d

        def transform(before: list[int], after: list[int], unfold: bool) -> Any:
            t = TensorTransformDescriptor(before, after, [fold.s, fold.s], unfold=unfold)
            self._descs.append(t)
            return t

        try:
            self.x = tensor((n, c, h, w))
            self.xf = tensor(inner.x_dims)
            self.w = tensor((k, c, r, q))
            self.wf = tensor(inner.w_dims)
            (ph, pw), (ah, aw) = fold.pad_before, fold.pad_after
            fh, fq = fold.filter_pad_after
            self.fold_x_t = transform([0, 0, ph, pw], [0, 0, ah, aw], False)
            self.unfold_x_t = transform([0, 0, -ph, -pw], [0, 0, -ah, -aw], True)
            self.fold_w_t = transform([0, 0, 0, 0], [0, 0, fh, fq], False)
            self.unfold_w_t = transform([0, 0, 0, 0], [0, 0, -fh, -fq], True)
        except BaseException:
            self.close()
            raise
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        # A folded launcher issues two of these a call: the raw binding, with
        # the descriptors' pointers read once (Note [raw bindings]); close()
        # zeroes them, so a call after it fails in cuDNN's check, not on freed memory.
        self._run = lib.raw("cudnnTransformTensorEx")
        self._ptrs = {id(d): d.handle for d in self._descs}
        #: bytes of the x rows and of the folded rows
        self.x_bytes = math.prod(p.x_shape[1:]) * p.itemsize * self.size
        self.xf_bytes = math.prod(inner.x_shape) * inner.itemsize
        #: (src, dst) bytes of the scratch :meth:`run_all` needs: x rows or
        #: the filter, and their folds
        self.scratch_bytes = (max(self.x_bytes, math.prod(p.w_shape) * p.itemsize),
                              max(self.xf_bytes, math.prod(inner.w_shape) * inner.itemsize))

    def _go(self, handle: Any, t: Any, src: Any, sp: int, dst: Any, dp: int,
            alpha: Any, beta: Any) -> None:
        ptrs = self._ptrs
        st = self._run(handle.handle, ptrs[id(t)], ctypes.byref(alpha), ptrs[id(src)], sp,
                       ctypes.byref(beta), ptrs[id(dst)], dp)
        if st:
            raise_status(st, "cudnnTransformTensorEx", fold=self.fold.s, size=self.size)

    def fold_x(self, handle: Any, x: int, xf: int) -> None:
        """x rows at ``x`` folded into ``xf``."""
        self._go(handle, self.fold_x_t, self.x, x, self.xf, xf, self._one, self._zero)

    def fold_w(self, handle: Any, w: int, wf: int) -> None:
        """The filter at ``w`` folded into ``wf``."""
        self._go(handle, self.fold_w_t, self.w, w, self.wf, wf, self._one, self._zero)

    def unfold_x(self, handle: Any, xf: int, x: int, alpha: Any, beta: Any) -> None:
        """x rows = alpha * (folded rows at ``xf`` unfolded, padding dropped) + beta * x rows."""
        self._go(handle, self.unfold_x_t, self.xf, xf, self.x, x, alpha, beta)

    def unfold_w(self, handle: Any, wf: int, w: int, alpha: Any, beta: Any) -> None:
        """The filter = alpha * (folded filter at ``wf`` unfolded) + beta * filter."""
        self._go(handle, self.unfold_w_t, self.wf, wf, self.w, w, alpha, beta)

    def run_all(self, handle: Any, direction: Direction, src: int, dst: int) -> None:
        """Every transform one call of ``direction`` runs, on scratch of
        :attr:`scratch_bytes` (for timing them: Note [folded first layers])."""
        for name in transforms_of(direction):
            if name == "fold_x":
                self.fold_x(handle, src, dst)
            elif name == "fold_w":
                self.fold_w(handle, src, dst)
            elif name == "unfold_x":
                self.unfold_x(handle, dst, src, self._one, self._zero)
            else:
                self.unfold_w(handle, dst, src, self._one, self._zero)

    def close(self) -> None:
        """Destroy the descriptors now (idempotent)."""
        self._ptrs = dict.fromkeys(self._ptrs, 0)
        for d in self._descs:
            d.close()
