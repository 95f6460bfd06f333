#!/usr/bin/env python
"""Where the fastest configurations' workspace goes: copies of the operands, or scratch.

For every entry of a benchmark cache (one backend, default ``cudnn-graph``) that
was measured with an uncapped workspace (cap >= ``--min-cap``) at a batch of at
least ``--min-batch``, this takes the fastest configuration and relates its
workspace to the bytes of the call's operands (x, y and w together):

* ``copies``: 0.85-1.25x the operands: the engine copies its operands into the
  workspace (Note [fp32 transposes in workspace] in mucudnn/problem/layouts.py: on the
  H200 the fastest float32 NCHW engines copy x and y to NHWC and back);
* ``small``: under 0.1x (scratch, split-K partial sums, nothing);
* ``other``: anything else.

It prints a markdown table per (dtype, layout, direction): kernels in each
class, and the engines of the ``copies`` class. Nothing runs on a GPU.

    python tools/workspace_anatomy.py        # the shipped H200 cache (float32 NCHW)
    python tools/workspace_anatomy.py --cache out/cache.sqlite --json out/anatomy.json
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
from typing import Any, Iterable, Sequence

from mucudnn.optimizer.cache import Entry
from mucudnn.optimizer.cache_tools import open_input
from mucudnn.problem import ConvProblem
from mucudnn.units import parse_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHIPPED = os.path.join(ROOT, "tests", "data", "h200-benchmark-cache.sqlite.gz")
CLASSES = ("copies", "small", "other")
#: a workspace within these multiples of the operands' bytes counts as copies of them
COPIES = (0.85, 1.25)
SMALL = 0.1


def operand_bytes(p: ConvProblem) -> int:
    """Bytes of x, y and w of one call."""
    return p.itemsize * sum(math.prod(p.shape_of(t)) for t in ("x", "y", "w"))


def classify(workspace: int, operands: int) -> str:
    """``copies``, ``small`` or ``other`` (see the module doc).

    >>> classify(100, 100), classify(5, 100), classify(50, 100), classify(0, 100)
    ('copies', 'small', 'other', 'small')
    """
    r = workspace / operands
    if r < SMALL:
        return "small"
    return "copies" if COPIES[0] <= r <= COPIES[1] else "other"


def engine(algo: Any) -> str:
    """The engine of a graph-backend config id ("e68;k2=0;..." -> "e68"); the id as text
    otherwise (legacy algorithms are ints)."""
    return str(algo).split(";", 1)[0]


def anatomy(entries: Iterable[Entry], *, min_batch: int = 32,
            min_cap: int = 1 << 30) -> list[dict[str, Any]]:
    """One row per (dtype, layout, direction): kernel counts per class and the engines
    of the copies class (engine -> kernels), over the entries that qualify."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for e in entries:
        if e.workspace_cap < min_cap or not e.results:
            continue
        p = ConvProblem.from_key(e.problem)
        if p.batch < min_batch:
            continue
        best = min(e.results, key=lambda r: r.time_ms)
        key = (p.dtype, p.layout, e.direction)
        row = rows.setdefault(key, {"dtype": p.dtype, "layout": p.layout,
                                    "direction": e.direction, "kernels": 0,
                                    **{c: 0 for c in CLASSES}, "copies_engines": {}})
        cls = classify(best.workspace_bytes, operand_bytes(p))
        row["kernels"] += 1
        row[cls] += 1
        if cls == "copies":
            eng = row["copies_engines"]
            eng[engine(best.algo)] = eng.get(engine(best.algo), 0) + 1
    return [rows[k] for k in sorted(rows)]


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["dtype", "layout", "direction", "kernels", "copies", "small", "other",
            "engines of the copies"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        eng = collections.Counter(r["copies_engines"]).most_common()
        lines.append("| " + " | ".join([
            r["dtype"], r["layout"], r["direction"], str(r["kernels"]),
            *(f"{r[c]} ({100 * r[c] / r['kernels']:.0f}%)" for c in CLASSES),
            ", ".join(f"{e} x{n}" for e, n in eng) or "-"]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=SHIPPED,
                    help="benchmark cache, SQLite or .sqlite.gz (default: the shipped H200 one)")
    ap.add_argument("--backend", default="cudnn-graph")
    ap.add_argument("--min-batch", type=int, default=32)
    ap.add_argument("--min-cap", type=parse_bytes, default=1 << 30,
                    help="only entries measured under at least this workspace cap (default 1 GiB)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.min_batch < 1:
        ap.error("--min-batch: expected a positive int")
    cache = open_input(args.cache, "--cache")
    try:
        rows = anatomy(cache.entries(backend=args.backend), min_batch=args.min_batch,
                       min_cap=args.min_cap)
    finally:
        cache.close()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cache": os.path.basename(args.cache), "backend": args.backend,
                       "min_batch": args.min_batch, "rows": rows}, f, indent=1)
    print(f"Fastest configuration per kernel ({args.backend}, batch >= {args.min_batch}, "
          f"uncapped): its workspace against the operands' bytes (x + y + w); copies: "
          f"{COPIES[0]}-{COPIES[1]}x, small: < {SMALL}x")
    print()
    print(format_table(rows) if rows else "no entries qualify")
    return 0


if __name__ == "__main__":
    sys.exit(main())
