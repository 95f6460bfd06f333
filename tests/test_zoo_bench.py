"""tools/zoo_bench.py on the CPU: argument parsing, the ratio and geometric-mean
helpers, model specs, a failed stage recorded, and the tiny model end to end
through main() (steps, gradient check, and in a slow test the cold processes)."""

from __future__ import annotations

import doctest
import json
import math
import os
import signal
import statistics
import time
import types
import warnings

import pytest
from tool_support import load_tool

torch = pytest.importorskip("torch", reason="tools/zoo_bench.py needs PyTorch")

import mucudnn.torch as mt  # noqa: E402

TINY = ["--device", "cpu", "--models", "tiny", "--batch", "2", "--size", "32", "--no-progress"]


@pytest.fixture(scope="module")
def zb():
    return load_tool("zoo_bench")


pytestmark = pytest.mark.usefixtures("cache_off")


def test_doctests(zb):
    for mod in (zb, zb.zoo_cold, zb.zoo_isolated, zb.ts):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0


def test_parse_args_defaults_and_errors(zb):
    a = zb.parse_args(["--device", "cpu", "--models", "tiny"])
    assert a.precisions == ["fp32cl"] and a.execution == ["eager"]  # the CPU's only ones
    assert (a.batch, a.size, a.workspace, a.warmup, a.rounds, a.steps) == (64, None, 64 << 20,
                                                                          16, 16, 5)
    assert not a.cold and not a.grad_check and a.grad_batch is None and a.cold_child is None
    assert not a.control and not a.no_steps
    a = zb.parse_args(TINY + ["--workspace", "8MiB", "--rounds", "2", "--grad-check"])
    assert a.workspace == 8 << 20 and a.rounds == 2 and a.grad_check and a.no_progress
    # three sides: the default rounds balance their order (Note [balanced round order])
    assert zb.parse_args(TINY + ["--with-control"]).rounds == 18
    assert (zb.parse_args(TINY).cold_steps, zb.parse_args(TINY + ["--cold-steps", "3"]).cold_steps) \
        == (8, 3)
    assert zb.parse_args(TINY + ["--with-control", "--rounds", "4"]).rounds == 4
    for names in (["tiny,tiny"], ["tiny", "tiny,"], [",tiny"]):  # commas as spaces, once each
        assert zb.parse_args(["--device", "cpu", "--models", *names]).models == ["tiny"]
    for bad in (["--models", "lenet"], ["--models", "tiny,lenet"], ["--models", ","],
                ["--precisions", "amp"], ["--execution", "graph"],
                ["--precisions", "fp16"], ["--batch", "0"], ["--workspace", "lots"],
                ["--rounds", "0"], ["--cold-child", "both"], ["--no-steps"],
                ["--cold-profile", "5"], ["--cold", "--cold-profile", "-1"],
                ["--resolve", "-1"], ["--cold", "--cold-repeat", "0"],
                ["--cold", "--cold-steps", "1"]):
        with pytest.raises(SystemExit):
            zb.parse_args(TINY + bad)


def test_backend_options_reach_the_converted_sides_of_every_process(zb, monkeypatch):
    """--backend-option KEY=VALUE (repeatable) names the converted side's
    cudnn-graph backend options: refused on the CPU, kept in the options and
    passed on to each cold process; without it the default backend runs."""
    import argparse
    import subprocess
    import torch

    with pytest.raises(SystemExit):
        zb.parse_args(TINY + ["--backend-option", "find_hold=True"])
    with pytest.raises(SystemExit):
        zb.parse_args(TINY + ["--backend-option", "no equals sign"])
    args = argparse.Namespace(backend_options=[("find_hold", True), ("find_rtc", "all")],
                              device="cuda", batch=2, workspace=1 << 20, seed=0, lr=0.01,
                              cold_profile=0, cold_steps=2, cold_timeout=5.0)
    seen = {}

    def run(cmd, **kw):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 1, "", "stopped here")

    monkeypatch.setattr(zb.zoo_cold.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="stopped here"):
        zb.zoo_cold.run_cold(args, zb.model_spec("tiny", None), "fp32cl", "converted")
    passed = [a for a in seen["cmd"] if a.startswith("--backend-option=")]
    assert passed == ["--backend-option=find_hold=True", "--backend-option=find_rtc='all'"]
    assert zb.parse_args(["--device", "cpu", "--models", "tiny"]).backend_options == []
    assert [zb.parse_option(a.split("=", 1)[1]) for a in passed] == args.backend_options
    assert zb.converted_backend(argparse.Namespace(backend_options=[]),
                                torch.device("cuda", 0)) is None



    step_ms = {"native": [[10.0, 10.0, 12.0], [20.0, 22.0, 21.0], [30.0, 30.0, 30.0]],
               "converted": [[11.0, 12.0, 13.0], [21.0, 20.0, 19.0], [36.0, 33.0, 33.0]]}
    s = zb.step_stats(step_ms)
    assert s["native_ms"] == statistics.median([10, 10, 12, 20, 22, 21, 30, 30, 30]) == 21
    assert s["converted_ms"] == 20
    # round medians: native 10, 21, 30; converted 12, 20, 33
    assert s["round_ratios"] == [12 / 10, 20 / 21, 33 / 30]
    assert math.isclose(s["ratio"], 1.1)  # the middle of 1.2, 0.952, 1.1
    assert s["step_ms"] is step_ms


def test_model_specs(zb):
    assert zb.model_spec("tiny", None) == ("tiny", "classification", 1000, 32)
    assert zb.model_spec("resnet50", None).size == 224
    assert zb.model_spec("resnet50", 160).size == 160
    assert zb.model_spec("inception_v3", 224).size == 299


def test_unet_is_built_in_with_transposed_convolutions_that_convert(zb):
    """``unet`` needs no torchvision: a segmentation model whose decoder
    up-samples with transposed convolutions; convert() takes every layer."""
    spec = zb.model_spec("unet", 32)
    assert spec.task == "segmentation" and spec.num_classes == 21
    model = zb.build_model(spec).eval()
    with torch.no_grad():
        assert tuple(model(torch.randn(1, 3, 32, 32)).shape) == (1, 21, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left native
        mt.convert(model)
    kinds = [type(m) for m in model.modules() if isinstance(m, mt.modules.MucudnnConvMixin)]
    assert kinds.count(mt.ConvTranspose2d) == 4 and kinds.count(mt.Conv2d) == 19
    assert zb.parse_args(["--device", "cpu", "--models", "unet"]).models == ["unet"]


def test_segmentation_model(zb):
    pytest.importorskip("torchvision")
    import torch

    spec = zb.model_spec("lraspp_mobilenet_v3_large", 32)
    assert spec.task == "segmentation" and spec.num_classes == 21
    model = zb.build_model(spec).eval()
    assert isinstance(model, zb.SegmentationLogits)
    with torch.no_grad():
        assert tuple(model(torch.randn(1, 3, 32, 32)).shape) == (1, 21, 32, 32)
    assert zb.parse_args(["--device", "cpu", "--models", "fcn_resnet50", "googlenet"]).models


def test_summary_lines(zb):
    e = {"model": "m", "precision": "amp", "errors": {},
         "steps": {"eager": {"native_ms": 10.0, "converted_ms": 11.0, "ratio": 1.1,
                             "memory": {"native": {"peak_bytes": 3 << 20},
                                        "converted": {"peak_bytes": 4 << 20}},
                             "replay": {"kernels": 3, "captures": 2, "replays": 40,
                                        "direct": 5, "failed": 0}},
                   "graph": {"native_ms": 8.0, "converted_ms": 8.0, "ratio": 1.0,
                             "memory": {}}},
         "cold": {"native": {"first_step_s": 1.25}},
         "grad": {"native": {"all": 1e-3}, "converted": {"all": 2e-3}}}
    e2 = {**e, "model": "n", "steps": {"eager": {"native_ms": 10.0, "converted_ms": 10.0,
                                                 "ratio": 0.9, "memory": {}}},
          "cold": {}, "grad": None}
    lines = zb.summary_lines([e, e2])
    timed = {**e, "model": "t", "steps": {"eager": {**e["steps"]["eager"], "replay": {
        **e["steps"]["eager"]["replay"], "capture_s": 0.0125}}}}
    assert "| 2/5 (12.5 ms) |" in zb.summary_lines([timed])[2]
    assert lines[0].startswith("| model | precision | execution | native ms")
    assert "| m | amp | eager | 10.00 | 11.00 | 1.100 | 3/4 | 1.2/- | 1.0e-03/2.0e-03 | 2/5 |" in lines
    assert "| m | amp | graph | 8.00 | 8.00 | 1.000 | -/- | 1.2/- | 1.0e-03/2.0e-03 | - |" in lines
    assert "| n | amp | eager | 10.00 | 10.00 | 0.900 | -/- | -/- | -/- | - |" in lines
    # with six rounds or more, the ratio's interval (order statistics 1 and 6 of six)
    e2["steps"]["eager"]["round_ratios"] = [0.93, 0.88, 0.90, 0.95, 0.86, 0.91]
    assert "| n | amp | eager | 10.00 | 10.00 | 0.900 [0.860, 0.950] | -/- | -/- | -/- | - |" in \
        zb.summary_lines([e2])
    gm = [ln for ln in lines if ln.startswith("geometric mean")]
    assert gm == [f"geometric mean converted/native, amp eager: {math.sqrt(1.1 * 0.9):.3f} "
                  "over 2 models", "geometric mean converted/native, amp graph: 1.000 over 1 models"]


@pytest.mark.slow
def test_tiny_end_to_end(zb, tmp_path, capsys):
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--grad-check", "--rounds", "2", "--steps", "2",
                           "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    env = report["environment"]
    for key in ("torch", "mucudnn", "cuda", "date", "git_commit", "device", "settings"):
        assert key in env
    assert env["settings"]["MUCUDNN_TORCH_REPLAY"] == ("1" if mt.settings.replays() else "0")
    assert report["options"]["models"] == ["tiny"] and report["skipped"] == []
    (r,) = report["results"]
    assert (r["model"], r["precision"], r["task"], r["batch"], r["size"]) == (
        "tiny", "fp32cl", "classification", 2, 32)
    assert r["errors"] == {} and r["seconds"] > 0 and "cold" not in r
    st = r["steps"]["eager"]
    assert st["native_ms"] > 0 and st["converted_ms"] > 0 and st["ratio"] > 0
    assert [len(st["step_ms"][s]) for s in ("native", "converted")] == [2, 2]
    assert all(len(rnd) == 2 and min(rnd) > 0 for s in st["step_ms"].values() for rnd in s)
    assert st["memory"]["native"] == {"peak_bytes": None, "requested_peak_bytes": None,
                                      "device_used_bytes": None}  # CPU
    assert r["report"]["find_profile"] is None  # the CPU's backend keeps no find profile
    g = r["grad"]
    assert g["planned_kernels"] is None  # the CPU compares nothing with PyTorch's call
    assert g["batch"] == 2 and g["conv_layers"] == ["features.0.weight", "features.4.weight",
                                                   "features.6.weight"]
    for side in ("native", "converted"):
        e = g[side]
        assert len(e["conv_layers"]) == 3
        for v in (e["conv_median"], e["conv_max"], e["all"], *e["conv_layers"]):
            assert math.isfinite(v) and 0 <= v < 1e-3  # float32 against float64
        assert e["conv_median"] <= e["conv_max"]
    assert math.isfinite(g["ratio"]) and g["ratio"] > 0
    first = g["converted_first_step"]  # its first pass's gradients (Note [gradient check])
    assert len(first["conv_layers"]) == 3 and math.isfinite(first["all"]) and first["all"] < 1e-3
    text = capsys.readouterr().out
    assert "| tiny | fp32cl | eager |" in text and "geometric mean converted/native" in text


@pytest.mark.slow
def test_failed_stage_recorded(zb, tmp_path, monkeypatch, capsys):
    import torch

    def boom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(zb, "grad_check", boom)
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--grad-check", "--rounds", "1", "--steps", "1",
                           "--json", str(out)]) == 0  # the steps were measured
    (r,) = json.loads(out.read_text())["results"]
    assert r["errors"]["grad-check"].startswith("OutOfMemoryError") and r["oom"] == ["grad-check"]
    assert "grad" not in r and r["steps"]["eager"]["ratio"] > 0
    assert "FAILED tiny fp32cl grad-check" in capsys.readouterr().out


def test_max_seconds_skips(zb, tmp_path):
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--max-seconds", "0", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["results"] == []
    assert report["skipped"] == [{"model": "tiny", "precision": "fp32cl",
                                  "reason": "--max-seconds reached"}]


def test_max_seconds_weighs_the_longest_model_so_far(zb, tmp_path, monkeypatch):
    """A model is started only where the longest one so far would end within
    --max-seconds (the rule itself: the over_budget doctests)."""
    seen = []

    def record(elapsed, longest, max_seconds):
        seen.append((elapsed, longest, max_seconds))
        return None if len(seen) == 1 else "stop"
    parse = zb.parse_args

    def twice(argv):  # the one CPU model, listed twice (parse_args drops repeats)
        args = parse(argv)
        args.models = ["tiny", "tiny"]
        return args
    monkeypatch.setattr(zb, "over_budget", record)
    monkeypatch.setattr(zb, "parse_args", twice)
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--no-steps", "--grad-check", "--max-seconds", "1000",
                           "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (first,) = report["results"]
    assert [s[1] for s in seen] == [0.0, first["seconds"]] and seen[1][2] == 1000
    assert report["skipped"] == [{"model": "tiny", "precision": "fp32cl", "reason": "stop"}]


def test_resolve_adds_a_second_stage_of_rounds(zb, tmp_path, monkeypatch):
    """--resolve: the rounds Note [resolving a ratio]'s rule grants (given the
    first stage's ratios, SECONDS and the pace of a round) run after --rounds,
    continue their rotation, and the ratio is read over all of them."""
    seen = []

    def rule(ratios, seconds, round_s):
        seen.append((len(ratios), seconds, round_s))
        return 3
    monkeypatch.setattr(zb, "extra_rounds", rule)
    rotations = []
    real = zb.ts.time_rounds

    def time_rounds(jobs, rounds, steps, device, first=0, after_round=None):
        rotations.append((rounds, first))
        return real(jobs, rounds, steps, device, first=first, after_round=after_round)
    monkeypatch.setattr(zb.ts, "time_rounds", time_rounds)
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--rounds", "2", "--steps", "1", "--resolve", "30",
                           "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    st = r["steps"]["eager"]
    assert st["extra_rounds"] == 3 and len(st["round_ratios"]) == 5
    assert [len(st["step_ms"][s]) for s in ("native", "converted")] == [5, 5]
    assert rotations == [(4, 0), (2, 0), (3, 2)]  # Note [a warm rotation] first, untimed
    assert len(seen) == 1 and seen[0][:2] == (2, 30.0) and seen[0][2] > 0


def test_cold_repeat_alternates_the_sides_and_keeps_medians(zb, monkeypatch):
    """--cold-repeat N: N pairs, native first in the odd ones and converted first
    in the even ones; each side keeps the medians of its runs and every first
    step, updated after each run (a cut-short run keeps what it measured)."""
    args = zb.parse_args(TINY + ["--cold", "--no-steps", "--cold-repeat", "3"])
    firsts = {"native": iter([5.0, 9.0, 6.0]), "converted": iter([8.0, 4.0, 7.0])}
    order, seen = [], []
    out: dict = {}

    def run_cold(a, spec, precision, side):
        order.append(side)
        seen.append({k: dict(v) for k, v in out.items()})
        first = next(firsts[side])
        run = {"first_step_s": first, "process_s": 10.0 + len(order)}
        if side == "converted":  # the report's first calls: a part of each run's first step
            run["first_calls"] = {"signatures": 3, "seconds": first - 0.5,
                                  "planning_seconds": first / 10}
        return run

    monkeypatch.setattr(zb.zoo_cold, "run_cold", run_cold)
    tags = []

    def stage(tag, work):
        tags.append(tag)
        return work()

    zb.zoo_cold.run_cold_pairs(args, zb.model_spec("tiny", 32), "fp32cl", stage, out)
    assert order == ["native", "converted", "converted", "native", "native", "converted"]
    assert tags[:2] == ["cold native 1/3", "cold converted 1/3"]
    assert out["native"]["first_step_samples"] == [5.0, 9.0, 6.0]
    assert out["native"]["first_step_s"] == 6.0 and out["converted"]["first_step_s"] == 7.0
    assert out["native"]["process_s"] == 14.0  # runs 1, 4 and 5: 11, 14, 15
    # the first calls' figures are medians too, not the first run's
    assert out["converted"]["first_calls"] == {"signatures": 3, "seconds": 6.5,
                                               "planning_seconds": 0.7}
    assert seen[1] == {"native": {"first_step_s": 5.0, "process_s": 11.0,
                                  "first_step_samples": [5.0]}}


@pytest.mark.slow
def test_cold_processes(zb, tmp_path):
    """Each side's first step in a fresh process (zoo_bench.py --cold-child);
    --no-steps measures nothing else."""
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--cold", "--no-steps", "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["errors"] == {} and r["steps"] == {}
    assert r["cold_primer"]["first_step_s"] > 0  # Note [cold steps]: run first, kept apart
    for side in ("native", "converted"):
        c = r["cold"][side]
        assert 0 < c["second_step_s"] and 0 < c["first_step_s"] < c["process_s"]
        assert 0 < c["build_s"] < c["process_s"]
        assert "profile" not in c and "profiled" not in c
    # the converted side says what its first calls cost (none on the CPU: no comparison)
    assert "first_calls" in r["cold"]["converted"] and "first_calls" not in r["cold"]["native"]
    assert r["cold"]["converted"]["find_profile"] is None  # the CPU's backend keeps none


@pytest.mark.slow
def test_cold_processes_profiled(zb, tmp_path):
    """--cold-profile N: each side's first step under cProfile, its N functions
    of most cumulative time kept (the step itself among them), the side marked."""
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--cold", "--cold-profile", "25", "--no-steps",
                           "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    for side in ("native", "converted"):
        c = r["cold"][side]
        rows, own = c["profile"]["cumulative"], c["profile"]["self"]
        assert c["profiled"] is True and 0 < len(rows) <= 25 and 0 < len(own) <= 25
        cum = [row["cumulative_s"] for row in rows]
        assert cum == sorted(cum, reverse=True) and cum[0] <= c["first_step_s"]
        self_s = [row["self_s"] for row in own]
        assert self_s == sorted(self_s, reverse=True) and sum(self_s) <= c["first_step_s"]
        assert any("tools/train_steps.py" in row["function"] and "(step)" in row["function"]
                   for row in rows)
    converted = " ".join(row["function"] for row in r["cold"]["converted"]["profile"]["cumulative"])
    assert "mucudnn/" in converted  # the converted step runs mucudnn's code


def test_isolated_models(zb, tmp_path):
    """--isolate: each model in a child process (Note [isolated models]); a
    child that does not finish is recorded, and the run goes on."""
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--isolate", "--rounds", "1", "--steps", "1",
                           "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["model"] == "tiny" and r["errors"] == {} and r["steps"]["eager"]["ratio"] > 0
    assert zb.main(TINY + ["--isolate", "--timeout", "0.01", "--json", str(out)]) == 1
    (r,) = json.loads(out.read_text())["results"]
    assert r["errors"] == {"process": "isolated process timed out after 0 s"} and not r["steps"]


def test_an_isolated_model_runs_its_precisions_in_one_child(zb, tmp_path, monkeypatch):
    """One child per model, given every precision; a child that dies keeps
    the rows it saved, and its exit status marks the row it was measuring and
    the precisions it never reached (See Note [isolated models])."""
    calls = []

    def child(cmd, **kw):
        calls.append(cmd)
        out = cmd[cmd.index("--json") + 1]
        precs = cmd[cmd.index("--precisions") + 1:cmd.index("--json")]
        done = {"model": "tiny", "precision": precs[0], "steps": {"eager": {"ratio": 1.0}},
                "errors": {}, "seconds": 3.0}
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"results": [done]}, f)
        return types.SimpleNamespace(returncode=-11)  # died in the second precision

    monkeypatch.setattr(zb.zoo_isolated.subprocess, "run", child)
    args = types.SimpleNamespace(precisions=["fp32cl", "amp"], timeout=5.0)
    rows = zb.zoo_isolated.run_isolated("zoo_bench.py", ["--isolate", "--models", "a", "b"],
                                        args, "tiny")
    (cmd,) = calls
    assert cmd[cmd.index("--precisions") + 1:cmd.index("--json")] == ["fp32cl", "amp"]
    assert "--isolate" not in cmd and cmd[cmd.index("--models", 3) + 1] == "tiny"
    assert [r["precision"] for r in rows] == ["fp32cl", "amp"]
    assert rows[0]["steps"] and rows[0]["seconds"] == 3.0 and not rows[1]["steps"]
    assert all(r["errors"] == {"process": "isolated process exited -11"} for r in rows)


def test_sigterm_stops_an_isolating_parent_with_an_exception(zb):
    """See Note [isolated models]: under --isolate, SIGTERM raises SystemExit,
    so that subprocess.run kills the child it waits on as the exception passes."""
    old = zb.zoo_isolated.stop_children_on_sigterm()
    try:
        with pytest.raises(SystemExit) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode boundary
        assert info.value.code == 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, old)


def test_with_control_times_a_second_native_side_in_the_same_rounds(zb, tmp_path, monkeypatch):
    """--with-control: a third side, never converted, timed in the rounds; each
    row carries its A/A ratio (Note [control runs])."""
    converted = []
    real = zb.mt.convert
    monkeypatch.setattr(zb.mt, "convert", lambda m, **k: converted.append(1) or real(m, **k))
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--with-control", "--rounds", "2", "--steps", "1", "--warmup", "1",
                           "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    st = r["steps"]["eager"]
    assert converted == [1] and set(st["step_ms"]) == {"native", "converted", "control"}
    assert set(st["memory"]) == {"native", "converted", "control"}
    rounds = {s: [sorted(v)[len(v) // 2] for v in st["step_ms"][s]] for s in st["step_ms"]}
    assert st["control_round_ratios"] == [c / n for c, n in zip(rounds["control"],
                                                                 rounds["native"])]
    assert zb.ratio_text(st) == f"{st['ratio']:.3f} (A/A {st['control_ratio']:.3f})"
    with pytest.raises(SystemExit):
        zb.parse_args(TINY + ["--with-control", "--control"])


@pytest.mark.slow
def test_a_control_run_builds_two_native_sides(zb, tmp_path, monkeypatch):
    """See Note [control runs]: no model is converted and no report is made."""
    converted = []
    monkeypatch.setattr(zb.mt, "convert", lambda *a, **k: converted.append(1))
    out = tmp_path / "zoo.json"
    assert zb.main(TINY + ["--control", "--rounds", "1", "--steps", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (r,) = report["results"]
    assert not converted and "report" not in r and report["options"]["control"] is True
    assert r["steps"]["eager"]["ratio"] > 0


def test_find_profile_is_the_default_gpu_backends_counts(monkeypatch):
    """tools/train_steps.find_profile: the default backend's FindProfile as flat
    numbers (its per-mode seconds left out), None on the CPU."""
    import torch

    from mucudnn.backends import _device
    import mucudnn.backends as backends

    ts = load_tool("train_steps")
    assert ts.find_profile(torch.device("cpu")) is None
    prof = _device.FindProfile()
    prof.calls, prof.split_finds, prof.modes_s["A"] = 3, 2, 0.5
    seen = {}

    def fake(name, device=None):
        seen.update(name=name, device=device)
        return type("Be", (), {"find_profile": prof})()

    monkeypatch.setattr(backends, "get_backend", fake)
    got = ts.find_profile(torch.device("cuda", 1))
    assert seen == {"name": backends.default_name(gpu=True), "device": 1}
    assert got["calls"] == 3 and got["split_finds"] == 2 and "modes_s" not in got
    assert set(got) == {f for f in prof.as_dict() if f != "modes_s"}
    # a backend given (zoo_bench's --backend-option) is read, not the default one
    seen.clear()
    own = _device.FindProfile()
    own.calls = 7
    assert ts.find_profile(torch.device("cuda", 1), type("Be", (), {"find_profile": own})()
                           )["calls"] == 7 and seen == {}


def test_graph_replays_sum_the_replaying_kernels_of_the_cached_convolutions(monkeypatch):
    """tools/train_steps.graph_replays: None where no kernel replays; else the
    kernels that do, with their captures, replays, direct launches and failed
    captures summed (Note [replay after repeated addresses])."""
    from types import SimpleNamespace

    import mucudnn

    ts = load_tool("train_steps")

    def conv(*caches):
        kernels = dict(zip(mucudnn.Direction, caches))
        return SimpleNamespace(kernel=lambda d: SimpleNamespace(graphs=kernels[d]))

    def cache(c, r, d, failed=None):
        return SimpleNamespace(captures=c, replays=r, direct=d, failed=failed,
                               capture_s=0.5 * c, instantiate_s=0.25 * c, replay_s=0.25 * r,
                               direct_s=0.125 * d)

    monkeypatch.setattr(ts.mt, "cached_convolutions", lambda: [conv(None, None, None)])
    assert ts.graph_replays() is None
    monkeypatch.setattr(ts.mt, "cached_convolutions", lambda: [
        conv(cache(1, 5, 1), None, cache(0, 0, 3, "CudaError: x")), conv(None, cache(2, 2, 2),
                                                                          None)])
    assert ts.graph_replays() == {"kernels": 3, "captures": 3, "replays": 7, "direct": 6,
                                  "failed": 1, "capture_s": 1.5, "instantiate_s": 0.75,
                                  "replay_s": 1.75, "direct_s": 0.75}


def test_replay_rounds_are_each_rounds_captures_and_direct_launches(monkeypatch):
    """tools/train_steps.ReplayRounds, called after each timed round (Note [a
    warm rotation]): the captures and direct launches of that round alone,
    from graph_replays' readings; None where no kernel replays."""
    ts = load_tool("train_steps")
    readings = iter([{"kernels": 2, "captures": c, "replays": r, "direct": d, "failed": 0,
                      "capture_s": s}
                     for c, r, d, s in ((4, 9, 4, 0.004), (6, 20, 7, 0.0065), (6, 30, 7, 0.0065),
                                        (7, 41, 7, 0.00725))])
    monkeypatch.setattr(ts, "graph_replays", lambda: next(readings))
    rounds = ts.ReplayRounds()
    t = ts.time_rounds([], 3, 1, torch.device("cpu"), after_round=rounds)
    assert t == [] and rounds.as_dict() == {"captures": [2, 0, 1], "direct": [3, 0, 0],
                                            "capture_ms": [2.5, 0.0, 0.75]}
    assert rounds.total() == pytest.approx({"kernels": 2, "captures": 3, "replays": 32,
                                            "direct": 3, "failed": 0, "capture_s": 0.00325})
    monkeypatch.setattr(ts, "graph_replays", lambda: None)
    none = ts.ReplayRounds()
    none(0)
    assert none.as_dict() is None
