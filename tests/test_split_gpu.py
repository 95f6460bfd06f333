"""Grouped convolutions split into chunks of their groups on the GPU (marker
gpu; Note [split groups] in mucudnn/backends/split.py): split configurations
of the cudnn-graph backend run (micro-batched, alpha and beta, every
direction, both layouts, float32 and half types) as the float64 reference
says, with the workspace workspace_size() names; find() reports them where
the cap leaves out what heuristics prefer (a depthwise backward-filter), each
within the cap; with split=False it reports none."""

from __future__ import annotations

import numpy as np
import pytest

from mucudnn import ConvProblem, Direction
from mucudnn.backends import split
from mucudnn.backends.cudnn_graph import CudnnGraphBackend
from mucudnn.errors import UnsupportedConfigError
from mucudnn.problem import MicroBatch, Plan
from conv_support import MiB, backend_fixture, check_micro_batched, run_plan, uniform_tensors
from reference import reference, rel_err

pytestmark = pytest.mark.gpu

be = backend_fixture(CudnnGraphBackend, 256 * MiB)

# name -> (x, w, padding, groups, layout): a depthwise 7x7 (ConvNeXt's) and a
# grouped 3x3 (ResNeXt's) at few pixels
LAYERS = {
    "depthwise-nhwc": ((8, 12, 12, 32), (32, 7, 7, 1), 3, 32, "NHWC"),
    "grouped-nchw": ((8, 32, 10, 10), (32, 4, 3, 3), 1, 8, "NCHW"),
}
# dtype, math, tolerance against float64
CONFIGS = {"f32-fma": ("float32", "fma", 1e-5), "f32-default": ("float32", "default", 5e-3),
           "f16": ("float16", "default", 1e-2), "bf16": ("bfloat16", "default", 3e-2)}


def _problem(layer, config, batch=None):
    x, w, pad, g, layout = LAYERS[layer]
    dtype, math, _ = CONFIGS[config]
    p = ConvProblem(x, w, padding=pad, groups=g, layout=layout, dtype=dtype, math=math)
    return p if batch is None else p.with_batch(batch)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_split_configurations_run_micro_batched_as_the_reference(be, layer, config, direction):
    p = _problem(layer, config)
    rng = np.random.default_rng(7)
    hx, hw, hy = uniform_tensors(p, rng, via_float32=True)
    tol = CONFIGS[config][2]
    ran = 0
    for k in (2, 4):
        s = split.split_of(p, k)
        inner = [a.algo for a in be.find(s.chunk, direction, 256 * MiB)][:2]
        assert inner, (k, direction)
        n, needs = check_micro_batched(be, p, direction, [split.split_id(k, i) for i in inner],
                                       (hx, hw, hy), tol)
        assert all(need >= split.regions(s, 4).inner for need in needs.values())
        ran += n
    assert ran >= 4


def test_find_splits_a_depthwise_backward_filter_where_the_cap_bites(be):
    """ConvNeXt's second stage's depthwise 7x7 at 16 rows under 8 MiB: the
    engines heuristics prefer copy x and dy (19 MiB) into their workspace, so
    find() reports split configurations, each within the cap, and the fastest
    of them runs as the reference."""
    p = ConvProblem((16, 28, 28, 192), (192, 7, 7, 1), padding=3, groups=192, layout="NHWC")
    d = Direction.BACKWARD_FILTER
    cap = 8 * MiB
    assert be._limit_bites(p, d, cap)
    perfs = be.find(p, d, cap)
    splits = [a for a in perfs if split.parse_split_id(a.algo) is not None]
    assert splits, [a.algo for a in perfs]
    assert be.find_profile.split_finds >= 1
    for a in splits:
        assert a.workspace_bytes <= cap
        assert be.workspace_size(p, d, a.algo) == a.workspace_bytes
    best = splits[0]
    rng = np.random.default_rng(3)
    hx, hw, hy = uniform_tensors(p, rng, via_float32=True)
    plan = Plan(p, d, (MicroBatch(0, p.batch, best.algo, 0, best.workspace_bytes),),
                best.workspace_bytes, 0.0, 0.0, None)
    got = run_plan(be, p, d, plan, hx, hw, hy)
    want = reference(p, d, hx.astype(np.float64), hw.astype(np.float64), hy.astype(np.float64))
    assert rel_err(got, want) < 5e-3, best.algo


def test_split_off_reports_no_split_configuration():
    b = CudnnGraphBackend(find_workspace_limit=256 * MiB, split=False)
    try:
        p = ConvProblem((16, 28, 28, 192), (192, 7, 7, 1), padding=3, groups=192, layout="NHWC")
        assert all(split.parse_split_id(a.algo) is None
                   for a in b.find(p, Direction.BACKWARD_FILTER, 8 * MiB))
        assert b.cache_name(p) == b.name + b.find_options.key()
    finally:
        b.close()


def test_a_problem_that_does_not_split_refuses_a_split_id(be):
    p = ConvProblem((8, 16, 10, 10), (16, 16, 3, 3), padding=1)
    with pytest.raises(UnsupportedConfigError, match="split into 2 chunks"):
        be.bind(Direction.FORWARD, "split2|e1", 0, p, 0, p.batch, 1.0, 0.0)
    with pytest.raises(UnsupportedConfigError):
        be.workspace_size(p, Direction.FORWARD, "split2|e1")
