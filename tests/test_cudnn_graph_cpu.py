"""The cuDNN backend (graph) API binding on the CPU.

How far the graph API gets without a GPU (checked by these tests):

* creating backend descriptors and setting their attributes needs only libcudnn;
* the first step that needs the driver is ``cudnnBackendFinalize`` of ANY
  descriptor, even a tensor: it loads cuDNN's engine sub-libraries, which link
  the CUDA driver library (libcuda.so.1), so without it cuDNN answers
  CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED; ``cudnnBackendGetAttribute`` needs a
  finalized descriptor, so attribute read-backs need the driver library too;
* with the driver library present (but no usable GPU), tensor, convolution,
  operation, operation-graph and heuristics descriptors finalize; the
  execution plan is the first step that needs a GPU (it needs a cuDNN handle,
  and ``cudnnCreate`` needs a device).

Tests that need a finalized descriptor skip, saying so, where the driver
library is missing. Enum values and the attribute types the builders use are
checked against the text of the wheel's cudnn_graph.h.
"""

from __future__ import annotations

import ctypes
import gc
import re
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from cudnn_headers import header_dir
from mucudnn._cudnn import enums, errors, graph_descriptors as gd, loader
from mucudnn._cudnn.backend_api import (
    BackendDescriptor, live_backend_descriptor_counts, live_backend_descriptors,
)
from mucudnn._cudnn.descriptors import TensorDescriptor
from mucudnn._cudnn.enums import (
    BACKEND_MIN_VERSION, BackendAttributeName as A, BackendAttributeType as T,
    BackendBehaviorNote, BackendDescriptorType as D, BackendHeurMode, BackendKnobType,
    BackendNumericalNote, DataType, Status,
)
from mucudnn.problem import ConvProblem, Direction, packed_strides

from conftest import HAVE_GPU, needs_cudnn

pytestmark = needs_cudnn

#: The oldest cuDNN the graph backend runs on (the device's).
OLDEST = (9, 19, 0)

NEW_ENUMS = (D, A, T, BackendHeurMode, BackendNumericalNote, BackendBehaviorNote,
             BackendKnobType)


# -- headers ---------------------------------------------------------------------------------

_INCLUDE = header_dir()
HEADER = _INCLUDE / "cudnn_graph.h" if _INCLUDE is not None else None
needs_header = pytest.mark.skipif(HEADER is None, reason="cuDNN headers not installed")

_ENUMERATOR = re.compile(
    r"\b(CUDNN_[A-Za-z0-9_]+)\s*(?:CUDNN_DEPRECATED_ENUM\s*)?=\s*(-?[0-9]+)\s*,?"
    r"(?:\s*/\*\*<((?:(?!\*/).)*)\*/)?", re.S)
_SINCE = re.compile(r"@since cuDNN (\d+)\.(\d+)\.(\d+)")


def _header_enumerators() -> dict[str, tuple[int, tuple[int, int, int] | None]]:
    """name -> (value, @since version or None), from cudnn_graph.h's text."""
    out = {}
    for name, value, doc in _ENUMERATOR.findall(HEADER.read_text()):
        m = _SINCE.search(doc or "")
        out.setdefault(name, (int(value), tuple(map(int, m.groups())) if m else None))
    return out


def _documented_types() -> dict[str, set[str]]:
    """``- CUDNN_ATTR_X (CUDNN_TYPE_Y[ or CUDNN_TYPE_Z], n elements)`` lines of the
    descriptor-type documentation: attribute -> allowed attribute types."""
    out: dict[str, set[str]] = {}
    for name, types in re.findall(r"-\s*(CUDNN_ATTR_[A-Z0-9_]+)\s*\(([^)]*)\)", HEADER.read_text()):
        out.setdefault(name, set()).update(re.findall(r"CUDNN_TYPE_[A-Z0-9_]+", types))
    return out


@needs_header
def test_every_backend_enum_member_has_the_header_value():
    header = _header_enumerators()
    checked = 0
    for cls in NEW_ENUMS:
        for member_name, member in cls.__members__.items():
            name = enums.c_name((cls, member_name))
            assert name in header, f"{name} is not in cudnn_graph.h"
            assert header[name][0] == int(member), name
            checked += 1
    assert checked > 150


@needs_header
def test_spot_checks_against_the_header_text():
    text = HEADER.read_text()

    def value(name: str) -> int:
        m = re.search(rf"\b{name}\s*(?:CUDNN_DEPRECATED_ENUM\s*)?=\s*(-?\d+)", text)
        assert m, name
        return int(m.group(1))

    assert value("CUDNN_BACKEND_TENSOR_DESCRIPTOR") == D.TENSOR_DESCRIPTOR == 17
    assert value("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR") == D.EXECUTION_PLAN_DESCRIPTOR == 5
    assert value("CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR") == 11
    assert value("CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR") == 12
    assert value("CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT") == A.TENSOR_BYTE_ALIGNMENT == 900
    assert value("CUDNN_ATTR_ENGINEHEUR_RESULTS") == A.ENGINEHEUR_RESULTS == 202
    assert value("CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE") == 402
    assert value("CUDNN_ATTR_VARIANT_PACK_WORKSPACE") == A.VARIANT_PACK_WORKSPACE == 1003
    assert value("CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW") == 715
    assert value("CUDNN_TYPE_BACKEND_DESCRIPTOR") == T.BACKEND_DESCRIPTOR == 15
    assert value("CUDNN_TYPE_VOID_PTR") == T.VOID_PTR == 6
    assert value("CUDNN_HEUR_MODE_A") == BackendHeurMode.A == 3
    assert value("CUDNN_HEUR_MODE_FALLBACK") == BackendHeurMode.FALLBACK == 2
    assert value("CUDNN_HEUR_MODE_B") == BackendHeurMode.B == 1
    assert value("CUDNN_NUMERICAL_NOTE_TENSOR_CORE") == BackendNumericalNote.TENSOR_CORE == 0
    assert value("CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS") == 1
    assert value("CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC") == 4
    assert value("CUDNN_KNOB_TYPE_TILE_SIZE") == BackendKnobType.TILE_SIZE == 2
    assert value("CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION") == 0
    # the three descriptors' alpha/beta accept float or double (we pick by compute type)
    for d in ("FORWARD", "BWD_DATA", "BWD_FILTER"):
        for s in ("ALPHA", "BETA"):
            assert re.search(rf"CUDNN_ATTR_OPERATION_CONVOLUTION_{d}_{s} \(CUDNN_TYPE_FLOAT or "
                             r"CUDNN_TYPE_DOUBLE", text), (d, s)
    # groups are implied by the tensors, not set on the convolution descriptor
    assert "W tensor dimension and stride arrays are [GK, C, ...]" in text


@needs_header
def test_members_newer_than_the_oldest_library_are_only_read_back():
    header = _header_enumerators()
    newer = []
    for cls in NEW_ENUMS:
        for member_name in cls.__members__:
            since = header[enums.c_name((cls, member_name))][1]
            if since is not None and since > OLDEST:
                newer.append((cls, member_name))
            declared = BACKEND_MIN_VERSION.get((cls, member_name))
            if declared is not None and since is not None:
                assert declared == since[0] * 10000 + since[1] * 100 + since[2], member_name
    # only knob types, which cuDNN reports and mucudnn never sets by name
    assert newer and all(cls is BackendKnobType for cls, _ in newer), newer
    assert all((cls, n) in BACKEND_MIN_VERSION for cls, n in newer)


# -- building descriptors without the driver ------------------------------------------------------

P2 = ConvProblem((2, 12, 12, 32), (16, 5, 5, 8), padding=2, stride=(1, 2), dilation=(2, 1),
                 groups=4, layout="NHWC")
P3 = ConvProblem((2, 8, 6, 7, 8), (8, 8, 3, 3, 3), padding=1, stride=(1, 2, 1), layout="NCDHW",
                 dtype="float64")


def _unfinalized_chain(p: ConvProblem, direction: str):
    """Every descriptor of one convolution up to the operation, none finalized."""
    ts = [gd.tensor(uid, d, packed_strides(d, p.layout), p.dtype, 8, finalize=False)
          for uid, d in zip((gd.UID_X, gd.UID_W, gd.UID_Y), (p.x_dims, p.w_dims, p.y_dims))]
    conv = gd.convolution(p.padding, p.stride, p.dilation, p.compute_type, finalize=False)
    op = gd.convolution_operation(direction, *ts, conv, 0.5, 0.25,
                                  double_scalars=p.compute_type == "float64", finalize=False)
    return ts, conv, op


@needs_header
@pytest.mark.parametrize("p", [P2, P3], ids=["2d-nhwc-grouped", "3d-float64"])
@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_builders_set_what_the_header_documents(p, direction):
    documented = _documented_types()
    ts, conv, op = _unfinalized_chain(p, direction.value)
    x, w, y = ts
    try:
        assert x.attributes[A.TENSOR_DIMENSIONS] == (T.INT64, p.x_dims)
        assert w.attributes[A.TENSOR_DIMENSIONS] == (T.INT64, p.w_dims)  # [G*K, C, ...]
        assert y.attributes[A.TENSOR_STRIDES] == (T.INT64, packed_strides(p.y_dims, p.layout))
        assert x.attributes[A.TENSOR_BYTE_ALIGNMENT] == (T.INT64, (8,))
        assert x.attributes[A.TENSOR_DATA_TYPE] == (T.DATA_TYPE, (int(enums.data_type(p.dtype)),))
        assert conv.attributes[A.CONVOLUTION_SPATIAL_DIMS] == (T.INT64, (p.nd,))
        assert conv.attributes[A.CONVOLUTION_PRE_PADDINGS] == (T.INT64, p.padding)
        assert conv.attributes[A.CONVOLUTION_POST_PADDINGS] == (T.INT64, p.padding)
        assert conv.attributes[A.CONVOLUTION_FILTER_STRIDES] == (T.INT64, p.stride)
        assert conv.attributes[A.CONVOLUTION_DILATIONS] == (T.INT64, p.dilation)
        assert conv.attributes[A.CONVOLUTION_CONV_MODE] == (T.CONVOLUTION_MODE, (1,))
        scalar = T.DOUBLE if p.compute_type == "float64" else T.FLOAT
        scalars = [v for k, v in op.attributes.items() if k.name.endswith(("_ALPHA", "_BETA"))]
        assert sorted(v[1][0] for v in scalars) == [0.25, 0.5]
        assert all(v[0] is scalar for v in scalars)
        checked = 0
        for d in (*ts, conv, op):
            for name, (atype, _) in d.attributes.items():
                allowed = documented.get(enums.c_name(name))
                if allowed:  # (the header documents CONV_MODE as "CUDNN_ATTR_CONVOLUTION_MODE")
                    assert enums.c_name(atype) in allowed, (name, atype, allowed)
                    checked += 1
        assert checked >= 14
    finally:
        for d in (op, conv, *ts):
            d.close()


def test_other_builders_without_finalize():
    k = gd.knob_choice(BackendKnobType.TILE_SIZE, 3, finalize=False)
    v = gd.variant_pack((1, 2, 3), (0x1000, 0x2000, 0x3000), None, finalize=False)
    try:
        assert k.attributes[A.KNOB_CHOICE_KNOB_TYPE] == (T.KNOB_TYPE, (2,))
        assert k.attributes[A.KNOB_CHOICE_KNOB_VALUE] == (T.INT64, (3,))
        assert v.attributes[A.VARIANT_PACK_UNIQUE_IDS] == (T.INT64, (1, 2, 3))
        assert v.attributes[A.VARIANT_PACK_DATA_POINTERS] == (T.VOID_PTR, (0x1000, 0x2000, 0x3000))
        assert v.attributes[A.VARIANT_PACK_WORKSPACE] == (T.VOID_PTR, (None,))
    finally:
        k.close()
        v.close()
    with pytest.raises(ValueError, match="pointers"):
        gd.variant_pack((1, 2, 3), (1, 2))


def test_unfinalized_operation_is_refused_by_the_graph_with_cudnns_message():
    ts, conv, op = _unfinalized_chain(P2, "forward")
    try:
        with pytest.raises(errors.BadParamError) as info:
            gd.operation_graph([op], finalize=False)
        e = info.value
        assert e.status == Status.BAD_PARAM_NOT_FINALIZED
        assert e.function == "cudnnBackendSetAttribute"
        assert e.message  # cuDNN's cudnnGetLastErrorString text
        assert e.details["attribute"] == "OPERATIONGRAPH_OPS"
    finally:
        for d in (op, conv, *ts):
            d.close()


def test_bad_attribute_raises_bad_param_with_cudnns_message():
    with BackendDescriptor(D.TENSOR_DESCRIPTOR) as t:
        # dimensions are CUDNN_TYPE_INT64; say DATA_TYPE instead
        with pytest.raises(errors.BadParamError) as info:
            t.set(A.TENSOR_DIMENSIONS, T.DATA_TYPE, [2, 3])
        e = info.value
        assert e.status == Status.BAD_PARAM_ATTRIBUTE_TYPE
        assert e.message and "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE" in str(e)
        assert e.details["attribute"] == "TENSOR_DIMENSIONS"
        assert e.details["descriptor"] == "TENSOR_DESCRIPTOR"
        # an attribute of another descriptor type
        with pytest.raises(errors.BadParamError) as info:
            t.set_int64(A.CONVOLUTION_SPATIAL_DIMS, 2)
        assert info.value.message
        assert A.CONVOLUTION_SPATIAL_DIMS not in t.attributes  # failed sets are not recorded
        # an unknown attribute name
        with pytest.raises(errors.BadParamError):
            t.set_int64(99999, 1)


def test_unknown_descriptor_type_and_unsupported_attribute_type():
    with pytest.raises(errors.CudnnError):
        BackendDescriptor(9999)
    with BackendDescriptor(D.TENSOR_DESCRIPTOR) as t:
        with pytest.raises(ValueError, match="not supported"):
            t.set(A.TENSOR_DIMENSIONS, T.FRACTION, [1])


def test_wrong_handle_kinds_are_refused_in_python():
    from mucudnn._cudnn.prototypes import lib

    with TensorDescriptor((1, 2, 3, 4)) as legacy:
        with pytest.raises(ctypes.ArgumentError):
            lib.cudnnBackendFinalize(legacy)
    with BackendDescriptor(D.TENSOR_DESCRIPTOR) as t:
        with pytest.raises(ctypes.ArgumentError):
            lib.cudnnDestroyTensorDescriptor(t)
        with pytest.raises(TypeError):
            BackendDescriptor(D.OPERATIONGRAPH_DESCRIPTOR).set_descriptors(
                A.OPERATIONGRAPH_OPS, [legacy])


def test_closed_descriptor_is_refused():
    t = BackendDescriptor(D.TENSOR_DESCRIPTOR)
    t.close()
    t.close()  # idempotent
    assert t.closed and t.handle == 0
    with pytest.raises(ValueError, match="closed"):
        t.set_int64(A.TENSOR_UNIQUE_ID, 1)
    with pytest.raises(ValueError, match="closed"):
        t.finalize()


def test_live_counter_and_no_leak():
    gc.collect()
    before = live_backend_descriptors()
    before_counts = live_backend_descriptor_counts()
    for _ in range(200):
        with gd.tensor(1, (2, 3), (3, 1), "float32", finalize=False):
            pass
        with gd.convolution((1,), (1,), (1,), finalize=False):
            pass
    assert live_backend_descriptors() == before
    t = BackendDescriptor(D.TENSOR_DESCRIPTOR)
    assert live_backend_descriptors() == before + 1
    assert live_backend_descriptor_counts()["TENSOR_DESCRIPTOR"] == \
        before_counts.get("TENSOR_DESCRIPTOR", 0) + 1
    del t
    gc.collect()
    assert live_backend_descriptors() == before


def test_set_descriptors_keeps_its_inputs_alive():
    ts, conv, op = _unfinalized_chain(P2, "forward")
    before = live_backend_descriptors()
    del ts, conv
    gc.collect()
    assert live_backend_descriptors() == before  # op still holds x, w, y, conv
    op.close()
    gc.collect()
    assert live_backend_descriptors() == before - 5


# -- finalize and read back: the first step needing the driver ----------------------------------

def _finalize_or_skip(d: BackendDescriptor) -> None:
    try:
        d.finalize()
    except errors.NotInitializedError as exc:
        assert exc.status == Status.SUBLIBRARY_LOADING_FAILED, exc
        pytest.skip("cudnnBackendFinalize needs the CUDA driver library (libcuda.so.1): "
                    f"{exc}")


def test_finalize_without_the_driver_library_says_so():
    t = gd.tensor(1, (2, 3, 4, 5), (60, 20, 5, 1), "float32", finalize=False)
    try:
        t.finalize()
    except errors.NotInitializedError as exc:
        assert exc.status == Status.SUBLIBRARY_LOADING_FAILED
        assert exc.function == "cudnnBackendFinalize"
        assert exc.details["descriptor"] == "TENSOR_DESCRIPTOR"
        assert not t.finalized
    else:
        assert t.finalized  # the driver library is there: finalize works without a GPU
    finally:
        t.close()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_tensor_attributes_round_trip(layout):
    dims = (3, 5, 7, 9)
    strides = packed_strides(dims, layout)
    with gd.tensor(42, dims, strides, "bfloat16", 4, finalize=False) as t:
        _finalize_or_skip(t)
        assert t.get_int64(A.TENSOR_DIMENSIONS) == dims
        assert t.get_int64(A.TENSOR_STRIDES) == strides
        assert t.get_int64_scalar(A.TENSOR_UNIQUE_ID) == 42
        # (cuDNN 9.28 answers NOT_SUPPORTED to reading TENSOR_BYTE_ALIGNMENT back)
        assert t.get_data_type(A.TENSOR_DATA_TYPE) == DataType.BFLOAT16
        assert t.count(A.TENSOR_DIMENSIONS, T.INT64) == 4


def test_convolution_attributes_round_trip():
    with gd.convolution((1, 2, 0), (1, 2, 3), (2, 1, 1), "float64", finalize=False) as c:
        _finalize_or_skip(c)
        assert c.get_int64(A.CONVOLUTION_PRE_PADDINGS) == (1, 2, 0)
        assert c.get_int64(A.CONVOLUTION_POST_PADDINGS) == (1, 2, 0)
        assert c.get_int64(A.CONVOLUTION_FILTER_STRIDES) == (1, 2, 3)
        assert c.get_int64(A.CONVOLUTION_DILATIONS) == (2, 1, 1)
        assert c.get_int64_scalar(A.CONVOLUTION_SPATIAL_DIMS) == 3
        assert c.get_data_type(A.CONVOLUTION_COMP_TYPE) == DataType.DOUBLE
        # (reading CONV_MODE back as CUDNN_TYPE_CONVOLUTION_MODE, the type it is set with,
        # is refused by cuDNN 9.28 with "CUDNN_TYPE_DATA_TYPE != attrType")


@pytest.mark.parametrize("direction", list(Direction), ids=str)
def test_graph_and_heuristics_without_a_gpu(direction):
    """Up to the heuristics when the driver library is there; the execution plan
    (a cuDNN handle) is the first step needing a GPU."""
    with gd.tensor(1, (2, 3), (3, 1), "float32", finalize=False) as probe:
        _finalize_or_skip(probe)
    with gd.ConvGraph(P2, direction, 0.5, 0.25, (16, 4, 8)) as g:
        assert g.x.attributes[A.TENSOR_BYTE_ALIGNMENT] == (T.INT64, (16,))
        assert g.w.attributes[A.TENSOR_BYTE_ALIGNMENT] == (T.INT64, (4,))
        assert g.w.get_int64(A.TENSOR_DIMENSIONS) == P2.w_dims
        assert g.y.get_int64(A.TENSOR_DIMENSIONS) == P2.y_dims
        assert g.global_engine_count() > 0
        for mode in ("A", "FALLBACK"):
            cfgs = g.engine_configs(mode)  # without a device, heuristics may return none
            for c in cfgs:
                info = gd.engine_config_info(c)
                assert gd.parse_engine_config_id(info.id) == (info.global_index, info.knobs)
                c.close()


# -- engine-config ids -------------------------------------------------------------------------

knob_lists = st.dictionaries(st.integers(0, 60), st.integers(-2**40, 2**40), max_size=8)


@given(st.integers(0, 10**6), knob_lists)
def test_engine_config_id_round_trip(index, knobs):
    s = gd.format_engine_config_id(index, knobs.items())
    assert gd.parse_engine_config_id(s) == (index, tuple(sorted(knobs.items())))
    assert gd.format_engine_config_id(*gd.parse_engine_config_id(s)) == s
    assert re.fullmatch(r"e\d+(;k\d+=-?\d+)*", s)
    types = [int(t) for t in re.findall(r";k(\d+)=", s)]
    assert types == sorted(types)


@given(st.integers(0, 1000), knob_lists)
def test_engine_config_id_is_order_independent(index, knobs):
    items = list(knobs.items())
    assert gd.format_engine_config_id(index, items) == \
        gd.format_engine_config_id(index, list(reversed(items)))


@pytest.mark.parametrize("bad", [3, None, "", "12", "e", "e-1", "e1;k2", "e1;k2=1;k2=3",
                                 "e1,k2=1", "x1", "e1;kx=1", "e1;k2=1;"])
def test_engine_config_id_refuses_garbage(bad):
    with pytest.raises(ValueError):
        gd.parse_engine_config_id(bad)


def test_engine_config_id_examples():
    assert gd.format_engine_config_id(12, [(14, 1), (2, 3)]) == "e12;k2=3;k14=1"
    assert gd.parse_engine_config_id(" e12;k2=3;k14=1 ") == (12, ((2, 3), (14, 1)))
    assert gd.format_engine_config_id(0) == "e0"
    with pytest.raises(ValueError):
        gd.format_engine_config_id(-1)
    with pytest.raises(ValueError):
        gd.format_engine_config_id(1, [(2, 1), (2, 2)])


# -- small pure helpers of the backend -----------------------------------------------------------

def test_pointer_alignment():
    assert gd.pointer_alignment(0x7F0000000000) == 16
    assert gd.pointer_alignment(0x7F0000000008) == 8
    assert gd.pointer_alignment(0x7F0000000104, 4) == 4
    assert gd.pointer_alignment(0x7F0000000102, 2) == 2
    assert gd.pointer_alignment(0) == 16
    with pytest.raises(ValueError):
        gd.pointer_alignment(0x7F0000000102, 4)


def test_numerics_filter():
    from mucudnn.backends.graph_candidates import numerics_allowed

    N = BackendNumericalNote
    assert numerics_allowed("fma", [N.FFT, N.NONDETERMINISTIC])
    assert not numerics_allowed("fma", [N.TENSOR_CORE])
    assert numerics_allowed("default", [N.TENSOR_CORE])
    assert not numerics_allowed("default", [N.TENSOR_CORE, N.DOWN_CONVERT_INPUTS])
    assert not numerics_allowed("tensor_op", [N.REDUCED_PRECISION_REDUCTION])
    assert numerics_allowed("tensor_op_allow_conversion", [N.DOWN_CONVERT_INPUTS,
                                                           N.REDUCED_PRECISION_REDUCTION])


def test_engine_config_info_notes():
    info = gd.EngineConfigInfo(7, ((2, 1),), (int(BackendNumericalNote.NONDETERMINISTIC),),
                               (int(BackendBehaviorNote.RUNTIME_COMPILATION),))
    assert info.id == "e7;k2=1"
    assert not info.deterministic
    assert info.has_note(BackendBehaviorNote.RUNTIME_COMPILATION)
    assert not info.has_note(BackendNumericalNote.TENSOR_CORE)


@pytest.mark.skipif(HAVE_GPU, reason="checks the no-GPU path")
def test_graph_backend_without_gpu_raises_no_device():
    from mucudnn.backends import get_backend
    from mucudnn.backends.cudnn_graph import CudnnGraphBackend
    from mucudnn.cuda import NoDeviceError

    with pytest.raises(NoDeviceError):
        CudnnGraphBackend()
    with pytest.raises(NoDeviceError):
        get_backend("cudnn-graph", find_repeat=3)
    with pytest.raises(ValueError, match="find_repeat"):
        CudnnGraphBackend(find_repeat=2)
    with pytest.raises(ValueError, match="heuristic_modes"):
        CudnnGraphBackend(heuristic_modes=("Z",))
    # every option is checked before any device work (no GPU here)
    with pytest.raises(ValueError, match="find_top_k"):
        CudnnGraphBackend(find_top_k=0)
    with pytest.raises(ValueError, match="find_probe_ratio"):
        CudnnGraphBackend(find_probe_ratio=1.0)
    with pytest.raises(ValueError, match="find_cold_ratio"):
        CudnnGraphBackend(find_cold_ratio=0.5)
    with pytest.raises(ValueError, match="find_rtc: expected one of"):
        CudnnGraphBackend(find_rtc="some")
    with pytest.raises(ValueError, match="find_skip_ratio: expected None or a number > 1"):
        CudnnGraphBackend(find_skip_ratio=1.0)
    for bad in (0, -5.0):
        with pytest.raises(ValueError, match="find_long_ms: expected None or a number of ms > 0"):
            CudnnGraphBackend(find_long_ms=bad)
    with pytest.raises(ValueError, match="find_zero: expected one of"):
        CudnnGraphBackend(find_zero="never")
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="find_retime: expected an int >= 0"):
            CudnnGraphBackend(find_retime=bad)


@needs_header
def test_type_counts_match_the_header_for_the_loaded_library():
    """engine_config_info asks for up to CUDNN_*_TYPE_COUNT(S) elements, as cudnn-frontend does."""
    if loader.version_tuple()[:2] != _header_version()[:2]:
        pytest.skip("the loaded library is not the one these headers came with")
    header = _header_enumerators()
    assert gd._type_count(BackendKnobType) == header["CUDNN_KNOB_TYPE_COUNTS"][0]
    assert gd._type_count(BackendNumericalNote) == header["CUDNN_NUMERICAL_NOTE_TYPE_COUNT"][0]
    assert gd._type_count(BackendBehaviorNote) == header["CUDNN_BEHAVIOR_NOTE_TYPE_COUNT"][0]


def _header_version() -> tuple[int, int, int]:
    text = (HEADER.parent / "cudnn_version.h").read_text()
    get = lambda k: int(re.search(rf"#define CUDNN_{k}\s+(\d+)", text).group(1))  # noqa: E731
    return get("MAJOR"), get("MINOR"), get("PATCHLEVEL")


def _info(idx, ws):
    return gd.EngineConfigInfo(idx, (), (), (), ws)


def test_find_cut_keeps_each_modes_best_and_one_without_workspace():
    """Note [find cut-offs] (no GPU needed: the cut is a pure function of the
    candidates and the heuristics' rankings)."""
    from mucudnn.backends.graph_candidates import top_k_cut
    cands = [_info(i, ws) for i, ws in enumerate([8, 4, 4, 2, 1, 9, 0, 3, 0])]
    ids = [c.id for c in cands]
    rankings = {"A": ids[:5], "B": [ids[5], ids[0]], "FALLBACK": [ids[7], ids[8], ids[6]]}
    kept = top_k_cut(cands, 2, rankings)
    # A's best two, B's best two, FALLBACK's best two, in heuristics order
    assert [c.id for c in kept] == [ids[0], ids[1], ids[5], ids[7], ids[8]]
    # without a zero-workspace config among them, the best-ranked one is added
    rankings = {"A": ids[:5]}
    assert [c.global_index for c in top_k_cut(cands, 2, rankings)] == [0, 1, 6]
    # configs that do not fit the cap were never candidates: rankings may name them
    assert [c.global_index for c in top_k_cut(cands[1:], 1, {"A": ids})] == [1, 6]
    # k=None or few candidates: all of them
    assert top_k_cut(cands, None, rankings) == cands
    assert top_k_cut(cands[:3], 5, rankings) == cands[:3]


@given(lo=st.integers(-4, 40), span=st.integers(-2, 300), stride=st.integers(1, 9),
       limit=st.one_of(st.none(), st.integers(1, 12)))
def test_knob_values_stay_on_the_range_and_its_stride(lo, span, stride, limit):
    """KnobInfo.values: every value is minimum + a multiple of stride, within
    [minimum, maximum], ascending; at most ``limit`` of them, both ends kept
    when the range is sampled; every value when it fits."""
    info = gd.KnobInfo(3, lo, lo + span, stride)
    vals = info.values(limit)
    everything = list(range(lo, lo + span + 1, stride)) if span >= 0 else []
    assert list(vals) == sorted(set(vals))
    assert set(vals) <= set(everything)
    if limit is None or len(everything) <= limit:
        assert list(vals) == everything
    else:
        assert len(vals) <= limit and vals[0] == lo
        assert limit == 1 or vals[-1] == everything[-1]


@given(base=st.dictionaries(st.integers(0, 30), st.integers(-3, 50), max_size=4),
       ranges=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5), st.integers(0, 6)),
                       max_size=4, unique_by=lambda t: t[0]),
       values=st.integers(1, 5))
def test_knob_variants_move_one_knob_at_a_time(base, ranges, values):
    """See Note [knob search]: the base first, then settings that differ from it in
    exactly one knob, whose value comes from that knob's range; no repeats."""
    from mucudnn.backends.graph_candidates import knob_variants

    knobs = [gd.KnobInfo(t, lo, lo + span) for t, lo, span in ranges]
    out = knob_variants(sorted(base.items()), knobs, values)
    assert out[0] == tuple(sorted(base.items()))
    assert len(out) == len(set(out))
    legal = {k.knob_type: set(k.values(values)) for k in knobs}
    for setting in out[1:]:
        d = dict(setting)
        changed = [t for t in set(d) | set(base) if d.get(t) != base.get(t)]
        assert len(changed) == 1 and d[changed[0]] in legal[changed[0]]
    expected = 1 + sum(len([v for v in k.values(values) if v != base.get(k.knob_type)])
                       for k in knobs)
    assert len(out) == expected


def test_search_options_are_checked_before_any_device_work():
    from mucudnn.backends.cudnn_graph import CudnnGraphBackend

    for kw, word in (({"search": "all"}, "search"), ({"search_knob_values": 0}, "search_knob"),
                     ({"search_max_configs": True}, "search_max")):
        with pytest.raises(ValueError, match=word):
            CudnnGraphBackend(**kw)


def test_knob_search_backend_is_registered_under_its_own_name():
    """get_backend("cudnn-graph+knobs") is the graph backend with search="knobs":
    its own name, so cache entries and plan memos never mix with heuristics'."""
    import mucudnn
    from mucudnn.backends.cudnn_graph import CudnnGraphKnobsBackend

    assert "cudnn-graph+knobs" in mucudnn.available_backends()
    assert CudnnGraphKnobsBackend.name == "cudnn-graph+knobs"
    with pytest.raises(ValueError, match="search_max_configs"):
        CudnnGraphKnobsBackend(search_max_configs=0)


def test_raw_descriptors_of_a_read_are_views_destroyed_after_it():
    """See Note [descriptor reads]: the descriptors a read fills are raw (created
    without a GPU), handed out as views that own nothing, not counted by
    live_backend_descriptors(), and destroyed when the read ends; a failing
    read leaves none behind."""
    from mucudnn._cudnn import backend_api as ba

    t = int(D.KNOB_CHOICE_DESCRIPTOR)
    live = live_backend_descriptors()
    with ba._RawDescriptors(t, 20) as raw:
        views = raw.views(20)
        assert raw.made == 20 and len({v.handle for v in views}) == 20
        assert all(v.handle and not v.closed for v in views)
        assert views[0].type == D.KNOB_CHOICE_DESCRIPTOR and views[0].finalized
        views[0].close()  # a view owns nothing: closing it does nothing
        assert views[0]._as_parameter_.value == views[0].handle
        assert [v.handle for v in raw.views(3)] == [v.handle for v in views[:3]]
        assert live_backend_descriptors() == live
    assert raw.made == 0
    # a read from a descriptor cuDNN will not answer (not finalized) raises
    # cuDNN's error and destroys what it created
    with gd.tensor(1, (2, 3), (3, 1), "float32", finalize=False) as probe:
        with pytest.raises(errors.CudnnError):
            probe.read_descriptors(A.TENSOR_DIMENSIONS, t, 4, lambda d: d.handle)
    assert live_backend_descriptors() == live


def test_a_launcher_finalizer_never_waits_for_the_backend_lock():
    """See Note [releases from finalizers]: while another thread holds the backend's
    lock (find() waiting for its finalizing threads), a launcher finalizer run
    by the garbage collector on any thread queues its plan and returns; the
    next holder of the lock releases it. With the lock free it releases at once."""
    import threading

    from mucudnn.backends.cudnn_graph import CudnnGraphBackend

    class Plan:
        released = 0

        def release(self):
            self.released += 1

    be = object.__new__(CudnnGraphBackend)  # no GPU: only the release machinery
    be._lock = threading.RLock()
    be._releases = __import__("collections").deque()
    held, done = threading.Event(), threading.Event()

    def holder():
        with be._lock:
            held.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    a = Plan()
    finished = threading.Event()
    worker = threading.Thread(target=lambda: (be._release_plan(a), finished.set()))
    worker.start()
    assert finished.wait(5), "the finalizer waited for the lock"
    assert a.released == 0 and list(be._releases) == [a]
    done.set()
    t.join()
    worker.join()
    with be._lock:
        be._drain_releases()
    assert a.released == 1 and not be._releases
    b = Plan()
    be._release_plan(b)  # lock free: released now
    assert b.released == 1 and not be._releases


def test_first_timed_keeps_the_first_launchs_host_seconds():
    """See Note [cold probe]: the host seconds of a plan's first launch (where CUDA
    loads its kernels) are kept, so the warm-up run is judged without them;
    later calls run without timing and the profile sums every first launch."""
    from mucudnn.backends.graph_candidates import FirstTimed, cold_out
    prof = SimpleNamespace(first_launch_s=0.5)
    calls = []

    def run() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            time.sleep(0.02)

    f = FirstTimed(run, prof)
    f()
    f()
    assert calls == [0, 1]
    assert 0.015 < f.host_s < 1.0
    assert prof.first_launch_s == pytest.approx(0.5 + f.host_s)
    # a 1.32 ms warm-up against 0.135 ms: cut, unless 1.2 ms of it was loading
    assert cold_out(1.32, 0.0, 0.135, 4.0)
    assert not cold_out(1.32, 1.2, 0.135, 4.0)
    assert cold_out(3.0, 1.2, 0.135, 4.0)
