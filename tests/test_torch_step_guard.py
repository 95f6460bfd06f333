"""See Note [guarded steps]: once two checked training forwards agree, a settled
layer runs torch.nn's own call with no check, and only while its forward's
key, weight and calls are those checked. On the CPU the layers are settled by
hand and the step trial's way is kept by hand; on a GPU (marker ``gpu``) a
trained converted model gets there by itself and still matches float64.
"""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import mucudnn.torch as mt  # noqa: E402
from mucudnn.torch import engine, modules, step_guard, step_trial  # noqa: E402
from mucudnn.torch.step_trial import TORCH  # noqa: E402
from torch_support import step_against_float64  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")


class Watch:
    """Per converted layer, what each call ran: ``"armed"`` (torch.nn's call set
    on the instance by the guard, none of mucudnn's code) or ``"checked"`` (the
    mixin's ``_conv_forward``); from forward pre-hooks on the layers and a
    wrapper on the mixin's call."""

    def __init__(self, model: nn.Module, mp: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        self.names = {m: n for n, m in model.named_modules()
                      if isinstance(m, modules.MucudnnConvMixin)}
        for m in self.names:
            m.register_forward_pre_hook(self._pre)
        real = modules.MucudnnConvMixin._conv_forward

        def checked(layer, x, w, b):
            name, how = self.calls[-1]
            self.calls[-1] = (name, "checked" if how == "?" else how + " and checked")
            return real(layer, x, w, b)
        mp.setattr(modules.MucudnnConvMixin, "_conv_forward", checked)

    def _pre(self, m: nn.Module, args: tuple) -> None:
        self.calls.append((self.names[m], "armed" if "_conv_forward" in m.__dict__ else "?"))

    def run(self, call) -> dict[str, list[str]]:
        """``call()``'s converted calls: layer name -> what each ran."""
        self.calls.clear()
        call()
        out: dict[str, list[str]] = {}
        for name, how in self.calls:
            out.setdefault(name, []).append(how)
        return out


def _settle(model: nn.Module, *xs: torch.Tensor) -> None:
    """Settle every converted layer of ``model`` on PyTorch's call for the
    signatures its layers meet on ``xs`` (as a GPU's first calls would), and
    keep the step trial's PyTorch way."""
    seen: dict[nn.Module, set] = {}

    def pre(m, args):
        seen.setdefault(m, set()).add(modules._signature(args[0], m.weight))
    convs = [m for m in model.modules() if isinstance(m, modules.MucudnnConvMixin)]
    handles = [m.register_forward_pre_hook(pre) for m in convs]
    for x in xs:
        model(x)
    for h in handles:
        h.remove()
    for m in convs:
        sigs = frozenset(seen.get(m, ()))
        m._mu_torch = (engine.GENERATION[0], sigs, sigs)
    trial = step_trial.trial_of(model)
    trial.kept, trial.torch = TORCH, True


def _model() -> nn.Module:
    torch.manual_seed(0)
    return mt.convert(nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(),
                                    nn.Conv2d(4, 3, 1, groups=1), nn.ReLU(),
                                    nn.Conv2d(3, 3, 3, groups=3)))


def _reference(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model``'s forward in float64 through torch.nn.functional alone."""
    y = x.double()
    for m in model:
        if isinstance(m, nn.Conv2d):
            y = F.conv2d(y, m.weight.double(), m.bias.double(), m.stride, m.padding,
                         m.dilation, m.groups)
        else:
            y = m(y)
    return y


def test_two_agreeing_checked_forwards_leave_later_ones_unchecked(monkeypatch):
    model = _model()
    x = torch.randn(2, 2, 6, 6)
    _settle(model, x)
    watch = Watch(model, monkeypatch)
    every = {"0", "2", "4"}
    for _ in range(2):
        ran = watch.run(lambda: model(x))
        assert set(ran) == every and all(v == ["checked"] for v in ran.values())
    assert {watch.names[m] for m, _ in step_guard.guard_of(model).guarded} == every
    for _ in range(3):
        out: list[torch.Tensor] = []
        ran = watch.run(lambda: out.append(model(x)))  # noqa: B023 (called at once)
        assert ran == {n: ["armed"] for n in every}
        torch.testing.assert_close(out[0].double(), _reference(model, x), rtol=1e-5, atol=1e-6)
        out[0].square().sum().backward()  # the backward of torch's own convolutions
    # nothing set on the instances outside the forward
    assert not any("_conv_forward" in m.__dict__ for m in watch.names)
    # a call outside the root's forward is checked
    assert watch.run(lambda: model[0](x)) == {"0": ["checked"]}


def _all(ran: dict[str, list[str]], how: str) -> bool:
    return bool(ran) and all(v == [how] for v in ran.values())


def test_another_key_weight_or_flag_is_checked_again(monkeypatch):
    model = _model()
    x, x3 = torch.randn(2, 2, 6, 6), torch.randn(3, 2, 6, 6)
    _settle(model, x, x3)
    watch = Watch(model, monkeypatch)
    for _ in range(2):
        watch.run(lambda: model(x))
    assert _all(watch.run(lambda: model(x)), "armed")
    # another batch: another key, checked until two forwards of it agree
    for _ in range(2):
        assert _all(watch.run(lambda: model(x3)), "checked")
    assert _all(watch.run(lambda: model(x3)), "armed")
    # back to the first batch size: a new key again
    assert _all(watch.run(lambda: model(x)), "checked")
    watch.run(lambda: model(x))
    assert _all(watch.run(lambda: model(x)), "armed")
    # a weight that changed layout: the forward is checked again, every layer of it
    # (the first layer's output, the next one's input, follows its weight's layout)
    w = model[0].weight
    w.data = w.data.contiguous(memory_format=torch.channels_last)
    assert w.stride() != w.contiguous().stride()
    out: list[torch.Tensor] = []
    ran = watch.run(lambda: out.append(model(x)))
    assert _all(ran, "checked")
    torch.testing.assert_close(out[0].double(), _reference(model, x), rtol=1e-5, atol=1e-6)
    # a flag that decides signatures (TF32) makes another key
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=not torch.backends.cudnn.allow_tf32):
        assert _all(watch.run(lambda: model(x)), "checked")
    # so do autocast and the gradient need of an argument
    assert _all(watch.run(lambda: model(x.clone().requires_grad_())), "checked")
    # mucudnn.torch.clear() forgets the verdicts and the guard's layers
    mt.clear()
    assert _all(watch.run(lambda: model(x)), "checked")
    assert step_guard.guard_of(model).guarded == ()


def test_a_layer_settled_late_joins_the_guarded_ones(monkeypatch):
    model = _model()
    x = torch.randn(2, 2, 6, 6)
    _settle(model, x)
    late = model[2]._mu_torch
    model[2]._mu_torch = (late[0], frozenset(), late[2] - late[2])
    watch = Watch(model, monkeypatch)
    for _ in range(2):
        watch.run(lambda: model(x))
    assert watch.run(lambda: model(x)) == {"0": ["armed"], "2": ["checked"], "4": ["armed"]}
    model[2]._mu_torch = late
    watch.run(lambda: model(x))  # the first forward that settles it
    assert watch.run(lambda: model(x)) == {"0": ["armed"], "2": ["checked"], "4": ["armed"]}
    assert _all(watch.run(lambda: model(x)), "armed")


class Pyramid(nn.Module):
    """One converted layer called twice a forward, on two sizes (as a
    feature pyramid's shared head), and a checkpointed block."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(2, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 4, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = torch.utils.checkpoint.checkpoint(self.block, y, use_reentrant=False)
        small = self.head(F.avg_pool2d(y, 2))
        return self.head(y).mean() + small.mean()


def _pyramid_reference(m: Pyramid, x: torch.Tensor) -> torch.Tensor:
    def conv(layer, t):
        return F.conv2d(t, layer.weight.double(), layer.bias.double(), padding=layer.padding)
    y = conv(m.stem, x.double())
    y = conv(m.block[0], y).relu()
    return conv(m.head, y).mean() + conv(m.head, F.avg_pool2d(y, 2)).mean()


def test_a_layer_called_twice_and_a_checkpointed_block_are_guarded_and_match_float64(monkeypatch):
    """The head's two calls (two sizes) are both settled and recorded, so it is
    guarded; the checkpointed block's recomputation in the backward runs
    after the post-hook, so it is checked; gradients match float64."""
    torch.manual_seed(2)
    model = mt.convert(Pyramid())
    x = torch.randn(2, 2, 8, 8)
    _settle(model, x)
    assert len(model.head._mu_torch[1]) == 2
    watch = Watch(model, monkeypatch)
    for _ in range(2):
        watch.run(lambda: model(x))
    ref = Pyramid().double()
    ref.load_state_dict(model.state_dict())  # float64 copies of the weights
    for _ in range(2):
        model.zero_grad()
        out: list[torch.Tensor] = []
        ran = watch.run(lambda: out.append(model(x)))  # noqa: B023 (called at once)
        assert ran == {"stem": ["armed"], "block.0": ["armed"], "head": ["armed", "armed"]}
        recomputed = watch.run(lambda: out[0].backward())  # noqa: B023
        assert recomputed == {"block.0": ["checked"]}
        y64 = _pyramid_reference(ref, x)
        torch.testing.assert_close(out[0].double(), y64, rtol=1e-6, atol=1e-7)
        grads = torch.autograd.grad(y64, list(ref.parameters()))
        for p, g64 in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad.double(), g64, rtol=1e-5, atol=1e-6)


def test_a_dataparallel_replica_is_never_guarded():
    """``nn.DataParallel``'s replicas share the root's hooks, and run in threads."""
    model = _model()
    x = torch.randn(2, 2, 6, 6)
    _settle(model, x)
    model._is_replica = True
    for _ in range(4):
        model(x)
    assert step_guard.guard_of(model).guarded == ()


class Crop(nn.Module):
    """Data decides the width: one column fewer where the input's first value is negative."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., : x.shape[-1] - int(x[0, 0, 0, 0] < 0)]


def test_a_layer_whose_shapes_data_decides_stays_checked(monkeypatch):
    torch.manual_seed(1)
    model = mt.convert(nn.Sequential(nn.Conv2d(2, 2, 1), Crop(), nn.Conv2d(2, 2, 3)))
    pos, neg = torch.randn(2, 2, 6, 6), torch.randn(2, 2, 6, 6)
    pos[0, 0, 0, 0], neg[0, 0, 0, 0] = 1e3, -1e3  # signs kept through the first 1x1 layer
    model[0].weight.data.abs_()
    model[0].bias.data.zero_()
    _settle(model, pos, neg)
    watch = Watch(model, monkeypatch)
    watch.run(lambda: model(pos))
    watch.run(lambda: model(neg))
    for x in (pos, neg, pos):
        assert watch.run(lambda: model(x)) == {"0": ["armed"], "2": ["checked"]}  # noqa: B023


def test_no_guard_outside_training_forwards_with_keyable_arguments(monkeypatch):
    class Listed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)

        def forward(self, xs: list) -> torch.Tensor:
            return self.conv(xs[0])
    listed = mt.convert(Listed())
    x = torch.randn(2, 2, 4, 4)
    _settle(listed, [x])
    watch = Watch(listed, monkeypatch)
    for _ in range(4):
        assert _all(watch.run(lambda: listed([x])), "checked")
    model = _model()
    _settle(model, x)
    watch = Watch(model, monkeypatch)
    with torch.no_grad():
        for _ in range(4):
            assert _all(watch.run(lambda: model(x)), "checked")
    model.eval()
    for _ in range(4):
        assert _all(watch.run(lambda: model(x)), "checked")
    model.train()
    # the step trial still running: nothing guarded
    step_trial.trial_of(model).kept = None
    for _ in range(4):
        assert _all(watch.run(lambda: model(x)), "checked")


def test_a_forward_that_raises_leaves_nothing_set(monkeypatch):
    class Boom(nn.Module):
        fail = False

        def forward(self, x):
            if self.fail:
                raise RuntimeError("boom")
            return x
    model = mt.convert(nn.Sequential(nn.Conv2d(2, 2, 1), Boom(), nn.Conv2d(2, 2, 1)))
    x = torch.randn(2, 2, 4, 4)
    _settle(model, x)
    watch = Watch(model, monkeypatch)
    for _ in range(2):
        watch.run(lambda: model(x))
    model[1].fail = True
    with pytest.raises(RuntimeError, match="boom"):
        watch.run(lambda: model(x))
    assert watch.calls == [("0", "armed")]
    assert not any("_conv_forward" in m.__dict__ for m in watch.names)
    model[1].fail = False
    assert _all(watch.run(lambda: model(x)), "armed")


def test_copies_and_reconversion_start_a_fresh_guard(monkeypatch):
    model = _model()
    x = torch.randn(2, 2, 6, 6)
    _settle(model, x)
    for _ in range(2):
        model(x)
    guard = step_guard.guard_of(model)
    assert len(guard.guarded) == 3
    assert mt.report(model).as_dict()["step_guard"] == {"guarded_layers": 3}
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        g = step_guard.guard_of(copied)
        assert g is not None and g is not guard and g.guarded == ()
        assert g.trial is step_trial.trial_of(copied)
        torch.testing.assert_close(copied(x), model(x))
    mt.convert(model)
    hooks = [*model._forward_pre_hooks.values(), *model._forward_hooks.values()]
    assert sum(isinstance(getattr(h, "__self__", None), step_guard.StepGuard) for h in hooks) == 2
    assert step_guard.guard_of(model) is not guard


_STEPS = st.lists(st.tuples(st.sampled_from([2, 3]), st.booleans(), st.booleans(),
                            st.sampled_from(["", "weight", "tf32", "eval"]),
                            st.integers(1, 4)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(steps=_STEPS)
def test_an_unchecked_call_runs_only_a_settled_signature(steps):
    """Any sequence of forwards (batch size, input layout, input gradient need,
    a weight's layout changed, a TF32 flip, an eval forward; each repeated a
    few times): a call runs
    unchecked only for a signature its layer settled, and every output matches
    float64."""
    model = _model()
    base = torch.randn(3, 2, 6, 6)
    _settle(model, base[:2], base)  # contiguous inputs that need no gradient only
    seen: list[tuple[nn.Module, tuple, bool]] = []

    def pre(m, args):
        seen.append((m, modules._signature(args[0], m.weight), "_conv_forward" in m.__dict__))
    for m in model.modules():
        if isinstance(m, modules.MucudnnConvMixin):
            m.register_forward_pre_hook(pre)
    tf32 = torch.backends.cudnn.allow_tf32
    try:
        for n, channels_last, needs_grad, change, repeats in steps:
            x = base[:n].clone()
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            x.requires_grad_(needs_grad)
            if change == "weight":
                w = model[0].weight
                w.data = w.data.contiguous(memory_format=torch.channels_last
                                           if w.is_contiguous() else torch.contiguous_format)
            elif change == "tf32":
                torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
            model.train(change != "eval")
            for _ in range(repeats):
                y = model(x)
                torch.testing.assert_close(y.double(), _reference(model, x.detach()),
                                           rtol=1e-5, atol=1e-6)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    for m, sig, armed in seen:
        assert not armed or sig in m._mu_torch[1]


@pytest.mark.gpu
@gpu
def test_a_trained_model_reaches_guarded_steps_and_matches_float64(monkeypatch, tmp_path):
    """Training steps on a GPU settle the layers, end the step trial and then
    run guarded forwards (torch.nn's call set on the layers); outputs and
    gradients match float64 throughout, and a new batch size is checked again.
    Under the default search these small layers fit the limit, so no layer runs
    a plan and the trial ends at once; under ``MUCUDNN_TORCH_SEARCH=all`` (the
    suite's setting) whether it times steps, and for how long, would turn on the
    GPU's timings of each plan."""
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "over-limit")
    mt.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 8, 1, groups=2), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, groups=8)).cuda().to(memory_format=torch.channels_last)
    ref = copy.deepcopy(model).double()
    mt.convert(model, workspace_limit=64 << 20)
    armed: list[bool] = []
    for m in model.modules():
        if isinstance(m, mt.Conv2d):
            m.register_forward_pre_hook(lambda m, a: armed.append("_conv_forward" in m.__dict__))
    history = []
    with torch.backends.cudnn.flags(allow_tf32=False):
        for n in [4] * 16 + [6] * 8:
            armed.clear()
            x = torch.randn(n, 8, 10, 10, device="cuda").to(memory_format=torch.channels_last)
            step_against_float64(model, ref, x)
            assert len(armed) == 3
            history.append(all(armed))
    trial = step_trial.trial_of(model)
    assert trial.kept == step_trial.TORCH and not any(trial.step_ms.values()), trial.as_dict()
    assert all(history[12:16]), history
    # the new batch size: its first calls compare, two checked forwards agree, then guarded
    assert history[16:19] == [False] * 3 and all(history[-3:]), history
    assert "step guard: 3 layer(s)" in str(mt.report(model))
    mt.clear()


def test_a_compiled_part_of_a_guarded_model_compiles_once(monkeypatch):
    """A submodule compiled on its own (``torch.compile``, one whole graph)
    inside a converted model run eagerly: its layers run mucudnn's op in the
    graph, are never guarded (no instance attribute flips its guards), and
    it compiles once."""
    torch._dynamo.reset()
    model = _model()
    x = torch.randn(2, 2, 6, 6)
    _settle(model, x)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model[2] = torch.compile(model[2], backend=backend, fullgraph=True)
    for _ in range(5):
        y = model(x)
        torch.testing.assert_close(y.double(), _reference(nn.Sequential(
            model[0], model[1], model[2]._orig_mod, model[3], model[4]), x), rtol=1e-5, atol=1e-6)
    assert len(graphs) == 1
    guarded = {m for m, _ in step_guard.guard_of(model).guarded}
    assert model[0] in guarded and model[4] in guarded and model[2]._orig_mod not in guarded
    torch._dynamo.reset()
