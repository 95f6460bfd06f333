"""The functional helpers import each DLPack argument once (issue 34, L10):
``mu.conv2d`` asked a producer for its data twice (once to size the
Convolution, once to run it), so a producer that exports once was refused,
where ``Convolution.forward`` took it. Results are checked against the float64
reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mucudnn as mu
from mucudnn.problem import ConvProblem, Direction

from reference import reference, rel_err


class OneShot:
    """A DLPack producer around a NumPy array whose ``__dlpack__`` works once
    (as for a stream or a buffer handed over), with no ``shape``/``dtype``
    attributes, so that only its export says what it holds."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        self.exports = 0

    def __dlpack__(self, **kwargs):
        self.exports += 1
        if self.exports > 1:
            raise BufferError("OneShot: already exported")
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


pytestmark = pytest.mark.usefixtures("cache_off")


@given(st.integers(1, 3), st.integers(1, 4), st.integers(3, 7), st.integers(1, 3),
       st.integers(0, 2), st.integers(1, 2), st.booleans(), st.randoms(use_true_random=False))
def test_conv2d_and_gradients_take_one_shot_producers(n, c, hw, r, pad, stride, out_given, rnd):
    r = min(r, hw + 2 * pad)
    p = ConvProblem((n, c, hw, hw), (2, c, r, r), padding=pad, stride=stride)
    g = np.random.default_rng(rnd.getrandbits(32))
    x = g.standard_normal(p.x_shape).astype(np.float32)
    w = g.standard_normal(p.w_shape).astype(np.float32)
    dy = g.standard_normal(p.output_shape).astype(np.float32)
    kw = dict(padding=pad, stride=stride, backend="numpy")
    cases = [
        (Direction.FORWARD, (x, w), "y",
         lambda a, b, o: mu.conv2d(a, b, out=o, **kw)),
        (Direction.BACKWARD_DATA, (dy, w), "x",
         lambda a, b, o: mu.conv_backward_data(a, b, p.x_shape, out=o, **kw)),
        (Direction.BACKWARD_FILTER, (x, dy), "w",
         lambda a, b, o: mu.conv_backward_filter(a, b, p.w_shape, out=o, **kw)),
    ]
    for d, (a, b), ro, call in cases:
        pa, pb = OneShot(a), OneShot(b)
        out = np.full(p.shape_of(ro), np.nan, np.float32) if out_given else None
        po = OneShot(out) if out_given else None
        res = call(pa, pb, po)
        assert (pa.exports, pb.exports) == (1, 1)
        if out_given:
            assert res is po and po.exports == 1
            res = out
        want = reference(p, d, x, w, dy)
        assert rel_err(np.asarray(res), want) < 1e-5, d


def test_a_producer_exported_twice_is_still_refused_with_its_name():
    """The guard the fix relies on: a OneShot really refuses a second export,
    and the error names the argument."""
    x = OneShot(np.ones((1, 1, 3, 3), np.float32))
    np.from_dlpack(x)
    with pytest.raises(mu.MucudnnError, match="^x: ") as info:
        mu.conv2d(x, np.ones((1, 1, 3, 3), np.float32), backend="numpy")
    assert isinstance(info.value, TypeError)
