"""Interleaved timing (Note [interleaved timing] in mucudnn/bench.py): the
order in which plans run, and which time goes to which plan."""

from __future__ import annotations

import math

import pytest

from mucudnn import bench
from mucudnn.backends import get_backend
from mucudnn.cuda import time_interleaved


def test_cpu_timer_warms_each_function_then_runs_them_in_turn():
    calls: list[str] = []
    timer = bench.make_interleaved_timer(get_backend("numpy"))
    times = timer([lambda: calls.append("a"), lambda: calls.append("b"),
                   lambda: calls.append("c")], 2, 3)
    assert calls == ["a", "a", "b", "b", "c", "c"] + ["a", "b", "c"] * 3
    assert len(times) == 3 and all(t >= 0 and math.isfinite(t) for t in times)


def test_make_timer_is_the_interleaved_timer_with_one_function():
    calls: list[int] = []
    t = bench.make_timer(get_backend("numpy"))(lambda: calls.append(1), 1, 4)
    assert len(calls) == 5 and t >= 0


@pytest.mark.parametrize("kw, match", [({"repeat": 0}, "repeat >= 1"),
                                       ({"warmup": -1}, "warmup >= 0")])
def test_time_interleaved_validates_arguments_before_any_device_work(kw, match):
    with pytest.raises(ValueError, match=match):
        time_interleaved([lambda: None], None, **kw)


def test_time_interleaved_needs_a_function():
    with pytest.raises(ValueError, match="fns: expected at least one function"):
        time_interleaved([], None)


@pytest.mark.slow
def test_run_network_times_plan_undivided_and_unlimited_together(monkeypatch):
    """Each kernel's three plans go to one interleaved timing, in the order
    plan, undivided, unlimited, and each time lands in its own field."""
    seen: list[int] = []

    def fake_timer(backend):
        def timer(fns, warmup, repeat):
            seen.append(len(fns))
            for fn in fns:  # the launchers must run
                fn()
            if len(fns) == 1:  # a micro-batch timed alone
                return [5.0]
            return [10.0, 20.0, 30.0][:len(fns) - 1] + [30.0]
        return timer

    monkeypatch.setattr(bench, "make_interleaved_timer", fake_timer)
    r = bench.run_network("alexnet", batch=2, backend="numpy", repeat=1, warmup=0,
                          layers=["conv5"], directions=["forward", "backward_filter"],
                          workspace_limit=1 << 30, progress=False, cache=False)
    together = [n for n in seen if n > 1]
    assert all(n in (2, 3) for n in together) and len(together) == len(r.kernels) == 2
    for k, n in zip(r.kernels, together):
        assert k.micro_ms == 10.0 and k.unlimited_ms == 30.0
        assert k.undivided_ms == (20.0 if n == 3 else math.inf)
        assert k.kernels_alone_ms == 5.0 * len(k.plan.micro_batches)
