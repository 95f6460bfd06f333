"""``mucudnn.conv1d`` and the 1-D forms of the backward helpers (Note [1-D
arrays as height-1 views]) on the NumPy backend, against torch's float64
``conv1d`` and its autograd gradients: random shapes, strides, paddings,
dilations, groups, both layouts, alpha/beta and given outputs; and the
arguments they refuse, each named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mucudnn as mu
from mucudnn.api.functional import _CONVS

torch = pytest.importorskip("torch", reason="the reference is torch's float64 conv1d")
F = torch.nn.functional

pytestmark = pytest.mark.usefixtures("cache_off")


@st.composite
def problems(draw):
    groups = draw(st.integers(1, 3))
    cg, kg = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    k, d = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    pad, stride = draw(st.integers(0, 3)), draw(st.integers(1, 3))
    length = max(1, d * (k - 1) + 1 - 2 * pad) + draw(st.integers(0, 6))
    return dict(n=draw(st.integers(1, 5)), c=cg * groups, k=kg * groups, kernel=k,
                length=length, groups=groups, stride=stride, padding=pad, dilation=d,
                layout=draw(st.sampled_from(["NCL", "NLC", "ncl"])),
                alpha=draw(st.sampled_from([1.0, 0.5, -2.0])),
                beta=draw(st.sampled_from([0.0, 0.0, 1.0, -0.5])),
                policy=draw(st.sampled_from(["powerOfTwo", "all", [2, 1]])),
                seed=draw(st.integers(0, 2 ** 16)))


def _to(layout, a):
    """An (N, C, L)-ordered array in ``layout`` (the filter alike)."""
    return np.ascontiguousarray(a.transpose(0, 2, 1)) if layout.upper() == "NLC" else a


@settings(max_examples=60, deadline=None)
@given(problems())
def test_conv1d_and_its_gradients_match_torch_float64(p):
    rng = np.random.default_rng(p["seed"])
    x = rng.standard_normal((p["n"], p["c"], p["length"]))
    w = rng.standard_normal((p["k"], p["c"] // p["groups"], p["kernel"]))
    kw = dict(stride=p["stride"], padding=p["padding"], dilation=p["dilation"],
              groups=p["groups"])
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    yt = F.conv1d(xt, wt, **kw)
    dy = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(dy))
    lay = p["layout"]
    opts = dict(kw, layout=lay, backend="numpy", policy=p["policy"], workspace_limit=0,
                alpha=p["alpha"], beta=p["beta"])
    cases = [
        (mu.conv1d, (_to(lay, x), _to(lay, w)), yt.detach().numpy()),
        (lambda a, b, **o: mu.conv_backward_data(a, b, _to(lay, x).shape, **o),
         (_to(lay, dy), _to(lay, w)), xt.grad.numpy()),
        (lambda a, b, **o: mu.conv_backward_filter(a, b, _to(lay, w).shape, **o),
         (_to(lay, x), _to(lay, dy)), wt.grad.numpy()),
    ]
    for fn, args, want in cases:
        old = _to(lay, rng.standard_normal(want.shape))
        out = old.copy()
        got = fn(*args, out=out, **opts)
        assert got is out
        np.testing.assert_allclose(got, _to(lay, p["alpha"] * want) + p["beta"] * old,
                                   rtol=1e-10, atol=1e-10)
        if p["beta"] == 0.0:  # an output allocated for the call
            fresh = fn(*args, **opts)
            assert fresh.shape == out.shape
            np.testing.assert_allclose(fresh, out, rtol=1e-12, atol=1e-12)


def test_a_given_output_is_written_through_its_view():
    x = np.ones((2, 3, 9), np.float32)
    w = np.ones((4, 3, 3), np.float32)
    big = np.zeros((3, 4, 7), np.float32)
    out = big[1:]  # contiguous, a view of a larger array
    assert mu.conv1d(x, w, out=out, backend="numpy") is out
    np.testing.assert_array_equal(big[1:], np.full((2, 4, 7), 9.0, np.float32))
    assert not big[0].any()


def test_conv1d_runs_the_height_1_problem_and_views_its_arrays():
    x = np.arange(2 * 3 * 9, dtype=np.float32).reshape(2, 3, 9)
    w = np.ones((4, 3, 3), np.float32)
    mu.clear_caches()
    y = mu.conv1d(x, w, stride=(2,), padding=[1], backend="numpy")
    ref = F.conv1d(torch.tensor(x), torch.tensor(w), stride=2, padding=1).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    (conv,) = _CONVS.values()
    assert conv.problem.x_shape == (2, 3, 1, 9) and conv.problem.stride == (1, 2)
    assert conv.problem.padding == (0, 1) and conv.problem.layout == "NCHW"


@pytest.mark.parametrize("call,match", [
    (lambda x, w: mu.conv1d(x, w, layout="NCHW", backend="numpy"), r"layout: 1-D .*'NCHW'"),
    (lambda x, w: mu.conv1d(x, w, layout=3, backend="numpy"), r"layout: expected a string"),
    (lambda x, w: mu.conv1d(x[None], w, backend="numpy"), r"x: expected 3 dimensions"),
    (lambda x, w: mu.conv1d(x, w[..., None], backend="numpy"), r"w: expected 3 dimensions"),
    (lambda x, w: mu.conv1d(x.tolist(), w, backend="numpy"), r"x: a 1-D convolution needs"),
    (lambda x, w: mu.conv1d(x, w, stride=(1, 2), backend="numpy"), r"stride"),
    (lambda x, w: mu.conv1d(x, w, padding=-1, backend="numpy"), r"padding"),
    (lambda x, w: mu.conv1d(x, w, dilation=2.5, backend="numpy"), r"dilation"),
    (lambda x, w: mu.conv1d(x, w, out=np.empty((2, 8, 7), np.float32)[:, ::2],
                            backend="numpy"), r"y: expected a C-contiguous array"),
    (lambda x, w: mu.conv_backward_data(np.ones((2, 4, 7), np.float32), w, (2, 3, 9, 1),
                                        layout="NLC", backend="numpy"), r"layout"),
    (lambda x, w: mu.conv_backward_filter(x, np.ones((2, 4, 7), np.float32), (4, 3, 3),
                                          layout="NDHWC", backend="numpy"), r"layout: 1-D"),
])
def test_bad_1d_arguments_raise_mucudnn_errors_naming_them(call, match):
    x = np.ones((2, 3, 9), np.float32)
    w = np.ones((4, 3, 3), np.float32)
    with pytest.raises(mu.MucudnnError, match=match) as err:
        call(x, w)
    assert isinstance(err.value, (ValueError, TypeError))
