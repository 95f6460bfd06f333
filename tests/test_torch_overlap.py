"""Note [overlapped backward] on a CUDA GPU (marker ``gpu``): a converted layer's
backward-data and backward-filter run at once on two streams and give float64's
gradients, whichever side (plan or PyTorch's call) runs each; a captured step
replays them; the first call times the pair where a plan runs a backward
direction and the report says which way runs. The rule itself (which layers may
overlap, when they do) is checked on the CPU in its doctests and in
test_torch_calibrate.py.

Run: ``python -m pytest -q -m gpu tests/test_torch_overlap.py``
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import mucudnn.torch as mt  # noqa: E402
from mucudnn.problem import Direction  # noqa: E402
from mucudnn.torch import engine, native, overlap, step_trial  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")]

FMA_TOL, BF16_TOL = 1e-5, 2e-2
#: A grouped 3x3 in channels-last: the kind of layer whose backward-filter runs a plan
KW = dict(stride=1, padding=1, groups=8)


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.delenv("MUCUDNN_TORCH_SEARCH", raising=False)
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    mt.clear()
    yield
    mt.clear()
    torch.backends.cudnn.allow_tf32 = old


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _operands(dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(16, 64, 28, 28, device="cuda", generator=g).to(dtype)
    w = (torch.randn(64, 8, 3, 3, device="cuda", generator=g) / 10).to(dtype)
    cl = torch.channels_last
    return x.to(memory_format=cl), w.to(memory_format=cl)


def _float64(x, w, dy):
    x64, w64 = (t.detach().double().requires_grad_(True) for t in (x, w))
    y = F.conv2d(x64, w64, **KW)
    gx, gw = torch.autograd.grad(y, (x64, w64), dy.double())
    return y.detach(), gx, gw


def _forced(x, w, sides):
    """The warm record of (x, w)'s signature after its first call, set to overlap
    its backward pair with ``sides`` (PyTorch's call for dx, for dw)."""
    mt.conv2d(x, w, workspace_limit=64 << 20, **KW)
    warm = engine.last_warm()
    assert warm is not None
    warm.overlap, warm.captured, warm.host_pending = True, None, False
    warm.native = (warm.native[0],) + tuple(sides)
    return warm


def _counted(monkeypatch):
    calls = []
    real = overlap.run_pair

    def run_pair(dx_fn, dw_fn, index):
        calls.append(torch.cuda.is_current_stream_capturing())
        return real(dx_fn, dw_fn, index)

    monkeypatch.setattr(overlap, "run_pair", run_pair)
    return calls


@pytest.mark.parametrize("sides", [(False, False), (True, False), (False, True)],
                         ids=["plans", "torch-dx", "torch-dw"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, FMA_TOL), (torch.bfloat16, BF16_TOL)],
                         ids=["fp32", "bf16"])
def test_an_overlapped_backward_matches_float64(sides, dtype, tol, monkeypatch):
    x, w = _operands(dtype)
    _forced(x, w, sides)
    calls = _counted(monkeypatch)
    xs, ws = (t.detach().clone().requires_grad_(True) for t in (x, w))
    y = mt.conv2d(xs, ws, workspace_limit=64 << 20, **KW)
    dy = (1 + y.detach().double() / 10)
    y.backward(dy.to(dtype))
    y64, gx, gw = _float64(x, w, dy)
    assert calls == [False]  # the pair ran through run_pair, eagerly
    assert rel(y, y64) < tol
    assert rel(xs.grad, gx) < tol * (10 if dtype == torch.float32 else 1)
    assert rel(ws.grad, gw) < tol * (10 if dtype == torch.float32 else 1)
    assert xs.grad.dtype == dtype and ws.grad.is_contiguous(memory_format=torch.channels_last)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 9), groups=st.sampled_from([1, 2, 4]), per=st.integers(1, 6),
       k=st.integers(1, 3), hw=st.tuples(st.integers(3, 12), st.integers(3, 12)),
       stride=st.integers(1, 2), padding=st.integers(0, 2), dilation=st.integers(1, 2),
       cl=st.booleans(), sides=st.sampled_from([(False, False), (True, False), (False, True)]))
def test_overlapped_backward_matches_float64_on_random_convolutions(
        n, groups, per, k, hw, stride, padding, dilation, cl, sides):
    """Random shapes, strides, paddings, dilations, groups and layouts: the
    overlapped pair's gradients are float64's, whichever side runs each."""
    reach = dilation * 2 + 1
    if min(hw) + 2 * padding < reach:
        return
    fmt = torch.channels_last if cl else torch.contiguous_format
    g = torch.Generator(device="cuda").manual_seed(n * 31 + per)
    x = torch.randn(n, groups * per, *hw, device="cuda", generator=g).to(memory_format=fmt)
    w = (torch.randn(groups * k, per, 3, 3, device="cuda", generator=g) / 10
         ).to(memory_format=fmt)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    mt.conv2d(x, w, workspace_limit=64 << 20, **kw)
    warm = engine.last_warm()
    warm.overlap, warm.captured, warm.host_pending = True, None, False
    warm.native = (warm.native[0],) + tuple(sides)
    xs, ws = (t.detach().clone().requires_grad_(True) for t in (x, w))
    y = mt.conv2d(xs, ws, workspace_limit=64 << 20, **kw)
    dy = 1 + y.detach().double() / 10
    y.backward(dy.float())
    x64, w64 = (t.detach().double().requires_grad_(True) for t in (x, w))
    gx, gw = torch.autograd.grad(F.conv2d(x64, w64, **kw), (x64, w64), dy)
    assert rel(xs.grad, gx) < 10 * FMA_TOL and rel(ws.grad, gw) < 10 * FMA_TOL


def test_an_overlapped_backward_is_captured_and_replays_float64s_gradients(monkeypatch):
    """The second stream forks from the capturing stream and joins it inside the
    capture: each replay computes the new operands' gradients."""
    x, w = _operands(torch.float32)
    _forced(x, w, (True, False))
    calls = _counted(monkeypatch)
    sx, sw = (t.detach().clone().requires_grad_(True) for t in (x, w))
    sdy = torch.empty(16, 64, 28, 28, device="cuda").to(memory_format=torch.channels_last)
    sdy.copy_(torch.randn_like(sdy))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph asks
        for _ in range(2):
            torch.autograd.grad(mt.conv2d(sx, sw, workspace_limit=64 << 20, **KW), (sx, sw), sdy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mt.conv2d(sx, sw, workspace_limit=64 << 20, **KW)
        gx, gw = torch.autograd.grad(y, (sx, sw), sdy)
    assert calls[-1] is True
    for seed in (1, 2):
        nx, nw = _operands(torch.float32, seed)
        with torch.no_grad():
            sx.copy_(nx)
            sw.copy_(nw)
            sdy.copy_(torch.randn_like(sdy))
        graph.replay()
        torch.cuda.synchronize()
        y64, gx64, gw64 = _float64(nx, nw, sdy)
        assert rel(y, y64) < FMA_TOL
        assert rel(gx, gx64) < 10 * FMA_TOL and rel(gw, gw64) < 10 * FMA_TOL


def test_the_first_call_times_the_pair_and_the_report_says_it_runs_at_once(monkeypatch):
    """A backward-filter that runs a plan (made so here) beside PyTorch's
    backward-data, both within the limit: the first call times the pair, the
    layer overlaps where that is faster (every time here: MARGIN made negative),
    the report shows both times, and training steps give float64's gradients."""
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "all")
    monkeypatch.setattr(native, "settle", lambda choices, *_: choices)
    monkeypatch.setattr(overlap, "MARGIN", -1.0)
    real_decide = native.decide

    def decide(d, plan_ms, torch_ms, ws, limit):
        c = real_decide(d, plan_ms, torch_ms, ws, limit)
        want = native.MUCUDNN if d is Direction.BACKWARD_FILTER else native.TORCH
        return native.Choice(d, want, c.plan_ms, c.torch_ms, c.torch_workspace, c.limit,
                             "made so by the test")

    monkeypatch.setattr(native, "decide", decide)
    calls = _counted(monkeypatch)
    torch.manual_seed(3)
    conv = nn.Conv2d(64, 64, 3, bias=False, **KW).cuda().to(memory_format=torch.channels_last)
    model = mt.convert(nn.Sequential(conv), workspace_limit=64 << 20)
    step_trial.drop(model)  # its layer keeps the plan's way: no trial moves it
    weight = model[0].weight
    x, _ = _operands(torch.float32)
    xs = x.detach().clone().requires_grad_(True)
    for _ in range(3):
        xs.grad = None
        weight.grad = None
        y = model(xs)
        dy = (1 + y.detach().double() / 10)
        y.backward(dy.float())
        y64, gx, gw = _float64(x, weight, dy)
        assert rel(xs.grad, gx) < 10 * FMA_TOL and rel(weight.grad, gw) < 10 * FMA_TOL
    recs = [r for r in native.records() if r.overlap is not None]
    assert len(recs) == 1 and recs[0].overlapped and min(recs[0].overlap) > 0
    assert calls  # the steps after the first ran the pair at once
    rep = mt.report(model)
    (layer,) = rep.layers
    assert layer.overlapped and layer.overlap_ms == recs[0].overlap
    assert "| bwd pair | at once |" in str(rep)
    assert rep.as_dict()["layers"][0]["overlapped"] is True
