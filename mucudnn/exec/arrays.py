"""Array kinds the public API accepts, their validation, and the frameworks they come from.

Kinds:

* ``"numpy"`` -- a NumPy array (host memory);
* ``"device"`` -- a :class:`mucudnn.cuda.DeviceArray`;
* ``"cai"`` -- any other object with ``__cuda_array_interface__`` (CuPy, Numba,
  ...) or a CUDA torch tensor, used zero-copy.

:func:`inspect_array` only *looks* at arrays (shape, dtype, strides, device,
pointer); it does no device work, so the API validates every argument before
touching a GPU. :class:`Framework` says, for a device argument, on which
stream its producer orders work, how to allocate an output of its kind and
where per-call workspace comes from. Framework modules (torch, cupy) are never
imported here: an array of theirs means they are already loaded.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cuda import DeviceArray
from ..errors import UnsupportedDtypeError, WorkspaceUnavailable
from ..problem import conv_dtype

__all__ = ["ArrayInfo", "inspect_array", "framework_of", "Framework", "framework_for",
           "UNKNOWN_STREAM"]

#: A producer stream that cannot be known (``__cuda_array_interface__`` v2).
UNKNOWN_STREAM = -1


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
    framework: str = ""  # "torch", "cupy", "numpy", "mucudnn", or the producer's module


def _dtype_or_none(d: Any) -> str | None:
    try:
        return conv_dtype(d)
    except UnsupportedDtypeError:
        return None


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out = []
    acc = itemsize
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _contiguous_cai(shape: tuple[int, ...], strides: Any, itemsize: int) -> bool:
    if strides is None:
        return True
    want = _c_strides(shape, itemsize)
    # Axes of extent 1 may carry any stride.
    return all(s == w or n == 1 for s, w, n in zip(tuple(strides), want, shape))


def framework_of(obj: Any) -> str:
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


def inspect_array(name: str, obj: Any) -> ArrayInfo:
    """Classify and describe an argument; TypeError naming it if it is no array."""
    if isinstance(obj, np.ndarray):
        if not obj.dtype.isnative:
            raise UnsupportedDtypeError(
                f"{name}: the array's byte order ({obj.dtype.str}) is not the machine's; "
                "convert it first (a.astype(a.dtype.newbyteorder('=')))")
        return ArrayInfo(name, obj, "numpy", tuple(obj.shape), _dtype_or_none(obj.dtype),
                         bool(obj.flags.c_contiguous), 0, int(obj.nbytes), None, "numpy")
    if isinstance(obj, DeviceArray):
        return ArrayInfo(name, obj, "device", tuple(obj.shape), _dtype_or_none(obj.dtype_name),
                         True, int(obj.ptr), int(obj.nbytes), obj.device, "mucudnn")
    fw = framework_of(obj)
    if fw == "torch" and hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda"):
        if not obj.is_cuda:
            raise TypeError(f"{name}: a CPU torch tensor is host memory; pass {name}.numpy() "
                            "or a CUDA tensor (mucudnn.torch runs CPU tensors on the NumPy "
                            "backend)")
        shape = tuple(int(s) for s in obj.shape)
        return ArrayInfo(name, obj, "cai", shape, _dtype_or_none(obj.dtype),
                         bool(obj.is_contiguous()), int(obj.data_ptr()),
                         math.prod(shape) * int(obj.element_size()), _device_of(obj), "torch")
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception as exc:  # e.g. torch bfloat16 / tensors requiring grad
        raise TypeError(f"{name}: its __cuda_array_interface__ is not usable ({exc})") from None
    if cai is not None:
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
    raise TypeError(
        f"{name}: expected a NumPy array, a mucudnn.cuda.DeviceArray or an object with "
        f"__cuda_array_interface__ (torch, CuPy), got {type(obj).__name__}")


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

    def empty(self, like: ArrayInfo, shape: tuple[int, ...], dtype: str, backend: Any) -> Any:
        """A new output of the producer's kind (a DeviceArray for the generic one)."""
        return backend.empty(shape, dtype)

    def workspace(self, like: ArrayInfo) -> Any:
        """A per-call workspace allocator from the producer's memory pool, or None
        (the engine's pool for the stream)."""
        return None


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

    def empty(self, like: ArrayInfo, shape: tuple[int, ...], dtype: str, backend: Any) -> Any:
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=like.obj.dtype, device=like.obj.device)

    def workspace(self, like: ArrayInfo) -> Any:
        return torch_workspace(like.obj.device)


def torch_workspace(device: Any) -> Any:
    """A workspace allocator from torch's caching allocator on ``device`` (a
    ``torch.device``): stream-ordered, CUDA-graph aware, counted in
    ``torch.cuda.memory_allocated`` while the call runs (as native convs' is)."""
    torch = sys.modules["torch"]
    empty, uint8, oom = torch.empty, torch.uint8, torch.cuda.OutOfMemoryError

    def alloc(nbytes: int) -> tuple[Any, int, int]:
        try:
            t = empty((nbytes,), dtype=uint8, device=device)
        except oom as exc:
            free = int(torch.cuda.mem_get_info(device)[0])
            raise WorkspaceUnavailable(f"workspace: torch could not allocate {nbytes} bytes "
                                       f"({str(exc).splitlines()[0]})", nbytes, free) from None
        return t, t.data_ptr(), nbytes

    return alloc


class _Cupy(Framework):
    name = "cupy"

    def stream(self, info: ArrayInfo) -> int | None:
        cupy = sys.modules["cupy"]
        with info.obj.device:
            return int(cupy.cuda.get_current_stream().ptr)

    def empty(self, like: ArrayInfo, shape: tuple[int, ...], dtype: str, backend: Any) -> Any:
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


_FRAMEWORKS: dict[str, Framework] = {"torch": _Torch(), "cupy": _Cupy(),
                                     "mucudnn": _DeviceArrays()}
_GENERIC = Framework()


def framework_for(info: ArrayInfo) -> Framework:
    """The :class:`Framework` of a device argument."""
    return _FRAMEWORKS.get(info.framework, _GENERIC)
