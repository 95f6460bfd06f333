"""CUDA runtime errors and :func:`check`, the one wrapper every runtime call goes through."""

from __future__ import annotations

from ..errors import MucudnnError
from . import _runtime

__all__ = ["CudaError", "CudaOutOfMemoryError", "NoDeviceError", "check", "NO_DEVICE_MESSAGE"]

NO_DEVICE_MESSAGE = "no CUDA device or driver was found"

# Error names (not enum members, so the set is stable across cuda-bindings
# versions) that mean "there is no usable CUDA device or driver here".
NO_DEVICE_ERRORS = frozenset({
    "cudaErrorNoDevice",
    "cudaErrorInsufficientDriver",
    "cudaErrorStubLibrary",
    "cudaErrorSystemDriverMismatch",
    "cudaErrorCompatNotSupportedOnDevice",
})
OUT_OF_MEMORY_ERRORS = frozenset({"cudaErrorMemoryAllocation"})


class CudaError(MucudnnError):
    """A CUDA runtime call failed.

    ``function`` is the runtime function (``"cudaMalloc"``), ``error_name`` the
    ``cudaError_t`` name (``"cudaErrorMemoryAllocation"``) and ``message`` the
    runtime's description (plus context we add). Pickles with all three.
    """

    def __init__(self, function: str, error_name: str, message: str):
        super().__init__(function, error_name, message)
        self.function = function
        self.error_name = error_name
        self.message = message

    def __str__(self) -> str:
        return f"{self.function} failed with {self.error_name}: {self.message}"

    def __reduce__(self):
        return (type(self), (self.function, self.error_name, self.message))


class CudaOutOfMemoryError(CudaError, MemoryError):
    """cudaErrorMemoryAllocation: the device has not enough free memory."""


class NoDeviceError(CudaError):
    """No CUDA device, or no (recent enough) driver, on this machine."""


def _error_name_and_string(err) -> tuple[str, str]:
    name = getattr(err, "name", None)
    text = None
    try:
        rt = _runtime.get()
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
        _runtime.get().cudaGetLastError()
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
        raise ValueError(f"{function}: empty result tuple")
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
