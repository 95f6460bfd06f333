"""Array kinds the public API accepts, their validation, and the frameworks they come from.

Kinds:

* ``"numpy"`` -- a NumPy array (host memory), or host memory taken zero-copy
  through DLPack (a CPU torch tensor, any producer whose ``__dlpack_device__``
  is the CPU or pinned host memory): ``obj`` is then a NumPy view of it and
  ``source`` the caller's object;
* ``"device"`` -- a :class:`mucudnn.cuda.DeviceArray`;
* ``"cai"`` -- any other device array used zero-copy: a CUDA torch tensor, an
  object with ``__cuda_array_interface__`` (CuPy, Numba, ...), or a CUDA array
  taken through DLPack (JAX, ...; framework ``"dlpack"``, ``owner`` the
  :class:`~mucudnn.cuda.dlpack.ImportedTensor` that holds it).

:func:`inspect_array` only *looks* at arrays (shape, dtype, strides, device,
pointer); it does no device work, so the API validates every argument before
touching a GPU. The one exception is a CUDA DLPack producer, whose
``__dlpack__`` is called with the stream the call will run on (it orders the
producer's pending work before that stream's). :class:`Framework` says, for a
device argument, on which stream its producer orders work, how to allocate an
output of its kind, where per-call workspace comes from and how a result is
handed back in the caller's kind. Framework modules (torch, cupy, jax) are never
imported here: an array of theirs means they are already loaded.
"""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.base import Backend
from ..cuda import DeviceArray
from ..cuda.dlpack import (DEVICE_NAMES, c_strides, import_capsule, kDLCPU, kDLCUDA, kDLCUDAHost,
                           kDLCUDAManaged)
from ..errors import InvalidTypeError, InvalidValueError, UnsupportedDtypeError, WorkspaceUnavailable
from ..problem import conv_dtype
from ..typing_aliases import ArrayLike

__all__ = ["ArrayInfo", "inspect_array", "shape_and_dtype", "framework_of", "Framework",
           "framework_for", "UNKNOWN_STREAM", "TorchWorkspace", "torch_workspace",
           "release_torch_workspaces", "torch_workspace_bytes", "check_writable_dlpack",
           "overlaps"]

#: A producer stream that cannot be known (``__cuda_array_interface__`` v2).
UNKNOWN_STREAM = -1

#: Producers whose arrays are taken through ``__cuda_array_interface__`` even
#: though they speak DLPack too (their Framework knows their current stream).
_CAI_FRAMEWORKS = frozenset({"cupy"})


@dataclass
class ArrayInfo:
    """What the API needs to know of one argument."""

    name: str
    obj: Any
    kind: str            # "numpy" | "device" | "cai"
    shape: tuple[int, ...]
    dtype: str | None    # our dtype name, None if not a convolution dtype
    contiguous: bool
    ptr: int             # 0 for numpy
    nbytes: int
    device: int | None   # CUDA device ordinal where known
    framework: str = ""  # "torch", "cupy", "numpy", "mucudnn", "dlpack", or the producer's module
    source: Any = None   # the caller's object when obj is a view of it (DLPack), else None
    owner: Any = None    # what holds a CUDA DLPack import (release it after the work)


def _dtype_or_none(d: Any) -> str | None:
    try:
        return conv_dtype(d)
    except UnsupportedDtypeError:
        return None


def _contiguous_cai(shape: tuple[int, ...], strides: Any, itemsize: int) -> bool:
    if strides is None:
        return True
    want = c_strides(shape, itemsize)
    # Axes of extent 1 may carry any stride.
    return all(s == w or n == 1 for s, w, n in zip(tuple(strides), want, shape))


def framework_of(obj: ArrayLike) -> str:
    """Top-level module name of ``obj``'s type ("torch", "cupy", "numpy", ...)."""
    return type(obj).__module__.split(".", 1)[0]


def _device_of(obj: Any) -> int | None:
    dev = getattr(obj, "device", None)
    if dev is None:
        return None
    for attr in ("index", "id"):
        v = getattr(dev, attr, None)
        if isinstance(v, int):
            return v
    if isinstance(dev, int):
        return dev
    return None


def _numpy_info(name: str, obj: np.ndarray) -> ArrayInfo:
    if not obj.dtype.isnative:
        raise UnsupportedDtypeError(
            f"{name}: the array's byte order ({obj.dtype.str}) is not the machine's; "
            "convert it first (a.astype(a.dtype.newbyteorder('=')))")
    return ArrayInfo(name, obj, "numpy", tuple(obj.shape), _dtype_or_none(obj.dtype),
                     bool(obj.flags.c_contiguous), 0, int(obj.nbytes), None, "numpy")


def _cai_of(name: str, obj: Any) -> Any:
    try:
        return obj.__cuda_array_interface__
    except AttributeError:
        return None
    except Exception as exc:  # e.g. torch bfloat16 / tensors requiring grad
        raise InvalidTypeError(f"{name}: its __cuda_array_interface__ is not usable ({exc})") from None


def _cai_info(name: str, obj: Any, cai: Any, fw: str) -> ArrayInfo:
    shape = tuple(int(s) for s in cai["shape"])
    try:
        npdt = np.dtype(cai["typestr"]) if cai["typestr"] not in ("<V2", "|V2") else None
    except TypeError:
        npdt = None
    dt: str | None
    if cai["typestr"] in ("<V2", "|V2"):
        dt, itemsize = "bfloat16", 2
    else:
        dt = _dtype_or_none(npdt) if npdt is not None else None
        itemsize = npdt.itemsize if npdt is not None else 0
    contiguous = _contiguous_cai(shape, cai.get("strides"), itemsize)
    return ArrayInfo(name, obj, "cai", shape, dt, contiguous, int(cai["data"][0]),
                     math.prod(shape) * itemsize, _device_of(obj), fw)


def _dlpack_info(name: str, obj: Any, stream: int | None) -> ArrayInfo:
    """An argument taken through DLPack: host memory as a NumPy view, CUDA memory
    zero-copy (its producer's ``__dlpack__`` called with ``stream``)."""
    try:
        dev_type, dev_id = (int(v) for v in obj.__dlpack_device__())
    except Exception as exc:
        raise InvalidTypeError(f"{name}: its __dlpack_device__() is not usable ({exc})") from None
    if dev_type in (kDLCPU, kDLCUDAHost):
        try:
            view = np.from_dlpack(obj)
        except Exception as exc:  # bfloat16, a tensor requiring grad, ...
            raise InvalidTypeError(
                f"{name}: NumPy cannot take this {type(obj).__name__} through DLPack "
                f"({type(exc).__name__}: {exc}); convert it to a NumPy array first") from None
        info = _numpy_info(name, view)
        info.framework, info.source = "dlpack", obj
        return info
    if dev_type not in (kDLCUDA, kDLCUDAManaged):
        where = DEVICE_NAMES.get(dev_type, f"device type {dev_type}")
        raise InvalidTypeError(f"{name}: a DLPack array in {where} memory; mucudnn takes host "
                               "(CPU) and CUDA memory")
    try:
        t = import_capsule(obj, stream)
    except Exception as exc:
        raise InvalidTypeError(f"{name}: its __dlpack__ failed ({type(exc).__name__}: "
                               f"{exc})") from None
    contiguous = _contiguous_cai(t.shape, t.strides, 1)  # element strides
    return ArrayInfo(name, obj, "cai", t.shape, t.dtype, contiguous, t.ptr, t.nbytes,
                     t.device[1], "dlpack", source=obj, owner=t)


def _is_dlpack(obj: Any) -> bool:
    return hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")


def inspect_array(name: str, obj: ArrayLike, *, stream: int | None = None) -> ArrayInfo:
    """Classify and describe an argument; TypeError naming it if it is no array.

    Checked in this order: NumPy arrays, DeviceArrays, torch tensors (CUDA
    ones directly, others through DLPack), arrays of frameworks with their own
    handling of ``__cuda_array_interface__`` (CuPy), then any object with
    ``__dlpack__``/``__dlpack_device__``, then any other object with
    ``__cuda_array_interface__``. ``stream`` is the stream the call will run on,
    passed to a CUDA DLPack producer's ``__dlpack__`` (None: the protocol's
    default, the legacy stream); only such a producer sees it.
    """
    if isinstance(obj, np.ndarray):
        return _numpy_info(name, obj)
    if isinstance(obj, DeviceArray):
        return ArrayInfo(name, obj, "device", tuple(obj.shape), _dtype_or_none(obj.dtype_name),
                         True, int(obj.ptr), int(obj.nbytes), obj.device, "mucudnn")
    fw = framework_of(obj)
    if fw == "torch" and hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda"):
        if not obj.is_cuda:  # host (or another device's) memory: through DLPack
            return _dlpack_info(name, obj, stream)
        shape = tuple(int(s) for s in obj.shape)
        return ArrayInfo(name, obj, "cai", shape, _dtype_or_none(obj.dtype),
                         bool(obj.is_contiguous()), int(obj.data_ptr()),
                         math.prod(shape) * int(obj.element_size()), _device_of(obj), "torch")
    if fw in _CAI_FRAMEWORKS:
        cai = _cai_of(name, obj)
        if cai is not None:
            return _cai_info(name, obj, cai, fw)
    if _is_dlpack(obj):
        return _dlpack_info(name, obj, stream)
    cai = _cai_of(name, obj)
    if cai is not None:
        return _cai_info(name, obj, cai, fw)
    raise InvalidTypeError(
        f"{name}: expected a NumPy array, a mucudnn.cuda.DeviceArray, an object with "
        f"__dlpack__ (JAX, CuPy, torch, NumPy) or with __cuda_array_interface__ (Numba, ...), "
        f"got {type(obj).__name__}")


def shape_and_dtype(name: str, obj: ArrayLike) -> tuple[tuple[int, ...], str | None]:
    """Shape and dtype name of an argument, read without exporting a DLPack
    producer's capsule when it has ``shape`` and ``dtype`` attributes (the
    functional helpers size their Convolution with them; the call itself then
    validates everything)."""
    if not isinstance(obj, (np.ndarray, DeviceArray)) and _is_dlpack(obj):
        shape, dtype = getattr(obj, "shape", None), getattr(obj, "dtype", None)
        if shape is not None and dtype is not None:
            try:
                return tuple(int(s) for s in shape), _dtype_or_none(dtype)
            except (TypeError, ValueError):
                pass
    info = inspect_array(name, obj)
    return info.shape, info.dtype


def check_writable_dlpack(name: str, info: ArrayInfo) -> None:
    """Refuse a DLPack output that must not or cannot be written in place."""
    if info.source is None:
        return
    if framework_of(info.source) in ("jax", "jaxlib"):
        raise InvalidValueError(f"{name}: JAX arrays are immutable; pass no {name} (the result "
                                "comes back as a new JAX array)")
    owner = info.owner
    if owner is not None and owner.readonly:
        raise InvalidValueError(f"{name}: the DLPack output is read-only (its producer set the "
                                "READ_ONLY flag)")
    if owner is not None and owner.copied:
        raise InvalidValueError(f"{name}: its producer exported a copy (the DLPack IS_COPIED "
                                "flag); it could not be written in place")


def overlaps(a: ArrayInfo, b: ArrayInfo) -> bool:
    """Whether two arguments may share memory (an output must not alias an input)."""
    if a.kind == "numpy" and b.kind == "numpy":
        if a.contiguous and b.contiguous:
            return bool(np.may_share_memory(a.obj, b.obj))
        if a.nbytes + b.nbytes >= (1 << 26):
            return False  # too costly to decide exactly for big strided arrays
        work: Any = 10_000
        return bool(np.shares_memory(a.obj, b.obj, max_work=work))
    if a.kind != "numpy" and b.kind != "numpy" and a.ptr and b.ptr:
        return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes
    return False


class Framework:
    """How the engine treats device arrays of one producer (the generic one:
    ``__cuda_array_interface__``, with the interface's v3 ``stream`` field)."""

    name = "cai"

    def stream(self, info: ArrayInfo) -> int | None:
        """The stream the producer orders its work on (the call runs there);
        None for the backend's home stream, :data:`UNKNOWN_STREAM` when unknown."""
        try:
            st = info.obj.__cuda_array_interface__.get("stream")
        except Exception:
            return UNKNOWN_STREAM
        if isinstance(st, int) and not isinstance(st, bool):
            return 0 if st == 1 else st  # the interface's 1 is the legacy stream, handle 0
        return UNKNOWN_STREAM

    def empty(self, like: ArrayInfo, shape: tuple[int, ...], dtype: str,
              backend: Backend) -> ArrayLike:
        """A new output of the producer's kind (a DeviceArray for the generic one)."""
        return backend.empty(shape, dtype)

    def workspace(self, like: ArrayInfo) -> Any:
        """A per-call workspace allocator from the producer's memory pool, or None
        (the engine's pool for the stream)."""
        return None

    def adopt(self, like: ArrayInfo, result: ArrayLike) -> ArrayLike:
        """A result allocated for the call, in the kind of ``like`` (the caller's
        first input); the generic producer's is the result itself."""
        return result


class _DeviceArrays(Framework):
    name = "mucudnn"

    def stream(self, info: ArrayInfo) -> int | None:
        st = info.obj.stream
        return None if st is None else int(st.handle)


class _Torch(Framework):
    name = "torch"

    def stream(self, info: ArrayInfo) -> int | None:
        torch = sys.modules["torch"]
        return int(torch._C._cuda_getCurrentRawStream(info.device))

    def empty(self, like: ArrayInfo, shape: tuple[int, ...], dtype: str,
              backend: Backend) -> ArrayLike:
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=like.obj.dtype, device=like.obj.device)

    def workspace(self, like: ArrayInfo) -> Any:
        return torch_workspace(like.obj.device)


# Note [torch workspace]
# ~~~~~~~~~~~~~~~~~~~~~~
# Calls with CUDA torch tensors take their workspace from torch's caching
# allocator, so that it counts in ``torch.cuda.memory_allocated`` (and under
# ``set_per_process_memory_fraction``) and CUDA-graph capture takes it from the
# graph's private pool. A fresh ``torch.empty`` per launch costs microseconds
# of host time, three launches per conv in training, so one buffer per stream
# is kept between calls, grown to the largest need seen (powers of two from 1
# MiB, so at most twice the largest need) and used by every convolution on
# that device and stream: stream order makes the reuse safe, as it makes
# torch's own reuse of a freed block safe. A buffer outgrown is retired, not
# freed (a launch on another thread may still be using its address), and the
# retired ones are freed with the rest by :func:`release_torch_workspaces`
# (``mucudnn.torch.release_workspace``). During capture every launch takes a
# fresh buffer from the graph's pool: a kept buffer must not be baked into a
# graph that outlives it.
#
# Note [transient workspace in a training step]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A kept buffer is live for the whole training step, so it adds its size to
# the step's peak (activations and gradients at the start of the backward
# pass); PyTorch's own convolutions take their workspace from the caching
# allocator per call and give it back after, so only what runs at the peak
# counts there. mucudnn.torch's converted layers run inside such steps and
# hold a model to native's peak, so they take workspace the way PyTorch does:
# ``TorchWorkspace(device, keep=False)`` gives every launch a fresh block of
# exactly the bytes it needs, dropped once the launch is enqueued (the
# allocator reuses it in stream order, as it does PyTorch's). The cost, a few
# microseconds of host time per launch, falls only on layers that run plans.
class TorchWorkspace:
    """Workspace allocator (``alloc(nbytes) -> (keepalive, address, size)``)
    from torch's caching allocator on one CUDA device, one buffer kept per
    stream (Note [torch workspace]); :meth:`release` frees what it holds. With
    ``keep=False`` every launch gets a block of its own and nothing is kept
    (Note [transient workspace in a training step])."""

    __slots__ = ("device", "index", "keep", "_bufs", "_retired", "_lock", "_stream",
                 "_capturing", "_empty", "_uint8", "_oom", "_mem_get_info")

    def __init__(self, device: Any, keep: bool = True) -> None:
        torch = sys.modules["torch"]
        self.device = device
        self.keep = keep
        self.index = int(device.index) if device.index is not None else \
            int(torch.cuda.current_device())
        self._bufs: dict[int, tuple[Any, int, int]] = {}
        self._retired: list[Any] = []
        self._lock = threading.Lock()
        self._stream = torch._C._cuda_getCurrentRawStream
        self._capturing = torch._C._cuda_isCurrentStreamCapturing
        self._empty, self._uint8 = torch.empty, torch.uint8
        self._oom = torch.cuda.OutOfMemoryError
        self._mem_get_info = torch.cuda.mem_get_info

    def __call__(self, nbytes: int) -> tuple[Any, int, int]:
        if not self.keep or self._capturing():  # the current device's stream: the caller's
            t = self._allocate(nbytes, nbytes)
            return t, t.data_ptr(), nbytes
        buf = self._bufs.get(self._stream(self.index))
        if buf is not None and buf[2] >= nbytes:
            return None, buf[1], buf[2]
        return self._grow(nbytes)

    def _grow(self, nbytes: int) -> tuple[Any, int, int]:
        with self._lock:
            stream = self._stream(self.index)
            buf = self._bufs.get(stream)
            if buf is not None and buf[2] >= nbytes:
                return None, buf[1], buf[2]
            size = max(1 << 20, 1 << (int(nbytes) - 1).bit_length())
            t = self._allocate(size, nbytes)
            size = t.numel()
            if buf is not None:
                self._retired.append(buf[0])
            self._bufs[stream] = (t, t.data_ptr(), size)
            return None, t.data_ptr(), size

    def _allocate(self, size: int, nbytes: int) -> Any:
        """``size`` bytes, else exactly ``nbytes``; WorkspaceUnavailable if neither."""
        for n in dict.fromkeys((size, nbytes)):
            try:
                return self._empty((n,), dtype=self._uint8, device=self.device)
            except self._oom as exc:
                err = exc
        free = int(self._mem_get_info(self.device)[0])
        raise WorkspaceUnavailable(f"workspace: torch could not allocate {nbytes} bytes "
                                   f"({str(err).splitlines()[0]})", nbytes, free) from None

    @property
    def held_bytes(self) -> int:
        """Bytes this allocator keeps now (buffers in use and retired)."""
        return sum(b[2] for b in list(self._bufs.values())) + \
            sum(t.numel() for t in list(self._retired))

    def release(self) -> int:
        """Drop every kept buffer (back to torch's cache); returns the bytes dropped.
        Call it when no convolution on this device is running or being captured."""
        with self._lock:
            n = self.held_bytes
            self._bufs.clear()
            self._retired.clear()
            return n


_TORCH_WORKSPACES: dict[tuple[str, int], TorchWorkspace] = {}
_TRANSIENT_WORKSPACES: dict[tuple[str, int], TorchWorkspace] = {}


def torch_workspace(device: Any, keep: bool = True) -> TorchWorkspace:
    """The workspace allocator of CUDA ``device`` (a ``torch.device``), one per
    device (Note [torch workspace]): stream-ordered, CUDA-graph aware, counted in
    ``torch.cuda.memory_allocated``. ``keep=False``: the one that keeps nothing
    between launches (Note [transient workspace in a training step])."""
    torch = sys.modules["torch"]
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (device.type, int(index))
    table = _TORCH_WORKSPACES if keep else _TRANSIENT_WORKSPACES
    ws = table.get(key)
    if ws is None:
        ws = table.setdefault(key, TorchWorkspace(torch.device(device.type, index), keep))
    return ws


def release_torch_workspaces() -> int:
    """Free the workspace buffers kept for torch calls on every device (Note
    [torch workspace]); returns the bytes released."""
    return sum(ws.release() for ws in list(_TORCH_WORKSPACES.values()))


def torch_workspace_bytes(device_index: int | None = None) -> int:
    """Bytes kept now for torch calls' workspace (on CUDA device
    ``device_index`` only, when given)."""
    return sum(ws.held_bytes for (_, i), ws in list(_TORCH_WORKSPACES.items())
               if device_index is None or i == device_index)


class _Cupy(Framework):
    name = "cupy"

    def stream(self, info: ArrayInfo) -> int | None:
        cupy = sys.modules["cupy"]
        with info.obj.device:
            return int(cupy.cuda.get_current_stream().ptr)

    def empty(self, like: ArrayInfo, shape: tuple[int, ...], dtype: str,
              backend: Backend) -> ArrayLike:
        cupy = sys.modules["cupy"]
        with like.obj.device:
            return cupy.empty(shape, dtype=like.obj.dtype)

    def workspace(self, like: ArrayInfo) -> Any:
        cupy = sys.modules["cupy"]
        device = like.obj.device

        def alloc(nbytes: int) -> tuple[Any, int, int]:
            try:
                with device:
                    a = cupy.empty((nbytes,), dtype=cupy.uint8)
            except cupy.cuda.memory.OutOfMemoryError as exc:
                raise WorkspaceUnavailable(f"workspace: CuPy could not allocate {nbytes} bytes "
                                           f"({exc})", nbytes, 0) from None
            return a, int(a.data.ptr), nbytes

        return alloc


class _DLPack(Framework):
    """Arrays taken through DLPack. Their producer ordered its work before the
    backend's home stream (the stream handed to ``__dlpack__``), so the call runs
    there; results go back through the producer's ``from_dlpack``."""

    name = "dlpack"

    def stream(self, info: ArrayInfo) -> int | None:
        return None

    def adopt(self, like: ArrayInfo, result: ArrayLike) -> ArrayLike:
        """``result`` (a DeviceArray, or a NumPy array for host inputs) as the
        caller's kind: ``x.__array_namespace__().from_dlpack`` (JAX, NumPy 2,
        CuPy), else the producer's module's ``from_dlpack`` (torch), else as is."""
        src = like.source
        namespace = getattr(src, "__array_namespace__", None)
        module = namespace() if namespace is not None else sys.modules.get(framework_of(src))
        from_dlpack = getattr(module, "from_dlpack", None)
        return result if from_dlpack is None else from_dlpack(result)


#: Producers with a Framework of their own (CuPy keeps its __cuda_array_interface__ path).
_FRAMEWORKS: dict[str, Framework] = {"torch": _Torch(), "cupy": _Cupy(),
                                     "mucudnn": _DeviceArrays(), "dlpack": _DLPack()}
_GENERIC = Framework()


def framework_for(info: ArrayInfo) -> Framework:
    """The :class:`Framework` of a device argument."""
    return _FRAMEWORKS.get(info.framework, _GENERIC)
