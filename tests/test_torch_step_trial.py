"""See Note [the whole-step trial]: the trial's bookkeeping driven by a fake
clock (CPU), and on a GPU (marker ``gpu``) a converted model whose trial keeps
either way computes its convolutions against float64, with PyTorch's way
entering no mucudnn code.
"""

from __future__ import annotations

import copy
import pickle
import statistics

import pytest
from hypothesis import given, strategies as st

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")

from torch import nn  # noqa: E402

import mucudnn.torch as mt  # noqa: E402
from mucudnn.torch import engine, native, step_trial  # noqa: E402
from mucudnn.torch.step_trial import PLANS, TORCH, TRIAL_STEPS, StepTrial  # noqa: E402
from torch_support import step_against_float64  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fake_device(mp: pytest.MonkeyPatch) -> Clock:
    """A clock the test advances; synchronising and capture checks that do nothing."""
    clock = Clock()
    mp.setattr(step_trial.time, "perf_counter", clock)
    mp.setattr(step_trial.torch.cuda, "is_available", lambda: True)
    mp.setattr(step_trial.torch.cuda, "synchronize", lambda: None)
    mp.setattr(step_trial, "_CAPTURING", lambda: False)
    mp.delenv("MUCUDNN_TORCH_NATIVE", raising=False)
    return clock


@pytest.fixture
def fake_device(monkeypatch):
    return _fake_device(monkeypatch)


def _step(trial: StepTrial, module: nn.Module, clock: Clock, cost: dict[str, list[int]],
          ran: list[tuple[str, float]]) -> None:
    """One training step: the hook, then the way it chose takes its next cost,
    in 1/1024 s (exact in binary floating point, so ties stay ties); ``ran``
    gets the way and its milliseconds."""
    trial(module, ())
    way = TORCH if trial.torch else PLANS
    k = cost[way][sum(w == way for w, _ in ran) % len(cost[way])]
    ran.append((way, k * 1000 / 1024))
    clock.now += k / 1024


def _differing() -> nn.Module:
    """A model one of whose layers runs a plan where PyTorch's call fits (its
    ``_mu_torch`` as a converted layer keeps it), so the two ways differ."""
    m = nn.Sequential(nn.Linear(1, 1))
    m[0]._mu_torch = (engine.GENERATION[0], frozenset(), frozenset({"signature"}))
    return m


def test_the_trial_keeps_pytorch_untimed_where_the_ways_are_one(fake_device):
    """No layer that fits keeps a plan (settled, or nothing fits): no step is
    timed and PyTorch's way is kept at once."""
    gen = engine.GENERATION[0]
    for state in (None, (gen, frozenset({"s"}), frozenset({"s"})), (gen, frozenset(), frozenset())):
        model = nn.Sequential(nn.Linear(1, 1))
        if state is not None:
            model[0]._mu_torch = state
        trial = StepTrial()
        trial(model, ())
        assert (trial.kept, trial.torch, trial.step_ms) == (TORCH, True, {PLANS: [], TORCH: []})


def test_the_trial_waits_for_every_converted_layer_to_run_before_calling_the_ways_one(
        fake_device):
    """A converted layer that has not run since the last clear decides what it
    runs at its first call: until it has, the trial does not keep PyTorch's way
    untimed, and once it has run a plan where PyTorch's call fits, the ways
    are compared."""
    cost = {PLANS: [1024], TORCH: [512]}
    gen = engine.GENERATION[0]
    for stale in (-1, gen - 1):  # never run (modules._UNSETTLED); run before a clear
        trial, module, ran = StepTrial(), nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1)), []
        module[0]._mu_torch = (gen, frozenset({"s"}), frozenset({"s"}))
        module[1]._mu_torch = (stale, frozenset(), frozenset())
        _step(trial, module, fake_device, cost, ran)
        assert trial.kept is None and trial._start is not None
        module[1]._mu_torch = (gen, frozenset(), frozenset({"t"}))  # its first call kept a plan
        for _ in range(2 * (TRIAL_STEPS + 1) + 1):
            _step(trial, module, fake_device, cost, ran)
        assert trial.kept == TORCH and len(trial.step_ms[PLANS]) == TRIAL_STEPS


costs = st.lists(st.integers(1, 100), min_size=TRIAL_STEPS + 1, max_size=TRIAL_STEPS + 4)


@given(plans=costs, torch_=costs)
def test_the_trial_keeps_the_way_with_the_lower_median_of_its_timed_steps(plans, torch_):
    with pytest.MonkeyPatch.context() as mp:
        clock = _fake_device(mp)
        trial, module = StepTrial(), _differing()
        ran: list[tuple[str, float]] = []
        for _ in range(4 * (TRIAL_STEPS + 2)):
            _step(trial, module, clock, {PLANS: plans, TORCH: torch_}, ran)
        assert trial.kept in (PLANS, TORCH)
        # each way's first step is a warm-up
        timed = {way: [ms for w, ms in ran if w == way][1:1 + TRIAL_STEPS]
                 for way in (PLANS, TORCH)}
        assert trial.step_ms == timed
        lower = statistics.median(timed[PLANS]) < statistics.median(timed[TORCH])
        assert trial.kept == (PLANS if lower else TORCH)
        assert trial.torch == (trial.kept == TORCH)
        # the ways alternate until the decision, and the kept one runs after it
        decided = 2 * (TRIAL_STEPS + 1)
        assert [w for w, _ in ran[:decided]] == [TORCH, PLANS] * (TRIAL_STEPS + 1)
        assert {w for w, _ in ran[decided:]} == {trial.kept}


def test_steps_that_compare_layers_or_do_not_train_are_not_timed(fake_device):
    trial, module = StepTrial(), _differing()
    ran: list[tuple[str, float]] = []
    cost = {PLANS: [1024], TORCH: [512]}
    _step(trial, module, fake_device, cost, ran)
    _step(trial, module, fake_device, cost, ran)
    engine.CALIBRATIONS[0] += 1  # a layer met a new signature in this step
    _step(trial, module, fake_device, cost, ran)
    assert trial.torch is False and trial._start is None  # back to the plans, untimed
    module.eval()
    _step(trial, module, fake_device, cost, ran)
    module.train()
    with torch.no_grad():
        _step(trial, module, fake_device, cost, ran)
    assert trial.step_ms == {PLANS: [], TORCH: []}
    for _ in range(2 * (TRIAL_STEPS + 1) + 1):
        _step(trial, module, fake_device, cost, ran)
    assert trial.kept == TORCH and trial.step_ms[TORCH] == [500.0] * TRIAL_STEPS
    assert trial.step_ms[PLANS] == [1000.0] * TRIAL_STEPS


def test_a_tie_keeps_pytorch_and_clear_or_a_copy_starts_again(fake_device):
    trial, module = StepTrial(), _differing()
    ran: list[tuple[str, float]] = []
    for _ in range(2 * (TRIAL_STEPS + 1) + 1):
        _step(trial, module, fake_device, {PLANS: [7], TORCH: [7]}, ran)
    assert trial.kept == TORCH
    for copied in (copy.deepcopy(trial), pickle.loads(pickle.dumps(trial))):
        assert copied.kept is None and copied.step_ms == {PLANS: [], TORCH: []}
    engine.clear()
    trial(module, ())
    assert trial.kept is None


def test_the_trial_is_off_with_the_native_comparison(fake_device, monkeypatch):
    monkeypatch.setenv("MUCUDNN_TORCH_NATIVE", "0")
    trial, module = StepTrial(), _differing()
    ran: list[tuple[str, float]] = []
    for _ in range(4 * (TRIAL_STEPS + 2)):
        _step(trial, module, fake_device, {PLANS: [1], TORCH: [2]}, ran)
    assert trial.kept is None and {w for w, _ in ran} == {PLANS}


def test_a_freshly_converted_models_first_step_does_not_end_its_trial(fake_device):
    """The trial's hook runs before the first step's layers decide what they run,
    so at that step it cannot know the ways are one: it keeps nothing."""
    model = mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 1)))
    trial = step_trial.trial_of(model)
    trial(model, ())
    assert trial.kept is None and not any(trial.step_ms.values())


@pytest.mark.parametrize("plans_where_torch_fits", [False, True])
def test_a_training_loop_through_converted_modules_reaches_the_trials_end(
        fake_device, monkeypatch, plans_where_torch_fits):
    """Real converted modules and the real hook, with each layer's first call
    faked to what a GPU's calibration leaves (every direction fits; PyTorch's
    call kept, or a plan kept): the first step calibrates, the second is not
    timed, and then either the ways are one and PyTorch's is kept untimed, or
    the trial times both ways and keeps one."""
    import torch.nn.functional as F

    from mucudnn.torch.modules import MucudnnConvMixin

    met: set[int] = set()

    def first_calls(self, input, weight, bias):
        if id(self) not in met:  # what warm_call's calibration does at a first call
            met.add(id(self))
            engine.CALIBRATIONS[0] += 1
        keep = not plans_where_torch_fits
        engine._LAST.warm = type("Warm", (), {"fits": (True,) * 3, "native": (keep,) * 3,
                                                "key": ("stub",), "transposed": False})()
        return F.conv2d(input, weight, bias, self.stride, self.padding)

    monkeypatch.setattr(MucudnnConvMixin, "_mu_forward", first_calls)
    monkeypatch.setattr(engine._LAST, "warm", None, raising=False)  # restored afterwards
    model = mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 1)))
    trial = step_trial.trial_of(model)
    x = torch.randn(2, 3, 6, 6)
    for step in range(3):
        model(x)
        fake_device.now += 1.0
        assert trial.kept is None or step == 2
    if not plans_where_torch_fits:
        assert trial.kept == TORCH and trial.torch and trial.step_ms == {PLANS: [], TORCH: []}
        return
    assert trial.kept is None
    for _ in range(2 * (TRIAL_STEPS + 1)):
        model(x)
        fake_device.now += 1.0
    assert trial.kept in (PLANS, TORCH)
    assert [len(v) for v in trial.step_ms.values()] == [TRIAL_STEPS, TRIAL_STEPS]


def test_convert_hooks_one_trial_shared_by_its_layers_and_the_report_shows_it():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sequential(nn.Conv2d(4, 4, 1)))
    mt.convert(model)
    mt.convert(model, workspace_limit=1 << 20)  # again: one trial still
    trials = [h for m in model.modules() for h in m._forward_pre_hooks.values()
              if isinstance(h, StepTrial)]
    assert len(trials) == 1 and step_trial.trial_of(model) is trials[0]
    assert model[0]._mu_step is trials[0] and model[1][0]._mu_step is trials[0]
    rep = mt.report(model)
    assert rep.as_dict()["step_trial"] == {"kept": None, "torch": False,
                                           "step_ms": {PLANS: [], TORCH: []}}
    copied = pickle.loads(pickle.dumps(model))
    assert copied[0]._mu_step is step_trial.trial_of(copied)
    assert mt.report(nn.Linear(1, 1)).step_trial is None


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("kept", [PLANS, TORCH])
def test_a_trained_model_keeps_a_way_and_computes_its_convolutions(monkeypatch, tmp_path, kept):
    """Training steps run the trial to its end; with PyTorch's way kept, the
    layers whose PyTorch workspace fits run torch.nn's code alone (no warm
    call); either way outputs and gradients match float64."""
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    mt.clear()
    monkeypatch.setattr(StepTrial, "decide", staticmethod(lambda step_ms: kept))
    # every layer keeps its plans per layer, so the two ways differ and the trial runs
    monkeypatch.setattr(native, "settle", lambda choices, *_: choices)
    monkeypatch.setattr(native, "decide", lambda d, plan_ms, torch_ms, ws, limit: native.Choice(
        d, native.MUCUDNN, plan_ms, torch_ms, ws, limit, "forced by the test"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 8, 1, groups=2)).cuda().to(memory_format=torch.channels_last)
    ref = copy.deepcopy(model).double()
    mt.convert(model, workspace_limit=64 << 20)
    trial = step_trial.trial_of(model)
    calls = []
    real_warm = engine.warm_call
    monkeypatch.setattr(engine, "warm_call", lambda *a: calls.append(1) or real_warm(*a))
    with torch.backends.cudnn.flags(allow_tf32=False):
        for _ in range(3 * (TRIAL_STEPS + 2)):
            calls.clear()
            x = torch.randn(4, 8, 10, 10, device="cuda").to(memory_format=torch.channels_last)
            step_against_float64(model, ref, x)
    assert trial.kept == kept
    convs = [m for m in model.modules() if isinstance(m, mt.Conv2d)]
    if kept == TORCH:
        assert all(m._mu_torch[2] for m in convs)  # small layers: PyTorch's workspace fits
    entered = [m for m in convs if not m._mu_torch[1] and not (kept == TORCH and m._mu_torch[2])]
    assert bool(calls) == bool(entered)
    mt.clear()
