"""The two probes behind folding, on the CPU: tools/space_to_depth_probe.py's
rearrangements (the rewritten problem computes the original's sums, forward
and both gradients, against torch in float64) and tools/fold_transform_probe.py's
per-phase strided copies (their descriptors' dims, strides and offsets,
replayed with torch.as_strided, build torch's fold exactly)."""

from __future__ import annotations

import pytest
from tool_support import load_tool

torch = pytest.importorskip("torch", reason="the probes need PyTorch")
F = torch.nn.functional


@pytest.fixture(scope="module")
def s2d():
    return load_tool("space_to_depth_probe")


@pytest.fixture(scope="module")
def ftp():
    return load_tool("fold_transform_probe")


@pytest.mark.parametrize("c, h, w, k, r, s, p", [
    (3, 27, 27, 8, 11, 4, 0), (3, 24, 24, 8, 7, 2, 3), (2, 23, 21, 5, 5, 3, 1)])
def test_space_to_depth_rewrite_computes_the_same_sums(s2d, c, h, w, k, r, s, p):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, c, h, w, dtype=torch.float64, generator=g, requires_grad=True)
    wt = torch.randn(k, c, r, r, dtype=torch.float64, generator=g, requires_grad=True)
    y = F.conv2d(x, wt, stride=s, padding=p)
    dy = torch.randn(y.shape, dtype=torch.float64, generator=g)
    dx, dw = torch.autograd.grad(y, (x, wt), dy)
    x2 = s2d.s2d_input(x.detach(), s, p).requires_grad_()
    w2 = s2d.s2d_weight(wt.detach(), s).requires_grad_()
    y2 = F.conv2d(x2, w2)
    oh, ow = y.shape[2:]
    assert torch.allclose(y2[:, :, :oh, :ow], y, atol=1e-12)
    dy2 = F.pad(dy, (0, y2.shape[3] - ow, 0, y2.shape[2] - oh))
    dx2, dw2 = torch.autograd.grad(y2, (x2, w2), dy2)
    assert torch.allclose(s2d.d2s_input(dx2, s, p, c, h, w), dx, atol=1e-12)
    assert torch.allclose(s2d.d2s_weight(dw2, s, c, r, r), dw, atol=1e-12)


class _Desc:
    """Stands in for a TensorDescriptor: keeps dims and strides."""

    def __init__(self, dims, strides, dtype):
        self.dims, self.strides = tuple(dims), tuple(strides)


@pytest.mark.parametrize("name", ["alexnet", "resnet"])
def test_phase_copies_build_the_fold(ftp, monkeypatch, name):
    monkeypatch.setattr(ftp, "TensorDescriptor", _Desc)
    c, h, w, s, p, _ = ftp.LAYERS[name]
    xn = torch.randn(2, c, h, w)
    x = xn.permute(0, 2, 3, 1).contiguous()
    ref = ftp.fold_reference(xn, s, p, "ijc")
    out = torch.zeros_like(ref)
    calls = ftp.boxes(None, x, c, h, w, s, p, out)
    assert len(calls) == s * s
    flat_x, flat_out, item = x.reshape(-1), out.reshape(-1), x.element_size()
    for src, sp, dst, dp in calls:
        a = torch.as_strided(flat_x, src.dims, src.strides, (sp - x.data_ptr()) // item)
        b = torch.as_strided(flat_out, dst.dims, dst.strides, (dp - out.data_ptr()) // item)
        b.copy_(a)
    assert torch.equal(out, ref)
    # the other channel order is another tensor
    assert not torch.equal(ftp.fold_reference(xn, s, p, "cij"), ref)
