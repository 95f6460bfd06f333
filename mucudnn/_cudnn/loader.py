"""Finding and loading libcudnn (cuDNN 9.x, and nothing else).

Search order, first success wins:

1. the ``MUCUDNN_CUDNN_LIBRARY`` environment variable (a path to libcudnn);
2. the ``nvidia-cudnn-cu13`` wheel, then ``nvidia-cudnn-cu12`` (located through
   ``importlib.metadata``, then the ``nvidia.cudnn`` namespace package through
   ``importlib.util.find_spec``; site-packages is never guessed);
3. ``cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")`` when cuda-pathfinder is
   installed;
4. the system loader: ``ctypes.CDLL("libcudnn.so.9")``.

**When the variable is set it is the only candidate.** Whatever is wrong with
the path it names raises at once, naming the variable, the path and (where
known) the version found; the search never falls through to another cuDNN:

- no such file, or not a regular file: :class:`CudnnLibraryNotFoundError`;
- not a cuDNN library, or not one that loads: :class:`CudnnLibraryNotFoundError`;
- a cuDNN whose major version is not 9: :class:`CudnnVersionError`.

Only major version 9 is accepted (``MIN_VERSION <= cudnnGetVersion() <
MAX_VERSION``): the prototype table is transcribed from, and checked against,
the 9.x headers, and a later major version may change any of it.

What is checked, and when (for every candidate that is a path: the variable,
the wheels, the namespace package):

*Before loading* (nothing of the library runs; ``dlopen`` would run its
constructors):

- the path exists and is a regular file;
- its file name, and the name of the file a symlink resolves to: a cuDNN
  soname suffix (``libcudnn.so.8``, ``libcudnn.so.10.1.0``) must say major 9;
- (Linux) the file is ELF, and its ``DT_SONAME`` (read by :mod:`.elf`, without
  loading) is absent or ``libcudnn.so.<major>`` with major 9. Another soname
  (``libfoo.so.1``, ``libcudnn_graph.so.9``, a cuDNN sub-library) is not the
  library the prototype table binds and is refused;
- (Linux) ``libcudnn_graph.so.9`` is beside the file a path resolves to (Note
  [cuDNN's sub-libraries]): the file is then loaded by that real path.

*After loading* (only what the library itself can tell):

- ``cudnnGetVersion`` is exported (else: not a cuDNN library);
- its value is in ``[MIN_VERSION, MAX_VERSION)``.

A library refused after loading stays mapped in the process (ctypes cannot
safely unload it) and its constructors have run; only a library with no
soname and no version in its file name gets that far.

Places found by name only (cuda.pathfinder, the system loader) are loaded
first and checked after loading. On failure of the whole search
:class:`~mucudnn._cudnn.errors.CudnnLibraryNotFoundError` lists every place
tried and why it failed ("not found", "failed to load", "refused"); when every
library found was the wrong version it is :class:`CudnnVersionError`.

Nothing is loaded at import time; :func:`library` loads once and caches.

>>> from mucudnn._cudnn import loader
>>> loader.library_source() in ("MUCUDNN_CUDNN_LIBRARY", "wheel nvidia-cudnn-cu13",
...     "wheel nvidia-cudnn-cu12", "package nvidia.cudnn", "cuda.pathfinder", "system loader")
True
>>> loader.soname_major("libcudnn.so.9.19.0"), loader.soname_major("libcudnn_ops.so.9")
(9, None)
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from ..errors import MucudnnError
from . import elf
from .errors import CudnnLibraryNotFoundError, CudnnVersionError

__all__ = ["library", "library_path", "library_source", "get_version", "get_cudart_version",
           "version_tuple", "version_string", "find_library", "soname_major", "format_version",
           "ENV_VAR", "MIN_VERSION", "MAX_VERSION", "REQUIRED_MAJOR"]

log = logging.getLogger("mucudnn")

ENV_VAR = "MUCUDNN_CUDNN_LIBRARY"
#: The one cuDNN major version this binding accepts.
REQUIRED_MAJOR = 9
#: The oldest cuDNN this binding accepts (cudnnGetVersion encoding).
MIN_VERSION = REQUIRED_MAJOR * 10000
#: The first cuDNN this binding refuses as too new (exclusive bound).
MAX_VERSION = (REQUIRED_MAJOR + 1) * 10000
#: Wheel distributions tried, in order.
WHEEL_DISTRIBUTIONS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
#: Library file names, per platform.
if sys.platform == "win32":  # pragma: no cover - Linux is what we test
    LIBRARY_NAMES = ("cudnn64_9.dll",)
else:
    LIBRARY_NAMES = ("libcudnn.so.9",)
#: Names handed to the system loader.
SYSTEM_NAMES: tuple[str, ...] = LIBRARY_NAMES
#: Whether the ELF soname check applies (ELF platforms).
_CHECK_ELF = sys.platform.startswith(("linux", "freebsd"))

_SONAME_RE = re.compile(r"libcudnn\.so\.(\d+)(?:\.\d+)*")
_DLL_RE = re.compile(r"cudnn64_(\d+)\.dll", re.IGNORECASE)
_HINT = (f"Point {ENV_VAR} at cuDNN {REQUIRED_MAJOR}'s libcudnn.so.{REQUIRED_MAJOR} "
         "(e.g. the one `pip install nvidia-cudnn-cu13` installs), or unset it to search "
         "the wheels and the system loader.")


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



class _NoFile(MucudnnError, FileNotFoundError):
    """A candidate path that names no file (internal: recorded as "not found")."""


class _NotLoaded(MucudnnError, OSError):
    """A candidate the system loader refused (internal: recorded as "failed to load")."""

def soname_major(name: str) -> Optional[int]:
    """The major version a cuDNN library name claims: ``"libcudnn.so.9.19.0"`` -> 9,
    ``"cudnn64_9.dll"`` -> 9; None for any other name (``"libcudnn.so"``,
    ``"libcudnn_graph.so.9"``, ``"libfoo.so.1"``)."""
    base = os.path.basename(name)
    m = _SONAME_RE.fullmatch(base) or _DLL_RE.fullmatch(base)
    return int(m.group(1)) if m else None


def format_version(v: int) -> str:
    """92801 -> "9.28.1" (cuDNN 9 encoding); 8907 -> "8.9.7" (cuDNN <= 8 encoded
    MAJOR*1000 + MINOR*100 + PATCH)."""
    if v < 10000:
        return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


# -- checks ----------------------------------------------------------------------
BEFORE, AFTER = "before loading", "after loading"


class _Refused(Exception):
    """A candidate failed a check. ``kind``: "version" (a cuDNN of another
    major version) or "identity" (not cuDNN's main library); ``when``: BEFORE or
    AFTER; ``version`` (cudnnGetVersion) or ``major`` where known. Internal:
    find_library turns it into an Attempt."""

    def __init__(self, reason: str, kind: str, when: str, version: Optional[int] = None,
                 major: Optional[int] = None) -> None:
        super().__init__(reason)
        self.reason, self.kind, self.when = reason, kind, when
        self.version, self.major = version, major


def _refuse_major(major: int, what: str) -> None:
    if major != REQUIRED_MAJOR:
        raise _Refused(f"{what} says cuDNN {major}; mucudnn needs cuDNN {REQUIRED_MAJOR}.x "
                       f"(its prototype table is checked against the {REQUIRED_MAJOR}.x headers)",
                       "version", BEFORE, major=major)


def _check_file(path: str) -> None:
    """The checks made before loading (see the module docstring)."""
    if not os.path.exists(path):
        raise _NoFile(f"no such file: {path}")
    if not os.path.isfile(path):
        raise _Refused(f"{path} is not a file", "identity", BEFORE)
    names = [os.path.basename(path)]
    real = os.path.basename(os.path.realpath(path))
    if real != names[0]:
        names.append(real)
    for name in names:
        major = soname_major(name)
        if major is not None:
            _refuse_major(major, f"its file name {name}")
    if not _CHECK_ELF:  # pragma: no cover - Linux is what we test
        return
    try:
        soname = elf.read_soname(path)
    except elf.ElfFormatError as exc:
        raise _Refused(f"not a shared library: {exc}", "identity", BEFORE) from None
    if soname is None:
        return
    major = soname_major(soname)
    if major is None:
        raise _Refused(f"its DT_SONAME is {soname}: not the cuDNN library (that is "
                       f"libcudnn.so.{REQUIRED_MAJOR})", "identity", BEFORE)
    _refuse_major(major, f"its DT_SONAME {soname}")


def _read_version(cdll: ctypes.CDLL) -> int:
    fn = cdll["cudnnGetVersion"]  # a fresh function object, not the cached attribute
    fn.restype = ctypes.c_size_t
    fn.argtypes = []
    return int(fn())


def _check_loaded(cdll: ctypes.CDLL) -> int:
    """The checks made after loading; returns cudnnGetVersion()."""
    try:
        version = _read_version(cdll)
    except (AttributeError, OSError) as exc:
        raise _Refused(f"not a cuDNN library (it exports no cudnnGetVersion: {exc})",
                       "identity", AFTER) from None
    if version < MIN_VERSION:
        raise _Refused(f"cuDNN {format_version(version)} is older than the required "
                       f"{format_version(MIN_VERSION)}", "version", AFTER, version=version)
    if version >= MAX_VERSION:
        raise _Refused(f"cuDNN {format_version(version)} is newer than the supported "
                       f"{REQUIRED_MAJOR}.x (the prototype table is checked against the "
                       f"{REQUIRED_MAJOR}.x headers)", "version", AFTER, version=version)
    return version


# -- the places ------------------------------------------------------------------
# Each yields (source, target, load) where load() returns a CDLL or raises
# FileNotFoundError (not found) / OSError (failed to load) / _Refused; or raises
# _NotFound with a reason when there is nothing to try.

class _NotFound(Exception):
    pass


# Indirections so tests can hide places without touching importlib itself.
_distribution = importlib.metadata.distribution
_find_spec = importlib.util.find_spec


class _LoadFailed(OSError):
    """dlopen refused a file that exists (never "not found", whatever its text says)."""


#: The sub-library cuDNN 9's libcudnn loads from its own folder for every call
#: (cudnnGetVersion included); Note [cuDNN's sub-libraries].
REQUIRED_SUB_LIBRARY = f"libcudnn_graph.so.{REQUIRED_MAJOR}"
#: The others, loaded on first use of their part of the API; missing ones are logged.
OTHER_SUB_LIBRARIES = tuple(f"libcudnn_{n}.so.{REQUIRED_MAJOR}" for n in (
    "ops", "cnn", "adv", "heuristic", "engines_precompiled", "engines_runtime_compiled"))


# Note [cuDNN's sub-libraries]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# CuDNN 9's libcudnn.so.9 is a small dispatcher that dlopens
# libcudnn_graph.so.9 (and, on first use of their calls, ops, cnn, adv, the
# engine libraries) from the folder of the file the process mapped. If
# libcudnn_graph is not there, its first call (cudnnGetVersion) prints "Cannot
# load symbol" and aborts the process: no exception can be raised after that.
# So a path is loaded by its real path (a symlink's target: the file in the
# cuDNN installation, beside its sub-libraries; the dispatcher does not follow
# the link itself), and a file with no libcudnn_graph.so.9 beside it (a lone
# copy of libcudnn.so.9, or a link to one) is refused before it is loaded.


def _check_siblings(real: str) -> None:
    """See Note [cuDNN's sub-libraries]: refuse ``real`` (a resolved path) when
    libcudnn_graph is not beside it; log the other missing sub-libraries."""
    folder = os.path.dirname(real)
    if not os.path.isfile(os.path.join(folder, REQUIRED_SUB_LIBRARY)):
        raise _Refused(
            f"{real} has no {REQUIRED_SUB_LIBRARY} beside it in {folder}; cuDNN "
            f"{REQUIRED_MAJOR}'s libcudnn loads its sub-libraries from its own folder and "
            "aborts the process without them (a lone copy of libcudnn, or a link to one?): "
            "point at the libcudnn of a complete cuDNN installation, or copy the whole "
            "folder", "identity", BEFORE)
    missing = [n for n in OTHER_SUB_LIBRARIES if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        log.warning("mucudnn: %s has no %s beside it; the calls that need them will fail",
                    real, ", ".join(missing))


def _load_path(path: str) -> Callable[[], ctypes.CDLL]:
    def load() -> ctypes.CDLL:
        _check_file(path)
        # Note: the real path, so the loader opens the very file checked (a bare
        # name would be looked up on the library search path instead) and cuDNN
        # finds its sub-libraries beside it (Note [cuDNN's sub-libraries]).
        real = os.path.realpath(path)
        if _CHECK_ELF:
            _check_siblings(real)
        try:
            return ctypes.CDLL(real)
        except OSError as exc:
            # glibc says "No such file or directory" also for an existing file
            # built for another machine; the file was there a moment ago.
            raise _LoadFailed(f"{exc} (the file exists but does not load here: a missing "
                              "dependency, another machine type, or a damaged file)") from None
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
                raise _NoFile(f"{type(exc).__name__}: {exc}") from None
            raise _NotLoaded(f"{type(exc).__name__}: {exc}") from None
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
    if isinstance(exc, _LoadFailed):
        return False
    if isinstance(exc, FileNotFoundError):
        return True
    text = str(exc)
    return "No such file" in text or "cannot find" in text.lower() or \
        "could not be found" in text.lower()


def _try(label: str, target: str, load: Callable[[], ctypes.CDLL]
         ) -> tuple[Optional[Loaded], Attempt, Optional[_Refused]]:
    """Load and check one candidate: (Loaded or None, what happened, the refusal if any)."""
    try:
        cdll = load()
        version = _check_loaded(cdll)
    except _Refused as r:
        return None, Attempt(label, target, "refused", f"{r.reason} [checked {r.when}]"), r
    except OSError as exc:
        outcome = "not found" if _is_not_found(exc) else "failed to load"
        return None, Attempt(label, target, outcome, str(exc)), None
    path = getattr(cdll, "_name", target) or target
    return Loaded(cdll, str(path), label, version), Attempt(label, target, "loaded"), None


def _env_only(raw: str) -> Loaded:
    """The library ``MUCUDNN_CUDNN_LIBRARY`` names, or an error: no other place is tried."""
    path = os.path.expanduser(raw)
    loaded, attempt, refusal = _try(ENV_VAR, path, _load_path(path))
    if loaded is not None:
        return loaded
    text = (f"{ENV_VAR} is set to {raw!r}, so it is the only place mucudnn loads cuDNN from, "
            f"and it cannot be used:\n  - {attempt}\n{_HINT}")
    if refusal is not None and refusal.kind == "version":
        raise CudnnVersionError(text, (attempt,), refusal.version, refusal.major)
    raise CudnnLibraryNotFoundError(text, (attempt,))


def find_library() -> Loaded:
    """Search every place, uncached; the first cuDNN 9.x wins. When
    ``MUCUDNN_CUDNN_LIBRARY`` is set, only the library it names is tried."""
    raw = os.environ.get(ENV_VAR)
    if raw:
        return _env_only(raw)
    attempts: list[Attempt] = []
    refused: list[_Refused] = []
    for source_label, source in _sources():
        try:
            candidates = list(source())
        except _NotFound as exc:
            attempts.append(Attempt(source_label, "", "not found", str(exc)))
            continue
        for label, target, load in candidates:
            loaded, attempt, refusal = _try(label, target, load)
            if loaded is not None:
                return loaded
            attempts.append(attempt)
            if refusal is not None and refusal.kind == "version":
                refused.append(refusal)
    lines = "\n".join(f"  - {a}" for a in attempts)
    if refused and all(a.outcome in ("refused", "not found") for a in attempts):
        first = refused[0]
        raise CudnnVersionError(
            f"mucudnn needs cuDNN {REQUIRED_MAJOR}.x ({MIN_VERSION} <= cudnnGetVersion() < "
            f"{MAX_VERSION}); only other versions were found and refused:\n{lines}\n"
            f"Install cuDNN {REQUIRED_MAJOR}, e.g. `pip install nvidia-cudnn-cu13`, or set "
            f"{ENV_VAR} to the path of a libcudnn.so.{REQUIRED_MAJOR}.",
            tuple(attempts), first.version, first.major)
    raise CudnnLibraryNotFoundError(
        f"mucudnn could not load cuDNN {REQUIRED_MAJOR} (libcudnn). Places tried, in order:\n"
        f"{lines}\nInstall it with `pip install nvidia-cudnn-cu13` (or -cu12), or set "
        f"{ENV_VAR} to the path of a libcudnn.so.{REQUIRED_MAJOR}.", tuple(attempts))


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
