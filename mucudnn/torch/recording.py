"""Recording a model's convolutions instead of running them: one forward
pass inside :func:`recording` lists every distinct convolution a model makes
(its problem, backend and options), with no plan made and no kernel run.
:func:`mucudnn.torch.distributed.share_plans` plans them once for a group of
processes.

>>> import torch
>>> from mucudnn.torch.engine import ConvConfig
>>> from mucudnn.torch import ops
>>> cfg = ConvConfig((1, 1), (1, 1), (1, 1), 1, 1 << 20, "powerOfTwo", "", "")
>>> with recording() as rec:
...     y = ops.apply(torch.ones(2, 3, 5, 5), torch.ones(4, 3, 3, 3), None, cfg)
>>> tuple(y.shape), [c.problem.key()[:22] for c in rec.convs]
((2, 4, 5, 5), ['conv2d:x=2x3x5x5:w=4x3'])
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, NamedTuple

import torch

from ..backends import Backend
from ..problem import ConvProblem
from . import engine, layout
from .tokens import TorchBridgeError, backend_for

__all__ = ["RecordedConv", "Recorder", "RECORDER", "recording", "record", "record_transposed"]


class RecordedConv(NamedTuple):
    """One distinct convolution met while :func:`recording`: its problem, the
    backend it runs on and the options and determinism its Convolution would
    plan with (what :class:`mucudnn.optimizer.Planner` takes)."""

    problem: ConvProblem
    backend: Backend
    workspace_limit: "int | None"
    policy: Any
    deterministic: bool
    wd: bool  #: planned jointly (convert's mode="wd"), not per kernel


class Recorder:
    """What a :func:`recording` forward met: :attr:`convs`, distinct, in order."""

    def __init__(self) -> None:
        self.convs: dict[RecordedConv, None] = {}


#: The active recorder (None: convolutions run). One at a time, process-wide;
#: read on every converted call, so read as this module's attribute.
RECORDER: "Recorder | None" = None
_RECORD_LOCK = threading.Lock()


@contextlib.contextmanager
def recording() -> Any:
    """Within it, mucudnn.torch's convolutions are recorded instead of run:
    each call returns an uninitialised output of the right shape, dtype and
    memory format, and no plan is made. For finding a model's convolutions
    from one forward pass (:func:`mucudnn.torch.distributed.share_plans`).
    Nested recordings raise :class:`TorchBridgeError`."""
    global RECORDER
    with _RECORD_LOCK:
        if RECORDER is not None:
            raise TorchBridgeError("recording: already recording (one at a time)")
        rec = RECORDER = Recorder()
    try:
        yield rec
    finally:
        RECORDER = None


def record(x: torch.Tensor, w: torch.Tensor, cfg: engine.ConvConfig) -> torch.Tensor:
    """Record the convolution of ``x`` and ``w`` (see :func:`recording`) and
    return an uninitialised output for it."""
    cl = layout.channels_last(x, w)
    _note(x, layout.view(x, cl), layout.view(w, cl), cl, cfg)
    return layout.empty(engine.output_shape(x.shape, w.shape, cfg.stride, cfg.padding,
                                            cfg.dilation), x.dtype, x.device, cl)


def record_transposed(x: torch.Tensor, w: torch.Tensor, cfg: engine.ConvConfig,
                      size: tuple) -> torch.Tensor:
    """Record a transposed convolution of ``x`` and ``w`` with output spatial
    ``size``, as its convolution problem (Note [transposed convolutions] in
    :mod:`.transposed`), and return an uninitialised output for it."""
    cl = layout.channels_last(x, w)
    y = layout.empty((x.shape[0], w.shape[1] * cfg.groups) + tuple(size), x.dtype,
                     torch.device("meta"), cl)
    _note(x, layout.view(y, cl), layout.view(w, cl), cl, cfg)
    return layout.empty(y.shape, x.dtype, x.device, cl)


def _note(x: torch.Tensor, xv: torch.Tensor, wv: torch.Tensor, cl: bool,
          cfg: engine.ConvConfig) -> None:
    """Add the problem of the packed ``xv`` and ``wv`` to the recording."""
    rec = RECORDER
    assert rec is not None
    order = layout.LAYOUT[(xv.dim(), cl)]
    problem = engine._problem(xv, wv, order, engine._math(x.dtype, x.device), cfg)
    rec.convs.setdefault(RecordedConv(
        problem, backend_for(cfg.backend, x.device),
        None if cfg.workspace_limit < 0 else cfg.workspace_limit, engine._policy(cfg.policy),
        engine.deterministic(), bool(cfg.plans)), None)
