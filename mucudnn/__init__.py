"""mucudnn: micro-batched cuDNN convolutions from Python.

>>> import mucudnn as mu
>>> p = mu.ConvProblem((8, 3, 9, 9), (4, 3, 3, 3), padding=1)
>>> p.output_shape
(8, 4, 9, 9)
"""

from ._cudnn.errors import (AllocationFailedError, BadParamError, CudnnError, CudnnLibraryError,
                            CudnnLibraryNotFoundError, CudnnVersionError, ExecutionFailedError,
                            InternalError, NotInitializedError, NotSupportedError)
from .api import (Convolution, MicroBatchHandle, clear_caches, conv2d, conv3d, conv_backward_data,
                  conv_backward_filter)
from .backends import Backend, BackendBase, ConvTensors, available_backends, get_backend
from .cuda import CudaError, CudaOutOfMemoryError, NoDeviceError
from .errors import (MucudnnError, PlanningInCaptureError, UnsupportedConfigError,
                     UnsupportedDtypeError, WorkspaceUnavailable)
from .exec import FallbackWarning, WorkspaceFallbackWarning
from .optimizer import (BenchmarkCache, CacheArgumentError, CachedBackend, CacheFileError,
                        CacheMissError, CacheWarning, Planner,
                        batch_sizes, benchmark, optimize, optimize_network, optimize_wd,
                        optimize_wr, pareto_front)
from .problem import AlgoPerf, ConvProblem, Direction, MicroBatch, Plan
from .units import parse_bytes

__version__ = "0.1.0"

__all__ = [
    # values
    "AlgoPerf", "ConvProblem", "Direction", "MicroBatch", "Plan",
    # running convolutions
    "Convolution", "MicroBatchHandle", "conv2d", "conv3d", "conv_backward_data",
    "conv_backward_filter", "clear_caches",
    # backends
    "Backend", "BackendBase", "ConvTensors", "available_backends", "get_backend",
    "CachedBackend",
    # planning
    "BenchmarkCache", "Planner", "batch_sizes", "benchmark", "optimize", "optimize_network",
    "optimize_wd", "optimize_wr", "pareto_front", "parse_bytes",
    # errors and warnings
    "MucudnnError", "CudaError", "CudaOutOfMemoryError", "NoDeviceError", "CudnnError",
    "NotInitializedError", "BadParamError", "NotSupportedError", "InternalError",
    "AllocationFailedError", "ExecutionFailedError", "CudnnLibraryError",
    "CudnnLibraryNotFoundError", "CudnnVersionError", "UnsupportedDtypeError",
    "UnsupportedConfigError", "WorkspaceUnavailable", "PlanningInCaptureError",
    "CacheArgumentError", "CacheFileError", "CacheMissError", "CacheWarning",
    "FallbackWarning", "WorkspaceFallbackWarning",
]
