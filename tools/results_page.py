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
bench_call_overhead.py, zoo_bench.py and search_parity.py. tests/test_results_page.py
checks that the committed pages hold exactly what this writes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import re
import sys
from typing import Any, Callable

from round_stats import STEP_TARGET, geomean, median_interval, ratio_text  # tools/, beside this script

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = ("docs/BENCHMARKS.md", "README.md")
NETS = ("alexnet", "resnet18", "resnet50", "vgg16")
NET_LABEL = {"alexnet": "AlexNet", "resnet18": "ResNet-18", "resnet50": "ResNet-50", "vgg16": "VGG-16"}
PRECISIONS = ("fp32", "fp32cl", "bf16cl", "amp", "fp32strict")
PRECISION_LABEL = {"fp32": "fp32 NCHW", "fp32cl": "fp32 channels-last", "bf16cl": "bf16 channels-last",
                   "amp": "AMP bf16 channels-last", "fp32strict": "strict fp32 (no TF32)"}
MIB = 1 << 20
LIMIT = 64 * MIB  # the per-kernel workspace limit every headline number is taken at
NR = "not recorded"
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)


# -- reading ------------------------------------------------------------------------------------
def newness(name: str) -> tuple:
    """Sort key, oldest first: the date the name starts with, then the work session and
    call it names (``-s14-call8-``; none: before numbered sessions), then the name
    without its extension (``x-final.json`` after ``x.json``)."""
    m = re.search(r"-s(\d+)-call(\d+)-", name)
    return (name[:10], int(m.group(1)) if m else 0, int(m.group(2)) if m else 0,
            name.split(".json")[0])


def load_results(folder: pathlib.Path) -> list[tuple[str, Any]]:
    """(file name, parsed JSON) of every result file, oldest first (:func:`newness`)."""
    out = []
    for p in sorted(folder.iterdir(), key=lambda p: newness(p.name)):
        if p.name.endswith((".json", ".json.gz")):
            opener: Any = gzip.open if p.name.endswith(".gz") else open
            with opener(p, "rt", encoding="utf-8") as f:
                out.append((p.name, json.load(f)))
    return out


def kind(doc: Any) -> str | None:
    if isinstance(doc, list):
        ok = bool(doc) and all(isinstance(r, dict) and "config" in r and "process_s" in r for r in doc)
        return "cold" if ok else None
    if not isinstance(doc, dict):
        return None
    if str(doc.get("schema", "")).startswith("mucudnn-frontier"):
        return "frontier"
    if {"runs", "args", "environment"} <= doc.keys():
        return "train"
    if "host_us" in doc:
        return "overhead"
    if {"results", "options", "environment"} <= doc.keys():
        # an A/A run (zoo_bench --control) measures the harness, not mucudnn
        return None if (doc["options"] or {}).get("control") else "zoo"
    if {"models", "options"} <= doc.keys() and isinstance(doc["models"], dict):
        return "parity"
    return None


def of_kind(results: list[tuple[str, Any]], k: str) -> list[tuple[str, Any]]:
    return [(n, d) for n, d in results if kind(d) == k]


# -- what a source records ----------------------------------------------------------------------
def cudnn_text(v: Any) -> str:
    if isinstance(v, int):  # torch.backends.cudnn.version(): 91900
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return str(v) if v else NR


def commit_of(name: str, recorded: Any) -> str:
    if recorded:
        return str(recorded)[:10]
    m = re.search(r"-([0-9a-f]{7,40})(?=[.-])", name)
    return f"{m.group(1)} (file name)" if m else NR


def source_line(name: str, date: Any = None, device: Any = None, cudnn: Any = None,
                torch: Any = None, commit: Any = None, defaults: str = NR) -> str:
    day = name[:10] if re.match(r"\d{4}-\d\d-\d\d", name) else NR
    return (f"`{name}`: commit {commit_of(name, commit)}; date {date or day}; "
            f"device {device or NR}; cuDNN {cudnn_text(cudnn)}; torch {torch or NR}; {defaults}")


class Sources(dict):
    """{file: (number, source line)}, numbered in the order a table first cites them."""

    def cite(self, name: str, line: str) -> str:
        return f"[{self.setdefault(name, (len(self) + 1, line))[0]}]"

    def text(self) -> str:
        return "Sources:\n\n" + "\n".join(f"{i}. {line}" for i, line in self.values())


def table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def finish(head: list[str], rows: list[list[str]], src: Sources, tool: str) -> str:
    """The table and its sources, or what measures it while nothing has."""
    if not rows:
        return f"Not measured yet (`tools/{tool} --json docs/results/...`).\n"
    return table(head, rows) + "\n\n" + src.text() + "\n"


def pct(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{100 * (a / b - 1):+.1f}%"


def num(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


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


# -- the zoo (tools/zoo_bench.py) ----------------------------------------------------------------
def zoo_with(results: list[tuple[str, Any]], *fields: str) -> list[tuple[str, Any]]:
    """The zoo documents with some result holding one of ``fields`` (a run may
    time steps and not cold steps, or the other way round)."""
    return [(name, doc) for name, doc in of_kind(results, "zoo")
            if any(e.get(f) for e in doc["results"] for f in fields)]


#: models a session's step runs must cover to be the zoo table's run (the issue's bar:
#: at least ten torchvision models); newer sessions with fewer are follow-ups
MIN_ZOO_MODELS = 10


def _picked_steps(docs: list[tuple[str, Any]]) -> list[tuple[str, dict, dict, str, dict]]:
    """(file, document, result, execution, step figures) of ``docs``, a later
    call's figures replacing an earlier one's of the same model, precision,
    execution and workspace limit."""
    picked: dict[tuple, tuple[str, dict, dict, str, dict]] = {}
    for name, doc in docs:
        for e in doc["results"]:
            for ex, st in (e.get("steps") or {}).items():
                picked[e["model"], e["precision"], ex, doc["options"].get("workspace"),
                       torch_search(doc)] = (name, doc, e, ex, st)
    return list(picked.values())


def torch_search(doc: dict) -> str:
    """The ``MUCUDNN_TORCH_SEARCH`` a run was made under (its default where the
    file does not say): runs under another search are not the default's."""
    return (doc["environment"].get("settings") or {}).get("MUCUDNN_TORCH_SEARCH", "over-limit")


def _zoo_runs(results: list[tuple[str, Any]]) -> tuple[list, list]:
    """The zoo's step runs as (the zoo run, the follow-ups): the zoo run is the
    newest session whose step runs at the 64 MiB limit cover at least
    :data:`MIN_ZOO_MODELS` models (else the newest session with step runs at
    it), so that its geometric means come from one session's run; the
    follow-ups are every step run of a later session (any limit or search).
    The zoo run is made under the default ``MUCUDNN_TORCH_SEARCH``."""
    docs = zoo_with(results, "steps")
    at_limit = [(n, d) for n, d in docs if d["options"].get("workspace") == LIMIT
                and torch_search(d) == "over-limit"]
    sessions: dict[tuple, list[tuple[str, Any]]] = {}
    for name, doc in at_limit:
        sessions.setdefault(newness(name)[:2], []).append((name, doc))
    full = [k for k, v in sessions.items()
            if len({e["model"] for _, d in v for e in d["results"] if e.get("steps")})
            >= MIN_ZOO_MODELS]
    if not sessions:
        return [], []
    main = max(full) if full else max(sessions)
    later = [(n, d) for n, d in docs if newness(n)[:2] > main]
    return _picked_steps(sessions[main]), _picked_steps(later)


def zoo_steps(results: list[tuple[str, Any]]) -> list[tuple[str, dict, dict, str, dict]]:
    """The zoo run's step figures (:func:`_zoo_runs`)."""
    return _zoo_runs(results)[0]


def zoo_source(name: str, doc: dict) -> str:
    env, o = doc["environment"], doc["options"]
    ws = o.get("workspace")
    note = env.get("commit_note")
    settings = "".join(f", {k}={v}" for k, v in sorted((env.get("settings") or {}).items()))
    return source_line(name, env.get("date"), env.get("gpu"), env.get("cudnn"), env.get("torch"),
                       env.get("git_commit"),
                       f"workspace_limit {ws // MIB if isinstance(ws, int) else ws} MiB, "
                       f"policy {o.get('policy', 'default')}, batch {o.get('batch', NR)}"
                       + settings + (f"; {note}" if note else ""))


def _conv_ms(e: dict) -> str:
    t = (e.get("report") or {}).get("totals")
    if not t or not t.get("kernels"):
        return "-"
    return f"{t['ms']:.2f} vs {t['torch_ms']:.2f} ({t['torch_kernels']}/{t['kernels']})"


def _pair(d: Any, key: str, fmt: str) -> str:
    if not isinstance(d, dict) or not all(isinstance(d.get(s), dict) for s in ("native", "converted")):
        return "-"
    return f"{format(d['native'].get(key, float('nan')), fmt)} / " \
           f"{format(d['converted'].get(key, float('nan')), fmt)}"


def _first_step(side: dict) -> str:
    """One side's cold first-step seconds; a profiled one (zoo_bench
    --cold-profile) is marked, its seconds not comparable with the others, and
    a median over several processes (zoo_bench --cold-repeat) gives its range."""
    samples = side.get("first_step_samples") or []
    spread = f" (median of {len(samples)}: {min(samples):.1f}-{max(samples):.1f})" \
        if len(samples) > 1 else ""
    return num(side.get("first_step_s"), ".1f") + spread + (
        " (profiled)" if side.get("profiled") else "")


def _first_calls(side: dict) -> str:
    """What a converted cold first step's first calls cost (Note [first-call
    seconds] in mucudnn/torch/native.py); "-" where the run did not record it."""
    f = side.get("first_calls")
    if not f:
        return "-"
    return f"{f['seconds']:.1f} ({f['planning_seconds']:.1f}, " \
           f"{f['planned_signatures']:g} of {f['signatures']:g})"  # counts: medians may be floats


def zoo_cold(results: list[tuple[str, Any]]) -> str:
    """First training steps from a cold cache (Note [cold steps] in
    tools/zoo_bench.py) and one step's gradient errors against float64 (Note
    [gradient check]), the newest measurement of each model and precision: its
    cold steps (with the search in force and whether a primer ran first) and
    its gradients each from the newest file that measured them, both cited. A
    profiled first step (slowed by cProfile) never replaces an unprofiled one."""
    src = Sources()
    colds: dict[tuple[str, str], tuple[bool, str, dict, dict]] = {}
    grads: dict[tuple[str, str], tuple[str, dict, dict]] = {}
    for name, doc in zoo_with(results, "cold", "grad"):
        for e in doc["results"]:
            key = (e["model"], e["precision"])
            cold, grad = e.get("cold") or {}, e.get("grad") or {}
            if all(isinstance(cold.get(s), dict) for s in ("native", "converted")):
                profiled = any(cold[s].get("profiled") for s in ("native", "converted"))
                if not (profiled and key in colds and not colds[key][0]):
                    colds[key] = (profiled, name, doc, e)
            if all(isinstance(grad.get(s), dict) for s in ("native", "converted")):
                grads[key] = (name, doc, e)
    rows = []
    for key in dict.fromkeys([*colds, *grads]):
        first = colds[key][2] if key in colds else grads[key][1]
        row = [key[0], PRECISION_LABEL.get(key[1], key[1]),
               (first["environment"].get("settings") or {}).get("MUCUDNN_TORCH_SEARCH", NR)]
        cites = []
        if key in colds:
            _, name, doc, e = colds[key]
            cold = e["cold"]
            row += [_first_step(cold["native"]), _first_step(cold["converted"]),
                    _first_calls(cold["converted"]),
                    "yes" if e.get("cold_primer") else "none (native ran first)"]
            cites.append(src.cite(name, zoo_source(name, doc)))
        else:
            row += ["-"] * 4
        grad, ratio = {}, "-"
        if key in grads:
            name, doc, e = grads[key]
            grad = e["grad"]
            if grad["native"].get("all"):
                ratio = num(grad["converted"].get("all", float("nan")) / grad["native"]["all"],
                            ".2f")
                if grad.get("planned_kernels") is not None:
                    n = grad["planned_kernels"]
                    ratio += f" ({n} kernel{'' if n == 1 else 's'} on plans)"
            cite = src.cite(name, zoo_source(name, doc))
            if cite not in cites:
                cites.append(cite)
        rows.append(row + [_pair(grad, "all", ".2e"), ratio, ", ".join(cites)])
    return finish(["model", "precision", "MUCUDNN_TORCH_SEARCH", "first step s, native",
                   "first step s, converted",
                   "converted first calls s: all (planning, signatures planned)", "primer",
                   "gradient error vs float64, native / converted", "converted / native error",
                   "source"], rows, src, "zoo_bench.py --cold --grad-check")


def zoo(results: list[tuple[str, Any]]) -> str:
    if not of_kind(results, "zoo"):
        return finish([], [], Sources(), "zoo_bench.py")
    src, per_model = Sources(), []
    groups: dict[tuple[str, str], list[tuple[str, float]]] = {}
    steps = zoo_steps(results)
    for name, doc, e, ex, st in steps:
        cite = src.cite(name, zoo_source(name, doc))
        if st.get("ratio"):
            iv = median_interval(st.get("round_ratios") or [])
            groups.setdefault((e["precision"], ex), []).append(
                (e["model"], st["ratio"], iv is not None and iv[0] > STEP_TARGET))
        per_model.append([e["model"], PRECISION_LABEL.get(e["precision"], e["precision"]),
                          "captured" if ex == "graph" else ex, num(st.get("native_ms")),
                          num(st.get("converted_ms")),
                          ratio_text(st), _conv_ms(e), _pair(e.get("cold"), "first_step_s", ".1f"),
                          _pair(e.get("grad"), "all", ".2e"), cite])
    failed = sorted({e["model"] for _, _, e, _, _ in steps if e.get("errors")})
    rows = []
    for (prec, ex), rs in groups.items():
        worst = max(rs, key=lambda r: r[1])
        rows.append([PRECISION_LABEL.get(prec, prec), "captured" if ex == "graph" else ex,
                     str(len(rs)), num(geomean([r for _, r, _ in rs]), ".3f"),
                     f"{sum(r > STEP_TARGET for _, r, _ in rs)} ({sum(a for _, _, a in rs)})",
                     f"{worst[0]} {worst[1]:.3f}"])
    text = (table(["precision", "step", "models", "geometric mean converted/native",
                   f"models over {STEP_TARGET} (interval wholly above)", "slowest (ratio)"], rows)
            + f"\n\nModels with a failed stage: {', '.join(failed) or 'none'}.\n\n"
            + finish(["model", "precision", "step", "native ms", "converted ms", "converted/native",
                      "conv ms: what runs vs PyTorch's (directions on PyTorch's own)",
                      "first step s native / converted", "gradient error native / converted",
                      "source"], per_model, src, "zoo_bench.py"))
    later = _zoo_runs(results)[1]
    if not later:
        return text
    src2 = Sources()
    rows2 = [[e["model"], PRECISION_LABEL.get(e["precision"], e["precision"]),
              "captured" if ex == "graph" else ex, _mib_limit(doc["options"].get("workspace")),
              torch_search(doc), str(doc["options"].get("steps", "-")), num(st.get("native_ms")),
              num(st.get("converted_ms")), ratio_text(st), _conv_ms(e), _peaks(st),
              src2.cite(name, zoo_source(name, doc))]
             for name, doc, e, ex, st in later]
    return text + "\n**Later runs** (fewer models than the zoo run above; not in its means):\n\n" \
        + finish(["model", "precision", "step", "limit MiB", "MUCUDNN_TORCH_SEARCH",
                  "steps a round", "native ms",
                  "converted ms", "converted/native", "conv ms: what runs vs PyTorch's",
                  "peak MiB native / converted", "source"], rows2, src2, "zoo_bench.py")


def _mib_limit(ws: Any) -> str:
    return str(ws // MIB) if isinstance(ws, int) else NR


def _peaks(st: dict) -> str:
    """Each side's peak allocated MiB in its steady steps (Note [memory per side] in
    tools/zoo_bench.py)."""
    mem = st.get("memory") or {}

    def peak(side: str) -> Any:
        b = (mem.get(side) or {}).get("peak_bytes")
        return None if b is None else b / MIB
    return f"{num(peak('native'), '.1f')} / {num(peak('converted'), '.1f')}"


# -- search parity (tools/search_parity.py) ------------------------------------------------------
def _convs_checked(model: dict) -> str:
    """A parity row's distinct convolutions; of a run cut short by its time
    limit, how many of them it checked."""
    if model.get("complete", True):
        return str(model.get("convs", "-"))
    return f"{model.get('convs_checked', '-')} of {model.get('convs', '-')} (cut short)"


def _limit(options: dict) -> str:
    """The ``--over-limit`` of a parity run, as a phrase."""
    n = options.get("over_limit")
    return f"the {n // MIB} MiB limit" if isinstance(n, int) else "the limit"


def _parity_source(name: str, doc: dict) -> str:
    o, env = doc["options"], doc.get("environment") or {}
    return source_line(name, env.get("date"), env.get("gpu"), env.get("cudnn"), env.get("torch"),
                       env.get("git_commit"), defaults=(
                           f"find options {o.get('find', NR)}, precision "
                           f"{o.get('precision', NR)}, batch {o.get('batch', NR)}"))


def _mib(n: Any) -> str:
    return f"{n / MIB:.1f}" if isinstance(n, (int, float)) else "-"


def _over_limit_rows(model: str, v: dict, cite: str) -> list[list[str]]:
    """One row per direction an ``--over-limit`` run compared in ``model``:
    PyTorch's call (its workspace and time), whether mucudnn's find held its
    kernels, and PyTorch's call at the largest halving of the batch that fits
    the limit."""
    rows = []
    for r in v.get("results", []):
        if r.get("fits") or r.get("held") is None:
            continue
        u = r.get("torch_under_limit") or {}
        rows.append([model, r["layer"], r["direction"], _mib(r.get("torch_workspace")),
                     num(r.get("torch_ms"), ".3f"), "yes" if r["held"] else "no",
                     f"{u['batch']} ({_mib(u.get('workspace_bytes'))} MiB)" if u else "none fits",
                     num(u.get("ms_whole_batch"), ".3f") if u else "-",
                     ("yes" if u.get("held") else "no") if u else "-", cite])
    return rows


def search_parity(results: list[tuple[str, Any]]) -> str:
    """The newest parity run over whole models, and each model's newest
    ``--over-limit`` run (the directions a converted model plans), whose
    compared directions get a table of their own."""
    src, rows, over = Sources(), [], []
    docs = of_kind(results, "parity")
    for name, doc in [d for d in docs if d[1]["options"].get("over_limit") is None][-1:]:
        cite = src.cite(name, _parity_source(name, doc))
        rows += [[m, _convs_checked(v), str(v.get("kernels", "-")), str(v.get("held", "-")),
                  cite] for m, v in doc["models"].items()]
    newest: dict[str, tuple[str, dict, dict]] = {}
    for name, doc in docs:
        if doc["options"].get("over_limit") is not None:
            for m, v in doc["models"].items():
                newest[m] = (name, doc, v)
    for m, (name, doc, v) in newest.items():
        cite = src.cite(name, _parity_source(name, doc))
        rows.append([m, _convs_checked(v), str(v.get("kernels", "-")) + (
                     f" (and {v['fit']} fitting {_limit(doc['options'])}, not compared)"
                     if v.get("fit") else ""), str(v.get("held", "-")), cite])
        over += _over_limit_rows(m, v, cite)
    text = finish(["model", "distinct convolutions", "convolution directions",
                   "held (PyTorch's kernels among mucudnn's candidates)", "source"],
                  rows, src, "search_parity.py")
    if not over:
        return text
    return table(["model", "layer", "direction", "PyTorch's workspace MiB", "PyTorch ms",
                  "held", "largest fitting batch (PyTorch's workspace)",
                  "PyTorch's calls on it, ms for the whole batch", "held there", "source"],
                 over) + "\n\n" + text


# -- README's headline ---------------------------------------------------------------------------
def headline(results: list[tuple[str, Any]]) -> str:
    series, train, src = newest_series(results), newest_training(results), Sources()

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
    zoo_cell = "not measured yet"
    if of_kind(results, "zoo"):
        groups: dict[tuple[str, str], list[float]] = {}
        cites: dict[str, str] = {}
        for name, doc, e, ex, st in zoo_steps(results):
            cites.setdefault(name, src.cite(name, zoo_source(name, doc)))
            if st.get("ratio"):
                groups.setdefault((e["precision"], ex), []).append(st["ratio"])
        zoo_cell = "; ".join(f"{PRECISION_LABEL.get(p, p)} {ex}: "
                             f"{num(geomean(rs), '.3f')}x over {len(rs)} models"
                             for (p, ex), rs in groups.items()) + " " + " ".join(cites.values())
    rows.append(["torchvision zoo, training step: geometric mean converted/native", zoo_cell,
                 "", "", ""])
    return (table(["claim (H200 unless the source says otherwise)"]
                  + [NET_LABEL[n] for n in NETS], rows) + "\n\n" + src.text() + "\n")


TABLES: dict[str, Callable[[list[tuple[str, Any]]], str]] = {
    "headline": headline, "kernels": kernels, "training": training, "cold-start": cold_start,
    "zoo-cold": zoo_cold,
    "call-overhead": call_overhead, "zoo": zoo, "search-parity": search_parity}


def render(text: str, results: list[tuple[str, Any]]) -> str:
    """``text`` with every generated block rewritten from ``results``."""
    def sub(m: re.Match) -> str:
        if m.group(2) not in TABLES:
            raise ValueError(f"no table named {m.group(2)!r} (known: {', '.join(TABLES)})")
        return m.group(1) + TABLES[m.group(2)](results) + m.group(4)
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
