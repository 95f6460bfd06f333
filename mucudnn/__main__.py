"""The command line: ``python -m mucudnn bench | optimize | plot | cache``.

    python -m mucudnn bench --net alexnet --batch 256 --workspace 64MiB --policy powerOfTwo
    python -m mucudnn optimize --net resnet18 --workspace 64MiB --json plans.json
    python -m mucudnn plot --net alexnet --out figures/
    python -m mucudnn cache info | export h200.sqlite.gz | import h200.sqlite.gz | merge a b -o c
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from typing import Any, Sequence

from .backends import get_backend
from .bench import format_table, run_network, save_json
from .cuda import device_count
from .networks import DEFAULT_BATCH, NETWORKS, select
from .optimizer import cache_tools, optimize, optimize_network
from .optimizer.cache import CacheFileError
from .optimizer.offline import CachedBackend, CacheMissError
from .plot import plot_network
from .units import parse_bytes

#: Batch used on the NumPy backend when no GPU is there (keeps a network under a minute).
CPU_BATCH = 2


def parse_size(text: str) -> int:
    """A size argument in bytes (units as :func:`mucudnn.units.parse_bytes` reads them).

    >>> parse_size("64MiB"), parse_size("1.5GiB"), parse_size("100")
    (67108864, 1610612736, 100)
    """
    try:
        return parse_bytes(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("size: ")) from None


def _policy(text: str) -> Any:
    if re.fullmatch(r"[0-9,\s]+", text):
        return [int(v) for v in text.split(",") if v.strip()]
    return text


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--net", required=True, choices=sorted(NETWORKS), help="network")
    p.add_argument("--batch", type=int, default=None,
                   help="mini-batch size (default: the paper's: alexnet 256, resnet 128, vgg16 64)")
    p.add_argument("--dtype", default="float32",
                   choices=["float32", "float16", "bfloat16", "float64"])
    p.add_argument("--layout", default="NCHW", choices=["NCHW", "NHWC"])
    p.add_argument("--math", default="default",
                   choices=["default", "fma", "tensor_op", "tensor_op_allow_conversion"])
    p.add_argument("--workspace", type=parse_size, default=64 << 20,
                   help="workspace limit per kernel, e.g. 64MiB (default 64MiB)")
    p.add_argument("--policy", type=_policy, default="powerOfTwo",
                   help="batch-size policy: powerOfTwo, all, undivided or a list like 64,32")
    p.add_argument("--mode", default="wr", choices=["wr", "wd"],
                   help="wr: a limit per kernel; wd: one total budget for all kernels")
    p.add_argument("--total-workspace", type=parse_size, default=None,
                   help="WD budget (default: --workspace x number of kernels)")
    p.add_argument("--backend", default=None, choices=["cudnn", "cudnn-graph", "numpy"],
                   help="default: $MUCUDNN_BACKEND, else cudnn-graph where a GPU is present, else numpy")
    p.add_argument("--offline", action="store_true",
                   help="answer from the benchmark cache only (measurements made on a GPU "
                        "elsewhere; set MUCUDNN_CACHE to that file); for optimize and plot")
    p.add_argument("--layers", default=None, help="comma-separated layer names (default: all)")
    p.add_argument("--directions", default="forward,backward_data,backward_filter")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("-v", "--verbose", action="store_true", help="log each plan")


def _layers(args: argparse.Namespace) -> list[str] | None:
    return args.layers.split(",") if args.layers else None


def _resolve(args: argparse.Namespace) -> tuple[Any, int]:
    """Backend (a name, None for the default, or the offline CachedBackend) and
    batch; prints first a line saying so when offline or falling back to the CPU."""
    backend = args.backend
    batch = args.batch or DEFAULT_BATCH[args.net]
    if getattr(args, "offline", False):
        be = CachedBackend(backend or "cudnn-graph")
        print(f"offline: plans from cached measurements of {be.name} on {be.device_name} "
              f"({be.version})", flush=True)
        return be, batch
    if backend is None and device_count() == 0 and not os.environ.get("MUCUDNN_BACKEND"):
        backend = "numpy"
        small = min(batch, CPU_BATCH) if args.batch is None else batch
        print(f"note: no CUDA GPU found; running on the NumPy (CPU) backend at batch {small}"
              f"{'' if small == batch else f' instead of {batch}'} (pass --batch to choose)",
              flush=True)
        batch = small
    return backend, batch


def cmd_bench(args: argparse.Namespace) -> int:
    if args.offline:
        raise SystemExit("bench: --offline cannot execute plans; use optimize or plot offline")
    backend, batch = _resolve(args)
    backend = get_backend(backend).name
    repeat = args.repeat if args.repeat is not None else (3 if backend == "numpy" else 10)
    r = run_network(args.net, batch, dtype=args.dtype, layout=args.layout, math_mode=args.math,
                    workspace_limit=args.workspace, policy=args.policy, mode=args.mode,
                    total_workspace=args.total_workspace, backend=backend, repeat=repeat,
                    warmup=1 if backend == "numpy" else 3,
                    layers=_layers(args),
                    directions=args.directions.split(","), progress=not args.no_progress,
                    graph=args.graph)
    print(format_table(r))
    if args.json:
        save_json([r], args.json)
        print(f"wrote {args.json}")
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    backend, batch = _resolve(args)
    probs = {l.name: l.problem(batch, dtype=args.dtype, layout=args.layout, math=args.math)
             for l in select(args.net, _layers(args))}
    dirs = args.directions.split(",")
    progress = not args.no_progress
    if args.mode == "wd":
        total = args.total_workspace or args.workspace * len(probs) * len(dirs)
        plans = optimize_network(probs, total, dirs, policy=args.policy, backend=backend,
                                 progress=progress)
    else:
        memo: dict = {}  # a repeated layer (same problem) shares its plan
        plans = {}
        for name, p in probs.items():
            for d in dirs:
                if (p, d) not in memo:
                    memo[p, d] = optimize(p, d, args.workspace, args.policy, backend,
                                          progress=progress)
                plans[name, d] = memo[p, d]
    out = []
    for (name, d), plan in plans.items():
        out.append({"layer": name, "direction": str(d), **plan.to_dict()})
        und = f"{plan.undivided_time_ms:.3f}" if math.isfinite(plan.undivided_time_ms) else "n/a"
        print(f"{name:24s} {str(d):16s} {plan.describe():>18s}  predicted {plan.time_ms:8.3f} ms"
              f"  undivided {und:>8s} ms  workspace {plan.workspace_bytes / (1 << 20):7.1f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    backend, batch = _resolve(args)
    files = plot_network(args.net, batch, out_dir=args.out, dtype=args.dtype,
                         layout=args.layout, math_mode=args.math, policy=args.policy,
                         backend=backend, workspace_limit=args.workspace,
                         layers=_layers(args),
                         directions=args.directions.split(","), progress=not args.no_progress)
    for f in files:
        print(f"wrote {f}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    """``cache info|export|import|merge`` (see :mod:`mucudnn.optimizer.cache_tools`)."""
    if args.cache_command == "info":
        print(cache_tools.info(args.path))
    elif args.cache_command == "export":
        n = cache_tools.export(args.out, backend=args.backend, device=args.device,
                               version=args.version, force=args.force)
        print(f"wrote {n} entries to {args.out}")
    elif args.cache_command == "import":
        read, stored = cache_tools.import_cache(args.file)
        print(f"imported {args.file}: {read} entries read, {stored} added or replaced "
              "(entries measured under a larger workspace cap are kept)")
    else:
        n = cache_tools.merge(args.inputs, args.out, force=args.force)
        print(f"wrote {n} entries to {args.out}")
    return 0


def _cache_parser(sub: Any) -> None:
    c = sub.add_parser("cache", help="inspect, export, import and merge benchmark caches",
                       description="The current cache is MUCUDNN_CACHE's file (default: the "
                       "user cache directory). Portable files are gzipped SQLite caches "
                       "(*.sqlite.gz), usable directly and read-only as MUCUDNN_CACHE.")
    cs = c.add_subparsers(dest="cache_command", required=True)
    i = cs.add_parser("info", help="path, schema version and entries per backend/device/version")
    i.add_argument("path", nargs="?", default=None, help="a cache file (default: the current one)")
    e = cs.add_parser("export", help="write the current cache's entries to a portable file")
    e.add_argument("out", help="output file; *.gz: gzipped SQLite (portable), else plain SQLite")
    e.add_argument("--backend", default=None, help="only this backend (e.g. cudnn-graph)")
    e.add_argument("--device", default=None, help='only this device (e.g. "NVIDIA H200")')
    e.add_argument("--version", default=None, help="only this library version (e.g. 9.19.0)")
    e.add_argument("--force", action="store_true", help="replace OUT if it exists")
    m = cs.add_parser("import", help="merge a cache file (SQLite or .sqlite.gz) into the "
                                     "current cache; larger workspace caps win")
    m.add_argument("file")
    g = cs.add_parser("merge", help="merge cache files into a new one")
    g.add_argument("inputs", nargs="+", help="cache files (SQLite or .sqlite.gz)")
    g.add_argument("-o", "--out", required=True, help="output file (*.gz: gzipped)")
    g.add_argument("--force", action="store_true", help="replace OUT if it exists")
    c.set_defaults(func=cmd_cache, verbose=False)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mucudnn", description=(
        "Micro-batched cuDNN convolutions: benchmark, optimise and plot networks; "
        "manage benchmark caches."))
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="optimise, execute and time every conv layer of a network")
    _common(b)
    b.add_argument("--repeat", type=int, default=None,
                   help="timed runs per plan (median; default 10 on a GPU, 3 on NumPy)")
    b.add_argument("--json", default=None, help="write all numbers to this JSON file")
    b.add_argument("--graph", action="store_true",
                   help="time plans replayed as CUDA graphs (as Convolution(graph=True) runs)")
    b.set_defaults(func=cmd_bench)
    o = sub.add_parser("optimize", help="print or save the plans of a network as JSON")
    _common(o)
    o.add_argument("--json", default=None, help="write the plans to this JSON file")
    o.set_defaults(func=cmd_optimize)
    p = sub.add_parser("plot", help="draw Pareto fronts and the speedup-versus-limit curve")
    _common(p)
    p.add_argument("--out", default=".", help="folder for the PNG files")
    p.set_defaults(func=cmd_plot)
    _cache_parser(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, CacheMissError, CacheFileError) as exc:  # found past argparse: exit 2
        parser.exit(2, f"{parser.prog} {args.command}: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
