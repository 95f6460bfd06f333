"""Training steps checked against float64, for the GPU tests of a converted
model's whole-step behaviour (tests/test_torch_step_trial.py,
tests/test_torch_step_guard.py)."""

from __future__ import annotations

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
