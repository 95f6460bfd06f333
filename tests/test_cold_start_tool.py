"""tools/cold_start.py on the CPU: how each worker is started with respect to
the driver's JIT cache (Note [JIT cache in cold runs]) and what a row records;
the worker itself needs a GPU and is replaced by a stand-in that reports the
environment it was given."""

from __future__ import annotations

import json
import os
import types

import pytest
from tool_support import load_tool



@pytest.fixture(scope="module")
def cs() -> types.ModuleType:
    return load_tool("cold_start")


@pytest.fixture
def worker(cs, monkeypatch):
    """subprocess.run replaced by a worker that writes 100 bytes into its JIT
    cache and reports the cache path it saw."""
    seen: list[dict] = []

    def run(cmd, capture_output, text, timeout, env):
        path = cmd[cmd.index("--worker-json") + 1]
        cache = env.get("CUDA_CACHE_PATH")
        if cache:
            os.makedirs(cache, exist_ok=True)
            with open(os.path.join(cache, "kernel.bin"), "wb") as fh:
                fh.write(b"x" * 100)
        seen.append({"cache": cache, "args": cmd})
        with open(path, "w") as fh:
            json.dump({"process_s": 1.0}, fh)
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(cs.subprocess, "run", run)
    return seen


def test_a_fresh_jit_cache_per_worker_is_empty_and_removed(cs, worker, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_CACHE_PATH", str(tmp_path / "users"))
    r1 = cs._run_worker(["--worker", "default"], 10.0, "fresh")
    r2 = cs._run_worker(["--worker", "default"], 10.0, "fresh")
    a, b = worker[0]["cache"], worker[1]["cache"]
    assert a != b and a != str(tmp_path / "users")  # one of its own each time
    assert not os.path.exists(a) and not os.path.exists(b)  # removed afterwards
    assert r1 == r2 == {"process_s": 1.0, "jit_cache": "fresh", "jit_cache_bytes_after": 100}
    assert not (tmp_path / "users").exists()  # the user's cache was not touched


def test_the_shared_jit_cache_is_the_users(cs, worker, tmp_path, monkeypatch):
    users = tmp_path / "users"
    monkeypatch.setenv("CUDA_CACHE_PATH", str(users))
    r = cs._run_worker(["--worker", "torch"], 10.0)
    assert worker[0]["cache"] == str(users)
    assert r["jit_cache"] == "shared" and r["jit_cache_bytes_after"] == 100
    assert (users / "kernel.bin").stat().st_size == 100


def test_the_option_is_checked(cs):
    with pytest.raises(SystemExit):
        cs.main(["--jit-cache", "warm", "--nets", "alexnet"])


def test_the_breakdown_has_its_columns_and_the_runtime_compiled_share(cs):
    """The FindProfile columns of a row: BREAKDOWN_COLUMNS of them, the
    finalize column with the runtime-compiled engines' share (Note
    [runtime-compiled engines]); '-' in each where there is no profile."""
    from mucudnn.backends._device import FindProfile
    p = FindProfile(finalize_s=2.0, finalize_thread_s=3.5, finalized_rtc=4, finalize_rtc_s=3.0,
                    rtc_cut=7, modes_s={"A": 0.5})
    cells = cs._breakdown(p.as_dict()).split(" | ")
    assert len(cells) == cs.BREAKDOWN_COLUMNS
    assert cells[1] == "2.0 (runtime-compiled 4: 3.0 of 3.5 thread s; 7 left out)"
    assert cells[5] == "0"
    assert cs._breakdown({}) == " | ".join(["-"] * cs.BREAKDOWN_COLUMNS)
    # find_skip_ratio's cut shows beside the rank cut (Note [far behind at another size])
    p.cut, p.far_cut = 12, 5
    assert cs._breakdown(p.as_dict()).split(" | ")[5] == "12 (+5 far behind)"
    # find_carry's additions show beside the timed count (Note [carried to other sizes])
    p.timed, p.carried = 30, 3
    assert cs._breakdown(p.as_dict()).split(" | ")[7] == "30 (+3 carried)"
    assert cs.CONFIGS["no-carry"] == {"find_carry": False}
    assert cs.CONFIGS["no-fold"] == {"fold": False}


@pytest.fixture
def workers(cs, monkeypatch):
    """The arguments of every worker main() would start; none is started."""
    seen: list[list[str]] = []

    def run_worker(args, timeout, jit_cache="shared"):
        seen.append(args)
        return {"error": "stand-in"}

    monkeypatch.setattr(cs, "_run_worker", run_worker)
    return seen


def test_keep_caches_reaches_every_worker(cs, tmp_path, workers):
    """--keep-caches DIR is handed to each worker (absolute); a mucudnn worker
    copies its benchmark cache there as NET-CONFIG.sqlite."""
    keep = tmp_path / "caches"
    assert cs.main(["--nets", "alexnet", "--configs", "default", "exhaustive",
                    "--keep-caches", str(keep)]) == 0
    assert [a[a.index("--worker") + 1] for a in workers] == ["default", "exhaustive"]
    for args in workers:
        assert args[args.index("--keep-caches") + 1] == str(keep.resolve())


def test_the_precision_reaches_every_worker_and_its_problems(cs, workers, capsys):
    """--precision bf16cl: every worker (PyTorch's too) is told, its problems
    are bfloat16 NHWC (what AMP channels-last runs), and rows are labelled."""
    assert cs.main(["--nets", "alexnet", "--configs", "default", "--torch",
                    "--precision", "bf16cl"]) == 0
    assert [a[a.index("--precision") + 1] for a in workers] == ["bf16cl", "bf16cl"]
    assert "| alexnet (bf16cl) | default | error:" in capsys.readouterr().out
    problems = list(cs._problems("alexnet", 8, "bf16cl"))
    assert problems and all(p.dtype == "bfloat16" and p.layout == "NHWC" for p in problems)
    assert all(p.dtype == "float32" and p.layout == "NCHW" for p in cs._problems("alexnet", 8))
    with pytest.raises(SystemExit):
        cs.main(["--nets", "alexnet", "--precision", "fp16"])


def test_the_workspace_takes_sizes_and_reaches_every_worker_in_bytes(cs, workers):
    assert cs.main(["--nets", "alexnet", "--configs", "default", "no-carry",
                    "--workspace", "128MiB"]) == 0
    assert [a[a.index("--workspace") + 1] for a in workers] == [str(128 << 20)] * 2
    assert cs.main(["--nets", "alexnet", "--configs", "default", "--workspace", "1024"]) == 0
    assert workers[-1][workers[-1].index("--workspace") + 1] == "1024"
    with pytest.raises(SystemExit):
        cs.main(["--nets", "alexnet", "--workspace", "lots"])
