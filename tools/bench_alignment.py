#!/usr/bin/env python
"""How a micro-batch's offset (its pointers' alignment) changes cuDNN's speed.

A micro-batch at row ``k`` of a tensor starts ``k * bytes_per_sample`` bytes
into it. When a sample's byte size is not a multiple of 16 (AlexNet conv1's
input: 3 x 227 x 227 x 4 = 618348 bytes, 4 mod 16), an odd ``k`` leaves the
pointer only 4-byte aligned. Find times every algorithm on aligned buffers,
so a plan whose micro-batches sit at such offsets may run slower than Find
predicted. This script times every algorithm Find reports for one
micro-batch size at several row offsets and prints a table (median of
``--repeat`` CUDA-event timings, ms).

    python tools/bench_alignment.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys


CASES = {
    # name: (x shape at batch 1 [C, H, W], w shape, stride, padding)
    "alexnet.conv1": ((3, 227, 227), (96, 3, 11, 11), 4, 0),
    # y per sample 5 x 13 x 13 x 4 = 3380 bytes (4 mod 16), x 16 x 15 x 15 x 4 (aligned)
    "odd-y": ((16, 15, 15), (5, 16, 3, 3), 1, 0),
}


def main(argv=None) -> int:
    import numpy as np

    from mucudnn.backends import get_backend
    from mucudnn.backends.base import ConvTensors
    from mucudnn.cuda import time_on_stream
    from mucudnn.exec.views import micro_batch_tensors
    from mucudnn.problem import ConvProblem, Direction

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--backend", nargs="+", default=["cudnn", "cudnn-graph"])
    ap.add_argument("--size", type=int, default=36, help="micro-batch size")
    ap.add_argument("--offsets", type=int, nargs="+", default=[0, 1, 2, 3, 4, 8])
    ap.add_argument("--cap", type=int, default=512 << 20, help="Find's workspace cap (bytes)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    rows = []
    batch = args.size + max(args.offsets)
    for bname in args.backend:
        be = get_backend(bname)
        for case in args.cases:
            chw, wshape, stride, pad = CASES[case]
            full = ConvProblem((batch,) + chw, wshape, stride=stride, padding=pad)
            host = {n: rng.standard_normal(s).astype(np.float32)
                    for n, s in (("x", full.x_shape), ("w", full.w_shape),
                                 ("y", full.y_shape))}
            t = ConvTensors(full, *(be.from_host(host[n]) for n in ("x", "w", "y")))
            sample = {n: int(np.prod(getattr(full, f"{n}_shape")[1:])) * full.itemsize
                      for n in ("x", "y")}
            for d in Direction:
                mp = full.with_batch(args.size)
                for a in be.find(mp, d, args.cap):
                    ws = be.alloc_workspace(a.workspace_bytes) if a.workspace_bytes else None
                    row = {"backend": bname, "case": case, "direction": d.value,
                           "algo": str(a.algo), "find_ms": a.time_ms,
                           "bytes_per_sample": sample, "ms": {}}
                    for k in args.offsets:
                        mt = micro_batch_tensors(t, d, k, args.size)
                        try:
                            launch = be.bind(d, a.algo, a.math_type, mt, 1.0, 0.0, ws)
                            ms = statistics.median(time_on_stream(launch, be.stream, warmup=2,
                                                                  repeat=args.repeat))
                        except Exception as exc:  # report, keep measuring the others
                            ms = math.nan
                            row.setdefault("errors", {})[k] = f"{type(exc).__name__}: {exc}"[:200]
                        row["ms"][k] = ms
                    rows.append(row)
                    base = row["ms"][args.offsets[0]]
                    worst = max(row["ms"].values())
                    print(f"{bname:11s} {case:14s} {d.value:15s} algo {str(a.algo):12s} "
                          f"find {a.time_ms:7.3f} | " + " ".join(
                              f"k={k}:{v:8.3f}" for k, v in row["ms"].items())
                          + f" | worst/aligned {worst / base:6.2f}", flush=True)
                    del ws
        del t
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "offsets": args.offsets, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
