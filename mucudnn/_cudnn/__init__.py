"""Raw ctypes binding to libcudnn: loader, prototypes, enums, errors, handles and descriptors.

Importing this package loads nothing; libcudnn is found and loaded on first use
(see :mod:`mucudnn._cudnn.loader` for the search order). No policy lives here:
micro-batching, planning and memory management are elsewhere.

>>> from mucudnn import _cudnn
>>> _cudnn.get_version() >= 90000
True
"""

import ctypes

from .backend_api import (
    BackendDescriptor, live_backend_descriptor_counts, live_backend_descriptors,
)
from .descriptors import (
    ConvolutionDescriptor, FilterDescriptor, TensorDescriptor, live_descriptor_counts,
    live_descriptors, output_dims, tensor_format,
)
from .enums import (
    ConvolutionBwdDataAlgo, ConvolutionBwdFilterAlgo, ConvolutionFwdAlgo, ConvolutionMode,
    DataType, Determinism, LibraryPropertyType, MathType, NanPropagation, Status, TensorFormat,
    algo_enum, c_name, compute_type, data_type, math_type,
)
from .errors import (
    AllocationFailedError, BadParamError, CudnnError, CudnnLibraryError,
    CudnnLibraryNotFoundError, CudnnVersionError, ExecutionFailedError, Int32RangeError,
    Int64RangeError, IntFieldTypeError, IntRangeError, InternalError, NotInitializedError,
    NotSupportedError, from_status, raise_for_status,
)
from .handle import Handle, get_handle, live_handles
from .loader import (
    get_cudart_version, get_version, library, library_path, library_source, version_string,
    version_tuple,
)
from .prototypes import PROTOTYPES, Prototype, last_error_string, lib, register
from .structs import (
    cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdFilterAlgoPerf_t,
    cudnnConvolutionFwdAlgoPerf_t,
)


def get_property(which: "LibraryPropertyType | str | int") -> int:
    """cudnnGetProperty: MAJOR_VERSION, MINOR_VERSION or PATCH_LEVEL."""
    if isinstance(which, str):
        which = LibraryPropertyType[which.upper()]
    v = ctypes.c_int()
    lib.cudnnGetProperty(int(which), ctypes.byref(v))
    return v.value


__all__ = [
    # loading
    "get_version", "get_cudart_version", "version_string", "version_tuple", "library",
    "library_path", "library_source", "get_property",
    # prototypes
    "lib", "PROTOTYPES", "Prototype", "register", "last_error_string",
    # errors
    "CudnnError", "NotInitializedError", "BadParamError", "NotSupportedError", "InternalError",
    "AllocationFailedError", "ExecutionFailedError", "CudnnLibraryError",
    "CudnnLibraryNotFoundError", "CudnnVersionError", "from_status", "raise_for_status",
    "IntRangeError", "Int32RangeError", "Int64RangeError", "IntFieldTypeError",
    # enums
    "Status", "DataType", "MathType", "NanPropagation", "TensorFormat", "ConvolutionMode",
    "Determinism", "ConvolutionFwdAlgo", "ConvolutionBwdDataAlgo", "ConvolutionBwdFilterAlgo",
    "LibraryPropertyType", "c_name", "data_type", "compute_type", "math_type", "algo_enum",
    # structs
    "cudnnConvolutionFwdAlgoPerf_t", "cudnnConvolutionBwdDataAlgoPerf_t",
    "cudnnConvolutionBwdFilterAlgoPerf_t",
    # objects
    "Handle", "get_handle", "live_handles", "TensorDescriptor",
    "FilterDescriptor", "ConvolutionDescriptor", "live_descriptors", "live_descriptor_counts",
    "output_dims", "tensor_format",
    # backend (graph) API
    "BackendDescriptor", "live_backend_descriptors", "live_backend_descriptor_counts",
    "BackendDescriptorType", "BackendAttributeName", "BackendAttributeType", "BackendHeurMode",
    "BackendNumericalNote", "BackendBehaviorNote", "BackendKnobType",
]
