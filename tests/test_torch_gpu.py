"""mucudnn.torch on a CUDA GPU (marker ``gpu``; skipped without a GPU or torch).

Against torch's native (cuDNN) convolutions: float32 (FMA math and TF32),
float16 and bfloat16, 2-D and 3-D, channels_last, autocast, a converted model
over optimizer steps, WR/WD workspace bounds, torch.compile, a CUDA-graph
captured training step (replay == eager, in deterministic mode), bitwise
reproducible weight gradients under ``torch.backends.cudnn.deterministic``,
the engine running on torch's current stream, and planning refused inside a
capture.

Run: ``python -m pytest -q -m gpu tests/test_torch_gpu.py``
"""

from __future__ import annotations

import copy
import functools

import pytest

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import mucudnn  # noqa: E402
import mucudnn.torch as mt  # noqa: E402
from mucudnn.exec.arrays import torch_workspace_bytes  # noqa: E402
from mucudnn.torch import native as native_mod  # noqa: E402
from torch_support import tensors_left_in_cycles  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")]

#: Relative errors (norm of the difference / norm of the reference), as DESIGN.md's.
FMA_TOL, TF32_TOL, HALF_TOL, BF16_TOL = 1e-5, 5e-3, 1e-2, 2e-2


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MUCUDNN_CACHE", str(tmp_path_factory.mktemp("cache") / "cache.sqlite"))
        mp.delenv("MUCUDNN_WORKSPACE_LIMIT", raising=False)
        yield


@pytest.fixture
def no_tf32():
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


@pytest.fixture
def deterministic():
    """torch.backends.cudnn.deterministic on: mucudnn.torch plans deterministic
    configurations only (Note [deterministic plans])."""
    old = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    yield
    torch.backends.cudnn.deterministic = old


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _reference(fn, x, w, b, **kw):
    """float64 result and gradients (dx, dw, db) for the output gradient dy = 1 + y/10."""
    x64, w64, b64 = (t.detach().double().requires_grad_(True) for t in (x, w, b))
    y = fn(x64, w64, b64, **kw)
    dy = (1 + y.detach() / 10)
    y.backward(dy)
    return y.detach(), dy, (x64.grad, w64.grad, b64.grad)


def _matches_float64(mine, native, x, w, b, tol, **kw):
    """``mine(x, w, b, **kw)`` and its gradients (for float64's dy) within
    ``tol`` of ``native``'s float64 run (gradients of float32 within 10 x
    ``tol``: their sums are longer); returns the float64 output."""
    y64, dy64, refs = _reference(native, x, w, b, **kw)
    xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = mine(xs, ws, bs, **kw)
    assert y.dtype == x.dtype and y.shape == y64.shape
    y.backward(dy64.to(x.dtype))
    assert rel(y, y64) < tol
    for got, want in zip((xs.grad, ws.grad, bs.grad), refs):
        assert got.dtype == x.dtype
        assert rel(got, want) < tol * (10 if x.dtype == torch.float32 else 1)
    return y64


CONFIGS_2D = [
    dict(x=(16, 32, 28, 28), w=(64, 32, 3, 3), stride=1, padding=1, dilation=1, groups=1),
    dict(x=(12, 16, 17, 19), w=(32, 8, 3, 5), stride=(2, 1), padding=(1, 2), dilation=1, groups=2),
    dict(x=(8, 24, 20, 20), w=(24, 1, 3, 3), stride=1, padding="same", dilation=2, groups=24),
    dict(x=(32, 64, 14, 14), w=(128, 64, 1, 1), stride=2, padding=0, dilation=1, groups=1),
]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, FMA_TOL), (torch.float16, HALF_TOL),
                                       (torch.bfloat16, BF16_TOL)], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("cfg", CONFIGS_2D, ids=[str(i) for i in range(len(CONFIGS_2D))])
def test_conv2d_against_float64(cfg, dtype, tol, no_tf32):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(cfg["x"], device="cuda", generator=g).to(dtype)
    w = (torch.randn(cfg["w"], device="cuda", generator=g) / 10).to(dtype)
    b = torch.randn(cfg["w"][0], device="cuda", generator=g).to(dtype)
    kw = {k: cfg[k] for k in ("stride", "padding", "dilation", "groups")}
    _matches_float64(functools.partial(mt.conv2d, workspace_limit=8 << 20), F.conv2d, x, w, b,
                     tol, **kw)


def test_default_tf32_math_matches_native(monkeypatch):
    torch.manual_seed(1)
    x = torch.randn(32, 64, 28, 28, device="cuda")
    w = torch.randn(64, 64, 3, 3, device="cuda") / 20
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # PyTorch's default
    y64 = F.conv2d(x.double(), w.double(), padding=1)
    assert rel(mt.conv2d(x, w, padding=1), y64) < TF32_TOL
    assert rel(F.conv2d(x, w, padding=1), y64) < TF32_TOL


def test_conv3d_against_float64(no_tf32):
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(4, 8, 9, 10, 11, device="cuda", generator=g)
    w = torch.randn(16, 4, 3, 3, 3, device="cuda", generator=g) / 10
    b = torch.randn(16, device="cuda", generator=g)
    kw = dict(stride=(1, 2, 1), padding=1, dilation=(2, 1, 1), groups=2)
    y64 = _matches_float64(mt.conv3d, F.conv3d, x, w, b, FMA_TOL, **kw)
    xc = x.contiguous(memory_format=torch.channels_last_3d)
    yc = mt.conv3d(xc, w, b, **kw)
    assert yc.is_contiguous(memory_format=torch.channels_last_3d)
    assert rel(yc, y64) < FMA_TOL


@pytest.mark.parametrize("dtype,tol", [(torch.float32, FMA_TOL), (torch.bfloat16, BF16_TOL)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("permuted", [False, True], ids=["ncl", "nlc"])
def test_conv1d_against_float64(dtype, tol, permuted, no_tf32):
    """See Note [one-dimensional convolutions]. A 1-D convolution (an input laid
    out (N, L, C) included) under a 1 MiB cap, planned as the height-1 NCHW
    problem within the cap, and a converted 1-D model's training step, each
    against float64 (the model's native side too, so both errors are read
    against the same reference)."""
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(64, 32, 4001, device="cuda", generator=g).to(dtype)
    if permuted:
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    w = (torch.randn(64, 16, 9, device="cuda", generator=g) / 10).to(dtype)
    b = torch.randn(64, device="cuda", generator=g).to(dtype)
    kw = dict(stride=2, padding=4, dilation=2, groups=2)
    _matches_float64(functools.partial(mt.conv1d, workspace_limit=1 << 20), F.conv1d, x, w, b,
                     tol, **kw)
    conv = [c for c in mt.cached_convolutions() if c.problem.w_shape == (64, 16, 1, 9)][-1]
    assert conv.problem.layout == "NCHW" and conv.problem.x_shape == (64, 32, 1, 4001)
    assert all(p.workspace_bytes <= 1 << 20 for p in conv.plans.values())
    torch.manual_seed(6)
    native = nn.Sequential(nn.Conv1d(8, 16, 7, padding=3), nn.ReLU(), nn.Conv1d(16, 4, 3)).cuda()
    model = mt.convert(copy.deepcopy(native), workspace_limit=1 << 20)
    assert type(model[0]) is mt.Conv1d
    x = torch.randn(32, 8, 2048, device="cuda", generator=g)
    native64 = copy.deepcopy(native).double()
    errors = []
    for m, xx in ((model, x), (native, x), (native64, x.double())):
        xr = xx.clone().requires_grad_(True)
        m(xr).square().mean().backward()
        errors.append([xr.grad] + [p.grad for p in m.parameters()])
    for got, theirs, want in zip(*errors):
        assert rel(got, want) <= max(FMA_TOL, 1.5 * rel(theirs, want))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, FMA_TOL), (torch.bfloat16, BF16_TOL)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("search", ["all", "over-limit"])
def test_conv_transpose_against_float64(dtype, tol, channels_last, search, no_tf32, monkeypatch):
    """See Note [transposed convolutions]. A transposed convolution under a 1 MiB
    cap runs its problem's three directions, each compared with PyTorch's call
    (under both searches), within ``tol`` of float64 in its output and
    gradients, every plan within the cap. Then a converted decoder's training
    step against float64 (with native's error against the same reference), and
    the report: its layers are transposed, the first one's problem forward (the
    decoder's input needs no gradient) not in a step."""
    monkeypatch.setenv("MUCUDNN_TORCH_SEARCH", search)
    mt.clear()
    g = torch.Generator(device="cuda").manual_seed(9)
    x = torch.randn(32, 64, 28, 28, device="cuda", generator=g).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = (torch.randn(64, 16, 4, 4, device="cuda", generator=g) / 10).to(dtype)
    b = torch.randn(32, device="cuda", generator=g).to(dtype)
    kw = dict(stride=2, padding=1, output_padding=0, groups=2, dilation=1)
    _matches_float64(functools.partial(mt.conv_transpose2d, workspace_limit=1 << 20),
                     F.conv_transpose2d, x, w, b, tol, **kw)
    recs = [r for r in native_mod.records() if r.transposed]
    assert recs and all(r.x_shape[0] == 32 for r in recs)
    assert all(p.workspace_bytes <= 1 << 20 for c in mt.cached_convolutions()
               for p in c.plans.values())
    torch.manual_seed(10)
    native = nn.Sequential(nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1),
                           nn.ReLU(), nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1,
                                                         groups=2)).cuda()
    model = mt.convert(copy.deepcopy(native), workspace_limit=1 << 20)
    assert type(model[0]) is mt.ConvTranspose2d
    x = torch.randn(16, 32, 28, 28, device="cuda", generator=g)
    if channels_last:
        native = native.to(memory_format=torch.channels_last)
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    native64 = copy.deepcopy(native).double()
    errors = []
    for m, xx in ((model, x), (native, x), (native64, x.double())):
        m(xx).square().mean().backward()
        errors.append([p.grad for p in m.parameters()])
    for got, theirs, want in zip(*errors):
        assert rel(got, want) <= max(FMA_TOL, 1.5 * rel(theirs, want))
    layers = mt.report(model).layers
    assert {layer.name for layer in layers} == {"0", "2"} and all(lr.transposed for lr in layers)
    first = next(lr for lr in layers if lr.name == "0")
    assert not first.directions["fwd"]["in_step"] and first.directions["bwd-data"]["in_step"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_channels_last_module_matches_native(dtype):
    torch.manual_seed(3)
    ref = nn.Conv2d(32, 64, 3, padding=1, stride=2).cuda().to(dtype)
    ref = ref.to(memory_format=torch.channels_last)
    mine = mt.convert(copy.deepcopy(ref))
    x = torch.randn(16, 32, 30, 30, device="cuda", dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yr, ym = ref(xr), mine(xm)
    assert ym.is_contiguous(memory_format=torch.channels_last)
    dy = torch.randn_like(yr)
    yr.backward(dy)
    ym.backward(dy)
    tol = {torch.float32: TF32_TOL, torch.float16: HALF_TOL, torch.bfloat16: BF16_TOL}[dtype]
    assert rel(ym, yr) < tol
    assert rel(xm.grad, xr.grad) < tol
    assert rel(mine.weight.grad, ref.weight.grad) < tol
    assert xm.grad.is_contiguous(memory_format=torch.channels_last)
    layouts = {c.problem.layout for c in mt.cached_convolutions()
               if c.problem.w_shape == (64, 3, 3, 32)}
    assert layouts == {"NHWC"}


@pytest.mark.parametrize("w_shape,groups", [((16, 8, 1, 1), 1), ((8, 1, 3, 3), 8),
                                             ((16, 8, 3, 3), 1)], ids=["1x1", "depthwise", "3x3"])
@pytest.mark.parametrize("x_fmt", ["nchw", "cl", "nchw-1x1-spatial"])
@pytest.mark.parametrize("w_cl", [False, True], ids=["w-nchw", "w-cl"])
def test_layouts_and_strides_follow_pytorchs_cudnn_convolution(w_shape, groups, x_fmt, w_cl,
                                                               no_tf32):
    """See Note [the layout PyTorch suggests]: on every mix of input and weight
    formats (plainly contiguous 1x1 and depthwise weights in channels-last
    included), the converted convolution's output has the strides PyTorch's own
    cuDNN convolution gives, its gradients the same layout in memory, and their
    values match float64."""
    g = torch.Generator(device="cuda").manual_seed(5)
    size = 1 if x_fmt == "nchw-1x1-spatial" else 9
    x = torch.randn(4, 8, size, size, device="cuda", generator=g)
    if x_fmt == "cl":
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(w_shape, device="cuda", generator=g) / 10
    if w_cl:
        w = w.to(memory_format=torch.channels_last)
    pad = w_shape[-1] // 2
    y64, dy64, (dx64, dw64, _) = _reference(
        lambda a, b, c: F.conv2d(a, b, padding=pad, groups=groups), x, w, w[:, 0, 0, 0])
    outs = []
    for fn in (F.conv2d, mt.conv2d):
        xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y = fn(xs, ws, padding=pad, groups=groups)
        y.backward(dy64.float().contiguous(memory_format=torch.channels_last)
                   if y.is_contiguous(memory_format=torch.channels_last) else dy64.float())
        outs.append((y, xs.grad, ws.grad))
    (yn, dxn, dwn), (ym, dxm, dwm) = outs
    assert ym.stride() == yn.stride()
    # a gradient's layout in memory: strides of a size-1 dimension never address anything
    for got, want in ((dxm, dxn), (dwm, dwn)):
        assert [s for s, n in zip(got.stride(), got.shape) if n > 1] == \
            [s for s, n in zip(want.stride(), want.shape) if n > 1]
    assert rel(ym, y64) < FMA_TOL
    assert rel(dxm, dx64) < 10 * FMA_TOL and rel(dwm, dw64) < 10 * FMA_TOL


def test_float64_on_the_gpu_runs_nchw_as_pytorchs_cudnn_convolution():
    """See Note [the layout PyTorch suggests]: PyTorch's cuDNN path runs float64
    NCHW whatever the strides, so a channels-last float64 input gives an NCHW
    output there and in the converted call, with the same values."""
    g = torch.Generator(device="cuda").manual_seed(6)
    x = torch.randn(2, 4, 6, 6, device="cuda", generator=g, dtype=torch.float64)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(5, 4, 3, 3, device="cuda", generator=g, dtype=torch.float64)
    w = w.to(memory_format=torch.channels_last)
    yn, ym = F.conv2d(x, w, padding=1), mt.conv2d(x, w, padding=1)
    assert ym.stride() == yn.stride() and yn.is_contiguous()
    assert rel(ym, yn) < 1e-12


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1, groups=4), nn.ReLU(),
            nn.Conv2d(64, 128, 1, stride=2), nn.ReLU())
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def _batches(n, batch=32, size=32, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(batch, 3, size, size, device="cuda", generator=g),
             torch.randint(0, 10, (batch,), device="cuda", generator=g)) for _ in range(n)]


def _step(model, opt, x, t):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), t)
    loss.backward()
    opt.step()
    return loss


@pytest.mark.parametrize("amp", [None, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_convert_training_tracks_native(amp, no_tf32):
    torch.manual_seed(4)
    ref = SmallCNN().cuda()
    model = copy.deepcopy(ref)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    mt.convert(model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for x, t in _batches(5):
        with torch.autocast("cuda", dtype=amp or torch.float16, enabled=amp is not None):
            out, ref_out = model(x), ref(x)
        if amp is not None:
            assert out.dtype == ref_out.dtype == amp
        loss, ref_loss = F.cross_entropy(out.float(), t), F.cross_entropy(ref_out.float(), t)
        for _m, o, lo in ((model, opt, loss), (ref, ref_opt, ref_loss)):
            o.zero_grad(set_to_none=True)
            lo.backward()
            o.step()
        tol = 1e-4 if amp is None else 3e-2
        assert rel(loss, ref_loss) <= tol
    assert all(p.dtype == torch.float32 for p in model.parameters())
    if amp is None:
        for p, q in zip(model.parameters(), ref.parameters()):
            assert rel(p, q) < 1e-4
    else:  # low precision: compare the parameters as a whole (tiny biases drift relatively)
        flat = [torch.cat([p.detach().flatten() for p in m.parameters()]) for m in (model, ref)]
        assert rel(*flat) < 1e-2


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("limit", [64 << 20, 0], ids=["64MiB", "no-workspace"])
def test_steady_training_steps_leave_no_tensor_to_the_cycle_collector(amp, limit):
    """Once planned, a converted model's steps free every tensor by reference
    counting, as native steps do: a tensor left in a reference cycle would stay
    allocated until Python's collector ran, and raise the peak at random."""
    torch.manual_seed(5)
    model = mt.convert(SmallCNN().cuda().to(memory_format=torch.channels_last),
                       workspace_limit=limit)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    (x, t), = _batches(1)
    x = x.contiguous(memory_format=torch.channels_last)

    def step():
        with torch.autocast("cuda", dtype=amp or torch.bfloat16, enabled=amp is not None):
            out = model(x)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(out.float(), t).backward()
        opt.step()

    for _ in range(12):  # stand-ins, then planning a share at a time, then replays
        step()
    torch.cuda.synchronize()
    assert tensors_left_in_cycles(step) == []


def test_workspace_bounds_and_where_it_lives():
    mucudnn.caches.clear_all()
    model = mt.convert(SmallCNN().cuda(), workspace_limit=1 << 20)
    for i, (x, t) in enumerate(_batches(2)):
        F.cross_entropy(model(x), t).backward()
        torch.cuda.synchronize()
        if i == 0:  # the pool and the kept torch buffer are shared with earlier
            mt.release_workspace()  # tests' larger plans: start them afresh
    held = mt.workspace_bytes("cuda")
    assert 0 <= held <= 1 << 20  # the backends' pools
    # converted layers keep no buffer in torch's allocator between launches
    # (Note [transient workspace in a training step])
    assert torch_workspace_bytes() == 0
    assert mt.release_workspace() == held and mt.workspace_bytes("cuda") == 0
    for conv in mt.cached_convolutions():
        assert all(p.workspace_bytes <= 1 << 20 for p in conv.plans.values())
    # WD: every kernel's plan, summed, fits the one budget
    total = 2 << 20
    wd = mt.convert(SmallCNN().cuda(), mode="wd", total_workspace=total)
    for x, t in _batches(2):
        F.cross_entropy(wd(x), t).backward()
    chosen = [p for plans in wd.mucudnn_planner.plans.values() for p in plans.values()]
    assert len(chosen) == 12 and sum(p.workspace_bytes for p in chosen) <= total


def test_torch_compile_matches_eager(no_tf32):
    torch._dynamo.reset()
    torch.manual_seed(5)
    model = mt.convert(SmallCNN().cuda())
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="aot_eager")
    for x, t in _batches(2, seed=3):
        loss = F.cross_entropy(compiled(x), t)
        loss.backward()
        ref_loss = F.cross_entropy(ref(x), t)
        ref_loss.backward()
        assert rel(loss, ref_loss) < 1e-5
        for p, q in zip(model.parameters(), ref.parameters()):
            assert rel(p.grad, q.grad) < 1e-4


def test_opcheck_on_cuda():
    g = torch.Generator(device="cuda").manual_seed(6)
    x = torch.randn(8, 16, 12, 12, device="cuda", generator=g, requires_grad=True)
    w = torch.randn(32, 8, 3, 3, device="cuda", generator=g, requires_grad=True)
    b = torch.randn(32, device="cuda", generator=g, requires_grad=True)
    args = ([1, 1], [1, 1], [1, 1], 2, 64 << 20, "powerOfTwo", "", "")
    torch.library.opcheck(torch.ops.mucudnn.conv.default, (x, w, b) + args)


def test_cuda_graph_training_step_replays_like_eager(no_tf32, deterministic, monkeypatch):
    """Deterministic mode: the captured model and its eager twin run the same
    deterministic plans (one Convolution per problem serves both), so they agree to
    rounding in the native layers (BatchNorm, Linear), not merely to atomics' noise.
    A capture runs each direction's GPU choice (Note [captured steps run the GPU's
    choice]), so the eager steps here run those too: no host rule, no step trial."""
    from mucudnn.torch import native, step_trial
    monkeypatch.setattr(native, "settle", lambda choices, *_: choices)
    mucudnn.caches.clear_all()  # earlier tests' (non-deterministic) Convolutions
    torch.manual_seed(7)
    model = mt.convert(SmallCNN().cuda())
    step_trial.drop(model)  # its layers keep the trial's "plans" way (torch False)
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    data = _batches(7, seed=8)
    static_x, static_t = data[0][0].clone(), data[0][1].clone()
    # warm-up on a side stream (plans, workspace, momentum buffers), as torch.cuda.graph asks
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for x, t in data[:3]:
            static_x.copy_(x)
            static_t.copy_(t)
            _step(model, opt, static_x, static_t)
    torch.cuda.current_stream().wait_stream(s)
    for x, t in data[:3]:
        _step(twin, twin_opt, x, t)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = F.cross_entropy(model(static_x), static_t)
        static_loss.backward()
        opt.step()
    for x, t in data[3:]:
        static_x.copy_(x)
        static_t.copy_(t)
        graph.replay()
        loss = _step(twin, twin_opt, x, t)
        torch.cuda.synchronize()
        assert rel(static_loss, loss) < 1e-5
    convs = mt.cached_convolutions()
    assert convs and all(c.deterministic for c in convs)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert rel(p, q) <= 1e-6
    for b, c in zip(model.buffers(), twin.buffers()):
        assert torch.equal(b, c) if not b.is_floating_point() else rel(b, c) <= 1e-6


def test_deterministic_mode_gives_bitwise_identical_weight_gradients(no_tf32, deterministic):
    """A converted conv's backward-filter (micro-batched where 16-sample calls win:
    beta = 1 accumulation in the plan's fixed order) with deterministic
    configurations only: repeated backward passes give the same bits."""
    g = torch.Generator(device="cuda").manual_seed(11)
    conv = mt.convert(nn.Conv2d(64, 64, 3, padding=1, bias=False).cuda(), policy=[16])
    x = torch.randn(64, 64, 28, 28, device="cuda", generator=g)
    dy = torch.randn(64, 64, 28, 28, device="cuda", generator=g)
    grads = []
    for _ in range(3):
        conv.zero_grad(set_to_none=True)
        conv(x).backward(dy)
        grads.append(conv.weight.grad.clone())
    torch.cuda.synchronize()
    assert all(torch.equal(grads[0], other) for other in grads[1:])
    (used,) = [c for c in mt.cached_convolutions()
               if c.problem.x_shape == (64, 64, 28, 28) and tuple(c.policy) == (16,)]
    assert used.deterministic
    # every micro-batch runs a configuration the backend's Find called deterministic
    d = mucudnn.Direction.BACKWARD_FILTER
    plan = used.plans[d]
    perf = mucudnn.optimizer.benchmark(used.backend, used.problem, d, used.policy,
                                       used.workspace_limit, progress=False)
    for m in plan.micro_batches:
        (entry,) = [a for a in perf[m.size] if a.algo == m.algo and a.math_type == m.math_type]
        assert entry.determinism != 0, (m, entry)
    x64, w64 = x.double(), conv.weight.detach().double().requires_grad_(True)
    (dw64,) = torch.autograd.grad(F.conv2d(x64, w64, padding=1), w64, dy.double())
    assert rel(grads[0], dw64) < 1e-4


def test_planning_inside_capture_is_refused():
    w = torch.randn(8, 4, 3, 3, device="cuda")
    mt.conv2d(torch.randn(2, 4, 9, 9, device="cuda"), w)  # the backend exists
    torch.cuda.synchronize()
    x = torch.randn(3, 4, 11, 11, device="cuda")            # a problem never planned
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(mucudnn.errors.PlanningInCaptureError):
        with torch.cuda.graph(graph):
            mt.conv2d(x, w)


def test_runs_on_torchs_current_stream():
    """Work queued on a side stream before the call must be waited for and the
    result must be ready for the next op on that stream, with no sync between."""
    w = torch.randn(64, 64, 3, 3, device="cuda") / 20
    x0 = torch.randn(32, 64, 32, 32, device="cuda")
    mt.conv2d(x0, w, padding=1)  # plan outside the timed region
    ref = F.conv2d(x0.double(), w.double(), padding=1)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)   # keeps s busy: x is written late
        x = x0 * 1.0
        y = mt.conv2d(x, w, padding=1)
        out = y * 1.0                    # consumes y on s
    s.synchronize()
    assert rel(out, ref) < TF32_TOL


@pytest.mark.parametrize("replay", ["1", "0"], ids=["replayed", "direct"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_planned_launches_match_float64_call_after_call(no_tf32, monkeypatch, channels_last,
                                                        replay):
    """See Note [replay after repeated addresses]: with every direction on its
    plan (micro-batched under a 1 MiB limit), a grouped layer's output and
    three gradients match a float64 run at every call of a loop on the same
    tensors, replayed (the default, ``MUCUDNN_TORCH_REPLAY=1``: once the
    loop's addresses repeat its launches are replayed graphs) or launched
    directly (``MUCUDNN_TORCH_REPLAY=0``: no kernel keeps graphs)."""
    monkeypatch.setenv("MUCUDNN_TORCH_REPLAY", replay)
    monkeypatch.setenv("MUCUDNN_TORCH_NATIVE", "0")
    mucudnn.caches.clear_all()
    torch.manual_seed(3)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(16, 48, 14, 14, device="cuda").contiguous(memory_format=fmt)
    w = (torch.randn(48, 12, 3, 3, device="cuda") * 0.1).contiguous(memory_format=fmt)
    b = torch.randn(48, device="cuda")
    kw = dict(padding=1, groups=4)
    y64, dy64, refs = _reference(F.conv2d, x, w, b, **kw)
    xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
    dy = dy64.float().contiguous(memory_format=fmt)
    for _ in range(6):
        for t in (xs, ws, bs):
            t.grad = None
        y = mt.conv2d(xs, ws, bs, workspace_limit=1 << 20, **kw)
        y.backward(dy)
        torch.cuda.synchronize()
        assert rel(y, y64) < FMA_TOL
        for got, want in zip((xs.grad, ws.grad, bs.grad), refs):
            assert rel(got, want) < 10 * FMA_TOL
        del y
    graphs = [c.kernel(d).graphs for c in mt.cached_convolutions()
              for d in mucudnn.Direction]
    if replay == "0":
        assert graphs and all(g is None for g in graphs)
        return
    assert graphs and all(g is not None and g.after == 2 for g in graphs)
    assert sum(g.replays for g in graphs) > 0


def test_layers_sharing_a_kernel_are_each_replayed_once_their_addresses_repeat(
        no_tf32, monkeypatch):
    """See Note [more address sets than graphs]: twelve grouped layers of one
    shape share each direction's kernel, more than the graphs a kernel keeps
    at first. With ``MUCUDNN_TORCH_REPLAY=1`` (every direction on its plan,
    micro-batched under a 1 MiB limit) the output and every gradient match a
    float64 run at each step, and once the caching allocator hands the steps
    the same addresses, a whole step's launches of every layer are replayed
    graphs: none captured anew, none direct. (Without growing, a kernel
    keeping eight graphs for twelve address sets in turn would capture at
    every call, and no step would be.)"""
    monkeypatch.setenv("MUCUDNN_TORCH_REPLAY", "1")
    monkeypatch.setenv("MUCUDNN_TORCH_NATIVE", "0")
    mucudnn.caches.clear_all()
    torch.manual_seed(4)
    kw = dict(padding=1, groups=4)
    x = torch.randn(8, 48, 14, 14, device="cuda")
    ws = [torch.randn(48, 12, 3, 3, device="cuda") * 0.1 for _ in range(12)]

    def net(conv, x, ws):
        for w in ws:
            x = conv(x, w, **kw)
        return x

    x64, w64 = x.double().requires_grad_(True), [w.double().requires_grad_(True) for w in ws]
    y64 = net(F.conv2d, x64, w64)
    dy = torch.randn_like(y64)
    y64.backward(dy)
    xs, wss = x.clone().requires_grad_(True), [w.clone().requires_grad_(True) for w in ws]
    dyf = dy.float()
    conv = functools.partial(mt.conv2d, workspace_limit=1 << 20)

    def counts():
        graphs = [c.kernel(d).graphs for c in mt.cached_convolutions()
                  for d in mucudnn.Direction]
        return graphs, [(g.captures, g.direct) for g in graphs if g is not None]

    replayed_only = None
    for step in range(10):
        before = counts()[1]
        for t in (xs, *wss):
            t.grad = None
        y = net(conv, xs, wss)
        y.backward(dyf)
        torch.cuda.synchronize()
        assert rel(y, y64) < 100 * FMA_TOL
        grads = zip((xs.grad, *(w.grad for w in wss)), (x64.grad, *(w.grad for w in w64)))
        assert all(rel(got, want) < 100 * FMA_TOL for got, want in grads)
        del y
        if step >= 2 and counts()[1] == before:
            replayed_only = step
            break
    graphs = counts()[0]
    assert graphs and all(g is not None and g.after == 2 for g in graphs)
    assert replayed_only is not None, [(g.captures, g.direct, g.max_graphs) for g in graphs]
    assert all(g.max_graphs >= 12 and len(g) >= 12 for g in graphs)
