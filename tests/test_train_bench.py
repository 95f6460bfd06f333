"""tools/train_bench.py on the CPU: argument parsing, the batch-size search, the
out-of-memory test, loss tracking, and a smoke run of the whole benchmark
(``--device cpu --models tiny``) that writes its JSON and prints its table."""

from __future__ import annotations

import json
import math

import pytest
from tool_support import load_tool

pytest.importorskip("torch", reason="tools/train_bench.py needs PyTorch")



@pytest.fixture(scope="module")
def tb():
    return load_tool("train_bench")


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", "off")


def test_parse_args_defaults_and_errors(tb):
    a = tb.parse_args(["--device", "cpu"])
    assert a.models == ["resnet50"] and a.modes == ["native", "wr", "wd"]
    assert a.precisions == ["fp32", "amp"] and a.execution == "both"
    assert a.workspace == 64 << 20 and a.total_workspace == 512 << 20 and a.memory == 16 << 30
    assert a.constrained_batches[0] == 64 and a.constrained_batches == sorted(a.constrained_batches)
    a = tb.parse_args(["--device", "cpu", "--workspace", "8MiB", "--constrained-batches", "96,32",
                       "--models", "tiny", "alexnet"])
    assert a.workspace == 8 << 20 and a.constrained_batches == [32, 96]
    for bad in (["--models", "lenet"], ["--workspace", "lots"], ["--constrained-batches", "0"],
                ["--steps", "0"], ["--constrained"], ["--policy", "bogus"],
                ["--backend", "tpu"], ["--modes", "fast"]):
        with pytest.raises(SystemExit):
            tb.parse_args(["--device", "cpu"] + bad)


def test_search_largest_batch(tb):
    calls = []

    def fits(limit):
        def f(b):
            calls.append(b)
            return b <= limit
        return f

    assert tb.search_largest_batch(fits(10_000), [64, 128, 256]) == (256, {64: True, 128: True,
                                                                          256: True})
    best, tried = tb.search_largest_batch(fits(10), [64, 128])
    assert best is None and tried == {64: False, 32: False, 16: False}
    calls.clear()
    best, tried = tb.search_largest_batch(fits(300), [64, 128, 256, 512], refine=5)
    assert best == 288 and tried[512] is False and all(tried[b] == (b <= 300) for b in tried)
    assert len(calls) == len(set(calls))  # no batch tried twice


def test_is_oom(tb):
    import torch

    assert tb.is_oom(MemoryError("x"))
    assert tb.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert tb.is_oom(torch.cuda.OutOfMemoryError("x"))
    assert not tb.is_oom(ValueError("bad shape"))


def test_loss_tracking(tb):
    runs = [dict(model="m", precision="fp32", execution="eager", mode="native", losses=[2.0, 1.0]),
            dict(model="m", precision="fp32", execution="eager", mode="wr", losses=[2.0, 1.0005]),
            dict(model="m", precision="amp", execution="eager", mode="wr", losses=[1.0]),
            dict(model="m", precision="fp32", execution="eager", mode="wd", error="boom")]
    (t,) = tb.loss_tracking(runs)
    assert t["mode"] == "wr" and t["steps_compared"] == 2
    assert math.isclose(t["max_rel_diff"], 5e-4) and t["within_1e-3"]


def test_smoke_run_on_cpu(tb, tmp_path, capsys):
    out = tmp_path / "res" / "bench.json"
    rc = tb.main(["--device", "cpu", "--models", "tiny", "--steps", "2", "--warmup", "1",
                  "--batch", "4", "--precisions", "fp32", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [(r["mode"], r["execution"]) for r in runs] == [("native", "eager"), ("wd", "eager"),
                                                           ("wr", "eager")]
    for r in runs:
        assert "error" not in r, r.get("traceback")
        assert len(r["losses"]) == 3 and all(math.isfinite(v) for v in r["losses"])
        assert r["median_step_ms"] > 0 and r["images_per_s"] > 0
    assert runs[1]["wd_kernels"] == 9
    # 3 distinct convs x 3 directions, less the first layer's backward-data (no input grad)
    assert runs[2]["mucudnn_micro_batches"] >= runs[2]["mucudnn_plans"] == 8
    assert runs[1]["wd_planned_workspace_bytes"] <= 512 << 20
    tracking = report["loss_tracking"]
    assert {t["mode"] for t in tracking} == {"wr", "wd"}
    assert all(t["within_1e-3"] for t in tracking)
    printed = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("model") for line in printed)
    assert printed[-1].startswith("losses tiny fp32 eager")


def test_max_seconds_skips_runs(tb, tmp_path):
    out = tmp_path / "b.json"
    rc = tb.main(["--device", "cpu", "--models", "tiny", "--steps", "1", "--warmup", "1",
                  "--batch", "2", "--precisions", "fp32", "--modes", "native", "wr",
                  "--max-seconds", "0", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["runs"] == [] and len(report["skipped"]) == 2


def test_doctests(tb):
    import doctest

    assert doctest.testmod(tb).failed == 0


def test_strict_fp32_runs_with_tf32_off(tb, tmp_path):
    """fp32strict trains with TF32 off for convolutions and matmuls (the precision
    of the 30-step loss check); the converted model tracks native within 1e-3."""
    out = tmp_path / "s.json"
    rc = tb.main(["--device", "cpu", "--models", "tiny", "--steps", "2", "--warmup", "1",
                  "--batch", "4", "--precisions", "fp32strict", "--modes", "native", "wr",
                  "--json", str(out)])
    assert rc == 0
    import torch
    assert torch.backends.cudnn.allow_tf32 is False
    assert torch.backends.cuda.matmul.allow_tf32 is False
    torch.backends.cudnn.allow_tf32 = True
    report = json.loads(out.read_text())
    assert {r["precision"] for r in report["runs"]} == {"fp32strict"}
    (t,) = report["loss_tracking"]
    assert t["precision"] == "fp32strict" and t["within_1e-3"]


def test_native_heur_is_the_noise_floor_of_the_loss_check(tb, tmp_path):
    """Note [loss noise floor]: ``native-heur`` trains PyTorch's own convolutions
    with cudnn.benchmark off and is reported against native like a converted
    run; it is not among the default modes."""
    import torch

    assert "native-heur" not in tb.parse_args(["--device", "cpu"]).modes
    out = tmp_path / "h.json"
    before = torch.backends.cudnn.benchmark
    try:
        rc = tb.main(["--device", "cpu", "--models", "tiny", "--steps", "2", "--warmup", "1",
                      "--batch", "4", "--precisions", "fp32", "--modes", "native-heur", "wr",
                      "native", "--json", str(out)])
        assert torch.backends.cudnn.benchmark is False  # the last run was native-heur
    finally:
        torch.backends.cudnn.benchmark = before
    assert rc == 0
    report = json.loads(out.read_text())
    assert [r["mode"] for r in report["runs"]] == ["native", "wr", "native-heur"]
    heur = report["runs"][2]
    assert heur["mucudnn_workspace_bytes"] == 0 and "mucudnn_plans" not in heur
    assert {t["mode"] for t in report["loss_tracking"]} == {"wr", "native-heur"}
    (h,) = [t for t in report["loss_tracking"] if t["mode"] == "native-heur"]
    assert h["max_rel_diff"] == 0.0  # on the CPU both are PyTorch's one algorithm
