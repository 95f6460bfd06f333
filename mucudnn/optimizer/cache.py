"""The benchmark cache: Find results per (backend, device, library version, problem, direction).

One SQLite file (stdlib :mod:`sqlite3`), by default
``$XDG_CACHE_HOME/mucudnn/benchmarks.sqlite`` (``~/.cache/mucudnn/...``
without XDG_CACHE_HOME). The environment variable ``MUCUDNN_CACHE`` overrides
the path; ``MUCUDNN_CACHE=off`` (or ``0``, ``false``, ``none``) disables the
cache: every lookup misses and nothing is written.

The file is opened in WAL mode with a busy timeout; every statement is
parameterised; each write is one short UPSERT, retried when the database is
locked, so several processes benchmarking at once lose nothing.

A value is the JSON list of :class:`AlgoPerf` dicts measured for the problem
at one micro-batch size (its ``key()`` includes the batch), plus the
workspace cap the Find ran under and a timestamp.

Note (workspace caps): a Find under cap C only reports algorithms needing at
most C bytes, so an entry is reused only for requests whose cap is <= the
stored cap; a request with a larger cap misses and re-benchmarks, and the new
entry replaces the old. A write never replaces an entry found under a larger
cap (the larger one holds strictly more information).

Recovery: a file that is not SQLite, a SQLite file without our schema table
(or with tables of its own), or a damaged one is moved aside to
``<file>.corrupt-<timestamp>`` with a warning (:class:`CacheWarning`, also
logged on the ``mucudnn`` logger) and a new cache is built. A file of an older
schema version is migrated where a migration exists, else rebuilt. A file of
a *newer* schema version (a newer mucudnn) is left untouched and the cache is
disabled for this process, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import sqlite3
import threading
import time
import warnings
from typing import Any, Callable, Iterable

from ..problem import AlgoPerf, ConvProblem, Direction

__all__ = ["BenchmarkCache", "CacheWarning", "default_cache_path", "default_cache",
           "SCHEMA_VERSION"]

log = logging.getLogger("mucudnn")

#: Version of the on-disk layout; bump it (and add a migration) when the layout changes.
SCHEMA_VERSION = 2
_META = "mucudnn_meta"
_TABLE = "benchmarks"
#: The workspace cap stored for "unlimited".
UNLIMITED = (1 << 63) - 1
_OFF = {"off", "0", "false", "no", "none", "disable", "disabled"}

_CREATE = (
    f"CREATE TABLE IF NOT EXISTS {_META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"""CREATE TABLE IF NOT EXISTS {_TABLE} (
        backend TEXT NOT NULL,
        device TEXT NOT NULL,
        version TEXT NOT NULL,
        problem TEXT NOT NULL,
        direction TEXT NOT NULL,
        workspace_cap INTEGER NOT NULL,
        results TEXT NOT NULL,
        created REAL NOT NULL,
        PRIMARY KEY (backend, device, version, problem, direction))""",
)

#: from_version -> function(conn) bringing the tables to from_version + 1.
#: Versions without an entry are rebuilt (the cache is only a cache).
_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {}


class CacheWarning(RuntimeWarning):
    """The cache file was unusable and has been moved aside, rebuilt or disabled."""


class _Foreign(Exception):
    """The file is not (or no longer) ours."""


class _Newer(Exception):
    """The file was written by a newer schema version."""


def default_cache_path() -> pathlib.Path | None:
    """The cache file ``MUCUDNN_CACHE`` and XDG_CACHE_HOME point to; None when disabled."""
    env = os.environ.get("MUCUDNN_CACHE")
    if env is not None and env.strip():
        if env.strip().lower() in _OFF:
            return None
        return pathlib.Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else pathlib.Path.home() / ".cache"
    return base / "mucudnn" / "benchmarks.sqlite"


_DEFAULTS: dict[Any, "BenchmarkCache"] = {}
_DEFAULTS_LOCK = threading.Lock()


def default_cache() -> "BenchmarkCache":
    """The shared cache for the current environment (one object per resolved path)."""
    path = default_cache_path()
    key = str(path) if path is not None else None
    with _DEFAULTS_LOCK:
        if key not in _DEFAULTS:
            _DEFAULTS[key] = BenchmarkCache(path if path is not None else False)
        return _DEFAULTS[key]


def _is_locked(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


def _is_corrupt(exc: BaseException) -> bool:
    """A DatabaseError that means the file's content is bad (not a lock, not I/O setup)."""
    if isinstance(exc, sqlite3.OperationalError):
        return False
    return isinstance(exc, sqlite3.DatabaseError)


def _names(backend: Any) -> tuple[str, str, str]:
    if isinstance(backend, (tuple, list)) and len(backend) == 3:
        return tuple(str(v) for v in backend)  # type: ignore[return-value]
    return (str(backend.name), str(getattr(backend, "device_name", "")),
            str(getattr(backend, "version", "")))


def _cap(cap: int | None) -> int:
    if cap is None:
        return UNLIMITED
    return min(int(cap), UNLIMITED)


class BenchmarkCache:
    """Find results on disk, shared by processes.

    ``BenchmarkCache()`` uses :func:`default_cache_path`; ``BenchmarkCache(path)``
    a given file; ``BenchmarkCache(False)`` (or ``MUCUDNN_CACHE=off``) is a
    no-op cache. ``backend`` arguments are Backend objects (their ``name``,
    ``device_name`` and ``version`` are the key) or a ``(name, device,
    version)`` tuple; ``problem`` is the ConvProblem at the micro-batch size
    (or its ``key()`` string).
    """

    def __init__(self, path: "str | os.PathLike[str] | bool | None" = None, *,
                 timeout: float = 30.0) -> None:
        if path is None or path is True:
            p = default_cache_path()
        elif path is False or (isinstance(path, str) and path.strip().lower() == "off"):
            p = None  # "off" disables, as MUCUDNN_CACHE=off does
        else:
            p = pathlib.Path(path).expanduser()
        self.path: pathlib.Path | None = p
        self.timeout = float(timeout)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._inode: int | None = None
        self._broken = False

    # -- state ----------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """False for a disabled cache (no path, or unusable this process)."""
        return self.path is not None and not self._broken

    def __repr__(self) -> str:
        return f"BenchmarkCache({str(self.path) if self.path else 'off'})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"] if state["path"] is not None else False,
                      timeout=state["timeout"])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                try:
                    self._conn.close()
                except sqlite3.Error:
                    pass
            self._conn = None

    def __enter__(self) -> "BenchmarkCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the public operations -----------------------------------------------
    def get(self, backend: Any, problem: "ConvProblem | str", direction: "Direction | str",
            workspace_cap: int | None = 0) -> list[AlgoPerf] | None:
        """The stored results, or None when absent or found under a cap smaller
        than ``workspace_cap`` (None = unlimited)."""
        if not self.enabled:
            return None
        key = (*_names(backend), _pkey(problem), Direction.parse(direction).value)
        row = self._run(lambda c: c.execute(
            f"SELECT results, workspace_cap FROM {_TABLE} WHERE backend = ? AND device = ? "
            "AND version = ? AND problem = ? AND direction = ?", key).fetchone())
        if row is None:
            return None
        results, cap = row
        if int(cap) < _cap(workspace_cap):
            return None
        try:
            return [AlgoPerf.from_dict(d) for d in json.loads(results)]
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("mucudnn cache: unreadable entry for %s (%s); ignoring it", key[3], exc)
            return None

    def put(self, backend: Any, problem: "ConvProblem | str", direction: "Direction | str",
            results: Iterable[AlgoPerf], workspace_cap: int | None) -> None:
        """Store ``results`` found under ``workspace_cap`` (None = unlimited).

        An entry found under a larger cap is kept."""
        if not self.enabled:
            return
        payload = json.dumps([r.to_dict() for r in results])
        row = (*_names(backend), _pkey(problem), Direction.parse(direction).value,
               _cap(workspace_cap), payload, time.time())
        self._run(lambda c: c.execute(
            f"INSERT INTO {_TABLE} (backend, device, version, problem, direction, "
            "workspace_cap, results, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (backend, device, version, problem, direction) DO UPDATE SET "
            "workspace_cap = excluded.workspace_cap, results = excluded.results, "
            f"created = excluded.created WHERE excluded.workspace_cap >= {_TABLE}.workspace_cap",
            row))

    def __len__(self) -> int:
        if not self.enabled:
            return 0
        return int(self._run(lambda c: c.execute(f"SELECT COUNT(*) FROM {_TABLE}").fetchone()[0]))

    def keys(self) -> list[tuple[str, str, str, str, str]]:
        """Every stored (backend, device, version, problem key, direction)."""
        if not self.enabled:
            return []
        return [tuple(r) for r in self._run(lambda c: c.execute(
            f"SELECT backend, device, version, problem, direction FROM {_TABLE} "
            "ORDER BY backend, device, version, problem, direction").fetchall())]

    def clear(self) -> None:
        """Delete every entry."""
        if self.enabled:
            self._run(lambda c: c.execute(f"DELETE FROM {_TABLE}"))

    # -- connection, schema, recovery -----------------------------------------
    def _run(self, op: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``op`` on the connection: retry while locked, recover once from a bad file."""
        recovered = False
        delay = 0.01
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while True:
                conn = self._connection()
                if conn is None:  # disabled while opening
                    return None
                try:
                    return op(conn)
                except sqlite3.DatabaseError as exc:
                    if _is_locked(exc) and time.monotonic() < deadline:
                        time.sleep(delay)
                        delay = min(delay * 2, 0.5)
                        continue
                    if not recovered and (_is_corrupt(exc) or "no such table" in str(exc)):
                        recovered = True
                        self.close()
                        if _is_corrupt(exc):
                            self._move_aside(f"{type(exc).__name__}: {exc}")
                        continue
                    raise

    def _connection(self) -> sqlite3.Connection | None:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        self._conn = None  # a connection inherited through fork is not ours to use
        assert self.path is not None
        for _attempt in range(3):
            try:
                conn = self._open()
            except _Foreign as exc:
                self._move_aside(str(exc))
                continue
            except _Newer as exc:
                self._disable(str(exc))
                return None
            except sqlite3.DatabaseError as exc:
                if _is_corrupt(exc):
                    self._move_aside(f"{type(exc).__name__}: {exc}")
                    continue
                if _is_locked(exc):
                    time.sleep(0.05)
                    continue
                self._disable(f"cannot open {self.path}: {exc}")
                return None
            except OSError as exc:
                self._disable(f"cannot create {self.path}: {exc}")
                return None
            self._conn, self._pid = conn, os.getpid()
            return conn
        self._disable(f"cannot open {self.path} after repeated recovery")
        return None

    def _open(self) -> sqlite3.Connection:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            self._inode = None
        conn = sqlite3.connect(str(self.path), timeout=self.timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            self._init_schema(conn)  # first: a file we must not touch stays untouched
            self._pragma_wal(conn)
            if self._inode is None:
                self._inode = os.stat(self.path).st_ino
        except BaseException:
            conn.close()
            raise
        return conn

    def _pragma_wal(self, conn: sqlite3.Connection) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
                if mode and str(mode[0]).lower() != "wal":
                    log.debug("mucudnn cache: journal_mode is %s, not WAL", mode[0])
                return
            except sqlite3.OperationalError as exc:
                if _is_locked(exc) and time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                raise

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            names = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            names = {n for n in names if not n.startswith("sqlite_")}
            if not names:
                self._create(conn)
            else:
                if _META not in names:
                    raise _Foreign(f"SQLite file with foreign tables {sorted(names)[:8]}")
                others = names - {_META, _TABLE}
                if others:
                    raise _Foreign(f"SQLite file with foreign tables {sorted(others)[:8]}")
                row = conn.execute(f"SELECT value FROM {_META} WHERE key = ?",
                                   ("schema_version",)).fetchone()
                try:
                    version = int(row[0]) if row else None
                except (TypeError, ValueError):
                    version = None
                if version is None:
                    raise _Foreign("no schema_version in the meta table")
                if version > SCHEMA_VERSION:
                    raise _Newer(f"schema version {version} is newer than this mucudnn's "
                                 f"({SCHEMA_VERSION})")
                if version < SCHEMA_VERSION:
                    self._upgrade(conn, version)
                elif _TABLE not in names:
                    self._create(conn)
            conn.execute("COMMIT")
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise

    def _create(self, conn: sqlite3.Connection) -> None:
        for stmt in _CREATE:
            conn.execute(stmt)
        conn.execute(f"INSERT OR REPLACE INTO {_META} (key, value) VALUES (?, ?)",
                     ("schema_version", str(SCHEMA_VERSION)))

    def _upgrade(self, conn: sqlite3.Connection, version: int) -> None:
        v = version
        while v < SCHEMA_VERSION and v in _MIGRATIONS:
            _MIGRATIONS[v](conn)
            v += 1
        if v == SCHEMA_VERSION:
            log.info("mucudnn cache: migrated %s from schema %d to %d", self.path, version, v)
            conn.execute(f"UPDATE {_META} SET value = ? WHERE key = ?",
                         (str(SCHEMA_VERSION), "schema_version"))
            return
        _warn(f"mucudnn cache {self.path}: schema version {version} is old; rebuilding it")
        conn.execute(f"DROP TABLE IF EXISTS {_TABLE}")
        conn.execute(f"DROP TABLE IF EXISTS {_META}")
        self._create(conn)

    def _move_aside(self, reason: str) -> None:
        """Rename the bad file (and its -wal/-shm) to <file>.corrupt-<timestamp>."""
        assert self.path is not None
        self.close()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if self._inode is not None and st.st_ino != self._inode:
            return  # another process already replaced it
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        try:
            os.replace(self.path, target)
        except FileNotFoundError:
            return
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            try:
                os.replace(side, target.with_name(target.name + suffix))
            except FileNotFoundError:
                pass
        self._inode = None
        _warn(f"mucudnn cache {self.path} was unusable ({reason}); moved it to "
              f"{target} and started a new cache")

    def _disable(self, reason: str) -> None:
        self._broken = True
        self._conn = None
        _warn(f"mucudnn cache disabled for this process: {reason}")


def _warn(msg: str) -> None:
    log.warning(msg)
    warnings.warn(msg, CacheWarning, stacklevel=4)


def _pkey(problem: "ConvProblem | str") -> str:
    return problem if isinstance(problem, str) else problem.key()

