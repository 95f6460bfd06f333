"""Benchmark caches between machines: ``python -m mucudnn cache info|export|import|merge``.

Every entry's key holds the backend, the device name and the library version,
so a cache measured on one machine serves every machine with the same device
name and cuDNN version, and caches from several machines merge without
clashing. The portable format is a **gzipped SQLite cache** (``*.sqlite.gz``):
the live cache's own schema in one self-contained file (journal mode DELETE,
vacuumed), compressed with gzip with a zero timestamp, so equal contents give
equal bytes. It is used directly, read-only, by ``MUCUDNN_CACHE=file.sqlite.gz``
and ``CachedBackend(cache="file.sqlite.gz")``; ``import`` copies it into the
writable cache. An output name not ending in ``.gz`` gets a plain SQLite cache.

Nothing here writes a file it was not asked to write: inputs are opened
read-only, outputs are built in a temporary file and renamed into place, and
an existing output is replaced only with ``force=True``.

>>> import tempfile, os
>>> from mucudnn import AlgoPerf
>>> d = tempfile.mkdtemp()
>>> c = BenchmarkCache(os.path.join(d, "live.sqlite"))
>>> c.put(("cudnn", "NVIDIA H100", "9.19.0"), "conv-key", "forward", [AlgoPerf(1, 0.5, 0)], None)
>>> export(os.path.join(d, "h100.sqlite.gz"), source=c.path, device="NVIDIA H100")
1
>>> print(info(os.path.join(d, "h100.sqlite.gz")).splitlines()[-1])
  cudnn    NVIDIA H100  9.19.0   1
"""

from __future__ import annotations

import contextlib
import gzip
import os
import pathlib
import shutil
import sqlite3
import tempfile
from typing import Any, Iterable, Sequence

from ..errors import InvalidValueError
from . import cache_files as files
from .cache import BenchmarkCache, CacheFileError, Entry, resolve

__all__ = ["info", "export", "import_cache", "merge", "write_cache", "open_input"]


#: Seconds a read-only command waits for a cache another program holds locked
#: (Note [locked caches] in :mod:`.cache_store`).
READ_TIMEOUT = 5.0


def open_input(path: "str | os.PathLike[str]", name: str = "FILE") -> BenchmarkCache:
    """An existing cache (SQLite or gzipped), opened read-only; CacheFileError if missing.
    A cache locked by another program is waited for :data:`READ_TIMEOUT` seconds."""
    cache = BenchmarkCache(path, read_only=True, timeout=READ_TIMEOUT, _name=name)
    p = cache.path
    assert p is not None  # a path argument (CacheFileError / CacheArgumentError otherwise)
    if not p.exists():
        raise CacheFileError(f"{name}: {p} does not exist", path=str(p), variable=name)
    _ = cache.read_only  # opens it: CacheFileError now for a file that is not a cache
    if not cache.enabled:
        raise CacheFileError(f"{name}: {p} cannot be used as a cache (see the warning above)",
                             path=str(p), variable=name)
    return cache


def info(path: "str | os.PathLike[str] | None" = None) -> str:
    """A description of the cache at ``path`` (default: the current cache): path,
    format, schema version and the entry count per (backend, device, version)."""
    if path is None:
        current = BenchmarkCache(None, read_only=True)
        if current.path is None:
            return "cache: off (MUCUDNN_CACHE disables it)"
        if not current.path.exists():
            return f"path: {current.path}\nno cache file yet (nothing measured)"
        path = current.path
    with contextlib.closing(open_input(path, "PATH")) as cache:
        p = pathlib.Path(str(cache.path))
        kind = files.file_kind(p)[0]
        fmt = "gzipped SQLite (read-only)" if kind == "gzip" else "SQLite"
        if kind != "gzip" and not (os.access(p, os.W_OK) and os.access(p.parent, os.W_OK)):
            fmt += " (read-only here)"
        summary = cache.summary()
        lines = [f"path: {cache.path}", f"format: {fmt}",
                 f"schema version: {cache.schema_version()}",
                 f"entries: {sum(summary.values())}"]
        if summary:
            rows = [("backend", "device", "version", "entries")] + [
                (*k, str(n)) for k, n in summary.items()]
            widths = [max(len(r[i]) for r in rows) for i in range(3)]
            lines += ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3]
                      for r in rows]
        return "\n".join(line.rstrip() for line in lines)


def write_cache(entries: Iterable[Entry], out: "str | os.PathLike[str]", *,
                force: bool = False) -> int:
    """Write ``entries`` as a new cache file ``out`` (gzipped when it ends in
    ``.gz``); returns the number of entries written. Where two entries share a
    key, the one found under the larger workspace cap wins (the later on a tie)."""
    out = _out_path(out)
    busy = [s for s in ("-wal", "-shm", "-journal") if os.path.exists(f"{out}{s}")]
    if busy:
        raise CacheFileError(f"OUT: {out} is in use ({out.name}{busy[0]} exists); close "
                             "what uses it or choose another name", path=str(out), variable="OUT")
    if os.path.lexists(out) and not force:  # a dangling symlink too: never written through
        what = "is a symbolic link" if out.is_symlink() else "exists"
        raise CacheFileError(f"OUT: {out} {what}; choose another name or pass --force "
                             "(force=True) to replace it", path=str(out), variable="OUT")
    if out.is_dir():
        raise CacheFileError(f"OUT: {out} is a directory; expected a file name",
                             path=str(out), variable="OUT")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mucudnn-export-")
    try:
        db = pathlib.Path(work) / "cache.sqlite"
        with BenchmarkCache(db) as c:
            c.put_many(entries)
            n = len(c)
        with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
            conn.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
            conn.execute("VACUUM")
        part = out.with_name(f".{out.name}.{os.getpid()}.part")
        try:
            with open(db, "rb") as src, open(part, "xb") as dst:
                if out.name.endswith(".gz"):
                    with gzip.GzipFile(filename="", mode="wb", fileobj=dst, mtime=0) as gz:
                        shutil.copyfileobj(src, gz)
                else:
                    shutil.copyfileobj(src, dst)
            os.replace(part, out)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return n


def _out_path(out: Any) -> pathlib.Path:
    """An output file argument as a path; CacheFileError naming OUT where no file
    can have that name (a NUL character, ``~user`` of no user)."""
    text = os.fsdecode(os.fspath(out))
    if "\0" in text or not text.strip():
        raise CacheFileError(f"OUT: expected a file name, got {text!r}", path=text,
                             variable="OUT")
    try:
        return pathlib.Path(text).expanduser()
    except RuntimeError as exc:
        raise CacheFileError(f"OUT: cannot expand '~' in {text!r} ({exc})", path=text,
                             variable="OUT") from None


def export(out: "str | os.PathLike[str]", *, source: Any = None, backend: str | None = None,
           device: str | None = None, version: str | None = None, force: bool = False) -> int:
    """Write the entries of ``source`` (default: the current cache) of one
    backend / device / version (default: all) to ``out``; returns the count."""
    if source is None:
        current = BenchmarkCache(None, read_only=True)
        if current.path is None:
            raise CacheFileError("MUCUDNN_CACHE is 'off': there is no cache to export",
                                 variable="MUCUDNN_CACHE")
        source = current.path
    with contextlib.closing(open_input(source, "source")) as src:
        return write_cache(src.entries(backend, device, version), out, force=force)


def import_cache(file: "str | os.PathLike[str]", *, into: Any = None) -> tuple[int, int]:
    """Merge the cache ``file`` into ``into`` (default: the current cache, as
    ``MUCUDNN_CACHE`` says). An entry replaces one found under a smaller or
    equal workspace cap, never a larger one. Returns (entries read, entries
    added or replaced)."""
    with contextlib.closing(open_input(file, "FILE")) as src:
        entries = list(src.entries())
    dst = resolve(into)
    if not dst.enabled:
        raise CacheFileError("there is no cache to import into (MUCUDNN_CACHE is 'off')",
                             variable="MUCUDNN_CACHE")
    if dst.read_only:
        raise CacheFileError(f"the current cache {dst.path} is read-only; point MUCUDNN_CACHE "
                             "at a writable file to import into it", path=str(dst.path),
                             variable="MUCUDNN_CACHE")
    return len(entries), dst.put_many(entries)


def merge(inputs: Sequence["str | os.PathLike[str]"], out: "str | os.PathLike[str]", *,
          force: bool = False) -> int:
    """Merge the caches ``inputs`` into the new file ``out``; returns its entry count."""
    if not inputs:
        raise InvalidValueError("inputs: expected one or more cache files, got none")
    entries: list[Entry] = []
    for path in inputs:
        with contextlib.closing(open_input(path, "FILE")) as src:
            entries.extend(src.entries())
    return write_cache(entries, out, force=force)

