"""tools/plan_quality.py on synthetic caches: a run priced against itself loses
nothing; against a reference whose times are other, the tested plan is priced
at the reference's times, the selection loss is what the reference's own plan
saves, and micro-batches the reference never measured are counted."""

from __future__ import annotations

import types

import pytest
from tool_support import load_tool

from mucudnn.networks import select
from mucudnn.optimizer import BenchmarkCache, batch_sizes
from mucudnn.optimizer.offline import CacheMissError
from mucudnn.problem import AlgoPerf, Direction

MiB = 1 << 20


@pytest.fixture(scope="module")
def pq() -> types.ModuleType:
    return load_tool("plan_quality")


class Measured:
    """The identity a cache entry is filed under (as a GPU backend's)."""
    name, device_name, version = "cudnn-graph", "NVIDIA H200", "91900"


def _fill(path, times, **precision):
    """A cache for AlexNet conv5 at batch 8: every size of powerOfTwo, algo
    "a" (fast, 32 MiB per sample, so only small sizes fit 64 MiB) and "b"
    (no workspace); ``times(size, algo)`` gives the ms (None: not measured);
    ``precision``: the problem's dtype, layout and math (default fp32 NCHW)."""
    store = BenchmarkCache(path)
    p = select("alexnet", ["conv5"])[0].problem(8, **precision)
    for d in Direction:
        for s in batch_sizes("powerOfTwo", 8):
            perfs = [AlgoPerf(algo, t, ws, 0, 1)
                     for algo, ws in (("a", 32 * MiB * s), ("b", 0))
                     if (t := times(s, algo)) is not None]
            store.put(Measured(), p.with_batch(s), d, perfs, 1 << 30)
    store.close()


def _true(s, a):
    """"a": 0.05 ms per call + 0.1 per sample (size 2 is its best that fits);
    "b": 0.5 per sample."""
    return 0.05 + 0.1 * s if a == "a" else 0.5 * s


def test_a_run_against_itself_loses_nothing(pq, tmp_path):
    path = tmp_path / "run.sqlite"
    _fill(path, _true)
    res = pq.compare("alexnet", str(path), str(path), batch=8, layers=["conv5"])
    assert len(res["kernels"]) == 3
    for r in res["kernels"]:
        assert r["predicted"] == pytest.approx(r["at_reference"]) == pytest.approx(r["reference"])
        assert r["plan"] == r["reference_plan"] == [[2, "a"]] * 4  # 2 x 32 MiB fits 64 MiB
        assert r["unpriced"] == 0
    assert res["total"]["unpriced"] == 0


def test_a_biased_run_is_priced_at_the_reference(pq, tmp_path):
    """The tested run measured "a" 10x too slow at size 2 (a cold GPU, say),
    so it chose 8 x 1 of "a"; priced at the reference's times, its plan costs
    what the reference says, and the reference's own plan is cheaper."""
    tested, ref = tmp_path / "tested.sqlite", tmp_path / "ref.sqlite"
    _fill(tested, lambda s, a: 10 * _true(s, a) if (a, s) == ("a", 2) else _true(s, a))
    _fill(ref, _true)
    res = pq.compare("alexnet", str(tested), str(ref), batch=8, layers=["conv5"])
    for r in res["kernels"]:
        assert r["reference_plan"] == [[2, "a"]] * 4 and r["reference"] == pytest.approx(1.0)
        assert r["plan"] == [[1, "a"]] * 8
        # its own belief and the reference's price of the same plan
        assert r["at_reference"] == pytest.approx(1.2) == pytest.approx(r["predicted"])
        assert r["at_reference"] > r["reference"]
    t = res["total"]
    assert t["at_reference"] > t["reference"]
    assert pq._table(res).splitlines()[-1].startswith("| total |")


def test_micro_batches_the_reference_lacks_are_counted(pq, tmp_path):
    tested, ref = tmp_path / "tested.sqlite", tmp_path / "ref.sqlite"
    _fill(tested, _true)
    _fill(ref, lambda s, a: None if a == "a" else _true(s, a))  # the reference never ran "a"
    res = pq.compare("alexnet", str(tested), str(ref), batch=8, layers=["conv5"])
    assert res["total"]["unpriced"] == 3 * 4  # three kernels, four micro-batches of "a" each
    for r in res["kernels"]:
        assert r["at_reference"] == pytest.approx(r["predicted"])  # priced at its own times


def test_the_precision_picks_the_problems_the_run_measured(pq, tmp_path):
    """A float32 channels-last run (tools/frontier.py's "fp32cl") is priced on
    its NHWC problems; read as fp32 NCHW it has no entries for them."""
    path = tmp_path / "cl.sqlite"
    spec = pq.PRECISIONS["fp32cl"]
    _fill(path, _true, dtype=spec["dtype"], layout=spec["layout"], math=spec["math"])
    res = pq.compare("alexnet", str(path), str(path), batch=8, layers=["conv5"],
                     precision="fp32cl")
    assert res["precision"] == "fp32cl"
    assert all(r["plan"] == [[2, "a"]] * 4 for r in res["kernels"])
    with pytest.raises(CacheMissError, match="NCHW"):
        pq.compare("alexnet", str(path), str(path), batch=8, layers=["conv5"])
