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

The modules, by job (each name is importable from here):

- :mod:`.direction`: :class:`Direction`, the three kernels a layer runs;
- :mod:`.layouts`: the tensor layouts and the conversions between a layout's
  own order and the canonical (N, C, spatial...) one;
- :mod:`.conv_problem`: :class:`ConvProblem` (shapes, geometry, data type,
  math mode, the bounds a problem must keep) and the supported data types;
- :mod:`.plan`: what planning makes of a problem: :class:`AlgoPerf`,
  :class:`MicroBatch`, :class:`Plan`, :func:`make_plan`;
- :mod:`.dict_form`: reading the values' dict (JSON) form back, and
  :class:`PlanFormatError` for a dict that describes none.
"""

from __future__ import annotations

from .conv_problem import (DTYPES, ITEMSIZE, MATH_MODES, MAX_DIM, MAX_TENSOR_BYTES,
                           MICRO_BATCH_ALIGNMENT, ConvProblem, IntOrTuple, conv_dtype,
                           transposed_spatial)
from .dict_form import PlanFormatError
from .direction import Direction
from .layouts import LAYOUTS, channels_last, from_canonical, packed_strides, to_canonical
from .plan import UNLIMITED_WORKSPACE, AlgoPerf, MicroBatch, Plan, make_plan

__all__ = [
    # values
    "AlgoPerf", "ConvProblem", "Direction", "MicroBatch", "Plan", "PlanFormatError", "make_plan",
    # layouts and data types
    "LAYOUTS", "DTYPES", "ITEMSIZE", "MATH_MODES", "channels_last", "to_canonical",
    "from_canonical", "packed_strides", "conv_dtype", "IntOrTuple", "transposed_spatial",
    # bounds
    "MICRO_BATCH_ALIGNMENT", "UNLIMITED_WORKSPACE", "MAX_DIM", "MAX_TENSOR_BYTES",
]
