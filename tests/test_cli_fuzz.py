"""Random command lines: each one either runs (exit code 0; --help and
--version too) or ends with exit code 2 and one line ``python -m mucudnn
[<command>]: error: ...``; never a traceback (unless -v asked for one).

The heavy work (benchmarking, plotting) is replaced by stand-ins that check
what the command line hands them, so every example is fast and a bad value
that slipped past the checks fails here. A small fixed budget runs by
default; the ``slow`` test draws many more.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import pathlib
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mucudnn.__main__ as cli
from mucudnn.bench import NetworkResult
from mucudnn.networks import NETWORKS
from mucudnn.problem import ConvProblem, Direction, MicroBatch, make_plan

DATA = pathlib.Path(__file__).parent / "data"

COMMANDS = ["bench", "optimize", "plot", "benchmark", "--help", "--version", ""]
OPTIONS = ["--net", "--batch", "--dtype", "--layout", "--math", "--workspace", "--policy",
           "--mode", "--total-workspace", "--backend", "--offline", "--layers",
           "--directions", "--no-progress", "-v", "--repeat", "--json", "--graph", "--out",
           "-h", "--version", "--", "-x", "--net=alexnet", "--batch=2", "--work", "--bat"]
VALUES = ["alexnet", "resnet18", "resnet50", "vgg16", "lenet", "AlexNet", "0", "-1", "1", "2",
          "3", "256", "1e400", "2.5", "", " ", "64MiB", "1.5GiB", "64 parsecs", "-1MiB",
          "9" * 30, "conv5", "conv1,conv5", "conv9", ",", "forward", "fwd,wgrad",
          "forward,forward", "sideways", "wr", "wd", "numpy", "cudnn", "cudnn-graph", "tpu",
          "powerOfTwo", "all", "undivided", "pow2", "64,32", "0,2", "float16", "bfloat16",
          "int8", "NHWC", "NCDHW", "fma", "tensor_op", "out.json", "/", "no/such/dir/x.json",
          "figs", "out.json/", "\n", "é", "--"]
TOKENS = st.one_of(st.sampled_from(OPTIONS), st.sampled_from(VALUES),
                   st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(COMMANDS))
    rest = draw(st.lists(TOKENS, max_size=10))
    # Most real command lines name a network: give the valid path a fair share.
    if draw(st.booleans()):
        rest = ["--net", draw(st.sampled_from(sorted(NETWORKS)))] + rest
    return ([command] if command else []) + rest


def _plan(p: ConvProblem, d, limit, policy):
    assert isinstance(p, ConvProblem) and p.batch >= 1
    return make_plan([MicroBatch(0, p.batch, 0)], undivided_time_ms=1.0,
                     workspace_limit=limit, policy=policy, problem=p, direction=d)


def fake_run_network(net, batch, **kw):
    assert net in NETWORKS and type(batch) is int and batch >= 1
    assert type(kw["workspace_limit"]) is int and kw["workspace_limit"] >= 0
    assert kw["mode"] in ("wr", "wd") and kw["repeat"] >= 1
    assert all(Direction.parse(d) for d in kw["directions"])
    return NetworkResult(net=net, batch=batch, dtype=kw["dtype"], backend=kw["backend"],
                         device="cpu", version="0", workspace_limit=kw["workspace_limit"],
                         policy=kw["policy"], mode=kw["mode"],
                         total_workspace=kw["total_workspace"])


def fake_optimize_kernels(kernels, limit, policy, backend, progress=True):
    assert type(limit) is int and limit >= 0
    return {key: _plan(p, Direction.parse(d), limit, policy) for key, (p, d) in kernels.items()}


def fake_optimize_network(probs, total, dirs, policy, backend, progress=True):
    assert type(total) is int and total >= 0
    return {(n, d): _plan(p, Direction.parse(d), None, policy)
            for n, p in probs.items() for d in dirs}


def fake_plot_network(net, batch, **kw):
    assert net in NETWORKS and type(batch) is int and batch >= 1
    return [os.path.join(kw["out_dir"], f"{net}-pareto.png")]


@pytest.fixture(scope="module")
def h200_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "h200.sqlite"
    with gzip.open(DATA / "h200-benchmark-cache.sqlite.gz") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def _check(argv, cache, folder):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "run_network", fake_run_network)
        mp.setattr(cli, "optimize_kernels", fake_optimize_kernels)
        mp.setattr(cli, "optimize_network", fake_optimize_network)
        mp.setattr(cli, "plot_network", fake_plot_network)
        mp.setattr(cli, "device_count", lambda: 0)
        for var in ("MUCUDNN_BACKEND", "MUCUDNN_WORKSPACE_LIMIT"):
            mp.delenv(var, raising=False)
        mp.setenv("MUCUDNN_CACHE", str(cache))
        mp.chdir(folder)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
        except cli.EXPECTED:
            # an expected failure shows its traceback only when -v asked for it
            assert "-v" in argv or any(a.startswith("--verb") for a in argv), argv
            return
    if rc == 2:
        lines = err.getvalue().splitlines()
        assert len(lines) == 1, (argv, err.getvalue())
        assert lines[0].startswith("python -m mucudnn") and ": error: " in lines[0], lines
    else:
        assert rc == 0, (argv, rc, err.getvalue())
        assert "Traceback" not in err.getvalue()


FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                       HealthCheck.too_slow])


@settings(FUZZ, max_examples=150)
@given(argv=command_lines())
def test_cli_fuzz(argv, h200_cache, tmp_path):
    _check(argv, h200_cache, tmp_path)


@pytest.mark.slow
@settings(FUZZ, max_examples=2000)
@given(argv=command_lines())
def test_cli_fuzz_many(argv, h200_cache, tmp_path):
    _check(argv, h200_cache, tmp_path)


@pytest.mark.parametrize("argv", [
    ["bench", "--net", "alexnet", "--batch", "2", "--backend", "numpy", "--json", "r.json"],
    ["optimize", "--net", "resnet18", "--offline", "--mode", "wd", "--total-workspace", "0"],
    ["plot", "--net", "vgg16", "--offline", "--out", "figs", "--directions", "fwd"],
    ["bench", "--net", "alexnet", "--batch", "0"],
    ["optimize", "--net", "alexnet", "--layers", "conv9"],
    ["--version"],
])
def test_cli_fuzz_checker_on_known_lines(argv, h200_cache, tmp_path):
    # the checker itself: known good and known bad lines pass it
    _check(argv, h200_cache, tmp_path)
