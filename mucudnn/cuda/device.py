"""Devices: count, selection, name, properties, free/total memory, synchronisation."""

from __future__ import annotations

import contextlib
import functools
import threading

from . import _runtime
from ._runtime import check, make_error
from .errors import NO_DEVICE_MESSAGE, NoDeviceError
from ..errors import InvalidValueError

__all__ = [
    "device_count", "require_device", "current_device", "set_device", "using_device",
    "device_name", "device_properties", "mem_get_info", "synchronize",
]

_ok_lock = threading.Lock()
_device_ok = False


def device_count() -> int:
    """Number of CUDA devices; 0 (never an exception) without a GPU, driver or cuda-bindings."""
    try:
        rt = _runtime.get()
        err, n = rt.cudaGetDeviceCount()
    except Exception:
        return 0
    if int(err) != 0:
        try:
            rt.cudaGetLastError()
        except Exception:
            pass
        return 0
    return int(n)


def require_device() -> None:
    """Raise :class:`NoDeviceError` unless at least one CUDA device is usable.

    Every constructor that touches the device (DeviceArray, Stream, Event, ...)
    calls this first, so the first real use without a GPU fails with one clear
    message that names the underlying runtime error.
    """
    global _device_ok
    if _device_ok:
        return
    rt = _runtime.get()  # raises NoDeviceError without cuda-bindings
    err, n = rt.cudaGetDeviceCount()
    if int(err) != 0:
        exc = make_error(err, "cudaGetDeviceCount")
        if not isinstance(exc, NoDeviceError):
            exc = NoDeviceError("cudaGetDeviceCount", exc.error_name,
                                f"{NO_DEVICE_MESSAGE} ({exc.error_name}: {exc.message})")
        raise exc
    if int(n) == 0:
        raise NoDeviceError("cudaGetDeviceCount", "cudaErrorNoDevice",
                            f"{NO_DEVICE_MESSAGE} (cudaErrorNoDevice: the driver reports 0 devices)")
    with _ok_lock:
        _device_ok = True


def current_device() -> int:
    """The calling thread's current device (cudaGetDevice)."""
    return int(check(_runtime.get().cudaGetDevice(), "cudaGetDevice"))


def set_device(device: int) -> None:
    """Make ``device`` current for the calling thread (cudaSetDevice)."""
    require_device()
    device = int(device)
    n = device_count()
    if not 0 <= device < n:
        raise InvalidValueError(f"device {device} does not exist (this machine has {n} CUDA devices)")
    check(_runtime.get().cudaSetDevice(device), "cudaSetDevice")


@contextlib.contextmanager
def using_device(device: int | None):
    """Context manager: make ``device`` current inside, restore the previous one after.

    ``None`` means "whatever is current" and does nothing.
    """
    if device is None:
        yield
        return
    device = int(device)
    previous = current_device()
    if previous == device:
        yield
        return
    set_device(device)
    try:
        yield
    finally:
        set_device(previous)


def _resolve(device: int | None) -> int:
    require_device()
    return current_device() if device is None else int(device)


@functools.lru_cache(maxsize=None)
def _properties(device: int) -> dict:
    prop = check(_runtime.get().cudaGetDeviceProperties(device), "cudaGetDeviceProperties",
                 f"device {device}")
    name = prop.name
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")

    def get(attr, default=None):
        # Fields come and go between CUDA versions (13 dropped clockRate, ...).
        try:
            return getattr(prop, attr)
        except Exception:
            return default

    return {
        "device": device,
        "name": str(name),
        "total_memory": int(prop.totalGlobalMem),
        "compute_capability": (int(prop.major), int(prop.minor)),
        "multiprocessor_count": int(prop.multiProcessorCount),
        "warp_size": get("warpSize"),
        "max_threads_per_block": get("maxThreadsPerBlock"),
        "max_threads_per_multiprocessor": get("maxThreadsPerMultiProcessor"),
        "shared_memory_per_block": get("sharedMemPerBlock"),
        "shared_memory_per_block_optin": get("sharedMemPerBlockOptin"),
        "shared_memory_per_multiprocessor": get("sharedMemPerMultiprocessor"),
        "registers_per_block": get("regsPerBlock"),
        "l2_cache_size": get("l2CacheSize"),
        "memory_bus_width": get("memoryBusWidth"),
        "ecc_enabled": bool(get("ECCEnabled", False)),
        "integrated": bool(get("integrated", False)),
        "pci_bus_id": get("pciBusID"),
        "pci_device_id": get("pciDeviceID"),
        "pci_domain_id": get("pciDomainID"),
        "unified_addressing": bool(get("unifiedAddressing", False)),
        "managed_memory": bool(get("managedMemory", False)),
        "concurrent_kernels": bool(get("concurrentKernels", False)),
        "async_engine_count": get("asyncEngineCount"),
    }


def device_properties(device: int | None = None) -> dict:
    """A dict of the device's properties (``name``, ``total_memory`` in bytes,
    ``compute_capability`` as ``(major, minor)``, ``multiprocessor_count``, ...).

    Cached per device (a fresh dict each call, so callers may modify it).
    """
    return dict(_properties(_resolve(device)))


def device_name(device: int | None = None) -> str:
    """The device's marketing name, e.g. ``"NVIDIA H100"``."""
    return _properties(_resolve(device))["name"]


def mem_get_info(device: int | None = None) -> tuple[int, int]:
    """``(free, total)`` device memory in bytes (cudaMemGetInfo)."""
    require_device()
    with using_device(device):
        free, total = check(_runtime.get().cudaMemGetInfo(), "cudaMemGetInfo")
    return int(free), int(total)


def synchronize(device: int | None = None) -> None:
    """Wait for all work on the device (cudaDeviceSynchronize)."""
    require_device()
    with using_device(device):
        check(_runtime.get().cudaDeviceSynchronize(), "cudaDeviceSynchronize")
