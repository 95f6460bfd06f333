"""tools/train_bench.py on the CPU: argument parsing, the batch-size search, the
out-of-memory test, loss tracking, and a smoke run of the whole benchmark
(``--device cpu --models tiny``) that writes its JSON and prints its table."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys

import pytest
from tool_support import load_tool

pytest.importorskip("torch", reason="tools/train_bench.py needs PyTorch")



@pytest.fixture(scope="module")
def tb():
    return load_tool("train_bench")


@pytest.fixture(scope="module")
def ts(tb):
    return sys.modules["train_steps"]  # the module train_bench imported


pytestmark = pytest.mark.usefixtures("cache_off")


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


def test_is_oom(ts, tb):
    import torch

    assert ts.is_oom(MemoryError("x"))
    assert ts.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert ts.is_oom(torch.cuda.OutOfMemoryError("x"))
    assert not ts.is_oom(ValueError("bad shape"))


def test_loss_tracking(tb):
    runs = [dict(model="m", precision="fp32", execution="eager", mode="native", losses=[2.0, 1.0]),
            dict(model="m", precision="fp32", execution="eager", mode="wr", losses=[2.0, 1.0005]),
            dict(model="m", precision="amp", execution="eager", mode="wr", losses=[1.0]),
            dict(model="m", precision="fp32", execution="eager", mode="wd", error="boom")]
    (t,) = tb.loss_tracking(runs)
    assert t["mode"] == "wr" and t["steps_compared"] == 2
    assert math.isclose(t["max_rel_diff"], 5e-4) and t["within_1e-3"]


@pytest.mark.slow
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


def test_doctests(tb, ts):
    import doctest

    for mod in (tb, ts):
        result = doctest.testmod(mod)
        assert result.failed == 0 and result.attempted > 0


@pytest.mark.slow
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


@pytest.mark.slow
def test_native_heur_is_the_noise_floor_of_the_loss_check(tb, tmp_path):
    """See Note [loss noise floor]: ``native-heur`` trains PyTorch's own convolutions
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



@pytest.mark.slow
def test_native_heur_runs_alone_against_a_reference(tb, tmp_path, capsys):
    """See Note [loss noise floor]: on CUDA native and native-heur are refused in one
    process (PyTorch's plan cache ignores cudnn.benchmark); native-heur then
    runs alone, compared with an earlier run's native losses (--reference)."""
    import torch

    with pytest.raises(SystemExit):
        tb.parse_args(["--modes", "native", "native-heur"])
    assert "processes of their own" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tb.parse_args(["--device", "cpu", "--reference", str(tmp_path / "missing.json")])
    common = ["--device", "cpu", "--models", "tiny", "--steps", "2", "--warmup", "1",
              "--batch", "4", "--precisions", "fp32"]
    first, second = tmp_path / "native.json", tmp_path / "heur.json"
    before = torch.backends.cudnn.benchmark
    try:
        assert tb.main(common + ["--modes", "native", "--json", str(first)]) == 0
        assert tb.main(common + ["--modes", "native-heur", "--reference", str(first),
                                 "--json", str(second)]) == 0
    finally:
        torch.backends.cudnn.benchmark = before
    (t,) = json.loads(second.read_text())["loss_tracking"]
    assert t["mode"] == "native-heur" and t["reference"] == "reference"
    assert t["max_rel_diff"] == 0.0 and t["steps_compared"] == 3  # same seed, same CPU conv
    assert "vs native (--reference's)" in capsys.readouterr().out

@pytest.mark.slow
def test_deterministic_runs_every_mode_deterministically(ts, tb, tmp_path, capsys):
    """See Note [deterministic loss check]: --deterministic sets
    cudnn.deterministic for every mode (mucudnn.torch then plans deterministic
    configurations only), and a native run is compared with --reference's
    native run: the same seed and algorithms, so no difference at all."""
    import torch

    from mucudnn.torch import engine

    seen = []
    original = ts.TrainJob.step

    def spying_step(self):
        seen.append((self.mode, torch.backends.cudnn.deterministic, engine.deterministic()))
        return original(self)

    common = ["--device", "cpu", "--models", "tiny", "--steps", "2", "--warmup", "1",
              "--batch", "4", "--precisions", "fp32", "--deterministic"]
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    before = torch.backends.cudnn.deterministic
    try:
        ts.TrainJob.step = spying_step
        assert tb.main(common + ["--modes", "native", "wr", "--json", str(first)]) == 0
        assert tb.main(common + ["--modes", "native", "--reference", str(first),
                                 "--json", str(second)]) == 0
        assert torch.backends.cudnn.deterministic is True
        assert tb.main(["--device", "cpu", "--models", "tiny", "--steps", "1", "--warmup", "1",
                        "--batch", "2", "--precisions", "fp32", "--modes", "native"]) == 0
        assert torch.backends.cudnn.deterministic is False  # off without the flag
    finally:
        ts.TrainJob.step = original
        torch.backends.cudnn.deterministic = before
    assert {m for m, _, _ in seen} == {"native", "wr"}
    assert all(flag and asked for _, flag, asked in seen[:-1])
    assert tb.parse_args(["--device", "cpu", "--deterministic"]).deterministic
    assert json.loads(first.read_text())["args"]["deterministic"] is True
    (wr,) = json.loads(first.read_text())["loss_tracking"]
    assert wr["mode"] == "wr" and len(wr["rel_diffs"]) == wr["steps_compared"] == 3
    assert wr["max_rel_diff"] == max(wr["rel_diffs"])
    (again,) = json.loads(second.read_text())["loss_tracking"]
    assert again["mode"] == "native" and again["reference"] == "reference"
    assert again["max_rel_diff"] == 0.0 and again["rel_diffs"] == [0.0, 0.0, 0.0]
    out = capsys.readouterr().out
    assert "losses tiny fp32 eager native vs native (--reference's): max rel diff 0.00e+00" in out


def test_round_order_rotates(ts, tb):
    assert [ts.round_order(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]]
    assert [ts.round_order(2, r) for r in range(3)] == [[0, 1], [1, 0], [0, 1]]
    assert ts.round_order(1, 5) == [0] and ts.round_order(0, 3) == []
    # every job comes first equally often over n rounds
    assert sorted(ts.round_order(4, r)[0] for r in range(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
def test_round_order_is_balanced(ts, tb, n):
    """See Note [balanced round order]: over 2n rounds every job holds every
    place equally often, each pair meets in either order equally often, and
    from three jobs on no round begins with the job that ended the round
    before it."""
    orders = [ts.round_order(n, r) for r in range(2 * n)]
    assert all(sorted(o) == list(range(n)) for o in orders)
    for place in range(n):
        assert sorted(o[place] for o in orders) == sorted(list(range(n)) * 2)
    for a in range(n):
        for b in range(n):
            if a != b:
                assert sum(o.index(a) < o.index(b) for o in orders) == n
    following = [ts.round_order(n, r) for r in range(6 * n + 1)]
    assert all((prev[-1] != nxt[0]) is (n >= 3) for prev, nxt in zip(following, following[1:]))


def test_interleaved_stats_by_hand(ts, tb):
    """See Note [interleaved steps]: per-round medians, then the median over rounds
    of each mode's round median over the reference's, less one."""
    step_ms = {"native": [[10.0, 12.0, 11.0], [20.0, 19.0, 30.0], [8.0, 8.0, 12.0]],
               "wd": [[12.0, 11.5, 13.0], [19.0, 21.0, 20.0], [10.0, 9.0, 8.5]],
               "wr": [[9.0, 10.0, 11.0], [22.0, 24.0, 23.0], [8.8, 8.0, 9.0]]}
    s = ts.interleaved_stats(step_ms, "native")
    # round medians: native 11, 20, 8; wd 12, 20, 9; wr 10, 23, 8.8
    assert s["round_median_ms"] == {"native": [11.0, 20.0, 8.0], "wd": [12.0, 20.0, 9.0],
                                    "wr": [10.0, 23.0, 8.8]}
    # wd: 12/11-1 = 0.0909, 0, 9/8-1 = 0.125 -> 0.0909; wr: -0.0909, 0.15, 0.1 -> 0.1
    assert set(s["rel_vs_native"]) == {"wd", "wr"}
    assert math.isclose(s["rel_vs_native"]["wd"], 1 / 11)
    assert math.isclose(s["rel_vs_native"]["wr"], 0.1)
    # the median of all nine steps (native's is 12, its round medians' 11)
    assert s["median_ms"] == {"native": 12.0, "wd": 12.0, "wr": 10.0}
    # without native, against the mode given, and the key says so
    s = ts.interleaved_stats({m: step_ms[m] for m in ("wd", "wr")}, "wd")
    assert "rel_vs_native" not in s and set(s["rel_vs_wd"]) == {"wr"}
    # wr/wd per round: 10/12-1 = -1/6, 23/20-1 = 0.15, 8.8/9-1 = -0.0222 -> -0.0222
    assert math.isclose(s["rel_vs_wd"]["wr"], 8.8 / 9 - 1)


def test_time_rounds_sets_each_modes_flags_before_its_steps(ts, tb):
    import torch

    calls = []

    class FakeJob:
        set_flags = ts.TrainJob.set_flags

        def __init__(self, mode):
            self.mode, self.precision, self.deterministic = mode, "fp32strict", False

        def timed_steps(self, steps, timer):
            calls.append((self.mode, torch.backends.cudnn.benchmark,
                          torch.backends.cuda.matmul.allow_tf32))
            for _ in range(steps):
                timer.stop(timer.start())

    before = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
              torch.backends.cuda.matmul.allow_tf32)
    try:
        times = ts.time_rounds([FakeJob("native"), FakeJob("native-heur"), FakeJob("wr")], 3, 2,
                               torch.device("cpu"))
    finally:
        (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_tf32) = before
    assert [c[0] for c in calls] == ["native", "native-heur", "wr", "native-heur", "wr", "native",
                                     "wr", "native", "native-heur"]
    assert all(bench == (mode != "native-heur") and tf32 is False for mode, bench, tf32 in calls)
    assert len(times) == 3 and all(len(r) == 3 and all(len(s) == 2 for s in r) for r in times)


@pytest.mark.slow
def test_interleaved_run_on_cpu(tb, tmp_path, capsys):
    """--interleave: after the runs, every mode's training state at once, the
    modes' steps in turn; medians and per-round ratios in the JSON and a table."""
    out = tmp_path / "i.json"
    rc = tb.main(["--device", "cpu", "--models", "tiny", "--modes", "native", "wr",
                  "--interleave", "2", "--interleave-steps", "2", "--steps", "2", "--warmup", "1",
                  "--execution", "eager", "--batch", "4", "--precisions", "fp32",
                  "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert [r["mode"] for r in report["runs"]] == ["native", "wr"]
    (e,) = report["interleaved"]
    assert "error" not in e, e.get("traceback")
    assert (e["model"], e["precision"], e["execution"], e["batch"]) == ("tiny", "fp32", "eager", 4)
    assert (e["rounds"], e["steps_per_round"], e["reference"]) == (2, 2, "native")
    assert e["modes"] == ["native", "wr"] and set(e["median_ms"]) == {"native", "wr"}
    for m in e["modes"]:
        steps = e["step_ms"][m]
        assert len(steps) == 2 and all(len(r) == 2 and min(r) > 0 for r in steps)
        assert math.isclose(e["median_ms"][m], statistics.median(t for r in steps for t in r))
        assert e["median_ms"][m] > 0
        assert e["round_median_ms"][m] == [statistics.median(r) for r in steps]
    rel = e["rel_vs_native"]
    assert set(rel) == {"wr"} and math.isfinite(rel["wr"])
    ratios = [w / n - 1 for w, n in zip(e["round_median_ms"]["wr"], e["round_median_ms"]["native"])]
    assert math.isclose(rel["wr"], statistics.median(ratios))
    printed = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("| tiny | fp32 | eager | ") for line in printed) == 2
    assert any(line.startswith("| tiny | fp32 | eager | wr | 4 |") and line.endswith("% |")
               for line in printed)


def test_interleave_honours_max_seconds_and_cpu_executions(tb, tmp_path):
    """No interleaved block past --max-seconds; on the CPU (graph execution is
    CUDA-only) only eager is planned, interleaved blocks included."""
    out = tmp_path / "m.json"
    rc = tb.main(["--device", "cpu", "--models", "tiny", "--steps", "1", "--warmup", "1",
                  "--batch", "2", "--precisions", "fp32", "--modes", "native", "wr",
                  "--interleave", "1", "--max-seconds", "0", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["runs"] == [] and report["interleaved"] == []
    assert [s["run"] for s in report["skipped"]] == [
        "tiny fp32 eager native", "tiny fp32 eager wr", "interleaved tiny fp32 eager native wr"]
    for bad in (["--interleave", "-1"], ["--interleave-steps", "0"]):
        with pytest.raises(SystemExit):
            tb.parse_args(["--device", "cpu"] + bad)
    assert tb.parse_args(["--device", "cpu"]).interleave == 0


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def test_a_results_commit_is_dirty_where_the_files_differ_whatever_the_index_says(ts, tmp_path):
    """train_ts.commit_of: HEAD, ``+dirty`` where a tracked file's content
    differs from HEAD's even when git's own index calls it unchanged (a copied
    checkout's stale index), untracked files aside; None below the top."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "first")
    head = ts.commit_of(str(tmp_path))
    assert head is not None and len(head) == 40 and "+" not in head
    (tmp_path / "new.py").write_text("untracked\n")
    assert ts.commit_of(str(tmp_path)) == head
    (tmp_path / "a.py").write_text("x = 3\n")
    _git(tmp_path, "update-index", "--assume-unchanged", "a.py")  # git status now says clean
    assert ts.commit_of(str(tmp_path)) == head + "+dirty"
    assert ts.commit_of(str(tmp_path / "sub")) is None


def test_a_pinned_run_records_its_cpus(ts, monkeypatch):
    """A process held to fewer CPUs than the machine has records them in its
    result's environment, as taskset lists them; one that may run on all of
    them records nothing (See Note [pinned CPUs] in tools/train_steps.py)."""
    import torch

    monkeypatch.setattr(ts.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(ts.os, "sched_getaffinity", lambda pid: {5, 2, 4, 3, 9}, raising=False)
    assert ts.cpu_affinity() == "2-5,9"
    assert ts.environment(torch.device("cpu"))["cpu_affinity"] == "2-5,9"
    monkeypatch.setattr(ts.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert ts.cpu_affinity() is None and "cpu_affinity" not in ts.environment(torch.device("cpu"))
