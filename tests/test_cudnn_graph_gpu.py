"""The cudnn-graph backend (cuDNN's backend API) on a real GPU (marker gpu).

Every engine config find() reports is run, in all three directions, float32
(FMA and default math), float16 and bfloat16, NCHW/NHWC, grouped, dilated,
strided, 2-D and 3-D, and checked against the float64 NumPy reference
(tests/reference.py) and, where torch is installed, torch on the device.
Outputs are poisoned with NaN before every beta = 0 call. Also: alpha/beta
with pre-filled outputs (baked into the plan: part of the plan key), pointer
alignment below 16 bytes (micro-batch views), micro-batched == unsplit through
mucudnn.Convolution(backend="cudnn-graph") with forced plans mixing sizes and
engines, backward-filter accumulation across micro-batches, bounded caches, and
no leak over 10,000 executions.

Kept small so that the whole file runs in well under three minutes on an H200:
``python -m pytest -q -m gpu tests/test_cudnn_graph_gpu.py``
"""

from __future__ import annotations

import ctypes
import functools
import gc
import re
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mucudnn.cuda as mc
from mucudnn import Backend, ConvProblem, Direction
from mucudnn._cudnn import graph_descriptors as gd
from mucudnn._cudnn.backend_api import live_backend_descriptors
from mucudnn._cudnn.enums import BackendNumericalNote as Note
from mucudnn.backends.base import OUTPUT_OF, ConvTensors
from mucudnn.backends.cudnn_graph import CudnnGraphBackend
from mucudnn.problem import MicroBatch, make_plan
from conv_support import (CONFIGS, DIRECTIONS, MiB, FindMemo, backend_fixture,
                          convolution_for, normal_tensors, problem, run_algo, run_direction,
                          torch_result, uniform_tensors)
from reference import reference, rel_err, to_canonical_array

pytestmark = pytest.mark.gpu

FIND_LIMIT = 256 * MiB
CONFIGS = {**CONFIGS, "bf16-default": ("bfloat16", "default", 1e-2)}
# every case, every config at least twice, every layout and 2-D/3-D with fma and a half type
MATRIX = [
    ("2d-nchw", "f32-fma"), ("2d-nchw", "f32-default"), ("2d-nchw", "bf16-default"),
    ("2d-nchw", "f16-default"),
    ("2d-nhwc-stride2", "f32-fma"), ("2d-nhwc-stride2", "f16-default"),
    ("2d-grouped-dilated", "f32-fma"), ("2d-grouped-dilated", "bf16-default"),
    ("2d-nhwc-grouped-5x5", "f32-default"), ("2d-nhwc-grouped-5x5", "f16-default"),
    ("2d-1x1-stride2", "f32-fma"),
    ("3d-ncdhw", "f32-fma"), ("3d-ncdhw", "f16-default"),
    ("3d-ndhwc-grouped-dilated", "f32-default"), ("3d-ndhwc-grouped-dilated", "bf16-default"),
]


be = backend_fixture(CudnnGraphBackend, FIND_LIMIT)
_find = FindMemo(FIND_LIMIT)
# host data rounded through float32 in every dtype (bfloat16 too), given to torch as float32
_host = functools.partial(uniform_tensors, via_float32=True)
_torch_result = functools.partial(torch_result, via_float32=True)


def _notes(be, p, direction):
    return {i.id: set(i.numerical_notes) for i in be.engine_configs(p, direction)}


def _tolerance(notes, dtype, math, tol):
    transform = {int(Note.FFT), int(Note.WINOGRAD), int(Note.WINOGRAD_TILE_4x4),
                 int(Note.WINOGRAD_TILE_6x6), int(Note.WINOGRAD_TILE_13x13)}
    if dtype == "float32" and math == "fma" and notes & transform:
        return max(tol, 1e-4)  # transform-based engines round differently (as in the legacy API)
    return tol


# -- the backend ------------------------------------------------------------------------------

def test_backend_identity(be):
    from mucudnn.backends import get_backend

    assert isinstance(be, Backend)
    assert be.name == "cudnn-graph"
    assert re.fullmatch(r"9\.\d+\.\d+", be.version)
    assert be.device_name and be.device_name == mc.device_name(be.device)
    assert be.handle.stream_handle == be.stream.handle
    assert be.find_workspace_cap() == FIND_LIMIT
    assert get_backend("cudnn-graph") is get_backend("cudnn-graph")
    assert get_backend("cudnn-graph").name == "cudnn-graph"


@pytest.mark.parametrize("case, config", MATRIX, ids=[f"{c}-{k}" for c, k in MATRIX])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_every_found_engine_is_correct(be, case, config, direction):
    dtype, math, tol = CONFIGS[config]
    p = problem(case, dtype, math)
    perfs = _find(be, p, direction)
    assert perfs, f"no engine config ran for {p} {direction}"
    assert [a.time_ms for a in perfs] == sorted(a.time_ms for a in perfs)
    notes = _notes(be, p, direction)
    rng = np.random.default_rng(zlib.crc32(f"{case}/{config}/{direction}".encode()))
    hx, hw, hy = _host(p, rng)
    truth = reference(p, direction, hx, hw, hy)
    errs = []
    for perf in perfs:
        assert isinstance(perf.algo, str) and gd.parse_engine_config_id(perf.algo)
        assert perf.workspace_bytes <= FIND_LIMIT and perf.math_type == 0
        assert perf.determinism in (0, 1)
        n = notes[perf.algo]
        assert int(Note.DOWN_CONVERT_INPUTS) not in n
        assert int(Note.REDUCED_PRECISION_REDUCTION) not in n
        if math == "fma":
            assert int(Note.TENSOR_CORE) not in n, perf
        assert (perf.determinism == 0) == (int(Note.NONDETERMINISTIC) in n)
        assert be.workspace_size(p, direction, perf.algo) == perf.workspace_bytes
        got = run_algo(be, p, direction, perf.algo, 0, hx, hw, hy)
        assert not np.isnan(got.astype(np.float64)).any(), (perf, "NaN poison survived")
        err = rel_err(got, truth)
        errs.append((perf.algo, err))
        assert err < _tolerance(n, dtype, math, tol), (perf, err, sorted(n))
    print(f"{case} {config} {direction}: (engine config, rel err) {errs}")
    try:
        theirs = _torch_result(p, direction, hx, hw, hy, math)
    except pytest.skip.Exception:
        return
    ours = to_canonical_array(run_algo(be, p, direction, perfs[0].algo, 0, hx, hw, hy), p.layout)
    t = _tolerance(notes[perfs[0].algo], dtype, math, tol)
    assert rel_err(ours, theirs) < 2 * t
    assert rel_err(theirs, to_canonical_array(truth, p.layout)) < 2 * t


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_float64_uses_double_scalars(be, direction):
    p = problem("2d-grouped-dilated", "float64", "default")
    perfs = be.find(p, direction, FIND_LIMIT)
    if not perfs:
        pytest.skip("no float64 engine for this problem")
    rng = np.random.default_rng(64)
    hx, hw, hy = _host(p, rng)
    truth = reference(p, direction, hx, hw, hy, alpha=2.5, beta=-1.25)
    for perf in perfs:
        got = run_algo(be, p, direction, perf.algo, 0, hx, hw, hy, alpha=2.5, beta=-1.25)
        assert rel_err(got, truth) < 1e-12, perf


@pytest.mark.parametrize("alpha, beta", [(0.5, 0.75), (1.0, 1.0), (-2.0, 0.5), (0.0, 1.0)])
@pytest.mark.parametrize("case", ["2d-nchw", "2d-nhwc-grouped-5x5", "3d-ndhwc-grouped-dilated"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_alpha_beta_with_prefilled_output(be, case, direction, alpha, beta):
    p = problem(case, "float32", "fma")
    perfs = _find(be, p, direction)
    notes = _notes(be, p, direction)
    rng = np.random.default_rng(7)
    hx, hw, hy = _host(p, rng)  # the written tensor's prior value is random, not zero
    truth = reference(p, direction, hx, hw, hy, alpha=alpha, beta=beta)
    for perf in perfs[:2]:
        got = run_algo(be, p, direction, perf.algo, 0, hx, hw, hy, alpha=alpha, beta=beta)
        assert rel_err(got, truth) < _tolerance(notes[perf.algo], "float32", "fma", 1e-5)


def test_alpha_beta_are_part_of_the_plan_key(be):
    p = problem("2d-1x1-stride2", "float32", "fma")
    a = _find(be, p, Direction.FORWARD)[0].algo
    rng = np.random.default_rng(9)
    hx, hw, hy = _host(p, rng)
    x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
    ws = be.alloc_workspace(be.workspace_size(p, Direction.FORWARD, a) or 1)
    t = ConvTensors(p, x, w, y)
    l0 = be.bind(Direction.FORWARD, a, 0, t, 1.0, 0.0, ws)
    l1 = be.bind(Direction.FORWARD, a, 0, t, 1.0, 1.0, ws)
    assert l0.keep[0] is not l1.keep[0]  # two finalized plans
    assert be.bind(Direction.FORWARD, a, 0, t, 1.0, 0.0, ws).keep[0] is l0.keep[0]  # cached
    assert be.bind(Direction.FORWARD, a, 0, t, 1.0, 0.0, ws).keep[1] is l0.keep[1]  # pack too
    l0()
    l1()  # y = conv + conv
    got = be.to_host(y)
    assert rel_err(got, 2 * reference(p, Direction.FORWARD, hx, hw, hy)) < 1e-5
    for arr in (x, w, y, ws):
        arr.close()


def test_find_respects_the_limit(be):
    p = problem("2d-nchw", "float32", "default")
    for direction in DIRECTIONS:
        everything = _find(be, p, direction)
        none = be.find(p, direction, 0)
        assert none and all(a.workspace_bytes == 0 for a in none)
        assert {a.algo for a in none} <= {a.algo for a in everything}
        small = be.find(p, direction, 64 << 10)
        assert all(a.workspace_bytes <= 64 << 10 for a in small)
        for a in everything:
            assert a.time_ms >= 0 and gd.format_engine_config_id(
                *gd.parse_engine_config_id(a.algo)) == a.algo


def test_too_small_workspace_and_wrong_arguments_raise(be):
    p = problem("2d-nchw", "float32", "fma")
    rng = np.random.default_rng(3)
    hx, hw, hy = _host(p, rng)
    tensors = ConvTensors(p, be.from_host(hx), be.from_host(hw), be.empty(p.output_shape, p.dtype))
    with pytest.raises(ValueError, match="engine-config id"):
        be.run(Direction.FORWARD, 1, 0, tensors, 1.0, 0.0, None)  # a legacy algo number
    with pytest.raises(ValueError, match="tensors.x"):
        q = p.with_batch(2)
        be.run(Direction.FORWARD, _find(be, p, Direction.FORWARD)[0].algo, 0,
               ConvTensors(p, be.empty(q.x_shape, "float32"), tensors.w, tensors.y), 1.0, 0.0,
               None)
    for direction in DIRECTIONS:
        needy = [a for a in _find(be, p, direction) if a.workspace_bytes > 0]
        if not needy:
            continue
        a = needy[0]
        small = be.alloc_workspace(a.workspace_bytes - 1)
        with pytest.raises(ValueError, match="workspace"):
            be.run(direction, a.algo, 0, tensors, 1.0, 0.0, small)
        with pytest.raises(ValueError, match="workspace"):
            be.run(direction, a.algo, 0, tensors, 1.0, 0.0, None)
        small.close()
        return
    pytest.skip("no engine config needs workspace here")


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("float16", 1e-2)])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_micro_batch_views_below_16_byte_alignment(be, direction, dtype, tol):
    """Rows of 3*5*7 elements: a view at row 1 is 4-byte (float32) or 2-byte (float16)
    aligned. Every engine found for the aligned problem still gives the right answer
    (directly, or through the logged fallback to one that supports the alignment)."""
    p = ConvProblem((3, 3, 5, 7), (4, 3, 3, 3), padding=1, dtype=dtype,
                    math="fma" if dtype == "float32" else "default")
    q = p.with_batch(2)
    rng = np.random.default_rng(21)
    hx, hw, hy = _host(p, rng)
    truth = reference(q, direction, hx[1:], hw, hy[1:])
    perfs = _find(be, q, direction)
    assert perfs
    for perf in perfs[:6]:
        x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
        out = {"x": x, "w": w, "y": y}[OUTPUT_OF[direction]]
        if direction is Direction.BACKWARD_FILTER:
            out.fill_nan(stream=be.stream)
        else:
            out[1:].fill_nan(stream=be.stream)
        ws = be.alloc_workspace(max(perf.workspace_bytes, 1 << 20))
        t = ConvTensors(q, x[1:], w, y[1:])
        assert gd.pointer_alignment(t.x.ptr) < 16
        be.run(direction, perf.algo, 0, t, 1.0, 0.0, ws)
        got = be.to_host(out)
        got = got if direction is Direction.BACKWARD_FILTER else got[1:]
        assert rel_err(got, truth) < _tolerance(set(), dtype, "fma", tol), perf
        for a in (x, w, y, ws):
            a.close()


# -- through the engine: micro-batched == unsplit ----------------------------------------------

_conv = functools.partial(convolution_for, backend="cudnn-graph")
_call = functools.partial(run_direction, assert_returns_out=False)


@pytest.fixture
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.delenv("MUCUDNN_WORKSPACE_LIMIT", raising=False)


SPLIT = {Direction.FORWARD: 1e-6, Direction.BACKWARD_DATA: 1e-6, Direction.BACKWARD_FILTER: 1e-5}
ENGINE_PROBLEMS = [
    ConvProblem((13, 8, 9, 9), (16, 8, 3, 3), padding=1, math="fma"),
    ConvProblem((10, 9, 7, 12), (12, 3, 3, 4), padding=1, stride=2, groups=3, layout="NHWC",
                math="fma"),
    ConvProblem((7, 4, 5, 6, 6), (8, 4, 3, 3, 3), padding=1, dilation=(1, 2, 1), layout="NCDHW",
                math="fma"),
]


def _engines_at(be, p, d, size):
    return [a.algo for a in _find(be, p.with_batch(size), d)]


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_micro_batched_equals_unsplit_and_reference(be, _cache, data):
    p = data.draw(st.sampled_from(ENGINE_PROBLEMS))
    d = data.draw(st.sampled_from(DIRECTIONS))
    sizes, left = [], p.batch
    while left:
        s = left if len(sizes) == 3 else data.draw(st.integers(1, left))
        sizes.append(s)
        left -= s
    # one engine config common to every size: only the split differs from the unsplit call
    common = set(_engines_at(be, p, d, p.batch))
    for s in set(sizes):
        common &= set(_engines_at(be, p, d, s))
    alpha, beta = data.draw(st.sampled_from([(1.0, 0.0), (2.0, 0.0), (0.5, 1.0), (-1.5, 0.25)]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    x, w, y = normal_tensors(p, rng)
    truth = reference(p, d, x, w, y, alpha, beta)
    if common:
        algo = data.draw(st.sampled_from(sorted(common)))
        mbs, off = [], 0
        for s in sizes:
            mbs.append(MicroBatch(off, s, algo))
            off += s
        plan = make_plan(mbs, undivided_time_ms=1, workspace_limit=None)
        whole = make_plan([MicroBatch(0, p.batch, algo)], undivided_time_ms=1,
                          workspace_limit=None)
        micro = _call(_conv(p, plans={d: plan}), d, x, w, y, alpha, beta, poison=True)
        unsplit = _call(_conv(p, plans={d: whole}), d, x, w, y, alpha, beta)
        assert rel_err(micro, unsplit) < SPLIT[d], (p, d, algo, sizes)
        assert rel_err(micro, truth) < 1e-5
    # mixed engine configs, one per micro-batch
    mbs, off = [], 0
    for s in sizes:
        mbs.append(MicroBatch(off, s, data.draw(st.sampled_from(_engines_at(be, p, d, s)))))
        off += s
    plan = make_plan(mbs, undivided_time_ms=1, workspace_limit=None)
    mixed = _call(_conv(p, plans={d: plan}), d, x, w, y, alpha, beta, poison=True)
    assert np.isfinite(mixed).all()
    assert rel_err(mixed, truth) < 1e-4, (p, d, mbs)


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_backward_filter_accumulates_across_micro_batches(be, _cache, beta):
    p = ConvProblem((16, 4, 7, 7), (8, 4, 3, 3), padding=1, math="fma")
    d = Direction.BACKWARD_FILTER
    a8, a4 = _engines_at(be, p, d, 8), _engines_at(be, p, d, 4)
    plan = make_plan([MicroBatch(0, 8, a8[0]), MicroBatch(8, 4, a4[-1]),
                      MicroBatch(12, 4, a4[0])], undivided_time_ms=1, workspace_limit=None)
    rng = np.random.default_rng(2)
    x, w, y = normal_tensors(p, rng)
    dw = _call(_conv(p, plans={d: plan}), d, x, w, y, 1.5, beta, poison=True)
    assert np.isfinite(dw).all()
    assert rel_err(dw, reference(p, d, x, w, y, 1.5, beta)) < 1e-4


def test_optimised_plans_under_a_limit(be, _cache):
    p = ConvProblem((24, 8, 10, 10), (16, 8, 3, 3), padding=1, math="fma")
    conv = _conv(p, workspace_limit=1 << 20, policy="powerOfTwo")
    rng = np.random.default_rng(4)
    x, w, y = normal_tensors(p, rng)
    for d in DIRECTIONS:
        out = _call(conv, d, x, w, y, 1.0, 0.0, poison=True)
        assert conv.plans[d].batch == 24 and conv.plans[d].workspace_bytes <= 1 << 20
        assert all(isinstance(m.algo, str) for m in conv.plans[d].micro_batches)
        assert rel_err(out, reference(p, d, x, w, y)) < 1e-4


# -- caches and leaks ----------------------------------------------------------------------------

def test_ten_thousand_executions_leak_nothing(be):
    p = problem("2d-nchw", "float32", "fma")
    rng = np.random.default_rng(11)
    hx, hw, hy = _host(p, rng)
    x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
    dx, dw, out = be.empty(p.x_shape, "float32"), be.from_host(hw), be.empty(p.output_shape,
                                                                           "float32")
    tensors = {Direction.FORWARD: ConvTensors(p, x, w, out),
               Direction.BACKWARD_DATA: ConvTensors(p, dx, w, y),
               Direction.BACKWARD_FILTER: ConvTensors(p, x, dw, y)}
    chosen = {d: be.find(p, d, 64 * MiB)[0].algo for d in DIRECTIONS}
    ws = be.alloc_workspace(max(be.workspace_size(p, d, a) for d, a in chosen.items()) or 1)
    for d, a in chosen.items():  # warm-up: every plan and variant pack cached
        be.run(d, a, 0, tensors[d], 1.0, 0.0, ws)
    be.synchronize()
    gc.collect()
    free0, _ = mc.mem_get_info()
    live0, alloc0 = live_backend_descriptors(), mc.memory_allocated()
    sizes0 = be.cache_sizes()
    for i in range(10_000):
        d = DIRECTIONS[i % 3]
        be.run(d, chosen[d], 0, tensors[d], 1.0, 0.0, ws)
    be.synchronize()
    gc.collect()
    free1, _ = mc.mem_get_info()
    assert live_backend_descriptors() == live0
    assert be.cache_sizes() == sizes0
    assert mc.memory_allocated() == alloc0
    assert free0 - free1 <= 2 * MiB, (free0, free1)
    assert rel_err(be.to_host(out), reference(p, Direction.FORWARD, hx, hw, hy)) < 1e-4
    for arr in (x, w, y, dx, dw, out, ws):
        arr.close()


def test_caches_are_bounded_and_closed():
    gc.collect()
    live0 = live_backend_descriptors()
    with CudnnGraphBackend(find_workspace_limit=16 * MiB, plan_cache_size=2,
                           graph_cache_size=2, pack_cache_size=2,
                           heuristic_modes=("A",)) as b:
        problems = [ConvProblem((n, 8, 9, 11), (16, 8, 1, 1), stride=2, math="fma")
                    for n in (1, 2, 3, 4)]
        rng = np.random.default_rng(1)
        for q in problems:
            a = b.find(q, Direction.FORWARD, 16 * MiB)[0].algo
            hx, hw, hy = _host(q, rng)
            x, w, y = b.from_host(hx), b.from_host(hw), b.from_host(hy)
            ws = b.alloc_workspace(b.workspace_size(q, Direction.FORWARD, a) or 1)
            launch = b.bind(Direction.FORWARD, a, 0, ConvTensors(q, x, w, y), 1.0, 0.0, ws)
            launch()
            assert rel_err(b.to_host(y), reference(q, Direction.FORWARD, hx, hw, hy)) < 1e-4
            sizes = b.cache_sizes()
            assert sizes["plans"] <= 2 and sizes["graphs"] <= 2 and sizes["packs"] <= 4
            for arr in (x, w, y, ws):
                arr.close()
        # a launcher whose plan the cache closed refuses to run (the engine rebinds)
        for q in problems[:3]:
            b.find(q, Direction.FORWARD, 16 * MiB)
        # ctypes wraps the descriptor's ValueError in an ArgumentError
        with pytest.raises((ValueError, ctypes.ArgumentError), match="closed"):
            launch()
        b.synchronize()
    gc.collect()
    assert live_backend_descriptors() == live0
