"""See Note [planning after the first step]: the step count and the rules of
stand-ins (CPU), and on a GPU (marker ``gpu``) a converted model whose first
step runs stand-ins within the limit, whose later steps plan one signature
each, and whose every step computes its convolutions against float64.
"""

from __future__ import annotations

import copy
import pickle

import pytest

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")

from torch import nn  # noqa: E402

import mucudnn  # noqa: E402
import mucudnn.torch as mt  # noqa: E402
from mucudnn.backends.cudnn_graph import CudnnGraphBackend  # noqa: E402
from mucudnn.optimizer import optimize_wr  # noqa: E402
from mucudnn.problem import Direction  # noqa: E402
from mucudnn.torch import engine, native, settings, standin, step_trial  # noqa: E402
from mucudnn.torch.engine import ConvConfig  # noqa: E402
from torch_support import rel, step_against_float64  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")


def test_each_forward_of_a_converted_model_is_a_step_and_calls_inside_it_are_in_it():
    """A converted root's forward counts one step, and only calls made while it
    runs (on its thread) are inside a step; one that raises still ends its step."""
    depth: list[int] = []
    model = mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()))
    model[1].register_forward_hook(lambda m, a, o: depth.append(standin._IN_STEP.depth))
    before = standin.STEPS[0]
    x = torch.randn(2, 3, 6, 6)
    model(x)
    model(x)
    assert standin.STEPS[0] == before + 2 and depth == [1, 1]
    assert standin._IN_STEP.depth == 0
    with pytest.raises(ValueError, match="^weight: expected 5 input channels"):
        model(torch.randn(2, 3 + 2, 6, 6))  # the wrong channels: the forward raises
    assert standin._IN_STEP.depth == 0 and standin.STEPS[0] == before + 3
    nn.Conv2d(3, 4, 3)(x)  # a module that is not converted counts nothing
    assert standin.STEPS[0] == before + 3


def test_a_copy_keeps_its_step_hooks_and_dropping_the_trial_drops_both():
    model = mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3)))
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert [h for h in twin._forward_hooks.values()
                if isinstance(h, step_trial.StepEnd)] != []
        before = standin.STEPS[0]
        twin(torch.randn(1, 3, 5, 5))
        assert standin.STEPS[0] == before + 1 and standin._IN_STEP.depth == 0
    (end,) = [k for k, h in model._forward_hooks.items() if isinstance(h, step_trial.StepEnd)]
    assert model._forward_hooks_always_called[end]
    step_trial.drop(model)
    for hooks in (model._forward_pre_hooks, model._forward_hooks):
        assert not [h for h in hooks.values()
                    if isinstance(h, (step_trial.StepTrial, step_trial.StepEnd))]
    assert end not in model._forward_hooks_always_called


def test_one_stand_in_is_replaced_a_step_or_at_its_last_call(monkeypatch):
    monkeypatch.setattr(standin, "STEPS", [5])
    monkeypatch.setattr(standin, "_REPLACED_AT", [0])
    assert not standin.due(5, 1)  # made in this step: not yet
    assert standin.due(4, 1)  # made before: this step plans it
    assert not standin.due(3, 1)  # one a step
    assert standin.due(3, standin.STANDIN_CALLS)  # however many steps
    standin.STEPS[0] = 6
    assert standin.due(3, 2) and not standin.due(4, 2)


def test_stand_ins_run_inside_converted_steps_on_the_graph_backend_by_default(monkeypatch):
    graph = object.__new__(CudnnGraphBackend)  # the type is what counts here
    monkeypatch.delenv("MUCUDNN_TORCH_DEFER", raising=False)
    monkeypatch.delenv("MUCUDNN_TORCH_SEARCH", raising=False)
    monkeypatch.setattr(standin._IN_STEP, "depth", 1, raising=False)
    assert standin.deferring(graph, False)
    assert not standin.deferring(graph, True)  # given plans
    assert not standin.deferring(mucudnn.get_backend("numpy"), False)
    assert standin.twin(mucudnn.get_backend("numpy")) is None
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "all")
    assert not standin.deferring(graph, False)
    monkeypatch.delenv("MUCUDNN_TORCH_SEARCH")
    monkeypatch.setenv("MUCUDNN_TORCH_DEFER", "0")
    assert not standin.deferring(graph, False)
    monkeypatch.setenv("MUCUDNN_TORCH_DEFER", "on")
    assert standin.deferring(graph, False)
    standin._IN_STEP.depth = 0  # outside a converted model's forward
    assert not standin.deferring(graph, False)


class _StoodWarm:
    """Stands in for engine._Warm: its first calibration makes stand-ins (as
    _Warm.calibrate does where it defers), a later one replaces them."""

    def __init__(self, x, w, cl, cfg, key, transposed=False):
        self.calibrations: list = []
        self.host_pending = False
        self.standin, self.standin_calls = None, 0

    def calibrate(self, x, w, key, step, need_dx):
        self.calibrations.append(standin.STEPS[0])
        self.standin = standin.STEPS[0] if len(self.calibrations) == 1 else None


def test_a_signature_with_stand_ins_is_calibrated_again_at_one_call_in_a_later_step(
        monkeypatch):
    """engine.resolve (Note [the warm torch path]): a record of stand-ins is
    calibrated again, which plans it, at its first call in a later step; with
    two such records, one a step; and not under capture, which warns instead."""
    from mucudnn.torch import engine
    monkeypatch.setattr(engine, "_Warm", _StoodWarm)
    monkeypatch.setattr(engine, "_STREAM", lambda index: 0)
    monkeypatch.setenv("MUCUDNN_TORCH_NATIVE", "1")
    monkeypatch.setattr(standin, "STEPS", [1])
    monkeypatch.setattr(standin, "_REPLACED_AT", [0])
    monkeypatch.setattr(standin, "_WARNED", [False])
    x, w = torch.randn(2, 2, 3, 3), torch.randn(2, 2, 1, 1)
    cfg = ConvConfig((1, 1), (0, 0), (1, 1), 1, 1 << 20, "powerOfTwo", "", "")
    keys = [("stood", 1), ("stood", 2)]
    for k in keys:
        engine._WARM.pop(k)
    try:
        a, b = (engine.resolve(k, x, w, cfg, None) for k in keys)  # step 1: stand-ins
        assert a.calibrations == [1] == b.calibrations and (a.standin, b.standin) == (1, 1)
        engine.resolve(keys[0], x, w, cfg, None)  # the same step: kept
        assert a.calibrations == [1]
        standin.STEPS[0] = 2
        monkeypatch.setattr(engine, "CAPTURING", lambda: True)
        with pytest.warns(standin.StandinWarning):
            engine.resolve(keys[0], x, w, cfg, None)  # a capture plans nothing
        assert a.calibrations == [1]
        monkeypatch.setattr(engine, "CAPTURING", lambda: False)
        for k in keys:
            engine.resolve(k, x, w, cfg, None)  # step 2 plans one of them
        assert (a.calibrations, b.calibrations, b.standin) == ([1, 2], [1], 1)
        assert a.standin is None
        standin.STEPS[0] = 3
        engine.resolve(keys[1], x, w, cfg, None)
        assert b.calibrations == [1, 3] and b.standin is None
        engine.resolve(keys[1], x, w, cfg, None)  # planned: nothing more
        assert b.calibrations == [1, 3]
    finally:
        for k in keys:
            engine._WARM.pop(k)


def test_the_stand_in_warning_is_public_and_a_runtime_warning():
    assert mt.StandinWarning is standin.StandinWarning
    assert issubclass(mt.StandinWarning, RuntimeWarning)


def test_the_defer_setting_is_checked(monkeypatch):
    monkeypatch.delenv("MUCUDNN_TORCH_DEFER", raising=False)
    assert settings.defers()
    monkeypatch.setenv("MUCUDNN_TORCH_DEFER", " No ")
    assert not settings.defers()
    monkeypatch.setenv("MUCUDNN_TORCH_DEFER", "later")
    with pytest.raises(mucudnn.MucudnnError, match="^MUCUDNN_TORCH_DEFER: expected") as info:
        settings.defers()
    assert isinstance(info.value, ValueError)


def test_a_stand_in_record_runs_them_where_pytorch_is_over_the_limit_and_keeps_the_rest():
    """The record of a first call with stand-ins: PyTorch's call where it fits,
    the stand-ins' plans elsewhere (PyTorch's measurements kept for the later
    comparison), none where ``make`` made none."""
    over = Direction.BACKWARD_FILTER
    first = native.torch_first(1 << 20, Direction.BACKWARD_DATA,
                               lambda d: (0.5, 2 << 20 if d is over else 0))
    plan = optimize_wr({4: [mucudnn.AlgoPerf(algo=1, time_ms=1.0, workspace_bytes=0)]},
                       batch=4, workspace_limit=1 << 20, policy="undivided")
    asked: list = []

    def make(directions):
        asked.append(directions)
        return {d: plan for d in directions}

    cfg = ConvConfig((1, 1), (1, 1), (1, 1), 1, 1 << 20, "fitted", "", "")
    rec = standin.record(first, Direction.BACKWARD_DATA, make, ((4, 8, 6, 6), (8, 8, 3, 3)),
                         "float32", cfg, True, False, False)
    assert asked == [[over]] and rec.standin and rec.plans == {over: plan}
    assert rec.choices[over].runs == native.MUCUDNN and "stand-in" in rec.choices[over].reason
    assert (rec.choices[over].torch_ms, rec.choices[over].torch_workspace) == (0.5, 2 << 20)
    assert rec.choices[Direction.FORWARD] == first[Direction.FORWARD]
    assert rec.choices[Direction.BACKWARD_DATA] == first[Direction.BACKWARD_DATA]
    assert rec.plan_s is not None and rec.first_s is None and rec.deferred_s is None
    assert standin.record(first, Direction.BACKWARD_DATA, lambda d: None, ((4, 8, 6, 6),
                          (8, 8, 3, 3)), "float32", cfg, True, False, False) is None


# -- on a GPU -----------------------------------------------------------------------------------
#: A limit below what PyTorch's calls of these layers take in most directions.
LIMIT = 1 << 10


def _layers() -> nn.Sequential:
    """Three convolutions of three signatures; their weight gradients take
    workspace under PyTorch's benchmark."""
    return nn.Sequential(nn.Conv2d(16, 64, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, stride=2, padding=1))


def _native_flags():
    """A native model's cuDNN flags, TF32 off (``cudnn.flags`` turns cuDNN off
    unless told: PyTorch's own calls then return channels-first outputs, a new
    signature for the next layer)."""
    return torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=False)


def _stand_ins() -> list[native.Record]:
    return [r for r in native.records() if r.standin]


def _defer(monkeypatch: pytest.MonkeyPatch, tmp_path, on: str = "1") -> None:
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "over-limit")
    monkeypatch.setenv("MUCUDNN_TORCH_DEFER", on)
    mt.clear()


@pytest.mark.gpu
@gpu
def test_a_first_step_runs_stand_ins_within_the_limit_and_each_later_step_plans_one(
        monkeypatch, tmp_path):
    _defer(monkeypatch, tmp_path)
    torch.manual_seed(0)
    cl = torch.channels_last
    model = _layers().cuda().to(memory_format=cl)
    ref = copy.deepcopy(model).double()
    conv = mt.convert(model, workspace_limit=LIMIT)
    batch = 16

    def step() -> None:
        x = torch.randn(batch, 16, 20, 20, device="cuda").to(memory_format=cl)
        step_against_float64(conv, ref, x, tol=1e-4)

    with _native_flags():
        step()
        stood = _stand_ins()
        assert len(stood) >= 2, "PyTorch's calls of two layers or more are over the limit"
        for r in stood:
            assert r.plans and r.deferred_s is None
            for d, plan in r.plans.items():
                assert r.choices[d].runs == native.MUCUDNN and r.choices[d].plan_ms is None
                assert plan.workspace_bytes <= LIMIT
                assert [m.size for m in plan.micro_batches] == [batch]  # the whole batch
        assert "stand-in: " in str(mt.report(conv))
        for left in range(len(stood) - 1, -1, -1):
            step()
            assert len(_stand_ins()) == left, (  # one signature a step
                standin.STEPS, standin._REPLACED_AT,
                [(r.x_shape, r.cfg.stride, r.standin, r.first_s, r.deferred_s)
                 for r in native.records()],
                [(w.key[0], w.key[1], w.cfg.stride, w.standin, w.standin_calls)
                 for w in engine._WARM.values()])
        done = [r for r in native.records() if r.deferred_s is not None]
        assert len(done) == len(stood)
        for r in done:
            for d in r.plans:
                assert r.plans[d].workspace_bytes <= LIMIT
                assert r.choices[d].runs == native.MUCUDNN and r.choices[d].plan_ms is not None
        assert mt.report(conv).first_calls["deferred_seconds"] > 0
        step()  # and on, with the plans
    mt.clear()


@pytest.mark.gpu
@gpu
def test_without_deferring_the_first_step_plans(monkeypatch, tmp_path):
    _defer(monkeypatch, tmp_path, "0")
    torch.manual_seed(0)
    cl = torch.channels_last
    model = _layers().cuda().to(memory_format=cl)
    ref = copy.deepcopy(model).double()
    conv = mt.convert(model, workspace_limit=LIMIT)
    with _native_flags():
        step_against_float64(conv, ref, torch.randn(16, 16, 20, 20, device="cuda").to(
            memory_format=cl), tol=1e-4)
    recs = native.records()
    assert recs and not _stand_ins()
    assert any(c.plan_ms is not None for r in recs for c in r.choices.values())
    mt.clear()


@pytest.mark.gpu
@gpu
def test_a_capture_of_stand_ins_warns_and_its_replays_compute_the_convolution(monkeypatch,
                                                                             tmp_path):
    _defer(monkeypatch, tmp_path)
    monkeypatch.setattr(standin, "_WARNED", [False])
    torch.manual_seed(0)
    cl = torch.channels_last
    model = _layers().cuda().to(memory_format=cl).eval()
    ref = copy.deepcopy(model).double()
    conv = mt.convert(model, workspace_limit=LIMIT)
    static_x = torch.randn(16, 16, 20, 20, device="cuda").to(memory_format=cl)
    with _native_flags(), torch.no_grad():
        conv(static_x)
        assert len(_stand_ins()) >= 2
        graph = torch.cuda.CUDAGraph()
        with pytest.warns(standin.StandinWarning, match="stand-in"):
            with torch.cuda.graph(graph):
                static_y = conv(static_x)
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        assert rel(static_y, ref(static_x.double())) < 1e-4
    mt.clear()
