"""Rank functions for tests/test_torch_distributed.py, in a module of their own
so that the processes torch.multiprocessing spawns import them by name.

Each rank joins a gloo group through a file in ``tmp``, uses its own benchmark
cache (``cache<rank>.sqlite``: as on separate hosts), converts a small CNN
and calls :func:`mucudnn.torch.share_plans`; what it saw is written to
``rank<rank>.json`` for the test to read.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

SMALL_LIMIT = 1 << 16


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, stride=2, bias=False), nn.ReLU(),
                         nn.Conv2d(8, 4, 1), nn.Flatten())


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 3, 12, 12, generator=g), torch.randn(8, 4 * 5 * 5, generator=g)


def run_rank(rank: int, world: int, tmp: str, case: str) -> None:
    os.environ["MUCUDNN_CACHE"] = os.path.join(tmp, f"cache{rank}.sqlite")
    import mucudnn.torch as mt
    from mucudnn.backends import NumpyBackend
    from mucudnn.optimizer.cache import default_cache

    class OtherCpu(NumpyBackend):
        def __init__(self) -> None:
            super().__init__()
            self.device_name = "another CPU"

    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank,
                            world_size=world)
    out: dict = {}
    try:
        net = model()
        backend = OtherCpu() if case == "mismatch" and rank == 1 else None
        mt.convert(net, workspace_limit=SMALL_LIMIT, backend=backend)
        x, target = batch()
        if case == "shapes" and rank == 1:
            x = x[:4]  # another batch size: other problems
        found: list[str] = []   # the kernels this rank ran Find for, at the full batch
        real = NumpyBackend.find

        def logged(self, problem, direction, *a, **k):
            found.append(f"{problem.with_batch(x.shape[0]).key()} {direction.value}")
            return real(self, problem, direction, *a, **k)

        NumpyBackend.find = logged  # type: ignore[method-assign]
        try:
            r = mt.share_plans(net, x, src=0 if case == "src" else None)
        except mt.TorchBridgeError as exc:
            out["error"] = str(exc)
            return
        finally:
            NumpyBackend.find = real  # type: ignore[method-assign]
            out["found"] = sorted(set(found))
        out.update(kernels=r.kernels, measured=list(r.measured_here), plans=r.plans,
                   received=r.entries_received)
        # a training step now benchmarks nothing: every plan was made above
        finds = []

        def counted(self, *a, **k):
            finds.append(1)
            return real(self, *a, **k)

        NumpyBackend.find = counted  # type: ignore[method-assign]
        entries = len(default_cache())
        loss = F.mse_loss(net(x), target)
        loss.backward()
        NumpyBackend.find = real  # type: ignore[method-assign]
        out.update(finds=len(finds), new_entries=len(default_cache()) - entries,
                   loss=float(loss.detach()), grad=[float(p.grad.double().sum()) for p in net.parameters()])
        ref = model()
        ref_loss = F.mse_loss(ref(x), target)
        ref_loss.backward()
        out.update(ref_loss=float(ref_loss.detach()),
                   ref_grad=[float(p.grad.double().sum()) for p in ref.parameters()])
    finally:
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
        dist.destroy_process_group()
