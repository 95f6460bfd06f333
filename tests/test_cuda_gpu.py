"""mucudnn.cuda on a real GPU (marker gpu; skipped without one)."""

from __future__ import annotations

import gc
import pickle
import threading
import time

import numpy as np
import pytest

import mucudnn.cuda as mc
from mucudnn.cuda import hold as hold_module

pytestmark = pytest.mark.gpu

MiB = 1 << 20

DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16",
          "float32", "float64"]


def _random(shape, name, rng):
    if name == "bool":
        return rng.random(shape) < 0.5
    if name == "bfloat16":
        bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
        return bits.view(mc.BFLOAT16)
    dt = np.dtype(name)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8)


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


@pytest.fixture(autouse=True)
def _no_leaks():
    gc.collect()
    before = mc.memory_allocated()
    yield
    gc.collect()
    mc.synchronize()
    assert mc.memory_allocated() == before, "a test leaked DeviceArray memory"


# -- devices --------------------------------------------------------------------

def test_device_queries():
    assert mc.device_count() >= 1
    mc.require_device()
    dev = mc.current_device()
    assert 0 <= dev < mc.device_count()
    props = mc.device_properties()
    assert props["name"] and props["name"] == mc.device_name() == mc.device_name(dev)
    assert props["total_memory"] > 1 << 30
    assert props["compute_capability"] >= (7, 0)
    assert props["multiprocessor_count"] > 0
    free, total = mc.mem_get_info()
    assert 0 < free <= total
    assert abs(total - props["total_memory"]) <= 64 * MiB
    mc.set_device(dev)
    with pytest.raises(ValueError):
        mc.set_device(mc.device_count())
    mc.synchronize()


# -- round trips ------------------------------------------------------------------

@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("ndim", [2, 3, 4, 5])
def test_numpy_round_trip(name, ndim):
    rng = np.random.default_rng(ndim * 100 + len(name))
    shape = tuple(int(d) for d in rng.integers(1, 6, size=ndim))
    host = _random(shape, name, rng)
    with mc.DeviceArray.from_numpy(host) as dev:
        assert dev.shape == shape and dev.dtype_name == name
        assert dev.nbytes == host.nbytes and dev.strides == host.strides
        back = dev.to_numpy()
        assert back.shape == shape and back.dtype == host.dtype
        assert np.array_equal(_bits(back), _bits(host))
        # device-to-device copy and an explicit stream
        with mc.Stream() as s:
            other = mc.DeviceArray(shape, name, stream=s)
            other.fill_bytes(0xA5).copy_from(dev)
            assert np.array_equal(_bits(other.to_numpy()), _bits(host))
            other.close()


def test_empty_and_zero_size_arrays():
    a = mc.DeviceArray.from_numpy(np.zeros((0, 3), np.float32))
    assert a.to_numpy().shape == (0, 3)
    a.fill_zero()
    a.close()


def test_fill_zero_nan_and_bytes():
    a = mc.DeviceArray((3, 4), "float32").fill_nan()
    assert np.isnan(a.to_numpy()).all()
    a.fill_zero()
    assert (a.to_numpy() == 0).all()
    b = mc.DeviceArray((5,), "uint8").fill_bytes(7)
    assert (b.to_numpy() == 7).all()
    for name in ("float16", "bfloat16", "float64"):
        c = mc.DeviceArray((4,), name).fill_nan()
        got = c.to_numpy()
        assert (_bits(got) == 0xFF).all()
        if name != "bfloat16":           # bfloat16 may be the ml_dtypes-less placeholder
            assert np.isnan(got).all()
        c.close()
    a.close()
    b.close()


# -- views ------------------------------------------------------------------------

def test_leading_axis_views_write_the_right_rows():
    a = mc.DeviceArray.zeros((8, 3, 4), "float32")
    v = a[2:5]
    assert v.ptr == a.ptr + 2 * 3 * 4 * 4
    v.copy_from(np.ones((3, 3, 4), np.float32))
    a[6].fill_nan()
    a[-1].copy_from(np.full((3, 4), 5, np.float32))
    got = a.to_numpy()
    assert (got[2:5] == 1).all()
    assert np.isnan(got[6]).all()
    assert (got[7] == 5).all()
    assert (got[[0, 1, 5]] == 0).all()
    # micro-batch views in a loop, like the engine makes them
    for off, size in [(0, 3), (3, 3), (6, 2)]:
        a[off:off + size].fill_bytes(off + 1)
    got = a.to_numpy().view(np.uint8).reshape(8, -1)
    assert (got[0:3] == 1).all() and (got[3:6] == 4).all() and (got[6:8] == 7).all()
    a.close()
    with pytest.raises(ValueError, match="closed"):
        v.to_numpy()


def test_view_keeps_parent_alive():
    before = mc.allocation_count()
    a = mc.DeviceArray.from_numpy(np.arange(12, dtype=np.int32).reshape(4, 3))
    v = a[1:3]
    del a
    gc.collect()
    assert mc.allocation_count() == before + 1      # still held by the view
    assert np.array_equal(v.to_numpy(), np.arange(3, 9, dtype=np.int32).reshape(2, 3))
    del v
    gc.collect()
    assert mc.allocation_count() == before


def test_workspace_segments():
    ws = mc.DeviceArray.zeros((1024,), "uint8")
    ws.view_bytes(256, 128).fill_bytes(7)
    ws[512:640].fill_bytes(9)
    got = ws.to_numpy()
    assert (got[256:384] == 7).all() and (got[512:640] == 9).all()
    assert (got[:256] == 0).all() and (got[384:512] == 0).all() and (got[640:] == 0).all()
    r = ws.reshape(4, 256)
    assert r.ptr == ws.ptr and (r.to_numpy()[2, :128] == 9).all()
    ws.close()


def test_not_picklable():
    a = mc.DeviceArray((2,), "float32")
    with pytest.raises(TypeError):
        pickle.dumps(a)
    a.close()


# -- torch interop ------------------------------------------------------------------

def test_zero_copy_import_of_torch_tensor():
    torch = _torch()
    t = torch.arange(24, dtype=torch.float32, device="cuda").reshape(2, 3, 4)
    a = mc.as_device_array(t)
    assert a.ptr == t.data_ptr() and a.shape == (2, 3, 4) and a.dtype_name == "float32"
    assert not a.owns_memory
    assert np.array_equal(a.to_numpy(), t.cpu().numpy())
    # torch writes, we see it
    t.fill_(3.0)
    torch.cuda.synchronize()
    assert (a.to_numpy() == 3).all()
    # we write, torch sees it
    a[1].fill_zero()
    mc.default_stream().synchronize()
    assert t[0].eq(3).all().item() and t[1].eq(0).all().item()
    a.copy_from(np.full((2, 3, 4), 7, np.float32))
    mc.default_stream().synchronize()
    assert t.eq(7).all().item()
    # the import keeps the tensor alive
    ptr = t.data_ptr()
    del t
    gc.collect()
    assert a.ptr == ptr and (a.to_numpy() == 7).all()


def test_torch_tensor_with_storage_offset_and_requires_grad():
    torch = _torch()
    base = torch.arange(40, dtype=torch.float64, device="cuda").reshape(10, 4)
    t = base[3:6]
    a = mc.as_device_array(t)
    assert a.ptr == t.data_ptr() == base.data_ptr() + 3 * 4 * 8
    assert np.array_equal(a.to_numpy(), t.cpu().numpy())
    w = torch.ones(3, 3, device="cuda", requires_grad=True)
    assert mc.as_device_array(w).ptr == w.data_ptr()


def test_bfloat16_torch_tensor_import():
    torch = _torch()
    t = torch.randn(4, 5, device="cuda").to(torch.bfloat16)
    a = mc.as_device_array(t)
    assert a.dtype_name == "bfloat16" and a.ptr == t.data_ptr() and a.shape == (4, 5)
    expected = t.view(torch.int16).cpu().numpy().view(np.uint16)
    assert np.array_equal(a.to_numpy().view(np.uint16), expected)
    assert mc.as_device_array(t, dtype="bfloat16") is not None
    with pytest.raises(ValueError, match="dtype"):
        mc.as_device_array(t, dtype="float16")


@pytest.mark.parametrize("make", ["transpose", "step", "cai_transpose"])
def test_non_contiguous_import_raises(make):
    torch = _torch()
    t = torch.zeros(4, 6, device="cuda")
    if make == "transpose":
        bad = t.t()
    elif make == "step":
        bad = t[::2]
    else:
        class Wrapper:
            __cuda_array_interface__ = t.t().__cuda_array_interface__
        bad = Wrapper()
    with pytest.raises(ValueError, match="contiguous"):
        mc.as_device_array(bad)


def test_cpu_tensor_and_numpy_are_type_errors():
    torch = _torch()
    with pytest.raises(TypeError):
        mc.as_device_array(torch.zeros(3))
    with pytest.raises(TypeError):
        mc.as_device_array(np.zeros(3))
    assert not mc.is_device_array_like(torch.zeros(3))
    assert mc.is_device_array_like(torch.zeros(3, device="cuda"))


def test_torch_consumes_our_interface_zero_copy():
    torch = _torch()
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = mc.DeviceArray.from_numpy(host)
    mc.default_stream().synchronize()
    t = torch.as_tensor(a, device="cuda")
    assert t.data_ptr() == a.ptr and tuple(t.shape) == (3, 4) and t.dtype == torch.float32
    assert np.array_equal(t.cpu().numpy(), host)
    t.mul_(2)
    torch.cuda.synchronize()
    assert np.array_equal(a.to_numpy(), host * 2)
    # a micro-batch view exported to torch
    tv = torch.as_tensor(a[1:3], device="cuda")
    assert tv.data_ptr() == a.ptr + 16 and np.array_equal(tv.cpu().numpy(), host[1:3] * 2)
    del t, tv
    a.close()


def test_generic_interface_import_keeps_owner_alive():
    class Foreign:                      # any producer exposing only the interface
        def __init__(self, arr):
            self.arr = arr
            self.__cuda_array_interface__ = dict(arr.__cuda_array_interface__)

    src = mc.DeviceArray.from_numpy(np.arange(6, dtype=np.int64))
    f = Foreign(src)
    src_ptr = src.ptr
    del src
    imported = mc.as_device_array(f)
    del f
    gc.collect()
    assert imported.ptr == src_ptr and not imported.owns_memory
    assert np.array_equal(imported.to_numpy(), np.arange(6))
    assert mc.as_device_array(imported) is imported


def test_readonly_interface_import():
    src = mc.DeviceArray.from_numpy(np.ones(4, np.float32))

    class ReadOnly:
        __cuda_array_interface__ = {**src.__cuda_array_interface__, "data": (src.ptr, True)}

    ro = mc.as_device_array(ReadOnly())
    assert ro.readonly and (ro.to_numpy() == 1).all()
    with pytest.raises(ValueError, match="read-only"):
        ro.fill_zero()
    src.close()


def test_host_pointer_import_is_refused():
    host = np.zeros(4, np.float32)

    class HostMemory:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (host.ctypes.data, False),
                                    "version": 3, "strides": None, "stream": None}

    with pytest.raises(ValueError, match="not device memory"):
        mc.as_device_array(HostMemory())


@pytest.mark.skipif(mc.device_count() < 2, reason="needs two GPUs")
def test_array_on_another_device_is_refused():
    with mc.using_device(1):
        other = mc.DeviceArray((4,), "float32")
    assert other.device == 1
    mc.set_device(0)

    class OnDevice1:
        __cuda_array_interface__ = other.__cuda_array_interface__

    with pytest.raises(ValueError, match="on device 1, expected 0"):
        mc.as_device_array(OnDevice1())
    other.close()


# -- streams, events, timing ----------------------------------------------------------

def test_time_interleaved_times_each_function_in_turn():
    small, big = mc.DeviceArray((8 * MiB,), "uint8"), mc.DeviceArray((512 * MiB,), "uint8")
    order: list[str] = []
    with mc.Stream() as s:
        def fill(buf, tag):
            def fn():
                order.append(tag)
                buf.fill_bytes(1, stream=s)
            return fn
        t_small, t_big = mc.time_interleaved([fill(small, "s"), fill(big, "b")], s,
                                             warmup=1, repeat=4)
    assert order == ["s", "b"] + ["s", "b"] * 4
    assert len(t_small) == len(t_big) == 4 and all(t > 0 for t in t_small + t_big)
    # 512 MiB cannot be set in less than ~50 us even at 10 TB/s; 64x the bytes
    assert min(t_big) > 0.05 and sorted(t_big)[2] > sorted(t_small)[2]
    small.close()
    big.close()


def test_streams_and_events_time_a_memset():
    buf = mc.DeviceArray((512 * MiB,), "uint8")
    with mc.Stream() as s:
        assert s.handle != 0 and s.device == mc.current_device() and s.owned
        times = mc.time_on_stream(lambda: buf.fill_bytes(1, stream=s), s, warmup=1, repeat=5)
        assert len(times) == 5 and all(t > 0 for t in times)
        # 512 MiB cannot be set in less than ~50 us even at 10 TB/s
        assert min(times) > 0.05
        start, end = mc.Event(), mc.Event()
        start.record(s)
        buf.fill_bytes(2, stream=s)
        end.record(s)
        end.synchronize()
        assert end.query()
        assert mc.Event.elapsed_ms(start, end) > 0
        s.synchronize()
        assert s.query()
        start.close()
        end.close()
    assert s.closed
    assert buf[:16].to_numpy().tolist() == [2] * 16
    buf.close()


def test_stream_ordering_across_streams():
    a = mc.DeviceArray((64 * MiB,), "uint8")
    with mc.Stream() as s1, mc.Stream() as s2:
        a.fill_bytes(1, stream=s1)
        a.fill_bytes(3, stream=s1)
        s2.wait_stream(s1)
        out = a[-8:].to_numpy(stream=s2)
    assert out.tolist() == [3] * 8
    a.close()


def test_default_stream_is_shared_and_not_legacy():
    s = mc.default_stream()
    assert s is mc.default_stream() and s.handle not in (0, 1, 2)
    seen = []
    t = threading.Thread(target=lambda: seen.append(mc.default_stream()))
    t.start()
    t.join()
    assert seen[0] is s


def test_wrap_torch_stream():
    torch = _torch()
    ts = torch.cuda.Stream()
    s = mc.Stream.wrap(ts.cuda_stream)
    assert mc.stream_handle(ts) == s.handle == ts.cuda_stream
    a = mc.DeviceArray((16,), "uint8", stream=s)
    assert a.__cuda_array_interface__["stream"] == ts.cuda_stream
    a.fill_bytes(4)                      # runs on torch's stream
    ts.synchronize()
    assert a.to_numpy().tolist() == [4] * 16
    s.close()                            # not owned: torch's stream survives
    ts.synchronize()
    a.close()


# -- graphs -------------------------------------------------------------------

def test_graph_capture_of_memset_and_memcpy_replays():
    n = 1 << 16
    src = mc.DeviceArray.from_numpy(np.arange(n, dtype=np.float32))
    dst = mc.DeviceArray((n,), "float32").fill_nan()
    s = mc.Stream()
    s.wait_stream(mc.default_stream())
    with mc.CudaGraph.capture(s) as g:
        dst.fill_zero(stream=s)
        dst[: n // 2].copy_from(src[: n // 2], stream=s)
    g.keep(src, dst)
    assert 0.0 < g.instantiate_s < 10.0  # cudaGraphInstantiate's host seconds
    s.synchronize()
    assert np.isnan(dst.to_numpy(stream=s)).all(), "capture must not execute the work"
    g.launch()
    got = dst.to_numpy(stream=s)
    assert np.array_equal(got[: n // 2], np.arange(n // 2, dtype=np.float32))
    assert (got[n // 2:] == 0).all()
    # replays read the buffers as they are at launch time
    src.copy_from(np.full(n, 5, np.float32), stream=s)
    dst.fill_nan(stream=s)
    g.launch(s)
    got = dst.to_numpy(stream=s)
    assert (got[: n // 2] == 5).all() and (got[n // 2:] == 0).all()
    for _ in range(10):
        g.launch(s)
    s.synchronize()
    g.close()
    assert g.closed
    with pytest.raises(ValueError):
        g.launch(s)
    g.close()
    s.close()
    src.close()
    dst.close()


def test_graph_capture_error_discards_and_stream_stays_usable():
    s = mc.Stream()
    a = mc.DeviceArray((256,), "uint8").fill_zero()
    mc.default_stream().synchronize()
    with pytest.raises(RuntimeError, match="boom"):
        with mc.CudaGraph.capture(s):
            a.fill_bytes(9, stream=s)
            raise RuntimeError("boom")
    a.fill_bytes(3, stream=s)
    assert a.to_numpy(stream=s).tolist() == [3] * 256
    s.close()
    a.close()


def test_frees_during_capture_are_deferred():
    s = mc.Stream()
    dst = mc.DeviceArray((1024,), "uint8")
    tmp = mc.DeviceArray((1 * MiB,), "uint8")
    held = mc.memory_allocated()
    with mc.CudaGraph.capture(s) as g:
        dst.fill_bytes(6, stream=s)
        tmp.close()                      # a cudaFree here would invalidate the capture
        assert mc.memory_allocated() == held
    assert mc.memory_allocated() == held - MiB
    g.launch(s)
    assert dst.to_numpy(stream=s).tolist() == [6] * 1024
    g.close()
    s.close()
    dst.close()


def test_legacy_stream_capture_is_refused():
    with pytest.raises(ValueError, match="legacy"):
        with mc.CudaGraph.capture(mc.Stream.wrap(0)):
            pass


# -- leaks and out of memory --------------------------------------------------------

def test_alloc_free_cycles_do_not_leak():
    sizes = [1, 256, 4096, 1 * MiB, 3 * MiB + 5]
    for size in sizes:                   # warm the allocator/context first
        mc.DeviceArray((size,), "uint8").close()
    mc.synchronize()
    live = mc.memory_allocated()
    count = mc.allocation_count()
    free_before, _ = mc.mem_get_info()
    for i in range(10_000):
        size = sizes[i % len(sizes)]
        a = mc.DeviceArray((size,), "uint8")
        if i % 2:
            a.close()                    # deterministic free
        else:
            v = a[: size // 2]
            del a, v                     # finalizer (CPython refcounting)
    gc.collect()
    mc.synchronize()
    free_after, _ = mc.mem_get_info()
    assert mc.memory_allocated() == live
    assert mc.allocation_count() == count
    assert abs(free_after - free_before) <= 4 * MiB


def test_out_of_memory_raises_and_device_stays_usable():
    live = mc.memory_allocated()
    with pytest.raises(mc.CudaOutOfMemoryError) as info:
        mc.DeviceArray((10 << 40,), "uint8")          # 10 TiB
    err = info.value
    assert err.function == "cudaMalloc" and err.error_name == "cudaErrorMemoryAllocation"
    assert str(10 << 40) in str(err)
    assert isinstance(pickle.loads(pickle.dumps(err)), mc.CudaOutOfMemoryError)
    assert mc.memory_allocated() == live
    host = np.arange(1000, dtype=np.float32)
    with mc.DeviceArray.from_numpy(host) as a:
        assert np.array_equal(a.to_numpy(), host)
    mc.synchronize()


@pytest.mark.parametrize("outlasts", [False, True])
def test_holding_queues_the_blocks_work_until_it_ends(monkeypatch, outlasts):
    """See Note [held timing]: what a held block queues runs once the block
    ends, not before, the hold not timed out; a block that outlasts
    HOLD_TIMEOUT_S sees its work run at the timeout, and the hold says so."""
    if outlasts:
        monkeypatch.setattr(hold_module, "HOLD_TIMEOUT_S", 0.05)
    buf = mc.DeviceArray((64 * MiB,), "uint8")
    with mc.Stream() as s:
        done = mc.Event(timing=False)
        with mc.holding(s) as hold:
            buf.fill_bytes(3, stream=s)
            done.record(s)
            time.sleep(0.5 if outlasts else 0.05)
            assert done.query() == outlasts
        s.synchronize()
        assert buf[:16].to_numpy().tolist() == [3] * 16 and hold.timed_out() == outlasts
        done.close()
    buf.close()


def test_held_timing_of_many_launches_returns_their_times():
    small = mc.DeviceArray((4096,), "uint8")
    with mc.Stream() as s:
        def many():
            for _ in range(50):
                small.fill_bytes(1, stream=s)
        times = mc.time_on_stream(many, s, warmup=1, repeat=5, held=True)
        assert len(times) == 5 and all(t > 0 for t in times)
    small.close()
