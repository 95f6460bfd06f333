"""Offline optimisation from a benchmark cache measured elsewhere (the real H200 cache)."""

import gzip
import shutil

import pytest

import mucudnn as mu
from mucudnn.__main__ import main
from mucudnn.optimizer.offline import CachedBackend, CacheMissError
from mucudnn.networks import network
from mucudnn.optimizer import BenchmarkCache, optimize_wr
from mucudnn.problem import AlgoPerf, Direction

from conftest import DATA


@pytest.fixture
def h200_cache(tmp_path, monkeypatch):
    """The cache filled on the H200 (cuDNN 9.19) by docs/BENCHMARKS.md's runs."""
    path = tmp_path / "h200.sqlite"
    with gzip.open(DATA / "h200-benchmark-cache.sqlite.gz") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    monkeypatch.setenv("MUCUDNN_CACHE", str(path))
    return path


def test_offline_plans_from_real_h200_measurements(h200_cache):
    be = CachedBackend("cudnn")
    assert (be.name, be.device_name, be.version) == ("cudnn", "NVIDIA H200", "9.19.0")
    p = network("alexnet", 256)["conv2"]
    plan = mu.optimize(p, Direction.FORWARD, 64 << 20, "powerOfTwo", backend=be)
    assert plan.workspace_bytes <= 64 << 20
    assert sum(m.size for m in plan.micro_batches) == 256
    # cuDNN alone under 64 MiB takes ~10 ms here; the split plan several times less
    assert plan.speedup > 3
    # the same answer as WR on the cached table read directly
    cache = BenchmarkCache(h200_cache)
    perf = {s: cache.get(be, p.with_batch(s), Direction.FORWARD, 64 << 20)
            for s in (256, 128, 64, 32, 16, 8, 4, 2, 1)}
    assert plan.time_ms == pytest.approx(optimize_wr(perf, 256, 64 << 20, "powerOfTwo").time_ms)


def test_offline_wd_for_a_whole_network(h200_cache):
    be = CachedBackend("cudnn-graph")
    probs = network("resnet18", 128)
    plans = mu.optimize_network(probs, 20 * 3 * (64 << 20), backend=be, progress=False)
    assert len(plans) == 60
    assert sum(p.workspace_bytes for p in plans.values()) <= 20 * 3 * (64 << 20)


def test_misses_and_ambiguity(h200_cache, tmp_path):
    be = CachedBackend("cudnn")
    p = network("alexnet", 3)["conv2"]  # batch 3 was never measured
    with pytest.raises(CacheMissError, match="never measured"):
        mu.optimize(p, Direction.FORWARD, 64 << 20, "powerOfTwo", backend=be)
    with pytest.raises(NotImplementedError, match="cannot execute"):
        be.alloc_workspace(16)
    with pytest.raises(ValueError, match="no measurements"):
        CachedBackend("cudnn", device_name="NVIDIA B200")
    other = BenchmarkCache(tmp_path / "two.sqlite")
    q = network("alexnet", 1)["conv5"]
    for dev in ("GPU A", "GPU B"):
        other.put(("cudnn", dev, "9.19.0"), q, Direction.FORWARD, [AlgoPerf(0, 1.0, 0)], 1 << 40)
    with pytest.raises(ValueError, match="several devices"):
        CachedBackend("cudnn", cache=other)
    assert CachedBackend("cudnn", device_name="GPU B", cache=other).device_name == "GPU B"


def test_cli_offline(h200_cache, capsys, tmp_path):
    assert main(["optimize", "--net", "alexnet", "--offline", "--backend", "cudnn",
                 "--layers", "conv5", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "offline: plans from cached measurements of cudnn on NVIDIA H200" in out
    assert "conv5" in out and "2 x 128" in out
    with pytest.raises(SystemExit) as e:  # bench executes plans: it offers no --offline
        main(["bench", "--net", "alexnet", "--offline"])
    assert e.value.code == 2
    assert "unrecognized arguments: --offline" in capsys.readouterr().err


def test_a_cache_from_an_earlier_default_search_is_replayed(tmp_path):
    """A cache made while the graph backend's default search was another
    (``cudnn-graph+parity``, before held timing) still replays offline, before
    the bare name's entries; the current default's entries come first."""
    q = network("alexnet", 1)["conv5"]
    cache = BenchmarkCache(tmp_path / "old.sqlite")
    for name, ms in (("cudnn-graph", 3.0), ("cudnn-graph+parity", 2.0)):
        cache.put((name, "NVIDIA H200", "9.19.0"), q, Direction.FORWARD, [AlgoPerf(0, ms, 0)],
                  1 << 40)
    be = CachedBackend("cudnn-graph", cache=cache)
    assert be.name == "cudnn-graph+parity"
    assert [r.time_ms for r in cache.get(be, q, Direction.FORWARD, 1 << 40)] == [2.0]
    cache.put(("cudnn-graph+parity+hold", "NVIDIA H200", "9.19.0"), q, Direction.FORWARD,
              [AlgoPerf(0, 1.0, 0)], 1 << 40)
    be = CachedBackend("cudnn-graph", cache=cache)
    assert be.name == "cudnn-graph+parity+hold"
    assert [r.time_ms for r in cache.get(be, q, Direction.FORWARD, 1 << 40)] == [1.0]
