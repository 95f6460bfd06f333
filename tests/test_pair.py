"""Micro-batches in pairs (Note [micro-batches in pairs] in mucudnn/backends/pair.py)
on the CPU: which problems and directions pair, the ids and the workspace
lanes, the NumPy backend's pair configurations against the float64
reference (every direction, layout, alpha and beta, micro-batched plans that
accumulate), the planner choosing them through a Convolution, and the keys of
the caches. The cuDNN launcher (two streams, the join) is tested on the GPU
(tests/test_pair_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mucudnn import ConvProblem, Direction, MucudnnError
from mucudnn.backends import pair
from mucudnn.backends.base import OUTPUT_OF, ConvTensors
from mucudnn.backends.numpy import NumpyAlgo, NumpyBackend
from conv_support import (RewritesFirstBackend, check_mixed_plan, check_rewritten_run, composition,
                          convolution_for, grouped_problems, run_direction)
from reference import reference, rel_err

RESNEXT = ConvProblem((64, 14, 14, 1024), (1024, 3, 3, 32), padding=1, groups=32,
                      layout="NHWC")


def grouped(batch=None):
    """A small grouped problem of several input channels a group (what find()
    pairs) or, now and then, an ungrouped one (whose pair ids still run):
    either layout, 2-D or 3-D, strides, paddings, dilations; an even batch."""
    return grouped_problems([1, 2, 4, 3], st.integers(1, 3).map(lambda k: 2 * k)
                            if batch is None else batch, extra=4)


def _tensors(p, rng):
    return tuple(rng.standard_normal(shape) for shape in (p.x_shape, p.w_shape, p.output_shape))


def test_find_pairs_the_backward_filter_of_grouped_problems_of_even_batches():
    bf, fwd = Direction.BACKWARD_FILTER, Direction.FORWARD
    assert pair.pairs(RESNEXT, bf) and not pair.pairs(RESNEXT, fwd)
    assert not pair.pairs(RESNEXT, Direction.BACKWARD_DATA)
    assert not pair.pairs(RESNEXT.with_batch(63), bf) and not pair.pairs(RESNEXT.with_batch(1), bf)
    depthwise = ConvProblem((8, 32, 9, 9), (32, 1, 3, 3), groups=32)
    dense = ConvProblem((8, 32, 9, 9), (32, 32, 3, 3))
    for q in (depthwise, dense):
        assert not pair.searched(q) and not pair.pairs(q, bf)
        assert pair.cache_name("g", q) == "g"
    assert pair.cache_name("g", RESNEXT) == "g" + pair.CACHE_SUFFIX


def test_the_lanes_hold_both_lanes_and_the_backward_filter_scratch():
    bf = Direction.BACKWARD_FILTER
    ln = pair.lanes(RESNEXT, bf, 32, 1000)
    assert (ln.part, ln.calls, ln.lane, ln.scratch) == (16, 1, 1024, 2048)
    assert pair.lanes(RESNEXT, bf, 32, 1000, 2).part == 8
    assert ln.need == 2048 + 1024 * 3 * 3 * 32 * 4  # the scratch is one dw in float32
    assert ln.lane % pair.ALIGNMENT == 0 and ln.scratch % pair.ALIGNMENT == 0
    fwd = pair.lanes(RESNEXT, Direction.FORWARD, 32, 1000)
    assert fwd.need == fwd.scratch == 2048  # forward and backward-data write rows of their own
    dw = 1024 * 3 * 3 * 32 * 4
    assert pair.lanes(RESNEXT, bf, 32, 0).need == pair.scratch_bytes(RESNEXT, bf) == dw
    assert pair.scratch_bytes(RESNEXT, Direction.FORWARD) == 0


@pytest.mark.parametrize("algo", ["pair|", "pair|split2|e1", "pair|fold2|e1", "pair0|e1",
                                  "pairx|e1", "pair2"])
def test_a_malformed_pair_id_is_refused_by_name(algo):
    with pytest.raises(ValueError, match=r"algo: expected 'pair\[<calls>\]\|<engine config id>'"
                       ) as exc:
        pair.parse_pair_id(algo)
    assert isinstance(exc.value, MucudnnError)


@given(inner=st.sampled_from(["e1", "e30;k3=1", "7"]), calls=st.integers(1, 8))
def test_pair_ids_round_trip(inner, calls):
    assert pair.parse_pair_id(pair.pair_id(inner, calls)) == (calls, inner)


@pytest.mark.parametrize("size,calls", [(1, 1), (3, 1), (0, 1), (6, 2), (2, 2)])
def test_a_pair_runs_micro_batches_its_calls_divide(size, calls):
    algo = pair.pair_id(0, calls)
    with pytest.raises(ValueError, match=f"multiple of {2 * calls} rows, got {size}"):
        pair.part_rows(size, calls, algo)
    p = ConvProblem((size or 1, 4, 5, 5), (4, 2, 3, 3), groups=2)
    if size:
        assert not NumpyBackend().supports(p, Direction.BACKWARD_FILTER, algo)
    with pytest.raises(ValueError, match="multiple of"):
        NumpyBackend().workspace_size(p.with_batch(size or 1), Direction.BACKWARD_FILTER, algo)


@settings(max_examples=60, deadline=None)
@given(p=grouped(), d=st.sampled_from(list(Direction)), inner=st.sampled_from(list(NumpyAlgo)),
       calls=st.sampled_from([1, 2, 3]), alpha=st.sampled_from([1.0, 0.5, -2.0]),
       beta=st.sampled_from([0.0, 1.0, 0.25]), seed=st.integers(0, 2**16))
def test_numpy_pair_configuration_matches_the_reference(p, d, inner, calls, alpha, beta, seed):
    """A pair call gives the whole micro-batch's result with the caller's
    alpha and beta (where beta is 0 the output is poisoned first), in
    :func:`pair.lanes`'s workspace, and refuses one byte less."""
    be = NumpyBackend()
    p = p.with_batch(2 * calls * (p.batch // 2))
    algo = pair.pair_id(int(inner), calls)
    assert be.supports(p, d, algo)
    need = be.workspace_size(p, d, algo)
    part = be.workspace_size(p.with_batch(p.batch // (2 * calls)), d, inner)
    assert need == pair.lanes(p, d, p.batch, part, calls).need
    x, w, y = _tensors(p, np.random.default_rng(seed))
    if need:
        check_rewritten_run(be, p, d, algo, need, x, w, y, alpha, beta, 1e-10)
        return
    # lanes of no bytes (a forward or backward-data inner algorithm without workspace)
    t = ConvTensors(p, x.copy(), w.copy(), y.copy())
    if beta == 0:
        getattr(t, OUTPUT_OF[d])[...] = np.nan
    be.run(d, algo, 0, t, alpha, beta, None)
    assert rel_err(getattr(t, OUTPUT_OF[d]), reference(p, d, x, w, y, alpha, beta)) < 1e-10


@settings(max_examples=30, deadline=None)
@given(data=st.data(), d=st.sampled_from(list(Direction)),
       alpha=st.sampled_from([1.0, 0.5]), beta=st.sampled_from([0.0, 1.0, -0.5]),
       seed=st.integers(0, 2**16))
def test_micro_batched_pair_plan_equals_the_unsplit_reference(data, d, alpha, beta, seed):
    """A plan of pair micro-batches (even sizes, mixed with plain ones) gives the
    whole batch's result; backward-filter accumulates over micro-batches, a
    pair's scratch included."""
    n = data.draw(st.integers(2, 8))
    p = data.draw(grouped(batch=n))
    be = NumpyBackend()
    sized = []
    for s in composition(data.draw, n):
        choices = [0, 1] + ([pair.pair_id(0), pair.pair_id(2)] if s % 2 == 0 else []) + (
            [pair.pair_id(1, 2)] if s % 4 == 0 else [])
        sized.append((s, data.draw(st.sampled_from(choices))))
    check_mixed_plan(be, p, d, sized, alpha, beta, seed, 1e-10)


def test_numpy_find_adds_pair_configurations_only_where_asked_and_they_are_searched():
    p = ConvProblem((4, 8, 9, 9), (8, 2, 3, 3), padding=1, groups=4)
    bf = Direction.BACKWARD_FILTER
    assert all(isinstance(a.algo, int) for a in NumpyBackend(repeats=1).find(p, bf, None))
    be = NumpyBackend(repeats=1, pair=True)
    got = be.find(p, bf, None)
    assert sorted(a.algo for a in got if isinstance(a.algo, str)) == sorted(
        pair.pair_id(int(a), j) for j in (1, 2) for a in NumpyAlgo)
    for a in got:
        assert a.workspace_bytes == be.workspace_size(p, bf, a.algo)
    # the scratch counts against the limit
    scratch = pair.scratch_bytes(p, bf)
    assert not [a for a in be.find(p, bf, scratch - 1) if isinstance(a.algo, str)]
    # other directions, odd batches, depthwise and ungrouped problems: not paired
    for q, d in ((p, Direction.FORWARD), (p.with_batch(3), bf),
                 (ConvProblem((4, 8, 9, 9), (8, 1, 3, 3), padding=1, groups=8), bf),
                 (ConvProblem((4, 8, 9, 9), (8, 8, 3, 3), padding=1), bf)):
        assert all(isinstance(a.algo, int) for a in be.find(q, d, None))


def test_a_convolution_plans_and_runs_pair_configurations(tmp_path, monkeypatch):
    """Through a Convolution whose backend reports pairs fastest, the backward-filter
    plan runs pairs and matches the reference; its key tells the search apart."""
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "c.sqlite"))
    p = ConvProblem((8, 9, 9, 8), (8, 3, 3, 2), padding=1, groups=4, layout="NHWC", math="fma")
    be = RewritesFirstBackend("pair")
    assert be.cache_name(p) == "numpy+pair" and NumpyBackend().cache_name(p) == "numpy"
    conv = convolution_for(p, backend=be, workspace_limit=1 << 20)
    rng = np.random.default_rng(3)
    x, w, y = (a.astype(np.float32) for a in _tensors(p, rng))
    d = Direction.BACKWARD_FILTER
    got = run_direction(conv, d, x, w, y, alpha=0.5, beta=0.25)
    plan = conv.plans[d]
    assert all(pair.parse_pair_id(m.algo) is not None for m in plan.micro_batches), plan
    assert rel_err(got, reference(p, d, x, w, y, 0.5, 0.25)) < 1e-5
