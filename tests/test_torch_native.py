"""See Note [never slower than native]: the rule that picks PyTorch's own call, the
records and ``mucudnn.torch.report`` (CPU), and on a GPU (marker ``gpu``) the
comparison itself: choices follow the rule on measured times and workspaces,
and a layer that runs PyTorch's call, or the plan, computes the convolution
(against float64) in every direction.
"""

from __future__ import annotations

import itertools
import threading

import pytest
from hypothesis import given, strategies as st

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import mucudnn  # noqa: E402
import mucudnn.torch as mt  # noqa: E402
from mucudnn.optimizer import optimize_wr  # noqa: E402
from mucudnn.problem import Direction  # noqa: E402
from mucudnn.torch import measure, native, settings  # noqa: E402
from mucudnn.torch.engine import ConvConfig  # noqa: E402
from mucudnn.torch.report import TRIAL_REASON  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")
times = st.one_of(st.none(), st.floats(0.0, 100.0))
sizes = st.one_of(st.none(), st.integers(0, 1 << 32))


@given(d=st.sampled_from(list(Direction)), plan_ms=times, torch_ms=times, ws=sizes, limit=sizes)
def test_pytorch_runs_exactly_where_its_measured_workspace_fits_and_it_is_no_slower(
        d, plan_ms, torch_ms, ws, limit):
    c = native.decide(d, plan_ms, torch_ms, ws, limit)
    fits = ws is not None and (limit is None or ws <= limit)
    faster = plan_ms is not None and torch_ms is not None and torch_ms <= plan_ms
    assert (c.runs == native.TORCH) == (fits and faster)
    assert (c.direction, c.plan_ms, c.torch_ms, c.torch_workspace, c.limit) == (
        d, plan_ms, torch_ms, ws, limit)
    assert c.reason


@given(plan=st.lists(st.floats(0.0, 10.0), min_size=3, max_size=3),
       torch_=st.lists(st.floats(0.0, 10.0), min_size=3, max_size=3),
       ws=st.lists(st.integers(0, 4 << 20), min_size=3, max_size=3),
       host=st.one_of(st.none(), st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 5.0))),
       need_dx=st.booleans())
def test_a_layer_runs_pytorch_whole_where_the_plans_do_not_pay_their_host_cost(
        plan, torch_, ws, host, need_dx):
    """See Note [host cost of a converted layer]: only the directions a step
    runs count (backward-data where the input needs its gradient)."""
    limit = 2 << 20
    choices = {d: native.decide(d, p, t, w, limit) for d, p, t, w in zip(Direction, plan, torch_, ws)}
    got = native.settle(choices, host, native.skipped(need_dx))
    runs = [d for d in Direction if need_dx or d is not Direction.BACKWARD_DATA]
    fit = {d: w <= limit for d, w in zip(Direction, ws)}
    eligible = host is not None and all(fit[d] for d in runs)
    saving = sum(t - p for d, p, t in zip(Direction, plan, torch_)
                 if d in runs and choices[d].runs == native.MUCUDNN)
    switched = eligible and 0 < saving <= host[0] - host[1]
    if switched:
        assert all(got[d].runs == native.TORCH for d in runs)
        assert all(got[d].runs == (native.TORCH if fit[d] else choices[d].runs)
                   for d in Direction if d not in runs)
        assert all(got[d].reason == choices[d].reason for d in Direction
                   if choices[d].runs == native.TORCH)
        assert all("host" in got[d].reason for d in Direction
                   if choices[d].runs == native.MUCUDNN and fit[d])
    else:
        assert got == choices
    for d in Direction:  # the measurements stay as measured
        assert (got[d].plan_ms, got[d].torch_ms, got[d].torch_workspace) == (
            choices[d].plan_ms, choices[d].torch_ms, choices[d].torch_workspace)
        # a capture runs what the GPU chose (Note [captured steps run the GPU's choice])
        assert got[d].captured == choices[d].runs == choices[d].captured


def test_report_lists_the_records_of_each_converted_layer_and_totals():
    model = mt.convert(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(8, 8, 3, padding=1, groups=8)),
                       workspace_limit=1 << 20)
    mt.clear()
    cfg = ConvConfig((1, 1), (1, 1), (1, 1), 8, 1 << 20, model[2]._mu_options.policy, "", "")
    choices = {d: native.decide(d, 1.0, t, ws, 1 << 20)
               for d, t, ws in zip(Direction, (0.5, 2.0, 0.5), (0, 0, 2 << 20))}
    native._RECORDS.put(("k",), native.Record(cfg, (4, 8, 6, 6), (8, 1, 3, 3), "float32", True,
                                              {}, choices))
    assert mt.report(model).layers == []  # a record no layer ran is no layer's
    model[2]._mu_seen.append(("k",))  # as its call would (MucudnnConvMixin._conv_forward)
    rep = mt.report(model)
    assert rep.unmeasured == ["0"]
    (layer,) = rep.layers
    assert layer.name == "2" and layer.channels_last
    runs = {k: v["runs"] for k, v in layer.directions.items()}
    assert runs == {"fwd": "torch", "bwd-data": "mucudnn", "bwd-filter": "mucudnn"}
    # what runs: PyTorch's 0.5 ms forward, the plans' 1.0 ms backward passes
    assert layer.ms == pytest.approx(2.5) and layer.torch_ms == pytest.approx(3.0)
    d = rep.as_dict()
    assert d["totals"] == {"ms": pytest.approx(2.5), "torch_ms": pytest.approx(3.0),
                           "kernels": 3, "torch_kernels": 1}
    assert "over the limit" in d["layers"][0]["directions"]["bwd-filter"]["reason"]
    # the limit's cost: bwd-filter's PyTorch workspace (2 MiB) is over 1 MiB; its plan
    # takes 1.0 ms against PyTorch's 0.5
    assert d["over_limit"] == {"kernels": 1, "ms": pytest.approx(0.5),
                               "largest_torch_workspace": 2 << 20}
    text = str(rep)
    assert "| 2 | 4x8x6x6 cl | fwd | torch | PyTorch's own |" in text
    assert "over the limit in 1 kernel(s); their plans take +0.500 ms" in text
    assert "a limit of 2.0 MiB would admit" in text
    # a first layer (input without gradient) runs no backward-data in a step: it is
    # listed, but neither totalled nor counted against the limit
    native._RECORDS.put(("k",), native.Record(cfg, (4, 8, 6, 6), (8, 1, 3, 3), "float32", True,
                                              {}, choices, need_dx=False))
    rep = mt.report(model)
    d = rep.as_dict()
    assert d["totals"] == {"ms": pytest.approx(1.5), "torch_ms": pytest.approx(1.0),
                           "kernels": 2, "torch_kernels": 1}
    assert d["over_limit"]["kernels"] == 1 and rep.layers[0].ms == pytest.approx(1.5)
    assert "| bwd-data (not in a step) | mucudnn |" in str(rep)
    # a transposed layer's (Note [transposed convolutions]): its forward is the
    # problem's backward-data, so without an input gradient the problem's forward
    # is what a step does not run; x is the problem's input, the layer's output
    native._RECORDS.put(("k",), native.Record(cfg, (4, 8, 6, 6), (8, 1, 3, 3), "float32", True,
                                              {}, choices, need_dx=False, transposed=True))
    rep = mt.report(model)
    assert rep.layers[0].transposed
    assert {k: v["in_step"] for k, v in rep.layers[0].directions.items()} == {
        "fwd": False, "bwd-data": True, "bwd-filter": True}
    assert rep.as_dict()["totals"]["kernels"] == 2 and rep.layers[0].ms == pytest.approx(2.0)
    assert "| 2 | 4x8x6x6 cl (transposed: its output) | fwd (not in a step) |" in str(rep)
    mt.clear()
    assert mt.report(model).layers == []


def test_report_counts_the_replays_of_the_layers_planned_launches():
    """See Note [replay after repeated addresses]: the report sums the graph
    counts of the convolutions its layers ran, each once however many layers
    share it, and says them in a line; a model whose kernels keep no graph
    cache reports None and no line."""
    from types import SimpleNamespace

    from mucudnn.torch import engine

    model = mt.convert(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)),
                       workspace_limit=1 << 20)
    mt.clear()
    cfg = ConvConfig((1, 1), (1, 1), (1, 1), 1, 1 << 20, model[0]._mu_options.policy, "", "")
    choices = {d: native.decide(d, 1.0, 2.0, 2 << 20, 1 << 20) for d in Direction}
    native._RECORDS.put(("k",), native.Record(cfg, (4, 8, 6, 6), (8, 8, 3, 3), "float32", True,
                                              {}, choices))

    def cache(c, r, d, failed=None):
        return SimpleNamespace(captures=c, replays=r, direct=d, failed=failed,
                               capture_s=c * 1e-3, instantiate_s=c * 4e-4, replay_s=r * 1e-5,
                               direct_s=d * 1e-4)

    caches = dict(zip(Direction, (cache(2, 9, 2), None, cache(1, 4, 3, "CudaError: x"))))
    conv = SimpleNamespace(kernel=lambda d: SimpleNamespace(graphs=caches[d]))
    engine._WARM.put(("k",), SimpleNamespace(conv=conv))
    for layer in model:
        layer._mu_seen.append(("k",))  # both layers ran the one signature
    rep = mt.report(model)
    assert rep.replay == pytest.approx({"kernels": 2, "captures": 3, "replays": 13, "direct": 5,
                                        "failed": 1, "capture_s": 3e-3, "instantiate_s": 12e-4,
                                        "replay_s": 13e-5, "direct_s": 5e-4})
    assert rep.as_dict()["replay"] == rep.replay
    assert ("replay: planned launches 13 replayed as CUDA graphs, 3 of them captured, 5 "
            "launched directly; 1 kernel(s) launch directly after a failed capture") in str(rep)
    assert ("replay host time: captures 3.000 ms (1.200 ms of it instantiating), graph "
            "launches 0.130 ms, direct launches 0.500 ms") in str(rep)
    caches.update({d: None for d in Direction})
    rep = mt.report(model)
    assert rep.replay is None and "replay:" not in str(rep)
    mt.clear()


def test_report_lists_each_layer_with_the_signatures_it_ran_alone():
    """Two layers of one weight shape and options that run on inputs of other
    sizes (a squeeze-and-excitation block's 1x1 convolutions beside a 1x1
    expansion) share no record: each is listed, and totalled, with its own
    signature only, and a layer that ran both is listed with both."""
    model = mt.convert(nn.Sequential(nn.Conv2d(8, 16, 1), nn.Conv2d(8, 16, 1),
                                     nn.Conv2d(8, 16, 1)), workspace_limit=1 << 20)
    mt.clear()
    cfg = ConvConfig((1, 1), (0, 0), (1, 1), 1, 1 << 20, model[0]._mu_options.policy, "", "")
    for key, ms, hw in ((("big",), 2.0, 56), (("small",), 0.5, 1)):
        choices = {d: native.decide(d, None, ms, 0, 1 << 20) for d in Direction}
        native._RECORDS.put(key, native.Record(cfg, (4, 8, hw, hw), (16, 8, 1, 1), "float32",
                                               True, {}, choices))
    model[0]._mu_seen.append(("big",))
    model[1]._mu_seen.append(("small",))
    model[2]._mu_seen.extend([("big",), ("small",)])
    rep = mt.report(model)
    assert [(layer.name, layer.x_shape[2]) for layer in rep.layers] == [
        ("0", 56), ("1", 1), ("2", 56), ("2", 1)]
    assert rep.as_dict()["totals"]["torch_ms"] == pytest.approx(3 * (2 * 2.0 + 2 * 0.5))
    mt.clear()


@given(ran=st.lists(st.lists(st.integers(0, 3), max_size=4), min_size=1, max_size=4),
       ms=st.lists(st.floats(0.0, 10.0), min_size=4, max_size=4))
def test_report_rows_and_totals_are_each_layers_own_signatures(ran, ms):
    """For layers of one weight shape that ran any signatures of a pool (in any
    order, repeats included), the report lists each layer with the ones it ran,
    once each in the order first met, and totals exactly those."""
    model = mt.convert(nn.Sequential(*[nn.Conv2d(8, 16, 1) for _ in ran]),
                       workspace_limit=1 << 20)
    mt.clear()
    cfg = ConvConfig((1, 1), (0, 0), (1, 1), 1, 1 << 20, model[0]._mu_options.policy, "", "")
    for i, t in enumerate(ms):
        choices = {d: native.decide(d, None, t, 0, 1 << 20) for d in Direction}
        native._RECORDS.put(("sig", i), native.Record(cfg, (4, 8, i + 1, i + 1), (16, 8, 1, 1),
                                                      "float32", True, {}, choices))
    for layer, sigs in zip(model, ran):
        for i in sigs:
            if ("sig", i) not in layer._mu_seen:
                layer._mu_seen.append(("sig", i))
    rep = mt.report(model)
    want = [(str(n), i) for n, sigs in enumerate(ran) for i in dict.fromkeys(sigs)]
    assert [(layer.name, layer.x_shape[2] - 1) for layer in rep.layers] == want
    assert rep.unmeasured == [str(n) for n, sigs in enumerate(ran) if not sigs]
    assert rep.as_dict()["totals"]["torch_ms"] == pytest.approx(sum(3 * ms[i] for _, i in want))
    mt.clear()


def test_report_shows_pytorchs_call_where_the_step_trial_runs_it():
    """See Note [the whole-step trial]: while the model's trial runs PyTorch's
    way, a layer whose PyTorch workspace fits in every direction a step runs
    runs PyTorch's call there, and the report says so (and totals it); a layer
    with a direction over the limit keeps its plans, as it then runs."""
    from mucudnn.torch.step_trial import trial_of

    model = mt.convert(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8)),
                       workspace_limit=1 << 20)
    mt.clear()
    cfg = ConvConfig((1, 1), (1, 1), (1, 1), 8, 1 << 20, model[0]._mu_options.policy, "", "")
    fit = {d: native.decide(d, p, 1.0, 0, 1 << 20)
           for d, p in zip(Direction, (0.5, 2.0, 0.25))}  # plans faster in two directions
    native._RECORDS.put(("k",), native.Record(cfg, (4, 8, 6, 6), (8, 1, 3, 3), "float32", True,
                                              {}, fit))
    model[0]._mu_seen.append(("k",))
    trial = trial_of(model)
    assert trial is not None and not trial.torch
    rows = mt.report(model).layers[0].directions
    assert [v["runs"] for v in rows.values()] == ["mucudnn", "torch", "mucudnn"]
    trial.torch = True
    rep = mt.report(model)
    rows = rep.layers[0].directions
    assert [v["runs"] for v in rows.values()] == ["torch", "torch", "torch"]
    assert rows["fwd"]["reason"] == TRIAL_REASON and rows["fwd"]["ms"] == 1.0
    # a capture runs the GPU's choices whatever the trial's way (Note [captured
    # steps run the GPU's choice]), and the report says where that differs
    assert [v["captured"] for v in rows.values()] == ["mucudnn", "torch", "mucudnn"]
    assert "| fwd | torch (mucudnn captured) |" in str(rep)
    assert "| bwd-data | torch |" in str(rep)
    assert rep.as_dict()["totals"] == {"ms": 3.0, "torch_ms": 3.0, "kernels": 3,
                                       "torch_kernels": 3}
    # a direction over the limit: the layer keeps its plans under either way
    over = dict(fit)
    over[Direction.BACKWARD_FILTER] = native.decide(Direction.BACKWARD_FILTER, 0.25, 1.0,
                                                    2 << 20, 1 << 20)
    native._RECORDS.put(("k",), native.Record(cfg, (4, 8, 6, 6), (8, 1, 3, 3), "float32", True,
                                              {}, over))
    rows = mt.report(model).layers[0].directions
    assert [v["runs"] for v in rows.values()] == ["mucudnn", "torch", "mucudnn"]
    mt.clear()


def test_report_says_what_the_first_calls_cost_counting_each_signature_once():
    """See Note [first-call seconds]. The report sums each timed signature's first
    call once (two layers of one shape share it) and the planning within it."""
    model = mt.convert(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8),
                                     nn.Conv2d(8, 8, 3, padding=1, groups=8),
                                     nn.Conv2d(8, 8, 1)), workspace_limit=1 << 20)
    mt.clear()
    policy = model[0]._mu_options.policy
    dw = ConvConfig((1, 1), (1, 1), (1, 1), 8, 1 << 20, policy, "", "")
    pw = ConvConfig((1, 1), (0, 0), (1, 1), 1, 1 << 20, policy, "", "")
    choices = {d: native.decide(d, 1.0, 0.5, 0, 1 << 20) for d in Direction}
    plan = {Direction.FORWARD: optimize_wr({4: [mucudnn.AlgoPerf(algo=1, time_ms=1.0,
                                                                workspace_bytes=0)]},
                                           batch=4, workspace_limit=1 << 20, policy="undivided")}
    native._RECORDS.put(("dw",), native.Record(dw, (4, 8, 6, 6), (8, 1, 3, 3), "float32", True,
                                               plan, choices, first_s=2.5, plan_s=2.0))
    native._RECORDS.put(("pw",), native.Record(pw, (4, 8, 6, 6), (8, 8, 1, 1), "float32", True,
                                               {}, choices, first_s=0.25, plan_s=0.0))
    for layer, key in zip(model, (("dw",), ("dw",), ("pw",))):
        layer._mu_seen.append(key)
    rep = mt.report(model)
    assert [layer.name for layer in rep.layers] == ["0", "1", "2"]
    assert rep.as_dict()["first_calls"] == {"signatures": 2, "seconds": pytest.approx(2.75),
                                            "planning_seconds": pytest.approx(2.0),
                                            "planned_signatures": 1, "standin_signatures": 0,
                                            "deferred_seconds": 0.0}
    assert "first calls: 2 signature(s) took 2.75 s, 2.00 s of it searching and timing plans " \
           "(1 signature(s) planned)" in str(rep)
    assert "planned after the first step" not in str(rep)
    # stand-ins now, then the later call that planned them (See Note [planning after the first step])
    over = {d: native.decide(d, 1.0, 0.5, 2 << 20, 1 << 20) for d in Direction}
    native._RECORDS.put(("dw",), native.Record(dw, (4, 8, 6, 6), (8, 1, 3, 3), "float32", True,
                                               plan, over, first_s=0.5, plan_s=0.125,
                                               standin=True))
    rep = mt.report(model)
    assert (rep.first_calls["standin_signatures"], rep.first_calls["planned_signatures"]) == (1, 0)
    assert rep.layers[0].directions["fwd"]["plan"].startswith("stand-in: ")
    assert rep.layers[2].directions["fwd"]["plan"] == "PyTorch's own"
    assert "planned after the first step: 0.00 s; 1 signature(s) still run stand-ins" in str(rep)
    native._RECORDS.put(("dw",), native.Record(dw, (4, 8, 6, 6), (8, 1, 3, 3), "float32", True,
                                               plan, over, first_s=0.5, plan_s=0.125,
                                               deferred_s=1.5))
    rep = mt.report(model)
    assert (rep.first_calls["standin_signatures"], rep.first_calls["deferred_seconds"],
            rep.first_calls["planned_signatures"]) == (0, 1.5, 1)
    assert not rep.layers[0].directions["fwd"]["plan"].startswith("stand-in")
    assert "planned after the first step: 1.50 s; 0 signature(s) still run stand-ins" in str(rep)
    native._RECORDS.put(("pw",), native.Record(pw, (4, 8, 6, 6), (8, 8, 1, 1), "float32", True,
                                               {}, choices))  # not timed: not counted
    assert mt.report(model).first_calls["signatures"] == 1
    mt.clear()
    assert mt.report(model).first_calls is None


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


def _two_calls_match_float64(model: nn.Module, conv: nn.Module, ref: nn.Module,
                             x_shape: tuple) -> None:
    """Two training calls of ``model`` (the first compares, the second runs the
    choice) under a native model's cuDNN flags, TF32 off: output and gradients
    against ``ref``, ``conv``'s float64 twin, within the error of PyTorch's own
    cuDNN call there (cudnn.benchmark may pick an FFT or Winograd algorithm,
    whose float32 error is well above 1e-5), or 1e-5 where that is less."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=False):
        for _ in range(2):
            x = torch.randn(x_shape, device="cuda").to(memory_format=torch.channels_last)
            x.requires_grad_(True)
            y = model(x)
            dy = torch.randn_like(y)
            y.backward(dy)
            x64 = x.detach().double().requires_grad_(True)
            y64 = ref(x64)
            y64.backward(dy.double())
            # PyTorch's own call on the same operands: the error a native model has
            xn = x.detach().clone().requires_grad_(True)
            wn = conv.weight.detach().clone().requires_grad_(True)
            yn = F.conv2d(xn, wn, conv.bias.detach(), conv.stride, conv.padding, conv.dilation,
                          conv.groups)
            yn.backward(dy)
            for got, theirs, want in ((y, yn, y64), (x.grad, xn.grad, x64.grad),
                                      (conv.weight.grad, wn.grad, ref.weight.grad)):
                assert _rel(got, want) <= max(1e-5, 1.5 * _rel(theirs, want))
            conv.weight.grad = ref.weight.grad = None
            conv.bias.grad = ref.bias.grad = None


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("force", [None, native.TORCH, native.MUCUDNN])
@pytest.mark.parametrize("groups", [1, 32])
def test_a_converted_layer_computes_the_convolution_whichever_side_runs(monkeypatch, tmp_path,
                                                                          force, groups):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    mt.clear()
    if force is not None:
        real = native.decide
        monkeypatch.setattr(native, "settle", lambda choices, *_: choices)

        def forced(d, plan_ms, torch_ms, ws, limit):
            c = real(d, plan_ms, torch_ms, ws, limit)
            return native.Choice(d, force, c.plan_ms, c.torch_ms, c.torch_workspace, c.limit,
                                 "forced by the test")
        monkeypatch.setattr(native, "decide", forced)
    torch.manual_seed(0)
    conv = nn.Conv2d(32, 64, 3, padding=1, groups=groups).cuda().to(
        memory_format=torch.channels_last)
    ref = nn.Conv2d(32, 64, 3, padding=1, groups=groups).cuda().double()
    ref.load_state_dict(conv.state_dict())
    model = mt.convert(nn.Sequential(conv), workspace_limit=16 << 20)
    _two_calls_match_float64(model, conv, ref, (8, 32, 20, 20))
    rep = mt.report(model)
    (layer,) = rep.layers
    assert set(layer.directions) == {"fwd", "bwd-data", "bwd-filter"}
    if force is None:
        decided = {d: native.decide(d, v["plan_ms"], v["torch_ms"], v["torch_workspace"],
                                    16 << 20) for d, v in zip(Direction, layer.directions.values())}
        want = native.settle(decided, layer.host_ms)
    for d, v in zip(Direction, layer.directions.values()):
        assert v["plan_ms"] > 0 and v["torch_ms"] > 0
        if force is not None:
            assert v["runs"] == force
        else:
            assert v["runs"] == want[d].runs
            if v["runs"] == native.TORCH:
                assert v["torch_workspace"] <= 16 << 20
    if force is None and any(c.runs == native.MUCUDNN for c in decided.values()):
        assert layer.host_ms is not None and min(layer.host_ms) > 0
    mt.clear()


@pytest.mark.gpu
@gpu
def test_a_settled_module_runs_torch_nn_code_and_computes_the_convolution(monkeypatch, tmp_path):
    """See Note [host cost of a converted layer]: once a module's signature is
    settled on PyTorch's call, its calls run no mucudnn code; a new signature
    (another batch) is compared again."""
    from mucudnn.torch import engine
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    mt.clear()
    monkeypatch.setattr(native, "settle", lambda choices, *_: {
        d: native.Choice(d, native.TORCH, c.plan_ms, c.torch_ms, c.torch_workspace, c.limit,
                         "forced by the test") for d, c in choices.items()})
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 32, 3, padding=1).cuda().to(memory_format=torch.channels_last)
    ref = nn.Conv2d(16, 32, 3, padding=1).cuda().double()
    ref.load_state_dict(conv.state_dict())
    model = mt.convert(nn.Sequential(conv), workspace_limit=16 << 20)
    calls = []
    real_warm = engine.warm_call
    monkeypatch.setattr(engine, "warm_call", lambda *a: calls.append(1) or real_warm(*a))
    with torch.backends.cudnn.flags(allow_tf32=False):
        for batch, entered in ((8, True), (8, False), (4, True)):
            calls.clear()
            x = torch.randn(batch, 16, 12, 12, device="cuda").to(
                memory_format=torch.channels_last).requires_grad_(True)
            y = model(x)
            dy = torch.randn_like(y)
            y.backward(dy)
            assert bool(calls) == entered
            x64 = x.detach().double().requires_grad_(True)
            y64 = ref(x64)
            y64.backward(dy.double())
            assert _rel(y, y64) < 1e-5 and _rel(x.grad, x64.grad) < 1e-5
            assert _rel(conv.weight.grad, ref.weight.grad) < 1e-5
            assert _rel(conv.bias.grad, ref.bias.grad) < 1e-5
            conv.weight.grad = conv.bias.grad = ref.weight.grad = ref.bias.grad = None
    assert len(conv._mu_torch[1]) == 2
    mt.clear()  # forgets the verdicts: the next call compares again
    calls.clear()
    assert conv(x).shape == y.shape and calls and len(conv._mu_torch[1]) == 1
    mt.clear()


@pytest.mark.gpu
@gpu
def test_a_capture_runs_the_plans_the_gpu_chose_where_eager_steps_run_pytorchs(monkeypatch,
                                                                               tmp_path):
    """See Note [captured steps run the GPU's choice]: a layer whose plans were
    faster on the GPU but which the host rule settled on PyTorch's call runs
    PyTorch's call in eager steps and its plans in a CUDA graph, and the graph's
    replays compute the convolution (against float64)."""
    import functools

    from mucudnn.torch import engine
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "all")
    mt.clear()
    real_time = native.time_ms

    def plans_faster(fns, repeat=measure.REPEAT):  # both sides run; the plan is said faster
        real_time(fns, repeat)
        return [0.1, 1.0]

    monkeypatch.setattr(native, "time_ms", plans_faster)
    monkeypatch.setattr(native, "_host_pair", lambda *a: (10.0, 0.1))  # and dearer on the host
    ran: list = []

    def spy(name, real, *a, **k):
        ran.append(name)
        return real(*a, **k)

    for name in ("native_forward", "native_backward"):
        monkeypatch.setattr(native, name, functools.partial(spy, name, getattr(native, name)))
    torch.manual_seed(0)
    cl = torch.channels_last
    conv = nn.Conv2d(16, 32, 3, padding=1, bias=False).cuda().to(memory_format=cl)
    ref = nn.Conv2d(16, 32, 3, padding=1, bias=False).cuda().double()
    ref.load_state_dict(conv.state_dict())
    model = mt.convert(nn.Sequential(conv), workspace_limit=64 << 20)
    static_x = torch.randn(8, 16, 12, 12, device="cuda").to(memory_format=cl).requires_grad_(True)
    static_dy = torch.randn(8, 32, 12, 12, device="cuda").to(memory_format=cl)
    with torch.backends.cudnn.flags(allow_tf32=False):
        for _ in range(2):  # the first call compares and settles; the second runs torch.nn's
            model(static_x).backward(static_dy)
        assert conv._mu_torch[1], "settled on PyTorch's call for eager steps"
        dirs = mt.report(model).layers[0].directions
        assert [(v["runs"], v["captured"]) for v in dirs.values()] == \
            [(native.TORCH, native.MUCUDNN)] * 3
        (warm,) = engine._WARM.values()
        for attr in ("fwd", "bwd_data", "bwd_filter"):
            setattr(warm, attr, functools.partial(spy, attr, getattr(warm, attr)))
        ran.clear()
        side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(static_x).backward(static_dy)
        torch.cuda.current_stream().wait_stream(side)
        assert not any(r in ("fwd", "bwd_data", "bwd_filter") for r in ran)  # eager: PyTorch's
        ran.clear()
        static_x.grad = conv.weight.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = model(static_x)
            static_y.backward(static_dy)
        assert sorted(ran) == ["bwd_data", "bwd_filter", "fwd"], ran  # the plans, no PyTorch call
        for seed in (1, 2):
            g = torch.Generator(device="cuda").manual_seed(seed)
            with torch.no_grad():
                static_x.copy_(torch.randn(static_x.shape, device="cuda", generator=g))
                static_dy.copy_(torch.randn(static_dy.shape, device="cuda", generator=g))
            graph.replay()
            torch.cuda.synchronize()
            x64 = static_x.detach().double().requires_grad_(True)
            ref.weight.grad = None
            y64 = ref(x64)
            y64.backward(static_dy.double())
            assert _rel(static_y, y64) < 1e-5
            assert _rel(static_x.grad, x64.grad) < 1e-5
            assert _rel(conv.weight.grad, ref.weight.grad) < 1e-5
    mt.clear()


@pytest.mark.gpu
@gpu
def test_timed_calls_take_the_gpus_time_not_the_hosts():
    """See Note [timing the GPU alone]: a call that keeps the host 2 ms to issue
    a kernel of microseconds times as the kernel; one whose kernel keeps the GPU
    busy times as that kernel."""
    import time
    x = torch.zeros(16, device="cuda")

    def slow_host() -> None:
        time.sleep(0.002)
        x.add_(1)

    def busy_gpu() -> None:
        torch.cuda._sleep(1 << 22)  # about 2 ms at 2 GHz

    fast, busy = measure.time_ms([slow_host, busy_gpu])
    assert fast < 0.2, fast
    assert busy > 1.0, busy
    torch.cuda.synchronize()
    assert float(x[0]) >= 1 + measure.REPEAT


@pytest.mark.gpu
@gpu
def test_pytorch_workspace_is_measured_not_understated():
    """A call whose workspace is known: a float32 NCHW forward with a large
    filter under cudnn.benchmark takes some workspace; the measurement is at
    least the bytes the allocator's peak grew by beyond the output, and it
    leaves the peak an earlier allocation reached as it was."""
    x = torch.randn(64, 64, 56, 56, device="cuda")
    w = torch.randn(64, 64, 5, 5, device="cuda")
    cfg = ConvConfig((1, 1), (2, 2), (1, 1), 1, -1, "fitted", "", "")

    def call():
        return native.native_forward(x, w, cfg, False, True)

    call()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = call()
    torch.cuda.synchronize()
    peak, held = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    del y
    # the output as the allocator counts it: See Note [outputs as the allocator counts them]
    peak_ws = peak - base - (held - torch.cuda.memory_allocated())
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # the user's peak, then freed
    del big
    user_peak = torch.cuda.max_memory_allocated()
    ws = measure.workspace_of(call)
    assert ws is not None and ws >= peak_ws
    # See Note [measuring without resetting the peak]
    assert torch.cuda.max_memory_allocated() == user_peak
    assert torch.allclose(call(), F.conv2d(x, w, padding=2), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@gpu
def test_a_layers_first_calls_leave_the_users_cuda_random_stream_alone(monkeypatch, tmp_path):
    """See Note [random operands of our own]: the first calls of a convolution
    and of a transposed convolution, which measure PyTorch's calls on operands
    of their own, draw nothing from torch's CUDA generator."""
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("MUCUDNN_TORCH_DEFER", "0")  # measured in this first step
    mt.clear()
    model = mt.convert(nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)).cuda(),
        workspace_limit=1 << 10)
    x = torch.randn(4, 8, 12, 12, device="cuda", requires_grad=True)
    state = torch.cuda.get_rng_state()
    with torch.backends.cudnn.flags(enabled=True, benchmark=True):
        model(x).sum().backward()
    torch.cuda.synchronize()
    assert torch.equal(torch.cuda.get_rng_state(), state)
    recs = native.records()
    assert {r.transposed for r in recs} == {False, True}
    assert all(any(c.torch_ms is not None for c in r.choices.values()) for r in recs)
    mt.clear()


def _block_bytes(nbytes: int) -> int:
    """What torch's caching allocator counts for ``nbytes`` (default settings)."""
    return 0 if nbytes == 0 else max(512, -(-nbytes // 512) * 512)


class _Allocator:
    """A stand-in for torch's caching allocator's statistics: blocks rounded up
    to 512 bytes, as its allocated bytes (current, peak and in all) count them,
    the blocks it freed, and how often its peak was reset."""

    def __init__(self) -> None:
        self.allocated = self.peak = self.total = self.freed = self.resets = 0

    def block(self, nbytes: int) -> object:
        size = _block_bytes(nbytes)
        self.allocated += size
        self.total += size
        self.peak = max(self.peak, self.allocated)
        alloc = self

        class Block:
            def __del__(self) -> None:
                alloc.allocated -= size
                alloc.freed += 1
        return Block()

    def reset_peak(self, *args) -> None:
        self.peak = self.allocated
        self.resets += 1

    def install(self, monkeypatch) -> None:
        stream = type("Stream", (), {"synchronize": lambda self: None})()
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: stream)
        monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda *a: {
            "allocated_bytes": {"all": {"current": self.allocated, "peak": self.peak,
                                        "allocated": self.total}},
            "allocation": {"all": {"freed": self.freed}}})
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset_peak)


@given(ws=st.integers(0, 8 << 20), outputs=st.lists(st.integers(1, 1 << 20), min_size=1,
                                                      max_size=3),
       kept=st.integers(0, 1 << 20), before=st.integers(0, 1 << 20))
def test_pytorch_workspace_is_the_peak_over_its_outputs_as_the_allocator_counts_them(
        ws, outputs, kept, before):
    """See Note [outputs as the allocator counts them]: a call that takes ``ws``
    bytes of workspace, leaves ``kept`` bytes allocated beyond its outputs and
    returns outputs of any byte counts measures as exactly the blocks of the
    two, whatever the outputs' rounding (and what was allocated before)."""
    mp = pytest.MonkeyPatch()
    alloc = _Allocator()
    alloc.install(mp)
    held = [alloc.block(before)] if before else []
    left = []

    def call():
        if kept:
            left.append(alloc.block(kept))
        scratch = alloc.block(ws) if ws else None
        out = tuple(alloc.block(n) for n in outputs)
        del scratch
        return out

    try:
        got = measure.workspace_of(call)
    finally:
        mp.undo()
    assert got == _block_bytes(ws) + _block_bytes(kept)
    assert alloc.resets == 0  # See Note [measuring without resetting the peak]
    # the outputs were freed; what was there before and what the call kept were not
    assert alloc.allocated == _block_bytes(before) + _block_bytes(kept)
    assert len(held) + len(left) == bool(before) + bool(kept)


@given(user_peak=st.integers(0, 64 << 20), ws=st.integers(0, 8 << 20),
       out=st.integers(1, 1 << 20))
def test_measuring_leaves_the_users_peak_alone(user_peak, ws, out):
    """See Note [measuring without resetting the peak]: a peak the user's
    steps reached before (``user_peak`` bytes once held) is still the peak
    after a call with one workspace is measured, or the call's own peak if
    higher."""
    mp = pytest.MonkeyPatch()
    alloc = _Allocator()
    alloc.install(mp)
    earlier = alloc.block(user_peak)
    del earlier

    def call():
        y = alloc.block(out)
        scratch = alloc.block(ws) if ws else None
        del scratch
        return y

    try:
        got = measure.workspace_of(call)
    finally:
        mp.undo()
    assert got == _block_bytes(ws)
    assert alloc.resets == 0
    assert alloc.peak == max(_block_bytes(user_peak), _block_bytes(out) + _block_bytes(ws))


@given(scratch=st.lists(st.integers(1, 8 << 20), min_size=2, max_size=4),
       out=st.integers(1, 1 << 20))
def test_a_call_of_several_scratch_blocks_is_measured_by_its_peak(scratch, out):
    """Scratch blocks that come and go one after another: their sum is not the
    workspace a call holds at once, so the call runs once more between a reset
    of the peak and a read of it, and measures as its largest block."""
    mp = pytest.MonkeyPatch()
    alloc = _Allocator()
    alloc.install(mp)
    calls = []

    def call():
        calls.append(1)
        y = alloc.block(out)
        for n in scratch:
            b = alloc.block(n)
            del b
        return y

    try:
        got = measure.workspace_of(call)
    finally:
        mp.undo()
    assert got == max(_block_bytes(n) for n in scratch)
    assert len(calls) == 2 and alloc.resets == 1


def test_a_first_calls_operands_come_from_generators_of_our_own():
    """See Note [random operands of our own]: drawing an operand leaves torch's
    random stream where it was, keeps the memory format asked for, and draws
    the same again once the caches (its generators) are cleared."""
    cpu = torch.device("cpu")
    torch.manual_seed(3)
    expected = torch.randn(4)
    torch.manual_seed(3)
    a = measure.random_operand((2, 3, 4, 4), torch.float32, cpu, torch.channels_last)
    assert torch.equal(torch.randn(4), expected)
    assert a.shape == (2, 3, 4, 4) and a.is_contiguous(memory_format=torch.channels_last)
    assert a.std() > 0.5
    mucudnn.clear_caches()
    assert torch.equal(measure.random_operand((2, 3, 4, 4), torch.float32, cpu), a)


def test_a_call_that_meets_the_limit_exactly_fits_it(monkeypatch):
    """bfloat16 AlexNet's first backward-filter: 64 MiB of workspace and a
    46,464-byte gradient (in a 46,592-byte block) fit a 64 MiB limit."""
    alloc = _Allocator()
    alloc.install(monkeypatch)

    def call():
        scratch = alloc.block(64 << 20)
        dw = alloc.block(64 * 3 * 11 * 11 * 2)
        del scratch
        return dw

    got = measure.workspace_of(call)
    assert got == 64 << 20 and native.within_limit(got, 64 << 20)


def test_a_first_call_is_warmed_up_then_timed_and_measured_in_one_call(monkeypatch):
    """measure.probe: PyTorch's call once to warm up (cudnn.benchmark's trials,
    whose workspace does not count), then once with CUDA events around it and
    its workspace measured: two calls in all, the time and bytes the second's."""
    alloc = _Allocator()
    alloc.install(monkeypatch)
    clock = [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def elapsed_time(self, other):
            return other.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", Event)
    calls = []

    def call():  # as aten's convolution: the output, then the workspace around cuDNN's call
        first = not calls
        calls.append(first)
        out = alloc.block(1000)
        trials = alloc.block(256 << 20) if first else None  # the benchmark's trials
        scratch = alloc.block(3 << 20)
        clock[0] += 5.0 if first else 0.25
        del trials, scratch
        return out

    assert measure.probe(call) == (0.25, 3 << 20)
    assert calls == [True, False] and alloc.allocated == 0


@given(torch_ms=st.lists(st.floats(0.0, 10.0), min_size=3, max_size=3),
       ws=st.lists(st.one_of(st.none(), st.integers(0, 4 << 20)), min_size=3, max_size=3),
       limit=st.one_of(st.none(), st.integers(0, 4 << 20)), need_dx=st.booleans(),
       fails=st.one_of(st.none(), st.sampled_from(list(Direction))))
def test_pytorch_first_runs_it_exactly_where_a_direction_fits_and_plans_the_rest(
        torch_ms, ws, limit, need_dx, fails):
    """See Note [plans only over the limit]: per direction a step runs, PyTorch's
    call where its measured workspace fits, else a plan to search; the whole
    layer is planned only where PyTorch cannot run a direction."""
    by = dict(zip(Direction, zip(torch_ms, ws)))

    def measure(d):
        if d is fails:
            raise RuntimeError("cuDNN: no algorithm")
        return by[d]

    got = native.torch_first(limit, native.skipped(need_dx), measure)
    runs = [d for d in Direction if need_dx or d is not Direction.BACKWARD_DATA]
    if fails in runs:
        assert got is None
        return
    assert got is not None and list(got) == list(Direction)
    fit = [d for d in runs if by[d][1] is not None and (limit is None or by[d][1] <= limit)]
    assert native.to_plan(got, native.skipped(need_dx)) == [d for d in runs if d not in fit]
    for d in Direction:
        c = got[d]
        assert c.plan_ms is None  # nothing planned yet
        if d in fit:
            assert (c.runs, c.torch_ms, c.torch_workspace) == (native.TORCH, by[d][0], by[d][1])
            assert native.fits(c)
        elif d in runs:  # over the limit, or not measured: to be planned
            assert (c.runs, c.torch_ms, c.torch_workspace) == (native.MUCUDNN, by[d][0], by[d][1])
            assert not native.fits(c)
        else:  # backward-data of an input without gradient: planned if ever used
            assert c.runs == native.MUCUDNN and c.torch_ms is None and not native.fits(c)


def test_the_search_setting_is_checked(monkeypatch):
    monkeypatch.delenv("MUCUDNN_TORCH_SEARCH", raising=False)
    assert settings.search() == "over-limit"
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", " Over-Limit ")
    assert settings.search() == "over-limit"
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "some")
    with pytest.raises(mucudnn.MucudnnError, match="^MUCUDNN_TORCH_SEARCH: expected") as info:
        settings.search()
    assert isinstance(info.value, ValueError)


def test_the_replay_setting_is_checked(monkeypatch):
    """``MUCUDNN_TORCH_REPLAY`` (Note [replay after repeated addresses]): on
    unless set off; a value that is neither is refused, naming the variable."""
    monkeypatch.delenv("MUCUDNN_TORCH_REPLAY", raising=False)
    assert settings.replays() is True
    for on in ("1", " On ", "TRUE", "yes", ""):
        monkeypatch.setenv("MUCUDNN_TORCH_REPLAY", on)
        assert settings.replays() is True
    for off in ("0", "off", "No"):
        monkeypatch.setenv("MUCUDNN_TORCH_REPLAY", off)
        assert settings.replays() is False
    monkeypatch.setenv("MUCUDNN_TORCH_REPLAY", "sometimes")
    with pytest.raises(mucudnn.MucudnnError, match="^MUCUDNN_TORCH_REPLAY: expected") as info:
        settings.replays()
    assert isinstance(info.value, ValueError)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("limit", [0, 64 << 20])
def test_pytorch_first_plans_only_layers_over_the_limit_and_computes_the_convolution(
        monkeypatch, tmp_path, limit):
    """See Note [plans only over the limit]: a layer whose PyTorch workspace fits
    runs PyTorch's call with no plan searched, one over the limit is planned;
    either way the results match float64."""
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "over-limit")
    mt.clear()
    torch.manual_seed(0)
    conv = nn.Conv2d(32, 64, 5, padding=2).cuda().to(memory_format=torch.channels_last)
    ref = nn.Conv2d(32, 64, 5, padding=2).cuda().double()
    ref.load_state_dict(conv.state_dict())
    model = mt.convert(nn.Sequential(conv), workspace_limit=limit)
    _two_calls_match_float64(model, conv, ref, (16, 32, 24, 24))
    (rec,) = native.records()
    for d, c in rec.choices.items():
        if native.fits(c):  # PyTorch's call, no plan searched for this direction
            assert c.runs == native.TORCH and c.plan_ms is None and d not in rec.plans
        else:  # over the limit: planned and compared as without the setting
            assert c.runs == native.MUCUDNN and c.plan_ms is not None and d in rec.plans
    mt.clear()


@pytest.mark.gpu
@gpu
def test_the_report_lists_the_signatures_each_layer_ran_on_a_gpu(monkeypatch, tmp_path):
    """A squeeze-and-excitation block's shape: a 1x1 convolution on the full
    map and another of the same weight shape on its pooled 1x1 map. After a
    training step each layer is listed with the one signature it ran, a
    layer called on two batches with both, and a copy keeps none (it is this
    process's record of what the layer ran, dropped as pickling drops it)."""
    import copy

    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    mt.clear()

    class SE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.full, self.pooled = nn.Conv2d(8, 16, 1), nn.Conv2d(8, 16, 1)

        def forward(self, x):
            return self.full(x).sum() + self.pooled(x.mean((2, 3), keepdim=True)).sum()

    model = mt.convert(SE().cuda(), workspace_limit=16 << 20)
    for batch in (4, 4, 2):
        x = torch.randn(batch, 8, 10, 10, device="cuda", requires_grad=batch == 2)
        model(x).backward()
    got = [(layer.name, layer.x_shape) for layer in mt.report(model).layers]
    assert got == [("full", (4, 8, 10, 10)), ("full", (2, 8, 10, 10)),
                   ("pooled", (4, 8, 1, 1)), ("pooled", (2, 8, 1, 1))]
    twin = copy.deepcopy(model)
    assert [layer.name for layer in mt.report(twin).layers] == []
    mt.clear()
    assert mt.report(model).layers == []


@pytest.mark.parametrize("direction", list(Direction))
def test_a_call_on_the_step_thread_returns_its_result_and_raises_its_error(direction):
    """native.on_step_thread hands back what the call returns, and what it raises
    (the very exception, raised on the caller's thread)."""
    cpu = torch.device("cpu")
    assert native.on_step_thread(direction, cpu, lambda: ("done", direction)) == ("done", direction)
    err = RuntimeError("cuDNN: no algorithm for this configuration")

    def fails():
        raise err

    with pytest.raises(RuntimeError) as info:
        native.on_step_thread(direction, cpu, fails)
    assert info.value is err
    with torch.inference_mode():  # no backward pass to run it in: it runs here
        assert native.on_step_thread(direction, cpu, threading.get_ident) == threading.get_ident()


@pytest.mark.gpu
@gpu
def test_pytorchs_backward_calls_are_measured_on_the_thread_that_runs_a_steps_backward(
        monkeypatch, tmp_path):
    """See Note [PyTorch's benchmark cache is per thread]: the first call measures
    PyTorch's backward-data and backward-filter on autograd's worker thread
    (where the step's backward then finds them benchmarked), not on the caller's."""
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", "over-limit")
    mt.clear()
    probed: list[int] = []
    real = native.native_backward

    def spy(*args, **kwargs):
        probed.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(native, "native_backward", spy)
    conv = nn.Conv2d(16, 32, 3, padding=1).cuda().to(memory_format=torch.channels_last)
    model = mt.convert(nn.Sequential(conv), workspace_limit=64 << 20)
    x = torch.randn(8, 16, 12, 12, device="cuda").to(memory_format=torch.channels_last)
    x.requires_grad_()
    y = model(x)  # the first call: PyTorch's calls measured here
    (rec,) = native.records()
    assert all(native.fits(c) for c in rec.choices.values())  # every direction was measured
    at_first_call = set(probed)
    step: list[int] = []
    y.register_hook(lambda g: step.append(threading.get_ident()))
    y.sum().backward()
    assert len(step) == 1 and step[0] != threading.get_ident()  # autograd's worker thread
    assert at_first_call == {step[0]}
    mt.clear()


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("need_dx", [False, True])
@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=3)))
def test_all_in_step_is_every_direction_a_step_runs(flags, need_dx, transposed):
    """A step skips only the direction that gives the layer's input its
    gradient, where the input needs none: backward-data, or a transposed
    layer's problem's forward (Note [transposed convolutions]); all_in_step,
    which a converted layer reads on every unsettled call, checks the flags of
    all the others in Direction's order."""
    skip = native.skipped(need_dx, transposed)
    gives_dx = Direction.FORWARD if transposed else Direction.BACKWARD_DATA
    assert skip is (None if need_dx else gives_dx)
    expected = all(f for f, d in zip(flags, Direction) if need_dx or d is not gives_dx)
    assert native.all_in_step(flags, skip) is expected


class _RecordedWarm:
    """Stands in for engine._Warm: what a record was made from and calibrated with."""

    def __init__(self, x, w, cl, cfg, key, transposed=False):
        self.made = (x, w, cl, cfg, key, transposed)
        self.calibrations = []
        self.host_pending = False
        self.standin, self.standin_calls = None, 0

    def calibrate(self, x, w, key, step, need_dx):
        self.calibrations.append((x, w, key, step, need_dx))
        self.host_pending = step is None


@given(transposed=st.booleans(), needs_grad=st.booleans(), compare=st.booleans(),
       steps=st.lists(st.booleans(), min_size=1, max_size=5), batch=st.integers(0, 2))
def test_a_warm_record_is_made_once_and_compared_then_host_timed_where_that_was_left(
        transposed, needs_grad, compare, steps, batch):
    """engine.resolve, the core of a convolution's and a transposed layer's warm
    record (Note [the warm torch path]): the first call of a signature makes its
    record (from the problem's input, for a transposed layer) and, with the
    comparison on, compares it with the direction a step skips following the
    call's input; a later call that brings a host step where the first did not
    (``host_pending``) times it, once; an empty batch makes none."""
    from mucudnn.torch import engine
    x = torch.randn(batch, 2, 3, 3).requires_grad_(needs_grad)
    w = torch.randn(2, 2, 1, 1)
    cfg = ConvConfig((1, 1), (0, 0), (1, 1), 1, 1 << 20, "powerOfTwo", "", "")
    made = []

    def problem_input(x_, w_, cfg_, cl):
        assert (x_, w_, cfg_, cl) == (x, w, cfg, False)
        made.append(torch.zeros(batch, 2, 5, 5))
        return made[-1]

    def step(*a):
        raise AssertionError("resolve only hands the host step on")

    key = ("resolve-test", transposed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "_Warm", _RecordedWarm)
        mp.setattr(engine, "_STREAM", lambda index: 0)
        mp.setenv("MUCUDNN_TORCH_NATIVE", "1" if compare else "0")
        engine._WARM.pop(key)
        records, timed = [], []
        for with_step in steps:
            warm = engine.resolve(key, x, w, cfg, step if with_step else None,
                                  problem_input if transposed else None)
            records.append(warm)
            if warm is not None:
                assert engine.last_warm() is warm
                timed.append(with_step)
        if batch == 0:
            assert records == [None] * len(steps) and engine._WARM.peek(key) is None
            return
        warm = records[0]
        assert all(r is warm for r in records) and engine._WARM.peek(key) is warm
        engine._WARM.pop(key)
    px, w_, cl, cfg_, key_, tr = warm.made
    assert (w_, cl, cfg_, key_, tr) == (w, False, cfg, key, transposed)
    assert px is (made[0] if transposed else x)
    # compared at the first call where the comparison is on; timed on the host at the
    # first call with a step after a comparison without one
    expected = []
    if compare:
        expected.append(timed[0])
    pending = compare and not timed[0]
    for with_step in timed[1:]:
        if pending and with_step:
            expected.append(True)
            pending = False
    got = [(c[3] is step) for c in warm.calibrations]
    assert got == expected
    for i, c in enumerate(warm.calibrations):
        assert c[0] is (made[i] if transposed else x) and c[4] is needs_grad and c[2] == key


@given(groups=st.sampled_from([1, 2, 4]), stride=st.integers(1, 2), pad=st.integers(0, 2),
       dil=st.integers(1, 2), need=st.sampled_from([(True, False), (False, True), (True, True)]))
def test_pytorchs_own_calls_compute_the_convolution_and_its_gradients(groups, stride, pad, dil,
                                                                      need):
    """native_forward and native_backward (PyTorch's calls a layer runs where
    they win) against autograd of torch.nn.functional.conv2d in float64."""
    g = torch.Generator().manual_seed(groups * 100 + stride * 10 + pad + dil)
    x = torch.randn(3, 4, 7, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(8, 4 // groups, 3, 2, dtype=torch.float64, generator=g, requires_grad=True)
    cfg = ConvConfig((stride,) * 2, (pad,) * 2, (dil,) * 2, groups, -1, "undivided", "", "")
    ref = F.conv2d(x, w, None, stride, pad, dil, groups)
    y = native.native_forward(x.detach(), w.detach(), cfg, False, False)
    torch.testing.assert_close(y, ref.detach())
    dy = torch.randn(ref.shape, dtype=torch.float64, generator=g)
    rdx, rdw = torch.autograd.grad(ref, (x, w), dy)
    dx, dw = native.native_backward(dy, x.detach(), w.detach(), cfg, *need, False, False)
    assert (dx is not None, dw is not None) == need
    if need[0]:
        torch.testing.assert_close(dx, rdx)
    if need[1]:
        torch.testing.assert_close(dw, rdw)
