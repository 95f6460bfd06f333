"""cuDNN 9 enumerations as IntEnums, values taken from cudnn_graph.h, cudnn_ops.h
and cudnn_cnn.h (cuDNN 9.x), plus the name mappings mucudnn uses.

Each member is named after its C enumerator without the common prefix;
:func:`c_name` gives the full C name (``c_name(Status.BAD_PARAM) ==
"CUDNN_STATUS_BAD_PARAM"``), which the tests check against the header text.
"""

from __future__ import annotations

import enum
from typing import Union


class Status(enum.IntEnum):
    """cudnnStatus_t. cuDNN 9 numbers codes category x 1000 + detail."""

    SUCCESS = 0
    # 1000: uncategorized (initialisation, versions, licensing)
    NOT_INITIALIZED = 1001
    SUBLIBRARY_VERSION_MISMATCH = 1002
    SERIALIZATION_VERSION_MISMATCH = 1003
    DEPRECATED = 1004
    LICENSE_ERROR = 1005
    RUNTIME_IN_PROGRESS = 1006
    RUNTIME_FP_OVERFLOW = 1007
    SUBLIBRARY_LOADING_FAILED = 1008
    # 2000: bad parameter
    BAD_PARAM = 2000
    INVALID_VALUE = 2001  # deprecated alias category member
    BAD_PARAM_NULL_POINTER = 2002
    BAD_PARAM_MISALIGNED_POINTER = 2003
    BAD_PARAM_NOT_FINALIZED = 2004
    BAD_PARAM_OUT_OF_BOUND = 2005
    BAD_PARAM_SIZE_INSUFFICIENT = 2006
    BAD_PARAM_STREAM_MISMATCH = 2007
    BAD_PARAM_SHAPE_MISMATCH = 2008
    BAD_PARAM_DUPLICATED_ENTRIES = 2009
    BAD_PARAM_ATTRIBUTE_TYPE = 2010
    BAD_PARAM_CUDA_GRAPH_MISMATCH = 2011
    BAD_PARAM_DESCRIPTOR_TYPE = 2012
    # 3000: not supported
    NOT_SUPPORTED = 3000
    NOT_SUPPORTED_GRAPH_PATTERN = 3001
    NOT_SUPPORTED_SHAPE = 3002
    NOT_SUPPORTED_DATA_TYPE = 3003
    NOT_SUPPORTED_LAYOUT = 3004
    NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER = 3005
    NOT_SUPPORTED_INCOMPATIBLE_CUDART = 3006
    NOT_SUPPORTED_ARCH_MISMATCH = 3007
    NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING = 3008
    NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE = 3009
    NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT = 3010
    NOT_SUPPORTED_PADDING = 3011
    NOT_SUPPORTED_BAD_LAUNCH_PARAM = 3012
    NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API = 3013
    NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE = 3014
    # 4000: internal error
    INTERNAL_ERROR = 4000
    INTERNAL_ERROR_COMPILATION_FAILED = 4001
    INTERNAL_ERROR_UNEXPECTED_VALUE = 4002
    INTERNAL_ERROR_HOST_ALLOCATION_FAILED = 4003
    INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004
    INTERNAL_ERROR_BAD_LAUNCH_PARAM = 4005
    INTERNAL_ERROR_TEXTURE_CREATION_FAILED = 4006
    # 5000: execution failed
    EXECUTION_FAILED = 5000
    EXECUTION_FAILED_CUDA_DRIVER = 5001
    EXECUTION_FAILED_CUBLAS = 5002
    EXECUTION_FAILED_CUDART = 5003
    EXECUTION_FAILED_CURAND = 5004
    # deprecated aliases kept by the header
    ALLOC_FAILED = 4003
    ARCH_MISMATCH = 3007
    MAPPING_ERROR = 4006
    RUNTIME_PREREQUISITE_MISSING = 3008
    VERSION_MISMATCH = 1002

    @property
    def category(self) -> int:
        """The category code (``CUDNN_STATUS_CATEGORY``): 0, 1000, 2000, ..."""
        return status_category(int(self))


def status_category(code: int) -> int:
    """``CUDNN_STATUS_CATEGORY(code)``: ``code // 1000 * 1000``."""
    return int(code) // 1000 * 1000


def status_name(code: int) -> str:
    """The C name of a status code; unknown codes keep their number."""
    try:
        return c_name(Status(int(code)))
    except ValueError:
        return f"CUDNN_STATUS_UNKNOWN_{int(code)}"


class DataType(enum.IntEnum):
    """cudnnDataType_t."""

    FLOAT = 0
    DOUBLE = 1
    HALF = 2
    INT8 = 3
    INT32 = 4
    INT8x4 = 5
    UINT8 = 6
    UINT8x4 = 7
    INT8x32 = 8
    BFLOAT16 = 9
    INT64 = 10
    BOOLEAN = 11
    FP8_E4M3 = 12
    FP8_E5M2 = 13
    FAST_FLOAT_FOR_FP8 = 14
    FP8_E8M0 = 15
    FP4_E2M1 = 16
    INT4 = 17
    UINT4 = 18
    UINT32 = 19
    COMPLEX_FP32 = 20
    COMPLEX_FP64 = 21
    BYTE_BOOLEAN = 22  # cuDNN 9.25
    FP8_E5M3 = 23  # cuDNN 9.26


class MathType(enum.IntEnum):
    """cudnnMathType_t."""

    DEFAULT_MATH = 0
    TENSOR_OP_MATH = 1
    TENSOR_OP_MATH_ALLOW_CONVERSION = 2
    FMA_MATH = 3


class NanPropagation(enum.IntEnum):
    """cudnnNanPropagation_t (deprecated in cuDNN 9, kept for completeness)."""

    NOT_PROPAGATE_NAN = 0
    PROPAGATE_NAN = 1


class TensorFormat(enum.IntEnum):
    """cudnnTensorFormat_t."""

    NCHW = 0
    NHWC = 1
    NCHW_VECT_C = 2


class ConvolutionMode(enum.IntEnum):
    """cudnnConvolutionMode_t."""

    CONVOLUTION = 0
    CROSS_CORRELATION = 1


class Determinism(enum.IntEnum):
    """cudnnDeterminism_t."""

    NON_DETERMINISTIC = 0
    DETERMINISTIC = 1


class ConvolutionFwdAlgo(enum.IntEnum):
    """cudnnConvolutionFwdAlgo_t."""

    IMPLICIT_GEMM = 0
    IMPLICIT_PRECOMP_GEMM = 1
    GEMM = 2
    DIRECT = 3
    FFT = 4
    FFT_TILING = 5
    WINOGRAD = 6
    WINOGRAD_NONFUSED = 7
    COUNT = 8


class ConvolutionBwdDataAlgo(enum.IntEnum):
    """cudnnConvolutionBwdDataAlgo_t."""

    ALGO_0 = 0
    ALGO_1 = 1
    FFT = 2
    FFT_TILING = 3
    WINOGRAD = 4
    WINOGRAD_NONFUSED = 5
    COUNT = 6


class ConvolutionBwdFilterAlgo(enum.IntEnum):
    """cudnnConvolutionBwdFilterAlgo_t."""

    ALGO_0 = 0
    ALGO_1 = 1
    FFT = 2
    ALGO_3 = 3
    WINOGRAD = 4
    WINOGRAD_NONFUSED = 5
    FFT_TILING = 6
    COUNT = 7


class LibraryPropertyType(enum.IntEnum):
    """libraryPropertyType (CUDA library_types.h), for cudnnGetProperty."""

    MAJOR_VERSION = 0
    MINOR_VERSION = 1
    PATCH_LEVEL = 2


#: The C prefix of each enum's members.
C_PREFIX: dict[type, str] = {
    Status: "CUDNN_STATUS_",
    DataType: "CUDNN_DATA_",
    MathType: "CUDNN_",
    NanPropagation: "CUDNN_",
    TensorFormat: "CUDNN_TENSOR_",
    ConvolutionMode: "CUDNN_",
    Determinism: "CUDNN_",
    ConvolutionFwdAlgo: "CUDNN_CONVOLUTION_FWD_ALGO_",
    ConvolutionBwdDataAlgo: "CUDNN_CONVOLUTION_BWD_DATA_ALGO_",
    ConvolutionBwdFilterAlgo: "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_",
    LibraryPropertyType: "",
}


def c_name(member: "enum.IntEnum | tuple[type, str]") -> str:
    """The C enumerator name of a member, e.g. ``CUDNN_TENSOR_OP_MATH``;
    ``ConvolutionBwdDataAlgo.ALGO_0`` is ``CUDNN_CONVOLUTION_BWD_DATA_ALGO_0``.
    Also takes ``(enum class, member name)`` to name aliases."""
    cls, name = member if isinstance(member, tuple) else (type(member), member.name)
    return (C_PREFIX[cls] + name).replace("_ALGO_ALGO_", "_ALGO_")


# -- mucudnn names -> cuDNN values ---------------------------------------------

#: ConvProblem dtype names -> cudnnDataType_t.
DTYPE_TO_CUDNN: dict[str, DataType] = {
    "float32": DataType.FLOAT,
    "float16": DataType.HALF,
    "bfloat16": DataType.BFLOAT16,
    "float64": DataType.DOUBLE,
}
CUDNN_TO_DTYPE: dict[DataType, str] = {v: k for k, v in DTYPE_TO_CUDNN.items()}

#: ConvProblem math names -> cudnnMathType_t.
MATH_TO_CUDNN: dict[str, MathType] = {
    "default": MathType.DEFAULT_MATH,
    "fma": MathType.FMA_MATH,
    "tensor_op": MathType.TENSOR_OP_MATH,
    "tensor_op_allow_conversion": MathType.TENSOR_OP_MATH_ALLOW_CONVERSION,
}


def data_type(dtype: Union[str, int, DataType]) -> DataType:
    """A dtype name ("float32", ...) or cudnnDataType_t value -> DataType."""
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, str):
        try:
            return DTYPE_TO_CUDNN[dtype]
        except KeyError:
            raise ValueError(
                f"dtype: expected one of {list(DTYPE_TO_CUDNN)}, got {dtype!r}") from None
    name = getattr(dtype, "name", None)  # numpy dtype
    if isinstance(name, str) and name in DTYPE_TO_CUDNN:
        return DTYPE_TO_CUDNN[name]
    return DataType(int(dtype))


def compute_type(dtype: str) -> DataType:
    """The convolution compute (accumulation) type for data of ``dtype``:
    float32 for float16/bfloat16/float32, float64 for float64."""
    return DataType.DOUBLE if data_type(dtype) == DataType.DOUBLE else DataType.FLOAT


def math_type(math: Union[str, int, MathType]) -> MathType:
    """A ConvProblem math name ("default", "fma", ...) or value -> MathType."""
    if isinstance(math, MathType):
        return math
    if isinstance(math, str):
        try:
            return MATH_TO_CUDNN[math.lower()]
        except KeyError:
            raise ValueError(
                f"math: expected one of {list(MATH_TO_CUDNN)}, got {math!r}") from None
    return MathType(int(math))


def algo_enum(direction) -> type:
    """The algorithm enum of a Direction (or its value)."""
    key = getattr(direction, "value", direction)
    return {"forward": ConvolutionFwdAlgo, "backward_data": ConvolutionBwdDataAlgo,
            "backward_filter": ConvolutionBwdFilterAlgo}[key]
