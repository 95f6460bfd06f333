"""Looking at a benchmark-cache file without changing it: what kind of file it is,
whose schema it holds, read-only connections, gzipped caches and fresh files.

Everything here either only reads (``inspect_file``, ``connect_ro``,
``read_schema``, ``gunzip_to``) or writes only files it creates itself
(``create_fresh`` builds a new cache next to the target and links it into place,
so no half-made cache is ever visible under the target's name).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> create_fresh(d / "c.sqlite")
'created'
>>> inspect_file(d / "c.sqlite").kind
'ok'
"""

from __future__ import annotations

import contextlib
import gzip
import os
import pathlib
import secrets
import shutil
import sqlite3
import stat
import tempfile
import zlib
from dataclasses import dataclass
from typing import Iterator

from ..errors import InvalidValueError, MucudnnError

__all__ = ["SQLITE_MAGIC", "GZIP_MAGIC", "SCHEMA_VERSION", "META", "TABLE", "COLUMNS",
           "Schema", "read_schema", "create_tables", "connect_ro", "inspect_file",
           "file_kind", "gunzip_to", "create_fresh", "make_tempdir", "remove_tempdir",
           "GunzipTooLarge", "MAX_GUNZIP"]

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
#: Version of the on-disk layout; bump it (and add a migration) when the layout changes.
SCHEMA_VERSION = 2
META = "mucudnn_meta"
TABLE = "benchmarks"
#: The benchmarks table's columns, in order, and its primary key.
COLUMNS = ("backend", "device", "version", "problem", "direction", "workspace_cap",
           "results", "created")
PRIMARY_KEY = ("backend", "device", "version", "problem", "direction")
#: Most bytes a gzipped cache may decompress to: each process reading it makes a
#: temporary copy of that size (a full cache of every network is a few MB), so
#: this bounds the disk a stray or hostile .gz can take.
MAX_GUNZIP = 1 << 30


class GunzipTooLarge(MucudnnError, ValueError):
    """A gzipped cache larger than the bound, or than the free temporary space."""

CREATE = (
    f"CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
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


@dataclass(frozen=True)
class Schema:
    """What a database holds, as far as mucudnn is concerned.

    ``kind``: ``"empty"`` (no tables), ``"foreign"`` (not a mucudnn cache:
    no readable ``mucudnn_meta`` schema_version), ``"newer"`` / ``"old"`` (ours, of
    another schema version), ``"no_table"`` (ours, the benchmarks table is
    missing), ``"damaged"`` (ours, but with other tables or columns) or ``"ok"``.
    Only ``"foreign"`` and ``"empty"`` are not provably ours.
    """

    kind: str
    version: int | None = None
    detail: str = ""

    @property
    def ours(self) -> bool:
        return self.kind not in ("foreign", "empty")


def read_schema(conn: sqlite3.Connection) -> Schema:
    """Classify the database behind ``conn`` (reads only; DatabaseError if unreadable)."""
    names = sorted(str(r[0]) for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'"))
    names = [n for n in names if not n.startswith("sqlite_")]
    if not names:
        return Schema("empty", detail="an SQLite database without tables")
    if META not in names:
        return Schema("foreign", detail=f"an SQLite database with tables {names[:6]} "
                                        f"and no {META} table")
    try:
        row = conn.execute(f"SELECT value FROM {META} WHERE key = ?",
                           ("schema_version",)).fetchone()
        version = int(str(row[0]).strip()) if row is not None else None
    except (sqlite3.DatabaseError, TypeError, ValueError):
        version = None
    if version is None or version < 1:
        return Schema("foreign", detail=f"its {META} table holds no readable schema_version")
    if version > SCHEMA_VERSION:
        return Schema("newer", version, f"schema version {version} is newer than this "
                                        f"mucudnn's ({SCHEMA_VERSION})")
    if version < SCHEMA_VERSION:
        return Schema("old", version, f"schema version {version} is old")
    others = [n for n in names if n not in (META, TABLE)]
    if others:
        return Schema("damaged", version, f"foreign tables {others[:6]} next to ours")
    if TABLE not in names:
        return Schema("no_table", version, f"no {TABLE} table")
    info = conn.execute(f"PRAGMA table_info({TABLE})").fetchall()
    cols = tuple(r[1] for r in info)
    pk = tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
    if cols != COLUMNS or pk != PRIMARY_KEY:
        return Schema("damaged", version, f"the {TABLE} table has columns {list(cols)[:10]} "
                                          f"(key {list(pk)}), not {list(COLUMNS)}")
    return Schema("ok", version)


def create_tables(conn: sqlite3.Connection) -> None:
    """Our tables and schema version (inside the caller's transaction)."""
    for stmt in CREATE:
        conn.execute(stmt)
    conn.execute(f"INSERT OR REPLACE INTO {META} (key, value) VALUES (?, ?)",
                 ("schema_version", str(SCHEMA_VERSION)))


def _uri(path: pathlib.Path, immutable: bool) -> str:
    return path.absolute().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")


def connect_ro(path: "str | os.PathLike[str]", timeout: float,
               immutable: bool = False) -> sqlite3.Connection:
    """A read-only connection (``immutable`` reads without locks or side files)."""
    conn = sqlite3.connect(_uri(pathlib.Path(path), immutable), uri=True, timeout=timeout,
                           isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    return conn


def inspect_file(path: "str | os.PathLike[str]", timeout: float = 30.0) -> Schema:
    """Classify an existing SQLite file without writing to it or next to it.

    Read as immutable (no locks, and no ``-shm``/``-wal`` left next to someone
    else's WAL database) where no ``-wal`` file says a writer is active, else
    through a normal read-only connection, which honours other processes'
    locks; an immutable read that saw the file change is done again. A file
    SQLite cannot read is ``"foreign"``.
    """
    p = pathlib.Path(path)
    last = Schema("foreign", detail="unreadable")
    for _attempt in range(3):
        immutable = not os.path.exists(f"{p}-wal")
        before = _stamp(p)
        try:
            with contextlib.closing(connect_ro(p, timeout, immutable)) as conn:
                last = read_schema(conn)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise
            last = Schema("foreign", detail=f"SQLite cannot read it ({exc})")
        except sqlite3.DatabaseError as exc:
            last = Schema("foreign", detail=f"SQLite cannot read it ({exc})")
        if last.kind == "ok" or not immutable or _stamp(p) == before:
            break  # an immutable read is trusted only if nobody wrote the file meanwhile
    return last


def _stamp(path: pathlib.Path) -> tuple[int, int, bool]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, os.path.exists(f"{path}-wal")


def file_kind(path: "str | os.PathLike[str]") -> tuple[str, int]:
    """``(kind, size)`` of an existing path: kind is "missing", "directory",
    "special" (not a regular file), "empty", "gzip", "sqlite" or "other".
    OSError when it cannot be looked at or read."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing", 0
    if stat.S_ISDIR(st.st_mode):
        return "directory", 0
    if not stat.S_ISREG(st.st_mode):
        return "special", 0
    if st.st_size == 0:
        return "empty", 0
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head.startswith(GZIP_MAGIC):
        return "gzip", st.st_size
    return ("sqlite" if head == SQLITE_MAGIC else "other"), st.st_size


def make_tempdir() -> str:
    return tempfile.mkdtemp(prefix="mucudnn-cache-")


def remove_tempdir(pid: int, path: str) -> None:
    """Remove a temporary folder made by process ``pid`` (only from that process)."""
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


def _stated_size(src: "str | os.PathLike[str]") -> int:
    """The size a gzip file's trailer states (ISIZE: modulo 2**32, and only of its
    last member, so a lower bound to check early, never the only check)."""
    with open(src, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() < 18:
            return 0
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def gunzip_to(src: "str | os.PathLike[str]", dst: "str | os.PathLike[str]",
              limit: int = MAX_GUNZIP) -> None:
    """Decompress ``src`` into the new file ``dst``; ValueError when ``src`` is
    not a readable gzip file, GunzipTooLarge (a ValueError) when it holds more
    than ``limit`` bytes or more than the free space beside ``dst`` (checked
    from its trailer before writing, and while writing)."""
    total = 0
    try:
        with gzip.open(src, "rb") as fin, open(dst, "xb") as fout:
            chunk = fin.read(1 << 20)  # a readable gzip stream first: then its trailer counts
            stated = _stated_size(src)
            folder = os.path.dirname(os.path.abspath(dst))
            free = shutil.disk_usage(folder).free
            if stated > limit:
                raise GunzipTooLarge(f"it decompresses to {stated} bytes, more than the "
                                     f"{limit} a gzipped cache may hold")
            if stated > free:
                raise GunzipTooLarge(f"it decompresses to {stated} bytes and the temporary "
                                     f"folder {folder} has {free} free")
            while chunk:
                total += len(chunk)
                if total > limit:
                    raise GunzipTooLarge(f"it decompresses to more than the {limit} bytes a "
                                         "gzipped cache may hold")
                fout.write(chunk)
                chunk = fin.read(1 << 20)
    except GunzipTooLarge:
        with contextlib.suppress(OSError):
            os.unlink(dst)
        raise
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise InvalidValueError(f"not a readable gzip file ({type(exc).__name__}: {exc})") from None


@contextlib.contextmanager
def _sibling_temp(path: pathlib.Path) -> Iterator[pathlib.Path]:
    # Mode 0644 less the umask, as SQLite creates files (mkstemp would make it 0600).
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.new")
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    try:
        yield tmp
    finally:
        for suffix in ("", "-journal", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{tmp}{suffix}")


def create_fresh(path: pathlib.Path, timeout: float = 30.0) -> str:
    """Create an empty cache at ``path`` unless something is there already.

    The cache is built in a temporary file in the same folder and hard-linked
    to ``path`` (which fails, harmlessly, if another process got there first),
    so ``path`` never names a half-made cache. Returns ``"created"``,
    ``"exists"`` (someone else's file is there now) or ``"nolink"`` (the file
    system has no hard links; the caller creates the tables in place). OSError
    when the folder cannot be made or written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with _sibling_temp(path) as tmp:
        with contextlib.closing(sqlite3.connect(str(tmp), timeout=timeout,
                                                isolation_level=None)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            create_tables(conn)
            conn.execute("COMMIT")
        try:
            os.link(tmp, path)
        except FileExistsError:
            return "exists"
        except OSError:  # no hard links here (some network and FAT file systems)
            return "nolink"
    return "created"
