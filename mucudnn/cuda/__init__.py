"""CUDA runtime through cuda-python: devices, memory, DeviceArray, streams, events, graphs.

This package is the only part of mucudnn that calls the CUDA runtime
(``cuda.bindings.runtime``). Importing it needs no GPU, no driver and not even
cuda-bindings; the first real device use raises :class:`NoDeviceError`
("no CUDA device or driver was found (<runtime error name>: ...)"), while
:func:`device_count` simply returns 0.
"""

from .device import (current_device, device_count, device_name, device_properties,
                     mem_get_info, require_device, set_device, synchronize, using_device)
from typing import TYPE_CHECKING, Any

from .. import dtypes as _dtypes
from ..dtypes import SUPPORTED_DTYPES, dtype_name, normalize_dtype, typestr
from ..errors import MissingAttributeError
from ._runtime import check
from .errors import CudaError, CudaOutOfMemoryError, NoDeviceError
from .graph import CudaGraph
from .memory import (DeviceArray, allocation_count, as_device_array, is_device_array_like,
                     memory_allocated)
from .hold import holding
from .stream import Event, Stream, as_stream, default_stream, is_capturing, stream_handle
from .timing import time_interleaved, time_on_stream

__all__ = [
    "CudaError", "CudaOutOfMemoryError", "NoDeviceError", "check",
    "device_count", "require_device", "current_device", "set_device", "using_device",
    "device_name", "device_properties", "mem_get_info", "synchronize",
    "Stream", "default_stream", "stream_handle", "is_capturing", "as_stream", "Event",
    "time_on_stream", "time_interleaved", "holding",
    "DeviceArray", "as_device_array", "is_device_array_like", "memory_allocated",
    "allocation_count",
    "BFLOAT16", "SUPPORTED_DTYPES", "dtype_name", "normalize_dtype", "typestr",
    "CudaGraph",
]

if TYPE_CHECKING:
    from ..dtypes import BFLOAT16


def __getattr__(name: str) -> Any:
    # BFLOAT16 is resolved on first use (Note [bfloat16 on first use], dtypes.py).
    if name == "BFLOAT16":
        return _dtypes.bfloat16()
    raise MissingAttributeError(f"module {__name__!r} has no attribute {name!r}")
