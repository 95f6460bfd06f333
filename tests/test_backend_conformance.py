"""One conformance suite over every backend: numpy on the CPU; cudnn (legacy API) and
cudnn-graph (backend API) on a GPU (marker gpu, skipped cleanly without one).

Every algorithm or engine config find() reports is run in all three directions,
float32 (FMA and default math) and float16 (bfloat16 on cudnn-graph), NCHW/NHWC,
grouped, dilated, strided, 2-D and 3-D, and checked against the float64 NumPy
reference (tests/reference.py) and, on a GPU where torch is installed, torch on
the device. Outputs are poisoned with NaN before every beta = 0 call. Then
alpha/beta with pre-filled outputs, Find's limits and workspace numbers,
errors for a too-small workspace and wrong tensors, bound launchers serving any
buffers, micro-batched == unsplit through mucudnn.Convolution with forced plans
mixing sizes and algorithms, backward-filter accumulation, optimised plans
under a limit, and (GPU) no leak over thousands of executions.

Backend-specific tests stay beside their backend: tests/test_cudnn_backend_gpu.py
(handles, legacy descriptors) and tests/test_cudnn_graph_gpu.py (engine notes,
plan keys, alignment, the graph caches).
"""

from __future__ import annotations

import gc
import re
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mucudnn.cuda as mc
from mucudnn import Backend, BackendBase, ConvProblem, Direction
from mucudnn.backends import fold
from mucudnn.backends.find_options import default_search_name
from mucudnn.backends.base import OUTPUT_OF, ConvTensors
from mucudnn.errors import UnsupportedConfigError
from mucudnn.exec import bind_plan
from mucudnn.problem import MicroBatch, make_plan
from conv_support import (BACKENDS, CASES, CONFIGS, DIRECTIONS, MiB, FindMemo, composition,
                          convolution_for, make_backend, normal_tensors, poison, problem,
                          problems, release, run_algo, run_direction, tolerance, torch_result,
                          uniform_tensors)
from reference import reference, rel_err, to_canonical_array

FIND_LIMIT = 256 * MiB
_find = FindMemo(FIND_LIMIT)


@pytest.fixture(scope="module", params=BACKENDS)
def be(request):
    b = make_backend(request.param, FIND_LIMIT)
    yield b
    if request.param != "numpy":
        b.close()


def _configs(be):
    """The configs a backend is checked in (NumPy: float32 only, it computes the same)."""
    if be.is_host:
        return {"f32-fma": CONFIGS["f32-fma"]}
    extra = {"bf16-default": ("bfloat16", "default", 1e-2)} if be.name == "cudnn-graph" else {}
    return {**CONFIGS, **extra}


def _host(p, rng):
    # float32-exact data in every dtype (bfloat16 too), as torch gets it
    return uniform_tensors(p, rng, via_float32=True)


# -- identity and the protocol ------------------------------------------------------------------

def test_identity_and_protocol(be):
    assert isinstance(be, BackendBase) and isinstance(be, Backend)
    assert be.name in ("numpy", "cudnn", "cudnn-graph") and be.device_name and be.version
    if be.is_host:
        assert be.stream is None and be.device is None and not be.supports_graphs
        assert be.mem_get_info() is None
    else:
        assert re.fullmatch(r"9\.\d+\.\d+", be.version)
        assert be.device_name == mc.device_name(be.device)
        assert isinstance(be.stream, mc.Stream) and be.supports_graphs
        assert be.handle.stream_handle == be.stream.handle
        assert be.find_workspace_cap() == FIND_LIMIT
        free, total = be.mem_get_info()
        assert 0 < free <= total


def test_cache_name_changes_exactly_where_find_reports_more(be):
    """See Note [candidate sets in keys]: a problem's key names a variant of the
    backend only where find() reports configurations beyond the plain set
    (folded first layers: cudnn-graph folds by default, numpy and cudnn do not)."""
    base = default_search_name(be.name)  # the default search's key (Note [search parity])
    plain = problem("2d-nchw", "float32", "default")
    assert be.cache_name(plain) == base
    p = problem("2d-nhwc-stride2", "float32", "default")
    assert fold.fold_of(p) is not None
    folded = any(fold.split_fold_id(r.algo) for r in _find(be, p, Direction.FORWARD))
    assert be.cache_name(p) == (base + fold.CACHE_SUFFIX if folded else base)
    assert folded == (be.name == "cudnn-graph")


def test_blocked_workspace_is_over_the_limit_or_none(be):
    """Backend.blocked_workspace (Note [size pruning]): None or more than the
    limit; None under a limit every configuration fits."""
    p = problem("2d-nchw", "float32", "default")
    for d in DIRECTIONS:
        assert be.blocked_workspace(p, d, 1 << 40) is None
        b = be.blocked_workspace(p, d, 0)
        assert b is None or b > 0


# -- every algorithm is right ---------------------------------------------------------------------

@pytest.mark.parametrize("config", list(CONFIGS) + ["bf16-default"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_every_found_algorithm_is_correct(be, case, config, direction):
    configs = _configs(be)
    if config not in configs:
        pytest.skip(f"{config} is not checked on {be.name}")
    dtype, math, tol = configs[config]
    p = problem(case, dtype, math)
    perfs = _find(be, p, direction)
    assert perfs, f"no algorithm ran for {p} {direction}"
    assert [a.time_ms for a in perfs] == sorted(a.time_ms for a in perfs)
    rng = np.random.default_rng(zlib.crc32(f"{case}/{config}/{direction}".encode()))
    hx, hw, hy = _host(p, rng)
    truth = reference(p, direction, hx, hw, hy)
    errs = []
    for perf in perfs:
        assert perf.workspace_bytes <= FIND_LIMIT and perf.time_ms >= 0
        assert be.workspace_size(p, direction, perf.algo, perf.math_type) <= perf.workspace_bytes
        got = run_algo(be, p, direction, perf.algo, perf.math_type, hx, hw, hy)
        assert not np.isnan(got.astype(np.float64)).any(), (perf, "NaN poison survived")
        err = rel_err(got, truth)
        errs.append((perf.algo, err))
        assert err < tolerance(be, p, direction, perf.algo, tol), (perf, err)
    print(f"{be.name} {case} {config} {direction}: (algo, rel err) {errs}")
    if be.is_host:
        return
    try:
        theirs = torch_result(p, direction, hx, hw, hy, math, via_float32=True)
    except pytest.skip.Exception:
        return
    ours = to_canonical_array(
        run_algo(be, p, direction, perfs[0].algo, perfs[0].math_type, hx, hw, hy), p.layout)
    t = tolerance(be, p, direction, perfs[0].algo, tol)
    assert rel_err(ours, theirs) < 2 * t
    assert rel_err(theirs, to_canonical_array(truth, p.layout)) < 2 * t


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_float64_uses_double_scalars(be, direction):
    p = problem("2d-grouped-dilated", "float64", "default")
    perfs = be.find(p, direction, FIND_LIMIT)
    if not perfs:
        pytest.skip("no float64 algorithm for this problem")
    rng = np.random.default_rng(64)
    hx, hw, hy = _host(p, rng)
    truth = reference(p, direction, hx, hw, hy, alpha=2.5, beta=-1.25)
    for perf in perfs:
        got = run_algo(be, p, direction, perf.algo, perf.math_type, hx, hw, hy,
                       alpha=2.5, beta=-1.25)
        assert rel_err(got, truth) < 1e-10, perf


@pytest.mark.parametrize("alpha, beta", [(0.5, 0.75), (1.0, 1.0), (-2.0, 0.5), (0.0, 1.0)])
@pytest.mark.parametrize("case", ["2d-nchw", "2d-nhwc-grouped-5x5", "3d-ndhwc-grouped-dilated"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_alpha_beta_with_prefilled_output(be, case, direction, alpha, beta):
    p = problem(case, "float32", "fma")
    perfs = _find(be, p, direction)
    rng = np.random.default_rng(7)
    hx, hw, hy = _host(p, rng)  # the written tensor's prior value is random, not zero
    truth = reference(p, direction, hx, hw, hy, alpha=alpha, beta=beta)
    for perf in perfs[:2]:
        got = run_algo(be, p, direction, perf.algo, perf.math_type, hx, hw, hy,
                       alpha=alpha, beta=beta)
        assert rel_err(got, truth) < tolerance(be, p, direction, perf.algo, 1e-5)


# -- find, workspace and argument errors ----------------------------------------------------------

def test_find_respects_the_limit(be):
    p = problem("2d-nchw", "float32", "default")
    for direction in DIRECTIONS:
        everything = _find(be, p, direction)
        none = be.find(p, direction, 0)
        assert none and all(a.workspace_bytes == 0 for a in none)
        if getattr(getattr(be, "find_options", None), "top_k", None) is None:
            assert {a.algo for a in none} <= {a.algo for a in everything}
        else:
            # See Note [find cut-offs]: each mode's k best of what fits the cap, so a
            # smaller cap may time configs a larger one cut; each still needs none
            assert all(be.workspace_size(p, direction, a.algo, a.math_type) == 0 for a in none)
        small = be.find(p, direction, 64 << 10)
        assert all(a.workspace_bytes <= 64 << 10 for a in small)
        for a in everything:
            assert a.determinism in (0, 1, None) and a.time_ms >= 0


def test_too_small_workspace_and_wrong_tensors_raise(be):
    p = problem("2d-nchw", "float32", "fma")
    q = p.with_batch(2)
    rng = np.random.default_rng(3)
    hx, hw, hy = _host(p, rng)
    tensors = ConvTensors(p, be.from_host(hx), be.from_host(hw), be.empty(p.output_shape, p.dtype))
    a0 = _find(be, p, Direction.FORWARD)[0]
    with pytest.raises(ValueError, match="x"):
        be.run(Direction.FORWARD, a0.algo, a0.math_type,
               ConvTensors(p, be.empty(q.x_shape, "float32"), tensors.w, tensors.y), 1.0, 0.0,
               be.alloc_workspace(a0.workspace_bytes) if a0.workspace_bytes else None)
    for direction in DIRECTIONS:
        needy = [a for a in _find(be, p, direction)
                 if be.workspace_size(p, direction, a.algo, a.math_type) > 0]
        if not needy:
            continue
        a = needy[0]
        need = be.workspace_size(p, direction, a.algo, a.math_type)
        small = be.alloc_workspace(need - 1)
        with pytest.raises(ValueError, match="workspace"):
            be.run(direction, a.algo, a.math_type, tensors, 1.0, 0.0, small)
        with pytest.raises(ValueError, match="workspace"):
            be.run(direction, a.algo, a.math_type, tensors, 1.0, 0.0, None)
        enough = be.alloc_workspace(need)
        got = run_algo(be, p, direction, a.algo, a.math_type, hx, hw, hy, workspace=enough)
        assert rel_err(got, reference(p, direction, hx, hw, hy)) < 1e-4
        release(small, enough, tensors.x, tensors.w, tensors.y)
        return
    pytest.skip("no algorithm needs workspace here")


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_a_bound_plan_serves_any_buffers(be, direction):
    """Launchers take addresses per call: one binding runs on fresh buffers."""
    p = problem("2d-nhwc-stride2", "float32", "fma")
    a2 = _find(be, p.with_batch(2), direction)[0]
    a1 = _find(be, p.with_batch(1), direction)[0]
    plan = make_plan([MicroBatch(0, 2, a2.algo, a2.math_type),
                      MicroBatch(2, 1, a1.algo, a1.math_type)],
                     undivided_time_ms=1, workspace_limit=None, problem=p, direction=direction)
    bound = bind_plan(plan, be)
    ws = be.alloc_workspace(max(bound.workspace_bytes, 1))
    addr = be.address
    for seed in range(3):
        rng = np.random.default_rng(seed)
        hx, hw, hy = _host(p, rng)
        x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
        out = {"x": x, "w": w, "y": y}[OUTPUT_OF[direction]]
        poison(be, out)
        with be.on_home_stream():
            bound(addr(x), addr(w), addr(y), addr(ws), int(ws.nbytes))
        got = be.to_host(out)
        tol = max(tolerance(be, p.with_batch(2), direction, a2.algo, 1e-5),
                  tolerance(be, p.with_batch(1), direction, a1.algo, 1e-5))
        assert rel_err(got, reference(p, direction, hx, hw, hy)) < 2 * tol
        release(x, w, y)
    release(ws)


# -- through the engine: micro-batched == unsplit ----------------------------------------------

@pytest.fixture
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.delenv("MUCUDNN_WORKSPACE_LIMIT", raising=False)


SPLIT = {Direction.FORWARD: 1e-6, Direction.BACKWARD_DATA: 1e-6, Direction.BACKWARD_FILTER: 1e-5}


def _algos_at(be, p, d, size):
    """(algo, math type) pairs the backend ran for ``p`` at micro-batch ``size``."""
    return [(a.algo, a.math_type) for a in _find(be, p.with_batch(size), d)]


def _call(be, p, d, x, w, y, alpha, beta, poisoned=False, **kw):
    conv = convolution_for(p, backend=be, **kw)
    return run_direction(conv, d, x, w, y, alpha, beta, poison=poisoned,
                         assert_returns_out=False)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_micro_batched_equals_unsplit_and_reference(be, _cache, data):
    """Random problems (2-D/3-D, both layouts, groups, dilation, padding, stride, odd
    sizes), random splits, random scalars; the hypothesis profile sets the count."""
    p = data.draw(problems())
    d = data.draw(st.sampled_from(DIRECTIONS))
    sizes = composition(data.draw, p.batch, parts=4)
    # one algorithm common to every size: only the split differs from the unsplit call
    common = set(_algos_at(be, p, d, p.batch))
    for s in set(sizes):
        common &= set(_algos_at(be, p, d, s))
    alpha, beta = data.draw(st.sampled_from([(1.0, 0.0), (2.0, 0.0), (0.5, 1.0), (-1.5, 0.25)]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    x, w, y = normal_tensors(p, rng)
    truth = reference(p, d, x, w, y, alpha, beta)
    if common:
        algo, mt = data.draw(st.sampled_from(sorted(common, key=str)))
        mbs, off = [], 0
        for s in sizes:
            mbs.append(MicroBatch(off, s, algo, mt))
            off += s
        plan = make_plan(mbs, undivided_time_ms=1, workspace_limit=None)
        whole = make_plan([MicroBatch(0, p.batch, algo, mt)], undivided_time_ms=1,
                          workspace_limit=None)
        micro = _call(be, p, d, x, w, y, alpha, beta, True, plans={d: plan},
                      workspace_limit=None)
        unsplit = _call(be, p, d, x, w, y, alpha, beta, plans={d: whole}, workspace_limit=None)
        assert rel_err(micro, unsplit) < SPLIT[d], (p, d, algo, sizes)
        assert rel_err(micro, truth) < 1e-4
    # mixed algorithms, one per micro-batch
    mbs, off = [], 0
    for s in sizes:
        algo, mt = data.draw(st.sampled_from(_algos_at(be, p, d, s)))
        mbs.append(MicroBatch(off, s, algo, mt))
        off += s
    plan = make_plan(mbs, undivided_time_ms=1, workspace_limit=None)
    mixed = _call(be, p, d, x, w, y, alpha, beta, True, plans={d: plan}, workspace_limit=None)
    assert np.isfinite(mixed).all()
    assert rel_err(mixed, truth) < 1e-4, (p, d, mbs)


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_backward_filter_accumulates_across_micro_batches(be, _cache, beta):
    p = ConvProblem((16, 4, 7, 7), (8, 4, 3, 3), padding=1, math="fma")
    d = Direction.BACKWARD_FILTER
    a8, a4 = _algos_at(be, p, d, 8), _algos_at(be, p, d, 4)
    plan = make_plan([MicroBatch(0, 8, *a8[0]), MicroBatch(8, 4, *a4[-1]),
                      MicroBatch(12, 4, *a4[0])], undivided_time_ms=1, workspace_limit=None)
    rng = np.random.default_rng(2)
    x, w, y = normal_tensors(p, rng)
    dw = _call(be, p, d, x, w, y, 1.5, beta, True, plans={d: plan}, workspace_limit=None)
    assert np.isfinite(dw).all()
    assert rel_err(dw, reference(p, d, x, w, y, 1.5, beta)) < 1e-4


def test_optimised_plans_under_a_limit(be, _cache):
    p = ConvProblem((24, 8, 10, 10), (16, 8, 3, 3), padding=1, math="fma")
    conv = convolution_for(p, backend=be, workspace_limit=1 << 20, policy="powerOfTwo")
    rng = np.random.default_rng(4)
    x, w, y = normal_tensors(p, rng)
    for d in DIRECTIONS:
        out = run_direction(conv, d, x, w, y, 1.0, 0.0, poison=True, assert_returns_out=False)
        assert conv.plans[d].batch == 24 and conv.plans[d].workspace_bytes <= 1 << 20
        assert rel_err(out, reference(p, d, x, w, y)) < 1e-4


def test_a_refused_configuration_never_runs_silently(be):
    """A backend either runs what it is given or raises UnsupportedConfigError."""
    p = problem("2d-nchw", "float32", "fma")
    bogus = "e99999" if be.name == "cudnn-graph" else 99
    with pytest.raises((UnsupportedConfigError, ValueError)):
        be.bind(Direction.FORWARD, bogus, 0, p, 0, p.batch, 1.0, 0.0, (16, 16, 16))


# -- leaks (GPU) ---------------------------------------------------------------------------------

def test_many_executions_leak_nothing(be):
    if be.is_host:
        pytest.skip("host memory is garbage collected; the GPU backends are checked")
    from mucudnn._cudnn import live_descriptors
    from mucudnn._cudnn.backend_api import live_backend_descriptors

    p = problem("2d-nchw", "float32", "fma")
    rng = np.random.default_rng(11)
    hx, hw, hy = _host(p, rng)
    x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
    dx, dw, out = be.empty(p.x_shape, "float32"), be.from_host(hw), be.empty(p.output_shape,
                                                                           "float32")
    tensors = {Direction.FORWARD: ConvTensors(p, x, w, out),
               Direction.BACKWARD_DATA: ConvTensors(p, dx, w, y),
               Direction.BACKWARD_FILTER: ConvTensors(p, x, dw, y)}
    chosen = {d: be.find(p, d, 64 * MiB)[0] for d in DIRECTIONS}
    ws = be.alloc_workspace(max(be.workspace_size(p, d, a.algo, a.math_type)
                                for d, a in chosen.items()) or 1)
    for d, a in chosen.items():  # warm-up: every kernel loaded, every descriptor cached
        be.run(d, a.algo, a.math_type, tensors[d], 1.0, 0.0, ws)
    be.synchronize()
    gc.collect()
    free0, _ = mc.mem_get_info()
    live0 = (live_descriptors(), live_backend_descriptors(), mc.memory_allocated())
    for i in range(3000):
        d = DIRECTIONS[i % 3]
        a = chosen[d]
        be.run(d, a.algo, a.math_type, tensors[d], 1.0, 0.0, ws)
    be.synchronize()
    gc.collect()
    free1, _ = mc.mem_get_info()
    assert (live_descriptors(), live_backend_descriptors(), mc.memory_allocated()) == live0
    assert free0 - free1 <= 2 * MiB, (free0, free1)  # a per-call leak would be >= 1000 pages
    assert rel_err(be.to_host(out), reference(p, Direction.FORWARD, hx, hw, hy)) < 1e-4
    release(x, w, y, dx, dw, out, ws)
