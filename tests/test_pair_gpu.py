"""Micro-batches in pairs on the GPU (marker gpu; Note [micro-batches in pairs]
in mucudnn/backends/pair.py): pair configurations of the cudnn-graph backend
run (micro-batched, alpha and beta, every direction, both layouts, float32
and half types) as the float64 reference says, with the workspace
workspace_size() names; replayed from a CUDA graph (the second lane's stream
captured with the first); find() reports them for a grouped backward-filter
where the cap bites, each within the cap; with pair=False it reports none."""

from __future__ import annotations

import numpy as np
import pytest

from mucudnn import ConvProblem, Direction
from mucudnn.backends import pair
from mucudnn.backends.cudnn_graph import CudnnGraphBackend
from mucudnn.errors import InvalidValueError, UnsupportedConfigError
from mucudnn.problem import MicroBatch, Plan
from conv_support import (MiB, backend_fixture, check_micro_batched, convolution_for,
                          run_plan, torch_or_skip, uniform_tensors)
from reference import reference, rel_err

pytestmark = pytest.mark.gpu

#: a graph backend that pairs (``pair`` is off by default)
be = backend_fixture(CudnnGraphBackend, 256 * MiB, pair=True)

# name -> (x, w, padding, groups, layout): grouped 3x3s (ResNeXt's, RegNet's) at few pixels
LAYERS = {
    "grouped-nhwc": ((8, 10, 10, 64), (64, 3, 3, 8), 1, 8, "NHWC"),
    "grouped-nchw": ((8, 32, 10, 10), (32, 4, 3, 3), 1, 8, "NCHW"),
}
# dtype, math, tolerance against float64
CONFIGS = {"f32-fma": ("float32", "fma", 1e-5), "f32-default": ("float32", "default", 5e-3),
           "f16": ("float16", "default", 1e-2), "bf16": ("bfloat16", "default", 3e-2)}
#: ResNeXt-101's layer-3 grouped 3x3 at 32 rows, channels-last
RESNEXT = ConvProblem((32, 14, 14, 1024), (1024, 3, 3, 32), padding=1, groups=32, layout="NHWC",
                      math="default")


def _problem(layer, config):
    x, w, pad, g, layout = LAYERS[layer]
    dtype, math, _ = CONFIGS[config]
    return ConvProblem(x, w, padding=pad, groups=g, layout=layout, dtype=dtype, math=math)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_pair_configurations_run_micro_batched_as_the_reference(be, layer, config, direction):
    p = _problem(layer, config)
    hx, hw, hy = uniform_tensors(p, np.random.default_rng(7), via_float32=True)
    inner = [a.algo for a in be.find(p.with_batch(2), direction, 256 * MiB)][:3]
    assert inner, direction
    ran, needs = 0, {}
    for i in inner:
        try:
            n, got = check_micro_batched(be, p, direction, [pair.pair_id(i)], (hx, hw, hy),
                                         CONFIGS[config][2])
        except InvalidValueError as exc:
            # an engine config whose plan for other scalars needs more workspace than
            # workspace_size() names (alpha 1, beta 0 or 1): the engine plans again
            # there, for pairs as for any configuration (Note [beta and workspace])
            assert "the plan needs" in str(exc)
            continue
        ran += n
        needs.update(got)
    assert ran >= 2, (inner, needs)
    for a, need in needs.items():
        part = be.workspace_size(p.with_batch(2), direction, pair.parse_pair_id(a)[1])
        assert need == pair.lanes(p, direction, 4, part).need


def test_find_pairs_a_grouped_backward_filter_where_the_cap_bites(be):
    """ResNeXt's layer-3 backward-filter at 32 rows under 32 MiB: the engines
    heuristics prefer need more, so find() also reports pairs of 16 rows,
    each within the cap; the fastest runs as the reference."""
    d = Direction.BACKWARD_FILTER
    cap = 32 * MiB
    assert be._limit_bites(RESNEXT, d, cap)
    before = be.find_profile.pairs
    perfs = be.find(RESNEXT, d, cap)
    pairs = [a for a in perfs if pair.parse_pair_id(a.algo) is not None]
    assert pairs and be.find_profile.pairs - before == len(pairs), [a.algo for a in perfs]
    assert len(pairs) <= pair.PAIR_TOP * len(pair.PAIR_CALLS)
    for a in pairs:
        assert a.workspace_bytes <= cap
        assert be.workspace_size(RESNEXT, d, a.algo) <= a.workspace_bytes
    best = pairs[0]
    hx, hw, hy = uniform_tensors(RESNEXT, np.random.default_rng(3), via_float32=True)
    plan = Plan(RESNEXT, d, (MicroBatch(0, 32, best.algo, 0, best.workspace_bytes),),
                best.workspace_bytes, 0.0, 0.0, None)
    got = run_plan(be, RESNEXT, d, plan, hx, hw, hy, 0.5, 0.25)
    want = reference(RESNEXT, d, hx.astype(np.float64), hw.astype(np.float64),
                     hy.astype(np.float64), 0.5, 0.25)
    assert rel_err(got, want) < 5e-3, best.algo


def test_pair_off_by_default_reports_no_pair_configuration():
    b = CudnnGraphBackend(find_workspace_limit=256 * MiB)
    try:
        assert all(pair.parse_pair_id(a.algo) is None
                   for a in b.find(RESNEXT, Direction.BACKWARD_FILTER, 32 * MiB))
        assert b.cache_name(RESNEXT) == b.name + b.find_options.key()
    finally:
        b.close()


def test_a_micro_batch_its_calls_do_not_divide_refuses_a_pair_id(be):
    p = _problem("grouped-nchw", "f32-fma").with_batch(6)
    with pytest.raises(UnsupportedConfigError, match="multiple of 2 rows, got 3"):
        be.bind(Direction.BACKWARD_FILTER, "pair|e1", 0, p, 0, 3, 1.0, 0.0)
    with pytest.raises(UnsupportedConfigError, match="multiple of 4 rows, got 6"):
        be.bind(Direction.BACKWARD_FILTER, "pair2|e1", 0, p, 0, 6, 1.0, 0.0)


@pytest.mark.parametrize("calls", [1, 2])
@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_pair_plans_replay_from_a_cuda_graph_as_they_run(be, direction, calls):
    """A plan of pair micro-batches (one or two calls a lane) through a
    Convolution with ``graph=True``: each replay (the side stream's lane
    captured between the fork and join events) gives the reference's result."""
    torch = torch_or_skip()
    p = _problem("grouped-nhwc", "f32-fma")
    d = direction
    inner = [a.algo for a in be.find(p.with_batch(4 // (2 * calls)), d, 256 * MiB)]
    algo = pair.pair_id(inner[0], calls)
    mbs = (MicroBatch(0, 4, algo, 0, be.workspace_size(p.with_batch(4), d, algo)),
           MicroBatch(4, 4, algo, 0, be.workspace_size(p.with_batch(4), d, algo)))
    plan = Plan(p, d, mbs, max(m.workspace_bytes for m in mbs), 0.0, 0.0, None)
    hx, hw, hy = uniform_tensors(p, np.random.default_rng(11), via_float32=True)
    tx, tw, ty = (torch.from_numpy(a).cuda() for a in (hx, hw, hy))
    args = {Direction.FORWARD: (tx, tw), Direction.BACKWARD_DATA: (ty, tw),
            Direction.BACKWARD_FILTER: (tx, ty)}[d]
    call = {Direction.FORWARD: "forward", Direction.BACKWARD_DATA: "backward_data",
            Direction.BACKWARD_FILTER: "backward_filter"}[d]
    want = reference(p, d, hx.astype(np.float64), hw.astype(np.float64), hy.astype(np.float64))
    graphed = convolution_for(p, backend=be, plans={d: plan}, graph=True)
    assert graphed.graph_active
    out = torch.empty(want.shape, dtype=torch.float32, device="cuda")
    for _ in range(3):
        out.fill_(float("nan"))
        getattr(graphed, call)(*args, out)
        assert rel_err(out.cpu().numpy(), want) < 1e-5
    g = graphed.kernel(d).graphs
    assert g.captures == 1 and g.replays == 3
