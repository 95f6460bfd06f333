"""Measuring PyTorch's own convolution calls for the comparison of Note [never
slower than native] (:mod:`mucudnn.torch.native`): their GPU time alone, the
host's time to issue them, and the workspace they take from torch's caching
allocator."""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, NamedTuple, Optional

import torch

from ..caches import LRU

__all__ = ["REPEAT", "HOST_REPEAT", "MAX_SPIN", "MAX_GENERATORS", "time_ms", "host_ms",
           "workspace_of", "probe", "random_operand"]

log = logging.getLogger("mucudnn")

#: Timed runs of each side per direction (medians; alternated).
REPEAT = 5
#: Host-timed forward-and-backward calls of each side (Note [host cost of a
#: converted layer] in :mod:`mucudnn.torch.native`).
HOST_REPEAT = 5


# Note [timing the GPU alone]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Events around a call time the GPU from one event to the next; where the host
# takes longer to issue the call than the GPU takes to run it (small kernels;
# PyTorch's grouped calls take up to 150 us of host time), the GPU waits in
# between and the figure is the host's. The comparisons here are of GPU time:
# the host's share has its own rule (Note [host cost of a converted layer])
# and a CUDA graph does not pay it (Note [captured steps run the GPU's
# choice]). So :func:`time_ms` first holds the stream with a spin kernel
# (``torch.cuda._sleep``) and issues every timed call behind it, so that the
# GPU runs them back to back. Where the spin had ended before the host was
# done issuing (an event recorded after it reads complete), the timing is
# repeated behind a spin twice as long, up to :data:`MAX_SPIN` cycles; the
# length is kept for the next timing.

#: Cycles of the spin before timed calls (doubled where too short; Note [timing the GPU alone]).
_SPIN = [1 << 20]
#: The longest spin: about a tenth of a second at 2 GHz.
MAX_SPIN = 1 << 28


def time_ms(fns: list[Callable[[], Any]], repeat: int = REPEAT) -> list[float]:
    """Median GPU ms of each of ``fns``, alternated on torch's current stream
    behind a spin kernel (one warm-up each first; Note [timing the GPU alone])."""
    for fn in fns:
        fn()
    while True:
        spin = _SPIN[0]
        torch.cuda._sleep(spin)
        held = torch.cuda.Event()
        held.record()
        events: list[list[tuple[Any, Any]]] = [[] for _ in fns]
        for r in range(repeat):
            order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
            for i in order:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fns[i]()
                end.record()
                events[i].append((start, end))
        if not held.query() or spin >= MAX_SPIN:
            break
        _SPIN[0] = spin * 2  # the host issued for longer than the spin held the GPU
    torch.cuda.current_stream().synchronize()
    return [statistics.median(a.elapsed_time(b) for a, b in pairs) for pairs in events]


def host_ms(fn: Callable[[], Any], repeat: int = HOST_REPEAT) -> float:
    """Median host milliseconds of ``fn()`` issued on an idle stream (one
    warm-up first): the time its launches take, not the GPU's."""
    fn()
    times = []
    for _ in range(repeat):
        torch.cuda.current_stream().synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.current_stream().synchronize()
    return statistics.median(times) * 1e3


# Note [outputs as the allocator counts them]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's peak counts blocks, rounded up (to 512 bytes by default), not the
# bytes a tensor asked for; an output's ``nbytes`` subtracted from the peak
# leaves that rounding in the workspace. A call whose workspace meets the
# limit exactly (say beside a 46,464-byte weight gradient, which sits in a
# 46,592-byte block) then reads as over the limit, and the layer runs a plan
# where it could run PyTorch's own call. So the outputs' share is what ``memory_allocated`` drops by when
# they are freed: the allocator's own count. Anything else the call leaves
# allocated still counts as its workspace.
def workspace_of(fn: Callable[[], Any]) -> Optional[int]:
    """Bytes of workspace ``fn()`` takes from torch's allocator beyond its
    outputs: what the allocator gives the call at once over what the call
    returns, each as the allocator counts it (None where torch cannot say).
    torch's peak-memory statistics are left alone
    unless several blocks come and go in the call (See Note [measuring without
    resetting the peak]; Note [never slower than native]; Note [outputs as the
    allocator counts them])."""
    try:
        return _measured(fn)
    except _NO_STATS as exc:
        log.debug("mucudnn.torch: PyTorch's workspace not measured: %s", exc)
        return None


def probe(fn: Callable[[], Any]) -> tuple[float, Optional[int]]:
    """PyTorch's call ``fn`` as Note [plans only over the limit] measures it: once
    to warm up (its ``cudnn.benchmark`` runs there; a RuntimeError there means
    PyTorch cannot run it), then once timed with CUDA events while its
    workspace is measured as :func:`workspace_of` does: (ms, bytes or None). One
    call does both, so a layer's first call costs one PyTorch call per
    direction beyond native's first."""
    fn()
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ws = _measured(fn, (start, end))
        return float(start.elapsed_time(end)), ws
    except _NO_STATS as exc:  # time it alone
        log.debug("mucudnn.torch: PyTorch's workspace not measured: %s", exc)
        return time_ms([fn], 1)[0], None


# Note [measuring without resetting the peak]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's peak-memory statistics are the user's: a converted model measures
# PyTorch's calls inside the user's own steps (the second and third, Note
# [planning after the first step] in :mod:`.standin`), and a reset of the peak
# there would drop whatever peak the user's own reset began to record (a
# training run's, read with ``max_memory_allocated``). So a call's workspace
# is read from the allocator's running totals, which only grow: the bytes
# allocated during the call less what it returns (Note [outputs as the
# allocator counts them]). Where at most one block was freed during the call
# (PyTorch's convolution allocates its outputs, then one workspace that it
# frees), that is exactly the peak over what the call holds after it. Where
# several were, they may not all have been held at once and their sum may
# exceed the peak, so the call runs once more between a reset of the peak and
# a read of it: only then are the statistics touched.
_NO_STATS = (RuntimeError, AttributeError, TypeError, KeyError)


class _Allocated(NamedTuple):
    """torch's allocator on the current device: its allocated bytes now, at
    their peak and in all so far, and the blocks it has freed so far."""
    current: int
    peak: int
    total: int
    freed: int


def _allocated() -> _Allocated:
    """:class:`_Allocated` now: one read of the allocator's nested statistics
    (``memory_allocated()`` and ``max_memory_allocated()`` each flatten all of
    them, and a model's first steps measure every direction of every
    signature)."""
    stats = torch.cuda.memory_stats_as_nested_dict()
    b = stats["allocated_bytes"]["all"]
    return _Allocated(int(b["current"]), int(b["peak"]), int(b["allocated"]),
                      int(stats["allocation"]["all"]["freed"]))


def _call(fn: Callable[[], Any], events: Optional[tuple[Any, Any]] = None
          ) -> tuple[_Allocated, _Allocated, int]:
    """One call of ``fn`` on an idle stream (``events``: CUDA events recorded
    around it): the allocator before it and after it, and the bytes of what it
    returned, as the allocator counts them (freed here)."""
    stream = torch.cuda.current_stream()
    stream.synchronize()
    before = _allocated()
    if events is not None:
        events[0].record()
    out = fn()
    if events is not None:
        events[1].record()
    stream.synchronize()
    after = _allocated()
    del out
    return before, after, after.current - _allocated().current


def _measured(fn: Callable[[], Any], events: Optional[tuple[Any, Any]] = None) -> int:
    """The workspace bytes of one call of ``fn`` on an idle stream
    (:func:`workspace_of`; See Note [measuring without resetting the peak]);
    ``events``: CUDA events (start, end) recorded around it."""
    before, after, kept = _call(fn, events)
    if after.freed - before.freed <= 1:
        return max(0, after.total - before.total - kept)
    torch.cuda.reset_peak_memory_stats()
    before, after, kept = _call(fn)
    return max(0, after.peak - before.current - kept)


# Note [random operands of our own]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A first call's timings need operands that the call does not give: the
# gradient of the output, a transposed layer's problem input. They are drawn
# from generators of mucudnn's own, one per device and seeded alike, never
# from torch's default ones: a draw there would move the user's random stream
# in the steps that measure, so that a converted model's dropout masks and
# augmentations would differ from the native model's under the same seed.
#: Bound of the generators kept (one per device; Note [random operands of our own]).
MAX_GENERATORS = 64
_GENERATORS: "LRU[torch.device, torch.Generator]" = LRU("torch.generators", MAX_GENERATORS)


def random_operand(shape: Any, dtype: torch.dtype, device: torch.device,
                   memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """A standard-normal tensor of ``shape`` in ``memory_format`` for a first
    call's timings, drawn from mucudnn's own generator of ``device`` (See Note
    [random operands of our own]).

    >>> state = torch.get_rng_state()
    >>> random_operand((2, 3), torch.float32, torch.device("cpu")).shape
    torch.Size([2, 3])
    >>> torch.equal(torch.get_rng_state(), state)
    True
    """
    gen = _GENERATORS.get_or_create(
        device, lambda: torch.Generator(device=device).manual_seed(0))
    return torch.randn(shape, dtype=dtype, device=device, generator=gen).contiguous(
        memory_format=memory_format)
