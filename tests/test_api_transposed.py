"""``mucudnn.conv_transpose1d/2d/3d`` on arrays (Note [transposed convolutions
on arrays]) on the NumPy backend, against torch's float64
``conv_transpose*d``: random shapes, strides, paddings, output paddings,
dilations, groups, channels-first and channels-last layouts, alpha/beta with
given and allocated outputs; and the arguments they refuse, each named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mucudnn as mu

torch = pytest.importorskip("torch", reason="the reference is torch's float64 conv_transpose")
F = torch.nn.functional

pytestmark = pytest.mark.usefixtures("cache_off")

OURS = {1: mu.conv_transpose1d, 2: mu.conv_transpose2d, 3: mu.conv_transpose3d}
THEIRS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
LAYOUTS = {1: ("NCL", "NLC"), 2: ("NCHW", "NHWC"), 3: ("NCDHW", "NDHWC")}


@st.composite
def problems(draw):
    nd = draw(st.sampled_from([1, 2, 2, 3]))
    groups = draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    out_pad = tuple(draw(st.integers(0, s - 1)) for s in stride)
    spatial = tuple(draw(st.integers(1, 5 if nd < 3 else 3)) for _ in range(nd))
    pad = tuple(draw(st.integers(0, max(0, ((spatial[i] - 1) * stride[i] + dilation[i]
                                            * (kernel[i] - 1) + out_pad[i]) // 2)))
                for i in range(nd))
    return dict(nd=nd, n=draw(st.integers(1, 4)), cin=groups * draw(st.integers(1, 2)),
                cout_g=draw(st.integers(1, 2)), kernel=kernel, spatial=spatial,
                groups=groups, stride=stride, padding=pad, output_padding=out_pad,
                dilation=dilation, last=draw(st.booleans()),
                alpha=draw(st.sampled_from([1.0, 0.5, -2.0])),
                beta=draw(st.sampled_from([0.0, 0.0, 1.0, -0.5])),
                policy=draw(st.sampled_from(["powerOfTwo", "all", [2, 1]])),
                seed=draw(st.integers(0, 2 ** 16)))


def _to(last, a):
    """A channels-first array (the filter alike) in the channels-last order where ``last``."""
    return np.ascontiguousarray(np.moveaxis(a, 1, -1)) if last else a


@settings(max_examples=60, deadline=None)
@given(problems())
def test_conv_transpose_matches_torch_float64(p):
    rng = np.random.default_rng(p["seed"])
    nd = p["nd"]
    x = rng.standard_normal((p["n"], p["cin"]) + p["spatial"])
    w = rng.standard_normal((p["cin"], p["cout_g"]) + p["kernel"])
    kw = dict(stride=p["stride"], padding=p["padding"], output_padding=p["output_padding"],
              dilation=p["dilation"], groups=p["groups"])
    want = THEIRS[nd](torch.tensor(x), torch.tensor(w), **kw).numpy()
    last = p["last"]
    opts = dict(kw, layout=LAYOUTS[nd][last], backend="numpy", policy=p["policy"],
                workspace_limit=0, alpha=p["alpha"], beta=p["beta"])
    old = _to(last, rng.standard_normal(want.shape))
    out = old.copy()
    got = OURS[nd](_to(last, x), _to(last, w), out=out, **opts)
    assert got is out
    np.testing.assert_allclose(got, _to(last, p["alpha"] * want) + p["beta"] * old,
                               rtol=1e-10, atol=1e-10)
    if p["beta"] == 0.0:  # an output allocated for the call
        fresh = OURS[nd](_to(last, x), _to(last, w), **opts)
        assert fresh.shape == out.shape
        np.testing.assert_allclose(fresh, out, rtol=1e-12, atol=1e-12)


def test_it_runs_the_backward_data_of_the_adjoint_problem():
    """See Note [transposed convolutions on arrays]: the cached Convolution is
    the convolution whose input has the output's shape, in the given layout."""
    mu.clear_caches()
    x = np.ones((2, 5, 4, 6), np.float32)  # NHWC, C_in = 6
    w = np.ones((6, 3, 3, 2), np.float32)  # (C_in, R, S, C_out/groups)
    y = mu.conv_transpose2d(x, w, stride=2, padding=1, output_padding=(1, 0), groups=3,
                            layout="nhwc", backend="numpy")
    assert y.shape == (2, 10, 7, 6)
    (conv,) = mu.api.functional._CONVS.values()
    assert conv.problem.x_shape == (2, 10, 7, 6) and conv.problem.w_shape == (6, 3, 3, 2)
    assert conv.problem.layout == "NHWC" and conv.problem.groups == 3
    assert conv.plans and all(d.value == "backward_data" for d in conv.plans)


def test_bad_arguments_raise_errors_naming_them():
    x = np.ones((1, 4, 5, 5), np.float32)
    w = np.ones((4, 2, 3, 3), np.float32)
    cases = [
        (dict(output_padding=2, stride=2), "output_padding"),
        (dict(output_padding=1), "output_padding"),  # not below stride 1, whatever the dilation
        (dict(output_padding=-1), "output_padding"),
        (dict(stride=0), "stride"),
        (dict(padding=4), "x"),  # an empty output
        (dict(stride=10 ** 9), "y"),  # an output no tensor can hold, refused up front
        (dict(dilation=2 ** 70), "y"),
        (dict(groups=3), "groups"),
        (dict(groups=True), "groups"),
        (dict(layout="NHWCX"), "layout"),
        (dict(layout="NCL"), "layout"),
    ]
    for kw, name in cases:
        with pytest.raises(mu.MucudnnError, match=rf"^{name}:") as info:
            mu.conv_transpose2d(x, w, backend="numpy", **kw)
        assert isinstance(info.value, (ValueError, TypeError))
    with pytest.raises(ValueError, match=r"^w: expected 4 input channels first"):
        mu.conv_transpose2d(x, np.ones((3, 2, 3, 3), np.float32), backend="numpy")
    with pytest.raises(ValueError, match=r"^w: expected a 4-D array"):
        mu.conv_transpose2d(x, np.ones((4, 2, 3), np.float32), backend="numpy")
    with pytest.raises(ValueError, match=r"^x: expected a 4-D array"):
        mu.conv_transpose2d(x[0], w, backend="numpy")
    with pytest.raises(mu.MucudnnError, match=r"^layout:"):
        mu.conv_transpose1d(x[0], w[..., 0], layout="NCHW", backend="numpy")
