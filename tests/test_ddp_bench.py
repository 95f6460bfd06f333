"""tools/ddp_bench.py on the CPU: two gloo ranks under torchrun (``--standalone``),
the NumPy backend, the tiny model: shared cold plans split the kernels, DDP
gradients equal one process's over the global batch, throughput is reported."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="tools/ddp_bench.py needs PyTorch")

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "ddp_bench.py"


@pytest.mark.slow
def test_two_ranks_on_the_cpu(tmp_path):
    out = tmp_path / "ddp.json"
    env = dict(os.environ, MUCUDNN_BACKEND="numpy", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(TOOL), "--device", "cpu", "--model", "tiny",
                        "--steps", "1", "--warmup", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "gradients vs one process" in r.stdout
    ranks = json.loads(out.read_text())["ranks"]
    assert len(ranks) == 2 and all(x["world"] == 2 and x["batch"] == 8 for x in ranks)
    cold = [x["cold"] for x in ranks]
    kernels = cold[0]["kernels"]
    assert kernels == 9                                     # 3 distinct convs x 3 directions
    assert all(c["alone_measured"] == kernels for c in cold)    # alone: every rank all of them
    assert sum(c["shared_measured"] for c in cold) == kernels   # shared: each once in the group
    assert all(c["shared_measured"] > 0 for c in cold)
    assert ranks[0]["gradients"]["max_rel_grad_diff"] < 1e-5
    tp = ranks[0]["throughput"]
    for key in ("native_ddp_ms", "converted_ddp_ms", "converted_one_ms", "scaling"):
        assert tp[key] > 0
