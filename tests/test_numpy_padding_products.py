"""The NumPy backend multiplies the padding like any input (issue 34, L9): with a
NaN or inf weight, outputs whose window lies (wholly or partly) in the padding
are NaN, as 0 * NaN and 0 * inf are, where they used to be finite (Note
[padding products] in mucudnn/backends/numpy_geometry.py). Checked against the
float64 reference, which pads explicitly. (PyTorch is no reference here: on the CPU
some of its kernels multiply the padding and others skip it.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mucudnn import ConvProblem, Direction
from mucudnn.backends.base import OUTPUT_OF, ConvTensors
from mucudnn.backends.numpy import NumpyAlgo, NumpyBackend
from mucudnn.problem import from_canonical

from reference import reference

BE = NumpyBackend(repeats=1)


pytestmark = pytest.mark.usefixtures("cache_off")


def run(p, direction, algo, x, w, y):
    t = ConvTensors(p, x.copy(), w.copy(), y.copy())
    out = getattr(t, OUTPUT_OF[direction])
    out[...] = 7.0
    BE.run(direction, algo, 0, t, 1.0, 0.0,
           BE.alloc_workspace(BE.workspace_size(p, direction, algo)))
    return out


def kinds(a):
    """0 finite, 1 NaN, 2 +inf, 3 -inf, elementwise."""
    return np.select([np.isnan(a), np.isposinf(a), np.isneginf(a)], [1, 2, 3], 0)


def test_a_nan_weight_over_padding_only_windows_gives_nan():
    """The finding: padding 2 around a 1x1 input with a 3x3 filter, one NaN tap."""
    p = ConvProblem((1, 1, 1, 1), (1, 1, 3, 3), padding=2)
    x = np.ones(p.x_shape, np.float32)
    w = np.ones(p.w_shape, np.float32)
    w[0, 0, 0, 0] = np.nan
    y = np.zeros(p.output_shape, np.float32)
    with np.errstate(invalid="ignore"):
        want = reference(p, Direction.FORWARD, x, w, y)
    # the NaN tap reads the input only at output (2, 2); everywhere else, padding
    assert np.isnan(want).sum() == want.size
    for algo in NumpyAlgo:
        out = run(p, Direction.FORWARD, algo, x, w, y)
        assert np.isnan(out).all(), (algo.name, out)


@st.composite
def cases(draw):
    """A padded problem, finite operands, and NaN/inf put into w and dy (the
    operands whose products with the padding exist)."""
    layout = draw(st.sampled_from(["NCHW", "NHWC", "NCDHW"]))
    nd = 3 if layout == "NCDHW" else 2
    g = draw(st.integers(1, 2))
    c, k = g * draw(st.integers(1, 2)), g * draw(st.integers(1, 2))
    r = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    s = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    d = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    pad = draw(st.lists(st.integers(0, 3), min_size=nd, max_size=nd).filter(any))
    h = [draw(st.integers(max(1, (ri - 1) * di + 1 - 2 * pi), 5)) for ri, di, pi in zip(r, d, pad)]
    n = draw(st.integers(1, 2))
    p = ConvProblem(from_canonical((n, c) + tuple(h), layout),
                    from_canonical((k, c // g) + tuple(r), layout), stride=tuple(s),
                    padding=tuple(pad), dilation=tuple(d), groups=g, layout=layout,
                    dtype=draw(st.sampled_from(["float32", "float64"])))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x, w, y = (rng.standard_normal(sh).astype(p.dtype)
               for sh in (p.x_shape, p.w_shape, p.output_shape))
    for a in (w, y):
        flat = a.reshape(-1)
        for _ in range(draw(st.integers(0, 2))):
            flat[draw(st.integers(0, flat.size - 1))] = draw(
                st.sampled_from([np.nan, np.inf, -np.inf]))
    return p, x, w, y


@given(cases())
def test_non_finite_values_meet_the_padding_as_in_the_reference(case):
    p, x, w, y = case
    for direction in Direction:
        with np.errstate(all="ignore"):
            want = reference(p, direction, x, w, y)
        for algo in NumpyAlgo:
            out = run(p, direction, algo, x, w, y)
            label = (algo.name, str(direction), p)
            assert (kinds(out) == kinds(want)).all(), label
            ok = np.isfinite(want)
            tol = 1e-4 if p.dtype == "float32" else 1e-9
            assert np.allclose(out[ok], want[ok], rtol=tol, atol=tol), label
