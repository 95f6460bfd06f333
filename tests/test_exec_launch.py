"""Bound launchers: bind_plan/prepare bind once, a kernel rebinds only when scalars or
alignment change, and a refused configuration is re-planned by the planner (never
swapped in silently by the backend)."""

import warnings

import numpy as np
import pytest

import mucudnn as mu
from mucudnn.backends import BackendBase, ConvTensors, get_backend
from mucudnn.errors import UnsupportedConfigError
from mucudnn.exec import FallbackWarning, Kernel, bind_plan, prepare
from mucudnn.optimizer import Planner
from mucudnn.problem import ConvProblem, Direction, MicroBatch, make_plan

from reference import reference, rel_err


pytestmark = pytest.mark.usefixtures("cache_off")


class BindingBackend(BackendBase):
    """The NumPy backend, counting bindings; algorithms in ``refuse`` raise
    UnsupportedConfigError at bind time, as a GPU backend does for a config that
    cannot run at some alignment."""

    name = "binding"

    def __init__(self, refuse=()):
        self._np = get_backend("numpy")
        self.device_name, self.version = "cpu", "1"
        self.binds = 0
        self.refuse = set(refuse)

    def find(self, problem, direction, workspace_limit):
        return self._np.find(problem, direction, workspace_limit)

    def workspace_size(self, problem, direction, algo, math_type=0):
        return self._np.workspace_size(problem, direction, algo, math_type)

    def run(self, *args):
        self._np.run(*args)

    def bind(self, direction, algo, math_type, problem, offset, size, alpha, beta, aligns):
        self.binds += 1
        if algo in self.refuse:
            raise UnsupportedConfigError(f"algo: {algo} refused here", algo=algo, reason="test")
        return super().bind(direction, algo, math_type, problem, offset, size, alpha, beta, aligns)

    def empty(self, shape, dtype):
        return self._np.empty(shape, dtype)

    def from_host(self, a):
        return self._np.from_host(a)

    def to_host(self, a):
        return self._np.to_host(a)

    def alloc_workspace(self, n):
        return self._np.alloc_workspace(n)

    def synchronize(self):
        pass


def _setup():
    p = ConvProblem((7, 3, 6, 6), (4, 3, 3, 3), padding=1)
    rng = np.random.default_rng(3)
    x, w, y = (rng.standard_normal(s).astype(np.float32) for s in
               (p.x_shape, p.w_shape, p.output_shape))
    plan = make_plan([MicroBatch(0, 4, 1, workspace_bytes=1 << 20), MicroBatch(4, 3, 0)],
                     undivided_time_ms=1.0, workspace_limit=None).with_context(p, Direction.FORWARD)
    return p, x, w, y, plan


def test_prepare_binds_each_micro_batch_once_and_is_correct():
    be = BindingBackend()
    p, x, w, y, plan = _setup()
    ws = be.alloc_workspace(1 << 20)
    t = ConvTensors(p, x, w, y.copy())
    launch = prepare(plan, be, t, 1.0, 0.0, ws)
    assert be.binds == 2
    for _ in range(3):
        t.y[...] = np.nan
        launch()
        assert rel_err(t.y, reference(p, Direction.FORWARD, x, w, y)) < 1e-5
    assert be.binds == 2


def test_a_bound_plan_serves_any_buffers():
    """A launcher takes addresses: the same bound plan runs on new buffers unbound."""
    be = BindingBackend()
    p, x, w, y, plan = _setup()
    bound = bind_plan(plan, be)
    ws = be.alloc_workspace(bound.workspace_bytes)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        xs = rng.standard_normal(p.x_shape).astype(np.float32)
        out = np.full(p.output_shape, np.nan, np.float32)
        bound(xs, w, out, ws, ws.nbytes)
        assert rel_err(out, reference(p, Direction.FORWARD, xs, w, None)) < 1e-5
    assert be.binds == 2


def test_kernel_rebinds_only_when_scalars_change():
    be = BindingBackend()
    p, x, w, y, plan = _setup()
    k = Kernel(be, p, Direction.FORWARD, Planner(be, None, cache=False), plan=plan)
    for _i in range(3):
        out = np.empty(p.output_shape, np.float32)
        k.run(ConvTensors(p, x, w, out))
        assert rel_err(out, reference(p, Direction.FORWARD, x, w, None)) < 1e-5
    assert be.binds == 2
    prior = np.random.default_rng(9).standard_normal(p.output_shape).astype(np.float32)
    out = prior.copy()
    k.run(ConvTensors(p, x, w, out), 2.0, 0.5)  # new scalars: bound anew, once
    assert be.binds == 4
    assert rel_err(out, reference(p, Direction.FORWARD, x, w, prior, 2.0, 0.5)) < 1e-5


@pytest.mark.parametrize("direction", list(Direction))
def test_a_refused_configuration_is_replanned_by_the_planner(direction):
    """The backend raises instead of substituting; the kernel asks the planner for
    a plan without that algorithm, warns once, and conv.plans names what ran."""
    be = BindingBackend(refuse={1})
    p = ConvProblem((8, 3, 6, 6), (4, 3, 3, 3), padding=1)
    forced = make_plan([MicroBatch(0, 4, 1), MicroBatch(4, 4, 1)], undivided_time_ms=1.0,
                       workspace_limit=None, problem=p, direction=direction)
    conv = mu.Convolution(p.x_shape, p.w_shape, padding=1, backend=be, cache=False,
                          plans={direction: forced})
    rng = np.random.default_rng(4)
    x, w, y = (rng.standard_normal(s).astype(np.float32) for s in
               (p.x_shape, p.w_shape, p.output_shape))
    run = {Direction.FORWARD: lambda: conv.forward(x, w),
           Direction.BACKWARD_DATA: lambda: conv.backward_data(y, w),
           Direction.BACKWARD_FILTER: lambda: conv.backward_filter(x, y)}[direction]
    with pytest.warns(FallbackWarning, match="refused"):
        out = run()
    ran = conv.plans[direction]
    assert all(m.algo != 1 for m in ran.micro_batches)
    assert rel_err(out, reference(p, direction, x, w, y)) < 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = run()  # warned once; the re-planned plan is bound now
    assert rel_err(out, reference(p, direction, x, w, y)) < 1e-5


def test_nothing_left_to_run_is_an_error():
    be = BindingBackend(refuse={0, 1, 2})
    p, x, w, y, plan = _setup()
    k = Kernel(be, p, Direction.FORWARD, Planner(be, None, cache=False), plan=plan)
    with pytest.raises(UnsupportedConfigError):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            k.run(ConvTensors(p, x, w, y))
