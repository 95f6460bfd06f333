"""Lifetime of the cuDNN objects mucudnn owns: the handle and every descriptor.

:class:`CudnnObject` owns one opaque cuDNN pointer. A subclass names its typed
handle (``_ctype``, a :class:`~mucudnn._cudnn.structs.OpaqueHandle` subclass),
the cuDNN functions that create and destroy one (``_create_fn``,
``_destroy_fn``) and the :class:`LiveCount` that counts it, then calls
:meth:`CudnnObject._create` in ``__init__``. The object is destroyed by
``close()`` (idempotent), by leaving a ``with`` block or, as a safety net, by
``weakref.finalize`` when it is collected; ``_as_parameter_`` hands ctypes the
typed handle, so a wrong kind is refused in Python and a closed one raises
ValueError ("... is closed").

The finalizer never references the Python object, only the raw pointer. A
destroy that fails (for example at interpreter teardown, when the library is
half unloaded) is logged at debug level and swallowed; the live count drops
either way.

Unlike :mod:`mucudnn.cuda._lifetime` (CUDA runtime releases, deferred while the
thread captures a stream), cuDNN destroys run at once: they belong to libcudnn,
not to the CUDA runtime, and keep their own error logging.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from typing import Any, TypeVar

from .prototypes import lib
from .structs import OpaqueHandle
from ..errors import InvalidValueError

__all__ = ["CudnnObject", "LiveCount"]

log = logging.getLogger("mucudnn")

_Self = TypeVar("_Self", bound="CudnnObject")


class LiveCount:
    """Objects created and not yet destroyed, by kind (thread-safe).

    ``kinds`` are reported even while zero; others appear once first counted.
    """

    def __init__(self, *kinds: str) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(kinds, 0)

    def add(self, kind: str, delta: int) -> None:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + delta

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def by_kind(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _destroy(live: LiveCount, kind: str, destroy_fn: str, ctype: type, value: int) -> None:
    """Finalizer: never references the Python object, only the raw pointer."""
    try:
        getattr(lib, destroy_fn)(ctype(value))
    except Exception as exc:  # pragma: no cover - only at interpreter teardown
        log.debug("mucudnn: %s failed: %s", destroy_fn, exc)
    finally:
        live.add(kind, -1)


class CudnnObject:
    """Owns one cuDNN object (see the module docstring)."""

    __slots__ = ("_handle", "_finalizer", "__weakref__")

    _ctype: type = OpaqueHandle
    _create_fn = ""
    _destroy_fn = ""
    _live: LiveCount

    def _create(self, kind: str, *args: Any) -> None:
        """``_create_fn(*args, &handle)``; then count the new object under
        ``kind`` and arm the finalizer that destroys it."""
        handle = self._ctype()
        getattr(lib, self._create_fn)(*args, ctypes.byref(handle))
        self._handle = handle
        self._live.add(kind, +1)
        self._finalizer = weakref.finalize(
            self, _destroy, self._live, kind, self._destroy_fn, self._ctype, handle.value)

    def _label(self) -> str:
        """How the "... is closed" error names this object."""
        return type(self).__name__

    @property
    def _as_parameter_(self) -> Any:
        if not self._finalizer.alive:
            raise InvalidValueError(f"{self._label()} is closed")
        return self._handle

    @property
    def handle(self) -> int:
        """The raw pointer as an int (0 once closed)."""
        return (self._handle.value or 0) if self._finalizer.alive else 0

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Destroy the cuDNN object now (idempotent)."""
        self._finalizer()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
