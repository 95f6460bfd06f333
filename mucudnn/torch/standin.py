"""Stand-in plans: a converted model's first step without the plans' search.

Note [planning after the first step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A converted model's first training step pays what a native one pays
(PyTorch's ``cudnn.benchmark`` of each convolution, which Note [plans only
over the limit] measures there) plus the search of every direction whose
PyTorch workspace is over the limit: several micro-batch sizes, each a find()
of tens of configurations, then the comparison with PyTorch's call. That
search is what made a converted first step slower than a native one. So a
signature's first call inside a converted model's forward (its step trial's
hooks mark the forward and count it as a step: :func:`begin_step`) runs a
stand-in in each direction over the limit: the whole batch as one call of
the configuration cuDNN's heuristics (mode A) rank first among those whose
workspace fits the limit, or of the best-ranked one that needs no workspace,
whichever ran faster (a find() of at most two configurations, on a twin of
the model's graph backend whose search is cut to that: :func:`twin`). Calls
outside a converted model's forward plan at once. The limit holds from the
first call. The search and the comparison of Note [never slower than native]
run at the signature's first call in a later step, one signature a step
(:func:`due`), so that no step pays for more than one signature's search; a
signature called :data:`STANDIN_CALLS` times before its turn is planned then.
The search's cost is moved, not saved: it is spread over the steps after the
first, and those steps run the stand-ins still left (``tools/zoo_bench.py
--cold-steps`` times each of the first steps). A CUDA graph captured while a
stand-in runs keeps it in its replays, so a warning says so
(:func:`warn_captured`): eager steps before a capture plan them, one
signature each. Backends other than the graph backend,
``MUCUDNN_TORCH_SEARCH=all``, given plans and ``MUCUDNN_TORCH_DEFER=0`` plan
at the first call, in the first step.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import warnings
from typing import Any, Callable, Optional

from ..backends import Backend
from ..backends.cudnn_graph import CudnnGraphBackend
from ..caches import LRU
from ..problem import Direction, Plan
from . import native, settings

__all__ = ["STEPS", "STANDIN_CALLS", "MAX_TWINS", "StandinWarning", "twin", "deferring", "due",
           "begin_step", "end_step", "record", "warn_captured"]

log = logging.getLogger("mucudnn")

#: Steps begun by converted models: each forward of a converted root module
#: (its step trial's pre-hook, :func:`begin_step`); 0 while none has begun.
STEPS = [0]
#: The step in which a stand-in was last replaced by its plans (one a step).
_REPLACED_AT = [0]
#: Calls after which a stand-in is replaced whatever the steps (Note [planning
#: after the first step]).
STANDIN_CALLS = 64
#: Bound of the twin backends kept (one per configured graph backend and device).
MAX_TWINS = 4

_TWINS: "LRU[tuple, Backend]" = LRU("torch.standin_backends", MAX_TWINS)


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


def twin(backend: Backend) -> Optional[Backend]:
    """The backend that finds ``backend``'s stand-ins: a graph backend on the
    same device whose find() times heuristics mode A's best-ranked fitting
    configuration and the best-ranked one needing no workspace, nothing else
    (Note [planning after the first step]); None for other backends. Its
    search differs from ``backend``'s, so its benchmark-cache entries and plans
    are its own (Note [candidate sets in keys] in :mod:`mucudnn.backends.base`)."""
    if not isinstance(backend, CudnnGraphBackend):
        return None
    opts = dataclasses.replace(
        backend.find_options, heuristic_modes=("A",), top_k=1, parity=False, retime=0,
        carry=False, fold=False, split=False, pair=False, rtc="none", search="heuristics",
        skip_ratio=None, zero="each")
    key = (type(backend).__name__, backend.device, backend.find_workspace_limit, opts)
    return _TWINS.get_or_create(key, lambda: CudnnGraphBackend(
        device=backend.device, find_workspace_limit=backend.find_workspace_limit, find=opts))


def deferring(backend: Backend, given_plans: bool) -> bool:
    """Whether a first call on ``backend`` runs stand-ins where it would plan:
    inside a converted model's forward on this thread, under the default
    search, without given plans, on a graph backend, unless
    ``MUCUDNN_TORCH_DEFER=0``."""
    return (getattr(_IN_STEP, "depth", 0) > 0 and not given_plans and settings.defers()
            and settings.search() == "over-limit" and isinstance(backend, CudnnGraphBackend))


def due(made_in: int, calls: int) -> bool:
    """Whether a stand-in made in step ``made_in`` and called ``calls`` times is
    replaced by its plans at this call: the first such call in a later step
    claims that step (one signature a step), or the :data:`STANDIN_CALLS`-th."""
    if STEPS[0] > made_in and _REPLACED_AT[0] != STEPS[0]:
        _REPLACED_AT[0] = STEPS[0]
        return True
    return calls >= STANDIN_CALLS


def record(first: dict[Direction, native.Choice], skip: Optional[Direction],
           make: Callable[[list[Direction]], Optional[dict[Direction, Plan]]],
           shapes: tuple[tuple[int, ...], tuple[int, ...]], dtype: str, cfg: Any,
           channels_last: bool, need_dx: bool, transposed: bool) -> Optional[native.Record]:
    """A first call's record that runs stand-ins (``make(directions)``: their
    plans, launched from now on) in the directions :func:`native.torch_first`'s
    ``first`` leaves to plan; None where ``make`` made none (plan them now).
    Its ``plan_s`` is what the stand-ins took; ``first_s`` is the caller's."""
    start = time.perf_counter()
    plans = make(native.to_plan(first, skip))
    if plans is None:
        return None
    choices = {d: c if d not in plans else dataclasses.replace(
        c, reason="a stand-in (the whole batch, the configuration heuristics rank first that "
        "fits) until a later step plans it; PyTorch's workspace is over the limit")
        for d, c in first.items()}
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
                  "run more eager steps before capturing (each plans one signature; Note "
                  "[planning after the first step] in mucudnn/torch/standin.py)",
                  StandinWarning, stacklevel=3)
    log.info("mucudnn.torch: a CUDA graph captured stand-in plans")
