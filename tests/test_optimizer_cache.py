"""The SQLite benchmark cache: round trips, caps, concurrency, recovery, MUCUDNN_CACHE."""

from __future__ import annotations

import multiprocessing
import pathlib
import sqlite3
import warnings

import pytest

from mucudnn.optimizer import BenchmarkCache, CacheWarning, benchmark, default_cache_path
from mucudnn.optimizer.cache import SCHEMA_VERSION, CacheFileError
from mucudnn.problem import AlgoPerf, ConvProblem, Direction

BE = ("fake", "Fake Device 9000", "1.2.3")
P = ConvProblem((8, 4, 6, 6), (4, 4, 3, 3), padding=1)
RESULTS = [AlgoPerf(1, 0.5, 1024, 0, 1), AlgoPerf("eng3:cfg7", 0.7, 0, "tensor_op", None),
           AlgoPerf(0, 2.25, 0)]


class FakeBackend:
    """Deterministic Find results that depend on the problem and direction; counts calls."""

    name = "fake"
    device_name = "Fake Device 9000"
    version = "1.2.3"

    def __init__(self):
        self.calls = []

    def find(self, problem, direction, workspace_limit):
        self.calls.append((problem.batch, direction, workspace_limit))
        n = problem.batch
        out = [AlgoPerf(0, 1.0 * n, 0), AlgoPerf(1, 0.1 * n + 0.05, 1000 * n)]
        return [r for r in out if r.workspace_bytes <= workspace_limit]


def test_round_trip(tmp_path):
    cache = BenchmarkCache(tmp_path / "c.sqlite")
    assert cache.get(BE, P, Direction.FORWARD) is None
    cache.put(BE, P, Direction.FORWARD, RESULTS, 1 << 20)
    assert cache.get(BE, P, Direction.FORWARD) == RESULTS
    got = cache.get(BE, P, "forward", 1 << 20)
    assert got == RESULTS and isinstance(got[1].algo, str) and isinstance(got[0].algo, int)
    # Every key field matters.
    assert cache.get(BE, P, Direction.BACKWARD_DATA) is None
    assert cache.get(BE, P.with_batch(4), Direction.FORWARD) is None
    assert cache.get(("fake", "Fake Device 9000", "1.2.4"), P, Direction.FORWARD) is None
    assert cache.get(("fake", "Other", "1.2.3"), P, Direction.FORWARD) is None
    assert cache.get(("cudnn", "Fake Device 9000", "1.2.3"), P, Direction.FORWARD) is None
    assert len(cache) == 1
    assert cache.keys() == [(*BE, P.key(), "forward")]
    # A second object (another process, say) sees the same entry; the file is WAL.
    assert BenchmarkCache(tmp_path / "c.sqlite").get(FakeBackend(), P.key(), "fwd") == RESULTS
    mode = sqlite3.connect(tmp_path / "c.sqlite").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    cache.clear()
    assert len(cache) == 0
    cache.close()


def test_workspace_caps(tmp_path):
    cache = BenchmarkCache(tmp_path / "c.sqlite")
    cache.put(BE, P, Direction.FORWARD, RESULTS[:1], 1000)
    assert cache.get(BE, P, Direction.FORWARD, 1000) == RESULTS[:1]
    assert cache.get(BE, P, Direction.FORWARD, 10) == RESULTS[:1]
    assert cache.get(BE, P, Direction.FORWARD, 1001) is None
    assert cache.get(BE, P, Direction.FORWARD, None) is None
    cache.put(BE, P, Direction.FORWARD, RESULTS[2:], 10)  # a smaller cap does not replace
    assert cache.get(BE, P, Direction.FORWARD, 0) == RESULTS[:1]
    cache.put(BE, P, Direction.FORWARD, RESULTS, None)  # unlimited replaces
    assert cache.get(BE, P, Direction.FORWARD, 1 << 40) == RESULTS
    assert cache.get(BE, P, Direction.FORWARD, None) == RESULTS


def _direction(i: int, worker: int) -> Direction:
    return list(Direction)[(i + worker) % 3]


def _worker(path: str, worker: int, problems: list) -> int:
    warnings.simplefilter("error", CacheWarning)
    cache = BenchmarkCache(path)
    be = FakeBackend()
    for i, p in enumerate(problems):
        benchmark(be, p, _direction(i, worker), "all", 1 << 30, cache=cache, progress=False)
        for d in Direction:  # plain puts at the full batch, all directions
            cache.put(be, p.with_batch(7), d, [AlgoPerf(worker, float(i), 0)], 1 << 30)
    cache.close()
    return len(be.calls)


def _aside(tmp_path):
    return [p for p in tmp_path.glob("c.sqlite.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]


def _execute(path, *statements):
    """Run ``statements`` on the SQLite file at ``path`` behind the cache's back, then commit."""
    con = sqlite3.connect(path)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()


@pytest.mark.slow
def test_four_processes_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    probs = [ConvProblem((6, c, 5, 5), (2, c, 3, 3)) for c in range(1, 13)]
    # Overlapping slices: every problem is written by two or more processes.
    slices = [probs[0:8], probs[2:10], probs[4:12], probs[0:12:2] + probs[1:12:2]]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        calls = pool.starmap(_worker, [(path, w, s) for w, s in enumerate(slices)])
    assert all(c > 0 for c in calls)
    benchmarked = {(p.with_batch(s), _direction(i, w))
                   for w, sl in enumerate(slices) for i, p in enumerate(sl) for s in range(1, 7)}
    put = {(p.with_batch(7), d) for p in probs for d in Direction}
    cache = BenchmarkCache(path)
    assert set(cache.keys()) == {(*BE, p.key(), d.value) for p, d in benchmarked | put}
    be = FakeBackend()
    for p, d in benchmarked:
        assert cache.get(be, p, d, 1 << 30) == FakeBackend().find(p, d, 1 << 30)
    for p, d in put:
        (r,) = cache.get(be, p, d, 1 << 30)
        assert r.workspace_bytes == 0 and 0 <= int(r.algo) < 4
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_text_file_is_refused_not_moved(tmp_path):
    # (Before issue 11 a file that was not ours was renamed to *.corrupt-* and replaced.)
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database, just some text\n" * 200)
    cache = BenchmarkCache(path)
    with pytest.raises(CacheFileError, match="not a mucudnn benchmark cache"):
        cache.get(BE, P, Direction.FORWARD)
    assert not _aside(tmp_path)
    assert path.read_bytes() == b"this is not a database, just some text\n" * 200


def test_foreign_sqlite_file_is_refused_not_moved(tmp_path):
    path = tmp_path / "c.sqlite"
    _execute(path, "CREATE TABLE users (name TEXT)", "INSERT INTO users VALUES ('alice')")
    before = path.read_bytes()
    cache = BenchmarkCache(path)
    with pytest.raises(CacheFileError, match="users"):
        cache.put(BE, P, Direction.FORWARD, RESULTS, 0)
    assert not _aside(tmp_path) and path.read_bytes() == before
    assert sqlite3.connect(path).execute("SELECT name FROM users").fetchall() == [("alice",)]


def test_our_damaged_file_is_moved_aside_and_rebuilt(tmp_path):
    path = tmp_path / "c.sqlite"
    with BenchmarkCache(path) as c:
        for i in range(1, 200):
            c.put(BE, P.with_batch(i), Direction.FORWARD, RESULTS, 0)
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[3 * page:] = b"\xff" * (len(data) - 3 * page)  # pages 4.. are garbage
    path.write_bytes(bytes(data))
    cache = BenchmarkCache(path)
    with pytest.warns(CacheWarning, match="moved it to"):
        assert cache.get(BE, P.with_batch(150), Direction.FORWARD) is None
    (aside,) = _aside(tmp_path)
    assert aside.read_bytes() == bytes(data)
    cache.put(BE, P, Direction.FORWARD, RESULTS, 0)
    assert BenchmarkCache(path).get(BE, P, Direction.FORWARD) == RESULTS


def test_our_tables_plus_foreign_ones_are_moved_aside(tmp_path):
    path = tmp_path / "c.sqlite"
    BenchmarkCache(path).put(BE, P, Direction.FORWARD, RESULTS, 0)
    _execute(path, "CREATE TABLE extra (x)")
    with pytest.warns(CacheWarning, match="foreign"):
        assert BenchmarkCache(path).get(BE, P, Direction.FORWARD) is None
    assert len(_aside(tmp_path)) == 1


def test_old_schema_version_is_rebuilt(tmp_path):
    path = tmp_path / "c.sqlite"
    _execute(path,
             "CREATE TABLE mucudnn_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
             "INSERT INTO mucudnn_meta VALUES ('schema_version', '1')",
             "CREATE TABLE benchmarks (k TEXT PRIMARY KEY, v TEXT)",
             "INSERT INTO benchmarks VALUES ('x', 'y')")
    cache = BenchmarkCache(path)
    with pytest.warns(CacheWarning, match="schema version 1 is old"):
        cache.put(BE, P, Direction.FORWARD, RESULTS, 0)
    assert cache.get(BE, P, Direction.FORWARD) == RESULTS
    assert len(cache) == 1
    version = sqlite3.connect(path).execute(
        "SELECT value FROM mucudnn_meta WHERE key = 'schema_version'").fetchone()[0]
    assert int(version) == SCHEMA_VERSION
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_newer_schema_version_is_left_alone(tmp_path):
    path = tmp_path / "c.sqlite"
    _execute(path,
             "CREATE TABLE mucudnn_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
             "INSERT INTO mucudnn_meta VALUES ('schema_version', '999')")
    before = path.read_bytes()
    cache = BenchmarkCache(path)
    with pytest.warns(CacheWarning, match="disabled"):
        assert cache.get(BE, P, Direction.FORWARD) is None
    cache.put(BE, P, Direction.FORWARD, RESULTS, 0)  # a no-op now
    assert not cache.enabled
    assert path.read_bytes() == before


def test_env_off_disables(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("MUCUDNN_CACHE", "off")
    assert default_cache_path() is None
    cache = BenchmarkCache()
    assert not cache.enabled
    cache.put(BE, P, Direction.FORWARD, RESULTS, 0)
    assert cache.get(BE, P, Direction.FORWARD) is None
    assert len(cache) == 0
    be = FakeBackend()
    benchmark(be, P, Direction.FORWARD, "powerOfTwo", 1 << 20, progress=False)
    benchmark(be, P, Direction.FORWARD, "powerOfTwo", 1 << 20, progress=False)
    assert len(be.calls) == 8  # no cache: both runs did the work
    assert not (tmp_path / "xdg").exists()


def test_default_paths(tmp_path, monkeypatch):
    monkeypatch.delenv("MUCUDNN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "xdg" / "mucudnn" / "benchmarks.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_path() == pathlib.Path.home() / ".cache" / "mucudnn" / "benchmarks.sqlite"
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "mine.sqlite"))
    assert default_cache_path() == tmp_path / "mine.sqlite"
    # The default cache follows the environment.
    be = FakeBackend()
    benchmark(be, P, Direction.FORWARD, "undivided", 1 << 20, progress=False)
    assert (tmp_path / "mine.sqlite").exists()
    assert BenchmarkCache(tmp_path / "mine.sqlite").get(be, P, "fwd", 1 << 20) is not None


def test_cache_off_string_disables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = BenchmarkCache("off")
    assert not c.enabled
    assert not (tmp_path / "off").exists()
