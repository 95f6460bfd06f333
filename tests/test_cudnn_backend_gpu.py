"""The cuDNN backend and handle on a real GPU (marker gpu; skipped without one).

Every algorithm cudnnFind*AlgorithmEx reports as successful is run, in all three
directions, float32 (FMA and default math) and float16, NCHW/NHWC, grouped,
dilated, strided, 2-D and 3-D, and checked against the float64 NumPy reference
(tests/reference.py) and, where torch is installed, against torch on the device.
Outputs are poisoned with NaN before every beta = 0 call. Leak checks: 10,000
descriptor cycles and 1,000 convolutions leave device memory and the live
descriptor counter unchanged.

Kept small so that the whole file runs in well under three minutes on an H200.
"""

from __future__ import annotations

import gc
import re
import zlib

import numpy as np
import pytest

import mucudnn.cuda as mc
from mucudnn import Backend, Direction
from mucudnn._cudnn import (
    ConvolutionBwdDataAlgo, ConvolutionBwdFilterAlgo, ConvolutionDescriptor,
    ConvolutionFwdAlgo, FilterDescriptor, Handle, MathType, TensorDescriptor, get_handle,
    live_descriptors, live_handles,
)
from mucudnn.backends.base import ConvTensors
from mucudnn.backends.cudnn import CudnnBackend
from conv_support import (CASES, CONFIGS, DIRECTIONS, MiB, FindMemo, backend_fixture,
                          problem, run_algo, torch_or_skip, torch_result, uniform_tensors)
from reference import reference, rel_err, to_canonical_array

pytestmark = pytest.mark.gpu

FIND_LIMIT = 512 * MiB

# Transform-based algorithms round differently from the GEMM/direct ones; with
# FMA math in float32 they get 1e-4 instead of 1e-5 (measured errors are printed).
_TRANSFORM_ALGOS = {
    Direction.FORWARD: {ConvolutionFwdAlgo.FFT, ConvolutionFwdAlgo.FFT_TILING,
                        ConvolutionFwdAlgo.WINOGRAD, ConvolutionFwdAlgo.WINOGRAD_NONFUSED},
    Direction.BACKWARD_DATA: {ConvolutionBwdDataAlgo.FFT, ConvolutionBwdDataAlgo.FFT_TILING,
                              ConvolutionBwdDataAlgo.WINOGRAD,
                              ConvolutionBwdDataAlgo.WINOGRAD_NONFUSED},
    Direction.BACKWARD_FILTER: {ConvolutionBwdFilterAlgo.FFT, ConvolutionBwdFilterAlgo.FFT_TILING,
                                ConvolutionBwdFilterAlgo.WINOGRAD_NONFUSED},
}


def _tolerance(direction, algo, dtype, math, tol):
    if dtype == "float32" and math == "fma" and algo in _TRANSFORM_ALGOS[direction]:
        return max(tol, 1e-4)
    return tol


be = backend_fixture(CudnnBackend, FIND_LIMIT)
_find = FindMemo(FIND_LIMIT)


# -- the backend ------------------------------------------------------------------------

def test_backend_identity(be):
    assert isinstance(be, Backend)
    assert be.name == "cudnn"
    assert re.fullmatch(r"9\.\d+\.\d+", be.version)
    assert be.device_name and be.device_name == mc.device_name(be.device)
    assert isinstance(be.stream, mc.Stream)
    assert be.handle.stream_handle == be.stream.handle
    assert be.find_workspace_cap() == FIND_LIMIT


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_every_found_algorithm_is_correct(be, case, config, direction):
    dtype, math, tol = CONFIGS[config]
    p = problem(case, dtype, math)
    perfs = _find(be, p, direction)
    assert perfs, f"cuDNN found no algorithm for {p} {direction}"
    assert [a.time_ms for a in perfs] == sorted(a.time_ms for a in perfs)
    rng = np.random.default_rng(zlib.crc32(f"{case}/{config}/{direction}".encode()))
    hx, hw, hy = uniform_tensors(p, rng)
    truth = reference(p, direction, hx, hw, hy)
    errs = []
    for perf in perfs:
        assert perf.workspace_bytes <= FIND_LIMIT
        if math == "fma":
            assert perf.math_type == MathType.FMA_MATH
        got = run_algo(be, p, direction, perf.algo, perf.math_type, hx, hw, hy)
        assert not np.isnan(got.astype(np.float64)).any(), (perf, "NaN poison survived")
        err = rel_err(got, truth)
        errs.append((perf.algo, perf.math_type, err))
        assert err < _tolerance(direction, perf.algo, dtype, math, tol), (perf, err)
    print(f"{case} {config} {direction}: (algo, math, rel err) {errs}")
    # the fastest algorithm against torch on the device
    try:
        theirs = torch_result(p, direction, hx, hw, hy, math)
    except pytest.skip.Exception:
        return
    ours = to_canonical_array(
        run_algo(be, p, direction, perfs[0].algo, perfs[0].math_type, hx, hw, hy), p.layout)
    t = _tolerance(direction, perfs[0].algo, dtype, math, tol)
    assert rel_err(ours, theirs) < 2 * t
    assert rel_err(theirs, to_canonical_array(truth, p.layout)) < 2 * t


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_float64_uses_double_scalars(be, direction):
    p = problem("2d-grouped-dilated", "float64", "default")
    perfs = be.find(p, direction, FIND_LIMIT)
    if not perfs:
        pytest.skip("no float64 algorithm for this problem")
    rng = np.random.default_rng(64)
    hx, hw, hy = uniform_tensors(p, rng)
    for perf in perfs:
        got = run_algo(be, p, direction, perf.algo, perf.math_type, hx, hw, hy,
                       alpha=2.5, beta=-1.25)
        truth = reference(p, direction, hx, hw, hy, alpha=2.5, beta=-1.25)
        assert rel_err(got, truth) < 1e-12, perf


@pytest.mark.parametrize("alpha, beta", [(0.5, 0.75), (1.0, 1.0), (-2.0, 0.5), (0.0, 1.0)])
@pytest.mark.parametrize("case", ["2d-nchw", "2d-nhwc-grouped-5x5", "3d-ndhwc-grouped-dilated"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_alpha_beta_with_prefilled_output(be, case, direction, alpha, beta):
    p = problem(case, "float32", "fma")
    perfs = _find(be, p, direction)
    rng = np.random.default_rng(7)
    hx, hw, hy = uniform_tensors(p, rng)  # the written tensor's prior value is random, not zero
    truth = reference(p, direction, hx, hw, hy, alpha=alpha, beta=beta)
    for perf in perfs[:2]:
        got = run_algo(be, p, direction, perf.algo, perf.math_type, hx, hw, hy,
                       alpha=alpha, beta=beta)
        assert rel_err(got, truth) < _tolerance(direction, perf.algo, "float32", "fma", 1e-5)


def test_find_respects_the_limit_and_math(be):
    p = problem("2d-nchw", "float32", "default")
    for direction in DIRECTIONS:
        everything = be.find(p, direction, FIND_LIMIT)
        none = be.find(p, direction, 0)
        assert none and all(a.workspace_bytes == 0 for a in none)
        assert {(a.algo, a.math_type) for a in none} <= {(a.algo, a.math_type)
                                                         for a in everything}
        for a in everything:
            assert a.determinism in (0, 1) and a.time_ms >= 0
    fma = be.find(problem("2d-nchw", "float32", "fma"), Direction.FORWARD, FIND_LIMIT)
    assert fma and all(a.math_type == MathType.FMA_MATH for a in fma)


@pytest.mark.parametrize("case", ["2d-nchw", "2d-nhwc-stride2", "3d-ncdhw"])
def test_find_workspace_is_enough_to_run(be, case):
    """What Find reports as an algorithm's workspace is what Get*WorkspaceSize asks
    for: a plan sized from Find's numbers can run."""
    for config in ("f32-fma", "f16-default"):
        dtype, math, _ = CONFIGS[config]
        p = problem(case, dtype, math)
        for direction in DIRECTIONS:
            for a in _find(be, p, direction):
                need = be.workspace_size(p, direction, a.algo, a.math_type)
                assert need <= a.workspace_bytes, (config, direction, a, need)


def test_too_small_workspace_raises_value_error(be):
    p = problem("2d-nchw", "float32", "fma")
    rng = np.random.default_rng(3)
    hx, hw, hy = uniform_tensors(p, rng)
    tensors = ConvTensors(p, be.empty(p.x_shape, p.dtype), be.empty(p.w_shape, p.dtype),
                          be.empty(p.output_shape, p.dtype))
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
        small.close()
        enough.close()
        return
    pytest.skip("no algorithm needs workspace here")


def test_wrong_tensors_raise(be):
    p = problem("2d-nchw", "float32", "fma")
    q = p.with_batch(2)
    good = ConvTensors(p, be.empty(p.x_shape, "float32"), be.empty(p.w_shape, "float32"),
                       be.empty(p.output_shape, "float32"))
    a = be.find(p, Direction.FORWARD, 0)[0]
    with pytest.raises(ValueError, match="tensors.x"):
        be.run(Direction.FORWARD, a.algo, a.math_type,
               ConvTensors(p, be.empty(q.x_shape, "float32"), good.w, good.y), 1.0, 0.0, None)
    with pytest.raises(ValueError, match="tensors.w"):
        be.run(Direction.FORWARD, a.algo, a.math_type,
               ConvTensors(p, good.x, be.empty(p.w_shape, "float16"), good.y), 1.0, 0.0, None)
    be.run(Direction.FORWARD, a.algo, a.math_type, good, 1.0, 0.0, None)
    be.synchronize()


def test_micro_batch_views_and_zero_copy_torch(be):
    """Leading-axis views (micro-batches) and torch tensors used in place."""
    torch = torch_or_skip()
    p = problem("2d-nchw", "float32", "fma")
    dev = torch.device("cuda", be.device)
    gen = torch.Generator(device=dev).manual_seed(5)
    x = torch.rand(p.x_shape, device=dev, generator=gen) * 2 - 1
    w = torch.rand(p.w_shape, device=dev, generator=gen) * 2 - 1
    y = torch.full(p.output_shape, float("nan"), device=dev)
    torch.cuda.synchronize()
    X, W, Y = (mc.as_device_array(t) for t in (x, w, y))
    half = p.with_batch(p.batch // 2)
    a = be.find(half, Direction.FORWARD, 0)[0]
    for off in (0, half.batch):
        t = ConvTensors(half, X[off:off + half.batch], W, Y[off:off + half.batch])
        be.run(Direction.FORWARD, a.algo, a.math_type, t, 1.0, 0.0, None)
    be.synchronize()
    torch.backends.cudnn.allow_tf32 = False
    expected = torch.nn.functional.conv2d(x, w, padding=p.padding)
    torch.cuda.synchronize()
    assert not torch.isnan(y).any()
    assert rel_err(y.double().cpu().numpy(), expected.double().cpu().numpy()) < 1e-5


# -- handles and descriptors -----------------------------------------------------------------

def test_handle_stream_binding_and_cache():
    s = mc.Stream()
    with Handle(stream=s) as h:
        assert h.stream_handle == s.handle and h.stream is s
        h.set_stream(0)  # the legacy default stream
        assert h.stream_handle == 0
        h.set_stream(None)  # mucudnn's default stream
        assert h.stream_handle == mc.default_stream().handle
    assert h.closed
    assert get_handle() is get_handle()
    assert get_handle().stream_handle == mc.default_stream().handle
    before = live_handles()
    for _ in range(20):
        Handle().close()
    assert live_handles() == before
    s.close()


def test_descriptor_cycles_leak_nothing():
    p = problem("3d-ndhwc-grouped-dilated", "float16", "fma")
    gc.collect()
    mc.synchronize()
    free0, _ = mc.mem_get_info()
    live0 = live_descriptors()
    for _ in range(10_000):
        with TensorDescriptor.for_x(p) as x, FilterDescriptor.for_w(p) as w, \
                ConvolutionDescriptor.for_problem(p) as c:
            assert c.output_dims(x, w) == p.y_dims
    gc.collect()
    assert live_descriptors() == live0
    free1, _ = mc.mem_get_info()
    assert free1 == free0


def test_a_thousand_convolutions_leak_nothing(be):
    p = problem("2d-nchw", "float32", "fma")
    rng = np.random.default_rng(11)
    hx, hw, hy = uniform_tensors(p, rng)
    x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
    dx, dw, out = be.empty(p.x_shape, "float32"), be.from_host(hw), be.empty(p.output_shape,
                                                                           "float32")
    # inputs are never written, so values stay bounded however often we run
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
    live0, alloc0 = live_descriptors(), mc.memory_allocated()
    for i in range(1000):
        d = DIRECTIONS[i % 3]
        a = chosen[d]
        be.run(d, a.algo, a.math_type, tensors[d], 1.0, 0.0, ws)
    be.synchronize()
    gc.collect()
    free1, _ = mc.mem_get_info()
    assert live_descriptors() == live0
    assert mc.memory_allocated() == alloc0
    assert free0 - free1 <= 2 * MiB, (free0, free1)  # a per-call leak would be >= 1000 pages
    assert rel_err(be.to_host(out), reference(p, Direction.FORWARD, hx, hw, hy)) < 1e-4
    for arr in (x, w, y, dx, dw, out, ws):
        arr.close()


def test_descriptor_cache_is_bounded_and_closed():
    gc.collect()
    live0 = live_descriptors()
    with CudnnBackend(descriptor_cache_size=2, find_workspace_limit=16 * MiB) as b:
        problems = [problem("2d-1x1-stride2", "float32", "fma").with_batch(n)
                    for n in (1, 2, 3, 4, 5)]
        for _ in range(3):
            for q in problems:
                b.workspace_size(q, Direction.FORWARD, 0, MathType.FMA_MATH)
                assert len(b._descs) <= 2
        assert live_descriptors() - live0 <= 2 * 4
    assert live_descriptors() == live0
