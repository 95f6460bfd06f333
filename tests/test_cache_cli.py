"""``python -m mucudnn cache info|export|import|merge``: caches between machines."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import warnings

import pytest

import mucudnn as mu
from mucudnn.__main__ import main
from mucudnn.networks import network
from mucudnn.optimizer import BenchmarkCache, CacheWarning, CachedBackend
from mucudnn.optimizer import cache_tools
from mucudnn.optimizer.cache import CacheFileError
from mucudnn.problem import AlgoPerf, Direction

from conftest import DATA

H200 = DATA / "h200-benchmark-cache.sqlite.gz"
A = ("cudnn", "GPU A", "9.1.0")
B = ("cudnn", "GPU B", "9.1.0")


def _sha(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def _quiet_read_only_notices():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "mucudnn cache .* is read-only", CacheWarning)
        yield


@pytest.fixture
def h200(tmp_path):
    path = tmp_path / "h200.sqlite.gz"
    shutil.copy(H200, path)
    return path


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = main(["cache", *argv])
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _fill(path, who, caps) -> None:
    with BenchmarkCache(path) as c:
        for i, cap in enumerate(caps):
            c.put(who, f"problem-{i}", "forward", [AlgoPerf(i, float(cap), 0)], cap)


def test_info_of_the_shipped_h200_cache(capsys, h200):
    before = _sha(H200)
    rc, out, _ = _run(capsys, "info", str(H200))
    assert rc == 0
    lines = out.splitlines()
    assert lines[:4] == [f"path: {H200}", "format: gzipped SQLite (read-only)",
                         "schema version: 2", "entries: 1851"]
    assert lines[5].split() == ["cudnn", "NVIDIA", "H200", "9.19.0", "1020"]
    assert lines[6].split() == ["cudnn-graph", "NVIDIA", "H200", "9.19.0", "831"]
    assert _sha(H200) == before


def test_info_of_the_current_cache(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", "off")
    assert "off" in _run(capsys, "info")[1]
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "new.sqlite"))
    assert "no cache file yet" in _run(capsys, "info")[1]
    assert not (tmp_path / "new.sqlite").exists()  # info never creates anything
    _fill(tmp_path / "new.sqlite", A, [1, 2, 3])
    rc, out, _ = _run(capsys, "info")
    assert rc == 0 and "format: SQLite\n" in out and "entries: 3" in out
    assert out.splitlines()[-1].split() == ["cudnn", "GPU", "A", "9.1.0", "3"]


def test_info_of_a_file_that_is_not_a_cache(capsys, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    rc, _, err = _run(capsys, "info", str(path))
    assert rc == 2 and "not a mucudnn benchmark cache" in err and str(path) in err
    with pytest.raises(CacheFileError, match="PATH"):
        cache_tools.info(path)
    assert path.read_text() == "hello\n" and sorted(tmp_path.iterdir()) == [path]
    rc, _, err = _run(capsys, "info", str(tmp_path / "missing.sqlite"))
    assert rc == 2 and "does not exist" in err


@pytest.mark.slow
def test_export_one_backend_serves_another_machine(capsys, tmp_path, monkeypatch, h200):
    monkeypatch.setenv("MUCUDNN_CACHE", str(h200))
    out = tmp_path / "cudnn-h200.sqlite.gz"
    rc, text, _ = _run(capsys, "export", str(out), "--backend", "cudnn",
                       "--device", "NVIDIA H200", "--version", "9.19.0")
    assert rc == 0 and "wrote 1020 entries" in text
    assert cache_tools.info(out).splitlines()[3:] == [
        "entries: 1020", "  backend  device       version  entries",
        "  cudnn    NVIDIA H200  9.19.0   1020"]
    assert _sha(h200) == _sha(H200)
    # The export is a cache in its own right, read directly: same plans as the original.
    p = network("alexnet", 256)["conv2"]
    plans = [mu.optimize(p, Direction.FORWARD, 64 << 20, "powerOfTwo",
                         backend=CachedBackend("cudnn", cache=str(f)), cache=str(f))
             for f in (h200, out)]
    assert plans[0] == plans[1]
    # The same entries again give the same bytes (gzip without a timestamp).
    again = tmp_path / "again.sqlite.gz"
    assert cache_tools.export(again, source=h200, backend="cudnn") == 1020
    assert _sha(again) == _sha(out)


def test_export_refuses_to_overwrite(capsys, tmp_path, monkeypatch):
    live = tmp_path / "live.sqlite"
    _fill(live, A, [1])
    monkeypatch.setenv("MUCUDNN_CACHE", str(live))
    out = tmp_path / "mine.txt"
    out.write_text("precious\n")
    rc, _, err = _run(capsys, "export", str(out))
    assert rc == 2 and "exists" in err and "--force" in err
    assert out.read_text() == "precious\n"
    assert _run(capsys, "export", str(out), "--force")[0] == 0
    assert BenchmarkCache(out, read_only=True).keys() == [(*A, "problem-0", "forward")]


class _Machine:
    """A backend on another machine with the same device and cuDNN version."""

    def __init__(self, device: str) -> None:
        self.name, self.device_name, self.version = "cudnn", device, "9.19.0"
        self.finds = 0

    def find(self, problem, direction, workspace_limit):
        self.finds += 1
        return [AlgoPerf(0, 100.0 * problem.batch, 0)]


@pytest.mark.slow
def test_import_into_the_current_cache(capsys, tmp_path, monkeypatch, h200):
    live = tmp_path / "live.sqlite"
    monkeypatch.setenv("MUCUDNN_CACHE", str(live))
    rc, text, _ = _run(capsys, "import", str(h200))
    assert rc == 0 and "1851 entries read, 1851 added or replaced" in text
    cache = BenchmarkCache(live)
    assert len(cache) == 1851 and not cache.read_only
    assert _sha(h200) == _sha(H200)
    # Measured on the H200: serves a machine with the same device and version ...
    p = network("alexnet", 256)["conv5"]
    same = _Machine("NVIDIA H200")
    plan = mu.optimize(p, Direction.FORWARD, 64 << 20, "powerOfTwo", backend=same)
    assert same.finds == 0 and plan.describe() == "2 x 128"
    # ... and not another device, which measures for itself.
    other = _Machine("NVIDIA B200")
    mu.optimize(p, Direction.FORWARD, 64 << 20, "powerOfTwo", backend=other)
    assert other.finds == 9


def test_import_keeps_larger_caps(capsys, tmp_path, monkeypatch):
    live, incoming = tmp_path / "live.sqlite", tmp_path / "in.sqlite"
    _fill(live, A, [100, 1, 50])
    _fill(incoming, A, [10, 10, 50])
    _fill(incoming, B, [7])
    monkeypatch.setenv("MUCUDNN_CACHE", str(live))
    rc, text, _ = _run(capsys, "import", str(incoming))
    assert rc == 0 and "4 entries read" in text
    c = BenchmarkCache(live)
    assert [c.get(A, f"problem-{i}", "forward", 0)[0].time_ms for i in range(3)] == [100, 10, 50]
    assert c.get(B, "problem-0", "forward", 7) == [AlgoPerf(0, 7.0, 0)]


def test_import_into_a_read_only_cache_is_refused(capsys, tmp_path, monkeypatch, h200):
    monkeypatch.setenv("MUCUDNN_CACHE", str(h200))
    incoming = tmp_path / "in.sqlite"
    _fill(incoming, A, [1])
    rc, _, err = _run(capsys, "import", str(incoming))
    assert rc == 2 and "read-only" in err and "MUCUDNN_CACHE" in err
    assert _sha(h200) == _sha(H200)
    monkeypatch.setenv("MUCUDNN_CACHE", "off")
    assert _run(capsys, "import", str(incoming))[0] == 2


@pytest.mark.slow
def test_merge(capsys, tmp_path, h200):
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    _fill(a, A, [1, 2, 3])
    _fill(b, B, [4])
    _fill(b, A, [9, 0])
    before = {p: _sha(p) for p in (a, b, h200)}
    out = tmp_path / "all.sqlite"
    rc, text, _ = _run(capsys, "merge", str(a), str(b), str(h200), "-o", str(out))
    assert rc == 0 and f"wrote {3 + 1 + 1851} entries" in text
    assert {p: _sha(p) for p in (a, b, h200)} == before
    merged = BenchmarkCache(out)
    assert not merged.read_only and len(merged) == 3 + 1 + 1851
    assert [merged.get(A, f"problem-{i}", "forward", 0)[0].time_ms for i in range(3)] == [9, 2, 3]
    assert merged.get(B, "problem-0", "forward", 0) == [AlgoPerf(0, 4.0, 0)]
    merged.close()
    rc, _, err = _run(capsys, "merge", str(a), "-o", str(out))
    assert rc == 2 and "exists" in err
    con = sqlite3.connect(out)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] in ("wal", "delete")
    con.close()


def test_merge_refuses_a_file_that_is_not_a_cache(capsys, tmp_path):
    a = tmp_path / "a.sqlite"
    _fill(a, A, [1])
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    rc, _, err = _run(capsys, "merge", str(a), str(notes), "-o", str(tmp_path / "o.sqlite.gz"))
    assert rc == 2 and "notes.txt" in err and "not a mucudnn benchmark cache" in err
    assert not (tmp_path / "o.sqlite.gz").exists()


@pytest.mark.slow
def test_cache_subcommand_as_a_program(tmp_path, h200):
    r = subprocess.run([sys.executable, "-m", "mucudnn", "cache", "info", str(H200)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "entries: 1851" in r.stdout
    assert r.stderr == ""  # info opens it read-only on purpose: no notice
    env = {**os.environ, "MUCUDNN_CACHE": str(h200), "PYTHONWARNINGS": "always"}
    r = subprocess.run([sys.executable, "-m", "mucudnn", "optimize", "--net", "alexnet",
                        "--offline", "--backend", "cudnn", "--layers", "conv5,conv4",
                        "--no-progress"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.count("2 x 128") >= 3
    assert r.stderr.count("is read-only") == 1  # one notice, even with every warning shown
    assert sorted(tmp_path.iterdir()) == [h200] and _sha(h200) == _sha(H200)


# -- hostile outputs, locks, keys and sizes ------------------------------------------------------

def test_export_refuses_a_dangling_symlink_without_force(capsys, tmp_path, monkeypatch):
    live = tmp_path / "live.sqlite"
    _fill(live, A, [1])
    monkeypatch.setenv("MUCUDNN_CACHE", str(live))
    target = tmp_path / "somewhere" / "precious.sqlite.gz"  # does not exist (yet)
    link = tmp_path / "out.sqlite.gz"
    link.symlink_to(target)
    rc, _, err = _run(capsys, "export", str(link))
    assert rc == 2 and "symbolic link" in err and "--force" in err and str(link) in err
    assert link.is_symlink() and os.readlink(link) == str(target) and not target.exists()
    assert _run(capsys, "export", str(link), "--force")[0] == 0
    assert not link.is_symlink()  # --force replaces the link itself, never writes through it
    assert not target.exists()
    assert BenchmarkCache(link, read_only=True).keys() == [(*A, "problem-0", "forward")]


_HOLD = r"""
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA locking_mode=EXCLUSIVE")
c.execute("BEGIN EXCLUSIVE")
c.execute("INSERT OR REPLACE INTO mucudnn_meta VALUES ('held', 'yes')")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_info_on_a_locked_cache_says_what_it_waits_for_and_gives_up_soon(tmp_path):
    live = tmp_path / "live.sqlite"
    _fill(live, A, [1])
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(live)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "mucudnn", "cache", "info", str(live)],
                             capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t0
    finally:
        holder.communicate("")
    assert out.returncode == 2
    waits = [ln for ln in out.stderr.splitlines() if "locked" in ln and "waiting up to" in ln]
    assert len(waits) == 1 and str(live) in waits[0], out.stderr
    assert took < cache_tools.READ_TIMEOUT + 15, took
    # once released, the same file reads
    assert "entries: 1" in cache_tools.info(live)


def test_rows_with_null_key_columns_are_rejected_and_counted(capsys, tmp_path, monkeypatch):
    """A file with our schema but NULLs (or BLOBs) in key columns: those rows
    are skipped with a count, never imported under the key "None"."""
    bad = tmp_path / "bad.sqlite"
    _fill(bad, A, [1, 2])
    con = sqlite3.connect(bad)
    con.execute("PRAGMA writable_schema = ON")
    con.execute("UPDATE sqlite_master SET sql = replace(sql, 'NOT NULL', '') "
                "WHERE name = 'benchmarks'")
    con.commit()
    con.close()
    con = sqlite3.connect(bad)
    good = con.execute("SELECT * FROM benchmarks LIMIT 1").fetchone()
    for i, col in enumerate(["backend", "device", "version", "problem", "direction"]):
        row = list(good)
        row[i] = None
        row[3] = f"null-{col}" if i != 3 else None
        con.execute("INSERT INTO benchmarks VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
    row = list(good)
    row[1], row[3] = b"GPU A", "blob-device"  # a BLOB stays a BLOB in a TEXT column
    con.execute("INSERT INTO benchmarks VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
    con.commit()
    con.close()
    live = tmp_path / "live.sqlite"
    monkeypatch.setenv("MUCUDNN_CACHE", str(live))
    with pytest.warns(CacheWarning, match=r"skipped 6 entries whose key"):
        read, stored = cache_tools.import_cache(bad)
    assert (read, stored) == (2, 2)
    keys = BenchmarkCache(live, read_only=True).keys()
    assert keys == [(*A, "problem-0", "forward"), (*A, "problem-1", "forward")]
    assert not any(k[3].startswith(("null", "blob")) or "None" in k for k in keys)


@pytest.mark.slow
def test_gzipped_cache_larger_than_the_bound_is_refused(tmp_path, monkeypatch):
    from mucudnn.optimizer import cache_files
    live = tmp_path / "live.sqlite"
    with BenchmarkCache(live) as c:  # a few MB: more than one read of the decompressor
        c.put_many([cache_tools.Entry(*A, f"p{i}", "forward", 1 << 30,
                                      [AlgoPerf(j, 1.0 + j, j) for j in range(200)])
                    for i in range(150)])
    gz = tmp_path / "c.sqlite.gz"
    assert cache_tools.export(gz, source=live) == 150
    size = live.stat().st_size
    assert size > 2 << 20
    monkeypatch.setattr(cache_files, "MAX_GUNZIP", size // 2)
    monkeypatch.setattr(cache_files.gunzip_to, "__defaults__", (size // 2,))
    before = set(pathlib.Path(tempfile.gettempdir()).glob("mucudnn-cache-*/cache.sqlite"))
    with pytest.raises(CacheFileError, match=r"gzipped cache too large to read .*gunzip"):
        cache_tools.info(gz)
    after = set(pathlib.Path(tempfile.gettempdir()).glob("mucudnn-cache-*/cache.sqlite"))
    assert after <= before  # nothing left behind
    # the trailer may lie: the stream is still counted
    lying = tmp_path / "lying.sqlite.gz"
    data = bytearray(gz.read_bytes())
    data[-4:] = (1).to_bytes(4, "little")
    lying.write_bytes(bytes(data))
    with pytest.raises(CacheFileError, match=r"too large"):
        cache_tools.info(lying)
