"""Time the WD integer program (mucudnn.optimizer.optimize_wd) on a large instance.

160 kernels x 20 Pareto plans each (random but shaped like real fronts:
workspace from 0 up to ~1 GiB, time falling steeply then flattening), with a
budget that forces trade-offs. Prints the median solve time over several runs.

    python tools/bench_ilp.py [--kernels 160] [--plans 20] [--runs 7] [--seed 0]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import scipy

from mucudnn.optimizer import optimize_wd
from mucudnn.problem import MicroBatch, make_plan


def random_front(rng: np.random.Generator, plans: int) -> list:
    """A front like a conv layer's: t falls from a slow zero-workspace plan to a
    fast one needing hundreds of MiB; workspace ascending, time strictly falling."""
    t_fast = rng.uniform(0.2, 3.0)
    t_slow = t_fast * rng.uniform(1.5, 10.0)
    ws_max = rng.uniform(16, 1024) * (1 << 20)
    ws = np.concatenate([[0], np.sort(rng.uniform(0, 1, plans - 1)) ** 2 * ws_max])
    ws = np.maximum.accumulate(ws.astype(np.int64) + np.arange(plans))  # strictly ascending
    frac = np.concatenate([[0], np.sort(rng.uniform(0, 1, plans - 1))])
    times = t_slow - (t_slow - t_fast) * np.sqrt(frac)
    times = np.minimum.accumulate(times - np.arange(plans) * 1e-6)
    out = []
    for w, t in zip(ws, times):
        mb = MicroBatch(offset=0, size=1, algo=0, workspace_bytes=int(w), time_ms=float(t))
        out.append(make_plan([mb], undivided_time_ms=float(t_slow), workspace_limit=int(w)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=160)
    ap.add_argument("--plans", type=int, default=20)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-fraction", type=float, default=0.25,
                    help="budget as a fraction of the sum of every kernel's largest plan")
    args = ap.parse_args()
    times = []
    for r in range(args.runs):
        rng = np.random.default_rng(args.seed + r)
        fronts = {f"k{i}": random_front(rng, args.plans) for i in range(args.kernels)}
        budget = int(args.budget_fraction * sum(f[-1].workspace_bytes for f in fronts.values()))
        t0 = time.perf_counter()
        chosen = optimize_wd(fronts, budget)
        times.append(time.perf_counter() - t0)
        used = sum(p.workspace_bytes for p in chosen.values())
        assert used <= budget, (used, budget)
    print(f"optimize_wd: {args.kernels} kernels x {args.plans} plans, {args.runs} runs: "
          f"median {statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}); "
          f"scipy {scipy.__version__}, Python {platform.python_version()}, "
          f"{platform.processor() or platform.machine()}")


if __name__ == "__main__":
    main()
