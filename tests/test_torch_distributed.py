"""mucudnn.torch.share_plans over torch.distributed (gloo, CPU, NumPy backend):
two ranks, each with its own benchmark cache, as on two hosts."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import mucudnn.torch as mt  # noqa: E402

from distributed_support import model, run_rank  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _run(tmp_path, case: str, world: int = 2) -> list[dict]:
    mp.spawn(run_rank, args=(world, str(tmp_path), case), nprocs=world)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
def test_each_kernel_is_benchmarked_once_and_every_rank_plans_the_same(tmp_path):
    a, b = _run(tmp_path, "spread")
    assert a["kernels"] == b["kernels"] == 9           # 3 distinct convs x 3 directions
    assert not set(a["measured"]) & set(b["measured"])
    assert len(set(a["measured"]) | set(b["measured"])) == 9
    assert a["measured"] and b["measured"]              # both ranks took part
    # Find ran on each rank for its own kernels only
    assert a["found"] == sorted(a["measured"]) and b["found"] == sorted(b["measured"])
    assert a["received"] > 0 and b["received"] > 0
    assert a["plans"] == b["plans"] and len(a["plans"]) == 9
    for r in (a, b):
        # the training step planned nothing: no Find, no new cache entry
        assert r["finds"] == 0 and r["new_entries"] == 0
        # and it is the native model's step
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
        assert r["grad"] == pytest.approx(r["ref_grad"], rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_src_benchmarks_everything(tmp_path):
    a, b = _run(tmp_path, "src")
    assert len(a["measured"]) == 9 and b["measured"] == [] and b["found"] == []
    assert b["received"] > 0 and a["received"] == 0
    assert a["plans"] == b["plans"]
    assert b["finds"] == 0 and b["new_entries"] == 0


@pytest.mark.slow
def test_ranks_on_different_devices_are_an_error_naming_them(tmp_path):
    a, b = _run(tmp_path, "mismatch")
    for r in (a, b):
        assert "do not measure on one kind of device" in r["error"]
        assert "rank 0: numpy" in r["error"] and "rank 1: numpy another CPU" in r["error"]


@pytest.mark.slow
def test_ranks_that_meet_other_convolutions_are_an_error(tmp_path):
    a, b = _run(tmp_path, "shapes")
    for r in (a, b):
        assert "rank 1 met other convolutions than rank 0" in r["error"]
        assert r["found"] == []   # raised before any benchmark


def test_needs_an_initialised_process_group():
    with pytest.raises(mt.TorchBridgeError, match="init_process_group"):
        mt.share_plans(mt.convert(model()), torch.randn(2, 3, 12, 12))


def test_recording_runs_no_convolution_and_plans_nothing():
    from mucudnn.torch import recording
    net = mt.convert(model(), workspace_limit=1 << 16)
    mt.clear()
    with recording.recording() as rec, torch.no_grad():
        y = net(torch.randn(2, 3, 12, 12))
    assert tuple(y.shape) == (2, 100)
    assert len(rec.convs) == 3 and mt.cached_convolutions() == []
    assert [c.problem.w_shape for c in rec.convs] == [(8, 3, 3, 3), (8, 8, 3, 3), (4, 8, 1, 1)]
    with pytest.raises(mt.TorchBridgeError, match="already recording"):
        with recording.recording(), recording.recording():
            pass
    assert recording.RECORDER is None
