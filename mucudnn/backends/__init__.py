"""Backends: the Backend protocol and its implementations (numpy, cudnn, cudnn-graph,
and cudnn-graph+knobs: the graph backend searching each engine's knobs), and
what cudnn-graph and numpy share to run a strided first layer folded by
space-to-depth (:mod:`.fold`, :mod:`.fold_cudnn`; Note [folded first layers]).

>>> get_backend("numpy").name
'numpy'
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ..cuda import current_device, device_count
from .base import OUTPUT_OF, Backend, BackendBase, ConvTensors, Launcher, adapt
from .cudnn import CudnnBackend
from .cudnn_graph import CudnnGraphBackend, CudnnGraphKnobsBackend
from .numpy import NumpyBackend
from ..errors import InvalidTypeError, InvalidValueError

__all__ = ["Backend", "BackendBase", "ConvTensors", "CudnnBackend", "CudnnGraphBackend", "Launcher",
           "default_name",
           "NumpyBackend", "OUTPUT_OF", "adapt",
           "available_backends", "get_backend", "DEFAULT_GPU_BACKEND"]

log = logging.getLogger("mucudnn")

#: name -> class.
_REGISTRY: dict[str, type] = {
    "numpy": NumpyBackend,
    "cudnn": CudnnBackend,
    "cudnn-graph": CudnnGraphBackend,
    "cudnn-graph+knobs": CudnnGraphKnobsBackend,  # Note [knob search]
}
#: (name, device) -> the shared instance. Bounded by names x devices; backends
#: hold handles and device memory, so they live as long as the process.
_INSTANCES: dict[tuple[str, int | None], Backend] = {}
_LOCK = threading.Lock()
_NOTICE_GIVEN = False

#: The GPU backend get_backend() picks. Note: the graph API's engines ran every
#: measured network faster than the legacy API's algorithms, under a 64 MiB cap
#: and unlimited alike (docs/BENCHMARKS.md); its cost is a
#: slower first optimisation (it times every engine config the heuristics give).
DEFAULT_GPU_BACKEND = "cudnn-graph"


def available_backends() -> list[str]:
    """Names get_backend accepts."""
    return list(_REGISTRY)


def default_name(gpu: "bool | None" = None) -> str:
    """The backend a call without a name gets: ``MUCUDNN_BACKEND`` if set, else
    cudnn-graph where a GPU is present, else numpy (with a one-line notice).
    ``gpu``: whether one is (None: count the devices, which loads the CUDA
    runtime; a caller holding a CUDA tensor knows, and a model whose every
    layer runs PyTorch's own call then never loads it).

    >>> default_name(gpu=True) == (os.environ.get("MUCUDNN_BACKEND") or DEFAULT_GPU_BACKEND)
    True
    """
    global _NOTICE_GIVEN
    env = os.environ.get("MUCUDNN_BACKEND", "").strip().lower()
    if env:
        if env not in _REGISTRY:
            raise InvalidValueError(
                f"MUCUDNN_BACKEND: expected one of {list(_REGISTRY)}, got {env!r}")
        return env
    if device_count() > 0 if gpu is None else gpu:
        return DEFAULT_GPU_BACKEND
    if not _NOTICE_GIVEN:
        _NOTICE_GIVEN = True
        log.warning("mucudnn: no CUDA device found; using the NumPy (CPU) backend")
    return "numpy"


def get_backend(name: "str | Backend | None" = None, *, device: int | None = None,
                **options: Any) -> Backend:
    """The backend called ``name`` ("numpy", "cudnn", "cudnn-graph"); with no
    name, ``MUCUDNN_BACKEND`` if set, else cudnn-graph where a GPU is present
    (the faster of the two GPU backends in docs/BENCHMARKS.md), else numpy
    (with a one-line notice). Measurements replayed from a benchmark cache are
    :class:`mucudnn.optimizer.CachedBackend`.

    ``device``: the CUDA device of a GPU backend (default: the current device).
    Backends without options are shared per (name, device). A Backend
    instance (or any object :func:`~mucudnn.backends.base.adapt` accepts) is
    returned as a complete Backend.

    >>> get_backend("numpy") is get_backend("numpy")
    True
    """
    if name is not None and not isinstance(name, str):
        if options or device is not None:
            raise InvalidTypeError("backend: options and device= apply to backend names only")
        return adapt(name)
    if name is None:
        name = default_name()
    key = name.lower()
    cls = _REGISTRY.get(key)
    if cls is None:
        raise InvalidValueError(f"backend: expected one of {list(_REGISTRY)}, got {name!r}")
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise InvalidTypeError(f"device: expected a CUDA device ordinal (int) or None, got {device!r}")
    if cls is NumpyBackend:
        if device is not None:
            raise InvalidValueError(f"device: the numpy backend runs on the host, got device={device}")
    elif device is None:
        device = current_device() if device_count() > 0 else None
    if options:
        return cls(**options) if device is None else cls(device=device, **options)
    with _LOCK:
        inst = _INSTANCES.get((key, device))
        if inst is None:
            inst = cls() if device is None else cls(device=device)
            _INSTANCES[(key, device)] = inst
        return inst
