"""The command line as a new user meets it: expected failures are one line
(``python -m mucudnn <cmd>: error: ...``, exit code 2) found before any heavy
work; without a GPU the NumPy backend runs at a batch it can finish and says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import mucudnn
import mucudnn.__main__ as cli
from mucudnn.bench import NetworkResult
from mucudnn.errors import MucudnnError

QUICK_START = ["bench", "--net", "alexnet", "--batch", "256", "--workspace", "64MiB",
               "--policy", "powerOfTwo"]


def _error_line(capsys, argv, command=None):
    """Run main(argv), expecting exit code 2 with one line on stderr; return it."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    prefix = f"python -m mucudnn {command or argv[0]}: error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix):]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(cli, "device_count", lambda: 0)
    monkeypatch.delenv("MUCUDNN_BACKEND", raising=False)
    monkeypatch.delenv("MUCUDNN_WORKSPACE_LIMIT", raising=False)


@pytest.fixture
def fake_run(monkeypatch):
    """run_network replaced by a recorder (no benchmarking)."""
    calls = []

    def run_network(net, batch, **kw):
        calls.append(dict(kw, net=net, batch=batch))
        be = kw["backend"]
        return NetworkResult(net=net, batch=batch, dtype=kw["dtype"], backend=str(be),
                             device="cpu", version="0", workspace_limit=kw["workspace_limit"],
                             policy=kw["policy"], mode=kw["mode"],
                             total_workspace=kw["total_workspace"])
    monkeypatch.setattr(cli, "run_network", run_network)
    return calls


# -- batch ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "-3", "two", "1.5", ""])
def test_batch_must_be_a_positive_int(capsys, value):
    msg = _error_line(capsys, ["bench", "--net", "alexnet", "--batch", value])
    assert msg.startswith("argument --batch: expected a positive int")


@pytest.mark.parametrize("option", ["--repeat"])
def test_repeat_must_be_a_positive_int(capsys, option):
    msg = _error_line(capsys, ["bench", "--net", "alexnet", option, "0"])
    assert msg.startswith(f"argument {option}: expected a positive int")


def test_quick_start_without_gpu_caps_the_batch_and_says_so(no_gpu, fake_run, capsys):
    assert cli.main(QUICK_START + ["--no-progress"]) == 0
    out = capsys.readouterr().out
    cap = cli.CPU_BATCH["alexnet"]
    assert [c["batch"] for c in fake_run] == [cap] and cap < 256
    note = out.splitlines()[0]
    assert f"batch {cap} instead of 256" in note and "--backend numpy" in note
    assert "pass --batch" not in out
    assert "say nothing about" in out  # CPU timings are no guide to a GPU


@pytest.mark.parametrize("net", sorted(cli.CPU_BATCH))
def test_every_network_has_a_cpu_cap(no_gpu, fake_run, capsys, net):
    assert cli.main(["bench", "--net", net, "--no-progress"]) == 0
    assert fake_run[0]["batch"] == cli.CPU_BATCH[net] >= 1
    assert f"batch {cli.CPU_BATCH[net]} instead of" in capsys.readouterr().out


def test_a_smaller_batch_is_kept_and_an_explicit_numpy_backend_is_not_capped(
        no_gpu, fake_run, capsys):
    assert cli.main(["bench", "--net", "alexnet", "--batch", "1", "--no-progress"]) == 0
    assert fake_run[-1]["batch"] == 1
    assert "instead of" not in capsys.readouterr().out
    assert cli.main(["bench", "--net", "alexnet", "--batch", "16", "--backend", "numpy",
                     "--no-progress"]) == 0
    assert fake_run[-1]["batch"] == 16


@pytest.mark.slow
def test_numpy_bench_says_its_speedups_are_no_guide(tmp_cache, capsys):
    rc = cli.main(["bench", "--net", "alexnet", "--backend", "numpy", "--batch", "2",
                   "--layers", "conv5", "--directions", "forward", "--repeat", "1",
                   "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "TOTAL" in out and "say nothing about" in out


# -- options that are not there, or only with others ------------------------------------------
def test_bench_does_not_offer_offline(capsys):
    msg = _error_line(capsys, ["bench", "--net", "alexnet", "--offline"])
    assert "--offline" in msg
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "--offline" not in capsys.readouterr().out


def test_total_workspace_needs_wd(capsys):
    msg = _error_line(capsys, ["optimize", "--net", "alexnet", "--total-workspace", "1GiB"])
    assert msg.startswith("argument --total-workspace:") and "--mode wd" in msg


def test_total_workspace_zero_is_a_budget(tmp_cache, tmp_path, capsys):
    out = tmp_path / "plans.json"
    rc = cli.main(["optimize", "--net", "alexnet", "--backend", "numpy", "--batch", "2",
                   "--layers", "conv4,conv5", "--directions", "forward", "--mode", "wd",
                   "--workspace", "64MiB", "--total-workspace", "0", "--no-progress",
                   "--json", str(out)])
    assert rc == 0
    plans = json.loads(out.read_text())
    assert len(plans) == 2
    assert all(p["workspace_bytes"] == 0 for p in plans)  # not 2 x 64 MiB


# -- sizes and the environment -------------------------------------------------------------------
@pytest.mark.parametrize("option", ["--workspace", "--total-workspace"])
def test_size_options_give_one_line(capsys, option):
    argv = ["optimize", "--net", "alexnet", "--mode", "wd", option, "1e400"]
    msg = _error_line(capsys, argv)
    assert msg == f"argument {option}: '1e400' is too large (sizes must be below 2**63 bytes)"


def test_workspace_limit_variable_is_checked_first(monkeypatch, fake_run, capsys):
    monkeypatch.setenv("MUCUDNN_WORKSPACE_LIMIT", "1e400")
    msg = _error_line(capsys, QUICK_START)
    assert msg.startswith("MUCUDNN_WORKSPACE_LIMIT: '1e400' is too large")
    assert fake_run == []


def test_backend_variable_is_checked_first(monkeypatch, fake_run, capsys):
    monkeypatch.setenv("MUCUDNN_BACKEND", "tpu")
    msg = _error_line(capsys, QUICK_START)
    assert msg.startswith("MUCUDNN_BACKEND: expected one of")
    assert fake_run == []


@pytest.mark.parametrize("how", ["option", "variable"])
def test_gpu_backend_without_gpu_is_one_line(no_gpu, monkeypatch, fake_run, capsys, how):
    argv = ["optimize", "--net", "alexnet", "--layers", "conv5"]
    if how == "option":
        argv += ["--backend", "cudnn"]
    else:
        monkeypatch.setenv("MUCUDNN_BACKEND", "cudnn-graph")
    msg = _error_line(capsys, argv)
    assert "needs a CUDA GPU" in msg and "--backend numpy" in msg and "--offline" in msg


# -- files ----------------------------------------------------------------------------------------
def test_unwritable_json_is_refused_before_the_run(no_gpu, fake_run, tmp_path, capsys):
    target = tmp_path / "no" / "such" / "folder" / "r.json"
    msg = _error_line(capsys, QUICK_START + ["--json", str(target)])
    assert msg.startswith("argument --json:") and "does not exist" in msg
    assert fake_run == []
    msg = _error_line(capsys, QUICK_START + ["--json", str(tmp_path)])
    assert msg.startswith("argument --json:") and "is a folder" in msg


def test_plot_out_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("")
    msg = _error_line(capsys, ["plot", "--net", "alexnet", "--out", str(f)])
    assert msg.startswith("argument --out:") and "not a folder" in msg


def test_offline_without_measurements_is_one_line(tmp_cache, capsys):
    msg = _error_line(capsys, ["optimize", "--net", "alexnet", "--offline"])
    assert "no measurements" in msg


# -- optional dependencies ------------------------------------------------------------------------
def test_plot_without_matplotlib(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    msg = _error_line(capsys, ["plot", "--net", "alexnet"])
    assert msg.endswith('pip install "mucudnn[plot]"') and "matplotlib" in msg


def test_bfloat16_on_the_host_without_ml_dtypes(monkeypatch, fake_run, capsys):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    msg = _error_line(capsys, ["bench", "--net", "alexnet", "--dtype", "bfloat16",
                               "--backend", "numpy"])
    assert msg.endswith('pip install "mucudnn[bfloat16]"') and "ml_dtypes" in msg
    assert fake_run == []


def test_plot_api_without_matplotlib(monkeypatch):
    from mucudnn import plot
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError) as e:
        plot.plot_network("alexnet", 2, backend="numpy")
    assert isinstance(e.value, MucudnnError)
    assert str(e.value).endswith('pip install "mucudnn[plot]"')
    assert e.value.__cause__ is None and e.value.__suppress_context__


# -- what stays a traceback ------------------------------------------------------------------------
def test_a_real_bug_keeps_its_traceback(no_gpu, monkeypatch):
    def broken(*a, **k):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(cli, "run_network", broken)
    with pytest.raises(ZeroDivisionError):
        cli.main(QUICK_START + ["--no-progress"])


def test_verbose_shows_the_traceback_of_an_expected_error(monkeypatch, fake_run):
    monkeypatch.setenv("MUCUDNN_WORKSPACE_LIMIT", "1e400")
    with pytest.raises(ValueError, match="MUCUDNN_WORKSPACE_LIMIT"):
        cli.main(QUICK_START + ["-v"])


def test_a_closed_pipe_ends_quietly(no_gpu, fake_run, monkeypatch, capsys):
    class Closed:
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(sys, "stdout", Closed())
    assert cli.main(QUICK_START + ["--no-progress"]) == 141
    assert capsys.readouterr().err == ""


# -- --version ------------------------------------------------------------------------------------
def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"mucudnn {mucudnn.__version__}"


def test_version_from_a_shell():
    out = subprocess.run([sys.executable, "-m", "mucudnn", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == f"mucudnn {mucudnn.__version__}"


def test_console_script_version():
    script = shutil.which("mucudnn", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("no mucudnn script next to this Python (package not installed)")
    out = subprocess.run([script, "--version"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == f"mucudnn {mucudnn.__version__}"


def test_console_script_is_main():
    from importlib.metadata import entry_points
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "mucudnn"]
    assert ep.value == "mucudnn.__main__:main" and ep.load() is cli.main


def test_no_command_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m mucudnn: error:")
