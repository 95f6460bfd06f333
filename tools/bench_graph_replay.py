#!/usr/bin/env python
"""What CUDA-graph replay saves on small layers: ResNet-18 layer4 (x (B, 512, 7, 7),
w (512, 512, 3, 3), padding 1) at batch 128 and 16, all three directions,
plans (the default policy) under a 64 MiB limit, run through ``mucudnn.Convolution`` with
``graph=False`` (one cuDNN call per micro-batch, dispatched from Python) and
``graph=True`` (the micro-batch sequence captured once, one graph launch per call).

Two numbers per case, both the median over ``--repeat`` (>= 20) calls after
``--warmup`` untimed calls:

* ``gpu_ms``: CUDA events recorded on the backend's stream around each call
  (includes any idle gaps the host leaves between micro-batches);
* ``wall_ms``: host wall time of ``--repeat`` back-to-back calls plus one final
  synchronise, divided by the count (throughput as a training loop sees it).

Usage::

    python tools/bench_graph_replay.py [--batches 128 16] [--repeat 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def _measure(conv, direction, args, out, stream, warmup, repeat):
    from mucudnn.cuda import time_on_stream

    call = {"forward": conv.forward, "backward_data": conv.backward_data,
            "backward_filter": conv.backward_filter}[direction]

    def fn():
        call(*args, out)

    gpu = time_on_stream(fn, stream, warmup=warmup, repeat=repeat)
    conv.backend.synchronize()
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        conv.backend.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3 / repeat)
    return statistics.median(gpu), statistics.median(walls)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[128, 16])
    ap.add_argument("--workspace-limit", type=int, default=64 << 20)
    ap.add_argument("--policy", default="fitted")
    ap.add_argument("--math", default="default")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", default=None, help="write the results as JSON to this path")
    a = ap.parse_args(argv)
    if a.repeat < 20:
        ap.error("--repeat must be >= 20")

    from mucudnn.api import Convolution
    from mucudnn.backends import get_backend
    from mucudnn.cuda import DeviceArray

    be = get_backend("cudnn")
    rng = np.random.default_rng(0)
    rows = []
    for batch in a.batches:
        xs, ws = (batch, 512, 7, 7), (512, 512, 3, 3)
        x = DeviceArray.from_numpy(rng.standard_normal(xs).astype(np.float32), stream=be.stream)
        w = DeviceArray.from_numpy((rng.standard_normal(ws) * 0.02).astype(np.float32),
                                   stream=be.stream)
        dy = DeviceArray.from_numpy(rng.standard_normal(xs).astype(np.float32), stream=be.stream)
        outs = {"forward": be.empty(xs, "float32"), "backward_data": be.empty(xs, "float32"),
                "backward_filter": be.empty(ws, "float32")}
        ins = {"forward": (x, w), "backward_data": (dy, w), "backward_filter": (x, dy)}
        for direction in ("forward", "backward_data", "backward_filter"):
            res = {}
            plan = None
            for graph in (False, True):
                conv = Convolution(xs, ws, padding=1, math=a.math,
                                   workspace_limit=a.workspace_limit, policy=a.policy,
                                   backend=be, graph=graph)
                plan = conv.plan(direction)
                res[graph] = _measure(conv, direction, ins[direction], outs[direction],
                                      be.stream, a.warmup, a.repeat)
            row = {
                "layer": "resnet18.layer4", "batch": batch, "direction": direction,
                "plan": plan.describe(), "micro_batches": len(plan.micro_batches),
                "algos": sorted({str(m.algo) for m in plan.micro_batches}),
                "workspace_bytes": plan.workspace_bytes,
                "plain_gpu_ms": res[False][0], "graph_gpu_ms": res[True][0],
                "plain_wall_ms": res[False][1], "graph_wall_ms": res[True][1],
            }
            row["gpu_speedup"] = row["plain_gpu_ms"] / row["graph_gpu_ms"]
            row["wall_speedup"] = row["plain_wall_ms"] / row["graph_wall_ms"]
            rows.append(row)

    hdr = (f"{'batch':>5} {'direction':<16} {'plan':<14} {'plain gpu':>10} {'graph gpu':>10} "
           f"{'x':>6} {'plain wall':>11} {'graph wall':>11} {'x':>6}")
    print(f"ResNet-18 layer4 (512x7x7, 3x3, pad 1), {a.policy}, "
          f"{a.workspace_limit >> 20} MiB, math={a.math}, median of {a.repeat} (ms)")
    print(f"device: {be.device_name}, cuDNN {be.version}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['batch']:>5} {r['direction']:<16} {r['plan']:<14} {r['plain_gpu_ms']:>10.3f} "
              f"{r['graph_gpu_ms']:>10.3f} {r['gpu_speedup']:>5.2f}x {r['plain_wall_ms']:>11.3f} "
              f"{r['graph_wall_ms']:>11.3f} {r['wall_speedup']:>5.2f}x")
    if a.json:
        meta = {"device": be.device_name, "cudnn": be.version, "policy": a.policy,
                "workspace_limit": a.workspace_limit, "math": a.math, "repeat": a.repeat,
                "warmup": a.warmup}
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=2)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
