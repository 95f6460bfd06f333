"""Backends: the Backend protocol and its implementations (numpy, cudnn, cudnn-graph)."""

from __future__ import annotations

import importlib
import logging
import os
import threading
from typing import Any

from .base import OUTPUT_OF, Backend, ConvTensors

__all__ = ["Backend", "ConvTensors", "OUTPUT_OF", "get_backend", "available_backends"]

log = logging.getLogger("mucudnn")

#: name -> "module:factory"; modules are imported on first use only.
_REGISTRY: dict[str, str] = {
    "numpy": "mucudnn.backends.numpy:NumpyBackend",
    "cudnn": "mucudnn.backends.cudnn:CudnnBackend",
    "cudnn-graph": "mucudnn.backends.cudnn_graph:CudnnGraphBackend",
}
_INSTANCES: dict[str, Backend] = {}
_LOCK = threading.Lock()
_NOTICE_GIVEN = False


def available_backends() -> list[str]:
    """Names get_backend accepts."""
    return list(_REGISTRY)


#: The GPU backend get_backend() picks. Note: the graph API's engines ran every
#: measured network faster than the legacy API's algorithms, under a 64 MiB cap
#: and unlimited alike (docs/BENCHMARKS.md, H200, cuDNN 9.19); its cost is a
#: slower first optimisation (it times every engine config the heuristics give).
DEFAULT_GPU_BACKEND = "cudnn-graph"


def _default_name() -> str:
    global _NOTICE_GIVEN
    from ..cuda import device_count

    env = os.environ.get("MUCUDNN_BACKEND", "").strip().lower()
    if env:
        if env not in _REGISTRY:
            raise ValueError(
                f"MUCUDNN_BACKEND: expected one of {list(_REGISTRY)}, got {env!r}")
        return env
    if device_count() > 0:
        return DEFAULT_GPU_BACKEND
    if not _NOTICE_GIVEN:
        _NOTICE_GIVEN = True
        log.warning("mucudnn: no CUDA device found; using the NumPy (CPU) backend")
    return "numpy"


def get_backend(name: "str | Backend | None" = None, **options: Any) -> Backend:
    """The backend called ``name`` ("numpy", "cudnn", "cudnn-graph"; measurements
    replayed from a benchmark cache are :class:`mucudnn.optimizer.CachedBackend`); with no
    name, ``MUCUDNN_BACKEND`` if set, else cudnn-graph where a GPU is present
    (the faster of the two GPU backends in docs/BENCHMARKS.md), else numpy
    (with a one-line notice).

    A Backend instance is returned as it is. Backends without options are
    shared per process.

    >>> get_backend("numpy").name
    'numpy'
    """
    if name is not None and not isinstance(name, str):
        if isinstance(name, Backend):
            return name
        raise TypeError(f"backend: expected a name or a Backend, got {type(name).__name__}")
    if name is None:
        name = _default_name()
    key = name.lower()
    if key not in _REGISTRY:
        raise ValueError(f"backend: expected one of {list(_REGISTRY)}, got {name!r}")
    if options:
        return _make(key, **options)
    with _LOCK:
        if key not in _INSTANCES:
            _INSTANCES[key] = _make(key)
        return _INSTANCES[key]


def _make(key: str, **options: Any) -> Backend:
    module, _, attr = _REGISTRY[key].partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            raise NotImplementedError(f"backend {key!r} is not available in this build") from None
        raise
    return getattr(mod, attr)(**options)
