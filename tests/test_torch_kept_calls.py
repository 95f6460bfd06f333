"""A converted module's kept warm calls on a CUDA GPU (Note [a module's warm
calls] in mucudnn/torch/modules.py): a call after the first runs its kept
record, with results and gradients against float64, and every change the
checked path would see (module attributes, bias, autocast, grad mode,
``torch.func``, the engine's clearing) is honoured.

Run: ``python -m pytest -q -m gpu tests/test_torch_kept_calls.py``
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")

import torch.nn.functional as F  # noqa: E402

import mucudnn.torch as mt  # noqa: E402
from mucudnn.torch import engine, modules  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")]

FMA_TOL, BF16_TOL = 1e-5, 2e-2


@pytest.fixture(autouse=True)
def _plans_run(tmp_path, monkeypatch):
    """Every direction on mucudnn's plans (no comparison with PyTorch's call),
    FMA math, a cache of its own."""
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("MUCUDNN_TORCH_NATIVE", "0")
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    engine.clear()
    yield
    torch.backends.cudnn.allow_tf32 = old
    engine.clear()


@pytest.fixture
def kept_runs(monkeypatch):
    """Counts calls that ran a kept record."""
    n = [0]
    real = modules.ops.apply_warm

    def counted(*args):
        y = real(*args)
        n[0] += y is not None
        return y

    monkeypatch.setattr(modules.ops, "apply_warm", counted)
    return n


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def reference(conv, x):
    """float64 output and gradients of ``conv`` (its current attributes) for dy = 1 + y/10."""
    x64 = x.detach().double().requires_grad_(True)
    w64 = conv.weight.detach().double().requires_grad_(True)
    b64 = None if conv.bias is None else conv.bias.detach().double().requires_grad_(True)
    y = F.conv2d(x64, w64, b64, conv.stride, conv.padding, conv.dilation, conv.groups)
    dy = 1 + y.detach() / 10
    y.backward(dy)
    return y.detach(), dy, x64.grad, w64.grad, None if b64 is None else b64.grad


def check(conv, x, tol=FMA_TOL):
    """One forward and backward of ``conv`` against float64."""
    x = x.detach().requires_grad_(True)
    conv.zero_grad(set_to_none=True)
    y = conv(x)
    ry, dy, rdx, rdw, rdb = reference(conv, x)
    y.backward(dy.to(y.dtype))
    assert rel(y, ry) < tol
    assert rel(x.grad, rdx) < tol and rel(conv.weight.grad, rdw) < tol
    if rdb is not None:
        assert rel(conv.bias.grad, rdb) < tol


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "nhwc"])
def test_later_calls_run_the_kept_record_and_match_float64(cl, kept_runs):
    conv = mt.Conv2d(16, 32, 3, padding=1, groups=2).cuda()
    x = torch.randn(8, 16, 12, 12, device="cuda")
    if cl:
        conv = conv.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    check(conv, x)  # the checked path, which keeps the record
    assert kept_runs[0] == 0 and len(conv._mu_warm[1]) == 1
    for _ in range(2):
        check(conv, x)
    assert kept_runs[0] == 2
    with torch.no_grad():  # no autograd: the record's forward
        y = conv(x.detach().requires_grad_(True))  # the signature the record was kept for
    assert kept_runs[0] == 3 and not y.requires_grad
    assert rel(y, reference(conv, x)[0]) < FMA_TOL


def test_module_and_bias_changes_take_the_checked_path(kept_runs):
    conv = mt.Conv2d(8, 8, 3, padding=1).cuda()
    x = torch.randn(4, 8, 10, 10, device="cuda")
    check(conv, x)
    conv.padding = (0, 0)  # a new configuration: checked, and kept for itself
    check(conv, x)
    assert kept_runs[0] == 0
    check(conv, x)
    assert kept_runs[0] == 1
    conv.stride = (2, 2)
    check(conv, x)
    assert kept_runs[0] == 1
    conv.bias = None  # the bias's signature changed
    check(conv, x)
    assert kept_runs[0] == 1
    conv.bias = torch.nn.Parameter(torch.randn(8, device="cuda", dtype=torch.float64))
    with pytest.raises(TypeError, match="bias"):  # as the checked path says it
        conv(x)
    assert kept_runs[0] == 1


def test_a_new_input_signature_is_checked_first(kept_runs):
    conv = mt.Conv2d(4, 4, 3).cuda()
    check(conv, torch.randn(2, 4, 9, 9, device="cuda"))
    check(conv, torch.randn(3, 4, 9, 9, device="cuda"))
    assert kept_runs[0] == 0 and len(conv._mu_warm[1]) == 2
    with pytest.raises(ValueError, match="input"):  # still the checked path's errors
        conv(torch.randn(3, 5, 9, 9, device="cuda"))


def test_autocast_casts_as_the_checked_path(kept_runs):
    conv = mt.Conv2d(16, 16, 3, padding=1).cuda()
    x = torch.randn(4, 16, 8, 8, device="cuda")
    outs = []
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs.append(conv(x))
    assert kept_runs[0] == 1
    ref = reference(conv, x)[0]
    for y in outs:
        assert y.dtype == torch.bfloat16 and rel(y, ref) < BF16_TOL
    check(conv, x)  # autocast off: another signature, checked first
    assert kept_runs[0] == 1


def test_torch_func_and_clearing_take_the_checked_path(kept_runs):
    conv = mt.Conv2d(4, 6, 3).cuda()
    x = torch.randn(2, 4, 7, 7, device="cuda")
    check(conv, x)
    params = dict(conv.named_parameters())

    def loss(p):
        return torch.func.functional_call(conv, p, (x,)).square().sum()

    grads = torch.func.grad(loss)(params)
    assert kept_runs[0] == 0  # under a transform: not the kept record
    w64 = conv.weight.detach().double().requires_grad_(True)
    b64 = conv.bias.detach().double().requires_grad_(True)
    F.conv2d(x.double(), w64, b64).square().sum().backward()
    assert rel(grads["weight"], w64.grad) < FMA_TOL and rel(grads["bias"], b64.grad) < FMA_TOL
    check(conv, x)
    assert kept_runs[0] == 1
    engine.clear()  # the engine's records are gone: so are the module's
    check(conv, x)
    assert kept_runs[0] == 1
    check(conv, x)
    assert kept_runs[0] == 2
