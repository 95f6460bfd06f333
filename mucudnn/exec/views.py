"""Micro-batch views of a convolution's tensors.

The batch is the leading axis in every packed layout (NCHW, NHWC, NCDHW,
NDHWC), so the rows ``[offset, offset + size)`` of a packed tensor are one
contiguous block and a leading-axis slice is a view. Which tensors carry the
batch depends on the direction, but in forward naming (see
:class:`~mucudnn.backends.ConvTensors`) it is always ``x`` and ``y``:

* forward: x (read) and y (written),
* backward-data: dx (written, stored as ``x``) and dy (read, stored as ``y``),
* backward-filter: x and dy (both read); dw (``w``) is whole in every call.

The filter is never sliced.
"""

from __future__ import annotations


from ..backends.base import ConvTensors
from ..problem import ConvProblem, Direction, MicroBatch
from ..errors import InvalidValueError
from ..typing_aliases import ArrayLike

__all__ = ["batch_view", "micro_batch_tensors", "check_micro_batches", "BATCHED"]

#: The tensors (forward naming) that carry the batch, per direction.
BATCHED: dict[Direction, tuple[str, str]] = {
    Direction.FORWARD: ("x", "y"),
    Direction.BACKWARD_DATA: ("x", "y"),
    Direction.BACKWARD_FILTER: ("x", "y"),
}


def batch_view(array: ArrayLike, offset: int, size: int) -> ArrayLike:
    """Rows ``[offset, offset + size)`` of ``array`` along its leading (batch) axis.

    Works for anything with leading-axis slicing that returns views (NumPy
    arrays, :class:`mucudnn.cuda.DeviceArray`).

    >>> import numpy as np
    >>> a = np.arange(24).reshape(4, 2, 3)
    >>> np.shares_memory(batch_view(a, 1, 2), a)
    True
    """
    if offset == 0 and size == array.shape[0]:
        return array
    return array[offset:offset + size]


def micro_batch_tensors(tensors: ConvTensors, direction: Direction,
                        offset: int, size: int) -> ConvTensors:
    """The :class:`ConvTensors` of one micro-batch: ``problem.with_batch(size)``
    with the batched tensors sliced to rows ``[offset, offset + size)``."""
    p: ConvProblem = tensors.problem
    if offset < 0 or size < 1 or offset + size > p.batch:
        raise InvalidValueError(
            f"micro-batch rows [{offset}, {offset + size}) outside the batch of {p.batch}")
    if offset == 0 and size == p.batch:
        return tensors
    mp = p.with_batch(size)
    return ConvTensors(mp, batch_view(tensors.x, offset, size), tensors.w,
                       batch_view(tensors.y, offset, size))


def check_micro_batches(micro_batches: tuple[MicroBatch, ...], batch: int) -> None:
    """Raise ValueError unless the micro-batches tile ``[0, batch)`` in order."""
    pos = 0
    for i, m in enumerate(micro_batches):
        if m.offset != pos:
            raise InvalidValueError(
                f"plan: micro-batch {i} starts at row {m.offset}, expected {pos} "
                "(micro-batches must be contiguous from 0)")
        if m.size < 1:
            raise InvalidValueError(f"plan: micro-batch {i} has size {m.size}, expected >= 1")
        pos += m.size
    if pos != batch:
        raise InvalidValueError(f"plan: micro-batches cover {pos} rows, expected the batch of {batch}")
