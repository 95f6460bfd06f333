"""The execution engine on the NumPy backend: views, alpha/beta, workspace, fallback,
graph caching (with a fake graph), and the MicroBatchHandle path."""

from __future__ import annotations

import contextlib
import types
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mucudnn.exec.graph as exec_graph
import mucudnn.exec.kernel as exec_kernel
from mucudnn import MicroBatchHandle
from mucudnn.backends import adapt, get_backend
from mucudnn.backends.base import ConvTensors
from mucudnn.exec import (
    ALIGN, Kernel, SegmentedWorkspace, WorkspaceFallbackWarning, WorkspacePool,
    WorkspaceUnavailable, carve_segments, execute, get_pool, micro_batch_betas,
    micro_batch_tensors, problem_from_descriptors, resolve_workspace,
)
from mucudnn.optimizer import Planner
from mucudnn.problem import ConvProblem, Direction, MicroBatch, make_plan

from reference import reference, rel_err

NP = get_backend("numpy")


pytestmark = pytest.mark.usefixtures("cache_off")


@pytest.fixture
def pool_limit():
    """Set the NumPy backend's pool limit for one test, restored afterwards."""
    pool = get_pool(NP)
    old = pool.limit_bytes

    def set_(n):
        pool.limit_bytes = n
        return pool

    yield set_
    pool.limit_bytes = old


class Spy:
    """A NumPy backend that records every call (name, details)."""

    def __init__(self, inner=None):
        self.inner = inner or NP
        self.name = "spy"
        self.device_name = "spy-cpu"
        self.version = "0"
        self.calls: list[tuple] = []

    def find(self, problem, direction, workspace_limit):
        self.calls.append(("find", problem.batch, Direction.parse(direction)))
        return self.inner.find(problem, direction, workspace_limit)

    def workspace_size(self, problem, direction, algo, math_type=0):
        self.calls.append(("workspace_size", problem.batch))
        return self.inner.workspace_size(problem, direction, algo, math_type)

    def run(self, direction, algo, math_type, tensors, alpha, beta, workspace):
        self.calls.append(("run", Direction.parse(direction), algo, tensors.problem.batch,
                           tensors.x.__array_interface__["data"][0],
                           tensors.y.__array_interface__["data"][0], alpha, beta))
        return self.inner.run(direction, algo, math_type, tensors, alpha, beta, workspace)

    def empty(self, shape, dtype):
        self.calls.append(("empty",))
        return self.inner.empty(shape, dtype)

    def from_host(self, a):
        self.calls.append(("from_host",))
        return self.inner.from_host(a)

    def to_host(self, a):
        self.calls.append(("to_host",))
        return self.inner.to_host(a)

    def alloc_workspace(self, n):
        self.calls.append(("alloc_workspace", n))
        return self.inner.alloc_workspace(n)

    def synchronize(self):
        self.calls.append(("synchronize",))

    def names(self):
        return [c[0] for c in self.calls]


def rand(shape, rng, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def tensors_for(p, rng):
    return rand(p.x_shape, rng), rand(p.w_shape, rng), rand(p.output_shape, rng)


# -- views and betas -------------------------------------------------------------------------

@pytest.mark.parametrize("layout,x,w", [
    ("NCHW", (5, 2, 4, 4), (3, 2, 3, 3)), ("NHWC", (5, 4, 4, 2), (3, 3, 3, 2)),
    ("NCDHW", (5, 2, 3, 3, 3), (3, 2, 2, 2, 2)), ("NDHWC", (5, 3, 3, 3, 2), (3, 2, 2, 2, 2)),
])
def test_micro_batch_views_are_row_blocks(layout, x, w):
    p = ConvProblem(x, w, layout=layout)
    rng = np.random.default_rng(0)
    xa, wa, ya = tensors_for(p, rng)
    for d in Direction:
        t = micro_batch_tensors(ConvTensors(p, xa, wa, ya), d, 1, 3)
        assert t.problem == p.with_batch(3)
        assert t.x.shape == p.with_batch(3).x_shape and t.y.shape == p.with_batch(3).output_shape
        assert np.shares_memory(t.x, xa) and np.shares_memory(t.y, ya)
        np.testing.assert_array_equal(t.x, xa[1:4])
        np.testing.assert_array_equal(t.y, ya[1:4])
        assert t.w is wa
        assert t.x.flags.c_contiguous and t.y.flags.c_contiguous


def test_micro_batch_betas():
    assert micro_batch_betas(Direction.BACKWARD_FILTER, 4, 0.0) == [0.0, 1.0, 1.0, 1.0]
    assert micro_batch_betas(Direction.BACKWARD_FILTER, 1, 0.25) == [0.25]
    assert micro_batch_betas(Direction.FORWARD, 3, 0.5) == [0.5] * 3
    assert micro_batch_betas(Direction.BACKWARD_DATA, 2, 0.0) == [0.0, 0.0]


@pytest.mark.parametrize("direction", list(Direction))
def test_execute_calls_each_micro_batch_without_sync(direction):
    spy = Spy()
    p = ConvProblem((10, 2, 5, 5), (3, 2, 3, 3), padding=1)
    rng = np.random.default_rng(1)
    x, w, y = tensors_for(p, rng)
    sizes, algos = [4, 1, 3, 2], [1, 0, 2, 1]
    mbs, off = [], 0
    for s, a in zip(sizes, algos):
        mbs.append(MicroBatch(off, s, a))
        off += s
    plan = resolve_workspace(make_plan(mbs, undivided_time_ms=1.0, workspace_limit=None,
                                       problem=p, direction=direction), NP)
    ws = NP.alloc_workspace(plan.workspace_bytes)
    spy.calls.clear()
    execute(plan, adapt(spy), ConvTensors(p, x, w, y), 1.5, 0.0, ws)
    runs = [c for c in spy.calls if c[0] == "run"]
    # no synchronize, no allocation between micro-batches (binding asks workspace sizes)
    assert [n for n in spy.names() if n != "workspace_size"] == ["run"] * 4
    assert [c[2] for c in runs] == algos and [c[3] for c in runs] == sizes
    want_betas = [0.0, 1.0, 1.0, 1.0] if direction is Direction.BACKWARD_FILTER else [0.0] * 4
    assert [c[7] for c in runs] == want_betas
    assert all(c[6] == 1.5 for c in runs)
    # Row offsets: the x/y data pointers advance by the row size.
    row_x = x[0].nbytes
    assert [(c[4] - x.__array_interface__["data"][0]) // row_x for c in runs] == [0, 4, 5, 8]


def test_execute_rejects_bad_plans():
    p = ConvProblem((6, 2, 4, 4), (2, 2, 3, 3))
    rng = np.random.default_rng(2)
    t = ConvTensors(p, *tensors_for(p, rng))
    gap = make_plan([MicroBatch(0, 2, 0), MicroBatch(3, 3, 0)], undivided_time_ms=1,
                    workspace_limit=None, problem=p, direction=Direction.FORWARD)
    with pytest.raises(ValueError, match="contiguous"):
        execute(gap, NP, t)
    short = make_plan([MicroBatch(0, 5, 0)], undivided_time_ms=1, workspace_limit=None,
                      problem=p, direction=Direction.FORWARD)
    with pytest.raises(ValueError, match="cover 5 rows"):
        execute(short, NP, t)
    need = make_plan([MicroBatch(0, 6, 1, workspace_bytes=100)], undivided_time_ms=1,
                     workspace_limit=None, problem=p, direction=Direction.FORWARD)
    with pytest.raises(ValueError, match="workspace"):
        execute(need, NP, t, workspace=None)


def test_backward_filter_beta_zero_ignores_nan_and_accumulates():
    p = ConvProblem((9, 3, 5, 5), (4, 3, 3, 3), padding=1)
    rng = np.random.default_rng(3)
    x, w, dy = tensors_for(p, rng)
    plan = resolve_workspace(make_plan(
        [MicroBatch(0, 4, 1), MicroBatch(4, 4, 2), MicroBatch(8, 1, 0)], undivided_time_ms=1,
        workspace_limit=None, problem=p, direction=Direction.BACKWARD_FILTER), NP)
    ws = NP.alloc_workspace(plan.workspace_bytes)
    dw = np.full(p.w_shape, np.nan, np.float32)
    execute(plan, NP, ConvTensors(p, x, dw, dy), 0.5, 0.0, ws)
    assert np.isfinite(dw).all()
    assert rel_err(dw, reference(p, Direction.BACKWARD_FILTER, x, w, dy, 0.5, 0.0)) < 1e-5
    # beta != 0 applies exactly once.
    prior = rand(p.w_shape, rng)
    dw = prior.copy()
    execute(plan, NP, ConvTensors(p, x, dw, dy), 1.0, 2.0, ws)
    assert rel_err(dw, reference(p, Direction.BACKWARD_FILTER, x, prior, dy, 1.0, 2.0)) < 1e-5


# -- workspace pool and WD segments -------------------------------------------------------------

def test_pool_grows_and_reuses_one_buffer():
    pool = WorkspacePool(NP)
    assert pool.get(0) is None
    a = pool.get(1000)
    assert a.nbytes == 1000 and a.dtype == np.uint8 and pool.allocations == 1
    b = pool.get(500)
    assert pool.allocations == 1 and np.shares_memory(a, b)
    c = pool.get(5000)
    assert pool.allocations == 2 and c.nbytes == 5000 and pool.size >= 5000
    pool.release()
    assert pool.size == 0


def test_pool_limit_attribute_and_env(monkeypatch):
    pool = WorkspacePool(NP)
    pool.limit_bytes = 100
    with pytest.raises(WorkspaceUnavailable) as ei:
        pool.get(101)
    assert ei.value.requested == 101 and ei.value.available == 100
    assert isinstance(ei.value, MemoryError)
    assert pool.get(100).nbytes == 100
    pool.limit_bytes = None
    monkeypatch.setenv("MUCUDNN_WORKSPACE_LIMIT", "1K")
    assert pool.effective_limit() == 1024
    with pytest.raises(WorkspaceUnavailable):
        pool.get(2000)
    monkeypatch.setenv("MUCUDNN_WORKSPACE_LIMIT", "lots")
    with pytest.raises(ValueError, match="MUCUDNN_WORKSPACE_LIMIT"):
        pool.get(10)


def test_pool_turns_memory_error_into_unavailable():
    class Stingy(Spy):
        def alloc_workspace(self, n):
            if n > 4096:
                raise MemoryError("no")
            return super().alloc_workspace(n)

    pool = WorkspacePool(adapt(Stingy()))
    assert pool.get(4000).nbytes == 4000
    with pytest.raises(WorkspaceUnavailable):
        pool.get(10_000)


def test_get_pool_is_per_backend_and_stream():
    spy = adapt(Spy())
    assert get_pool(NP) is get_pool(NP)
    assert get_pool(spy) is not get_pool(NP) and adapt(spy) is spy
    from mucudnn.exec import pool_for
    assert pool_for(spy, 5) is pool_for(spy, 5) and pool_for(spy, 5) is not get_pool(spy)


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=4),
                       st.integers(0, 5000), max_size=12))
def test_wd_segments_do_not_overlap(sizes):
    total, segs = carve_segments(sizes)
    assert list(segs) == list(sizes)
    spans = []
    for key, (off, n) in segs.items():
        assert n == sizes[key]
        assert off % ALIGN == 0
        assert off + n <= total
        if n:
            spans.append((off, off + n))
    spans.sort()
    for (_a0, a1), (b0, _b1) in zip(spans, spans[1:]):
        assert a1 <= b0
    assert total >= sum(sizes.values())
    ws = SegmentedWorkspace(NP, sizes)
    views = {k: ws.segment(k) for k in sizes}
    for k, v in views.items():
        if sizes[k] == 0:
            assert v is None
        else:
            assert v.nbytes == sizes[k]
    keys = [k for k in sizes if sizes[k]]
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            assert not np.shares_memory(views[a], views[b])


def test_wd_segments_respect_the_pool_limit(pool_limit):
    pool_limit(1000)
    with pytest.raises(WorkspaceUnavailable):
        SegmentedWorkspace(NP, {"a": 600, "b": 600})


# -- fallback -----------------------------------------------------------------------------------

def _kernel(p, d, plan, **kw):
    return Kernel(NP, p, d, Planner(NP, 1 << 30, cache=False), plan=plan, **kw)


@pytest.mark.parametrize("direction", list(Direction))
def test_fallback_warns_once_and_stays_correct(direction, pool_limit):
    p = ConvProblem((8, 3, 6, 6), (4, 3, 3, 3), padding=1)
    rng = np.random.default_rng(4)
    x, w, y = tensors_for(p, rng)
    plan = make_plan([MicroBatch(0, 8, 1)], undivided_time_ms=1, workspace_limit=None,
                     problem=p, direction=direction)
    k = _kernel(p, direction, plan)
    assert k.plan.workspace_bytes > 0
    pool_limit(16)
    outs = []
    with pytest.warns(WorkspaceFallbackWarning, match="instead of"):
        t = ConvTensors(p, x.copy(), w.copy(), y.copy())
        ran = k.run(t, 1.0, 0.0)
        outs.append(t)
    assert ran.workspace_bytes <= 16 and k.fallbacks == 1
    assert k.plan is ran  # the fallback plan is now the one in use
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Again, and again after going back to the preferred plan: no second warning.
        t = ConvTensors(p, x.copy(), w.copy(), y.copy())
        k.run(t, 1.0, 0.0)
        outs.append(t)
        k.reset()
        t = ConvTensors(p, x.copy(), w.copy(), y.copy())
        k.run(t, 1.0, 0.0)
        outs.append(t)
    assert k.fallbacks == 2
    out = {"forward": "y", "backward_data": "x", "backward_filter": "w"}[direction.value]
    ref = reference(p, direction, x, w, y)
    for t in outs:
        assert rel_err(getattr(t, out), ref) < 1e-5


def test_fallback_with_zero_available_uses_zero_workspace(pool_limit):
    p = ConvProblem((5, 2, 4, 4), (2, 2, 3, 3), padding=1)
    plan = make_plan([MicroBatch(0, 5, 2)], undivided_time_ms=1, workspace_limit=None,
                     problem=p, direction=Direction.FORWARD)
    k = _kernel(p, Direction.FORWARD, plan)
    pool_limit(0)
    rng = np.random.default_rng(5)
    x, w, y = tensors_for(p, rng)
    with pytest.warns(WorkspaceFallbackWarning):
        ran = k.run(ConvTensors(p, x, w, y))
    assert ran.workspace_bytes == 0
    assert rel_err(y, reference(p, Direction.FORWARD, x, w, y)) < 1e-5


# -- graph cache (fake CUDA graph on the CPU) -------------------------------------------------

class FakeGraph:
    recording: list | None = None

    def __init__(self):
        self.ops = []
        self.closed = False
        self.kept = []
        self.instantiate_s = 0.0

    @classmethod
    @contextlib.contextmanager
    def capture(cls, stream):
        g = cls()
        FakeGraph.recording = g.ops
        try:
            yield g
        finally:
            FakeGraph.recording = None

    def keep(self, *objs):
        self.kept.extend(objs)
        return self

    def launch(self, stream):
        for op in self.ops:
            op()

    def close(self):
        self.closed = True


class StreamSpy(Spy):
    """A host backend that pretends to have a stream and graphs (FakeGraph)."""

    is_host = True
    supports_graphs = True

    def __init__(self):
        super().__init__()
        self.stream = types.SimpleNamespace(handle=7)

    def run(self, *args):
        if FakeGraph.recording is not None:
            FakeGraph.recording.append(lambda: Spy.run(self, *args))
        else:
            Spy.run(self, *args)


@pytest.fixture
def fake_graphs(monkeypatch):
    monkeypatch.setattr(exec_graph, "CudaGraph", FakeGraph)
    monkeypatch.setattr(exec_kernel, "is_capturing", lambda stream: False)


def test_graph_cache_captures_once_per_pointer_set(fake_graphs):
    be = adapt(StreamSpy())
    p = ConvProblem((6, 2, 4, 4), (3, 2, 3, 3), padding=1)
    plan = make_plan([MicroBatch(0, 4, 0), MicroBatch(4, 2, 0)], undivided_time_ms=1,
                     workspace_limit=None, problem=p, direction=Direction.FORWARD)
    k = Kernel(be, p, Direction.FORWARD, Planner(be, None, cache=False), plan=plan, graph=True)
    assert k.graph and k.graphs is not None
    rng = np.random.default_rng(6)
    x, w, y = tensors_for(p, rng)
    ref = reference(p, Direction.FORWARD, x, w, y)
    t = ConvTensors(p, x, w, y)
    k.run(t)
    assert (k.graphs.captures, k.graphs.replays) == (1, 1)
    y[...] = np.nan
    k.run(t)
    assert (k.graphs.captures, k.graphs.replays) == (1, 2)
    assert rel_err(y, ref) < 1e-5
    runs = [c for c in be._inner.calls if c[0] == "run"]
    assert len(runs) == 4  # 2 launches x 2 micro-batches
    k.run(t, alpha=2.0)  # new scalars: new graph
    assert k.graphs.captures == 2
    y2 = np.empty_like(y)
    k.run(ConvTensors(p, x, w, y2))  # new pointers: new graph
    assert k.graphs.captures == 3
    assert rel_err(y2, ref) < 1e-5
    k.graphs.clear()
    assert len(k.graphs) == 0


def test_graph_is_a_no_op_on_numpy():
    p = ConvProblem((3, 2, 4, 4), (2, 2, 3, 3))
    plan = make_plan([MicroBatch(0, 3, 0)], undivided_time_ms=1, workspace_limit=None,
                     problem=p, direction=Direction.FORWARD)
    k = _kernel(p, Direction.FORWARD, plan, graph=True)
    rng = np.random.default_rng(7)
    x, w, y = tensors_for(p, rng)
    k.run(ConvTensors(p, x, w, y))
    assert not k.graph and k.graphs is None
    assert rel_err(y, reference(p, Direction.FORWARD, x, w, y)) < 1e-5


# -- MicroBatchHandle on the NumPy backend (descriptors read through getters) -----------------

def fake_descriptors(p):
    ns = types.SimpleNamespace
    from mucudnn.problem import packed_strides

    xd = ns(dims=p.x_dims, strides=packed_strides(p.x_dims, p.layout), dtype="float32")
    yd = ns(dims=p.y_dims, strides=packed_strides(p.y_dims, p.layout), dtype="float32")
    wd = ns(dims=p.w_dims, format="NHWC" if p.channels_last else "NCHW", dtype="float32")
    cd = ns(padding=p.padding, stride=p.stride, dilation=p.dilation, group_count=p.groups,
            compute_type="float32", math_type=3 if p.math == "fma" else 0)
    return xd, wd, cd, yd


@pytest.mark.parametrize("p", [
    ConvProblem((7, 4, 6, 5), (6, 2, 3, 3), padding=1, stride=(1, 2), groups=2),
    ConvProblem((5, 6, 5, 6), (4, 3, 2, 3), layout="NHWC", dilation=(2, 1), groups=2),
    ConvProblem((3, 2, 4, 4, 4), (2, 2, 3, 3, 3), padding=1, layout="NCDHW"),
    ConvProblem((3, 4, 4, 4, 2), (2, 3, 3, 3, 2), padding=(1, 0, 1), layout="NDHWC", math="fma"),
])
def test_problem_from_descriptors(p):
    assert problem_from_descriptors(*fake_descriptors(p)) == p


def test_problem_from_descriptors_checks_y():
    p = ConvProblem((2, 3, 5, 5), (4, 3, 3, 3))
    xd, wd, cd, yd = fake_descriptors(p)
    yd.dims = (2, 4, 5, 5)
    with pytest.raises(ValueError, match="y_desc"):
        problem_from_descriptors(xd, wd, cd, yd)


def test_handle_runs_three_directions_and_ignores_algo():
    p = ConvProblem((12, 4, 6, 6), (6, 2, 3, 3), padding=1, groups=2)
    h = MicroBatchHandle("numpy", workspace_limit=8 << 10, policy="powerOfTwo")
    xd, wd, cd, yd = fake_descriptors(p)
    rng = np.random.default_rng(7)
    x, w, y = tensors_for(p, rng)
    need_f = h.get_convolution_forward_workspace_size(xd, wd, cd, yd, 99, layer_id="c1")
    need_d = h.get_convolution_backward_data_workspace_size(wd, yd, cd, xd, 99, layer_id="c1")
    need_w = h.get_convolution_backward_filter_workspace_size(xd, yd, cd, wd, 99, layer_id="c1")
    plans = h.plans
    assert set(plans) == {"c1/forward", "c1/backward_data", "c1/backward_filter"}
    assert need_f == plans["c1/forward"].workspace_bytes <= 8 << 10
    assert need_d == plans["c1/backward_data"].workspace_bytes
    assert need_w == plans["c1/backward_filter"].workspace_bytes
    out = np.zeros(p.output_shape, np.float32)
    h.convolution_forward(1.0, xd, x, wd, w, cd, 99, NP.alloc_workspace(need_f), need_f, 0.0,
                          yd, out, layer_id="c1")
    assert rel_err(out, reference(p, "forward", x, w, y)) < 1e-5
    dx = rand(p.x_shape, rng)
    dx0 = dx.copy()
    h.convolution_backward_data(2.0, wd, w, yd, y, cd, 99, None, 0, 0.5, xd, dx, layer_id="c1")
    assert rel_err(dx, reference(p, "backward_data", dx0, w, y, 2.0, 0.5)) < 1e-5
    dw = np.full(p.w_shape, np.nan, np.float32)
    h.convolution_backward_filter(1.0, xd, x, yd, y, cd, 5, None, 0, 0.0, wd, dw, layer_id="c1")
    assert rel_err(dw, reference(p, "backward_filter", x, w, y)) < 1e-5
    with pytest.raises(TypeError, match="pointers"):
        h.convolution_forward(1.0, xd, 1234, wd, w, cd, 0, None, 0, 0.0, yd, out)


def test_handle_optimize_wd_gives_disjoint_segments():
    h = MicroBatchHandle("numpy", workspace_limit=1 << 20, policy="powerOfTwo")
    probs = {"a": ConvProblem((8, 3, 6, 6), (4, 3, 3, 3), padding=1),
             "b": ConvProblem((8, 4, 5, 5), (4, 4, 3, 3))}
    rng = np.random.default_rng(8)
    for name, p in probs.items():
        for d in Direction:
            h.register(p, d, layer_id=name)
    total = 20_000
    chosen = h.optimize_wd(total)
    assert len(chosen) == 6
    assert sum(pl.workspace_bytes for pl in chosen.values()) <= total
    seg = h.segments
    spans = sorted((off, off + n) for off, n in seg.segments.values() if n)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert all(off % ALIGN == 0 for off, _ in seg.segments.values())
    # Runs after WD are still correct, using the kernel's segment.
    p = probs["a"]
    xd, wd, cd, yd = fake_descriptors(p)
    x, w, y = tensors_for(p, rng)
    out = np.empty(p.output_shape, np.float32)
    h.convolution_forward(1.0, xd, x, wd, w, cd, 0, None, 0, 0.0, yd, out, layer_id="a")
    assert rel_err(out, reference(p, "forward", x, w, y)) < 1e-5


def _bound_1x1(be, batches=(2,)):
    """A 1x1 forward problem whose batch is the sum of ``batches``, and its plan
    of those micro-batches bound to ``be``."""
    from mucudnn.exec import bind_plan

    p = ConvProblem((sum(batches), 1, 3, 3), (1, 1, 1, 1))
    starts = np.cumsum((0,) + tuple(batches))
    plan = make_plan([MicroBatch(int(a), n, 0) for a, n in zip(starts, batches)],
                     undivided_time_ms=1, workspace_limit=None, problem=p,
                     direction=Direction.FORWARD)
    return p, bind_plan(plan, be)


def test_graph_cache_keeps_the_newest_and_closes_the_evicted(fake_graphs):
    from mucudnn.exec.graph import GraphCache

    be = adapt(StreamSpy())
    p, bound = _bound_1x1(be)
    cache = GraphCache(be, max_graphs=2)
    rng = np.random.default_rng(0)
    x, w, y = tensors_for(p, rng)
    ys = [np.empty_like(y) for _ in range(3)]
    for out in ys:
        assert cache.run(bound, x, w, out, None, 0, 7) is True
    graphs = cache._graphs.values()
    assert len(cache) == 2
    ref = reference(p, Direction.FORWARD, x, w, y)
    assert all(rel_err(out, ref) < 1e-5 for out in ys)
    # the oldest (first pointers) was evicted: running it again captures anew
    assert cache.run(bound, x, w, ys[0], None, 0, 7) is True
    assert graphs[0].closed and not graphs[1].closed  # ys[1]'s graph went next
    assert cache.run(bound, x, w, ys[0], None, 0, 7) is False
    assert cache.captures == 4 and cache.replays == 5
    cache.clear()
    assert len(cache) == 0


def test_graph_cache_counts_the_host_seconds_of_each_kind_of_call(fake_graphs, monkeypatch):
    """See Note [what replay costs the host]: a cache's seconds are those of its
    direct launches, its captures (the capture alone, not the launch after it)
    and its graph launches, each kind on its own, read on a clock that the
    calls themselves move (a direct call 1 s, a capture 10 s, a replayed call
    0.25 s); the output is the convolution's throughout."""
    from mucudnn.exec.graph import GraphCache

    now = [0.0]
    monkeypatch.setattr(exec_graph, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    class Ticking(StreamSpy):
        def run(self, *args):
            if FakeGraph.recording is not None:
                now[0] += 10.0
                FakeGraph.recording.append(lambda: (now.__setitem__(0, now[0] + 0.25),
                                                    Spy.run(self, *args)))
            else:
                now[0] += 1.0
                Spy.run(self, *args)

    be = adapt(Ticking())
    p, bound = _bound_1x1(be)
    cache = GraphCache(be, after=2)
    x, w, y = tensors_for(p, np.random.default_rng(5))
    ref = reference(p, Direction.FORWARD, x, w, y)
    seconds = []
    for _ in range(4):  # direct, capture and replay, replay, replay
        y[...] = np.nan
        cache.run(bound, x, w, y, None, 0, 7)
        assert rel_err(y, ref) < 1e-5
        seconds.append((cache.direct_s, cache.capture_s, cache.replay_s))
    assert seconds == [(1.0, 0.0, 0.0), (1.0, 10.0, 0.25), (1.0, 10.0, 0.5), (1.0, 10.0, 0.75)]
    assert (cache.direct, cache.captures, cache.replays) == (1, 1, 3)
    assert cache.instantiate_s == 0.0  # the fake graph instantiates nothing


@given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(1, 3))
def test_a_graph_cache_captures_an_address_set_the_after_th_time_it_is_seen(picks, after):
    """See Note [replay after repeated addresses]: before the ``after``-th call
    at one address set the plan launches directly, that call captures, later
    ones replay; every call's output is the convolution's."""
    from mucudnn.exec import bind_plan
    from mucudnn.exec.graph import GraphCache

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(exec_graph, "CudaGraph", FakeGraph)
        be = adapt(StreamSpy())
        p = ConvProblem((3, 2, 4, 4), (2, 2, 3, 3), padding=1)
        plan = make_plan([MicroBatch(0, 2, 0), MicroBatch(2, 1, 0)], undivided_time_ms=1,
                         workspace_limit=None, problem=p, direction=Direction.FORWARD)
        bound = bind_plan(plan, be)
        cache = GraphCache(be, after=after)
        rng = np.random.default_rng(1)
        x, w, _ = tensors_for(p, rng)
        ref = reference(p, Direction.FORWARD, x, w, np.zeros(p.output_shape, np.float32))
        outs = [np.empty(p.output_shape, np.float32) for _ in range(4)]
        seen = {i: 0 for i in range(4)}
        for i in picks:
            outs[i][...] = np.nan
            seen[i] += 1
            assert cache.run(bound, x, w, outs[i], None, 0, 7) is (seen[i] == after)
            assert rel_err(outs[i], ref) < 1e-5
    assert cache.direct == sum(min(n, after - 1) for n in seen.values())
    assert cache.captures == sum(n >= after for n in seen.values())
    assert cache.replays == len(picks) - cache.direct


@given(st.integers(1, 40), st.integers(3, 5), st.sampled_from([2, 3]))
def test_a_cache_of_repeated_addresses_grows_to_hold_every_address_set_that_repeats(
        n, rounds, after):
    """See Note [more address sets than graphs]: ``n`` address sets called in
    turn, round after round (a step's layers sharing a kernel), end up all
    replayed, however many there are beyond the graphs kept at first, and the
    graphs kept never outnumber them; every call's output is the convolution's."""
    from mucudnn.exec.graph import GraphCache, MAX_GRAPHS, MAX_GROWN_GRAPHS

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(exec_graph, "CudaGraph", FakeGraph)
        be = adapt(StreamSpy())
        p, bound = _bound_1x1(be, (1, 1))
        cache = GraphCache(be, after=after)
        rng = np.random.default_rng(3)
        x, w, _ = tensors_for(p, rng)
        ref = reference(p, Direction.FORWARD, x, w, np.zeros(p.output_shape, np.float32))
        outs = [np.empty(p.output_shape, np.float32) for _ in range(n)]
        for _ in range(after + rounds):
            before = (cache.captures, cache.direct)
            for out in outs:
                out[...] = np.nan
                cache.run(bound, x, w, out, None, 0, 7)
                assert rel_err(out, ref) < 1e-5
                assert len(cache) <= max(n, MAX_GRAPHS)
        assert (cache.captures, cache.direct) == before  # the last round only replayed
        assert cache.captures < 2 * n and MAX_GRAPHS <= cache.max_graphs <= MAX_GROWN_GRAPHS
        assert cache.max_graphs < 2 * max(n, MAX_GRAPHS)


def test_a_grown_cache_stops_at_its_bound(fake_graphs, monkeypatch):
    """See Note [more address sets than graphs]: past :data:`MAX_GROWN_GRAPHS`
    address sets the cache keeps that many graphs and no more, and each call's
    output is still the convolution's."""
    from mucudnn.exec.graph import GraphCache

    monkeypatch.setattr(exec_graph, "MAX_GROWN_GRAPHS", 16)
    be = adapt(StreamSpy())
    p, bound = _bound_1x1(be)
    cache = GraphCache(be, after=2)
    rng = np.random.default_rng(5)
    x, w, _ = tensors_for(p, rng)
    ref = reference(p, Direction.FORWARD, x, w, np.zeros(p.output_shape, np.float32))
    outs = [np.empty(p.output_shape, np.float32) for _ in range(20)]
    for _ in range(5):
        for out in outs:
            out[...] = np.nan
            cache.run(bound, x, w, out, None, 0, 7)
            assert rel_err(out, ref) < 1e-5 and len(cache) <= 16
    assert cache.max_graphs == 16
    closed = sum(g.closed for g in cache._graphs.values())
    assert closed == 0 and len(cache) == 16
    cache.clear()
    assert len(cache) == 0 and len(cache._seen) == 0


@pytest.mark.parametrize("same_block", [True, False])
def test_replay_repeated_takes_the_callers_workspace_and_replays_once_its_address_repeats(
        fake_graphs, same_block):
    """See Note [replay after repeated addresses]: a kernel replaying repeated
    launches takes each call's workspace from the caller (not the pool), its
    address part of the key: the same block at every call is captured at the
    second and replayed after; a fresh block each time is never captured."""
    be = adapt(StreamSpy())
    p = ConvProblem((6, 2, 4, 4), (3, 2, 3, 3), padding=1)
    need = NP.workspace_size(p.with_batch(4), Direction.FORWARD, 1)
    plan = make_plan([MicroBatch(0, 4, 1, workspace_bytes=need),
                      MicroBatch(4, 2, 1, workspace_bytes=need)],
                     undivided_time_ms=1, workspace_limit=None, problem=p,
                     direction=Direction.FORWARD)
    k = Kernel(be, p, Direction.FORWARD, Planner(be, None, cache=False), plan=plan)
    assert k.graphs is None and k.replay_repeated() and k.graph
    assert k.graphs.after == 2
    block = np.zeros(need, np.uint8)
    given = []

    def alloc(n):
        buf = block if same_block else np.zeros(n, np.uint8)
        given.append(buf)
        return buf, buf, n

    rng = np.random.default_rng(2)
    x, w, y = tensors_for(p, rng)
    ref = reference(p, Direction.FORWARD, x, w, y)
    for _ in range(4):
        y[...] = np.nan
        k.launch(x, w, y, workspace=alloc)
        assert rel_err(y, ref) < 1e-5
    assert len(given) == 4 and not any(c[0] == "alloc_workspace" for c in be._inner.calls)
    if same_block:
        assert (k.graphs.direct, k.graphs.captures, k.graphs.replays) == (1, 1, 3)
    else:
        assert (k.graphs.direct, k.graphs.captures, k.graphs.replays) == (4, 0, 0)


def test_replay_repeated_is_refused_without_graphs():
    """A backend without streams has nothing to replay: the kernel stays as it was."""
    p = ConvProblem((2, 1, 3, 3), (1, 1, 1, 1))
    plan = make_plan([MicroBatch(0, 2, 0)], undivided_time_ms=1, workspace_limit=None,
                     problem=p, direction=Direction.FORWARD)
    k = _kernel(p, Direction.FORWARD, plan)
    assert k.replay_repeated() is False and not k.graph and k.graphs is None
    with pytest.raises(ValueError, match="after"):
        exec_graph.GraphCache(NP, after=0)


class _UncapturableGraph(FakeGraph):
    """A capture that fails as cudaStreamEndCapture does for an engine that
    cannot be captured; counts the attempts."""

    attempts = 0

    @classmethod
    @contextlib.contextmanager
    def capture(cls, stream):
        from mucudnn.cuda import CudaError
        _UncapturableGraph.attempts += 1
        with FakeGraph.capture.__func__(cls, stream) as g:
            yield g
        raise CudaError("cudaStreamEndCapture", "cudaErrorStreamCaptureInvalidated",
                        "operation not permitted when stream is capturing")


@pytest.mark.parametrize("fall_back", [False, True])
def test_a_failed_capture_launches_directly_from_then_on_where_the_cache_falls_back(
        monkeypatch, fall_back):
    """See Note [replay after repeated addresses]: a cache made with ``fall_back``
    runs the call whose capture failed directly (its output is the
    convolution's), warns once, and tries no capture again; without it the
    error reaches the caller, as ``graph=True`` asked for graphs."""
    from mucudnn.cuda import CudaError
    from mucudnn.exec import bind_plan
    from mucudnn.exec.graph import GraphCache

    monkeypatch.setattr(exec_graph, "CudaGraph", _UncapturableGraph)
    monkeypatch.setattr(_UncapturableGraph, "attempts", 0)
    be = adapt(StreamSpy())
    p = ConvProblem((3, 2, 4, 4), (2, 2, 3, 3), padding=1)
    plan = make_plan([MicroBatch(0, 2, 0), MicroBatch(2, 1, 0)], undivided_time_ms=1,
                     workspace_limit=None, problem=p, direction=Direction.FORWARD)
    bound = bind_plan(plan, be)
    cache = GraphCache(be, after=2, fall_back=fall_back)
    rng = np.random.default_rng(4)
    x, w, y = tensors_for(p, rng)
    ref = reference(p, Direction.FORWARD, x, w, y)
    assert cache.run(bound, x, w, y, None, 0, 7) is False  # first sighting: direct
    if not fall_back:
        with pytest.raises(CudaError, match="cudaStreamEndCapture"):
            cache.run(bound, x, w, y, None, 0, 7)
        return
    with pytest.warns(RuntimeWarning, match="launches directly from now on") as caught:
        for _ in range(3):
            y[...] = np.nan
            assert cache.run(bound, x, w, y, None, 0, 7) is False
            assert rel_err(y, ref) < 1e-5
    assert len(caught) == 1 and _UncapturableGraph.attempts == 1
    assert cache.failed.startswith("CudaError") and len(cache) == 0
    assert (cache.captures, cache.replays, cache.direct) == (0, 0, 4)
