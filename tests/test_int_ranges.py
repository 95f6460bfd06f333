"""Ints passed into cuDNN's C integer fields are range-checked, never truncated.

The legacy descriptors take int32 dims, strides, paddings, strides, dilations
and group counts; ctypes truncates a Python int to 32 bits without a word (an x
dim of 4294967301 became 5). The graph (backend) API takes int64 arrays. These
tests check every field at the boundaries (hypothesis), the tensor-span limit
against cuDNN's own verdict, and what actually crosses the ABI into
cudnnBackendSetAttribute.
"""

from __future__ import annotations

import contextlib
import ctypes
import pickle

import pytest
from hypothesis import given, strategies as st

from mucudnn._cudnn import prototypes
from mucudnn._cudnn import graph_descriptors as gd
from mucudnn._cudnn.descriptors import (
    ConvolutionDescriptor, FilterDescriptor, TensorDescriptor, live_descriptors,
)
from mucudnn._cudnn.backend_api import BackendDescriptor
from mucudnn._cudnn.enums import (
    BackendAttributeName as A, BackendAttributeType, BackendDescriptorType,
)
from mucudnn._cudnn.errors import CudnnError, Int32RangeError, Int64RangeError
from mucudnn.errors import MucudnnError
from mucudnn.problem import ConvProblem, packed_strides

from conftest import needs_cudnn

pytestmark = needs_cudnn

I32_MIN, I32_MAX = -2**31, 2**31 - 1
I64_MIN, I64_MAX = -2**63, 2**63 - 1


def fits32(v: int) -> bool:
    return I32_MIN <= v <= I32_MAX


def near(bound: int, width: int = 4):
    return st.integers(bound - width, bound + width)


# Values at and around every int32 edge, plus anything at all.
int32_edges = st.one_of(near(I32_MAX), near(I32_MIN), near(2**32), near(2**32 + 5),
                        st.integers(1, 16), st.integers(-2**70, 2**70))
int64_edges = st.one_of(near(I64_MAX), near(I64_MIN), near(2**64), near(I32_MAX),
                        st.integers(0, 16), st.integers(-2**80, 2**80))


# -- the finding -------------------------------------------------------------------------------

def test_a_dim_of_2_to_the_32_plus_5_is_refused_not_truncated_to_5():
    before = live_descriptors()
    with pytest.raises(Int32RangeError) as info:
        TensorDescriptor((1, 1, 4294967301, 1))
    e = info.value
    assert isinstance(e, MucudnnError) and isinstance(e, ValueError)
    assert e.field == "dims[2]" and e.value == 4294967301 and e.bits == 32
    text = str(e)
    assert "dims[2]" in text and "4294967301" in text and 'backend="cudnn-graph"' in text
    assert live_descriptors() == before  # the half-made descriptor was closed


def test_a_problem_too_large_for_the_legacy_api_points_at_the_graph_backend():
    p = ConvProblem((1, 1, 4294967301, 2), (1, 1, 1, 1))
    with pytest.raises(Int32RangeError, match="cudnn-graph"):
        TensorDescriptor.for_x(p)
    with gd.tensor(gd.UID_X, p.x_dims, packed_strides(p.x_dims, p.layout), p.dtype,
                   finalize=False) as t:
        assert t.attributes[A.TENSOR_DIMENSIONS][1] == p.x_dims


def test_range_errors_are_exported_and_keep_their_builtins():
    import mucudnn._cudnn as cd
    for name, builtin in (("IntRangeError", ValueError), ("Int32RangeError", ValueError),
                          ("Int64RangeError", ValueError), ("IntFieldTypeError", TypeError)):
        cls = getattr(cd, name)
        assert name in cd.__all__ and issubclass(cls, (MucudnnError,)) and issubclass(cls, builtin)


def test_range_errors_pickle():
    for cls in (Int32RangeError, Int64RangeError):
        e = cls("dims[2]: too big", "dims[2]", 2**40)
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is cls and str(again) == str(e)
        assert (again.field, again.value, again.bits) == ("dims[2]", 2**40, e.bits)


# -- every legacy int32 field ------------------------------------------------------------------

def expect(make, field: str, value: int, read_back):
    """``make()`` either raises Int32RangeError naming ``field`` (iff ``value``
    does not fit int32), raises cuDNN's own error, or stores ``value`` exactly."""
    if not fits32(value):
        with pytest.raises(Int32RangeError) as info:
            make()
        assert info.value.field == field and info.value.value == value
        assert field in str(info.value) and str(value) in str(info.value)
        return
    try:
        d = make()
    except Int32RangeError as exc:  # only an element-span error may remain
        assert "span" in str(exc), exc
        return
    except CudnnError:
        return  # cuDNN refused the (representable) value itself: no truncation
    with d:
        assert read_back(d) == value


@given(value=int32_edges, i=st.integers(0, 2), kind=st.sampled_from(["padding", "stride",
                                                                      "dilation"]))
def test_convolution_nd_fields(value, i, kind):
    args = {"padding": [0, 0, 0], "stride": [1, 1, 1], "dilation": [1, 1, 1]}
    args[kind][i] = value
    pos = {"padding": 0, "stride": 1, "dilation": 2}[kind]
    expect(lambda: ConvolutionDescriptor(args["padding"], args["stride"], args["dilation"]),
           f"{kind}[{i}]", value, lambda d: d.get_nd()[pos][i])


@given(value=int32_edges, i=st.integers(0, 1), kind=st.sampled_from(["padding", "stride",
                                                                      "dilation"]))
def test_convolution_2d_fields(value, i, kind):
    args = {"padding": [0, 0], "stride": [1, 1], "dilation": [1, 1]}
    args[kind][i] = value
    pos = {"padding": 0, "stride": 1, "dilation": 2}[kind]

    def make():
        d = ConvolutionDescriptor()
        try:
            d.set_2d(args["padding"], args["stride"], args["dilation"])
        except BaseException:
            d.close()
            raise
        return d
    expect(make, f"{kind}[{i}]", value, lambda d: d.get_2d()[pos][i])


@given(value=int32_edges)
def test_group_count(value):
    def make():
        d = ConvolutionDescriptor((0, 0), (1, 1), (1, 1))
        try:
            d.group_count = value
        except BaseException:
            d.close()
            raise
        return d
    expect(make, "groups", value, lambda d: d.group_count)


@given(value=int32_edges, i=st.integers(0, 3),
       how=st.sampled_from(["init", "set_4d", "set_nd_ex", "filter", "filter_4d"]))
def test_dims(value, i, how):
    dims = [1, 1, 1, 1]
    dims[i] = value

    def make():
        if how == "init":
            return TensorDescriptor(dims)
        if how == "filter":
            return FilterDescriptor(dims)
        d = FilterDescriptor() if how == "filter_4d" else TensorDescriptor()
        try:
            getattr(d, "set_nd_ex" if how == "set_nd_ex" else "set_4d")(dims)
        except BaseException:
            d.close()
            raise
        return d
    expect(make, f"dims[{i}]", value, lambda d: d.dims[i])


@given(value=int32_edges, i=st.integers(0, 3), ex=st.booleans())
def test_strides(value, i, ex):
    strides = [1, 1, 1, 1]
    strides[i] = value

    def make():
        if not ex:
            return TensorDescriptor((1, 1, 1, 1), strides)
        d = TensorDescriptor()
        try:
            d.set_4d_ex((1, 1, 1, 1), strides)
        except BaseException:
            d.close()
            raise
        return d
    expect(make, f"strides[{i}]", value, lambda d: d.strides[i])


def test_non_integral_values_are_refused_not_rounded():
    with pytest.raises(TypeError, match="dims"):
        TensorDescriptor((1, 2.5, 3, 4))
    with pytest.raises(TypeError, match="padding"):
        ConvolutionDescriptor((1.9, 0), (1, 1), (1, 1))
    with pytest.raises(TypeError, match="dims"):
        gd.tensor(1, (1, 2.5), (3, 1), "float32", finalize=False)


# -- the element span: cuDNN's own int32 limit on a tensor ------------------------------------

def cudnn_accepts(dims, strides) -> bool:
    """cuDNN's own verdict, through the raw C call (every value fits int32 here)."""
    with TensorDescriptor() as t:
        d = (ctypes.c_int * len(dims))(*dims)
        s = (ctypes.c_int * len(dims))(*strides)
        try:
            prototypes.lib.cudnnSetTensorNdDescriptor(t, 0, len(dims), d, s)
        except CudnnError:
            return False
        return True


big = st.one_of(st.integers(1, 8), st.integers(2**14, 2**17), near(2**30, 2), near(I32_MAX, 2))


@given(dims=st.lists(big, min_size=3, max_size=4), data=st.data())
def test_span_limit_matches_cudnns_own(dims, data):
    strides = data.draw(st.lists(big, min_size=len(dims), max_size=len(dims)))
    if not all(fits32(v) for v in dims + strides):
        return
    span = 1 + sum((d - 1) * s for d, s in zip(dims, strides))
    try:
        TensorDescriptor(dims, strides).close()
        ours = True
    except Int32RangeError as exc:
        assert exc.field == "span" and exc.value == span
        assert "cudnn-graph" in str(exc)
        ours = False
    assert ours == (span <= I32_MAX)
    assert ours == cudnn_accepts(dims, strides)


def test_packed_tensor_of_2_to_the_31_elements_is_refused_by_us_with_a_reason():
    for make in (lambda: TensorDescriptor((2, 2**30, 1, 1)),
                 lambda: TensorDescriptor((2, 2**30, 1, 1), format="NHWC")):
        with pytest.raises(Int32RangeError, match="span") as info:
            make()
        assert info.value.value == 2**31
    with TensorDescriptor() as t:
        with pytest.raises(Int32RangeError, match="span"):
            t.set_4d((2, 2**30, 1, 1))
        with pytest.raises(Int32RangeError, match="span"):
            t.set_nd_ex((2, 2**30, 1, 1), format="NHWC")
    TensorDescriptor((2, 2**30 - 1, 1, 1)).close()  # 2**31 - 2 elements fit


# -- the graph API: int64 arrays, checked and passed whole -------------------------------------

@contextlib.contextmanager
def captured():
    """What cudnnBackendSetAttribute receives while the block runs:
    {attribute: tuple of the int64 values in the C array}."""
    seen: dict[int, tuple] = {}
    real = prototypes.lib.cudnnBackendSetAttribute

    def spy(desc, name, atype, count, array):
        if atype == int(BackendAttributeType.INT64):
            p = ctypes.cast(array, ctypes.POINTER(ctypes.c_int64))
            seen[int(name)] = tuple(p[i] for i in range(count))
        return real(desc, name, atype, count, array)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prototypes.lib, "cudnnBackendSetAttribute", spy)
        yield seen


@given(dims=st.lists(int64_edges, min_size=3, max_size=5), data=st.data())
def test_graph_tensor_dims_and_strides_cross_the_abi_whole(dims, data):
    strides = data.draw(st.lists(int64_edges, min_size=len(dims), max_size=len(dims)))
    bad = [(f, i, v) for f, vals in (("DIMENSIONS", dims), ("STRIDES", strides))
           for i, v in enumerate(vals) if not I64_MIN <= v <= I64_MAX]
    try:
        with captured() as seen:
            t = gd.tensor(7, dims, strides, "float32", finalize=False)
    except Int64RangeError as exc:
        assert bad, exc
        f, i, v = bad[0]
        assert exc.field == f"TENSOR_{f}[{i}]" and exc.value == v and exc.bits == 64
        assert str(v) in str(exc)
        return
    except CudnnError:
        assert not bad
        return  # cuDNN refused the (representable) values itself
    with t:
        assert not bad
        assert seen[int(A.TENSOR_DIMENSIONS)] == tuple(dims)
        assert seen[int(A.TENSOR_STRIDES)] == tuple(strides)


@given(pad=st.lists(int64_edges, min_size=2, max_size=2))
def test_graph_convolution_paddings_cross_the_abi_whole(pad):
    if not all(I64_MIN <= v <= I64_MAX for v in pad):
        with pytest.raises(Int64RangeError, match="CONVOLUTION_PRE_PADDINGS"):
            gd.convolution(pad, (1, 1), (1, 1), finalize=False)
        return
    try:
        with captured() as seen:
            c = gd.convolution(pad, (1, 1), (1, 1), finalize=False)
    except CudnnError:
        return
    with c:
        assert seen[int(A.CONVOLUTION_PRE_PADDINGS)] == tuple(pad)
        assert seen[int(A.CONVOLUTION_POST_PADDINGS)] == tuple(pad)


@given(value=int32_edges)
def test_graph_int32_and_enum_attributes_are_checked(value):
    T = BackendAttributeType
    with BackendDescriptor(BackendDescriptorType.CONVOLUTION_DESCRIPTOR) as c:
        if fits32(value):
            try:
                c.set_enum(A.CONVOLUTION_CONV_MODE, T.CONVOLUTION_MODE, value)
            except CudnnError:
                pass
        else:
            with pytest.raises(Int32RangeError, match="CONVOLUTION_CONV_MODE"):
                c.set_enum(A.CONVOLUTION_CONV_MODE, T.CONVOLUTION_MODE, value)
