"""Forward-mode AD, double backward and ``torch.func`` transforms of
mucudnn.torch's convolutions.

Note [three bilinear directions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Forward ``y = conv(x, w)``, backward-data ``dx = data(dy, w)`` and
backward-filter ``dw = filter(x, dy)`` are bilinear maps of their two
operands, and each one's adjoints are the other two (for the same convolution
configuration)::

    conv(x, w)     grad x: data(g, w)      grad w: filter(x, g)
    data(dy, w)    grad dy: conv(g, w)     grad w: filter(g, dy)
    filter(x, dy)  grad x: data(dy, g)     grad dy: conv(x, g)

and the JVP of a bilinear map ``f`` is ``f(a_t, b) + f(a, b_t)``.
:class:`Bilinear` is one ``autograd.Function`` for all three (the direction
is an argument), whose backward, JVP and vmap rule apply :class:`Bilinear`
again: gradients of any order, forward-over-reverse (``jacfwd(jacrev)``),
``torch.func.vmap``/``grad``/``jvp``/``jacrev`` all run on mucudnn's three
directions. The bias is added outside it by ordinary torch ops.

Note [the eager first-order path stays lean]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The eager first-order path (:class:`~mucudnn.torch.ops.ConvFunction`, Note
[eager backward cost]) is unchanged; :func:`mucudnn.torch.ops.apply` takes
:func:`conv` only under a ``torch.func`` transform or inside
``torch.autograd.forward_ad.dual_level`` (one C call and one module attribute
read per call decide it), and ConvFunction's backward calls :func:`backward`
only when it runs with grad mode on (``create_graph=True``).

Note [vmap by folding]
~~~~~~~~~~~~~~~~~~~~~~
The vmap rule folds the vmapped dimension into the convolution. When only the
activation-side operand (``x`` of conv, ``dy`` of data) is batched, into its
batch dimension; otherwise (a batched weight, or any batched operand of
filter, whose sum over the batch would mix the vmapped entries) into the
groups: operand ``(B, N, C, ...)`` becomes ``(N, B*C, ...)``, weight ``(B, K,
C/g, ...)`` becomes ``(B*K, C/g, ...)`` and the groups ``B*g`` (an unbatched
operand is expanded to ``B`` first). The folded problem is planned on its own
(without a WD layer's joint plans).

>>> import torch
>>> from mucudnn.torch.engine import ConvConfig
>>> cfg = ConvConfig((1, 1), (0, 0), (1, 1), 1, -1, "undivided", "", "")
>>> x = torch.ones(1, 1, 3, 3, dtype=torch.float64)
>>> w = torch.ones(1, 1, 2, 2, dtype=torch.float64)
>>> y, t = torch.func.jvp(lambda a: conv(a, w, None, cfg), (x,), (torch.ones_like(x),))
>>> float(y[0, 0, 0, 0]), float(t[0, 0, 0, 0])
(4.0, 4.0)
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor

from . import engine, layout
from .engine import ConvConfig

__all__ = ["Bilinear", "Op", "conv", "backward", "FORWARD", "DATA", "FILTER"]

#: The three directions (:attr:`Op.kind`).
FORWARD, DATA, FILTER = 0, 1, 2

_BIAS_VIEW = {3: (-1, 1), 4: (-1, 1, 1), 5: (-1, 1, 1, 1)}


class Op(NamedTuple):
    """One direction of a convolution: ``kind`` (:data:`FORWARD`,
    :data:`DATA`, :data:`FILTER`), its configuration, and the spatial sizes
    the operands do not give: ``x``'s for :data:`DATA`, the kernel's for
    :data:`FILTER` (``()`` for :data:`FORWARD`)."""

    kind: int
    cfg: ConvConfig
    spatial: tuple[int, ...]


def _placeholder(shape: tuple, like: Tensor, cl: bool) -> Tensor:
    """An uninitialised tensor standing for the operand a direction does not
    read (only its shape, dtype and memory format are used)."""
    fmt = layout.CL[len(shape)] if cl else torch.contiguous_format
    return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=fmt)


def run(a: Tensor, b: Tensor, op: Op) -> Tensor:
    """``op`` on plain tensors, through the engine (no autograd)."""
    cfg = op.cfg
    if op.kind == FORWARD:
        return engine.forward(a, b, None, cfg)
    if op.kind == DATA:  # a: dy, b: w
        shape = (a.shape[0], b.shape[1] * cfg.groups) + op.spatial
        x = _placeholder(shape, a, layout.channels_last(a, b))
        dx = engine.backward(a, x, b, cfg, True, False, False)[0]
        assert dx is not None
        return dx
    # FILTER; a: x, b: dy
    shape = (b.shape[1], a.shape[1] // cfg.groups) + op.spatial
    w = _placeholder(shape, a, layout.channels_last(a, b))
    dw = engine.backward(b, a, w, cfg, False, True, False)[1]
    assert dw is not None
    return dw


def _adjoints(op: Op, a: Tensor, b: Tensor, g: Tensor, need_a: bool,
              need_b: bool) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """The gradients of ``op(a, b)`` for the output gradient ``g``
    (Note [three bilinear directions])."""
    cfg, apply = op.cfg, Bilinear.apply
    ga = gb = None
    if op.kind == FORWARD:  # a: x, b: w
        if need_a:
            ga = apply(g, b, Op(DATA, cfg, tuple(a.shape[2:])))
        if need_b:
            gb = apply(a, g, Op(FILTER, cfg, tuple(b.shape[2:])))
    elif op.kind == DATA:  # a: dy, b: w
        if need_a:
            ga = apply(g, b, Op(FORWARD, cfg, ()))
        if need_b:
            gb = apply(g, a, Op(FILTER, cfg, tuple(b.shape[2:])))
    else:  # FILTER; a: x, b: dy
        if need_a:
            ga = apply(b, g, Op(DATA, cfg, tuple(a.shape[2:])))
        if need_b:
            gb = apply(a, g, Op(FORWARD, cfg, ()))
    return ga, gb


class Bilinear(torch.autograd.Function):
    """``Bilinear.apply(a, b, op)``: one direction of a convolution, with a
    backward, a JVP and a vmap rule in terms of the directions (Note [three
    bilinear directions])."""

    @staticmethod
    def forward(a: Tensor, b: Tensor, op: Op) -> Tensor:  # type: ignore[override]
        return run(a, b, op)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        a, b, op = inputs
        ctx.op = op
        ctx.save_for_backward(a, b)
        ctx.save_for_forward(a, b)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:  # type: ignore[override]
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad[:2]
        ga, gb = _adjoints(ctx.op, a, b, g, na, nb)
        return ga, gb, None

    @staticmethod
    def jvp(ctx: Any, a_t: Optional[Tensor], b_t: Optional[Tensor], _op: Any) -> Tensor:
        a, b = ctx.saved_tensors
        op = ctx.op
        out = None if a_t is None else Bilinear.apply(a_t, b, op)
        if b_t is not None:
            tb = Bilinear.apply(a, b_t, op)
            out = tb if out is None else out + tb
        assert out is not None  # forward AD calls jvp only with some tangent
        return out

    @staticmethod
    def vmap(info: Any, in_dims: tuple, a: Tensor, b: Tensor, op: Op) -> tuple:
        # Note [vmap by folding]
        n = info.batch_size
        da, db = in_dims[0], in_dims[1]
        if da is not None:
            a = a.movedim(da, 0)
        if db is not None:
            b = b.movedim(db, 0)
        if db is None and op.kind != FILTER:  # into the batch dimension
            out = Bilinear.apply(a.flatten(0, 1), b, op)
            return out.unflatten(0, (n, a.shape[1])), 0
        if da is None:
            a = a.expand((n,) + tuple(a.shape))
        if db is None:
            b = b.expand((n,) + tuple(b.shape))
        folded = op._replace(cfg=op.cfg._replace(groups=n * op.cfg.groups, plans=""))
        a2 = a.movedim(0, 1).flatten(1, 2)
        if op.kind == FILTER:  # both operands are (B, N, C, ...)
            out = Bilinear.apply(a2, b.movedim(0, 1).flatten(1, 2), folded)
            return out.unflatten(0, (n, -1)), 0
        out = Bilinear.apply(a2, b.flatten(0, 1), folded)
        return out.unflatten(1, (n, -1)), 1


def conv(x: Tensor, w: Tensor, bias: Optional[Tensor], cfg: ConvConfig) -> Tensor:
    """``conv(x, w) + bias`` through :class:`Bilinear` (what
    :func:`mucudnn.torch.ops.apply` runs under ``torch.func`` transforms and
    forward-mode AD)."""
    y = Bilinear.apply(x, w, Op(FORWARD, cfg, ()))
    if bias is not None:
        y = y + bias.view(_BIAS_VIEW[y.dim()])
    return y


def backward(x: Tensor, w: Tensor, dy: Tensor, cfg: ConvConfig, need_x: bool, need_w: bool,
             need_bias: bool) -> tuple:
    """:class:`~mucudnn.torch.ops.ConvFunction`'s gradients as differentiable
    ops (its backward under ``create_graph=True``): ``(dx, dw, dbias, None)``."""
    dx = Bilinear.apply(dy, w, Op(DATA, cfg, tuple(x.shape[2:]))) if need_x else None
    dw = Bilinear.apply(x, dy, Op(FILTER, cfg, tuple(w.shape[2:]))) if need_w else None
    db = dy.sum(dim=[0] + list(range(2, dy.dim()))) if need_bias else None
    return dx, dw, db, None
