#!/usr/bin/env python
"""Writes the result tables of docs/BENCHMARKS.md and README.md from docs/results/.

Every table between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``
is made here from ``docs/results/*.json[.gz]``: the newest result of each kind
(:func:`newness`) and, below each table, what each source file records of its
code and machine (commit, date, device, cuDNN, torch, options), "not recorded"
where it does not.

    python tools/results_page.py          # rewrite the tables in place
    python tools/results_page.py --check  # exit 1 if a page's tables differ from the JSON

Kinds read: the ``--json`` of tools/frontier.py, train_bench.py, cold_start.py,
bench_call_overhead.py, zoo_bench.py and search_parity.py. The zoo's and
search parity's tables are made in tools/results_zoo.py, and what every table
shares (reading, sources, markdown) is tools/results_tables.py.
tests/test_results_page.py checks that the committed pages hold exactly what
this writes.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
from typing import Any, Callable

from results_tables import (LIMIT, NR, PRECISION_LABEL, ROOT, TABLE_GPU, Sources, finish,  # tools/
                            gpu_of, load_results, newness, num, of_kind, on_gpu, pct, source_line,
                            table, MIB)
from results_zoo import search_parity, zoo, zoo_cold, zoo_elsewhere, zoo_source, zoo_steps
from round_stats import geomean

PAGES = ("docs/BENCHMARKS.md", "README.md")
NETS = ("alexnet", "resnet18", "resnet50", "vgg16")
NET_LABEL = {"alexnet": "AlexNet", "resnet18": "ResNet-18", "resnet50": "ResNet-50", "vgg16": "VGG-16"}
PRECISIONS = ("fp32", "fp32cl", "bf16cl", "amp", "fp32strict")
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)


# -- kernels under a limit (tools/frontier.py) ---------------------------------------------------
def series_meta(s: dict) -> dict:
    """policy, backend, version and date of a frontier series, from its plans' results."""
    return next((p["result"] for p in s["points"] if p.get("result")), {})


def newest_series(results: list[tuple[str, Any]]) -> dict[tuple[str, str], tuple[str, dict, dict]]:
    """{(net, precision): (file, report, series)}: the newest whole-network series measured
    with the graph backend's default options and a named policy, at 64 MiB and against PyTorch."""
    best: dict[tuple[str, str], tuple[tuple, str, dict, dict]] = {}
    for i, (name, doc) in enumerate(of_kind(results, "frontier")):
        merged = set(doc.get("sources") or []) - {name}  # a merge of files read here too
        if doc.get("backend_options") or merged & {n for n, _ in results}:
            continue
        for s in doc["series"]:
            meta = series_meta(s)
            if (s.get("layers") is not None or meta.get("backend") != "cudnn-graph"
                    or not isinstance(meta.get("policy"), str) or at(s, LIMIT) is None
                    or not (s.get("pytorch") or {}).get("total_ms")):
                continue
            key = (meta.get("date", ""), i)
            if (s["net"], s["precision"]) not in best or key >= best[s["net"], s["precision"]][0]:
                best[s["net"], s["precision"]] = (key, name, doc, s)
    return {k: v[1:] for k, v in best.items()}


def at(s: dict, limit: int | None) -> dict | None:
    return next((p for p in s["points"] if p["limit_bytes"] == limit and p.get("executed_ms")), None)


def one_clock(s: dict, limit: int) -> str:
    """Note [one-clock reference] in tools/frontier.py: the limit's time on the first
    (unlimited) run's clock, through each run's single unlimited calls, over PyTorch's."""
    here, first = at(s, limit), at(s, None)
    if not here or not first or not here.get("unlimited_ms") or not first.get("unlimited_ms"):
        return "-"
    return pct(here["executed_ms"] * first["unlimited_ms"] / here["unlimited_ms"],
               s["pytorch"]["total_ms"])


def frontier_source(name: str, doc: dict, s: dict) -> str:
    meta, pt = series_meta(s), s["pytorch"]
    opts = doc.get("backend_options")
    return source_line(name, meta.get("date"), doc.get("device"), meta.get("version"),
                       pt.get("torch"), doc.get("commit"),
                       f"backend {meta.get('backend')}, options "
                       f"{'defaults' if opts == {} else NR if opts is None else opts}, "
                       f"policy {meta.get('policy')}, WR, repeat {doc.get('repeat', NR)}")


def kernels(results: list[tuple[str, Any]]) -> str:
    best, src, rows = newest_series(results), Sources(), []
    for prec in PRECISIONS:
        for net in NETS:
            if (net, prec) not in best:
                continue
            name, doc, s = best[net, prec]
            pt = s["pytorch"]
            ms = {lim: (at(s, lim) or {}).get("executed_ms") for lim in (LIMIT, 2 * LIMIT, None)}
            rows.append([f"{NET_LABEL[net]} ({s['batch']})", PRECISION_LABEL[prec],
                         num(ms[LIMIT]), num(ms[2 * LIMIT]), num(ms[None]), num(pt["total_ms"]),
                         num((pt.get("max_peak_extra_bytes") or 0) / MIB, ".0f"),
                         pct(ms[LIMIT], pt["total_ms"]), one_clock(s, LIMIT),
                         src.cite(name, frontier_source(name, doc, s))])
    return finish(["network (batch)", "precision", "64 MiB ms", "128 MiB ms", "unlimited ms",
                   "PyTorch ms", "PyTorch peak MiB/kernel", "64 MiB vs PyTorch",
                   "64 MiB vs PyTorch, one clock", "source"], rows, src, "frontier.py")


# -- training (tools/train_bench.py) -------------------------------------------------------------
def train_source(name: str, doc: dict) -> str:
    a, env = doc["args"], doc["environment"]
    return source_line(name, env.get("date"), env.get("gpu"), env.get("cudnn"), env.get("torch"),
                       env.get("git_commit"),
                       f"workspace_limit {a['workspace'] // MIB} MiB, policy {a.get('policy')}, "
                       f"backend default, deterministic {bool(a.get('deterministic'))}")


def newest_training(results: list[tuple[str, Any]]) -> dict[tuple, tuple[str, dict, dict, dict]]:
    """{(model, precision, execution): (file, report, native run, WR run)}, newest file first."""
    best: dict[tuple, tuple[str, dict, dict, dict]] = {}
    for name, doc in of_kind(results, "train"):
        a = doc["args"]
        if (a.get("workspace") != LIMIT or a.get("backend") or a.get("deterministic")
                or a.get("constrained_only")):
            continue
        runs = {(r["model"], r["precision"], r["execution"], r["mode"]): r for r in doc["runs"]
                if r.get("median_step_ms")}
        for (m, p, e, mode), r in runs.items():
            if mode == "wr" and (m, p, e, "native") in runs:
                best[m, p, e] = (name, doc, runs[m, p, e, "native"], r)
    return best


def training(results: list[tuple[str, Any]]) -> str:
    best, src, rows = newest_training(results), Sources(), []
    for prec in PRECISIONS:
        for net in NETS:
            for ex in ("eager", "graph"):
                if (net, prec, ex) not in best:
                    continue
                name, doc, nat, wr = best[net, prec, ex]
                mem = [r.get("max_memory_allocated") for r in (nat, wr)]
                rows.append([f"{NET_LABEL[net]} ({wr['batch']})", PRECISION_LABEL[prec],
                             "captured" if ex == "graph" else ex, num(nat["median_step_ms"]),
                             num(wr["median_step_ms"]), pct(wr["median_step_ms"], nat["median_step_ms"]),
                             " -> ".join(num(m / 2**30 if m else None, ".1f") for m in mem),
                             src.cite(name, train_source(name, doc))])
    return finish(["model (batch)", "precision", "step", "native ms", "converted ms",
                   "converted vs native", "peak allocated GiB, native -> converted", "source"],
                  rows, src, "train_bench.py")


# -- cold start (tools/cold_start.py) ------------------------------------------------------------
def cold_start(results: list[tuple[str, Any]]) -> str:
    best: dict[tuple, tuple[str, dict, dict | None]] = {}
    for name, doc in of_kind(results, "cold"):
        rows_by = {(r["net"], r.get("precision"), r.get("jit_cache"), r["config"]): r for r in doc}
        for (net, prec, jit, config), r in rows_by.items():
            if config == "default" and prec and not r.get("devices"):
                best[net, prec, jit] = (name, r, rows_by.get((net, prec, jit, "torch")))
    src, rows = Sources(), []
    for prec in PRECISIONS:
        for net in NETS:
            for jit in ("fresh", "shared"):
                if (net, prec, jit) not in best:
                    continue
                name, r, t = best[net, prec, jit]
                rows.append([NET_LABEL[net], PRECISION_LABEL[prec], jit,
                             f"{r['process_s']:.1f} ({num(r.get('optimise_s'), '.1f')})",
                             num(r.get("executed_ms")),
                             f"{t['process_s']:.1f} ({num(t.get('first_iteration_s'), '.1f')})"
                             if t else "not in this run",
                             src.cite(name, source_line(
                                 name, defaults="workspace limit not recorded, find options defaults"))])
    return finish(["network", "precision", "CUDA JIT cache", "mucudnn s: process (optimise)",
                   "plans' executed ms", "PyTorch s: process (first iteration)", "source"],
                  rows, src, "cold_start.py")


# -- call overhead (tools/bench_call_overhead.py) ------------------------------------------------
def call_overhead(results: list[tuple[str, Any]]) -> str:
    if not of_kind(results, "overhead"):
        return finish([], [], Sources(), "bench_call_overhead.py")
    name, doc = of_kind(results, "overhead")[-1]
    us: dict[str, dict[str, float]] = {}
    for h in doc["host_us"]:
        label = ("PyTorch's own call (F.conv2d, convolution_backward)" if "graph" not in h else
                 f"mucudnn, {h['kind']} arrays, {h['output']}{', CUDA graph' if h['graph'] else ''}")
        us.setdefault(label, {})[h["direction"]] = h["us"]
    dirs = ("forward", "backward_data", "backward_filter")
    rows = [[label] + [num(v.get(d), ".1f") for d in dirs] for label, v in us.items()]
    src = source_line(name, doc.get("date"), doc.get("device"), doc.get("cudnn"), doc.get("torch"),
                      doc.get("commit"), f"backend {doc.get('backend', NR)}")
    return table(["call (host us per warm call)", *dirs], rows) + f"\n\nSource: {src}\n"


# -- README's headline ---------------------------------------------------------------------------
def _zoo_run(results: list[tuple[str, Any]]) -> list:
    """The zoo run the headline quotes (:func:`zoo_steps`): the
    :data:`TABLE_GPU`'s, else the newest of another GPU's (its source line
    names that GPU, as the headline's header says); empty where no GPU has a
    zoo run under the current defaults."""
    runs = zoo_steps(on_gpu(results, TABLE_GPU))
    if runs:
        return runs
    others = [zoo_steps(on_gpu(results, g))
              for g in sorted({gpu_of(d) for _, d in results} - {TABLE_GPU})]
    others = [r for r in others if r]
    return max(others, key=lambda r: max(newness(row[0]) for row in r)) if others else []


def headline(results: list[tuple[str, Any]]) -> str:
    """README's headline: the kernels and training rows from the
    :data:`TABLE_GPU`'s files, the zoo's geometric means from :func:`_zoo_run`."""
    here = on_gpu(results, TABLE_GPU)
    series, train, src = newest_series(here), newest_training(here), Sources()

    def kernel_cell(net: str, prec: str) -> str:
        if (net, prec) not in series:
            return "not measured"
        name, doc, s = series[net, prec]
        ms, pt = at(s, LIMIT)["executed_ms"], s["pytorch"]["total_ms"]  # type: ignore[index]
        return (f"{ms:.2f} vs {pt:.2f} ms ({pct(ms, pt)}) "
                + src.cite(name, frontier_source(name, doc, s)))

    def train_cell(net: str, prec: str, ex: str) -> str:
        if (net, prec, ex) not in train:
            return "not measured"
        name, doc, nat, wr = train[net, prec, ex]
        a, b = wr["median_step_ms"], nat["median_step_ms"]
        return f"{a:.2f} vs {b:.2f} ms ({pct(a, b)}) " + src.cite(name, train_source(name, doc))

    rows = [[f"conv layers, {PRECISION_LABEL[p]}: mucudnn at 64 MiB/kernel vs PyTorch unlimited"]
            + [kernel_cell(n, p) for n in NETS] for p in ("fp32", "fp32cl")]
    rows += [[f"training step, fp32 channels-last, {lbl}: converted vs native"]
             + [train_cell(n, "fp32cl", ex) for n in NETS]
             for ex, lbl in (("eager", "eager"), ("graph", "captured"))]
    groups: dict[tuple[str, str], list[float]] = {}
    cites: dict[str, str] = {}
    for name, doc, e, ex, st in _zoo_run(results):
        cites.setdefault(name, src.cite(name, zoo_source(name, doc)))
        if st.get("ratio"):
            groups.setdefault((e["precision"], ex), []).append(st["ratio"])
    zoo_cell = "; ".join(f"{PRECISION_LABEL.get(p, p)} {ex}: "
                         f"{num(geomean(rs), '.3f')}x over {len(rs)} models"
                         for (p, ex), rs in groups.items()) + " " + " ".join(cites.values()) \
        if groups else "not measured under the current defaults"
    rows.append(["torchvision zoo, training step: geometric mean converted/native", zoo_cell,
                 "", "", ""])
    return (table(["claim (H200 unless the source says otherwise)"]
                  + [NET_LABEL[n] for n in NETS], rows) + "\n\n" + src.text() + "\n")


TABLES: dict[str, Callable[[list[tuple[str, Any]]], str]] = {
    "headline": headline, "kernels": kernels, "training": training, "cold-start": cold_start,
    "zoo-cold": zoo_cold,
    "call-overhead": call_overhead, "zoo": zoo, "search-parity": search_parity,
    "zoo-elsewhere": zoo_elsewhere}
#: The tables made from every GPU's files (the headline picks its own: :func:`headline`);
#: the others see the TABLE_GPU's alone.
ALL_GPUS = ("zoo-elsewhere", "headline")


def render(text: str, results: list[tuple[str, Any]]) -> str:
    """``text`` with every generated block rewritten from ``results`` (those
    made on the :data:`TABLE_GPU`, except for the :data:`ALL_GPUS` tables)."""
    here = on_gpu(results, TABLE_GPU)

    def sub(m: re.Match) -> str:
        if m.group(2) not in TABLES:
            raise ValueError(f"no table named {m.group(2)!r} (known: {', '.join(TABLES)})")
        return m.group(1) + TABLES[m.group(2)](results if m.group(2) in ALL_GPUS else here) \
            + m.group(4)
    return BLOCK.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    ap.add_argument("--results", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args(argv)
    results = load_results(pathlib.Path(args.results))
    stale = []
    for page in PAGES:
        path = ROOT / page
        old = path.read_text(encoding="utf-8")
        new = render(old, results)
        if new != old:
            stale.append(page)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    verb = "differ from docs/results (run python tools/results_page.py)" if args.check else "rewritten"
    print(f"{', '.join(stale)}: {verb}" if stale else "tables up to date")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
