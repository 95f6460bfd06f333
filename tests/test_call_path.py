"""The device call path on the CPU: a fake device backend whose addresses are integer
pointers into NumPy memory exercises what a GPU call does (pointers per call,
alignment classes, scalars, streams, per-stream pools, framework workspace
allocators, re-plans) and checks every change is noticed with the right result.
The same properties run on the H200 in tests/test_engine_gpu.py."""

from __future__ import annotations

import ctypes
import types
import warnings

import numpy as np
import pytest

import mucudnn as mu
import mucudnn.exec.kernel as exec_kernel
from mucudnn.backends import BackendBase, ConvTensors, get_backend
from mucudnn.errors import WorkspaceUnavailable
from mucudnn.exec import Kernel, WorkspaceFallbackWarning, pool_for
from mucudnn.optimizer import Planner
from mucudnn.problem import ConvProblem, Direction, MicroBatch, make_plan

from reference import reference, rel_err


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", "off")
    monkeypatch.delenv("MUCUDNN_WORKSPACE_LIMIT", raising=False)
    monkeypatch.setattr(exec_kernel, "is_capturing", lambda stream: False)


def _view(ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    n = int(np.prod(shape)) * dtype.itemsize
    buf = (ctypes.c_char * n).from_address(ptr)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


class PointerBackend(BackendBase):
    """The NumPy backend's arithmetic behind a device backend's interface: addresses
    are ints, launches go to the active 'stream', and everything is recorded."""

    name = "pointer"
    is_host = False
    supports_graphs = False
    device = 0

    def __init__(self):
        self._np = get_backend("numpy")
        self.device_name, self.version = "fake-gpu", "1"
        self.stream = types.SimpleNamespace(handle=1000)
        self.active = 1000
        self.binds: list[tuple] = []
        self.launches: list[tuple] = []
        self._keep: dict[int, np.ndarray] = {}

    def find(self, problem, direction, workspace_limit):
        return self._np.find(problem, direction, workspace_limit)

    def workspace_size(self, problem, direction, algo, math_type=0):
        return self._np.workspace_size(problem, direction, algo, math_type)

    def address(self, a):
        self._keep[a.ctypes.data] = a
        return a.ctypes.data

    def activate(self, stream):
        self.active = self.stream.handle if stream is None else stream

    def mem_get_info(self):
        return (1 << 40, 1 << 40)

    def bind(self, direction, algo, math_type, problem, offset, size, alpha, beta, aligns):
        self.binds.append((Direction.parse(direction), algo, offset, size, alpha, beta, aligns))
        sub = problem.with_batch(size)
        dt = np.dtype(problem.dtype)
        need = self._np.workspace_size(sub, direction, algo, math_type)

        def launch(x, w, y, ws, ws_bytes):
            assert isinstance(x, int) and isinstance(w, int) and isinstance(y, int)
            self.launches.append((self.active, x, w, y, ws, ws_bytes, alpha, beta))
            xs = _view(x, problem.x_shape, dt)[offset:offset + size]
            ys = _view(y, problem.output_shape, dt)[offset:offset + size]
            wa = _view(w, problem.w_shape, dt)
            wsa = _view(ws, (ws_bytes,), np.dtype(np.uint8)) if need else None
            self._np.run(direction, algo, math_type, ConvTensors(sub, xs, wa, ys), alpha, beta,
                         wsa)

        launch.workspace_bytes = need
        launch.algo = algo
        return launch

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def alloc_workspace(self, n):
        return np.empty(int(n), np.uint8)

    def from_host(self, a):
        return np.array(a)

    def to_host(self, a):
        return np.array(a)


class Cai:
    """A device-array stand-in: __cuda_array_interface__ v3 over NumPy memory."""

    def __init__(self, a: np.ndarray, stream: int | None = 7):
        self.a = a
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str,
                                         "data": (a.ctypes.data, False), "version": 3,
                                         "strides": None, "stream": stream}


P = ConvProblem((9, 4, 7, 7), (6, 4, 3, 3), padding=1)


def _data(seed: int, p: ConvProblem = P):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float32)
                 for s in (p.x_shape, p.w_shape, p.output_shape))


def _plan(p=P, d=Direction.FORWARD, sizes=(4, 4, 1), algo=1):
    mbs, off = [], 0
    for s in sizes:
        mbs.append(MicroBatch(off, s, algo))
        off += s
    return make_plan(mbs, undivided_time_ms=1, workspace_limit=None, problem=p, direction=d)


def _kernel(be, plan, **kw):
    return Kernel(be, plan.problem, plan.direction, Planner(be, None, cache=False), plan=plan,
                  **kw)


def test_pointers_are_arguments_not_bindings():
    be = PointerBackend()
    k = _kernel(be, _plan())
    for seed in range(4):
        x, w, y = _data(seed)
        out = np.full(P.output_shape, np.nan, np.float32)
        k.launch(x.ctypes.data, w.ctypes.data, out.ctypes.data, 1.0, 0.0, 5)
        assert rel_err(out, reference(P, "forward", x, w, y)) < 1e-5
    assert len(be.binds) == 3  # three micro-batches, bound once
    assert {l[0] for l in be.launches} == {5}


def test_scalars_and_alignment_are_binding_keys():
    be = PointerBackend()
    k = _kernel(be, _plan())
    x, w, y = _data(1)
    out = y.copy()
    k.launch(x.ctypes.data, w.ctypes.data, out.ctypes.data, 1.0, 0.0, 5)
    k.launch(x.ctypes.data, w.ctypes.data, out.ctypes.data, 1.0, 0.0, 5)
    assert len(be.binds) == 3
    prior = out.copy()
    k.launch(x.ctypes.data, w.ctypes.data, out.ctypes.data, 0.5, 1.0, 5)  # new scalars
    assert len(be.binds) == 6 and be.binds[-1][4:6] == (0.5, 1.0)
    assert rel_err(out, reference(P, "forward", x, w, prior, 0.5, 1.0)) < 1e-5
    # a tensor at a 4-byte-aligned address: a binding for that alignment class
    buf = np.empty(x.size + 1, np.float32)
    shifted = buf[1:].reshape(x.shape) if buf[1:].ctypes.data % 16 else buf[:-1].reshape(x.shape)
    if shifted.ctypes.data % 16 == 0:  # pragma: no cover - depends on the allocator
        shifted = np.empty(x.size + 1, np.float32)[1:].reshape(x.shape)
    shifted[...] = x
    out2 = np.full_like(out, np.nan)
    k.launch(shifted.ctypes.data, w.ctypes.data, out2.ctypes.data, 1.0, 0.0, 5)
    assert len(be.binds) == 9 and be.binds[-1][6][0] == shifted.ctypes.data & -shifted.ctypes.data
    assert rel_err(out2, reference(P, "forward", x, w, None)) < 1e-5


def test_each_stream_has_its_own_pool():
    be = PointerBackend()
    k = _kernel(be, _plan(algo=1))
    x, w, y = _data(2)
    for s in (5, 6, 5):
        k.launch(x.ctypes.data, w.ctypes.data, y.ctypes.data, 1.0, 0.0, s)
    assert [l[0] for l in be.launches] == [5] * 3 + [6] * 3 + [5] * 3
    p5, p6 = pool_for(be, 5), pool_for(be, 6)
    assert p5 is not p6 and p5.size > 0 and p6.size > 0 and p5.address != p6.address
    assert {l[4] for l in be.launches if l[0] == 5} == {p5.address}
    assert {l[4] for l in be.launches if l[0] == 6} == {p6.address}


def test_a_framework_allocator_gives_the_workspace_per_call():
    be = PointerBackend()
    k = _kernel(be, _plan(algo=1))
    x, w, y = _data(3)
    calls = []

    def alloc(n):
        buf = np.empty(n, np.uint8)
        calls.append(n)
        return buf, buf.ctypes.data, n

    k.launch(x.ctypes.data, w.ctypes.data, y.ctypes.data, 1.0, 0.0, 5, alloc)
    need = max(b.workspace_bytes for b in [k._last_bound])
    assert calls == [need] and pool_for(be, 5).size == 0  # the pool was not touched
    assert rel_err(y, reference(P, "forward", x, w, None)) < 1e-5


def test_an_allocator_that_runs_out_makes_the_planner_replan():
    be = PointerBackend()
    k = _kernel(be, _plan(algo=1))
    x, w, y = _data(4)

    def stingy(n):
        if n > 0:
            raise WorkspaceUnavailable(f"no {n} bytes", n, 0)
        return None, None, 0

    with pytest.warns(WorkspaceFallbackWarning):
        ran = k.launch(x.ctypes.data, w.ctypes.data, y.ctypes.data, 1.0, 0.0, 5, stingy)
    assert ran.workspace_bytes == 0 and k.plan is ran
    assert rel_err(y, reference(P, "forward", x, w, None)) < 1e-5


@pytest.mark.parametrize("direction", list(Direction))
def test_convolution_notices_every_change(direction):
    """Through the public API with __cuda_array_interface__ arrays: new pointers, new
    data, scalars, a stream change (v3 field), shape and dtype changes are noticed."""
    be = PointerBackend()
    conv = mu.Convolution(P.x_shape, P.w_shape, padding=1, backend=be, cache=False,
                          plans={direction: _plan(d=direction)})
    call = {Direction.FORWARD: conv.forward, Direction.BACKWARD_DATA: conv.backward_data,
            Direction.BACKWARD_FILTER: conv.backward_filter}[direction]
    shape = {Direction.FORWARD: P.output_shape, Direction.BACKWARD_DATA: P.x_shape,
             Direction.BACKWARD_FILTER: P.w_shape}[direction]

    def run(seed, stream=7, alpha=1.0, beta=0.0, prior=None):
        x, w, y = _data(seed)
        a, b = {Direction.FORWARD: (x, w), Direction.BACKWARD_DATA: (y, w),
                Direction.BACKWARD_FILTER: (x, y)}[direction]
        out = np.full(shape, np.nan, np.float32) if prior is None else prior.copy()
        r = call(Cai(a, stream), Cai(b, stream), Cai(out, stream), alpha=alpha, beta=beta)
        assert r.a is out
        want = reference(P, direction, x, w, y if prior is None or direction !=
                         Direction.FORWARD else prior, alpha, beta) if prior is None else None
        return out, (x, w, y), want

    for seed in range(3):  # new pointers and data each time
        out, _, want = run(seed)
        assert rel_err(out, want) < 1e-5
    assert {l[0] for l in be.launches} == {7}
    n_binds = len(be.binds)
    out, _, want = run(9, stream=11)  # another stream: issued there, no rebinding
    assert be.launches[-1][0] == 11 and len(be.binds) == n_binds
    assert rel_err(out, want) < 1e-5
    x, w, y = _data(5)
    prior = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    a, b = {Direction.FORWARD: (x, w), Direction.BACKWARD_DATA: (y, w),
            Direction.BACKWARD_FILTER: (x, y)}[direction]
    out = prior.copy()
    call(Cai(a), Cai(b), Cai(out), alpha=2.0, beta=0.5)
    ref_prior = {Direction.FORWARD: (x, w, prior), Direction.BACKWARD_DATA: (prior, w, y),
                 Direction.BACKWARD_FILTER: (x, prior, y)}[direction]
    assert rel_err(out, reference(P, direction, *ref_prior, 2.0, 0.5)) < 1e-5
    with pytest.raises(ValueError, match="expected shape"):
        call(Cai(a[:3]), Cai(b), Cai(out))
    with pytest.raises(ValueError, match="expected dtype float32"):
        call(Cai(a.astype(np.float64)), Cai(b), Cai(out))
    buf = np.zeros(2 * (a.size + out.size), np.float32)
    a_in = buf[:a.size].reshape(a.shape)
    out_on_a = buf[a.size // 2:a.size // 2 + out.size].reshape(out.shape)
    with pytest.raises(ValueError, match="overlaps"):
        call(Cai(a_in), Cai(b), Cai(out_on_a))


def test_v2_interface_arrays_synchronise_around_the_call(monkeypatch):
    """An array whose producer stream is unknown (interface v2): the device is
    synchronised before, and the call's stream after."""
    import mucudnn.api.convolution as api_convolution

    be = PointerBackend()
    syncs = []
    monkeypatch.setattr(api_convolution, "device_synchronize", lambda dev: syncs.append(("device", dev)))
    be.synchronize = lambda: syncs.append(("backend",))
    conv = mu.Convolution(P.x_shape, P.w_shape, padding=1, backend=be, cache=False,
                          plans={Direction.FORWARD: _plan()})
    x, w, y = _data(8)
    out = np.full(P.output_shape, np.nan, np.float32)
    cx, cw, co = Cai(x), Cai(w), Cai(out)
    for c in (cx, cw, co):
        del c.__cuda_array_interface__["stream"]
        c.__cuda_array_interface__["version"] = 2
    conv.forward(cx, cw, co)
    assert syncs == [("device", 0), ("backend",)]
    assert be.launches[-1][0] == 1000  # the home stream
    assert rel_err(out, reference(P, "forward", x, w, y)) < 1e-5


def test_warm_path_memory_is_bounded(monkeypatch):
    """Bound plans per kernel and pools per backend are bounded caches."""
    be = PointerBackend()
    k = _kernel(be, _plan())
    x, w, y = _data(9)
    for i in range(40):
        k.launch(x.ctypes.data, w.ctypes.data, y.ctypes.data, float(i), 0.0, 100 + i)
    assert len(k._bound) <= k._bound.maxsize
    from mucudnn.exec.workspace import MAX_STREAM_POOLS, _POOLS
    assert len(_POOLS[be]) <= MAX_STREAM_POOLS
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mu.clear_caches()
    assert len(k._bound) == 0 and len(_POOLS[be]) == 0
