"""A pair call's ordering and join on cuDNN (Note [micro-batches in pairs] in
:mod:`mucudnn.backends.pair`): the events that order the second lane's
stream after the caller's and back, and, for backward-filter, the add of the
second lane's partial gradient into dw (``cudnnTransformTensor`` with beta 1
over the filter's elements, on the handle's stream).

A launcher holds its :class:`PairJoin` (freed with it, ``weakref.finalize``
through the descriptor and the events).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

from .._cudnn.descriptors import TensorDescriptor
from .._cudnn.prototypes import lib, raise_status
from ..cuda import Event, Stream
from ..problem import ConvProblem

__all__ = ["PairJoin"]


class PairJoin:
    """The fork and join events of one pair launcher, and the add of its
    backward-filter lanes (``wgrad``) for ``problem``'s filter."""

    def __init__(self, problem: ConvProblem, wgrad: bool) -> None:
        self.fork = Event(timing=False)
        self.join = Event(timing=False)
        self.desc = None
        if wgrad:
            n = math.prod(problem.w_shape)
            # dw and the scratch are both dense, so the add is over n elements in order
            self.desc = TensorDescriptor((1, n, 1, 1), (n, 1, 1, 1), problem.dtype)
            scalar = ctypes.c_double if problem.dtype == "float64" else ctypes.c_float
            self._one = scalar(1.0)
            self._run = lib.raw("cudnnTransformTensor")
            self._ptr = self.desc.handle

    def split_off(self, main: int, side: Stream) -> None:
        """Order ``side`` after what is queued on stream ``main`` so far."""
        self.fork.record(main)
        side.wait_event(self.fork)

    def merge(self, main: int, side: Stream) -> None:
        """Order what is queued on stream ``main`` next after ``side``'s work so far."""
        self.join.record(side)
        Stream.wrap(main).wait_event(self.join)

    def add(self, handle: Any, scratch: int, dw: int) -> None:
        """dw += the scratch gradient, on the handle's stream."""
        one = ctypes.byref(self._one)
        st = self._run(handle.handle, one, self._ptr, scratch, one, self._ptr, dw)
        if st:
            raise_status(st, "cudnnTransformTensor", pair="join")

    def close(self) -> None:
        """Destroy the events and the descriptor now (idempotent)."""
        self._ptr = 0
        for obj in (self.desc, self.fork, self.join):
            if obj is not None:
                obj.close()
