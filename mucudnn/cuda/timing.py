"""Timing work on a stream with CUDA events: :func:`time_on_stream`,
:func:`time_interleaved` (held: Note [held timing] in mucudnn/cuda/hold.py)."""

from __future__ import annotations

import contextlib
import logging
import time

from .hold import holding
from .stream import Event, as_stream
from ..errors import InvalidValueError

__all__ = ["time_on_stream", "time_interleaved"]

log = logging.getLogger("mucudnn")


def time_on_stream(fn, stream=None, warmup: int = 3, repeat: int = 10,
                   held: bool = False, host: bool = False) -> list[float]:
    """Time ``fn()`` with CUDA events on ``stream``; a list of ``repeat`` times in ms.

    ``fn`` takes no arguments and must queue its work on ``stream`` (it should
    not synchronise the host itself). ``warmup`` untimed calls come first. The
    host synchronises once, at the end. ``held``: the GPU's time alone (Note
    [held timing] in mucudnn/cuda/hold.py). ``host``: each time is at least
    the host's time to issue that call (See Note [the host's share of a find]
    in mucudnn/backends/find_options.py).
    """
    return time_interleaved([fn], stream, warmup=warmup, repeat=repeat, held=held,
                            host=host)[0]


def time_interleaved(fns, stream=None, warmup: int = 3, repeat: int = 10,
                     held: bool = False, host: bool = False) -> list[list[float]]:
    """Time several functions in turn with CUDA events on ``stream``: ``repeat``
    rounds, each running every function once, in order; per function, its list of
    ``repeat`` times in ms.

    Each function is first called ``warmup`` times, untimed. The host
    synchronises once, at the end. Interleaving makes the functions' times
    comparable on a GPU whose clock drifts (Note [interleaved timing] in
    mucudnn/bench.py). ``held``: the timed rounds are queued on the stream
    held (:func:`~mucudnn.cuda.hold.holding`), so that each time is the GPU's
    alone (Note [held timing] in mucudnn/cuda/hold.py). ``host``: each time
    is the larger of the events' and the host's milliseconds in that call
    (See Note [the host's share of a find] in mucudnn/backends/find_options.py).
    """
    warmup, repeat = int(warmup), int(repeat)
    fns = list(fns)
    if warmup < 0 or repeat < 1:
        raise InvalidValueError(f"need warmup >= 0 and repeat >= 1, got warmup={warmup}, repeat={repeat}")
    if not fns:
        raise InvalidValueError("fns: expected at least one function to time, got none")
    s = as_stream(stream)
    for fn in fns:
        for _ in range(warmup):
            fn()
    events = [[(Event(), Event()) for _ in fns] for _ in range(repeat)]
    issued = [[0.0] * len(fns) for _ in range(repeat)]  # host ms per call
    clock = time.perf_counter
    try:
        with holding(s) if held else contextlib.nullcontext() as hold:
            for row, issue in zip(events, issued):
                for i, (fn, (start, end)) in enumerate(zip(fns, row)):
                    start.record(s)
                    t = clock()
                    fn()
                    issue[i] = (clock() - t) * 1e3
                    end.record(s)
        events[-1][-1][1].synchronize()
        if hold is not None and hold.timed_out():
            log.debug("mucudnn: a held timing's hold timed out; its times include the host's")
        gpu = [[Event.elapsed_ms(*row[i]) for row in events] for i in range(len(fns))]
        if not host:
            return gpu
        return [[max(g, issue[i]) for g, issue in zip(gpu[i], issued)] for i in range(len(fns))]
    finally:
        for row in events:
            for start, end in row:
                start.close()
                end.close()
