"""Regression tests for bugs found in review: each failed before its fix."""

import threading

import numpy as np
import pytest

import mucudnn as mu
from mucudnn.__main__ import main
from mucudnn._cudnn import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor
from mucudnn import MicroBatchHandle
from mucudnn.optimizer import BenchmarkCache, optimize_wr
from mucudnn.problem import AlgoPerf, ConvProblem, Direction, MicroBatch, make_plan, packed_strides

from reference import reference, rel_err
from conftest import needs_cudnn


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", "off")


def test_handle_with_unlimited_workspace():
    p = ConvProblem((4, 2, 5, 5), (3, 2, 3, 3))
    h = MicroBatchHandle("numpy", workspace_limit=None)
    plan = h.register(p, "forward").plan
    assert plan.batch == 4


@needs_cudnn
def test_handle_refuses_mixed_layouts():
    """cuDNN allows an NHWC x with an NCHW-format filter or NCHW-strided y; a
    ConvProblem has one layout, so the handle must refuse, not write y wrongly."""
    nhwc = ConvProblem((2, 4, 4, 3), (5, 3, 3, 3), padding=1, layout="NHWC")
    nchw = ConvProblem((2, 3, 4, 4), (5, 3, 3, 3), padding=1, layout="NCHW")
    xd = TensorDescriptor(nhwc.x_dims, strides=packed_strides(nhwc.x_dims, "NHWC"),
                          dtype="float32")
    cd = ConvolutionDescriptor(padding=(1, 1), stride=(1, 1), dilation=(1, 1))
    x = np.zeros(nhwc.x_shape, np.float32)
    y = np.zeros(nhwc.output_shape, np.float32)
    h = MicroBatchHandle("numpy", policy="undivided")
    w_nchw = FilterDescriptor(nchw.w_dims, dtype="float32", format="NCHW")
    y_nhwc = TensorDescriptor(nhwc.y_dims, strides=packed_strides(nhwc.y_dims, "NHWC"),
                              dtype="float32")
    with pytest.raises(ValueError, match="w_desc"):
        h.convolution_forward(1.0, xd, x, w_nchw, np.zeros(nhwc.w_shape, np.float32), cd, 0,
                              None, 0, 0.0, y_nhwc, y)
    w_nhwc = FilterDescriptor(nhwc.w_dims, dtype="float32", format="NHWC")
    y_nchw = TensorDescriptor(nchw.y_dims, strides=packed_strides(nchw.y_dims, "NCHW"),
                              dtype="float32")
    with pytest.raises(ValueError, match="y_desc"):
        h.convolution_forward(1.0, xd, x, w_nhwc, np.zeros(nhwc.w_shape, np.float32), cd, 0,
                              None, 0, 0.0, y_nchw, y)
    # the consistent NHWC call still runs and is right
    rng = np.random.default_rng(0)
    x = rng.standard_normal(nhwc.x_shape).astype(np.float32)
    w = rng.standard_normal(nhwc.w_shape).astype(np.float32)
    h.convolution_forward(1.0, xd, x, w_nhwc, w, cd, 0, None, 0, 0.0, y_nhwc, y)
    assert rel_err(y, reference(nhwc, Direction.FORWARD, x, w, None)) < 1e-5


def test_one_shot_iterable_policy_is_read_once():
    perf = {4: [AlgoPerf(0, 10.0, 0)], 2: [AlgoPerf(1, 1.0, 0)]}
    assert optimize_wr(perf, 4, 0, iter([2])).describe() == "2 x 2"
    sizes = []
    be = mu.get_backend("numpy", repeats=1)
    orig = be.find
    be.find = lambda p, d, lim: (sizes.append(p.batch), orig(p, d, lim))[1]
    c = mu.Convolution((8, 2, 5, 5), (3, 2, 3, 3), backend=be, policy=(s for s in (4, 2)))
    c.forward(np.ones((8, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32))
    # read twice, the policy would be empty the second time and only 8 benchmarked;
    # size 2 may be pruned (Note [size pruning])
    assert {4, 8} <= set(sizes) <= {2, 4, 8}


def test_host_backend_is_safe_across_threads():
    """Two threads share the NumPy backend's workspace pool; results stay right."""
    p = ConvProblem((8, 8, 16, 16), (8, 8, 3, 3), padding=1)
    plan = make_plan([MicroBatch(0, 8, 1)], undivided_time_ms=1.0, workspace_limit=None)
    convs = [mu.Convolution(p.x_shape, p.w_shape, padding=1, backend="numpy",
                            plans={Direction.FORWARD: plan}) for _ in range(2)]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(p.x_shape).astype(np.float32) for _ in range(2)]
    w = rng.standard_normal(p.w_shape).astype(np.float32)
    refs = [reference(p, Direction.FORWARD, x, w, None) for x in xs]
    errors = []

    def worker(i):
        for _ in range(15):
            errors.append(rel_err(convs[i].forward(xs[i], w), refs[i]))
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(errors) == 30 and max(errors) < 1e-5


def test_cli_unknown_layer_is_an_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--net", "alexnet", "--backend", "numpy", "--batch", "2",
              "--layers", "conv5,cnov4", "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "cnov4" in err and "conv1, conv2" in err


def test_cache_off_string_disables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = BenchmarkCache("off")
    assert not c.enabled
    assert not (tmp_path / "off").exists()
