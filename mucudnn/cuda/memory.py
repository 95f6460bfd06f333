"""Device memory: :class:`DeviceArray`, zero-copy import, live-bytes accounting."""

from __future__ import annotations

import math
import operator
import sys
import threading
import weakref

import numpy as np

from . import _lifetime, _runtime, dlpack as _dlpack
from .device import current_device, mem_get_info, require_device
from ..dtypes import dtype_from_typestr, dtype_name, is_bfloat16, normalize_dtype, typestr
from ._runtime import check
from .errors import CudaOutOfMemoryError
from .stream import as_stream, default_stream, stream_handle
from ..errors import InvalidIndexError, InvalidTypeError, InvalidValueError

__all__ = ["DeviceArray", "as_device_array", "is_device_array_like", "memory_allocated",
           "allocation_count", "cuda_array_interface", "parse_cuda_array_interface"]

# ---------------------------------------------------------------------------
# Accounting of live allocations (for leak tests)

_acct_lock = threading.Lock()
_live_bytes = 0
_live_count = 0


def _account(nbytes: int, count: int) -> None:
    global _live_bytes, _live_count
    with _acct_lock:
        _live_bytes += nbytes
        _live_count += count


def memory_allocated() -> int:
    """Bytes currently held by live DeviceArray allocations of this process (all devices)."""
    return _live_bytes


def allocation_count() -> int:
    """Number of live DeviceArray allocations (views and imports are not allocations)."""
    return _live_count


def _cuda_free(ptr: int) -> None:
    check(_runtime.get().cudaFree(ptr), "cudaFree")


def _release_memory(ptr: int, nbytes: int) -> None:
    try:
        if ptr:
            _cuda_free(ptr)
    finally:
        _account(-nbytes, -1)


def _free(ptr: int, nbytes: int) -> None:
    # Deferred (with its accounting) while this thread captures a CUDA graph.
    _lifetime.release(_release_memory, ptr, nbytes)


class _Allocation:
    """One cudaMalloc'd block; freed once, by close() or by its finalizer."""

    __slots__ = ("ptr", "nbytes", "device", "_finalizer", "__weakref__")

    def __init__(self, nbytes: int, device: int, what: str):
        rt = _runtime.get()
        ptr = 0
        if nbytes:
            result = rt.cudaMalloc(nbytes)
            try:
                ptr = int(check(result, "cudaMalloc"))
            except CudaOutOfMemoryError as exc:
                try:
                    free, total = mem_get_info()
                    where = f"; {free} of {total} bytes free on device {device}"
                except Exception:
                    where = ""
                raise CudaOutOfMemoryError(
                    exc.function, exc.error_name,
                    f"{exc.message}: allocating {nbytes} bytes for {what}{where}") from None
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        _account(nbytes, 1)
        self._finalizer = weakref.finalize(self, _free, ptr, nbytes)
        # Do not free at interpreter exit: the runtime may already be half torn
        # down, and process exit frees device memory anyway.
        self._finalizer.atexit = False

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        self._finalizer()


# ---------------------------------------------------------------------------
# Pure helpers (no device needed; unit-tested on the CPU)

def _normalize_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError as exc:
        raise InvalidTypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from exc
    if any(d < 0 for d in dims):
        raise InvalidValueError(f"negative dimension in shape {dims}")
    return dims


def _is_c_contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    if len(strides) != len(shape):
        return False
    if any(d == 0 for d in shape):
        return True
    expected = itemsize
    for d, s in zip(reversed(shape), reversed(strides)):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def _leading_index(shape: tuple[int, ...], key) -> tuple[int, tuple[int, ...]]:
    """Resolve ``key`` (an int or a step-1 slice on the leading axis) to (first row, new shape)."""
    if isinstance(key, tuple):
        if len(key) == 1:
            key = key[0]
        elif len(key) == 0:
            return 0, shape
        else:
            raise InvalidIndexError("a DeviceArray can only be indexed on its leading axis "
                             f"(an int or a slice with step 1), got {key!r}")
    if not shape:
        raise InvalidIndexError("a 0-d DeviceArray cannot be indexed")
    n = shape[0]
    if isinstance(key, slice):
        start, stop, step = key.indices(n)
        if step != 1:
            raise InvalidValueError(f"only step-1 slices make contiguous views, got step {step}")
        stop = max(stop, start)
        return start, (stop - start,) + shape[1:]
    if key is None or key is Ellipsis or isinstance(key, bool):
        raise InvalidTypeError(f"unsupported index {key!r}: use an int or a slice on the leading axis")
    try:
        i = operator.index(key)
    except TypeError:
        raise InvalidTypeError(f"unsupported index {key!r}: use an int or a slice on the leading "
                               "axis") from None
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise InvalidIndexError(f"index {key} is out of range for leading axis of size {n}")
    return i, shape[1:]


def _resolve_reshape(size: int, shape) -> tuple[int, ...]:
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        shape = tuple(shape[0])
    dims = [operator.index(d) for d in shape]
    unknown = [i for i, d in enumerate(dims) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in dims):
        raise InvalidValueError(f"invalid shape {tuple(dims)}")
    known = math.prod(d for d in dims if d != -1)
    if unknown:
        if known == 0 or size % known:
            raise InvalidValueError(f"cannot reshape an array of size {size} into shape {tuple(dims)}")
        dims[unknown[0]] = size // known
    if math.prod(dims) != size:
        raise InvalidValueError(f"cannot reshape an array of size {size} into shape {tuple(dims)}")
    return tuple(dims)


def cuda_array_interface(ptr: int, shape, dtype, readonly: bool = False,
                         stream: int | None = None) -> dict:
    """A ``__cuda_array_interface__`` v3 dict for a C-contiguous array.

    ``stream`` is the integer handle consumers must synchronise with (v3), or
    None. The interface forbids 0 (ambiguous), so a 0 handle (the legacy
    default stream) is exported as 1, the interface's name for that stream.
    """
    if stream is not None:
        stream = int(stream)
        if stream == 0:
            stream = 1
    return {
        "shape": tuple(int(d) for d in shape),
        "typestr": typestr(dtype),
        "data": (int(ptr), bool(readonly)),
        "version": 3,
        "strides": None,
        "stream": stream,
    }


def parse_cuda_array_interface(cai) -> tuple[int, tuple[int, ...], np.dtype, bool, int | None]:
    """Validate an imported ``__cuda_array_interface__`` dict.

    Returns ``(ptr, shape, dtype, readonly, stream)``; raises ValueError naming
    the problem: unsupported version, typestr or mask, non-C-contiguous strides,
    malformed fields.
    """
    if not isinstance(cai, dict):
        raise InvalidValueError(f"__cuda_array_interface__ must be a dict, got {type(cai).__name__}")
    for key in ("shape", "typestr", "data", "version"):
        if key not in cai:
            raise InvalidValueError(f"__cuda_array_interface__ lacks the required key {key!r}")
    version = cai["version"]
    if not isinstance(version, int) or not 0 <= version <= 3:
        raise InvalidValueError(f"unsupported __cuda_array_interface__ version {version!r} (1 to 3 are "
                                "understood)")
    try:
        shape = _normalize_shape(tuple(cai["shape"]))
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(f"bad shape in __cuda_array_interface__: {cai['shape']!r}") from exc
    dtype = dtype_from_typestr(cai["typestr"])
    data = cai["data"]
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise InvalidValueError(f"__cuda_array_interface__ 'data' must be (pointer, readonly), got {data!r}")
    ptr, readonly = data
    ptr = int(ptr) if ptr is not None else 0
    size = math.prod(shape)
    if ptr == 0 and size:
        raise InvalidValueError("__cuda_array_interface__ has a null data pointer for a non-empty array")
    if cai.get("mask") is not None:
        raise InvalidValueError("masked arrays (__cuda_array_interface__ 'mask') are not supported")
    strides = cai.get("strides")
    if strides is not None:
        strides = tuple(int(s) for s in strides)
        if not _is_c_contiguous(shape, strides, dtype.itemsize):
            raise InvalidValueError(
                f"the array is not C-contiguous (shape {shape}, strides {strides} bytes, "
                f"itemsize {dtype.itemsize}); make it contiguous first, e.g. .contiguous()")
    stream = cai.get("stream") if version >= 3 else None
    if stream is not None:
        if isinstance(stream, bool) or not isinstance(stream, int):
            raise InvalidValueError("__cuda_array_interface__ 'stream' must be an int or None, got "
                                    f"{stream!r}")
    return ptr, shape, dtype, bool(readonly), stream


# ---------------------------------------------------------------------------

class DeviceArray:
    """A C-contiguous array in device memory (cudaMalloc), or a view of one, or an
    imported foreign array (zero-copy).

    ``ptr`` (int), ``shape``, ``dtype`` (NumPy dtype), ``dtype_name``,
    ``strides`` (bytes), ``size``, ``nbytes``, ``itemsize``, ``ndim``,
    ``device``, ``readonly``, ``stream``. Integer or step-1 slice indexing on the
    leading axis gives a view sharing the allocation (micro-batch views; also
    workspace segments of a 1-D uint8 array). ``close()`` frees an owning
    array deterministically (views then refuse to be used); views and imported
    arrays never free. Operations with ``stream=None`` use the array's stream
    (given at construction) or else the device's :func:`default_stream`.
    """

    __slots__ = ("_ptr", "shape", "dtype", "device", "readonly", "stream",
                 "_alloc", "_keep", "_kind", "_closed", "__weakref__")

    def __init__(self, shape, dtype="float32", *, stream=None):
        shape = _normalize_shape(shape)
        dt = normalize_dtype(dtype)
        require_device()
        device = current_device()
        s = None if stream is None else as_stream(stream)
        if s is not None and s.device is not None and s.device != device:
            raise InvalidValueError(f"stream is on device {s.device}, the current device is {device}")
        nbytes = math.prod(shape) * dt.itemsize
        alloc = _Allocation(nbytes, device, f"a {dtype_name(dt)} array of shape {shape}")
        self._init(alloc.ptr, shape, dt, device, readonly=False, stream=s,
                   alloc=alloc, keep=alloc, kind="owner")

    def _init(self, ptr, shape, dtype, device, *, readonly, stream, alloc, keep, kind):
        self._ptr = int(ptr)
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device
        self.readonly = bool(readonly)
        self.stream = stream
        self._alloc = alloc
        self._keep = keep
        self._kind = kind
        self._closed = False

    @classmethod
    def _from_parts(cls, ptr: int, shape, dtype, device, *, readonly=False, stream=None,
                    alloc=None, keep=None, kind="import") -> "DeviceArray":
        """Wrap memory we do not allocate (imports, views). Touches no device."""
        self = cls.__new__(cls)
        self._init(ptr, _normalize_shape(shape), normalize_dtype(dtype), device,
                   readonly=readonly, stream=stream, alloc=alloc, keep=keep, kind=kind)
        return self

    # -- constructors -----------------------------------------------------

    @classmethod
    def zeros(cls, shape, dtype="float32", *, stream=None) -> "DeviceArray":
        """A new array filled with zero bytes (asynchronously, on the array's stream)."""
        a = cls(shape, dtype, stream=stream)
        a.fill_zero()
        return a

    @classmethod
    def from_numpy(cls, a, stream=None) -> "DeviceArray":
        """A new device array holding a copy of host array ``a``.

        The copy is queued on ``stream`` (default: the default stream); the
        host array may be modified or freed as soon as this returns (pageable
        host memory is staged before cudaMemcpyAsync returns).
        """
        a = np.asarray(a)
        dt = normalize_dtype(a.dtype)
        if a.dtype != dt:  # e.g. a non-native byte order that normalize_dtype accepted
            a = a.astype(dt)
        a = np.ascontiguousarray(a)
        out = cls(a.shape, dt, stream=stream)
        if out.nbytes:
            rt = _runtime.get()
            check(rt.cudaMemcpyAsync(out._ptr, a.ctypes.data, out.nbytes,
                                     rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                     out._stream_handle(stream)), "cudaMemcpyAsync",
                  "host to device")
        return out

    # -- properties -------------------------------------------------------

    @property
    def ptr(self) -> int:
        """The device address of the first element (int)."""
        if self._closed or (self._alloc is not None and self._alloc.closed):
            raise InvalidValueError("use of a closed DeviceArray (or a view of one)")
        return self._ptr

    @property
    def dtype_name(self) -> str:
        return "bfloat16" if is_bfloat16(self.dtype) else self.dtype.name

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        return _dlpack.c_strides(self.shape, self.dtype.itemsize)

    @property
    def is_view(self) -> bool:
        return self._kind == "view"

    @property
    def owns_memory(self) -> bool:
        return self._kind == "owner"

    @property
    def closed(self) -> bool:
        return self._closed or (self._alloc is not None and self._alloc.closed)

    def __len__(self) -> int:
        if not self.shape:
            raise InvalidTypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    @property
    def __cuda_array_interface__(self) -> dict:
        # The v3 stream is the one our own operations on this array use, so a
        # consumer that honours it is ordered after our queued writes.
        handle = self.stream.handle if self.stream is not None else default_stream(self.device).handle
        return cuda_array_interface(self.ptr, self.shape, self.dtype, self.readonly, handle)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """The array as a DLPack capsule, zero-copy (``torch.from_dlpack(a)``,
        ``cupy.from_dlpack(a)``, ``jax.numpy.from_dlpack(a)`` take it).

        The consumer's ``stream`` (an int; None: the legacy default stream; -1:
        no ordering) waits for the work queued on the array's stream.
        ``max_version`` >= (1, 0) gives a versioned capsule, which carries the
        read-only flag; a read-only array has no legacy capsule (BufferError).
        ``dl_device`` other than ``(2, a.device)`` or ``copy=True``:
        BufferError (no copy is made). See :mod:`mucudnn.cuda.dlpack`.
        """
        return _dlpack.export_device_array(self, stream=stream, max_version=max_version,
                                           dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, device)``: CUDA memory (kDLCUDA) on device ``self.device``."""
        return (_dlpack.kDLCUDA, self.device)

    # -- views ------------------------------------------------------------

    def __getitem__(self, key) -> "DeviceArray":
        """A view: ``a[i]`` drops the leading axis, ``a[i:j]`` keeps it (step must be 1)."""
        first, shape = _leading_index(self.shape, key)
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        return self._view(self.ptr + first * row, shape)

    def _view(self, ptr: int, shape) -> "DeviceArray":
        view = DeviceArray.__new__(DeviceArray)
        view._init(ptr, shape, self.dtype, self.device, readonly=self.readonly,
                   stream=self.stream, alloc=self._alloc, keep=self._keep, kind="view")
        return view

    def view_bytes(self, offset: int, nbytes: int) -> "DeviceArray":
        """Bytes ``[offset, offset + nbytes)`` of a 1-D uint8 array, as a view (workspace segments)."""
        if self.ndim != 1 or self.dtype != np.uint8:
            raise InvalidTypeError(f"view_bytes needs a 1-D uint8 array, this is {self.dtype_name} "
                                   f"{self.shape}")
        offset, nbytes = operator.index(offset), operator.index(nbytes)
        if offset < 0 or nbytes < 0 or offset + nbytes > self.shape[0]:
            raise InvalidIndexError(f"bytes [{offset}, {offset + nbytes}) are outside an array of "
                             f"{self.shape[0]} bytes")
        return self._view(self.ptr + offset, (nbytes,))

    def reshape(self, *shape) -> "DeviceArray":
        """A view with another shape of the same size (one dimension may be -1)."""
        new = _resolve_reshape(self.size, shape)
        return self._view(self.ptr, new)

    # -- copies and fills ---------------------------------------------------

    def _stream_handle(self, stream) -> int:
        if stream is None:
            stream = self.stream
        return stream_handle(stream, self.device)

    def _check_writable(self) -> None:
        if self.readonly:
            raise InvalidValueError("this DeviceArray is read-only (imported with readonly=True)")

    def to_numpy(self, stream=None) -> np.ndarray:
        """A host copy; waits for the copy (and everything before it on the stream)."""
        out = np.empty(self.shape, dtype=self.dtype)
        handle = self._stream_handle(stream)
        if self.nbytes:
            rt = _runtime.get()
            check(rt.cudaMemcpyAsync(out.ctypes.data, self.ptr, self.nbytes,
                                     rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, handle),
                  "cudaMemcpyAsync", "device to host")
        check(_runtime.get().cudaStreamSynchronize(handle), "cudaStreamSynchronize")
        return out

    def copy_from(self, src, stream=None) -> "DeviceArray":
        """Copy ``src`` (a NumPy array, DeviceArray or any device-array-like of the same
        shape and dtype) into this array, queued on ``stream``. Returns self."""
        self._check_writable()
        rt = _runtime.get()
        handle = self._stream_handle(stream)
        if isinstance(src, np.ndarray) or not is_device_array_like(src):
            host = np.asarray(src)
            if host.shape != self.shape:
                raise InvalidValueError(f"shape mismatch: copying {host.shape} into {self.shape}")
            if normalize_dtype(host.dtype) != self.dtype:
                raise InvalidValueError(f"dtype mismatch: copying {host.dtype} into {self.dtype_name}")
            host = np.ascontiguousarray(host, dtype=self.dtype)
            if self.nbytes:
                check(rt.cudaMemcpyAsync(self.ptr, host.ctypes.data, self.nbytes,
                                         rt.cudaMemcpyKind.cudaMemcpyHostToDevice, handle),
                      "cudaMemcpyAsync", "host to device")
            return self
        other = as_device_array(src)
        if other.shape != self.shape:
            raise InvalidValueError(f"shape mismatch: copying {other.shape} into {self.shape}")
        if other.dtype != self.dtype:
            raise InvalidValueError(f"dtype mismatch: copying {other.dtype_name} into {self.dtype_name}")
        if self.nbytes:
            check(rt.cudaMemcpyAsync(self.ptr, other.ptr, self.nbytes,
                                     rt.cudaMemcpyKind.cudaMemcpyDefault, handle),
                  "cudaMemcpyAsync", "device to device")
        return self

    def fill_bytes(self, value: int, stream=None) -> "DeviceArray":
        """Set every byte to ``value`` (0..255) with cudaMemsetAsync. Returns self."""
        self._check_writable()
        value = operator.index(value)
        if not 0 <= value <= 255:
            raise InvalidValueError(f"byte value must be in 0..255, got {value}")
        handle = self._stream_handle(stream)
        if self.nbytes:
            check(_runtime.get().cudaMemsetAsync(self.ptr, value, self.nbytes, handle),
                  "cudaMemsetAsync")
        return self

    def fill_zero(self, stream=None) -> "DeviceArray":
        """Set every byte to 0 (0.0 for every float type). Returns self."""
        return self.fill_bytes(0, stream)

    def fill_nan(self, stream=None) -> "DeviceArray":
        """Poison a floating-point array with NaN (all bytes 0xFF is a NaN in
        float16, bfloat16, float32 and float64). Returns self."""
        if not (self.dtype.kind in "fc" or is_bfloat16(self.dtype)):
            raise InvalidTypeError(f"fill_nan needs a floating-point array, this is {self.dtype_name}")
        return self.fill_bytes(0xFF, stream)

    # -- lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Free an owning array now (views of it become unusable); a view or an
        imported array just lets go of what it keeps alive. Idempotent."""
        if self._kind == "owner" and self._alloc is not None:
            self._alloc.close()
        self._closed = True
        self._keep = None

    def __enter__(self) -> "DeviceArray":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        raise InvalidTypeError("a DeviceArray cannot be pickled; pickle a.to_numpy() instead")

    def __array__(self, *args, **kwargs):
        raise InvalidTypeError("implicit conversion of a DeviceArray to NumPy is not allowed; use "
                               ".to_numpy()")

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        ptr = f"0x{self._ptr:x}"
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype_name}, device={self.device}, "
                f"ptr={ptr}, {self._kind}{state})")


# ---------------------------------------------------------------------------
# Zero-copy import

def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def _is_torch_tensor(obj) -> bool:
    tensor = _torch_tensor_type()
    return tensor is not None and isinstance(obj, tensor)


def is_device_array_like(obj) -> bool:
    """True for a DeviceArray, a CUDA torch tensor, or anything exposing ``__cuda_array_interface__``."""
    if isinstance(obj, DeviceArray):
        return True
    if _is_torch_tensor(obj):
        return getattr(obj, "is_cuda", False)
    if isinstance(obj, np.ndarray):
        return False
    try:
        return getattr(obj, "__cuda_array_interface__", None) is not None
    except Exception:
        return False


def _pointer_device(ptr: int) -> int | None:
    rt = _runtime.get()
    attrs = check(rt.cudaPointerGetAttributes(ptr), "cudaPointerGetAttributes")
    if int(attrs.type) == int(rt.cudaMemoryType.cudaMemoryTypeUnregistered):
        raise InvalidValueError(f"pointer 0x{ptr:x} is not device memory (unregistered host memory)")
    return int(attrs.device)


def _check_device(device: int | None) -> int:
    current = current_device()
    if device is not None and device != current:
        raise InvalidValueError(f"the array is on device {device}, expected {current} (the current device); "
                         "call mucudnn.cuda.set_device() first or move the array")
    return current


def _sync_producer(stream: int | None) -> None:
    if stream is not None:
        check(_runtime.get().cudaStreamSynchronize(int(stream)), "cudaStreamSynchronize",
              "waiting for the producer's stream of an imported array")


def _from_torch(t, sync: bool) -> DeviceArray:
    if not t.is_cuda:
        raise InvalidTypeError("a CPU torch tensor is not device memory; use "
                               "DeviceArray.from_numpy(t.numpy())")
    if not t.is_contiguous():
        raise InvalidValueError(f"the torch tensor is not C-contiguous (shape {tuple(t.shape)}, "
                         f"strides {tuple(t.stride())} elements); call .contiguous() first")
    dt = normalize_dtype(t.dtype)
    require_device()
    device = _check_device(t.device.index)
    if sync:
        torch = sys.modules["torch"]  # imported: t is a torch tensor
        _sync_producer(torch.cuda.current_stream(t.device).cuda_stream)
    return DeviceArray._from_parts(t.data_ptr(), tuple(t.shape), dt, device,
                                   readonly=False, stream=None, keep=t, kind="import")


def _from_cai(obj, cai, sync: bool) -> DeviceArray:
    ptr, shape, dt, readonly, stream = parse_cuda_array_interface(cai)
    require_device()
    device = _check_device(_pointer_device(ptr) if ptr else None)
    if sync:
        _sync_producer(stream)
    return DeviceArray._from_parts(ptr, shape, dt, device, readonly=readonly,
                                   stream=None, keep=obj, kind="import")


def as_device_array(obj, *, dtype=None, shape=None, sync: bool = True) -> DeviceArray:
    """``obj`` as a DeviceArray, without copying.

    A DeviceArray is returned as is. A torch CUDA tensor is imported through
    ``data_ptr()`` (this also covers bfloat16, which torch's
    ``__cuda_array_interface__`` refuses). Any other object with
    ``__cuda_array_interface__`` (CuPy, Numba, ...) is imported from it. The
    result keeps ``obj`` alive. Non-C-contiguous arrays, an unsupported element
    type, a mask, or memory on another device than the current one raise
    ValueError; host arrays and other objects raise TypeError.

    With ``sync=True`` (the default) the host waits for the producer's stream
    (the interface's v3 ``stream``, or torch's current stream), as the
    interface requires of a consumer; pass ``sync=False`` when you order the
    streams yourself.

    ``dtype``: if given, the array must have it (ValueError otherwise).
    ``shape``: if given, the result is reshaped (a view) to it.
    """
    if isinstance(obj, DeviceArray):
        arr = obj
    elif _is_torch_tensor(obj):
        arr = _from_torch(obj, sync)
    elif isinstance(obj, np.ndarray):
        raise InvalidTypeError("a NumPy array is host memory; use DeviceArray.from_numpy()")
    else:
        try:
            cai = obj.__cuda_array_interface__
        except AttributeError:
            raise InvalidTypeError(f"{type(obj).__name__} is not a device array: it has no "
                            "__cuda_array_interface__") from None
        arr = _from_cai(obj, cai, sync)
    if dtype is not None:
        want = normalize_dtype(dtype)
        if arr.dtype != want:
            raise InvalidValueError(f"the array has dtype {arr.dtype_name}, expected {dtype_name(want)}")
    if shape is not None:
        arr = arr.reshape(_normalize_shape(shape))
    return arr
