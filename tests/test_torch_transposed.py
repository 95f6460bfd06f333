"""Transposed convolutions in mucudnn.torch on the CPU (NumPy backend):
``conv_transpose1d/2d/3d`` and ``ConvTranspose1d/2d/3d`` against torch's
float64 ones, forced micro-batch plans, convert, torch.compile, torch.func and
argument errors (Note [transposed convolutions] in mucudnn/torch/transposed.py)."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch (pip install torch)")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils.parametrizations import weight_norm  # noqa: E402

import mucudnn.torch as mt  # noqa: E402
from mucudnn import Direction  # noqa: E402
from mucudnn.caches import clear_all  # noqa: E402
from mucudnn.problem import MicroBatch, make_plan  # noqa: E402
from mucudnn.torch import engine, functional, native, recording, transposed  # noqa: E402

from reference import rel_err  # noqa: E402
from torch_support import compiled_like_eager  # noqa: E402

pytestmark = pytest.mark.usefixtures("cache_off")

#: small enough that the NumPy backend's algorithms need several micro-batches
SMALL_LIMIT = 6 << 10
_NATIVE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_OURS = {1: mt.conv_transpose1d, 2: mt.conv_transpose2d, 3: mt.conv_transpose3d}


@st.composite
def transposed_configs(draw, nd=2):
    groups = draw(st.sampled_from([1, 2, 3]))
    cin = groups * draw(st.integers(1, 3))
    cout = groups * draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    padding = tuple(draw(st.integers(0, (dilation[i] * (kernel[i] - 1)) // 2 + 1))
                    for i in range(nd))
    out_pad = tuple(draw(st.integers(0, stride[i] - 1)) for i in range(nd))
    spatial = tuple(draw(st.integers(1, 6 if nd < 3 else 3)) for _ in range(nd))
    # the output must not be empty
    for i in range(nd):
        size = (spatial[i] - 1) * stride[i] - 2 * padding[i] \
            + dilation[i] * (kernel[i] - 1) + out_pad[i] + 1
        if size < 1:
            padding = tuple(0 if j == i else p for j, p in enumerate(padding))
    return dict(cin=cin, cout=cout, kernel=kernel, stride=stride, padding=padding,
                output_padding=out_pad, dilation=dilation, groups=groups,
                bias=draw(st.booleans()), batch=draw(st.sampled_from([None, 1, 2, 3])),
                spatial=spatial, channels_last=nd == 2 and draw(st.booleans()),
                policy=draw(st.sampled_from(["powerOfTwo", "all", [1], [2, 1]])),
                seed=draw(st.integers(0, 2 ** 16)))


def _check_against_float64(cfg, nd):
    """mucudnn's functional and module forms against torch's float64 run:
    output and gradients of input, weight and bias within 1e-5 norm-wise, or
    twice torch's own float32 error where that is more."""
    torch.manual_seed(cfg["seed"])
    kw = dict(stride=cfg["stride"], padding=cfg["padding"],
              output_padding=cfg["output_padding"], groups=cfg["groups"],
              dilation=cfg["dilation"])
    ref = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}[nd](
        cfg["cin"], cfg["cout"], cfg["kernel"], bias=cfg["bias"], **kw)
    mine = {1: mt.ConvTranspose1d, 2: mt.ConvTranspose2d, 3: mt.ConvTranspose3d}[nd](
        cfg["cin"], cfg["cout"], cfg["kernel"], bias=cfg["bias"], **kw,
        workspace_limit=SMALL_LIMIT, policy=cfg["policy"])
    mine.load_state_dict(ref.state_dict())
    ref64 = copy.deepcopy(ref).double()
    shape = ((cfg["batch"],) if cfg["batch"] else ()) + (cfg["cin"],) + cfg["spatial"]
    x = torch.randn(shape)
    if cfg["channels_last"] and cfg["batch"]:
        x = x.contiguous(memory_format=torch.channels_last)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    x64 = x.double().requires_grad_(True)
    yr, ym, y64 = ref(xr), mine(xm), ref64(x64)
    assert ym.shape == yr.shape == y64.shape
    dy = torch.randn_like(yr)
    for y, d in ((yr, dy), (ym, dy), (y64, dy.double())):
        y.backward(d)
    pairs = [(ym, yr, y64), (xm.grad, xr.grad, x64.grad),
             (mine.weight.grad, ref.weight.grad, ref64.weight.grad)]
    if cfg["bias"]:
        pairs.append((mine.bias.grad, ref.bias.grad, ref64.bias.grad))
    for got, theirs, want in pairs:
        want = want.detach().numpy()
        assert rel_err(got.detach().numpy(), want) <= max(1e-5, 2 * rel_err(
            theirs.detach().numpy(), want))
    # the functional form, in float64, is torch's to rounding
    w = ref64.weight.detach()
    b = None if ref64.bias is None else ref64.bias.detach()
    got = _OURS[nd](x.double(), w, b, **kw, workspace_limit=SMALL_LIMIT, policy=cfg["policy"])
    torch.testing.assert_close(got, _NATIVE[nd](x.double(), w, b, **kw), rtol=1e-10,
                               atol=1e-10)


@settings(max_examples=40)
@given(transposed_configs(nd=2))
def test_conv_transpose2d_matches_torch_float64(cfg):
    _check_against_float64(cfg, 2)


@settings(max_examples=20)
@given(transposed_configs(nd=1))
def test_conv_transpose1d_matches_torch_float64(cfg):
    _check_against_float64(cfg, 1)


@settings(max_examples=8)
@given(transposed_configs(nd=3))
def test_conv_transpose3d_matches_torch_float64(cfg):
    _check_against_float64(cfg, 3)


class _MixedPlans:
    """A plan source forcing plans that mix micro-batch sizes and algorithms."""

    def plans_for(self, layer, problem, backend, key):
        mbs = [MicroBatch(0, 3, 1), MicroBatch(3, 2, 2), MicroBatch(5, 3, 0)]
        return {d: make_plan(mbs, undivided_time_ms=1.0, workspace_limit=None, direction=d)
                for d in Direction}


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_transposed_convolution_runs_its_problems_backward_data(channels_last):
    """See Note [transposed convolutions]. The problem planned is the
    convolution whose input has the layer's output shape and whose weight is
    the layer's; forced plans of three micro-batches in each direction give
    float64's output and gradients."""
    clear_all()
    source = _MixedPlans()  # held: the engine keeps plan sources weakly
    token = engine.register_plan_source(source)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, 6, 5, 4, generator=g, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(6, 2, 3, 3, generator=g, dtype=torch.float64)
    b = torch.randn(4, generator=g, dtype=torch.float64)
    xm, wm, bm = (t.clone().requires_grad_(True) for t in (x, w, b))
    xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
    opts = functional.options(None, "powerOfTwo", None)
    y = functional._conv_transposend(2, xm, wm, bm, 2, 1, (1, 0), 2, 1, opts,
                                     plans=f"{token}:layer")
    ref = F.conv_transpose2d(xr, wr, br, stride=2, padding=1, output_padding=(1, 0), groups=2)
    assert y.shape == ref.shape == (8, 4, 10, 7)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    y.backward(dy)
    ref.backward(dy)
    for got, want in ((xm.grad, xr.grad), (wm.grad, wr.grad), (bm.grad, br.grad)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (conv,) = mt.cached_convolutions()
    shapes = "x=8x10x7x4:w=6x3x3x2" if channels_last else "x=8x4x10x7:w=6x2x3x3"
    assert conv.problem.key().startswith(f"conv2d:{shapes}:stride=2x2:pad=1x1:dil=1x1:g=2:")
    assert conv.problem.layout == ("NHWC" if channels_last else "NCHW")
    assert {d: p.describe() for d, p in conv.plans.items()} == {d: "3 + 2 + 3" for d in Direction}


def test_modules_convert_output_size_and_state():
    """convert() swaps nn.ConvTranspose1d/2d/3d (lazy and parametrized ones too)
    for mucudnn's, keeping parameters and state_dict keys; output_size picks
    the output padding as torch's forward does."""
    torch.manual_seed(3)
    ref = nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1), nn.ReLU(),
                        weight_norm(nn.ConvTranspose2d(6, 2, 2, stride=2)),
                        nn.LazyConvTranspose2d(3, 1)).double()
    ref(torch.randn(1, 4, 5, 5, dtype=torch.float64))  # materialise the lazy one
    m = copy.deepcopy(ref)
    lazy = nn.Sequential(nn.LazyConvTranspose1d(3, 2, stride=2)).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left native
        mt.convert(m)
        mt.convert(lazy)
    assert type(m[0]) is mt.ConvTranspose2d and isinstance(m[2], mt.ConvTranspose2d)
    assert type(m[3]) is mt.ConvTranspose2d
    assert list(m.state_dict()) == list(ref.state_dict())
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(m(x), ref(x), rtol=1e-12, atol=1e-12)
    # torch's own forward materialises it (and runs that first call: Note [lazy
    # transposed convolutions] in mucudnn/torch/convert.py); mucudnn's runs the next
    x1 = torch.randn(2, 5, 4, dtype=torch.float64)
    lazy(x1)
    assert type(lazy[0]) is mt.ConvTranspose1d
    native1 = nn.ConvTranspose1d(5, 3, 2, stride=2).double()
    native1.load_state_dict(lazy[0].state_dict())
    clear_all()
    torch.testing.assert_close(lazy(x1), native1(x1), rtol=1e-12, atol=1e-12)
    assert [c.problem.w_shape for c in mt.cached_convolutions()] == [(5, 3, 1, 2)]
    up = mt.ConvTranspose2d(2, 2, 3, stride=2, padding=1).double()
    native_up = nn.ConvTranspose2d(2, 2, 3, stride=2, padding=1).double()
    native_up.load_state_dict(up.state_dict())
    xs = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    for size in ([7, 7], [8, 8], [7, 8]):
        torch.testing.assert_close(up(xs, output_size=size), native_up(xs, output_size=size),
                                   rtol=1e-12, atol=1e-12)
    assert "workspace_limit=" in repr(up)


def test_argument_errors_name_the_argument():
    x = torch.randn(1, 4, 5, 5)
    w = torch.randn(4, 2, 3, 3)
    cases = [
        (dict(output_padding=2, stride=2), r"output_padding: .*smaller than the stride"),
        (dict(padding="same"), r"padding: .*'same'"),
        (dict(groups=3), r"in_channels \(4\) must be divisible by groups \(3\)"),
        (dict(bias=torch.randn(3)), r"bias: expected shape \(2,\)"),
        (dict(padding=4), r"input: the output size .* is too small"),
        (dict(stride=10 ** 9), r"stride, dilation: the output of shape .* would take"),
        (dict(dilation=2 ** 70), r"stride, dilation: the output of shape .* would take"),
    ]
    for kw, match in cases:
        with pytest.raises(mt.TorchValueError, match=match):
            mt.conv_transpose2d(x, w, **kw)
    with pytest.raises(mt.TorchValueError, match=r"weight: expected 4 input channels first"):
        mt.conv_transpose2d(x, torch.randn(3, 2, 3, 3))
    with pytest.raises(mt.TorchValueError, match=r"weight: expected a 4-D tensor \(in_channels"):
        mt.conv_transpose2d(x, torch.randn(4, 2, 3))
    with pytest.raises(mt.TorchTypeError, match=r"weight: expected the input's dtype"):
        mt.conv_transpose2d(x, w.double())
    with pytest.raises(ValueError, match=r"zeros"):  # torch's constructor says so
        mt.ConvTranspose2d(4, 2, 3, padding_mode="reflect")(x)


def test_an_output_padding_below_the_dilation_only_runs_pytorchs_call_and_warns():
    """See Note [transposed convolutions]: an output padding not below the
    stride has no convolution to run backward."""
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64)
    kw = dict(stride=1, dilation=2, output_padding=1)
    with pytest.warns(RuntimeWarning, match="PyTorch's own transposed convolution runs"):
        y = mt.conv_transpose2d(x, w, **kw)
    torch.testing.assert_close(y, F.conv_transpose2d(x, w, **kw), rtol=1e-12, atol=1e-12)


def test_torch_compile_keeps_the_transposed_op_in_one_graph_with_torchs_gradients():
    torch.manual_seed(12)
    ref = nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
                        nn.ReLU(), nn.ConvTranspose2d(4, 2, 2, stride=2)).double()
    targets = compiled_like_eager(ref, mt.convert(copy.deepcopy(ref)),
                                  torch.randn(2, 3, 5, 5, dtype=torch.float64))
    assert sum(t is torch.ops.mucudnn.conv_transpose.default for t in targets) == 2


def test_the_custom_op_passes_opcheck():
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.mucudnn.conv_transpose.default,
                          (x, w, b, [2, 2], [0, 0], [1, 1], 2, [6, 6], -1, "powerOfTwo", "", ""))


def test_func_transforms_and_double_backward_match_torch():
    """forward-mode AD, vmap and create_graph gradients run through the three
    bilinear directions (Note [three bilinear directions])."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, generator=g, dtype=torch.float64)
    t = torch.randn_like(x)

    def ours(a, b):
        return mt.conv_transpose2d(a, b, stride=2, padding=1)

    def theirs(a, b):
        return F.conv_transpose2d(a, b, stride=2, padding=1)

    got = torch.func.jvp(lambda a: ours(a, w), (x,), (t,))
    want = torch.func.jvp(lambda a: theirs(a, w), (x,), (t,))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    xs = torch.randn(3, 2, 3, 4, 4, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(lambda a: ours(a, w))(xs),
                               torch.func.vmap(lambda a: theirs(a, w))(xs),
                               rtol=1e-12, atol=1e-12)
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    assert torch.autograd.gradgradcheck(ours, (xg, wg))


def test_recording_records_the_problem_and_in_step_follows_the_layer():
    x = torch.randn(2, 4, 3, 3)
    w = torch.randn(4, 3, 2, 2)
    cfg = engine.ConvConfig((2, 2), (0, 0), (1, 1), 1, 1 << 20, "powerOfTwo", "", "")
    with recording.recording() as rec:
        y = transposed.apply(x, w, None, cfg, (6, 6))
    assert y.shape == (2, 3, 6, 6)
    (conv,) = rec.convs
    assert conv.problem.x_shape == (2, 3, 6, 6) and conv.problem.w_shape == (4, 3, 2, 2)
    # a transposed layer whose input needs no gradient skips its problem's forward
    skip = native.skipped(False, transposed=True)
    first = native.torch_first(8 << 20, skip, lambda d: (0.5, 16 << 20))
    assert first[Direction.FORWARD].torch_ms is None
    assert native.to_plan(first, skip) == [Direction.BACKWARD_DATA, Direction.BACKWARD_FILTER]


def test_pytorchs_own_call_and_the_host_timing_run_the_transposed_layer(monkeypatch):
    """The parts of a GPU first call that need no GPU: PyTorch's own transposed
    call (``native_transposed``, with the output padding the shapes give), and
    the host timing's two sides (Note [host cost of a converted layer]), which
    must compute the same gradients."""
    g = torch.Generator().manual_seed(11)
    cfg = engine.ConvConfig((2, 2), (1, 1), (1, 1), 2, -1, "powerOfTwo", "", "")
    dy = torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64)  # the layer's input
    w = torch.randn(4, 3, 3, 3, generator=g, dtype=torch.float64)
    x = torch.randn(2, 6, 6, 6, generator=g, dtype=torch.float64)  # its output's shape
    pad = native.output_padding(tuple(x.shape), tuple(dy.shape), tuple(w.shape), cfg)
    assert pad == [1, 1]
    torch.testing.assert_close(
        native.native_transposed(dy, w, cfg, pad, False, True),
        F.conv_transpose2d(dy, w, stride=2, padding=1, output_padding=1, groups=2))
    sides = []

    def host_ms(fn):
        sides.append(fn())
        return 1.0

    monkeypatch.setattr(native, "host_ms", host_ms)
    assert native._host_pair(transposed._host_step((6, 6)), x, w, dy, cfg, False, True,
                             transposed=True) == (1.0, 1.0)
    ours, theirs = sides
    assert ours[0].shape == dy.shape and ours[1].shape == w.shape
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_wd_mode_plans_a_transposed_layers_problem_jointly_and_pickles():
    """convert(mode="wd") plans the transposed layer's convolution problem with
    the others at the first forward; the model's output and gradients are
    torch's, and a pickled converted model runs the same."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
                        nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1,
                                           output_padding=1)).double()
    m = mt.convert(copy.deepcopy(ref), mode="wd", total_workspace=1 << 16)
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    y, yr = m(x), ref(x)
    torch.testing.assert_close(y, yr, rtol=1e-12, atol=1e-12)
    keys = [problem for _, problem in m.mucudnn_planner.plans]
    assert any(k.startswith("conv2d:x=2x2x10x10:w=4x2x3x3:stride=2x2:pad=1x1:") for k in keys)
    y.sum().backward()
    yr.sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)
    m2 = pickle.loads(pickle.dumps(mt.convert(copy.deepcopy(ref))))
    assert type(m2[2]) is mt.ConvTranspose2d
    torch.testing.assert_close(m2(x), yr, rtol=1e-12, atol=1e-12)
