"""The two autograd paths of mucudnn.torch, over the same engine calls.

* Eager mode: :class:`ConvFunction`, a ``torch.autograd.Function`` (a custom
  op costs 10-30 µs more host time per call in eager mode; this does not).
* ``torch.compile`` / ``torch.export``: the custom ops ``mucudnn::conv`` and
  ``mucudnn::conv_backward`` (``torch.library.custom_op``), with fake
  (meta) implementations that compute output shapes and strides, and
  ``register_autograd``, so a compiled model keeps the convolution as one
  opaque node instead of breaking the graph.

:func:`apply` picks the path: the custom op while compiling, the Function
otherwise. Both save ``x`` and ``w`` for the backward pass (as PyTorch's own
convolution does) and compute only the gradients that are needed
(``ctx.needs_input_grad``): backward-data for ``x``, backward-filter for
``w``, and ``dy`` summed over batch and spatial dimensions for the bias.

>>> import torch
>>> cfg = ConvConfig((1, 1), (0, 0), (1, 1), 1, 64 << 20, "powerOfTwo", "", "")
>>> x = torch.ones(2, 1, 3, 3, requires_grad=True)
>>> w = torch.ones(1, 1, 3, 3, requires_grad=True)
>>> y = apply(x, w, None, cfg)
>>> y.sum().backward()
>>> float(y.detach()[0, 0, 0, 0]), float(w.grad[0, 0, 0, 0]), float(x.grad[0, 0, 1, 1])
(9.0, 2.0, 1.0)
"""

from typing import Any, Optional, Sequence

import torch
from torch import Tensor
from torch.autograd import forward_ad as _forward_ad

from . import autodiff, engine, layout, recording
from .engine import ConvConfig

__all__ = ["ConvFunction", "apply", "conv", "conv_backward"]

_TAGS = tuple(getattr(torch.Tag, t) for t in ("needs_fixed_stride_order",)
              if hasattr(torch.Tag, t))


# Note [eager backward cost]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# In host-bound eager training (small batches) every microsecond of a conv's
# Python is paid once per conv call, dozens of times a step. So the eager
# Function's forward looks up the warm record once (Note [the warm torch path]
# in engine.py) and keeps it on ``ctx``, and its backward runs the engine's
# two backward directions directly. Only with grad mode on in the backward
# (``create_graph=True``: gradient penalties, double backward) does it build
# its gradients from differentiable ops instead (:func:`autodiff.backward`,
# Note [three bilinear directions]).
class ConvFunction(torch.autograd.Function):
    """Eager autograd path: ``ConvFunction.apply(x, w, bias, cfg)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, bias: Optional[Tensor],
                cfg: ConvConfig) -> Tensor:
        ctx.cfg = cfg
        ctx.save_for_backward(x, w)
        warm = ctx.warm = engine.warm_call(x, w, cfg, _host_step)
        if warm is not None:
            return warm.forward(x, w, bias)
        return engine.forward(x, w, bias, cfg)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple:
        if _GRAD_ENABLED():  # create_graph=True (Note [eager backward cost])
            x, w = ctx.saved_tensors
            return autodiff.backward(x, w, dy, ctx.cfg, *ctx.needs_input_grad[:3])
        try:
            return _conv_function_backward(ctx, dy)
        except RuntimeError:
            if not _IS_BATCHED(dy):
                raise
            return _batched_backward(ctx, dy)  # Note [legacy batched gradients]


def _host_step(x: Tensor, w: Tensor, cfg: ConvConfig) -> Tensor:
    """A converted forward through this path, for the host timing (Note [host
    cost of a converted layer])."""
    return apply(x, w, None, cfg)


_GRAD_ENABLED = torch.is_grad_enabled
_IS_BATCHED: Any = getattr(torch._C._functorch, "is_legacy_batchedtensor",
                           torch._C._functorch.is_batchedtensor)


# Note [legacy batched gradients]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# ``torch.autograd.grad(..., is_grads_batched=True)`` (and gradcheck's
# batched-gradient check) run the backward under torch's legacy vmap, which no
# ``autograd.Function`` rule covers: ``dy`` comes as a batched tensor without
# storage, which the engine cannot take. Such a backward runs aten's
# ``convolution_backward`` (torch's own kernels, which have batching rules).
# It is detected from the engine's failure, so an ordinary backward pays
# nothing for it.
def _batched_backward(ctx: Any, dy: Tensor) -> tuple:
    x, w = ctx.saved_tensors
    nx, nw, nb = ctx.needs_input_grad[:3]
    cfg = ctx.cfg
    dx, dw, db = torch.ops.aten.convolution_backward(
        dy, x, w, [w.shape[0]] if nb else None, list(cfg.stride), list(cfg.padding),
        list(cfg.dilation), False, [0] * len(cfg.stride), cfg.groups, [nx, nw, nb])
    return dx, dw, db, None


def _conv_function_backward(ctx: Any, dy: Tensor) -> tuple:
    x, w = ctx.saved_tensors
    nx, nw, nb = ctx.needs_input_grad[:3]
    warm = ctx.warm
    if warm is not None:
        dx, dw, db = warm.backward(dy, x, w, nx, nw, nb)
    else:
        dx, dw, db = engine.backward(dy, x, w, ctx.cfg, nx, nw, nb)
    return dx, dw, db, None


# Note [Function.apply's Python wrapper]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# In the torch releases our users run (2.11) ``Function.apply`` is a Python
# classmethod: it checks for a ``setup_context`` (ConvFunction has none),
# unwraps dead functorch wrappers (tensors that outlived a torch.func
# transform) and calls ``torch._C._FunctionBase.apply``; newer releases made
# ``apply`` that C method itself. Outside functorch transforms :func:`apply`
# calls the C method directly, saving the wrapper's Python on every call.
# Under a transform (``torch._C._are_functorch_transforms_active()``) it takes
# :func:`autodiff.conv` instead (Note [the eager first-order path stays lean]).
_BASE_APPLY: Any = torch._C._FunctionBase.__dict__.get("apply")
_C_APPLY: Any = ConvFunction.apply if _BASE_APPLY is None \
    else _BASE_APPLY.__get__(None, ConvFunction)
_FUNCTORCH_ACTIVE: Any = torch._C._are_functorch_transforms_active


def _cfg(stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int,
         workspace_limit: int, policy: str, backend: str, plans: str) -> ConvConfig:
    return ConvConfig(tuple(int(v) for v in stride), tuple(int(v) for v in padding),
                      tuple(int(v) for v in dilation), int(groups), int(workspace_limit),
                      policy, backend, plans)


@torch.library.custom_op("mucudnn::conv", mutates_args=(), tags=_TAGS)
def conv(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: Sequence[int],
         padding: Sequence[int], dilation: Sequence[int], groups: int, workspace_limit: int,
         policy: str, backend: str, plans: str) -> Tensor:
    """``conv(x, weight) + bias`` (micro-batched); x ``(N, C, *spatial)``."""
    return engine.forward(x, weight, bias, _cfg(stride, padding, dilation, groups,
                                                 workspace_limit, policy, backend, plans))


@conv.register_fake
def _conv_fake(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], groups: int,
               workspace_limit: int, policy: str, backend: str, plans: str) -> Tensor:
    return layout.empty(engine.output_shape(x.shape, weight.shape, stride, padding, dilation),
                        x.dtype, x.device, layout.channels_last(x, weight))


@torch.library.custom_op("mucudnn::conv_backward", mutates_args=(), tags=_TAGS)
def conv_backward(grad: Tensor, x: Tensor, weight: Tensor, stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], groups: int,
                  workspace_limit: int, policy: str, backend: str, plans: str,
                  output_mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dweight, dbias)`` of :func:`conv` for the output gradient ``grad``;
    a gradient not asked for in ``output_mask`` is an empty tensor."""
    nx, nw, nb = (bool(v) for v in output_mask)
    dx, dw, db = engine.backward(grad, x, weight, _cfg(stride, padding, dilation, groups,
                                                       workspace_limit, policy, backend, plans),
                                 nx, nw, nb)
    # a fresh empty tensor for each missing gradient: outputs may not alias
    return (x.new_empty(0) if dx is None else dx, x.new_empty(0) if dw is None else dw,
            x.new_empty(0) if db is None else db)


@conv_backward.register_fake
def _conv_backward_fake(grad: Tensor, x: Tensor, weight: Tensor, stride: Sequence[int],
                        padding: Sequence[int], dilation: Sequence[int], groups: int,
                        workspace_limit: int, policy: str, backend: str, plans: str,
                        output_mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    nx, nw, nb = (bool(v) for v in output_mask)
    cl = layout.channels_last(x, weight)

    def like(t: Tensor) -> Tensor:
        return layout.empty(t.shape, t.dtype, t.device, cl)

    return (like(x) if nx else x.new_empty(0), like(weight) if nw else x.new_empty(0),
            grad.new_empty(grad.shape[1]) if nb else x.new_empty(0))


def _setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, w, bias, *rest = inputs
    ctx.save_for_backward(x, w)
    ctx.args = rest
    ctx.has_bias = bias is not None


def _backward(ctx: Any, grad: Tensor) -> tuple:
    x, w = ctx.saved_tensors
    nx, nw, nb = ctx.needs_input_grad[:3]
    dx, dw, db = conv_backward(grad, x, w, *ctx.args, [nx, nw, nb and ctx.has_bias])
    return (dx if nx else None, dw if nw else None, db if nb else None) + (None,) * 8


conv.register_autograd(_backward, setup_context=_setup_context)


def apply(x: Tensor, w: Tensor, bias: Optional[Tensor], cfg: ConvConfig) -> Tensor:
    """The convolution through the custom op while compiling; under a
    ``torch.func`` transform or forward-mode AD through :func:`autodiff.conv`;
    else through :class:`ConvFunction` (or, with no gradient needed, the engine
    directly); within :func:`.recording.recording`, only records it."""
    if recording.RECORDER is not None:
        return recording.record(x, w, cfg)
    if torch.compiler.is_compiling():
        return conv(x, w, bias, list(cfg.stride), list(cfg.padding), list(cfg.dilation),
                    cfg.groups, cfg.workspace_limit, cfg.policy, cfg.backend, cfg.plans)
    if _FUNCTORCH_ACTIVE() or _forward_ad._current_level >= 0:
        return autodiff.conv(x, w, bias, cfg)  # Note [the eager first-order path stays lean]
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _C_APPLY(x, w, bias, cfg)
    return engine.forward(x, w, bias, cfg)
