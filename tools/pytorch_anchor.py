#!/usr/bin/env python
"""The peer anchor: PyTorch's own convolutions (cudnn.benchmark=True, unlimited
workspace) on the same layers, per direction, with their peak extra memory.

Forward is ``F.conv2d``; backward-data and backward-filter are
``aten.convolution_backward`` with one output mask each, so each direction is
timed alone (CUDA events, warm-up, median of ``--repeat``). Peak memory is the
caching allocator's peak during the timed call minus what was allocated before
it (so: output + workspace).

    python tools/pytorch_anchor.py --net alexnet --batch 256 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


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
                     "peak_extra_bytes": torch.cuda.max_memory_allocated() - base}
    x = w = dy = None  # release the tensors (the closures above are done with them)
    torch.cuda.empty_cache()
    return out


def run(net: str, batch: int, dtype: str = "float32", repeat: int = 10) -> dict:
    import torch

    from mucudnn.networks import network, unique_problems

    probs = network(net, batch, dtype=dtype)
    layers = {}
    total = {"forward": 0.0, "backward_data": 0.0, "backward_filter": 0.0}
    peak = 0
    for p, names in unique_problems(probs).items():
        r = time_layer(p, repeat=repeat)
        layers[names[0]] = {"count": len(names), **r}
        for d in total:
            total[d] += len(names) * r[d]["ms"]
            peak = max(peak, r[d]["peak_extra_bytes"])
    return {"net": net, "batch": batch, "dtype": dtype, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "device": torch.cuda.get_device_name(),
            "layers": layers, "total_ms": sum(total.values()), "total_by_direction": total,
            "max_peak_extra_bytes": peak}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", nargs="+", default=["alexnet"])
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from mucudnn.networks import DEFAULT_BATCH

    results = [run(n, args.batch or DEFAULT_BATCH[n], args.dtype, args.repeat) for n in args.net]
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
