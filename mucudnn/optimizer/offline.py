"""A backend that only answers from a benchmark cache.

Measurements made on a GPU (``python -m mucudnn bench`` fills the SQLite cache)
can be optimised, compared and plotted later on any machine: :class:`CachedBackend`
presents itself under the measured backend's name, device and library version,
so the cache's keys match, and its ``find`` refuses anything the cache lacks.
It cannot execute. The cache may be a gzipped export (``*.sqlite.gz``, see
``python -m mucudnn cache export``) or a read-only file: it is only read.

>>> be = CachedBackend("cudnn", cache="h100.sqlite.gz")       # doctest: +SKIP
>>> mu.optimize(problem, "forward", 64 << 20, backend=be)    # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, NoReturn, Union

from ..backends.base import BackendBase
from ..backends.find_options import stored_search_names
from ..errors import InvalidValueError, MucudnnError, UnsupportedOperationError
from ..problem import AlgoPerf, ConvProblem, Direction
from .benchmark import resolve_cache
from .cache import VARIANT_SUFFIXES


class CacheMissError(MucudnnError, LookupError):
    """A (problem, direction) the cache holds no measurement for."""


class CachedBackend(BackendBase):
    """Stands in for backend ``name`` as measured on ``device_name`` with
    library ``version``, answering ``find`` from ``cache`` only.

    ``device_name`` and ``version`` default to the only ones the cache holds
    for ``name``; where it holds several, say which.
    """

    def __init__(self, name: str = "cudnn-graph", device_name: str | None = None,
                 version: str | None = None, cache: Any = None) -> None:
        self.cache = resolve_cache(cache)
        keys = self.cache.keys()  # opens it (read-only where it cannot be written)
        if not self.cache.enabled:
            raise InvalidValueError("cache: the cached backend needs a benchmark cache "
                             "(MUCUDNN_CACHE is 'off' or the file could not be opened)")
        # the default search's entries first (Note [search parity]), else an
        # earlier default's (a cache from an earlier release), else the bare name's
        for cand in stored_search_names(name):
            found = sorted({k[:3] for k in keys if k[0] == cand})
            if found:
                break
        if device_name is not None:
            found = [f for f in found if f[1] == device_name]
        if version is not None:
            found = [f for f in found if f[2] == version]
        if not found:
            raise InvalidValueError(
                f"cache: no measurements of backend {name!r}"
                f"{f' on {device_name!r}' if device_name else ''}"
                f"{f' with version {version!r}' if version else ''} in {self.cache!r}")
        if len(found) > 1:
            raise InvalidValueError(f"device_name/version: the cache holds {name!r} measurements of "
                             f"several devices or versions {found}; choose one")
        self.name, self.device_name, self.version = found[0]
        #: per variant (folded, split, ...: VARIANT_SUFFIXES, most specific first),
        #: the problem keys measured under it (Note [candidate sets in keys])
        variants: dict[str, set[str]] = {self.name + s: set() for s in VARIANT_SUFFIXES}
        for k in keys:
            if k[0] in variants and k[1:3] == (self.device_name, self.version):
                variants[k[0]].add(k[3])
        self._variants = [(n, frozenset(problems)) for n, problems in variants.items()]

    def cache_name(self, problem: ConvProblem) -> str:
        """The name of the measurements replayed for ``problem``: the most
        specific variant's (folded, split, ...: Note [candidate sets in keys]
        in :mod:`mucudnn.backends.base`) where the cache holds it, else
        ``name``."""
        key = problem.key()
        for name, problems in self._variants:
            if key in problems:
                return name
        return self.name

    def __repr__(self) -> str:
        return f"CachedBackend({self.name!r}, {self.device_name!r}, {self.version!r})"

    def find(self, problem: ConvProblem, direction: "Direction | str",
             workspace_limit: int | None) -> list[AlgoPerf]:
        raise CacheMissError(
            f"{problem.key()} {Direction.parse(direction).value} (workspace cap "
            f"{workspace_limit}) was never measured with {self.name} on {self.device_name} "
            f"{self.version}; benchmark it there first (python -m mucudnn bench ...)")

    def workspace_size(self, problem: ConvProblem, direction: "Direction | str",
                       algo: Union[int, str], math_type: Union[int, str] = 0) -> int:
        self._cannot("workspace_size")

    def run(self, *args: Any, **kwargs: Any) -> None:
        self._cannot("run")

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        self._cannot("empty")

    def from_host(self, array: Any) -> Any:
        self._cannot("from_host")

    def to_host(self, array: Any) -> Any:
        self._cannot("to_host")

    def alloc_workspace(self, nbytes: int) -> Any:
        self._cannot("alloc_workspace")

    def synchronize(self) -> None:
        pass

    def _cannot(self, what: str) -> NoReturn:
        raise UnsupportedOperationError(
            f"{what}: {self!r} only replays measurements from the cache; it cannot execute")
