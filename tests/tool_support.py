"""Loading a script under tools/ as a module, for the CPU tests of the tools.

The one place tests put tools/ on ``sys.path``: a script run from the command line
has its own directory first on the path and imports its siblings directly
(``from frontier import PRECISIONS``), so its tests need the same.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

TOOLS = pathlib.Path(__file__).resolve().parent.parent / "tools"


def load_tool(name: str) -> types.ModuleType:
    """``tools/<name>.py``, imported as a fresh module named ``name`` and
    registered under it, as an import makes it: a sibling that imports it
    (``import zoo_bench``) and doctest's lookup of its objects see this one."""
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
