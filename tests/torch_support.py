"""Training steps checked against float64, for the GPU tests of a converted
model's whole-step behaviour (tests/test_torch_step_trial.py,
tests/test_torch_step_guard.py)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch
from torch import nn


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``a``'s relative error against the float64 ``b`` (2-norms)."""
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-30))


def step_against_float64(model: nn.Module, ref: nn.Module, x: torch.Tensor,
                         tol: float = 1e-5) -> None:
    """One forward and backward of ``model`` on ``x`` and of ``ref`` (its float64
    copy) on ``x`` in float64, with the same gradient of the output; asserts the
    output and every parameter's gradient within ``tol`` of float64's."""
    model.zero_grad()
    ref.zero_grad()
    y = model(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    y64 = ref(x.double())
    y64.backward(dy.double())
    assert rel(y, y64) < tol
    for p, p64 in zip(model.parameters(), ref.parameters()):
        assert rel(p.grad, p64.grad) < tol


def compiled_like_eager(ref: nn.Module, model: nn.Module, x: torch.Tensor) -> list:
    """``model`` (``ref`` converted) compiled whole (``fullgraph``) on a backend
    that keeps the graph: its output and the gradients of ``x`` and of every
    parameter equal ``ref``'s eager ones to 1e-12 (float64), in one graph;
    returns that graph's called targets."""
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, backend=backend, fullgraph=True)
    x = x.detach().requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    y, yr = compiled(x), ref(xr)
    torch.testing.assert_close(y, yr, rtol=1e-12, atol=1e-12)
    y.square().sum().backward()
    yr.square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-12, atol=1e-12)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)
    assert len(graphs) == 1
    return [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]


def tensors_left_in_cycles(step: Callable[[], object], repeat: int = 3) -> list[torch.Tensor]:
    """The tensors that ``repeat`` calls of ``step`` leave reachable only through
    reference cycles: memory that stays allocated until Python's cycle
    collector happens to run, so a training step's peak would depend on when it
    does. The collector is off while ``step`` runs and restored after."""
    gc.collect()
    enabled, flags = gc.isenabled(), gc.get_debug()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(repeat):
            step()
        gc.collect()
        found = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.garbage.clear()
        gc.set_debug(flags)
        if enabled:
            gc.enable()
    return found
