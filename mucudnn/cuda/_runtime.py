"""Lazy access to ``cuda.bindings.runtime``, and :func:`check`, the one wrapper every
runtime call goes through.

Importing :mod:`mucudnn.cuda` must work on a machine without a GPU, without a
driver and even without cuda-bindings installed; only the first real use of the
runtime fails, and it fails with :class:`~mucudnn.cuda.errors.NoDeviceError`.
"""

from __future__ import annotations

import threading

from .errors import (NO_DEVICE_ERRORS, NO_DEVICE_MESSAGE, OUT_OF_MEMORY_ERRORS,
                     CudaBindingsMissingError, CudaError, CudaOutOfMemoryError, NoDeviceError)
from .._optional import install_hint
from ..errors import InvalidValueError

__all__ = ["get", "driver", "available", "check", "make_error"]

_lock = threading.Lock()
_rt = None
_import_error: BaseException | None = None


def get():
    """Return the ``cuda.bindings.runtime`` module, or raise NoDeviceError
    (CudaBindingsMissingError, with the pip command, when cuda-bindings is not installed)."""
    global _rt, _import_error
    if _rt is not None:
        return _rt
    with _lock:
        if _rt is None and _import_error is None:
            try:
                from cuda.bindings import runtime as rt
            except Exception as exc:  # ImportError, or a broken install
                _import_error = exc
            else:
                _rt = rt
    if _rt is None:
        if _not_installed(_import_error):
            raise CudaBindingsMissingError(
                "import cuda.bindings.runtime", type(_import_error).__name__,
                f"{NO_DEVICE_MESSAGE} (cuda-bindings, which the CUDA runtime needs, is not "
                f"installed): {install_hint('cudnn')}")
        raise NoDeviceError(
            "import cuda.bindings.runtime", type(_import_error).__name__,
            f"{NO_DEVICE_MESSAGE} (cuda-bindings could not be imported: {_import_error})")
    return _rt


def driver():
    """Return the ``cuda.bindings.driver`` module (for what the runtime has no
    call for: loading a module of PTX); errors as :func:`get`'s."""
    get()
    from cuda.bindings import driver as drv
    return drv


def _not_installed(exc: BaseException | None) -> bool:
    """Whether the import error ``exc`` says cuda-bindings is not installed at all."""
    return (isinstance(exc, ModuleNotFoundError)
            and exc.name in ("cuda", "cuda.bindings", "cuda.bindings.runtime"))


def missing() -> bool:
    """True when cuda-bindings is not installed (its import found no module)."""
    try:
        get()
    except NoDeviceError:
        pass
    return _not_installed(_import_error)


def available() -> bool:
    """True when cuda.bindings.runtime imports (says nothing about a device)."""
    try:
        get()
    except Exception:
        return False
    return True


def _error_name_and_string(err) -> tuple[str, str]:
    name = getattr(err, "name", None)
    text = None
    try:
        rt = get()
        if name is None:
            e, raw = rt.cudaGetErrorName(err)
            if int(e) == 0 and raw:
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
        e, raw = rt.cudaGetErrorString(err)
        if int(e) == 0 and raw:
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
    except Exception:
        pass
    if name is None:
        name = f"cudaError({int(err)})"
    if text is None:
        text = "unknown CUDA error"
    return name, text


def make_error(err, function: str, context: str | None = None) -> CudaError:
    """Build the right CudaError subclass for a failed ``cudaError_t``."""
    name, text = _error_name_and_string(err)
    if context:
        text = f"{text} ({context})"
    if name in NO_DEVICE_ERRORS:
        return NoDeviceError(function, name, f"{NO_DEVICE_MESSAGE} ({name}: {text})")
    if name in OUT_OF_MEMORY_ERRORS:
        return CudaOutOfMemoryError(function, name, text)
    return CudaError(function, name, text)


def _clear_last_error() -> None:
    # A failed call also sets the runtime's per-thread "last error"; clear it so
    # that a later, unrelated cudaGetLastError/PeekAtLastError (ours or a
    # library's) does not report our already-raised error again. Sticky errors
    # stay sticky whatever we do.
    try:
        get().cudaGetLastError()
    except Exception:
        pass


def check(result, function: str, context: str | None = None):
    """Turn a cuda-python result tuple ``(err, *values)`` into its value(s).

    Returns ``None`` for ``(err,)``, the value for ``(err, v)`` and the tuple
    ``values`` for more. Raises :class:`CudaError` (or the subclass matching the
    error) naming ``function`` when ``err`` is not ``cudaSuccess``.
    """
    if not isinstance(result, tuple):
        result = (result,)
    if not result:
        raise InvalidValueError(f"{function}: empty result tuple")
    err = result[0]
    if int(err) != 0:
        _clear_last_error()
        raise make_error(err, function, context)
    values = result[1:]
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return values
