"""mucudnn.torch on the CPU (NumPy backend): autograd against torch's native
convolutions and float64 gradcheck, the modules and convert() against
nn.Conv2d/Conv3d over optimizer steps, state_dict round trips, WD mode,
channels_last, autocast, torch.compile and the custom ops (opcheck), and
torch's determinism switches."""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch (pip install torch)")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import mucudnn  # noqa: E402
import mucudnn.torch as mt  # noqa: E402
from mucudnn import Direction  # noqa: E402
from mucudnn.caches import clear_all  # noqa: E402
from mucudnn.problem import MicroBatch, make_plan  # noqa: E402
from mucudnn.torch import engine, functional, layout, ops  # noqa: E402

from conv_support import AtomicNumpyBackend  # noqa: E402
from reference import rel_err  # noqa: E402
from torch_support import compiled_like_eager  # noqa: E402

#: A limit small enough that the NumPy backend's workspace-hungry algorithms
#: need several micro-batches on the test shapes (checked in a test below).
SMALL_LIMIT = 6 << 10


pytestmark = pytest.mark.usefixtures("cache_off")


def _close(a, b, rtol=1e-4, atol=1e-5):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


# -- the package boundary ------------------------------------------------------------------------

def test_import_mucudnn_does_not_import_torch():
    code = ("import sys, mucudnn; import mucudnn.api, mucudnn.backends, mucudnn.optimizer; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "MUCUDNN_CACHE": "off"})
    assert r.returncode == 0, r.stderr or "importing mucudnn imported torch"


def test_errors_are_mucudnn_errors_naming_the_argument():
    x, w = torch.randn(2, 4, 6, 6), torch.randn(6, 2, 3, 3)
    cases = [
        (lambda: mt.conv2d(x, w, stride=2, padding="same", groups=2), ValueError, "padding"),
        (lambda: mt.conv2d(x, w, padding="full", groups=2), ValueError, "padding"),
        (lambda: mt.conv2d(x, w), ValueError, "weight"),                    # groups mismatch
        (lambda: mt.conv2d(x, torch.randn(6, 4, 3)), ValueError, "weight"),
        (lambda: mt.conv2d(x[0, 0], w, groups=2), ValueError, "input"),
        (lambda: mt.conv2d(x, w, torch.randn(5), groups=2), ValueError, "bias"),
        (lambda: mt.conv2d(x, w.double(), groups=2), TypeError, "weight"),
        (lambda: mt.conv2d(x.int(), w.int(), groups=2), TypeError, "input"),
        (lambda: mt.conv2d(x.numpy(), w, groups=2), TypeError, "input"),
        (lambda: mt.conv2d(x, w, stride=0, groups=2), ValueError, "stride"),
        (lambda: mt.conv2d(x, w, dilation=(1, 2, 3), groups=2), ValueError, "dilation"),
        (lambda: mt.conv2d(x, w, groups=0), ValueError, "groups"),
        (lambda: mt.conv2d(x, w, groups=2, workspace_limit=-1), ValueError, "workspace_limit"),
        (lambda: mt.conv2d(x, w, groups=2, workspace_limit=1.5), TypeError, "workspace_limit"),
        (lambda: mt.conv2d(x, w, groups=2, policy="half"), ValueError, "policy"),
        (lambda: mt.conv2d(x, w, groups=2, policy=[0]), ValueError, "policy"),
        (lambda: mt.conv2d(x, w, groups=2, backend="tpu"), ValueError, "backend"),
        (lambda: mt.conv2d(x, w, groups=2, backend="cudnn"), ValueError, "backend"),
        (lambda: mt.conv2d(x[:, :, :2, :2], w, groups=2, dilation=2), ValueError, "input"),
        (lambda: mt.convert(nn.Conv2d(1, 1, 1), mode="xx"), ValueError, "mode"),
        (lambda: mt.convert(nn.Conv2d(1, 1, 1), mode="wd"), ValueError, "total_workspace"),
        (lambda: mt.convert(nn.Conv2d(1, 1, 1), total_workspace=1 << 20), ValueError,
         "total_workspace"),
        (lambda: mt.convert("model"), TypeError, "module"),
        (lambda: mt.Conv2d(1, 1, 1, policy="bogus"), ValueError, "policy"),
    ]
    for fn, kind, name in cases:
        with pytest.raises(kind) as info:
            fn()
        assert isinstance(info.value, mucudnn.errors.MucudnnError), info.value
        assert name in str(info.value), (name, str(info.value))


# -- gradcheck in float64 --------------------------------------------------------------------------

GRADCHECK_2D = [
    dict(x=(3, 4, 6, 5), w=(6, 2, 3, 2), stride=1, padding=1, dilation=1, groups=2),
    dict(x=(2, 3, 7, 7), w=(2, 3, 3, 3), stride=2, padding=(0, 2), dilation=(2, 1), groups=1),
    dict(x=(4, 2, 5, 6), w=(4, 1, 2, 2), stride=1, padding="same", dilation=(1, 2), groups=2),
    dict(x=(2, 3, 5, 5), w=(3, 1, 3, 3), stride=1, padding="valid", dilation=2, groups=3),
]
GRADCHECK_3D = [
    dict(x=(2, 2, 4, 5, 4), w=(4, 1, 2, 3, 2), stride=(1, 2, 1), padding=1, dilation=1, groups=2),
    dict(x=(3, 2, 4, 4, 4), w=(2, 2, 2, 2, 2), stride=1, padding="same", dilation=(1, 2, 1),
         groups=1),
]


_CASES = GRADCHECK_2D + GRADCHECK_3D
_IDS = [f"{len(c['x']) - 2}d-{i}" for i, c in enumerate(_CASES)]


def _inputs_float64(case):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(case["x"], generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(case["w"], generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(case["w"][0], generator=g, dtype=torch.float64, requires_grad=True)
    return x, w, b


@pytest.mark.slow
@pytest.mark.parametrize("case", _CASES, ids=_IDS)
def test_gradcheck_float64(case):
    x, w, b = _inputs_float64(case)
    fn = mt.conv2d if x.dim() == 4 else mt.conv3d
    kw = dict(stride=case["stride"], padding=case["padding"], dilation=case["dilation"],
              groups=case["groups"], workspace_limit=SMALL_LIMIT)
    assert torch.autograd.gradcheck(lambda x, w, b: fn(x, w, b, **kw), (x, w, b),
                                    eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", [c for c in _CASES if not isinstance(c["padding"], str)],
                         ids=[i for i, c in zip(_IDS, _CASES) if not isinstance(c["padding"], str)])
@pytest.mark.slow
def test_gradcheck_float64_custom_op(case):
    """The op torch.compile calls (explicit padding: 'same'/'valid' are resolved above it)."""
    x, w, b = _inputs_float64(case)
    nd = x.dim() - 2

    def tup(v):
        return [v] * nd if isinstance(v, int) else list(v)

    s, p, d = tup(case["stride"]), tup(case["padding"]), tup(case["dilation"])

    def f(x, w, b):
        return torch.ops.mucudnn.conv(x, w, b, s, p, d, case["groups"], SMALL_LIMIT,
                                      "powerOfTwo", "", "")
    native = F.conv2d if nd == 2 else F.conv3d
    _close(f(x, w, b), native(x, w, b, s, p, d, case["groups"]), rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(f, (x, w, b), eps=1e-6, atol=1e-6)


class _MixedPlans:
    """A plan source forcing plans that mix micro-batch sizes and algorithms."""

    def plans_for(self, layer, problem, backend, key):
        mbs = [MicroBatch(0, 3, 1), MicroBatch(3, 2, 2), MicroBatch(5, 3, 0)]
        return {d: make_plan(mbs, undivided_time_ms=1.0, workspace_limit=None, direction=d)
                for d in Direction}


@pytest.mark.parametrize("channels_last", [False, True])
def test_micro_batched_plans_equal_native_float64(channels_last):
    """Forced plans of three micro-batches (three algorithms) give torch's results."""
    clear_all()
    source = _MixedPlans()
    token = engine.register_plan_source(source)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4, 10, 10, generator=g, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    w = torch.randn(6, 4, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    opts = functional.options(None, "powerOfTwo", None)
    y = functional._convnd(2, x, w, b, 1, 1, 1, 1, opts, plans=f"{token}:layer")
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    yr = F.conv2d(x, w, b, padding=1)
    refs = torch.autograd.grad(yr, (x, w, b), dy)
    _close(y, yr, rtol=1e-12, atol=1e-12)
    for a, r in zip(grads, refs):
        _close(a, r, rtol=1e-12, atol=1e-12)
    (conv,) = mt.cached_convolutions()
    assert conv.problem.layout == ("NHWC" if channels_last else "NCHW")
    assert {d: p.describe() for d, p in conv.plans.items()} == {d: "3 + 2 + 3" for d in Direction}


def test_only_needed_gradients_are_computed(monkeypatch):
    calls = []
    for name in ("backward_data", "backward_filter"):
        orig = getattr(mucudnn.Convolution, name)

        def spy(self, *a, _orig=orig, _name=name, **k):
            calls.append(_name)
            return _orig(self, *a, **k)
        monkeypatch.setattr(mucudnn.Convolution, name, spy)
    x = torch.randn(2, 3, 5, 5)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    mt.conv2d(x, w).sum().backward()
    assert calls == ["backward_filter"]
    calls.clear()
    x.requires_grad_(True)
    w.requires_grad_(False)
    b = torch.zeros(4, requires_grad=True)
    mt.conv2d(x, w, b).sum().backward()
    assert calls == ["backward_data"]
    _close(b.grad, torch.full((4,), 2.0 * 3 * 3))  # dy summed over batch and space


# -- Conv2d against nn.Conv2d, random configurations ------------------------------------------------

@st.composite
def conv_configs(draw, nd=2):
    groups = draw(st.integers(1, 3))
    cin = groups * draw(st.integers(1, 2))
    cout = groups * draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    mode = draw(st.sampled_from(["zeros", "zeros", "reflect", "replicate", "circular"]))
    pad_kind = draw(st.sampled_from(["int", "tuple", "same", "valid"]))
    if pad_kind == "same":
        stride: tuple | int = 1
        padding: object = "same"
    else:
        stride = draw(st.one_of(st.integers(1, 2), st.tuples(*[st.integers(1, 2)] * nd)))
        padding = {"int": draw(st.integers(0, 2)),
                   "tuple": tuple(draw(st.integers(0, 2)) for _ in range(nd)),
                   "valid": "valid"}[pad_kind]
    spatial = tuple(draw(st.integers(max(3, dilation[i] * (kernel[i] - 1) + 1), 7))
                    for i in range(nd))
    return dict(cin=cin, cout=cout, kernel=kernel, stride=stride, padding=padding,
                dilation=dilation, groups=groups, bias=draw(st.booleans()), padding_mode=mode,
                batch=draw(st.sampled_from([None, 1, 2, 3])), spatial=spatial,
                channels_last=draw(st.booleans()) if nd in (1, 2) else False,
                seed=draw(st.integers(0, 2 ** 16)))


def _check_against_native(cfg, nd):
    """The converted module and torch.nn's, each against a float64 run of torch.nn's
    (float32 sums in another order differ element by element where terms cancel,
    so the two float32 sides are not compared with each other): output, input
    and weight gradients (and the bias's) within 1e-5 of float64's, norm-wise,
    or within twice torch.nn's own error where that is more."""
    native_cls, mu_cls = {1: (nn.Conv1d, mt.Conv1d), 2: (nn.Conv2d, mt.Conv2d),
                          3: (nn.Conv3d, mt.Conv3d)}[nd]
    torch.manual_seed(cfg["seed"])
    kw = dict(stride=cfg["stride"], padding=cfg["padding"], dilation=cfg["dilation"],
              groups=cfg["groups"], bias=cfg["bias"], padding_mode=cfg["padding_mode"])
    ref = native_cls(cfg["cin"], cfg["cout"], cfg["kernel"], **kw)
    mine = mu_cls(cfg["cin"], cfg["cout"], cfg["kernel"], **kw, workspace_limit=SMALL_LIMIT)
    mine.load_state_dict(ref.state_dict())
    ref64 = copy.deepcopy(ref).double()
    shape = ((cfg["batch"],) if cfg["batch"] else ()) + (cfg["cin"],) + cfg["spatial"]
    x = torch.randn(shape)
    if cfg["channels_last"] and cfg["batch"]:  # 1-D: an (N, L, C) tensor's transpose
        x = x.contiguous(memory_format=torch.channels_last) if nd == 2 \
            else x.transpose(1, 2).contiguous().transpose(1, 2)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    x64 = x.double().requires_grad_(True)
    yr, ym, y64 = ref(xr), mine(xm), ref64(x64)
    assert ym.shape == yr.shape == y64.shape
    dy = torch.randn_like(yr)
    yr.backward(dy)
    ym.backward(dy)
    y64.backward(dy.double())
    pairs = [(ym, yr, y64), (xm.grad, xr.grad, x64.grad),
             (mine.weight.grad, ref.weight.grad, ref64.weight.grad)]
    if cfg["bias"]:
        pairs.append((mine.bias.grad, ref.bias.grad, ref64.bias.grad))
    for got, theirs, want in pairs:
        want = want.detach().numpy()
        bound = max(1e-5, 2 * rel_err(theirs.detach().numpy(), want))
        assert rel_err(got.detach().numpy(), want) <= bound


@pytest.mark.slow
@given(conv_configs())
def test_conv2d_module_matches_nn_conv2d(cfg):
    _check_against_native(cfg, 2)


@settings(max_examples=10)
@given(conv_configs(nd=3))
def test_conv3d_module_matches_nn_conv3d(cfg):
    _check_against_native(cfg, 3)


@settings(max_examples=30)
@given(conv_configs(nd=1))
def test_conv1d_module_matches_nn_conv1d(cfg):
    _check_against_native(cfg, 1)


@pytest.mark.parametrize("permuted", [False, True])
def test_conv1d_runs_as_pytorch_does_a_2d_convolution_of_height_1(permuted):
    """See Note [one-dimensional convolutions]. The problem planned is (N, C,
    1, L) by (K, C/g, 1, k), NCHW even for an input laid out (N, L, C) (PyTorch makes
    it contiguous first); forced plans of three micro-batches give float64's
    results and gradients, and the output is (N, K, L')."""
    clear_all()
    source = _MixedPlans()  # held: the engine keeps plan sources weakly
    token = engine.register_plan_source(source)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 6, 9, generator=g, dtype=torch.float64)
    if permuted:
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    w = torch.randn(4, 3, 3, generator=g, dtype=torch.float64)
    b = torch.randn(4, generator=g, dtype=torch.float64)
    xm, wm, bm = (t.clone().requires_grad_(True) for t in (x, w, b))
    xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
    opts = functional.options(None, "powerOfTwo", None)
    y = functional._convnd(1, xm, wm, bm, 2, 2, 2, 2, opts, plans=f"{token}:layer")
    ref = F.conv1d(xr, wr, br, stride=2, padding=2, dilation=2, groups=2)
    assert y.shape == ref.shape == (8, 4, 5)
    _close(y, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    y.backward(dy)
    ref.backward(dy)
    for got, want in ((xm.grad, xr.grad), (wm.grad, wr.grad), (bm.grad, br.grad)):
        _close(got, want, rtol=1e-12, atol=1e-12)
    (conv,) = mt.cached_convolutions()
    key = conv.problem.key()
    assert ":x=8x6x1x9:w=4x3x1x3:stride=1x2:pad=0x2:dil=1x2:g=2:" in key and ":NCHW:" in key
    assert {d: p.describe() for d, p in conv.plans.items()} == {d: "3 + 2 + 3" for d in Direction}


def test_conv1d_functional_unbatched_same_padding_and_errors():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 8, generator=g, dtype=torch.float64)
    w = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    _close(mt.conv1d(x, w, padding="same"), F.conv1d(x, w, padding="same"),
           rtol=1e-12, atol=1e-12)
    with pytest.raises(mt.TorchValueError, match=r"weight: expected a 3-D tensor"):
        mt.conv1d(x, w.unsqueeze(2))
    with pytest.raises(mt.TorchValueError, match=r"input: expected a 2-D \(unbatched\) or 3-D"):
        mt.conv1d(x.unsqueeze(0).unsqueeze(0), w)
    with pytest.raises(mt.TorchValueError, match=r"stride: .*1"):
        mt.conv1d(x, w, stride=(1, 1))


def test_functional_unbatched_and_empty_batch():
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    x = torch.randn(3, 6, 6)
    _close(mt.conv2d(x, w, b, padding=1), F.conv2d(x, w, b, padding=1))
    x0 = torch.randn(0, 3, 6, 6, requires_grad=True)
    w0 = w.clone().requires_grad_(True)
    y0 = mt.conv2d(x0, w0, b)
    assert y0.shape == F.conv2d(x0, w, b).shape == (0, 4, 4, 4)
    y0.sum().backward()
    assert x0.grad.shape == x0.shape and torch.count_nonzero(w0.grad) == 0


def test_same_padding_even_kernel_matches_torch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 7, 6, generator=g, dtype=torch.float64)
    w = torch.randn(3, 2, 4, 2, generator=g, dtype=torch.float64)
    for dil in (1, (2, 3)):
        _close(mt.conv2d(x, w, padding="same", dilation=dil),
               F.conv2d(x, w, padding="same", dilation=dil), rtol=1e-12, atol=1e-12)


# -- channels_last, dtypes, autocast -------------------------------------------------------------

def test_channels_last_runs_nhwc_without_copies_and_returns_channels_last():
    clear_all()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 4, 6, 6, generator=g).contiguous(memory_format=torch.channels_last)
    w = torch.randn(8, 4, 3, 3, generator=g)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    wr, wm = w.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ym = mt.conv2d(xm, wm, padding=1)
    yr = F.conv2d(xr, wr, padding=1)
    assert ym.is_contiguous(memory_format=torch.channels_last) and not ym.is_contiguous()
    _close(ym, yr)
    dy = torch.randn_like(yr)
    ym.backward(dy)
    yr.backward(dy)
    _close(xm.grad, xr.grad)
    _close(wm.grad, wr.grad)
    assert xm.grad.is_contiguous(memory_format=torch.channels_last)
    assert {c.problem.layout for c in mt.cached_convolutions()} == {"NHWC"}
    # the NHWC view of a channels_last tensor is the tensor's own memory
    v = layout.view(x, True)
    assert v.data_ptr() == x.data_ptr() and v.shape == (3, 6, 6, 4)


@settings(max_examples=300, deadline=None)
@given(shape=st.lists(st.integers(0, 3), min_size=4, max_size=5),
       order=st.permutations(range(5)), strides=st.lists(st.integers(0, 40), min_size=5,
                                                          max_size=5), data=st.data())
def test_layout_rule_is_pytorchs_suggested_memory_format(shape, order, strides, data):
    """See Note [the layout PyTorch suggests]: the rule, on any sizes and strides
    (packed in some dimension order, or arbitrary), against PyTorch's own port of
    c10's stride test (torch._prims_common, independent of ours)."""
    from torch._prims_common import suggest_memory_format
    nd = len(shape)
    perm = [d for d in order if d < nd]
    if data.draw(st.booleans(), label="packed"):
        t = torch.empty([shape[d] for d in perm]).permute([perm.index(d) for d in range(nd)])
    else:
        t = torch.empty_strided(shape, strides[:nd])
    want = suggest_memory_format(t) is not torch.contiguous_format
    assert layout.is_cl(t) == want
    # on the CPU float64 follows the strides too, as PyTorch's CPU convolutions do
    td = t.double()  # (its own strides where t's overlap)
    assert layout.channels_last(td, torch.empty([1] * nd, dtype=torch.float64)) == \
        (suggest_memory_format(td) is not torch.contiguous_format)


def test_ambiguous_weights_run_as_pytorch_suggests_and_outputs_follow():
    """A 1x1 and a depthwise weight moved to channels-last are plainly contiguous
    too; PyTorch's cuDNN convolution runs them NHWC after an NCHW input (Note [the
    layout PyTorch suggests]), and so does the converted layer: output format and
    values as the float64 convolution's, gradients too."""
    clear_all()
    g = torch.Generator().manual_seed(9)
    for w_shape, groups in (((6, 4, 1, 1), 1), ((4, 1, 3, 3), 4)):
        x = torch.randn(2, 4, 5, 5, generator=g, dtype=torch.float64)
        w = torch.randn(*w_shape, generator=g, dtype=torch.float64)
        wc = w.float().to(memory_format=torch.channels_last)
        assert wc.is_contiguous() and layout.channels_last(x.float(), wc)
        assert not layout.channels_last(x.float(), w.float())
        xm, wm = x.float().requires_grad_(True), wc.clone().requires_grad_(True)
        ym = mt.conv2d(xm, wm, padding=1, groups=groups)
        assert ym.is_contiguous(memory_format=torch.channels_last) and not ym.is_contiguous()
        xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        yr = F.conv2d(xr, wr, padding=1, groups=groups)
        _close(ym.double(), yr)
        dy = torch.randn(yr.shape, generator=g, dtype=torch.float64)
        ym.backward(dy.float())
        yr.backward(dy)
        _close(xm.grad.double(), xr.grad)
        _close(wm.grad.double(), wr.grad)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("bias", [False, True])
def test_in_place_op_on_the_output_is_allowed_as_after_a_native_conv(channels_last, bias):
    """See Note [outputs are not views]: VGG's and AlexNet's ReLU(inplace=True) right
    after a conv. The output is a base tensor (not a view made inside the
    autograd Function), so the in-place op is allowed and the gradients equal
    native ones; channels-last outputs stay channels-last."""
    torch.manual_seed(11)
    native = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, bias=bias), nn.ReLU(inplace=True),
                           nn.Conv2d(6, 4, 3, bias=bias), nn.ReLU(inplace=True))
    model = mt.convert(copy.deepcopy(native))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    native, model = native.to(memory_format=fmt), model.to(memory_format=fmt)
    x = torch.randn(5, 3, 9, 9).contiguous(memory_format=fmt)
    y = model(x)
    yr = native(x)
    assert y._base is None and y.is_contiguous(memory_format=fmt)
    _close(y, yr)
    y.square().sum().backward()
    yr.square().sum().backward()
    for p, q in zip(model.parameters(), native.parameters()):
        _close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_channels_last_3d():
    x = torch.randn(2, 3, 4, 5, 4).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(4, 3, 2, 2, 2)
    y = mt.conv3d(x, w, stride=(1, 2, 1))
    assert y.is_contiguous(memory_format=torch.channels_last_3d)
    _close(y, F.conv3d(x, w, stride=(1, 2, 1)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_cpu(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 6, 6, generator=g).to(dtype).requires_grad_(True)
    w = torch.randn(4, 3, 3, 3, generator=g).to(dtype).requires_grad_(True)
    y = mt.conv2d(x, w, padding=1)
    assert y.dtype == dtype
    y.float().sum().backward()
    x64, w64 = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    y64 = F.conv2d(x64, w64, padding=1)
    y64.sum().backward()
    tol = dict(rtol=2e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=5e-3, atol=1e-2)
    _close(y.double(), y64, **tol)
    _close(x.grad.double(), x64.grad, **tol)
    _close(w.grad.double(), w64.grad, **tol)
    assert x.grad.dtype == w.grad.dtype == dtype


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def test_autocast_casts_like_native_convolutions():
    torch.manual_seed(8)
    # no ReLU between the convs: a bf16 rounding may flip a ReLU mask, in torch's own convs too
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 2, 1))
    ref = copy.deepcopy(m)
    mt.convert(m)
    x = torch.randn(2, 3, 6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, yr = m(x), ref(x)
    assert y.dtype == yr.dtype == torch.bfloat16
    assert _rel(y, yr) < 2e-2
    (y.float() ** 2).sum().backward()
    (yr.float() ** 2).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert p.grad.dtype == torch.float32
        assert _rel(p.grad, q.grad) < 3e-2


# -- modules, convert, optimizer steps, state_dict ---------------------------------------------------

class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.block = nn.ModuleDict({
            "a": nn.Conv2d(8, 8, 3, padding="same", groups=2, padding_mode="reflect"),
            "b": nn.Conv2d(8, 16, 3, stride=2, dilation=1, padding=(1, 1)),
        })
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.stem(x)
        x = F.relu(self.block["a"](x)) + x
        x = F.relu(self.block["b"](x))
        return self.head(x.mean(dim=(2, 3)))


def _train(model, opt, data, steps):
    losses = []
    for i in range(steps):
        x, t = data[i]
        opt.zero_grad()
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def _data(n, batch=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 8, 8, generator=g), torch.randint(0, 5, (batch,), generator=g))
            for _ in range(n)]


def test_convert_tracks_native_training_with_the_same_parameters():
    torch.manual_seed(0)
    model = SmallCNN()
    ref = copy.deepcopy(model)
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   # made before convert
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    assert mt.convert(model, workspace_limit=SMALL_LIMIT) is model
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert type(model.stem[0]) is mt.Conv2d and type(model.block["b"]) is mt.Conv2d
    assert model.block["a"].padding_mode == "reflect"
    data = _data(4)
    losses = _train(model, opt, data, 4)
    ref_losses = _train(ref, ref_opt, data, 4)
    for a, b in zip(losses, ref_losses):
        _close(a, b)
    for (_n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        _close(p, q, rtol=1e-4, atol=1e-5)
        _close(p.grad, q.grad, rtol=1e-4, atol=1e-5)  # the last step's gradients
    for (_n, b), (_, c) in zip(model.named_buffers(), ref.named_buffers()):
        _close(b, c)
    # converting again applies the new options (Note [converting again])
    assert mt.convert(model) is model and model.stem[0].workspace_limit == mt.DEFAULT_WORKSPACE_LIMIT
    assert all(a is b for a, b in zip(model.parameters(), params))


def test_convert_conv3d_and_a_bare_conv_and_skips_subclasses():
    class MyConv(nn.Conv2d):
        pass

    m = nn.Sequential(nn.Conv3d(2, 3, 3), MyConv(1, 1, 1))
    with pytest.warns(mt.ConvertWarning, match="left native"):
        mt.convert(m)
    assert type(m[0]) is mt.Conv3d and type(m[1]) is MyConv
    bare = nn.Conv2d(2, 2, 1)
    assert type(mt.convert(bare)) is mt.Conv2d


def test_state_dict_round_trip():
    torch.manual_seed(1)
    native = SmallCNN()
    converted = mt.convert(SmallCNN())
    converted.load_state_dict(native.state_dict())
    assert list(converted.state_dict()) == list(native.state_dict())
    x = torch.randn(2, 3, 8, 8)
    native.eval()
    converted.eval()
    _close(converted(x), native(x))
    back = SmallCNN()
    back.load_state_dict(converted.state_dict())
    back.eval()
    _close(back(x), native(x))
    built = mt.Conv2d(3, 4, 3, bias=True, workspace_limit=None)
    assert list(built.state_dict()) == list(nn.Conv2d(3, 4, 3).state_dict())
    assert "workspace_limit=None" in repr(built)


# -- WD mode ------------------------------------------------------------------------------------------

def test_wd_mode_plans_jointly_at_first_forward():
    clear_all()
    torch.manual_seed(2)
    total = 24 << 10
    model = SmallCNN()
    ref = copy.deepcopy(model)
    mt.convert(model, mode="wd", total_workspace=total)
    planner = model.mucudnn_planner
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    data = _data(3)
    losses = _train(model, opt, data, 3)
    ref_losses = _train(ref, ref_opt, data, 3)
    for a, b in zip(losses, ref_losses):
        _close(a, b)
    # three convolutions, each with three directions, planned jointly under the budget
    assert len(planner.plans) == 3 and planner.pending == 0
    chosen = [p for plans in planner.plans.values() for p in plans.values()]
    assert len(chosen) == 9
    assert sum(p.workspace_bytes for p in chosen) <= total
    # the Convolutions in use run exactly those plans
    def mbs(plan):
        return tuple((m.offset, m.size, int(m.algo)) for m in plan.micro_batches)

    used = {(c.problem.key(), d): mbs(p) for c in mt.cached_convolutions()
            for d, p in c.plans.items()}
    checked = 0
    for (_layer, key), plans in planner.plans.items():
        for d, plan in plans.items():
            if (key, d) in used:
                assert used[(key, d)] == mbs(plan)
                checked += 1
    assert checked == 8  # every kernel run; the stem's input needs no gradient
    # a new batch size is planned jointly once more
    x = torch.randn(3, 3, 8, 8)
    model(x).sum().backward()
    assert len(planner.plans) == 6 and planner.pending == 0


def test_wd_mode_without_grad_plans_forward_only():
    model = mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3)), mode="wd",
                       total_workspace=8 << 10)
    with torch.no_grad():
        model(torch.randn(2, 3, 7, 7))
    plans = list(model.mucudnn_planner.plans.values())
    assert len(plans) == 2 and all(set(p) == {Direction.FORWARD} for p in plans)


def test_wd_model_copies_pickles_and_replans_after_a_failure(monkeypatch):
    import importlib
    import io

    convert_mod = importlib.import_module("mucudnn.torch.convert")  # the module, not the function

    model = mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1)),
                       mode="wd", total_workspace=8 << 10)
    x = torch.randn(2, 3, 6, 6)
    calls = []
    real = convert_mod.optimize_network

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise mucudnn.errors.UnsupportedConfigError("boom")
        return real(*a, **k)
    monkeypatch.setattr(convert_mod, "optimize_network", flaky)
    with pytest.raises(ValueError, match="boom"):
        model(x)
    assert model.mucudnn_planner.pending == 2      # kept for the next forward
    y = model(x)
    assert model.mucudnn_planner.pending == 0 and len(model.mucudnn_planner.plans) == 2
    twin = copy.deepcopy(model)
    assert twin.mucudnn_planner is model.mucudnn_planner
    _close(twin(x), y)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert back.mucudnn_planner is model.mucudnn_planner  # same process: the live planner
    _close(back(x), y)
    # in a process that has never seen the planner, a fresh one under the same token
    fresh = convert_mod._restore_planner(8 << 10, "powerOfTwo", "", "src-not-seen-before")
    assert fresh.token == "src-not-seen-before" and fresh.plans == {}


# -- determinism (Note [deterministic plans]) --------------------------------------------------------

@contextlib.contextmanager
def _determinism(cudnn, algorithms):
    """torch's two determinism switches set for the block, restored after it."""
    old = (torch.backends.cudnn.deterministic, torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    torch.backends.cudnn.deterministic = cudnn
    torch.use_deterministic_algorithms(algorithms)
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic = old[0]
        torch.use_deterministic_algorithms(old[1], warn_only=old[2])


def _algos(conv):
    return {d: {int(m.algo) for m in p.micro_batches} for d, p in conv.plans.items()}


def test_determinism_flags_choose_the_plans_at_every_call():
    """AtomicNumpyBackend reports every algorithm but DIRECT (0) non-deterministic
    and 1000x faster: calls plan with them, but not under torch's determinism
    switches, which are read at each call (so a change acts at the next one)."""
    clear_all()
    be = AtomicNumpyBackend()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(4, 5, 8, 8, generator=g, dtype=torch.float64)
    ref = torch.autograd.grad(F.conv2d(x, w, padding=1), (x, w), dy)

    def run():
        y = mt.conv2d(x, w, padding=1, backend=be, workspace_limit=None)
        grads = torch.autograd.grad(y, (x, w), dy)
        for a, r in zip(grads, ref):
            _close(a, r, rtol=1e-12, atol=1e-12)
        return mt.cached_convolutions()

    with _determinism(False, False):
        assert not engine.deterministic()
        (free,) = run()
    assert not free.deterministic
    assert all(a and a <= {1, 2} for a in _algos(free).values()) and len(free.plans) == 3
    with _determinism(True, False):
        assert engine.deterministic()
        convs = run()
    assert len(convs) == 2 and convs[0] is free
    det = convs[1]
    assert det.deterministic and det.planner.deterministic
    assert _algos(det) == {d: {0} for d in Direction}
    with _determinism(False, True):  # torch.use_deterministic_algorithms: the same mode
        assert engine.deterministic()
        assert run() == [free, det]
    with _determinism(False, False):  # switched off again: the first Convolution
        assert run() == [det, free]


@settings(max_examples=8, deadline=None)
@given(st.booleans(), st.booleans())
def test_the_convolution_cache_key_follows_the_determinism_flags(cudnn, algorithms):
    x, w = torch.ones(2, 3, 5, 5), torch.ones(4, 3, 3, 3)
    with _determinism(cudnn, algorithms):
        assert engine.deterministic() == (cudnn or algorithms)
        conv = engine.convolution(x, w, "NCHW", engine.ConvConfig((1, 1), (0, 0), (1, 1), 1,
                                                                   -1, "undivided", "", ""))
        key = next(k for k in engine._CONVS.keys() if engine._CONVS.get(k) is conv)
        assert engine.key_deterministic(key) == conv.deterministic == (cudnn or algorithms)


def test_wd_mode_plans_deterministically_under_the_flags():
    clear_all()
    be = AtomicNumpyBackend()
    model = mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1)),
                       mode="wd", total_workspace=1 << 30, backend=be)
    planner = model.mucudnn_planner
    x = torch.randn(3, 3, 6, 6)
    with _determinism(True, False):
        model(x).sum().backward()
        det = planner.plans
        assert len(det) == 2
        assert all(p.micro_batches and {int(m.algo) for m in p.micro_batches} == {0}
                   for plans in det.values() for p in plans.values())
    with _determinism(False, False):
        assert planner.plans == {}        # nothing planned in this mode yet
        model(x).sum().backward()         # the next forward plans jointly again
        free = planner.plans
        assert set(free) == set(det) and planner.pending == 0
        assert all({int(m.algo) for m in p.micro_batches} <= {1, 2}
                   for plans in free.values() for p in plans.values())
    with _determinism(True, False):
        assert planner.plans == det       # kept apart, both still there


# -- caches -----------------------------------------------------------------------------------------

def test_convolution_cache_is_bounded_keyed_and_cleared():
    clear_all()
    w = torch.randn(2, 3, 3, 3)
    for n in (1, 2, 3):
        mt.conv2d(torch.randn(n, 3, 5, 5), w)
    mt.conv2d(torch.randn(3, 3, 5, 5), w)
    convs = mt.cached_convolutions()
    assert [c.problem.batch for c in convs] == [1, 2, 3]
    mt.conv2d(torch.randn(3, 3, 5, 5), w, workspace_limit=1 << 10)
    assert len(mt.cached_convolutions()) == 4
    assert engine._CONVS.maxsize == mt.MAX_CONVOLUTIONS
    assert "torch.convolutions" in {c.name for c in mucudnn.caches.live_caches()}
    mucudnn.caches.clear_all()
    assert mt.cached_convolutions() == []
    assert mt.workspace_bytes("cpu") >= 0


def test_explicit_policy_and_backend_instance():
    clear_all()
    x, w = torch.randn(5, 3, 6, 6, dtype=torch.float64), torch.randn(4, 3, 3, 3, dtype=torch.float64)
    be = mucudnn.get_backend("numpy")
    y = mt.conv2d(x, w, padding=1, policy=[2, 1, 2], backend=be, workspace_limit=None)
    _close(y, F.conv2d(x, w, padding=1), rtol=1e-12, atol=1e-12)
    (conv,) = mt.cached_convolutions()
    assert conv.backend is be and conv.workspace_limit is None
    assert tuple(conv.policy) == (2, 1)
    assert mt.conv2d(x, w, padding=1, policy=(1, 2), backend=be) is not None
    assert len(mt.cached_convolutions()) == 2  # a 64 MiB limit is another configuration


# -- torch.compile and the custom ops ------------------------------------------------------------------

def _compile_matches_eager(backend, steps=2, model=None):
    torch._dynamo.reset()
    torch.manual_seed(3)
    model = mt.convert(model if model is not None else SmallCNN())
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=False)
    for x, t in _data(steps, seed=7):
        loss = F.cross_entropy(compiled(x), t)
        loss.backward()
        ref_loss = F.cross_entropy(ref(x), t)
        ref_loss.backward()
        _close(loss, ref_loss)
        for p, q in zip(model.parameters(), ref.parameters()):
            _close(p.grad, q.grad)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_matches_eager(backend):
    _compile_matches_eager(backend)


def test_torch_compile_of_a_wd_model_plans_at_its_first_forward():
    torch._dynamo.reset()
    torch.manual_seed(9)
    model = SmallCNN()
    ref = copy.deepcopy(model)  # native
    mt.convert(model, mode="wd", total_workspace=16 << 10)
    compiled = torch.compile(model, backend="aot_eager")
    for x, t in _data(2, seed=11):
        loss = F.cross_entropy(compiled(x), t)
        loss.backward()
        ref_loss = F.cross_entropy(ref(x), t)
        ref_loss.backward()
        _close(loss, ref_loss)
    assert len(model.mucudnn_planner.plans) == 3 and model.mucudnn_planner.pending == 0


def test_torch_compile_keeps_the_conv_in_one_graph():
    torch._dynamo.reset()
    m = mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3, padding="same"), nn.ReLU(),
                                 nn.Conv2d(4, 4, 3, groups=2)))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(m, backend=backend, fullgraph=True)
    x = torch.randn(2, 3, 6, 6)
    _close(compiled(x), m(x))
    assert len(graphs) == 1
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum(t is torch.ops.mucudnn.conv.default for t in targets) == 2


def test_torch_compile_of_a_1d_model_is_one_graph_of_mucudnns_op_with_torchs_gradients():
    """See Note [one-dimensional convolutions]: the height-1 views trace with
    the op, and the compiled step's output and gradients are torch's."""
    torch.manual_seed(12)
    ref = nn.Sequential(nn.Conv1d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv1d(4, 2, 1)).double()
    targets = compiled_like_eager(ref, mt.convert(copy.deepcopy(ref)),
                                  torch.randn(2, 3, 10, dtype=torch.float64))
    assert sum(t is torch.ops.mucudnn.conv.default for t in targets) == 2


def test_torch_compile_of_a_settled_layer_keeps_mucudnns_op_in_one_graph():
    """See Note [host cost of a converted layer]: a settled layer's check does
    not run under torch.compile (the verdict is this process's, not a graph's),
    so the compiled graph holds mucudnn's op, whole, as for any other layer."""
    from mucudnn.torch import engine as mt_engine
    from mucudnn.torch import modules as mt_modules
    torch._dynamo.reset()
    m = mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1)))
    x = torch.randn(2, 3, 6, 6)
    sig = mt_modules._signature(x, m[0].weight)
    m[0]._mu_torch = (mt_engine.GENERATION[0], frozenset({sig}), frozenset({sig}))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(m, backend=backend, fullgraph=True)
    _close(compiled(x), F.conv2d(x, m[0].weight, m[0].bias, padding=1))
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert len(graphs) == 1 and torch.ops.mucudnn.conv.default in targets


@pytest.mark.slow
def test_torch_compile_default_backend():
    pytest.importorskip("torch._inductor")
    tiny = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 5))
    _compile_matches_eager("inductor", steps=1, model=tiny)


@pytest.mark.slow
@pytest.mark.parametrize("channels_last", [False, True])
def test_opcheck_custom_ops(channels_last):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 4, 6, 5, generator=g, requires_grad=True)
    w = torch.randn(4, 2, 3, 3, generator=g, requires_grad=True)
    b = torch.randn(4, generator=g, requires_grad=True)
    if channels_last:
        x = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_(True)
    args = ([1, 2], [1, 0], [1, 1], 2, SMALL_LIMIT, "powerOfTwo", "", "")
    torch.library.opcheck(torch.ops.mucudnn.conv.default, (x, w, b) + args)
    torch.library.opcheck(torch.ops.mucudnn.conv.default, (x, w, None) + args)
    dy = torch.randn(F.conv2d(x, w, b, (1, 2), (1, 0), 1, 2).shape, generator=g)
    for mask in ([True, True, True], [False, True, False], [True, False, False]):
        torch.library.opcheck(torch.ops.mucudnn.conv_backward.default,
                              (dy, x.detach(), w.detach()) + args + (mask,))
    dx, dw, db = ops.conv_backward(dy, x.detach(), w.detach(), *args, [True, True, True])
    xr, wr, br = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    torch.autograd.backward(F.conv2d(xr, wr, br, (1, 2), (1, 0), 1, 2), dy)
    _close(dx, xr.grad)
    _close(dw, wr.grad)
    _close(db, br.grad)


def test_ci_installs_what_readme_says_with_the_torch_extra():
    root = os.path.join(os.path.dirname(__file__), "..")
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(root, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    section = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    installs = [block.split("```", 1)[0].strip() for block in section.split("```bash")[1:]]
    install = 'python -m pip install -e ".[test,cudnn,plot,torch]"'
    assert install in installs
    lines = ci.splitlines()
    assert install in lines
    # PyTorch's CPU build goes in first, as README says, so the extra adds no CUDA build.
    cpu_torch = 'python -m pip install "torch==2.13.0+cpu" "nvidia-cudnn-cu13==9.24.0.43"'
    assert cpu_torch in lines and lines.index(cpu_torch) < lines.index(install)
    assert "torch==2.13.0+cpu" in section and "nvidia-cudnn-cu13==9.24.0.43" in section


@pytest.mark.parametrize("name", ["", ".engine", ".recording", ".ops", ".functional", ".modules", ".convert",
                                  ".autodiff"])
def test_docstring_examples(name):
    import doctest
    import importlib

    mod = importlib.import_module("mucudnn.torch" + name)
    assert doctest.testmod(mod).failed == 0


def test_create_graph_gradients_are_differentiable_and_plain_backward_stays_first_order():
    """See Note [eager backward cost]: under create_graph=True the gradients are
    differentiable (Note [three bilinear directions]); an ordinary backward
    (grad mode off inside it) gives native's first-order gradients."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (gx,) = torch.autograd.grad(mt.conv2d(x, w, padding=1).square().sum(), x, create_graph=True)
    (rx,) = torch.autograd.grad(F.conv2d(xr, wr, padding=1).square().sum(), xr,
                                create_graph=True)
    torch.testing.assert_close(gx.detach(), rx.detach())
    gx.sum().backward()
    rx.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)
    x.grad = w.grad = xr.grad = wr.grad = None
    mt.conv2d(x, w, padding=1).square().sum().backward()
    F.conv2d(xr, wr, padding=1).square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)


def test_a_settled_signature_lapses_when_anything_that_decides_it_changes(monkeypatch):
    """See Note [host cost of a converted layer]: a module settled for a call's
    signature runs torch.nn's own code for that signature only; another shape,
    memory format, dtype, gradient need, CUDA autocast state, TF32 or
    determinism flag goes through mucudnn's path (its own verdict)."""
    from mucudnn.torch import engine as mt_engine
    from mucudnn.torch import modules as mt_modules
    conv = mucudnn.torch.convert(nn.Sequential(nn.Conv2d(2, 3, 3)))[0]
    ours = []
    real = conv._mu_forward

    def mu_forward(x, w, b):
        ours.append(True)
        return real(x, w, b)
    monkeypatch.setattr(conv, "_mu_forward", mu_forward)
    x = torch.randn(2, 2, 5, 5)
    sig = mt_modules._signature(x, conv.weight)
    conv._mu_torch = (mt_engine.GENERATION[0], frozenset({sig}), frozenset({sig}))

    def runs_mucudnn(call) -> bool:
        ours.clear()
        with torch.no_grad():
            call()
        conv._mu_torch = (mt_engine.GENERATION[0], frozenset({sig}), frozenset({sig}))
        return bool(ours)

    assert not runs_mucudnn(lambda: conv(x))
    assert runs_mucudnn(lambda: conv(torch.randn(3, 2, 5, 5)))
    assert runs_mucudnn(lambda: conv(x.contiguous(memory_format=torch.channels_last)))
    assert runs_mucudnn(lambda: conv.double()(x.double()))
    conv.float()
    sig = mt_modules._signature(x, conv.weight)
    conv._mu_torch = (mt_engine.GENERATION[0], frozenset({sig}), frozenset({sig}))
    assert not runs_mucudnn(lambda: conv(x))
    assert mt_modules._signature(x.requires_grad_(), conv.weight) != sig
    x.requires_grad_(False)
    prev = torch.is_autocast_enabled("cuda")
    torch.set_autocast_enabled("cuda", True)
    try:
        assert runs_mucudnn(lambda: conv(x))
    finally:
        torch.set_autocast_enabled("cuda", prev)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=not torch.backends.cudnn.allow_tf32):
        assert runs_mucudnn(lambda: conv(x))
    with torch.backends.cudnn.flags(enabled=True, deterministic=True):
        assert runs_mucudnn(lambda: conv(x))
    assert not runs_mucudnn(lambda: conv(x))
