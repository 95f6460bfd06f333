"""The prototype table of every libcudnn function the binding uses, bound lazily.

One declarative table of :class:`Prototype` rows (name, return type, argument
types, minimum cuDNN version). :data:`lib` binds a row on first attribute
access; functions returning ``cudnnStatus_t`` go through one error-checking
wrapper that raises the matching :class:`~mucudnn._cudnn.errors.CudnnError`
with ``cudnnGetLastErrorString``'s text and the function's name.

>>> from mucudnn._cudnn.prototypes import lib
>>> lib.cudnnGetVersion() >= 90000
True

Signatures are transcribed from cudnn_graph.h, cudnn_ops.h and cudnn_cnn.h of
cuDNN 9; the CPU tests check each row's arity and pointer-ness against the
header text. More rows (the backend/graph API) can be added with
:func:`register`.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint32, c_void_p
from typing import Any, NamedTuple, Optional, Sequence

from . import loader
from .errors import CudnnError, from_status
from .structs import (
    cudaStream_t, cudnnBackendDescriptor_t, cudnnConvolutionBwdDataAlgoPerf_t,
    cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionDescriptor_t,
    cudnnConvolutionFwdAlgoPerf_t, cudnnFilterDescriptor_t, cudnnHandle_t,
    cudnnTensorDescriptor_t, cudnnTensorTransformDescriptor_t,
)
from ..errors import MissingAttributeError

__all__ = ["Prototype", "STATUS", "PROTOTYPES", "lib", "register", "last_error_string",
           "error_string", "raise_status", "Library"]


class _StatusType:
    """Marker: the function returns cudnnStatus_t and is error-checked."""

    def __repr__(self) -> str:
        return "cudnnStatus_t"


STATUS = _StatusType()


class Prototype(NamedTuple):
    name: str
    restype: Any                 # a ctypes type, None (void) or STATUS
    argtypes: tuple              # ctypes types
    min_version: int = 90000     # cudnnGetVersion() encoding


# short names for the table
_int = c_int
_size = c_size_t
_pint = POINTER(c_int)
_psize = POINTER(c_size_t)
_vp = c_void_p                   # device data pointers and host scalars (alpha/beta)
_H = cudnnHandle_t
_T = cudnnTensorDescriptor_t
_F = cudnnFilterDescriptor_t
_C = cudnnConvolutionDescriptor_t
_TT = cudnnTensorTransformDescriptor_t
_S = cudaStream_t
_FwdPerf = POINTER(cudnnConvolutionFwdAlgoPerf_t)
_BwdDPerf = POINTER(cudnnConvolutionBwdDataAlgoPerf_t)
_BwdFPerf = POINTER(cudnnConvolutionBwdFilterAlgoPerf_t)
# enums are passed as int: cudnnDataType_t, cudnnTensorFormat_t, cudnnMathType_t,
# cudnnConvolutionMode_t, cudnn*Algo_t, libraryPropertyType
_enum = c_int
_penum = POINTER(c_int)

P = Prototype
PROTOTYPES: list[Prototype] = [
    # -- cudnn_graph.h: library, handle -------------------------------------------
    P("cudnnGetVersion", c_size_t, ()),
    P("cudnnGetMaxDeviceVersion", c_size_t, ()),
    P("cudnnGetCudartVersion", c_size_t, ()),
    P("cudnnGetErrorString", c_char_p, (_enum,)),
    P("cudnnGetLastErrorString", None, (ctypes.c_char_p, _size)),
    P("cudnnGetProperty", STATUS, (_enum, _pint)),
    P("cudnnCreate", STATUS, (POINTER(_H),)),
    P("cudnnDestroy", STATUS, (_H,)),
    P("cudnnSetStream", STATUS, (_H, _S)),
    P("cudnnGetStream", STATUS, (_H, POINTER(_S))),
    P("cudnnGraphVersionCheck", STATUS, ()),
    # -- cudnn_ops.h: tensor descriptors ------------------------------------------
    P("cudnnOpsVersionCheck", STATUS, ()),
    P("cudnnCreateTensorDescriptor", STATUS, (POINTER(_T),)),
    P("cudnnDestroyTensorDescriptor", STATUS, (_T,)),
    P("cudnnSetTensor4dDescriptor", STATUS, (_T, _enum, _enum, _int, _int, _int, _int)),
    P("cudnnSetTensor4dDescriptorEx", STATUS,
      (_T, _enum, _int, _int, _int, _int, _int, _int, _int, _int)),
    P("cudnnGetTensor4dDescriptor", STATUS,
      (_T, _penum, _pint, _pint, _pint, _pint, _pint, _pint, _pint, _pint)),
    P("cudnnSetTensorNdDescriptor", STATUS, (_T, _enum, _int, _pint, _pint)),
    P("cudnnSetTensorNdDescriptorEx", STATUS, (_T, _enum, _enum, _int, _pint)),
    P("cudnnGetTensorNdDescriptor", STATUS, (_T, _int, _penum, _pint, _pint, _pint)),
    P("cudnnGetTensorSizeInBytes", STATUS, (_T, _psize)),
    P("cudnnAddTensor", STATUS, (_H, _vp, _T, _vp, _vp, _T, _vp)),
    P("cudnnSetTensor", STATUS, (_H, _T, _vp, _vp)),
    P("cudnnTransformTensor", STATUS, (_H, _vp, _T, _vp, _vp, _T, _vp)),
    # -- cudnn_ops.h: tensor transforms (padding, folding) ---------------------------
    P("cudnnCreateTensorTransformDescriptor", STATUS, (POINTER(_TT),)),
    P("cudnnDestroyTensorTransformDescriptor", STATUS, (_TT,)),
    P("cudnnSetTensorTransformDescriptor", STATUS,
      (_TT, c_uint32, _enum, POINTER(c_int32), POINTER(c_int32), POINTER(c_uint32), _enum)),
    P("cudnnGetTensorTransformDescriptor", STATUS,
      (_TT, c_uint32, _penum, POINTER(c_int32), POINTER(c_int32), POINTER(c_uint32), _penum)),
    P("cudnnInitTransformDest", STATUS, (_TT, _T, _T, _psize)),
    P("cudnnTransformTensorEx", STATUS, (_H, _TT, _vp, _T, _vp, _vp, _T, _vp)),
    # -- cudnn_ops.h: filter descriptors --------------------------------------------
    P("cudnnCreateFilterDescriptor", STATUS, (POINTER(_F),)),
    P("cudnnDestroyFilterDescriptor", STATUS, (_F,)),
    P("cudnnSetFilter4dDescriptor", STATUS, (_F, _enum, _enum, _int, _int, _int, _int)),
    P("cudnnGetFilter4dDescriptor", STATUS, (_F, _penum, _penum, _pint, _pint, _pint, _pint)),
    P("cudnnSetFilterNdDescriptor", STATUS, (_F, _enum, _enum, _int, _pint)),
    P("cudnnGetFilterNdDescriptor", STATUS, (_F, _int, _penum, _penum, _pint, _pint)),
    P("cudnnGetFilterSizeInBytes", STATUS, (_F, _psize)),
    # -- cudnn_cnn.h: convolution descriptor ----------------------------------------
    P("cudnnCnnVersionCheck", STATUS, ()),
    P("cudnnCreateConvolutionDescriptor", STATUS, (POINTER(_C),)),
    P("cudnnDestroyConvolutionDescriptor", STATUS, (_C,)),
    P("cudnnSetConvolutionMathType", STATUS, (_C, _enum)),
    P("cudnnGetConvolutionMathType", STATUS, (_C, _penum)),
    P("cudnnSetConvolutionGroupCount", STATUS, (_C, _int)),
    P("cudnnGetConvolutionGroupCount", STATUS, (_C, _pint)),
    P("cudnnSetConvolution2dDescriptor", STATUS,
      (_C, _int, _int, _int, _int, _int, _int, _enum, _enum)),
    P("cudnnGetConvolution2dDescriptor", STATUS,
      (_C, _pint, _pint, _pint, _pint, _pint, _pint, _penum, _penum)),
    P("cudnnSetConvolutionNdDescriptor", STATUS, (_C, _int, _pint, _pint, _pint, _enum, _enum)),
    P("cudnnGetConvolutionNdDescriptor", STATUS,
      (_C, _int, _pint, _pint, _pint, _pint, _penum, _penum)),
    P("cudnnGetConvolution2dForwardOutputDim", STATUS, (_C, _T, _F, _pint, _pint, _pint, _pint)),
    P("cudnnGetConvolutionNdForwardOutputDim", STATUS, (_C, _T, _F, _int, _pint)),
    # -- forward ----------------------------------------------------------------------
    P("cudnnGetConvolutionForwardAlgorithmMaxCount", STATUS, (_H, _pint)),
    P("cudnnGetConvolutionForwardAlgorithm_v7", STATUS,
      (_H, _T, _F, _C, _T, _int, _pint, _FwdPerf)),
    P("cudnnFindConvolutionForwardAlgorithm", STATUS,
      (_H, _T, _F, _C, _T, _int, _pint, _FwdPerf)),
    P("cudnnFindConvolutionForwardAlgorithmEx", STATUS,
      (_H, _T, _vp, _F, _vp, _C, _T, _vp, _int, _pint, _FwdPerf, _vp, _size)),
    P("cudnnGetConvolutionForwardWorkspaceSize", STATUS, (_H, _T, _F, _C, _T, _enum, _psize)),
    P("cudnnConvolutionForward", STATUS,
      (_H, _vp, _T, _vp, _F, _vp, _C, _enum, _vp, _size, _vp, _T, _vp)),
    # -- backward data ----------------------------------------------------------------
    P("cudnnGetConvolutionBackwardDataAlgorithmMaxCount", STATUS, (_H, _pint)),
    P("cudnnGetConvolutionBackwardDataAlgorithm_v7", STATUS,
      (_H, _F, _T, _C, _T, _int, _pint, _BwdDPerf)),
    P("cudnnFindConvolutionBackwardDataAlgorithm", STATUS,
      (_H, _F, _T, _C, _T, _int, _pint, _BwdDPerf)),
    P("cudnnFindConvolutionBackwardDataAlgorithmEx", STATUS,
      (_H, _F, _vp, _T, _vp, _C, _T, _vp, _int, _pint, _BwdDPerf, _vp, _size)),
    P("cudnnGetConvolutionBackwardDataWorkspaceSize", STATUS,
      (_H, _F, _T, _C, _T, _enum, _psize)),
    P("cudnnConvolutionBackwardData", STATUS,
      (_H, _vp, _F, _vp, _T, _vp, _C, _enum, _vp, _size, _vp, _T, _vp)),
    # -- backward filter --------------------------------------------------------------
    P("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount", STATUS, (_H, _pint)),
    P("cudnnGetConvolutionBackwardFilterAlgorithm_v7", STATUS,
      (_H, _T, _T, _C, _F, _int, _pint, _BwdFPerf)),
    P("cudnnFindConvolutionBackwardFilterAlgorithm", STATUS,
      (_H, _T, _T, _C, _F, _int, _pint, _BwdFPerf)),
    P("cudnnFindConvolutionBackwardFilterAlgorithmEx", STATUS,
      (_H, _T, _vp, _T, _vp, _C, _F, _vp, _int, _pint, _BwdFPerf, _vp, _size)),
    P("cudnnGetConvolutionBackwardFilterWorkspaceSize", STATUS,
      (_H, _T, _T, _C, _F, _enum, _psize)),
    P("cudnnConvolutionBackwardFilter", STATUS,
      (_H, _vp, _T, _vp, _T, _vp, _C, _enum, _vp, _size, _vp, _F, _vp)),
    # -- bias ---------------------------------------------------------------------------
    P("cudnnConvolutionBackwardBias", STATUS, (_H, _vp, _T, _vp, _vp, _T, _vp)),
    # -- backend (graph) API: the minimum, more rows come with the cudnn-graph backend ---
    P("cudnnBackendCreateDescriptor", STATUS, (_enum, POINTER(cudnnBackendDescriptor_t))),
    P("cudnnBackendDestroyDescriptor", STATUS, (cudnnBackendDescriptor_t,)),
    P("cudnnBackendInitialize", STATUS, (cudnnBackendDescriptor_t,)),
    P("cudnnBackendFinalize", STATUS, (cudnnBackendDescriptor_t,)),
    P("cudnnBackendSetAttribute", STATUS,
      (cudnnBackendDescriptor_t, _enum, _enum, c_int64, _vp)),
    P("cudnnBackendGetAttribute", STATUS,
      (cudnnBackendDescriptor_t, _enum, _enum, c_int64, POINTER(c_int64), _vp)),
    P("cudnnBackendExecute", STATUS, (_H, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t)),
]
del P

_TABLE: dict[str, Prototype] = {p.name: p for p in PROTOTYPES}
_table_lock = threading.Lock()


def register(*prototypes: Prototype) -> None:
    """Add rows to the table (e.g. more of the backend API). A name already
    bound keeps its binding until :meth:`Library.reset`."""
    with _table_lock:
        for p in prototypes:
            if not isinstance(p, Prototype):
                p = Prototype(*p)
            _TABLE[p.name] = p
            PROTOTYPES.append(p)


_ERRBUF_SIZE = 4096


def last_error_string() -> str:
    """``cudnnGetLastErrorString``: cuDNN's text for its most recent error
    (reading it clears it); empty when none or when unavailable."""
    try:
        fn = lib.cudnnGetLastErrorString
    except Exception:
        return ""
    buf = ctypes.create_string_buffer(_ERRBUF_SIZE)
    fn(buf, _ERRBUF_SIZE)
    return buf.value.decode("utf-8", "replace").strip()


def error_string(status: int) -> str:
    """``cudnnGetErrorString``: the library's name for a status code."""
    return lib.cudnnGetErrorString(int(status)).decode("ascii", "replace")


def raise_status(status: int, name: str, **details: Any) -> None:
    """Raise the CudnnError for a non-zero ``status`` of ``name`` (with cuDNN's
    last-error text and ``details``); the check behind every call."""
    raise from_status(status)(name, status, last_error_string(), details)


def _make_errcheck(name: str):
    def errcheck(result, func, args):
        if result != 0:
            raise_status(result, name)
        return None
    return errcheck


def _erase(t: Any) -> Any:
    """The argument type a raw binding uses: typed opaque handles, and pointers
    to them, become c_void_p (an address as an int).

    >>> from mucudnn._cudnn.structs import cudnnHandle_t
    >>> _erase(cudnnHandle_t) is _erase(POINTER(cudnnHandle_t)) is c_void_p
    True
    """
    if isinstance(t, type) and issubclass(t, c_void_p):
        return c_void_p
    target = getattr(t, "_type_", None)
    if isinstance(t, type) and issubclass(t, ctypes._Pointer) and isinstance(target, type) \
            and issubclass(target, c_void_p):
        return c_void_p
    return t


class Library:
    """Lazy, checked access to libcudnn: ``lib.cudnnCreate(...)`` binds the
    table row on first use and caches the bound function on the instance."""

    def __init__(self, table: Optional[dict[str, Prototype]] = None) -> None:
        self._table = _TABLE if table is None else table

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise MissingAttributeError(name)
        try:
            proto = self._table[name]
        except KeyError:
            raise MissingAttributeError(
                f"{name} is not in mucudnn's cuDNN prototype table "
                "(add it with mucudnn._cudnn.prototypes.register)") from None
        fn = self._bind(proto)
        self.__dict__[name] = fn
        return fn

    @staticmethod
    def _bind(proto: Prototype):
        version = loader.get_version()
        if version < proto.min_version:
            raise MissingAttributeError(
                f"{proto.name} needs cuDNN {loader.format_version(proto.min_version)}; "
                f"the loaded library is {loader.format_version(version)} "
                f"({loader.library_path()})")
        cdll = loader.library()
        try:
            fn = cdll[proto.name]  # a fresh function object per row
        except AttributeError:
            raise MissingAttributeError(
                f"{proto.name} is not exported by {loader.library_path()} "
                f"(cuDNN {loader.format_version(version)})") from None
        fn.argtypes = list(proto.argtypes)
        if proto.restype is STATUS:
            fn.restype = c_int
            fn.errcheck = _make_errcheck(proto.name)
        else:
            fn.restype = proto.restype
        fn.__name__ = proto.name
        return fn

    def raw(self, name: str):
        """A second binding of ``name`` for hot paths (bound launchers): typed
        opaque handles are plain ``c_void_p`` (pass their ``.value``, checked
        when the launcher was bound), and the status comes back as an int for
        the caller to hand to :func:`raise_status`. Cached per name.

        Note [raw bindings]
        ~~~~~~~~~~~~~~~~~~~
        Argument conversion through the typed handles' Python-level
        ``from_param`` costs about a microsecond per handle; a warm
        convolution call passes five of them. The launcher checks every
        handle's kind once, when it is bound, and keeps the objects alive.
        """
        key = "__raw__" + name
        fn = self.__dict__.get(key)
        if fn is None:
            proto = self._table[name]
            self._bind(proto)  # version and export checks
            fn = loader.library()[proto.name]
            fn.argtypes = [_erase(t) for t in proto.argtypes]
            fn.restype = c_int if proto.restype is STATUS else proto.restype
            self.__dict__[key] = fn
        return fn

    def bind_all(self) -> list[str]:
        """Bind every row now; returns the names (tests use this)."""
        for name in list(self._table):
            getattr(self, name)
        return list(self._table)

    def reset(self) -> None:
        """Forget every binding (they are rebuilt on next use)."""
        for name in list(self.__dict__):
            if name in self._table or name.startswith("__raw__"):
                del self.__dict__[name]

    def __dir__(self) -> Sequence[str]:
        return sorted(set(super().__dir__()) | set(self._table))


lib = Library()


def call(name: str, *args: Any, **details: Any) -> None:
    """Call a status-returning function, attaching ``details`` (shapes,
    parameters) to any CudnnError it raises."""
    try:
        getattr(lib, name)(*args)
    except CudnnError as exc:
        exc.add_details(**details)
        raise

