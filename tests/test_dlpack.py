"""DLPack in and out (mucudnn.cuda.dlpack, the intake in mucudnn.exec.arrays, the API).

On the CPU: the struct layout against dlpack.h; capsules consumed exactly once
(renamed, the producer's deleter called once, legacy and versioned, old
producers without ``max_version``); our exports read back by NumPy and torch;
host arrays through DLPack (a DLPack-only wrapper, CPU torch tensors, outputs
written in place) on the NumPy backend equal to the NumPy call and the float64
reference; a CUDA DLPack producer through the device call path of a fake
pointer backend (the stream handed to ``__dlpack__``, the deferred release);
the bounded release queue; the errors, each naming its argument.

On the H200 (marker ``gpu``): JAX arrays in and out, CuPy arrays through a
DLPack-only wrapper, ``torch``/``cupy``/``jax.numpy.from_dlpack`` of a
DeviceArray (zero-copy), the read-only flag.

Run the GPU part: ``python -m pytest -q -m gpu tests/test_dlpack.py``
"""

from __future__ import annotations

import contextlib
import ctypes
import doctest
import gc
import os
import types
import weakref

# JAX preallocates 75% of the GPU by default: keep it from starving cuDNN's
# workspace (must be set before JAX starts its GPU client).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mucudnn as mu  # noqa: E402
import mucudnn.api.convolution as api_convolution  # noqa: E402
import mucudnn.cuda.dlpack as dl  # noqa: E402
import mucudnn.exec.kernel as exec_kernel  # noqa: E402
from mucudnn.cuda import DeviceArray  # noqa: E402
from mucudnn.exec.arrays import framework_for, inspect_array  # noqa: E402
from mucudnn.problem import ConvProblem, Direction  # noqa: E402

from conv_support import convolution_for, normal_tensors, problems  # noqa: E402
from reference import reference, rel_err  # noqa: E402
from test_call_path import PointerBackend, _plan  # noqa: E402


#: NumPy reads versioned (DLPack 1.x) capsules from 2.1 on.
needs_versioned_numpy = pytest.mark.skipif(
    np.lib.NumpyVersion(np.__version__) < "2.1.0", reason="NumPy < 2.1 reads legacy capsules only")


pytestmark = pytest.mark.usefixtures("cache_off")


class DLPackOnly:
    """A producer that speaks nothing but DLPack: it hands the wrapped array's
    capsule on and records the arguments it was asked with."""

    def __init__(self, array):
        self.array = array
        self.asked: list[dict] = []

    def __dlpack__(self, **kwargs):
        self.asked.append(kwargs)
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class OldProducer(DLPackOnly):
    """A DLPack < 1.0 producer: ``__dlpack__`` takes ``stream`` only."""

    def __dlpack__(self, *, stream=None):
        self.asked.append({"stream": stream})
        return self.array.__dlpack__()


# -- a producer built from ctypes, counting its deleter's calls ----------------------------------

_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                   ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_DELETER_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CountingProducer:
    """Hands out one capsule over ``array``'s memory (legacy or versioned) whose
    deleter counts its calls; the capsule has no destructor of its own."""

    def __init__(self, array: np.ndarray, versioned: bool = True, flags: int = 0,
                 device: tuple[int, int] = (dl.kDLCPU, 0), major: int = 1):
        self.array = array
        self.calls: list[int] = []
        self._deleter = _DELETER_T(self.calls.append)   # kept: C holds its address
        self._shape = (ctypes.c_int64 * array.ndim)(*array.shape)
        self._strides = (ctypes.c_int64 * array.ndim)(
            *(s // array.itemsize for s in array.strides))
        self.managed = (dl.DLManagedTensorVersioned if versioned else dl.DLManagedTensor)()
        if versioned:
            self.managed.version.major, self.managed.version.minor = major, 0
            self.managed.flags = flags
        t = self.managed.dl_tensor
        t.data = array.ctypes.data
        t.device.device_type, t.device.device_id = device
        t.ndim = array.ndim
        code, bits = dl.dlpack_dtype(array.dtype)
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
        self.managed.deleter = ctypes.cast(self._deleter, ctypes.c_void_p).value
        self.address = ctypes.addressof(self.managed)
        self.capsule = _PyCapsule_New(self.address,
                                      b"dltensor_versioned" if versioned else b"dltensor", None)
        self.device = device

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return self.device


# -- dlpack.h ------------------------------------------------------------------------------------

@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="dlpack.h offsets of 64-bit ABIs")
def test_struct_layout_matches_dlpack_h():
    off = lambda s, f: getattr(s, f).offset  # noqa: E731
    assert ctypes.sizeof(dl.DLDevice) == 8 and ctypes.sizeof(dl.DLDataType) == 4
    assert ctypes.sizeof(dl.DLPackVersion) == 8
    assert ctypes.sizeof(dl.DLTensor) == 48
    assert [off(dl.DLTensor, f) for f in ("data", "device", "ndim", "dtype", "shape", "strides",
                                          "byte_offset")] == [0, 8, 16, 20, 24, 32, 40]
    assert ctypes.sizeof(dl.DLManagedTensor) == 64
    assert [off(dl.DLManagedTensor, f) for f in ("dl_tensor", "manager_ctx", "deleter")] == \
        [0, 48, 56]
    assert ctypes.sizeof(dl.DLManagedTensorVersioned) == 80
    assert [off(dl.DLManagedTensorVersioned, f) for f in
            ("version", "manager_ctx", "deleter", "flags", "dl_tensor")] == [0, 8, 16, 24, 32]
    assert (dl.READ_ONLY, dl.IS_COPIED) == (1, 2)
    assert (dl.kDLCPU, dl.kDLCUDA, dl.kDLCUDAHost, dl.kDLCUDAManaged) == (1, 2, 3, 13)


def test_type_codes_round_trip_every_supported_dtype():
    for name in mu.cuda.SUPPORTED_DTYPES:
        code, bits = dl.dlpack_dtype(name)
        assert dl.dtype_from_dlpack(code, bits) == name
    assert dl.dlpack_dtype("bfloat16") == (dl.kDLBfloat, 16)
    assert dl.dlpack_dtype("float32") == (dl.kDLFloat, 32)
    assert dl.dlpack_dtype("bool") == (dl.kDLBool, 8)
    assert dl.dtype_from_dlpack(dl.kDLFloat, 32, lanes=4) is None
    assert dl.dtype_from_dlpack(dl.kDLFloat, 8) is None   # an fp8: no mucudnn name
    assert dl.dtype_from_dlpack(10, 8) is None            # kDLFloat8_e4m3fn


def test_module_doctests():
    result = doctest.testmod(dl)
    assert result.attempted > 0 and result.failed == 0


# -- import: capsules consumed once --------------------------------------------------------------

@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_the_deleter_runs_exactly_once(versioned):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = CountingProducer(a, versioned=versioned)
    t = dl.import_capsule(p, None)
    used = "used_dltensor_versioned" if versioned else "used_dltensor"
    assert f'"{used}"' in repr(p.capsule)            # renamed: consumed
    assert (t.ptr, t.shape, t.strides, t.dtype) == (a.ctypes.data, (3, 4), (4, 1), "float32")
    assert t.device == (dl.kDLCPU, 0) and t.versioned is versioned and not t.readonly
    assert p.calls == []
    t.close()
    assert p.calls == [p.address]
    t.close()
    del t
    gc.collect()
    assert p.calls == [p.address]
    with pytest.raises(BufferError, match="consumed already"):
        dl.consume_capsule(p.capsule)


def test_the_deleter_runs_when_the_owner_is_collected():
    p = CountingProducer(np.ones(5, np.float64))
    t = dl.import_capsule(p, None)
    del t
    gc.collect()
    assert p.calls == [p.address]


def test_flags_and_versions_are_read():
    a = np.ones((2, 2), np.float32)
    t = dl.import_capsule(CountingProducer(a, flags=dl.READ_ONLY | dl.IS_COPIED), None)
    assert t.readonly and t.copied
    t.close()
    p = CountingProducer(a, major=2)
    with pytest.raises(BufferError, match="DLPack 2.0"):
        dl.import_capsule(p, None)
    assert p.calls == [p.address]  # refused, and given back


def test_an_old_producer_is_asked_again_without_max_version():
    a = np.arange(6.0).reshape(2, 3)
    old = OldProducer(a)
    t = dl.import_capsule(old, None)
    assert old.asked == [{"stream": None}]
    assert (t.ptr, t.shape, t.dtype) == (a.ctypes.data, (2, 3), "float64")
    new = DLPackOnly(a)
    dl.import_capsule(new, None).close()
    assert new.asked == [{"stream": None, "max_version": dl.MAX_VERSION}]


def test_the_stream_handed_to_dlpack_follows_the_protocol():
    a = np.ones(3, np.float32)
    for asked, sent in ((None, None), (0, 1), (1, 1), (-1, -1), (0x7F00, 0x7F00)):
        p = DLPackOnly(a)
        with contextlib.suppress(Exception):  # NumPy takes stream=None only
            dl.import_capsule(p, asked)
        assert p.asked[0]["stream"] == sent


# -- export: capsules our consumers read --------------------------------------------------------

@pytest.mark.parametrize("version", [pytest.param((1, 1), marks=needs_versioned_numpy),
                                     pytest.param((1, 0), marks=needs_versioned_numpy), None],
                         ids=["v1.1", "v1.0", "legacy"])
def test_numpy_reads_our_export_zero_copy(version):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    cap = dl.export_capsule(a, a.ctypes.data, a.shape, a.dtype, (dl.kDLCPU, 0), version=version)
    name = "dltensor" if version is None else "dltensor_versioned"
    assert f'"{name}"' in repr(cap)
    b = np.from_dlpack(dl._HostExport(cap))
    assert b.ctypes.data == a.ctypes.data and b.shape == a.shape
    assert b.flags.writeable is (version is not None)  # NumPy: legacy imports are read-only
    np.testing.assert_array_equal(b, a)


def test_the_exported_memory_lives_until_the_consumer_lets_go():
    class Keep:
        pass

    a = np.arange(8.0)
    live = len(dl._exports)
    keep = Keep()
    ref = weakref.ref(keep)
    b = np.from_dlpack(dl._HostExport(dl.export_capsule(keep, a.ctypes.data, a.shape,
                                                         a.dtype, (dl.kDLCPU, 0))))
    del keep
    gc.collect()
    assert ref() is not None        # the view holds the managed tensor
    del b
    gc.collect()
    assert ref() is None            # the consumer called our deleter
    keep2 = Keep()
    ref2 = weakref.ref(keep2)
    cap = dl.export_capsule(keep2, a.ctypes.data, a.shape, a.dtype, (dl.kDLCPU, 0))
    del keep2, cap                  # never consumed: the capsule's destructor deletes
    gc.collect()
    assert ref2() is None and len(dl._exports) == live


@needs_versioned_numpy
def test_a_read_only_export_is_flagged_or_refused():
    a = np.arange(4.0)
    cap = dl.export_capsule(a, a.ctypes.data, a.shape, a.dtype, (dl.kDLCPU, 0), readonly=True)
    assert not np.from_dlpack(dl._HostExport(cap)).flags.writeable
    t = dl.consume_capsule(dl.export_capsule(a, a.ctypes.data, a.shape, a.dtype,
                                             (dl.kDLCPU, 0), readonly=True))
    assert t.readonly
    with pytest.raises(BufferError, match="read-only"):
        dl.export_capsule(a, a.ctypes.data, a.shape, a.dtype, (dl.kDLCPU, 0), readonly=True,
                          version=None)


def test_torch_reads_our_export_zero_copy():
    torch = pytest.importorskip("torch")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for version in ((1, 0), None):
        cap = dl.export_capsule(a, a.ctypes.data, a.shape, a.dtype, (dl.kDLCPU, 0),
                                version=version)
        t = torch.from_dlpack(cap)
        assert t.data_ptr() == a.ctypes.data and tuple(t.shape) == (2, 3)
        assert t.tolist() == a.tolist()


def _device_array(a: np.ndarray, readonly: bool = False) -> DeviceArray:
    """A DeviceArray over host memory (never dereferenced: no GPU here)."""
    return DeviceArray._from_parts(a.ctypes.data, a.shape, a.dtype, 0, readonly=readonly,
                                   keep=a)


def test_device_array_dlpack_arguments():
    a = np.zeros((2, 3), np.float32)
    d = _device_array(a)
    assert d.__dlpack_device__() == (dl.kDLCUDA, 0)
    with pytest.raises(BufferError, match="dl_device"):
        d.__dlpack__(stream=-1, dl_device=(dl.kDLCPU, 0))
    with pytest.raises(BufferError, match="never copies"):
        d.__dlpack__(stream=-1, copy=True)
    ro = _device_array(a, readonly=True)
    with pytest.raises(BufferError, match="read-only"):
        ro.__dlpack__(stream=-1)
    # stream=-1: no ordering, so no device is needed
    t = dl.consume_capsule(ro.__dlpack__(stream=-1, max_version=(1, 0),
                                         dl_device=(dl.kDLCUDA, 0), copy=False))
    assert t.readonly and t.versioned and t.device == (dl.kDLCUDA, 0)
    assert (t.ptr, t.shape, t.dtype, t.strides) == (a.ctypes.data, (2, 3), "float32", (3, 1))
    t = dl.consume_capsule(d.__dlpack__(stream=-1))
    assert not t.versioned and not t.readonly
    d.close()
    with pytest.raises(ValueError, match="closed"):
        d.__dlpack__(stream=-1)


def test_dlpack_errors_are_mucudnn_errors_and_buffer_errors():
    import pickle

    err = pickle.loads(pickle.dumps(dl.DLPackError("x")))
    assert isinstance(err, mu.MucudnnError) and isinstance(err, BufferError) and str(err) == "x"


@pytest.mark.parametrize("asked,declared", [((1, 0), (1, 0)), ((1, 1), (1, 1)), ((1, 7), (1, 1)),
                                            ((2, 0), (1, 1)), ((0, 8), None), (None, None)])
def test_the_declared_version_never_exceeds_the_consumers(asked, declared):
    assert dl._export_version(asked) == declared


# -- the deferred release queue (Note [DLPack lifetimes]) ----------------------------------------

class FakeEvent:
    """An event whose completion the test decides."""

    log: list[tuple] = []

    def __init__(self, timing=True):
        self.done = False
        self.closed = False

    def record(self, stream):
        FakeEvent.log.append(("record", stream))
        return self

    def query(self):
        return self.done

    def synchronize(self):
        FakeEvent.log.append(("synchronize", self))
        self.done = True

    def close(self):
        self.closed = True


@pytest.fixture
def fake_events(monkeypatch):
    dl.release_all()  # real entries a GPU test may have left
    monkeypatch.setattr(dl, "Event", FakeEvent)
    monkeypatch.setattr(dl, "is_capturing", lambda stream: False)
    monkeypatch.setattr(dl, "using_device", lambda device: contextlib.nullcontext())
    FakeEvent.log = []
    dl._pending.clear()
    yield
    dl._pending.clear()


def _cuda_owner() -> tuple[dl.ImportedTensor, CountingProducer]:
    p = CountingProducer(np.ones(2, np.float32), device=(dl.kDLCUDA, 0))
    return dl.import_capsule(p, -1), p


def test_release_waits_for_the_work_and_the_queue_is_bounded(fake_events):
    t, p = _cuda_owner()
    dl.release_after(42, [t, None])
    assert FakeEvent.log == [("record", 42)] and dl.pending_releases() == 1
    assert p.calls == []                       # the work may still be running
    event = dl._pending[0][0]
    dl.release_after(42, [])
    assert p.calls == []
    event.done = True
    t2, p2 = _cuda_owner()                     # an import reaps what completed
    assert p.calls == [p.address] and event.closed and dl.pending_releases() == 0
    producers = [p2]
    dl.release_after(7, [t2])
    for _ in range(dl._MAX_PENDING + 5):
        o, q = _cuda_owner()
        producers.append(q)
        dl.release_after(7, [o])
    assert dl.pending_releases() == dl._MAX_PENDING
    synced = [e for e in FakeEvent.log if e[0] == "synchronize"]
    assert len(synced) == 6                    # the oldest ones, waited for
    assert [len(q.calls) for q in producers] == [1] * 6 + [0] * dl._MAX_PENDING
    dl.release_all()
    assert all(len(q.calls) == 1 for q in producers) and dl.pending_releases() == 0


def test_reaping_goes_in_queue_order(fake_events):
    (t1, p1), (t2, p2) = _cuda_owner(), _cuda_owner()
    dl.release_after(1, [t1])
    dl.release_after(2, [t2])
    first, second = (entry[0] for entry in dl._pending)
    second.done = True
    dl.release_after(3, [])
    assert p1.calls == [] and p2.calls == [] and dl.pending_releases() == 2
    first.done = True
    dl.release_after(3, [])
    assert p1.calls == [p1.address] and p2.calls == [p2.address]
    assert dl.pending_releases() == 0


def test_host_owners_are_released_at_once(fake_events):
    p = CountingProducer(np.ones(2, np.float32))
    dl.release_after(42, [dl.import_capsule(p, None)])
    assert p.calls == [p.address] and FakeEvent.log == [] and dl.pending_releases() == 0


def test_owners_are_released_at_once_inside_a_capture(fake_events, monkeypatch):
    monkeypatch.setattr(dl, "is_capturing", lambda stream: True)
    t, p = _cuda_owner()
    dl.release_after(42, [t])
    assert p.calls == [p.address] and FakeEvent.log == []


# -- host arrays through DLPack on the NumPy backend --------------------------------------------

P = ConvProblem((5, 3, 7, 7), (4, 3, 3, 3), padding=1, stride=(1, 2))


def _conv(p=P, backend="numpy"):
    return convolution_for(p, backend=backend, policy="powerOfTwo", workspace_limit=1 << 20)


@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
def test_a_dlpack_only_wrapper_equals_the_numpy_call(direction):
    x, w, y = normal_tensors(P, np.random.default_rng(1))
    conv = _conv()
    call = {Direction.FORWARD: conv.forward, Direction.BACKWARD_DATA: conv.backward_data,
            Direction.BACKWARD_FILTER: conv.backward_filter}[direction]
    a, b = {Direction.FORWARD: (x, w), Direction.BACKWARD_DATA: (y, w),
            Direction.BACKWARD_FILTER: (x, y)}[direction]
    wa, wb = DLPackOnly(a), DLPackOnly(b)
    got = call(wa, wb)
    assert type(got) is np.ndarray                 # the wrapper has no from_dlpack
    np.testing.assert_array_equal(got, call(a, b))
    assert rel_err(got, reference(P, direction, x, w, y)) < 1e-5
    assert wa.asked and all(k.get("stream") is None for k in wa.asked + wb.asked)


def test_an_output_given_through_dlpack_is_written_in_place():
    x, w, y = normal_tensors(P, np.random.default_rng(2))
    conv = _conv()
    prior = y.copy()
    out = DLPackOnly(prior)
    r = conv.forward(DLPackOnly(x), DLPackOnly(w), out, alpha=2.0, beta=0.5)
    assert r is out
    assert rel_err(prior, reference(P, "forward", x, w, y, 2.0, 0.5)) < 1e-5
    r = conv.forward(OldProducer(x), OldProducer(w))
    assert rel_err(r, reference(P, "forward", x, w, y)) < 1e-5
    # An output behind a legacy capsule is written where NumPy imports it writable
    # (NumPy 2 does not: a legacy capsule cannot say so)
    legacy = OldProducer(np.zeros(P.output_shape, np.float32))
    if np.from_dlpack(OldProducer(np.zeros(1))).flags.writeable:
        assert conv.forward(x, w, legacy) is legacy
        assert rel_err(legacy.array, reference(P, "forward", x, w, y)) < 1e-5
    else:
        with pytest.raises(ValueError, match="^y: the output is read-only as NumPy imports it"):
            conv.forward(x, w, legacy)
        assert not legacy.array.any()


def test_cpu_torch_tensors_in_torch_tensors_out():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x, w, _ = normal_tensors(P, np.random.default_rng(3))
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    conv = _conv()
    y = conv.forward(tx, tw)
    assert isinstance(y, torch.Tensor) and y.device.type == "cpu"
    want = F.conv2d(tx.double(), tw.double(), stride=P.stride, padding=P.padding)
    assert rel_err(y.numpy(), want.numpy()) < 1e-5
    out = torch.full(P.output_shape, float("nan"))
    assert conv.forward(tx, tw, out) is out
    torch.testing.assert_close(out, y, rtol=0, atol=0)
    dx = conv.backward_data(y, tw)
    assert isinstance(dx, torch.Tensor)
    assert rel_err(dx.numpy(), reference(P, "backward_data", x, w, y.numpy())) < 1e-5
    y2 = mu.conv2d(tx, tw, stride=P.stride, padding=P.padding, backend="numpy")
    assert isinstance(y2, torch.Tensor) and rel_err(y2.numpy(), want.numpy()) < 1e-5
    with pytest.raises(TypeError, match="^x: NumPy cannot take this Tensor.*gradient"):
        conv.forward(tx.clone().requires_grad_(True), tw)
    with pytest.raises(TypeError, match="^w: NumPy cannot take this Tensor through DLPack"):
        conv.forward(tx, tw.bfloat16())


@pytest.mark.parametrize("versioned", [pytest.param(True, marks=needs_versioned_numpy), False],
                         ids=["versioned", "legacy"])
def test_host_imports_through_a_call_give_the_capsules_back(versioned):
    x, w, _ = normal_tensors(P, np.random.default_rng(4))
    px, pw = CountingProducer(x, versioned), CountingProducer(w, versioned)
    y = _conv().forward(px, pw)
    gc.collect()
    assert px.calls == [px.address] and pw.calls == [pw.address]
    assert rel_err(y, reference(P, "forward", x, w, None)) < 1e-5


@settings(max_examples=25, deadline=None)
@given(p=problems(), data=st.data())
def test_random_problems_through_dlpack_equal_the_numpy_call(p, data):
    seed = data.draw(st.integers(0, 2**16))
    x, w, y = normal_tensors(p, np.random.default_rng(seed))
    conv = convolution_for(p, backend="numpy", policy="undivided")
    np.testing.assert_array_equal(conv.forward(DLPackOnly(x), DLPackOnly(w)), conv.forward(x, w))
    np.testing.assert_array_equal(conv.backward_filter(DLPackOnly(x), DLPackOnly(y)),
                                  conv.backward_filter(x, y))


# -- the errors, each naming its argument ------------------------------------------------------

class OnDevice(DLPackOnly):
    def __init__(self, array, device):
        super().__init__(array)
        self.device = device

    def __dlpack_device__(self):
        return self.device


class BrokenDevice(DLPackOnly):
    def __dlpack_device__(self):
        raise RuntimeError("no device")


def _immutable_type():
    cls = type("ArrayImpl", (DLPackOnly,), {})
    cls.__module__ = "jaxlib.xla_extension"    # what JAX's arrays report
    return cls


def test_errors_name_the_argument():
    x, w, y = normal_tensors(P, np.random.default_rng(5))
    conv = _conv()
    ro = y.copy()
    ro.flags.writeable = False
    cases = [
        ((DLPackOnly(x.astype(np.float64)), w), ValueError, r"^x: expected dtype float32"),
        ((x, DLPackOnly(np.ones((2, 2), np.float32))), ValueError, r"^w: expected shape"),
        ((x, OnDevice(w, (dl.kDLROCM, 0))), TypeError, r"^w: a DLPack array in ROCm memory"),
        ((x, OnDevice(w, (99, 0))), TypeError, r"^w: a DLPack array in device type 99 memory"),
        ((BrokenDevice(x), w), TypeError, r"^x: its __dlpack_device__\(\) is not usable"),
        ((x, w, DLPackOnly(ro)), (TypeError, ValueError), r"^y: "),  # NumPy < 2.1: no export
        ((x, w, _immutable_type()(y.copy())), ValueError, r"^y: JAX arrays are immutable"),
    ]
    for args, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            conv.forward(*args)
    if np.lib.NumpyVersion(np.__version__) >= "2.1.0":
        with pytest.raises(ValueError, match="^y: the output is read-only as NumPy imports it"):
            conv.forward(x, w, DLPackOnly(ro))


def test_a_cuda_dlpack_array_on_a_host_backend_is_refused():
    x, w, _ = normal_tensors(P, np.random.default_rng(6))
    px = CountingProducer(x, device=(dl.kDLCUDA, 0))
    pw = CountingProducer(w, device=(dl.kDLCUDA, 0))
    with pytest.raises(TypeError, match="^x: the numpy backend takes NumPy arrays"):
        _conv().forward(px, pw)
    gc.collect()
    assert px.calls == [px.address] and pw.calls == [pw.address]
    with pytest.raises(TypeError, match=r"^x is a NumPy array but w is a device array"):
        _conv(backend=PointerBackend()).forward(x, CountingProducer(w, device=(dl.kDLCUDA, 0)))
    with pytest.raises(TypeError, match=r"^x is host memory \(DLPackOnly\) but w is a device"):
        _conv(backend=PointerBackend()).forward(DLPackOnly(x),
                                                CountingProducer(w, device=(dl.kDLCUDA, 0)))


# -- a CUDA DLPack producer through the device call path (a fake pointer backend) ---------------

class FakeCuda(DLPackOnly):
    """A 'CUDA' producer over host memory: capsules say kDLCUDA (device 0); the
    PointerBackend computes through the pointers."""

    def __init__(self, array, flags=0):
        super().__init__(array)
        self.flags = flags
        self.producers: list[CountingProducer] = []

    def __dlpack__(self, **kwargs):
        self.asked.append(kwargs)
        p = CountingProducer(self.array, device=(dl.kDLCUDA, 0), flags=self.flags)
        self.producers.append(p)
        return p.capsule

    def __dlpack_device__(self):
        return (dl.kDLCUDA, 0)


@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
def test_cuda_dlpack_arrays_run_zero_copy_and_are_released_after_the_work(direction,
                                                                           monkeypatch):
    be = PointerBackend()
    released = []

    def release_after(stream, owners, device=None):
        released.append((stream, device, [o.closed for o in owners]))
        for o in owners:
            o.close()

    monkeypatch.setattr(api_convolution, "release_after", release_after)
    monkeypatch.setattr(exec_kernel, "is_capturing", lambda stream: False)  # fake streams
    p = P
    conv = mu.Convolution(p.x_shape, p.w_shape, stride=p.stride, padding=p.padding, backend=be,
                          cache=False, plans={direction: _plan(p, direction, (2, 2, 1))})
    call = {Direction.FORWARD: conv.forward, Direction.BACKWARD_DATA: conv.backward_data,
            Direction.BACKWARD_FILTER: conv.backward_filter}[direction]
    x, w, y = normal_tensors(p, np.random.default_rng(7))
    a, b = {Direction.FORWARD: (x, w), Direction.BACKWARD_DATA: (y, w),
            Direction.BACKWARD_FILTER: (x, y)}[direction]
    shape = {Direction.FORWARD: p.output_shape, Direction.BACKWARD_DATA: p.x_shape,
             Direction.BACKWARD_FILTER: p.w_shape}[direction]
    out = np.full(shape, np.nan, np.float32)
    fa, fb, fo = FakeCuda(a), FakeCuda(b), FakeCuda(out)
    assert call(fa, fb, fo) is fo
    assert rel_err(out, reference(p, direction, x, w, y)) < 1e-5
    for f in (fa, fb, fo):  # asked once, on the home stream, for a 1.x capsule
        assert f.asked == [{"stream": 1000, "max_version": dl.MAX_VERSION}]
    launch = be.launches[-1]
    assert launch[0] == 1000
    assert {launch[1], launch[2], launch[3]} == {a.ctypes.data, b.ctypes.data, out.ctypes.data}
    # released once, after the launch, on the stream it ran on; not before
    assert released == [(1000, 0, [False, False, False])]
    assert all(q.calls == [q.address] for f in (fa, fb, fo) for q in f.producers)
    with pytest.raises(ValueError, match=r"is read-only \(its producer set the READ_ONLY"):
        call(FakeCuda(a), FakeCuda(b), FakeCuda(out, flags=dl.READ_ONLY))
    with pytest.raises(ValueError, match="IS_COPIED"):
        call(FakeCuda(a), FakeCuda(b), FakeCuda(out, flags=dl.IS_COPIED))
    with pytest.raises(ValueError, match="expected shape"):
        call(FakeCuda(a[:1]), FakeCuda(b), FakeCuda(out))
    assert len(released) == 1  # refused calls released their imports, queued nothing


def test_cuda_dlpack_info_and_framework():
    a = np.zeros((2, 3, 4), np.float32)
    f = FakeCuda(a)
    info = inspect_array("x", f, stream=5)
    assert (info.kind, info.framework, info.ptr, info.shape, info.dtype, info.device) == \
        ("cai", "dlpack", a.ctypes.data, (2, 3, 4), "float32", 0)
    assert info.contiguous and info.nbytes == a.nbytes and info.source is f
    assert f.asked[0]["stream"] == 5
    fw = framework_for(info)
    assert fw.name == "dlpack" and fw.stream(info) is None
    info.owner.close()
    t = FakeCuda(np.zeros((4, 3), np.float32).T)  # a transposed view: strides (1, 3)
    assert not inspect_array("w", t).contiguous
    unit = FakeCuda(np.zeros((3, 4), np.float32)[::2][:1])  # an extent-1 axis: any stride
    assert inspect_array("w", unit).contiguous


def test_results_come_back_in_the_callers_kind():
    ns = types.SimpleNamespace(from_dlpack=lambda r: ("adopted", r))

    class WithNamespace(DLPackOnly):
        def __array_namespace__(self, api_version=None):
            return ns

    fw = framework_for(inspect_array("x", WithNamespace(np.ones(2))))
    like = inspect_array("x", WithNamespace(np.ones(2)))
    assert fw.adopt(like, "r") == ("adopted", "r")
    assert fw.adopt(inspect_array("x", DLPackOnly(np.ones(2))), "r") == "r"
    assert framework_for(inspect_array("x", np.ones(2))).adopt(None, "r") == "r"


# -- on the GPU -----------------------------------------------------------------------------------

GP = ConvProblem((8, 16, 12, 12), (32, 16, 3, 3), padding=1, math="fma")
FMA_TOL = 1e-5


def _jax_gpu():
    jax = pytest.importorskip("jax")
    # JAX's first use initialises every GPU and leaves the last one current on
    # this thread (seen on a two-GPU H200 host): put back the device that was
    # current, which the Convolutions below take as theirs, so that they and
    # JAX's first GPU are the same device.
    before = mu.cuda.current_device() if mu.cuda.device_count() else None
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        devices = []
    if before is not None:
        mu.cuda.set_device(before)
    if not devices:
        pytest.skip("JAX sees no GPU")
    return jax


@pytest.mark.gpu
@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
def test_jax_arrays_in_jax_arrays_out(direction):
    jax = _jax_gpu()
    x, w, y = normal_tensors(GP, np.random.default_rng(10))
    conv = convolution_for(GP, workspace_limit=8 << 20)
    call = {Direction.FORWARD: conv.forward, Direction.BACKWARD_DATA: conv.backward_data,
            Direction.BACKWARD_FILTER: conv.backward_filter}[direction]
    a, b = {Direction.FORWARD: (x, w), Direction.BACKWARD_DATA: (y, w),
            Direction.BACKWARD_FILTER: (x, y)}[direction]
    gpu = jax.devices("gpu")[0]
    ja, jb = jax.device_put(a, gpu), jax.device_put(b, gpu)
    assert not isinstance(ja, np.ndarray)
    r = call(ja, jb)
    assert isinstance(r, jax.Array) and r.devices() == {gpu}
    assert rel_err(np.asarray(r), reference(GP, direction, x, w, y)) < FMA_TOL
    # temporaries dropped right after the call: their memory is held until the work is done
    r2 = call(jax.device_put(a, gpu) * 1.0, jax.device_put(b, gpu) * 1.0)
    assert rel_err(np.asarray(r2), reference(GP, direction, x, w, y)) < FMA_TOL
    conv.backend.synchronize()
    dl.release_all()
    assert dl.pending_releases() == 0
    with pytest.raises(ValueError, match="JAX arrays are immutable"):
        call(ja, jb, r)


@pytest.mark.gpu
def test_jax_result_matches_torch():
    jax = _jax_gpu()
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x, w, _ = normal_tensors(GP, np.random.default_rng(11))
    conv = convolution_for(GP)
    y = conv.forward(jax.numpy.asarray(x), jax.numpy.asarray(w))
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        want = F.conv2d(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(),
                        padding=GP.padding).cpu().numpy()
    finally:
        torch.backends.cudnn.allow_tf32 = old
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_cupy_arrays_through_a_dlpack_only_wrapper():
    cupy = pytest.importorskip("cupy")
    x, w, y = normal_tensors(GP, np.random.default_rng(12))
    conv = convolution_for(GP)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # the producer's work is on a stream of its own
        cx, cw = cupy.asarray(x), cupy.asarray(w)
        cy = cupy.full(GP.output_shape, cupy.nan, dtype=cupy.float32)
        wx, ww, wy = DLPackOnly(cx), DLPackOnly(cw), DLPackOnly(cy)
        r = conv.forward(wx, ww)
        assert isinstance(r, DeviceArray)  # the wrapper has no from_dlpack of its own
        assert conv.forward(wx, ww, wy) is wy
    home = conv.backend.stream.handle
    assert all(k["stream"] == home for k in wx.asked + ww.asked + wy.asked)
    assert rel_err(r.to_numpy(), reference(GP, "forward", x, w, y)) < FMA_TOL
    conv.backend.synchronize()
    assert rel_err(cupy.asnumpy(cy), reference(GP, "forward", x, w, y)) < FMA_TOL
    dw = conv.backward_filter(DLPackOnly(cx), DLPackOnly(cy))
    assert rel_err(dw.to_numpy(), reference(GP, "backward_filter", x, w, cupy.asnumpy(cy))) \
        < FMA_TOL


@pytest.mark.gpu
def test_torch_from_dlpack_of_a_device_array_is_zero_copy():
    torch = pytest.importorskip("torch")
    h = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = DeviceArray.from_numpy(h)
    t = torch.from_dlpack(a)
    assert t.is_cuda and t.data_ptr() == a.ptr and tuple(t.shape) == h.shape
    np.testing.assert_array_equal(t.cpu().numpy(), h)
    t.mul_(2)                                  # the same memory
    torch.cuda.synchronize()
    np.testing.assert_array_equal(a.to_numpy(), 2 * h)
    del a
    gc.collect()                               # the capsule keeps the memory alive
    np.testing.assert_array_equal(t.cpu().numpy(), 2 * h)


@pytest.mark.gpu
def test_cupy_from_dlpack_of_a_device_array_is_zero_copy():
    cupy = pytest.importorskip("cupy")
    h = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = DeviceArray.from_numpy(h)
    c = cupy.from_dlpack(a)
    assert c.data.ptr == a.ptr and c.shape == h.shape
    np.testing.assert_array_equal(cupy.asnumpy(c), h)


@pytest.mark.gpu
def test_jax_from_dlpack_of_a_device_array_is_zero_copy():
    jax = _jax_gpu()
    h = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = DeviceArray.from_numpy(h)
    j = jax.numpy.from_dlpack(a)
    assert j.unsafe_buffer_pointer() == a.ptr
    np.testing.assert_array_equal(np.asarray(j), h)


@pytest.mark.gpu
def test_a_read_only_device_array_carries_the_flag():
    h = np.ones((4, 4), np.float32)
    a = DeviceArray.from_numpy(h)
    ro = DeviceArray._from_parts(a.ptr, a.shape, a.dtype, a.device, readonly=True, keep=a)
    t = dl.consume_capsule(ro.__dlpack__(max_version=(1, 0)))  # ordered on the legacy stream
    assert t.readonly and t.versioned and t.ptr == a.ptr
    with pytest.raises(BufferError, match="read-only"):
        ro.__dlpack__()
    t = dl.consume_capsule(a.__dlpack__(stream=2, max_version=(1, 0)))  # per-thread stream
    assert not t.readonly


@pytest.mark.gpu
def test_cpu_torch_tensors_on_a_gpu_backend():
    torch = pytest.importorskip("torch")
    x, w, y = normal_tensors(GP, np.random.default_rng(13))
    r = convolution_for(GP).forward(torch.from_numpy(x), torch.from_numpy(w))
    assert isinstance(r, torch.Tensor) and r.device.type == "cpu"
    assert rel_err(r.numpy(), reference(GP, "forward", x, w, y)) < FMA_TOL
