"""DLPack: zero-copy exchange of arrays with JAX, CuPy, PyTorch, NumPy and any other
library that speaks the protocol (https://dmlc.github.io/dlpack/latest/python_spec.html).

Three parts:

* the structures of ``dlpack.h`` 1.x as ctypes structures (:class:`DLTensor`,
  :class:`DLManagedTensor`, :class:`DLManagedTensorVersioned`, ...), the device
  types and the type codes, mapped to mucudnn's dtype names;
* import: :func:`import_capsule` asks a producer for a capsule
  (``obj.__dlpack__(stream=..., max_version=(1, 1))``), takes ownership of the
  managed tensor in it and returns an :class:`ImportedTensor` that describes the
  memory and calls the producer's deleter exactly once (``close()`` or garbage
  collection); :func:`release_after` defers that until the device work that
  uses the memory is done (Note [DLPack lifetimes]);
* export: :func:`export_capsule` wraps memory we hold in a capsule any consumer
  takes (``torch.from_dlpack``, ``cupy.from_dlpack``, ``jax.numpy.from_dlpack``,
  ``numpy.from_dlpack``); :func:`export_device_array` is
  ``DeviceArray.__dlpack__``, with the protocol's stream ordering.

Nothing here touches a GPU until a CUDA array is exported or a deferred
release is queued, so the module imports and works on host arrays anywhere:

>>> import numpy as np
>>> t = import_capsule(np.arange(6, dtype=np.float32).reshape(2, 3), None)
>>> t.shape, t.strides, t.dtype, t.device
((2, 3), (3, 1), 'float32', (1, 0))
>>> t.close()
>>> a = np.arange(4.0)
>>> b = np.from_dlpack(_HostExport(export_capsule(a, a.ctypes.data, a.shape, a.dtype,
...                                               (kDLCPU, 0), version=None)))
>>> b.tolist(), b.ctypes.data == a.ctypes.data
([0.0, 1.0, 2.0, 3.0], True)
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from collections import deque
from typing import Any, Iterable

from . import _lifetime
from .device import using_device
from ..dtypes import dtype_name
from ..errors import MucudnnError
from .stream import Event, Stream, default_stream, is_capturing, stream_handle

__all__ = [
    "DLPackError", "DLDevice", "DLDataType", "DLTensor", "DLManagedTensor", "DLPackVersion",
    "DLManagedTensorVersioned", "READ_ONLY", "IS_COPIED", "kDLCPU", "kDLCUDA", "kDLCUDAHost",
    "kDLCUDAManaged", "kDLInt", "kDLUInt", "kDLFloat", "kDLBfloat", "kDLComplex", "kDLBool",
    "MAX_VERSION", "dtype_from_dlpack", "dlpack_dtype", "ImportedTensor", "import_capsule",
    "consume_capsule", "release_after", "pending_releases", "release_all", "export_capsule",
    "export_device_array", "c_strides",
]



class DLPackError(MucudnnError, BufferError):
    """A DLPack exchange that cannot be made (the protocol's BufferError)."""


# ---------------------------------------------------------------------------
# dlpack.h (1.1)

#: The newest DLPack version whose structures this module reads and writes.
MAX_VERSION = (1, 1)

# DLDeviceType (the ones mucudnn meets; others are refused by name)
kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3          # pinned host memory (cudaMallocHost)
kDLROCM = 10
kDLCUDAManaged = 13      # unified memory (cudaMallocManaged)

#: Readable names of device types, for error messages.
DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 4: "OpenCL", 7: "Vulkan",
                8: "Metal", 9: "VPI", 10: "ROCm", 11: "ROCm host", 12: "ExtDev",
                13: "CUDA managed", 14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA",
                18: "Trainium"}

# DLDataTypeCode
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4
kDLComplex = 5
kDLBool = 6

# DLManagedTensorVersioned.flags
READ_ONLY = 1 << 0
IS_COPIED = 1 << 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p),
                ("device", DLDevice),
                ("ndim", ctypes.c_int32),
                ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),   # elements, not bytes
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    """The legacy (unversioned) managed tensor, in capsules named "dltensor"."""

    _fields_ = [("dl_tensor", DLTensor),
                ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]   # void (*)(DLManagedTensor *), may be NULL


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    """The managed tensor of DLPack >= 1.0, in capsules named "dltensor_versioned".
    Everything up to ``flags`` keeps its place in every future major version."""

    _fields_ = [("version", DLPackVersion),
                ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p),   # void (*)(DLManagedTensorVersioned *)
                ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor)]


_DLPACK_TO_NAME: dict[tuple[int, int], str] = {
    (kDLBool, 8): "bool", (kDLBfloat, 16): "bfloat16",
    **{(kDLInt, b): f"int{b}" for b in (8, 16, 32, 64)},
    **{(kDLUInt, b): f"uint{b}" for b in (8, 16, 32, 64)},
    **{(kDLFloat, b): f"float{b}" for b in (16, 32, 64)},
    **{(kDLComplex, b): f"complex{b}" for b in (64, 128)},
}
_NAME_TO_DLPACK = {name: code for code, name in _DLPACK_TO_NAME.items()}


def dtype_from_dlpack(code: int, bits: int, lanes: int = 1) -> str | None:
    """mucudnn's dtype name of a DLPack data type, or None when it has none.

    >>> dtype_from_dlpack(kDLFloat, 32), dtype_from_dlpack(kDLBfloat, 16), dtype_from_dlpack(kDLFloat, 8)
    ('float32', 'bfloat16', None)
    """
    if lanes != 1:
        return None
    return _DLPACK_TO_NAME.get((int(code), int(bits)))


def dlpack_dtype(dtype: Any) -> tuple[int, int]:
    """``(type code, bits)`` of a supported dtype (UnsupportedDtypeError otherwise).

    >>> dlpack_dtype("float16"), dlpack_dtype("bfloat16"), dlpack_dtype("bool")
    ((2, 16), (4, 16), (6, 8))
    """
    return _NAME_TO_DLPACK[dtype_name(dtype)]


# ---------------------------------------------------------------------------
# The capsule API, through ctypes.pythonapi. Function objects of our own (a
# prototype bound to the symbol), so that setting argtypes never changes the
# shared ``ctypes.pythonapi.X`` that other libraries use.

def _capi(name: str, proto: Any, restype: Any, *argtypes: Any) -> Any:
    return proto(restype, *argtypes)((name, ctypes.pythonapi))


_P = ctypes.PYFUNCTYPE          # holds the GIL, raises the Python error a call sets
_capsule_new = _capi("PyCapsule_New", _P, ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                     ctypes.c_void_p)
_capsule_is_valid = _capi("PyCapsule_IsValid", _P, ctypes.c_int, ctypes.py_object,
                          ctypes.c_char_p)
_capsule_get_pointer = _capi("PyCapsule_GetPointer", _P, ctypes.c_void_p, ctypes.py_object,
                             ctypes.c_char_p)
_capsule_set_name = _capi("PyCapsule_SetName", _P, ctypes.c_int, ctypes.py_object,
                          ctypes.c_char_p)
# In a capsule destructor the capsule is a raw pointer (it is being freed: it must
# not be wrapped in a py_object) and an exception may be pending: these two read
# the capsule only, never set an error and need no error check.
_raw_is_valid = _capi("PyCapsule_IsValid", ctypes.CFUNCTYPE, ctypes.c_int, ctypes.c_void_p,
                      ctypes.c_char_p)
_raw_get_pointer = _capi("PyCapsule_GetPointer", ctypes.CFUNCTYPE, ctypes.c_void_p,
                         ctypes.c_void_p, ctypes.c_char_p)

# Capsule names. Module-level bytes: a capsule keeps the char pointer it is given
# (PyCapsule_New, PyCapsule_SetName), so the strings must outlive every capsule.
_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"
_USED_LEGACY = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"

#: How a producer's deleter is called: with the GIL held (deleters of Python
#: producers drop references to Python objects).
_PRODUCER_DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)


# ---------------------------------------------------------------------------
# Import

def _call_deleter(deleter: int, managed: int) -> None:
    if deleter:
        _PRODUCER_DELETER(deleter)(managed)


def _release_managed(deleter: int, managed: int) -> None:
    # A deleter may free memory (cudaFree): deferred while this thread captures.
    _lifetime.release(_call_deleter, deleter, managed)


class ImportedTensor:
    """A tensor taken from a DLPack capsule; owns the producer's managed tensor.

    ``ptr`` (``data + byte_offset``), ``shape``, ``strides`` (in elements, or
    None for C order), ``dtype`` (mucudnn's name, None when it has none),
    ``bits`` (per element), ``device`` (``(device_type, device_id)``),
    ``readonly`` and ``copied`` (the versioned flags; False for legacy
    capsules), ``versioned``. :meth:`close` (or garbage collection) calls the
    producer's deleter, once; after it the memory may be gone.
    """

    __slots__ = ("ptr", "shape", "strides", "dtype", "bits", "device", "readonly", "copied",
                 "versioned", "_finalizer", "__weakref__")

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: str | None
    bits: int
    device: tuple[int, int]
    readonly: bool
    copied: bool
    versioned: bool

    def __init__(self, managed: int, deleter: int, versioned: bool) -> None:
        self.versioned = versioned
        self.readonly = self.copied = False
        self._finalizer = weakref.finalize(self, _release_managed, deleter, managed)
        # Process exit frees everything; a producer half torn down at exit is
        # better not called.
        self._finalizer.atexit = False

    @property
    def itemsize(self) -> int:
        """Bytes per element (rounded up)."""
        return (self.bits + 7) // 8

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Call the producer's deleter now (idempotent)."""
        self._finalizer()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return (f"<ImportedTensor ptr=0x{self.ptr:x} shape={self.shape} dtype={self.dtype} "
                f"device={self.device}{state}>")


def _consumer_stream(stream: int | None) -> int | None:
    # The protocol forbids 0 (ambiguous) and names the legacy default stream 1.
    if stream is None:
        return None
    stream = int(stream)
    return 1 if stream == 0 else stream


def import_capsule(obj: Any, stream: int | None) -> ImportedTensor:
    """Take ``obj``'s memory through DLPack, zero-copy; the returned tensor owns it.

    ``stream`` is passed to ``obj.__dlpack__``: for a CUDA array, the stream the
    consumer will use it on (the producer orders its pending work before that
    stream's later work), -1 for no ordering, None for the legacy default
    stream (0 is sent as 1, the protocol's name for it); None for host arrays.
    Producers that do not take ``max_version`` (DLPack < 1.0) are asked again
    without it. Once the work using the memory is queued, hand the tensor to
    :func:`release_after` (Note [DLPack lifetimes]).
    """
    _reap()
    arg = _consumer_stream(stream)
    export = obj.__dlpack__
    try:
        capsule = export(stream=arg, max_version=MAX_VERSION)
    except TypeError:  # an older producer: no max_version keyword
        capsule = export(stream=arg)
    return consume_capsule(capsule)


def consume_capsule(capsule: Any) -> ImportedTensor:
    """Take ownership of the managed tensor in an unused DLPack capsule (renaming it
    "used_dltensor[_versioned]", as the protocol says) and describe it."""
    if type(capsule).__name__ != "PyCapsule":
        raise DLPackError(f"__dlpack__ returned {type(capsule).__name__}, not a PyCapsule")
    if _capsule_is_valid(capsule, _VERSIONED):
        versioned, name, used = True, _VERSIONED, _USED_VERSIONED
    elif _capsule_is_valid(capsule, _LEGACY):
        versioned, name, used = False, _LEGACY, _USED_LEGACY
    else:
        raise DLPackError("the capsule is not an unused DLPack capsule (named 'dltensor' or "
                          "'dltensor_versioned'); was it consumed already?")
    managed = int(_capsule_get_pointer(capsule, name))
    _capsule_set_name(capsule, used)
    tensor: DLTensor
    if versioned:
        mv = DLManagedTensorVersioned.from_address(managed)
        owner = ImportedTensor(managed, mv.deleter or 0, True)
        if mv.version.major != 1:  # nothing past the deleter may be read
            owner.close()
            raise DLPackError(f"the producer exported DLPack {mv.version.major}."
                              f"{mv.version.minor}; mucudnn reads DLPack 1.x")
        owner.readonly = bool(mv.flags & READ_ONLY)
        owner.copied = bool(mv.flags & IS_COPIED)
        tensor = mv.dl_tensor
    else:
        ml = DLManagedTensor.from_address(managed)
        owner = ImportedTensor(managed, ml.deleter or 0, False)
        tensor = ml.dl_tensor
    try:
        _describe(owner, tensor)
    except BaseException:
        owner.close()
        raise
    return owner


def _describe(owner: ImportedTensor, t: DLTensor) -> None:
    ndim = int(t.ndim)
    if not 0 <= ndim <= 64:
        raise DLPackError(f"the DLPack tensor has ndim={ndim}")
    if ndim and not t.shape:
        raise DLPackError("the DLPack tensor has no shape")
    shape = tuple(int(t.shape[i]) for i in range(ndim)) if ndim else ()
    if any(s < 0 for s in shape):
        raise DLPackError(f"the DLPack tensor has a negative extent in shape {shape}")
    owner.shape = shape
    owner.strides = tuple(int(t.strides[i]) for i in range(ndim)) if (ndim and t.strides) \
        else None
    dt = t.dtype
    owner.dtype = dtype_from_dlpack(dt.code, dt.bits, dt.lanes)
    owner.bits = int(dt.bits) * int(dt.lanes)
    owner.device = (int(t.device.device_type), int(t.device.device_id))
    owner.ptr = int(t.data or 0) + int(t.byte_offset)


# Note [DLPack lifetimes]
# ~~~~~~~~~~~~~~~~~~~~~~~
# A consumer may use a producer's memory until it calls the deleter; after that
# the producer may free or reuse it (JAX drops its external reference, CuPy and
# torch their array). Our use is asynchronous: a convolution queued on a stream
# reads x and w and writes y after the call has returned. So the deleter of an
# imported CUDA tensor is called only once the work queued on the call's stream
# has finished: release_after() records a (non-timing) event there and keeps
# (event, owners) in _pending. Every import and every release_after() first
# reaps the oldest entries whose event has completed (Event.query(), no wait,
# in queue order up to the first one still running); the queue holds at most
# _MAX_PENDING entries, past that the oldest event is synchronized and
# released, so a program that never waits cannot pile up producers' memory.
# This is not a cache (nothing is looked up; clear_caches() leaves it alone):
# release_all() empties it, waiting.

# The caller's own array keeps the memory alive as long as the caller holds it;
# the deferral is what makes dropping it right after the call (temporaries,
# `conv(jnp.asarray(...), w)`) safe. Host (CPU) imports need none: the host
# work is done when the call returns. Inside a stream capture the event could
# not be waited on (its work runs at replay), so owners are released at once:
# the arrays a captured graph reads must be kept by the caller for its replays,
# as with any captured work.

_MAX_PENDING = 64
_pending: deque[tuple[Event, tuple[ImportedTensor, ...]]] = deque()
_pending_lock = threading.Lock()


def _completed(event: Event) -> bool:
    try:
        return event.query()
    except Exception:  # a broken context: nothing will complete any more
        return True


def _release(event: Event | None, owners: Iterable[ImportedTensor]) -> None:
    for o in owners:
        o.close()
    if event is not None:
        event.close()


def _reap() -> None:
    """Release the queue's oldest entries whose work has finished (no wait).

    In queue order, stopping at the first event not yet completed: events on
    one stream complete in order, so a call costs one or two queries however
    long the queue; an entry behind a slower stream's waits for it (released
    late, never early).
    """
    if not _pending:
        return
    done = []
    with _pending_lock:
        while _pending and _completed(_pending[0][0]):
            done.append(_pending.popleft())
    for event, owners in done:
        _release(event, owners)


def release_after(stream: int, owners: Iterable[ImportedTensor | None],
                  device: int | None = None) -> None:
    """Call the owners' deleters once the work queued so far on ``stream`` (an int
    handle on ``device``) has finished (Note [DLPack lifetimes]). Host (CPU)
    imports are released now; pinned host memory, which device work may read,
    waits like device memory."""
    keep = []
    for o in owners:
        if o is None or o.closed:
            continue
        if o.device[0] == kDLCPU:
            o.close()
        else:
            keep.append(o)
    _reap()
    if not keep:
        return
    with using_device(device):
        if is_capturing(stream):
            _release(None, keep)
            return
        event = Event(timing=False).record(int(stream))
    with _pending_lock:
        _pending.append((event, tuple(keep)))
        over = [_pending.popleft() for _ in range(len(_pending) - _MAX_PENDING)]
    for ev, own in over:
        ev.synchronize()
        _release(ev, own)


def pending_releases() -> int:
    """How many deferred releases are queued (each an event and its owners)."""
    return len(_pending)


def release_all() -> None:
    """Wait for every deferred release's work and call the deleters."""
    with _pending_lock:
        entries = list(_pending)
        _pending.clear()
    for event, owners in entries:
        try:
            event.synchronize()
        finally:
            _release(event, owners)


# ---------------------------------------------------------------------------
# Export

#: Exported managed tensors not yet deleted: address -> (struct, shape, strides,
#: what keeps the memory alive). The deleter (ours) drops the entry.
_exports: dict[int, tuple[Any, Any, Any, Any]] = {}


def _release_export(managed: int | None) -> None:
    """The deleter of every managed tensor we export (called by the consumer, or by
    the capsule's destructor when nobody consumed it)."""
    try:
        if managed:
            _exports.pop(int(managed), None)
    except Exception:  # at interpreter exit the module may be half torn down
        pass


def _capsule_destructor(capsule: int | None) -> None:
    # Only a capsule nobody consumed still has its unused name: its managed
    # tensor is ours to delete. A consumed one is the consumer's (it calls our deleter).
    try:
        for name in (_VERSIONED, _LEGACY):
            if _raw_is_valid(capsule, name):
                _release_export(_raw_get_pointer(capsule, name))
                return
    except Exception:  # a destructor must not raise (interpreter exit, say)
        pass


# The two C callbacks; module-level references keep them (and the addresses
# handed to C) valid for the life of the process.
_DELETER_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_EXPORT_DELETER = _DELETER_T(_release_export)
_EXPORT_DELETER_ADDR = ctypes.cast(_EXPORT_DELETER, ctypes.c_void_p).value
_DESTRUCTOR_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_CAPSULE_DESTRUCTOR = _DESTRUCTOR_T(_capsule_destructor)
_CAPSULE_DESTRUCTOR_ADDR = ctypes.cast(_CAPSULE_DESTRUCTOR, ctypes.c_void_p).value


# Note [contiguous strides]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# The strides of a C-contiguous array step over each axis as if its extent
# were max(extent, 1): the rule of PyTorch's contiguous tensors and of NumPy's
# reshapes (NumPy 2 gives a freshly allocated empty array all-zero strides
# instead). An axis of extent 0 then does not zero the strides of the axes
# before it, so an empty batch has the strides of one row, which is what a
# producer following PyTorch's rule reports for it.
def c_strides(shape: tuple[int, ...], itemsize: int = 1) -> tuple[int, ...]:
    """The C-contiguous strides of ``shape`` in units of ``itemsize`` (bytes
    for an element size, elements for 1); see Note [contiguous strides].

    >>> c_strides((2, 3, 4), 4), c_strides((2, 0, 3), 4), c_strides(())
    ((48, 16, 4), (12, 12, 4), ())
    """
    out, step = [], int(itemsize)
    for d in reversed(shape):
        out.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(out))


def _readonly_legacy() -> DLPackError:
    return DLPackError("a read-only array cannot be exported as a legacy (unversioned) DLPack "
                       "capsule, which has no read-only flag; ask for max_version >= (1, 0)")


def export_capsule(keep: Any, ptr: int, shape: Iterable[int], dtype: Any,
                   device: tuple[int, int], *, readonly: bool = False,
                   version: tuple[int, int] | None = MAX_VERSION) -> Any:
    """A DLPack capsule for the C-contiguous memory at ``ptr``; ``keep`` (what owns
    the memory) stays referenced until the consumer calls the deleter (or, if no
    one consumes the capsule, until it is garbage collected).

    ``version``: the DLPack version to declare, ``(1, minor)``, for a
    "dltensor_versioned" capsule (with the READ_ONLY flag when ``readonly``),
    or None for a legacy "dltensor" capsule, which cannot say read-only
    (BufferError for a read-only array, as NumPy does).
    """
    shape = tuple(int(s) for s in shape)
    code, bits = dlpack_dtype(dtype)
    if version is None and readonly:
        raise _readonly_legacy()
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*c_strides(shape))
    m: Any
    if version is None:
        m = DLManagedTensor()
        name = _LEGACY
    else:
        m = DLManagedTensorVersioned()
        m.version.major, m.version.minor = version
        m.flags = READ_ONLY if readonly else 0
        name = _VERSIONED
    t = m.dl_tensor
    t.data = int(ptr) or None
    t.device.device_type, t.device.device_id = int(device[0]), int(device[1])
    t.ndim = ndim
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    m.manager_ctx = None
    m.deleter = _EXPORT_DELETER_ADDR
    addr = ctypes.addressof(m)
    _exports[addr] = (m, shape_arr, strides_arr, keep)
    try:
        return _capsule_new(addr, name, _CAPSULE_DESTRUCTOR_ADDR)
    except BaseException:
        _exports.pop(addr, None)
        raise


class _HostExport:
    """A minimal host producer around a ready capsule (for the doctest and tests)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        capsule, self._capsule = self._capsule, None
        return capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (kDLCPU, 0)


def _export_version(max_version: Any) -> tuple[int, int] | None:
    """The version to declare for a consumer's ``max_version`` (None: legacy capsule)."""
    if max_version is None:
        return None
    major, minor = (int(v) for v in max_version)
    if major < 1:
        return None
    return (1, min(minor, MAX_VERSION[1])) if major == 1 else MAX_VERSION


def _order_consumer(array: Any, stream: Any) -> None:
    """Make the consumer's ``stream`` wait for the work queued on the array's stream
    (an event, no host wait), as ``__dlpack__`` must; -1: no ordering."""
    if isinstance(stream, int) and not isinstance(stream, bool) and stream == -1:
        return
    consumer = 0 if stream is None else stream_handle(stream)  # None: the legacy stream
    producer = (array.stream.handle if array.stream is not None
                else default_stream(array.device).handle)
    if consumer == producer:
        return
    with using_device(array.device):
        Stream.wrap(consumer).wait_stream(producer)


def export_device_array(array: Any, *, stream: Any = None, max_version: Any = None,
                        dl_device: Any = None, copy: bool | None = None) -> Any:
    """``DeviceArray.__dlpack__``: the array as a DLPack capsule, zero-copy.

    ``stream``: the consumer's stream (an int ``cudaStream_t``; 1 and 2 are the
    legacy and per-thread default streams; None means the legacy default
    stream; -1: no ordering): it is made to wait for the work queued on the
    array's stream (``array.stream``, else the device's default stream).
    ``max_version`` >= (1, 0) gives a versioned capsule (READ_ONLY set for a
    read-only array); otherwise a legacy one. ``dl_device`` must be the array's
    own ``(2, device)``; ``copy=True`` is refused (no copy is made).
    """
    if dl_device is not None:
        want = tuple(int(v) for v in dl_device)
        if want != (kDLCUDA, array.device):
            raise DLPackError(f"a DeviceArray on CUDA device {array.device} can only be exported "
                              f"there (dl_device={(kDLCUDA, array.device)}), not to {want}")
    if copy:
        raise DLPackError("DeviceArray.__dlpack__ never copies (copy=True was asked); copy the "
                          "array first (DeviceArray(a.shape, a.dtype).copy_from(a))")
    version = _export_version(max_version)
    if version is None and array.readonly:
        raise _readonly_legacy()
    ptr = array.ptr  # ValueError for a closed array
    _order_consumer(array, stream)
    return export_capsule(array, ptr, array.shape, array.dtype_name, (kDLCUDA, array.device),
                          readonly=array.readonly, version=version)
