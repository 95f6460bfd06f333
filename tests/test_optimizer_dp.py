"""WR (optimize_wr) and Pareto fronts: against brute force, invariants, and real H200 data."""

from __future__ import annotations

import itertools
import json
import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mucudnn.optimizer import batch_sizes, optimize_wr, pareto_front
from mucudnn.optimizer.dp import wr_graph
from mucudnn.optimizer.policies import FIT_MARGIN, FIT_MOST, allowed_sizes, fitted_sizes
from mucudnn.problem import AlgoPerf, Plan

from conftest import DATA

WS_VALUES = [0, 10, 20, 50, 100, 200]


# -- strategies and brute force ----------------------------------------------------

@st.composite
def perf_tables(draw, max_batch=8, zero_ws=None):
    """A random perf table {size: [AlgoPerf]} for a batch of 1..max_batch."""
    batch = draw(st.integers(1, max_batch))
    sizes = draw(st.sets(st.integers(1, batch), min_size=1, max_size=batch))
    if draw(st.booleans()):
        sizes.add(batch)
    force_zero = draw(st.booleans()) if zero_ws is None else zero_ws
    perf = {}
    for s in sorted(sizes):
        n = draw(st.integers(1, 3))
        algos = []
        for a in range(n):
            t = draw(st.floats(0.01, 10.0, allow_nan=False, allow_infinity=False))
            ws = draw(st.sampled_from(WS_VALUES))
            algos.append(AlgoPerf(algo=a, time_ms=t, workspace_bytes=ws))
        if force_zero and all(x.workspace_bytes for x in algos):
            algos.append(AlgoPerf(algo=9, time_ms=draw(st.floats(1.0, 20.0)), workspace_bytes=0))
        perf[s] = algos
    return perf, batch


policies = st.one_of(
    st.sampled_from(["all", "powerOfTwo", "undivided"]),
    st.lists(st.integers(1, 8), min_size=1, max_size=4),
)


def compositions(n):
    """Every ordered composition of n (tuples of positive ints summing to n)."""
    for cuts in itertools.product([0, 1], repeat=n - 1):
        parts, last = [], 0
        for i, c in enumerate(cuts, start=1):
            if c:
                parts.append(i - last)
                last = i
        parts.append(n - last)
        yield tuple(parts)


def brute_force(perf, batch, limit, policy):
    """Min total time over all compositions of batch into allowed sizes (inf if none)."""
    allowed = set(batch_sizes(policy, batch)) & set(perf)
    best_t = {}
    for s in allowed:
        ts = [a.time_ms for a in perf[s] if limit is None or a.workspace_bytes <= limit]
        if ts:
            best_t[s] = min(ts)
    best = math.inf
    for comp in compositions(batch):
        if all(p in best_t for p in comp):
            best = min(best, sum(best_t[p] for p in comp))
    return best


def check_plan(plan: Plan, perf, batch, limit, policy):
    allowed = set(batch_sizes(policy, batch)) & set(perf)
    off = 0
    sizes = [m.size for m in plan.micro_batches]
    assert sizes == sorted(sizes, reverse=True)
    for m in plan.micro_batches:
        assert m.offset == off
        off += m.size
        assert m.size in allowed
        assert any(a.algo == m.algo and a.time_ms == m.time_ms
                   and a.workspace_bytes == m.workspace_bytes for a in perf[m.size])
        if limit is not None:
            assert m.workspace_bytes <= limit
    assert off == batch == plan.batch
    assert plan.workspace_bytes == max(m.workspace_bytes for m in plan.micro_batches)
    assert plan.time_ms == pytest.approx(sum(m.time_ms for m in plan.micro_batches))
    assert plan.problem is None and plan.direction is None
    und = [a.time_ms for a in perf.get(batch, []) if limit is None or a.workspace_bytes <= limit]
    assert plan.undivided_time_ms == (min(und) if und else math.inf)


# -- WR against brute force --------------------------------------------------------

@given(perf_tables(), st.one_of(st.none(), st.sampled_from(WS_VALUES + [5, 1000])), policies)
def test_wr_equals_brute_force(table, limit, policy):
    perf, batch = table
    expect = brute_force(perf, batch, limit, policy)
    if math.isinf(expect):
        with pytest.raises(ValueError, match="no plan"):
            optimize_wr(perf, batch, limit, policy)
        return
    for method in ("networkx", "numpy"):
        plan = optimize_wr(perf, batch, limit, policy, method=method)
        assert plan.time_ms == pytest.approx(expect, rel=1e-9)
        check_plan(plan, perf, batch, limit, policy)


@given(perf_tables(), policies)
def test_networkx_and_numpy_give_the_same_plan(table, policy):
    perf, batch = table
    for limit in [None] + WS_VALUES:
        try:
            a = optimize_wr(perf, batch, limit, policy, method="networkx")
        except ValueError:
            with pytest.raises(ValueError):
                optimize_wr(perf, batch, limit, policy, method="numpy")
            continue
        b = optimize_wr(perf, batch, limit, policy, method="numpy")
        assert a == b


@given(st.integers(1, 80), st.sampled_from([1, 1, 2, 3, 4]), st.data())
def test_scalar_and_vector_recurrences_agree(batch, quantum, data):
    """The two loops behind method="numpy" (Python floats for few sizes, NumPy
    vectors for many) give the same split, ties included: times are drawn from
    a few values so that equal totals are common."""
    from mucudnn.optimizer import dp
    sizes = sorted(data.draw(st.sets(st.integers(1, batch), min_size=1)))
    tv = np.full(batch + 1, np.inf)
    for s in sizes:
        tv[s] = data.draw(st.sampled_from([0.25, 0.5, 1.0])) * s + data.draw(
            st.sampled_from([0.0, 0.5, 1.0]))
    S = np.array(sizes)
    a = dp._recur_scalar(sizes, tv[S].tolist(), batch, quantum)
    b = dp._recur_vector(S, tv[S], batch, quantum)
    if a is None:
        assert b is None
        return
    assert b is not None
    assert list(a) == b.tolist()


# -- the alignment quantum -------------------------------------------------------------

def brute_force_quantum(perf, batch, limit, policy, quantum):
    """Like brute_force, over the compositions whose parts but the last are
    multiples of quantum."""
    allowed = set(batch_sizes(policy, batch)) & set(perf)
    best_t = {s: min(a.time_ms for a in perf[s] if limit is None or a.workspace_bytes <= limit)
              for s in allowed
              if any(limit is None or a.workspace_bytes <= limit for a in perf[s])}
    best = math.inf
    for comp in compositions(batch):
        if all(p in best_t for p in comp) and all(p % quantum == 0 for p in comp[:-1]):
            best = min(best, sum(best_t[p] for p in comp))
    return best


quanta = st.sampled_from([2, 3, 4])


@given(perf_tables(), st.one_of(st.none(), st.sampled_from(WS_VALUES + [5, 1000])), policies,
       quanta)
def test_wr_with_quantum_equals_brute_force(table, limit, policy, quantum):
    perf, batch = table
    expect = brute_force_quantum(perf, batch, limit, policy, quantum)
    aligned = math.isfinite(expect)
    if not aligned:  # no aligned plan: the unconstrained optimum, or no plan at all
        expect = brute_force(perf, batch, limit, policy)
    if math.isinf(expect):
        with pytest.raises(ValueError, match="no plan"):
            optimize_wr(perf, batch, limit, policy, quantum=quantum)
        return
    plans = [optimize_wr(perf, batch, limit, policy, method=m, quantum=quantum)
             for m in ("networkx", "numpy")]
    assert plans[0] == plans[1]
    plan = plans[0]
    assert plan.time_ms == pytest.approx(expect, rel=1e-9)
    if aligned:
        assert all(m.offset % quantum == 0 for m in plan.micro_batches)
    mbs = plan.micro_batches
    off = [m for m in mbs if m.size % quantum]
    assert len(off) <= 1 or not aligned
    if off and aligned:
        assert mbs[-1] is off[0]  # the one size off the quantum comes last
    body = [m.size for m in mbs if m.size % quantum == 0]
    assert body == sorted(body, reverse=True)


@given(perf_tables(), policies, quanta)
def test_front_with_quantum_is_complete(table, policy, quantum):
    perf, batch = table
    if math.isinf(brute_force(perf, batch, None, policy)):
        return
    front = pareto_front(perf, batch, policy, quantum=quantum)
    assert front == pareto_front(perf, batch, policy, method="networkx", quantum=quantum)
    for a, b in zip(front, front[1:]):
        assert a.workspace_bytes < b.workspace_bytes and a.time_ms > b.time_ms
    if math.isinf(brute_force_quantum(perf, batch, None, policy, quantum)):
        assert front == pareto_front(perf, batch, policy)  # the unconstrained front
        return
    for p in front:
        assert all(m.offset % quantum == 0 for m in p.micro_batches)
    for limit in sorted({a.workspace_bytes for v in perf.values() for a in v} | {5, 1000}):
        expect = brute_force_quantum(perf, batch, limit, policy, quantum)
        fits = [p.time_ms for p in front if p.workspace_bytes <= limit]
        if math.isinf(expect):
            assert not fits
        else:
            assert min(fits) == pytest.approx(expect, rel=1e-9)


def test_quantum_on_the_alexnet_conv1_case():
    """The measured case (tools/bench_alignment.py): 64 MiB, every size; the
    unconstrained plan puts micro-batches at odd offsets, the quantum of 4
    keeps every offset a multiple of 4 at a predicted cost of a few percent."""
    from mucudnn.problem import ConvProblem
    q = ConvProblem((256, 3, 227, 227), (96, 3, 11, 11), stride=4).batch_quantum()
    assert q == 4
    perf = {b: [AlgoPerf(0, 0.05 + 0.0105 * b, 0), AlgoPerf(1, 0.04 + 0.0081 * b, 1744 * 1024 * b)]
            for b in range(1, 257)}
    free = optimize_wr(perf, 256, 64 << 20, "all")
    assert any(m.offset % 4 for m in free.micro_batches)
    plan = optimize_wr(perf, 256, 64 << 20, "all", quantum=4)
    assert all(m.offset % 4 == 0 for m in plan.micro_batches)
    assert all(m.workspace_bytes <= 64 << 20 for m in plan.micro_batches)
    assert plan.time_ms <= free.time_ms * 1.05


def test_quantum_must_be_a_positive_int():
    perf = {2: [AlgoPerf(0, 1.0, 0)]}
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(ValueError, match="quantum"):
            optimize_wr(perf, 2, None, quantum=bad)
        with pytest.raises(ValueError, match="quantum"):
            pareto_front(perf, 2, quantum=bad)


@given(perf_tables(), policies)
def test_time_non_increasing_as_limit_grows(table, policy):
    perf, batch = table
    prev = math.inf
    for limit in WS_VALUES + [None]:
        try:
            t = optimize_wr(perf, batch, limit, policy).time_ms
        except ValueError:
            t = math.inf
        assert t <= prev * (1 + 1e-12)
        prev = t


@given(perf_tables(), st.one_of(st.none(), st.sampled_from(WS_VALUES)))
def test_undivided_is_the_best_single_call(table, limit):
    perf, batch = table
    fits = [a for a in perf.get(batch, []) if limit is None or a.workspace_bytes <= limit]
    if not fits:
        with pytest.raises(ValueError):
            optimize_wr(perf, batch, limit, "undivided")
        return
    plan = optimize_wr(perf, batch, limit, "undivided")
    best = min(fits, key=lambda a: (a.time_ms, a.workspace_bytes))
    assert len(plan.micro_batches) == 1
    assert plan.micro_batches[0].algo == best.algo
    assert plan.time_ms == best.time_ms == plan.undivided_time_ms
    assert plan.speedup == 1.0


@given(perf_tables(), st.sampled_from(WS_VALUES))
def test_shortest_path_length_agrees(table, limit):
    perf, batch = table
    tv = {}
    for s, algos in perf.items():
        ts = [a.time_ms for a in algos if a.workspace_bytes <= limit]
        if ts:
            tv[s] = min(ts)
    g = wr_graph(tv, batch)
    try:
        length = nx.shortest_path_length(g, 0, batch, weight="weight")
    except nx.NetworkXNoPath:
        with pytest.raises(ValueError):
            optimize_wr(perf, batch, limit, "all")
        return
    assert optimize_wr(perf, batch, limit, "all").time_ms == pytest.approx(length, rel=1e-9)


# -- Pareto fronts -------------------------------------------------------------------

@given(perf_tables(), policies)
def test_front_is_non_dominated_and_complete(table, policy):
    perf, batch = table
    if math.isinf(brute_force(perf, batch, None, policy)):
        with pytest.raises(ValueError):
            pareto_front(perf, batch, policy)
        return
    front = pareto_front(perf, batch, policy)
    assert front == pareto_front(perf, batch, policy, method="networkx")
    for a, b in zip(front, front[1:]):
        assert a.workspace_bytes < b.workspace_bytes
        assert a.time_ms > b.time_ms
    for p in front:
        check_plan(p, perf, batch, p.workspace_limit, policy)
        assert p.workspace_limit == p.workspace_bytes
    # The unlimited optimum is the last plan.
    assert front[-1].time_ms == pytest.approx(brute_force(perf, batch, None, policy), rel=1e-9)
    # At every limit, the best front plan that fits is as fast as WR there (completeness).
    for limit in sorted({a.workspace_bytes for v in perf.values() for a in v} | {5, 1000}):
        expect = brute_force(perf, batch, limit, policy)
        fits = [p.time_ms for p in front if p.workspace_bytes <= limit]
        if math.isinf(expect):
            assert not fits
        else:
            assert min(fits) == pytest.approx(expect, rel=1e-9)


@given(perf_tables(zero_ws=True), policies)
def test_front_contains_the_zero_workspace_plan(table, policy):
    perf, batch = table
    zero = brute_force(perf, batch, 0, policy)
    assume(math.isfinite(zero))
    front = pareto_front(perf, batch, policy)
    assert front[0].workspace_bytes == 0
    assert front[0].time_ms == pytest.approx(zero, rel=1e-9)
    assert front[0].time_ms == pytest.approx(optimize_wr(perf, batch, 0, policy).time_ms)


# -- tie-breaking, errors, policies ----------------------------------------------------

def test_ties_prefer_fewer_micro_batches_then_larger_first():
    linear = {s: [AlgoPerf(0, 0.5 * s, 0)] for s in range(1, 9)}
    assert optimize_wr(linear, 8, 0, "all").describe() == "8"
    # 8 is unavailable: 6 + 2 ties with 4 + 4 and 5 + 3; fewer batches then larger first.
    no8 = {s: v for s, v in linear.items() if s != 8}
    plan = optimize_wr(no8, 8, 0, "all")
    assert [m.size for m in plan.micro_batches] == [7, 1]
    assert optimize_wr(no8, 8, 0, "all", method="numpy") == plan
    # Same time on two algorithms: the smaller workspace wins.
    perf = {4: [AlgoPerf(1, 1.0, 100), AlgoPerf(2, 1.0, 50)]}
    assert optimize_wr(perf, 4, None).micro_batches[0].algo == 2


def test_mixed_sizes_and_algorithms():
    perf = {
        6: [AlgoPerf(1, 1.0, 600), AlgoPerf(0, 9.0, 0)],
        4: [AlgoPerf(1, 0.7, 400), AlgoPerf(0, 6.0, 0)],
        2: [AlgoPerf(2, 0.4, 100), AlgoPerf(0, 3.0, 0)],
    }
    plan = optimize_wr(perf, 6, 400, [4, 2])
    assert [(m.offset, m.size, m.algo) for m in plan.micro_batches] == [(0, 4, 1), (4, 2, 2)]
    assert plan.time_ms == pytest.approx(1.1)
    assert plan.workspace_bytes == 400
    assert plan.undivided_time_ms == 9.0
    assert plan.speedup == pytest.approx(9.0 / 1.1)
    assert plan.describe() == "4 + 2"


def test_no_plan_is_a_clear_value_error():
    perf = {8: [AlgoPerf(1, 1.0, 1 << 20)], 4: [AlgoPerf(1, 0.6, 1 << 19)]}
    with pytest.raises(ValueError, match="no plan for batch 8 under workspace_limit=1000"):
        optimize_wr(perf, 8, 1000, "powerOfTwo")
    with pytest.raises(ValueError, match="no plan"):
        pareto_front({3: [AlgoPerf(0, 1.0, 0)]}, 8, "powerOfTwo")
    with pytest.raises(ValueError, match="workspace_limit"):
        optimize_wr(perf, 8, -1)
    with pytest.raises(ValueError, match="batch"):
        optimize_wr(perf, 0, 10)
    with pytest.raises(ValueError, match="powerOfTwo"):
        optimize_wr(perf, 8, 10, "fastest")


def test_batch_sizes_policies():
    assert batch_sizes("powerOfTwo", 100) == [100, 64, 32, 16, 8, 4, 2, 1]
    assert batch_sizes("powerOfTwo", 64) == [64, 32, 16, 8, 4, 2, 1]
    assert batch_sizes("all", 4) == [4, 3, 2, 1]
    assert batch_sizes("undivided", 7) == [7]
    assert batch_sizes([3, 5, 50, 3], 10) == [10, 5, 3]
    assert batch_sizes("power_of_two", 2) == batch_sizes("POWEROFTWO", 2) == [2, 1]
    with pytest.raises(ValueError, match=r"'all', 'powerOfTwo', 'fitted', 'undivided'"):
        batch_sizes("some", 8)
    with pytest.raises(ValueError):
        batch_sizes([0, 2], 8)
    with pytest.raises(ValueError):
        batch_sizes(3, 8)
    with pytest.raises(ValueError):
        batch_sizes("all", 0)


def test_plan_round_trips_through_json():
    perf = {8: [AlgoPerf(1, 2.0, 800), AlgoPerf(0, 9.0, 0)], 4: [AlgoPerf(1, 0.9, 400)]}
    plan = optimize_wr(perf, 8, 500, "powerOfTwo")
    back = Plan.from_json(plan.to_json())
    assert back == plan
    plan0 = optimize_wr({8: [AlgoPerf(1, 2.0, 800)], 4: [AlgoPerf(1, 0.9, 400)]}, 8, 500)
    assert math.isinf(Plan.from_json(plan0.to_json()).undivided_time_ms)


# -- real H200 cuDNN Find data -------------------------------------------------------------

def _allsizes(layer, direction):
    table = json.loads((DATA / "h200-cudnn-find-allsizes.json").read_text())["table"]
    return {int(b): [AlgoPerf(*e) for e in v[direction]] for b, v in table[layer].items()}


def _pow2_table(config, layer, direction):
    table = json.loads((DATA / "h200-cudnn-find.json").read_text())["table"]
    out = {}
    for key, v in table.items():
        c, l, b = key.rsplit("/", 2)
        if c == config and l == layer:
            out[int(b)] = [AlgoPerf(*e) for e in v[direction]]
    return out


def _simple_dp(perf, batch, limit, sizes):
    """An independent O(batch * sizes) DP: T(n) = min_s T(n-s) + t(s)."""
    t = {}
    for s in sizes:
        fit = [a.time_ms for a in perf.get(s, []) if a.workspace_bytes <= limit]
        if fit:
            t[s] = min(fit)
    T = [0.0] + [math.inf] * batch
    for n in range(1, batch + 1):
        T[n] = min((T[n - s] + ts for s, ts in t.items() if s <= n), default=math.inf)
    return T[batch]


def test_alexnet_conv2_all_sizes_at_64mib():
    perf = _allsizes("alexnet.conv2", "fwd")
    limit = 64 << 20
    plan_all = optimize_wr(perf, 256, limit, "all")
    plan_p2 = optimize_wr(perf, 256, limit, "powerOfTwo")
    assert plan_all.time_ms == pytest.approx(_simple_dp(perf, 256, limit, range(1, 257)), rel=1e-9)
    assert plan_p2.time_ms == pytest.approx(
        _simple_dp(perf, 256, limit, [1, 2, 4, 8, 16, 32, 64, 128, 256]), rel=1e-9)
    # What the data gives (DESIGN.md quotes it): 52+52+52+52+48, 1.37x over powerOfTwo.
    assert plan_all.describe() == "52 + 52 + 52 + 52 + 48"
    assert plan_all.workspace_bytes <= limit
    assert plan_all.undivided_time_ms / plan_all.time_ms >= 1.3
    assert plan_p2.time_ms / plan_all.time_ms >= 1.3
    assert plan_p2.time_ms / plan_all.time_ms == pytest.approx(1.37, abs=0.01)


@pytest.mark.parametrize("layer", ["alexnet.conv2", "alexnet.conv4", "resnet18.l1"])
@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
def test_all_sizes_never_worse_than_power_of_two(layer, direction):
    perf = _allsizes(layer, direction)
    batch = max(perf)
    for limit in (0, 16 << 20, 64 << 20, 256 << 20, None):
        a = optimize_wr(perf, batch, limit, "all", method="numpy")
        p = optimize_wr(perf, batch, limit, "powerOfTwo")
        u = optimize_wr(perf, batch, limit, "undivided")
        assert a.time_ms <= p.time_ms * (1 + 1e-12) <= u.time_ms * (1 + 1e-9)


@pytest.mark.parametrize("config", ["float32/m0", "float32/m3"])
@pytest.mark.parametrize("layer", ["conv1", "conv2", "conv3", "conv4", "conv5"])
@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
def test_alexnet_power_of_two_beats_undivided_at_64mib(config, layer, direction):
    perf = _pow2_table(config, f"alexnet.{layer}", direction)
    plan = optimize_wr(perf, 256, 64 << 20, "powerOfTwo")
    undivided = optimize_wr(perf, 256, 64 << 20, "undivided")
    assert plan.undivided_time_ms == undivided.time_ms
    assert plan.time_ms <= undivided.time_ms
    if layer != "conv1":
        assert plan.time_ms < undivided.time_ms
        assert plan.speedup > 1.3


@pytest.mark.parametrize("policy", ["all", "powerOfTwo"])
def test_auto_method_gives_the_networkx_plan(policy):
    """method="auto" (the default) solves with the NumPy recurrence at every DAG
    size (Note [no networkx on the planning path]), the 'all' policy's
    33k-edge DAG and powerOfTwo's small one alike; the plan is networkx's."""
    perf = _allsizes("alexnet.conv2", "bwd_data")
    for limit in (0, 64 << 20, None):
        ref = optimize_wr(perf, 256, limit, policy, method="networkx")
        assert optimize_wr(perf, 256, limit, policy) == ref
        assert optimize_wr(perf, 256, limit, policy, quantum=4) == optimize_wr(
            perf, 256, limit, policy, method="networkx", quantum=4)
    with pytest.raises(ValueError, match="auto"):
        optimize_wr(perf, 256, None, policy, method="fast")


def test_pareto_front_on_all_sizes():
    perf = _allsizes("alexnet.conv2", "bwd_data")
    front = pareto_front(perf, 256, "all")
    assert front[0].workspace_bytes == 0
    assert front[-1].time_ms == pytest.approx(_simple_dp(perf, 256, 1 << 62, range(1, 257)))
    for a, b in zip(front, front[1:]):
        assert a.workspace_bytes < b.workspace_bytes and a.time_ms > b.time_ms
    # Complete: at any limit the best plan of the front that fits is WR's optimum.
    for limit in (0, 1 << 20, 16 << 20, 64 << 20, 300 << 20, 1 << 30):
        wr = optimize_wr(perf, 256, limit, "all", method="numpy")
        assert min(p.time_ms for p in front if p.workspace_bytes <= limit) == wr.time_ms


_ENTRY = st.tuples(st.floats(0.001, 100.0), st.integers(0, 1 << 28))


@given(table=st.dictionaries(st.integers(1, 256), st.lists(_ENTRY, min_size=1, max_size=4),
                             min_size=1, max_size=9),
       limit=st.integers(1, 1 << 28), quantum=st.sampled_from([1, 2, 4, 8]))
def test_fitted_sizes_stretch_the_best_configurations_to_the_limit(table, limit, quantum):
    """Note [fitted sizes], property: each fitted size stretches the best
    configuration of a measured size whose time per sample is within
    FIT_MARGIN of the best: it lies strictly between that size and the next
    larger measured one, is new, a multiple of the quantum (where one fits),
    fits the limit with the configuration's workspace taken as proportional to
    the batch, and is the largest such size; at most FIT_MOST of them."""
    n = 256
    results = {s: [AlgoPerf(i, t, w) for i, (t, w) in enumerate(es)] for s, es in table.items()}
    got = fitted_sizes(results, n, limit, quantum)
    assert len(got) <= FIT_MOST and len(set(got)) == len(got)
    fitting = {s: [r for r in rs if r.workspace_bytes <= limit] for s, rs in results.items()}
    best = {s: min(rs, key=lambda r: (r.time_ms, r.workspace_bytes))
            for s, rs in fitting.items() if rs}
    if not best:
        assert got == []
        return
    top = min(r.time_ms / s for s, r in best.items())
    def explains(f, s):
        r = best[s]
        larger = [x for x in results if x > s]
        if not larger or r.workspace_bytes <= 0 or r.time_ms / s > (1 + FIT_MARGIN) * top:
            return False
        step = quantum if f >= quantum else 1
        return (s < f < min(larger) and f * r.workspace_bytes <= limit * s and f % step == 0
                and ((f + step) * r.workspace_bytes > limit * s or f + step >= min(larger)))

    for f in got:
        assert f not in results
        assert any(explains(f, s) for s in best)

    def stretches(s):  # the size s's best configuration stretches to, if any
        r = best[s]
        larger = [x for x in results if x > s]
        if not larger or r.workspace_bytes <= 0 or r.time_ms / s > (1 + FIT_MARGIN) * top:
            return None
        reach = s * limit // r.workspace_bytes
        f = reach - reach % quantum if reach >= quantum else reach
        return f if reach < min(larger) and f > s and f not in results else None
    wanted = {f for f in map(stretches, best) if f is not None}
    assert set(got) <= wanted and len(got) == min(FIT_MOST, len(wanted))


def test_allowed_sizes_of_fitted_are_every_measured_size():
    measured = {256: [], 64: [], 36: [], 4: [], 300: []}
    assert allowed_sizes("fitted", 256, measured) == [256, 64, 36, 4]
    assert allowed_sizes("powerOfTwo", 256, measured) == [256, 64, 4]
    assert allowed_sizes([36, 4], 256, measured) == [256, 36, 4]
