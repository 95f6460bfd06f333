"""The NumPy backend's three algorithms compute one function on every input:
NaN, +-inf and values near the float32 maximum included (Note [FFT and
non-finite inputs] in mucudnn/backends/_numpy_guard.py).

Two independent expectations, both from the float64 reference (tests/reference.py):

- where an output is non-finite: exactly where one of its products has a
  non-finite operand, the padding's zeros included (0 * inf is NaN; Note
  [padding products] in mucudnn/backends/numpy_geometry.py). The reference
  computes that on operands whose finite values are 1 and the others NaN,
  where a product is NaN exactly when one of its operands is;
- elsewhere: the float64 reference rounded to the output type: +-inf where it
  exceeds the type's range, else close to it.

And, between the algorithms: NaN, +inf and -inf at exactly the same positions.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mucudnn import ConvProblem, Direction
from mucudnn.backends.base import OUTPUT_OF, ConvTensors
from mucudnn.backends.numpy import NumpyAlgo, NumpyBackend
from mucudnn.problem import from_canonical

from reference import from_canonical_array, reference, rel_err, to_canonical_array


be = NumpyBackend(repeats=1)
F32_MAX = float(np.finfo(np.float32).max)
TOL = {"float32": 1e-5, "float64": 1e-10}
SPECIAL = [np.nan, np.inf, -np.inf, 3e38, -3e38, 1e38, -1e38, F32_MAX, -F32_MAX, 1e30, 0.0]


def run(p, direction, algo, x, w, y):
    t = ConvTensors(p, x.copy(), w.copy(), y.copy())
    out = getattr(t, OUTPUT_OF[direction])
    out[...] = 7.0  # beta = 0: never read
    be.run(direction, algo, 0, t, 1.0, 0.0, be.alloc_workspace(be.workspace_size(p, direction, algo)))
    return out


@st.composite
def problems(draw, dtypes=("float32", "float32", "float64")):
    nd = draw(st.sampled_from([2, 2, 3]))
    layout = {2: ["NCHW", "NHWC"], 3: ["NCDHW", "NDHWC"]}[nd]
    layout = draw(st.sampled_from(layout))
    g = draw(st.integers(1, 2))
    c, k = g * draw(st.integers(1, 3)), g * draw(st.integers(1, 3))
    r = draw(st.lists(st.integers(1, 3 if nd < 3 else 2), min_size=nd, max_size=nd))
    s = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    d = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    pad = draw(st.lists(st.integers(0, 2), min_size=nd, max_size=nd))
    h = [draw(st.integers(max(1, (ri - 1) * di + 1 - 2 * pi), (ri - 1) * di + 5))
         for ri, di, pi in zip(r, d, pad)]
    n = draw(st.integers(1, 3))
    return ConvProblem(from_canonical((n, c) + tuple(h), layout),
                       from_canonical((k, c // g) + tuple(r), layout),
                       stride=tuple(s), padding=tuple(pad), dilation=tuple(d), groups=g,
                       layout=layout, dtype=draw(st.sampled_from(dtypes)))


@st.composite
def cases(draw):
    """A problem and x, w, y with special values put in at drawn places."""
    p = draw(problems())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dt = np.dtype(p.dtype)
    arrays = [rng.standard_normal(s).astype(dt) for s in (p.x_shape, p.w_shape, p.output_shape)]
    for _ in range(draw(st.integers(1, 4))):
        which = draw(st.integers(0, 2))
        a = arrays[which].reshape(-1)
        a[draw(st.integers(0, a.size - 1))] = draw(st.sampled_from(SPECIAL))
    if draw(st.booleans()):  # a block of huge values, to overflow sums
        a = arrays[0].reshape(-1)
        a[: draw(st.integers(1, a.size))] = draw(st.sampled_from([3e38, -2e38, 1e38]))
    return p, arrays


def operands(direction, x, w, y):
    return {Direction.FORWARD: (x, w), Direction.BACKWARD_DATA: (w, y),
            Direction.BACKWARD_FILTER: (x, y)}[direction]


def expected_nonfinite(p, direction, x, w, y):
    """Outputs with a product of a NaN or inf of either operand (padding included)."""
    def marks(a):
        return np.where(np.isfinite(a), 1.0, np.nan)

    with np.errstate(invalid="ignore"):
        return np.isnan(reference(p, direction, marks(x), marks(w), marks(y)))


def _clean(a):
    return np.where(np.isfinite(a), np.abs(np.asarray(a, np.float64)), 0.0)


def product_bound(p, direction, x, w, y):
    """Per output, the sum of |products| that make it (non-finite operands as 0):
    what DIRECT's and IM2COL's rounding is relative to."""
    return reference(p, direction, _clean(x), _clean(w), _clean(y))


def transform_bound(p, direction, x, w, y):
    """Per output, sum over its channel pairs of ||a_channel|| * ||b_channel||
    (2-norms over space, non-finite as 0): what a transform's rounding is
    relative to (Note [FFT and non-finite inputs])."""
    def norms(a):
        c = to_canonical_array(_clean(a), p.layout)
        return np.linalg.norm(c.reshape(c.shape[0], c.shape[1], -1), axis=2)

    nx, nw, ny = norms(x), norms(w), norms(y)              # (N, C), (K, Cg), (N, K)
    g, (k, cg) = p.groups, p.w_dims[:2]
    kg = k // g
    group_x = np.stack([nx[:, gi * cg:(gi + 1) * cg] for gi in range(g)], 1)   # (N, G, Cg)
    wg, yg = nw.reshape(g, kg, cg), ny.reshape(-1, g, kg)
    if direction is Direction.FORWARD:
        s = np.einsum("ngc,gkc->ngk", group_x, wg).reshape(-1, k)
    elif direction is Direction.BACKWARD_DATA:
        s = np.einsum("ngk,gkc->ngc", yg, wg).reshape(-1, g * cg)
    else:
        s = np.einsum("ngc,ngk->gkc", group_x, yg).reshape(k, cg)
    out = p.y_dims if direction is Direction.FORWARD else (
        p.x_dims if direction is Direction.BACKWARD_DATA else p.w_dims)
    s = np.broadcast_to(s.reshape(s.shape + (1,) * (len(out) - 2)), out)
    return from_canonical_array(s, p.layout)


def kinds(a):
    """0 finite, 1 NaN, 2 +inf, 3 -inf, elementwise."""
    return np.select([np.isnan(a), np.isposinf(a), np.isneginf(a)], [1, 2, 3], 0)


@given(case=cases())
def test_algorithms_agree_with_the_reference_on_special_values(case):
    p, (x, w, y) = case
    for direction in Direction:
        with np.errstate(all="ignore"):
            want = reference(p, direction, x, w, y)
            bad = expected_nonfinite(p, direction, x, w, y)
            bound = product_bound(p, direction, x, w, y)
            spread = transform_bound(p, direction, x, w, y)
        outs = {algo: run(p, direction, algo, x, w, y) for algo in NumpyAlgo}
        top = float(np.finfo(p.dtype).max)
        for algo, out in outs.items():
            label = (algo.name, str(direction), p)
            # this algorithm's rounding, relative to what it scales with
            slack = TOL[p.dtype] * (bound + (spread if algo is NumpyAlgo.FFT else 0))
            over = ~bad & (np.abs(want) - slack > top)   # too large even after rounding
            fits = ~bad & (np.abs(want) + slack < top)   # fits even after rounding
            # non-finite exactly where a NaN/inf reaches (through the padding's
            # products too), or where the exact result does not fit the type
            assert (~np.isfinite(out) == (bad | over))[bad | over | fits].all(), label
            assert (np.sign(out[over]) == np.sign(want[over])).all(), label
            err = np.abs(out[fits] - want[fits]) - slack[fits]
            assert (err <= np.finfo(p.dtype).tiny).all(), (label, err.max())
            assert (kinds(out)[bad] == kinds(want)[bad]).all(), label
        first = kinds(outs[NumpyAlgo.DIRECT])
        for algo, out in outs.items():
            assert (kinds(out) == first).all(), (algo.name, str(direction), p)


# -- the findings, one by one ----------------------------------------------------------------

def test_huge_operands_on_both_sides_overflow_where_direct_does():
    # dy and w both hold 3e38: an FFT's rounding (relative to |dy| * |w|, 9e76)
    # buries an exact -3.8e38, which must still come back as -inf everywhere.
    p = ConvProblem((1, 1, 1, 3, 2), (1, 1, 1, 2, 1), stride=(1, 1, 2), padding=(0, 0, 1),
                    layout="NCDHW")
    x = np.zeros(p.x_shape, np.float32)
    w = np.array([3e38, 0.94708097], np.float32).reshape(p.w_shape)
    y = np.array([3e38, -1.2654215, -0.62327445, 0.041325979], np.float32).reshape(
        p.output_shape)
    with np.errstate(all="ignore"):
        want = reference(p, Direction.BACKWARD_DATA, x, w, y).reshape(-1)
    assert want[1] < -F32_MAX and abs(want[3]) < F32_MAX
    for algo in NumpyAlgo:
        out = run(p, Direction.BACKWARD_DATA, algo, x, w, y).reshape(-1)
        assert np.isneginf(out[1]) and np.isfinite(out[[0, 2, 3, 4, 5]]).all(), algo.name
        if algo is not NumpyAlgo.FFT:  # (the FFT's 1.2e37 is within its rounding of 9e76)
            assert out[3] == pytest.approx(want[3], rel=1e-6), algo.name


P = ConvProblem((2, 2, 8, 8), (3, 2, 3, 3), padding=1)


def normal(p, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in (p.x_shape, p.w_shape, p.output_shape)]


@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_one_nan_stays_in_its_receptive_field(direction):
    x, w, y = normal(P)
    x[0, 0, 2, 2] = np.nan
    y[0, 1, 5, 5] = np.nan
    bad = expected_nonfinite(P, direction, x, w, y)
    assert 0 < bad.sum() < bad.size  # a real test: some, not all
    for algo in NumpyAlgo:
        out = run(P, direction, algo, x, w, y)
        assert (np.isnan(out) == bad).all(), algo.name


@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_a_finite_1e38_gives_finite_outputs_where_the_result_fits(direction):
    x, w, y = (0.1 * a for a in normal(P, 1))  # keep every exact result below the maximum
    x[1, 1, 4, 4] = 1e38
    y[0, 2, 3, 3] = 1e38  # another sample: dw sums x[n] * dy[n], never 1e38 * 1e38
    with np.errstate(all="ignore"):
        want = reference(P, direction, x, w, y)
    assert np.abs(want).max() > 1e36 and np.isfinite(want.astype(np.float32)).all()
    for algo in NumpyAlgo:
        out = run(P, direction, algo, x, w, y)
        assert np.isfinite(out).all(), algo.name
        assert rel_err(out, want) < 1e-5, algo.name


def test_partial_sums_of_huge_values_do_not_overflow():
    # 3e38 + 3e38 - 3e38 overflows float32 summed left to right; the exact sum fits.
    p = ConvProblem((1, 3, 1, 1), (1, 3, 1, 1))
    x = np.array([3e38, 3e38, -3e38], np.float32).reshape(p.x_shape)
    w = np.ones(p.w_shape, np.float32)
    y = np.zeros(p.output_shape, np.float32)
    for algo in NumpyAlgo:
        out = run(p, Direction.FORWARD, algo, x, w, y)
        assert out.reshape(-1)[0] == pytest.approx(3e38, rel=1e-6), algo.name


def test_overflow_of_the_exact_result_is_inf_in_every_algorithm():
    p = ConvProblem((1, 4, 1, 1), (2, 4, 1, 1))
    x = np.full(p.x_shape, 3e38, np.float32)
    w = np.array([[1, 1, 1, 1], [1, -1, 1, -1]], np.float32).reshape(p.w_shape)
    y = np.zeros(p.output_shape, np.float32)
    for algo in NumpyAlgo:
        out = run(p, Direction.FORWARD, algo, x, w, y).reshape(-1)
        assert np.isposinf(out[0]) and out[1] == 0, (algo.name, out)


def test_a_huge_sample_leaves_the_others_alone():
    x, w, y = normal(P, 2)
    alone = {a: run(P.with_batch(1), Direction.FORWARD, a, x[1:], w, y[1:]) for a in NumpyAlgo}
    x[0] = 3e37
    for algo in NumpyAlgo:
        out = run(P, Direction.FORWARD, algo, x, w, y)
        np.testing.assert_allclose(out[1], alone[algo][0], rtol=1e-5, atol=1e-5)
