#!/usr/bin/env python
"""Does the knob space pay? Per kernel: heuristics vs knob search vs unlimited.

For each kernel (network, layer, direction; default: the layers that keep the
64 MiB plans behind PyTorch, docs/BENCHMARKS.md), the cudnn-graph backend plans
it as a user's first call does (``mucudnn.optimize``: fitted, WR under the
limit, benchmarked under that limit) twice: with ``search="heuristics"`` and
with ``search="knobs"`` (Note [knob search] in mucudnn/backends/cudnn_graph.py),
each with its own fresh benchmark cache. The best single call with unlimited
workspace (heuristics) is the reference. Every plan is then executed on the
same tensors (bound launchers, CUDA events, median of ``--repeat``), so the
numbers are executed times, not Find's. Writes JSON, prints a markdown table
last (executed ms per kernel, and the optimisation seconds each search cost).

    python tools/knob_search.py --json out/knobs.json
    python tools/knob_search.py --kernels resnet18:layer1.0.conv1:backward_data --limits 64MiB
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: Where 64 MiB plans lose to PyTorch (issue: "the last 12-25%").
DEFAULT_KERNELS = (
    "alexnet:conv1:backward_data", "alexnet:conv1:backward_filter",
    "alexnet:conv2:backward_data", "alexnet:conv2:backward_filter",
    "resnet18:conv1:backward_filter", "resnet18:layer1.0.conv1:backward_data",
    "resnet18:layer1.0.conv1:backward_filter", "resnet50:layer2.0.downsample:backward_filter",
)
SEARCHES = ("heuristics", "knobs")


def parse_kernel(text: str) -> tuple[str, str, str]:
    parts = text.split(":")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected net:layer:direction, got {text!r}")
    return parts[0], parts[1], parts[2]


def main(argv: Any = None) -> int:
    from mucudnn.__main__ import parse_policy, parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", nargs="+", type=parse_kernel,
                    default=[parse_kernel(k) for k in DEFAULT_KERNELS])
    ap.add_argument("--limits", nargs="+", type=parse_size, default=[64 << 20, 128 << 20])
    ap.add_argument("--policy", type=parse_policy, default="fitted",
                    help="fitted (default), powerOfTwo, all, undivided or sizes like 64,48,32")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="NCHW")
    ap.add_argument("--knob-values", type=int, default=6)
    ap.add_argument("--max-configs", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from mucudnn import networks
    from mucudnn.backends.cudnn_graph import CudnnGraphBackend
    from mucudnn.bench import make_timer, random_tensors
    from mucudnn.exec.runner import prepare
    from mucudnn.optimizer import optimize
    from mucudnn.problem import Direction

    tmp = tempfile.mkdtemp(prefix="mucudnn-knobs-")
    big = 8 << 30
    backends = {
        "heuristics": CudnnGraphBackend(find_workspace_limit=big),
        "knobs": CudnnGraphBackend(find_workspace_limit=big, search="knobs",
                                   search_knob_values=args.knob_values,
                                   search_max_configs=args.max_configs),
    }
    caches = {s: os.path.join(tmp, f"{s}.sqlite") for s in SEARCHES}
    ref = backends["heuristics"]
    timer = make_timer(ref)
    rows: list[dict] = []
    t_start = time.time()

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"kernels": rows, "args": {k: v for k, v in vars(args).items()
                                                     if k != "kernels"}}, f, indent=1)

    for net, layer, dname in args.kernels:
        if args.max_seconds and time.time() - t_start > args.max_seconds:
            print(f"stopping: --max-seconds {args.max_seconds} reached", flush=True)
            break
        d = Direction.parse(dname)
        (lay,) = networks.select(net, [layer])
        p = lay.problem(networks.DEFAULT_BATCH[net], dtype=args.dtype, layout=args.layout)
        row: dict[str, Any] = {"net": net, "layer": layer, "direction": d.value,
                               "problem": p.to_dict(), "limits": {}}
        plans = {}
        t = time.perf_counter()
        plans["unlimited"] = optimize(p, d, big, "undivided", ref, cache=caches["heuristics"])
        row["unlimited_optimize_s"] = time.perf_counter() - t
        for limit in args.limits:
            for s in SEARCHES:
                be = backends[s]
                be.find_profile.reset()
                t = time.perf_counter()
                plans[s, limit] = optimize(p, d, limit, args.policy, be, cache=caches[s])
                row["limits"].setdefault(str(limit), {})[s] = {
                    "optimize_s": time.perf_counter() - t,
                    "predicted_ms": plans[s, limit].time_ms,
                    "plan": plans[s, limit].to_dict(),
                    "find_profile": be.find_profile.as_dict()}
        tensors = random_tensors(ref, p)
        ws = ref.alloc_workspace(max(q.workspace_bytes for q in plans.values()) or 1)
        with ref.on_home_stream():
            for key, q in plans.items():
                # a knob-space plan's configs run on the reference backend too:
                # ids name the engine and knobs, which run() rebuilds
                launch = prepare(q, ref, tensors, 1.0, 0.0, ws, direction=d)
                ms = timer(launch, 3, args.repeat)
                if key == "unlimited":
                    row["unlimited_ms"] = ms
                    row["unlimited_workspace"] = q.workspace_bytes
                else:
                    s, limit = key
                    row["limits"][str(limit)][s]["executed_ms"] = ms
        ws.close()
        for a in (tensors.x, tensors.w, tensors.y):
            a.close()
        rows.append(row)
        save()
        parts = [f"{net} {layer} {d.value}: unlimited {row['unlimited_ms']:.3f} ms"]
        for limit, r in row["limits"].items():
            parts.append(f"{int(limit) >> 20} MiB heur {r['heuristics']['executed_ms']:.3f} "
                         f"knobs {r['knobs']['executed_ms']:.3f}")
        print("; ".join(parts), flush=True)

    print()
    print("| kernel | " + " | ".join(f"{lim >> 20} MiB heur / knobs (opt s)" for lim in
                                     args.limits) + " | unlimited |")
    print("|---|" + "---|" * (len(args.limits) + 1))
    tot: dict[str, float] = {}
    for row in rows:
        cells = []
        for limit in args.limits:
            r = row["limits"][str(limit)]
            h, k = r["heuristics"], r["knobs"]
            cells.append(f"{h['executed_ms']:.3f} / {k['executed_ms']:.3f} "
                         f"({h['optimize_s']:.1f} / {k['optimize_s']:.1f})")
            for s in SEARCHES:
                tot[f"{limit}:{s}"] = tot.get(f"{limit}:{s}", 0.0) + r[s]["executed_ms"]
        tot["unlimited"] = tot.get("unlimited", 0.0) + row["unlimited_ms"]
        print(f"| {row['net']} {row['layer']} {row['direction']} | " + " | ".join(cells)
              + f" | {row['unlimited_ms']:.3f} |")
    if rows:
        cells = [f"{tot[f'{lim}:heuristics']:.3f} / {tot[f'{lim}:knobs']:.3f}"
                 for lim in args.limits]
        print("| **sum** | " + " | ".join(cells) + f" | {tot['unlimited']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
