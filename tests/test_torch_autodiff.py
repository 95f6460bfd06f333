"""mucudnn.torch beyond first-order eager autograd, on the CPU (NumPy backend),
against torch's own convolutions in float64: forward-mode AD (eager dual
tensors and ``torch.func.jvp``), double backward (gradient penalties,
gradgradcheck, ``jacrev``/``jacfwd``), ``torch.func.vmap``,
``torch.compile(fullgraph=True)`` over the functional API, and the option
and backend registries (issue 34)."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch (pip install torch)")

import torch.autograd.forward_ad as fwAD  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mucudnn  # noqa: E402
import mucudnn.torch as mt  # noqa: E402
from mucudnn.backends.numpy import NumpyBackend  # noqa: E402
from mucudnn.torch import tokens  # noqa: E402
from torch_support import tensors_left_in_cycles  # noqa: E402

D = torch.float64


pytestmark = pytest.mark.usefixtures("cache_off")


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def _randn(*shape, seed=0):
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(seed))


CASES = [  # (x shape, w shape, kwargs)
    ((2, 3, 6, 6), (4, 3, 3, 3), dict(padding=1)),
    ((2, 4, 7, 5), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)),
    ((1, 2, 5, 5), (2, 2, 2, 2), dict(padding="same")),
]
CASES_3D = [((1, 2, 4, 4, 3), (3, 2, 2, 3, 2), dict(stride=(1, 2, 1), padding=1))]


def _mt_and_native(nd):
    return (mt.conv2d, F.conv2d) if nd == 2 else (mt.conv3d, F.conv3d)


# -- forward-mode AD -------------------------------------------------------------------------------

def test_eager_forward_ad_with_frozen_weights_matches_native():
    """The issue's case: no input requires grad, the input is a dual tensor."""
    x, w, b, t = _randn(2, 3, 6, 6), _randn(4, 3, 3, 3, seed=1), _randn(4, seed=2), \
        _randn(2, 3, 6, 6, seed=3)
    out = []
    for f in (mt.conv2d, F.conv2d):
        with fwAD.dual_level():
            d = fwAD.make_dual(x, t)
            y = f(d, w, b, padding=1).sum() + d.sum()
            out.append((fwAD.unpack_dual(y).primal, fwAD.unpack_dual(y).tangent))
    assert out[0][1] is not None
    _close(out[0][0], out[1][0])
    _close(out[0][1], out[1][1])


@pytest.mark.parametrize("xs,ws,kw", CASES + CASES_3D)
def test_func_jvp_in_every_operand_matches_native(xs, ws, kw):
    mine, native = _mt_and_native(len(xs) - 2)
    x, w, b = _randn(*xs), _randn(*ws, seed=1), _randn(ws[0], seed=2)
    tangents = (_randn(*xs, seed=3), _randn(*ws, seed=4), _randn(ws[0], seed=5))
    got = torch.func.jvp(lambda a, c, d: mine(a, c, d, **kw), (x, w, b), tangents)
    ref = torch.func.jvp(lambda a, c, d: native(a, c, d, **kw), (x, w, b), tangents)
    _close(got[0], ref[0])
    _close(got[1], ref[1])


def test_eager_forward_ad_of_weight_and_bias_with_grad_mode_on():
    x, w, b = _randn(2, 3, 5, 5), _randn(4, 3, 3, 3, seed=1).requires_grad_(), _randn(4, seed=2)
    wt, bt = _randn(4, 3, 3, 3, seed=3), _randn(4, seed=4)
    res = []
    for f in (mt.conv2d, F.conv2d):
        with fwAD.dual_level():
            y = f(x, fwAD.make_dual(w, wt), fwAD.make_dual(b, bt), stride=2)
            res.append(fwAD.unpack_dual(y).tangent)
    _close(res[0], res[1])


# -- double backward -------------------------------------------------------------------------------

@pytest.mark.parametrize("xs,ws,kw", CASES + CASES_3D)
def test_gradient_penalty_matches_native(xs, ws, kw):
    mine, native = _mt_and_native(len(xs) - 2)
    grads = []
    for f in (mine, native):
        x = _randn(*xs).requires_grad_()
        w = _randn(*ws, seed=1).requires_grad_()
        b = _randn(ws[0], seed=2).requires_grad_()
        loss = f(x, w, b, **kw).tanh().sum()
        gx, gw = torch.autograd.grad(loss, (x, w), create_graph=True)
        penalty = gx.square().sum() + (gw * gw.detach()).sum()
        grads.append(torch.autograd.grad(penalty, (x, w, b), allow_unused=True))
    for g, r in zip(*grads):
        if r is None:
            assert g is None or not g.any()
        else:
            _close(g, r)


@pytest.mark.slow
def test_gradcheck_and_gradgradcheck_float64():
    x = _randn(2, 2, 5, 4).requires_grad_()
    w = _randn(4, 1, 3, 2, seed=1).requires_grad_()
    b = _randn(4, seed=2).requires_grad_()

    def f(a, c, d):
        return mt.conv2d(a, c, d, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)

    assert torch.autograd.gradcheck(f, (x, w, b), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, (x, w, b), check_fwd_over_rev=True)


def test_jacrev_jacfwd_and_hessian_match_native():
    x, w = _randn(1, 2, 4, 4), _randn(3, 2, 2, 2, seed=1)
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        got = transform(lambda a, c: mt.conv2d(a, c, stride=2), argnums=(0, 1))(x, w)
        ref = transform(lambda a, c: F.conv2d(a, c, stride=2), argnums=(0, 1))(x, w)
        _close(got[0], ref[0])
        _close(got[1], ref[1])
    got = torch.func.hessian(lambda c: mt.conv2d(x, c).sin().sum())(w)
    ref = torch.func.hessian(lambda c: F.conv2d(x, c).sin().sum())(w)
    _close(got, ref)


# -- vmap ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("in_dims", [(0, None, None), (None, 0, None), (1, 0, 0), (0, 0, None)])
@pytest.mark.parametrize("xs,ws,kw", CASES + CASES_3D)
def test_vmap_matches_native(xs, ws, kw, in_dims):
    mine, native = _mt_and_native(len(xs) - 2)
    n = 3
    x = _randn(*((n,) + xs if in_dims[0] == 0 else (xs[0], n) + xs[1:] if in_dims[0] == 1
                 else xs))
    w = _randn(*((n,) + ws if in_dims[1] == 0 else ws), seed=1)
    b = _randn(*((n, ws[0]) if in_dims[2] == 0 else (ws[0],)), seed=2)
    got = torch.func.vmap(lambda a, c, d: mine(a, c, d, **kw), in_dims=in_dims)(x, w, b)
    ref = torch.func.vmap(lambda a, c, d: native(a, c, d, **kw), in_dims=in_dims)(x, w, b)
    _close(got, ref)


def test_vmap_of_grad_per_sample_gradients_match_native():
    x, w = _randn(4, 2, 5, 5), _randn(3, 2, 3, 3, seed=1)

    def loss(f, c, a):
        return f(a.unsqueeze(0), c, padding=1).square().sum()

    got = torch.func.vmap(torch.func.grad(lambda c, a: loss(mt.conv2d, c, a)),
                          in_dims=(None, 0))(w, x)
    ref = torch.func.vmap(torch.func.grad(lambda c, a: loss(F.conv2d, c, a)),
                          in_dims=(None, 0))(w, x)
    _close(got, ref)


# -- torch.compile ---------------------------------------------------------------------------------

def test_torch_compile_fullgraph_over_the_functional_api():
    torch._dynamo.reset()
    x, w, b = _randn(2, 3, 6, 6), _randn(4, 3, 3, 3, seed=1), _randn(4, seed=2)

    def f(a, c, d):
        return mt.conv2d(a, c, d, padding="same", workspace_limit=1 << 20, policy=[2, 1])

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    _close(compiled(x, w, b), F.conv2d(x, w, b, padding="same"))


# -- options and backends --------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [True, 1.0, False, 2.0])
def test_workspace_limit_of_another_type_is_refused_after_the_int_was_accepted(bad):
    x, w = _randn(1, 1, 3, 3), _randn(1, 1, 2, 2)
    mt.conv2d(x, w, workspace_limit=int(bad))
    for _ in range(2):
        with pytest.raises(mt.TorchTypeError, match="workspace_limit"):
            mt.conv2d(x, w, workspace_limit=bad)


@pytest.mark.slow
def test_one_off_backend_instances_are_not_kept():
    """See Note [backend tokens]: a registry that lives as long as its backends."""
    x, w = _randn(1, 1, 3, 3), _randn(1, 1, 2, 2)
    ref = F.conv2d(x, w)
    # backends other tests left registered and alive (the registry's shared
    # instances, given as backend= objects), held here so the counts below are ours
    others = dict(tokens._BACKEND_OBJECTS)
    refs = []
    for _ in range(1200):
        be = NumpyBackend()
        refs.append(weakref.ref(be))
        _close(mt.conv2d(x, w, backend=be), ref)
        del be
    live = sum(r() is not None for r in refs)
    assert live <= mt.MAX_CONVOLUTIONS  # held by cached Convolutions only
    assert len(tokens._BACKEND_OBJECTS) - len(others) <= mt.MAX_CONVOLUTIONS
    mt.clear()
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert set(tokens._BACKEND_OBJECTS) <= set(others)
    assert len(tokens._BACKEND_TOKENS) <= len(others)
    # a module keeps its backend (and so its token) alive
    be = NumpyBackend()
    conv = mt.Conv2d(1, 1, 2, backend=be).double()
    del be
    mt.clear()
    gc.collect()
    _close(conv(x), F.conv2d(x, conv.weight, conv.bias))
    assert isinstance(conv.backend, mucudnn.backends.Backend)


def test_training_steps_leave_no_tensor_to_the_cycle_collector():
    """A converted model's steps (first and second order, momentum) free every
    tensor by reference counting, as native ones do: none waits in a reference
    cycle, where it would stay allocated until the collector ran."""
    be = NumpyBackend()
    model = torch.nn.Sequential(
        mt.Conv2d(3, 4, 3, padding=1, backend=be), torch.nn.ReLU(),
        mt.Conv2d(4, 4, 3, padding=1, groups=2, backend=be),
        mt.ConvTranspose2d(4, 2, 2, stride=2, backend=be)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = _randn(2, 3, 6, 6).requires_grad_()

    def step():
        opt.zero_grad(set_to_none=True)
        y = model(x)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        (y.mean() + gx.square().mean()).backward()  # a gradient penalty: double backward
        opt.step()

    assert tensors_left_in_cycles(step) == []


def test_legacy_batched_gradients_and_gradcheck_batched_grad():
    """Note [legacy batched gradients]."""
    x = _randn(2, 2, 5, 4).requires_grad_()
    w = _randn(4, 1, 3, 2, seed=1).requires_grad_()
    b = _randn(4, seed=2).requires_grad_()
    kw = dict(stride=(2, 1), padding=1, groups=2)
    y, yr = mt.conv2d(x, w, b, **kw), F.conv2d(x, w, b, **kw)
    dys = _randn(3, *y.shape, seed=3)
    got = torch.autograd.grad(y, (x, w, b), dys, is_grads_batched=True)
    want = torch.autograd.grad(yr, (x, w, b), dys, is_grads_batched=True)
    for g, r in zip(got, want):
        _close(g, r)
    assert torch.autograd.gradcheck(lambda a, c, d: mt.conv2d(a, c, d, **kw), (x, w, b),
                                    check_batched_grad=True)
