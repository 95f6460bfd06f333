"""Optional third-party packages, imported where a feature needs them.

Each extra of ``pyproject.toml`` names the packages one feature needs;
:func:`require` imports one or raises a one-line
:class:`~mucudnn.errors.MissingDependencyError` (an ImportError) that ends with
the command installing it:

>>> require("numpy", "test", "the tests").__name__
'numpy'
>>> require("no_such_module", "plot", "plotting")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
mucudnn.errors.MissingDependencyError: plotting needs no_such_module, ...: pip install "mucudnn[plot]"
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

__all__ = ["require", "install_hint"]


def install_hint(extra: str) -> str:
    """The command that installs the extra: ``pip install "mucudnn[plot]"``."""
    return f'pip install "mucudnn[{extra}]"'


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` (needed for ``purpose``, installed by the ``extra``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.partition(".")[0]
        if getattr(exc, "name", None) in (module, top):
            raise MissingDependencyError(
                f"{purpose} needs {module}, which is not installed: {install_hint(extra)}"
            ) from None
        raise MissingDependencyError(
            f"{purpose} needs {module}, which is installed but failed to import ({exc}); "
            f"reinstall it: {install_hint(extra)}") from None
