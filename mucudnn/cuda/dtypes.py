"""Element types of DeviceArray: names, NumPy dtypes, ``__cuda_array_interface__`` typestrs.

bfloat16: NumPy has no bfloat16. With ``ml_dtypes`` installed (the
``bfloat16``/``test`` extras), bfloat16 is ``ml_dtypes.bfloat16`` and
``to_numpy()`` gives real bfloat16 numbers. Without it, bfloat16 is a 2-byte
placeholder: the structured dtype ``[("bfloat16", "<u2")]`` (kind ``"V"``), so
the raw bits survive a round trip (``a.view(np.uint16)`` reads them) and the
name "bfloat16" is kept; arithmetic on the host is then up to the caller.

``__cuda_array_interface__`` has no standard typestr for bfloat16. We export
``"<V2"`` (a 2-byte opaque element; it is also what ``ml_dtypes.bfloat16``'s
``dtype.str`` is) and, on import, read ``"<V2"``/``"|V2"`` as bfloat16. A
consumer that does not know this convention sees opaque 2-byte elements,
which is at least not a wrong numeric type. PyTorch refuses to export bfloat16
through the interface; we import torch bfloat16 tensors through
``data_ptr()`` instead (see memory.as_device_array).
"""

from __future__ import annotations

import numpy as np

__all__ = ["BFLOAT16", "SUPPORTED_DTYPES", "normalize_dtype", "dtype_name", "typestr",
           "dtype_from_typestr", "is_bfloat16"]

BFLOAT16_PLACEHOLDER = np.dtype([("bfloat16", "<u2")])


def _resolve_bfloat16(use_ml_dtypes: bool = True) -> np.dtype:
    """``ml_dtypes.bfloat16`` when importable (and wanted), else the placeholder."""
    if use_ml_dtypes:
        try:
            import ml_dtypes
        except Exception:
            pass
        else:
            return np.dtype(ml_dtypes.bfloat16)
    return BFLOAT16_PLACEHOLDER


BFLOAT16: np.dtype = _resolve_bfloat16()
HAVE_ML_DTYPES: bool = BFLOAT16 is not BFLOAT16_PLACEHOLDER

_STANDARD = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64", "complex64", "complex128")
SUPPORTED_DTYPES: tuple[str, ...] = _STANDARD[:10] + ("bfloat16",) + _STANDARD[10:]

_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16",
            "fp16": "float16", "fp32": "float32", "fp64": "float64", "short": "int16",
            "int": "int32", "long": "int64", "cfloat": "complex64", "cdouble": "complex128"}


def is_bfloat16(dt) -> bool:
    dt = np.dtype(dt) if not isinstance(dt, np.dtype) else dt
    return dt == BFLOAT16 or dt == BFLOAT16_PLACEHOLDER or getattr(dt, "name", "") == "bfloat16"


def normalize_dtype(dtype) -> np.dtype:
    """A supported element type as a NumPy dtype.

    Accepts names (``"float32"``, ``"bfloat16"``, ``"half"``), NumPy dtypes and
    scalar types, ``ml_dtypes.bfloat16`` and torch dtypes (``torch.float16``,
    read through ``str()``). Raises TypeError for anything unsupported.
    """
    if isinstance(dtype, str) or type(dtype).__module__ == "torch" or str(dtype).startswith("torch."):
        name = str(dtype)
        if name.startswith("torch."):
            name = name[len("torch."):]
        name = _ALIASES.get(name, name)
        if name == "bfloat16":
            return BFLOAT16
        if name not in _STANDARD:
            raise TypeError(f"unsupported element type {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
        return np.dtype(name)
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"unsupported element type {dtype!r}") from exc
    if is_bfloat16(dt):
        return BFLOAT16
    if not dt.isnative:
        raise TypeError(f"unsupported element type {dt} (non-native byte order)")
    if dt.name not in _STANDARD or dt.fields is not None:
        raise TypeError(f"unsupported element type {dt}; supported: {', '.join(SUPPORTED_DTYPES)}")
    return dt


def dtype_name(dtype) -> str:
    """``"float32"``, ``"bfloat16"``, ...: the name used throughout mucudnn."""
    dt = normalize_dtype(dtype)
    return "bfloat16" if is_bfloat16(dt) else dt.name


def typestr(dtype) -> str:
    """The ``__cuda_array_interface__`` typestr of a supported dtype (``"<f4"``, ``"|u1"``, ``"<V2"``)."""
    dt = normalize_dtype(dtype)
    if is_bfloat16(dt):
        return "<V2"
    return dt.str


def dtype_from_typestr(ts: str) -> np.dtype:
    """The dtype for an imported typestr; ``"<V2"``/``"|V2"`` mean bfloat16. ValueError if unsupported."""
    if not isinstance(ts, str):
        raise ValueError(f"typestr must be a str, got {type(ts).__name__}")
    if ts in ("<V2", "|V2"):
        return BFLOAT16
    try:
        dt = np.dtype(ts)
    except TypeError as exc:
        raise ValueError(f"unrecognised typestr {ts!r}") from exc
    if not dt.isnative and dt.itemsize > 1:
        raise ValueError(f"typestr {ts!r} is not in the machine's byte order")
    try:
        return normalize_dtype(dt.newbyteorder("=") if dt.itemsize > 1 else dt)
    except TypeError as exc:
        raise ValueError(f"unsupported typestr {ts!r}: {exc}") from exc
