"""The command line on the NumPy backend (CPU): bench, optimize, plot."""

import argparse
import json

import pytest

from mucudnn.__main__ import main, parse_size


def test_parse_size():
    assert parse_size("64MiB") == 64 << 20
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("512k") == 512 << 10
    assert parse_size("2MB") == 2_000_000
    assert parse_size("0") == 0
    for bad in ("64 parsecs", "", "MiB", "-1MiB"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a size"):
            parse_size(bad)


@pytest.mark.slow
def test_bench_numpy_table_and_json(tmp_path, tmp_cache, capsys):
    out = tmp_path / "r.json"
    rc = main(["bench", "--net", "alexnet", "--backend", "numpy", "--batch", "3",
               "--layers", "conv5", "--workspace", "1MiB", "--repeat", "2", "--no-progress",
               "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "alexnet, batch 3" in text and "TOTAL" in text
    for d in ("forward", "backward_data", "backward_filter"):
        assert f"conv5  {d}" in text
    data = json.loads(out.read_text())[0]
    assert data["batch"] == 3 and data["workspace_limit"] == 1 << 20
    assert len(data["kernels"]) == 3
    for k in data["kernels"]:
        assert k["plan"]["workspace_bytes"] <= 1 << 20
        assert sum(m["size"] for m in k["plan"]["micro_batches"]) == 3
        assert k["micro_ms"] > 0 and k["unlimited_ms"] > 0
    assert data["optimize_warm_s"] < data["optimize_cold_s"]


@pytest.mark.slow
def test_bench_wd_mode(tmp_cache, capsys):
    rc = main(["bench", "--net", "alexnet", "--backend", "numpy", "--batch", "2",
               "--layers", "conv4,conv5", "--mode", "wd", "--total-workspace", "2MiB",
               "--repeat", "1", "--no-progress", "--directions", "forward"])
    assert rc == 0
    assert "2.0 MiB total (WD)" in capsys.readouterr().out


@pytest.mark.slow
def test_optimize_json(tmp_path, tmp_cache, capsys):
    out = tmp_path / "plans.json"
    rc = main(["optimize", "--net", "resnet18", "--backend", "numpy", "--batch", "4",
               "--layers", "layer4.0.conv2", "--workspace", "0", "--no-progress",
               "--json", str(out)])
    assert rc == 0
    plans = json.loads(out.read_text())
    assert {p["direction"] for p in plans} == {"forward", "backward_data", "backward_filter"}
    for p in plans:
        assert p["workspace_bytes"] == 0  # a zero limit forces zero-workspace algorithms
        assert p["problem"]["x_shape"] == [4, 512, 7, 7]


@pytest.mark.slow
def test_plot_pngs(tmp_path, tmp_cache):
    pytest.importorskip("matplotlib")
    rc = main(["plot", "--net", "alexnet", "--backend", "numpy", "--batch", "2",
               "--layers", "conv5", "--directions", "forward", "--no-progress",
               "--out", str(tmp_path)])
    assert rc == 0
    for name in ("alexnet-pareto.png", "alexnet-speedup.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_bad_arguments_exit_cleanly(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--net", "lenet"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_default_backend_choice(monkeypatch):
    """No GPU: numpy; MUCUDNN_BACKEND overrides; a GPU picks the graph API; a
    caller that says a GPU is there (a CUDA tensor's) is answered without a
    device count."""
    import mucudnn.backends as b

    monkeypatch.delenv("MUCUDNN_BACKEND", raising=False)
    monkeypatch.setattr(b, "device_count", lambda: 0)
    assert b.default_name() == "numpy"
    monkeypatch.setattr(b, "device_count", lambda: 1)
    assert b.default_name() == b.DEFAULT_GPU_BACKEND == "cudnn-graph"

    def no_count():
        raise AssertionError("counted the devices")
    monkeypatch.setattr(b, "device_count", no_count)
    assert b.default_name(gpu=True) == "cudnn-graph"
    monkeypatch.setenv("MUCUDNN_BACKEND", "cudnn")
    assert b.default_name() == b.default_name(gpu=True) == "cudnn"
    monkeypatch.setenv("MUCUDNN_BACKEND", "tpu")
    with pytest.raises(ValueError, match="MUCUDNN_BACKEND"):
        b.default_name()


def test_parser_names_every_backend():
    # See Note [commands load what they run]: the parser's list, kept without importing backends
    import mucudnn
    from mucudnn.__main__ import BACKENDS

    assert list(BACKENDS) == mucudnn.available_backends()


@pytest.mark.slow
def test_bench_says_which_cache_and_when_it_answered_everything(tmp_cache, capsys):
    argv = ["bench", "--net", "alexnet", "--backend", "numpy", "--batch", "2", "--layers",
            "conv5", "--directions", "forward", "--repeat", "1", "--no-progress"]
    assert main(argv) == 0
    cold = capsys.readouterr().out
    assert f"cache: {tmp_cache} (0 entries; MUCUDNN_CACHE names another file)" in cold
    assert "optimisation: cold " in cold and " sizes measured)" in cold
    # See Note [overhead on the host]: no dispatch-overhead figure from NumPy timings
    assert "dispatch overhead" not in cold
    assert main(argv) == 0
    warm = capsys.readouterr().out
    assert warm.count("cache: ") == 1
    n = int(warm.split(f"cache: {tmp_cache} (")[1].split(" ")[0])
    assert n >= 2
    assert "optimisation: cached " in warm and "(every size was in the cache)" in warm
    assert "cold" not in warm


def test_gpu_results_keep_the_dispatch_overhead():
    from mucudnn.bench import NetworkResult, _optimisation_line

    r = NetworkResult(net="alexnet", batch=2, dtype="float32", backend="cudnn", device="GPU",
                      version="9", workspace_limit=1, policy="fitted", mode="wr",
                      total_workspace=None, optimize_cold_s=2.0, optimize_warm_s=0.01,
                      cold_measured=5)
    r.total = lambda attr: {"micro_ms": 1.1, "kernels_alone_ms": 1.0}.get(attr, 1.0)  # type: ignore
    assert _optimisation_line(r) == ("optimisation: cold 2.00 s (5 sizes measured), warm (cached) "
                                     "0.010 s; dispatch overhead +10.0% over the micro-batch "
                                     "kernels timed alone")
    r.host = True
    assert "dispatch overhead" not in _optimisation_line(r)


def test_optimize_offline_draws_no_progress_bar(tmp_path, monkeypatch, capsys):
    import gzip
    import shutil

    from conftest import DATA

    path = tmp_path / "h200.sqlite"
    with gzip.open(DATA / "h200-benchmark-cache.sqlite.gz") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    monkeypatch.setenv("MUCUDNN_CACHE", str(path))
    assert main(["optimize", "--net", "alexnet", "--offline", "--layers", "conv1,conv2"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith(f"cache: {path} (")
    assert "entries" in out.splitlines()[0]
    assert err == ""


def test_cli_unknown_layer_is_an_error(capsys, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", "off")
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--net", "alexnet", "--backend", "numpy", "--batch", "2",
              "--layers", "conv5,cnov4", "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "cnov4" in err and "conv1, conv2" in err
