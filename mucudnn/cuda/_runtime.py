"""Lazy access to ``cuda.bindings.runtime``.

Importing :mod:`mucudnn.cuda` must work on a machine without a GPU, without a
driver and even without cuda-bindings installed; only the first real use of the
runtime fails, and it fails with :class:`~mucudnn.cuda.errors.NoDeviceError`.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_rt = None
_import_error: BaseException | None = None


def get():
    """Return the ``cuda.bindings.runtime`` module, or raise NoDeviceError."""
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
        from .errors import NoDeviceError, NO_DEVICE_MESSAGE
        raise NoDeviceError(
            "import cuda.bindings.runtime", type(_import_error).__name__,
            f"{NO_DEVICE_MESSAGE} (cuda-bindings could not be imported: {_import_error})")
    return _rt


def available() -> bool:
    """True when cuda.bindings.runtime imports (says nothing about a device)."""
    try:
        get()
    except Exception:
        return False
    return True
