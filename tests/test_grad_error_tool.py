"""tools/grad_error.py on the CPU (Note [gradient error]): one step's loss and
gradients of native PyTorch and of the converted model (NumPy backend)
against float64, layer by layer, with each layer's plans."""

from __future__ import annotations

import doctest
import json

import pytest
from tool_support import load_tool

pytest.importorskip("torch", reason="tools/grad_error.py needs PyTorch")


@pytest.fixture(scope="module")
def ge():
    return load_tool("grad_error")


pytestmark = pytest.mark.usefixtures("cache_off")


def test_doctests(ge):
    result = doctest.testmod(ge)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32strict", "fp32cl"])
def test_smoke_run_on_cpu(ge, tmp_path, capsys, precision):
    out = tmp_path / "g.json"
    assert ge.main(["--device", "cpu", "--models", "tiny", "--batch", "4", "--precision",
                    precision, "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["models"]
    assert r["model"] == "tiny" and r["precision"] == precision
    layers = r["conv_layers"]
    assert [v["layer"] for v in layers] == ["features.0", "features.4", "features.6"]
    for v in layers:
        # float32 gradients against float64: close, but not identical
        assert 0 < v["native"] < 1e-4 and 0 < v["converted"] < 1e-4, v
        # the converted layer's plans were found: forward and backward-filter at least
        assert {"forward", "backward_filter"} <= set(v["plans"]), v
    assert layers[0]["plans"].keys() == {"forward", "backward_filter"}  # no input gradient
    assert r["loss"]["converted_rel"] < 1e-5 and r["all_parameters"]["converted"] < 1e-4
    printed = capsys.readouterr().out
    assert "| features.0 | 8x3x3x3 |" in printed and "conv weight gradients (3 layers)" in printed


def test_a_wrong_gradient_shows(ge, monkeypatch):
    """The comparison is not vacuous: a converted model whose convolution
    weight gradients are off by 1% is reported so, layer by layer."""
    import torch

    real = ge._grads
    calls = []

    def skewed(model, x, t):
        loss, grads = real(model, x, t)
        calls.append(model)
        if len(calls) == 3:  # float64, native, then the converted model
            grads = {k: g * 1.01 if k.startswith("features.") and g.dim() == 4 else g
                     for k, g in grads.items()}
        return loss, grads

    monkeypatch.setattr(ge, "_grads", skewed)
    args = ge.parse_args(["--device", "cpu", "--models", "tiny", "--batch", "4"])
    r = ge.compare(args, "tiny", torch.device("cpu"))
    for v in r["conv_layers"]:
        assert v["converted"] == pytest.approx(1e-2, rel=1e-2) and v["native"] < 1e-4
        assert v["ratio"] > 100


def test_the_first_and_the_last_pass_are_read_apart(ge):
    """pass_grads returns the first pass's gradients and the last's (Note
    [gradient check]): a model whose passes differ (a scale that grows each
    call, as a converted model's first pass runs other kernels than its
    last) gives each pass's own, and the default reads past the passes that
    replace a converted model's stand-ins."""
    import torch
    from torch import nn

    from mucudnn.torch.standin import STANDIN_STEPS

    class Growing(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 3)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.lin(x) * self.calls

    torch.manual_seed(0)
    m = Growing()
    x, t = torch.randn(4, 2), torch.tensor([0, 1, 2, 0])
    first, last = ge.pass_grads(m, x, t, False)
    assert m.calls == ge.PASSES == 2 + STANDIN_STEPS
    ref = Growing()
    ref.load_state_dict(m.state_dict())
    for k, grads in ((1, first), (ge.PASSES, last)):
        ref.calls = k - 1
        ref.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), t).backward()
        assert torch.allclose(grads["lin.weight"], ref.lin.weight.grad.double())
    assert not torch.allclose(first["lin.weight"], last["lin.weight"])
