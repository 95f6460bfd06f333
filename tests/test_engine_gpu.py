"""The execution engine and public API on both cuDNN backends (marker ``gpu``; skipped
without a GPU): the array kinds (torch zero-copy, CuPy-style __cuda_array_interface__
v2/v3, DeviceArray, NumPy copied), the warm call path noticing every change
(pointers, shapes, dtypes, contiguity, scalars, torch's current stream), the
MicroBatchHandle path with real descriptors and int pointers, graph replay, and the
run-time fallback. Micro-batched == unsplit over random problems is in
tests/test_backend_conformance.py.

Run: ``HYPOTHESIS_PROFILE=gpu python -m pytest -q -m gpu tests/test_engine_gpu.py``
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mucudnn as mu
from mucudnn.api import conv2d
from mucudnn.backends import get_backend
from mucudnn.cuda import DeviceArray
from mucudnn.exec import WorkspaceFallbackWarning, get_pool, problem_from_descriptors
from mucudnn.exec.arrays import release_torch_workspaces, torch_workspace, torch_workspace_bytes
from mucudnn.optimizer.policies import fitted_sizes
from mucudnn.problem import ConvProblem, Direction, MicroBatch, make_plan

from conv_support import convolution_for, normal_tensors, run_direction
from reference import reference, rel_err

pytestmark = pytest.mark.gpu

FMA_REF = 1e-5
DEFAULT_REF = 5e-3


@pytest.fixture(scope="module", params=["cudnn", "cudnn-graph"])
def be(request):
    return get_backend(request.param)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.delenv("MUCUDNN_WORKSPACE_LIMIT", raising=False)


@pytest.fixture
def torch(monkeypatch):
    t = pytest.importorskip("torch")
    monkeypatch.setattr(t.backends.cudnn, "allow_tf32", False)  # restored after the test
    return t


def conv_for(be, p, **kw):
    return convolution_for(p, backend=be, **kw)


_ALGOS: dict = {}


def algos_at(be, p, d, size):
    """(algo, math_type) that the backend ran for p at micro-batch ``size``."""
    key = (be.name, p.key(), d, size)
    if key not in _ALGOS:
        _ALGOS[key] = [(a.algo, a.math_type) for a in be.find(p.with_batch(size), d, 256 << 20)]
    return _ALGOS[key]


def plan_of(be, p, d, sizes, pick=0):
    """A forced plan over ``sizes`` with the ``pick``-th fastest algorithm of each size."""
    mbs, off = [], 0
    for s in sizes:
        choices = algos_at(be, p, d, s)
        algo, math = choices[min(pick, len(choices) - 1)]
        mbs.append(MicroBatch(off, s, algo, math))
        off += s
    return make_plan(mbs, undivided_time_ms=1, workspace_limit=None)


@pytest.mark.parametrize("batch", [1, 7, 37, 100])
def test_batch_sizes_with_optimised_plans(be, batch):
    p = ConvProblem((batch, 8, 6, 6), (8, 8, 3, 3), padding=1, math="fma")
    conv = conv_for(be, p, workspace_limit=1 << 20, policy="powerOfTwo")
    rng = np.random.default_rng(batch)
    x, w, y = normal_tensors(p, rng)
    for d in Direction:
        out = run_direction(conv, d, x, w, y, 1.0, 0.0, poison=True)
        assert conv.plans[d].batch == batch and conv.plans[d].workspace_bytes <= 1 << 20
        assert rel_err(out, reference(p, d, x, w, y)) < FMA_REF


def test_default_math_against_reference(be):
    p = ConvProblem((32, 16, 9, 9), (32, 16, 3, 3), padding=1)
    conv = conv_for(be, p, workspace_limit=4 << 20)
    rng = np.random.default_rng(1)
    x, w, y = normal_tensors(p, rng)
    for d in Direction:
        assert rel_err(run_direction(conv, d, x, w, y, 0.5, 1.0),
                       reference(p, d, x, w, y, 0.5, 1.0)) < DEFAULT_REF


def test_backward_filter_beta_zero_with_nan_dw(be):
    p = ConvProblem((16, 4, 7, 7), (8, 4, 3, 3), padding=1, math="fma")
    plan = plan_of(be, p, Direction.BACKWARD_FILTER, [8, 4, 4], pick=1)
    conv = conv_for(be, p, plans={Direction.BACKWARD_FILTER: plan})
    rng = np.random.default_rng(2)
    x, w, y = normal_tensors(p, rng)
    dw = run_direction(conv, Direction.BACKWARD_FILTER, x, w, y, 1.0, 0.0, poison=True)
    assert np.isfinite(dw).all()
    assert rel_err(dw, reference(p, Direction.BACKWARD_FILTER, x, w, y)) < FMA_REF



def test_fitted_policy_plans_run_and_match_the_reference(be):
    """Note [fitted sizes] on cuDNN: AlexNet conv1's backward-filter geometry in
    channels-last (smaller images), under 60% of the best undivided call's
    workspace: "fitted" times the sizes it names (if any) on top of powerOfTwo's,
    its plan fits the limit and agrees with the float64 reference."""
    p = ConvProblem((32, 67, 67, 3), (96, 11, 11, 3), stride=4, layout="NHWC")
    d = Direction.BACKWARD_FILTER
    best = min(be.find(p, d, 1 << 30), key=lambda r: r.time_ms)
    limit = max(1 << 20, int(best.workspace_bytes * 0.6))
    perf = mu.optimizer.benchmark(be, p, d, "fitted", limit, cache=False, prune_sizes=True,
                                  progress=False)
    pow2 = {s: perf[s] for s in mu.optimizer.batch_sizes("powerOfTwo", 32) if s in perf}
    named = fitted_sizes(pow2, 32, limit, p.batch_quantum())
    assert set(named) <= set(perf)
    plan = mu.optimizer.optimize_wr(perf, 32, limit, "fitted", quantum=p.batch_quantum())
    assert plan.workspace_bytes <= limit and {m.size for m in plan.micro_batches} <= set(perf)
    conv = conv_for(be, p, plans={d: plan})
    rng = np.random.default_rng(5)
    x, w, y = normal_tensors(p, rng)
    dw = run_direction(conv, d, x, w, y, 1.0, 0.0, poison=True)
    assert rel_err(dw, reference(p, d, x, w, y)) < DEFAULT_REF

# -- array kinds -----------------------------------------------------------------------------

P = ConvProblem((12, 8, 10, 10), (16, 8, 3, 3), padding=1, math="fma")


def test_torch_round_trip_is_zero_copy(be, torch):
    rng = np.random.default_rng(3)
    x, w, y = normal_tensors(P, rng)
    conv = conv_for(be, P, workspace_limit=1 << 20)
    tx, tw, ty = (torch.from_numpy(a).cuda() for a in (x, w, y))
    out = torch.full(P.output_shape, float("nan"), device="cuda")
    ptr = out.data_ptr()
    r = conv.forward(tx, tw, out)
    assert r is out and r.data_ptr() == ptr
    # No explicit synchronisation: the call ran on torch's current stream.
    got = out.cpu().numpy()
    assert rel_err(got, reference(P, "forward", x, w, y)) < FMA_REF
    r2 = conv.forward(tx, tw)
    assert isinstance(r2, torch.Tensor) and r2.device == tx.device and r2.dtype == tx.dtype
    np.testing.assert_allclose(r2.cpu().numpy(), got, rtol=0, atol=0)
    dx = conv.backward_data(ty, tw)
    assert isinstance(dx, torch.Tensor)
    assert rel_err(dx.cpu().numpy(), reference(P, "backward_data", x, w, y)) < FMA_REF
    dw = torch.full(P.w_shape, float("nan"), device="cuda")
    conv.backward_filter(tx, ty, dw)
    assert rel_err(dw.cpu().numpy(), reference(P, "backward_filter", x, w, y)) < FMA_REF
    # torch writes just before us, on its own stream: we must see it.
    tx2 = tx * 2
    out2 = conv.forward(tx2, tw)
    assert rel_err(out2.cpu().numpy(), 2 * reference(P, "forward", x, w, y)) < FMA_REF


class CupyLike:
    """A minimal CuPy stand-in: only __cuda_array_interface__, over a torch tensor."""

    def __init__(self, t, version=3):
        self._t = t
        cai = dict(t.__cuda_array_interface__)
        if version >= 3:
            import torch

            cai["version"] = 3
            cai["stream"] = int(torch.cuda.current_stream().cuda_stream) or 1
        self.__cuda_array_interface__ = cai


@pytest.mark.parametrize("version", [2, 3])
def test_cupy_style_round_trip(be, torch, version):
    rng = np.random.default_rng(4)
    x, w, y = normal_tensors(P, rng)
    conv = conv_for(be, P, workspace_limit=1 << 20)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    ty = torch.empty(P.output_shape, device="cuda")
    cy = CupyLike(ty, version)
    r = conv.forward(CupyLike(tx, version), CupyLike(tw, version), cy)
    assert r is cy
    assert rel_err(ty.cpu().numpy(), reference(P, "forward", x, w, y)) < FMA_REF
    r2 = conv.forward(CupyLike(tx, version), CupyLike(tw, version))  # no output: a DeviceArray
    assert isinstance(r2, DeviceArray)
    assert rel_err(r2.to_numpy(), reference(P, "forward", x, w, y)) < FMA_REF


def test_device_arrays_and_numpy_on_gpu(be):
    rng = np.random.default_rng(5)
    x, w, y = normal_tensors(P, rng)
    conv = conv_for(be, P, workspace_limit=1 << 20)
    dx, dw = DeviceArray.from_numpy(x), DeviceArray.from_numpy(w)
    r = conv.forward(dx, dw)
    assert isinstance(r, DeviceArray)
    assert rel_err(r.to_numpy(), reference(P, "forward", x, w, y)) < FMA_REF
    yn = conv.forward(x, w)
    assert isinstance(yn, np.ndarray)
    assert rel_err(yn, reference(P, "forward", x, w, y)) < FMA_REF
    with pytest.raises(TypeError, match="^y: the inputs are NumPy arrays"):
        conv.forward(x, w, be.empty(P.output_shape, "float32"))
    with pytest.raises(TypeError, match="x is a NumPy array but w"):
        conv.forward(x, dw)


def test_validation_of_device_inputs(be, torch):
    conv = conv_for(be, P, workspace_limit=1 << 20)
    tx = torch.zeros(P.x_shape, device="cuda")
    tw = torch.zeros(P.w_shape, device="cuda")
    with pytest.raises(ValueError, match="^x: expected a C-contiguous device array"):
        conv.forward(torch.zeros(P.x_shape[::-1], device="cuda").permute(3, 2, 1, 0), tw)
    with pytest.raises(ValueError, match="^w: expected dtype float32"):
        conv.forward(tx, tw.double())
    with pytest.raises(ValueError, match=r"^y: expected shape"):
        conv.forward(tx, tw, torch.zeros((1, 2), device="cuda"))
    with pytest.raises(TypeError, match=r"^x is host memory \(Tensor\) but w is a device array"):
        conv.forward(tx.cpu(), tw)
    with pytest.raises(ValueError, match="^y: beta"):
        conv.forward(tx, tw, beta=1.0)


# -- MicroBatchHandle ---------------------------------------------------------------------------

HANDLE_PROBLEMS = [
    ConvProblem((9, 8, 12, 12), (16, 4, 3, 3), padding=1, groups=2, math="fma"),
    ConvProblem((6, 7, 9, 8), (8, 3, 3, 8), stride=2, dilation=(1, 2), layout="NHWC", math="fma"),
    ConvProblem((5, 4, 6, 6, 6), (8, 4, 3, 3, 3), padding=1, layout="NCDHW", math="fma"),
]


@pytest.mark.parametrize("p", HANDLE_PROBLEMS, ids=lambda p: p.layout)
def test_handle_with_descriptors_and_pointers(be, torch, p):
    from mucudnn._cudnn.descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor

    xd, wd = TensorDescriptor.for_x(p), FilterDescriptor.for_w(p)
    cd, yd = ConvolutionDescriptor.for_problem(p), TensorDescriptor.for_y(p)
    assert problem_from_descriptors(xd, wd, cd, yd) == p
    h = mu.MicroBatchHandle(be, workspace_limit=1 << 20)
    rng = np.random.default_rng(6)
    x, w, y = normal_tensors(p, rng)
    tx, tw, ty = (torch.from_numpy(a).cuda() for a in (x, w, y))
    need = h.get_convolution_forward_workspace_size(xd, wd, cd, yd, 0, layer_id="L")
    assert need == h.plans["L/forward"].workspace_bytes <= 1 << 20
    ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
    out = torch.empty(p.output_shape, device="cuda")
    torch.cuda.synchronize()
    h.convolution_forward(1.0, xd, tx.data_ptr(), wd, tw.data_ptr(), cd, 7, ws.data_ptr(), need,
                          0.0, yd, out.data_ptr(), layer_id="L")
    dx = torch.from_numpy(x).cuda()
    torch.cuda.synchronize()
    h.convolution_backward_data(2.0, wd, tw.data_ptr(), yd, ty.data_ptr(), cd, 0, 0, 0, 0.5,
                                xd, dx.data_ptr(), layer_id="L")
    dw = torch.full(p.w_shape, float("nan"), device="cuda")
    torch.cuda.synchronize()
    h.convolution_backward_filter(1.0, xd, tx.data_ptr(), yd, ty.data_ptr(), cd, 0, None, 0, 0.0,
                                  wd, dw.data_ptr(), layer_id="L")
    be.synchronize()
    assert rel_err(out.cpu().numpy(), reference(p, "forward", x, w, y)) < FMA_REF
    assert rel_err(dx.cpu().numpy(), reference(p, "backward_data", x, w, y, 2.0, 0.5)) < FMA_REF
    assert rel_err(dw.cpu().numpy(), reference(p, "backward_filter", x, w, y)) < FMA_REF
    for dsc in (xd, wd, cd, yd):
        dsc.close()


def test_handle_wd(be, torch):
    from mucudnn._cudnn.descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor

    h = mu.MicroBatchHandle(be, workspace_limit=64 << 20)
    ps = {"a": ConvProblem((32, 16, 14, 14), (32, 16, 3, 3), padding=1, math="fma"),
          "b": ConvProblem((32, 32, 7, 7), (32, 32, 3, 3), padding=1, math="fma")}
    for name, p in ps.items():
        for d in Direction:
            h.register(p, d, layer_id=name)
    total = 2 << 20
    chosen = h.optimize_wd(total)
    assert sum(pl.workspace_bytes for pl in chosen.values()) <= total
    spans = sorted((o, o + n) for o, n in h.segments.segments.values() if n)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    p = ps["b"]
    rng = np.random.default_rng(7)
    x, w, y = normal_tensors(p, rng)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    out = torch.empty(p.output_shape, device="cuda")
    xd, wd = TensorDescriptor.for_x(p), FilterDescriptor.for_w(p)
    cd, yd = ConvolutionDescriptor.for_problem(p), TensorDescriptor.for_y(p)
    torch.cuda.synchronize()
    h.convolution_forward(1.0, xd, tx.data_ptr(), wd, tw.data_ptr(), cd, 0, None, 0, 0.0, yd,
                          out.data_ptr(), layer_id="b")
    be.synchronize()
    assert rel_err(out.cpu().numpy(), reference(p, "forward", x, w, y)) < FMA_REF


# -- graphs and fallback ----------------------------------------------------------------------------

def test_graph_replay_equals_plain(be, torch):
    p = ConvProblem((16, 32, 7, 7), (32, 32, 3, 3), padding=1, math="fma")
    rng = np.random.default_rng(8)
    x, w, y = normal_tensors(p, rng)
    tx, tw, ty = (torch.from_numpy(a).cuda() for a in (x, w, y))
    tol = {Direction.FORWARD: 1e-6, Direction.BACKWARD_DATA: 1e-6, Direction.BACKWARD_FILTER: 1e-5}
    for d in Direction:
        plan = plan_of(be, p, d, [8, 4, 4])
        plain = conv_for(be, p, plans={d: plan})
        graphed = conv_for(be, p, plans={d: plan}, graph=True)
        assert graphed.graph_active
        args = {Direction.FORWARD: (tx, tw), Direction.BACKWARD_DATA: (ty, tw),
                Direction.BACKWARD_FILTER: (tx, ty)}[d]
        call = {Direction.FORWARD: "forward", Direction.BACKWARD_DATA: "backward_data",
                Direction.BACKWARD_FILTER: "backward_filter"}[d]
        want = getattr(plain, call)(*args).cpu().numpy()
        out = torch.empty_like(torch.from_numpy(want)).cuda()
        for _i in range(3):
            out.fill_(float("nan"))
            getattr(graphed, call)(*args, out)
            # Note: graph and plain runs may differ by rounding where an algorithm
            # is non-deterministic (atomics in backward passes); judge by norm.
            assert rel_err(out.cpu().numpy(), want) < tol[d]
        g = graphed.kernel(d).graphs
        assert g.captures == 1 and g.replays == 3
        # the capture's seconds hold its instantiation (See Note [what replay costs the host])
        assert 0.0 < g.instantiate_s <= g.capture_s and g.replay_s > 0.0
        out2 = torch.empty_like(out)
        getattr(graphed, call)(*args, out2)  # new pointer: captured again
        assert g.captures == 2
        assert rel_err(out2.cpu().numpy(), want) < tol[d]
        getattr(graphed, call)(*args, out, alpha=2.0)  # new alpha: captured again
        assert g.captures == 3
        assert rel_err(out.cpu().numpy(), 2 * want) < tol[d]


def test_fallback_under_a_tiny_allocation_limit(be):
    p = ConvProblem((16, 16, 12, 12), (32, 16, 3, 3), padding=1, math="fma")
    rng = np.random.default_rng(9)
    x, w, y = normal_tensors(p, rng)
    forced = {}
    for d in Direction:
        needy = [a for a in algos_at(be, p, d, 16)
                 if be.workspace_size(p, d, a[0], a[1]) > 4096]
        if needy:
            forced[d] = make_plan([MicroBatch(0, 16, needy[0][0], needy[0][1])],
                                  undivided_time_ms=1, workspace_limit=None)
    assert forced, "no cuDNN algorithm needs workspace for this problem"
    conv = conv_for(be, p, plans=forced, workspace_limit=64 << 20)
    pool = get_pool(conv.backend)  # NumPy arrays in: the call runs on the home stream
    old = pool.limit_bytes
    pool.limit_bytes = 4096
    try:
        for d in forced:
            with pytest.warns(WorkspaceFallbackWarning):
                out = run_direction(conv, d, x, w, y, 1.0, 0.0, poison=True)
            assert conv.plans[d].workspace_bytes <= 4096
            assert rel_err(out, reference(p, d, x, w, y)) < FMA_REF
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                out = run_direction(conv, d, x, w, y, 1.0, 0.0)
            assert rel_err(out, reference(p, d, x, w, y)) < FMA_REF
    finally:
        pool.limit_bytes = old


def test_conv2d_on_gpu_reuses_plans(be, torch):
    rng = np.random.default_rng(10)
    x, w, y = normal_tensors(P, rng)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    r1 = conv2d(tx, tw, padding=1, math="fma", backend=be, workspace_limit=1 << 20)
    r2 = conv2d(tx, tw, padding=1, math="fma", backend=be, workspace_limit=1 << 20)
    assert rel_err(r1.cpu().numpy(), reference(P, "forward", x, w, y)) < FMA_REF
    assert torch.equal(r1, r2)


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
def test_conv1d_on_gpu_arrays_matches_torch_float64(be, torch, layout):
    """Note [1-D arrays as height-1 views] on a GPU: torch CUDA tensors in,
    a torch tensor out; DeviceArrays in, written into a given DeviceArray; the
    three directions against torch's float64 conv1d and its gradients."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((16, 8, 301)).astype(np.float32)
    w = rng.standard_normal((12, 4, 5)).astype(np.float32)
    kw = dict(stride=2, padding=2, dilation=3, groups=2)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    yt = torch.nn.functional.conv1d(xt, wt, **kw)
    dy = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.tensor(dy, dtype=torch.float64))

    def lay(a):
        return np.ascontiguousarray(a.transpose(0, 2, 1)) if layout == "NLC" else a

    opts = dict(kw, layout=layout, math="fma", backend=be, workspace_limit=1 << 20)
    cx, cw, cdy = (torch.from_numpy(lay(a)).cuda() for a in (x, w, dy))
    got = mu.conv1d(cx, cw, **opts)
    assert isinstance(got, torch.Tensor) and got.is_cuda
    assert rel_err(got.cpu().numpy(), lay(yt.detach().numpy())) < FMA_REF
    dx = mu.conv_backward_data(cdy, cw, tuple(cx.shape), **opts)
    assert rel_err(dx.cpu().numpy(), lay(xt.grad.numpy())) < FMA_REF
    dw = mu.conv_backward_filter(cx, cdy, tuple(cw.shape), **opts)
    assert rel_err(dw.cpu().numpy(), lay(wt.grad.numpy())) < 10 * FMA_REF
    ax, aw = (DeviceArray.from_numpy(lay(a)) for a in (x, w))
    out = DeviceArray(tuple(got.shape), "float32")
    assert mu.conv1d(ax, aw, out=out, **opts) is out
    assert rel_err(out.to_numpy(), lay(yt.detach().numpy())) < FMA_REF


@pytest.mark.parametrize("nd,layout", [(1, "NLC"), (2, "NCHW"), (2, "NHWC"), (3, "NDHWC")])
def test_conv_transpose_on_gpu_arrays_matches_torch_float64(be, torch, nd, layout):
    """Note [transposed convolutions on arrays] on a GPU: torch CUDA tensors in,
    a torch tensor out, within a 1 MiB cap; DeviceArrays in, written into a
    given DeviceArray; against torch's float64 transposed convolution."""
    rng = np.random.default_rng(13)
    spatial = {1: (301,), 2: (29, 31), 3: (9, 10, 11)}[nd]
    x = rng.standard_normal((16, 8) + spatial).astype(np.float32)
    w = rng.standard_normal((8, 6) + (3,) * nd).astype(np.float32)
    kw = dict(stride=2, padding=1, output_padding=1, dilation=1, groups=2)
    theirs = getattr(torch.nn.functional, f"conv_transpose{nd}d")
    want = theirs(torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64),
                  **kw).numpy()

    def lay(a):
        return np.ascontiguousarray(np.moveaxis(a, 1, -1)) if layout[-1] == "C" else a

    ours = getattr(mu, f"conv_transpose{nd}d")
    opts = dict(kw, layout=layout, math="fma", backend=be, workspace_limit=1 << 20)
    got = ours(torch.from_numpy(lay(x)).cuda(), torch.from_numpy(lay(w)).cuda(), **opts)
    assert isinstance(got, torch.Tensor) and got.is_cuda
    assert rel_err(got.cpu().numpy(), lay(want)) < FMA_REF
    ax, aw = (DeviceArray.from_numpy(lay(a)) for a in (x, w))
    out = DeviceArray(tuple(got.shape), "float32")
    assert ours(ax, aw, out=out, **opts) is out
    assert rel_err(out.to_numpy(), lay(want)) < FMA_REF


# -- the warm path notices every change --------------------------------------------------------

def test_bound_plans_are_reused_and_every_change_is_noticed(be, torch):
    """Repeated calls run the launchers bound once (pointers are arguments); new
    scalars bind again; a new output, new input data, another dtype, shape or
    contiguity is noticed (right result, or the full path's error)."""
    p = ConvProblem((12, 16, 9, 9), (24, 16, 3, 3), padding=1, math="fma")
    plan = plan_of(be, p, Direction.FORWARD, [8, 4])
    rng = np.random.default_rng(11)
    x, w, y = normal_tensors(p, rng)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    conv = conv_for(be, p, plans={Direction.FORWARD: plan})
    k = conv.kernel(Direction.FORWARD)
    out = torch.empty(p.output_shape, device="cuda")
    want = reference(p, Direction.FORWARD, x, w, y)
    for _i in range(3):
        out.fill_(float("nan"))
        assert conv.forward(tx, tw, out) is out
        assert rel_err(out.cpu().numpy(), want) < FMA_REF
    assert len(k._bound) == 1 and Direction.FORWARD in conv._fast
    conv.forward(tx, tw, out, alpha=0.5, beta=1.0)  # new scalars: bound again, once
    assert len(k._bound) == 2
    assert rel_err(out.cpu().numpy(), 1.5 * want) < FMA_REF
    out2 = torch.full_like(out, float("nan"))
    conv.forward(tx, tw, out2)  # new output pointer: no rebinding
    assert len(k._bound) == 2 and rel_err(out2.cpu().numpy(), want) < FMA_REF
    tx3 = tx * 3  # new input pointer and data
    assert rel_err(conv.forward(tx3, tw).cpu().numpy(), 3 * want) < FMA_REF
    with pytest.raises(ValueError, match="^x: expected dtype float32"):
        conv.forward(tx.half(), tw)
    with pytest.raises(ValueError, match="^x: expected shape"):
        conv.forward(tx[:6], tw)
    with pytest.raises(ValueError, match="^w: expected a C-contiguous"):
        conv.forward(tx, tw.transpose(2, 3))
    big = torch.zeros(tx.numel() + out.numel(), device="cuda")
    x_in = big[:tx.numel()].view(tx.shape).copy_(tx)
    with pytest.raises(ValueError, match="^y: overlaps x"):
        conv.forward(x_in, tw, big[tx.numel() // 2:tx.numel() // 2 + out.numel()].view(out.shape))
    assert rel_err(conv.forward(tx, tw).cpu().numpy(), want) < FMA_REF  # still warm and right


def test_calls_run_on_torchs_current_stream(be, torch):
    """Inside ``torch.cuda.stream(s)`` a call is issued on s: queued behind s's work,
    with no host wait and no event, and right once s is done."""
    p = ConvProblem((16, 32, 14, 14), (32, 32, 3, 3), padding=1, math="fma")
    rng = np.random.default_rng(12)
    x, w, y = normal_tensors(p, rng)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    conv = conv_for(be, p, workspace_limit=1 << 20)
    want = reference(p, Direction.FORWARD, x, w, y)
    conv.forward(tx, tw)  # plan and bind outside
    s = torch.cuda.Stream()
    out = torch.full(p.output_shape, float("nan"), device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # keep s busy (a GPU spin of ~0.1 s)
        conv.forward(tx, tw, out)
        assert not s.query()  # queued on s, behind the sleep: the host did not wait
    snapshot = out.clone()  # on the default stream, not ordered after s
    torch.cuda.current_stream().synchronize()
    assert torch.isnan(snapshot).all(), "the call did not wait for s's earlier work"
    s.synchronize()
    assert rel_err(out.cpu().numpy(), want) < FMA_REF


def test_workspace_comes_from_torch_for_torch_calls(be, torch):
    """With torch tensors the workspace comes from torch's caching allocator, in
    one buffer kept per device and stream (Note [torch workspace]), not from
    mucudnn's pool: allocated by the first call, counted in
    ``torch.cuda.memory_allocated``, reused by the next calls on the stream,
    dropped by ``release_torch_workspaces``; another stream gets its own."""
    p = ConvProblem((32, 64, 28, 28), (64, 64, 3, 3), padding=1)
    conv = conv_for(be, p, workspace_limit=64 << 20)
    tx = torch.randn(p.x_shape, device="cuda")
    tw = torch.randn(p.w_shape, device="cuda")
    conv.forward(tx, tw)
    need = conv.plans[Direction.FORWARD].workspace_bytes
    if need == 0:
        pytest.skip("the plan needs no workspace")
    pool = conv.pool
    before = pool.size
    torch.cuda.synchronize()
    release_torch_workspaces()
    assert torch_workspace_bytes() == 0
    base = torch.cuda.memory_allocated()
    y = conv.forward(tx, tw)
    torch.cuda.synchronize()
    kept = torch_workspace_bytes(torch.cuda.current_device())
    assert need <= kept < 2 * max(need, 1 << 20)
    assert torch.cuda.memory_allocated() - base == kept + y.numel() * 4
    assert pool.size == before  # the pool did not grow for it
    del y
    base = torch.cuda.memory_allocated()
    y2 = conv.forward(tx, tw)  # the kept buffer again: only the output is new
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - base == y2.numel() * 4
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y3 = conv.forward(tx, tw)  # a buffer of its own for stream s
    s.synchronize()
    assert torch_workspace_bytes() == 2 * kept
    assert rel_err(y3.cpu().numpy(), y2.cpu().numpy()) < 1e-6
    assert release_torch_workspaces() == 2 * kept and torch_workspace_bytes() == 0


def test_torch_workspace_grows_to_the_largest_need(torch):
    """The kept buffer grows in powers of two from 1 MiB; an outgrown buffer is
    retired, not freed, until release (Note [torch workspace])."""
    dev = torch.device("cuda", torch.cuda.current_device())
    release_torch_workspaces()
    ws = torch_workspace(dev)
    assert torch_workspace(torch.device("cuda")) is ws  # one per device
    keep, a1, n1 = ws(1000)
    assert keep is None and n1 == 1 << 20
    assert ws(n1)[1:] == (a1, n1)  # fits: the same buffer
    keep, a2, n2 = ws((3 << 20) + 1)
    assert n2 == 4 << 20 and ws.held_bytes == n1 + n2
    assert ws(5)[1:] == (a2, n2)
    assert ws.release() == n1 + n2 and ws.held_bytes == 0


@pytest.mark.skipif("not __import__('mucudnn').cuda.device_count() > 1", reason="needs two GPUs")
def test_a_tensor_on_another_device_is_refused(be, torch):
    conv = conv_for(be, P, workspace_limit=1 << 20)
    tx = torch.zeros(P.x_shape, device="cuda:1")
    tw = torch.zeros(P.w_shape, device="cuda:1")
    with pytest.raises(ValueError, match="is on CUDA device 1"):
        conv.forward(tx, tw)
