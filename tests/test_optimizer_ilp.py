"""WD (optimize_wd): against brute force on small instances; budgets and errors."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mucudnn.optimizer import optimize_wd, pareto_front
from mucudnn.problem import AlgoPerf, MicroBatch, Plan, make_plan


def plan(ws: int, t: float) -> Plan:
    mb = MicroBatch(offset=0, size=1, algo=0, workspace_bytes=ws, time_ms=t)
    return make_plan([mb], undivided_time_ms=t, workspace_limit=ws)


@st.composite
def fronts(draw, zero=True):
    if zero is None:
        zero = draw(st.booleans())
    n = draw(st.integers(1, 5))
    out = {}
    for k in range(n):
        m = draw(st.integers(1, 4))
        ws = sorted(draw(st.sets(st.integers(1, 1000), min_size=m, max_size=m)))
        if zero:
            ws[0] = 0
        ts = sorted(draw(st.lists(st.floats(0.1, 100.0), min_size=m, max_size=m)), reverse=True)
        out[f"k{k}"] = [plan(w, t) for w, t in zip(ws, ts)]
    return out


def brute(fr, budget):
    keys = list(fr)
    best = math.inf
    for combo in itertools.product(*(fr[k] for k in keys)):
        if sum(p.workspace_bytes for p in combo) <= budget:
            best = min(best, sum(p.time_ms for p in combo))
    return best


@given(fronts(zero=None), st.integers(0, 3000))
def test_wd_equals_brute_force(fr, budget):
    expect = brute(fr, budget)
    if math.isinf(expect):
        with pytest.raises(ValueError, match="infeasible"):
            optimize_wd(fr, budget)
        return
    chosen = optimize_wd(fr, budget)
    assert set(chosen) == set(fr)
    for k, p in chosen.items():
        assert any(p is q for q in fr[k])
    assert sum(p.workspace_bytes for p in chosen.values()) <= budget
    assert sum(p.time_ms for p in chosen.values()) == pytest.approx(expect, rel=1e-6)


@given(fronts(), st.integers(0, 3000))
def test_more_budget_never_hurts(fr, budget):
    a = sum(p.time_ms for p in optimize_wd(fr, budget).values())
    b = sum(p.time_ms for p in optimize_wd(fr, budget + 500).values())
    assert b <= a * (1 + 1e-6)


def test_zero_budget_takes_the_zero_workspace_plans():
    fr = {"a": [plan(0, 5.0), plan(100, 1.0)], "b": [plan(0, 3.0), plan(50, 2.0)]}
    chosen = optimize_wd(fr, 0)
    assert chosen["a"].workspace_bytes == chosen["b"].workspace_bytes == 0


def test_budget_trade_off():
    fr = {"a": [plan(0, 5.0), plan(100, 1.0)], "b": [plan(0, 3.0), plan(60, 2.0)],
          "c": [plan(0, 4.0), plan(50, 1.5)]}
    chosen = optimize_wd(fr, 150)  # a (saves 4) + c (saves 2.5) = 150 bytes
    assert [chosen[k].workspace_bytes for k in "abc"] == [100, 0, 50]
    chosen = optimize_wd(fr, 10 ** 6)
    assert [chosen[k].workspace_bytes for k in "abc"] == [100, 60, 50]


def test_errors():
    fr = {"a": [plan(0, 5.0)]}
    with pytest.raises(ValueError, match="total_workspace"):
        optimize_wd(fr, -1)
    with pytest.raises(ValueError, match="no candidate"):
        optimize_wd({"a": []}, 10)
    with pytest.raises(ValueError, match="infeasible"):
        optimize_wd({"a": [plan(20, 1.0)], "b": [plan(20, 1.0)]}, 30)
    assert optimize_wd({}, 0) == {}


def test_with_real_fronts():
    # Two kernels whose fast algorithms need workspace: 1 MiB buys only one of them.
    perf_a = {8: [AlgoPerf(1, 1.0, 1 << 20), AlgoPerf(0, 4.0, 0)],
              4: [AlgoPerf(1, 0.6, 1 << 19), AlgoPerf(0, 2.0, 0)]}
    perf_b = {8: [AlgoPerf(1, 2.0, 1 << 20), AlgoPerf(0, 3.0, 0)],
              4: [AlgoPerf(1, 1.2, 1 << 19), AlgoPerf(0, 1.5, 0)]}
    fr = {("a", "fwd"): pareto_front(perf_a, 8, "powerOfTwo"),
          ("b", "fwd"): pareto_front(perf_b, 8, "powerOfTwo")}
    chosen = optimize_wd(fr, 1 << 20)  # 2 x 4 on both (1.2 + 2.4) beats 8 + zero (1.0 + 3.0)
    assert chosen[("a", "fwd")].describe() == chosen[("b", "fwd")].describe() == "2 x 4"
    chosen = optimize_wd(fr, 1 << 19)
    assert chosen[("a", "fwd")].describe() == "2 x 4"
    assert chosen[("b", "fwd")].workspace_bytes == 0
    chosen = optimize_wd(fr, 3 << 19)  # 1.2 + 2.0 beats 1.0 + 2.4
    assert chosen[("a", "fwd")].workspace_bytes == 1 << 19
    assert chosen[("b", "fwd")].workspace_bytes == 1 << 20
