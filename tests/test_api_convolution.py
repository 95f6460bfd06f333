"""mucudnn.api on the NumPy backend: micro-batched == unsplit == float64 reference for
random problems and forced plans mixing sizes and algorithms; lazy planning; validation
before any backend call; the functional helpers."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mucudnn import api
from mucudnn.api import (Convolution, conv2d, conv3d, conv_backward_data,
                         conv_backward_filter)
from mucudnn.backends import get_backend
from mucudnn.exec import WorkspaceFallbackWarning
from mucudnn.problem import ConvProblem, Direction, MicroBatch, from_canonical, make_plan

from conftest import needs_cudnn
from conv_support import AtomicNumpyBackend, convolution_for, normal_tensors, run_direction
from reference import reference, rel_err
from test_exec_engine import Spy

NP = get_backend("numpy")
ALGOS = (0, 1, 2)


pytestmark = pytest.mark.usefixtures("cache_off")


# -- strategies ------------------------------------------------------------------------------

@st.composite
def problems(draw, batch=None):
    nd = draw(st.sampled_from([2, 2, 2, 3]))
    channels_last = draw(st.booleans())
    layout = {(2, False): "NCHW", (2, True): "NHWC", (3, False): "NCDHW",
              (3, True): "NDHWC"}[(nd, channels_last)]
    n = batch if batch is not None else draw(st.sampled_from([1, 2, 3, 5, 7, 8, 13]))
    big = n > 16
    groups = draw(st.integers(1, 1 if big else 3))
    cg = draw(st.integers(1, 2 if big else 3))
    kg = draw(st.integers(1, 2 if big else 3))
    smax = (4 if big else 6) if nd == 2 else 3
    r = tuple(draw(st.integers(1, 3 if nd == 2 else 2)) for _ in range(nd))
    dil = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    pad = tuple(draw(st.integers(0, 2)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    spatial = []
    for ri, di, pi in zip(r, dil, pad):
        lo = max(1, di * (ri - 1) + 1 - 2 * pi)
        spatial.append(draw(st.integers(lo, max(lo, smax))))
    x = from_canonical((n, groups * cg) + tuple(spatial), layout)
    w = from_canonical((groups * kg, cg) + r, layout)
    return ConvProblem(x, w, stride=stride, padding=pad, dilation=dil, groups=groups,
                       layout=layout)


@st.composite
def forced_plans(draw, batch, direction):
    """A random composition of ``batch`` into up to 6 parts, each with a random algorithm."""
    parts = []
    left = batch
    while left:
        if len(parts) == 5:
            s = left
        else:
            s = draw(st.integers(1, left))
        parts.append(s)
        left -= s
    mbs, off = [], 0
    for s in parts:
        mbs.append(MicroBatch(off, s, draw(st.sampled_from(ALGOS))))
        off += s
    return make_plan(mbs, undivided_time_ms=1.0, workspace_limit=None, direction=direction)


SCALARS = st.sampled_from([(1.0, 0.0), (2.0, 0.0), (0.5, 1.0), (-1.5, 0.25), (1.0, 1.0)])


conv_for = functools.partial(convolution_for, backend="numpy")


# -- properties -------------------------------------------------------------------------------

@pytest.mark.slow
@settings(max_examples=max(300, settings.default.max_examples))
@given(st.data())
def test_forced_plans_equal_unsplit_and_reference(data):
    p = data.draw(problems())
    d = data.draw(st.sampled_from(list(Direction)))
    plan = data.draw(forced_plans(p.batch, d))
    alpha, beta = data.draw(SCALARS)
    seed = data.draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    x, w, y = normal_tensors(p, rng)
    micro = run_direction(conv_for(p, plans={d: plan}), d, x, w, y, alpha, beta, poison=True)
    whole = make_plan([MicroBatch(0, p.batch, data.draw(st.sampled_from(ALGOS)))],
                      undivided_time_ms=1.0, workspace_limit=None)
    unsplit = run_direction(conv_for(p, plans={d: whole}), d, x, w, y, alpha, beta)
    ref = reference(p, d, x, w, y, alpha, beta)
    assert np.isfinite(micro).all()
    assert rel_err(micro, unsplit) < 1e-5, (p, d, plan.describe())
    assert rel_err(micro, ref) < 1e-5, (p, d, plan.describe())


@settings(max_examples=max(40, settings.default.max_examples // 2))
@given(st.data())
@pytest.mark.parametrize("batch", [1, 7, 37, 100])
def test_big_and_odd_batches(batch, data):
    p = data.draw(problems(batch=batch))
    d = data.draw(st.sampled_from(list(Direction)))
    plan = data.draw(forced_plans(batch, d))
    alpha, beta = data.draw(SCALARS)
    rng = np.random.default_rng(batch)
    x, w, y = normal_tensors(p, rng)
    micro = run_direction(conv_for(p, plans={d: plan}), d, x, w, y, alpha, beta, poison=True)
    assert rel_err(micro, reference(p, d, x, w, y, alpha, beta)) < 1e-5


@pytest.mark.parametrize("batch", [1, 7, 37, 100])
def test_lazily_optimised_plans(batch):
    p = ConvProblem((batch, 3, 5, 5), (4, 3, 3, 3), padding=1)
    # A limit below im2col's need at the full batch forces splits (or algo 0).
    limit = NP.workspace_size(p.with_batch(max(1, batch // 3)), Direction.FORWARD, 1)
    conv = conv_for(p, workspace_limit=limit, policy="powerOfTwo")
    assert conv.plans == {}
    rng = np.random.default_rng(11)
    x, w, y = normal_tensors(p, rng)
    for d in Direction:
        out = run_direction(conv, d, x, w, y, 1.0, 0.0, poison=True)
        plan = conv.plans[d]
        assert plan.batch == batch and plan.direction is d and plan.problem == p
        assert plan.workspace_bytes <= limit
        assert rel_err(out, reference(p, d, x, w, y)) < 1e-5
    assert set(conv.plans) == set(Direction)
    # A second Convolution of the same problem reuses the in-memory plans.
    conv2 = conv_for(p, workspace_limit=limit, policy="powerOfTwo")
    assert conv2.plan(Direction.FORWARD) is conv.plans[Direction.FORWARD]


def test_defaults_and_returned_kinds():
    p = ConvProblem((4, 2, 5, 5), (3, 2, 3, 3), padding=1)
    conv = conv_for(p)
    rng = np.random.default_rng(12)
    x, w, y = normal_tensors(p, rng)
    y1 = conv.forward(x, w)
    assert isinstance(y1, np.ndarray) and y1.shape == p.output_shape and y1.dtype == np.float32
    assert rel_err(y1, reference(p, "forward", x, w, y)) < 1e-5
    dx = conv.backward_data(y, w)
    assert dx.shape == p.x_shape
    dw = conv.backward_filter(x, y)
    assert dw.shape == p.w_shape
    assert rel_err(dw, reference(p, "backward_filter", x, w, y)) < 1e-5
    assert conv(x, w).shape == p.output_shape


def test_non_contiguous_numpy_inputs_are_copied():
    p = ConvProblem((4, 2, 5, 5), (3, 2, 3, 3))
    rng = np.random.default_rng(13)
    big = rng.standard_normal((8, 2, 5, 5)).astype(np.float32)
    x = big[::2]
    assert not x.flags.c_contiguous
    w = rng.standard_normal(p.w_shape).astype(np.float32)
    y = conv_for(p).forward(x, w)
    assert rel_err(y, reference(p, "forward", x, w, None)) < 1e-5


def test_graph_true_is_a_no_op_on_numpy():
    p = ConvProblem((6, 2, 4, 4), (2, 2, 3, 3), padding=1)
    conv = conv_for(p, graph=True)
    assert not conv.graph_active
    rng = np.random.default_rng(14)
    x, w, y = normal_tensors(p, rng)
    assert rel_err(conv.forward(x, w), reference(p, "forward", x, w, y)) < 1e-5


def test_fallback_through_the_api(monkeypatch):
    p = ConvProblem((8, 3, 6, 6), (4, 3, 3, 3), padding=1)
    forced = {d: make_plan([MicroBatch(0, 4, 1), MicroBatch(4, 4, 2)], undivided_time_ms=1,
                           workspace_limit=None) for d in Direction}
    conv = conv_for(p, plans=forced)
    rng = np.random.default_rng(15)
    x, w, y = normal_tensors(p, rng)
    monkeypatch.setenv("MUCUDNN_WORKSPACE_LIMIT", "64")
    conv.pool.release()  # the variable is read when the pool allocates
    for d in Direction:
        with pytest.warns(WorkspaceFallbackWarning):
            out = run_direction(conv, d, x, w, y, 1.0, 0.0, poison=True)
        assert rel_err(out, reference(p, d, x, w, y)) < 1e-5
        assert conv.plans[d].workspace_bytes <= 64
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = run_direction(conv, d, x, w, y, 0.5, 1.0)
        assert rel_err(out, reference(p, d, x, w, y, 0.5, 1.0)) < 1e-5


# -- validation before any backend call ----------------------------------------------------------

class FakeCAI:
    """Something that looks like a device array (no device behind it)."""

    def __init__(self, shape, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (1 << 20, False), "version": 2,
                                         "strides": None}


P = ConvProblem((4, 2, 5, 5), (2, 2, 3, 3), padding=1)  # y has x's shape


def _args():
    rng = np.random.default_rng(16)
    return normal_tensors(P, rng)


def _bad_cases():
    x, w, y = _args()
    ro = y.copy()
    ro.flags.writeable = False
    F, BD, BF = "forward", "backward_data", "backward_filter"
    return [
        ("x-shape", F, (x[:3], w), {}, ValueError, r"x: expected shape \(4, 2, 5, 5\).*got \(3, 2, 5, 5\)"),
        ("w-shape", F, (x, w[:1]), {}, ValueError, r"^w: expected shape"),
        ("y-shape", F, (x, w, y[:, :1].copy()), {}, ValueError, r"^y: expected shape"),
        ("x-dtype", F, (x.astype(np.float64), w), {}, ValueError, r"^x: expected dtype float32"),
        ("y-dtype", F, (x, w, y.astype(np.float16)), {}, ValueError, r"^y: expected dtype"),
        ("x-list", F, (x.tolist(), w), {}, TypeError, r"^x: expected a NumPy array"),
        ("alpha", F, (x, w), {"alpha": "2"}, TypeError, r"^alpha"),
        ("beta-no-y", F, (x, w), {"beta": 1.0}, ValueError, r"^y: beta=1.0"),
        ("y-noncontig", F, (x, w, np.empty((4, 2, 5, 10), np.float32)[..., ::2]), {}, ValueError,
         r"^y: expected a C-contiguous"),
        ("y-readonly", F, (x, w, ro), {}, ValueError, r"^y: the output array is read-only"),
        ("y-aliases-x", F, (x, w, x), {}, ValueError, r"^y: overlaps x"),
        ("device-on-numpy", F, (FakeCAI(P.x_shape), FakeCAI(P.w_shape)), {}, TypeError,
         r"^x: the spy backend takes NumPy arrays"),
        ("mixed-kinds", F, (x, FakeCAI(P.w_shape)), {}, TypeError, r"x is a NumPy array but w"),
        ("dy-shape", BD, (y[:2], w), {}, ValueError, r"^dy: expected shape"),
        ("dx-shape", BD, (y, w, x[:1].copy()), {}, ValueError, r"^dx: expected shape"),
        ("bd-beta", BD, (y, w), {"beta": 0.5}, ValueError, r"^dx: beta"),
        ("bf-dy", BF, (x, y[:, :1]), {}, ValueError, r"^dy: expected shape"),
        ("dw-shape", BF, (x, y, w[:1].copy()), {}, ValueError, r"^dw: expected shape"),
        ("dw-dtype", BF, (x, y, w.astype(np.float64)), {}, ValueError, r"^dw: expected dtype"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_validation_happens_before_any_backend_call(case):
    _, method, args, kwargs, exc, pattern = case
    spy = Spy()
    conv = Convolution(P.x_shape, P.w_shape, padding=1, backend=spy)
    with pytest.raises(exc, match=pattern):
        getattr(conv, method)(*args, **kwargs)
    assert spy.calls == []
    assert conv.plans == {}


def test_spy_sees_only_runs_after_planning():
    spy = Spy()
    conv = Convolution(P.x_shape, P.w_shape, padding=1, backend=spy, policy="powerOfTwo",
                       workspace_limit=1 << 20)
    x, w, y = _args()
    conv.forward(x, w)
    assert "find" in spy.names()
    spy.calls.clear()
    conv.forward(x, w)
    names = spy.names()
    assert "find" not in names and "synchronize" not in names
    assert names.count("run") == len(conv.plans[Direction.FORWARD].micro_batches)


def test_constructor_validation():
    with pytest.raises(ValueError, match="w_shape"):
        Convolution((2, 3, 5, 5), (4, 2, 3, 3), backend="numpy")
    with pytest.raises(ValueError, match="workspace_limit"):
        Convolution((2, 3, 5, 5), (4, 3, 3, 3), backend="numpy", workspace_limit=-1)
    with pytest.raises(TypeError, match="plans"):
        Convolution((2, 3, 5, 5), (4, 3, 3, 3), backend="numpy", plans={"forward": "2 x 1"})
    bad = make_plan([MicroBatch(0, 1, 0)], undivided_time_ms=1, workspace_limit=None)
    conv = Convolution((2, 3, 5, 5), (4, 3, 3, 3), backend="numpy", plans={"fwd": bad})
    with pytest.raises(ValueError, match="cover 1 rows"):
        conv.plan("forward")


def test_deterministic_convolution_and_handle_plan_deterministic_algorithms():
    """deterministic=True reaches the Planner: every direction runs DIRECT, the one
    algorithm AtomicNumpyBackend reports deterministic, although the others look
    1000x faster; the results are the same convolution."""
    be = AtomicNumpyBackend()
    p = ConvProblem((6, 3, 7, 7), (4, 3, 3, 3), padding=1)
    x, w, y = normal_tensors(p, np.random.default_rng(3))
    free = Convolution(p.x_shape, p.w_shape, padding=1, backend=be, workspace_limit=None)
    det = Convolution(p.x_shape, p.w_shape, padding=1, backend=be, workspace_limit=None,
                      deterministic=True)
    assert (free.deterministic, det.deterministic) == (False, True)
    assert det.planner.deterministic and not free.planner.deterministic
    for d in Direction:
        assert {m.algo for m in free.plan(d).micro_batches} <= {1, 2}
        assert {m.algo for m in det.plan(d).micro_batches} == {0}
    dy = np.ones(p.output_shape, np.float32)
    for got, ref_ in [(det.forward(x, w), reference(p, "forward", x, w, y)),
                      (det.backward_filter(x, dy), free.backward_filter(x, dy))]:
        assert rel_err(got, ref_) < 1e-5
    h = api.MicroBatchHandle(be, workspace_limit="1MiB", deterministic=True)
    assert h.deterministic and h.planner.deterministic
    joint = h.planner.plan_jointly({"c": (p, Direction.BACKWARD_FILTER)}, 1 << 20)
    assert {m.algo for m in joint["c"].micro_batches} == {0}
    assert not api.MicroBatchHandle(be).planner.deterministic


@pytest.mark.parametrize("bad", [1, None, "true", np.bool_(False)])
def test_deterministic_argument_is_checked_before_any_backend_call(bad):
    spy = Spy()
    with pytest.raises(TypeError, match=r"^deterministic: expected True or False"):
        Convolution(P.x_shape, P.w_shape, padding=1, backend=spy, deterministic=bad)
    with pytest.raises(TypeError, match=r"^deterministic: expected True or False"):
        api.MicroBatchHandle(spy, deterministic=bad)
    assert spy.calls == []


# -- functional helpers ----------------------------------------------------------------------------

def test_conv2d_matches_reference_and_reuses_its_convolution():
    api.clear_caches()
    spy = Spy()
    rng = np.random.default_rng(17)
    p = ConvProblem((6, 4, 7, 7), (6, 2, 3, 3), stride=2, padding=1, dilation=1, groups=2)
    x, w, y = normal_tensors(p, rng)
    y1 = conv2d(x, w, stride=2, padding=1, groups=2, backend=spy, workspace_limit=1 << 20)
    assert rel_err(y1, reference(p, "forward", x, w, y)) < 1e-5
    finds = spy.names().count("find")
    assert finds > 0
    y2 = conv2d(x, w, stride=2, padding=1, groups=2, backend=spy, workspace_limit=1 << 20)
    assert spy.names().count("find") == finds  # no re-planning
    np.testing.assert_array_equal(y1, y2)
    out = y.copy()
    r = conv2d(x, w, stride=2, padding=1, groups=2, backend=spy, workspace_limit=1 << 20,
               alpha=2.0, beta=0.5, out=out)
    assert r is out
    assert rel_err(out, reference(p, "forward", x, w, y, 2.0, 0.5)) < 1e-5
    with pytest.raises(ValueError, match="layout"):
        conv2d(x, w, layout="NCDHW", backend="numpy")


def test_conv2d_nhwc_and_conv3d():
    rng = np.random.default_rng(18)
    p = ConvProblem((3, 5, 6, 4), (2, 3, 3, 4), padding=(1, 0), layout="NHWC")
    x, w, y = normal_tensors(p, rng)
    r = conv2d(x, w, padding=(1, 0), layout="NHWC", backend="numpy")
    assert rel_err(r, reference(p, "forward", x, w, y)) < 1e-5
    p3 = ConvProblem((2, 2, 4, 4, 4), (3, 2, 2, 2, 2), stride=2, layout="NCDHW")
    x, w, y = normal_tensors(p3, rng)
    assert rel_err(conv3d(x, w, stride=2, backend="numpy"),
                   reference(p3, "forward", x, w, y)) < 1e-5


def test_functional_backward_helpers():
    rng = np.random.default_rng(19)
    p = ConvProblem((5, 4, 6, 6), (4, 2, 3, 3), padding=1, dilation=2, groups=2)
    x, w, y = normal_tensors(p, rng)
    dx = conv_backward_data(y, w, p.x_shape, padding=1, dilation=2, groups=2, backend="numpy")
    assert rel_err(dx, reference(p, "backward_data", x, w, y)) < 1e-5
    dw = conv_backward_filter(x, y, p.w_shape, padding=1, dilation=2, groups=2, backend="numpy")
    assert rel_err(dw, reference(p, "backward_filter", x, w, y)) < 1e-5
    p3 = ConvProblem((2, 3, 3, 3, 2), (2, 2, 2, 2, 2), layout="NDHWC")
    x, w, y = normal_tensors(p3, rng)
    dw = conv_backward_filter(x, y, p3.w_shape, layout="NDHWC", backend="numpy")
    assert rel_err(dw, reference(p3, "backward_filter", x, w, y)) < 1e-5


def test_handle_with_unlimited_workspace():
    from mucudnn.api import MicroBatchHandle
    p = ConvProblem((4, 2, 5, 5), (3, 2, 3, 3))
    h = MicroBatchHandle("numpy", workspace_limit=None)
    plan = h.register(p, "forward").plan
    assert plan.batch == 4


@needs_cudnn
def test_handle_refuses_mixed_layouts():
    """cuDNN allows an NHWC x with an NCHW-format filter or NCHW-strided y; a
    ConvProblem has one layout, so the handle must refuse, not write y wrongly."""
    from mucudnn._cudnn import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor
    from mucudnn.api import MicroBatchHandle
    from mucudnn.problem import packed_strides
    nhwc = ConvProblem((2, 4, 4, 3), (5, 3, 3, 3), padding=1, layout="NHWC")
    nchw = ConvProblem((2, 3, 4, 4), (5, 3, 3, 3), padding=1, layout="NCHW")
    xd = TensorDescriptor(nhwc.x_dims, strides=packed_strides(nhwc.x_dims, "NHWC"),
                          dtype="float32")
    cd = ConvolutionDescriptor(padding=(1, 1), stride=(1, 1), dilation=(1, 1))
    x = np.zeros(nhwc.x_shape, np.float32)
    y = np.zeros(nhwc.output_shape, np.float32)
    h = MicroBatchHandle("numpy", policy="undivided")
    w_nchw = FilterDescriptor(nchw.w_dims, dtype="float32", format="NCHW")
    y_nhwc = TensorDescriptor(nhwc.y_dims, strides=packed_strides(nhwc.y_dims, "NHWC"),
                              dtype="float32")
    with pytest.raises(ValueError, match="w_desc"):
        h.convolution_forward(1.0, xd, x, w_nchw, np.zeros(nhwc.w_shape, np.float32), cd, 0,
                              None, 0, 0.0, y_nhwc, y)
    w_nhwc = FilterDescriptor(nhwc.w_dims, dtype="float32", format="NHWC")
    y_nchw = TensorDescriptor(nchw.y_dims, strides=packed_strides(nchw.y_dims, "NCHW"),
                              dtype="float32")
    with pytest.raises(ValueError, match="y_desc"):
        h.convolution_forward(1.0, xd, x, w_nhwc, np.zeros(nhwc.w_shape, np.float32), cd, 0,
                              None, 0, 0.0, y_nchw, y)
    # the consistent NHWC call still runs and is right
    rng = np.random.default_rng(0)
    x = rng.standard_normal(nhwc.x_shape).astype(np.float32)
    w = rng.standard_normal(nhwc.w_shape).astype(np.float32)
    h.convolution_forward(1.0, xd, x, w_nhwc, w, cd, 0, None, 0, 0.0, y_nhwc, y)
    assert rel_err(y, reference(nhwc, Direction.FORWARD, x, w, None)) < 1e-5


def test_one_shot_iterable_policy_is_read_once():
    from mucudnn.optimizer import optimize_wr
    from mucudnn.problem import AlgoPerf
    perf = {4: [AlgoPerf(0, 10.0, 0)], 2: [AlgoPerf(1, 1.0, 0)]}
    assert optimize_wr(perf, 4, 0, iter([2])).describe() == "2 x 2"
    sizes = []
    be = get_backend("numpy", repeats=1)
    orig = be.find
    be.find = lambda p, d, lim: (sizes.append(p.batch), orig(p, d, lim))[1]
    c = Convolution((8, 2, 5, 5), (3, 2, 3, 3), backend=be, policy=(s for s in (4, 2)))
    c.forward(np.ones((8, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32))
    # read twice, the policy would be empty the second time and only 8 benchmarked;
    # size 2 may be pruned (Note [size pruning])
    assert {4, 8} <= set(sizes) <= {2, 4, 8}
