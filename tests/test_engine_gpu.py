"""The execution engine and public API on cuDNN (marker ``gpu``; skipped without a GPU).

Same properties as the CPU tests, on get_backend("cudnn"): micro-batched == unsplit
and == the float64 reference (FMA math float32: forward/backward-data < 1e-6 vs
unsplit, backward-filter < 1e-5; vs reference < 1e-5, default math < 5e-3), forced
plans mixing sizes and algorithms, alpha/beta, torch and CuPy-style
(__cuda_array_interface__) round trips, the MicroBatchHandle path with real
descriptors and int pointers, graph replay, and the run-time fallback.

Run: ``HYPOTHESIS_PROFILE=gpu python -m pytest -q -m gpu tests/test_engine_gpu.py``
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mucudnn.api import conv2d
from mucudnn.backends import get_backend
from mucudnn.exec import (MicroBatchHandle, WorkspaceFallbackWarning, get_pool,
                          problem_from_descriptors)
from mucudnn.problem import ConvProblem, Direction, MicroBatch, from_canonical, make_plan

from conv_support import convolution_for, normal_tensors, run_direction
from reference import reference, rel_err

pytestmark = pytest.mark.gpu

FMA_SPLIT = {Direction.FORWARD: 1e-6, Direction.BACKWARD_DATA: 1e-6,
             Direction.BACKWARD_FILTER: 1e-5}
FMA_REF = 1e-5
DEFAULT_REF = 5e-3


@pytest.fixture(scope="module")
def be():
    return get_backend("cudnn")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.delenv("MUCUDNN_WORKSPACE_LIMIT", raising=False)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


conv_for = functools.partial(convolution_for, backend="cudnn")


_ALGOS: dict = {}


def algos_at(be, p, d, size):
    """(algo, math_type, workspace) that cuDNN ran for p at micro-batch ``size``."""
    key = (p.key(), d, size)
    if key not in _ALGOS:
        _ALGOS[key] = [(a.algo, a.math_type) for a in be.find(p.with_batch(size), d, 256 << 20)]
    return _ALGOS[key]


@st.composite
def problems(draw, batch=None):
    nd = draw(st.sampled_from([2, 2, 2, 3]))
    cl = draw(st.booleans())
    layout = {(2, False): "NCHW", (2, True): "NHWC", (3, False): "NCDHW", (3, True): "NDHWC"}[(nd, cl)]
    n = batch if batch is not None else draw(st.sampled_from([1, 2, 5, 8, 13]))
    big = n > 16
    groups = draw(st.integers(1, 1 if big else 2))
    cg = draw(st.integers(1, 4 if big else 8))
    kg = draw(st.integers(1, 4 if big else 8))
    r = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dil = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    pad = tuple(draw(st.integers(0, 2)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    smax = (6 if big else 10) if nd == 2 else 5
    spatial = []
    for ri, di, pi in zip(r, dil, pad):
        lo = max(1, di * (ri - 1) + 1 - 2 * pi)
        spatial.append(draw(st.integers(lo, max(lo, smax))))
    return ConvProblem(from_canonical((n, groups * cg) + tuple(spatial), layout),
                       from_canonical((groups * kg, cg) + r, layout), stride=stride,
                       padding=pad, dilation=dil, groups=groups, layout=layout, math="fma")


def composition(draw, n, parts=4):
    out, left = [], n
    while left:
        s = left if len(out) == parts - 1 else draw(st.integers(1, left))
        out.append(s)
        left -= s
    return out


SCALARS = st.sampled_from([(1.0, 0.0), (2.0, 0.0), (0.5, 1.0), (-1.5, 0.25)])


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_same_algo_split_equals_unsplit_and_reference(be, data):
    """One algorithm for every micro-batch and for the unsplit call: only the split differs."""
    p = data.draw(problems())
    d = data.draw(st.sampled_from(list(Direction)))
    sizes = composition(data.draw, p.batch)
    common = set(algos_at(be, p, d, p.batch))
    for s in set(sizes):
        common &= set(algos_at(be, p, d, s))
    if not common:
        return
    algo, math = data.draw(st.sampled_from(sorted(common)))
    mbs, off = [], 0
    for s in sizes:
        mbs.append(MicroBatch(off, s, algo, math))
        off += s
    plan = make_plan(mbs, undivided_time_ms=1, workspace_limit=None)
    whole = make_plan([MicroBatch(0, p.batch, algo, math)], undivided_time_ms=1,
                      workspace_limit=None)
    alpha, beta = data.draw(SCALARS)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    x, w, y = normal_tensors(p, rng)
    micro = run_direction(conv_for(p, plans={d: plan}), d, x, w, y, alpha, beta, poison=True)
    unsplit = run_direction(conv_for(p, plans={d: whole}), d, x, w, y, alpha, beta)
    assert rel_err(micro, unsplit) < FMA_SPLIT[d], (p, d, algo, sizes)
    assert rel_err(micro, reference(p, d, x, w, y, alpha, beta)) < FMA_REF, (p, d, algo)


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_mixed_algorithms_equal_reference(be, data):
    p = data.draw(problems())
    d = data.draw(st.sampled_from(list(Direction)))
    sizes = composition(data.draw, p.batch)
    mbs, off = [], 0
    for s in sizes:
        choices = algos_at(be, p, d, s)
        algo, math = data.draw(st.sampled_from(choices))
        mbs.append(MicroBatch(off, s, algo, math))
        off += s
    alpha, beta = data.draw(SCALARS)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    x, w, y = normal_tensors(p, rng)
    plan = make_plan(mbs, undivided_time_ms=1, workspace_limit=None)
    micro = run_direction(conv_for(p, plans={d: plan}), d, x, w, y, alpha, beta, poison=True)
    assert np.isfinite(micro).all()
    assert rel_err(micro, reference(p, d, x, w, y, alpha, beta)) < FMA_REF, (p, d, mbs)


@pytest.mark.parametrize("batch", [1, 7, 37, 100])
def test_batch_sizes_with_optimised_plans(be, batch):
    p = ConvProblem((batch, 8, 6, 6), (8, 8, 3, 3), padding=1, math="fma")
    conv = conv_for(p, workspace_limit=1 << 20, policy="powerOfTwo")
    rng = np.random.default_rng(batch)
    x, w, y = normal_tensors(p, rng)
    for d in Direction:
        out = run_direction(conv, d, x, w, y, 1.0, 0.0, poison=True)
        assert conv.plans[d].batch == batch and conv.plans[d].workspace_bytes <= 1 << 20
        assert rel_err(out, reference(p, d, x, w, y)) < FMA_REF


def test_default_math_against_reference(be):
    p = ConvProblem((32, 16, 9, 9), (32, 16, 3, 3), padding=1)
    conv = conv_for(p, workspace_limit=4 << 20)
    rng = np.random.default_rng(1)
    x, w, y = normal_tensors(p, rng)
    for d in Direction:
        assert rel_err(run_direction(conv, d, x, w, y, 0.5, 1.0),
                       reference(p, d, x, w, y, 0.5, 1.0)) < DEFAULT_REF


def test_backward_filter_beta_zero_with_nan_dw(be):
    p = ConvProblem((16, 4, 7, 7), (8, 4, 3, 3), padding=1, math="fma")
    plan = make_plan([MicroBatch(0, 8, 0), MicroBatch(8, 4, 1), MicroBatch(12, 4, 0)],
                     undivided_time_ms=1, workspace_limit=None)
    conv = conv_for(p, plans={Direction.BACKWARD_FILTER: plan})
    rng = np.random.default_rng(2)
    x, w, y = normal_tensors(p, rng)
    dw = run_direction(conv, Direction.BACKWARD_FILTER, x, w, y, 1.0, 0.0, poison=True)
    assert np.isfinite(dw).all()
    assert rel_err(dw, reference(p, Direction.BACKWARD_FILTER, x, w, y)) < FMA_REF


# -- array kinds -----------------------------------------------------------------------------

P = ConvProblem((12, 8, 10, 10), (16, 8, 3, 3), padding=1, math="fma")


def test_torch_round_trip_is_zero_copy(be, torch):
    rng = np.random.default_rng(3)
    x, w, y = normal_tensors(P, rng)
    conv = conv_for(P, workspace_limit=1 << 20)
    tx, tw, ty = (torch.from_numpy(a).cuda() for a in (x, w, y))
    out = torch.full(P.output_shape, float("nan"), device="cuda")
    ptr = out.data_ptr()
    r = conv.forward(tx, tw, out)
    assert r is out and r.data_ptr() == ptr
    # No explicit synchronisation: torch's stream is ordered after ours.
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
    conv = conv_for(P, workspace_limit=1 << 20)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    ty = torch.empty(P.output_shape, device="cuda")
    cy = CupyLike(ty, version)
    r = conv.forward(CupyLike(tx, version), CupyLike(tw, version), cy)
    assert r is cy
    assert rel_err(ty.cpu().numpy(), reference(P, "forward", x, w, y)) < FMA_REF
    r2 = conv.forward(CupyLike(tx, version), CupyLike(tw, version))  # no output: a DeviceArray
    from mucudnn.cuda import DeviceArray

    assert isinstance(r2, DeviceArray)
    assert rel_err(r2.to_numpy(), reference(P, "forward", x, w, y)) < FMA_REF


def test_device_arrays_and_numpy_on_gpu(be):
    from mucudnn.cuda import DeviceArray

    rng = np.random.default_rng(5)
    x, w, y = normal_tensors(P, rng)
    conv = conv_for(P, workspace_limit=1 << 20)
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
    conv = conv_for(P, workspace_limit=1 << 20)
    tx = torch.zeros(P.x_shape, device="cuda")
    tw = torch.zeros(P.w_shape, device="cuda")
    with pytest.raises(ValueError, match="^x: expected a C-contiguous device array"):
        conv.forward(torch.zeros(P.x_shape[::-1], device="cuda").permute(3, 2, 1, 0), tw)
    with pytest.raises(ValueError, match="^w: expected dtype float32"):
        conv.forward(tx, tw.double())
    with pytest.raises(ValueError, match=r"^y: expected shape"):
        conv.forward(tx, tw, torch.zeros((1, 2), device="cuda"))
    with pytest.raises(TypeError, match="^x: a CPU torch tensor"):
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
    h = MicroBatchHandle("cudnn", workspace_limit=1 << 20)
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

    h = MicroBatchHandle("cudnn", workspace_limit=64 << 20)
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
    plan = make_plan([MicroBatch(0, 8, 1), MicroBatch(8, 4, 0), MicroBatch(12, 4, 1)],
                     undivided_time_ms=1, workspace_limit=None)
    rng = np.random.default_rng(8)
    x, w, y = normal_tensors(p, rng)
    tx, tw, ty = (torch.from_numpy(a).cuda() for a in (x, w, y))
    tol = {Direction.FORWARD: 1e-6, Direction.BACKWARD_DATA: 1e-6, Direction.BACKWARD_FILTER: 1e-5}
    for d in Direction:
        plain = conv_for(p, plans={d: plan})
        graphed = conv_for(p, plans={d: plan}, graph=True)
        assert graphed.graph_active
        args = {Direction.FORWARD: (tx, tw), Direction.BACKWARD_DATA: (ty, tw),
                Direction.BACKWARD_FILTER: (tx, ty)}[d]
        call = {Direction.FORWARD: "forward", Direction.BACKWARD_DATA: "backward_data",
                Direction.BACKWARD_FILTER: "backward_filter"}[d]
        want = getattr(plain, call)(*args).cpu().numpy()
        out = torch.empty_like(torch.from_numpy(want)).cuda()
        for i in range(3):
            out.fill_(float("nan"))
            getattr(graphed, call)(*args, out)
            # Note: graph and plain runs may differ by rounding where an algorithm
            # is non-deterministic (atomics in backward passes); judge by norm.
            assert rel_err(out.cpu().numpy(), want) < tol[d]
        g = graphed.kernel(d).graphs
        assert g.captures == 1 and g.replays == 3
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
    conv = conv_for(p, plans=forced, workspace_limit=64 << 20)
    pool = get_pool(conv.backend)
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
    r1 = conv2d(tx, tw, padding=1, math="fma", backend="cudnn", workspace_limit=1 << 20)
    r2 = conv2d(tx, tw, padding=1, math="fma", backend="cudnn", workspace_limit=1 << 20)
    assert rel_err(r1.cpu().numpy(), reference(P, "forward", x, w, y)) < FMA_REF
    assert torch.equal(r1, r2)


def test_bound_launchers_are_reused_and_correct(be, torch):
    """A repeated call with the same pointers runs a launcher bound once;
    new pointers or scalars bind a new one; every result stays right."""
    p = ConvProblem((12, 16, 9, 9), (24, 16, 3, 3), padding=1, math="fma")
    plan = make_plan([MicroBatch(0, 8, 1), MicroBatch(8, 4, 0)], undivided_time_ms=1,
                     workspace_limit=None)
    rng = np.random.default_rng(11)
    x, w, y = normal_tensors(p, rng)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    conv = conv_for(p, plans={Direction.FORWARD: plan})
    out = torch.empty(p.output_shape, device="cuda")
    want = reference(p, Direction.FORWARD, x, w, y)
    for i in range(3):
        out.fill_(float("nan"))
        conv.forward(tx, tw, out)
        assert rel_err(out.cpu().numpy(), want) < FMA_REF
    cache = conv.kernel(Direction.FORWARD)._launchers
    assert cache is not None and len(cache) == 1
    conv.forward(tx, tw, out, alpha=0.5, beta=1.0)  # new scalars: a second launcher
    assert len(cache) == 2
    assert rel_err(out.cpu().numpy(), 1.5 * want) < FMA_REF
    out2 = torch.empty_like(out)
    conv.forward(tx, tw, out2)  # new pointer: a third
    assert len(cache) == 3
    assert rel_err(out2.cpu().numpy(), want) < FMA_REF
