"""See Note [planning after the first step] and Note [untimed stand-ins]: the
step count and the rules of stand-ins (CPU), and on a GPU (marker ``gpu``) a
converted model whose first step runs stand-ins within the limit, whose later
steps plan them a share at a time, and whose every step computes its
convolutions against float64.
"""

from __future__ import annotations

import copy
import pickle
import weakref
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import mucudnn  # noqa: E402
import mucudnn.torch as mt  # noqa: E402
from mucudnn._cudnn import graph_descriptors as gd  # noqa: E402
from mucudnn.backends.cudnn_graph import CudnnGraphBackend  # noqa: E402
from mucudnn.optimizer import optimize_wr  # noqa: E402
from mucudnn.problem import Direction  # noqa: E402
from mucudnn.torch import distributed, engine, native, settings, standin, step_trial  # noqa: E402
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


class _Owner:
    """A signature's warm record, as :func:`standin.due` sees it."""


def _fresh_share(monkeypatch, step: int) -> None:
    monkeypatch.setattr(standin, "STEPS", [step])
    monkeypatch.setattr(standin, "_OPEN", weakref.WeakSet())
    monkeypatch.setattr(standin, "_SHARE", standin._Share())


def test_stand_ins_are_replaced_over_the_next_steps_an_equal_share_each(monkeypatch):
    """Nine stand-ins of step 1 over STANDIN_STEPS = 4 steps: three a step (nine
    over four, rounded up), none in the step that made them, any at its
    STANDIN_CALLS-th call; once none is open, a new one is replaced in the
    next step alone."""
    _fresh_share(monkeypatch, 1)
    monkeypatch.setattr(standin, "STANDIN_STEPS", 4)
    owners = [_Owner() for _ in range(9)]
    for o in owners:
        standin.opened(o)
    assert not any(standin.due(o, 1, 1) for o in owners)  # made in this step
    standin.STEPS[0] = 2
    assert [standin.due(o, 1, 1) for o in owners[:4]] == [True, True, True, False]
    assert standin.due(owners[3], 1, standin.STANDIN_CALLS)  # however many this step took
    standin.STEPS[0] = 3
    assert [standin.due(o, 1, 2) for o in owners[4:]] == [True, True, True, False, False]
    standin.STEPS[0] = 4
    assert [standin.due(o, 1, 3) for o in owners[7:]] == [True, True]
    assert len(standin._OPEN) == 0 and standin._SHARE.peak == 0
    late = _Owner()
    standin.opened(late)
    assert not standin.due(late, 4, 1)
    standin.STEPS[0] = 5
    assert standin.due(late, 4, 1)
    standin.reset()
    assert standin._SHARE == standin._Share()


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
        if self.standin is not None:
            standin.opened(self)


def test_a_signature_with_stand_ins_is_calibrated_again_at_one_call_in_a_later_step(
        monkeypatch):
    """engine.resolve (Note [the warm torch path]): a record of stand-ins is
    calibrated again, which plans it, at its first call in a later step; with
    two such records (a share of one a step), one a step; and not under
    capture, which warns instead."""
    monkeypatch.setattr(engine, "_Warm", _StoodWarm)
    monkeypatch.setattr(engine, "_STREAM", lambda index: 0)
    monkeypatch.setenv("MUCUDNN_TORCH_NATIVE", "1")
    _fresh_share(monkeypatch, 1)
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


def test_a_stand_in_record_runs_them_in_every_direction_a_step_runs_measuring_nothing():
    """The record of a first call with stand-ins: the stand-ins' plans in every
    direction but the one a step does not run, PyTorch's calls not measured;
    none where ``make`` made none."""
    plan = optimize_wr({4: [mucudnn.AlgoPerf(algo=1, time_ms=1.0, workspace_bytes=0)]},
                       batch=4, workspace_limit=1 << 20, policy="undivided")
    asked: list = []

    def make(directions):
        asked.append(directions)
        return {d: plan for d in directions}

    cfg = ConvConfig((1, 1), (1, 1), (1, 1), 1, 1 << 20, "fitted", "", "")
    shapes = ((4, 8, 6, 6), (8, 8, 3, 3))
    skip = Direction.BACKWARD_DATA
    rec = standin.record(skip, make, shapes, "float32", cfg, True, False, False, 1 << 20)
    ran = [Direction.FORWARD, Direction.BACKWARD_FILTER]
    assert asked == [ran] and rec.standin and rec.plans == {d: plan for d in ran}
    for d in ran:
        c = rec.choices[d]
        assert c.runs == native.MUCUDNN and "stand-in" in c.reason and c.limit == 1 << 20
        assert (c.plan_ms, c.torch_ms, c.torch_workspace) == (None, None, None)
    assert rec.choices[skip] == native.unrun(skip, 1 << 20)
    assert rec.plan_s is not None and rec.first_s is None and rec.deferred_s is None
    assert standin.record(skip, lambda d: None, shapes, "float32", cfg, True, False, False,
                          1 << 20) is None


def test_calibrate_keeps_a_stand_in_record_measuring_nothing_and_replaces_it_later(
        monkeypatch):
    """native.calibrate with ``standin``: the first call keeps the stand-in
    record before measuring anything; the signature's next calibration
    measures PyTorch's calls (here every one fits: none is planned) and keeps
    the stand-ins' seconds, adding its own as ``deferred_s``."""
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "over-limit")
    measured: list = []

    def torch_first(limit, skip, measure):
        measured.append(skip)
        return {d: native.unrun(d, limit) if d is skip else native.Choice(
            d, native.TORCH, None, 0.5, 0, limit, "fits") for d in Direction}

    monkeypatch.setattr(native, "torch_first", torch_first)
    cfg = ConvConfig((1, 1), (1, 1), (1, 1), 1, 1 << 20, "fitted", "", "")
    x, w = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    conv = SimpleNamespace(plans={}, problem=SimpleNamespace(key=lambda: "the problem"))
    stood = native.Record(cfg, (2, 3, 5, 5), (4, 3, 3, 3), "float32", False, {}, {},
                          need_dx=False, plan_s=0.25, standin=True)
    asked: list = []

    def standin(skip):
        asked.append(skip)
        return stood

    key = ("calibrate-standin",)

    def calibrate():
        return native.calibrate(key, conv, x, w, (2, 4, 5, 5), cfg, torch.contiguous_format,
                                {}, None, lambda: 0, 1 << 20, False, False, None, False,
                                False, standin)

    try:
        assert calibrate() is stood and native.record(key) is stood
        assert asked == [Direction.BACKWARD_DATA] and measured == []
        assert stood.first_s is not None and stood.plan_s == 0.25
        rec = calibrate()  # the next calibration replaces it
        assert asked == [Direction.BACKWARD_DATA] and measured == [Direction.BACKWARD_DATA]
        assert not rec.standin and native.record(key) is rec and rec.plans == {}
        assert [c.runs for d, c in rec.choices.items() if d is not rec.skip] == [native.TORCH] * 2
        assert (rec.first_s, rec.plan_s) == (stood.first_s, 0.25) and rec.deferred_s >= 0
        assert calibrate() is rec and len(measured) == 1  # kept: nothing again
    finally:
        native._RECORDS.pop(key)


class _FirstFit:
    def __init__(self, perf):
        self.perf, self.asked, self.name = perf, [], "cudnn-graph"

    def first_fit(self, problem, direction, limit, deterministic):
        self.asked.append((direction, limit, deterministic))
        return self.perf


def test_a_stand_in_plan_is_the_whole_batch_in_the_first_fit_untimed():
    problem = mucudnn.ConvProblem((6, 8, 5, 5), (8, 8, 3, 3), padding=(1, 1))
    found = _FirstFit(mucudnn.AlgoPerf(algo="e3;k2=1", time_ms=0.0, workspace_bytes=512))
    plan = standin.plan(found, problem, Direction.BACKWARD_FILTER, 1024, True)
    assert found.asked == [(Direction.BACKWARD_FILTER, 1024, True)]
    assert [(m.offset, m.size, m.algo, m.workspace_bytes) for m in plan.micro_batches] == [
        (0, 6, "e3;k2=1", 512)]
    assert (plan.problem, plan.direction, plan.workspace_bytes, plan.workspace_limit) == (
        problem, Direction.BACKWARD_FILTER, 512, 1024)
    assert plan.extra["untimed"] and plan.policy == "stand-in"
    assert standin.plan(_FirstFit(None), problem, Direction.FORWARD, 0, False) is None


def _info(index: int, ws, numerical=(), behavior=()) -> gd.EngineConfigInfo:
    return gd.EngineConfigInfo(index, (), tuple(int(n) for n in numerical),
                               tuple(int(b) for b in behavior), workspace_bytes=ws)


class _Built:
    def __init__(self, algo_id: str, ws: int):
        self.id, self.workspace_bytes = algo_id, ws


def test_first_fit_takes_the_best_ranked_config_that_qualifies_without_timing(monkeypatch):
    """CudnnGraphBackend.first_fit (Note [untimed stand-ins]) in heuristics'
    order: it passes over a config whose numerics the problem's math leaves
    out, one that compiles at run time, a non-deterministic one where asked,
    one whose heuristics workspace is over the limit, one that does not
    finalize and one whose finalized plan is over it."""
    N, B = gd.BackendNumericalNote, gd.BackendBehaviorNote
    infos = [_info(1, 0, numerical=[N.TENSOR_CORE]), _info(2, 0, behavior=[B.RUNTIME_COMPILATION]),
             _info(3, 0, numerical=[N.NONDETERMINISTIC]), _info(4, 4096), _info(5, None),
             _info(6, 100), _info(7, 0)]
    finalized = {"e5": 2048, "e6": 100, "e7": 0, "e3": 0}
    built: list = []
    be = object.__new__(CudnnGraphBackend)
    monkeypatch.setattr(be, "engine_configs", lambda p, d: infos, raising=False)
    monkeypatch.setattr(be, "find_workspace_cap", lambda: 1 << 30, raising=False)

    def build(problem, direction, wanted):
        built.extend(a for a, _ in wanted)
        return {(a, b): _Built(a, finalized[a]) for a, b in wanted if a in finalized}

    monkeypatch.setattr(be, "_build_plans", build, raising=False)
    problem = mucudnn.ConvProblem((2, 4, 5, 5), (4, 4, 3, 3), math="fma")
    got = be.first_fit(problem, "forward", 1024, deterministic=True)
    assert (got.algo, got.time_ms, got.workspace_bytes, got.determinism) == ("e6", 0.0, 100, 1)
    assert built == ["e5", "e6"]  # e4 never finalized: its heuristics figure is over
    assert be.first_fit(problem, "forward", 0, deterministic=True).algo == "e7"
    assert be.first_fit(problem, "forward", 1024, deterministic=False).algo == "e3"
    finalized.clear()
    assert be.first_fit(problem, "forward", 1024) is None


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


def _converted() -> tuple[nn.Module, nn.Module]:
    """:func:`_layers` on the GPU, channels-last, converted at LIMIT; and a float64 copy."""
    torch.manual_seed(0)
    model = _layers().cuda().to(memory_format=torch.channels_last)
    ref = copy.deepcopy(model).double()
    return mt.convert(model, workspace_limit=LIMIT), ref


def _batch(n: int = 16) -> torch.Tensor:
    """A channels-last input of :func:`_layers` on the GPU."""
    return torch.randn(n, 16, 20, 20, device="cuda").to(memory_format=torch.channels_last)


def _defer(monkeypatch: pytest.MonkeyPatch, tmp_path, on: str = "1") -> None:
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "over-limit")
    monkeypatch.setenv("MUCUDNN_TORCH_DEFER", on)
    mt.clear()


@pytest.mark.gpu
@gpu
def test_a_first_step_runs_untimed_stand_ins_within_the_limit_and_later_steps_plan_them(
        monkeypatch, tmp_path):
    """Every signature of the first step runs stand-ins in every direction,
    PyTorch's calls unmeasured; the next steps replace a share of them each
    (one a step here: three over STANDIN_STEPS), measuring PyTorch's calls and
    planning the directions over the limit; every step against float64."""
    _defer(monkeypatch, tmp_path)
    conv, ref = _converted()
    batch = 16

    def step() -> None:
        step_against_float64(conv, ref, _batch(batch), tol=1e-4)

    with _native_flags():
        step()
        stood = _stand_ins()
        assert len(stood) == 3 and len(native.records()) == 3
        for r in stood:
            assert set(r.plans) == {d for d in Direction if d is not r.skip}
            assert r.deferred_s is None
            for d, plan in r.plans.items():
                c = r.choices[d]
                assert c.runs == native.MUCUDNN and (c.plan_ms, c.torch_ms) == (None, None)
                assert plan.workspace_bytes <= LIMIT and plan.extra["untimed"]
                assert [m.size for m in plan.micro_batches] == [batch]  # the whole batch
        assert "stand-in: " in str(mt.report(conv))
        share = -(-len(stood) // standin.STANDIN_STEPS)
        left = len(stood)
        while left:
            step()
            left = max(0, left - share)
            assert len(_stand_ins()) == left, (
                standin.STEPS, standin._SHARE,
                [(r.x_shape, r.cfg.stride, r.standin, r.first_s, r.deferred_s)
                 for r in native.records()])
        done = [r for r in native.records() if r.deferred_s is not None]
        assert len(done) == len(stood)
        for r in done:
            assert all(r.choices[d].torch_ms is not None for d in Direction if d is not r.skip)
            for d in r.plans:
                assert r.plans[d].workspace_bytes <= LIMIT and not r.plans[d].extra.get("untimed")
                assert r.choices[d].runs == native.MUCUDNN and r.choices[d].plan_ms is not None
        assert mt.report(conv).first_calls["deferred_seconds"] > 0
        step()  # and on, with the plans
    mt.clear()


@pytest.mark.gpu
@gpu
def test_first_fit_on_the_device_is_heuristics_first_config_that_fits(monkeypatch):
    """On cuDNN: first_fit's config is the first of heuristics mode A's that
    qualifies, its finalized workspace within the limit (0 bytes included)."""
    be = standin.twin(mucudnn.get_backend("cudnn-graph"))
    problem = mucudnn.ConvProblem((8, 12, 12, 16), (32, 3, 3, 16), padding=(1, 1),
                                  layout="NHWC", math="fma")
    for d in Direction:
        for limit in (0, 1 << 20):
            got = be.first_fit(problem, d, limit)
            assert got is not None and got.workspace_bytes <= limit and got.time_ms == 0.0
            assert be.workspace_size(problem, d, got.algo) <= limit
            ranked = [i for i in be.engine_configs(problem, d)
                      if (i.workspace_bytes or 0) <= limit and not i.has_note(
                          gd.BackendBehaviorNote.RUNTIME_COMPILATION)
                      and not i.has_note(gd.BackendNumericalNote.TENSOR_CORE)]
            assert got.algo in [i.id for i in ranked][:4]  # among the first that qualify


@pytest.mark.gpu
@gpu
def test_without_deferring_the_first_step_plans(monkeypatch, tmp_path):
    _defer(monkeypatch, tmp_path, "0")
    conv, ref = _converted()
    with _native_flags():
        step_against_float64(conv, ref, _batch(), tol=1e-4)
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
    conv, ref = _converted()
    conv.eval()
    static_x = _batch()
    with _native_flags(), torch.no_grad():
        conv(static_x)
        assert len(_stand_ins()) == 3
        graph = torch.cuda.CUDAGraph()
        with pytest.warns(standin.StandinWarning, match="stand-in"):
            with torch.cuda.graph(graph):
                static_y = conv(static_x)
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        assert rel(static_y, ref(static_x.double())) < 1e-4
    mt.clear()


@pytest.mark.gpu
@gpu
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
def test_after_share_plans_stand_ins_give_way_to_the_shared_plans_without_a_find(monkeypatch,
                                                                               tmp_path):
    """See Note [shared plans] in mucudnn/torch/distributed.py: share_plans
    (a group of one) plans every kernel before training; the first step still
    runs stand-ins, and the steps that replace them measure PyTorch's calls
    but run no find(): the directions over the limit run the shared plans,
    every step against float64."""
    _defer(monkeypatch, tmp_path)
    finds: list[str] = []
    real = CudnnGraphBackend.find

    def counted(self, problem, direction, *args, **kwargs):
        finds.append(f"{problem.key()} {Direction.parse(direction).value}")
        return real(self, problem, direction, *args, **kwargs)

    conv, ref = _converted()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)
    try:
        with _native_flags():
            monkeypatch.setattr(CudnnGraphBackend, "find", counted)
            shared = mt.share_plans(conv, _batch())
            assert shared.kernels == 9 and len(shared.plans) == 9
            assert finds  # share_plans measured through find()
            finds.clear()
            step_against_float64(conv, ref, _batch(), tol=1e-4)
            assert len(_stand_ins()) == 3
            for _ in range(standin.STANDIN_STEPS):
                step_against_float64(conv, ref, _batch(), tol=1e-4)
            assert not _stand_ins()
            planned = [(r, d) for r in native.records() for d in r.plans]
            assert planned  # some direction is over the limit
            for r, d in planned:
                plan = r.plans[d]
                assert plan.workspace_bytes <= LIMIT
                assert shared.plans[f"{plan.problem.key()} {d.value}"] == \
                    distributed._plan_text(plan)
            assert finds == []
    finally:
        dist.destroy_process_group()
        mt.clear()
