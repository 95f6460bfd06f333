"""The zoo's tables on docs/BENCHMARKS.md: step times, cold first steps and
gradients (tools/zoo_bench.py's ``--json``), and search parity
(tools/search_parity.py's); tools/results_page.py writes them into the page."""

from __future__ import annotations

from typing import Any

from round_stats import STEP_TARGET, geomean, median_interval, ratio_text  # tools/, beside this script
from results_tables import (LIMIT, MIB, NR, PRECISION_LABEL, TABLE_GPU, Sources, finish, gpu_of,
                            kind, num, of_kind, on_gpu, side_peak, source_line, table, newness)


# -- the zoo (tools/zoo_bench.py) ----------------------------------------------------------------
def zoo_with(results: list[tuple[str, Any]], *fields: str) -> list[tuple[str, Any]]:
    """The zoo documents with some result holding one of ``fields`` (a run may
    time steps and not cold steps, or the other way round)."""
    return [(name, doc) for name, doc in of_kind(results, "zoo")
            if any(e.get(f) for e in doc["results"] for f in fields)]


#: models a session's step runs must cover to be the zoo table's run (the issue's bar:
#: at least ten torchvision models); newer sessions with fewer are follow-ups
MIN_ZOO_MODELS = 10
#: ... the four bench networks among them (the issue's bar too): a run over models
#: never measured before (gpu_run.sh's zoo-heldout) is a later run with means of its own
BENCH_NETS = frozenset({"alexnet", "resnet18", "resnet50", "vgg16"})
#: what a file's name holds where it is a run over models never measured before
#: (gpu_run.sh's zoo-heldout): never part of the zoo table's run, even in its session
HELDOUT = "-heldout"


def _heldout(name: str) -> bool:
    return HELDOUT in name


def _picked_steps(docs: list[tuple[str, Any]]) -> list[tuple[str, dict, dict, str, dict]]:
    """(file, document, result, execution, step figures) of ``docs``, a later
    call's figures replacing an earlier one's of the same model, precision,
    execution and workspace limit."""
    picked: dict[tuple, tuple[str, dict, dict, str, dict]] = {}
    for name, doc in docs:
        for e in doc["results"]:
            for ex, st in (e.get("steps") or {}).items():
                key = _step_key(doc, e, ex)
                picked.pop(key, None)  # the newer run's place: rows in the order they ran
                picked[key] = (name, doc, e, ex, st)
    return list(picked.values())


#: The values that turn a mucudnn.torch switch on, and off (mucudnn/torch/settings.py's,
#: which importing would import torch; tests/test_results_page.py checks that they agree).
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
#: mucudnn.torch's default for replaying planned launches
#: (``mucudnn.torch.settings.REPLAY_DEFAULT``; tests/test_results_page.py checks
#: that the two agree). A run that records no ``MUCUDNN_TORCH_REPLAY`` ran
#: before replay existed, so without it.
REPLAY_DEFAULT = True


def torch_search(doc: dict, unset: str = "over-limit", eager: bool = True) -> str:
    """The ``MUCUDNN_TORCH_SEARCH`` a run was made under (``unset`` where the
    file does not say: by default, the search's default), ``", NATIVE=0"``
    where ``MUCUDNN_TORCH_NATIVE`` turned the comparisons with PyTorch's call
    off (every direction on plans), ``", REPLAY=1"`` or ``", REPLAY=0"`` where
    planned launches were or were not replayed as CUDA graphs
    (``MUCUDNN_TORCH_REPLAY``) against :data:`REPLAY_DEFAULT`, and the
    converted side's backend options (zoo_bench's ``--backend-option``): runs
    under other settings are not the default's.

    A file that records no ``MUCUDNN_TORCH_REPLAY`` was made before replay
    existed: its launches were direct. Replay changes eager steps' times
    only: a captured step is one graph whatever the setting, and a first
    step captures nothing yet, so without ``eager`` no label says it.

    >>> on = {"MUCUDNN_TORCH_REPLAY": "1"}
    >>> torch_search({"environment": {"settings": {**on, "MUCUDNN_TORCH_NATIVE": "0"}}})
    'over-limit, NATIVE=0'
    >>> torch_search({"environment": {"settings": {"MUCUDNN_TORCH_REPLAY": "off"}}})
    'over-limit, REPLAY=0'
    >>> torch_search({"environment": {}}, eager=False)
    'over-limit'
    >>> torch_search({"environment": {"settings": on}}), torch_search({"environment": {}}, "-")
    ('over-limit', '-, REPLAY=0')
    >>> torch_search({"environment": {"settings": on},
    ...               "options": {"backend_options": [["find_hold", False]]}})
    'over-limit, find_hold=False'
    """
    settings = doc["environment"].get("settings") or {}
    search = settings.get("MUCUDNN_TORCH_SEARCH", unset)
    native = str(settings.get("MUCUDNN_TORCH_NATIVE", "1")).strip().lower()
    replay = str(settings.get("MUCUDNN_TORCH_REPLAY", "0")).strip().lower() in _ON
    options = (doc.get("options") or {}).get("backend_options") or []
    return (search + (", NATIVE=0" if native in _OFF else "")
            + (f", REPLAY={int(replay)}" if eager and replay != REPLAY_DEFAULT else "")
            + "".join(f", {k}={v}" for k, v in options))


def _step_key(doc: dict, e: dict, ex: str) -> tuple:
    """What one step figure measured: model, precision, execution, limit, search."""
    return (e["model"], e["precision"], ex, doc["options"].get("workspace"),
            torch_search(doc, eager=ex != "graph"))


def _zoo_runs(results: list[tuple[str, Any]]) -> tuple[list, list]:
    """The zoo's step runs as (the zoo run, the other runs): the zoo run is the
    newest session whose step runs at the 64 MiB limit cover at least
    :data:`MIN_ZOO_MODELS` models, :data:`BENCH_NETS` among them (else the
    newest session with step runs at it), so that its geometric means come
    from one session's run. The other runs are every step run of a later
    session (any limit or search) and, from earlier sessions, those of a
    model, precision, execution, limit and search the zoo run did not
    measure (a captured step, say, which no eager run replaces), and the
    held-out runs of its own session (:data:`HELDOUT` in the file's name).
    The zoo run is made under the default ``MUCUDNN_TORCH_SEARCH``."""
    docs = zoo_with(results, "steps")
    at_limit = [(n, d) for n, d in docs if d["options"].get("workspace") == LIMIT
                and torch_search(d) == "over-limit" and not _heldout(n)]
    sessions: dict[tuple, list[tuple[str, Any]]] = {}
    for name, doc in at_limit:
        sessions.setdefault(newness(name)[:2], []).append((name, doc))
    covered = {k: {e["model"] for _, d in v for e in d["results"] if e.get("steps")}
               for k, v in sessions.items()}
    full = [k for k, models in covered.items()
            if len(models) >= MIN_ZOO_MODELS and BENCH_NETS <= models]
    if not sessions:  # none under the defaults: every run is another run
        return [], _picked_steps(docs)
    main = max(full) if full else max(sessions)
    zoo_run = _picked_steps(sessions[main])
    measured = {_step_key(d, e, ex) for _, d, e, ex, _ in zoo_run}
    others = [row for row in _picked_steps([(n, d) for n, d in docs
                                            if newness(n)[:2] != main or _heldout(n)])
              if newness(row[0])[:2] > main or _step_key(row[1], row[2], row[3]) not in measured]
    return zoo_run, others


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
                       + settings
                       + (f", pinned to CPUs {env['cpu_affinity']}" if env.get("cpu_affinity")
                          else "")
                       + (f"; {note}" if note else ""))


#: ``mucudnn.torch.report`` before 7526756 listed each layer with every
#: signature of its weight shape and options, the layers' own or not: files
#: dated before this over-count where a layer is listed more than once
REPORT_BY_SHAPE_UNTIL = "2026-12-06T20:00"
#: marks a total such a report over-counts (:data:`OVER_COUNTED_NOTE` says why)
OVER_COUNTED = "†"
OVER_COUNTED_NOTE = (
    f"{OVER_COUNTED} Over-counted: before 7526756 `report()` listed each layer with every "
    "signature of its weight shape, so these totals count a shape's signatures under every "
    "layer of that shape (DenseNet's 3x3 convolutions four times).\n")


def _over_counted(doc: dict, e: dict) -> bool:
    """Whether ``e``'s report totals count signatures under layers that did not
    run them (:data:`REPORT_BY_SHAPE_UNTIL`)."""
    names = [layer["name"] for layer in (e.get("report") or {}).get("layers", []) if "name" in layer]
    return str(doc["environment"].get("date") or "") < REPORT_BY_SHAPE_UNTIL \
        and len(names) != len(set(names))


def _conv_ms(doc: dict, e: dict, execution: str = "eager") -> str:
    rep = e.get("report") or {}
    t = rep.get("totals")
    if not t or not t.get("kernels"):
        return "-"
    if execution == "graph":
        t = _captured_totals(rep["layers"]) or t
    elif (rep.get("step_trial") or {}).get("torch"):
        t = _trial_totals(rep["layers"]) or t
    mark = f" {OVER_COUNTED}" if _over_counted(doc, e) else ""
    return f"{t['ms']:.2f} vs {t['torch_ms']:.2f} ({t['torch_kernels']}/{t['kernels']}){mark}"


def _captured_totals(layers: list[dict]) -> dict | None:
    """A report's totals as a CUDA-graph capture runs its layers: each direction
    a step runs on its GPU choice (Note [captured steps run the GPU's choice] in
    mucudnn/torch/native.py); None for reports made before they said so."""
    ms = torch_ms = 0.0
    kernels = torch_kernels = 0
    for layer in layers:
        for d in layer["directions"].values():
            if "captured" not in d:
                return None
            if not d["in_step"]:
                continue
            theirs = d["captured"] == "torch"
            kernels += 1
            torch_kernels += theirs
            ms += (d["torch_ms"] if theirs else d["plan_ms"]) or 0.0
            torch_ms += d["torch_ms"] or 0.0
    return {"ms": ms, "torch_ms": torch_ms, "kernels": kernels, "torch_kernels": torch_kernels}


def _fits(d: dict) -> bool:
    return d["torch_ms"] is not None and d["torch_workspace"] is not None \
        and (d["limit"] is None or d["torch_workspace"] <= d["limit"])


def _trial_totals(layers: list[dict]) -> dict | None:
    """A report's totals as its layers ran while the step trial ran PyTorch's
    way (Note [the whole-step trial]): a layer whose PyTorch workspace fits in
    every direction a step runs ran PyTorch's calls in all of them. Reports
    made before ``mucudnn.torch.report`` showed that list the per-layer choices;
    None where a row lacks what the rule reads."""
    ms = torch_ms = 0.0
    kernels = torch_kernels = 0
    for layer in layers:
        rows = list(layer["directions"].values())
        if any(k not in d for d in rows
               for k in ("in_step", "runs", "torch_ms", "torch_workspace", "limit", "ms")):
            return None
        run = [d for d in rows if d["in_step"]]
        whole = all(_fits(d) for d in run)
        for d in run:
            theirs = whole or d["runs"] == "torch"
            kernels += 1
            torch_kernels += theirs
            ms += (d["torch_ms"] if theirs else d["ms"]) or 0.0
            torch_ms += d["torch_ms"] or 0.0
    return {"ms": ms, "torch_ms": torch_ms, "kernels": kernels, "torch_kernels": torch_kernels}


def _pair(d: Any, key: str, fmt: str) -> str:
    if not isinstance(d, dict) or not all(isinstance(d.get(s), dict) for s in ("native", "converted")):
        return "-"
    return f"{format(d['native'].get(key, float('nan')), fmt)} / " \
           f"{format(d['converted'].get(key, float('nan')), fmt)}"


def _grad_errors(grad: dict) -> str:
    """Both sides' gradient errors against float64 (Note [gradient check] in
    tools/grad_error.py) and, where recorded, the converted first step's (its
    stand-ins)."""
    first = grad.get("converted_first_step") if isinstance(grad, dict) else None
    text = _pair(grad, "all", ".2e")
    return text + (f" (first step {first['all']:.2e})" if first and "all" in first else "")


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


def _steps_total(cold: dict) -> str:
    """Each side's seconds over its cold process's first steps (zoo_bench
    --cold-steps; the first step included): what a cold start costs in all,
    where a converted model plans after its first step (Note [planning after
    the first step] in mucudnn/torch/standin.py); "-" where not recorded."""
    sides = [cold[s] for s in ("native", "converted")]
    if not all(isinstance(c.get("steps_total_s"), (int, float)) for c in sides):
        return "-"
    n = len(sides[1].get("steps_s") or ())
    return f"{sides[0]['steps_total_s']:.1f} / {sides[1]['steps_total_s']:.1f} ({n} steps)"


def zoo_cold(results: list[tuple[str, Any]]) -> str:
    """First training steps from a cold cache (Note [cold steps] in
    tools/zoo_cold.py) and one step's gradient errors against float64 (Note
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
        row = [key[0], PRECISION_LABEL.get(key[1], key[1]), torch_search(first, NR, eager=False)]
        cites = []
        if key in colds:
            _, name, doc, e = colds[key]
            cold = e["cold"]
            row += [_first_step(cold["native"]), _first_step(cold["converted"]),
                    _first_calls(cold["converted"]), _steps_total(cold),
                    "yes" if e.get("cold_primer") else "none (native ran first)"]
            cites.append(src.cite(name, zoo_source(name, doc)))
        else:
            row += ["-"] * 5
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
        rows.append(row + [_grad_errors(grad), ratio, ", ".join(cites)])
    return finish(["model", "precision", "MUCUDNN_TORCH_SEARCH", "first step s, native",
                   "first step s, converted",
                   "converted first calls s: all (planning, signatures planned)",
                   "first steps s in all, native / converted", "primer",
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
                          ratio_text(st), _conv_ms(doc, e, ex),
                          _pair(e.get("cold"), "first_step_s", ".1f"),
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
    marked = any(_over_counted(doc, e) for _, doc, e, _, _ in steps + later)
    note = "\n" + OVER_COUNTED_NOTE if marked else ""
    if not later:
        return text + note
    src2 = Sources()
    rows2 = [[e["model"], PRECISION_LABEL.get(e["precision"], e["precision"]),
              "captured" if ex == "graph" else ex, _mib_limit(doc["options"].get("workspace")),
              torch_search(doc, eager=ex != "graph"), str(doc["options"].get("steps", "-")),
              num(st.get("native_ms")),
              num(st.get("converted_ms")), ratio_text(st), _conv_ms(doc, e, ex), _peaks(st),
              src2.cite(name, zoo_source(name, doc))]
             for name, doc, e, ex, st in later]
    return text + "\n**Other runs** (later sessions at any limit or search, and earlier ones " \
        "of a step, limit or search the zoo run above did not measure; not in its means):" \
        "\n\n" + _later_means(later) \
        + finish(["model", "precision", "step", "limit MiB", "MUCUDNN_TORCH_SEARCH",
                  "steps a round", "native ms",
                  "converted ms", "converted/native", "conv ms: what runs vs PyTorch's",
                  "peak MiB native / converted (requested bytes; allocated in files "
                  "before they were recorded)", "source"], rows2, src2, "zoo_bench.py") + note


def _later_means(later: list[tuple[str, dict, dict, str, dict]]) -> str:
    """The geometric means of the later runs' groups (one session, precision,
    step, limit and search) that cover at least :data:`MIN_ZOO_MODELS` models,
    as a table before theirs ("" where none does)."""
    groups: dict[tuple, list[tuple[str, float, bool]]] = {}
    for name, doc, e, ex, st in later:
        if st.get("ratio"):
            iv = median_interval(st.get("round_ratios") or [])
            key = (newness(name)[:2], e["precision"], ex, doc["options"].get("workspace"),
                   torch_search(doc, eager=ex != "graph"))
            groups.setdefault(key, []).append(
                (e["model"], st["ratio"], iv is not None and iv[0] > STEP_TARGET))
    rows = []
    for ((date, session), prec, ex, ws, search), rs in sorted(groups.items(), key=lambda kv: kv[0][0]):
        if len({m for m, _, _ in rs}) < MIN_ZOO_MODELS:
            continue
        worst = max(rs, key=lambda r: r[1])
        rows.append([f"{date} s{session}", PRECISION_LABEL.get(prec, prec),
                     "captured" if ex == "graph" else ex, _mib_limit(ws), search, str(len(rs)),
                     num(geomean([r for _, r, _ in rs]), ".3f"),
                     f"{sum(r > STEP_TARGET for _, r, _ in rs)} ({sum(a for _, _, a in rs)})",
                     f"{worst[0]} {worst[1]:.3f}"])
    if not rows:
        return ""
    return table(["session", "precision", "step", "limit MiB", "MUCUDNN_TORCH_SEARCH", "models",
                  "geometric mean converted/native",
                  f"models over {STEP_TARGET} (interval wholly above)", "slowest (ratio)"],
                 rows) + "\n\n"


def _mib_limit(ws: Any) -> str:
    return str(ws // MIB) if isinstance(ws, int) else NR


def _peaks(st: dict) -> str:
    """Each side's peak MiB in its steady steps (:func:`side_peak`: requested
    bytes where recorded; Note [memory per side] in tools/zoo_bench.py), and the
    control side's where one ran (a second native model: how far two identical
    models' peaks differ in the harness)."""
    mem = st.get("memory") or {}

    def peak(side: str) -> Any:
        b = side_peak(mem.get(side))
        return None if b is None else b / MIB
    control = peak("control")
    return f"{num(peak('native'), '.1f')} / {num(peak('converted'), '.1f')}" + (
        "" if control is None else f" (A/A {control:.1f})")


def zoo_elsewhere(results: list[tuple[str, Any]]) -> str:
    """The zoo's tables (:func:`zoo`, :func:`zoo_cold`, :func:`search_parity`)
    of each GPU other than :data:`TABLE_GPU`, each made from that GPU's files
    alone, under its name."""
    gpus = sorted({gpu_of(d) for _, d in results if kind(d) in ("zoo", "parity")} - {TABLE_GPU})
    if not gpus:
        return f"None: every zoo and search-parity run is on the {TABLE_GPU}.\n"
    parts = []
    for gpu in gpus:
        mine = on_gpu(results, gpu)
        text = f"#### {gpu}\n\n"
        if of_kind(mine, "zoo"):
            text += zoo(mine) + "\n" + zoo_cold(mine)
        if of_kind(mine, "parity"):
            text += "\n" + search_parity(mine)
        parts.append(text)
    return "\n".join(parts)


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
