"""PyTorch's own convolution calls, as a converted layer runs and measures
them: ``aten::convolution`` and ``aten::convolution_backward`` under the cuDNN
flags of a native model with ``cudnn.benchmark``, and the thread a training
step runs each direction on (Note [PyTorch's benchmark cache is per thread]).
:mod:`.native` decides where they run (Note [never slower than native])."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import torch

from ..problem import Direction

__all__ = ["benchmark_flags", "native_forward", "native_transposed", "native_backward",
           "on_step_thread"]

_BENCHMARK: Any = getattr(torch._C, "_get_cudnn_benchmark", None) \
    or (lambda: torch.backends.cudnn.benchmark)
_NULL = contextlib.nullcontext()


def benchmark_flags(deterministic: bool, tf32: bool) -> Any:
    """cuDNN flags as a native model with ``cudnn.benchmark`` runs them. The
    determinism and TF32 flags are the call's own already (they key the warm
    record), so only ``benchmark`` may need setting; a check of one flag per
    call where it is on."""
    if _BENCHMARK():
        return _NULL
    return torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=deterministic,
                                      allow_tf32=tf32)


def native_forward(x: torch.Tensor, w: torch.Tensor, cfg: Any, deterministic: bool,
                   tf32: bool) -> torch.Tensor:
    """PyTorch's own cuDNN forward (no bias): ``aten::convolution`` through
    its ``torch`` binding, which parses arguments in C++ (the ``torch.ops``
    packet resolves its overload in Python first)."""
    with benchmark_flags(deterministic, tf32):
        return torch.convolution(x, w, None, list(cfg.stride), list(cfg.padding),
                                 list(cfg.dilation), False, [0] * len(cfg.stride), cfg.groups)


def native_transposed(dy: torch.Tensor, w: torch.Tensor, cfg: Any, output_padding: Any,
                      deterministic: bool, tf32: bool) -> torch.Tensor:
    """PyTorch's own cuDNN transposed convolution of ``dy`` (no bias): the
    backward-data of ``cfg``'s convolution (Note [transposed convolutions])."""
    with benchmark_flags(deterministic, tf32):
        return torch.convolution(dy, w, None, list(cfg.stride), list(cfg.padding),
                                 list(cfg.dilation), True, list(output_padding), cfg.groups)


#: ``aten::convolution_backward`` has no ``torch`` binding: its overload, resolved once
_CONV_BACKWARD: Any = torch.ops.aten.convolution_backward.default


def native_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, cfg: Any,
                    need_x: bool, need_w: bool, deterministic: bool, tf32: bool
                    ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """PyTorch's own cuDNN backward-data and/or backward-filter."""
    with benchmark_flags(deterministic, tf32):
        dx, dw, _ = _CONV_BACKWARD(
            dy, x, w, None, list(cfg.stride), list(cfg.padding), list(cfg.dilation), False,
            [0] * len(cfg.stride), cfg.groups, [need_x, need_w, False])
    return dx, dw


# -- the harness -----------------------------------------------------------------------------------
# Note [PyTorch's benchmark cache is per thread]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# PyTorch keeps what ``cudnn.benchmark`` found per thread (its BenchmarkCache
# in aten/src/ATen/native/cudnn/Conv_v8.cpp is ``thread_local``), and a training
# step's backward runs on autograd's worker thread for the device, not on the
# thread that called the forward. A backward direction measured on the caller's
# thread would be benchmarked there and again by the step's backward, so the
# first step would pay for each backward benchmark twice. So the backward
# directions are measured inside a backward pass
# (:func:`on_step_thread`), on the thread that runs them in a step, and its
# cache is the one they fill; the forward is measured on the caller's thread,
# where a step's forward runs.
class _InBackward(torch.autograd.Function):
    """An identity whose backward runs ``box[0]()`` and keeps its result in
    ``box[1]`` (or what it raised in ``box[2]``)."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, box: list) -> torch.Tensor:
        ctx.box = box
        return anchor.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        box = ctx.box
        try:
            box[1] = box[0]()
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            box[2] = exc
        return grad, None


def on_step_thread(direction: Direction, device: torch.device, fn: Callable[[], Any]) -> Any:
    """``fn()`` on the thread where a training step runs ``direction`` on
    ``device``: the caller's for the forward, autograd's worker for the
    backward directions, reached through a backward pass of one scalar on
    ``device`` (See Note [PyTorch's benchmark cache is per thread]). What
    ``fn`` raises is raised here. Under inference mode, which has no backward,
    ``fn()`` runs here.

    >>> on_step_thread(Direction.BACKWARD_DATA, torch.device("cpu"), lambda: 42)
    42
    """
    if direction is Direction.FORWARD or torch.is_inference_mode_enabled():
        return fn()
    box: list = [fn, None, None]
    anchor = torch.zeros((), device=device, requires_grad=True)
    with torch.enable_grad():
        out = _InBackward.apply(anchor, box)
    torch.autograd.grad(out, anchor, torch.ones_like(out))
    if box[2] is not None:
        raise box[2]
    return box[1]
