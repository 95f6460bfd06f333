"""Bound launchers (exec.prepare and the per-kernel LaunchCache) with a backend that binds."""

import ctypes

import numpy as np

from mucudnn.backends import ConvTensors, get_backend
from mucudnn.exec import LaunchCache, prepare
from mucudnn.problem import ConvProblem, Direction, MicroBatch, make_plan

from reference import reference, rel_err


class BindingBackend:
    """The NumPy backend plus a bind() that counts bindings, like the GPU backends."""

    def __init__(self):
        self._np = get_backend("numpy")
        self.binds = 0
        self.stale = False
        for n in ("name", "device_name", "version", "find", "workspace_size", "run", "empty",
                  "from_host", "to_host", "alloc_workspace", "synchronize"):
            setattr(self, n, getattr(self._np, n))

    def bind(self, direction, algo, math_type, tensors, alpha, beta, workspace):
        self.binds += 1
        args = (direction, algo, math_type, tensors, alpha, beta, workspace)

        def launch():
            if self.stale:  # what a closed descriptor does inside a ctypes call
                self.stale = False
                raise ctypes.ArgumentError("argument 1: ValueError: TensorDescriptor is closed")
            self._np.run(*args)
        return launch


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


def test_launch_cache_checks_liveness_before_running():
    """A plan whose second micro-batch went stale is rebound before anything
    runs, so beta is applied once (a half-run plan run again would apply it twice)."""
    be = BindingBackend()
    p, x, w, y, plan = _setup()
    ws = be.alloc_workspace(1 << 20)
    t = ConvTensors(p, x, w, y.copy())
    dead = []
    orig = be.bind

    def bind(*a):
        launch = orig(*a)
        n = be.binds
        launch.alive = lambda: n not in dead
        return launch
    be.bind = bind
    cache = LaunchCache(be)
    make = lambda: prepare(plan, be, t, 1.0, 0.5, ws)  # noqa: E731
    prior = t.y.copy()
    cache.run(plan, t, ws, 1.0, 0.5, make)
    dead.append(2)  # the second micro-batch's launcher is now stale
    t.y[...] = prior
    cache.run(plan, t, ws, 1.0, 0.5, make)
    assert be.binds == 4
    assert rel_err(t.y, reference(p, Direction.FORWARD, x, w, prior, 1.0, 0.5)) < 1e-5


def test_launch_cache_reuses_and_rebinds_a_stale_launcher():
    be = BindingBackend()
    p, x, w, y, plan = _setup()
    ws = be.alloc_workspace(1 << 20)
    t = ConvTensors(p, x, w, y.copy())
    cache = LaunchCache(be)
    make = lambda: prepare(plan, be, t, 1.0, 0.0, ws)  # noqa: E731
    cache.run(plan, t, ws, 1.0, 0.0, make)
    cache.run(plan, t, ws, 1.0, 0.0, make)
    assert be.binds == 2 and len(cache) == 1
    be.stale = True  # the first micro-batch's launcher now fails before doing anything
    t.y[...] = np.nan
    cache.run(plan, t, ws, 1.0, 0.0, make)
    assert be.binds == 4 and len(cache) == 1
    assert rel_err(t.y, reference(p, Direction.FORWARD, x, w, y)) < 1e-5
    cache.run(plan, t, ws, 0.5, 0.0, make)  # new scalars: a new entry
    assert len(cache) == 2
