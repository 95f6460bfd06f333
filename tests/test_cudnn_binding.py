"""The ctypes binding to libcudnn (mucudnn._cudnn), on the CPU.

libcudnn loads and every descriptor call works without a GPU; only
cudnnCreate (a handle) needs one. Enum values, struct layouts and prototype
signatures are checked against the text of the cuDNN headers shipped with the
wheel, read at test time.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.metadata
import os
import pickle
import re
from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint, c_uint32, c_void_p
from pathlib import Path

import pytest
from hypothesis import assume, given, strategies as st

import mucudnn._cudnn as cd
from cudnn_headers import header_dir
from mucudnn._cudnn import enums, errors, loader, prototypes, structs
from mucudnn._cudnn.descriptors import (
    ConvolutionDescriptor, FilterDescriptor, TensorDescriptor, live_descriptor_counts,
    live_descriptors, output_dims,
)
from mucudnn._cudnn.enums import (
    ConvolutionMode, DataType, MathType, Status, TensorFormat,
)
from mucudnn.problem import ConvProblem, from_canonical, packed_strides

from conftest import HAVE_GPU, needs_cudnn

pytestmark = needs_cudnn


# -- headers ----------------------------------------------------------------------------

HEADERS = header_dir()
needs_headers = pytest.mark.skipif(HEADERS is None, reason="cuDNN headers not installed")
HEADER_NAMES = ("cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _header_text() -> str:
    return "\n".join(_strip_comments((HEADERS / h).read_text()) for h in HEADER_NAMES)


def _header_enumerators() -> dict[str, int]:
    """Every `CUDNN_X = value` of the headers, aliases resolved."""
    raw = dict(re.findall(
        r"\b(CUDNN_[A-Za-z0-9_]+)\s*(?:CUDNN_DEPRECATED_ENUM\s*)?=\s*([0-9]+U?|CUDNN_[A-Za-z0-9_]+)",
        _header_text()))
    out: dict[str, int] = {}
    for name, value in raw.items():
        seen = 0
        while not value.rstrip("U").isdigit() and seen < 10:
            value = raw[value]
            seen += 1
        out[name] = int(value.rstrip("U"))
    return out


# -- loading and version ------------------------------------------------------------------

def test_loads_cudnn_9():
    v = cd.get_version()
    assert v >= 90000
    assert cd.version_tuple() == (v // 10000, v // 100 % 100, v % 100)
    assert cd.version_string() == "%d.%d.%d" % cd.version_tuple()
    assert cd.get_property("MAJOR_VERSION") == v // 10000
    assert cd.get_property(enums.LibraryPropertyType.MINOR_VERSION) == v // 100 % 100
    assert cd.get_property("patch_level") == v % 100
    assert cd.get_cudart_version() >= 12000
    assert os.path.exists(cd.library_path())
    assert cd.library_source()
    assert prototypes.lib.cudnnGetVersion() == v


@needs_headers
def test_version_matches_the_wheel_headers():
    text = (HEADERS / "cudnn_version.h").read_text()
    major, minor, patch = (int(re.search(rf"#define CUDNN_{k}\s+(\d+)", text).group(1))
                           for k in ("MAJOR", "MINOR", "PATCHLEVEL"))
    if Path(loader.library_path()).resolve().parent.parent != HEADERS.parent:
        pytest.skip("the loaded library is not the one these headers came with")
    assert cd.version_tuple() == (major, minor, patch)


def _hide_everything(monkeypatch, system_names=("libcudnn_mucudnn_missing_test.so.9",)):
    def no_dist(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(loader, "_distribution", no_dist)
    monkeypatch.setattr(loader, "_find_spec", lambda name: None)
    monkeypatch.setattr(loader, "_import_pathfinder", lambda: None)
    monkeypatch.setattr(loader, "SYSTEM_NAMES", tuple(system_names))


def test_loader_error_lists_every_place_tried(monkeypatch):
    monkeypatch.delenv(loader.ENV_VAR, raising=False)
    _hide_everything(monkeypatch)
    with pytest.raises(errors.CudnnLibraryNotFoundError) as info:
        loader.find_library()
    text = str(info.value)
    for expected in ("MUCUDNN_CUDNN_LIBRARY is not set", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12",
                     "nvidia.cudnn", "cuda.pathfinder", "system loader",
                     "libcudnn_mucudnn_missing_test.so.9"):
        assert expected in text, expected
    sources = [a.source for a in info.value.attempts]
    assert sources == [loader.ENV_VAR, "wheel nvidia-cudnn-cu13", "wheel nvidia-cudnn-cu12",
                       "package nvidia.cudnn", "cuda.pathfinder", "system loader"]
    assert all(a.outcome == "not found" for a in info.value.attempts)
    # the error survives pickling with its attempts
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == text and again.attempts == info.value.attempts


def test_loader_tells_failed_to_load_from_not_found(monkeypatch, tmp_path):
    # cuDNN's own library with its ELF machine type changed to AArch64: it passes
    # the checks made before loading, then dlopen refuses it (with glibc's
    # "No such file or directory" text, although the file is there).
    data = bytearray(Path(loader.library_path()).read_bytes())
    data[18:20] = (183).to_bytes(2, "little" if data[5] == 1 else "big")
    foreign = tmp_path / "libcudnn.so.9"
    foreign.write_bytes(bytes(data))
    # a sub-library beside it, as in every cuDNN 9 installation, so that the
    # checks made before loading pass (Note [cuDNN's sub-libraries])
    (tmp_path / loader.REQUIRED_SUB_LIBRARY).write_bytes(b"")
    monkeypatch.setenv(loader.ENV_VAR, str(foreign))
    _hide_everything(monkeypatch)
    with pytest.raises(errors.CudnnLibraryNotFoundError) as info:
        loader.find_library()
    (only,) = info.value.attempts  # nothing after the variable was tried
    assert only.source == loader.ENV_VAR and only.target == str(foreign)
    assert only.outcome == "failed to load"
    assert only.reason  # the OSError text
    assert f"{loader.ENV_VAR} ({foreign}): failed to load: " in str(info.value)


def test_env_var_comes_first(monkeypatch):
    path = loader.library_path()
    monkeypatch.setenv(loader.ENV_VAR, path)
    found = loader.find_library()
    assert found.source == loader.ENV_VAR and found.version == cd.get_version()


def test_wheel_then_package_then_pathfinder(monkeypatch):
    monkeypatch.delenv(loader.ENV_VAR, raising=False)
    try:
        importlib.metadata.distribution("nvidia-cudnn-cu13")
        have_cu13 = True
    except importlib.metadata.PackageNotFoundError:
        have_cu13 = False
    if have_cu13:
        assert loader.find_library().source == "wheel nvidia-cudnn-cu13"

    def no_dist(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(loader, "_distribution", no_dist)
    spec = loader._find_spec("nvidia.cudnn")
    if spec is not None:
        assert loader.find_library().source == "package nvidia.cudnn"
    monkeypatch.setattr(loader, "_find_spec", lambda name: None)
    pytest.importorskip("cuda.pathfinder")
    found = loader.find_library()
    assert found.source == "cuda.pathfinder"
    assert found.version == cd.get_version()


def test_cudnn_older_than_9_is_refused(monkeypatch):
    monkeypatch.setenv(loader.ENV_VAR, loader.library_path())
    _hide_everything(monkeypatch)
    monkeypatch.setattr(loader, "_read_version", lambda cdll: 8907)
    with pytest.raises(errors.CudnnVersionError) as info:
        loader.find_library()
    text = str(info.value)
    assert "8.9.7" in text and "cuDNN 9" in text and "refused" in text


# -- prototypes -------------------------------------------------------------------------------

def test_every_prototype_binds():
    names = prototypes.lib.bind_all()
    assert len(names) == len(set(names)) >= 60
    required = [
        "cudnnGetVersion", "cudnnGetCudartVersion", "cudnnGetErrorString",
        "cudnnGetLastErrorString", "cudnnGetProperty", "cudnnCreate", "cudnnDestroy",
        "cudnnSetStream", "cudnnGetStream", "cudnnAddTensor", "cudnnConvolutionBackwardBias",
        "cudnnSetTensor4dDescriptor", "cudnnSetTensor4dDescriptorEx", "cudnnGetTensor4dDescriptor",
        "cudnnSetTensorNdDescriptor", "cudnnSetTensorNdDescriptorEx", "cudnnGetTensorNdDescriptor",
        "cudnnSetFilter4dDescriptor", "cudnnGetFilter4dDescriptor", "cudnnSetFilterNdDescriptor",
        "cudnnGetFilterNdDescriptor", "cudnnSetConvolution2dDescriptor",
        "cudnnGetConvolution2dDescriptor", "cudnnSetConvolutionNdDescriptor",
        "cudnnGetConvolutionNdDescriptor", "cudnnSetConvolutionGroupCount",
        "cudnnGetConvolutionGroupCount", "cudnnSetConvolutionMathType",
        "cudnnGetConvolutionMathType", "cudnnGetConvolution2dForwardOutputDim",
        "cudnnGetConvolutionNdForwardOutputDim",
    ]
    for d in ("Forward", "BackwardData", "BackwardFilter"):
        required += [f"cudnnGetConvolution{d}AlgorithmMaxCount",
                     f"cudnnGetConvolution{d}Algorithm_v7",
                     f"cudnnFindConvolution{d}AlgorithmEx",
                     f"cudnnGetConvolution{d}WorkspaceSize", f"cudnnConvolution{d}"]
    for kind in ("Tensor", "Filter", "Convolution"):
        required += [f"cudnnCreate{kind}Descriptor", f"cudnnDestroy{kind}Descriptor"]
    missing = sorted(set(required) - set(names))
    assert not missing


_OPAQUE = {
    "cudnnHandle_t": structs.cudnnHandle_t,
    "cudnnTensorDescriptor_t": structs.cudnnTensorDescriptor_t,
    "cudnnFilterDescriptor_t": structs.cudnnFilterDescriptor_t,
    "cudnnConvolutionDescriptor_t": structs.cudnnConvolutionDescriptor_t,
    "cudnnBackendDescriptor_t": structs.cudnnBackendDescriptor_t,
    "cudnnTensorTransformDescriptor_t": structs.cudnnTensorTransformDescriptor_t,
    "cudaStream_t": structs.cudaStream_t,
}
_STRUCTS = {
    "cudnnConvolutionFwdAlgoPerf_t": structs.cudnnConvolutionFwdAlgoPerf_t,
    "cudnnConvolutionBwdDataAlgoPerf_t": structs.cudnnConvolutionBwdDataAlgoPerf_t,
    "cudnnConvolutionBwdFilterAlgoPerf_t": structs.cudnnConvolutionBwdFilterAlgoPerf_t,
}
_SCALARS = {"int": c_int, "size_t": c_size_t, "int64_t": c_int64, "unsigned": c_uint,
            "int32_t": c_int32, "uint32_t": c_uint32}
_ENUMS = {"cudnnStatus_t", "cudnnDataType_t", "cudnnTensorFormat_t", "cudnnMathType_t",
          "cudnnConvolutionMode_t", "cudnnConvolutionFwdAlgo_t", "cudnnConvolutionBwdDataAlgo_t",
          "cudnnConvolutionBwdFilterAlgo_t", "libraryPropertyType", "cudnnBackendDescriptorType_t",
          "cudnnBackendAttributeName_t", "cudnnBackendAttributeType_t",
          "cudnnFoldingDirection_t"}


def _expected_ctype(decl: str):
    """The ctypes type a C parameter declaration should bind to."""
    decl = decl.strip()
    array = decl.endswith("]")
    decl = re.sub(r"\[\s*\]$", "", decl)
    tokens = [t for t in re.findall(r"[A-Za-z_]\w*|\*", decl) if t != "const"]
    stars = tokens.count("*") + (1 if array else 0)
    words = [t for t in tokens if t != "*"]
    base = words[0]  # type, then (optional) parameter name
    if stars == 0:
        if base in _OPAQUE:
            return _OPAQUE[base]
        if base in _ENUMS:
            return c_int
        return _SCALARS[base]
    assert stars == 1, decl
    if base == "void":
        return c_void_p
    if base == "char":
        return c_char_p
    if base in _OPAQUE:
        return POINTER(_OPAQUE[base])
    if base in _STRUCTS:
        return POINTER(_STRUCTS[base])
    if base in _ENUMS:
        return POINTER(c_int)
    return POINTER(_SCALARS[base])


def _header_prototypes() -> dict[str, tuple[str, list[str]]]:
    text = _header_text()
    out = {}
    for m in re.finditer(r"([A-Za-z_][\w\s\*]*?)\b(cudnn[A-Za-z0-9_]+)\s*\(([^()]*)\)\s*;", text):
        ret = " ".join(t for t in m.group(1).split()
                       if t not in ("CUDNN_DEPRECATED", "CUDNNWINAPI", "const", "typedef"))
        params = [p.strip() for p in m.group(3).split(",") if p.strip()]
        if params == ["void"]:
            params = []
        out[m.group(2)] = (ret.split()[-1] if ret else "", params)
    return out


@needs_headers
def test_prototype_table_matches_the_headers():
    decls = _header_prototypes()
    restypes = {"cudnnStatus_t": prototypes.STATUS, "size_t": c_size_t, "void": None}
    checked = 0
    for proto in prototypes.PROTOTYPES:
        assert proto.name in decls, f"{proto.name} is not declared in {HEADER_NAMES}"
        ret, params = decls[proto.name]
        if proto.name == "cudnnGetErrorString":
            assert proto.restype is c_char_p
        else:
            assert proto.restype is restypes[ret], proto.name
        assert len(proto.argtypes) == len(params), (proto.name, params)
        for i, (have, decl) in enumerate(zip(proto.argtypes, params)):
            assert have is _expected_ctype(decl), (proto.name, i, decl, have)
        checked += 1
    assert checked == len(prototypes.PROTOTYPES)


def test_unknown_function_and_extension():
    with pytest.raises(AttributeError, match="prototype table"):
        prototypes.lib.cudnnNoSuchFunction
    own = prototypes.Library({"cudnnGetMaxDeviceVersion": prototypes.Prototype(
        "cudnnGetMaxDeviceVersion", c_size_t, ())})
    assert own.cudnnGetMaxDeviceVersion() > 0
    late = prototypes.Library({"cudnnGetVersion": prototypes.Prototype(
        "cudnnGetVersion", c_size_t, (), min_version=990000)})
    with pytest.raises(AttributeError, match="needs cuDNN 99"):
        late.cudnnGetVersion


def test_status_wrapper_raises_with_cudnn_text_and_name():
    with pytest.raises(errors.BadParamError) as info:
        cd.get_property(77)
    assert info.value.function == "cudnnGetProperty"
    assert info.value.status == Status.BAD_PARAM
    assert "cudnnGetProperty" in str(info.value) and "CUDNN_STATUS_BAD_PARAM" in str(info.value)


def test_error_strings():
    assert prototypes.error_string(2002) == "CUDNN_STATUS_BAD_PARAM_NULL_POINTER"
    assert prototypes.last_error_string() == ""  # nothing pending


# -- enums and structs ------------------------------------------------------------------------

@needs_headers
def test_enums_have_the_header_values():
    header = _header_enumerators()
    installed = cd.get_version()
    checked = 0
    for enum_cls, prefix in enums.C_PREFIX.items():
        if not prefix:
            continue  # libraryPropertyType lives in CUDA's library_types.h
        for member_name, member in enum_cls.__members__.items():  # aliases included
            if enums.BACKEND_MIN_VERSION.get((enum_cls, member_name), 0) > installed:
                continue  # newer than the installed headers (and never set by mucudnn)
            name = enums.c_name((enum_cls, member_name))
            assert name in header, f"{name} is not in the headers"
            assert header[name] == int(member), name
            checked += 1
    assert checked > 100
    # a few spot checks by hand, from cudnn_graph.h / cudnn_ops.h
    assert (header["CUDNN_STATUS_BAD_PARAM"], header["CUDNN_STATUS_BAD_PARAM_NULL_POINTER"],
            header["CUDNN_STATUS_NOT_SUPPORTED"], header["CUDNN_STATUS_INTERNAL_ERROR"],
            header["CUDNN_STATUS_EXECUTION_FAILED"]) == (2000, 2002, 3000, 4000, 5000)
    assert header["CUDNN_FMA_MATH"] == MathType.FMA_MATH == 3
    assert header["CUDNN_DATA_BFLOAT16"] == DataType.BFLOAT16 == 9
    assert enums.c_name(enums.ConvolutionBwdDataAlgo.ALGO_0) == "CUDNN_CONVOLUTION_BWD_DATA_ALGO_0"
    assert enums.c_name(enums.ConvolutionBwdFilterAlgo.FFT) == "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT"


@needs_headers
def test_status_enum_covers_the_header():
    header = _header_enumerators()
    ours = {enums.c_name((Status, n)) for n in Status.__members__}
    theirs = {n for n in header if n.startswith("CUDNN_STATUS_")}
    assert theirs - {"CUDNN_STATUS_FULL_ERROR_CODE"} <= ours | _newer_than_us(header)


def _newer_than_us(header):
    """Status codes added by a cuDNN newer than the one this binding was written for."""
    return {n for n in header if n.startswith("CUDNN_STATUS_") and header[n] % 1000 > 14}


def test_status_categories():
    assert Status.BAD_PARAM_NULL_POINTER.category == 2000
    assert Status.SUCCESS.category == 0
    assert enums.status_name(2003) == "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER"
    assert enums.status_name(2999) == "CUDNN_STATUS_UNKNOWN_2999"
    assert Status(4003) is Status.INTERNAL_ERROR_HOST_ALLOCATION_FAILED  # alias ALLOC_FAILED


@needs_headers
def test_algo_perf_structs_match_the_header():
    text = _header_text()
    for c_name_, cls in _STRUCTS.items():
        tag = c_name_.replace("_t", "Struct")
        body = re.search(r"typedef struct " + tag + r"\s*\{(.*?)\}", text, re.S).group(1)
        fields = re.findall(r"(\w+)\s*(?:\[\s*(\d+)\s*\])?\s*;", body)
        assert [f for f, _ in fields] == [f for f, _ in cls._fields_]
        assert [n for _, n in fields if n] == ["3"]
    for cls in _STRUCTS.values():
        assert ctypes.sizeof(cls) == 48
        assert cls.memory.offset == 16 and cls.mathType.offset == 28 and cls.reserved.offset == 32


def test_name_mappings():
    assert [enums.data_type(n) for n in ("float32", "float16", "bfloat16", "float64")] == [
        DataType.FLOAT, DataType.HALF, DataType.BFLOAT16, DataType.DOUBLE]
    assert [enums.compute_type(n) for n in ("float32", "float16", "bfloat16", "float64")] == [
        DataType.FLOAT, DataType.FLOAT, DataType.FLOAT, DataType.DOUBLE]
    assert [enums.math_type(n) for n in ("default", "fma", "tensor_op",
                                         "tensor_op_allow_conversion")] == [
        MathType.DEFAULT_MATH, MathType.FMA_MATH, MathType.TENSOR_OP_MATH,
        MathType.TENSOR_OP_MATH_ALLOW_CONVERSION]
    with pytest.raises(ValueError, match="dtype"):
        enums.data_type("int7")
    with pytest.raises(ValueError, match="math"):
        enums.math_type("fast")


# -- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("code, cls", [
    (1001, errors.NotInitializedError), (1002, errors.NotInitializedError),
    (1008, errors.NotInitializedError),
    (2000, errors.BadParamError), (2002, errors.BadParamError), (2003, errors.BadParamError),
    (2012, errors.BadParamError), (2077, errors.BadParamError),
    (3000, errors.NotSupportedError), (3007, errors.NotSupportedError),
    (4000, errors.InternalError), (4003, errors.AllocationFailedError),
    (4004, errors.AllocationFailedError), (4006, errors.InternalError),
    (5000, errors.ExecutionFailedError), (5003, errors.ExecutionFailedError),
    (9000, errors.CudnnError), (17, errors.CudnnError),
])
def test_from_status(code, cls):
    assert errors.from_status(code) is cls
    assert issubclass(cls, errors.CudnnError)


def test_every_status_maps_to_its_category():
    by_cat = {1000: errors.NotInitializedError, 2000: errors.BadParamError,
              3000: errors.NotSupportedError, 4000: errors.InternalError,
              5000: errors.ExecutionFailedError}
    for s in Status:
        if s is Status.SUCCESS:
            continue
        assert issubclass(errors.from_status(s), by_cat[s.category]), s


@pytest.mark.parametrize("cls", [errors.CudnnError, errors.NotInitializedError,
                                 errors.BadParamError, errors.NotSupportedError,
                                 errors.InternalError, errors.AllocationFailedError,
                                 errors.ExecutionFailedError])
def test_errors_pickle(cls):
    e = cls("cudnnConvolutionForward", 2002, "x is NULL", {"dims": (2, 3, 4, 5), "algo": 1})
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is cls
    assert (again.function, again.status, again.message, again.details) == (
        e.function, e.status, e.message, e.details)
    assert str(again) == str(e)
    assert "cudnnConvolutionForward" in str(e) and "x is NULL" in str(e)
    assert "dims=(2, 3, 4, 5)" in str(e)


def test_errors_importable_from_package():
    for name in ("CudnnError", "BadParamError", "NotSupportedError", "InternalError",
                 "ExecutionFailedError", "NotInitializedError"):
        assert getattr(cd, name) is getattr(errors, name)


# -- descriptors: set-then-get round trips ------------------------------------------------------------

DTYPES = ("float32", "float16", "bfloat16", "float64")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_tensor_4d_round_trip(dtype, fmt):
    dims = (2, 3, 4, 5)
    with TensorDescriptor() as t:
        t.set_4d(dims, dtype, fmt)
        assert t.get_4d() == (enums.data_type(dtype), dims, packed_strides(dims, fmt))
        assert t.get_nd() == (enums.data_type(dtype), dims, packed_strides(dims, fmt))
        assert t.size_in_bytes == 120 * {"float32": 4, "float16": 2, "bfloat16": 2,
                                         "float64": 8}[dtype]


def test_tensor_4d_ex_round_trip_with_padding_strides():
    dims, strides = (2, 3, 4, 5), (80, 25, 6, 1)
    with TensorDescriptor() as t:
        t.set_4d_ex(dims, strides, "float32")
        assert t.get_4d() == (DataType.FLOAT, dims, strides)
        assert (t.dims, t.strides, t.dtype) == (dims, strides, DataType.FLOAT)


@pytest.mark.parametrize("layout, dims", [("NCHW", (2, 3, 4, 5)), ("NHWC", (2, 3, 4, 5)),
                                          ("NCDHW", (2, 3, 4, 5, 6)), ("NDHWC", (2, 3, 4, 5, 6))])
def test_tensor_nd_round_trip(layout, dims):
    strides = packed_strides(dims, layout)
    with TensorDescriptor(dims, strides, "float16") as t:
        assert t.get_nd() == (DataType.HALF, dims, strides)
    with TensorDescriptor(dims, dtype="float32", format=layout) as t:
        assert t.strides == strides
    with TensorDescriptor() as t:
        t.set_nd_ex(dims, "float64", layout)
        assert t.get_nd() == (DataType.DOUBLE, dims, strides)


def test_tensor_nd_round_trip_with_odd_strides():
    dims, strides = (3, 2, 5, 7), (200, 90, 14, 2)  # every element two apart, padded rows
    with TensorDescriptor(dims, strides, "float32") as t:
        assert t.get_nd() == (DataType.FLOAT, dims, strides)
        assert t.get_nd(max_dims=2)[1] == dims[:2]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_filter_4d_round_trip(dtype, fmt):
    dims = (8, 3, 5, 7)
    with FilterDescriptor() as f:
        f.set_4d(dims, dtype, fmt)
        assert f.get_4d() == (enums.data_type(dtype), TensorFormat[fmt], dims)
        assert f.get_nd() == (enums.data_type(dtype), TensorFormat[fmt], dims)
        assert f.size_in_bytes == 8 * 3 * 5 * 7 * (8 if dtype == "float64" else
                                                   4 if dtype == "float32" else 2)


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC", "NCDHW", "NDHWC"])
def test_filter_nd_round_trip(fmt):
    dims = (8, 3, 2, 5, 7) if "D" in fmt else (8, 3, 5, 7)
    with FilterDescriptor(dims, "bfloat16", fmt) as f:
        assert f.get_nd() == (DataType.BFLOAT16, cd.tensor_format(fmt), dims)
        assert (f.dims, f.format, f.dtype) == (dims, cd.tensor_format(fmt), DataType.BFLOAT16)


@pytest.mark.parametrize("mode", list(ConvolutionMode))
@pytest.mark.parametrize("compute", ["float32", "float64", "float16"])
def test_convolution_2d_round_trip(mode, compute):
    with ConvolutionDescriptor() as c:
        c.set_2d((1, 2), (3, 4), (2, 1), mode, compute)
        assert c.get_2d() == ((1, 2), (3, 4), (2, 1), mode, enums.data_type(compute))
        assert c.get_nd() == ((1, 2), (3, 4), (2, 1), mode, enums.data_type(compute))


def test_convolution_nd_round_trip_groups_and_math():
    with ConvolutionDescriptor((0, 1, 2), (1, 2, 3), (3, 2, 1), compute_type="float64",
                               groups=4, math_type="fma") as c:
        assert c.get_nd() == ((0, 1, 2), (1, 2, 3), (3, 2, 1), ConvolutionMode.CROSS_CORRELATION,
                              DataType.DOUBLE)
        assert c.group_count == 4
        assert c.math_type is MathType.FMA_MATH
        for m in MathType:
            c.math_type = m
            assert c.math_type is m
        c.math_type = "tensor_op"
        assert c.math_type is MathType.TENSOR_OP_MATH
        c.group_count = 7
        assert c.group_count == 7


@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "NCDHW", "NDHWC"])
def test_descriptors_for_problem(layout):
    nd = 3 if "D" in layout else 2
    x_canon = (4, 6) + (9, 8, 7)[:nd]
    w_canon = (10, 3) + (3, 2, 1)[:nd]
    p = ConvProblem(from_canonical(x_canon, layout), from_canonical(w_canon, layout),
                    stride=2, padding=1, dilation=(2, 1, 1)[:nd], groups=2, dtype="float16",
                    layout=layout, math="fma")
    with TensorDescriptor.for_x(p) as x, FilterDescriptor.for_w(p) as w, \
            TensorDescriptor.for_y(p) as y, ConvolutionDescriptor.for_problem(p) as c:
        assert x.get_nd() == (DataType.HALF, p.x_dims, packed_strides(p.x_dims, layout))
        assert y.get_nd() == (DataType.HALF, p.y_dims, packed_strides(p.y_dims, layout))
        fmt = TensorFormat.NHWC if p.channels_last else TensorFormat.NCHW
        assert w.get_nd() == (DataType.HALF, fmt, p.w_dims)
        assert c.get_nd() == (p.padding, p.stride, p.dilation, ConvolutionMode.CROSS_CORRELATION,
                              DataType.FLOAT)
        assert c.group_count == 2 and c.math_type is MathType.FMA_MATH
        assert c.output_dims(x, w) == p.y_dims
        if nd == 2:
            assert c.output_dims_2d(x, w) == p.y_dims
        for d in (x, w, y, c):
            assert "closed" not in repr(d)
    with ConvolutionDescriptor.for_problem(p, math_type=MathType.TENSOR_OP_MATH) as c:
        assert c.math_type is MathType.TENSOR_OP_MATH


@st.composite
def problems(draw):
    nd = draw(st.sampled_from([2, 3]))
    layout = draw(st.sampled_from(["NCHW", "NHWC"] if nd == 2 else ["NCDHW", "NDHWC"]))
    groups = draw(st.integers(1, 4))
    cg = draw(st.integers(1, 4))
    kg = draw(st.integers(1, 3))
    n = draw(st.integers(1, 5))
    spatial = draw(st.lists(st.integers(1, 14), min_size=nd, max_size=nd))
    filt = draw(st.lists(st.integers(1, 5), min_size=nd, max_size=nd))
    pad = draw(st.lists(st.integers(0, 3), min_size=nd, max_size=nd))
    stride = draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd))
    dil = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    dtype = draw(st.sampled_from(DTYPES))
    x = from_canonical((n, groups * cg, *spatial), layout)
    w = from_canonical((groups * kg, cg, *filt), layout)
    try:
        return ConvProblem(x, w, stride=stride, padding=pad, dilation=dil, groups=groups,
                           dtype=dtype, layout=layout)
    except ValueError:
        assume(False)


@given(problems())
def test_cudnn_output_dims_equal_problem_output_shape(p):
    dims = output_dims(p)
    assert dims == p.y_dims
    assert from_canonical(dims, p.layout) == p.output_shape


# -- bad descriptors -----------------------------------------------------------------------------

def _check_bad_param(info, function, *fragments):
    e = info.value
    assert isinstance(e, errors.BadParamError)
    assert e.function == function and function in str(e)
    assert e.status_name.startswith("CUDNN_STATUS_BAD_PARAM")
    assert e.message, "cuDNN's cudnnGetLastErrorString text is missing"
    assert e.message in str(e)
    for f in fragments:
        assert f in str(e), f


def test_negative_dims_raise_bad_param():
    before = live_descriptors()
    with pytest.raises(errors.BadParamError) as info:
        TensorDescriptor((2, -3, 4, 5))
    _check_bad_param(info, "cudnnSetTensorNdDescriptor", "dims=(2, -3, 4, 5)")
    assert info.value.details["dims"] == (2, -3, 4, 5)
    assert live_descriptors() == before  # the half-made descriptor was destroyed


def test_zero_filter_dim_raises_bad_param():
    with pytest.raises(errors.BadParamError) as info:
        FilterDescriptor((0, 3, 3, 3))
    _check_bad_param(info, "cudnnSetFilterNdDescriptor", "dims=(0, 3, 3, 3)")


def test_zero_stride_raises_bad_param():
    with pytest.raises(errors.BadParamError) as info:
        ConvolutionDescriptor((1, 1), (0, 1), (1, 1))
    _check_bad_param(info, "cudnnSetConvolutionNdDescriptor", "stride=(0, 1)")


def test_bad_strides_and_groups_raise_bad_param():
    with pytest.raises(errors.BadParamError) as info:
        TensorDescriptor((2, 3, 4, 5), (60, 20, 5, 0))
    _check_bad_param(info, "cudnnSetTensorNdDescriptor")
    with ConvolutionDescriptor((1, 1), (1, 1), (1, 1)) as c:
        with pytest.raises(errors.BadParamError) as info:
            c.group_count = 0
        _check_bad_param(info, "cudnnSetConvolutionGroupCount", "groups=0")


def test_channel_mismatch_raises_bad_param_with_shapes():
    with TensorDescriptor((2, 8, 5, 5)) as x, FilterDescriptor((4, 3, 3, 3)) as w, \
            ConvolutionDescriptor((1, 1), (1, 1), (1, 1)) as c:
        with pytest.raises(errors.BadParamError) as info:
            c.output_dims(x, w)
        _check_bad_param(info, "cudnnGetConvolutionNdForwardOutputDim",
                         "x=(2, 8, 5, 5)", "w=(4, 3, 3, 3)")


def test_too_many_dims_refused_in_python():
    with pytest.raises(ValueError, match="dims"):
        TensorDescriptor(tuple(range(1, 10)))


# -- typed handles -------------------------------------------------------------------------------

def test_wrong_descriptor_kind_fails_in_python():
    with TensorDescriptor((2, 3, 4, 5)) as x, FilterDescriptor((4, 3, 3, 3)) as w, \
            ConvolutionDescriptor((1, 1), (1, 1), (1, 1)) as c:
        size = ctypes.c_size_t()
        with pytest.raises(ctypes.ArgumentError, match="cudnnFilterDescriptor_t"):
            prototypes.lib.cudnnGetFilterSizeInBytes(x, ctypes.byref(size))
        with pytest.raises(ctypes.ArgumentError, match="cudnnTensorDescriptor_t"):
            prototypes.lib.cudnnGetTensorSizeInBytes(w, ctypes.byref(size))
        with pytest.raises((ctypes.ArgumentError, TypeError)):
            c.output_dims(w, x)  # swapped
        with pytest.raises(ctypes.ArgumentError):
            prototypes.lib.cudnnGetTensorSizeInBytes(x.handle, ctypes.byref(size))  # a raw int
        with pytest.raises(ctypes.ArgumentError):
            prototypes.lib.cudnnGetConvolutionGroupCount(None, ctypes.byref(ctypes.c_int()))
        prototypes.lib.cudnnGetTensorSizeInBytes(x, ctypes.byref(size))
        assert size.value == 480


def test_closed_descriptor_refused():
    t = TensorDescriptor((1, 1, 1, 1))
    t.close()
    t.close()  # idempotent
    assert t.closed and t.handle == 0 and "closed" in repr(t)
    with pytest.raises(ValueError, match="closed"):
        t.get_nd()


# -- lifetime ------------------------------------------------------------------------------------

def test_live_descriptor_counter_and_no_leak():
    gc.collect()
    before = live_descriptor_counts()
    for _ in range(10_000):
        with TensorDescriptor((2, 3, 4, 5)):
            pass
        f = FilterDescriptor((4, 3, 3, 3))
        f.close()
        c = ConvolutionDescriptor((1, 1), (1, 1), (1, 1))
        c.close()
    assert live_descriptor_counts() == before


def test_finalizer_frees_forgotten_descriptors():
    gc.collect()
    before = live_descriptors()
    ds = [TensorDescriptor((1, 2, 3, 4)), FilterDescriptor((1, 2, 3, 3)),
          ConvolutionDescriptor((0, 0), (1, 1), (1, 1))]
    assert live_descriptors() == before + 3
    assert live_descriptor_counts()["convolution"] >= 1
    del ds
    gc.collect()
    assert live_descriptors() == before


# -- no GPU ---------------------------------------------------------------------------------------

no_gpu_only = pytest.mark.skipif(HAVE_GPU, reason="this machine has a GPU")


@no_gpu_only
def test_handle_without_gpu_raises_no_device():
    from mucudnn.cuda import NoDeviceError

    with pytest.raises(NoDeviceError, match="no CUDA device"):
        cd.Handle()
    with pytest.raises(NoDeviceError):
        cd.get_handle()
    assert cd.live_handles() == 0


@no_gpu_only
def test_cudnn_backend_without_gpu_raises_no_device():
    import mucudnn as mu
    from mucudnn.backends.cudnn import CudnnBackend
    from mucudnn.cuda import NoDeviceError

    with pytest.raises(NoDeviceError, match="no CUDA device"):
        mu.get_backend("cudnn")
    with pytest.raises(NoDeviceError):
        CudnnBackend(find_workspace_limit=1 << 20)


def test_stream_handle_conversion():
    class TorchLike:
        cuda_stream = 0x1234

    class CudaCoreLike:
        def __cuda_stream__(self):
            return (0, 0x5678)

    class Ours:
        handle = 0x9abc

    from mucudnn.cuda import stream_handle  # the one stream reader (cuDNN's Handle uses it)

    assert stream_handle(0) == 0
    assert stream_handle(0x42) == 0x42
    assert stream_handle(TorchLike()) == 0x1234
    assert stream_handle(CudaCoreLike()) == 0x5678
    assert stream_handle(Ours()) == 0x9abc
    with pytest.raises(TypeError, match="stream"):
        stream_handle(object())
    with pytest.raises(ValueError, match="stream"):
        stream_handle(-1)


def test_fast_variant_pack_is_counted_and_closed_whether_or_not_it_finalizes():
    """See Note [variant packs on the hot path]: the raw-built pack is a counted
    descriptor; finalized where cuDNN can (a GPU machine), else the failing
    call's CudnnError with cuDNN's message and nothing left alive."""
    from mucudnn._cudnn import graph_descriptors as gd
    from mucudnn._cudnn.backend_api import live_backend_descriptors
    from mucudnn._cudnn.errors import CudnnError

    uids = gd.uid_array((gd.UID_X, gd.UID_W, gd.UID_Y))
    assert list(uids) == [1, 2, 3]
    before = live_backend_descriptors()
    try:
        d = gd.fast_variant_pack(uids, 0x7F0000000000, 0x7F0000001000, 0x7F0000002000, 0)
    except CudnnError as exc:
        assert "cudnnBackend" in str(exc) and "VARIANT_PACK" in str(exc)
    else:
        assert d.finalized and not d.closed
        assert live_backend_descriptors() != before
        d.close()
    assert live_backend_descriptors() == before
