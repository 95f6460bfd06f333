"""Finding and loading libcudnn (cuDNN 9).

Search order, first success wins:

1. the ``MUCUDNN_CUDNN_LIBRARY`` environment variable (a path to libcudnn);
2. the ``nvidia-cudnn-cu13`` wheel, then ``nvidia-cudnn-cu12`` (located through
   ``importlib.metadata``, then the ``nvidia.cudnn`` namespace package through
   ``importlib.util.find_spec``; site-packages is never guessed);
3. ``cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")`` when cuda-pathfinder is
   installed;
4. the system loader: ``ctypes.CDLL("libcudnn.so.9")``.

On failure :class:`~mucudnn._cudnn.errors.CudnnLibraryNotFoundError` lists every
place tried and why it failed ("not found" vs "failed to load: <OSError>").
A library older than cuDNN 9 is refused (:class:`CudnnVersionError`).

Nothing is loaded at import time; :func:`library` loads once and caches.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from .errors import CudnnLibraryNotFoundError, CudnnVersionError

__all__ = ["library", "library_path", "library_source", "get_version", "get_cudart_version",
           "version_tuple", "version_string", "find_library", "ENV_VAR", "MIN_VERSION"]

log = logging.getLogger("mucudnn")

ENV_VAR = "MUCUDNN_CUDNN_LIBRARY"
#: The oldest cuDNN this binding accepts (cudnnGetVersion encoding).
MIN_VERSION = 90000
#: Wheel distributions tried, in order.
WHEEL_DISTRIBUTIONS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
#: Library file names, per platform.
if sys.platform == "win32":  # pragma: no cover - Linux is what we test
    LIBRARY_NAMES = ("cudnn64_9.dll",)
else:
    LIBRARY_NAMES = ("libcudnn.so.9",)
#: Names handed to the system loader.
SYSTEM_NAMES: tuple[str, ...] = LIBRARY_NAMES


@dataclass(frozen=True)
class Attempt:
    """One place tried: where, and what happened."""

    source: str          # e.g. "MUCUDNN_CUDNN_LIBRARY", "wheel nvidia-cudnn-cu13"
    target: str          # a path or a library name ("" when nothing to try)
    outcome: str         # "not found", "failed to load", "refused", "loaded"
    reason: str = ""

    def __str__(self) -> str:
        where = f"{self.source} ({self.target})" if self.target else self.source
        return f"{where}: {self.outcome}" + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class Loaded:
    cdll: ctypes.CDLL
    path: str
    source: str
    version: int


# -- the places ------------------------------------------------------------------
# Each yields (source, target, load) where load() returns a CDLL or raises
# FileNotFoundError (not found) / OSError (failed to load); or (source, "", None)
# with a reason via _NotFound when there is nothing to try.

class _NotFound(Exception):
    pass


# Indirections so tests can hide places without touching importlib itself.
_distribution = importlib.metadata.distribution
_find_spec = importlib.util.find_spec


def _load_path(path: str) -> Callable[[], ctypes.CDLL]:
    def load() -> ctypes.CDLL:
        if not os.path.exists(path):
            raise FileNotFoundError(f"no such file: {path}")
        return ctypes.CDLL(path)
    return load


def _from_env() -> Iterator[tuple]:
    path = os.environ.get(ENV_VAR)
    if not path:
        raise _NotFound(f"{ENV_VAR} is not set")
    yield (ENV_VAR, path, _load_path(os.path.expanduser(path)))


def _wheel_files(dist_name: str) -> list[str]:
    """Paths of libcudnn inside an installed wheel (importlib.metadata)."""
    try:
        dist = _distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise _NotFound("not installed") from None
    found = []
    for f in dist.files or ():
        if f.name in LIBRARY_NAMES:
            found.append(str(dist.locate_file(f)))
    if not found:
        raise _NotFound(f"installed, but it lists no {LIBRARY_NAMES[0]}")
    return found


def _wheel(dist_name: str) -> Callable[[], Iterator[tuple]]:
    def gen() -> Iterator[tuple]:
        for path in _wheel_files(dist_name):
            yield (f"wheel {dist_name}", path, _load_path(path))
    return gen


def _namespace_package() -> Iterator[tuple]:
    """nvidia.cudnn located with importlib.util.find_spec (covers wheels whose
    metadata is missing, e.g. vendored copies)."""
    try:
        spec = _find_spec("nvidia.cudnn")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise _NotFound("package nvidia.cudnn not importable")
    for root in spec.submodule_search_locations:
        for name in LIBRARY_NAMES:
            sub = "bin" if sys.platform == "win32" else "lib"
            yield ("package nvidia.cudnn", os.path.join(root, sub, name),
                   _load_path(os.path.join(root, sub, name)))


def _import_pathfinder():
    try:
        import cuda.pathfinder as pathfinder  # type: ignore[import-not-found]
    except ImportError:
        return None
    return pathfinder


def _pathfinder() -> Iterator[tuple]:
    pf = _import_pathfinder()
    if pf is None or not hasattr(pf, "load_nvidia_dynamic_lib"):
        raise _NotFound("cuda-pathfinder not installed")

    def load() -> ctypes.CDLL:
        try:
            loaded = pf.load_nvidia_dynamic_lib("cudnn")
        except Exception as exc:  # DynamicLibNotFoundError and friends
            if type(exc).__name__ in ("DynamicLibNotFoundError", "DynamicLibUnknownError",
                                      "DynamicLibNotAvailableError"):
                raise FileNotFoundError(f"{type(exc).__name__}: {exc}") from None
            raise OSError(f"{type(exc).__name__}: {exc}") from None
        return ctypes.CDLL(loaded.abs_path)

    yield ("cuda.pathfinder", 'load_nvidia_dynamic_lib("cudnn")', load)


def _system() -> Iterator[tuple]:
    for name in SYSTEM_NAMES:
        yield ("system loader", name, lambda name=name: ctypes.CDLL(name))


def _sources() -> list[tuple[str, Callable[[], Iterator[tuple]]]]:
    """(label, generator of candidates) for every place, in search order."""
    return [(ENV_VAR, _from_env),
            *((f"wheel {d}", _wheel(d)) for d in WHEEL_DISTRIBUTIONS),
            ("package nvidia.cudnn", _namespace_package),
            ("cuda.pathfinder", _pathfinder),
            ("system loader", _system)]


def _is_not_found(exc: OSError) -> bool:
    if isinstance(exc, FileNotFoundError):
        return True
    text = str(exc)
    return "No such file" in text or "cannot find" in text.lower() or \
        "could not be found" in text.lower()


def _read_version(cdll: ctypes.CDLL) -> int:
    fn = cdll["cudnnGetVersion"]  # a fresh function object, not the cached attribute
    fn.restype = ctypes.c_size_t
    fn.argtypes = []
    return int(fn())


def format_version(v: int) -> str:
    """92801 -> "9.28.1" (cuDNN 9 encoding); 8907 -> "8.9.7" (cuDNN <= 8 encoded
    MAJOR*1000 + MINOR*100 + PATCH)."""
    if v < 10000:
        return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def find_library() -> Loaded:
    """Search every place, uncached; the first cuDNN >= 9 wins."""
    attempts: list[Attempt] = []
    refused: list[Attempt] = []
    for source_label, source in _sources():
        try:
            candidates = list(source())
        except _NotFound as exc:
            attempts.append(Attempt(source_label, "", "not found", str(exc)))
            continue
        for label, target, load in candidates:
            try:
                cdll = load()
            except OSError as exc:
                outcome = "not found" if _is_not_found(exc) else "failed to load"
                attempts.append(Attempt(label, target, outcome, str(exc)))
                if label == ENV_VAR:
                    log.warning("mucudnn: %s=%s could not be loaded (%s); searching further",
                                ENV_VAR, target, exc)
                continue
            try:
                version = _read_version(cdll)
            except (AttributeError, OSError) as exc:
                attempts.append(Attempt(label, target, "failed to load",
                                        f"not a cuDNN library (no cudnnGetVersion: {exc})"))
                continue
            if version < MIN_VERSION:
                a = Attempt(label, target, "refused",
                            f"cuDNN {format_version(version)} is older than the required "
                            f"{format_version(MIN_VERSION)}")
                attempts.append(a)
                refused.append(a)
                continue
            path = getattr(cdll, "_name", target) or target
            return Loaded(cdll, str(path), label, version)
    lines = "\n".join(f"  - {a}" for a in attempts)
    if refused and all(a.outcome in ("refused", "not found") for a in attempts):
        raise CudnnVersionError(
            "mucudnn needs cuDNN 9 (cudnnGetVersion() >= 90000); only older versions were "
            f"found:\n{lines}\nInstall cuDNN 9, e.g. `pip install nvidia-cudnn-cu13`, or set "
            f"{ENV_VAR} to the path of a libcudnn.so.9.")
    raise CudnnLibraryNotFoundError(
        "mucudnn could not load cuDNN 9 (libcudnn). Places tried, in order:\n"
        f"{lines}\nInstall it with `pip install nvidia-cudnn-cu13` (or -cu12), or set "
        f"{ENV_VAR} to the path of a libcudnn.so.9.", tuple(attempts))


_lock = threading.Lock()
_loaded: Optional[Loaded] = None


def _get() -> Loaded:
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                _loaded = find_library()
                log.debug("mucudnn: loaded cuDNN %s from %s (%s)",
                          format_version(_loaded.version), _loaded.path, _loaded.source)
    return _loaded


def library() -> ctypes.CDLL:
    """The loaded libcudnn (loads it on first call)."""
    return _get().cdll


def library_path() -> str:
    return _get().path


def library_source() -> str:
    """Which place the library came from, e.g. ``"wheel nvidia-cudnn-cu13"``."""
    return _get().source


def get_version() -> int:
    """``cudnnGetVersion()``: MAJOR*10000 + MINOR*100 + PATCH, e.g. 91900."""
    return _get().version


def version_tuple() -> tuple[int, int, int]:
    v = get_version()
    return (v // 10000, v // 100 % 100, v % 100)


def version_string() -> str:
    """E.g. ``"9.19.0"``."""
    return format_version(get_version())


def get_cudart_version() -> int:
    """``cudnnGetCudartVersion()``: the CUDA runtime version cuDNN was built with
    (e.g. 13000)."""
    fn = library()["cudnnGetCudartVersion"]
    fn.restype = ctypes.c_size_t
    fn.argtypes = []
    return int(fn())
