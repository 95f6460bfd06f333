"""The benchmark cache's file: opened only when it is provably a mucudnn cache.

:class:`CacheFile` owns the path, the SQLite connection and every decision
about the file itself; :class:`~mucudnn.optimizer.cache.BenchmarkCache` adds
the entries on top. The rules:

- Never move, rename or write a file it did not create. A path naming
  something that is not a mucudnn cache (a text file, another application's
  SQLite database, a directory, a device) raises :class:`CacheFileError`
  naming the path and where it came from (``MUCUDNN_CACHE`` or the argument);
  the file is left byte for byte as it was (it is inspected read-only, as
  immutable, so not even ``-shm``/``-wal`` files appear next to it). An empty
  file is taken as a new cache (there is nothing in it to lose). New caches
  are built beside the target and linked into place, so a half-made cache is
  never visible under its name.
- Read-only: a file (or folder) this process may not write, and a gzipped
  cache (``*.sqlite.gz``, decompressed to a private temporary file and never
  written back), are served read-only: lookups work, nothing is stored, and
  one :class:`CacheWarning` per path and process says so
  (``optimizer.cache_notices``, an LRU of 64 paths, remembers which).
- Damage: a file that is provably ours (its ``mucudnn_meta`` table and
  schema_version were read in this process, or this process made it) but
  damaged is moved aside to ``<file>.corrupt-<timestamp>`` with a warning and
  a new cache is built; a read-only one is disabled instead. An older schema
  version is migrated where a migration exists, else rebuilt; a newer one is
  left untouched and the cache is disabled for this process, with a warning.

>>> import tempfile, os
>>> f = CacheFile(os.path.join(tempfile.mkdtemp(), "c.sqlite"))
>>> f.read_only, f.schema_version()
(False, 2)
"""

from __future__ import annotations

import logging
import os
import pathlib
import sqlite3
import threading
import time
import warnings
import weakref
from typing import TypeVar, Any, Callable

from ..caches import LRU
from ..errors import MucudnnError
from . import cache_files as files

__all__ = ["CacheFile", "CacheWarning", "CacheFileError", "CacheArgumentError",
           "default_cache_path", "warn", "SCHEMA_VERSION"]

_Self = TypeVar("_Self", bound="CacheFile")

log = logging.getLogger("mucudnn")

SCHEMA_VERSION = files.SCHEMA_VERSION
_META, _TABLE = files.META, files.TABLE
_OFF = {"off", "0", "false", "no", "none", "disable", "disabled"}
#: Seconds opening waits for a lock before it says so (Note [locked caches]).
_FIRST_WAIT = 1.0

#: from_version -> function(conn) bringing the tables to from_version + 1.
#: Versions without an entry are rebuilt (the cache is only a cache).
_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {}


class CacheWarning(RuntimeWarning):
    """The cache is read-only, was rebuilt or disabled, or an entry was dropped."""


class CacheFileError(MucudnnError, OSError):
    """A cache path names something that is not a mucudnn benchmark cache.

    ``path`` is the file, ``variable`` where the path came from
    (``"MUCUDNN_CACHE"``, or the argument's name). The file is left untouched.
    """

    def __init__(self, message: str, *, path: str | None = None,
                 variable: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.variable = variable

    def __reduce__(self) -> tuple:
        return (_rebuild_file_error, (type(self), str(self), self.path, self.variable))


def _rebuild_file_error(cls: type, message: str, path: Any, variable: Any) -> "CacheFileError":
    return cls(message, path=path, variable=variable)


class CacheArgumentError(MucudnnError, TypeError, ValueError):
    """A ``cache=`` argument that is neither None, False, "off", a path nor a BenchmarkCache."""


class _Newer(Exception):
    """The file was written by a newer schema version."""


class _Unusable(Exception):
    """Ours, but it cannot be used here (read-only and old or damaged, or not creatable)."""


class _Damaged(Exception):
    """Ours (its schema version was read) but damaged: move it aside."""


class _ReadOnly(Exception):
    """This process may not write the file."""


class _Again(Exception):
    """Another process created the file meanwhile: look at it again."""


def default_cache_path() -> pathlib.Path | None:
    """The cache file ``MUCUDNN_CACHE`` and XDG_CACHE_HOME point to; None when disabled."""
    return _default_target()[0]


#: The file a cache path naming a folder (a trailing slash) means inside it.
DEFAULT_NAME = "benchmarks.sqlite"


def _as_path(text: str, origin: str) -> pathlib.Path:
    """The cache file a path text names (``origin``: MUCUDNN_CACHE or the
    argument's name): ``~`` and ``~user`` expanded, and a text ending in a slash
    (a folder, made when needed) meaning :data:`DEFAULT_NAME` inside it.
    CacheFileError naming ``origin`` and the text where no file can have that name."""
    what = f"{origin}={text!r}" if origin == "MUCUDNN_CACHE" else f"{origin}: {text!r}"
    if "\0" in text:
        raise CacheFileError(f"{what}: a path cannot hold a NUL character; expected a file "
                             "path (or 'off')", path=text, variable=origin)
    try:
        path = pathlib.Path(text).expanduser()
    except RuntimeError as exc:  # ~nosuchuser: no home to expand
        raise CacheFileError(f"{what}: cannot expand '~' ({exc}); expected a file path "
                             "(or 'off')", path=text, variable=origin) from None
    if text.endswith(("/", os.sep)):
        path = path / DEFAULT_NAME
    return path


def _default_target() -> tuple[pathlib.Path | None, str]:
    env = os.environ.get("MUCUDNN_CACHE")
    if env is not None and env.strip():
        if env.strip().lower() in _OFF:
            return None, "MUCUDNN_CACHE"
        return _as_path(env, "MUCUDNN_CACHE"), "MUCUDNN_CACHE"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and ("\0" in xdg or not os.path.isabs(xdg)):
        xdg = None
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "mucudnn" / DEFAULT_NAME, "default"


def _target(value: Any, name: str) -> tuple[pathlib.Path | None, str]:
    """(path or None, origin) of a cache argument; CacheArgumentError for anything else."""
    if value is None or value is True:
        return _default_target()
    if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return None, name
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        text = os.fsdecode(text) if isinstance(text, bytes) else text
        if not isinstance(text, str) or not text.strip():
            raise CacheArgumentError(f"{name}: expected a file path, got an empty string")
        return _as_path(text, name), name
    raise CacheArgumentError(
        f"{name}: expected None (the default cache), False or 'off' (no cache), a file path "
        f"(str or os.PathLike) or a BenchmarkCache, got {value!r} ({type(value).__name__})")


_NOTICES: "LRU[str, bool]" = LRU("optimizer.cache_notices", 64)


def _is_locked(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


def _is_readonly(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and (
        "readonly" in msg or "read-only" in msg or "unable to open" in msg)


def _is_corrupt(exc: BaseException) -> bool:
    """A DatabaseError that means the file's content is bad (not a lock, not I/O setup)."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)


class CacheFile:
    """A mucudnn cache file and its connection (see the module notes).

    ``path``: None or True for :func:`default_cache_path`, False or "off" for
    none, else a file (str or os.PathLike). ``read_only=True`` never writes
    (nor creates) the file. Subclasses run statements through :meth:`_run`.
    """

    def __init__(self, path: "str | os.PathLike[str] | bool | None" = None, *,
                 timeout: float = 30.0, read_only: bool = False, _name: str = "path") -> None:
        self.path, self._origin = _target(path, _name)
        self.timeout = float(timeout)
        self._want_ro = bool(read_only)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._verified: int | None = None  # inode whose schema we read (or made) this process
        self._readonly = False
        self._broken = False
        self._tmp: Any = None  # finalizer of a gzipped cache's temporary copy
        self._wait = self.timeout  # what opening may still wait for a lock (Note [locked caches])

    # -- state ----------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """False for a disabled cache (no path, or unusable this process)."""
        return self.path is not None and not self._broken

    @property
    def read_only(self) -> bool:
        """True when this cache serves lookups but stores nothing (opens the file)."""
        with self._lock:
            if self.enabled:
                self._connection()
            return self.enabled and self._readonly

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path) if self.path else 'off'})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "timeout": self.timeout, "read_only": self._want_ro,
                "origin": self._origin}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["path"] if state["path"] is not None else False,
                            timeout=state["timeout"], read_only=state.get("read_only", False))
        self._origin = state.get("origin", "path")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                try:
                    self._conn.close()
                except sqlite3.Error:
                    pass
            self._conn = None
            if self._tmp is not None:
                self._tmp()  # removes a gzipped cache's temporary copy (in its own process)
                self._tmp = None

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def schema_version(self) -> int | None:
        """The schema version of the open file (None when disabled)."""
        if not self.enabled:
            return None
        row = self._run(lambda c: c.execute(f"SELECT value FROM {_META} WHERE key = ?",
                                            ("schema_version",)).fetchone())
        return int(row[0]) if row is not None else None

    # -- messages ---------------------------------------------------------------
    def _where(self) -> str:
        if self._origin == "MUCUDNN_CACHE":
            return f"MUCUDNN_CACHE={self.path}"
        if self._origin == "default":
            return f"the default cache file {self.path}"
        return f"the cache file {self.path}"

    def _fix(self) -> str:
        if self._origin == "MUCUDNN_CACHE":
            return "point MUCUDNN_CACHE at a new file name (or set it to 'off')"
        if self._origin == "default":
            return "set MUCUDNN_CACHE to a new file name (or to 'off')"
        if self._origin in ("cache", "path"):
            return f"pass another file name as {self._origin} (or {self._origin}=False: no cache)"
        return f"give another file as {self._origin}"

    def _error(self, message: str) -> CacheFileError:
        return CacheFileError(message, path=str(self.path),
                              variable=None if self._origin == "default" else self._origin)

    def _not_ours(self, detail: str) -> CacheFileError:
        return self._error(f"{self._where()} is not a mucudnn benchmark cache ({detail}); "
                           f"mucudnn never changes a file it did not create: {self._fix()}, "
                           "or move the file away yourself")

    def _notice(self, why: str) -> None:
        self._readonly = True
        if self._want_ro or str(self.path) in _NOTICES:
            return
        _NOTICES.put(str(self.path), True)
        warn(f"mucudnn cache {self.path} is read-only ({why}): its measurements are used, "
             "new ones are not stored")

    # -- connection, schema, recovery -----------------------------------------
    def _run(self, op: Callable[[sqlite3.Connection], Any], write: bool = False) -> Any:
        """Run ``op`` on the connection: retry while locked, recover once from a
        damaged file of ours; None when the cache is (or becomes) unusable."""
        recovered = False
        delay = 0.01
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while True:
                conn = self._connection()
                if conn is None or (write and self._readonly):
                    return None
                try:
                    return op(conn)
                except sqlite3.DatabaseError as exc:
                    if _is_locked(exc):
                        if time.monotonic() < deadline:
                            time.sleep(delay)
                            delay = min(delay * 2, 0.5)
                            continue
                        log.warning("mucudnn cache %s: locked for %.0f s; %s", self.path,
                                    self.timeout, "not stored" if write else "treated as a miss")
                        return None
                    if write and _is_readonly(exc):
                        self._notice(str(exc))
                        return None
                    if not recovered and (_is_corrupt(exc) or "no such table" in str(exc)):
                        recovered = True
                        readonly = self._readonly
                        self.close()
                        if _is_corrupt(exc):
                            if readonly or not self._move_aside(f"{type(exc).__name__}: {exc}"):
                                self._disable(f"{self.path} is damaged ({exc})")
                                return None
                        continue
                    self._disable(f"{self.path}: {type(exc).__name__}: {exc}")
                    return None

    # Note [locked caches]
    # ~~~~~~~~~~~~~~~~~~~~
    # Another program may hold the file locked (an exclusive transaction,
    # EXCLUSIVE locking mode). Opening first waits at most _FIRST_WAIT (what
    # another mucudnn process's short write takes); if the file is still locked
    # it logs one line saying what it waits for and how long, and the later
    # attempts wait at most what is left of ``timeout`` between them (not
    # ``timeout`` each). Read-only commands (the cache CLI's inputs) open with a
    # short timeout (cache_tools.READ_TIMEOUT).
    def _connection(self) -> sqlite3.Connection | None:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        if self._pid != os.getpid():  # inherited through fork: not ours to use or remove
            self._conn, self._tmp = None, None
        self._conn = None
        if not self.enabled:
            return None
        # See Note [locked caches]: the first attempt waits briefly; a locked file is
        # said once, and the attempts after it share what is left of the timeout
        deadline = time.monotonic() + self.timeout
        first = self._wait = min(_FIRST_WAIT, self.timeout)
        for _attempt in range(4):
            try:
                conn = self._open()
            except CacheFileError:
                raise
            except (_Newer, _Unusable) as exc:
                self._disable(str(exc))
                return None
            except _Damaged as exc:
                if not self._move_aside(str(exc)):
                    self._disable(f"{self.path} is damaged ({exc}) and cannot be moved aside")
                    return None
                continue
            except _Again:
                continue
            except sqlite3.DatabaseError as exc:
                if _is_locked(exc):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    if self._wait == first:
                        log.warning("mucudnn cache %s: another program holds it locked; "
                                    "waiting up to %.0f s for it", self.path, left)
                    self._wait = max(left, 0.001)
                    time.sleep(0.05)
                    continue
                if _is_corrupt(exc) and self._verified is not None:
                    if self._move_aside(f"{type(exc).__name__}: {exc}"):
                        continue
                if _is_corrupt(exc):
                    raise self._not_ours(f"SQLite cannot read it ({exc})") from None
                self._disable(f"cannot open {self.path}: {exc}")
                return None
            except OSError as exc:
                self._disable(f"cannot open {self.path}: {exc}")
                return None
            self._conn, self._pid = conn, os.getpid()
            return conn
        if time.monotonic() >= deadline:
            self._disable(f"{self.path} stayed locked by another program for "
                          f"{self.timeout:.0f} s")
        else:
            self._disable(f"cannot open {self.path} after repeated recovery")
        return None

    def _open(self) -> sqlite3.Connection:
        """A connection to a file that is provably ours (or new); see the module notes."""
        assert self.path is not None
        self._verified = None
        self._readonly = False
        try:
            kind, _size = files.file_kind(self.path)
        except OSError as exc:
            raise self._error(f"{self._where()} cannot be read ({exc}); {self._fix()}") from None
        if kind == "directory":
            raise self._error(f"{self._where()} is a directory, not a mucudnn benchmark cache "
                              f"file; {self._fix()}")
        if kind == "special":
            raise self._error(f"{self._where()} is not a regular file; to disable the cache set "
                              "MUCUDNN_CACHE=off (or pass cache=False)")
        if kind == "gzip":
            return self._open_gz()
        if kind == "other":
            raise self._not_ours("neither an SQLite nor a gzip file")
        if kind == "sqlite":
            schema = files.inspect_file(self.path, self._wait)
            if not schema.ours:
                raise self._not_ours(schema.detail)
            if schema.kind == "newer":
                raise _Newer(f"{self.path}: {schema.detail}")
            if self._want_ro or not (os.access(self.path, os.W_OK)
                                     and os.access(self.path.parent, os.W_OK)):
                return self._open_ro(self.path, "no permission to write it or its folder")
        elif self._want_ro:
            raise _Unusable(f"{self.path} {'is empty' if kind == 'empty' else 'does not exist'}")
        fresh = kind == "empty"
        if kind == "missing":
            try:
                made = files.create_fresh(self.path, self._wait)
            except OSError as exc:
                raise _Unusable(f"cannot create {self.path}: {exc}") from None
            if made == "exists":
                raise _Again()
            fresh = made == "nolink"
        try:
            return self._open_rw(fresh)
        except _ReadOnly as exc:
            if fresh:
                raise _Unusable(f"cannot write the new cache {self.path}: {exc}") from None
            return self._open_ro(self.path, str(exc))

    def _open_rw(self, fresh: bool) -> sqlite3.Connection:
        assert self.path is not None
        conn = sqlite3.connect(str(self.path), timeout=self._wait, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._wait * 1000)}")
            inode = os.stat(self.path).st_ino
            self._init_schema(conn, fresh, inode)
            self._pragma_wal(conn)
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        except sqlite3.OperationalError as exc:
            conn.close()
            if _is_readonly(exc):
                raise _ReadOnly(str(exc)) from None
            raise
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_ro(self, db: pathlib.Path, why: str) -> sqlite3.Connection:
        """A read-only connection to ``db`` (the file, or a gzipped cache's copy)."""
        conn = None
        try:
            try:
                conn = files.connect_ro(db, self._wait)
                schema = files.read_schema(conn)
            except sqlite3.OperationalError as exc:
                if _is_locked(exc) or os.path.exists(f"{db}-wal"):
                    raise
                if conn is not None:
                    conn.close()
                # A WAL file in a folder we cannot write: with no -wal beside it no
                # writer is active, so it can be read as immutable.
                conn = files.connect_ro(db, self._wait, immutable=True)
                schema = files.read_schema(conn)
            if not schema.ours:
                raise self._not_ours(schema.detail)
            if schema.kind == "newer":
                raise _Newer(f"{self.path}: {schema.detail}")
            if schema.kind != "ok":
                raise _Unusable(f"{self.path} is read-only and {schema.detail}; it cannot be "
                                "repaired here")
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        assert self.path is not None
        self._verified = os.stat(self.path).st_ino
        self._notice(why)
        return conn

    def _open_gz(self) -> sqlite3.Connection:
        assert self.path is not None
        tmp = files.make_tempdir()
        cleanup = weakref.finalize(self, files.remove_tempdir, os.getpid(), tmp)
        try:
            db = pathlib.Path(tmp) / "cache.sqlite"
            try:
                files.gunzip_to(self.path, db)
            except files.GunzipTooLarge as exc:
                raise self._error(
                    f"{self._where()} is a gzipped cache too large to read ({exc}); it is "
                    "decompressed to a temporary file by every process that reads it: "
                    "decompress it yourself (gunzip) and use the .sqlite file") from None
            except ValueError as exc:
                raise self._not_ours(str(exc)) from None
            if files.file_kind(db)[0] != "sqlite":
                raise self._not_ours("a gzip file that does not hold an SQLite database")
            conn = self._open_ro(db, "a gzipped cache is never written; `python -m mucudnn "
                                     "cache import` copies it into a writable one")
        except BaseException:
            cleanup()
            raise
        self._tmp = cleanup
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

    def _init_schema(self, conn: sqlite3.Connection, fresh: bool, inode: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            schema = files.read_schema(conn)
            if schema.kind == "empty" and fresh:
                files.create_tables(conn)
            elif not schema.ours:
                raise self._not_ours(schema.detail)
            self._verified = inode  # ours: made here, or its schema version was read
            if schema.kind == "newer":
                raise _Newer(f"{self.path}: {schema.detail}")
            if schema.kind == "old":
                self._upgrade(conn, schema.version or 0)
            elif schema.kind == "no_table":
                files.create_tables(conn)
            elif schema.kind == "damaged":
                raise _Damaged(schema.detail)
            conn.execute("COMMIT")
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise

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
        warn(f"mucudnn cache {self.path}: schema version {version} is old; rebuilding it")
        conn.execute(f"DROP TABLE IF EXISTS {_TABLE}")
        conn.execute(f"DROP TABLE IF EXISTS {_META}")
        files.create_tables(conn)

    def _move_aside(self, reason: str) -> bool:
        """Rename our damaged file (and its -wal/-shm) to <file>.corrupt-<timestamp>.

        Only a file whose schema this process read (same inode) is moved; True
        when the path is free for a new cache afterwards."""
        assert self.path is not None
        self.close()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return True
        if self._verified is None or st.st_ino != self._verified:
            return False  # not provably ours, or replaced by another process meanwhile
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        try:
            os.replace(self.path, target)
        except FileNotFoundError:
            return True
        except OSError as exc:
            log.warning("mucudnn cache: cannot move %s aside: %s", self.path, exc)
            return False
        for suffix in ("-wal", "-shm"):
            try:
                os.replace(f"{self.path}{suffix}", f"{target}{suffix}")
            except OSError:
                pass
        self._verified = None
        warn(f"mucudnn cache {self.path} was damaged ({reason}); moved it to "
             f"{target} and started a new cache")
        return True

    def _disable(self, reason: str) -> None:
        self._broken = True
        self.close()
        warn(f"mucudnn cache disabled for this process: {reason}")


def warn(msg: str) -> None:
    """A CacheWarning (shown once by Python's default filter), and an INFO log record
    (so that logging users see it without a second copy on stderr)."""
    log.info(msg)
    warnings.warn(msg, CacheWarning, stacklevel=4)
