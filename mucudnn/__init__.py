"""mucudnn: micro-batched cuDNN convolutions from Python.

Under a workspace limit cuDNN falls back to slow convolution algorithms; the
fast ones need workspace that grows with the batch. mucudnn splits a
mini-batch of N samples into micro-batches (b1 + b2 + ... = N) and runs each
with the fastest algorithm whose workspace fits the limit you set: the same
convolution (forward, backward-data, backward-filter), only faster. It is pure
Python (ctypes bindings to cuDNN 9, cuda-python for device memory), and a
NumPy backend runs the whole engine on any machine.

Three ways to use it:

* **On arrays**: :class:`Convolution` is a layer whose plan for each
  direction is made on first use and cached; :func:`conv1d`, :func:`conv2d`,
  :func:`conv3d`, :func:`conv_transpose1d`/``2d``/``3d``,
  :func:`conv_backward_data` and :func:`conv_backward_filter` are the
  functional forms. NumPy arrays, :class:`mucudnn.cuda.DeviceArray` or
  anything with ``__cuda_array_interface__`` (PyTorch, CuPy) go in, and come
  back in the kind given.
* **For frameworks that drive cuDNN themselves**: :class:`MicroBatchHandle`
  has cuDNN's convolution calls (descriptors, device pointers, alpha/beta) and
  runs them micro-batched; its :meth:`~MicroBatchHandle.optimize_wd` shares one
  workspace budget among all layers.
* **The optimizer alone**: :func:`optimize` makes a :class:`Plan` for one
  :class:`ConvProblem` through a backend and the SQLite benchmark cache,
  :func:`optimize_network` one budget for many; :func:`optimize_wr`,
  :func:`pareto_front` and :func:`optimize_wd` work on your own measurements.
  The command line (``python -m mucudnn bench | optimize | plot``) does this
  for whole networks; :func:`load_plans` reads the plans it saves.

On the CPU (the NumPy backend, so no GPU is needed):

>>> import numpy as np
>>> import mucudnn as mu
>>> conv = mu.Convolution((8, 3, 16, 16), (4, 3, 3, 3), padding=1, backend="numpy",
...                       workspace_limit=64 << 20, cache="off")
>>> y = conv.forward(np.ones((8, 3, 16, 16), np.float32), np.ones((4, 3, 3, 3), np.float32))
>>> y.shape, float(y[0, 0, 5, 5])
((8, 4, 16, 16), 27.0)
>>> conv.plan("forward").batch, conv.plan("forward").workspace_bytes <= 64 << 20
(8, True)

Plans from measurements (an algorithm's time and workspace at each size):

>>> perf = {4: [mu.AlgoPerf(algo=1, time_ms=1.0, workspace_bytes=100),
...             mu.AlgoPerf(algo=0, time_ms=8.0, workspace_bytes=0)],
...         2: [mu.AlgoPerf(algo=1, time_ms=0.6, workspace_bytes=50)]}
>>> plan = mu.optimize_wr(perf, batch=4, workspace_limit=64, policy="powerOfTwo")
>>> plan.describe(), plan.time_ms, plan.undivided_time_ms
('2 x 2', 1.2, 8.0)

Every error is a :class:`MucudnnError` (and the builtin it always was, such
as ValueError). Read more: README.md (install, quick start, configuration:
environment variables, extras and the ``mucudnn`` logger), docs/BENCHMARKS.md
(what it gains on a GPU), ``help(mu.Convolution)``, ``python -m mucudnn --help``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .errors import (InvalidTypeError, InvalidValueError, MissingDependencyError, MucudnnError,
                     PlanningInCaptureError, UnsupportedConfigError, UnsupportedDtypeError,
                     WorkspaceUnavailable)
from .errors import MissingAttributeError as _MissingAttributeError

if TYPE_CHECKING:
    from ._cudnn.errors import (AllocationFailedError, BadParamError, CudnnError,
                                CudnnLibraryError, CudnnLibraryNotFoundError, CudnnVersionError,
                                ExecutionFailedError, InternalError, NotInitializedError,
                                NotSupportedError)
    from .api import (Convolution, MicroBatchHandle, clear_caches, conv1d, conv2d, conv3d,
                      conv_backward_data, conv_backward_filter, conv_transpose1d,
                      conv_transpose2d, conv_transpose3d)
    from .backends import Backend, BackendBase, ConvTensors, available_backends, get_backend
    from .cuda import CudaError, CudaOutOfMemoryError, NoDeviceError
    from .exec import FallbackWarning, WorkspaceFallbackWarning
    from .optimizer import (BenchmarkCache, CacheArgumentError, CachedBackend, CacheFileError,
                            CacheMissError, CacheWarning, Planner,
                            batch_sizes, optimize, optimize_network, optimize_wd,
                            optimize_wr, pareto_front)
    from .optimizer.benchmark import benchmark  # the function, which mypy tells apart from the module here
    from .plans_io import PlanMismatchError, load_plans
    from .problem import AlgoPerf, ConvProblem, Direction, MicroBatch, Plan, PlanFormatError
    from .units import parse_bytes

# Note [public names on first use]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `import mucudnn` loads only the version and the errors of errors.py; every
# other public name is imported from its room the first time it is read (PEP
# 562 module __getattr__), because the rooms behind them pull in ml_dtypes,
# SciPy, networkx, tqdm and the cuDNN binding: seconds that `import mucudnn`
# and `python -m mucudnn --version` need not pay. The imports under
# TYPE_CHECKING above name the same objects for type checkers and readers;
# tests/test_import_budget.py holds both to it.
_LAZY: dict[str, str] = {
    **dict.fromkeys(["AllocationFailedError", "BadParamError", "CudnnError", "CudnnLibraryError",
                     "CudnnLibraryNotFoundError", "CudnnVersionError", "ExecutionFailedError",
                     "InternalError", "NotInitializedError", "NotSupportedError"],
                    "._cudnn.errors"),
    **dict.fromkeys(["Convolution", "MicroBatchHandle", "clear_caches", "conv1d", "conv2d", "conv3d",
                     "conv_backward_data", "conv_backward_filter", "conv_transpose1d",
                     "conv_transpose2d", "conv_transpose3d"], ".api"),
    **dict.fromkeys(["Backend", "BackendBase", "ConvTensors", "available_backends",
                     "get_backend"], ".backends"),
    **dict.fromkeys(["CudaError", "CudaOutOfMemoryError", "NoDeviceError"], ".cuda"),
    **dict.fromkeys(["FallbackWarning", "WorkspaceFallbackWarning"], ".exec"),
    **dict.fromkeys(["BenchmarkCache", "CacheArgumentError", "CachedBackend", "CacheFileError",
                     "CacheMissError", "CacheWarning", "Planner", "batch_sizes", "benchmark",
                     "optimize", "optimize_network", "optimize_wd", "optimize_wr",
                     "pareto_front"], ".optimizer"),
    **dict.fromkeys(["PlanMismatchError", "load_plans"], ".plans_io"),
    **dict.fromkeys(["AlgoPerf", "ConvProblem", "Direction", "MicroBatch", "Plan",
                     "PlanFormatError"], ".problem"),
    "parse_bytes": ".units",
}
#: The rooms that `mucudnn.<name>` reaches without importing them first: those
#: the public names live in and what they import (`mucudnn.torch`, `bench` and
#: `plot` are imported by name, as always).
_ROOMS = frozenset({"_cudnn", "api", "backends", "caches", "cuda", "dtypes", "exec", "networks",
                    "optimizer", "plans_io", "problem", "units"})


def __getattr__(name: str) -> Any:
    # Note [public names on first use].
    room = _LAZY.get(name)
    if room is not None:
        value = getattr(importlib.import_module(room, __name__), name)
    elif name in _ROOMS:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise _MissingAttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _ROOMS)


__all__ = [
    # values
    "AlgoPerf", "ConvProblem", "Direction", "MicroBatch", "Plan",
    # running convolutions
    "Convolution", "MicroBatchHandle", "conv1d", "conv2d", "conv3d", "conv_backward_data",
    "conv_backward_filter", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "clear_caches",
    # backends
    "Backend", "BackendBase", "ConvTensors", "available_backends", "get_backend",
    "CachedBackend",
    # planning
    "BenchmarkCache", "Planner", "batch_sizes", "benchmark", "optimize", "optimize_network",
    "optimize_wd", "optimize_wr", "pareto_front", "parse_bytes", "load_plans",
    # errors and warnings
    "MucudnnError", "CudaError", "CudaOutOfMemoryError", "NoDeviceError", "CudnnError",
    "NotInitializedError", "BadParamError", "NotSupportedError", "InternalError",
    "AllocationFailedError", "ExecutionFailedError", "CudnnLibraryError",
    "CudnnLibraryNotFoundError", "CudnnVersionError", "UnsupportedDtypeError",
    "UnsupportedConfigError", "WorkspaceUnavailable", "PlanningInCaptureError",
    "CacheArgumentError", "CacheFileError", "CacheMissError", "CacheWarning",
    "FallbackWarning", "WorkspaceFallbackWarning", "InvalidTypeError", "InvalidValueError",
    "MissingDependencyError", "PlanFormatError", "PlanMismatchError",
]


# Note [heavy imports where they are used]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The rooms a training process loads (mucudnn.torch, the planner, the
# backends) import SciPy, networkx and tqdm inside the functions that use them
# (the ILP, the WR graph, FFT sizes, progress bars), not at module level: a
# converted model that never solves an ILP or shows a bar does not load them.
# tests/test_import_budget.py holds `import mucudnn.torch` to it.
