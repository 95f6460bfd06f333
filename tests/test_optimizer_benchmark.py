"""benchmark() with a counting fake backend, optimize()/optimize_network() end to end, and
deterministic=True through them and the Planner (Note [deterministic plans])."""

from __future__ import annotations

import dataclasses
import functools
import logging
import statistics
import sys

import numpy as np

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mucudnn.backends.base import ConvTensors
from mucudnn.errors import UnsupportedConfigError
from mucudnn.optimizer import (BenchmarkCache, Planner, batch_sizes, benchmark, optimize,
                               optimize_network, optimize_wr, zero_workspace_plan)
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


def test_progress_bar(cache, capsys, monkeypatch):
    # the bar shows once work has lasted PROGRESS_DELAY_S (a cached run draws none);
    # with no delay it shows at once
    monkeypatch.setattr(sys.modules["mucudnn.optimizer.benchmark"], "PROGRESS_DELAY_S", 0.0)
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
    """See Note [size pruning]: largest first, the descent stops at the first size more
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


class BlockedBackend:
    """AlexNet conv1's bf16 backward-filter as the H200 showed it: one engine fits
    the cap at every size (``slow`` ms per sample, and worse per sample at small
    sizes), while the engines heuristics prefer need ``per_sample_ws`` bytes per
    sample of workspace and run at ``fast`` ms per sample once they fit."""

    name = "blocked"
    device_name = "Fake"
    version = "0"

    def __init__(self, per_sample_ws, fast=0.0025, slow=0.0127, report=True, slow_ws=93136):
        self.per_sample_ws, self.fast, self.slow, self.report = per_sample_ws, fast, slow, report
        self.slow_ws = slow_ws
        self.sizes = []

    def find(self, problem, direction, workspace_limit):
        n = problem.batch
        self.sizes.append(n)
        out = [AlgoPerf(1, self.slow * n * (1 + 64 / n), self.slow_ws)]
        if self.per_sample_ws * n <= workspace_limit:
            out.append(AlgoPerf(49, self.fast * n + 0.01, self.per_sample_ws * n))
        return sorted(out, key=lambda r: r.time_ms)

    def blocked_workspace(self, problem, direction, workspace_limit):
        ws = self.per_sample_ws * problem.batch
        return ws if self.report and ws > workspace_limit else None


def test_size_pruning_descends_to_configurations_blocked_by_the_cap(tmp_path):
    """See Note [size pruning]: the descent goes on past a size that is worse per
    sample while configurations heuristics prefer are over the cap and would fit
    a smaller size; the plan then uses them (it stopped at 128 before)."""
    cap = 64 << 20
    p = ConvProblem((256, 3, 224, 224), (64, 3, 11, 11), stride=4, padding=2)
    be = BlockedBackend(803_300)  # 206 MB at 256, 51 MB at 64: fits from 64 down
    perf = benchmark(be, p, Direction.BACKWARD_FILTER, "powerOfTwo", cap, cache=False,
                     prune_sizes=True)
    assert be.sizes == [256, 128, 64, 32, 16]
    plan = optimize_wr(perf, 256, cap, "powerOfTwo")
    assert {m.algo for m in plan.micro_batches} == {49} and plan.time_ms < 1.0
    full = optimize_wr(benchmark(BlockedBackend(803_300), p, Direction.BACKWARD_FILTER,
                                 "powerOfTwo", cap, cache=False), 256, cap, "powerOfTwo")
    assert plan.time_ms == pytest.approx(full.time_ms)
    # a backend that cannot tell prunes as before, and so misses them
    silent = BlockedBackend(803_300, report=False)
    perf = benchmark(silent, p, Direction.BACKWARD_FILTER, "powerOfTwo", cap, cache=False,
                     prune_sizes=True)
    assert silent.sizes == [256, 128]
    assert {m.algo for m in optimize_wr(perf, 256, cap, "powerOfTwo").micro_batches} == {1}
    # configurations that would fit only below an eighth of the batch are not chased
    far = BlockedBackend(803_300 * 16)
    benchmark(far, p, Direction.BACKWARD_FILTER, "powerOfTwo", cap, cache=False,
              prune_sizes=True)
    assert far.sizes == [256, 128]
    # warm: the same sizes from the cache, the backend not asked again
    cache_path = tmp_path / "c.sqlite"
    cold = BlockedBackend(803_300)
    first = benchmark(cold, p, Direction.BACKWARD_FILTER, "powerOfTwo", cap,
                      cache=str(cache_path), prune_sizes=True)
    warm = BlockedBackend(803_300, report=False)
    again = benchmark(warm, p, Direction.BACKWARD_FILTER, "powerOfTwo", cap,
                      cache=str(cache_path), prune_sizes=True)
    assert warm.sizes == [] and sorted(again) == sorted(first) == [16, 32, 64, 128, 256]


@given(log_batch=st.integers(4, 9), per_sample_ws=st.integers(1 << 10, 64 << 20),
       fast=st.floats(0.001, 0.02), slow_factor=st.floats(1.5, 50.0),
       cap_log=st.integers(16, 28))
def test_pruned_plan_is_the_full_plan_where_blocked_configs_fit_an_eighth(
        log_batch, per_sample_ws, fast, slow_factor, cap_log):
    """Note [size pruning], property: with a backend that reports what the cap
    blocks, the pruned WR plan is as fast as the plan from every size whenever
    the preferred configuration fits some size of at least an eighth of the
    batch (the descent's reach), and never slower than the undivided call."""
    batch, cap = 1 << log_batch, 1 << cap_log
    be = BlockedBackend(per_sample_ws, fast=fast, slow=fast * slow_factor, slow_ws=0)
    p = ConvProblem((batch, 3, 9, 9), (4, 3, 3, 3), padding=1)
    d = Direction.BACKWARD_FILTER
    pruned = optimize_wr(benchmark(be, p, d, "powerOfTwo", cap, cache=False, prune_sizes=True),
                         batch, cap, "powerOfTwo")
    full_perf = benchmark(BlockedBackend(per_sample_ws, fast=fast, slow=fast * slow_factor,
                                         slow_ws=0), p, d, "powerOfTwo", cap, cache=False)
    full = optimize_wr(full_perf, batch, cap, "powerOfTwo")
    assert pruned.time_ms <= min(r.time_ms for r in full_perf[batch]) + 1e-9
    fits = [n for n in batch_sizes("powerOfTwo", batch) if per_sample_ws * n <= cap]
    if fits and fits[0] * 8 >= batch:
        assert pruned.time_ms == pytest.approx(full.time_ms)


# -- deterministic plans (Note [deterministic plans]) ---------------------------------------------

#: determinism values a backend or a cache entry may carry, and whether each is deterministic
DETERMINISM = {0: False, 1: True, None: True, "0": False, "NON_DETERMINISTIC": False,
               "CUDNN_NON_DETERMINISTIC": False, "CUDNN_DETERMINISTIC": True}


class DetBackend(CountingBackend):
    """CountingBackend's algorithms with determinism: algo 1 (the fastest) is
    non-deterministic, algo 2 deterministic, algo 0 (no workspace) unknown; algo 3
    needs no workspace either, beats algo 0 and is non-deterministic in the
    string form a cache entry may hold."""

    name = "det"

    def __init__(self, everything_atomic=False):
        super().__init__()
        self.everything_atomic = everything_atomic

    def find(self, problem, direction, workspace_limit):
        n = problem.batch
        out = [AlgoPerf(0, 1.0 * n, 0, 0, None), AlgoPerf(1, 0.1 * n + 0.05, 100 * n, 0, 0),
               AlgoPerf(2, 0.2 * n + 0.05, 10 * n, 0, 1),
               AlgoPerf(3, 0.5 * n, 0, 0, "CUDNN_NON_DETERMINISTIC")]
        if self.everything_atomic:
            out = [AlgoPerf(a.algo, a.time_ms, a.workspace_bytes, 0, 0) for a in out]
        self.calls.append((n, direction, workspace_limit))
        return sorted((r for r in out if r.workspace_bytes <= workspace_limit),
                      key=lambda r: r.time_ms)


def _algos(plan):
    return {m.algo for m in plan.micro_batches}


def test_deterministic_never_picks_a_non_deterministic_config(cache):
    be = DetBackend()
    free = optimize(P, Direction.FORWARD, workspace_limit=1 << 20, backend=be, cache=cache)
    assert _algos(free) == {1}                      # the fastest: not deterministic
    n = len(be.calls)
    det = optimize(P, Direction.FORWARD, workspace_limit=1 << 20, backend=be, cache=cache,
                   deterministic=True)
    # the cache answered for every size benchmarked before (it kept every entry); pruning,
    # judged by the deterministic entries, may go down one size further
    seen = {c[0] for c in be.calls[:n]}
    assert not any(c[0] in seen for c in be.calls[n:])
    assert _algos(det) == {2} and det.time_ms == pytest.approx(0.2 * 32 + 0.05)
    assert det.time_ms > free.time_ms
    # under no workspace: algo 3 (non-deterministic, as a string) is left out for algo 0
    zero = optimize(P, "fwd", workspace_limit=0, policy="undivided", backend=be, cache=cache)
    assert _algos(zero) == {3}
    zero_det = optimize(P, "fwd", workspace_limit=0, policy="undivided", backend=be,
                        cache=cache, deterministic=True)
    assert _algos(zero_det) == {0}
    # the stored entry still holds every algorithm, determinism included
    stored = benchmark(DetBackend(), P, "fwd", "undivided", 1 << 20, cache=cache,
                       progress=False)
    assert {(a.algo, a.determinism) for a in stored[32]} == \
        {(0, None), (1, 0), (2, 1), (3, "CUDNN_NON_DETERMINISTIC")}
    only = benchmark(DetBackend(), P, "fwd", "undivided", 1 << 20, cache=cache,
                     progress=False, deterministic=True)
    assert [a.algo for a in only[32]] == [a.algo for a in stored[32] if a.algo in (0, 2)]


@st.composite
def determinism_tables(draw, batch=8):
    """{size: [AlgoPerf]} for the powerOfTwo sizes of ``batch``: distinct algos,
    random times, workspaces and determinism values (every form listed above)."""
    table = {}
    for s in batch_sizes("powerOfTwo", batch):
        algos = draw(st.lists(st.integers(0, 7), min_size=1, max_size=5, unique=True))
        table[s] = [AlgoPerf(a, draw(st.floats(0.01, 10.0)), draw(st.sampled_from([0, 40, 400])),
                             0, draw(st.sampled_from(list(DETERMINISM)))) for a in algos]
    return table


class TableBackend:
    name = "table"
    device_name = "Fake"
    version = "0"

    def __init__(self, table):
        self.table = table

    def find(self, problem, direction, workspace_limit):
        return [a for a in self.table[problem.batch] if a.workspace_bytes <= workspace_limit]


@given(determinism_tables(), st.sampled_from([0, 40, 100, 400]))
def test_deterministic_plans_are_the_best_of_the_deterministic_entries(table, limit):
    """optimize(deterministic=True) is WR over the deterministic entries alone: never a
    non-deterministic one, however fast; the same time as WR on a hand-filtered table;
    an error naming ``deterministic`` exactly where that table has no plan."""
    p = P.with_batch(8)
    be = TableBackend(table)
    kept = {s: [a for a in v if DETERMINISM[a.determinism]] for s, v in table.items()}
    try:
        want = optimize_wr(kept, 8, limit, "powerOfTwo", quantum=p.batch_quantum())
    except ValueError:
        want = None
    # benchmark_cap above the limit: no size pruning, so every size is compared
    run = functools.partial(optimize, p, "fwd", limit, "powerOfTwo", be, False,
                            benchmark_cap=1 << 20)
    if want is None:
        with pytest.raises(ValueError, match="deterministic=True"):
            run(deterministic=True)
        return
    plan = run(deterministic=True)
    assert plan.time_ms == pytest.approx(want.time_ms)
    for m in plan.micro_batches:
        (entry,) = [a for a in table[m.size] if a.algo == m.algo]
        assert DETERMINISM[entry.determinism] and entry.workspace_bytes <= limit
    assert run().time_ms <= plan.time_ms * (1 + 1e-9)   # determinism only costs time


def test_planner_keys_memo_replan_and_zero_workspace_plans_respect_deterministic(cache):
    be = DetBackend()
    free, det = Planner(be, 1 << 20, cache=cache), Planner(be, 1 << 20, cache=cache,
                                                            deterministic=True)
    k_free, k_det = free.key(P, Direction.FORWARD), det.key(P, Direction.FORWARD)
    assert k_free != k_det and (k_free.deterministic, k_det.deterministic) == (False, True)
    assert dataclasses.replace(k_free, deterministic=True) == k_det  # the only difference
    assert "deterministic=True" in repr(det) and "deterministic" not in repr(free)
    # the process-wide memo keeps the two apart, whichever is planned first
    assert _algos(det.plan(P, Direction.FORWARD)) == {2}
    assert _algos(free.plan(P, Direction.FORWARD)) == {1}
    assert _algos(det.plan(P, Direction.FORWARD)) == {2}
    # re-plans: under ample workspace, without algo 2, and with no workspace at all
    assert _algos(det.replan(P, Direction.FORWARD, 1 << 20)) == {2}
    assert _algos(free.replan(P, Direction.FORWARD, 1 << 20, exclude={1})) == {2}
    no2 = det.replan(P, Direction.FORWARD, 1 << 20, exclude={2})
    assert _algos(no2) == {0} and no2.workspace_bytes == 0
    assert _algos(free.replan(P, Direction.FORWARD, 0)) == {3}
    assert _algos(det.replan(P, Direction.FORWARD, 0)) == {0}
    assert _algos(zero_workspace_plan(P, Direction.FORWARD, be, cache=cache)) == {3}
    assert _algos(zero_workspace_plan(P, Direction.FORWARD, be, cache=cache,
                                      deterministic=True)) == {0}
    with pytest.raises(UnsupportedConfigError, match="deterministic=True"):
        zero_workspace_plan(P, Direction.FORWARD, be, cache=cache, exclude={0},
                            deterministic=True)
    with pytest.raises(UnsupportedConfigError, match="deterministic=True"):
        det.replan(P, Direction.BACKWARD_DATA, 0, exclude={0})
    assert _algos(free.replan(P, Direction.BACKWARD_DATA, 0, exclude={0})) == {3}
    # WD through the planner
    kernels = {"a": (P, Direction.FORWARD), "b": (P, Direction.BACKWARD_FILTER)}
    assert [_algos(p) for p in det.plan_jointly(kernels, 1 << 20).values()] == [{2}, {2}]
    assert [_algos(p) for p in free.plan_jointly(kernels, 1 << 20).values()] == [{1}, {1}]


def test_nothing_deterministic_fits_names_deterministic(cache):
    atomic = DetBackend(everything_atomic=True)
    plan = optimize(P, "fwd", 1 << 20, backend=atomic, cache=cache)
    assert _algos(plan) == {1}
    with pytest.raises(ValueError, match="no plan.*deterministic=True"):
        optimize(P, "fwd", 1 << 20, backend=atomic, cache=cache, deterministic=True)
    layers = {"a": P, "b": P.with_batch(16)}
    assert optimize_network(layers, 1 << 20, ["fwd"], backend=atomic, cache=cache)
    with pytest.raises(ValueError, match="deterministic=True"):
        optimize_network(layers, 1 << 20, ["fwd"], backend=atomic, cache=cache,
                         deterministic=True)
    with pytest.raises(ValueError, match="deterministic=True"):
        Planner(atomic, 1 << 20, cache=cache, deterministic=True).plan(P, Direction.FORWARD)
    # deterministic configurations that exist but do not fit: the same error, saying so
    with pytest.raises(ValueError, match="deterministic=True"):
        optimize(P, "fwd", 0, "undivided", backend=_NoZero(), cache=cache, deterministic=True)
    # without deterministic=True the message does not blame it
    with pytest.raises(ValueError, match="no plan") as info:
        optimize(P, "fwd", 0, "undivided", backend=_NoZero(), cache=cache)
    assert "deterministic" not in str(info.value)


@pytest.mark.parametrize("bad", [1, 0, None, "yes", np.bool_(True)])
def test_deterministic_must_be_a_bool(cache, bad):
    be = DetBackend()
    calls = [
        lambda: optimize(P, "fwd", 1 << 20, backend=be, cache=cache, deterministic=bad),
        lambda: optimize_network({"a": P}, 1 << 20, backend=be, cache=cache, deterministic=bad),
        lambda: benchmark(be, P, "fwd", "undivided", 1 << 20, cache=cache, deterministic=bad),
        lambda: Planner(be, deterministic=bad),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=r"^deterministic: expected True or False"):
            call()
    assert be.calls == []


class ZeroOnceBackend:
    """A find() in the manner of cudnn-graph's ``find_zero="once"``: the
    configuration that needs no workspace (algo 0, ``zero_per`` ms per sample)
    is reported only under a cap of 0; algo 1 needs 100 B per sample."""

    name = "zero-once"
    device_name = "Fake"
    version = "0"
    finds_zero_once = True

    def __init__(self, zero_per=5.0, zero_determinism=1):
        self.calls = []
        self.zero_per, self.zero_determinism = zero_per, zero_determinism

    def find(self, problem, direction, workspace_limit):
        n = problem.batch
        self.calls.append((n, workspace_limit))
        if workspace_limit == 0:
            return [AlgoPerf(0, self.zero_per * n, 0, 0, self.zero_determinism)]
        out = [AlgoPerf(1, 0.1 * n + 0.05, 100 * n)]
        return [r for r in out if r.workspace_bytes <= workspace_limit]


def test_one_zero_workspace_find_per_kernel(cache):
    """See Note [one zero-workspace find per kernel]: a backend whose find() leaves
    the zero-workspace configs out is asked for them once, under a cap of 0, at
    the smallest size found that divides the batch; they go into that size's
    results and cache entry, a warm run asks nothing, and a budget of nothing
    gets a plan of them."""
    p = ConvProblem((96, 4, 6, 6), (4, 4, 3, 3), padding=1)
    be = ZeroOnceBackend()
    perf = benchmark(be, p, Direction.FORWARD, "powerOfTwo", 10_000, cache=cache,
                     progress=False)
    assert [c for c in be.calls if c[1] == 0] == [(1, 0)]
    assert len(be.calls) == len(batch_sizes("powerOfTwo", 96)) + 1
    assert [a.algo for a in perf[1] if a.workspace_bytes == 0] == [0]
    assert all(a.workspace_bytes > 0 for s, v in perf.items() if s != 1 for a in v)
    assert {a.algo for a in cache.get(be, p.with_batch(1), Direction.FORWARD, 10_000)} == {0, 1}
    warm = ZeroOnceBackend()
    again = benchmark(warm, p, Direction.FORWARD, "powerOfTwo", 10_000, cache=cache,
                      progress=False)
    assert warm.calls == [] and again == perf
    plan = optimize_wr(perf, 96, 0, "powerOfTwo")
    assert plan.workspace_bytes == 0 and {m.algo for m in plan.micro_batches} == {0}
    assert plan.time_ms == pytest.approx(5.0 * 96)
    # a backend that reports them at every find() is not asked again
    plain = CountingBackend()
    benchmark(plain, p, Direction.FORWARD, "powerOfTwo", 10_000, cache=False, progress=False)
    assert all(c[2] == 10_000 for c in plain.calls)


def test_zero_workspace_size_tiles_the_batch_and_keeps_its_alignment():
    """See Note [one zero-workspace find per kernel]: with pruning the descent stops
    early and the remainder's sizes are found; the zero-workspace find goes to
    the smallest found size that divides the batch, a multiple of the
    problem's alignment quantum where one is found."""
    p = ConvProblem((100, 3, 227, 227), (96, 3, 11, 11), stride=4)  # quantum 4
    assert p.batch_quantum() == 4
    be = ZeroOnceBackend()
    perf = benchmark(be, p, Direction.FORWARD, [100, 50, 25, 20], 10 ** 9, cache=False,
                     progress=False)
    assert [c for c in be.calls if c[1] == 0] == [(20, 0)]
    plan = optimize_wr(perf, 100, 0, [100, 50, 25, 20])
    assert [m.size for m in plan.micro_batches] == [20] * 5 and plan.workspace_bytes == 0


def test_replan_and_zero_workspace_plan_find_the_zero_workspace_configs(cache):
    """See Note [one zero-workspace find per kernel]: a re-plan with no memory
    composes its plan from the size that holds them; zero_workspace_plan, whose
    full-batch cache entry holds none, finds them at the full batch (uncached)."""
    p = ConvProblem((32, 4, 6, 6), (4, 4, 3, 3), padding=1)
    be = ZeroOnceBackend()
    planner = Planner(be, 10_000, cache=cache)
    assert planner.plan(p, Direction.FORWARD).workspace_bytes > 0
    plan = planner.replan(p, Direction.FORWARD, available=0)
    assert plan.workspace_bytes == 0 and {m.algo for m in plan.micro_batches} == {0}
    n_calls = len(be.calls)
    zp = zero_workspace_plan(p, Direction.FORWARD, be, cache=cache)
    assert [m.size for m in zp.micro_batches] == [32] and zp.micro_batches[0].algo == 0
    assert be.calls[n_calls:] == [(32, 0)]
    with pytest.raises(UnsupportedConfigError, match="no zero-workspace algorithm is left"):
        zero_workspace_plan(p, Direction.FORWARD, be, cache=cache, exclude=[0])


@given(batch=st.integers(1, 300), cap_log=st.integers(8, 20),
       explicit=st.one_of(st.none(), st.lists(st.integers(1, 300), min_size=1, max_size=6)))
def test_a_zero_once_benchmark_always_allows_a_zero_workspace_plan(batch, cap_log, explicit):
    """Note [one zero-workspace find per kernel], property: whatever the batch,
    policy and cap, and with size pruning, the benchmark of a backend that finds
    zero-workspace configs once allows a WR plan under a cap of 0, made of
    them."""
    policy = "powerOfTwo" if explicit is None else explicit
    p = ConvProblem((batch, 4, 6, 6), (4, 4, 3, 3), padding=1)
    be = ZeroOnceBackend()
    perf = benchmark(be, p, Direction.FORWARD, policy, 1 << cap_log, cache=False,
                     progress=False, prune_sizes=True)
    assert len([c for c in be.calls if c[1] == 0]) == 1
    plan = optimize_wr(perf, batch, 0, policy)
    assert plan.workspace_bytes == 0 and {m.algo for m in plan.micro_batches} == {0}


def test_zero_workspace_find_is_not_repeated_when_determinism_filters_it(cache):
    """Note [one zero-workspace find per kernel] with deterministic=True: a
    non-deterministic zero-workspace config is found once and kept in the
    cache, left out of the results, and a warm run does not look for it again."""
    p = ConvProblem((16, 4, 6, 6), (4, 4, 3, 3), padding=1)
    be = ZeroOnceBackend(zero_determinism=0)
    perf = benchmark(be, p, Direction.FORWARD, "powerOfTwo", 10_000, cache=cache,
                     progress=False, deterministic=True)
    assert [c for c in be.calls if c[1] == 0] == [(1, 0)]
    assert all(a.workspace_bytes > 0 for v in perf.values() for a in v)
    warm = ZeroOnceBackend(zero_determinism=0)
    benchmark(warm, p, Direction.FORWARD, "powerOfTwo", 10_000, cache=cache, progress=False,
              deterministic=True)
    assert warm.calls == []


def test_zero_workspace_plan_asks_other_backends_once(cache):
    """See Note [one zero-workspace find per kernel]: only a backend that finds its
    zero-workspace configs once is asked again, uncached; any other is asked at
    most once, and its lack of such configs is an error naming the kernel."""
    class NoZero(CountingBackend):
        def find(self, problem, direction, workspace_limit):
            self.calls.append((problem.batch, direction, workspace_limit))
            return []
    be = NoZero()
    with pytest.raises(UnsupportedConfigError, match="no zero-workspace algorithm is left"):
        zero_workspace_plan(P, Direction.FORWARD, be, cache=cache)
    assert be.calls == [(32, Direction.FORWARD, 0)]


# -- the fitted policy (Note [fitted sizes]) --------------------------------------------------------

class StretchBackend:
    """A kernel whose fast configuration needs ``per_sample_ws`` bytes of
    workspace a sample and costs ``overhead`` ms a call on top of ``fast`` ms a
    sample (so fewer, larger calls win), next to a slow one that needs none."""

    name = "stretch"
    device_name = "Fake"
    version = "0"

    def __init__(self, per_sample_ws, fast=0.01, overhead=0.05, slow=0.05):
        self.per_sample_ws, self.fast, self.overhead, self.slow = per_sample_ws, fast, overhead, slow
        self.sizes = []

    def find(self, problem, direction, workspace_limit):
        n = problem.batch
        self.sizes.append(n)
        out = [AlgoPerf(0, self.slow * n + self.overhead, 0)]
        if self.per_sample_ws * n <= workspace_limit:
            out.append(AlgoPerf(7, self.fast * n + self.overhead, self.per_sample_ws * n))
        return sorted(out, key=lambda r: r.time_ms)


#: 1024 bytes a sample in and out: an alignment quantum of 1
Q1 = ConvProblem((256, 4, 8, 8), (4, 4, 3, 3), padding=1)


def test_fitted_policy_times_the_size_the_best_configuration_stretches_to(tmp_path):
    """See Note [fitted sizes]: 36 samples fit the cap where powerOfTwo stops at 32;
    "fitted" times 36 and the remainder's 4, its plan is 7 x 36 + 4 (8 calls,
    as good as timing every size), and a warm run asks the backend nothing."""
    assert Q1.batch_quantum() == 1
    cap, d = 36 * 1000, Direction.BACKWARD_FILTER
    path = str(tmp_path / "c.sqlite")
    be = StretchBackend(1000)
    perf = benchmark(be, Q1, d, "fitted", cap, cache=path, prune_sizes=True, progress=False)
    assert be.sizes[-2:] == [36, 4] and 36 in perf and 4 in perf
    plan = optimize_wr(perf, 256, cap, "fitted")
    assert sorted(m.size for m in plan.micro_batches) == [4] + [36] * 7
    every = optimize_wr(benchmark(StretchBackend(1000), Q1, d, "all", cap, cache=False,
                                  progress=False), 256, cap, "all")
    assert plan.time_ms == pytest.approx(every.time_ms)
    pow2 = optimize_wr(benchmark(StretchBackend(1000), Q1, d, "powerOfTwo", cap, cache=False,
                                 prune_sizes=True, progress=False), 256, cap, "powerOfTwo")
    assert plan.time_ms < pow2.time_ms
    # powerOfTwo's plans never use the fitted sizes, even when they are measured
    assert {m.size for m in optimize_wr(perf, 256, cap, "powerOfTwo").micro_batches} <= {32}
    warm = StretchBackend(1000)
    again = benchmark(warm, Q1, d, "fitted", cap, cache=path, prune_sizes=True, progress=False)
    assert warm.sizes == [] and sorted(again) == sorted(perf)


def test_fitted_policy_adds_nothing_where_the_cap_does_not_bind():
    be = StretchBackend(1000)
    perf = benchmark(be, Q1, Direction.FORWARD, "fitted", 10 << 20, cache=False,
                     prune_sizes=True, progress=False)
    ref = StretchBackend(1000)
    benchmark(ref, Q1, Direction.FORWARD, "powerOfTwo", 10 << 20, cache=False,
              prune_sizes=True, progress=False)
    assert be.sizes == ref.sizes and sorted(perf) == sorted(set(ref.sizes))


@given(log_batch=st.integers(3, 9), per_sample_ws=st.integers(1, 1 << 20),
       cap=st.integers(1, 64 << 20), overhead=st.floats(0.0, 1.0), fast=st.floats(0.001, 0.1))
def test_fitted_plans_are_never_slower_than_power_of_two(log_batch, per_sample_ws, cap,
                                                           overhead, fast):
    """Property: "fitted" measures powerOfTwo's sizes and more, so its WR plan is
    at most powerOfTwo's (same backend, no pruning differences), and every
    extra size it timed is one the best configuration fits under the cap."""
    p = Q1.with_batch(1 << log_batch)
    d = Direction.BACKWARD_DATA
    fit = StretchBackend(per_sample_ws, fast=fast, overhead=overhead)
    perf = benchmark(fit, p, d, "fitted", cap, cache=False, prune_sizes=True, progress=False)
    ref = StretchBackend(per_sample_ws, fast=fast, overhead=overhead)
    base = benchmark(ref, p, d, "powerOfTwo", cap, cache=False, prune_sizes=True, progress=False)
    assert set(base) <= set(perf)
    extra = sorted(set(perf) - set(base), reverse=True)
    if extra:
        assert extra[0] * per_sample_ws <= cap  # the fitted size: the fast config fits
        assert extra[0] not in batch_sizes("powerOfTwo", p.batch)
    a = optimize_wr(perf, p.batch, cap, "fitted")
    b = optimize_wr(base, p.batch, cap, "powerOfTwo")
    assert a.time_ms <= b.time_ms + 1e-9


def test_fitted_sizes_follow_the_plans_limit_under_a_larger_cap():
    """See Note [fitted sizes]: benchmarked under a larger cap (optimize's
    benchmark_cap, run_network's unlimited one), "fitted" stretches to the
    plan's limit (``fit_limit``), not to the cap."""
    d, limit = Direction.BACKWARD_FILTER, 36 * 1000
    be = StretchBackend(1000)
    perf = benchmark(be, Q1, d, "fitted", 1 << 30, cache=False, fit_limit=limit,
                     progress=False)
    assert 36 in perf and 4 in perf
    plan = optimize(Q1, d, limit, "fitted", StretchBackend(1000), cache=False,
                    benchmark_cap=1 << 30)
    assert sorted(m.size for m in plan.micro_batches) == [4] + [36] * 7
    unfitted = benchmark(StretchBackend(1000), Q1, d, "fitted", 1 << 30, cache=False,
                         progress=False)
    assert set(unfitted) == set(batch_sizes("powerOfTwo", 256))  # the cap fits everything
    with pytest.raises(ValueError, match="fit_limit"):
        benchmark(StretchBackend(1000), Q1, d, "fitted", 1 << 30, cache=False, fit_limit=-1)


def test_fitted_sizes_a_backend_cannot_measure_are_left_out():
    """See Note [fitted sizes]: offline (CachedBackend) a fitted size missing from the
    cache is left out, and the plan is powerOfTwo's, rather than an error."""
    from mucudnn.optimizer import CacheMissError

    class Offline(StretchBackend):
        def find(self, problem, direction, workspace_limit):
            n = problem.batch
            if n & (n - 1):
                raise CacheMissError(f"size {n} was never measured")
            return super().find(problem, direction, workspace_limit)

    cap, d = 36 * 1000, Direction.BACKWARD_FILTER
    perf = benchmark(Offline(1000), Q1, d, "fitted", cap, cache=False, prune_sizes=True,
                     progress=False)
    assert all(s & (s - 1) == 0 for s in perf)
    pow2 = benchmark(StretchBackend(1000), Q1, d, "powerOfTwo", cap, cache=False,
                     prune_sizes=True, progress=False)
    assert optimize_wr(perf, 256, cap, "fitted").time_ms == pytest.approx(
        optimize_wr(pow2, 256, cap, "powerOfTwo").time_ms)


def test_the_planner_checks_its_options_once(cache, monkeypatch):
    """The Planner resolves its arguments into one PlanOptions in its constructor;
    plan, replan, plan_jointly and the zero-workspace last resort never check them
    again (issue 35), and its PlanKey holds what it held before."""
    # the package's names shadow its modules ``benchmark`` and ``api``: by sys.modules
    opt_api, opt_bench, opt_planner = (sys.modules[f"mucudnn.optimizer.{m}"]
                                       for m in ("api", "benchmark", "planner"))
    be = ZeroOnceBackend()
    planner = Planner(be, "10000", [16, 8], cache=cache, retime=1)
    assert planner.options.backend is planner.backend and planner.cache is planner.options.cache
    assert (planner.workspace_limit, planner.policy, planner.retime, planner.deterministic) \
        == (10_000, (16, 8), 1, False)

    def refuse(*a, **kw):
        raise AssertionError("plan_options called again")

    for mod in (opt_api, opt_bench, opt_planner):
        monkeypatch.setattr(mod, "plan_options", refuse)
    p = ConvProblem((32, 4, 6, 6), (4, 4, 3, 3), padding=1)
    key = planner.key(p, "forward")
    assert (key.backend, key.device, key.version, key.problem, key.direction) \
        == (be.name, be.device_name, be.version, p, Direction.FORWARD)
    assert (key.workspace_limit, key.policy, key.cache, key.retime, key.exclude, key.available,
            key.deterministic) == (10_000, (16, 8), str(cache.path), 1, frozenset(), None, False)
    assert planner.plan(p, Direction.FORWARD).problem == p
    assert planner.replan(p, Direction.FORWARD, available=0).workspace_bytes == 0
    plans = planner.plan_jointly({"a": (p, Direction.FORWARD)}, 5_000)
    assert plans["a"].workspace_bytes <= 5_000
