"""Plan quality without a GPU: where one benchmark run's plans lose against another's.

Given two benchmark caches of the same network (e.g. ``tools/cold_start.py
--configs default exhaustive --keep-caches DIR``: the default find() and one
that timed every configuration at every size), this makes each cache's WR
plans (as ``Convolution``'s first call would from them) and prices both with
the *reference* cache's measurements. Per kernel, and summed over the network
(each distinct kernel weighted by its occurrences):

* ``predicted``: the tested cache's plan at its own times (what its optimiser
  believed);
* ``at reference``: the same plan at the reference times (what it costs,
  as far as the reference knows);
* ``reference``: the reference cache's own plan at its own times.

``at reference - reference`` is the selection loss (the tested run chose
other sizes or configurations); ``predicted - at reference`` is how the tested
run's timing differs from the reference's on the same plan. A micro-batch the
reference never measured (a configuration it could not time at that size) is
priced at the tested cache's time and counted in ``unpriced``.

    python3 tools/plan_quality.py --net alexnet --cache DIR/alexnet-default.sqlite \\
        --reference DIR/alexnet-exhaustive.sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from frontier import PRECISIONS  # noqa: E402  (--precision: how the problems are built)
from mucudnn.networks import DEFAULT_BATCH, select, unique_problems  # noqa: E402
from mucudnn.optimizer import CachedBackend, benchmark, optimize_wr  # noqa: E402
from mucudnn.problem import AlgoPerf, ConvProblem, Direction, Plan  # noqa: E402
from mucudnn.units import parse_bytes  # noqa: E402


def _perf(be: CachedBackend, p: ConvProblem, d: Direction, policy: str,
          limit: int) -> dict[int, list[AlgoPerf]]:
    # the sizes the run measured: the warm descent goes as far as the cold one did
    return benchmark(be, p, d, policy, limit, cache=be.cache, progress=False, prune_sizes=True)


def _price(plan: Plan, ref: dict[int, list[AlgoPerf]]) -> tuple[float, int]:
    """``plan`` at the reference's times: (ms, micro-batches the reference lacks)."""
    total, missing = 0.0, 0
    for mb in plan.micro_batches:
        t = next((a.time_ms for a in ref.get(mb.size, ())
                  if a.algo == mb.algo and a.math_type == mb.math_type), None)
        if t is None:
            missing += 1
            t = mb.time_ms
        total += t
    return total, missing


def compare(net: str, cache: str, reference: str, *, batch: int | None = None,
            limit: int = 64 << 20, policy: str = "fitted", backend: str = "cudnn-graph",
            layers: list[str] | None = None, precision: str = "fp32") -> dict[str, Any]:
    """The comparison the module docstring describes, as a dict (``kernels``:
    one row per distinct kernel; ``total``: the weighted sums). ``layers``:
    only these layers of ``net``; ``precision``: a key of tools/frontier.py's
    PRECISIONS (dtype, layout and math of the problems, as the run measured
    them)."""
    tested, ref_be = CachedBackend(backend, cache=cache), CachedBackend(backend, cache=reference)
    rows = []
    tot = {"predicted": 0.0, "at_reference": 0.0, "reference": 0.0, "unpriced": 0}
    n_batch = batch if batch is not None else DEFAULT_BATCH[net]
    spec = PRECISIONS[precision]
    problems = {lay.name: lay.problem(n_batch, dtype=spec["dtype"], layout=spec["layout"],
                                      math=spec["math"]) for lay in select(net, layers)}
    for p, layers_of in unique_problems(problems).items():
        for d in Direction:
            mine = _perf(tested, p, d, policy, limit)
            theirs = _perf(ref_be, p, d, policy, limit)
            q = p.batch_quantum()
            a = optimize_wr(mine, p.batch, limit, policy, quantum=q)
            r = optimize_wr(theirs, p.batch, limit, policy, quantum=q)
            priced, missing = _price(a, theirs)
            row = {"layers": layers_of, "direction": d.value, "predicted": a.time_ms,
                   "at_reference": priced, "reference": r.time_ms, "unpriced": missing,
                   "plan": [[mb.size, mb.algo] for mb in a.micro_batches],
                   "reference_plan": [[mb.size, mb.algo] for mb in r.micro_batches]}
            rows.append(row)
            n = len(layers_of)
            for k in ("predicted", "at_reference", "reference"):
                tot[k] += n * row[k]
            tot["unpriced"] += missing
    return {"net": net, "precision": precision, "limit": limit, "policy": policy,
            "kernels": rows, "total": tot}


def _table(res: dict[str, Any]) -> str:
    out = ["| layers | direction | predicted ms | at reference ms | reference ms | plan | reference plan |",
           "|---|---|---|---|---|---|---|"]

    def plan(mbs: list) -> str:
        runs: list[list] = []
        for size, algo in mbs:
            if runs and runs[-1][1:] == [size, algo]:
                runs[-1][0] += 1
            else:
                runs.append([1, size, algo])
        return ", ".join(f"{c} x {s} {a}" for c, s, a in runs)

    for r in res["kernels"]:
        out.append(f"| {','.join(r['layers'])} | {r['direction']} | {r['predicted']:.3f} | "
                   f"{r['at_reference']:.3f} | {r['reference']:.3f} | {plan(r['plan'])} | "
                   f"{plan(r['reference_plan'])} |")
    t = res["total"]
    out.append(f"| total | | {t['predicted']:.2f} | {t['at_reference']:.2f} | "
               f"{t['reference']:.2f} | unpriced micro-batches: {t['unpriced']} | |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", required=True)
    ap.add_argument("--cache", required=True, help="the tested run's benchmark cache")
    ap.add_argument("--reference", required=True, help="the reference run's benchmark cache")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--layers", nargs="+", default=None, help="only these layers")
    ap.add_argument("--workspace", default="64MiB", help="per-kernel limit (default 64MiB)")
    ap.add_argument("--policy", default="fitted")
    ap.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32",
                    help="the problems' dtype, layout and math (tools/frontier.py's PRECISIONS)")
    ap.add_argument("--backend", default="cudnn-graph", help="the backend name in the caches")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    res = compare(a.net, a.cache, a.reference, batch=a.batch, limit=parse_bytes(a.workspace),
                  policy=a.policy, backend=a.backend, layers=a.layers, precision=a.precision)
    print(_table(res))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
