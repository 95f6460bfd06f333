"""PyTorch's own convolution where it beats every plan under the limit.

Note [never slower than native]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Converting a model must never make a layer slower than leaving it alone. So
the first eager call of each convolution signature on a GPU
(:class:`~mucudnn.torch.engine._Warm`) times, per direction, the micro-batched
plan and PyTorch's own cuDNN call (``cudnn.benchmark``: PyTorch's fastest, as
a native model runs it) in one harness: the same tensors, CUDA events on
torch's current stream, alternated, medians. PyTorch's workspace is measured
too: what the caching allocator gives one call at once beyond the call's
outputs (anything the call allocates counts; read without resetting
``torch.cuda``'s peak-memory statistics, Note [measuring without resetting
the peak] in :mod:`.measure`). The direction then runs PyTorch's call where
that workspace fits the same limit (the WR limit, or a WD plan's own share)
and its time is no more than the plan's; otherwise the plan.
:func:`decide` is the rule. Each choice is kept (:data:`MAX_CHOICES`,
``torch.native_choices``) and :func:`mucudnn.torch.report` prints them. Calls
first made under CUDA-graph capture, on the CPU or with an empty batch are not
calibrated (they run the plan), and ``MUCUDNN_TORCH_NATIVE=0`` turns the
comparison off. See Note [host cost of a converted layer] for the layer-level
rule that follows the per-direction one.

Note [host cost of a converted layer]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A converted layer's call passes through Python (the argument checks, the
autograd Function, its backward node, the launchers) where a native one stays
in C++: more host time per step. Where the step is bound by the host (small
batches, fast GPUs), that time is the step's, whatever the GPU saves. So after
the per-direction choices the first call also times, on the host, one forward
and backward through the converted path and through ``torch.nn.functional``'s
(synchronised before each, medians). Only the directions a step runs count:
backward-data where the call's input needs its gradient (a network's first
layer does not run it). Where PyTorch may run all of them (its workspace fits)
and the plans' GPU saving over PyTorch's calls there is no more than that host
cost, the whole layer runs PyTorch's own call
(:func:`settle`), and a converted module whose every signature met is settled
so calls ``torch.nn``'s own ``_conv_forward`` after a check of the call's
signature alone, and in training steps like the ones before without even
that (Note [guarded steps] in :mod:`.step_guard`).

Note [captured steps run the GPU's choice]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The host rules, :func:`settle` per layer and the whole-step trial per model
(Note [the whole-step trial]), weigh what a converted call costs the host on
every eager step. A CUDA graph pays that once, at capture, and its replays
issue no host work per kernel: there only the GPU's time counts. So a call
made under capture runs, per direction, what the GPU comparison chose
(:attr:`Choice.captured`: the plan where it was faster on the GPU and fits,
else PyTorch's call), whichever way the eager steps run. Under the default
search (Note [plans only over the limit]) the two are the same: a direction
that fits runs PyTorch's call unplanned and no host rule moves one over the
limit. They differ under ``MUCUDNN_TORCH_SEARCH=all``, where plans searched
for directions that fit may be faster on the GPU yet lose an eager step to
the host; a captured step then runs them. A capture's convolutions may then
run other algorithms than the eager steps before it, with other rounding.

Note [plans only over the limit]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Searching plans for every convolution is the cold cost of a converted model:
several micro-batch sizes, three directions, each timed. Where PyTorch's own
call fits the limit its fastest algorithm is already known to cuDNN's
benchmark, and a plan's GPU saving there seldom pays for the converted path's
host cost (which the whole-step trial, Note [the whole-step trial], weighs
only after every layer was planned). So by default
(``MUCUDNN_TORCH_SEARCH=over-limit``) the first call of a signature (WR mode)
times PyTorch's call and measures its workspace first, in the directions a
training step runs; each direction where that fits the limit runs PyTorch's
call and no plan is searched for it, so a layer that fits everywhere costs
about what a native one does under ``cudnn.benchmark`` at its first call. Only
the directions over the limit are planned and compared as in Note [never
slower than native] (a first layer's backward-filter, say, while its forward
runs PyTorch's call); a layer is planned whole only where PyTorch cannot run
one of its directions. ``MUCUDNN_TORCH_SEARCH=all`` searches every direction
of every convolution (plans may still beat PyTorch's call where it fits, at
the first step's cost).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any, Callable, Optional

import torch

from ..caches import LRU
from ..problem import Direction, Plan, transposed_spatial
from . import settings
from .measure import host_ms, probe, random_operand, time_ms, workspace_of
from .torch_calls import (benchmark_flags, native_backward, native_forward,
                          native_transposed, on_step_thread)

__all__ = ["Choice", "Record", "MAX_CHOICES", "decide", "settle", "fits", "fits_in_step",
           "skipped", "all_in_step", "output_padding",
           "torch_first", "on_step_thread", "to_plan", "within_limit",
           "records", "record", "calibrate", "native_forward", "native_backward",
           "native_transposed"]

log = logging.getLogger("mucudnn")

#: Bound of the kept choices (one record per convolution signature).
MAX_CHOICES = 512

MUCUDNN = "mucudnn"
TORCH = "torch"


@dataclasses.dataclass(frozen=True)
class Choice:
    """What runs one direction of one signature, and why.

    ``runs``: ``"mucudnn"`` (the plan) or ``"torch"`` (PyTorch's own call).
    ``plan_ms`` / ``torch_ms``: their times in one harness (None where not
    measured); ``torch_workspace``: PyTorch's measured workspace bytes (None:
    unknown); ``limit``: the bytes it was held to (None: no limit).
    """

    direction: Direction
    runs: str
    plan_ms: Optional[float]
    torch_ms: Optional[float]
    torch_workspace: Optional[int]
    limit: Optional[int]
    reason: str
    #: what the GPU comparison chose where a host rule (:func:`settle`) overrode it;
    #: None: ``runs`` (Note [captured steps run the GPU's choice])
    on_gpu: Optional[str] = None

    @property
    def captured(self) -> str:
        """What runs under CUDA-graph capture (Note [captured steps run the GPU's choice])."""
        return self.on_gpu or self.runs


@dataclasses.dataclass
class Record:
    """One signature's convolution, its plans and its choices."""

    cfg: Any
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    dtype: str
    channels_last: bool
    plans: dict[Direction, Plan]
    choices: dict[Direction, Choice]
    #: host ms of one forward and backward: (converted, PyTorch's); None: not timed
    host: Optional[tuple[float, float]] = None
    #: the first call's input needed its gradient: a training step runs backward-data
    #: (the forward, for a transposed layer)
    need_dx: bool = True
    #: the layer is a transposed convolution, whose forward is the problem's
    #: backward-data (Note [transposed convolutions] in :mod:`.transposed`)
    transposed: bool = False
    #: wall seconds of the first call's comparison (PyTorch's calls measured, their
    #: benchmarks included), and of the part that searched and timed plans; None:
    #: not timed (Note [first-call seconds])
    first_s: Optional[float] = None
    plan_s: Optional[float] = None
    #: every direction a step runs launches a stand-in (``plans``) until a later
    #: call measures PyTorch's and plans (Note [planning after the first step] in
    #: :mod:`.standin`)
    standin: bool = False
    #: wall seconds of that later call's measuring, search and comparison; None: none ran
    deferred_s: Optional[float] = None

    @property
    def skip(self) -> Optional[Direction]:
        """The direction a training step does not run (:func:`skipped`)."""
        return skipped(self.need_dx, self.transposed)


_RECORDS: "LRU[tuple, Record]" = LRU("torch.native_choices", MAX_CHOICES)


def torch_first(limit: Optional[int], skip: Optional[Direction],
                measure: Callable[[Direction], tuple[float, Optional[int]]]
                ) -> Optional[dict[Direction, Choice]]:
    """See Note [plans only over the limit]: PyTorch's call in every direction a
    step runs (all but ``skip``: :func:`skipped`), its time and workspace from
    ``measure(direction)`` (:func:`~mucudnn.torch.measure.probe` of that direction's call on a GPU; a
    RuntimeError: PyTorch cannot run it). A direction whose workspace fits
    ``limit`` runs PyTorch's call, no plan searched; one over it (or whose
    workspace cannot be measured) is to be planned (:func:`to_plan`), and a
    direction a step does not run is planned at its first use. None where
    PyTorch cannot run a direction: the layer is then planned and compared whole.

    >>> c = torch_first(8 << 20, Direction.BACKWARD_DATA, lambda d: (0.5, 1 << 20))
    >>> [x.runs for x in c.values()], to_plan(c, Direction.BACKWARD_DATA)
    (['torch', 'mucudnn', 'torch'], [])
    >>> big = lambda d: (0.5, 9 << 20 if d is Direction.BACKWARD_FILTER else 0)
    >>> c = torch_first(8 << 20, None, big)
    >>> [x.runs for x in c.values()], [d.value for d in to_plan(c, None)]
    (['torch', 'torch', 'mucudnn'], ['backward_filter'])
    """
    choices: dict[Direction, Choice] = {}
    for d in Direction:
        if d is skip:
            choices[d] = unrun(d, limit)
            continue
        try:
            t, ws = measure(d)
        except RuntimeError as exc:
            log.info("mucudnn.torch: PyTorch's own %s not measured: %s", d.value, exc)
            return None
        if not within_limit(ws, limit):
            choices[d] = Choice(d, MUCUDNN, None, t, ws, limit,
                                "PyTorch's workspace is over the limit (or not measured): "
                                "to be planned")
        else:
            choices[d] = Choice(d, TORCH, None, t, ws, limit,
                                "PyTorch's call fits the limit; no plan searched")
    return choices


def unrun(direction: Direction, limit: Optional[int]) -> Choice:
    """The choice of a direction a training step does not run (:func:`skipped`)."""
    return Choice(direction, MUCUDNN, None, None, None, limit,
                  "not run by a training step (the input needs no gradient); planned at its "
                  "first use")


def to_plan(choices: dict[Direction, Choice], skip: Optional[Direction]) -> list[Direction]:
    """The directions of :func:`torch_first`'s ``choices`` that a step runs (all
    but ``skip``) and PyTorch's call does not fit: the ones to plan and compare."""
    return [d for d, c in choices.items() if d is not skip and c.runs == MUCUDNN]


def records() -> list[Record]:
    """The kept records, least recently made first."""
    return _RECORDS.values()


def record(key: tuple) -> Optional[Record]:
    """The kept record of the signature ``key`` (None: none kept)."""
    return _RECORDS.peek(key)


def decide(direction: Direction, plan_ms: Optional[float], torch_ms: Optional[float],
           torch_workspace: Optional[int], limit: Optional[int]) -> Choice:
    """See Note [never slower than native]: PyTorch's call where its workspace is
    known and within ``limit`` and it is no slower than the plan.

    >>> decide(Direction.FORWARD, 1.0, 0.5, 1 << 20, 64 << 20).runs
    'torch'
    >>> decide(Direction.FORWARD, 1.0, 0.5, 128 << 20, 64 << 20).reason
    "PyTorch's workspace 128.0 MiB is over the limit 64.0 MiB"
    >>> decide(Direction.FORWARD, 0.4, 0.5, 0, None).runs
    'mucudnn'
    """
    def mib(n: int) -> str:
        return f"{n / 2**20:.1f} MiB"

    if torch_ms is None or plan_ms is None:
        return Choice(direction, MUCUDNN, plan_ms, torch_ms, torch_workspace, limit,
                      "not compared")
    if torch_workspace is None:
        return Choice(direction, MUCUDNN, plan_ms, torch_ms, None, limit,
                      "PyTorch's workspace could not be measured")
    if limit is not None and torch_workspace > limit:  # torch_workspace is measured here
        return Choice(direction, MUCUDNN, plan_ms, torch_ms, torch_workspace, limit,
                      f"PyTorch's workspace {mib(torch_workspace)} is over the limit {mib(limit)}")
    if torch_ms <= plan_ms:
        return Choice(direction, TORCH, plan_ms, torch_ms, torch_workspace, limit,
                      "PyTorch's call is no slower and fits the limit")
    return Choice(direction, MUCUDNN, plan_ms, torch_ms, torch_workspace, limit,
                  "the plan is faster")


def within_limit(workspace: Optional[int], limit: Optional[int]) -> bool:
    """Whether a measured ``workspace`` is within ``limit`` (None: no limit); an
    unmeasured one (None) is not.

    >>> within_limit(1 << 20, 1 << 20), within_limit(1 << 20, None), within_limit(None, None)
    (True, True, False)
    """
    return workspace is not None and (limit is None or workspace <= limit)


def fits(choice: Choice) -> bool:
    """Whether PyTorch's call was timed for ``choice`` and its measured workspace
    is within the choice's limit (the plan may not have been searched: Note
    [plans only over the limit]).

    >>> fits(decide(Direction.FORWARD, 1.0, 2.0, 1 << 20, 64 << 20))
    True
    >>> fits(decide(Direction.FORWARD, 1.0, 2.0, None, 64 << 20))
    False
    """
    return choice.torch_ms is not None and within_limit(choice.torch_workspace, choice.limit)


def skipped(need_dx: bool, transposed: bool = False) -> Optional[Direction]:
    """The direction of a layer's problem that a training step does not run:
    the one that gives the layer's input its gradient, where that input needs
    none (``need_dx`` false); None where every direction runs. That is
    backward-data for a convolution, and the problem's forward for a
    transposed convolution, whose own forward is its problem's backward-data
    (Note [transposed convolutions] in :mod:`.transposed`).

    >>> skipped(False), skipped(True), skipped(False, transposed=True)
    (<Direction.BACKWARD_DATA: 'backward_data'>, None, <Direction.FORWARD: 'forward'>)
    """
    if need_dx:
        return None
    return Direction.FORWARD if transposed else Direction.BACKWARD_DATA


def all_in_step(flags: "tuple[bool, bool, bool]", skip: Optional[Direction]) -> bool:
    """Whether per-direction ``flags`` (in :class:`Direction`'s order) hold in
    every direction a training step runs (all but ``skip``); read on every
    call of a converted layer not settled yet, so without iterating the enum.

    >>> all_in_step((True, False, True), Direction.BACKWARD_DATA)
    True
    >>> all_in_step((True, False, True), None), all_in_step((False, True, True), Direction.FORWARD)
    (False, True)
    """
    if skip is Direction.FORWARD:
        return flags[1] and flags[2]
    if skip is Direction.BACKWARD_DATA:
        return flags[0] and flags[2]
    return flags[0] and flags[1] and flags[2]


def _run(choices: dict[Direction, Choice], skip: Optional[Direction]) -> list[Choice]:
    """The choices of the directions a training step runs (all but ``skip``)."""
    return [c for d, c in choices.items() if d is not skip]


def fits_in_step(choices: dict[Direction, Choice], skip: Optional[Direction]) -> bool:
    """Whether PyTorch's call was timed and fits its limit in every direction of
    ``choices`` a training step runs (:func:`fits`; all but ``skip``): a layer
    that may run PyTorch's call whole (Note [host cost of a converted layer],
    Note [the whole-step trial]).

    >>> c = {d: decide(d, 1.0, 2.0, 0, None) for d in Direction}
    >>> fits_in_step(c, None)
    True
    """
    return all(fits(c) for c in _run(choices, skip))


def _may_settle(choices: dict[Direction, Choice], skip: Optional[Direction]) -> bool:
    """Whether :func:`settle` could move a layer with ``choices`` to PyTorch's
    call: a plan runs in a direction a step runs, and PyTorch's call fits in
    all of them."""
    return any(c.runs == MUCUDNN for c in _run(choices, skip)) and fits_in_step(choices, skip)


def settle(choices: dict[Direction, Choice], host: Optional[tuple[float, float]],
           skip: Optional[Direction] = None) -> dict[Direction, Choice]:
    """See Note [host cost of a converted layer]: PyTorch's call in every
    direction that runs (all but ``skip``: :func:`skipped`) where its
    workspace fits in all of them and the plans' GPU saving there is no more
    than the converted path's extra host time ``host[0] - host[1]``; else
    ``choices`` unchanged. A direction that does not run keeps its choice
    where PyTorch's workspace does not fit it.

    >>> f = lambda d, p, t: decide(d, p, t, 0, None)
    >>> c = {d: f(d, 0.10, 0.12) for d in Direction}
    >>> [x.runs for x in settle(c, (0.30, 0.15)).values()]
    ['torch', 'torch', 'torch']
    >>> [x.runs for x in settle(c, (0.20, 0.15)).values()]
    ['mucudnn', 'mucudnn', 'mucudnn']
    >>> [x.captured for x in settle(c, (0.30, 0.15)).values()]  # the GPU's choice
    ['mucudnn', 'mucudnn', 'mucudnn']
    >>> c[Direction.BACKWARD_DATA] = f(Direction.BACKWARD_DATA, 0.10, 0.20)
    >>> [x.runs for x in settle(c, (0.20, 0.15), Direction.BACKWARD_DATA).values()]
    ['torch', 'torch', 'torch']
    """
    if host is None or not _may_settle(choices, skip):
        return choices
    saving = 0.0
    for c in _run(choices, skip):
        if c.runs == MUCUDNN and c.torch_ms is not None and c.plan_ms is not None:
            saving += c.torch_ms - c.plan_ms
    extra = host[0] - host[1]
    if saving <= 0 or saving > extra:
        return choices
    why = (f"the plans save {saving:.3f} ms of GPU time, less than the converted call's "
           f"{extra:.3f} ms of extra host time")
    return {d: dataclasses.replace(c, runs=TORCH, reason=why, on_gpu=c.runs)
            if c.runs == MUCUDNN and fits(c) else c for d, c in choices.items()}


# Note [first-call seconds]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# A converted model's first step costs more than a native one's by what its
# first calls add: PyTorch's calls measured (their cudnn.benchmark runs there,
# and a step's own call then finds it done) and, in the directions over the
# limit, the plans' search and their comparison. Each record keeps the wall
# seconds of both (``first_s``) and of the second alone (``plan_s``), which
# end with the device synchronised by the timings, so that
# :func:`mucudnn.torch.report` can say what a cold first step paid for
# without a profiler. A first call that runs stand-ins measures nothing: its
# ``plan_s`` is what choosing them took, and the later call that replaces
# them keeps both and adds its own seconds as ``deferred_s``.
def calibrate(key: tuple, conv: Any, x: torch.Tensor, w: torch.Tensor, y_shape: tuple,
              cfg: Any, fmt: Any, launch: dict[Direction, Callable[..., Any]], ws: Any,
              stream: Callable[[], int], limit: Optional[int], deterministic: bool, tf32: bool,
              step: Optional[Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]] = None,
              need_dx: bool = True, transposed: bool = False,
              standin: Optional[Callable[[Optional[Direction]], Optional[Record]]] = None
              ) -> Record:
    """Time each direction's plan (``launch``: the kernels' launchers) and
    PyTorch's own call on the call's ``x`` and ``w`` (output ``y_shape``), measure PyTorch's
    workspace, decide (Note [never slower than native]) and keep the record
    under ``key``. ``step(x, w, cfg)``: a forward through the converted path,
    host-timed with its backward against PyTorch's (Note [host cost of a
    converted layer]; ``need_dx``: whether the call's input needs its gradient).
    ``transposed``: the layer is a transposed convolution of this problem (its
    input is the problem's output, its forward the problem's backward-data,
    and ``step(dy, w, cfg)`` its forward; Note [transposed convolutions]).
    ``standin(skip)``: a record of stand-ins in every direction but ``skip``,
    measuring nothing (None: measure and plan now); the signature's next
    calibration replaces it (Note [planning after the first step] in
    :mod:`.standin`)."""
    start = time.perf_counter()
    old = _RECORDS.peek(key)
    # a record of stand-ins, which this call replaces (See Note [planning after the first step])
    replaced = old if old is not None and old.standin else None
    skip = skipped(need_dx, transposed)
    if replaced is None and old is not None and old.plans == conv.plans:
        if step is not None and old.host is None:
            dy = random_operand(y_shape, x.dtype, x.device, fmt)  # See Note [random operands of our own]
            _settle_host(old, step, x, w, dy, cfg, deterministic, tf32)
        return old
    stood = None if replaced is not None or standin is None else standin(skip)
    if stood is not None:
        return _keep(key, stood, None, start, None)
    # x and w are the call's own operands (read only); outputs are scratch
    y = torch.empty(y_shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    dy = random_operand(y_shape, x.dtype, x.device, fmt)  # See Note [random operands of our own]
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    theirs = {
        Direction.FORWARD: lambda: native_forward(x, w, cfg, deterministic, tf32),
        Direction.BACKWARD_DATA: lambda: native_backward(dy, x, w, cfg, True, False,
                                                         deterministic, tf32)[0],
        Direction.BACKWARD_FILTER: lambda: native_backward(dy, x, w, cfg, False, True,
                                                           deterministic, tf32)[1],
    }
    def step_thread(d: Direction, fn: Callable[[], Any]) -> Any:
        return on_step_thread(d, x.device, fn)  # Note [PyTorch's benchmark cache is per thread]

    first = None
    if not cfg.plans and settings.search() == "over-limit":  # Note [plans only over the limit]
        # timed on the call that measures its workspace: reported, not compared
        first = torch_first(limit, skip, lambda d: step_thread(d, lambda: probe(theirs[d])))
        if first is not None and not to_plan(first, skip):
            rec = Record(cfg, tuple(x.shape), tuple(w.shape), str(x.dtype).replace("torch.", ""),
                         fmt is not torch.contiguous_format, {}, first, need_dx=need_dx,
                         transposed=transposed)
            log.info("mucudnn.torch: %s runs PyTorch's call (it fits the limit; no plan "
                     "searched)", conv.problem.key())
            return _keep(key, rec, replaced, start, 0.0)
    # every direction, or only those over the limit (the others keep PyTorch's call)
    planned = list(Direction) if first is None else to_plan(first, skip)
    planning = time.perf_counter()
    fwd, bd, bf = (launch[d] for d in Direction)
    ours = {
        Direction.FORWARD: lambda: fwd(x.data_ptr(), w.data_ptr(), y.data_ptr(), 1.0, 0.0,
                                       stream(), ws),
        Direction.BACKWARD_DATA: lambda: bd(dx.data_ptr(), w.data_ptr(), dy.data_ptr(), 1.0, 0.0,
                                            stream(), ws),
        Direction.BACKWARD_FILTER: lambda: bf(x.data_ptr(), dw.data_ptr(), dy.data_ptr(), 1.0,
                                              0.0, stream(), ws),
    }
    timed: dict[Direction, tuple[Optional[float], Optional[float], Optional[int]]] = {}
    for d in planned:
        try:
            plan_ms, torch_ms = step_thread(d, functools.partial(time_ms, [ours[d], theirs[d]]))
            timed[d] = (plan_ms, torch_ms,
                        step_thread(d, functools.partial(workspace_of, theirs[d])) if first is None
                        else first[d].torch_workspace)
        except RuntimeError as exc:  # PyTorch cannot run it (or runs out of memory)
            log.info("mucudnn.torch: PyTorch's own %s not compared: %s", d.value, exc)
            timed[d] = (None, None, None)
    plans = dict(conv.plans)  # made by the first launches above
    choices = {}
    for d in Direction:
        if d not in planned:
            assert first is not None
            choices[d] = first[d]
            continue
        plan = plans.get(d)
        cap = plan.workspace_bytes if (cfg.plans and plan is not None) else limit
        choices[d] = decide(d, timed[d][0], timed[d][1], timed[d][2], cap)
    rec = Record(cfg, tuple(x.shape), tuple(w.shape), str(x.dtype).replace("torch.", ""),
                 fmt is not torch.contiguous_format, plans, choices, need_dx=need_dx,
                 transposed=transposed)
    if step is not None:
        _settle_host(rec, step, x, w, dy, cfg, deterministic, tf32)
    _keep(key, rec, replaced, start, time.perf_counter() - planning)
    for c in rec.choices.values():
        log.info("mucudnn.torch: %s %s runs %s (plan %s ms, PyTorch %s ms, its workspace %s): %s",
                 conv.problem.key(), c.direction.value, c.runs, _ms(c.plan_ms), _ms(c.torch_ms),
                 c.torch_workspace, c.reason)
    return rec


def _keep(key: tuple, rec: Record, replaced: Optional[Record], start: float,
          plan_s: Optional[float]) -> Record:
    """Keep ``rec`` under ``key`` with its seconds since ``start`` (Note
    [first-call seconds]): its ``first_s`` and ``plan_s`` (``plan_s``: the
    part that searched and timed plans; None: ``rec``'s own), or, where it
    replaces the stand-ins of ``replaced``, theirs and ``deferred_s``."""
    end = time.perf_counter()
    if replaced is not None:
        rec.first_s, rec.plan_s, rec.deferred_s = replaced.first_s, replaced.plan_s, end - start
    else:
        rec.first_s = end - start
        if plan_s is not None:
            rec.plan_s = plan_s
    _RECORDS.put(key, rec)
    return rec


_CONV = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d,
         5: torch.nn.functional.conv3d}
_CONV_TRANSPOSE = {3: torch.nn.functional.conv_transpose1d,
                   4: torch.nn.functional.conv_transpose2d,
                   5: torch.nn.functional.conv_transpose3d}


def _settle_host(rec: Record, step: Callable[..., Any], x: torch.Tensor, w: torch.Tensor,
                 dy: torch.Tensor, cfg: Any, deterministic: bool, tf32: bool) -> None:
    """Time ``rec``'s layer on the host and :func:`settle` its choices (Note
    [host cost of a converted layer])."""
    if _may_settle(rec.choices, rec.skip):  # else the host timing changes nothing
        rec.host = _host_pair(step, x, w, dy, cfg, deterministic, tf32, rec.transposed)
        rec.choices = settle(rec.choices, rec.host, rec.skip)


def output_padding(x_shape: tuple, y_shape: tuple, w_shape: tuple, cfg: Any) -> list[int]:
    """The ``output_padding`` of the transposed convolution whose input is the
    output (``y_shape``) of the convolution ``cfg`` of ``x_shape`` and whose
    output is ``x_shape``: what the stride leaves of ``x``'s spatial sizes
    beyond the least input with that output (Note [transposed convolutions]).

    >>> from collections import namedtuple
    >>> C = namedtuple("C", "stride padding dilation")
    >>> output_padding((1, 1, 8, 7), (1, 1, 4, 4), (1, 1, 3, 3), C((2, 2), (1, 1), (1, 1)))
    [1, 0]
    """
    least = transposed_spatial(y_shape[2:], w_shape[2:], cfg.stride, cfg.padding, cfg.dilation,
                               (0,) * len(cfg.stride))
    return [x - s for x, s in zip(x_shape[2:], least)]


def _host_pair(step: Callable[..., Any], x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor,
               cfg: Any, deterministic: bool, tf32: bool,
               transposed: bool = False) -> Optional[tuple[float, float]]:
    """Host ms of one forward and backward: ``step(x, w, cfg)`` (the converted path)
    and ``torch.nn.functional``'s convolution (Note [host cost of a converted
    layer]); None where either fails. For a transposed layer, ``step(dy, w,
    cfg)`` and ``torch.nn.functional``'s transposed convolution, with the
    gradient ``x``."""
    if transposed:  # its input is the problem's dy, its output gradient x-shaped
        x, dy = dy, x
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    pad = output_padding(dy.shape, x.shape, w.shape, cfg) if transposed else None

    def ours() -> Any:
        return torch.autograd.grad(step(xr, wr, cfg), (xr, wr), dy)

    def theirs() -> Any:
        with benchmark_flags(deterministic, tf32):
            if pad is not None:
                y = _CONV_TRANSPOSE[x.dim()](xr, wr, None, cfg.stride, cfg.padding, pad,
                                             cfg.groups, cfg.dilation)
            else:
                y = _CONV[x.dim()](xr, wr, None, cfg.stride, cfg.padding, cfg.dilation,
                                   cfg.groups)
            return torch.autograd.grad(y, (xr, wr), dy)

    try:
        with torch.enable_grad():
            return host_ms(ours), host_ms(theirs)
    except RuntimeError as exc:
        log.info("mucudnn.torch: host cost not compared: %s", exc)
        return None


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}"


def clear() -> None:
    """Forget every choice (the next first call of a signature compares again)."""
    _RECORDS.clear()
