"""Where the loaded libcudnn's headers are (the wheel's include/), for tests that
check our enum values against the header text."""

from __future__ import annotations

from pathlib import Path

from mucudnn._cudnn import loader
from mucudnn._cudnn.errors import CudnnLibraryError


def header_dir() -> Path | None:
    """The include/ directory next to the loaded library (the wheel's), if any
    (None where no libcudnn loads: the modules using it then skip)."""
    try:
        candidates = [Path(loader.library_path()).resolve().parent.parent / "include"]
    except CudnnLibraryError:
        return None
    try:
        spec = loader._find_spec("nvidia.cudnn")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "include" for p in spec.submodule_search_locations]
    for c in candidates:
        if (c / "cudnn_graph.h").exists():
            return c
    return None
