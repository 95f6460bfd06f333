"""Array kinds the public API accepts, their validation, and stream hand-over.

Three kinds:

* ``"numpy"`` — a NumPy array (host memory);
* ``"device"`` — a :class:`mucudnn.cuda.DeviceArray`;
* ``"cai"`` — any other object with ``__cuda_array_interface__`` (PyTorch,
  CuPy, Numba, ...), used zero-copy through :func:`mucudnn.cuda.as_device_array`.

Everything here only *looks* at arrays (shape, dtype, strides, device); it does
no device work, so the API can validate every argument before touching a GPU.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..problem import conv_dtype

__all__ = ["ArrayInfo", "inspect_array", "framework_of", "producer_stream"]


@dataclass
class ArrayInfo:
    """What the API needs to know of one argument."""

    name: str
    obj: Any
    kind: str            # "numpy" | "device" | "cai"
    shape: tuple[int, ...]
    dtype: str | None    # our dtype name, None if unknown
    contiguous: bool
    ptr: int             # 0 for numpy
    nbytes: int
    device: int | None   # CUDA device ordinal where known


def _is_device_array(obj: Any) -> bool:
    mod = sys.modules.get("mucudnn.cuda")
    cls = getattr(mod, "DeviceArray", None) if mod is not None else None
    return cls is not None and isinstance(obj, cls)


def _dtype_or_none(d: Any) -> str | None:
    try:
        return conv_dtype(d)
    except (ValueError, TypeError):
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
        return ArrayInfo(name, obj, "numpy", tuple(obj.shape), _dtype_or_none(obj.dtype),
                         bool(obj.flags.c_contiguous), 0, int(obj.nbytes), None)
    if _is_device_array(obj):
        dt = getattr(obj, "dtype_name", None) or _dtype_or_none(getattr(obj, "dtype", None))
        contiguous = getattr(obj, "is_contiguous", True)
        contiguous = bool(contiguous() if callable(contiguous) else contiguous)
        dev = getattr(obj, "device", None)
        return ArrayInfo(name, obj, "device", tuple(obj.shape), _dtype_or_none(dt), contiguous,
                         int(obj.ptr), int(obj.nbytes), dev if isinstance(dev, int) else None)
    if framework_of(obj) == "torch" and hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda"):
        if not obj.is_cuda:
            raise TypeError(f"{name}: a CPU torch tensor is host memory; pass {name}.numpy() "
                            "or a CUDA tensor")
        shape = tuple(int(s) for s in obj.shape)
        return ArrayInfo(name, obj, "cai", shape, _dtype_or_none(str(obj.dtype)),
                         bool(obj.is_contiguous()), int(obj.data_ptr()),
                         int(obj.numel()) * int(obj.element_size()), _device_of(obj))
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception as exc:  # e.g. torch bfloat16 / tensors requiring grad
        raise TypeError(f"{name}: its __cuda_array_interface__ is not usable ({exc})") from None
    if cai is not None:
        shape = tuple(int(s) for s in cai["shape"])
        try:
            npdt = np.dtype(cai["typestr"])
        except TypeError:
            npdt = None
        itemsize = npdt.itemsize if npdt is not None else 0
        dt = _dtype_or_none(npdt) if npdt is not None else None
        n = int(np.prod(shape, dtype=np.int64)) * itemsize
        contiguous = _contiguous_cai(shape, cai.get("strides"), itemsize)
        return ArrayInfo(name, obj, "cai", shape, dt, contiguous, int(cai["data"][0]), n,
                         _device_of(obj))
    raise TypeError(
        f"{name}: expected a NumPy array, a mucudnn.cuda.DeviceArray or an object with "
        f"__cuda_array_interface__ (torch, CuPy), got {type(obj).__name__}")


def producer_stream(info: ArrayInfo) -> int | None:
    """The stream handle on which ``info``'s producer orders its work, where known:
    torch's and CuPy's current stream, a DeviceArray's own stream, or the v3
    ``stream`` field of ``__cuda_array_interface__``. None when unknown."""
    obj = info.obj
    if info.kind == "device":
        st = getattr(obj, "stream", None)
        return int(st.handle) if st is not None else None
    if info.kind != "cai":
        return None
    fw = framework_of(obj)
    mod = sys.modules.get(fw)
    try:
        if fw == "torch" and mod is not None:
            return int(mod.cuda.current_stream(obj.device).cuda_stream)
        if fw == "cupy" and mod is not None:
            return int(mod.cuda.get_current_stream().ptr)
    except Exception:
        pass
    try:
        st = obj.__cuda_array_interface__.get("stream")
    except Exception:
        return None
    return int(st) if isinstance(st, int) and not isinstance(st, bool) else None
