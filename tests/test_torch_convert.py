"""mucudnn.torch.convert over models met in practice, on the CPU (NumPy
backend): converting twice (a re-run notebook cell, new options, WR then WD),
lazy convolutions, parametrized convolutions (weight_norm, spectral_norm),
and the warning for what stays native (issue 34)."""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch (pip install torch)")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils import parametrizations, parametrize  # noqa: E402

import mucudnn.torch as mt  # noqa: E402
from mucudnn.torch import step_guard, step_trial  # noqa: E402


pytestmark = pytest.mark.usefixtures("cache_off")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)).double()


def _x():
    return torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def _step(model):
    x = _x().requires_grad_()
    y = model(x)
    y.square().sum().backward()
    return y.detach(), x.grad


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def _hooks(m):
    """``m``'s forward hooks but the step guard's (Note [guarded steps]) and the
    step trial's end (Note [planning after the first step])."""
    return sum(not isinstance(getattr(h, "__self__", None), step_guard.StepGuard)
               and not isinstance(h, step_trial.StepEnd) for h in m._forward_hooks.values())


def test_convert_wd_twice_keeps_working_and_keeps_its_planner():
    native = _model()
    ref = _step(copy.deepcopy(native))
    model = mt.convert(copy.deepcopy(native), mode="wd", total_workspace=1 << 20)
    _close(_step(model)[0], ref[0])
    planner = model.mucudnn_planner
    mt.convert(model, mode="wd", total_workspace=1 << 20)  # the same cell run again
    assert model.mucudnn_planner is planner and _hooks(model) == 1
    for got, want in zip(_step(model), ref):
        _close(got, want)
    mt.convert(model, mode="wd", total_workspace=2 << 20)  # a new budget: a new planner
    assert model.mucudnn_planner is not planner and _hooks(model) == 1
    assert model.mucudnn_planner.total_workspace == 2 << 20
    assert model[0]._mu_plans.startswith(model.mucudnn_planner.token + ":")
    for got, want in zip(_step(model), ref):
        _close(got, want)
    assert model.mucudnn_planner.plans  # planned at that forward


def test_a_second_convert_applies_its_options_wr_then_wd_then_wr():
    model = mt.convert(_model(), workspace_limit=1 << 20)
    ref = _step(_model())
    mt.convert(model, workspace_limit=4096, policy="undivided")
    assert model[0].workspace_limit == 4096 and model[2].policy == "undivided"
    mt.convert(model, mode="wd", total_workspace=8192)
    assert model[0]._mu_plans and model[0]._mu_options.workspace_limit == 8192
    for got, want in zip(_step(model), ref):
        _close(got, want)
    assert len(model.mucudnn_planner.plans) == 2  # the WD budget is used
    mt.convert(model)  # back to WR: no planner, no hook
    assert not model[0]._mu_plans and "mucudnn_planner" not in model.__dict__
    assert _hooks(model) == 0
    for got, want in zip(_step(model), ref):
        _close(got, want)


def test_modules_built_directly_keep_their_options():
    m = nn.Sequential(mt.Conv2d(3, 4, 3, workspace_limit=4096), nn.Conv2d(4, 4, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left native
        mt.convert(m, workspace_limit=1 << 20)
    assert m[0].workspace_limit == 4096 and m[1].workspace_limit == 1 << 20


@pytest.mark.parametrize("mode", ["wr", "wd"])
def test_lazy_convolutions_convert_at_materialisation(mode):
    torch.manual_seed(2)
    model = nn.Sequential(nn.LazyConv2d(4, 3, padding=1), nn.ReLU(), nn.LazyConv2d(2, 1))
    kw = dict(mode="wd", total_workspace=1 << 20) if mode == "wd" else {}
    mt.convert(model, **kw)
    mt.clear()
    x = _x().float()
    y = model(x)
    assert type(model[0]) is mt.Conv2d and type(model[2]) is mt.Conv2d
    if mode == "wd":  # the first forward ran on mucudnn, recorded for the joint plan
        assert len(model.mucudnn_planner.plans) == 2
    else:  # the first forward ran on mucudnn
        assert len(mt.cached_convolutions()) == 2
    ref = F.conv2d(F.conv2d(x, model[0].weight, model[0].bias, padding=1).relu(),
                   model[2].weight, model[2].bias)
    torch.testing.assert_close(y, ref)


def test_lazy_conv3d_converts():
    m = mt.convert(nn.LazyConv3d(2, 2))
    x = torch.randn(1, 3, 3, 3, 3)
    y = m(x)
    assert type(m) is mt.Conv3d
    torch.testing.assert_close(y, F.conv3d(x, m.weight, m.bias))


def test_a_one_dimensional_model_converts_lazy_and_parametrized_layers_included():
    """nn.Conv1d, LazyConv1d and a weight_norm Conv1d become mucudnn's Conv1d
    and run on mucudnn (Note [one-dimensional convolutions]), with torch's
    float64 results and gradients."""
    torch.manual_seed(5)
    native = nn.Sequential(nn.Conv1d(3, 4, 3, padding=1, padding_mode="reflect"), nn.ReLU(),
                           parametrizations.weight_norm(nn.Conv1d(4, 4, 5, groups=2)),
                           nn.LazyConv1d(2, 1, stride=2)).double()
    native(torch.randn(1, 3, 12, dtype=torch.float64))  # materialise the lazy layer
    model = copy.deepcopy(native)
    model[3] = nn.LazyConv1d(2, 1, stride=2).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left native
        mt.convert(model)
    mt.clear()
    x = torch.randn(3, 3, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    xm, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    model(xm[:1])  # materialises the lazy layer as mucudnn's
    model[3].load_state_dict(native[3].state_dict())
    assert [type(model[i]) for i in (0, 3)] == [mt.Conv1d, mt.Conv1d]
    assert isinstance(model[2], mt.Conv1d) and parametrize.is_parametrized(model[2], "weight")
    mt.clear()
    y, yr = model(xm), native(xr)
    assert len(mt.cached_convolutions()) == 3
    _close(y, yr)
    y.square().sum().backward()
    yr.square().sum().backward()
    _close(xm.grad, xr.grad)
    for p, q in zip(model.parameters(), native.parameters()):
        _close(p.grad, q.grad)


@pytest.mark.parametrize("norm", ["weight_norm", "spectral_norm"])
def test_parametrized_convolutions_convert(norm):
    torch.manual_seed(3)
    make = getattr(parametrizations, norm)
    native = nn.Sequential(make(nn.Conv2d(3, 4, 3)), nn.ReLU(), make(nn.Conv3d(1, 1, 1))).double()
    model = copy.deepcopy(native)
    mt.convert(model)
    assert isinstance(model[0], mt.Conv2d) and isinstance(model[2], mt.Conv3d)
    assert parametrize.is_parametrized(model[0], "weight")
    assert model.state_dict().keys() == native.state_dict().keys()
    mt.clear()
    native.eval()
    model.eval()  # spectral_norm's power iteration runs in training mode only
    x = _x().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    y, yr = model[0](x), native[0](xr)
    assert mt.cached_convolutions()
    _close(y, yr)
    y.square().sum().backward()
    yr.square().sum().backward()
    _close(x.grad, xr.grad)
    for p, q in zip(model[0].parameters(), native[0].parameters()):
        _close(p.grad, q.grad)
    copy.deepcopy(model)
    parametrize.remove_parametrizations(model[0], "weight")
    assert type(model[0]) is mt.Conv2d


def test_a_settled_call_runs_the_classes_own_torch_convolution(monkeypatch):
    """See Note [host cost of a converted layer]: a settled signature runs the
    ``_conv_forward`` that ``super()`` would find past the mixin, for Conv2d,
    Conv3d and the class parametrize makes over a converted one; none of
    mucudnn's path runs, and the result is torch's own."""
    from mucudnn.torch import engine, modules
    torch.manual_seed(4)
    native = nn.Sequential(parametrizations.weight_norm(nn.Conv2d(3, 4, 3)),
                           nn.Conv3d(1, 2, 2, padding=1), nn.Conv2d(3, 2, 1)).double()
    model = mt.convert(copy.deepcopy(native))
    assert type(model[1])._mu_torch_conv is nn.Conv3d._conv_forward
    assert type(model[0])._mu_torch_conv is nn.Conv2d._conv_forward
    assert type(model[0]) is not mt.Conv2d and isinstance(model[0], mt.Conv2d)
    for m in model:
        monkeypatch.setattr(m, "_mu_forward", lambda *a: pytest.fail("mucudnn's path ran"))
    for i, x in ((0, _x()), (1, torch.randn(2, 1, 3, 4, 5, dtype=torch.float64)), (2, _x())):
        sig = modules._signature(x, model[i].weight)
        model[i]._mu_torch = (engine.GENERATION[0], frozenset({sig}), frozenset({sig}))
        torch.testing.assert_close(model[i](x), native[i](x), rtol=0, atol=0)


def test_conv_subclasses_left_native_are_named_in_a_warning():
    class MyConv(nn.Conv2d):
        pass

    m = nn.Sequential(nn.Conv2d(1, 1, 1), nn.Sequential(MyConv(1, 1, 1)))
    with pytest.warns(mt.ConvertWarning, match=r"1\.0 \(MyConv\)"):
        mt.convert(m)
    assert type(m[1][0]) is MyConv and type(m[0]) is mt.Conv2d
    # transposed convolutions convert; a subclass of one it does not know is named
    class MyTransposed(nn.ConvTranspose2d):
        pass

    t = nn.Sequential(nn.Conv1d(1, 1, 1), nn.ConvTranspose2d(1, 1, 1), MyTransposed(1, 1, 1),
                      nn.ConvTranspose1d(1, 1, 1))
    with pytest.warns(mt.ConvertWarning) as got:
        mt.convert(t)
    (w,) = got
    assert "2 (MyTransposed)" in str(w.message) and "not held to the limit" in str(w.message)
    assert "1 (" not in str(w.message) and "3 (" not in str(w.message)
    assert [type(m) for m in t] == [mt.Conv1d, mt.ConvTranspose2d, MyTransposed,
                                    mt.ConvTranspose1d]


def test_a_converted_model_on_meta_tensors_runs_torch_and_the_functional_form_names_the_device():
    """Shape inference and deferred initialisation run on ``meta`` tensors, where
    mucudnn does not run: a converted module runs torch's own convolution there
    (forward and backward); ``mt.conv2d`` says which device it cannot take."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1))
    mt.convert(model)
    y = model(torch.empty(2, 3, 8, 8, device="meta"))
    assert y.shape == (2, 2, 8, 8) and y.is_meta
    y.sum().backward()
    assert model[0].weight.grad.shape == model[0].weight.shape
    model.to_empty(device="cpu")  # deferred initialisation: then mucudnn's path
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    x = torch.randn(2, 3, 8, 8)
    ref = F.conv2d(F.relu(F.conv2d(x, model[0].weight, model[0].bias, padding=1)),
                   model[2].weight, model[2].bias)
    assert torch.allclose(model(x), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(mt.TorchValueError, match=r"^input: .*meta"):
        mt.conv2d(torch.empty(1, 3, 8, 8, device="meta"), torch.empty(4, 3, 3, 3, device="meta"))
