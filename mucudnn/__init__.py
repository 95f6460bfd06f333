"""mucudnn: micro-batched cuDNN convolutions from Python.

>>> import mucudnn as mu
>>> p = mu.ConvProblem((8, 3, 9, 9), (4, 3, 3, 3), padding=1)
>>> p.output_shape
(8, 4, 9, 9)
"""

from .backends import Backend, ConvTensors, available_backends, get_backend
from .problem import AlgoPerf, ConvProblem, Direction, MicroBatch, Plan

__version__ = "0.1.0"

__all__ = [
    "AlgoPerf", "Backend", "ConvProblem", "ConvTensors", "Direction", "MicroBatch", "Plan",
    "available_backends", "get_backend",
]
