"""Loading a script under tools/ as a module, for the CPU tests of the tools."""

from __future__ import annotations

import importlib.util
import pathlib
import types

TOOLS = pathlib.Path(__file__).resolve().parent.parent / "tools"


def load_tool(name: str) -> types.ModuleType:
    """``tools/<name>.py``, imported as a fresh module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
