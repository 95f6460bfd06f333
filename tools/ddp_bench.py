#!/usr/bin/env python
"""Data-parallel training with mucudnn.torch: DDP, shared plans, throughput (issue: many GPUs).

Launched with torchrun, one process per GPU (or per CPU worker with
``--device cpu``, gloo and the NumPy backend: a smoke test)::

    torchrun --nproc-per-node 2 tools/ddp_bench.py --model resnet50 --batch 256 --json out/ddp.json
    python -m torch.distributed.run --nproc-per-node 2 tools/ddp_bench.py --device cpu --model tiny

On two GPUs set ``NCCL_NVLS_ENABLE=0`` (and the other multicast switches the
machine notes name) in the environment torchrun starts the workers with.
``--batch`` is the global batch (each rank trains ``batch / world``). Every
rank builds the same model from one seed and draws the same global batch, of
which it takes its slice. The phases, in order:

1. ``cold``: the converted model's plans from an empty benchmark cache, each
   rank alone (every rank benchmarks every kernel) and then shared
   (:func:`mucudnn.torch.share_plans`, the kernels spread over the ranks,
   each with a fresh cache again): seconds from a barrier to a barrier.
2. ``gradients``: one DDP step of the converted model (plans from the shared
   phase) in strict fp32 (TF32 off), BatchNorm in eval mode (its statistics
   would otherwise be per rank), against one process's native step over the
   whole global batch on rank 0: the largest relative difference of any
   parameter's gradient (norm of the difference over the norm).
3. ``throughput``: median step time of native DDP (``cudnn.benchmark``) and of
   converted DDP, ``--steps`` steps after ``--warmup``, and of the converted
   model on rank 0 alone at the per-rank batch (no DDP): global images/s and
   the scaling ``DDP images/s / one-GPU images/s``.

Rank 0 prints a summary last and writes everything to ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


import mucudnn.torch as mt
from mucudnn.caches import clear_all
from train_bench import MODELS
from train_steps import IMAGE_SIZE, NUM_CLASSES, build_model


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=MODELS, default="resnet50")
    ap.add_argument("--batch", type=int, default=None,
                    help="global batch (default: 256 on GPUs, 8 on the CPU)")
    ap.add_argument("--precision", choices=("fp32", "amp"), default="fp32",
                    help="throughput phase: fp32 (TF32 allowed) or AMP bfloat16 channels-last")
    ap.add_argument("--workspace", type=int, default=64 << 20, help="bytes per kernel")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--phases", nargs="+", choices=("cold", "gradients", "throughput"),
                    default=["cold", "gradients", "throughput"])
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fresh_cache(tmp: str, name: str) -> None:
    """An empty benchmark cache from here on (and no plan remembered)."""
    os.environ["MUCUDNN_CACHE"] = os.path.join(tmp, name)
    mt.clear(backends=False)
    clear_all()


def _global_batch(batch: int, size: int, device: torch.device, seed: int = 1
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, size, size, generator=g)
    t = torch.randint(0, NUM_CLASSES, (batch,), generator=g)
    return x.to(device), t.to(device)


def _model(name: str, device: torch.device, converted: bool, limit: int,
           channels_last: bool = False) -> nn.Module:
    torch.manual_seed(0)
    m = build_model(name).to(device)
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
    if converted:
        mt.convert(m, workspace_limit=limit)
    return m


def _timed(device: torch.device, fn: Callable[..., Any], *args: Any, **kw: Any
           ) -> tuple[float, Any]:
    """``fn(*args, **kw)`` timed from a barrier to a barrier: (seconds, its result)."""
    dist.barrier()
    _sync(device)
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    _sync(device)
    dist.barrier()
    return time.perf_counter() - t0, out


def phase_cold(a: argparse.Namespace, device: torch.device, x: torch.Tensor, tmp: str,
               rank: int, world: int) -> dict:
    alone_groups = [dist.new_group([r]) for r in range(world)]
    out: dict[str, Any] = {}
    for how in ("alone", "shared"):
        _fresh_cache(tmp, f"cold-{how}-{rank}.sqlite")
        m = _model(a.model, device, True, a.workspace)
        group = alone_groups[rank] if how == "alone" else None
        out[f"{how}_s"], shared = _timed(device, mt.share_plans, m, x, group=group)
        out[f"{how}_measured"] = len(shared.measured_here)
        out["kernels"] = shared.kernels
    return out


def phase_gradients(a: argparse.Namespace, device: torch.device, x: torch.Tensor,
                    t: torch.Tensor, local: slice, rank: int) -> dict:
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        m = _model(a.model, device, True, a.workspace).eval()  # eval: BatchNorm's running stats
        mt.share_plans(m, x[local])
        ddp = DDP(m, device_ids=[device.index] if device.type == "cuda" else None)
        F.cross_entropy(ddp(x[local]), t[local]).backward()
        grads = [p.grad.detach().double() for p in m.parameters()]
        worst = 0.0
        if rank == 0:
            ref = _model(a.model, device, False, a.workspace).eval()
            F.cross_entropy(ref(x), t).backward()
            for g, p in zip(grads, ref.parameters()):
                r = p.grad.detach().double()
                worst = max(worst, float((g - r).norm() / max(float(r.norm()), 1e-30)))
        return {"max_rel_grad_diff": worst, "tf32": False}
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


def _step_ms(model: nn.Module, x: torch.Tensor, t: torch.Tensor, a: argparse.Namespace,
             device: torch.device) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    amp = a.precision == "amp"
    ts = []
    for i in range(a.warmup + a.steps):
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), t)
        loss.backward()
        opt.step()
        _sync(device)
        if i >= a.warmup:
            ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def phase_throughput(a: argparse.Namespace, device: torch.device, x: torch.Tensor,
                     t: torch.Tensor, local: slice, rank: int, world: int) -> dict:
    torch.backends.cudnn.benchmark = True
    cl = a.precision == "amp"
    xl = x[local].contiguous(memory_format=torch.channels_last) if cl else x[local]
    out: dict[str, Any] = {}
    for mode in ("native", "converted"):
        m = _model(a.model, device, mode == "converted", a.workspace, cl)
        if mode == "converted":
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cl):
                mt.share_plans(m, xl)
        ddp = DDP(m, device_ids=[device.index] if device.type == "cuda" else None)
        dist.barrier()
        ms = _step_ms(ddp, xl, t[local], a, device)
        out[f"{mode}_ddp_ms"] = ms
        out[f"{mode}_ddp_images_per_s"] = x.shape[0] / (ms / 1e3)
        del ddp, m
    dist.barrier()
    if rank == 0:  # the converted model alone on one device, at the per-rank batch
        m = _model(a.model, device, True, a.workspace, cl)
        ms = _step_ms(m, xl, t[local], a, device)
        out["converted_one_ms"] = ms
        out["converted_one_images_per_s"] = xl.shape[0] / (ms / 1e3)
        out["scaling"] = out["converted_ddp_images_per_s"] / out["converted_one_images_per_s"]
        out["converted_vs_native_ddp"] = out["converted_ddp_ms"] / out["native_ddp_ms"] - 1
    dist.barrier()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    cuda = a.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    batch = a.batch or (256 if cuda else 8)
    if batch % world:
        raise SystemExit(f"--batch: {batch} is not divisible by the {world} ranks")
    per = batch // world
    local = slice(rank * per, (rank + 1) * per)
    x, t = _global_batch(batch, IMAGE_SIZE.get(a.model, 224), device)
    res: dict[str, Any] = {"model": a.model, "batch": batch, "world": world,
                           "precision": a.precision, "device": torch.cuda.get_device_name(device)
                           if cuda else "cpu", "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        # every rank needs the same folder name only for its own files
        if "cold" in a.phases:
            res["cold"] = phase_cold(a, device, x[local], tmp, rank, world)
        _fresh_cache(tmp, f"run-{rank}.sqlite")
        if "gradients" in a.phases:
            res["gradients"] = phase_gradients(a, device, x, t, local, rank)
        if "throughput" in a.phases:
            res["throughput"] = phase_throughput(a, device, x, t, local, rank, world)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, res)
    if rank == 0:
        summary = {"ranks": everyone}
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as f:
                json.dump(summary, f, indent=1)
        r = everyone[0]
        print(f"ddp {a.model} batch {batch} on {world} x {r['device']}", flush=True)
        if "cold" in r:
            c = r["cold"]
            print(f"  cold plans: alone {c['alone_s']:.1f} s, shared {c['shared_s']:.1f} s "
                  f"({c['shared_s'] / c['alone_s']:.2f}x); kernels measured per rank: "
                  f"{[e['cold']['shared_measured'] for e in everyone]} of {c['kernels']}")
        if "gradients" in r:
            print(f"  gradients vs one process over the global batch (fp32, TF32 off): max "
                  f"relative difference {r['gradients']['max_rel_grad_diff']:.2e}")
        if "throughput" in r:
            tp = r["throughput"]
            print(f"  {a.precision}: native DDP {tp['native_ddp_ms']:.2f} ms, converted DDP "
                  f"{tp['converted_ddp_ms']:.2f} ms ({tp['converted_vs_native_ddp']:+.1%}); "
                  f"{tp['converted_ddp_images_per_s']:.0f} img/s, "
                  f"{tp['scaling']:.2f}x one device's {tp['converted_one_images_per_s']:.0f}",
                  flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
