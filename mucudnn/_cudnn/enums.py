"""cuDNN 9 enumerations as IntEnums, values taken from cudnn_graph.h, cudnn_ops.h
and cudnn_cnn.h (cuDNN 9.x), plus the name mappings mucudnn uses.

Each member is named after its C enumerator without the common prefix;
:func:`c_name` gives the full C name (``c_name(Status.BAD_PARAM) ==
"CUDNN_STATUS_BAD_PARAM"``), which the tests check against the header text.
"""

from __future__ import annotations

import enum
from typing import Union
from ..errors import InvalidValueError


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


# -- backend (graph) API enums (cudnn_graph.h) ------------------------------------
# Only the families and members mucudnn's cudnn-graph backend needs; every
# member exists in cuDNN 9.19 (the oldest the graph backend is tested on) unless
# BACKEND_MIN_VERSION says otherwise.


class BackendDescriptorType(enum.IntEnum):
    """cudnnBackendDescriptorType_t (the ones the convolution graphs use)."""

    POINTWISE_DESCRIPTOR = 0
    CONVOLUTION_DESCRIPTOR = 1
    ENGINE_DESCRIPTOR = 2
    ENGINECFG_DESCRIPTOR = 3
    ENGINEHEUR_DESCRIPTOR = 4
    EXECUTION_PLAN_DESCRIPTOR = 5
    INTERMEDIATE_INFO_DESCRIPTOR = 6
    KNOB_CHOICE_DESCRIPTOR = 7
    KNOB_INFO_DESCRIPTOR = 8
    LAYOUT_INFO_DESCRIPTOR = 9
    OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10
    OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11
    OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR = 12
    OPERATION_POINTWISE_DESCRIPTOR = 13
    OPERATION_GEN_STATS_DESCRIPTOR = 14
    OPERATIONGRAPH_DESCRIPTOR = 15
    VARIANT_PACK_DESCRIPTOR = 16
    TENSOR_DESCRIPTOR = 17


class BackendAttributeName(enum.IntEnum):
    """cudnnBackendAttributeName_t: the tensor, convolution, convolution-operation,
    operation-graph, heuristics, engine, engine-config, knob, execution-plan and
    variant-pack families."""

    # convolution
    CONVOLUTION_COMP_TYPE = 100
    CONVOLUTION_CONV_MODE = 101
    CONVOLUTION_DILATIONS = 102
    CONVOLUTION_FILTER_STRIDES = 103
    CONVOLUTION_POST_PADDINGS = 104
    CONVOLUTION_PRE_PADDINGS = 105
    CONVOLUTION_SPATIAL_DIMS = 106
    # engine heuristics
    ENGINEHEUR_MODE = 200
    ENGINEHEUR_OPERATION_GRAPH = 201
    ENGINEHEUR_RESULTS = 202
    ENGINEHEUR_SM_COUNT_TARGET = 203
    # engine config
    ENGINECFG_ENGINE = 300
    ENGINECFG_INTERMEDIATE_INFO = 301
    ENGINECFG_KNOB_CHOICES = 302
    ENGINECFG_WORKSPACE_SIZE = 303  # cuDNN 9.2
    ENGINECFG_SHARED_MEMORY_USED = 304  # cuDNN 9.2
    # execution plan
    EXECUTION_PLAN_HANDLE = 400  # deprecated in later 9.x headers, still accepted
    EXECUTION_PLAN_ENGINE_CONFIG = 401
    EXECUTION_PLAN_WORKSPACE_SIZE = 402
    EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS = 403
    EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS = 404
    EXECUTION_PLAN_JSON_REPRESENTATION = 405
    # knob choice
    KNOB_CHOICE_KNOB_TYPE = 600
    KNOB_CHOICE_KNOB_VALUE = 601
    # convolution operations
    OPERATION_CONVOLUTION_FORWARD_ALPHA = 700
    OPERATION_CONVOLUTION_FORWARD_BETA = 701
    OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702
    OPERATION_CONVOLUTION_FORWARD_W = 703
    OPERATION_CONVOLUTION_FORWARD_X = 704
    OPERATION_CONVOLUTION_FORWARD_Y = 705
    OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706
    OPERATION_CONVOLUTION_BWD_DATA_BETA = 707
    OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708
    OPERATION_CONVOLUTION_BWD_DATA_W = 709
    OPERATION_CONVOLUTION_BWD_DATA_DX = 710
    OPERATION_CONVOLUTION_BWD_DATA_DY = 711
    OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712
    OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713
    OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714
    OPERATION_CONVOLUTION_BWD_FILTER_DW = 715
    OPERATION_CONVOLUTION_BWD_FILTER_X = 716
    OPERATION_CONVOLUTION_BWD_FILTER_DY = 717
    # operation graph
    OPERATIONGRAPH_HANDLE = 800  # deprecated in later 9.x headers, still accepted
    OPERATIONGRAPH_OPS = 801
    OPERATIONGRAPH_ENGINE_GLOBAL_COUNT = 802
    # tensor
    TENSOR_BYTE_ALIGNMENT = 900
    TENSOR_DATA_TYPE = 901
    TENSOR_DIMENSIONS = 902
    TENSOR_STRIDES = 903
    TENSOR_VECTOR_COUNT = 904
    TENSOR_VECTORIZED_DIMENSION = 905
    TENSOR_UNIQUE_ID = 906
    TENSOR_IS_VIRTUAL = 907
    TENSOR_IS_BY_VALUE = 908
    TENSOR_REORDERING_MODE = 909
    # variant pack
    VARIANT_PACK_UNIQUE_IDS = 1000
    VARIANT_PACK_DATA_POINTERS = 1001
    VARIANT_PACK_INTERMEDIATES = 1002
    VARIANT_PACK_WORKSPACE = 1003
    # layout info, knob info
    LAYOUT_INFO_TENSOR_UID = 1100
    LAYOUT_INFO_TYPES = 1101
    KNOB_INFO_TYPE = 1200
    KNOB_INFO_MAXIMUM_VALUE = 1201
    KNOB_INFO_MINIMUM_VALUE = 1202
    KNOB_INFO_STRIDE = 1203
    # engine
    ENGINE_OPERATION_GRAPH = 1300
    ENGINE_GLOBAL_INDEX = 1301
    ENGINE_KNOB_INFO = 1302
    ENGINE_NUMERICAL_NOTE = 1303
    ENGINE_LAYOUT_INFO = 1304
    ENGINE_BEHAVIOR_NOTE = 1305
    ENGINE_SM_COUNT_TARGET = 1306


class BackendAttributeType(enum.IntEnum):
    """cudnnBackendAttributeType_t."""

    HANDLE = 0
    DATA_TYPE = 1
    BOOLEAN = 2
    INT64 = 3
    FLOAT = 4
    DOUBLE = 5
    VOID_PTR = 6
    CONVOLUTION_MODE = 7
    HEUR_MODE = 8
    KNOB_TYPE = 9
    NAN_PROPOGATION = 10  # sic (the header's spelling); deprecated
    NUMERICAL_NOTE = 11
    LAYOUT_TYPE = 12
    ATTRIB_NAME = 13
    POINTWISE_MODE = 14
    BACKEND_DESCRIPTOR = 15
    GENSTATS_MODE = 16
    BN_FINALIZE_STATS_MODE = 17
    REDUCTION_OPERATOR_TYPE = 18
    BEHAVIOR_NOTE = 19
    TENSOR_REORDERING_MODE = 20
    RESAMPLE_MODE = 21
    PADDING_MODE = 22
    INT32 = 23
    CHAR = 24
    SIGNAL_MODE = 25
    FRACTION = 26
    NORM_MODE = 27
    NORM_FWD_PHASE = 28
    RNG_DISTRIBUTION = 29


class BackendHeurMode(enum.IntEnum):
    """cudnnBackendHeurMode_t. A is the decision-tree heuristic, B the neural-net one
    (no 3-D, grouped or dilated convolutions), FALLBACK functional engines."""

    INSTANT = 0
    B = 1
    FALLBACK = 2
    A = 3


class BackendNumericalNote(enum.IntEnum):
    """cudnnBackendNumericalNote_t."""

    TENSOR_CORE = 0
    DOWN_CONVERT_INPUTS = 1
    REDUCED_PRECISION_REDUCTION = 2
    FFT = 3
    NONDETERMINISTIC = 4
    WINOGRAD = 5
    WINOGRAD_TILE_4x4 = 6
    WINOGRAD_TILE_6x6 = 7
    WINOGRAD_TILE_13x13 = 8
    STRICT_NAN_PROP = 9  # cuDNN 9.1


class BackendBehaviorNote(enum.IntEnum):
    """cudnnBackendBehaviorNote_t."""

    RUNTIME_COMPILATION = 0
    REQUIRES_FILTER_INT8x32_REORDER = 1
    REQUIRES_BIAS_INT8x32_REORDER = 2
    SUPPORTS_CUDA_GRAPH_NATIVE_API = 3  # cuDNN 9.5
    CUBLASLT_DEPENDENCY = 4  # cuDNN 9.15


class BackendKnobType(enum.IntEnum):
    """cudnnBackendKnobType_t. Knob types read back from cuDNN are kept as ints
    (a newer library may report types this enum does not list)."""

    SPLIT_K = 0  # deprecated
    SWIZZLE = 1
    TILE_SIZE = 2
    USE_TEX = 3  # deprecated
    EDGE = 4
    KBLOCK = 5  # deprecated
    LDGA = 6  # deprecated
    LDGB = 7  # deprecated
    CHUNK_K = 8  # deprecated
    SPLIT_H = 9  # deprecated
    WINO_TILE = 10  # deprecated
    MULTIPLY = 11
    SPLIT_K_BUF = 12
    TILEK = 13
    STAGES = 14
    REDUCTION_MODE = 15
    CTA_SPLIT_K_MODE = 16  # deprecated
    SPLIT_K_SLC = 17
    IDX_MODE = 18  # cuDNN 9.7
    SLICED = 19  # deprecated
    SPLIT_RS = 20  # deprecated
    SINGLEBUFFER = 21  # deprecated
    LDGC = 22  # deprecated
    SPECFILT = 23
    KERNEL_CFG = 24
    WORKSPACE = 25
    TILE_CGA = 26  # deprecated
    TILE_CGA_M = 27
    TILE_CGA_N = 28
    BLOCK_SIZE = 29
    OCCUPANCY = 30
    ARRAY_SIZE_PER_THREAD = 31
    NUM_C_PER_BLOCK = 32  # deprecated
    SPLIT_COLS = 33
    TILE_ROWS = 34
    TILE_COLS = 35
    LOAD_SIZE = 36
    CTA_COUNT = 37  # cuDNN 9.7
    STREAM_K = 38  # cuDNN 9.7
    SPLIT_P_SLC = 39  # cuDNN 9.7
    TILE_M = 40  # cuDNN 9.7
    TILE_N = 41  # cuDNN 9.7
    WARP_SPEC_CFG = 42  # cuDNN 9.7
    SWAP_AB = 43  # cuDNN 9.18
    INPUT_TMA_ENABLE = 44  # cuDNN 9.22: newer than 9.19, only ever read back
    OUTPUT_TMA_ENABLE = 45  # cuDNN 9.22: newer than 9.19, only ever read back


#: Members added after cuDNN 9.0, by (enum, member name): the cuDNN version
#: (cudnnGetVersion encoding) that introduced them. mucudnn sets none of the
#: members newer than 9.19 (its oldest tested library).
BACKEND_MIN_VERSION: dict[tuple[type, str], int] = {
    (BackendAttributeName, "ENGINECFG_WORKSPACE_SIZE"): 90200,
    (BackendAttributeName, "ENGINECFG_SHARED_MEMORY_USED"): 90200,
    (BackendNumericalNote, "STRICT_NAN_PROP"): 90100,
    (BackendBehaviorNote, "SUPPORTS_CUDA_GRAPH_NATIVE_API"): 90500,
    (BackendBehaviorNote, "CUBLASLT_DEPENDENCY"): 91500,
    (BackendKnobType, "IDX_MODE"): 90700,
    (BackendKnobType, "CTA_COUNT"): 90700,
    (BackendKnobType, "STREAM_K"): 90700,
    (BackendKnobType, "SPLIT_P_SLC"): 90700,
    (BackendKnobType, "TILE_M"): 90700,
    (BackendKnobType, "TILE_N"): 90700,
    (BackendKnobType, "WARP_SPEC_CFG"): 90700,
    (BackendKnobType, "SWAP_AB"): 91800,
    (BackendKnobType, "INPUT_TMA_ENABLE"): 92200,
    (BackendKnobType, "OUTPUT_TMA_ENABLE"): 92200,
    (DataType, "BYTE_BOOLEAN"): 92500,
    (DataType, "FP8_E5M3"): 92600,
}


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
    BackendDescriptorType: "CUDNN_BACKEND_",
    BackendAttributeName: "CUDNN_ATTR_",
    BackendAttributeType: "CUDNN_TYPE_",
    BackendHeurMode: "CUDNN_HEUR_MODE_",
    BackendNumericalNote: "CUDNN_NUMERICAL_NOTE_",
    BackendBehaviorNote: "CUDNN_BEHAVIOR_NOTE_",
    BackendKnobType: "CUDNN_KNOB_TYPE_",
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
            raise InvalidValueError(
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
            raise InvalidValueError(
                f"math: expected one of {list(MATH_TO_CUDNN)}, got {math!r}") from None
    return MathType(int(math))


def algo_enum(direction) -> type[enum.IntEnum]:
    """The algorithm enum of a Direction (or its value)."""
    key = getattr(direction, "value", direction)
    return {"forward": ConvolutionFwdAlgo, "backward_data": ConvolutionBwdDataAlgo,
            "backward_filter": ConvolutionBwdFilterAlgo}[key]
