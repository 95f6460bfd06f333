"""cuDNN status codes -> Python exceptions.

Every failing call raises a :class:`CudnnError` subclass chosen by the status
*category* (cuDNN 9 numbers codes category x 1000 + detail): ``from_status(2002)``
is :class:`BadParamError`. The message names the C function, the status and
cuDNN's own ``cudnnGetLastErrorString`` text, plus whatever shapes/parameters
the caller attached in ``details``. All of them pickle (for multiprocessing).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..errors import MucudnnError
from .enums import Status, status_category, status_name

__all__ = [
    "CudnnError", "NotInitializedError", "BadParamError", "NotSupportedError",
    "InternalError", "AllocationFailedError", "ExecutionFailedError",
    "CudnnLibraryError", "CudnnLibraryNotFoundError", "CudnnVersionError",
    "IntRangeError", "Int32RangeError", "Int64RangeError", "IntFieldTypeError",
    "from_status", "raise_for_status",
]


class CudnnError(MucudnnError, RuntimeError):
    """A cuDNN call returned a non-success status.

    Attributes: ``function`` (the C name, e.g. ``"cudnnSetTensorNdDescriptor"``),
    ``status`` (int, a :class:`~mucudnn._cudnn.enums.Status` value where known),
    ``message`` (cuDNN's last-error text, may be empty) and ``details`` (a dict
    of the failing call's shapes/parameters, may be empty).
    """

    #: The status category this class stands for (None: any / unknown).
    category: Optional[int] = None

    def __init__(self, function: str, status: int, message: str = "",
                 details: Optional[Mapping[str, Any]] = None) -> None:
        self.function = str(function)
        self.status = int(status)
        self.message = str(message or "")
        self.details: dict[str, Any] = dict(details or {})
        super().__init__(self.function, self.status, self.message, self.details)

    @property
    def status_name(self) -> str:
        """The C name of the status, e.g. ``CUDNN_STATUS_BAD_PARAM``."""
        return status_name(self.status)

    @property
    def status_enum(self) -> Optional[Status]:
        try:
            return Status(self.status)
        except ValueError:
            return None

    def add_details(self, **details: Any) -> "CudnnError":
        """Attach parameters of the failing call (existing keys win); returns self."""
        for k, v in details.items():
            self.details.setdefault(k, v)
        return self

    def __str__(self) -> str:
        text = f"{self.function} failed: {self.status_name} ({self.status})"
        if self.message:
            text += f": {self.message}"
        if self.details:
            text += " [" + ", ".join(f"{k}={v!r}" for k, v in self.details.items()) + "]"
        return text

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(function={self.function!r}, status={self.status}, "
                f"message={self.message!r}, details={self.details!r})")

    def __reduce__(self):
        return (type(self), (self.function, self.status, self.message, self.details))


class NotInitializedError(CudnnError):
    """1000s: library not initialised (e.g. no GPU/driver), sub-library or
    serialization version mismatch, licensing, sub-library loading failed."""

    category = 1000


class BadParamError(CudnnError, ValueError):
    """2000s: an invalid parameter (null or misaligned pointer, out of bound,
    size insufficient, shape mismatch, wrong descriptor type, ...)."""

    category = 2000


class NotSupportedError(CudnnError):
    """3000s: the operation, shape, data type, layout or architecture is not supported."""

    category = 3000


class InternalError(CudnnError):
    """4000s: an internal error inside cuDNN (incl. allocation failures)."""

    category = 4000


class AllocationFailedError(InternalError, MemoryError):
    """4003/4004: cuDNN could not allocate host or device memory."""


class ExecutionFailedError(CudnnError):
    """5000s: a kernel, the CUDA driver/runtime, cuBLAS or cuRAND failed."""

    category = 5000


_BY_CATEGORY: dict[int, type] = {
    1000: NotInitializedError,
    2000: BadParamError,
    3000: NotSupportedError,
    4000: InternalError,
    5000: ExecutionFailedError,
}
_BY_CODE: dict[int, type] = {
    int(Status.INTERNAL_ERROR_HOST_ALLOCATION_FAILED): AllocationFailedError,
    int(Status.INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED): AllocationFailedError,
}


def from_status(status: int) -> type:
    """The exception class for a status code: by exact code where special,
    else by category; :class:`CudnnError` for codes of no known category."""
    status = int(status)
    if status in _BY_CODE:
        return _BY_CODE[status]
    return _BY_CATEGORY.get(status_category(status), CudnnError)


def raise_for_status(status: int, function: str, message: str = "",
                     details: Optional[Mapping[str, Any]] = None) -> None:
    """Raise the matching CudnnError unless ``status`` is success."""
    if int(status) != 0:
        raise from_status(status)(function, status, message, details)


# -- C integer fields ------------------------------------------------------------

class IntRangeError(MucudnnError, ValueError):
    """A Python int does not fit the C integer field it is meant for; ctypes
    would have truncated it silently. ``field`` names the field (e.g.
    ``"dims[2]"``), ``value`` is the int refused, ``bits`` the field's width."""

    bits = 0

    def __init__(self, message: str, field: str = "", value: int = 0) -> None:
        super().__init__(message)
        self.field = str(field)
        self.value = int(value)

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.field, self.value))


class Int32RangeError(IntRangeError):
    """An int32 field (the legacy descriptors' dims, strides, paddings, ..., or
    a tensor's element span) cannot hold the value."""

    bits = 32


class Int64RangeError(IntRangeError):
    """An int64 field (a graph-API attribute) cannot hold the value."""

    bits = 64


class IntFieldTypeError(MucudnnError, TypeError):
    """A value for a C integer field is not an int (``int()`` would round a float)."""


# -- loading ---------------------------------------------------------------------

class CudnnLibraryError(MucudnnError, OSError):
    """libcudnn could not be used. ``attempts`` lists the places tried (the
    loader's ``Attempt`` records: source, target, outcome, reason), in order."""

    def __init__(self, message: str = "", attempts: tuple = ()) -> None:
        super().__init__(message)
        self.attempts = tuple(attempts)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.attempts))


class CudnnLibraryNotFoundError(CudnnLibraryError):
    """No usable libcudnn was found; the message lists every place tried and why
    each failed (not found, failed to load, refused)."""


class CudnnVersionError(CudnnLibraryError):
    """A libcudnn was found but its version is not supported (a major version
    other than 9). ``version`` is its ``cudnnGetVersion()`` when it was loaded,
    ``major`` the major version its file name or soname claims when it was
    refused before loading (each None when unknown)."""

    def __init__(self, message: str = "", attempts: tuple = (), version: Optional[int] = None,
                 major: Optional[int] = None) -> None:
        super().__init__(message, attempts)
        self.version = None if version is None else int(version)
        if major is None and self.version is not None:
            major = self.version // (1000 if self.version < 10000 else 10000)
        self.major = None if major is None else int(major)

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.attempts, self.version,
                             self.major))
