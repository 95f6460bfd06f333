"""C types of the binding: typed opaque handles and the *AlgoPerf_t structures.

The opaque handles are distinct ``c_void_p`` subclasses whose ``from_param``
accepts only their own kind (or an object whose ``_as_parameter_`` is of that
kind), so passing a FilterDescriptor where cuDNN wants a tensor descriptor
raises ``ctypes.ArgumentError`` in Python instead of reaching cuDNN.
"""

from __future__ import annotations

import ctypes
from typing import Any
from ctypes import c_float, c_int, c_size_t
from ..errors import InvalidTypeError

__all__ = [
    "OpaqueHandle", "cudnnHandle_t", "cudnnTensorDescriptor_t", "cudnnFilterDescriptor_t",
    "cudnnConvolutionDescriptor_t", "cudnnBackendDescriptor_t", "cudaStream_t",
    "cudnnTensorTransformDescriptor_t", "cudnnConvolutionFwdAlgoPerf_t", "cudnnConvolutionBwdDataAlgoPerf_t",
    "cudnnConvolutionBwdFilterAlgoPerf_t", "ALGO_PERF_FIELDS",
]


class OpaqueHandle(ctypes.c_void_p):
    """Base of the typed opaque pointers; never passed to cuDNN itself."""

    @classmethod
    def from_param(cls, obj):
        if isinstance(obj, cls):
            return obj
        param = getattr(obj, "_as_parameter_", None)
        if param is not None and isinstance(param, cls):
            return param
        raise InvalidTypeError(
            f"expected a {cls.__name__} (or an object wrapping one), got {type(obj).__name__}")

    def __repr__(self) -> str:
        v = self.value
        return f"{type(self).__name__}({'NULL' if v is None else hex(v)})"


class cudnnHandle_t(OpaqueHandle):
    """struct cudnnContext *"""


class cudnnTensorDescriptor_t(OpaqueHandle):
    """struct cudnnTensorStruct *"""


class cudnnFilterDescriptor_t(OpaqueHandle):
    """struct cudnnFilterStruct *"""


class cudnnConvolutionDescriptor_t(OpaqueHandle):
    """struct cudnnConvolutionStruct *"""


class cudnnTensorTransformDescriptor_t(OpaqueHandle):
    """struct cudnnTensorTransformStruct * (padding and folding of a tensor copy)"""


class cudnnBackendDescriptor_t(OpaqueHandle):
    """void * (graph/backend API descriptors; room for the cudnn-graph backend)."""


class cudaStream_t(ctypes.c_void_p):
    """A CUDA stream: accepts ints (raw handles), None (the legacy default
    stream) and objects with ``_as_parameter_``, like a plain ``void *``."""


# -- AlgoPerf structures (cudnn_cnn.h) -------------------------------------------
# typedef struct {
#     cudnnConvolution*Algo_t algo; cudnnStatus_t status; float time; size_t memory;
#     cudnnDeterminism_t determinism; cudnnMathType_t mathType; int reserved[3];
# } cudnnConvolution*AlgoPerf_t;

ALGO_PERF_FIELDS: list[tuple[str, Any]] = [
    ("algo", c_int),
    ("status", c_int),
    ("time", c_float),
    ("memory", c_size_t),
    ("determinism", c_int),
    ("mathType", c_int),
    ("reserved", c_int * 3),
]


class _AlgoPerf(ctypes.Structure):
    def as_dict(self) -> dict:
        return {"algo": int(self.algo), "status": int(self.status), "time": float(self.time),
                "memory": int(self.memory), "determinism": int(self.determinism),
                "mathType": int(self.mathType)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.as_dict()})"


class cudnnConvolutionFwdAlgoPerf_t(_AlgoPerf):
    _fields_ = ALGO_PERF_FIELDS


class cudnnConvolutionBwdDataAlgoPerf_t(_AlgoPerf):
    _fields_ = ALGO_PERF_FIELDS


class cudnnConvolutionBwdFilterAlgoPerf_t(_AlgoPerf):
    _fields_ = ALGO_PERF_FIELDS
