"""Stand-in plans: a converted model's first step without measuring or searching.

Note [planning after the first step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A native first training step with ``cudnn.benchmark`` times every cuDNN
configuration of each convolution's three directions; that find is most of
its seconds. A converted layer's first call measures the same PyTorch calls
(their time and workspace, Note [plans only over the limit]) and then
searches plans for the directions whose PyTorch workspace is over the limit,
so a converted first step could only be slower than a native one. So a
signature's first call inside a converted model's forward (its step trial's
hooks mark the forward and count it as a step: :func:`begin_step`) measures
and searches nothing: every direction a step runs launches a stand-in, the
whole batch as one call of an untimed configuration within the limit (Note
[untimed stand-ins]). Calls outside a converted model's forward plan at once.
The limit holds from the first call. PyTorch's calls are measured, and the
directions over the limit searched and compared (Note [never slower than
native]), at the signature's first call in a later step: the stand-ins of a
step are replaced over the next :data:`STANDIN_STEPS` steps, an equal share
in each (:func:`due`), so that no later step pays for all of them; two, so
that the three warm-up iterations PyTorch's CUDA-graph documentation runs
before a capture leave no stand-in for it; a signature called
:data:`STANDIN_CALLS` times before its turn is replaced then. The measuring
and searching are moved, not saved: the steps after the first pay them and
run the stand-ins still left (``tools/zoo_bench.py --cold-steps`` times each
of the first steps). A CUDA graph captured while a
stand-in runs keeps it in its replays, so a warning says so
(:func:`warn_captured`). Backends other than the graph backend,
``MUCUDNN_TORCH_SEARCH=all``, given plans and ``MUCUDNN_TORCH_DEFER=0`` plan
at the first call, in the first step.

Note [untimed stand-ins]
~~~~~~~~~~~~~~~~~~~~~~~~
A stand-in is chosen by cuDNN's heuristics alone
(:meth:`~mucudnn.backends.cudnn_graph.CudnnGraphBackend.first_fit`): the
best-ranked configuration of heuristics mode A whose numerics the problem
allows, that compiles nothing at run time and whose finalized plan fits the
limit. One heuristics query and one or a few finalizations a direction, no
buffers filled and nothing timed: a first step that timed its stand-ins would
pay, per direction, a small share of the find it defers. Its plan's times are
0.0 (``extra["untimed"]``), never measurements, and it enters no benchmark
cache. A direction with no such configuration makes the signature plan at
its first call.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Optional

from ..backends import Backend
from ..backends.cudnn_graph import CudnnGraphBackend
from ..caches import LRU
from ..problem import ConvProblem, Direction, MicroBatch, Plan
from . import native, settings

__all__ = ["STEPS", "STANDIN_STEPS", "STANDIN_CALLS", "MAX_TWINS", "StandinWarning", "twin",
           "plan", "deferring", "opened", "due", "reset", "begin_step", "end_step", "record",
           "warn_captured"]

log = logging.getLogger("mucudnn")

#: Steps begun by converted models: each forward of a converted root module
#: (its step trial's pre-hook, :func:`begin_step`); 0 while none has begun.
STEPS = [0]
#: Steps over which stand-ins are replaced by their plans, an equal share each
#: (Note [planning after the first step]).
STANDIN_STEPS = 2
#: Calls after which a stand-in is replaced whatever the steps.
STANDIN_CALLS = 64
#: Bound of the twin backends kept (one per configured graph backend and device).
MAX_TWINS = 4

_TWINS: "LRU[tuple, Backend]" = LRU("torch.standin_backends", MAX_TWINS)
#: The owners (signatures' warm records) whose stand-ins run now.
_OPEN: "weakref.WeakSet[Any]" = weakref.WeakSet()


@dataclasses.dataclass
class _Share:
    """The replacements of the current step (Note [planning after the first step])."""
    step: int = 0  #: the step the share was set for
    left: int = 0  #: replacements left in that step
    peak: int = 0  #: the most stand-ins open at once since none was


_SHARE = _Share()


class StandinWarning(RuntimeWarning):
    """A CUDA graph captured stand-in plans (Note [planning after the first step])."""


_IN_STEP = threading.local()


def begin_step() -> None:
    """Count a converted model's step, begun on this thread (its step trial's
    pre-hook calls this; :func:`end_step` when its forward returns)."""
    STEPS[0] += 1
    _IN_STEP.depth = getattr(_IN_STEP, "depth", 0) + 1


def end_step() -> None:
    """A converted model's forward returned (or raised) on this thread."""
    _IN_STEP.depth = max(0, getattr(_IN_STEP, "depth", 0) - 1)


def twin(backend: Backend) -> Optional[CudnnGraphBackend]:
    """The backend whose Convolutions launch ``backend``'s stand-ins: a graph
    backend on the same device whose search is cut to heuristics mode A's
    best-ranked configurations (for a direction planned only at its first
    use); None for other backends. Its search differs from ``backend``'s, so
    its Convolutions, benchmark-cache entries and plans are its own (Note
    [candidate sets in keys] in :mod:`mucudnn.backends.base`)."""
    if not isinstance(backend, CudnnGraphBackend):
        return None
    opts = dataclasses.replace(
        backend.find_options, heuristic_modes=("A",), top_k=1, parity=False, retime=0,
        carry=False, fold=False, split=False, pair=False, rtc="none", search="heuristics",
        skip_ratio=None, zero="each")
    key = (type(backend).__name__, backend.device, backend.find_workspace_limit, opts)
    made = _TWINS.get_or_create(key, lambda: CudnnGraphBackend(
        device=backend.device, find_workspace_limit=backend.find_workspace_limit, find=opts))
    assert isinstance(made, CudnnGraphBackend)
    return made


def plan(backend: CudnnGraphBackend, problem: ConvProblem, direction: Direction,
         limit: Optional[int], deterministic: bool) -> Optional[Plan]:
    """The stand-in plan of ``problem``'s ``direction`` under ``limit`` bytes
    (Note [untimed stand-ins]): the whole batch in one call of ``backend``'s
    :meth:`~mucudnn.backends.cudnn_graph.CudnnGraphBackend.first_fit`; None
    where no configuration qualifies."""
    perf = backend.first_fit(problem, direction, limit, deterministic)
    if perf is None:
        return None
    call = MicroBatch(0, problem.batch, perf.algo, perf.math_type, perf.workspace_bytes, 0.0)
    return Plan(problem, direction, (call,), perf.workspace_bytes, 0.0, 0.0, limit,
                policy="stand-in", extra={"untimed": True, "backend": backend.name})


def deferring(backend: Backend, given_plans: bool) -> bool:
    """Whether a first call on ``backend`` runs stand-ins: inside a converted
    model's forward on this thread, under the default search, without given
    plans, on a graph backend, unless ``MUCUDNN_TORCH_DEFER=0``."""
    return (getattr(_IN_STEP, "depth", 0) > 0 and not given_plans and settings.defers()
            and settings.search() == "over-limit" and isinstance(backend, CudnnGraphBackend))


def opened(owner: Any) -> None:
    """``owner`` (a signature's warm record) runs stand-ins from now on."""
    _OPEN.add(owner)
    _SHARE.peak = max(_SHARE.peak, len(_OPEN))


def due(owner: Any, made_in: int, calls: int) -> bool:
    """Whether ``owner``'s stand-ins, made in step ``made_in`` and called
    ``calls`` times, are replaced by their plans at this call: while this
    step's share is left (a :data:`STANDIN_STEPS`-th of the most stand-ins
    open at once, rounded up), in a step after ``made_in``; or at the
    :data:`STANDIN_CALLS`-th call. A true answer counts ``owner`` replaced."""
    if calls < STANDIN_CALLS:
        step = STEPS[0]
        if step <= made_in:
            return False
        if _SHARE.step != step:
            _SHARE.step, _SHARE.left = step, -(-_SHARE.peak // STANDIN_STEPS)
        if _SHARE.left <= 0:
            return False
        _SHARE.left -= 1
    _OPEN.discard(owner)
    if not _OPEN:
        _SHARE.peak = 0
    return True


def reset() -> None:
    """Forget the stand-ins open (their records were dropped: ``mucudnn.torch.clear``)."""
    _OPEN.clear()
    _SHARE.step = _SHARE.left = _SHARE.peak = 0


def record(skip: Optional[Direction], make: Callable[[list[Direction]], Optional[dict]],
           shapes: tuple[tuple[int, ...], tuple[int, ...]], dtype: str, cfg: Any,
           channels_last: bool, need_dx: bool, transposed: bool,
           limit: Optional[int]) -> Optional[native.Record]:
    """A first call's record that runs stand-ins (``make(directions)``: their
    plans, launched from now on) in every direction a step runs (all but
    ``skip``), PyTorch's calls not measured; None where ``make`` made none
    (measure and plan now). Its ``plan_s`` is what the stand-ins took;
    ``first_s`` is the caller's."""
    start = time.perf_counter()
    plans = make([d for d in Direction if d is not skip])
    if plans is None:
        return None
    choices = {d: native.unrun(d, limit) if d is skip else native.Choice(
        d, native.MUCUDNN, None, None, None, limit,
        "a stand-in (the whole batch, the configuration heuristics rank first that fits) "
        "until a later step measures PyTorch's call and plans") for d in Direction}
    return native.Record(cfg, shapes[0], shapes[1], dtype, channels_last, dict(plans), choices,
                         need_dx=need_dx, transposed=transposed,
                         plan_s=time.perf_counter() - start, standin=True)


_WARNED = [False]


def warn_captured() -> None:
    """Warn, once a process, that a CUDA graph is capturing a stand-in."""
    if _WARNED[0]:
        return
    _WARNED[0] = True
    warnings.warn("mucudnn.torch: a CUDA graph captures stand-in plans, which its replays keep; "
                  f"run {STANDIN_STEPS + 1} or more eager steps before capturing "
                  "(Note [planning after the first step] in mucudnn/torch/standin.py)",
                  StandinWarning, stacklevel=3)
    log.info("mucudnn.torch: a CUDA graph captured stand-in plans")
