"""Benchmarking on several devices (Note [benchmarking on several devices] in
mucudnn/optimizer/spread.py), on the CPU: the NumPy backend and the fakes of
spread_support, one host worker process per ``devices`` entry.

Worker pools start Python processes (about a second each here), so examples
are few and each pool benchmarks many problems at once.
"""

from __future__ import annotations

import functools
import json
import logging
import multiprocessing
import os
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mucudnn.__main__ as cli
from mucudnn.backends import NumpyBackend
from mucudnn.errors import InvalidTypeError, InvalidValueError, UnsupportedConfigError
from mucudnn.optimizer import (BenchmarkCache, benchmark, benchmark_many, check_devices,
                               optimize, optimize_kernels, optimize_network)
from mucudnn.optimizer.api import plan_jointly
from mucudnn.optimizer import options
from mucudnn.optimizer.spread import run as spread_run
from mucudnn.problem import ConvProblem, Direction
from spread_support import LOG, MEET, DeviceFake, Failing, FakeBackend, named_by_device

DIRS = list(Direction)
LAYERS = {
    "a": ConvProblem((16, 3, 12, 12), (8, 3, 3, 3), padding=1),
    "b": ConvProblem((16, 8, 12, 12), (8, 8, 3, 3), padding=1),
    "c": ConvProblem((16, 8, 6, 6), (16, 8, 1, 1), stride=2),
    "a_again": ConvProblem((16, 3, 12, 12), (8, 3, 3, 3), padding=1),   # a repeated layer
}


def _no_children():
    assert multiprocessing.active_children() == []


def _shape(perf):
    """What does not depend on timing: sizes, and each size's algorithms with
    their workspaces."""
    return {s: sorted((a.algo, a.workspace_bytes) for a in v) for s, v in perf.items()}


# -- arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize("devices,error,match", [
    ([], InvalidValueError, "empty"),
    ([-1], InvalidValueError, ">= 0"),
    ([0, 0], InvalidValueError, "repeated: 0"),
    ([1, 0, 1], InvalidValueError, "repeated: 1"),
    ("0,1", InvalidTypeError, "sequence of CUDA device ordinals"),
    (0, InvalidTypeError, "sequence"),
    ({0, 1}, InvalidTypeError, "sequence"),
    ([0, True], InvalidTypeError, "True"),
    ([0.0], InvalidTypeError, "0.0"),
])
def test_devices_are_checked_before_any_work(devices, error, match):
    with pytest.raises(error, match=match) as e:
        check_devices(devices)
    assert str(e.value).startswith("devices: ")
    # a Failing backend would raise if anything were benchmarked
    with pytest.raises(error, match=match):
        benchmark_many([(LAYERS["a"], "forward")], "powerOfTwo", 1 << 20, Failing, False,
                       devices=devices)
    with pytest.raises(error, match=match):
        optimize_network({"a": LAYERS["a"]}, 1 << 20, backend=Failing, cache=False,
                         devices=devices)
    assert check_devices(range(2)) == (0, 1)


@pytest.mark.parametrize("backend,error,match", [
    (NumpyBackend(), InvalidTypeError, "instance"),
    (FakeBackend(), InvalidTypeError, "factory"),
    (lambda device: FakeBackend(), InvalidTypeError, "picklable"),
    ("tpu", InvalidValueError, "backend: expected one of"),
    (3, InvalidTypeError, "backend"),
])
def test_backend_with_devices_is_a_name_none_or_a_picklable_factory(backend, error, match):
    with pytest.raises(error, match=match) as e:
        benchmark_many([(LAYERS["a"], "forward")], "powerOfTwo", 1 << 20, backend, False,
                       devices=[0])
    assert str(e.value).startswith("backend: ")


def test_other_arguments_are_checked_before_any_work():
    for kw, match in [({"retime": -1}, "retime"), ({"deterministic": 1}, "deterministic")]:
        with pytest.raises((TypeError, ValueError), match=match):
            benchmark_many([(LAYERS["a"], "forward")], "powerOfTwo", 1 << 20, Failing, False,
                           devices=[0], **kw)
    with pytest.raises(ValueError, match="workspace_cap"):
        benchmark_many([(LAYERS["a"], "forward")], "powerOfTwo", -1, Failing, devices=[0])
    with pytest.raises(ValueError):
        benchmark_many([(LAYERS["a"], "forward")], "sideways", 1 << 20, Failing, devices=[0])
    with pytest.raises(TypeError, match="tasks"):
        benchmark_many([LAYERS["a"]], "powerOfTwo", 1 << 20, Failing, devices=[0])
    assert benchmark_many([], "powerOfTwo", 1 << 20, Failing, devices=[0, 1]) == []


def test_a_gpu_backend_name_checks_the_ordinals_first(monkeypatch):
    monkeypatch.setattr(options, "device_count", lambda: 2)
    with pytest.raises(InvalidValueError, match=r"has 2 CUDA devices \(ordinals 0..1\)"):
        benchmark_many([(LAYERS["a"], "forward")], "powerOfTwo", 1 << 20, "cudnn-graph",
                       devices=[0, 2])
    from mucudnn.backends import CudnnGraphBackend
    with pytest.raises(InvalidValueError, match="has 2 CUDA devices"):
        benchmark_many([(LAYERS["a"], "forward")], "powerOfTwo", 1 << 20,
                       functools.partial(CudnnGraphBackend, find_top_k=4), devices=[5])


# -- what the workers measure ------------------------------------------------------------------
problems = st.builds(
    lambda n, c, k, hw, r: ConvProblem((n, c, hw, hw), (k, c, r, r), padding=r // 2),
    st.integers(1, 6), st.integers(1, 4), st.integers(1, 4), st.integers(3, 7),
    st.sampled_from([1, 3]))


@settings(max_examples=3, deadline=None)
@given(st.lists(st.tuples(problems, st.sampled_from(DIRS)), min_size=1, max_size=8),
       st.sampled_from([0, 1 << 10, 1 << 20]))
def test_numpy_on_two_host_workers_finds_what_one_process_finds(tasks, cap):
    """The same sizes, algorithms and workspaces per task as benchmark() in
    this process (times are measured, so they differ), repeats included."""
    tasks = tasks + tasks[:1]
    spread = benchmark_many(tasks, "powerOfTwo", cap, "numpy", cache=False, devices=[0, 1])
    assert len(spread) == len(tasks) and spread[-1] is spread[0]
    here = NumpyBackend()
    for (p, d), got in zip(tasks, spread):
        want = benchmark(here, p, d, "powerOfTwo", cap, cache=False, progress=False)
        assert list(got) == list(want) and _shape(got) == _shape(want)
    _no_children()


def test_in_process_path_is_benchmark_per_distinct_task(tmp_path):
    tasks = [(p, d) for p in LAYERS.values() for d in DIRS]
    got = benchmark_many(tasks, "powerOfTwo", 1 << 20, FakeBackend(), tmp_path / "c.sqlite")
    for (p, d), perf in zip(tasks, got):
        assert perf == benchmark(FakeBackend(), p, d, "powerOfTwo", 1 << 20, cache=False,
                                 progress=False)
    assert got[0] is got[-3]   # "a_again" forward is "a" forward


@pytest.mark.slow
def test_plans_on_two_workers_are_the_plans_of_one_process(tmp_path, caplog):
    """With a deterministic backend every entry point plans exactly as without
    devices: the measurements are the same, only where they are made differs."""
    caplog.set_level(logging.INFO, logger="mucudnn")
    limit, total = 600, 3000
    seq = optimize_network(LAYERS, total, backend=FakeBackend(), cache=False)
    par = optimize_network(LAYERS, total, backend=FakeBackend, cache=tmp_path / "c.sqlite",
                           devices=[0, 1])
    assert par == seq and list(par) == list(seq)
    assert {p.extra["backend"] for p in par.values()} == {"fake-spread"}
    assert any(len(p.micro_batches) > 1 for p in par.values())   # the budget splits some
    workers = [r.getMessage() for r in caplog.records if "benchmark host worker" in r.getMessage()]
    assert 1 <= len(workers) <= 2 and all("kernels" in w for w in workers)
    kernels = {(n, d): (p, d) for n, p in LAYERS.items() for d in DIRS}
    wr_seq = optimize_kernels(kernels, limit, backend=FakeBackend(), cache=False)
    wr_par = optimize_kernels(kernels, limit, backend=FakeBackend, cache=False, devices=[1, 0])
    assert wr_par == wr_seq
    # See Note [size pruning]: a warm descent goes as far as the cache holds sizes,
    # so compare warm with warm: the cache filled above holds every size
    warm = tmp_path / "c.sqlite"
    assert optimize_kernels(kernels, limit, backend=FakeBackend, cache=warm, devices=[0, 1]) \
        == optimize_kernels(kernels, limit, backend=FakeBackend(), cache=warm)
    assert wr_par["a", Direction.FORWARD] is wr_par["a_again", Direction.FORWARD]
    for (n, d), plan in wr_seq.items():
        assert plan == optimize(LAYERS[n], d, limit, backend=FakeBackend(), cache=False)
    jointly = plan_jointly(kernels, total, backend=FakeBackend, cache=False, devices=[0, 1])
    assert jointly == plan_jointly(kernels, total, backend=FakeBackend(), cache=False)
    _no_children()


@pytest.mark.parametrize("benchmark_cap", [None, 1 << 20])
def test_one_kernel_on_devices(tmp_path, monkeypatch, benchmark_cap):
    """optimize(devices=): pruned (no benchmark_cap) in one worker; otherwise
    its sizes spread, each benchmarked once, as the same cache entries."""
    log = tmp_path / "finds.log"
    monkeypatch.setenv(LOG, str(log))
    p = ConvProblem((64, 8, 12, 12), (8, 8, 3, 3), padding=1)
    store = BenchmarkCache(tmp_path / "c.sqlite")
    plan = optimize(p, "backward_filter", 1000, backend=FakeBackend, cache=store,
                    benchmark_cap=benchmark_cap, devices=[0, 1])
    lines = [line.split("\t") for line in log.read_text().splitlines()]
    monkeypatch.delenv(LOG)
    want = optimize(p, "backward_filter", 1000, backend=FakeBackend(), cache=False,
                    benchmark_cap=benchmark_cap)
    assert plan == want and plan.problem == p
    keys = [(k, d) for _pid, k, d in lines]
    assert len(keys) == len(set(keys)) == len(store)
    pruned = benchmark(FakeBackend(), p, "bwd_filter", "fitted", 1000, cache=False,
                       prune_sizes=True)
    assert len(keys) == (len(pruned) if benchmark_cap is None else 7)
    if benchmark_cap is None:
        assert len({pid for pid, _k, _d in lines}) == 1


@pytest.mark.slow
def test_each_distinct_kernel_is_benchmarked_once_into_the_one_cache(tmp_path, monkeypatch):
    log, meet = tmp_path / "finds.log", tmp_path / "meet"
    meet.mkdir()
    monkeypatch.setenv(LOG, str(log))
    monkeypatch.setenv(MEET, str(meet))   # both workers must call find()
    path = tmp_path / "c.sqlite"
    tasks = [(p, d) for p in LAYERS.values() for d in DIRS]
    res = spread_run(tasks, "powerOfTwo", 1 << 20, functools.partial(DeviceFake), path,
                     devices=[0, 1])
    lines = [line.split("\t") for line in log.read_text().splitlines()]
    measured = [(k, d) for _pid, k, d in lines]
    assert len(measured) == len(set(measured)) == 9 * 5     # 3 distinct layers x 3 x 5 sizes
    assert len({pid for pid, _k, _d in lines}) == 2          # both workers took part
    assert str(os.getpid()) in {pid for pid, _k, _d in lines}   # this process is one of them
    assert sorted(res.per_device) == [0, 1]
    assert sum(n for n, _s in res.per_device.values()) == 9
    assert res.identity == ("fake-spread", "Fake GPU", "1")
    con = sqlite3.connect(path)
    rows = con.execute("SELECT problem, direction FROM benchmarks").fetchall()
    con.close()
    assert sorted(rows) == sorted(set(measured))
    # a second call is answered by the cache, in the workers too
    log.unlink()
    again = benchmark_many(tasks, "powerOfTwo", 1 << 20, functools.partial(DeviceFake), path,
                           devices=[0, 1])
    assert again == res.perfs and not log.exists()
    _no_children()


def test_workers_on_different_devices_are_refused(tmp_path, monkeypatch):
    meet = tmp_path / "meet"
    meet.mkdir()
    monkeypatch.setenv(MEET, str(meet))
    tasks = [(p, d) for p in LAYERS.values() for d in DIRS]
    with pytest.raises(ValueError, match=r"devices: the workers on devices \[0, 1\]") as e:
        benchmark_many(tasks, "powerOfTwo", 1 << 20, named_by_device, False, devices=[0, 1])
    assert "Fake GPU model 0" in str(e.value) and "Fake GPU model 1" in str(e.value)
    _no_children()


def test_a_worker_error_comes_back_with_its_type_and_no_process_is_left():
    tasks = [(p, d) for p in LAYERS.values() for d in DIRS]
    with pytest.raises(UnsupportedConfigError, match="cannot run") as e:
        benchmark_many(tasks, "powerOfTwo", 1 << 20, Failing, False, devices=[0, 1])
    assert e.value.algo == 3
    _no_children()


def test_no_cache_results_come_back_through_the_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "default.sqlite"))
    tasks = [(p, d) for p in LAYERS.values() for d in DIRS]
    got = benchmark_many(tasks, "powerOfTwo", 1 << 20, FakeBackend, cache=False, devices=[0, 1])
    assert got == benchmark_many(tasks, "powerOfTwo", 1 << 20, FakeBackend(), cache=False)
    assert not (tmp_path / "default.sqlite").exists()


# -- the command line --------------------------------------------------------------------------
def test_cli_parses_devices(capsys):
    assert cli.parse_devices("0,1") == [0, 1] and cli.parse_devices(" 3 ") == [3]
    for bad in ("", "x", "0,", "0,0", "-1", "1.5"):
        with pytest.raises(cli.CommandLineError, match="argument --devices"):
            cli.parse_devices(bad)
    base = ["--net", "alexnet", "--backend", "numpy", "--batch", "2", "--layers", "conv5",
            "--no-progress"]
    for command in ("bench", "optimize"):
        with pytest.raises(SystemExit) as e:
            cli.main([command, *base, "--devices", "0,zero"])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"python -m mucudnn {command}: error: "
                                                   "argument --devices")
    with pytest.raises(SystemExit):
        cli.main(["optimize", "--net", "alexnet", "--offline", "--devices", "0"])
    assert "--offline" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["plot", *base, "--devices", "0"])   # plot benchmarks in this process


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["wr", "wd"])
def test_cli_optimize_on_devices_plans_as_without(tmp_path, tmp_cache, capsys, mode):
    """The first run fills the cache; the run with --devices reads the same
    measurements in its workers, so it prints the same plans."""
    argv = ["optimize", "--net", "alexnet", "--backend", "numpy", "--batch", "2", "--layers",
            "conv4,conv5", "--workspace", "64KiB", "--mode", mode, "--no-progress"]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert cli.main([*argv, "--json", str(one)]) == 0
    assert cli.main([*argv, "--json", str(two), "--devices", "0,1"]) == 0
    strip = [{k: v for k, v in p.items() if k != "extra"} for p in json.loads(one.read_text())]
    assert strip == [{k: v for k, v in p.items() if k != "extra"}
                     for p in json.loads(two.read_text())]
    _no_children()


def test_cli_bench_on_devices(tmp_path, tmp_cache, capsys):
    out = tmp_path / "r.json"
    rc = cli.main(["bench", "--net", "alexnet", "--backend", "numpy", "--batch", "2",
                   "--layers", "conv5", "--directions", "forward", "--repeat", "1",
                   "--no-progress", "--devices", "1,0", "--json", str(out)])
    assert rc == 0
    assert "on devices 1,0" in capsys.readouterr().out
    data = json.loads(out.read_text())[0]
    assert data["devices"] == [1, 0] and len(data["kernels"]) == 1
    assert os.path.exists(tmp_cache)
    _no_children()


# -- on a GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_one_device_worker_measures_what_this_process_measures(tmp_path):
    """devices=[0] on cudnn-graph: a worker on device 0 gives the same sizes
    and the same key (backend, device, version) as this process's backend."""
    from mucudnn.backends import get_backend
    p = ConvProblem((8, 16, 14, 14), (16, 16, 3, 3), padding=1)
    res = spread_run([(p, "forward")], "powerOfTwo", 64 << 20, "cudnn-graph",
                     tmp_path / "c.sqlite", devices=[0])
    be = get_backend("cudnn-graph", device=0)
    assert res.identity == (be.name, be.device_name, be.version)
    here = benchmark(be, p, "forward", "powerOfTwo", 64 << 20, cache=tmp_path / "c.sqlite",
                     progress=False)
    assert list(here) == list(res.perfs[0]) == [8, 4, 2, 1]
    assert here == res.perfs[0]   # answered from the entries the worker stored
    _no_children()


def test_cli_names_a_device_this_machine_lacks(monkeypatch, capsys):
    """--devices naming an ordinal past the machine's devices: the one check of
    the optimizer (check_ordinals), reported as the --devices argument's error
    before any device work."""
    monkeypatch.setattr(cli, "device_count", lambda: 2)
    monkeypatch.setattr(options, "device_count", lambda: 2)
    with pytest.raises(SystemExit) as e:
        cli.main(["optimize", "--net", "alexnet", "--backend", "cudnn-graph", "--batch", "2",
                  "--layers", "conv5", "--devices", "0,2", "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m mucudnn optimize: error: argument --devices: this machine has 2 "
                   "CUDA devices (ordinals 0..1), got [0, 2]"]
