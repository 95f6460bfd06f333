"""The one exception base of mucudnn and the errors that belong to no single room.

Every exception mucudnn raises derives from :class:`MucudnnError` and also from
the builtin it has always derived from (``ValueError``, ``MemoryError``,
``RuntimeError``, ...), so existing ``except`` clauses keep working while
``except mu.MucudnnError`` catches everything of ours::

    MucudnnError
    ├── CudaError (cuda/)                   ├── CudnnError (_cudnn/, RuntimeError)
    │   ├── CudaOutOfMemoryError            │   ├── BadParamError (ValueError), NotSupportedError, ...
    │   └── NoDeviceError                   │   └── AllocationFailedError (MemoryError)
    ├── CudnnLibraryError (OSError)         ├── WorkspaceUnavailable (MemoryError)
    ├── UnsupportedDtypeError (TypeError, ValueError)
    ├── UnsupportedConfigError (ValueError) ├── PlanningInCaptureError (RuntimeError)
    ├── InvalidValueError (ValueError)      ├── InvalidTypeError (TypeError)
    │   └── PlanFormatError (+ KeyError; problem/dict_form.py, plans_io.py)
    ├── InvalidIndexError (IndexError)      ├── MissingAttributeError (AttributeError)
    ├── UnsupportedOperationError (NotImplementedError: an object that cannot do what was asked)
    ├── MissingDependencyError (ImportError): an optional package, with its pip command
    ├── DLPackError (BufferError: a DLPack exchange that cannot be made; cuda/dlpack.py)
    ├── CacheFileError (OSError: a path that is not a mucudnn cache; optimizer/cache)
    ├── CacheArgumentError (TypeError, ValueError: a bad cache= argument; optimizer/cache)
    └── CacheMissError (LookupError: offline backend)

Rooms define their own subclasses next to the code that raises them; this
module holds the base and the errors several rooms share. All of them pickle.

>>> issubclass(UnsupportedDtypeError, (MucudnnError, TypeError, ValueError))
True
"""

from __future__ import annotations

from typing import Any

__all__ = ["MucudnnError", "InvalidValueError", "InvalidTypeError", "InvalidIndexError",
           "MissingAttributeError", "UnsupportedOperationError", "MissingDependencyError",
           "UnsupportedDtypeError", "UnsupportedConfigError", "WorkspaceUnavailable",
           "PlanningInCaptureError"]


class MucudnnError(Exception):
    """Base class of every exception mucudnn raises."""


class InvalidValueError(MucudnnError, ValueError):
    """An argument of the right type with a value mucudnn does not accept; the
    message starts with the argument's name and says what was expected."""


class InvalidTypeError(MucudnnError, TypeError):
    """An argument of the wrong type; the message starts with the argument's
    name and says what was expected."""


class InvalidIndexError(MucudnnError, IndexError):
    """An index out of range or of a form an object does not take (the message
    says which indices it takes)."""


class MissingAttributeError(MucudnnError, AttributeError):
    """An attribute an object does not have (``__getattr__`` of objects that
    look their attributes up elsewhere: a library's functions, a wrapped backend)."""


class UnsupportedOperationError(MucudnnError, NotImplementedError):
    """An operation the object it was asked of cannot do (a backend that only
    plans asked to run, an abstract method); the message names both."""


class MissingDependencyError(MucudnnError, ImportError):
    """An optional third-party package that one feature needs is not installed.

    The message is one line that ends with the command that installs it, e.g.
    ``plotting needs matplotlib: pip install "mucudnn[plot]"``.
    """


class UnsupportedDtypeError(MucudnnError, TypeError, ValueError):
    """An element type mucudnn does not know or does not support where it was given.

    A TypeError (the type of the data is wrong) and a ValueError (the argument's
    value names no supported dtype), so code catching either keeps working.
    """


class UnsupportedConfigError(MucudnnError, ValueError):
    """A backend cannot run one configuration (an algorithm or engine config at
    these pointer alignments, scalars or workspace). Backends raise it instead
    of substituting another configuration; the engine then asks the planner for
    a plan without it (see ``exec/kernel.py``).

    ``algo`` names the configuration that cannot run, ``reason`` says why.
    """

    def __init__(self, message: str, algo: Any = None, reason: str = "") -> None:
        super().__init__(message)
        self.algo = algo
        self.reason = reason

    def __reduce__(self) -> tuple:
        return (type(self), (self.args[0] if self.args else "", self.algo, self.reason))


class WorkspaceUnavailable(MucudnnError, MemoryError):
    """A workspace request could not be met (over the pool limit, or out of memory).

    ``requested`` is what was asked for, ``available`` a best guess of what
    could be had now (bytes).
    """

    def __init__(self, message: str, requested: int, available: int) -> None:
        super().__init__(message)
        self.requested = int(requested)
        self.available = int(available)

    def __reduce__(self) -> tuple:
        return (type(self), (self.args[0] if self.args else "", self.requested, self.available))


class PlanningInCaptureError(MucudnnError, RuntimeError):
    """A call inside CUDA-graph capture would have to plan, benchmark or allocate.

    Run the same calls once before capturing (a warm-up step), so that every
    plan and workspace exists; inside capture only launches are allowed.
    """
