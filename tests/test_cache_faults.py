"""The benchmark cache under hostile input: it never moves, renames or writes a file
it did not create, serves read-only and gzipped caches, drops bad entries, and
loses nothing to concurrent writers or a writer killed with SIGKILL.

Read-only cases drop root's privileges in a forked child (root ignores file
modes); elsewhere they run in-process.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import multiprocessing
import os
import pathlib
import shutil
import signal
import sqlite3
import tempfile
import traceback
import warnings

import networkx  # noqa: F401  (loaded before _as_user drops root, which may not read it)
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mucudnn as mu
import reference
from mucudnn.backends import get_backend
from mucudnn.backends.numpy import NumpyAlgo
from mucudnn.caches import clear_all, live_caches
from mucudnn.errors import MucudnnError
from mucudnn.optimizer import BenchmarkCache, CacheWarning, CachedBackend
from mucudnn.optimizer.benchmark import resolve_cache
from mucudnn.optimizer.cache import CacheArgumentError, CacheFileError
from mucudnn.exec.kernel import FallbackWarning
from mucudnn.problem import AlgoPerf, ConvProblem, Direction, MicroBatch, make_plan

from conftest import DATA

BE = ("fake", "Fake Device 9000", "1.2.3")
P = ConvProblem((8, 4, 6, 6), (4, 4, 3, 3), padding=1)
GOOD = [AlgoPerf(1, 0.5, 1024, 0, 1), AlgoPerf("eng3:cfg7", 0.7, 0, "tensor_op", None)]
FAST = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def _problem(i: int) -> ConvProblem:
    return ConvProblem((1 + i % 7, 1 + i // 7, 5, 5), (2, 1 + i // 7, 3, 3))


def _fill(path, n: int = 5) -> None:
    """A warm cache of ``n`` entries (closed, so its WAL is checkpointed away)."""
    with BenchmarkCache(path) as c:
        for i in range(n):
            c.put(BE, _problem(i), Direction.FORWARD, [AlgoPerf(i % 3, 1.0 + i, 64 * i)], 1 << 30)


def _snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    folder = pathlib.Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _caught(fn, *args):
    """``fn(*args)`` and the CacheWarning messages it raised."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in rec if issubclass(w.category, CacheWarning)]


def _as_user(fn, *args):
    """``fn(*args)`` where file modes bind: in-process for an ordinary user, in a
    forked child that drops to uid/gid 65534 for root. Returns fn's (picklable) value."""
    if os.geteuid() != 0:
        return fn(*args)
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child():
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
        except OSError as exc:
            send.send(("skip", f"cannot drop root privileges: {exc}"))
            return
        try:
            value = fn(*args)
            clear_all()  # closes the default caches (and their temporary copies): this
            send.send(("ok", value))  # child ends with os._exit, which runs no finalizers
        except BaseException:
            send.send(("error", traceback.format_exc()))

    proc = ctx.Process(target=child)
    proc.start()
    send.close()
    try:
        kind, value = recv.recv()
    except EOFError:
        kind, value = "error", f"child died (exit code {proc.join() or proc.exitcode})"
    proc.join()
    if kind == "skip":
        pytest.skip(value)
    if kind == "error":
        pytest.fail(f"in the unprivileged child:\n{value}")
    return value


@pytest.fixture
def shared_dir():
    """A folder that the unprivileged child of :func:`_as_user` can read."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="mucudnn-fault-"))
    d.chmod(0o755)
    yield d
    for p in [d, *d.rglob("*")]:
        with contextlib.suppress(OSError):
            p.chmod(0o755 if p.is_dir() else 0o644)
    shutil.rmtree(d, ignore_errors=True)


def _read_only(*paths) -> None:
    for p in paths:
        p = pathlib.Path(p)
        p.chmod(0o555 if p.is_dir() else 0o444)


# -- files that are not mucudnn caches ---------------------------------------------------------
def _foreign_sqlite(path, wal: bool = False) -> None:
    con = sqlite3.connect(path)
    if wal:
        con.execute("PRAGMA journal_mode = WAL")
    con.execute("CREATE TABLE users (name TEXT)")
    con.execute("INSERT INTO users VALUES ('alice')")
    con.commit()
    con.close()


@pytest.mark.parametrize("kind", ["text", "foreign-sqlite", "foreign-wal-sqlite", "empty-sqlite",
                                  "our-meta-no-version"])
def test_a_file_that_is_not_a_cache_is_refused_and_untouched(tmp_path, monkeypatch, kind):
    path = tmp_path / "notes.txt"
    if kind == "text":
        path.write_text("my notes\n" * 100)
    elif kind == "foreign-sqlite":
        _foreign_sqlite(path)
    elif kind == "foreign-wal-sqlite":  # no -shm/-wal may appear next to it
        _foreign_sqlite(path, wal=True)
    elif kind == "empty-sqlite":
        con = sqlite3.connect(path)
        con.execute("PRAGMA user_version = 7")  # a database file with no tables
        con.close()
    else:
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE mucudnn_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        con.commit()
        con.close()
    before = _snapshot(tmp_path)
    monkeypatch.setenv("MUCUDNN_CACHE", str(path))
    cache = BenchmarkCache()
    with pytest.raises(CacheFileError) as info:
        cache.get(BE, P, Direction.FORWARD)
    err = info.value
    assert isinstance(err, MucudnnError) and isinstance(err, OSError)
    assert str(path) in str(err) and "MUCUDNN_CACHE" in str(err)
    assert err.path == str(path) and err.variable == "MUCUDNN_CACHE"
    with pytest.raises(CacheFileError):
        cache.put(BE, P, Direction.FORWARD, GOOD, 0)
    with pytest.raises(CacheFileError, match=r"cache file .*notes\.txt"):  # named by the argument
        BenchmarkCache(path).get(BE, P, Direction.FORWARD)
    with pytest.raises(CacheFileError, match="MUCUDNN_CACHE"):
        mu.optimize(P, Direction.FORWARD, 1 << 20, "undivided", backend="numpy")
    assert _snapshot(tmp_path) == before  # nothing renamed, written or created


def test_directory_and_device_are_refused(tmp_path):
    with pytest.raises(CacheFileError, match="directory"):
        BenchmarkCache(tmp_path).get(BE, P, Direction.FORWARD)
    with pytest.raises(CacheFileError, match="not a regular file.*off"):
        BenchmarkCache("/dev/null").get(BE, P, Direction.FORWARD)


def test_empty_file_becomes_a_cache(tmp_path):
    path = tmp_path / "c.sqlite"
    path.touch()  # nothing to lose: what an interrupted first open of old versions left
    c = BenchmarkCache(path)
    c.put(BE, P, Direction.FORWARD, GOOD, 0)
    assert BenchmarkCache(path).get(BE, P, Direction.FORWARD) == GOOD


@FAST
@given(data=st.binary(min_size=1, max_size=3000),
       prefix=st.sampled_from([b"", b"SQLite format 3\x00", b"\x1f\x8b"]),
       compress=st.booleans())
def test_arbitrary_bytes_are_refused_untouched(data, prefix, compress):
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "c.sqlite"
        blob = prefix + data
        path.write_bytes(gzip.compress(blob, mtime=0) if compress else blob)
        before = _snapshot(d)
        with pytest.raises(CacheFileError, match="not a mucudnn benchmark cache"):
            BenchmarkCache(path).get(BE, P, Direction.FORWARD)
        assert _snapshot(d) == before


# -- our own caches, damaged -------------------------------------------------------------------
def test_schema_2_with_other_columns_is_ours_and_moved_aside(tmp_path):
    path = tmp_path / "c.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE mucudnn_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("INSERT INTO mucudnn_meta VALUES ('schema_version', '2')")
    con.execute("CREATE TABLE benchmarks (k TEXT PRIMARY KEY, v TEXT)")
    con.execute("INSERT INTO benchmarks VALUES ('x', 'y')")
    con.commit()
    con.close()
    original = path.read_bytes()
    cache = BenchmarkCache(path)
    with pytest.warns(CacheWarning, match="columns"):
        assert cache.get(BE, P, Direction.FORWARD) is None
    cache.put(BE, P, Direction.FORWARD, GOOD, 0)
    assert BenchmarkCache(path).get(BE, P, Direction.FORWARD) == GOOD
    (aside,) = tmp_path.glob("c.sqlite.corrupt-*")
    assert aside.read_bytes() == original


def test_read_only_damaged_cache_is_disabled_untouched(shared_dir):
    path = shared_dir / "c.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE mucudnn_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("INSERT INTO mucudnn_meta VALUES ('schema_version', '2')")
    con.execute("CREATE TABLE benchmarks (k TEXT PRIMARY KEY, v TEXT)")
    con.commit()
    con.close()
    _read_only(path, shared_dir)
    before = _snapshot(shared_dir)

    def go():
        c = BenchmarkCache(path)
        out = c.get(BE, P, Direction.FORWARD), c.enabled
        c.put(BE, P, Direction.FORWARD, GOOD, 0)
        return out

    (got, enabled), warned = _as_user(_caught, go)
    assert got is None and not enabled
    assert len(warned) == 1 and "cannot be repaired" in warned[0] and "columns" in warned[0]
    assert _snapshot(shared_dir) == before


def _truncated_cache(n: int = 60) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "c.sqlite"
        _fill(path, n)
        return path.read_bytes()


@pytest.fixture(scope="module")
def full_cache_bytes():
    return _truncated_cache()


@FAST
@given(cut=st.integers(min_value=1, max_value=60 * 4096))
def test_truncated_cache_loses_no_bytes(full_cache_bytes, cut):
    data = full_cache_bytes[:cut]
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "c.sqlite"
        path.write_bytes(data)
        cache = BenchmarkCache(path)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CacheWarning)
                got = [cache.get(BE, _problem(i), Direction.FORWARD, 1 << 30) for i in range(60)]
        except CacheFileError:  # not provably ours: left exactly as it was
            assert path.read_bytes() == data
            assert list(pathlib.Path(d).iterdir()) == [path]
            return
        for i, g in enumerate(got):  # what comes back is what was stored
            assert g is None or g == [AlgoPerf(i % 3, 1.0 + i, 64 * i)]
        asides = [p for p in pathlib.Path(d).glob("c.sqlite.corrupt-*")
                  if not p.name.endswith(("-wal", "-shm"))]
        if asides:  # moved aside (it was provably ours), byte for byte
            assert [a.read_bytes() for a in asides] == [data]
        cache.put(BE, P, Direction.FORWARD, GOOD, 0)  # still a usable cache
        assert cache.get(BE, P, Direction.FORWARD) == GOOD
        cache.close()


# -- read-only caches --------------------------------------------------------------------------
def _ro_session(path: str, cached_backend: bool):
    def go():
        c = BenchmarkCache(path)
        got = [c.get(BE, _problem(i), Direction.FORWARD, 1 << 30) for i in range(5)]
        c.put(BE, P, Direction.FORWARD, GOOD, 0)  # not stored, no error
        c.put(BE, P, Direction.BACKWARD_DATA, GOOD, 0)
        after = c.get(BE, P, Direction.FORWARD)
        names = None
        if cached_backend:
            cb = CachedBackend("fake", cache=path)
            names = (cb.name, cb.device_name, cb.version)
            cb.cache.close()
        out = got, after, c.read_only, len(c), names
        c.close()
        return out

    return _caught(go)


@pytest.mark.parametrize("what", ["file", "directory", "both"])
def test_read_only_cache_is_served(shared_dir, what):
    path = shared_dir / "c.sqlite"
    _fill(path)
    _read_only(*{"file": [path], "directory": [shared_dir], "both": [path, shared_dir]}[what])
    before = _snapshot(shared_dir)
    (got, after, ro, n, names), warned = _as_user(_ro_session, str(path), True)
    assert got == [[AlgoPerf(i % 3, 1.0 + i, 64 * i)] for i in range(5)]  # not turned off
    assert after is None and ro and n == 5
    assert names == BE
    assert len(warned) == 1 and "read-only" in warned[0] and "\n" not in warned[0]
    assert _snapshot(shared_dir) == before


def _ro_offline_cli(path: str):
    from mucudnn.__main__ import main

    import io
    import contextlib as cl

    old = os.environ.get("MUCUDNN_CACHE")
    os.environ["MUCUDNN_CACHE"] = path
    out = io.StringIO()
    try:
        with cl.redirect_stdout(out):
            rc = main(["optimize", "--net", "alexnet", "--offline", "--backend", "cudnn",
                       "--layers", "conv5", "--directions", "forward", "--no-progress"])
    finally:
        if old is None:
            del os.environ["MUCUDNN_CACHE"]
        else:
            os.environ["MUCUDNN_CACHE"] = old
    return rc, out.getvalue()


@pytest.mark.parametrize("gz", [False, True])
def test_offline_cli_on_a_read_only_h200_cache(shared_dir, gz):
    path = shared_dir / ("h200.sqlite.gz" if gz else "h200.sqlite")
    if gz:
        shutil.copy(DATA / "h200-benchmark-cache.sqlite.gz", path)
    else:
        with gzip.open(DATA / "h200-benchmark-cache.sqlite.gz") as s, open(path, "wb") as d:
            shutil.copyfileobj(s, d)
    _read_only(path, shared_dir)
    before = _snapshot(shared_dir)
    (rc, out), warned = _as_user(_caught, _ro_offline_cli, str(path))
    assert rc == 0 and "2 x 128" in out and "NVIDIA H200" in out
    assert len(warned) == 1 and "read-only" in warned[0]
    assert _snapshot(shared_dir) == before


def test_readme_offline_example_reads_the_gz_in_place(tmp_path, monkeypatch, capsys):
    """README: point MUCUDNN_CACHE at tests/data/h200-benchmark-cache.sqlite.gz."""
    from mucudnn.__main__ import main

    path = tmp_path / "h200-benchmark-cache.sqlite.gz"
    shutil.copy(DATA / "h200-benchmark-cache.sqlite.gz", path)
    monkeypatch.setenv("MUCUDNN_CACHE", str(path))
    with pytest.warns(CacheWarning, match="read-only"):
        assert main(["optimize", "--net", "alexnet", "--offline", "--backend", "cudnn",
                     "--layers", "conv5", "--no-progress"]) == 0
    assert "2 x 128" in capsys.readouterr().out
    shipped = {path.name: (DATA / "h200-benchmark-cache.sqlite.gz").read_bytes()}
    assert _snapshot(tmp_path) == shipped
    be = CachedBackend("cudnn-graph", cache=str(path))
    assert be.device_name == "NVIDIA H200"
    assert _snapshot(tmp_path) == shipped


def test_gz_that_is_not_a_cache_is_refused(tmp_path):
    for name, blob in [("a.gz", gzip.compress(b"hello " * 100)), ("b.sqlite.gz", b"\x1f\x8b junk"),
                       ]:
        path = tmp_path / name
        path.write_bytes(blob)
    for name in ("a.gz", "b.sqlite.gz"):
        with pytest.raises(CacheFileError, match="not a mucudnn benchmark cache"):
            BenchmarkCache(tmp_path / name).get(BE, P, Direction.FORWARD)
    foreign = tmp_path / "app.db"
    _foreign_sqlite(foreign)
    (tmp_path / "app.db.gz").write_bytes(gzip.compress(foreign.read_bytes()))
    with pytest.raises(CacheFileError, match="users"):
        BenchmarkCache(tmp_path / "app.db.gz").get(BE, P, Direction.FORWARD)


# -- tampered entries --------------------------------------------------------------------------
def _tamper(path, results, cap=1 << 30, problem=P) -> None:
    con = sqlite3.connect(path)
    con.execute("UPDATE benchmarks SET results = ?, workspace_cap = ? WHERE problem = ?",
                (results, cap, problem.key()))
    con.commit()
    con.close()


BAD_ENTRIES = [
    ('[{"algo": null, "time_ms": 1.0, "workspace_bytes": 0}]', 1 << 30),
    ('[{"algo": [1], "time_ms": 1.0, "workspace_bytes": 0}]', 1 << 30),
    ('[{"algo": 1, "time_ms": "1.0", "workspace_bytes": 0}]', 1 << 30),
    ('[{"algo": 1, "time_ms": 1.0, "workspace_bytes": "1024"}]', 1 << 30),
    ('[{"algo": 1, "time_ms": NaN, "workspace_bytes": 0}]', 1 << 30),
    ('[{"algo": 1, "time_ms": -1, "workspace_bytes": 0}]', 1 << 30),
    ('[{"algo": 1, "time_ms": 1.0, "workspace_bytes": 0, "colour": "red"}]', 1 << 30),
    ('[{"algo": 1, "time_ms": 1.0, "workspace_bytes": 0, "determinism": {"a": 1}}]', 1 << 30),
    ('{"algo": 1}', 1 << 30),
    ("[" * 200_000 + "]" * 200_000, 1 << 30),
    ('[{"algo": 1, "time_ms": 1.0, "workspace_bytes": 0}]', "a lot"),
    ('[{"algo": 1, "time_ms": 1.0, "workspace_bytes": 0}]', 1.5),
    ('[{"algo": 1, "time_ms": 1.0, "workspace_bytes": 0}]', -3),
    (b'[{"algo": 1, "time_ms": 1.0, "workspace_bytes": 0}]', 1 << 30),
    ("not json at all", 1 << 30),
]


@pytest.mark.parametrize("results,cap", BAD_ENTRIES, ids=range(len(BAD_ENTRIES)))
def test_tampered_entry_is_dropped_once_and_measured_again(tmp_path, results, cap):
    path = tmp_path / "c.sqlite"
    with BenchmarkCache(path) as c:
        c.put(BE, P, Direction.FORWARD, GOOD, 1 << 30)
        c.put(BE, P.with_batch(4), Direction.FORWARD, GOOD, 1 << 30)
    _tamper(path, results, cap)
    cache = BenchmarkCache(path)
    got, warned = _caught(cache.get, BE, P, Direction.FORWARD, 0)
    assert got is None and len(warned) == 1 and P.key()[:20] in warned[0]
    assert cache.keys() == [(*BE, P.with_batch(4).key(), "forward")]  # the bad row is gone
    assert cache.get(BE, P.with_batch(4), Direction.FORWARD) == GOOD
    # ... and the next benchmark measures it again and stores it
    cache.put(BE, P, Direction.FORWARD, GOOD[:1], 0)
    assert cache.get(BE, P, Direction.FORWARD) == GOOD[:1]


def test_tampered_entry_in_a_read_only_cache(shared_dir):
    path = shared_dir / "c.sqlite"
    with BenchmarkCache(path) as c:
        c.put(BE, P, Direction.FORWARD, GOOD, 1 << 30)
    _tamper(path, '[{"algo": null, "time_ms": 1.0, "workspace_bytes": 0}]')
    _read_only(path, shared_dir)
    before = _snapshot(shared_dir)

    def go():
        c = BenchmarkCache(path)
        return [c.get(BE, P, Direction.FORWARD) for _ in range(3)]

    got, warned = _as_user(_caught, go)
    assert got == [None, None, None]
    assert sum("read-only" in w for w in warned) == 1
    assert sum("algo" in w for w in warned) == 1  # one warning, not one per call
    assert _snapshot(shared_dir) == before


_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["algo", "time_ms", "workspace_bytes", "math_type", "determinism", "x"]),
        inner, max_size=6),
    max_leaves=12)
_good_dict = st.fixed_dictionaries({
    "algo": st.integers(0, 7) | st.text(min_size=1, max_size=20),
    "time_ms": st.floats(0, 1e6), "workspace_bytes": st.integers(0, 1 << 40)})


@FAST
@given(value=st.one_of(_json, st.lists(_good_dict, max_size=3),
                       st.lists(st.one_of(_good_dict, _json), max_size=3)),
       cap=st.one_of(st.integers(-5, 1 << 62), st.text(max_size=5), st.floats(allow_nan=False),
                     st.binary(max_size=4)))
@pytest.mark.slow
def test_any_stored_value_reads_back_valid_or_not_at_all(value, cap):
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "c.sqlite"
        with BenchmarkCache(path) as c:
            c.put(BE, P, Direction.FORWARD, GOOD, 1 << 30)
        _tamper(path, json.dumps(value), cap)
        cache = BenchmarkCache(path)
        got, warned = _caught(cache.get, BE, P, Direction.FORWARD, 0)
        if got is None:
            assert len(warned) == 1 and len(cache) == 0
        else:
            assert not warned and all(isinstance(r, AlgoPerf) for r in got)
            assert [r.to_dict() for r in got] == [
                {"math_type": 0, "determinism": None, **v, "time_ms": float(v["time_ms"])}
                for v in value]
        cache.put(BE, P, Direction.FORWARD, GOOD[:1], None)  # never stuck
        assert cache.get(BE, P, Direction.FORWARD, None) == GOOD[:1]
        cache.close()


def test_put_refuses_what_get_would_drop(tmp_path):
    cache = BenchmarkCache(tmp_path / "c.sqlite")
    cache.put(BE, P, Direction.FORWARD, [AlgoPerf(1, float("nan"), 0)], 0)
    cache.put(BE, P, Direction.BACKWARD_DATA, [AlgoPerf(None, 1.0, 0)], 0)
    assert len(cache) == 0


# -- the cache= argument and the default caches -------------------------------------------------
@pytest.mark.parametrize("bad", [0, 1, 1.5, b"", object(), ["x.sqlite"]])
def test_cache_argument_must_be_a_path_or_a_cache(bad):
    with pytest.raises(TypeError, match=r"cache: expected None .*False.*path.*BenchmarkCache"):
        resolve_cache(bad)
    with pytest.raises(CacheArgumentError, match="cache"):
        mu.optimize(P, Direction.FORWARD, 1 << 20, "undivided", backend="numpy", cache=bad)
    assert issubclass(CacheArgumentError, MucudnnError)


def test_cache_argument_empty_path():
    with pytest.raises(ValueError, match="cache: .*empty"):
        resolve_cache("  ")


def test_cache_argument_accepts_paths_and_off(tmp_path):
    assert resolve_cache(pathlib.Path(tmp_path / "a.sqlite")).path == tmp_path / "a.sqlite"
    assert resolve_cache(str(tmp_path / "b.sqlite")).path == tmp_path / "b.sqlite"
    assert not resolve_cache("off").enabled and not resolve_cache(False).enabled
    c = BenchmarkCache(tmp_path / "c.sqlite")
    assert resolve_cache(c) is c


def test_default_caches_are_bounded_and_closed(tmp_path, monkeypatch):
    (lru,) = [c for c in live_caches() if c.name == "optimizer.default_caches"]
    opened = []
    for i in range(lru.maxsize + 3):
        monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / f"{i}.sqlite"))
        c = resolve_cache(None)
        assert resolve_cache(None) is c
        c.put(BE, P, Direction.FORWARD, GOOD, 0)
        opened.append(c)
        assert len(lru) <= lru.maxsize
    assert lru.maxsize <= 8
    evicted = [c for c in opened if c not in lru.values()]
    assert len(evicted) >= 3 and all(c._conn is None for c in evicted)
    assert evicted[0].get(BE, P, Direction.FORWARD) == GOOD  # still usable, reopens
    evicted[0].close()


# -- several writers ---------------------------------------------------------------------------
def _writer(path: str, worker: int, n: int) -> None:
    warnings.simplefilter("error", CacheWarning)
    cache = BenchmarkCache(path)
    for i in range(n):
        cache.put(BE, _problem(100 + worker * n + i), Direction.FORWARD,
                  [AlgoPerf(worker, float(i), 0)], 1 << 20)            # its own keys
        cache.put(BE, _problem(i), Direction.FORWARD,
                  [AlgoPerf(worker, float(worker), 0)], worker << 20)  # everyone's keys
    cache.close()


@pytest.mark.slow
def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    n, workers = 12, 4
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        pool.starmap(_writer, [(path, w, n) for w in range(workers)])
    cache = BenchmarkCache(path)
    assert len(cache) == n * workers + n
    for w in range(workers):
        for i in range(n):
            assert cache.get(BE, _problem(100 + w * n + i), "forward", 0) == [
                AlgoPerf(w, float(i), 0)]
    for i in range(n):  # the largest cap won
        assert cache.get(BE, _problem(i), "forward", 0) == [
            AlgoPerf(workers - 1, float(workers - 1), 0)]
    assert not list(tmp_path.glob("*.corrupt-*"))


def _killed_writer(path: str, conn) -> None:
    cache = BenchmarkCache(path)
    i = 0
    while True:
        cache.put(BE, _problem(i), Direction.FORWARD, [AlgoPerf(i % 5, float(i), i)], 1 << 20)
        conn.send(i)  # committed
        i += 1


@pytest.mark.slow
def test_sigkill_during_writes_keeps_every_committed_entry(tmp_path):
    path = str(tmp_path / "c.sqlite")
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_killed_writer, args=(path, send))
    proc.start()
    send.close()
    last = -1
    while last < 40:
        last = recv.recv()
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL
    while recv.poll():
        try:
            last = recv.recv()
        except EOFError:
            break
    cache, warned = _caught(BenchmarkCache, path)
    got, warned2 = _caught(lambda: [cache.get(BE, _problem(i), "forward", 0)
                                    for i in range(last + 1)])
    assert not warned and not warned2
    assert got == [[AlgoPerf(i % 5, float(i), i)] for i in range(last + 1)]
    assert len(cache) >= last + 1
    cache.put(BE, P, Direction.FORWARD, GOOD, 0)
    assert cache.get(BE, P, Direction.FORWARD) == GOOD
    assert not list(tmp_path.glob("*.corrupt-*"))


# -- entries the backend cannot run (Note [entries the backend cannot run]) ----------------------
RUN_P = ConvProblem((4, 3, 6, 6), (5, 3, 3, 3), padding=1)


def _run_forward(cache, problem=RUN_P, **kw):
    """y of a NumPy-backend forward through ``cache`` and the float64 reference's y."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(problem.x_shape).astype(np.float32)
    w = rng.standard_normal(problem.w_shape).astype(np.float32)
    conv = mu.Convolution(problem.x_shape, problem.w_shape, padding=problem.padding,
                          backend="numpy", cache=cache, **kw)
    return conv, conv.forward(x, w), reference.forward(problem, x, w)


def _seed_every_size(path, results, cap=1 << 40):
    be = get_backend("numpy")
    with BenchmarkCache(path) as c:
        for s in (4, 2, 1, 3):
            c.put(be, RUN_P.with_batch(s), Direction.FORWARD, results, cap)


@pytest.mark.parametrize("algo", ["bogus", 3, "e5;k2=0", "fold2|0"])
def test_entry_naming_an_unknown_algo_is_dropped_and_measured_again(tmp_path, algo):
    path = tmp_path / "c.sqlite"
    _seed_every_size(path, [AlgoPerf(algo, 1e-6, 0)])
    (conv, y, ref), warned = _caught(_run_forward, path)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert warned and all(str(path) in m and "measured again" in m for m in warned)
    assert all(mb.algo in set(NumpyAlgo) for mb in conv.plans[Direction.FORWARD].micro_batches)
    # the bad entries the plan came from were replaced by measurements
    be = get_backend("numpy")
    with BenchmarkCache(path) as c:
        for mb in conv.plans[Direction.FORWARD].micro_batches:
            got = c.get(be, RUN_P.with_batch(mb.size), Direction.FORWARD, 0)
            assert got and all(a.algo in set(NumpyAlgo) for a in got)
    # planning again (memo cleared) measures no size twice: the dropped ones were stored
    clear_all()
    (conv2, y2, _), warned2 = _caught(_run_forward, path)
    np.testing.assert_allclose(y2, ref, rtol=1e-4, atol=1e-4)
    assert not set(warned) & set(warned2)


def test_entry_understating_its_workspace_is_measured_again(tmp_path):
    """One imported config that claims no workspace, under a limit of 0: the
    plan needs more than the limit once bound; the entry is measured again
    instead of being excluded for good."""
    path = tmp_path / "c.sqlite"
    _seed_every_size(path, [AlgoPerf(int(NumpyAlgo.IM2COL_GEMM), 1e-6, 0)])
    (conv, y, ref), warned = _caught(lambda: _run_forward(path, workspace_limit=0))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    plan = conv.plans[Direction.FORWARD]
    assert plan.workspace_bytes == 0
    assert all(mb.algo != NumpyAlgo.IM2COL_GEMM for mb in plan.micro_batches)
    assert any("needs" in m and str(path) in m for m in warned)


def test_unknown_algo_in_a_gzipped_cache_is_ignored(tmp_path):
    path = tmp_path / "c.sqlite"
    _seed_every_size(path, [AlgoPerf("bogus", 1e-6, 0)])
    gz = tmp_path / "c.sqlite.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    (conv, y, ref), warned = _caught(_run_forward, gz)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert any(str(gz) in m and "bogus" in m for m in warned)


def test_forced_plan_with_an_unknown_algo_falls_back_before_running(tmp_path):
    plan = make_plan([MicroBatch(0, 4, 42)], undivided_time_ms=1.0, workspace_limit=0,
                     problem=RUN_P, direction="forward")
    with pytest.warns(FallbackWarning, match=r"plans\[forward\].*42"):
        conv, y, ref = _run_forward(False, plans={"forward": plan})
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert all(mb.algo in set(NumpyAlgo) for mb in conv.plans[Direction.FORWARD].micro_batches)


# -- path texts no file can have, and folders (MUCUDNN_CACHE and cache=) -------------------------
@pytest.mark.parametrize("value, shown", [("~nosuchuser-mucudnn/c.sqlite", "cannot expand '~'"),
                                          ("c\0.sqlite", "NUL"),
                                          ("/tmp/a\0b/c.sqlite", "NUL")])
def test_cache_path_no_file_can_have_names_the_variable(monkeypatch, value, shown):
    if "\0" not in value:  # an environment variable cannot hold a NUL
        monkeypatch.setenv("MUCUDNN_CACHE", value)
        with pytest.raises(CacheFileError) as info:
            mu.optimizer.cache.default_cache_path()
        text = str(info.value)
        assert text.startswith(f"MUCUDNN_CACHE={value!r}: ") and shown in text
        assert info.value.variable == "MUCUDNN_CACHE"
        with pytest.raises(CacheFileError, match="MUCUDNN_CACHE"):
            mu.Convolution((2, 3, 5, 5), (4, 3, 3, 3), backend="numpy")
    with pytest.raises(CacheFileError) as info:
        BenchmarkCache(value, _name="cache")
    assert str(info.value).startswith(f"cache: {value!r}: ") and shown in str(info.value)
    assert isinstance(info.value, MucudnnError) and isinstance(info.value, OSError)
    with pytest.raises(CacheFileError, match=r"^cache: "):
        resolve_cache(value)


def test_cache_path_with_a_trailing_slash_is_a_folder(tmp_path, monkeypatch):
    """``MUCUDNN_CACHE=newdir/`` means newdir/benchmarks.sqlite (README's table),
    never a file named newdir."""
    folder = tmp_path / "newdir"
    monkeypatch.setenv("MUCUDNN_CACHE", f"{folder}/")
    path = mu.optimizer.cache.default_cache_path()
    assert path == folder / "benchmarks.sqlite"
    with BenchmarkCache() as c:
        c.put(BE, P, Direction.FORWARD, GOOD, 1 << 30)
        assert c.get(BE, P, Direction.FORWARD) == GOOD
    assert folder.is_dir() and (folder / "benchmarks.sqlite").is_file()
    assert BenchmarkCache(f"{folder}/").path == folder / "benchmarks.sqlite"
    # without the slash, an existing folder is still refused, naming it
    with pytest.raises(CacheFileError, match="is a directory"):
        BenchmarkCache(folder).get(BE, P, Direction.FORWARD)


def test_entries_without_results_are_measured_again(tmp_path):
    """An imported entry listing no configuration at every size would leave no plan."""
    path = tmp_path / "c.sqlite"
    _seed_every_size(path, [])
    conv, y, ref = _run_forward(path, workspace_limit=None)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert all(mb.algo in set(NumpyAlgo) for mb in conv.plans[Direction.FORWARD].micro_batches)
