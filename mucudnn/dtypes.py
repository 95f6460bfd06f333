"""Element types: the one dtype normaliser of mucudnn, and ``__cuda_array_interface__`` typestrs.

:func:`dtype_name` turns anything that names an element type into mucudnn's
name for it (``"float32"``, ``"bfloat16"``, ...): strings and their aliases
(``"half"``, ``"fp16"``, ``"bf16"``, ``"f4"``, ``"torch.float16"``), NumPy dtypes
and scalar types, ``ml_dtypes.bfloat16``, torch, CuPy and JAX dtypes (read by
their name). Anything else raises :class:`~mucudnn.errors.UnsupportedDtypeError`
(a TypeError and a ValueError) naming the argument. Results are memoised per
hashable input, so the call path pays one dict lookup for a dtype it has seen.

bfloat16: NumPy has no bfloat16. With ``ml_dtypes`` installed (the
``bfloat16``/``test`` extras), bfloat16 is ``ml_dtypes.bfloat16`` and
``to_numpy()`` gives real bfloat16 numbers. Without it, bfloat16 is a 2-byte
placeholder: the structured dtype ``[("bfloat16", "<u2")]`` (kind ``"V"``), so
the raw bits survive a round trip (``a.view(np.uint16)`` reads them) and the
name "bfloat16" is kept; arithmetic on the host is then up to the caller.

``__cuda_array_interface__`` has no standard typestr for bfloat16. We export
``"<V2"`` (a 2-byte opaque element; it is also what ``ml_dtypes.bfloat16``'s
``dtype.str`` is) and, on import, read ``"<V2"``/``"|V2"`` as bfloat16.
PyTorch refuses to export bfloat16 through the interface; torch tensors are
imported through ``data_ptr()`` instead (see :mod:`mucudnn.cuda.memory`).

>>> dtype_name("half"), dtype_name(np.float32), dtype_name("torch.bfloat16")
('float16', 'float32', 'bfloat16')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .caches import LRU
from .errors import InvalidValueError, MissingAttributeError, UnsupportedDtypeError

__all__ = ["BFLOAT16", "bfloat16", "SUPPORTED_DTYPES", "normalize_dtype", "dtype_name", "typestr",
           "dtype_from_typestr", "is_bfloat16", "itemsize"]

BFLOAT16_PLACEHOLDER = np.dtype([("bfloat16", "<u2")])


def _resolve_bfloat16(use_ml_dtypes: bool = True) -> np.dtype:
    """``ml_dtypes.bfloat16`` when importable (and wanted), else the placeholder."""
    if use_ml_dtypes:
        try:
            import ml_dtypes  # optional dependency (the bfloat16 extra)
        except Exception:
            pass
        else:
            return np.dtype(ml_dtypes.bfloat16)
    return BFLOAT16_PLACEHOLDER


# Note [bfloat16 on first use]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Importing ml_dtypes takes most of a second, so it is imported when bfloat16 is
# first needed (BFLOAT16 or HAVE_ML_DTYPES read, a bfloat16 array made), not
# when mucudnn is imported. Recognising a bfloat16 dtype needs no import:
# ml_dtypes' bfloat16 is named "bfloat16" (is_bfloat16).
_bfloat16: np.dtype | None = None

if TYPE_CHECKING:
    BFLOAT16: np.dtype
    HAVE_ML_DTYPES: bool


def bfloat16() -> np.dtype:
    """The NumPy dtype of bfloat16: ``ml_dtypes.bfloat16`` when installed, else
    the placeholder (resolved once, on first use; Note [bfloat16 on first use])."""
    global _bfloat16
    if _bfloat16 is None:
        _bfloat16 = _resolve_bfloat16()
    return _bfloat16


def __getattr__(name: str) -> Any:
    # BFLOAT16 and HAVE_ML_DTYPES are read lazily (Note [bfloat16 on first use]).
    if name == "BFLOAT16":
        return bfloat16()
    if name == "HAVE_ML_DTYPES":
        return bfloat16() is not BFLOAT16_PLACEHOLDER
    raise MissingAttributeError(f"module {__name__!r} has no attribute {name!r}")

_STANDARD = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64", "complex64", "complex128")
SUPPORTED_DTYPES: tuple[str, ...] = _STANDARD[:10] + ("bfloat16",) + _STANDARD[10:]

_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16",
            "fp16": "float16", "fp32": "float32", "fp64": "float64", "short": "int16",
            "int": "int32", "long": "int64", "cfloat": "complex64", "cdouble": "complex128",
            "f2": "float16", "f4": "float32", "f8": "float64"}

#: Names of dtype-like objects already resolved (a program meets a handful).
_memo: LRU[Any, str] = LRU("dtypes.names", 256)


def is_bfloat16(dt: Any) -> bool:
    dt = np.dtype(dt) if not isinstance(dt, np.dtype) else dt
    return getattr(dt, "name", "") == "bfloat16" or dt == BFLOAT16_PLACEHOLDER


def _unsupported(dtype: Any, name: str) -> UnsupportedDtypeError:
    return UnsupportedDtypeError(
        f"{name}: unsupported element type {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")


def _name_of(dtype: Any, name: str) -> str:
    """The uncached normalisation (see :func:`dtype_name`)."""
    if isinstance(dtype, str) or type(dtype).__module__ == "torch":
        text = str(dtype).strip()
        for prefix in ("torch.", "numpy."):
            if text.startswith(prefix):
                text = text[len(prefix):]
        text = _ALIASES.get(text.lower(), text)
        if text in SUPPORTED_DTYPES:
            return text
        if not isinstance(dtype, str):
            raise _unsupported(dtype, name)
        try:  # a NumPy spelling such as "<f4" or "float32"
            dt = np.dtype(text)
        except TypeError:
            raise _unsupported(dtype, name) from None
        return _name_of(dt, name)
    try:
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    except TypeError:
        # CuPy and other libraries: their dtypes are NumPy dtypes; anything
        # else may still carry a usable name (e.g. a JAX scalar type).
        label = getattr(dtype, "name", None) or getattr(dtype, "__name__", None)
        if isinstance(label, str) and label in SUPPORTED_DTYPES:
            return label
        raise _unsupported(dtype, name) from None
    if is_bfloat16(dt):
        return "bfloat16"
    if not dt.isnative:
        raise UnsupportedDtypeError(f"{name}: element type {dt} is not in the machine's byte "
                                    "order; convert it first (e.g. a.astype(a.dtype.newbyteorder('=')))")
    if dt.name not in _STANDARD or dt.fields is not None:
        raise _unsupported(dtype, name)
    return dt.name


def dtype_name(dtype: Any, name: str = "dtype") -> str:
    """mucudnn's name for the element type ``dtype`` (see the module doc).

    ``name`` is the argument named in the error.
    """
    try:
        hit = _memo.get(dtype)
    except TypeError:  # unhashable
        return _name_of(dtype, name)
    if hit is None:
        hit = _name_of(dtype, name)
        _memo.put(dtype, hit)
    return hit


def normalize_dtype(dtype: Any, name: str = "dtype") -> np.dtype:
    """The NumPy dtype of a supported element type (bfloat16: :data:`BFLOAT16`)."""
    n = dtype_name(dtype, name)
    return bfloat16() if n == "bfloat16" else np.dtype(n)


def itemsize(dtype: Any) -> int:
    """Bytes per element of a supported element type."""
    return normalize_dtype(dtype).itemsize


def typestr(dtype: Any) -> str:
    """The ``__cuda_array_interface__`` typestr of a supported dtype (``"<f4"``, ``"|u1"``, ``"<V2"``)."""
    dt = normalize_dtype(dtype)
    if is_bfloat16(dt):
        return "<V2"
    return dt.str


def dtype_from_typestr(ts: str) -> np.dtype:
    """The dtype for an imported typestr; ``"<V2"``/``"|V2"`` mean bfloat16. ValueError if unsupported."""
    if not isinstance(ts, str):
        raise InvalidValueError(f"typestr must be a str, got {type(ts).__name__}")
    if ts in ("<V2", "|V2"):
        return bfloat16()
    try:
        dt = np.dtype(ts)
    except TypeError as exc:
        raise InvalidValueError(f"unrecognised typestr {ts!r}") from exc
    if not dt.isnative and dt.itemsize > 1:
        raise InvalidValueError(f"typestr {ts!r} is not in the machine's byte order")
    try:
        return normalize_dtype(dt.newbyteorder("=") if dt.itemsize > 1 else dt)
    except UnsupportedDtypeError as exc:
        raise InvalidValueError(f"unsupported typestr {ts!r}: {exc}") from exc
