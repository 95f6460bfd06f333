"""SliceProblem (Note [chunks as slices] in mucudnn/problem/slice_problem.py):
a chunk of a grouped convolution's groups described in place, its x and y
strided as channel slices of the whole tensors. Its strides are checked
against NumPy's own strides of the same slices, and the graph API's tensor
descriptors (the real libcudnn, no GPU needed) against both."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mucudnn import ConvProblem, Direction
from mucudnn.errors import MucudnnError
from mucudnn.problem import packed_strides
from mucudnn.problem.layouts import from_canonical, to_canonical
from mucudnn.problem.slice_problem import SliceProblem
from conftest import needs_cudnn


def numpy_slice_strides(whole_dims: tuple, layout: str, c: int, itemsize: int) -> tuple:
    """The element strides, in canonical order, of channels ``[c, 2c)`` of a
    packed array of canonical dims ``whole_dims`` in ``layout``, as NumPy slices it."""
    a = np.zeros(from_canonical(whole_dims, layout), dtype=f"V{itemsize}")
    c_axis = 1 if layout in ("NCHW", "NCDHW") else a.ndim - 1
    index = [slice(None)] * a.ndim
    index[c_axis] = slice(c, 2 * c)
    return to_canonical(tuple(s // itemsize for s in a[tuple(index)].strides), layout)


@st.composite
def slices(draw):
    layout = draw(st.sampled_from(["NCHW", "NHWC", "NCDHW", "NDHWC"]))
    nd = 3 if "D" in layout else 2
    per_group = draw(st.sampled_from([1, 1, 2, 4]))  # depthwise mostly
    groups = draw(st.integers(1, 6))
    k = draw(st.integers(2, 5))
    mult = draw(st.sampled_from([1, 2]))
    c = groups * per_group
    n = draw(st.integers(1, 3))
    spatial = tuple(draw(st.integers(1, 6)) for _ in range(nd))
    r = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    pad = tuple(v // 2 for v in r)
    x = from_canonical((n, c) + spatial, layout)
    w = from_canonical((groups * mult, per_group) + r, layout)
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16", "float64"]))
    chunk = ConvProblem(x, w, padding=pad, groups=groups, layout=layout, dtype=dtype)
    return chunk, k


@settings(max_examples=60, deadline=None)
@given(case=slices())
def test_a_slices_strides_are_numpys_of_the_same_channel_slice(case):
    chunk, k = case
    s = SliceProblem.of(chunk, k * chunk.x_dims[1])
    assert s.chunks == k
    assert s.x_dims == chunk.x_dims and s.y_dims == chunk.y_dims
    assert s.x_strides == numpy_slice_strides(s.whole_x_dims, s.layout, chunk.x_dims[1],
                                              s.itemsize)
    assert s.y_strides == numpy_slice_strides(s.whole_y_dims, s.layout, chunk.y_dims[1],
                                              s.itemsize)
    assert s.whole_y_dims[1] == chunk.y_dims[1] * k
    assert chunk.x_strides == packed_strides(chunk.x_dims, chunk.layout)
    # its own problem: never the packed chunk's key, nor another whole's
    assert s.key() != chunk.key() and s != chunk
    assert s.key() != SliceProblem.of(chunk, (k + 1) * chunk.x_dims[1]).key()
    # other batch sizes stay slices of the same whole
    b = s.with_batch(chunk.batch + 2)
    assert isinstance(b, SliceProblem) and b.whole_channels == s.whole_channels
    assert b.x_strides == numpy_slice_strides(b.whole_x_dims, b.layout, chunk.x_dims[1],
                                              b.itemsize)


CHUNK = ConvProblem((8, 14, 14, 336), (336, 5, 5, 1), stride=2, padding=2, groups=336,
                    layout="NHWC", dtype="bfloat16")


@pytest.mark.parametrize("whole, error", [
    (336, "a multiple of the chunk's 336 input channels above it, got 336"),
    (500, "got 500"), (-672, "got -672"),
    (672.0, "expected an int"), (True, "expected an int"), ("672", "expected an int")])
def test_a_bad_whole_channel_count_is_refused_by_name(whole, error):
    with pytest.raises(MucudnnError, match="whole_channels") as info:
        SliceProblem.of(CHUNK, whole)
    assert error in str(info.value)
    assert isinstance(info.value, (ValueError, TypeError))


def test_a_slice_says_what_it_is():
    s = SliceProblem.of(CHUNK, 672)
    assert repr(s).startswith("SliceProblem(x_shape=(8, 14, 14, 336)")
    assert repr(s).endswith("whole_channels=672)")
    assert s.to_dict() == dict(CHUNK.to_dict(), whole_channels=672)
    with pytest.raises(MucudnnError, match="whole_channels"):
        ConvProblem.from_dict(s.to_dict())  # a slice is no plan file's problem


@needs_cudnn
@pytest.mark.parametrize("direction", list(Direction))
def test_the_graphs_tensors_carry_the_slices_strides(direction):
    """The operation graph of a slice (cuDNN's own tensor descriptors, read back)
    holds x and y with the whole tensors' strides and a packed filter; the
    packed chunk's holds packed ones."""
    from mucudnn._cudnn import graph_descriptors as gd
    from mucudnn._cudnn.enums import BackendAttributeName as A

    s = SliceProblem.of(CHUNK, 672)
    for p in (s, CHUNK):
        with gd.ConvGraph(p, direction) as g:
            got = [t.get_int64(A.TENSOR_STRIDES) for t in (g.x, g.w, g.y)]
        assert got == [p.x_strides, packed_strides(p.w_dims, p.layout), p.y_strides]
    assert s.x_strides != CHUNK.x_strides


@settings(max_examples=40, deadline=None)
@given(case=slices())
def test_a_slice_spans_its_whole_tensors_and_its_own_filter(case):
    """What find's scratch must hold for a slice (``extent``): the whole x and y
    its strides reach into, the chunk's own filter; a packed problem's, its size."""
    chunk, k = case
    s = SliceProblem.of(chunk, k * chunk.x_dims[1])
    for which, dims in (("x", s.whole_x_dims), ("y", s.whole_y_dims)):
        assert s.extent(which) == int(np.prod(dims)) == k * chunk.extent(which)
        # the last element the slice's strides reach, for every chunk, lies inside
        last = sum((d - 1) * st for d, st in zip(getattr(s, which + "_dims"),
                                                 getattr(s, which + "_strides")))
        offset = (k - 1) * getattr(chunk, which + "_dims")[1] * (
            1 if s.channels_last else int(np.prod(getattr(s, which + "_dims")[2:])))
        assert last + offset < s.extent(which)
    assert s.extent("w") == chunk.extent("w") == int(np.prod(chunk.w_shape))


def test_a_split_runs_in_place_as_slice_configurations():
    from mucudnn.backends import split
    from mucudnn.problem import AlgoPerf

    whole = ConvProblem((64, 14, 14, 672), (672, 5, 5, 1), stride=2, padding=2, groups=672,
                        layout="NHWC", dtype="bfloat16")
    sp = split.split_of(whole, 2)
    s = split.slice_of(sp)
    assert isinstance(s, SliceProblem) and s.whole_channels == 672
    assert (s.x_shape, s.w_shape) == (sp.chunk.x_shape, sp.chunk.w_shape)
    perfs = split.slice_perfs([AlgoPerf("e19;k2=0", 0.041, 0, 0, 1),
                               AlgoPerf("e0", 0.2, 0, 0, 1)], sp)
    assert [(a.algo, round(a.time_ms, 3), a.workspace_bytes) for a in perfs] == [
        ("slice2|e19;k2=0", 0.082, 0), ("slice2|e0", 0.4, 0)]
    assert split.parse_slice_id(perfs[0].algo) == (2, "e19;k2=0")
    assert split.parse_slice_id("split2|e0") is None and split.parse_split_id(perfs[0].algo) is None


def test_the_numpy_backend_refuses_a_slice_id_naming_the_argument():
    """Slices are the cudnn-graph backend's (Note [chunks as slices]): the NumPy
    backend names ``algo`` and what it takes, before any work."""
    from mucudnn.backends.numpy import NumpyBackend
    from mucudnn.errors import InvalidValueError, MucudnnError

    whole = ConvProblem((4, 6, 6, 8), (8, 3, 3, 1), padding=1, groups=8, layout="NHWC")
    be = NumpyBackend()
    for call in (lambda: be.workspace_size(whole, "backward_filter", "slice2|0"),
                 lambda: be.supports(whole, "forward", "slice2|0")):
        with pytest.raises(InvalidValueError, match=r"algo: expected one of .*slice2\|0") as e:
            call()
        assert isinstance(e.value, (MucudnnError, ValueError))
