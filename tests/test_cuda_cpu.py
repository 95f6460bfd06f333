"""mucudnn.cuda without a GPU: import, the no-device error, errors, and the pure
logic of DeviceArray (dtypes, typestrs, __cuda_array_interface__, views)."""

from __future__ import annotations

import ctypes
import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mucudnn.cuda as mc
from mucudnn import dtypes as mdt
from mucudnn.cuda import memory as mm
from mucudnn.cuda.errors import NO_DEVICE_MESSAGE

from conftest import HAVE_GPU

rt = pytest.importorskip("cuda.bindings.runtime")

no_gpu_only = pytest.mark.skipif(HAVE_GPU, reason="checks the behaviour without a GPU")

PUBLIC = [
    "CudaError", "CudaOutOfMemoryError", "NoDeviceError", "check",
    "device_count", "require_device", "current_device", "set_device",
    "device_name", "device_properties", "mem_get_info", "synchronize",
    "Stream", "default_stream", "Event", "time_on_stream", "time_interleaved", "holding",
    "DeviceArray", "as_device_array", "is_device_array_like", "memory_allocated",
    "CudaGraph",
]


def test_public_names_exported():
    for name in PUBLIC:
        assert hasattr(mc, name), name
        assert name in mc.__all__, name


def test_import_in_a_fresh_interpreter_touches_no_device():
    code = ("import mucudnn.cuda as c, mucudnn.cuda.memory as m; "
            "print(c.device_count() >= 0, m.memory_allocated(), m.allocation_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "0", "0"]


# -- no device ---------------------------------------------------------------

@no_gpu_only
def test_device_count_is_zero_without_gpu():
    assert mc.device_count() == 0


@no_gpu_only
@pytest.mark.parametrize("make", [
    lambda: mc.DeviceArray((2, 3), "float32"),
    lambda: mc.DeviceArray.from_numpy(np.zeros(3, np.float32)),
    lambda: mc.Stream(),
    lambda: mc.default_stream(),
    lambda: mc.Event(),
    lambda: mc.require_device(),
    lambda: mc.mem_get_info(),
    lambda: mc.device_name(),
    lambda: mc.device_properties(0),
    lambda: mc.current_device(),
    lambda: mc.synchronize(),
], ids=["DeviceArray", "from_numpy", "Stream", "default_stream", "Event", "require_device",
        "mem_get_info", "device_name", "device_properties", "current_device", "synchronize"])
def test_first_real_use_raises_no_device_error(make):
    with pytest.raises(mc.NoDeviceError) as info:
        make()
    err = info.value
    assert isinstance(err, mc.CudaError)
    assert NO_DEVICE_MESSAGE in str(err)
    assert err.error_name.startswith("cudaError")
    assert err.error_name in str(err)          # the underlying error is named
    assert err.function.startswith("cuda")
    assert mc.memory_allocated() == 0


@no_gpu_only
def test_import_of_foreign_array_without_gpu_raises_no_device_error():
    class Foreign:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0x7000_0000, False),
                                    "version": 3, "strides": None, "stream": None}
    with pytest.raises(mc.NoDeviceError, match=NO_DEVICE_MESSAGE):
        mc.as_device_array(Foreign())


# -- errors --------------------------------------------------------------------

@pytest.mark.parametrize("cls", [mc.CudaError, mc.CudaOutOfMemoryError, mc.NoDeviceError])
def test_errors_pickle_and_show_all_three_parts(cls):
    err = cls("cudaMalloc", "cudaErrorMemoryAllocation", "out of memory: 12 bytes")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert (back.function, back.error_name, back.message) == (
        "cudaMalloc", "cudaErrorMemoryAllocation", "out of memory: 12 bytes")
    for s in (str(err), str(back)):
        assert "cudaMalloc" in s and "cudaErrorMemoryAllocation" in s and "out of memory: 12 bytes" in s
    assert issubclass(cls, mc.CudaError) and issubclass(cls, Exception)


def test_check_returns_values_on_success():
    ok = rt.cudaError_t.cudaSuccess
    assert mc.check((ok,), "f") is None
    assert mc.check((ok, 5), "f") == 5
    assert mc.check((ok, 1, 2), "f") == (1, 2)
    assert mc.check(ok, "f") is None


def test_check_raises_cuda_error_with_runtime_name_and_text():
    with pytest.raises(mc.CudaError) as info:
        mc.check((rt.cudaError_t.cudaErrorInvalidValue, None), "cudaFoo")
    err = info.value
    assert type(err) is mc.CudaError
    assert err.function == "cudaFoo"
    assert err.error_name == "cudaErrorInvalidValue"
    assert err.message == "invalid argument"        # cudaGetErrorString's text
    assert "cudaFoo" in str(err) and "cudaErrorInvalidValue" in str(err)


def test_check_maps_out_of_memory_and_no_device():
    with pytest.raises(mc.CudaOutOfMemoryError) as info:
        mc.check((rt.cudaError_t.cudaErrorMemoryAllocation, None), "cudaMalloc")
    assert info.value.error_name == "cudaErrorMemoryAllocation"
    for name in ("cudaErrorNoDevice", "cudaErrorInsufficientDriver"):
        with pytest.raises(mc.NoDeviceError) as info:
            mc.check((getattr(rt.cudaError_t, name), None), "cudaGetDevice")
        assert info.value.error_name == name
        assert NO_DEVICE_MESSAGE in str(info.value) and name in str(info.value)
    # an ordinary error is neither
    with pytest.raises(mc.CudaError) as info:
        mc.check((rt.cudaError_t.cudaErrorInvalidDevice, None), "cudaSetDevice")
    assert not isinstance(info.value, (mc.NoDeviceError, mc.CudaOutOfMemoryError))


# -- dtypes and typestrs ----------------------------------------------------------

@pytest.mark.parametrize("name,ts", [
    ("bool", "|b1"), ("int8", "|i1"), ("uint8", "|u1"), ("int16", "<i2"), ("uint16", "<u2"),
    ("int32", "<i4"), ("uint32", "<u4"), ("int64", "<i8"), ("uint64", "<u8"),
    ("float16", "<f2"), ("float32", "<f4"), ("float64", "<f8"), ("bfloat16", "<V2"),
    ("complex64", "<c8"), ("complex128", "<c16"),
])
def test_typestr_mapping_round_trips(name, ts):
    if sys.byteorder != "little":
        pytest.skip("typestrs written for a little-endian host")
    dt = mc.normalize_dtype(name)
    assert mc.typestr(dt) == ts
    assert mc.dtype_name(dt) == name
    back = mdt.dtype_from_typestr(ts)
    assert back == dt and mc.dtype_name(back) == name
    assert dt.itemsize == (2 if name == "bfloat16" else np.dtype(name).itemsize)


def test_dtype_aliases_and_torch_style_names():
    assert mc.normalize_dtype("half") == np.float16
    assert mc.normalize_dtype(np.float32) == np.float32
    assert mc.normalize_dtype("torch.float64") == np.float64
    assert mc.normalize_dtype("torch.bfloat16") == mc.BFLOAT16
    assert mc.dtype_name("bf16") == "bfloat16"


@pytest.mark.parametrize("bad", ["float128", "str", "<U4", object, "int4", np.dtype([("a", "<f4")])])
def test_unsupported_dtypes_raise_type_error(bad):
    with pytest.raises(TypeError):
        mc.normalize_dtype(bad)


@pytest.mark.parametrize("ts", [">f4", "<U4", "|O", "<f16", "<V4", "nonsense", 5])
def test_unsupported_typestrs_raise_value_error(ts):
    with pytest.raises(ValueError):
        mdt.dtype_from_typestr(ts)


def test_bfloat16_with_and_without_ml_dtypes():
    fallback = mdt._resolve_bfloat16(use_ml_dtypes=False)
    assert fallback.itemsize == 2 and fallback.kind == "V"
    assert mc.dtype_name(fallback) == "bfloat16" and mc.typestr(fallback) == "<V2"
    bits = np.array([0x3F80, 0xFFFF], dtype=np.uint16)     # 1.0 and a NaN in bfloat16
    assert np.array_equal(bits.view(fallback).view(np.uint16), bits)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert mc.BFLOAT16 == np.dtype(ml_dtypes.bfloat16)
    assert float(bits.view(mc.BFLOAT16)[0]) == 1.0


# -- __cuda_array_interface__ parsing and export -------------------------------------

def _cai(**kw):
    d = {"shape": (2, 3, 4), "typestr": "<f4", "data": (0x10000, False), "version": 3,
         "strides": None, "stream": None}
    d.update(kw)
    return d


def test_parse_valid_interface():
    ptr, shape, dt, ro, stream = mm.parse_cuda_array_interface(_cai(stream=7, data=(0x2000, True)))
    assert (ptr, shape, dt, ro, stream) == (0x2000, (2, 3, 4), np.dtype(np.float32), True, 7)
    # explicit C strides are as good as None; size-1 axes may carry any stride
    assert mm.parse_cuda_array_interface(_cai(strides=(48, 16, 4)))[1] == (2, 3, 4)
    assert mm.parse_cuda_array_interface(_cai(shape=(2, 1, 4), strides=(16, 999, 4)))[1] == (2, 1, 4)
    assert mm.parse_cuda_array_interface(_cai(version=2, stream=5))[4] is None  # v2 has no stream
    assert mm.parse_cuda_array_interface(_cai(typestr="<V2"))[2] == mc.BFLOAT16


@pytest.mark.parametrize("kw,match", [
    ({"strides": (4, 8, 24)}, "not C-contiguous"),
    ({"strides": (96, 16, 4)}, "not C-contiguous"),
    ({"version": 4}, "version"),
    ({"mask": object()}, "mask"),
    ({"typestr": "<U3"}, "typestr"),
    ({"data": (0, False)}, "null data pointer"),
    ({"data": 0x1000}, "data"),
    ({"shape": (2, -1)}, "shape"),
    ({"stream": "s"}, "stream"),
])
def test_parse_rejects_bad_interfaces(kw, match):
    with pytest.raises(ValueError, match=match):
        mm.parse_cuda_array_interface(_cai(**kw))


def test_parse_rejects_missing_keys():
    for key in ("shape", "typestr", "data", "version"):
        d = _cai()
        del d[key]
        with pytest.raises(ValueError, match=key):
            mm.parse_cuda_array_interface(d)


def test_non_contiguous_foreign_array_fails_before_touching_the_device():
    class Foreign:
        __cuda_array_interface__ = _cai(strides=(4, 8, 24))
    with pytest.raises(ValueError, match="contiguous"):
        mc.as_device_array(Foreign())


def test_export_dict():
    d = mm.cuda_array_interface(0xABC000, (5, 2), np.float16, readonly=False, stream=42)
    assert d == {"shape": (5, 2), "typestr": "<f2", "data": (0xABC000, False), "version": 3,
                 "strides": None, "stream": 42}
    assert mm.cuda_array_interface(1, (1,), "bfloat16", True, None)["typestr"] == "<V2"
    assert mm.cuda_array_interface(1, (1,), "uint8", True, None)["data"] == (1, True)
    assert mm.cuda_array_interface(1, (1,), "uint8", stream=0)["stream"] == 1  # 0 is forbidden


# -- DeviceArray logic on a fake pointer (nothing is dereferenced) -------------------------

BASE = 0x7F00_0000_0000


def _fake(shape, dtype="float32", stream=5):
    return mm.DeviceArray._from_parts(BASE, shape, dtype, 0, stream=mc.Stream.wrap(stream),
                                      keep=object(), kind="import")


def test_attributes():
    a = _fake((4, 3, 2), "float16")
    assert (a.shape, a.dtype, a.dtype_name, a.itemsize) == ((4, 3, 2), np.float16, "float16", 2)
    assert (a.size, a.nbytes, a.ndim, a.strides, a.device) == (24, 48, 3, (12, 4, 2), 0)
    assert a.ptr == BASE and len(a) == 4
    assert "float16" in repr(a) and "(4, 3, 2)" in repr(a)
    cai = a.__cuda_array_interface__
    assert cai["data"] == (BASE, False) and cai["typestr"] == "<f2" and cai["stream"] == 5
    assert _fake((3,), "bfloat16").__cuda_array_interface__["typestr"] == "<V2"


def test_leading_axis_views():
    a = _fake((8, 3, 5))                 # a row is 60 bytes
    v = a[2:5]
    assert v.shape == (3, 3, 5) and v.ptr == BASE + 2 * 60 and v.is_view
    assert v.__cuda_array_interface__["data"][0] == BASE + 120
    assert v._keep is a._keep            # the view keeps the parent's memory owner alive
    assert a[6].shape == (3, 5) and a[6].ptr == BASE + 6 * 60
    assert a[-1].ptr == BASE + 7 * 60
    assert a[5:].shape == (3, 3, 5) and a[:0].shape == (0, 3, 5)
    assert a[7:3].shape == (0, 3, 5)
    assert a[(slice(1, 2),)].ptr == BASE + 60
    assert v[1:2].ptr == BASE + 3 * 60    # views of views
    with pytest.raises(IndexError):
        a[8]
    with pytest.raises(IndexError):
        a[-9]
    with pytest.raises(ValueError, match="step"):
        a[::2]
    with pytest.raises(IndexError, match="leading axis"):
        a[1, 2]
    with pytest.raises(TypeError):
        a[1.5]
    with pytest.raises(TypeError):
        a[None]


def test_workspace_byte_views():
    ws = _fake((1000,), "uint8")
    seg = ws.view_bytes(256, 128)
    assert seg.shape == (128,) and seg.ptr == BASE + 256 and seg.dtype == np.uint8
    assert ws[256:384].ptr == seg.ptr and ws[256:384].shape == (128,)
    assert ws.view_bytes(1000, 0).shape == (0,)
    with pytest.raises(IndexError):
        ws.view_bytes(900, 101)
    with pytest.raises(IndexError):
        ws.view_bytes(-1, 10)
    with pytest.raises(TypeError):
        _fake((10,), "float32").view_bytes(0, 4)
    with pytest.raises(TypeError):
        _fake((10, 10), "uint8").view_bytes(0, 4)


def test_reshape():
    a = _fake((4, 6))
    assert a.reshape(24).shape == (24,)
    assert a.reshape(2, -1, 3).shape == (2, 4, 3)
    assert a.reshape((3, 8)).shape == (3, 8) and a.reshape((3, 8)).ptr == BASE
    with pytest.raises(ValueError):
        a.reshape(5, 5)
    with pytest.raises(ValueError):
        a.reshape(-1, -1)


def test_closed_arrays_refuse_use():
    a = _fake((4, 2))
    v = a[1:3]
    v.close()
    with pytest.raises(ValueError, match="closed"):
        v.ptr
    assert a.ptr == BASE                 # closing a view leaves its parent alone
    a.close()
    a.close()                            # idempotent
    with pytest.raises(ValueError, match="closed"):
        a[0]


def test_device_array_is_not_picklable_or_implicitly_converted():
    a = _fake((2,))
    with pytest.raises(TypeError):
        pickle.dumps(a)
    with pytest.raises(TypeError):
        np.asarray(a)


def test_readonly_arrays_refuse_writes_before_any_device_call():
    a = mm.DeviceArray._from_parts(BASE, (4,), "float32", 0, readonly=True, keep=None)
    for write in (a.fill_zero, a.fill_nan, lambda: a.fill_bytes(1),
                  lambda: a.copy_from(np.zeros(4, np.float32))):
        with pytest.raises(ValueError, match="read-only"):
            write()


def test_fill_nan_needs_floats_and_fill_bytes_checks_range():
    with pytest.raises(TypeError):
        _fake((4,), "int32").fill_nan()
    with pytest.raises(ValueError):
        _fake((4,), "uint8").fill_bytes(256)


def test_as_device_array_type_errors_and_like():
    for obj in (np.zeros(3), [1, 2], 3.0, object()):
        with pytest.raises(TypeError):
            mc.as_device_array(obj)
        assert not mc.is_device_array_like(obj)
    a = _fake((3,))
    assert mc.as_device_array(a) is a
    assert mc.is_device_array_like(a)
    assert mc.as_device_array(a, shape=(3, 1)).shape == (3, 1)
    with pytest.raises(ValueError, match="dtype"):
        mc.as_device_array(a, dtype="float64")

    class Foreign:
        __cuda_array_interface__ = _cai()
    assert mc.is_device_array_like(Foreign())


def test_shape_validation():
    with pytest.raises(ValueError):
        mm._normalize_shape((2, -3))
    with pytest.raises(TypeError):
        mm._normalize_shape((2.5,))
    assert mm._normalize_shape(7) == (7,) and mm._normalize_shape(np.int64(3)) == (3,)
    assert mm._dlpack.c_strides((2, 0, 3), 4) == (12, 12, 4)


# -- streams without a device --------------------------------------------------------

def test_wrapped_streams_and_handles():
    s = mc.Stream.wrap(0x1234, device=0)
    assert s.handle == 0x1234 and int(s) == 0x1234 and not s.owned
    s.close()                            # never destroys a stream it does not own
    assert not s.closed
    assert mc.stream_handle(s) == 0x1234
    assert mc.stream_handle(77) == 77

    class TorchLikeStream:
        cuda_stream = 0x55
    assert mc.stream_handle(TorchLikeStream()) == 0x55
    with pytest.raises(TypeError):
        mc.stream_handle("stream")
    with pytest.raises(TypeError):
        mc.stream_handle(True)


def test_time_on_stream_validates_arguments():
    with pytest.raises(ValueError):
        mc.time_on_stream(lambda: None, mc.Stream.wrap(9), repeat=0)


def test_deferred_release_during_capture():
    from mucudnn.cuda import _lifetime
    calls = []
    _lifetime.begin_capture()
    _lifetime.release(calls.append, 1)
    assert calls == [] and _lifetime.capturing()
    _lifetime.end_capture()
    assert calls == [1] and not _lifetime.capturing()
    _lifetime.release(calls.append, 2)
    assert calls == [1, 2]


class _HoldDriver:
    """What holding() asks of cuda-bindings, without a device: pinned memory is
    a host buffer, a launch is recorded with its decoded parameters (``fail``:
    launches fail)."""

    cudaHostAllocMapped = 2

    def __init__(self, fail=False):
        self.fail, self.launches, self.buffers = fail, [], []

    def cudaHostAlloc(self, size, flags):
        assert flags == self.cudaHostAllocMapped
        buf = ctypes.create_string_buffer(size)
        self.buffers.append(buf)
        return (rt.cudaError_t.cudaSuccess, ctypes.addressof(buf))

    def cudaHostGetDevicePointer(self, host, flags):
        return (rt.cudaError_t.cudaSuccess, host)

    def cuModuleLoadData(self, image):
        assert b".entry mucudnn_hold" in ctypes.string_at(image)
        return (rt.cudaError_t.cudaSuccess, "module")

    def cuModuleGetFunction(self, module, name):
        return (rt.cudaError_t.cudaSuccess, (module, name))

    CUstream = staticmethod(int)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        if self.fail:
            return (rt.cudaError_t.cudaErrorInvalidValue,)
        ptrs = (ctypes.c_void_p * 3).from_address(params)
        values = [ctypes.c_uint64.from_address(p).value for p in ptrs]
        self.launches.append((f, (gx, gy, gz, bx, by, bz, shared), stream, values))
        return (rt.cudaError_t.cudaSuccess,)


@pytest.fixture
def hold_driver(monkeypatch):
    from mucudnn.cuda import hold
    fake = _HoldDriver()
    monkeypatch.setattr(hold._runtime, "get", lambda: fake)
    monkeypatch.setattr(hold._runtime, "driver", lambda: fake)
    monkeypatch.setattr(hold, "current_device", lambda: 0)
    monkeypatch.setattr(hold, "_DEVICES", {})
    return fake


def test_holding_queues_the_hold_kernel_and_raises_its_flag_when_the_block_ends(hold_driver):
    """See Note [held timing]: one thread of the hold kernel is queued on the
    stream, waiting for the flag (the pinned word's device address) to reach
    its ticket within HOLD_TIMEOUT_S; the flag stays below the ticket while
    the block runs and reaches it when the block ends, or raises."""
    from mucudnn.cuda import hold
    with mc.holding(1234) as h:
        (f, dims, stream, (flag, ticket, timeout_ns)), = hold_driver.launches
        assert f == ("module", b"mucudnn_hold") and dims == (1, 1, 1, 1, 1, 1, 0)
        assert stream == 1234 and ticket == h.ticket == 1
        assert timeout_ns == int(hold.HOLD_TIMEOUT_S * 1e9)
        word = ctypes.c_uint64.from_address(flag)
        assert word.value < ticket
    assert word.value == 1 and not h.timed_out()
    with pytest.raises(KeyError):
        with mc.holding(1234) as h2:
            assert hold_driver.launches[-1][3][:2] == [flag, 2] and word.value == 1
            raise KeyError("inside")
    assert word.value == 2 and h2.ticket == 2
    assert len(hold_driver.buffers) == 1  # one flag per device, made once


def test_a_hold_that_timed_out_says_so(hold_driver):
    """The kernel stores its ticket in the word after the flag when it gives
    up; Hold.timed_out reads it."""
    with mc.holding(7) as h:
        pass
    assert not h.timed_out()
    flag = hold_driver.launches[-1][3][0]
    ctypes.c_uint64.from_address(flag + 8).value = h.ticket
    assert h.timed_out()


def test_a_hold_that_cannot_be_queued_raises_cudas_error_by_name(hold_driver):
    hold_driver.fail = True
    ran = []
    with pytest.raises(mc.CudaError, match="cuLaunchKernel.*cudaErrorInvalidValue"):
        with mc.holding(7):
            ran.append(1)
    assert ran == []


def test_the_hold_kernel_assembles_for_the_gpus_we_run_on(tmp_path):
    """The hold kernel's PTX (Note [held timing]) assembles with ptxas for
    Hopper and Ampere, where a CUDA toolkit is installed."""
    import glob
    import shutil
    from mucudnn.cuda import hold
    ptxas = shutil.which("ptxas") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/ptxas"))), None)
    if ptxas is None:
        pytest.skip("no ptxas (CUDA toolkit) on this machine")
    src = tmp_path / "hold.ptx"
    src.write_bytes(hold._PTX)
    for arch in ("sm_80", "sm_90"):
        out = subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(tmp_path / f"{arch}.cubin")],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


class _ClockedEvents:
    """Stand-ins for timing's Event and clock: the k-th call of a timed
    function takes ``host[k]`` ms on the fake clock and ``gpu[k]`` ms between
    its events."""

    def __init__(self, gpu, host):
        self.gpu, self.host, self.now, self.k = gpu, host, 0.0, 0
        self.pairs = []
        owner = self

        class Event:
            def __init__(self):
                self.at = None

            def record(self, stream):
                owner.pairs.append(self)

            def synchronize(self):
                pass

            def close(self):
                pass

            @staticmethod
            def elapsed_ms(start, end):
                return owner.gpu[owner.pairs.index(start) // 2]

        self.Event = Event

    def clock(self):
        return self.now / 1e3

    def call(self):
        self.now += self.host[self.k]
        self.k += 1


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_time_counts_the_host_where_asked_and_the_gpu_alone_otherwise(data):
    """See Note [the host's share of a find]: with ``host`` each call's time is
    the larger of its events' and the host's ms in that call; without, the
    events' alone, whichever is larger. Functions alternate as before."""
    from mucudnn.cuda import timing

    n_fns = data.draw(st.integers(1, 3))
    repeat = data.draw(st.integers(1, 4))
    ms = st.floats(0.001, 5.0, allow_nan=False)
    gpu = data.draw(st.lists(ms, min_size=n_fns * repeat, max_size=n_fns * repeat))
    host_ms = data.draw(st.lists(ms, min_size=n_fns * repeat, max_size=n_fns * repeat))
    host = data.draw(st.booleans())
    fake = _ClockedEvents(gpu, host_ms)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timing, "Event", fake.Event)
        mp.setattr(timing, "as_stream", lambda s: s)
        mp.setattr(timing.time, "perf_counter", fake.clock)
        fns = [fake.call for _ in range(n_fns)]
        got = timing.time_interleaved(fns, 7, warmup=0, repeat=repeat, host=host)
    assert len(got) == n_fns and all(len(t) == repeat for t in got)
    for i in range(n_fns):
        for r in range(repeat):
            k = r * n_fns + i  # round r, function i
            want = max(gpu[k], host_ms[k]) if host else gpu[k]
            assert got[i][r] == pytest.approx(want, rel=1e-9, abs=1e-9)
