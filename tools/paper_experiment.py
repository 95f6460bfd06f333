#!/usr/bin/env python
"""The μ-cuDNN paper's experiment on this GPU: networks x per-layer limits x
policies x {WR, WD}, every plan executed and timed, with PyTorch as the anchor.

Each (network, policy) is benchmarked once (the SQLite cache answers every
later limit and mode), then each (limit, mode) is optimised, executed and
timed with ``mucudnn.bench.run_network``. WD's budget is the per-layer limit
times the number of kernels. Writes one JSON file with everything and prints a
summary table (markdown) last.

    python tools/paper_experiment.py --json out.json
    python tools/paper_experiment.py --nets alexnet resnet18 --limits 64MiB --policies powerOfTwo
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    from mucudnn.__main__ import parse_size
    from mucudnn.bench import run_network
    from mucudnn.networks import DEFAULT_BATCH

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", nargs="+", default=["alexnet", "resnet18", "resnet50", "vgg16"])
    ap.add_argument("--limits", nargs="+", type=parse_size,
                    default=[8 << 20, 64 << 20, 512 << 20])
    ap.add_argument("--policies", nargs="+", default=["undivided", "powerOfTwo", "all"],
                    help="'undivided' is also every run's baseline column")
    ap.add_argument("--modes", nargs="+", default=["wr", "wd"])
    ap.add_argument("--backend", nargs="+", default=["cudnn"])
    ap.add_argument("--batch", type=int, default=None,
                    help="one batch for every net (default: the paper's per net)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--torch", action="store_true", help="add the PyTorch anchor")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    rows, results, anchors = [], [], {}
    t_start = time.time()

    def save() -> None:  # after every run, so a run cut short keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"networks": [r.to_dict() for r in results], "pytorch": anchors}, f,
                          indent=1)

    for net in args.nets:
        tensors: dict = {}
        batch = args.batch or DEFAULT_BATCH[net]
        if args.torch:
            from pytorch_anchor import run as torch_run
            anchors[net] = torch_run(net, batch, args.dtype, args.repeat)
            save()
        for backend in args.backend:
            for policy in args.policies:
                for limit in args.limits:
                    for mode in args.modes:
                        if policy == "undivided" and mode == "wd":
                            continue  # WD over single-call fronts is WR's undivided column
                        r = run_network(net, batch, dtype=args.dtype, workspace_limit=limit,
                                        policy=policy, mode=mode, backend=backend,
                                        repeat=args.repeat, progress=False,
                                        time_alone=(mode == "wr" and policy == "powerOfTwo"),
                                        tensors=tensors)
                        results.append(r)
                        save()
                        rows.append((net, batch, backend, policy, limit >> 20, mode,
                                     r.total("undivided_ms"), r.total("micro_ms"), r.speedup,
                                     r.total("unlimited_ms"),
                                     anchors.get(net, {}).get("total_ms"),
                                     r.optimize_cold_s, r.optimize_warm_s,
                                     r.dispatch_overhead))
                        print(f"[{time.time() - t_start:6.0f} s] {net} {backend} {policy} "
                              f"{limit >> 20} MiB {mode}: {r.total('micro_ms'):.2f} ms "
                              f"({r.speedup:.2f}x)", flush=True)
        del tensors
    save()
    print("| net (batch) | backend | policy | limit MiB | mode | undivided ms | micro-batched ms "
          "| speedup | unlimited ms | PyTorch ms | optimise cold s | warm s | dispatch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (net, b, be, pol, lim, mode, und, mic, sp, unl, pt, cold, warm, disp) in rows:
        pts = f"{pt:.2f}" if pt else "-"
        ds = f"{100 * disp:+.1f}%" if disp == disp else "-"
        print(f"| {net} ({b}) | {be} | {pol} | {lim} | {mode} | {und:.2f} | {mic:.2f} | "
              f"{sp:.2f}x | {unl:.2f} | {pts} | {cold:.1f} | {warm:.3f} | {ds} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
