"""A split's chunks run in place as slices of the whole tensors on the GPU
(marker gpu; Note [chunks as slices] in mucudnn/problem/slice_problem.py):
slice configurations of the cudnn-graph backend run (micro-batched, alpha and
beta, every direction, both layouts, float32 and half types) as the float64
reference says, with the workspace workspace_size() names; find() times a
16-bit depthwise backward-filter's chunks as slices where the cap bites
(Note [which slices are searched]) and the fastest runs as the reference;
it times no slices for a float32 one."""

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

# name -> (x, w, stride, padding, groups, layout): ConvNeXt's depthwise 7x7,
# MobileNet-V3's strided depthwise 5x5, a grouped 3x3 (ResNeXt's), at few pixels
LAYERS = {
    "depthwise7-nhwc": ((8, 12, 12, 32), (32, 7, 7, 1), 1, 3, 32, "NHWC"),
    "depthwise5-s2-nhwc": ((8, 14, 14, 64), (64, 5, 5, 1), 2, 2, 64, "NHWC"),
    "grouped-nchw": ((8, 32, 10, 10), (32, 4, 3, 3), 1, 1, 8, "NCHW"),
}
# dtype, math, tolerance against float64
CONFIGS = {"f32-default": ("float32", "default", 5e-3), "f16": ("float16", "default", 1e-2),
           "bf16": ("bfloat16", "default", 3e-2)}
#: MobileNet-V3's planned layer at its training batch (bf16): PyTorch's engine
#: needs 98 MiB there, so a 64 MiB cap bites
MOBILENET_V3 = ConvProblem((64, 14, 14, 672), (672, 5, 5, 1), stride=2, padding=2, groups=672,
                           layout="NHWC", dtype="bfloat16")


def _problem(layer, config):
    x, w, stride, pad, g, layout = LAYERS[layer]
    dtype, math, _ = CONFIGS[config]
    return ConvProblem(x, w, stride=stride, padding=pad, groups=g, layout=layout, dtype=dtype,
                       math=math)


def _want(p, direction, hx, hw, hy, alpha=1.0, beta=0.0):
    return reference(p, direction, hx.astype(np.float64), hw.astype(np.float64),
                     hy.astype(np.float64), alpha, beta)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_slice_configurations_run_micro_batched_as_the_reference(be, layer, config, direction):
    p = _problem(layer, config)
    rng = np.random.default_rng(11)
    hx, hw, hy = uniform_tensors(p, rng, via_float32=True)
    tol = CONFIGS[config][2]
    ran = 0
    for k in (2, 4):
        s = split.split_of(p, k)
        inner = [a.algo for a in be.find(split.slice_of(s), direction, 256 * MiB)][:3]
        assert inner, (k, direction)
        n, _ = check_micro_batched(be, p, direction, [split.slice_id(k, i) for i in inner],
                                   (hx, hw, hy), tol)
        ran += n
    assert ran >= 4


def test_find_times_a_16_bit_depthwise_backward_filter_as_slices_where_the_cap_bites(be):
    """MobileNet-V3's layer under 64 MiB: find() reports slice configurations
    (split by 2, Note [which slices are searched]), each within the cap with
    the workspace workspace_size() names, and the fastest runs as the
    reference; the layer's forward times none."""
    p, d, cap = MOBILENET_V3, Direction.BACKWARD_FILTER, 64 * MiB
    assert be._limit_bites(p, d, cap)
    perfs = be.find(p, d, cap)
    slices = [a for a in perfs if split.parse_slice_id(a.algo) is not None]
    assert slices, [a.algo for a in perfs]
    assert {split.parse_slice_id(a.algo)[0] for a in slices} == {2}
    for a in slices:
        assert a.workspace_bytes <= cap
        assert be.workspace_size(p, d, a.algo) == a.workspace_bytes
    best = slices[0]
    rng = np.random.default_rng(5)
    hx, hw, hy = uniform_tensors(p, rng, via_float32=True)
    plan = Plan(p, d, (MicroBatch(0, p.batch, best.algo, 0, best.workspace_bytes),),
                best.workspace_bytes, 0.0, 0.0, None)
    got = run_plan(be, p, d, plan, hx, hw, hy)
    assert rel_err(got, _want(p, d, hx, hw, hy)) < 3e-2, best.algo
    fwd = be.find(p, Direction.FORWARD, cap)
    assert all(split.parse_slice_id(a.algo) is None for a in fwd)


def test_a_float32_depthwise_backward_filter_times_no_slices(be):
    p = ConvProblem((16, 28, 28, 192), (192, 7, 7, 1), padding=3, groups=192, layout="NHWC")
    perfs = be.find(p, Direction.BACKWARD_FILTER, 8 * MiB)
    assert any(split.parse_split_id(a.algo) is not None for a in perfs)
    assert all(split.parse_slice_id(a.algo) is None for a in perfs)


def test_a_problem_that_does_not_split_refuses_a_slice_id(be):
    p = ConvProblem((8, 16, 10, 10), (16, 16, 3, 3), padding=1)
    with pytest.raises(UnsupportedConfigError, match="split into 2 chunks"):
        be.bind(Direction.FORWARD, "slice2|e1", 0, p, 0, p.batch, 1.0, 0.0)
    with pytest.raises(UnsupportedConfigError):
        be.workspace_size(p, Direction.FORWARD, "slice2|e1")
