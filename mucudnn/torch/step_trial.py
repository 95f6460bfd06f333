"""The whole-step trial: a converted model runs its plans only where its
training steps are faster for them.

Note [the whole-step trial]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
Per-layer comparisons (Note [never slower than native], Note [host cost of a
converted layer]) time each convolution alone; a step is more than the sum of
its layers. Where the host issues kernels slower than the GPU runs them, every
microsecond of Python a converted call adds is the step's, and a plan's GPU
saving returns nothing; where the GPU is the bound, the host time hides behind
it. Which of the two holds is a property of the whole step, so the step decides.

:func:`mucudnn.torch.convert` gives the model a :class:`StepTrial` (a forward
pre-hook on the converted root module, shared by its converted layers). Once a
training step (module in training mode, gradients enabled) has passed in which
no layer met a new signature, the trial alternates the next steps between two
ways of running: the plans as the per-layer rules chose them, and PyTorch's own
convolution in every layer whose PyTorch workspace fits the limit in each
direction the step runs (backward-data only where the layer's input needs its
gradient); the others keep their plans, so the limit holds either way. The
hook synchronises the device at each step's start and times from one start to
the next: forward, backward, optimizer and data, as the user's loop runs them.
The first step of each way is a warm-up; after :data:`TRIAL_STEPS` more of
each, the way with the lower median step time is kept, PyTorch's on a tie.
Where the two ways would run the same (no layer whose PyTorch workspace fits
keeps a plan: under the default search, Note [plans only over the limit],
only layers over the limit are planned), nothing is timed and PyTorch's way
is kept at once: a comparison of identical steps would decide on noise. That
is known only once every converted layer has run (its first call decides what
it runs); until then the trial goes on as above.

A new signature met later (another batch size) is compared per layer as
before and then runs the kept way; :func:`mucudnn.torch.clear` starts the trial
again. Steps under CUDA-graph capture, ``torch.compile`` or outside training
are not timed and do not switch ways; a capture runs neither way but each
direction's GPU choice (Note [captured steps run the GPU's choice] in
:mod:`.native`), which its replays keep.
``MUCUDNN_TORCH_NATIVE=0`` turns the trial off with the per-layer comparisons.
The report (:func:`mucudnn.torch.report`) shows the trial's state and times.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Optional

import torch
from torch import nn

from . import engine, settings, standin

__all__ = ["StepTrial", "StepEnd", "TRIAL_STEPS", "trial_of"]

log = logging.getLogger("mucudnn")

#: Timed steps of each way, after its warm-up step (medians compared).
TRIAL_STEPS = 3
_CAPTURING = torch.cuda.is_current_stream_capturing
_COMPILING = torch.compiler.is_compiling

PLANS = "plans"
TORCH = "torch"


class StepTrial:
    """One converted model's trial (Note [the whole-step trial]).

    ``torch``: whether the layers now run PyTorch's own convolution where its
    workspace fits; ``kept``: the way decided (``"plans"``, ``"torch"``) or None
    while the trial runs; ``step_ms``: the timed steps of each way.

    >>> t = StepTrial()
    >>> t.kept, t.torch
    (None, False)
    >>> t.decide({PLANS: [10.0, 10.2, 9.9], TORCH: [9.0, 9.1, 9.3]})
    'torch'
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.generation = engine.GENERATION[0]
        self.calibrations = engine.CALIBRATIONS[0]
        self.torch = False
        self.kept: Optional[str] = None
        self.step_ms: dict[str, list[float]] = {PLANS: [], TORCH: []}
        self._seen = {PLANS: 0, TORCH: 0}
        self._start: Optional[float] = None

    # settled measurements are this process's, not the model's
    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self._reset()

    @staticmethod
    def decide(step_ms: dict[str, list[float]]) -> str:
        """The way with the lower median step time; PyTorch's on a tie."""
        return PLANS if statistics.median(step_ms[PLANS]) < statistics.median(step_ms[TORCH]) \
            else TORCH

    def __call__(self, module: nn.Module, args: Any) -> None:
        """The forward pre-hook: count the step (Note [planning after the first
        step] in :mod:`.standin`), time the step that ended and pick the next one's way."""
        if not _COMPILING():
            standin.begin_step()
        if self.generation != engine.GENERATION[0]:  # mucudnn.torch.clear(): start again
            self._reset()
        if self.kept is not None:
            return
        if not (module.training and torch.is_grad_enabled() and settings.enabled()) \
                or _COMPILING() or not torch.cuda.is_available() or _CAPTURING():
            self._start = None  # this step is not one of the trial's
            return
        if engine.CALIBRATIONS[0] != self.calibrations:  # the last step compared layers
            self.calibrations = engine.CALIBRATIONS[0]
            self._start = None
            self.torch = False
            self._seen = {PLANS: 0, TORCH: 0}  # new signatures: each way warms up again
            return
        if self._start is None and not any(self.step_ms.values()) \
                and _ways_differ(module) is False:
            self.kept, self.torch = TORCH, True  # nothing to compare: the ways are one
            log.info("mucudnn.torch: the step trial keeps torch (no layer that fits the limit "
                     "runs a plan)")
            return
        torch.cuda.synchronize()
        now = time.perf_counter()
        if self._start is not None:
            way = TORCH if self.torch else PLANS
            self._seen[way] += 1
            if self._seen[way] > 1:  # each way's first step warms it up
                self.step_ms[way].append((now - self._start) * 1e3)
        if all(len(v) >= TRIAL_STEPS for v in self.step_ms.values()):
            self.kept = self.decide(self.step_ms)
            self.torch = self.kept == TORCH
            log.info("mucudnn.torch: the step trial keeps %s (median step %.3f ms with the "
                     "plans, %.3f ms with PyTorch's convolutions where they fit)", self.kept,
                     statistics.median(self.step_ms[PLANS]),
                     statistics.median(self.step_ms[TORCH]))
            return
        self.torch = not self.torch
        self._start = time.perf_counter()

    def as_dict(self) -> dict[str, Any]:
        """The trial's state as JSON-ready data."""
        return {"kept": self.kept, "torch": self.torch,
                "step_ms": {k: list(v) for k, v in self.step_ms.items()}}


def _ways_differ(module: nn.Module) -> Optional[bool]:
    """Whether some converted layer in ``module`` runs a plan for a signature
    whose PyTorch workspace fits the limit (``_mu_torch``: settled, fitting; see
    :class:`~mucudnn.torch.modules.MucudnnConvMixin`), so that PyTorch's way
    differs; None while some converted layer has not run since the engine's
    last clear (its first call decides what it runs, so nothing is known yet)."""
    differ = False
    for m in module.modules():
        state = getattr(m, "_mu_torch", None)
        if state is None:
            continue
        if state[0] != engine.GENERATION[0]:
            return None
        differ = differ or bool(state[2] - state[1])
    return differ


class StepEnd:
    """The forward hook beside a :class:`StepTrial`: the converted model's forward
    returned (or raised), so calls after it are not inside its step (Note
    [planning after the first step] in :mod:`.standin`)."""

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        if not _COMPILING():
            standin.end_step()


def trial_of(module: nn.Module) -> Optional[StepTrial]:
    """The :class:`StepTrial` hooked on ``module`` (None where there is none)."""
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, StepTrial):
            return hook
    return None


def install(module: nn.Module) -> StepTrial:
    """Hook a fresh :class:`StepTrial` on ``module`` (replacing one there)."""
    drop(module)
    trial = StepTrial()
    module.register_forward_pre_hook(trial)
    module.register_forward_hook(StepEnd(), always_call=True)
    return trial


def drop(module: nn.Module) -> None:
    """Remove every :class:`StepTrial` (and its :class:`StepEnd`) hooked in
    ``module``'s tree."""
    for m in module.modules():
        for hooks, kind in ((m._forward_pre_hooks, StepTrial), (m._forward_hooks, StepEnd)):
            for key in [k for k, h in hooks.items() if isinstance(h, kind)]:
                del hooks[key]
                getattr(m, "_forward_hooks_always_called", {}).pop(key, None)
