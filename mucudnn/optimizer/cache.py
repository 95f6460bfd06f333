"""The benchmark cache: Find results per (backend, device, library version, problem, direction).

One SQLite file (stdlib :mod:`sqlite3`), by default
``$XDG_CACHE_HOME/mucudnn/benchmarks.sqlite`` (``~/.cache/mucudnn/...``
without XDG_CACHE_HOME). The environment variable ``MUCUDNN_CACHE`` overrides
the path; ``MUCUDNN_CACHE=off`` (or ``0``, ``false``, ``none``) disables the
cache: every lookup misses and nothing is written.

>>> import tempfile, os
>>> c = BenchmarkCache(os.path.join(tempfile.mkdtemp(), "c.sqlite"))
>>> h100 = ("cudnn", "NVIDIA H100", "9.19.0")            # backend, device, version
>>> c.put(h100, "problem-key", "forward", [AlgoPerf(1, 0.5, 1024)], 1 << 30)
>>> c.get(h100, "problem-key", "forward", 64 << 20)
[AlgoPerf(algo=1, time_ms=0.5, workspace_bytes=1024, math_type=0, determinism=None)]

The file is opened in WAL mode with a busy timeout; every statement is
parameterised; each write is one short UPSERT, retried when the database is
locked, so several processes benchmarking at once lose nothing. A value is
the JSON list of :class:`AlgoPerf` dicts measured for the problem at one
micro-batch size (its ``key()`` includes the batch), plus the workspace cap
the Find ran under and a timestamp.

Workspace caps: a Find under cap C only reports algorithms needing at most C
bytes, so an entry is reused only for requests whose cap is <= the stored cap;
a request with a larger cap misses and re-benchmarks, and the new entry
replaces the old. A write never replaces an entry found under a larger cap.

The file itself (what may be opened, read-only and gzipped caches, damage and
recovery, files that are not ours) is :mod:`.cache_store`'s business; entries
are checked when read (:mod:`.cache_entries`): one that fails is dropped with
one warning (deleted where the cache is writable) and measured again.

In-memory state: :func:`default_cache` keeps one BenchmarkCache per resolved
path in the LRU ``optimizer.default_caches`` (bound :data:`DEFAULT_CACHES`;
evicting one closes its connection; :func:`mucudnn.caches.clear_all` empties
it, and so does the end of the process).
"""

from __future__ import annotations

import atexit
import logging
import os
import sqlite3
import time
from typing import Any, Iterable, Iterator, NamedTuple

from ..backends.base import Backend
from ..backends.fold import CACHE_SUFFIX as FOLD_SUFFIX
from ..backends.graph_candidates import PARITY_SUFFIX
from ..backends.split import CACHE_SUFFIX as SPLIT_SUFFIX
from ..backends.split import SLICE_SUFFIX
from ..caches import LRU
from ..problem import AlgoPerf, ConvProblem, Direction
from . import cache_files as files
from .cache_entries import BadEntry, check_cap, decode_results, encode_results
from .cache_store import (SCHEMA_VERSION, CacheArgumentError, CacheFile, CacheFileError,
                          CacheWarning, default_cache_path, warn)

#: What a backend's ``cache_name(problem)`` may append to its name for the
#: problems an option reaches (Note [candidate sets in keys] in
#: :mod:`mucudnn.backends.base`), most specific first: a backend's entries are
#: its name's and these variants'.
VARIANT_SUFFIXES = (PARITY_SUFFIX + SPLIT_SUFFIX + SLICE_SUFFIX, PARITY_SUFFIX + SPLIT_SUFFIX,
                    SPLIT_SUFFIX + SLICE_SUFFIX, SPLIT_SUFFIX, PARITY_SUFFIX, FOLD_SUFFIX)

__all__ = ["BenchmarkCache", "CacheWarning", "CacheFileError", "CacheArgumentError", "Entry",
           "default_cache_path", "default_cache", "resolve", "SCHEMA_VERSION"]

log = logging.getLogger("mucudnn")

_META, _TABLE = files.META, files.TABLE
#: The workspace cap stored for "unlimited".
UNLIMITED = (1 << 63) - 1
#: How many default caches (one per MUCUDNN_CACHE path) stay open at once.
DEFAULT_CACHES = 4
_KEY = "backend = ? AND device = ? AND version = ? AND problem = ? AND direction = ?"
_UPSERT = (
    f"INSERT INTO {_TABLE} (backend, device, version, problem, direction, workspace_cap, "
    "results, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (backend, device, version, problem, direction) DO UPDATE SET "
    "workspace_cap = excluded.workspace_cap, results = excluded.results, "
    f"created = excluded.created WHERE excluded.workspace_cap >= {_TABLE}.workspace_cap "
    f"OR typeof({_TABLE}.workspace_cap) != 'integer' OR {_TABLE}.workspace_cap < 0")


class Entry(NamedTuple):
    """One stored measurement, as :meth:`BenchmarkCache.entries` yields and
    :meth:`BenchmarkCache.put_many` takes."""

    backend: str
    device: str
    version: str
    problem: str
    direction: str
    workspace_cap: int
    results: list[AlgoPerf]
    created: float = 0.0  #: when it was measured (seconds since the epoch; 0: now)


def _close_evicted(_key: Any, cache: "BenchmarkCache") -> None:
    cache.close()


_DEFAULTS: "LRU[str | None, BenchmarkCache]" = LRU(
    "optimizer.default_caches", DEFAULT_CACHES, on_evict=_close_evicted)
atexit.register(_DEFAULTS.clear)  # close them: SQLite then folds and removes its -wal/-shm


def default_cache() -> "BenchmarkCache":
    """The shared cache for the current environment (one object per resolved path)."""
    path = default_cache_path()
    return _DEFAULTS.get_or_create(str(path) if path is not None else None, BenchmarkCache)


def resolve(cache: Any) -> "BenchmarkCache":
    """What a ``cache=`` argument means.

    None (or True): the default cache (``MUCUDNN_CACHE``); False or "off": none;
    a path (str or os.PathLike): that file; a BenchmarkCache: itself. Anything
    else raises :class:`CacheArgumentError` (a TypeError) naming ``cache``.

    >>> resolve(False).enabled
    False
    >>> resolve(0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mucudnn.optimizer.cache_store.CacheArgumentError: cache: expected None (the default ... got 0 (int)
    """
    if isinstance(cache, BenchmarkCache):
        return cache
    if cache is None or cache is True:
        return default_cache()
    return BenchmarkCache(cache, _name="cache")


def _names(backend: Any, problem: "ConvProblem | str") -> tuple[str, str, str]:
    """The backend part of a key: a ``(name, device, version)`` tuple as it is;
    a complete Backend's ``cache_name(problem)`` (Note [candidate sets in keys]
    in :mod:`mucudnn.backends.base`), its device name and version; anything
    else with a ``name`` (a partial backend, an identity record), or a raw
    string problem key, takes ``name``."""
    if isinstance(backend, (tuple, list)) and len(backend) == 3:
        return tuple(str(v) for v in backend)  # type: ignore[return-value]
    name = backend.cache_name(problem) \
        if isinstance(problem, ConvProblem) and isinstance(backend, Backend) else backend.name
    return (str(name), str(getattr(backend, "device_name", "")),
            str(getattr(backend, "version", "")))


def _cap(cap: int | None) -> int:
    if cap is None:
        return UNLIMITED
    return min(int(cap), UNLIMITED)


class BenchmarkCache(CacheFile):
    """Find results on disk, shared by processes.

    ``BenchmarkCache()`` uses :func:`default_cache_path`; ``BenchmarkCache(path)``
    a given file (``*.gz``: a gzipped cache, read-only); ``BenchmarkCache(False)``
    (or "off", or ``MUCUDNN_CACHE=off``) is a no-op cache. ``read_only=True``
    never writes (and never creates) the file. ``backend`` arguments are
    Backend objects (their ``name``, ``device_name`` and ``version`` are the
    key) or a ``(name, device, version)`` tuple; ``problem`` is the
    ConvProblem at the micro-batch size (or its ``key()`` string).
    """

    def __init__(self, path: "str | os.PathLike[str] | bool | None" = None, *,
                 timeout: float = 30.0, read_only: bool = False, _name: str = "path") -> None:
        super().__init__(path, timeout=timeout, read_only=read_only, _name=_name)
        self._dropped: set[tuple[str, ...]] = set()  # entries warned about
        # entries invalidated (Note [entries the backend cannot run]) that a
        # read-only file still holds: misses for this object until stored again
        self._ignored: set[tuple[str, ...]] = set()
        #: Rows :meth:`entries` skipped for a key column that is NULL, empty or not text.
        self.skipped_rows = 0

    # -- the public operations -----------------------------------------------
    def get(self, backend: Any, problem: "ConvProblem | str", direction: "Direction | str",
            workspace_cap: int | None = 0) -> list[AlgoPerf] | None:
        """The stored results, or None when absent, invalid (dropped with a
        warning) or found under a cap smaller than ``workspace_cap`` (None = unlimited)."""
        if not self.enabled:
            return None
        key = (*_names(backend, problem), _pkey(problem), Direction.parse(direction).value)
        if key in self._ignored:
            return None
        row = self._run(lambda c: c.execute(
            f"SELECT results, workspace_cap FROM {_TABLE} WHERE {_KEY}", key).fetchone())
        if row is None:
            return None
        try:
            if check_cap(row[1]) < _cap(workspace_cap):
                return None
            return decode_results(row[0])
        except BadEntry as exc:
            self._drop(key, row, exc)
            return None

    def put(self, backend: Any, problem: "ConvProblem | str", direction: "Direction | str",
            results: Iterable[AlgoPerf], workspace_cap: int | None) -> None:
        """Store ``results`` found under ``workspace_cap`` (None = unlimited).

        An entry found under a larger cap is kept. Results the reader would
        refuse (see :mod:`.cache_entries`) are not stored (logged)."""
        if not self.enabled:
            return
        key = (*_names(backend, problem), _pkey(problem), Direction.parse(direction).value)
        try:
            payload = encode_results(results)
        except BadEntry as exc:
            log.warning("mucudnn cache: not storing %s %s: %s", key[3], key[4], exc)
            return
        row = (*key, _cap(workspace_cap), payload, time.time())
        if self._run(lambda c: c.execute(_UPSERT, row), write=True) is not None:
            self._ignored.discard(key)

    def invalidate(self, backend: Any, problem: "ConvProblem | str",
                   direction: "Direction | str", reason: str) -> None:
        """Forget the entry for (backend, problem, direction): its measurements
        cannot be used (Note [entries the backend cannot run] in
        :mod:`mucudnn.optimizer.planner`). One warning naming the cache file;
        the entry is deleted where the cache is writable, and is a miss for
        this object from now on where it is not, so the problem is measured again."""
        if not self.enabled:
            return
        key = (*_names(backend, problem), _pkey(problem), Direction.parse(direction).value)
        if len(self._ignored) < 4096:
            self._ignored.add(key)
        if key not in self._dropped and len(self._dropped) < 4096:
            self._dropped.add(key)
            warn(f"mucudnn cache {self.path}: dropping the entry for {key[3]} {key[4]} "
                 f"({key[0]}, {key[1]}, {key[2]}): {reason}; it will be measured again")
        if not self.read_only and self._run(
                lambda c: c.execute(f"DELETE FROM {_TABLE} WHERE {_KEY}", key),
                write=True) is not None:
            self._ignored.discard(key)

    def put_many(self, entries: Iterable[Entry]) -> int:
        """Store many entries in one transaction (each as :meth:`put` would);
        returns how many rows were added or replaced. Invalid entries are skipped."""
        if not self.enabled:
            return 0
        rows, now = [], time.time()
        for e in entries:
            try:
                payload = encode_results(e.results)
                rows.append((str(e.backend), str(e.device), str(e.version), str(e.problem),
                             Direction.parse(e.direction).value, _cap(check_cap(e.workspace_cap)),
                             payload, _created(e.created) or now))
            except (BadEntry, ValueError) as exc:
                log.warning("mucudnn cache: not storing %s %s: %s", e.problem, e.direction, exc)

        def op(c: sqlite3.Connection) -> int:
            before = c.total_changes
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany(_UPSERT, rows)
                c.execute("COMMIT")
            except BaseException:
                try:
                    c.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise
            return c.total_changes - before

        return int(self._run(op, write=True) or 0)

    def entries(self, backend: str | None = None, device: str | None = None,
                version: str | None = None) -> Iterator[Entry]:
        """Every valid stored entry (optionally of one backend, device, version).
        A backend's entries include its variants' (``backend + "+fold"``,
        ``backend + "+split"``, ...: :data:`VARIANT_SUFFIXES`, Note [candidate
        sets in keys] in :mod:`mucudnn.backends.base`)."""
        if not self.enabled:
            return
        names = [None if backend is None else backend + s for s in ("", *VARIANT_SUFFIXES)]
        marks = ", ".join("?" * len(names))
        rows = self._run(lambda c: c.execute(
            f"SELECT backend, device, version, problem, direction, workspace_cap, results, "
            f"created FROM {_TABLE} WHERE (? IS NULL OR backend IN ({marks})) "
            "AND (? IS NULL OR device = ?) AND (? IS NULL OR version = ?) "
            "ORDER BY backend, device, version, problem, direction",
            (backend, *names, device, device, version, version)).fetchall()) or []
        skipped = 0
        for r in rows:
            if not all(isinstance(c, str) and c for c in r[:5]):
                skipped += 1  # NULL, empty or not text: no key to use or to delete by
                continue
            try:
                b, d, v, pk, di = r[:5]
                yield Entry(b, d, v, pk, di, check_cap(r[5]), decode_results(r[6]),
                            _created(r[7]))
            except BadEntry as exc:
                self._drop(tuple(r[:5]), (r[6], r[5]), exc)
        if skipped:
            self.skipped_rows += skipped
            warn(f"mucudnn cache {self.path}: skipped {skipped} entr"
                 f"{'y' if skipped == 1 else 'ies'} whose key (backend, device, version, "
                 "problem, direction) has a NULL, empty or non-text column")

    def summary(self) -> dict[tuple[str, str, str], int]:
        """Entry count per (backend, device, version)."""
        if not self.enabled:
            return {}
        rows = self._run(lambda c: c.execute(
            f"SELECT backend, device, version, COUNT(*) FROM {_TABLE} "
            "GROUP BY backend, device, version ORDER BY backend, device, version").fetchall())
        return {(str(b), str(d), str(v)): int(n) for b, d, v, n in rows or []}

    def __len__(self) -> int:
        if not self.enabled:
            return 0
        return int(self._run(lambda c: c.execute(f"SELECT COUNT(*) FROM {_TABLE}").fetchone()[0])
                   or 0)

    def keys(self) -> list[tuple[str, str, str, str, str]]:
        """Every stored (backend, device, version, problem key, direction)."""
        if not self.enabled:
            return []
        return [tuple(r) for r in self._run(lambda c: c.execute(
            f"SELECT backend, device, version, problem, direction FROM {_TABLE} "
            "ORDER BY backend, device, version, problem, direction").fetchall()) or []]

    def clear(self) -> None:
        """Delete every entry (CacheFileError for a read-only cache)."""
        if self.enabled:
            if self.read_only:
                raise self._error(f"{self._where()} is read-only; it cannot be cleared")
            self._run(lambda c: c.execute(f"DELETE FROM {_TABLE}"), write=True)

    def _drop(self, key: tuple, row: tuple, exc: BaseException) -> None:
        """Forget an entry that failed validation: one warning; deleted where writable."""
        names = tuple(str(k) for k in key)
        if names not in self._dropped and len(self._dropped) < 4096:
            self._dropped.add(names)
            warn(f"mucudnn cache {self.path}: dropping the entry for {names[3]} {names[4]} "
                 f"({names[0]}, {names[1]}, {names[2]}): {exc}; it will be measured again")
        if not self._readonly:
            self._run(lambda c: c.execute(
                f"DELETE FROM {_TABLE} WHERE {_KEY} AND results IS ? AND workspace_cap IS ?",
                (*key, row[0], row[1])), write=True)


def _created(value: Any) -> float:
    """A stored timestamp, or 0.0 where it is not a finite number >= 0."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e12:
        return float(value)
    return 0.0


def _pkey(problem: "ConvProblem | str") -> str:
    return problem if isinstance(problem, str) else problem.key()
