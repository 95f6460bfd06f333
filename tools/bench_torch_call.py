#!/usr/bin/env python
"""Host cost of mucudnn.torch against native PyTorch convolutions, and where a
converted step's time goes (issue: mucudnn.torch).

One run measures, on the user's path (``nn.Conv2d`` vs ``mucudnn.torch.Conv2d``,
autograd forward + backward):

1. ``layer``: host microseconds per conv step (forward and ``y.backward(g)``)
   on a small layer (x 2x64x14x14, w 64x64x3x3, padding 1), so that the GPU is
   never the limit: median of single steps, the device synchronised only
   between batches of 50 (outside the timing). fp32 NCHW and bf16 autocast
   channels-last, with and without bias.
2. ``profile``: cProfile of the converted bf16 channels-last step (top
   functions by own time) written to ``--out``.
3. ``model``: a whole training step (forward, backward, SGD) of torchvision
   models at a small batch, where the host is the limit: median wall time per
   step with a sync after each, native vs converted (64 MiB per kernel).
4. ``mprofile``: cProfile of ten such steps (AMP), native and converted,
   written to ``--out``.
5. ``kernels``: torch.profiler over three training steps of a model at its
   training batch, native vs converted: device time per kernel name, the top
   rows and the total (to find time spent outside the plans' kernels).

    PYTHONPATH=$PWD python3 tools/bench_torch_call.py --out $OUT/torchcall \
        --parts layer profile model kernels --json $OUT/torchcall.json

Needs a GPU and torch (torchvision for ``model`` and ``kernels``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mucudnn.torch as mt  # noqa: E402
from bench_call_overhead import host_us  # noqa: E402  (tools/, beside this script)

PARTS = ("layer", "profile", "model", "mprofile", "kernels")


def _layer_step(precision: str, converted: bool, bias: bool) -> Callable[[], None]:
    dev = torch.device("cuda")
    cls = mt.Conv2d if converted else nn.Conv2d
    conv = cls(64, 64, 3, padding=1, bias=bias).to(dev)
    x = torch.randn(2, 64, 14, 14, device=dev, requires_grad=True)
    amp = precision == "amp"
    if amp:
        conv = conv.to(memory_format=torch.channels_last)
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    dt = torch.bfloat16 if amp else torch.float32
    g = torch.randn(2, 64, 14, 14, device=dev, dtype=dt)
    if amp:
        g = g.to(memory_format=torch.channels_last)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            y = conv(x)
        y.backward(g)
    return step


def part_layer(res: dict) -> None:
    torch.backends.cudnn.benchmark = True
    rows = []
    for precision in ("fp32", "amp"):
        for bias in (False, True):
            row = {"precision": precision, "bias": bias}
            for converted in (False, True):
                row["mucudnn" if converted else "native"] = host_us(
                    _layer_step(precision, converted, bias))
            row["extra_us"] = row["mucudnn"] - row["native"]
            rows.append(row)
            print(f"layer {precision:5s} bias={bias!s:5s}: native {row['native']:.1f} us, "
                  f"mucudnn {row['mucudnn']:.1f} us per conv fwd+bwd "
                  f"(+{row['extra_us']:.1f})", flush=True)
    res["layer"] = rows


def _profiled(step: Callable[[], None], n: int, rows: int) -> str:
    """cProfile of ``n`` calls of ``step`` (the device synchronised inside the
    profile), the top ``rows`` functions by own time, then mucudnn's own
    functions by cumulative time (where a call's host time goes, callees included)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(rows)
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats("mucudnn", rows)
    return s.getvalue()


def part_profile(res: dict, out: str) -> None:
    for precision in ("amp", "fp32"):
        step = _layer_step(precision, True, False)
        for _ in range(50):
            step()
        torch.cuda.synchronize()
        text = _profiled(step, 2000, 45)
        path = os.path.join(out, f"profile-{precision}.txt")
        with open(path, "w") as f:
            f.write(text)
        print(f"profile {precision}: {path}", flush=True)
    res["profile"] = "see profile-*.txt"


def _model(name: str, amp: bool, converted: bool, batch: int) -> tuple[Callable, nn.Module]:
    import torchvision  # noqa: PLC0415 - optional, only these parts need it
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).to(dev)
    fmt = torch.channels_last if amp else torch.contiguous_format
    if amp:
        model = model.to(memory_format=fmt)
    if converted:
        mt.convert(model, workspace_limit=64 << 20)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device=dev).to(memory_format=fmt)
    t = torch.randint(0, 1000, (batch,), device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), t)
        loss.backward()
        opt.step()
    return step, model


def part_model(res: dict, models: Sequence[str], batch: int,
               precisions: Sequence[str]) -> None:
    torch.backends.cudnn.benchmark = True
    rows = []
    for name in models:
        for precision in precisions:
            row: dict[str, Any] = {"model": name, "precision": precision, "batch": batch}
            for converted in (False, True):
                step, model = _model(name, precision == "amp", converted, batch)
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
                ts, enq = [], []
                for _ in range(20):
                    t0 = time.perf_counter()
                    step()
                    t1 = time.perf_counter()
                    torch.cuda.synchronize()
                    ts.append(time.perf_counter() - t0)
                    enq.append(t1 - t0)
                key = "mucudnn" if converted else "native"
                row[key + "_ms"] = statistics.median(ts) * 1e3
                row[key + "_enqueue_ms"] = statistics.median(enq) * 1e3
                convs = sum(1 for m in model.modules() if isinstance(m, nn.Conv2d))
                row["convs"] = convs
                del step, model
                mt.clear()
                torch.cuda.empty_cache()
            row["extra_us_per_conv"] = (row["mucudnn_ms"] - row["native_ms"]) * 1e3 / row["convs"]
            rows.append(row)
            print(f"model {name} {precision} batch {batch}: native {row['native_ms']:.2f} ms "
                  f"(enqueue {row['native_enqueue_ms']:.2f}), mucudnn {row['mucudnn_ms']:.2f} ms "
                  f"(enqueue {row['mucudnn_enqueue_ms']:.2f}); "
                  f"+{row['extra_us_per_conv']:.0f} us per conv", flush=True)
    res["model"] = rows


def part_mprofile(res: dict, out: str, models: Sequence[str], batch: int) -> None:
    """cProfile of converted training steps (AMP) at the small batch, native beside it."""
    torch.backends.cudnn.benchmark = True
    for name in models:
        for converted in (False, True):
            step, model = _model(name, True, converted, batch)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            text = _profiled(step, 10, 50)
            key = "mucudnn" if converted else "native"
            with open(os.path.join(out, f"mprofile-{name}-{key}.txt"), "w") as f:
                f.write(text)
            print(f"mprofile {name} {key}: " + text.strip().splitlines()[0], flush=True)
            del step, model
            mt.clear()
            torch.cuda.empty_cache()
    res["mprofile"] = "see mprofile-*.txt"


def part_kernels(res: dict, out: str, name: str, batch: int) -> None:
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415
    torch.backends.cudnn.benchmark = True
    rows = {}
    for converted in (False, True):
        step, model = _model(name, True, converted, batch)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        key = "mucudnn" if converted else "native"
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40,
                                          max_name_column_width=90)
        with open(os.path.join(out, f"kernels-{name}-{key}.txt"), "w") as f:
            f.write(table)
        cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40,
                                        max_name_column_width=60)
        with open(os.path.join(out, f"host-{name}-{key}.txt"), "w") as f:
            f.write(cpu)
        evs = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        total = sum(e.self_device_time_total for e in evs) / 3 / 1e3
        top = sorted(evs, key=lambda e: -e.self_device_time_total)[:12]
        rows[key] = {"device_ms_per_step": total,
                     "top": [(e.key[:90], e.count // 3, e.self_device_time_total / 3 / 1e3)
                             for e in top]}
        print(f"kernels {name} amp {key}: {total:.2f} device ms per step", flush=True)
        for k, c, ms in rows[key]["top"]:
            print(f"   {ms:7.3f} ms  x{c:<4d} {k}", flush=True)
        del step, model
        mt.clear()
        torch.cuda.empty_cache()
    res["kernels"] = rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--models", nargs="+", default=["resnet50", "resnet18"])
    ap.add_argument("--model-batch", type=int, default=8)
    ap.add_argument("--model-precisions", nargs="+", choices=("amp", "fp32"), default=["amp"])
    ap.add_argument("--kernels-model", default="alexnet")
    ap.add_argument("--kernels-batch", type=int, default=256)
    ap.add_argument("--out", default="out/torchcall")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    res: dict[str, Any] = {"torch": torch.__version__,
                           "device": torch.cuda.get_device_name()}
    for part in args.parts:
        if part == "layer":
            part_layer(res)
        elif part == "profile":
            part_profile(res, args.out)
        elif part == "model":
            part_model(res, args.models, args.model_batch, args.model_precisions)
        elif part == "mprofile":
            part_mprofile(res, args.out, args.models, args.model_batch)
        else:
            part_kernels(res, args.out, args.kernels_model, args.kernels_batch)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
