#!/usr/bin/env python
"""The memory-speed frontier: executed network conv time against the per-kernel
workspace limit, with PyTorch's point on the same axes.

For each network (AlexNet, ResNet-18, ResNet-50, VGG-16 at their default
batches) and each precision (``fp32``: float32 NCHW, math "default", so TF32
is allowed as in PyTorch's default; ``bf16cl``: bfloat16 channels-last; on
request ``fp32cl``: float32 channels-last, TF32 allowed), one
process measures

* PyTorch's point (``tools/pytorch_anchor.py``): its own convolutions with
  ``cudnn.benchmark=True`` and unlimited workspace, every direction timed
  alone, summed over all conv kernels (fwd + bwd-data + bwd-filter, each
  distinct layer weighted by its count), and its peak extra memory per kernel
  (the caching allocator's peak during a call minus what was allocated
  before it, so output + workspace; the max over kernels);
* mucudnn's executed total at each ``--limits`` (WR, ``--policy``): every
  conv kernel optimised under that workspace limit, its plan executed and
  timed (:func:`mucudnn.bench.run_network`), summed the same way.

Every limit benchmarks under the same workspace cap (``mucudnn.bench.UNLIMITED``;
"unlimited" is run with that cap as its limit), so the first limit of a
(network, precision) fills the benchmark cache and the later ones are cache
hits; limits run largest first so that even a limit above that cap would
answer the later ones. The random device tensors are reused across limits.

Results go to ``--json`` after every run (a time-out keeps what was done);
then the figure (``--figure``: one subplot per network, time against limit on
a log2 axis, "unlimited" at the right end, PyTorch as a star at its peak extra
memory per kernel) and a markdown table (printed last, and written next to
the JSON as ``.md``). ``--max-seconds`` stops starting new runs after that
many seconds; SIGTERM (``timeout``) stops the run in progress and still draws
what was measured. ``--plot-only`` redraws the figure and table from saved
JSON files (merged; no GPU, no torch needed).

    python tools/frontier.py --json out/frontier.json --max-seconds 480
    python tools/frontier.py --nets resnet50 vgg16 --precisions bf16cl --json out/f2.json
    python tools/frontier.py --plot-only out/frontier.json out/f2.json --json out/all.json
"""

from __future__ import annotations

import argparse
import ast
import gc
import gzip
import json
import math
import os
import signal
import sys
import time
import traceback
from typing import Any, Sequence

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)

SCHEMA = "mucudnn-frontier/1"
MIB = 1 << 20
#: precision name -> how its problems are built, and its figure label and colour
PRECISIONS: dict[str, dict[str, str]] = {
    "fp32": {"dtype": "float32", "layout": "NCHW", "math": "default",
             "label": "fp32 NCHW (TF32 allowed)", "color": "C0"},
    "bf16cl": {"dtype": "bfloat16", "layout": "NHWC", "math": "default",
               "label": "bf16 channels-last", "color": "C3"},
    # Note [fp32 transposes in workspace] (mucudnn/problem/layouts.py): the fp32 NCHW
    # engines that win unlimited copy their operands to NHWC in their workspace;
    # channels-last needs none.
    "fp32cl": {"dtype": "float32", "layout": "NHWC", "math": "default",
               "label": "fp32 channels-last (TF32 allowed)", "color": "C2"},
}
#: the precisions a run measures unless --precisions says otherwise
DEFAULT_PRECISIONS = ["fp32", "bf16cl"]
DEFAULT_NETS = ["alexnet", "resnet18", "resnet50", "vgg16"]
#: 8 MiB .. 512 MiB and unlimited (None)
DEFAULT_LIMITS: list[int | None] = [(8 << k) * MIB for k in range(7)] + [None]
#: the limits compared with PyTorch in the table's last columns
VS_PYTORCH = (64 << 20, 128 << 20)
UNLIMITED_WORDS = ("unlimited", "none", "inf")


class Interrupted(Exception):
    """SIGTERM arrived: stop measuring, keep and draw what was measured."""


# -- arguments -----------------------------------------------------------------------------------
def parse_limit(text: str) -> int | None:
    """A per-kernel workspace limit in bytes ("64MiB", "1GiB", ...); None for "unlimited"."""
    if text.strip().lower() in UNLIMITED_WORDS:
        return None
    from mucudnn.__main__ import parse_size  # the project's size parser (argparse errors)
    return parse_size(text)


def parse_policy(text: str) -> Any:
    """A batch-size policy: a name, or sizes such as ``64,48,32`` (the command line's parser).
    The default is not parsed: ``--plot-only`` imports no mucudnn."""
    if text == "fitted":
        return text
    from mucudnn.__main__ import parse_policy as parse  # argparse errors, like parse_limit's
    return parse(text)


def parse_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--backend-option``: the value as a Python literal
    where it is one, else the string.

    >>> parse_option("find_carry=True"), parse_option("find_rtc=all")
    (('find_carry', True), ('find_rtc', 'all'))
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY a name, got {text!r}")
    try:
        parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        parsed = value.strip()
    return key.strip(), parsed


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", nargs="+", default=list(DEFAULT_NETS))
    ap.add_argument("--precisions", nargs="+", choices=list(PRECISIONS),
                    default=list(DEFAULT_PRECISIONS))
    ap.add_argument("--limits", nargs="+", type=parse_limit, default=None,
                    help="per-kernel workspace limits, e.g. 8MiB 64MiB unlimited (default: "
                         f"{', '.join(fmt_limit(l) for l in DEFAULT_LIMITS)})")
    ap.add_argument("--policy", type=parse_policy, default="fitted",
                    help="fitted (default), powerOfTwo, all, undivided or sizes like 64,48,32")
    ap.add_argument("--backend", default=None,
                    help="mucudnn backend (default: get_backend()'s, cudnn-graph on a GPU)")
    ap.add_argument("--backend-option", action="append", type=parse_option, default=[],
                    metavar="KEY=VALUE", dest="backend_options",
                    help="an option of the backend's constructor, the value a Python literal "
                         "(e.g. find_carry=True; repeatable)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--batch", type=int, default=None,
                    help="one batch for every net (default: each net's DEFAULT_BATCH)")
    ap.add_argument("--layers", nargs="+", default=None,
                    help="only these layers of each net (smoke tests)")
    ap.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                    help="measure PyTorch's point (default: on)")
    ap.add_argument("--cache", default=None,
                    help="benchmark cache file (default: MUCUDNN_CACHE's; if that is off, a "
                         "temporary file, so later limits still reuse the first's benchmarks)")
    ap.add_argument("--json", default=None,
                    help="results, written after every run (with --plot-only: the merged "
                         "results); the table goes next to it as .md")
    ap.add_argument("--figure", default=os.path.join(ROOT, "docs", "figures", "frontier.png"),
                    help="the PNG (default: docs/figures/frontier.png of this checkout; '' for none)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no new run after this many seconds (what was done is kept)")
    ap.add_argument("--plot-only", nargs="+", default=None, metavar="JSON",
                    help="redraw the figure and table from saved results (.json or .json.gz, "
                         "merged in order; the table goes next to --json, else the first)")
    args = ap.parse_args(argv)
    if args.limits is None:
        args.limits = list(DEFAULT_LIMITS)
    if args.repeat < 1:
        ap.error("--repeat: expected a positive int")
    return args


def limit_order(limits: Sequence[int | None]) -> list[int | None]:
    """Distinct limits, largest first ("unlimited" first of all): each run then benchmarks
    under a cap no larger than an earlier one's, so the cache answers it."""
    uniq = list(dict.fromkeys(limits))
    return sorted(uniq, key=lambda l: (l is not None, -(l or 0)))


# -- measuring (GPU) -----------------------------------------------------------------------------
def _point(limit: int | None, r: Any, wall_s: float) -> dict[str, Any]:
    d = r.to_dict()
    tot = d["totals"]
    return {"limit_bytes": limit, "run_limit_bytes": r.workspace_limit,
            "executed_ms": tot["micro_ms"], "undivided_ms": tot["undivided_ms"],
            "unlimited_ms": tot["unlimited_ms"],
            "max_workspace_bytes": max((k.plan.workspace_bytes for k in r.kernels), default=0),
            "optimize_cold_s": d["optimize_cold_s"], "optimize_warm_s": d["optimize_warm_s"],
            "wall_s": wall_s, "result": d}


def _write_json(report: dict, path: str) -> None:
    """Write atomically: a time-out during the write leaves the previous file
    whole. A ``.gz`` path is written gzipped, as :func:`load` reads it."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(tmp, "wt", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


def measure(args: argparse.Namespace, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the sweep; returns the report (the JSON's content)."""
    import tempfile

    from mucudnn.backends import get_backend
    from mucudnn.bench import UNLIMITED, run_network
    from mucudnn.networks import DEFAULT_BATCH, select
    from mucudnn.optimizer.benchmark import resolve_cache

    be = get_backend(args.backend, **dict(args.backend_options))
    store = resolve_cache(args.cache)
    tmpdir = None
    if not store.enabled:
        tmpdir = tempfile.TemporaryDirectory(prefix="frontier-cache-")
        store = resolve_cache(os.path.join(tmpdir.name, "cache.sqlite"))
        print(f"note: no benchmark cache configured; using {store.path} for this run",
              file=sys.stderr)
    started = time.perf_counter()
    limits = limit_order(args.limits)
    report: dict[str, Any] = {
        "schema": SCHEMA, "date": time.strftime("%Y-%m-%d"),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "backend": be.name, "device": be.device_name, "version": be.version,
        "backend_options": dict(args.backend_options), "policy": args.policy,
        "repeat": args.repeat, "limits": limits,
        "max_seconds": args.max_seconds, "elapsed_s": 0.0, "interrupted": False,
        "series": [], "skipped": [], "errors": []}

    def save() -> None:
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        if args.json:
            _write_json(report, args.json)

    def out_of_time() -> bool:
        return args.max_seconds is not None and time.perf_counter() - started > args.max_seconds

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {msg}", flush=True)

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted()

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        for net in args.nets:
            try:
                select(net, args.layers)
            except ValueError as exc:
                report["errors"].append({"net": net, "precision": None, "limit": "all",
                                         "error": f"{type(exc).__name__}: {exc}"})
                log(f"{net}: {exc}")
                continue
            batch = args.batch or DEFAULT_BATCH[net.lower().replace("-", "").replace("_", "")]
            for prec in args.precisions:
                spec = PRECISIONS[prec]
                series: dict[str, Any] = {
                    "net": net, "batch": batch, "precision": prec, "dtype": spec["dtype"],
                    "layout": spec["layout"], "math": spec["math"], "layers": args.layers,
                    "pytorch": None, "points": []}
                report["series"].append(series)
                if args.torch:
                    if out_of_time():
                        report["skipped"].append({"net": net, "precision": prec, "limit": "pytorch",
                                                  "reason": "--max-seconds reached"})
                    else:
                        t0 = time.perf_counter()
                        try:
                            from pytorch_anchor import run as torch_run
                            series["pytorch"] = torch_run(net, batch, spec["dtype"], args.repeat,
                                                          layout=spec["layout"], layers=args.layers)
                            series["pytorch"]["wall_s"] = time.perf_counter() - t0
                            pt = series["pytorch"]
                            log(f"{net} {prec} PyTorch: {pt['total_ms']:.2f} ms, peak extra "
                                f"{pt['max_peak_extra_bytes'] / MIB:.0f} MiB/kernel")
                        except Interrupted:
                            raise
                        except Exception as exc:  # noqa: BLE001 - one failure must not end the sweep
                            report["errors"].append({"net": net, "precision": prec,
                                                     "limit": "pytorch",
                                                     "error": f"{type(exc).__name__}: {exc}",
                                                     "traceback": traceback.format_exc()})
                            log(f"{net} {prec} PyTorch FAILED: {type(exc).__name__}: {exc}")
                        save()
                tensors: dict = {}
                for limit in limits:
                    name = fmt_limit(limit)
                    if out_of_time():
                        report["skipped"].append({"net": net, "precision": prec, "limit": limit,
                                                  "reason": "--max-seconds reached"})
                        continue
                    t0 = time.perf_counter()
                    try:
                        r = run_network(net, batch, dtype=spec["dtype"], layout=spec["layout"],
                                        math_mode=spec["math"],
                                        workspace_limit=UNLIMITED if limit is None else limit,
                                        policy=args.policy, mode="wr", backend=be,
                                        repeat=args.repeat, cache=store, layers=args.layers,
                                        progress=False, time_alone=False, tensors=tensors)
                    except Interrupted:
                        raise
                    except Exception as exc:  # noqa: BLE001
                        report["errors"].append({"net": net, "precision": prec, "limit": limit,
                                                 "error": f"{type(exc).__name__}: {exc}",
                                                 "traceback": traceback.format_exc()})
                        log(f"{net} {prec} {name} FAILED: {type(exc).__name__}: {exc}")
                        save()
                        continue
                    p = _point(limit, r, time.perf_counter() - t0)
                    series["points"].append(p)
                    save()
                    log(f"{net} {prec} {name}: {p['executed_ms']:.2f} ms (optimise "
                        f"{p['optimize_cold_s']:.1f} s, run {p['wall_s']:.1f} s)")
                del tensors
                gc.collect()
    except Interrupted:
        report["interrupted"] = True
        log("SIGTERM: stopped; drawing what was measured")
    finally:
        signal.signal(signal.SIGTERM, old)
        save()
        if tmpdir is not None:
            store.close()
            tmpdir.cleanup()
    return report


# -- reading results (CPU) -----------------------------------------------------------------------
def fmt_limit(limit: int | None) -> str:
    """ "64 MiB", "1 GiB", "unlimited"."""
    if limit is None:
        return "unlimited"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if limit >= size:
            v = limit / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{limit} B"


def load(paths: Sequence[str]) -> dict[str, Any]:
    """Saved reports merged: metadata of the first, series in order (a later (net, precision)
    replacing an earlier one), skipped runs and errors of all."""
    merged: dict[str, Any] = {}
    by_key: dict[tuple[str, str], dict] = {}
    for path in paths:
        opener: Any = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            rep = json.load(f)
        if not isinstance(rep, dict) or rep.get("schema") != SCHEMA:
            got = rep.get("schema") if isinstance(rep, dict) else type(rep).__name__
            raise ValueError(f"{path}: not a frontier report (schema {got!r}, expected {SCHEMA!r})")
        if not merged:
            merged = {k: v for k, v in rep.items() if k not in ("series", "skipped", "errors")}
            merged.update(sources=[], skipped=[], errors=[])
        merged["sources"].append(os.path.basename(path))
        merged["skipped"] += rep.get("skipped", [])
        merged["errors"] += rep.get("errors", [])
        for s in rep["series"]:
            by_key[s["net"], s["precision"]] = s
    merged["series"] = list(by_key.values())
    return merged


def series_points(s: dict) -> dict[int | None, float]:
    """{limit bytes or None: executed ms} of one series (points that measured a time)."""
    return {p["limit_bytes"]: p["executed_ms"] for p in s["points"]
            if p.get("executed_ms") is not None}


def report_limits(report: dict) -> list[int | None]:
    """Every limit measured in the report, ascending, "unlimited" last."""
    seen = {l for s in report["series"] for l in series_points(s)}
    return sorted(seen, key=lambda l: (l is None, l or 0))


def vs_pytorch(ms: float | None, pytorch_ms: float | None) -> float | None:
    """mucudnn's time relative to PyTorch's, in percent (negative: faster than PyTorch)."""
    if ms is None or not pytorch_ms:
        return None
    return 100.0 * (ms / pytorch_ms - 1.0)


def clock_matched(s: dict, limit: int | None) -> float | None:
    """The series' time at ``limit`` over PyTorch's on one clock, in percent.

    Note [interleaved timing] (mucudnn/bench.py): seconds of back-to-back runs
    reach the GPU's power cap, so a later limit's run is on a slower clock than
    PyTorch's calls and the first ("unlimited") run, which follow host work.
    Every run times the same reference, each kernel's best single unlimited
    call (``unlimited_ms``), interleaved with its plans, on its own clock; so
    the limit's time, times the first run's reference over the limit run's,
    is the limit's time on the first run's clock, compared with PyTorch's.

    Note [one-clock reference]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~
    Until the thirteenth session this took the first run's executed plans as
    the reference instead of its single calls. That is the same only where the
    unlimited plan is one call per kernel; on AlexNet in float32 channels-last
    the unlimited plan ran 5% faster than the single calls, and its "one
    clock" numbers came out about 5 points too favourable (docs/BENCHMARKS.md,
    "Thirteenth session"). None where a part is missing.
    """
    pts = {p["limit_bytes"]: p for p in s["points"] if p.get("executed_ms") is not None}
    pt_ms = (s.get("pytorch") or {}).get("total_ms")
    here, first = pts.get(limit), pts.get(None)
    if (here is None or first is None or not pt_ms or not here.get("unlimited_ms")
            or not first.get("unlimited_ms")):
        return None
    return vs_pytorch(here["executed_ms"] * first["unlimited_ms"] / here["unlimited_ms"], pt_ms)


def table_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the markdown table (cells as printed)."""
    limits = report_limits(report)
    head = (["net (batch)", "precision"] + [f"{fmt_limit(l)} ms" for l in limits]
            + ["PyTorch ms", "PyTorch peak MiB/kernel"]
            + [f"{fmt_limit(l)} vs PyTorch" for l in VS_PYTORCH]
            + [f"{fmt_limit(l)} vs PyTorch, one clock" for l in VS_PYTORCH])
    rows = []
    for s in report["series"]:
        pts = series_points(s)
        pt = s.get("pytorch") or {}
        pt_ms = pt.get("total_ms")
        peak = pt.get("max_peak_extra_bytes")
        row = [f"{s['net']} ({s['batch']})", PRECISIONS.get(s["precision"], {}).get(
            "label", s["precision"])]
        row += [f"{pts[l]:.2f}" if l in pts else "-" for l in limits]
        row += [f"{pt_ms:.2f}" if pt_ms is not None else "-",
                f"{peak / MIB:.0f}" if peak is not None else "-"]
        pcts = [vs_pytorch(pts.get(l), pt_ms) for l in VS_PYTORCH]
        pcts += [clock_matched(s, l) for l in VS_PYTORCH]
        row += [f"{v:+.1f}%" if v is not None else "-" for v in pcts]
        rows.append(row)
    return head, rows


def format_table(report: dict) -> str:
    head, rows = table_rows(report)
    src = f"{report.get('backend', '?')} {report.get('version', '')} on {report.get('device', '?')}"
    lines = [f"Executed conv time (fwd + bwd-data + bwd-filter, ms) per per-kernel workspace limit "
             f"(WR, policy {report.get('policy')}; {src}; {report.get('date', '')}); PyTorch: "
             f"cudnn.benchmark, unlimited workspace, peak extra memory per kernel (output + "
             f"workspace). 'vs PyTorch': mucudnn's time over PyTorch's - 1 (negative: faster); "
             f"'one clock': the same, corrected for the GPU clock's drift between runs "
             f"(clock_matched in tools/frontier.py).",
             "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("the figure needs matplotlib (pip install \"mucudnn[plot]\")") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _tick_label(mib: float) -> str:
    if mib >= 1024:
        g = mib / 1024
        return f"{g:.0f} GiB" if g == int(g) else f"{g:.1f} GiB"
    return f"{mib:.0f}" if mib >= 1 else f"{mib:g}"


def plot(report: dict, path: str) -> str:
    """Draw the frontier figure to ``path`` (PNG); returns the path."""
    plt = _pyplot()
    nets: dict[str, list[dict]] = {}
    for s in report["series"]:
        nets.setdefault(s["net"], []).append(s)
    n = max(1, len(nets))
    cols = min(2, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.4 * rows), squeeze=False)
    for ax, (net, series) in zip(axes.flat, nets.items()):
        xs: list[float] = []  # every finite x on this subplot (MiB)
        for s in series:
            xs += [l / MIB for l in series_points(s) if l is not None]
            peak = (s.get("pytorch") or {}).get("max_peak_extra_bytes")
            if peak:
                xs.append(peak / MIB)
        if not xs:
            xs = [64.0]
        lo = 2.0 ** math.floor(math.log2(min(xs)))
        hi = 2.0 ** math.ceil(math.log2(max(xs)))
        x_unl = hi * 4  # "unlimited", right of everything finite, a gap apart
        for i, s in enumerate(series):
            spec = PRECISIONS.get(s["precision"], {})
            color = spec.get("color", f"C{i}")
            label = spec.get("label", s["precision"])
            pts = series_points(s)
            fin = sorted((l / MIB, t) for l, t in pts.items() if l is not None)
            if fin:
                ax.plot([x for x, _ in fin], [t for _, t in fin], marker="o", ms=4, color=color,
                        label=f"mucudnn, {label}")
            if None in pts:
                ax.plot([x_unl], [pts[None]], marker="o", ms=4, color=color,
                        label=None if fin else f"mucudnn, {label}")
                if fin:
                    ax.plot([fin[-1][0], x_unl], [fin[-1][1], pts[None]], ls=":", color=color)
            pt = s.get("pytorch") or {}
            if pt.get("total_ms") is not None and pt.get("max_peak_extra_bytes"):
                x, y = pt["max_peak_extra_bytes"] / MIB, pt["total_ms"]
                ax.plot([x], [y], marker="*", ms=13, color=color, mec="black", mew=0.6, ls="none",
                        label=f"PyTorch, {label}")
                ax.annotate("PyTorch", (x, y), textcoords="offset points", xytext=(6, 6),
                            fontsize=8, color=color)
        ax.set_xscale("log", base=2)
        ticks = [lo * 2 ** k for k in range(int(round(math.log2(hi / lo))) + 1)]
        ax.set_xticks(ticks + [x_unl])
        ax.set_xticklabels([_tick_label(t) for t in ticks] + ["unlimited"], fontsize=8)
        ax.minorticks_off()
        ax.set_xlim(lo / 1.4, x_unl * 1.4)
        ax.axvspan(hi * 1.4, x_unl / 1.4, color="0.93", lw=0)  # the axis break before "unlimited"
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        batch = series[0]["batch"]
        ax.set_title(f"{net}, batch {batch}", fontsize=10)
        ax.set_xlabel("workspace limit per kernel (MiB); PyTorch: peak extra memory per kernel",
                      fontsize=8)
        ax.set_ylabel("executed conv time, fwd+bwd (ms)", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(nets):]:
        ax.axis("off")
    fig.suptitle(f"Memory-speed frontier: {report.get('backend', '?')} {report.get('version', '')}"
                 f" on {report.get('device', '?')}, WR, policy {report.get('policy')}", fontsize=10)
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def render(report: dict, figure: str | None, table_path: str | None) -> str:
    """Figure (if matplotlib is there) and table; returns the table (markdown)."""
    if figure:
        try:
            print(f"figure: {plot(report, figure)}", flush=True)
        except ImportError as exc:
            print(f"note: no figure: {exc}", file=sys.stderr)
    table = format_table(report)
    if table_path:
        d = os.path.dirname(os.path.abspath(table_path))
        os.makedirs(d, exist_ok=True)
        with open(table_path, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    return table


def table_path_for(json_path: str | None) -> str | None:
    """out/frontier.json (or .json.gz) -> out/frontier.md."""
    if not json_path:
        return None
    base = json_path[:-3] if json_path.endswith(".gz") else json_path
    return os.path.splitext(base)[0] + ".md"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot_only:
        report = load(args.plot_only)
        if args.json:
            _write_json(report, args.json)
        table = render(report, args.figure, table_path_for(args.json or args.plot_only[0]))
    else:
        report = measure(args, argv)
        for e in report["errors"]:
            where = e["limit"] if isinstance(e["limit"], str) else fmt_limit(e["limit"])
            print(f"error: {e['net']} {e['precision'] or ''} {where}: {e['error']}",
                  file=sys.stderr)
        if report["skipped"]:
            print(f"skipped (--max-seconds): {len(report['skipped'])} runs", file=sys.stderr)
        table = render(report, args.figure, table_path_for(args.json))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
