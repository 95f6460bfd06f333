"""CUDA runtime errors (the classes; :func:`mucudnn.cuda._runtime.check` raises them)."""

from __future__ import annotations

from ..errors import MissingDependencyError, MucudnnError

__all__ = ["CudaError", "CudaOutOfMemoryError", "NoDeviceError", "CudaBindingsMissingError",
           "NO_DEVICE_MESSAGE",
           "NO_DEVICE_ERRORS", "OUT_OF_MEMORY_ERRORS"]

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


class CudaError(MucudnnError, RuntimeError):
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


class CudaBindingsMissingError(NoDeviceError, MissingDependencyError):
    """cuda-bindings, which every use of the CUDA runtime needs, is not installed: no
    device can be used until it is (the message ends with the pip command). A
    NoDeviceError, as a missing driver is, and a MissingDependencyError."""
