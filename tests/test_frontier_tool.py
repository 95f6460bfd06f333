"""tools/frontier.py on the CPU: argument parsing, the limit order, the table's numbers and
percentages and the figure from a synthetic report (``--plot-only``), merging reports, a
smoke run of the measuring path on the NumPy backend, and tools/pytorch_anchor.py's
``layout`` and ``layers`` (its timing stubbed: it needs CUDA)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
from tool_support import TOOLS, load_tool

MIB = 1 << 20


@pytest.fixture(scope="module")
def fr():
    return load_tool("frontier")


pytestmark = pytest.mark.usefixtures("cache_off")


def _point(limit, ms):
    # the fields the tool writes per (net, precision, limit); "result" is run_network's to_dict()
    return {"limit_bytes": limit, "run_limit_bytes": limit if limit is not None else 1 << 40,
            "executed_ms": ms, "undivided_ms": ms * 1.5, "unlimited_ms": ms * 0.9,
            "max_workspace_bytes": min(limit or 900 * MIB, 900 * MIB), "optimize_cold_s": 1.0,
            "optimize_warm_s": 0.01, "wall_s": 2.0, "result": {}}


def _series(net, batch, precision, times, pytorch=None):
    dtype, layout = {"fp32": ("float32", "NCHW"), "bf16cl": ("bfloat16", "NHWC")}[precision]
    return {"net": net, "batch": batch, "precision": precision, "dtype": dtype, "layout": layout,
            "math": "default", "layers": None, "pytorch": pytorch,
            "points": [_point(l, t) for l, t in times.items()]}


def _pytorch(ms, peak_mib):
    return {"total_ms": ms, "max_peak_extra_bytes": int(peak_mib * MIB),
            "max_peak_workspace_bytes": int(peak_mib * MIB) // 2, "layers": {},
            "total_by_direction": {"forward": ms / 3, "backward_data": ms / 3,
                                   "backward_filter": ms / 3}}


def _report(fr, series):
    return {"schema": fr.SCHEMA, "date": "2026-12-01", "argv": [], "backend": "cudnn-graph",
            "device": "NVIDIA H200", "version": "9.19.0", "policy": "powerOfTwo", "repeat": 10,
            "limits": [None, 128 * MIB, 64 * MIB, 8 * MIB], "max_seconds": None,
            "elapsed_s": 1.0, "interrupted": False, "series": series, "skipped": [], "errors": []}


def _synthetic(fr):
    L = {8 * MIB: 40.0, 64 * MIB: 22.0, 128 * MIB: 20.0, None: 18.0}
    return _report(fr, [
        _series("alexnet", 256, "fp32", L, _pytorch(20.0, 912)),
        _series("alexnet", 256, "bf16cl", {8 * MIB: 12.0, 64 * MIB: 9.0, None: 8.0},
                _pytorch(10.0, 400)),
        _series("resnet18", 128, "fp32", {64 * MIB: 16.5, 128 * MIB: 16.0, None: 15.9},
                _pytorch(15.0, 858)),
        _series("resnet50", 128, "fp32", {8 * MIB: 50.0}, None),  # no PyTorch point
        _series("vgg16", 64, "bf16cl", {}, _pytorch(30.0, 2352)),   # only PyTorch's point
    ])


def test_parse_args_defaults_and_errors(fr):
    a = fr.parse_args([])
    assert a.nets == ["alexnet", "resnet18", "resnet50", "vgg16"]
    assert a.precisions == ["fp32", "bf16cl"] and a.policy == "fitted" and a.torch
    assert a.limits == [8 * MIB, 16 * MIB, 32 * MIB, 64 * MIB, 128 * MIB, 256 * MIB, 512 * MIB,
                        None]
    assert a.figure == str(TOOLS.parent / "docs" / "figures" / "frontier.png")
    assert a.plot_only is None and a.json is None
    a = fr.parse_args(["--limits", "1GiB", "Unlimited", "8M", "--no-torch", "--max-seconds", "60"])
    assert a.limits == [1 << 30, None, 8 * MIB] and not a.torch and a.max_seconds == 60
    assert a.backend_options == []
    a = fr.parse_args(["--backend-option", "find_carry=True", "--backend-option", "find_rtc=all",
                       "--backend-option", "find_skip_ratio = None"])
    assert dict(a.backend_options) == {"find_carry": True, "find_rtc": "all",
                                       "find_skip_ratio": None}
    for bad in (["--limits", "lots"], ["--precisions", "fp16"], ["--repeat", "0"],
                ["--backend-option", "find_carry"], ["--backend-option", "2x=1"]):
        with pytest.raises(SystemExit):
            fr.parse_args(bad)


def test_clock_matched_compares_on_the_first_runs_clock(fr):
    """A later run on a slower clock: 64 MiB executes 12 ms where its own unlimited
    plans take 11 (the first, unlimited run measured 10, as PyTorch did): 12/11 of
    PyTorch's time on one clock, not 12/10."""
    s = _series("alexnet", 256, "fp32", {None: 10.0, 64 * MIB: 12.0}, _pytorch(10.0, 900))
    s["points"][0]["unlimited_ms"] = 10.0
    s["points"][1]["unlimited_ms"] = 11.0
    assert fr.vs_pytorch(12.0, 10.0) == pytest.approx(20.0)
    assert fr.clock_matched(s, 64 * MIB) == pytest.approx(100.0 * (12.0 / 11.0 - 1.0))
    assert fr.clock_matched(s, None) == pytest.approx(0.0)
    assert fr.clock_matched(s, 128 * MIB) is None          # not measured
    # See Note [one-clock reference]: where the unlimited run's plan beats its single
    # calls (9.5 against 10 ms), the single calls are still the reference
    s["points"][0]["executed_ms"] = 9.5
    assert fr.clock_matched(s, 64 * MIB) == pytest.approx(100.0 * (12.0 / 11.0 - 1.0))
    assert fr.clock_matched(s, None) == pytest.approx(-5.0)
    del s["points"][0]["unlimited_ms"]
    assert fr.clock_matched(s, 64 * MIB) is None           # no reference in the first run
    s["pytorch"] = None
    assert fr.clock_matched(s, 64 * MIB) is None           # no PyTorch point
    s = _series("alexnet", 256, "fp32", {64 * MIB: 12.0}, _pytorch(10.0, 900))
    assert fr.clock_matched(s, 64 * MIB) is None           # no unlimited run


def test_limit_order_largest_first(fr):
    # the same cap for every limit, but a larger cap first is what lets the cache answer later ones
    assert fr.limit_order([8 * MIB, None, 64 * MIB, 2 << 40, 8 * MIB]) == [
        None, 2 << 40, 64 * MIB, 8 * MIB]


def test_table_numbers_and_percentages(fr):
    rep = _synthetic(fr)
    head, rows = fr.table_rows(rep)
    assert head == ["net (batch)", "precision", "8 MiB ms", "64 MiB ms", "128 MiB ms",
                    "unlimited ms", "PyTorch ms", "PyTorch peak MiB/kernel",
                    "64 MiB vs PyTorch", "128 MiB vs PyTorch",
                    "64 MiB vs PyTorch, one clock", "128 MiB vs PyTorch, one clock"]
    by = {(r[0], r[1]): r for r in rows}
    # each synthetic run's single-call reference is 0.9x its plans' time, so on
    # the first run's clock every limit's plans take what the unlimited run's
    # did (Note [one-clock reference] in tools/frontier.py)
    a32 = by["alexnet (256)", "fp32 NCHW (TF32 allowed)"]
    assert a32[2:] == ["40.00", "22.00", "20.00", "18.00", "20.00", "912", "+10.0%", "+0.0%",
                       "-10.0%", "-10.0%"]
    abf = by["alexnet (256)", "bf16 channels-last"]
    assert abf[2:] == ["12.00", "9.00", "-", "8.00", "10.00", "400", "-10.0%", "-",
                       "-20.0%", "-"]
    r18 = by["resnet18 (128)", "fp32 NCHW (TF32 allowed)"]
    assert r18[2:] == ["-", "16.50", "16.00", "15.90", "15.00", "858", "+10.0%", "+6.7%",
                       "+6.0%", "+6.0%"]
    r50 = by["resnet50 (128)", "fp32 NCHW (TF32 allowed)"]
    assert r50[2:] == ["50.00", "-", "-", "-", "-", "-", "-", "-", "-", "-"]
    vgg = by["vgg16 (64)", "bf16 channels-last"]
    assert vgg[2:] == ["-", "-", "-", "-", "30.00", "2352", "-", "-", "-", "-"]
    assert fr.vs_pytorch(22.0, 20.0) == pytest.approx(10.0)
    assert fr.vs_pytorch(9.0, 10.0) == pytest.approx(-10.0)
    assert fr.vs_pytorch(None, 10.0) is None and fr.vs_pytorch(9.0, None) is None
    md = fr.format_table(rep).splitlines()
    assert md[2].startswith("| net (batch) | precision | 8 MiB ms |")
    assert md[3] == "|" + "---|" * len(head)
    assert len(md) == 4 + len(rows)


def test_plot_only_writes_figure_and_table(fr, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    src = tmp_path / "frontier.json"
    src.write_text(json.dumps(_synthetic(fr)))
    png = tmp_path / "figs" / "frontier.png"
    assert fr.main(["--plot-only", str(src), "--figure", str(png)]) == 0
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    out = capsys.readouterr().out
    table = (tmp_path / "frontier.md").read_text()
    assert table.strip() == out[out.index("Executed conv time"):].strip()
    assert "| alexnet (256) | fp32 NCHW (TF32 allowed) | 40.00 | 22.00 | 20.00 | 18.00 | 20.00 " \
           "| 912 | +10.0% | +0.0% |" in table


def test_plot_only_needs_neither_mucudnn_nor_torch(fr, tmp_path):
    src = tmp_path / "f.json"
    src.write_text(json.dumps(_synthetic(fr)))
    code = ("import runpy, sys\n"
            "tool, src = sys.argv[1:]\n"
            "sys.argv = [tool, '--plot-only', src, '--figure', '']\n"
            "try:\n"
            "    runpy.run_path(tool, run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    print(e.code, sorted(m for m in ('mucudnn', 'torch', 'matplotlib') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code, str(TOOLS / "frontier.py"), str(src)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[-1] == "0 []" and (tmp_path / "f.md").is_file()


def test_plot_only_merges_reports(fr, tmp_path):
    rep = _synthetic(fr)
    first = _report(fr, rep["series"][:2])
    second = _report(fr, [_series("alexnet", 256, "fp32", {64 * MIB: 21.0}, _pytorch(20.0, 900)),
                          *rep["series"][2:]])
    second["skipped"] = [{"net": "vgg16", "precision": "fp32", "limit": None,
                          "reason": "--max-seconds reached"}]
    paths = [tmp_path / "part0.json", tmp_path / "part1.json.gz"]  # results are kept gzipped
    paths[0].write_text(json.dumps(first))
    with gzip.open(paths[1], "wt", encoding="utf-8") as f:
        json.dump(second, f)
    merged = fr.load([str(p) for p in paths])
    assert [(s["net"], s["precision"]) for s in merged["series"]] == [
        ("alexnet", "fp32"), ("alexnet", "bf16cl"), ("resnet18", "fp32"), ("resnet50", "fp32"),
        ("vgg16", "bf16cl")]
    assert fr.series_points(merged["series"][0]) == {64 * MIB: 21.0}  # the later one won
    assert merged["sources"] == ["part0.json", "part1.json.gz"] and len(merged["skipped"]) == 1
    out = tmp_path / "all.json"
    assert fr.main(["--plot-only", *map(str, paths), "--json", str(out), "--figure", ""]) == 0
    assert json.loads(out.read_text())["series"] == merged["series"]
    assert (tmp_path / "all.md").is_file()
    # a gzipped merge is written gzipped, and reads back (it did not: plain JSON under .gz)
    zipped = tmp_path / "all.json.gz"
    assert fr.main(["--plot-only", *map(str, paths), "--json", str(zipped), "--figure", ""]) == 0
    with gzip.open(zipped, "rt", encoding="utf-8") as f:
        assert json.load(f)["series"] == merged["series"]
    assert fr.load([str(zipped)])["series"] == merged["series"]
    assert fr.table_path_for("out/f.json.gz") == "out/f.md" and fr.table_path_for(None) is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"net": "alexnet"}]))  # e.g. a paper_experiment/bench file
    with pytest.raises(ValueError, match="not a frontier report"):
        fr.load([str(bad)])


@pytest.mark.slow
def test_smoke_run_on_numpy_backend(fr, tmp_path, capsys):
    """The measuring path end to end (one small layer, NumPy backend, no PyTorch): the JSON it
    writes is what --plot-only reads."""
    pytest.importorskip("matplotlib")
    js, png = tmp_path / "f.json", tmp_path / "f.png"
    assert fr.main(["--backend", "numpy", "--nets", "alexnet", "--batch", "2", "--layers", "conv5",
                    "--precisions", "fp32", "--limits", "64KiB", "unlimited", "--repeat", "1",
                    "--no-torch", "--json", str(js), "--figure", str(png)]) == 0
    rep = json.loads(js.read_text())
    assert rep["schema"] == fr.SCHEMA and rep["backend"] == "numpy" and rep["errors"] == []
    assert rep["limits"] == [None, 64 << 10]
    (s,) = rep["series"]
    assert (s["net"], s["batch"], s["precision"], s["dtype"], s["layout"]) == (
        "alexnet", 2, "fp32", "float32", "NCHW")
    assert s["pytorch"] is None
    assert [p["limit_bytes"] for p in s["points"]] == [None, 64 << 10]
    for p in s["points"]:
        assert p["executed_ms"] > 0 and p["executed_ms"] == p["result"]["totals"]["micro_ms"]
        assert p["max_workspace_bytes"] <= p["run_limit_bytes"]
    assert s["points"][0]["run_limit_bytes"] == 1 << 40
    assert png.is_file() and (tmp_path / "f.md").is_file()
    assert "| alexnet (2) | fp32 NCHW (TF32 allowed) |" in capsys.readouterr().out


def test_max_seconds_skips_runs_and_keeps_the_report(fr, tmp_path):
    js = tmp_path / "f.json"
    assert fr.main(["--backend", "numpy", "--nets", "alexnet", "--batch", "2", "--layers", "conv5",
                    "--precisions", "fp32", "bf16cl", "--limits", "unlimited", "--repeat", "1",
                    "--max-seconds", "0", "--json", str(js), "--figure", ""]) == 0
    rep = json.loads(js.read_text())
    assert [s["points"] for s in rep["series"]] == [[], []]
    assert {(k["precision"], k["limit"]) for k in rep["skipped"]} == {
        ("fp32", "pytorch"), ("fp32", None), ("bf16cl", "pytorch"), ("bf16cl", None)}


def test_pytorch_anchor_layout_and_layers(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    pa = load_tool("pytorch_anchor")
    seen = []

    def fake_time_layer(p, repeat=10, warmup=3, tf32=True):
        seen.append(p)
        mib = p.batch  # distinct numbers per problem
        return {d: {"ms": 1.0, "peak_extra_bytes": (mib + i) * MIB, "output_bytes": MIB}
                for i, d in enumerate(("forward", "backward_data", "backward_filter"))}

    monkeypatch.setattr(pa, "time_layer", fake_time_layer)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91900)
    r = pa.run("resnet18", 4, "bfloat16", 1, layout="NHWC",
               layers=["layer1.0.conv1", "layer1.0.conv2", "layer2.0.conv1"])
    assert all(p.layout == "NHWC" and p.channels_last and p.dtype == "bfloat16" for p in seen)
    assert len(seen) == 2  # layer1.0.conv1 and conv2 are one problem
    assert r["layout"] == "NHWC" and r["layers"]["layer1.0.conv1"]["count"] == 2
    assert r["total_ms"] == pytest.approx(3 * 3.0)
    assert r["max_peak_extra_bytes"] == 6 * MIB and r["max_peak_workspace_bytes"] == 5 * MIB
    seen.clear()
    pa.run("alexnet", 2)  # the old positional signature still works: NCHW, all layers
    assert len(seen) == 5 and all(p.layout == "NCHW" for p in seen)
    seen.clear()
    out = tmp_path / "pt.json"
    assert pa.main(["--net", "alexnet", "--batch", "2", "--dtype", "bfloat16", "--layout", "NHWC",
                    "--json", str(out)]) == 0
    (saved,) = json.loads(out.read_text())
    assert saved["layout"] == "NHWC" and all(p.layout == "NHWC" for p in seen)
