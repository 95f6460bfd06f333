"""mucudnn: micro-batched cuDNN convolutions from Python.

>>> import mucudnn as mu
>>> p = mu.ConvProblem((8, 3, 9, 9), (4, 3, 3, 3), padding=1)
>>> p.output_shape
(8, 4, 9, 9)
"""

from .api import Convolution, conv2d, conv3d, conv_backward_data, conv_backward_filter
from .backends import Backend, ConvTensors, available_backends, get_backend
from .exec import MicroBatchHandle, WorkspaceFallbackWarning
from .optimizer import (BenchmarkCache, CacheWarning, batch_sizes, benchmark, optimize,
                        optimize_network, optimize_wd, optimize_wr, pareto_front)
from .errors import (InvalidTypeError, InvalidValueError, MissingDependencyError, MucudnnError)
from .plans_io import PlanMismatchError, load_plans
from .problem import AlgoPerf, ConvProblem, Direction, MicroBatch, Plan, PlanFormatError

__version__ = "0.1.0"

__all__ = [
    "AlgoPerf", "Backend", "BenchmarkCache", "CacheWarning", "ConvProblem", "ConvTensors", "Convolution",
    "Direction", "InvalidTypeError", "InvalidValueError", "MicroBatch", "MicroBatchHandle",
    "MissingDependencyError", "MucudnnError", "Plan", "PlanFormatError", "PlanMismatchError",
    "WorkspaceFallbackWarning", "load_plans",
    "available_backends", "batch_sizes", "benchmark", "conv2d", "conv3d", "conv_backward_data",
    "conv_backward_filter", "get_backend", "optimize", "optimize_network", "optimize_wd",
    "optimize_wr", "pareto_front",
]
