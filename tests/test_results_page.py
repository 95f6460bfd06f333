"""docs/BENCHMARKS.md's and README.md's result tables are exactly what
tools/results_page.py writes from docs/results/ (the zoo's tables made by
tools/results_zoo.py): a hand-edited number fails here."""

from __future__ import annotations

import doctest
import json
import pathlib

import pytest

from tool_support import load_tool

ROOT = pathlib.Path(__file__).resolve().parent.parent
rp = load_tool("results_page")
rz = load_tool("results_zoo")
rt = load_tool("results_tables")


@pytest.fixture(scope="module")
def results():
    return rp.load_results(ROOT / "docs" / "results")


@pytest.fixture
def files_without_replay(monkeypatch):
    """Docs below that record no ``MUCUDNN_TORCH_REPLAY`` read as the
    default's runs, as they would under a default of direct launches: the
    tests that use this fixture check the tables' assembly, not the replay
    label (test_replay_is_labelled_against_mucudnn_torchs_default does)."""
    for tables in (rz.__dict__, rp.zoo.__globals__):  # results_page's own import too
        monkeypatch.setitem(tables, "REPLAY_DEFAULT", False)


@pytest.mark.parametrize("page", rp.PAGES)
def test_committed_tables_are_generated(page, results):
    text = (ROOT / page).read_text(encoding="utf-8")
    assert "<!-- generated: " in text
    assert rp.render(text, results) == text, (
        f"{page}: its tables differ from docs/results; run python tools/results_page.py")


def test_a_hand_edited_number_is_put_back(results):
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    block = text.split("<!-- generated: kernels -->", 1)[1].split("<!-- end generated -->")[0]
    row = next(line for line in block.splitlines() if line.startswith("| AlexNet"))
    cells = row.split("|")
    cells[3] = " 1.00 "  # the 64 MiB time
    edited = text.replace(row, "|".join(cells), 1)
    assert edited != text
    assert rp.render(edited, results) == text


def test_every_section_has_its_table():
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    names = [m.group(2) for m in rp.BLOCK.finditer(text)]
    assert names == ["kernels", "training", "cold-start", "call-overhead", "zoo", "zoo-cold",
                     "search-parity", "zoo-elsewhere"]
    assert len(text.splitlines()) <= 700
    assert "Not measured: no two-GPU machine was available" in text


def test_tool_doctests():
    for tool in (rz, rp):
        result = doctest.testmod(tool)
        assert result.failed == 0
    assert doctest.testmod(rz).attempted > 0


def test_unknown_table_is_an_error():
    with pytest.raises(ValueError, match="no table named 'nope'"):
        rp.render("<!-- generated: nope -->\n<!-- end generated -->", [])


@pytest.mark.usefixtures("files_without_replay")
def test_zoo_and_search_parity_render_when_present(tmp_path):
    zoo = {"environment": {"torch": "2.11.0", "gpu": "GPU X", "cudnn": 91900, "git_commit": "abc1234def",
                           "date": "2026-12-03T10:00:00+00:00"},
           "options": {"workspace": 64 << 20, "batch": 32},
           "results": [{"model": "mobilenet_v2", "precision": "fp32cl", "errors": {},
                        "steps": {"eager": {"native_ms": 10.0, "converted_ms": 12.0, "ratio": 1.2}}},
                       {"model": "resnet50", "precision": "fp32cl", "errors": {"graph": "OOM"},
                        "steps": {"eager": {"native_ms": 20.0, "converted_ms": 20.0, "ratio": 1.0}}}],
           "skipped": []}
    parity = {"options": {"find": "FindOptions()", "batch": 64},
              "models": {"mobilenet_v2": {"convs": 35, "kernels": 105, "held": 101}}}
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(zoo))
    (tmp_path / "2026-12-03-x-search-parity.json").write_text(json.dumps(parity))
    res = rp.load_results(tmp_path)
    z = rz.zoo(res)
    assert "| fp32 channels-last | eager | 2 | 1.095 | 1 (0) | mobilenet_v2 1.200 |" in z  # over 1.02
    assert "failed stage: resnet50" in z and "commit abc1234def" in z and "cuDNN 9.19.0" in z
    assert "| mobilenet_v2 | 35 | 105 | 101 | [1] |" in rz.search_parity(res)
    parity["models"]["mobilenet_v2"] |= {"complete": False, "convs_checked": 12, "kernels": 36,
                                         "held": 30}
    (tmp_path / "2026-12-03-x-search-parity.json").write_text(json.dumps(parity))
    assert "| mobilenet_v2 | 12 of 35 (cut short) | 36 | 30 | [1] |" in \
        rz.search_parity(rp.load_results(tmp_path))
    over = {"options": {"find": "FindOptions()", "batch": 64, "over_limit": 64 << 20},
            "models": {"convnext_tiny": {"convs": 20, "kernels": 15, "held": 9, "fit": 45}}}
    (tmp_path / "2026-12-03-x-search-parity.json").write_text(json.dumps(over))
    assert "| convnext_tiny | 20 | 15 (and 45 fitting the 64 MiB limit, not compared) | 9 |" in \
        rz.search_parity(rp.load_results(tmp_path))  # search_parity.py --over-limit 64MiB
    (tmp_path / "2026-12-03-x-search-parity.json").write_text(json.dumps(
        parity | {"models": {"mobilenet_v2": {"convs": 35, "kernels": 105, "held": 101}}}))
    res = rp.load_results(tmp_path)
    head = rp.headline(res)
    assert "fp32 channels-last eager: 1.095x over 2 models [1]" in head
    assert "not measured" in head  # no frontier or training results in this folder
    # a row with a control side (zoo_bench --with-control) shows its A/A ratio
    zoo["results"][0]["steps"]["eager"]["control_ratio"] = 0.987
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(zoo))
    assert "| 1.200 (A/A 0.987) |" in rz.zoo(rp.load_results(tmp_path))
    del zoo["results"][0]["steps"]["eager"]["control_ratio"]
    # twelve rounds: the interval of order statistics 3 and 10 (tools/round_stats.py); its
    # low end above 1.02 counts the model as over the target beyond its rounds' spread
    rounds = [1.30, 1.10, 1.25, 1.15, 1.20, 1.05, 1.22, 1.18, 1.12, 1.28, 1.08, 1.21]
    zoo["results"][0]["steps"]["eager"]["round_ratios"] = rounds
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(zoo))
    z = rz.zoo(rp.load_results(tmp_path))
    assert "| 1.200 [1.100, 1.250] |" in z
    assert "| fp32 channels-last | eager | 2 | 1.095 | 1 (1) | mobilenet_v2 1.200 |" in z
    zoo["results"][0]["steps"]["eager"]["round_ratios"] = rounds[:5]  # too few for an interval
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(zoo))
    assert "| 1.200 |" in rz.zoo(rp.load_results(tmp_path))
    del zoo["results"][0]["steps"]["eager"]["round_ratios"]
    # the settings a converted layer follows are named with the source
    zoo["environment"]["settings"] = {"MUCUDNN_TORCH_SEARCH": "over-limit"}
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(zoo))
    assert "batch 32, MUCUDNN_TORCH_SEARCH=over-limit" in rz.zoo(rp.load_results(tmp_path))
    zoo["environment"]["cpu_affinity"] = "2-5"  # Note [pinned CPUs] in train_steps.py
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(zoo))
    assert "MUCUDNN_TORCH_SEARCH=over-limit, pinned to CPUs 2-5" in \
        rz.zoo(rp.load_results(tmp_path))
    del zoo["environment"]["cpu_affinity"]
    # an A/A run (zoo_bench --control) measures the harness: never a result on the page
    control = dict(zoo, options={**zoo["options"], "control": True},
                   results=[dict(zoo["results"][0], model="densenet121")])
    (tmp_path / "2026-12-04-x-zoo-control.json").write_text(json.dumps(control))
    z = rz.zoo(rp.load_results(tmp_path))
    assert "densenet121" not in z and "mobilenet_v2 1.200" in z


@pytest.mark.usefixtures("files_without_replay")
def test_each_gpus_zoo_runs_get_tables_of_their_own(tmp_path):
    """Two GPUs' numbers never share a table or a mean: the page's tables
    hold the TABLE_GPU's files (and those that record no GPU), and the
    zoo-elsewhere block each other GPU's, under its name."""
    def doc(gpu, ratio):
        env = {"date": "2026-12-03T10:00:00+00:00"} | ({"gpu": gpu} if gpu else {})
        return {"environment": env, "options": {"workspace": 64 << 20, "batch": 64},
                "results": [{"model": "resnet18", "precision": "fp32cl", "errors": {},
                             "steps": {"eager": {"native_ms": 10.0, "converted_ms": 10.0 * ratio,
                                                 "ratio": ratio}}}], "skipped": []}
    (tmp_path / "2026-12-03-s1-call1-zoo.json").write_text(json.dumps(doc(None, 1.5)))
    (tmp_path / "2026-12-03-s2-call1-zoo.json").write_text(json.dumps(doc("NVIDIA H100 X", 1.25)))
    (tmp_path / "2026-12-03-s2-call2-zoo.json").write_text(json.dumps(doc("Other GPU", 1.125)))
    page = ("<!-- generated: zoo -->\n<!-- end generated -->\n"
            "<!-- generated: zoo-elsewhere -->\n<!-- end generated -->\n")
    out = rp.render(page, rp.load_results(tmp_path))
    main, elsewhere = out.split("<!-- generated: zoo-elsewhere -->")
    assert "resnet18 1.500" in main and "1.250" not in main and "1.125" not in main
    assert "Other runs" not in main  # a later session on another GPU is not the H200's
    h100, other = elsewhere.split("#### NVIDIA H100 X")[1].split("#### Other GPU")
    assert "resnet18 1.250" in h100 and "1.125" not in h100 and "1.500" not in h100
    assert "resnet18 1.125" in other and "1.250" not in other
    assert rt.gpu_of(json.loads((tmp_path / "2026-12-03-s1-call1-zoo.json").read_text())) \
        == rt.TABLE_GPU
    only_main = rp.render(page, rp.load_results(tmp_path)[:1])
    assert "None: every zoo and search-parity run is on the NVIDIA H200." in only_main


def test_the_headline_quotes_the_h200s_zoo_else_the_newest_other_gpus(tmp_path):
    """README's zoo row quotes the TABLE_GPU's zoo run under the current
    defaults; where it has none, the newest other GPU's, whose source line
    names that GPU; where no GPU has one, it says so (never an empty cell)."""
    def write(name, gpu, ratio, replay="1"):
        env = {"date": "2026-12-03T10:00:00+00:00", "gpu": gpu,
               "settings": {"MUCUDNN_TORCH_REPLAY": replay}}
        doc = {"environment": env, "options": {"workspace": 64 << 20, "batch": 64},
               "results": [{"model": "resnet18", "precision": "fp32cl", "errors": {},
                            "steps": {"eager": {"native_ms": 10.0, "converted_ms": 10.0 * ratio,
                                                "ratio": ratio}}}], "skipped": []}
        (tmp_path / name).write_text(json.dumps(doc))

    def zoo_row() -> str:
        head = rp.headline(rp.load_results(tmp_path))
        row = next(r for r in head.splitlines() if r.startswith("| torchvision zoo"))
        return row + "\n" + head.split("Sources:")[1]

    write("2026-12-03-s1-call1-zoo.json", rt.TABLE_GPU, 1.5, replay="0")  # not the defaults
    assert "not measured under the current defaults" in zoo_row()
    write("2026-12-03-s2-call1-zoo.json", "NVIDIA H100 X", 1.25)
    write("2026-12-03-s3-call1-zoo.json", "Other GPU", 1.125)
    row = zoo_row()
    assert "eager: 1.125x over 1 models [1]" in row and "device Other GPU" in row
    assert "1.250" not in row and "1.500" not in row
    write("2026-12-03-s0-call1-zoo.json", rt.TABLE_GPU, 1.0625)  # the H200's, though older
    row = zoo_row()
    assert "eager: 1.062x over 1 models [1]" in row and f"device {rt.TABLE_GPU}" in row
    assert "1.125" not in row


def test_zoo_conv_ms_is_what_ran_under_the_step_trials_way(tmp_path):
    """The conv-ms cell totals what ran: while the step trial ran PyTorch's way
    (Note [the whole-step trial]), a layer that fits in every direction a step
    runs ran PyTorch's calls, whatever its per-layer choices (reports before
    mucudnn.torch.report showed that list the choices); one over the limit
    in a direction kept its plans."""
    def row(runs, ms, torch_ms, ws, in_step=True):
        return {"runs": runs, "ms": ms, "torch_ms": torch_ms, "torch_workspace": ws,
                "limit": 64 << 20, "in_step": in_step}
    fits = {"fwd": row("mucudnn", 1.0, 2.0, 0), "bwd-data": row("torch", 2.0, 2.0, 0),
            "bwd-filter": row("mucudnn", 1.0, 3.0, 1 << 20)}
    over = {"fwd": row("torch", 1.0, 1.0, 0), "bwd-data": row("mucudnn", 9.0, None, None, False),
            "bwd-filter": row("mucudnn", 4.0, 3.0, 100 << 20)}
    report = {"layers": [{"directions": fits}, {"directions": over}],
              "totals": {"ms": 9.0, "torch_ms": 11.0, "kernels": 5, "torch_kernels": 2},
              "step_trial": {"kept": "plans", "torch": False, "step_ms": {}}}
    doc = {"environment": {"date": "2026-12-03"}, "options": {"workspace": 64 << 20},
           "results": [{"model": "m", "precision": "fp32cl", "report": report,
                        "steps": {"eager": {"native_ms": 10.0, "converted_ms": 10.0,
                                            "ratio": 1.0}}}], "skipped": []}
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(doc))
    assert "| 9.00 vs 11.00 (2/5) |" in rz.zoo(rp.load_results(tmp_path))
    report["step_trial"] = {"kept": "torch", "torch": True, "step_ms": {}}
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(doc))
    # the first layer on PyTorch's 7.0 ms; the second's forward 1.0 and its plan's 4.0
    assert "| 12.00 vs 11.00 (4/5) |" in rz.zoo(rp.load_results(tmp_path))
    # a report from before rows said whether a step runs them: its own totals
    for layer in report["layers"]:
        for d in layer["directions"].values():
            del d["in_step"]
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(doc))
    assert "| 9.00 vs 11.00 (2/5) |" in rz.zoo(rp.load_results(tmp_path))


def test_zoo_conv_ms_of_a_report_that_listed_layers_by_weight_shape_is_marked(tmp_path):
    """A report made before 7526756 listed each layer with every signature of
    its weight shape: where it lists a layer twice its totals over-count, and
    the cell and a note say so; a later report's layer listed twice (it ran
    two signatures) is not marked, nor is an earlier one without repeats."""
    d = {"runs": "torch", "ms": 1.0, "torch_ms": 1.0, "torch_workspace": 0, "limit": 1,
         "in_step": True}
    report = {"layers": [{"name": n, "directions": {"fwd": d}} for n in ("a", "a", "b")],
              "totals": {"ms": 3.0, "torch_ms": 3.0, "kernels": 3, "torch_kernels": 3}}
    doc = {"environment": {"date": "2026-12-06T19:00:00+00:00"},
           "options": {"workspace": 64 << 20},
           "results": [{"model": "m", "precision": "fp32cl", "report": report,
                        "steps": {"eager": {"native_ms": 1.0, "converted_ms": 1.0,
                                            "ratio": 1.0}}}], "skipped": []}
    path = tmp_path / "2026-12-06-x-zoo.json"
    path.write_text(json.dumps(doc))
    z = rz.zoo(rp.load_results(tmp_path))
    assert f"| 3.00 vs 3.00 (3/3) {rz.OVER_COUNTED} |" in z and rz.OVER_COUNTED_NOTE in z
    for date, names in (("2026-12-06T21:00:00+00:00", "aab"), ("2026-12-06T19:00:00+00:00", "abc")):
        doc["environment"]["date"] = date
        for layer, n in zip(report["layers"], names):
            layer["name"] = n
        path.write_text(json.dumps(doc))
        z = rz.zoo(rp.load_results(tmp_path))
        assert "| 3.00 vs 3.00 (3/3) |" in z and rz.OVER_COUNTED not in z


@pytest.mark.usefixtures("files_without_replay")
def test_zoo_conv_ms_of_a_captured_row_is_what_the_capture_ran(tmp_path):
    """A captured row totals each direction a step runs on its GPU choice (Note
    [captured steps run the GPU's choice]), whatever the eager ways ran; a
    report from before rows said so gives its own totals."""
    def row(runs, captured, plan_ms, torch_ms, in_step=True):
        return {"runs": runs, "captured": captured, "ms": torch_ms if runs == "torch" else plan_ms,
                "plan_ms": plan_ms, "torch_ms": torch_ms, "torch_workspace": 0,
                "limit": 64 << 20, "in_step": in_step}
    dirs = {"fwd": row("torch", "mucudnn", 1.0, 2.0), "bwd-data": row("torch", "torch", 3.0, 2.0),
            "bwd-filter": row("torch", "mucudnn", 0.5, 4.0),
            "unused": row("mucudnn", "mucudnn", 9.0, None, in_step=False)}
    report = {"layers": [{"directions": dirs}],
              "totals": {"ms": 8.0, "torch_ms": 8.0, "kernels": 3, "torch_kernels": 3},
              "step_trial": {"kept": "torch", "torch": True, "step_ms": {}}}
    steps = {"native_ms": 10.0, "converted_ms": 9.0, "ratio": 0.9}
    doc = {"environment": {"date": "2026-12-03"}, "options": {"workspace": 64 << 20},
           "results": [{"model": "m", "precision": "fp32cl", "report": report,
                        "steps": {"eager": dict(steps, ratio=1.0), "graph": steps}}],
           "skipped": []}
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(doc))
    z = rz.zoo(rp.load_results(tmp_path))
    assert "| m | fp32 channels-last | eager | 10.00 | 9.00 | 1.000 | 8.00 vs 8.00 (3/3) |" in z
    # captured: the plans' 1.0 and 0.5 ms, PyTorch's 2.0 ms backward-data
    assert "| m | fp32 channels-last | captured | 10.00 | 9.00 | 0.900 | 3.50 vs 8.00 (1/3) |" in z
    for d in dirs.values():
        del d["captured"]
    (tmp_path / "2026-12-03-x-zoo.json").write_text(json.dumps(doc))
    assert "| captured | 10.00 | 9.00 | 0.900 | 8.00 vs 8.00 (3/3) |" in \
        rz.zoo(rp.load_results(tmp_path))


@pytest.mark.usefixtures("files_without_replay")
def test_zoo_cold_table(tmp_path):
    """Cold first steps (zoo_bench --cold, --no-steps too) with the search in force and
    whether a primer ran first; an entry without both sides is not a row."""
    assert rz.zoo_cold([]).startswith("Not measured yet")
    env = {"date": "2026-12-03", "gpu": "NVIDIA H200", "cudnn": "9.19.0", "torch": "2.11",
           "git_commit": "abc1234", "settings": {"MUCUDNN_TORCH_SEARCH": "over-limit"}}
    cold = {s: {"first_step_s": v, "second_step_s": 0.02} for s, v in
            (("native", 2.3), ("converted", 6.45))}
    doc = {"environment": env, "options": {"workspace": 64 << 20, "batch": 64},
           "results": [{"model": "resnet18", "precision": "fp32cl", "steps": {}, "cold": cold,
                        "cold_primer": {"first_step_s": 9.9}},
                       {"model": "vgg16", "precision": "amp", "steps": {}, "cold": cold},
                       {"model": "convnext_tiny", "precision": "fp32cl", "steps": {},
                        "cold": {s: dict(v, profiled=True) for s, v in cold.items()},
                        "cold_primer": {"first_step_s": 9.9}},
                       {"model": "alexnet", "precision": "amp", "steps": {},
                        "cold": {"native": cold["native"]}},
                       {"model": "resnet50", "precision": "fp32cl", "steps": {},
                        "cold": {s: dict(v, first_step_samples=[v["first_step_s"], 1.0, 12.0],
                                         first_calls={"seconds": 4.2, "planning_seconds": 3.0,
                                                      "signatures": 30, "planned_signatures": 2})
                                 for s, v in cold.items()}, "cold_primer": {}}],
           "skipped": []}
    (tmp_path / "2026-12-03-h200-s1-call1-zoo-cold.json").write_text(json.dumps(doc))
    t = rz.zoo_cold(rp.load_results(tmp_path))
    assert "| resnet18 | fp32 channels-last | over-limit | 2.3 | 6.5 | - | - | yes | - | - | [1] |" \
        in t
    assert "| vgg16 | AMP bf16 channels-last | over-limit | 2.3 | 6.5 | - | - | none (native ran " \
           "first) | - | - | [1] |" in t
    assert "| convnext_tiny | fp32 channels-last | over-limit | 2.3 (profiled) | 6.5 (profiled) " \
           "| - | - | yes |" in t  # zoo_bench --cold-profile: seconds under cProfile
    assert "alexnet" not in t and "MUCUDNN_TORCH_SEARCH=over-limit" in t
    assert "| resnet50 | fp32 channels-last | over-limit | 2.3 (median of 3: 1.0-12.0) " \
           "| 6.5 (median of 3: 1.0-12.0) | 4.2 (3.0, 2 of 30) | - |" in t  # --cold-repeat 3
    # zoo_bench --cold-steps: each side's first steps in all (Note [planning after the first step])
    steps = {"native": [2.0, 0.1, 0.1], "converted": [2.5, 1.0, 0.1]}
    for e in doc["results"]:
        if e["model"] == "resnet18":
            e["cold"] = {s: dict(v, steps_s=steps[s], steps_total_s=sum(steps[s]))
                         for s, v in cold.items()}
    (tmp_path / "2026-12-03-h200-s1-call1-zoo-cold.json").write_text(json.dumps(doc))
    t = rz.zoo_cold(rp.load_results(tmp_path))
    assert "| resnet18 | fp32 channels-last | over-limit | 2.3 | 6.5 | - | 2.2 / 3.6 (3 steps) " \
           "| yes |" in t
    # a run with the comparisons off is labelled so, as in the step tables; a file
    # that does not say is "not recorded"
    doc["environment"] = dict(env, settings={"MUCUDNN_TORCH_NATIVE": "0",
                                             "MUCUDNN_TORCH_SEARCH": "over-limit"})
    (tmp_path / "2026-12-03-h200-s1-call2-zoo-cold.json").write_text(json.dumps(doc))
    t = rz.zoo_cold(rp.load_results(tmp_path))
    assert "| resnet18 | fp32 channels-last | over-limit, NATIVE=0 | 2.3 | 6.5 |" in t
    doc["environment"] = {k: v for k, v in env.items() if k != "settings"}
    (tmp_path / "2026-12-03-h200-s1-call3-zoo-cold.json").write_text(json.dumps(doc))
    t = rz.zoo_cold(rp.load_results(tmp_path))
    assert f"| resnet18 | fp32 channels-last | {rz.NR} | 2.3 | 6.5 |" in t


@pytest.mark.usefixtures("files_without_replay")
def test_zoo_cold_table_shows_gradient_errors(tmp_path):
    """zoo_bench --grad-check rows: each side's error against float64 and their
    ratio (the target compares errors, not gradients); no cold figures needed."""
    env = {"date": "2026-12-03", "gpu": "NVIDIA H200", "cudnn": "9.19.0", "torch": "2.11",
           "git_commit": "abc1234", "settings": {"MUCUDNN_TORCH_SEARCH": "over-limit"}}
    grad = {"batch": 8, "native": {"all": 0.2, "conv_max": 0.3},
            "converted": {"all": 0.25, "conv_max": 0.3}, "planned_kernels": 3}
    doc = {"environment": env, "options": {"workspace": 64 << 20, "batch": 64},
           "results": [{"model": "densenet121", "precision": "fp32cl", "steps": {}, "grad": grad},
                       {"model": "vgg16", "precision": "fp32cl", "steps": {},
                        "grad": {"native": grad["native"]}}],
           "skipped": []}
    (tmp_path / "2026-12-03-h200-s1-call1-zoo-grad.json").write_text(json.dumps(doc))
    t = rz.zoo_cold(rp.load_results(tmp_path))
    assert "| densenet121 | fp32 channels-last | over-limit | - | - | - | - | - | 2.00e-01 / 2.50e-01 " \
           "| 1.25 (3 kernels on plans) | [1] |" in t
    assert "vgg16" not in t
    # the converted first step's error (its stand-ins), where the run recorded it
    grad["converted_first_step"] = {"all": 0.21}
    (tmp_path / "2026-12-03-h200-s1-call1-zoo-grad.json").write_text(json.dumps(doc))
    t = rz.zoo_cold(rp.load_results(tmp_path))
    assert "| 2.00e-01 / 2.50e-01 (first step 2.10e-01) | 1.25 (3 kernels on plans) |" in t


@pytest.mark.usefixtures("files_without_replay")
def test_zoo_tables_each_take_the_newest_session_that_measured_them(tmp_path):
    """A newer session that timed only steps replaces the step table and leaves
    the cold/gradient table on the older session that measured those; the
    cold/gradient table keeps each model's newest measurement, whichever
    session took it."""
    env = {"date": "2026-12-03", "gpu": "NVIDIA H200", "cudnn": "9.19.0", "torch": "2.11",
           "git_commit": "abc1234"}
    cold = {s: {"first_step_s": v, "second_step_s": 0.02} for s, v in
            (("native", 2.3), ("converted", 6.45))}
    steps = {"eager": {"native_ms": 10.0, "converted_ms": 10.5, "ratio": 1.05}}

    def write(name, model, **fields):
        doc = {"environment": env, "options": {"workspace": 64 << 20, "batch": 64},
               "results": [{"model": model, "precision": "fp32cl", "steps": {}, **fields}],
               "skipped": []}
        (tmp_path / name).write_text(json.dumps(doc))
    write("2026-12-03-h200-s1-call1-zoo-cold.json", "vgg16", cold=cold)
    write("2026-12-03-h200-s1-call2-zoo.json", "alexnet", steps=steps)
    write("2026-12-03-h200-s2-call1-zoo.json", "resnet18", steps=steps)
    res = rp.load_results(tmp_path)
    z, c = rz.zoo(res), rz.zoo_cold(res)
    main, others = z.split("**Other runs**")  # an earlier run of what s2 did not measure
    assert "resnet18" in main and "alexnet" not in main and "alexnet" in others
    assert "vgg16" not in z
    assert "vgg16" in c and "resnet18" not in c
    write("2026-12-03-h200-s3-call1-zoo-cold.json", "densenet121", cold=cold)
    res = rp.load_results(tmp_path)
    assert "densenet121" in rz.zoo_cold(res) and "| vgg16 |" in rz.zoo_cold(res)
    assert "resnet18" in rz.zoo(res) and "densenet121" not in rz.zoo(res)


@pytest.mark.usefixtures("files_without_replay")
def test_zoo_cold_row_takes_cold_steps_and_gradients_each_from_the_newest_file(tmp_path):
    """A newer file that measured only cold steps replaces a model's cold cells
    and keeps the gradient cells of the older file that measured them; the row
    cites both files."""
    env = {"date": "2026-12-03", "gpu": "NVIDIA H200", "cudnn": "9.19.0", "torch": "2.11",
           "git_commit": "abc1234", "settings": {"MUCUDNN_TORCH_SEARCH": "over-limit"}}

    def side(native, converted, **extra):
        return {"native": {"first_step_s": native}, "converted": {"first_step_s": converted,
                                                                  **extra}}
    grad = {"native": {"all": 0.2}, "converted": {"all": 0.2}, "planned_kernels": 1}

    def write(name, **fields):
        doc = {"environment": env, "options": {"workspace": 64 << 20, "batch": 64},
               "results": [{"model": "resnet18", "precision": "fp32cl", "steps": {},
                            "cold_primer": True, **fields}], "skipped": []}
        (tmp_path / name).write_text(json.dumps(doc))
    write("2026-12-03-h200-s1-call1-zoo-cold-grad.json", cold=side(2.0, 3.0), grad=grad)
    first = {"signatures": 11, "seconds": 3.4, "planning_seconds": 1.5, "planned_signatures": 1}
    write("2026-12-03-h200-s2-call1-zoo-cold.json", cold=side(2.3, 3.9, first_calls=first))
    t = rz.zoo_cold(rp.load_results(tmp_path))
    assert "| resnet18 | fp32 channels-last | over-limit | 2.3 | 3.9 | 3.4 (1.5, 1 of 11) | - | yes " \
           "| 2.00e-01 / 2.00e-01 | 1.00 (1 kernel on plans) | [1], [2] |" in t
    assert "1. `2026-12-03-h200-s2-call1-zoo-cold.json`" in t
    assert "2. `2026-12-03-h200-s1-call1-zoo-cold-grad.json`" in t
    assert t.count("| resnet18 |") == 1


def test_zoo_cold_table_keeps_one_row_per_model_and_precision(tmp_path):
    """A later call's row of the same model and precision replaces an earlier
    one, but a profiled first step never replaces an unprofiled one."""
    env = {"date": "2026-12-03", "gpu": "NVIDIA H200", "cudnn": "9.19.0", "torch": "2.11",
           "git_commit": "abc1234"}

    def cold(native, converted, profiled=False):
        return {s: {"first_step_s": v, **({"profiled": True} if profiled else {})}
                for s, v in (("native", native), ("converted", converted))}

    def write(name, *results):
        doc = {"environment": env, "options": {"workspace": 64 << 20, "batch": 64},
               "results": [{"model": m, "precision": "fp32cl", "steps": {}, "cold": c}
                           for m, c in results], "skipped": []}
        (tmp_path / name).write_text(json.dumps(doc))
    write("2026-12-03-h200-s4-call1-zoo-cold.json", ("densenet121", cold(11.3, 27.4, True)))
    write("2026-12-03-h200-s4-call2-zoo-cold.json", ("densenet121", cold(7.5, 11.5)),
          ("mobilenet_v2", cold(7.9, 11.1)))
    write("2026-12-03-h200-s4-call3-zoo-cold.json", ("mobilenet_v2", cold(11.1, 10.2, True)),
          ("regnet_y_1_6gf", cold(4.3, 12.9)))
    t = rz.zoo_cold(rp.load_results(tmp_path))
    rows = [r for r in t.splitlines() if r.startswith("| ") and "fp32" in r]
    assert [r.split(" | ")[0] for r in rows] == ["| densenet121", "| mobilenet_v2",
                                                 "| regnet_y_1_6gf"]
    assert "| 7.5 | 11.5 |" in rows[0] and "| 7.9 | 11.1 |" in rows[1] and "profiled" not in t


def test_newest_is_by_date_then_session_and_call():
    names = ["2026-12-02-h200-s14-call8-a.json", "2026-12-01-h200-zz.json",
             "2026-12-02-h200-s14-call10-a.json", "2026-12-02-h200-merged.json.gz",
             "2026-12-01-h200-s7-call1-b.json", "2026-12-01-h200-zz-final.json",
             "2026-12-02-h200-s14-call9b-a.json", "2026-12-02-h200-s14-call9a-b.json"]
    assert sorted(names, key=rt.newness) == [
        "2026-12-01-h200-zz.json", "2026-12-01-h200-zz-final.json",
        "2026-12-01-h200-s7-call1-b.json", "2026-12-02-h200-merged.json.gz",
        "2026-12-02-h200-s14-call8-a.json", "2026-12-02-h200-s14-call9a-b.json",
        "2026-12-02-h200-s14-call9b-a.json", "2026-12-02-h200-s14-call10-a.json"]


def test_search_parity_shows_the_whole_model_run_and_the_over_limit_run_with_its_directions(
        tmp_path):
    """The newest run over whole models and the newest --over-limit run both
    appear; the latter's compared directions get a row each (PyTorch's call,
    and its calls at the largest fitting halving of the batch), its
    directions that fit the limit none; the run's environment is its source."""
    whole = {"options": {"find": "FindOptions()", "batch": 64},
             "models": {"mobilenet_v2": {"convs": 30, "kernels": 90, "held": 69}}}
    row = {"layer": "conv1", "direction": "backward_filter", "torch_workspace": 250 << 20,
           "torch_ms": 0.469, "held": True, "fits": False,
           "torch_under_limit": {"batch": 8, "workspace_bytes": 33 << 20, "ms": 0.142,
                                 "ms_whole_batch": 1.132, "held": False}}
    fits = {"layer": "conv1", "direction": "forward", "torch_workspace": 1 << 20, "fits": True,
            "held": None}
    over = {"environment": {"gpu": "NVIDIA H200", "cudnn": 91900, "torch": "2.11",
                            "git_commit": "f2cb75e", "date": "2026-12-03T16:13:18+00:00"},
            "options": {"find": "FindOptions()", "batch": 64, "over_limit": 64 << 20},
            "models": {"resnext50_32x4d": {"convs": 24, "kernels": 1, "held": 1, "fit": 1,
                                           "results": [fits, row]}}}
    (tmp_path / "2026-12-02-h200-s1-call1-parity.json").write_text(json.dumps(whole))
    (tmp_path / "2026-12-03-h200-s2-call1-parity-over-limit.json").write_text(json.dumps(over))
    t = rz.search_parity(rp.load_results(tmp_path))
    assert "| resnext50_32x4d | conv1 | backward_filter | 250.0 | 0.469 | yes | 8 (33.0 MiB) " \
           "| 1.132 | no | [2] |" in t
    assert "| resnext50_32x4d | conv1 | forward |" not in t
    assert "| mobilenet_v2 | 30 | 90 | 69 | [1] |" in t
    assert "| resnext50_32x4d | 24 | 1 (and 1 fitting the 64 MiB limit, not compared) | 1 | [2] |" in t
    assert "commit f2cb75e; date 2026-12-03T16:13:18+00:00; device NVIDIA H200; cuDNN 9.19.0" in t


@pytest.mark.usefixtures("files_without_replay")
def test_zoo_table_is_the_newest_whole_zoo_run_and_other_runs_follow_it(tmp_path):
    """The step table and its means come from the newest session whose runs at
    the 64 MiB limit cover rz.MIN_ZOO_MODELS models; a later session with fewer
    models (or another limit) is listed after it as other runs, not in the
    means, and so is an earlier run of what the zoo run did not measure."""
    env = {"date": "2026-12-03", "gpu": "NVIDIA H200", "cudnn": "9.19.0", "torch": "2.11",
           "git_commit": "abc1234"}

    def steps(ratio, **extra):
        return {"eager": {"native_ms": 10.0, "converted_ms": 10.0 * ratio, "ratio": ratio,
                          **extra}}

    def write(name, models, ratio, workspace=64 << 20, search=None, native=None, **extra):
        settings = {"settings": {k: v for k, v in (("MUCUDNN_TORCH_SEARCH", search),
                                                   ("MUCUDNN_TORCH_NATIVE", native)) if v}}
        doc = {"environment": {**env, **settings},
               "options": {"workspace": workspace, "batch": 64, "steps": 10},
               "results": [{"model": m, "precision": "fp32cl", "steps": steps(ratio, **extra)}
                           for m in models], "skipped": []}
        (tmp_path / name).write_text(json.dumps(doc))
    zoo = [f"m{i}" for i in range(rz.MIN_ZOO_MODELS - len(rz.BENCH_NETS))] + sorted(rz.BENCH_NETS)
    write("2026-12-03-h200-s1-call1-zoo.json", zoo, 1.05)
    mem = {"native": {"peak_bytes": 100 << 20}, "converted": {"peak_bytes": 99 << 20},
           "control": {"peak_bytes": 101 << 20}}
    write("2026-12-03-h200-s2-call1-zoo.json", ["m0"], 1.01, memory=mem, control_ratio=1.0)
    write("2026-12-03-h200-s2-call2-zoo.json", ["m0"], 1.00, workspace=512 << 20)
    z = rz.zoo(rp.load_results(tmp_path))
    main, later = z.split("**Other runs**")
    assert f"| fp32 channels-last | eager | {rz.MIN_ZOO_MODELS} | 1.050 |" in main
    assert "| m0 | fp32 channels-last | eager | 10.00 | 10.50 | 1.050 |" in main
    assert "| m0 | fp32 channels-last | eager | 64 | over-limit | 10 | 10.00 | 10.10 | " \
           "1.010 (A/A 1.000) | - | 100.0 / 99.0 (A/A 101.0) | [1] |" in later
    assert "| m0 | fp32 channels-last | eager | 512 | over-limit | 10 | 10.00 | 10.00 | 1.000 |" \
        in later
    # a run under another search is a row of its own, never the default's, and a
    # whole zoo run under it is not the zoo table's run
    write("2026-12-03-h200-s2-call3-zoo.json", zoo, 0.90, search="all")
    z = rz.zoo(rp.load_results(tmp_path))
    main, later = z.split("**Other runs**")
    assert "| 1.050 |" in main and "0.900" not in main
    assert "| m0 | fp32 channels-last | eager | 64 | over-limit | 10 | 10.00 | 10.10 |" in later
    assert "| m0 | fp32 channels-last | eager | 64 | all | 10 | 10.00 | 9.00 | 0.900 |" in later
    # a later session's group (precision, step, limit, search) that covers the zoo's
    # count of models has its means; one with fewer (the s2 runs of m0 alone) has none
    assert f"| 2026-12-03 s2 | fp32 channels-last | eager | 64 | all | {rz.MIN_ZOO_MODELS} | " \
        "0.900 | 0 (0) | m0 0.900 |" in later
    assert later.count("| 2026-12-03 s2 |") == 1
    # a later session over as many models, none of the bench networks (a held-out set), is
    # a later run with its means, not the zoo table's run
    heldout = [f"h{i}" for i in range(rz.MIN_ZOO_MODELS + 2)]
    write("2026-12-03-h200-s3-call1-zoo.json", heldout, 1.25)
    main, later = rz.zoo(rp.load_results(tmp_path)).split("**Other runs**")
    assert "| 1.050 |" in main and "1.250" not in main
    assert f"| 2026-12-03 s3 | fp32 channels-last | eager | 64 | over-limit | " \
        f"{rz.MIN_ZOO_MODELS + 2} | 1.250 |" in later
    # a held-out run in the zoo run's own session (gpu_run.sh's zoo-heldout, named so)
    # stays out of its table and means, a row among the other runs
    write("2026-12-03-h200-s1-call2-zoo-heldout.json", ["x0"], 1.30)
    main, later = rz.zoo(rp.load_results(tmp_path)).split("**Other runs**")
    assert "| 1.050 |" in main and "x0" not in main
    assert "| x0 | fp32 channels-last | eager | 64 | over-limit | 10 | 10.00 | 13.00 | 1.300 |" \
        in later
    (tmp_path / "2026-12-03-h200-s1-call2-zoo-heldout.json").unlink()
    # so is one with the comparisons with PyTorch's call off (every direction on plans)
    write("2026-12-03-h200-s2-call4-zoo.json", zoo, 0.95, native="0")
    z = rz.zoo(rp.load_results(tmp_path))
    main, later = z.split("**Other runs**")
    assert "| 1.050 |" in main and "0.950" not in main
    assert "| m0 | fp32 channels-last | eager | 64 | over-limit, NATIVE=0 | 10 | 10.00 | 9.50 | " \
        "0.950 |" in later
    # a newer whole zoo run takes the table; what it measured again leaves the page
    # (s1's run, s2's m0 at 64 MiB), what it did not stays as other runs (another
    # limit, search or comparison setting)
    write("2026-12-03-h200-s3-call1-zoo.json", zoo, 1.02)
    main, later = rz.zoo(rp.load_results(tmp_path)).split("**Other runs**")
    assert "| 1.020 |" in main and "1.050" not in main + later and "1.010" not in later
    assert "| m0 | fp32 channels-last | eager | 512 | over-limit | 10 | 10.00 | 10.00 | 1.000 |" \
        in later and "| 64 | all |" in later and "NATIVE=0" in later
    # with nothing earlier or later that it did not measure, it stands alone
    for f in tmp_path.glob("2026-12-03-h200-s2-*"):
        f.unlink()
    assert "Other runs" not in rz.zoo(rp.load_results(tmp_path))
    # a whole zoo run on a backend with other find options (zoo_bench --backend-option)
    # is not the default search's: never the zoo table's run, its rows its own
    write("2026-12-03-h200-s4-call1-zoo.json", zoo, 0.80)
    name = tmp_path / "2026-12-03-h200-s4-call1-zoo.json"
    doc = json.loads(name.read_text())
    doc["options"]["backend_options"] = [["find_hold", False]]
    name.write_text(json.dumps(doc))
    main, later = rz.zoo(rp.load_results(tmp_path)).split("**Other runs**")
    assert "| 1.020 |" in main and "0.800" not in main
    assert "| m0 | fp32 channels-last | eager | 64 | over-limit, find_hold=False | 10 | " \
        "10.00 | 8.00 | 0.800 |" in later


def test_over_limit_parity_keeps_each_models_newest_run(tmp_path):
    """A later --over-limit run of another model adds its rows; one of the same
    model replaces the earlier one's."""
    def run(name, model, held):
        row = {"layer": "conv1", "direction": "backward_filter", "torch_workspace": 100 << 20,
               "torch_ms": 0.5, "held": held, "fits": False, "torch_under_limit": None}
        doc = {"options": {"find": "FindOptions()", "batch": 64, "over_limit": 64 << 20},
               "models": {model: {"convs": 3, "kernels": 1, "held": int(held),
                                  "results": [row]}}}
        (tmp_path / name).write_text(json.dumps(doc))
    run("2026-12-03-h200-s1-call1-parity.json", "convnext_tiny", False)
    run("2026-12-03-h200-s1-call2-parity.json", "resnet18", True)
    t = rz.search_parity(rp.load_results(tmp_path))
    assert "| convnext_tiny | conv1 | backward_filter | 100.0 | 0.500 | no | none fits | - | - | [1] |" in t
    assert "| resnet18 | conv1 | backward_filter | 100.0 | 0.500 | yes | none fits | - | - | [2] |" in t
    run("2026-12-03-h200-s2-call1-parity.json", "convnext_tiny", True)
    t = rz.search_parity(rp.load_results(tmp_path))
    assert "| convnext_tiny | conv1 | backward_filter | 100.0 | 0.500 | yes |" in t
    assert "| no |" not in t and "s1-call1" not in t


def test_replay_is_labelled_against_mucudnn_torchs_default(tmp_path, monkeypatch):
    """A zoo run is the default's only where its planned launches were
    replayed as ``mucudnn.torch``'s default says (rz.REPLAY_DEFAULT, the
    library's own); a run that records no setting ran before replay existed,
    without it. Under a default that no run followed, every run is another
    run, none lost."""
    settings = pytest.importorskip("mucudnn.torch.settings")
    assert rz.REPLAY_DEFAULT is settings.REPLAY_DEFAULT
    assert (rz._ON, rz._OFF) == (settings._ON, settings._OFF)  # the same spellings of a switch
    env = {"date": "2026-12-03", "gpu": "NVIDIA H200", "cudnn": "9.19.0", "torch": "2.11",
           "git_commit": "abc1234"}
    zoo = [f"m{i}" for i in range(rz.MIN_ZOO_MODELS - len(rz.BENCH_NETS))] + sorted(rz.BENCH_NETS)

    def write(name, ratio, replay=None):
        settings = {"MUCUDNN_TORCH_SEARCH": "over-limit"}
        if replay is not None:
            settings["MUCUDNN_TORCH_REPLAY"] = replay
        doc = {"environment": {**env, "settings": settings},
               "options": {"workspace": 64 << 20, "batch": 64, "steps": 10},
               "results": [{"model": m, "precision": "fp32cl",
                            "steps": {"eager": {"native_ms": 10.0, "converted_ms": 10 * ratio,
                                                "ratio": ratio}}} for m in zoo],
               "skipped": []}
        (tmp_path / name).write_text(json.dumps(doc))
    write("2026-12-03-h200-s1-call1-zoo.json", 1.05)         # before replay existed
    write("2026-12-03-h200-s2-call1-zoo.json", 1.01, "1")
    for default, main_ratio, other in ((False, "1.050", ", REPLAY=1"),
                                       (True, "1.010", ", REPLAY=0")):
        monkeypatch.setattr(rz, "REPLAY_DEFAULT", default)
        main, later = rz.zoo(rp.load_results(tmp_path)).split("**Other runs**")
        assert f"| fp32 channels-last | eager | {rz.MIN_ZOO_MODELS} | {main_ratio} |" in main
        assert f"| m0 | fp32 channels-last | eager | 64 | over-limit{other} | 10 |" in later
    write("2026-12-03-h200-s2-call1-zoo.json", 1.01, "0")
    main, later = rz.zoo(rp.load_results(tmp_path)).split("**Other runs**")  # none replayed
    assert "Not measured yet" in main and "| m0 |" not in main
    assert "| m0 | fp32 channels-last | eager | 64 | over-limit, REPLAY=0 | 10 | 10.00 | 10.10 |" \
        in later and "10.50" not in later  # the newer run of one setting replaces the older


def test_replay_labels_eager_steps_only(tmp_path, monkeypatch):
    """Replay changes eager steps' times only: under a default of replay, a
    file that records no setting (direct launches) labels its eager rows
    ``REPLAY=0``, but not its captured steps (one graph either way) nor its
    cold first steps (which capture nothing yet)."""
    for tables in (rz.__dict__, rp.zoo.__globals__):
        monkeypatch.setitem(tables, "REPLAY_DEFAULT", True)
    env = {"date": "2026-12-03", "gpu": "NVIDIA H200", "cudnn": "9.19.0", "torch": "2.11",
           "git_commit": "abc1234", "settings": {"MUCUDNN_TORCH_SEARCH": "over-limit"}}
    step = {"native_ms": 10.0, "converted_ms": 10.0, "ratio": 1.0}
    cold = {s: {"first_step_s": 2.0} for s in ("native", "converted")}
    doc = {"environment": env, "options": {"workspace": 64 << 20, "batch": 64, "steps": 10},
           "results": [{"model": "m0", "precision": "fp32cl", "cold": cold, "cold_primer": {},
                        "steps": {"eager": step, "graph": step}}], "skipped": []}
    (tmp_path / "2026-12-03-h200-s1-call1-zoo.json").write_text(json.dumps(doc))
    results = rp.load_results(tmp_path)
    z = rz.zoo(results)
    assert "| m0 | fp32 channels-last | eager | 64 | over-limit, REPLAY=0 | 10 |" in z
    assert "| m0 | fp32 channels-last | captured | 64 | over-limit | 10 |" in z
    assert "| m0 | fp32 channels-last | over-limit | 2.0 | 2.0 |" in rz.zoo_cold(results)


def test_zoo_peaks_compare_requested_bytes_where_a_file_records_them():
    """The requested-bytes peak, which no cached block changes, is the compared
    one; a file from before it was recorded shows its allocated peak (See Note
    [memory per side] in tools/zoo_bench.py)."""
    both = {"peak_bytes": 120 << 20, "requested_peak_bytes": 100 << 20}
    assert rt.side_peak(both) == 100 << 20
    assert rt.side_peak({"peak_bytes": 120 << 20}) == 120 << 20
    assert rt.side_peak({"peak_bytes": None, "requested_peak_bytes": None}) is None
    assert rt.side_peak(None) is None
    st = {"memory": {"native": both,
                     "converted": {"peak_bytes": 110 << 20, "requested_peak_bytes": 99 << 20},
                     "control": {"peak_bytes": 125 << 20, "requested_peak_bytes": 100 << 20}}}
    assert rz._peaks(st) == "100.0 / 99.0 (A/A 100.0)"
    assert rz._peaks({"memory": {"native": {"peak_bytes": 3 << 20}}}) == "3.0 / -"
