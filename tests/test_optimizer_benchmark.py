"""benchmark() with a counting fake backend, and optimize()/optimize_network() end to end."""

from __future__ import annotations

import logging
import statistics

import numpy as np
import pytest

from mucudnn.backends.base import ConvTensors
from mucudnn.optimizer import (BenchmarkCache, batch_sizes, benchmark, optimize, optimize_wr,
                               optimize_network)
from mucudnn.problem import AlgoPerf, ConvProblem, Direction

P = ConvProblem((32, 4, 6, 6), (4, 4, 3, 3), padding=1)


class CountingBackend:
    """Fake Find: algo 0 needs no workspace and is slow; algo 1 needs 100 B per sample."""

    name = "counting"
    device_name = "Fake"
    version = "0"

    def __init__(self, noise=None):
        self.calls = []
        self.noise = list(noise or [])

    def find(self, problem, direction, workspace_limit):
        self.calls.append((problem.batch, direction, workspace_limit))
        n = problem.batch
        jitter = self.noise.pop(0) if self.noise else 0.0
        out = [AlgoPerf(0, 1.0 * n, 0), AlgoPerf(1, 0.1 * n + 0.05 + jitter, 100 * n),
               AlgoPerf(2, 0.2 * n + 0.05, 10 * n)]
        return sorted((r for r in out if r.workspace_bytes <= workspace_limit),
                      key=lambda r: r.time_ms)


@pytest.fixture
def cache(tmp_path):
    c = BenchmarkCache(tmp_path / "bench.sqlite")
    yield c
    c.close()


def test_sizes_largest_first_and_warm_cache_does_no_work(cache):
    be = CountingBackend()
    perf = benchmark(be, P, Direction.FORWARD, "powerOfTwo", 10_000, cache=cache, progress=False)
    assert [c[0] for c in be.calls] == batch_sizes("powerOfTwo", 32) == [32, 16, 8, 4, 2, 1]
    assert all(c[1] is Direction.FORWARD and c[2] == 10_000 for c in be.calls)
    assert list(perf) == [32, 16, 8, 4, 2, 1]
    assert {a.algo for a in perf[32]} == {0, 1, 2}  # every algorithm kept, with its workspace
    assert perf[32][0].workspace_bytes == 3200
    warm = CountingBackend()
    again = benchmark(warm, P, "fwd", "powerOfTwo", 10_000, cache=cache, progress=False)
    assert warm.calls == []
    assert again == perf
    # A smaller cap is served from the cache, filtered; a larger one re-benchmarks.
    small = benchmark(warm, P, "fwd", "powerOfTwo", 500, cache=cache, progress=False)
    assert warm.calls == []
    assert all(a.workspace_bytes <= 500 for v in small.values() for a in v)
    assert {a.algo for a in small[32]} == {0, 2}
    benchmark(warm, P, "fwd", "powerOfTwo", 20_000, cache=cache, progress=False)
    assert len(warm.calls) == 6
    # Another direction is another key.
    benchmark(warm, P, "bwd_data", "undivided", 20_000, cache=cache, progress=False)
    assert warm.calls[-1] == (32, Direction.BACKWARD_DATA, 20_000)


def test_no_cache(tmp_path):
    be = CountingBackend()
    for _ in range(2):
        benchmark(be, P, "fwd", "undivided", 10_000, cache=False, progress=False)
    assert len(be.calls) == 2


def test_retime_takes_the_median(cache):
    # 1 first find + 4 repeats for size 32 only ("undivided").
    noise = [0.9, 0.0, 0.5, 0.1, 0.2]
    be = CountingBackend(noise=noise)
    perf = benchmark(be, P, "fwd", "undivided", 10_000, cache=cache, retime=1, repeats=4,
                     progress=False)
    assert len(be.calls) == 5
    a1 = next(a for a in perf[32] if a.algo == 1)
    assert a1.time_ms == pytest.approx(0.1 * 32 + 0.05 + statistics.median(noise))
    # The re-timed result is what the cache keeps.
    warm = CountingBackend()
    assert benchmark(warm, P, "fwd", "undivided", 10_000, cache=cache, progress=False) == perf
    assert warm.calls == []


def test_progress_bar(cache, capsys):
    be = CountingBackend()
    benchmark(be, P.with_batch(12), "fwd", "all", 10_000, cache=cache, progress=True)
    assert "mucudnn benchmark" in capsys.readouterr().err
    benchmark(be, P.with_batch(11), "fwd", "all", 10_000, cache=cache, progress=False)
    assert capsys.readouterr().err == ""


def test_bad_arguments_do_no_work(cache):
    be = CountingBackend()
    with pytest.raises(ValueError, match="policy"):
        benchmark(be, P, "fwd", "everything", 10, cache=cache)
    with pytest.raises(ValueError, match="workspace_cap"):
        benchmark(be, P, "fwd", "all", -1, cache=cache)
    with pytest.raises(ValueError, match="direction"):
        benchmark(be, P, "sideways", "all", 10, cache=cache)
    with pytest.raises(ValueError, match="policy"):
        optimize(P, "fwd", 10, "everything", backend=be, cache=cache)
    assert be.calls == []


def test_optimize_with_fake_backend(cache, caplog):
    be = CountingBackend()
    with caplog.at_level(logging.INFO, logger="mucudnn"):
        plan = optimize(P, Direction.FORWARD, workspace_limit=800, policy="powerOfTwo",
                        backend=be, cache=cache)
    # algo 1 at size 8 (800 B, 0.85 ms each) x 4 beats everything else under 800 B.
    assert plan.describe() == "4 x 8"
    assert {m.algo for m in plan.micro_batches} == {1}
    assert plan.problem == P and plan.direction is Direction.FORWARD
    assert plan.workspace_bytes == 800 and plan.workspace_limit == 800
    assert plan.time_ms == pytest.approx(4 * 0.85)
    assert plan.undivided_time_ms == pytest.approx(6.45)  # algo 2 at 32: 320 B
    text = caplog.text
    assert "4 x 8, algo 1" in text and "predicted 3.400 ms" in text
    assert "1.90x over undivided" in text and "workspace" in text and "benchmark" in text
    n = len(be.calls)
    optimize(P, Direction.FORWARD, workspace_limit=800, policy="powerOfTwo", backend=be,
             cache=cache)
    assert len(be.calls) == n
    with pytest.raises(ValueError, match="no plan"):
        optimize(P, "fwd", workspace_limit=0, policy="undivided",
                 backend=_NoZero(), cache=cache)


class _NoZero(CountingBackend):
    name = "nozero"

    def find(self, problem, direction, workspace_limit):
        return [a for a in super().find(problem, direction, 1 << 40) if a.workspace_bytes > 0
                and a.workspace_bytes <= workspace_limit]


def test_optimize_network_with_fake_backend(cache):
    be = CountingBackend()
    layers = {"a": P, "b": P.with_batch(16)}
    plans = optimize_network(layers, total_workspace=2000, policy="powerOfTwo", backend=be,
                             cache=cache)
    assert set(plans) == {(n, d) for n in layers for d in Direction}
    assert sum(p.workspace_bytes for p in plans.values()) <= 2000
    for (name, d), p in plans.items():
        assert p.problem == layers[name] and p.direction is d and p.batch == layers[name].batch
    # Unlimited budget: every kernel takes its fastest plan.
    big = optimize_network(layers, total_workspace=1 << 30, directions=["fwd"],
                           policy="powerOfTwo", backend=be, cache=cache)
    assert set(big) == {("a", Direction.FORWARD), ("b", Direction.FORWARD)}
    assert big[("a", Direction.FORWARD)].time_ms == pytest.approx(0.1 * 32 + 0.05)
    with pytest.raises(ValueError, match="no plan|infeasible"):
        optimize_network(layers, 10, policy="undivided", backend=_NoZero(), cache=cache)


def test_planners_keep_offsets_on_the_alignment_quantum(cache):
    """A sample of x spans 3 x 7 x 7 x 4 = 588 bytes (4 mod 16), so offsets must be
    multiples of 4 samples; under 700 B, algo 1 fits sizes up to 7 and the
    unconstrained best (7 + 7 + 7 + 7 + 2) would put micro-batches at 7, 14, 21."""
    p = ConvProblem((30, 3, 7, 7), (4, 3, 3, 3))
    assert p.batch_quantum() == 4
    be = CountingBackend()
    plan = optimize(p, Direction.FORWARD, workspace_limit=700, policy="all", backend=be,
                    cache=cache)
    # six micro-batches of 4, then the one size off the quantum (6) last
    assert [(m.offset, m.size) for m in plan.micro_batches] == \
        [(0, 4), (4, 4), (8, 4), (12, 4), (16, 4), (20, 4), (24, 6)]
    assert plan.time_ms == pytest.approx(3.0 + 7 * 0.05)
    plans = optimize_network({"a": p}, total_workspace=3 * 700, policy="all", backend=be,
                             cache=cache)
    for q in plans.values():
        assert all(m.offset % 4 == 0 for m in q.micro_batches)


# -- the real NumPy backend ------------------------------------------------------------------

class Counting:
    """Wraps a backend and counts find calls."""

    def __init__(self, inner):
        self.inner = inner
        self.name, self.device_name, self.version = inner.name, inner.device_name, inner.version
        self.finds = 0

    def find(self, *args, **kw):
        self.finds += 1
        return self.inner.find(*args, **kw)


def test_optimize_on_numpy_backend_end_to_end(cache):
    numpy_backend = pytest.importorskip("mucudnn.backends.numpy")
    inner = numpy_backend.NumpyBackend(repeats=1)
    be = Counting(inner)
    p = ConvProblem((8, 3, 7, 7), (4, 3, 3, 3), padding=1)
    im2col = numpy_backend.NumpyAlgo.IM2COL_GEMM
    limit = inner.workspace_size(p.with_batch(2), Direction.FORWARD, im2col)
    plan = optimize(p, Direction.FORWARD, workspace_limit=limit, policy="powerOfTwo",
                    backend=be, cache=cache)
    finds = be.finds  # sizes 8, 4, then 2 and 1 unless pruned (Note [size pruning])
    assert 2 <= finds <= 4
    assert plan.problem == p and plan.direction is Direction.FORWARD
    assert plan.batch == 8 and plan.workspace_bytes <= limit
    for m in plan.micro_batches:
        assert m.workspace_bytes == inner.workspace_size(p.with_batch(m.size), Direction.FORWARD,
                                                          m.algo)
    # A warm cache does no Find at all.
    again = optimize(p, Direction.FORWARD, workspace_limit=limit, policy="powerOfTwo",
                     backend=be, cache=cache)
    assert be.finds == finds and again.micro_batches == plan.micro_batches
    # Running the plan micro-batch by micro-batch gives the undivided result.
    rng = np.random.default_rng(0)
    x = rng.standard_normal(p.x_shape).astype(np.float32)
    w = rng.standard_normal(p.w_shape).astype(np.float32)
    y_ref = np.zeros(p.output_shape, np.float32)
    inner.run(Direction.FORWARD, 0, 0, ConvTensors(p, x, w, y_ref), 1.0, 0.0, None)
    y = np.zeros(p.output_shape, np.float32)
    for m in plan.micro_batches:
        q = p.with_batch(m.size)
        sl = slice(m.offset, m.offset + m.size)
        ws = inner.alloc_workspace(m.workspace_bytes) if m.workspace_bytes else None
        out = y[sl]
        inner.run(Direction.FORWARD, m.algo, m.math_type, ConvTensors(q, x[sl], w, out),
                  1.0, 0.0, ws)
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)
    # With no workspace only DIRECT (algo 0) fits.
    zero = optimize(p, Direction.BACKWARD_FILTER, workspace_limit=0, policy="all",
                    backend=inner, cache=cache)
    assert zero.workspace_bytes == 0 and {m.algo for m in zero.micro_batches} == {0}


def test_optimize_network_on_numpy_backend(cache):
    numpy_backend = pytest.importorskip("mucudnn.backends.numpy")
    be = numpy_backend.NumpyBackend(repeats=1)
    layers = {"c1": ConvProblem((4, 3, 8, 8), (4, 3, 3, 3), padding=1),
              "c2": ConvProblem((4, 4, 8, 8), (4, 4, 3, 3), stride=2, padding=1)}
    total = 64 << 10
    plans = optimize_network(layers, total, policy="powerOfTwo", backend=be, cache=cache)
    assert len(plans) == 6
    assert sum(p.workspace_bytes for p in plans.values()) <= total
    for (name, d), plan in plans.items():
        assert plan.problem == layers[name] and plan.direction is d and plan.batch == 4


class CurveBackend:
    """Fake Find whose best time per sample under the cap falls with the size
    until ``knee`` and rises below it (what a cap makes of real kernels)."""

    name = "curve"
    device_name = "Fake"
    version = "0"

    def __init__(self, knee):
        self.knee = knee
        self.sizes = []

    def find(self, problem, direction, workspace_limit):
        n = problem.batch
        self.sizes.append(n)
        per_sample = 1.0 + abs(np.log2(n) - np.log2(self.knee))  # best at the knee
        return [AlgoPerf(0, per_sample * n, 0)]


@pytest.mark.parametrize("batch,knee,want", [
    (256, 32, [256, 128, 64, 32, 16]),        # stops one size past the best
    (256, 256, [256, 128]),                   # the undivided call is best
    (100, 64, [100, 64, 32, 4]),              # 100 = 64 + 32 + 4: the remainder's size stays
    (100, 16, [100, 64, 32, 16, 8, 4]),       # 100 = 6 x 16 + 4
])
def test_size_pruning_stops_past_the_best_size(batch, knee, want):
    """Note [size pruning]: largest first, the descent stops at the first size more
    than PRUNE_MARGIN worse per sample than a larger one; the remainder's sizes
    are still benchmarked, and the WR plan is the one every size would give."""
    be = CurveBackend(knee)
    p = ConvProblem((batch, 3, 7, 7), (4, 3, 3, 3), padding=1)
    perf = benchmark(be, p, Direction.FORWARD, "powerOfTwo", 1 << 20, cache=False,
                     prune_sizes=True)
    assert be.sizes == want and sorted(perf, reverse=True) == want
    full = benchmark(CurveBackend(knee), p, Direction.FORWARD, "powerOfTwo", 1 << 20,
                     cache=False)
    assert len(full) == len(batch_sizes("powerOfTwo", batch))
    pruned_plan = optimize_wr(perf, batch, 1 << 20, "powerOfTwo")
    full_plan = optimize_wr(full, batch, 1 << 20, "powerOfTwo")
    assert pruned_plan.time_ms == pytest.approx(full_plan.time_ms)
