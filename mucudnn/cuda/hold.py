"""Holding a stream while work is queued on it: :func:`holding`.

Note [held timing]
~~~~~~~~~~~~~~~~~~
Events around a call time the GPU from one event to the next. Where the GPU
is idle when the start event is recorded, the figure includes the host's
time to issue the call: for a call of several launches (a split's copies
and chunk calls, Note [split groups]) or a short one (a small micro-batch),
tens of microseconds a launch that a step whose GPU runs behind its host
never pays, so such calls are timed slower than they run there. With
``held=True`` (:func:`~mucudnn.cuda.timing.time_interleaved`) the timed runs
are queued behind a kernel that spins on a flag in pinned host memory until
the host, having issued them all, raises the flag; the GPU then runs them
back to back: its time alone, as ``mucudnn.torch`` times PyTorch's calls
(Note [timing the GPU alone]). This is nvbench's blocking kernel. The kernel
gives up after :data:`HOLD_TIMEOUT_S`, so a block that waits on the held
stream (which it must not) stalls that long rather than for ever, and
:meth:`Hold.timed_out` says so afterwards. A host function
(``cudaLaunchHostFunc``) that waits would need no kernel, but a Python one
takes the GIL on the driver's thread, a known source of deadlocks. Work in
the block must not load modules (lazy loading may wait for the spinning
kernel): the timed runs follow a warm-up.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Iterator

from . import _runtime
from ._runtime import check
from .device import current_device
from .stream import stream_handle

__all__ = ["HOLD_TIMEOUT_S", "Hold", "holding"]

#: Seconds the hold kernel waits for its flag (Note [held timing]).
HOLD_TIMEOUT_S = 1.0

#: The hold kernel: waits until the u64 at ``flag`` reaches ``ticket`` or
#: ``timeout_ns`` pass (%globaltimer), and then, if it timed out, stores
#: ``ticket`` at ``flag + 8``.
_PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry mucudnn_hold(
    .param .u64 flag,
    .param .u64 ticket,
    .param .u64 timeout_ns
)
{
    .reg .pred %p<3>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [ticket];
    ld.param.u64 %rd3, [timeout_ns];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u64 %rd4, %globaltimer;
$L_wait:
    ld.volatile.global.u64 %rd5, [%rd1];
    setp.ge.u64 %p1, %rd5, %rd2;
    @%p1 bra $L_done;
    mov.u64 %rd6, %globaltimer;
    sub.u64 %rd7, %rd6, %rd4;
    setp.lt.u64 %p2, %rd7, %rd3;
    @%p2 bra $L_wait;
    st.volatile.global.u64 [%rd1+8], %rd2;
$L_done:
    ret;
}
"""


class _Device:
    """One device's hold kernel and its two pinned words (the flag, the last
    ticket that timed out), with the tickets handed out so far."""

    def __init__(self) -> None:
        rt, drv = _runtime.get(), _runtime.driver()
        self.host = int(check(rt.cudaHostAlloc(16, rt.cudaHostAllocMapped), "cudaHostAlloc"))
        ctypes.memset(self.host, 0, 16)
        self.device_ptr = int(check(rt.cudaHostGetDevicePointer(self.host, 0),
                                    "cudaHostGetDevicePointer"))
        image = ctypes.create_string_buffer(_PTX)  # NUL-terminated, as cuModuleLoadData reads PTX
        self.module = check(drv.cuModuleLoadData(ctypes.addressof(image)), "cuModuleLoadData")
        self.kernel = check(drv.cuModuleGetFunction(self.module, b"mucudnn_hold"),
                            "cuModuleGetFunction")
        self.flag = ctypes.c_uint64.from_address(self.host)
        self.missed = ctypes.c_uint64.from_address(self.host + 8)
        self.tickets = 0


_DEVICES: dict[int, _Device] = {}
_LOCK = threading.Lock()


def _device(device: int) -> _Device:
    """The hold state of ``device``, made at its first hold (kept for the process)."""
    with _LOCK:
        d = _DEVICES.get(device)
        if d is None:
            d = _DEVICES[device] = _Device()
        return d


class Hold:
    """One hold of a stream (:func:`holding`)."""

    __slots__ = ("_device", "ticket")

    def __init__(self, device: _Device, ticket: int) -> None:
        self._device, self.ticket = device, ticket

    def timed_out(self) -> bool:
        """Whether the hold kernel gave up before the block ended, this hold's
        or a later one's on the device (read once the stream has passed it,
        e.g. after synchronising)."""
        return self._device.missed.value >= self.ticket


@contextlib.contextmanager
def holding(stream=None) -> Iterator[Hold]:
    """Hold ``stream`` while the block queues work on it: that work starts when
    the block ends, back to back (Note [held timing]). The block must not
    wait for the stream's work, nor load modules.

    >>> import mucudnn.cuda as mc                       # doctest: +SKIP
    >>> with mc.holding(stream) as hold:                # doctest: +SKIP
    ...     for _ in range(8):
    ...         launch(stream)
    >>> stream.synchronize(); hold.timed_out()          # doctest: +SKIP
    False
    """
    handle = stream_handle(stream)
    d = _device(current_device())
    with _LOCK:
        d.tickets += 1
        ticket = d.tickets
    values = (ctypes.c_uint64 * 3)(d.device_ptr, ticket, int(HOLD_TIMEOUT_S * 1e9))
    params = (ctypes.c_void_p * 3)(*(ctypes.addressof(values) + 8 * i for i in range(3)))
    drv = _runtime.driver()
    check(drv.cuLaunchKernel(d.kernel, 1, 1, 1, 1, 1, 1, 0, drv.CUstream(handle),
                             ctypes.addressof(params), 0), "cuLaunchKernel")
    try:
        yield Hold(d, ticket)
    finally:
        with _LOCK:  # tickets only rise: a later hold's release frees earlier ones too
            if d.flag.value < ticket:
                d.flag.value = ticket
