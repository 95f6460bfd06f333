"""One helper per job for shapes and integers: contiguous strides
(``cuda.dlpack.c_strides``, Note [contiguous strides]), per-dimension integer
tuples (``units.int_tuple``, PyTorch's one-for-all rule included) and integer
values (``units.is_integer``), checked against NumPy's and PyTorch's own."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import mucudnn as mu
from mucudnn.cuda.dlpack import c_strides
from mucudnn.exec.arrays import _contiguous_cai
from mucudnn.optimizer.cache_entries import BadEntry, check_cap
from mucudnn.units import int_tuple, is_integer

DTYPES = [np.int8, np.float16, np.float32, np.float64, np.complex128]
shapes = st.lists(st.integers(1, 6), max_size=5).map(tuple)
shapes_with_zeros = st.lists(st.integers(0, 4), max_size=5).map(tuple)


@given(shape=shapes, dtype=st.sampled_from(DTYPES))
def test_c_strides_are_numpys_for_c_contiguous_arrays(shape, dtype):
    a = np.empty(shape, dtype)
    assert a.flags.c_contiguous
    assert c_strides(shape, a.itemsize) == a.strides
    assert c_strides(shape) == tuple(s // a.itemsize for s in a.strides)


@given(shape=shapes_with_zeros, dtype=st.sampled_from(DTYPES))
def test_a_zero_extent_counts_as_one(shape, dtype):
    """See Note [contiguous strides]: an axis of extent 0 is stepped over as one
    of extent 1 (PyTorch's contiguous strides, below; NumPy 2 gives a fresh
    empty array all-zero strides), and such strides are contiguous."""
    item = np.dtype(dtype).itemsize
    want = np.empty(tuple(max(d, 1) for d in shape), dtype).strides
    assert c_strides(shape, item) == want
    assert _contiguous_cai(shape, want, item)


@given(shape=shapes_with_zeros)
def test_c_strides_are_pytorchs_contiguous_strides(shape):
    torch = pytest.importorskip("torch")
    assert c_strides(shape) == torch.empty(shape).stride()


@given(v=st.integers(0, 9), nd=st.integers(1, 3))
def test_one_value_stands_for_every_dimension_where_asked(v, nd):
    assert int_tuple("stride", v, nd, 0) == (v,) * nd
    assert int_tuple("stride", [v], nd, 0, one_for_all=True) == (v,) * nd
    assert int_tuple("stride", (v,) * nd, nd, 0, one_for_all=True) == (v,) * nd
    if nd > 1:
        with pytest.raises(mu.InvalidValueError, match="^stride: expected"):
            int_tuple("stride", [v], nd, 0)
        with pytest.raises(mu.InvalidValueError, match="^stride: expected"):
            int_tuple("stride", [v] * (nd + 1), nd, 0, one_for_all=True)


@given(value=st.one_of(st.integers(-3, 9), st.lists(st.integers(-3, 9), max_size=4),
                       st.floats(allow_nan=False), st.booleans(), st.none(), st.text(max_size=2),
                       st.lists(st.one_of(st.booleans(), st.floats(0, 3)), min_size=1, max_size=3)),
       nd=st.integers(1, 3), minimum=st.integers(0, 1))
def test_torch_arguments_follow_the_one_parser(value, nd, minimum):
    """mucudnn.torch's stride/padding/dilation are int_tuple's with one-for-all, as
    TorchValueError / TorchTypeError."""
    pytest.importorskip("torch")
    from mucudnn.torch import functional as F

    try:
        want = int_tuple("padding", value, nd, minimum, one_for_all=True)
    except mu.InvalidTypeError as exc:
        with pytest.raises(F.TorchTypeError) as info:
            F._tuple("padding", value, nd, minimum)
        assert str(info.value) == str(exc)
        return
    except mu.InvalidValueError as exc:
        with pytest.raises(F.TorchValueError) as info:
            F._tuple("padding", value, nd, minimum)
        assert str(info.value) == str(exc)
        return
    assert F._tuple("padding", value, nd, minimum) == want


@pytest.mark.parametrize("v, ok", [(3, True), (np.int64(3), True), (np.array(3), True),
                                   (True, False), (3.0, False), ("3", False), (None, False),
                                   (np.array([3]), False)])
def test_is_integer_and_a_stored_cap(v, ok):
    assert is_integer(v) is ok
    if ok:
        assert check_cap(v) == 3 and type(check_cap(v)) is int
    else:
        with pytest.raises(BadEntry):
            check_cap(v)
