"""Folded first layers on the GPU (marker gpu; Note [folded first layers] in
mucudnn/backends/fold.py): the cudnn-graph backend's find() reports folded
configurations for strided first layers in channels-last, each runs (micro-batched,
alpha and beta, every direction, float32 and half types) as the float64
reference says, its workspace is what find() reported, a Convolution replays a
folded plan from a CUDA graph, and a problem that does not fold refuses a
folded id."""

from __future__ import annotations

import numpy as np
import pytest

from mucudnn import ConvProblem, Direction
from mucudnn._cudnn.errors import CudnnError
from mucudnn.backends import fold
from mucudnn.backends.base import OUTPUT_OF, ConvTensors
from mucudnn.backends.cudnn_graph import CudnnGraphBackend
from mucudnn.errors import UnsupportedConfigError
from mucudnn.exec import execute
from mucudnn.problem import MicroBatch, Plan
from conv_support import MiB, backend_fixture, convolution_for, run_direction, uniform_tensors
from reference import reference, rel_err

pytestmark = pytest.mark.gpu

be = backend_fixture(CudnnGraphBackend, 256 * MiB)

# name -> (x, w, stride, padding): small first layers that fold (AlexNet's and
# ResNet's geometry at fewer pixels and filters; AlexNet's rows padded up to a
# multiple of the stride, its columns not; offsets of 2 and 4 samples keep
# 16-byte alignment)
LAYERS = {
    "alexnet-like": ((8, 67, 68, 3), (16, 11, 11, 3), 4, 0),
    "resnet-like": ((8, 32, 32, 3), (16, 7, 7, 3), 2, 3),
}
# dtype, math, tolerance against float64
CONFIGS = {"f32-fma": ("float32", "fma", 1e-5), "f32-default": ("float32", "default", 5e-3),
           "f16": ("float16", "default", 1e-2), "bf16": ("bfloat16", "default", 3e-2)}


def _problem(layer, config):
    x, w, s, pad = LAYERS[layer]
    dtype, math, _ = CONFIGS[config]
    return ConvProblem(x, w, stride=s, padding=pad, layout="NHWC", dtype=dtype, math=math)


def _host(p, rng):
    return uniform_tensors(p, rng, via_float32=True)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_folded_configurations_run_micro_batched_as_the_reference(be, layer, config,
                                                                  direction):
    p = _problem(layer, config)
    f = fold.fold_of(p)
    assert f is not None
    perfs = be.find(p, direction, 256 * MiB)
    folded = [a for a in perfs if fold.split_fold_id(a.algo) is not None]
    assert folded, [a.algo for a in perfs]
    rng = np.random.default_rng(5)
    hx, hw, hy = _host(p, rng)
    tol = CONFIGS[config][2]
    ran = 0
    for a in folded:
        if ran == 2:
            break
        assert be.workspace_size(p, direction, a.algo) == a.workspace_bytes
        assert a.workspace_bytes >= fold.regions(f, p.batch).inner
        # three micro-batches (4 + 2 + 2), the later backward-filter ones
        # accumulating; a config cuDNN refuses at a smaller size (as it may any
        # config) is left for the next one
        try:
            needs = [be.workspace_size(p.with_batch(size), direction, a.algo)
                     for size in (4, 2, 2)]
        except (CudnnError, UnsupportedConfigError):
            continue
        mbs, off = [], 0
        for size, need in zip((4, 2, 2), needs):
            mbs.append(MicroBatch(off, size, a.algo, 0, need))
            off += size
        ws_bytes = max(m.workspace_bytes for m in mbs)
        plan = Plan(p, direction, tuple(mbs), ws_bytes, 0.0, 0.0, None)
        checked = 0
        for alpha, beta in ((1.0, 0.0), (0.5, 0.75)):
            x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
            t = ConvTensors(p, x, w, y)
            ws = be.alloc_workspace(ws_bytes)
            try:
                execute(plan, be, t, alpha, beta, ws)
                got = be.to_host(getattr(t, OUTPUT_OF[direction])).astype(np.float64)
            except UnsupportedConfigError:
                continue  # cuDNN refuses these scalars for it: the engine would re-plan
            finally:
                for arr in (x, w, y, ws):
                    arr.close()
            want = reference(p, direction, hx.astype(np.float64), hw.astype(np.float64),
                             hy.astype(np.float64), alpha, beta)
            assert rel_err(got, want) < tol, (a.algo, alpha, beta)
            checked += 1
        ran += checked == 2
    assert ran, [a.algo for a in folded]


def test_the_regions_count_against_the_limit(be):
    p = _problem("resnet-like", "f32-default")
    f = fold.fold_of(p)
    extra = fold.regions(f, p.batch).inner
    assert not [a for a in be.find(p, Direction.FORWARD, extra - 1)
                if fold.split_fold_id(a.algo) is not None]
    for a in be.find(p, Direction.FORWARD, extra + (1 << 20)):
        assert a.workspace_bytes <= extra + (1 << 20)


def test_a_problem_that_does_not_fold_refuses_a_folded_id(be):
    p = ConvProblem((8, 32, 32, 3), (16, 3, 3, 3), stride=1, padding=1, layout="NHWC")
    with pytest.raises(UnsupportedConfigError, match="folded by 2"):
        be.bind(Direction.FORWARD, "fold2|e1", 0, p, 0, p.batch, 1.0, 0.0)
    with pytest.raises(UnsupportedConfigError):
        be.workspace_size(p, Direction.FORWARD, "fold2|e1")


def test_fold_off_reports_no_folded_configuration():
    b = CudnnGraphBackend(find_workspace_limit=256 * MiB, fold=False)
    try:
        p = _problem("alexnet-like", "f32-default")
        assert all(fold.split_fold_id(a.algo) is None
                   for a in b.find(p, Direction.FORWARD, 256 * MiB))
    finally:
        b.close()


def test_a_cache_from_fold_off_is_measured_again_by_the_folding_backend(be, tmp_path):
    """See Note [candidate sets in keys]: entries a fold=False backend wrote (as a
    cache from before folding) are not what the folding backend reads for a
    first layer; it finds again, and its plan may use folded configurations."""
    from mucudnn.optimizer import BenchmarkCache
    from mucudnn.optimizer.benchmark import benchmark

    cache = BenchmarkCache(tmp_path / "c.sqlite")
    p = _problem("resnet-like", "f32-default")
    off = CudnnGraphBackend(find_workspace_limit=256 * MiB, fold=False)
    try:
        stale = benchmark(off, p, Direction.FORWARD, "undivided", 256 * MiB, cache=cache)[8]
    finally:
        off.close()
    assert not any(fold.split_fold_id(a.algo) for a in stale)
    fresh = benchmark(be, p, Direction.FORWARD, "undivided", 256 * MiB, cache=cache)[8]
    assert any(fold.split_fold_id(a.algo) for a in fresh)
    # the default search's key (See Note [search parity]), with "+fold" where it folds
    assert {k[0] for k in cache.keys()} == {"cudnn-graph+parity+hold", "cudnn-graph+parity+hold+fold"}


@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_a_convolution_replays_a_folded_plan_from_a_cuda_graph(be, direction):
    p = _problem("alexnet-like", "f32-fma")
    folded = [a for a in be.find(p, direction, 256 * MiB)
              if fold.split_fold_id(a.algo) is not None]
    a = folded[0]
    mbs = (MicroBatch(0, 4, a.algo, 0, 0), MicroBatch(4, 4, a.algo, 0, 0))
    plan = Plan(p, direction, mbs, 0, 0.0, 0.0, None)
    conv = convolution_for(p, backend=be, graph=True, workspace_limit=None,
                           plans={direction: plan})
    assert conv.graph_active
    rng = np.random.default_rng(11)
    hx, hw, hy = _host(p, rng)
    want = reference(p, direction, hx.astype(np.float64), hw.astype(np.float64),
                     hy.astype(np.float64), 0.5, 0.25)
    for _ in range(3):  # planned, captured, replayed
        got = run_direction(conv, direction, hx, hw, hy, alpha=0.5, beta=0.25)
        assert rel_err(got.astype(np.float64), want) < 1e-5
    assert conv.plans[direction].micro_batches[0].algo == a.algo
