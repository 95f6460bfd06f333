"""Transposed convolutions run micro-batched: the engine side of
``conv_transpose1d/2d/3d`` and ``ConvTranspose1d/2d/3d``.

Note [transposed convolutions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A transposed convolution is the adjoint of a convolution. Read its weight
``(C_in, C_out/groups, *k)`` as a convolution's ``(K, C/groups, *k)`` with the
same stride, padding, dilation and groups: its forward is that convolution's
backward-data, where the convolution's input has the transposed layer's
output shape (``output_padding`` picks it among the inputs with the same
output), and its gradients are the convolution's forward (for its input) and
backward-filter (for its weight; Note [three bilinear directions]). PyTorch
runs it so on cuDNN (aten's ``cudnn_convolution_transpose``). So mucudnn
plans, caches, compares and reports that convolution problem, and each of a
transposed layer's signatures is compared per direction with PyTorch's calls
as a convolution's is (Note [never slower than native]); only the direction
a step may skip differs: the problem's forward, where the layer's input needs
no gradient (:func:`.native.skipped`). Its records are
kept apart from a convolution's of the same problem (their keys start with
``"transposed"``), as which directions a step runs differs. An output padding
of at least the stride (PyTorch takes one below the dilation) has no such
convolution, as the convolution of that output would be larger than the
layer's input: :func:`~mucudnn.torch.conv_transpose2d` runs PyTorch's own call
for it, with a warning.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor
from torch.autograd import forward_ad as _forward_ad

from . import engine, layout, measure, ops, recording
from .autodiff import DATA, FILTER, FORWARD, Bilinear, Op
from .engine import ConvConfig

__all__ = ["TransposedFunction", "apply", "warm_call", "conv_transpose"]


def _out_shape(x: Tensor, w: Tensor, groups: int, size: Sequence[int]) -> tuple:
    """The layer's output shape: the problem's input shape."""
    return (x.shape[0], w.shape[1] * groups) + tuple(size)


def _in_layout(g: Tensor, x: Tensor, w: Tensor) -> Tensor:
    """The output gradient ``g`` in the memory format the forward ran in (its
    gradients run the same problem's layout, as PyTorch's do)."""
    if layout.channels_last(x, w):
        return g.contiguous(memory_format=layout.CL[g.dim()])
    return g.contiguous()


def _bias_grad(g: Tensor) -> Tensor:
    with engine._no_autocast(g.device):  # sum autocasts to float32; the gradient keeps g's dtype
        return g.sum(dim=[0] + list(range(2, g.dim())))


def warm_call(x: Tensor, w: Tensor, cfg: ConvConfig, size: tuple,
              timed: bool = False) -> "engine._Warm | None":
    """The warm record of a transposed layer's signature (input ``x``, weight
    ``w``, output spatial ``size``), made and compared on first use (Note
    [transposed convolutions]); None where the checked path runs (CPU tensors,
    an empty batch). ``timed``: the call is a training step's, so the host
    cost of the layer is timed too (Note [host cost of a converted layer])."""
    if not x.is_cuda:
        return None
    key = ("transposed", size, x.shape, x.stride(), w.shape, w.stride(), x.dtype,
           x.get_device(), cfg, engine._TF32(), engine.deterministic())
    return engine.resolve(key, x, w, cfg, _host_step(size) if timed else None,
                          lambda x, w, cfg, cl: _scratch(x, w, cfg, size, cl))


def _scratch(x: Tensor, w: Tensor, cfg: ConvConfig, size: tuple, cl: bool) -> Tensor:
    """A random operand of the problem's input shape, for the first call's
    timings (See Note [random operands of our own] in :mod:`.measure`)."""
    shape = _out_shape(x, w, cfg.groups, size)
    return measure.random_operand(shape, x.dtype, x.device,
                                  layout.CL[len(shape)] if cl else torch.contiguous_format)


def _host_step(size: tuple) -> Any:
    def step(x: Tensor, w: Tensor, cfg: ConvConfig) -> Tensor:
        return apply(x, w, None, cfg, size)
    return step


def _checked(x: Tensor, w: Tensor, bias: Optional[Tensor], cfg: ConvConfig,
             size: tuple) -> Tensor:
    """The forward through :class:`~mucudnn.Convolution`'s checked path (CPU
    tensors, empty batches): the problem's backward-data into a new output."""
    cl = layout.channels_last(x, w)
    nd = x.dim()
    dev = x.device
    y = layout.empty(_out_shape(x, w, cfg.groups, size), x.dtype, dev, cl)
    if x.shape[0] == 0:
        return y
    xv, wv = layout.view(x, cl), layout.view(w, cl)
    yv = layout.packed(y, cl)
    with engine._on_device(dev), engine._no_autocast(dev):
        conv = engine.convolution(layout.view(y, cl), wv, layout.LAYOUT[(nd, cl)], cfg)
        engine._run(conv.backward_data, xv, wv, yv)
        if bias is not None:
            yv.add_(bias if cl else bias.view(layout.BIAS_VIEW[nd]))
    return y


def _forward(x: Tensor, w: Tensor, bias: Optional[Tensor], cfg: ConvConfig, size: tuple,
             warm: "engine._Warm | None") -> Tensor:
    if warm is not None:
        return warm.data(x, w, bias)
    return _checked(x, w, bias, cfg, size)


class TransposedFunction(torch.autograd.Function):
    """Eager autograd path: ``TransposedFunction.apply(x, w, bias, cfg, size)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, bias: Optional[Tensor], cfg: ConvConfig,
                size: tuple) -> Tensor:
        ctx.cfg = cfg
        ctx.save_for_backward(x, w)
        warm = ctx.warm = warm_call(x, w, cfg, size, timed=True)
        return _forward(x, w, bias, cfg, size, warm)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:  # type: ignore[override]
        x, w = ctx.saved_tensors
        nx, nw, nb = ctx.needs_input_grad[:3]
        cfg = ctx.cfg
        gx = gw = None
        if ctx.warm is None:  # the warm record's calls keep its layout themselves
            g = _in_layout(g, x, w)
        if torch.is_grad_enabled():  # create_graph=True: differentiable gradients
            if nx:
                gx = Bilinear.apply(g, w, Op(FORWARD, cfg, ()))
            if nw:
                gw = Bilinear.apply(g, x, Op(FILTER, cfg, tuple(w.shape[2:])))
        else:
            warm = ctx.warm
            if warm is not None:
                if nx:
                    gx = warm.forward(g, w, None)
                if nw:
                    gw = warm.backward(x, g, w, False, True, False)[1]
            else:
                if nx:
                    gx = engine.forward(g, w, None, cfg)
                if nw:
                    gw = engine.backward(x, g, w, cfg, False, True, False)[1]
        return gx, gw, _bias_grad(g) if nb else None, None, None


@torch.library.custom_op("mucudnn::conv_transpose", mutates_args=(), tags=ops._TAGS)
def conv_transpose(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: Sequence[int],
                   padding: Sequence[int], dilation: Sequence[int], groups: int,
                   size: Sequence[int], workspace_limit: int, policy: str, backend: str,
                   plans: str) -> Tensor:
    """The transposed convolution of ``x`` and ``weight`` plus ``bias``
    (micro-batched) with output spatial sizes ``size``: the custom op that
    ``torch.compile`` keeps whole (Note [transposed convolutions])."""
    cfg = ops._cfg(stride, padding, dilation, groups, workspace_limit, policy, backend, plans)
    sz = tuple(int(v) for v in size)
    return _forward(x, weight, bias, cfg, sz, warm_call(x, weight, cfg, sz))


@conv_transpose.register_fake
def _conv_transpose_fake(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                         stride: Sequence[int], padding: Sequence[int],
                         dilation: Sequence[int], groups: int, size: Sequence[int],
                         workspace_limit: int, policy: str, backend: str,
                         plans: str) -> Tensor:
    return layout.empty(_out_shape(x, weight, groups, size), x.dtype, x.device,
                        layout.channels_last(x, weight))


def _setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, w, bias, stride, padding, dilation, groups, _size, *rest = inputs
    ctx.save_for_backward(x, w)
    ctx.conv_args = (stride, padding, dilation, groups, *rest)


def _backward(ctx: Any, g: Tensor) -> tuple:
    x, w = ctx.saved_tensors
    nx, nw, nb = ctx.needs_input_grad[:3]
    args = ctx.conv_args
    g = _in_layout(g, x, w)
    gx = ops.conv(g, w, None, *args) if nx else None
    gw = ops.conv_backward(x, g, w, *args, [False, True, False])[1] if nw else None
    return (gx, gw, _bias_grad(g) if nb else None) + (None,) * 9


conv_transpose.register_autograd(_backward, setup_context=_setup_context)


def apply(x: Tensor, w: Tensor, bias: Optional[Tensor], cfg: ConvConfig,
          size: tuple) -> Tensor:
    """The transposed convolution through the custom op while compiling; under a
    ``torch.func`` transform or forward-mode AD through :class:`Bilinear`'s
    backward-data; else through :class:`TransposedFunction` (or, with no
    gradient needed, the engine directly); within
    :func:`.recording.recording`, only records it."""
    if recording.RECORDER is not None:
        return recording.record_transposed(x, w, cfg, size)
    if torch.compiler.is_compiling():
        return conv_transpose(x, w, bias, list(cfg.stride), list(cfg.padding),
                              list(cfg.dilation), cfg.groups, list(size), cfg.workspace_limit,
                              cfg.policy, cfg.backend, cfg.plans)
    if ops._FUNCTORCH_ACTIVE() or _forward_ad._current_level >= 0:
        y = Bilinear.apply(x, w, Op(DATA, cfg, tuple(size)))
        return y if bias is None else y + bias.view(layout.BIAS_VIEW[y.dim()])
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return TransposedFunction.apply(x, w, bias, cfg, size)
    return _forward(x, w, bias, cfg, size, warm_call(x, w, cfg, size))
