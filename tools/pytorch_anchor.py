#!/usr/bin/env python
"""The peer anchor: PyTorch's own convolutions (cudnn.benchmark=True, unlimited
workspace) on the same layers, per direction, with their peak extra memory.

Forward is ``F.conv2d``; backward-data and backward-filter are
``aten.convolution_backward`` with one output mask each, so each direction is
timed alone (CUDA events, warm-up, median of ``--repeat``). Peak memory is the
caching allocator's peak during the timed call minus what was allocated before
it (so: output + workspace); ``peak_extra_bytes - output_bytes`` estimates the
workspace alone. ``--layout NHWC`` runs channels-last (``torch.channels_last``
tensors, as the problem's layout says).

    python tools/pytorch_anchor.py --net alexnet --batch 256 --json out.json
    python tools/pytorch_anchor.py --net resnet50 --dtype bfloat16 --layout NHWC
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Sequence


def time_layer(p, repeat: int = 10, warmup: int = 3, tf32: bool = True) -> dict:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    dev = torch.device("cuda")
    dt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}[p.dtype]
    cl = p.channels_last
    mf = (torch.channels_last if p.nd == 2 else torch.channels_last_3d) if cl else \
        torch.contiguous_format
    x = torch.randn(p.x_dims, device=dev, dtype=dt).to(memory_format=mf)
    w = torch.randn(p.w_dims, device=dev, dtype=dt).to(memory_format=mf)
    dy = torch.randn(p.y_dims, device=dev, dtype=dt).to(memory_format=mf)
    conv = F.conv2d if p.nd == 2 else F.conv3d
    kw = dict(stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups)

    def fwd():
        return conv(x, w, **kw)

    def bwd(mask):
        return torch.ops.aten.convolution_backward(
            dy, x, w, None, list(p.stride), list(p.padding), list(p.dilation), False,
            [0] * p.nd, p.groups, mask)

    fns = {"forward": fwd, "backward_data": lambda: bwd([True, False, False]),
           "backward_filter": lambda: bwd([False, True, False])}
    # what each direction writes: y, dx, dw
    out_bytes = {"forward": dy.numel() * dy.element_size(),
                 "backward_data": x.numel() * x.element_size(),
                 "backward_filter": w.numel() * w.element_size()}
    out = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        ts = []
        for _ in range(repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            r = fn()
            b.record()
            del r
            ts.append((a, b))
        torch.cuda.synchronize()
        out[name] = {"ms": statistics.median(a.elapsed_time(b) for a, b in ts),
                     "peak_extra_bytes": torch.cuda.max_memory_allocated() - base,
                     "output_bytes": out_bytes[name]}
    x = w = dy = None  # release the tensors (the closures above are done with them)
    torch.cuda.empty_cache()
    return out


def run(net: str, batch: int, dtype: str = "float32", repeat: int = 10, layout: str = "NCHW",
        layers: Sequence[str] | None = None) -> dict:
    """PyTorch's time for every conv layer of ``net`` (each distinct problem weighted by its
    count), fwd + bwd-data + bwd-filter, and its peak extra memory per kernel (the max).

    ``layout`` "NHWC" runs channels-last; ``layers`` restricts to some layer names."""
    import torch

    from mucudnn.networks import select, unique_problems

    probs = {l.name: l.problem(batch, dtype=dtype, layout=layout) for l in select(net, layers)}
    per_layer = {}
    total = {"forward": 0.0, "backward_data": 0.0, "backward_filter": 0.0}
    peak = peak_ws = 0
    for p, names in unique_problems(probs).items():
        r = time_layer(p, repeat=repeat)
        per_layer[names[0]] = {"count": len(names), **r}
        for d in total:
            total[d] += len(names) * r[d]["ms"]
            peak = max(peak, r[d]["peak_extra_bytes"])
            peak_ws = max(peak_ws, r[d]["peak_extra_bytes"] - r[d].get("output_bytes", 0))
    return {"net": net, "batch": batch, "dtype": dtype, "layout": layout,
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "device": torch.cuda.get_device_name(), "layers": per_layer,
            "total_ms": sum(total.values()), "total_by_direction": total,
            "max_peak_extra_bytes": peak, "max_peak_workspace_bytes": peak_ws}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", nargs="+", default=["alexnet"])
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="NCHW", choices=["NCHW", "NHWC"],
                    help="NHWC: channels-last tensors")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from mucudnn.networks import DEFAULT_BATCH

    results = [run(n, args.batch or DEFAULT_BATCH[n], args.dtype, args.repeat, layout=args.layout)
               for n in args.net]
    for r in results:
        print(f"PyTorch {r['torch']} cuDNN {r['cudnn']}: {r['net']} batch {r['batch']}: "
              f"{r['total_ms']:.2f} ms fwd+bwd, max peak extra "
              f"{r['max_peak_extra_bytes'] / 2**20:.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
