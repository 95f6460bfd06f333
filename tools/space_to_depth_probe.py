#!/usr/bin/env python
"""Probe: is a first layer's strided convolution faster rewritten by space-to-depth?

A convolution with stride ``s`` over few input channels (AlexNet's conv1:
11x11, stride 4, 3 channels; ResNet's: 7x7, stride 2, pad 3) is the same
sum as a stride-1 convolution over the input rearranged by space-to-depth
(each s x s block of pixels becomes s*s*C channels) with the filter padded
to a multiple of ``s`` and rearranged the same way (AlexNet: 3x3 over 48
channels; ResNet: 4x4 over 12). The rewritten problem has more channels and
a smaller filter, which tensor-core engines handle without padding the
channels and, in float32 channels-last, with less workspace per sample.

For each layer and ``--batch`` this times, on the GPU (torch tensors,
channels-last, TF32 allowed as in PyTorch's default), forward, backward-data
and backward-filter of

* ``native``: PyTorch with ``cudnn.benchmark=True`` on the original problem,
* ``mucudnn``: ``mucudnn.torch.conv2d`` at ``--workspace`` on the original,
* ``mucudnn-s2d``: the same on the rewritten problem, plus the cost of the
  rearrangements themselves (space-to-depth of x; depth-to-space of dx'; the
  filter's are negligible), timed as torch copies,

and checks that the rewritten forward and gradients equal the original's
(float64 on the GPU as the reference). Nothing here changes mucudnn; it
measures whether the rewrite would pay (Note [space-to-depth probe]).

    python tools/space_to_depth_probe.py --layers alexnet resnet --batch 256
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mucudnn.torch as mt  # noqa: E402
from mucudnn.__main__ import parse_size  # noqa: E402

# Note [space-to-depth probe]: the eleventh and twelfth sessions found the
# float32 channels-last gap to PyTorch at 64 MiB in the first layers'
# backward passes (AlexNet conv1, ResNet conv1): their fastest engines copy
# x padded to 4 channels and dy into the workspace, about 2-4 MiB a sample,
# so under 64 MiB they run 15-36 samples a call, 20-35% slower a sample
# than one full-batch call. This probe measures the rewrite before anything
# is built on it.

#: name -> (C, H, W, K, R, stride, padding)
LAYERS = {"alexnet": (3, 227, 227, 96, 11, 4, 0), "resnet": (3, 224, 224, 64, 7, 2, 3)}


def s2d_input(x: torch.Tensor, s: int, p: int) -> torch.Tensor:
    """x (N, C, H, W) padded by p, then to multiples of s, rearranged to
    (N, s*s*C, H'/s, W'/s), channel order (i, j, c)."""
    n, c, h, w = x.shape
    hp, wp = h + 2 * p, w + 2 * p
    x = F.pad(x, (p, p + (-wp) % s, p, p + (-hp) % s))
    h2, w2 = x.shape[2] // s, x.shape[3] // s
    x = x.reshape(n, c, h2, s, w2, s).permute(0, 3, 5, 1, 2, 4)
    return x.reshape(n, s * s * c, h2, w2).contiguous(memory_format=torch.channels_last)


def s2d_weight(w: torch.Tensor, s: int) -> torch.Tensor:
    k, c, r, q = w.shape
    w = F.pad(w, (0, (-q) % s, 0, (-r) % s))
    r2, q2 = w.shape[2] // s, w.shape[3] // s
    w = w.reshape(k, c, r2, s, q2, s).permute(0, 3, 5, 1, 2, 4)
    return w.reshape(k, s * s * c, r2, q2).contiguous(memory_format=torch.channels_last)


def d2s_input(g: torch.Tensor, s: int, p: int, c: int, h: int, w: int) -> torch.Tensor:
    """The inverse of :func:`s2d_input` for a gradient: (N, C, H, W)."""
    n, _, h2, w2 = g.shape
    g = g.reshape(n, s, s, c, h2, w2).permute(0, 3, 4, 1, 5, 2).reshape(n, c, h2 * s, w2 * s)
    return g[:, :, p:p + h, p:p + w].contiguous(memory_format=torch.channels_last)


def d2s_weight(g: torch.Tensor, s: int, c: int, r: int, q: int) -> torch.Tensor:
    k, _, r2, q2 = g.shape
    g = g.reshape(k, s, s, c, r2, q2).permute(0, 3, 4, 1, 5, 2).reshape(k, c, r2 * s, q2 * s)
    return g[:, :, :r, :q].contiguous(memory_format=torch.channels_last)


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median ms of ``fn`` over 3 blocks of ``reps`` calls (after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / reps)
    return statistics.median(out)


def directions(conv: Callable, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor,
               reps: int) -> dict[str, float]:
    """ms of forward, backward-data and backward-filter of ``conv(x, w)``."""
    xg, wg = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    with torch.no_grad():
        fwd = timed(lambda: conv(x, w), reps)
    y_x = conv(xg, w)
    bwd_data = timed(lambda: torch.autograd.grad(y_x, xg, dy, retain_graph=True), reps)
    y_w = conv(x, wg)
    bwd_filter = timed(lambda: torch.autograd.grad(y_w, wg, dy, retain_graph=True), reps)
    return {"forward": fwd, "backward_data": bwd_data, "backward_filter": bwd_filter}


def probe(name: str, batch: int, workspace: int, reps: int) -> dict:
    c, h, wd, k, r, s, p = LAYERS[name]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(batch, c, h, wd, device=dev, generator=g).contiguous(
        memory_format=torch.channels_last)
    w = (torch.randn(k, c, r, r, device=dev, generator=g) / math.sqrt(c * r * r)).contiguous(
        memory_format=torch.channels_last)
    out_hw = (h + 2 * p - r) // s + 1
    dy = torch.randn(batch, k, out_hw, out_hw, device=dev, generator=g).contiguous(
        memory_format=torch.channels_last)
    x2, w2 = s2d_input(x, s, p), s2d_weight(w, s)
    dy2 = dy
    if x2.shape[2] - w2.shape[2] + 1 != out_hw:  # the rewrite's extra rows: dy padded with zeros
        extra = x2.shape[2] - w2.shape[2] + 1 - out_hw
        dy2 = F.pad(dy, (0, extra, 0, extra)).contiguous(memory_format=torch.channels_last)

    def ours(a: torch.Tensor, b: torch.Tensor, stride: int, pad: int) -> torch.Tensor:
        return mt.conv2d(a, b, stride=stride, padding=pad, workspace_limit=workspace)

    # correctness of the rewrite, float64 reference
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    x64.requires_grad_(True)
    w64.requires_grad_(True)
    y64 = F.conv2d(x64, w64, stride=s, padding=p)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy64)
    xr, wr = x2.detach().requires_grad_(True), w2.detach().requires_grad_(True)
    y2 = ours(xr, wr, 1, 0)
    dx2, dw2 = torch.autograd.grad(y2, (xr, wr), dy2)
    check = {
        "forward": float(((y2[:, :, :out_hw, :out_hw] - y64).abs().max() / y64.abs().max())),
        "backward_data": float(((d2s_input(dx2, s, p, c, h, wd) - dx64).abs().max()
                                / dx64.abs().max())),
        "backward_filter": float(((d2s_weight(dw2, s, c, r, r) - dw64).abs().max()
                                  / dw64.abs().max())),
    }
    torch.backends.cudnn.benchmark = True
    out = {"layer": name, "batch": batch, "workspace": workspace,
           "original": [batch, c, h, wd, k, r, s, p], "rewritten": list(x2.shape) + list(w2.shape),
           "max_rel_error_vs_float64": check}
    out["native"] = directions(lambda a, b: F.conv2d(a, b, stride=s, padding=p), x, w, dy, reps)
    out["mucudnn"] = directions(lambda a, b: ours(a, b, s, p), x, w, dy, reps)
    out["mucudnn-s2d"] = directions(lambda a, b: ours(a, b, 1, 0), x2, w2, dy2, reps)
    out["native-s2d"] = directions(lambda a, b: F.conv2d(a, b), x2, w2, dy2, reps)
    out["rearrange"] = {"s2d_input": timed(lambda: s2d_input(x, s, p), reps),
                        "d2s_input": timed(lambda: d2s_input(dx2, s, p, c, h, wd), reps)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", nargs="+", choices=sorted(LAYERS), default=sorted(LAYERS))
    ap.add_argument("--batch", type=int, nargs="+", default=[256])
    ap.add_argument("--workspace", type=parse_size, default=64 << 20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = True
    results = [probe(n, b, args.workspace, args.reps) for n in args.layers for b in args.batch]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    dirs = ("forward", "backward_data", "backward_filter")
    print("| layer | batch | mode | fwd ms | bwd-data ms | bwd-filter ms | sum |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        for mode in ("native", "mucudnn", "mucudnn-s2d", "native-s2d"):
            t = r[mode]
            print(f"| {r['layer']} | {r['batch']} | {mode} | "
                  + " | ".join(f"{t[d]:.3f}" for d in dirs) + f" | {sum(t.values()):.3f} |")
        print(f"| {r['layer']} | {r['batch']} | rearrange | s2d(x) {r['rearrange']['s2d_input']:.3f}"
              f" | d2s(dx) {r['rearrange']['d2s_input']:.3f} | | |")
        print(f"| {r['layer']} | {r['batch']} | rel. error | "
              + " | ".join(f"{r['max_rel_error_vs_float64'][d]:.1e}" for d in dirs) + " | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
