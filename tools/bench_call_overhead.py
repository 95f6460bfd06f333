"""Host cost of a warm call through the public API, and whole sequences through Convolution
against the same plans' kernels (issue: the call path).

One run prints, with every number measured in it:

1. host microseconds per warm call (median of single calls, no host sync inside a
   batch of calls) for forward, backward-data and backward-filter with torch
   tensors (output given and allocated), CuPy arrays and DeviceArrays, graph=False
   and graph=True, beside torch's own F.conv2d / convolution_backward;
2. the same for plans of 1, 2, 4 and 8 micro-batches (the cost of each further one);
3. the five-layer set (DenseNet 3x3 128->32 at 56x56 and 28x28, 1x1 256->128 at 56x56
   at batch 64; AlexNet-like 5x5 96->256 at 27x27 and 3x3 192->384 at 13x13 at batch
   128), fwd+bwd at 64 MiB through Convolution with torch tensors, against the sum of
   its plans' kernels timed alone;
4. AlexNet (256) and ResNet-18 (128) at 64 MiB, every layer fwd+bwd, through
   Convolution with torch tensors, against ``mucudnn bench``'s executed total
   (run_network) in the same process, with the same plans;
5. ``layer``: host microseconds per conv step (forward and ``y.backward(g)``) of
   ``nn.Conv2d`` and ``mucudnn.torch.Conv2d`` on a small layer (x 2x64x14x14, w
   64x64x3x3), fp32 NCHW and bf16 autocast channels-last, with and without bias.

    PYTHONPATH=$PWD python3 tools/bench_call_overhead.py --json out.json

Needs a GPU, torch; CuPy optional. Point MUCUDNN_CACHE at a warm cache to skip cold
benchmarking (tests/data/h200-benchmark-cache.sqlite.gz holds the H200's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import mucudnn as mu
import mucudnn.torch as mt
from mucudnn import ConvProblem, Direction, MicroBatch
from mucudnn.backends import ConvTensors, get_backend
from mucudnn.bench import make_timer, run_network
from mucudnn.cuda import DeviceArray
from mucudnn.exec import prepare
from mucudnn.networks import select
from mucudnn.problem import make_plan

DIRS = (Direction.FORWARD, Direction.BACKWARD_DATA, Direction.BACKWARD_FILTER)
MiB = 1 << 20


def host_us(fn: Callable[[], Any], n: int = 600, every: int = 50) -> float:
    """Median host time of one ``fn()`` call in microseconds; the device is
    synchronised only between batches of ``every`` calls (outside the timing)."""
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        if (i + 1) % every == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def gpu_ms(fn: Callable[[], Any], iters: int = 15, warmup: int = 3) -> float:
    """Median device time of ``fn()`` (torch's current stream, CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def _calls(conv: mu.Convolution, t: dict[str, Any], out: bool) -> dict[Direction, Callable]:
    x, w, dy, y, dx, dw = (t[k] for k in ("x", "w", "dy", "y", "dx", "dw"))
    if out:
        return {Direction.FORWARD: lambda: conv.forward(x, w, y),
                Direction.BACKWARD_DATA: lambda: conv.backward_data(dy, w, dx),
                Direction.BACKWARD_FILTER: lambda: conv.backward_filter(x, dy, dw)}
    return {Direction.FORWARD: lambda: conv.forward(x, w),
            Direction.BACKWARD_DATA: lambda: conv.backward_data(dy, w),
            Direction.BACKWARD_FILTER: lambda: conv.backward_filter(x, dy)}


def _torch_set(p: ConvProblem) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda s: torch.randn(s, device="cuda", generator=g)  # noqa: E731
    return {"x": r(p.x_shape), "w": r(p.w_shape), "dy": r(p.output_shape),
            "y": torch.empty(p.output_shape, device="cuda"),
            "dx": torch.empty(p.x_shape, device="cuda"),
            "dw": torch.empty(p.w_shape, device="cuda")}


def _convert(t: dict[str, Any], kind: str) -> dict[str, Any]:
    if kind == "torch":
        return t
    if kind == "cupy":
        import cupy
        return {k: cupy.asarray(v) for k, v in t.items()}
    return {k: DeviceArray.from_numpy(v.cpu().numpy()) for k, v in t.items()}


def section_host(be: Any, p: ConvProblem, rows: list, out: dict) -> None:
    """1: host us per warm call, per kind, graph mode and direction; torch's own beside."""
    base = _torch_set(p)
    kinds = ["torch", "devicearray"]
    try:
        import cupy  # noqa: F401
        kinds.insert(1, "cupy")
    except Exception as exc:  # CuPy missing or broken: say so, measure the rest
        print(f"note: CuPy unavailable ({exc})", flush=True)
    one = {}
    for d in DIRS:
        plan = mu.optimize(p, d, 64 * MiB, "undivided", be)
        one[d] = make_plan(plan.micro_batches, undivided_time_ms=plan.time_ms,
                           workspace_limit=None)
    for kind in kinds:
        t = _convert(base, kind)
        for graph in (False, True):
            conv = mu.Convolution(p.x_shape, p.w_shape, padding=p.padding, backend=be,
                                  graph=graph, plans=one)
            variants = [("out given", True)] + ([("out allocated", False)]
                                                 if kind == "torch" else [])
            for label, given in variants:
                for d, fn in _calls(conv, t, given).items():
                    us = host_us(fn)
                    rows.append(("host", f"{kind} graph={graph} {label}", d.value, f"{us:.1f} us"))
                    out.setdefault("host_us", []).append(
                        {"kind": kind, "graph": graph, "output": label, "direction": d.value,
                         "us": us})
    x, w, dy = base["x"], base["w"], base["dy"]
    torch.backends.cudnn.benchmark = True
    pad = p.padding
    torch_fns = {
        "forward": lambda: F.conv2d(x, w, padding=pad),
        "backward_data": lambda: torch.ops.aten.convolution_backward(
            dy, x, w, None, [1, 1], list(pad), [1, 1], False, [0, 0], 1, [True, False, False]),
        "backward_filter": lambda: torch.ops.aten.convolution_backward(
            dy, x, w, None, [1, 1], list(pad), [1, 1], False, [0, 0], 1, [False, True, False]),
    }
    for d, fn in torch_fns.items():
        us = host_us(fn)
        rows.append(("host", "torch F.conv2d / convolution_backward", d, f"{us:.1f} us"))
        out.setdefault("host_us", []).append({"kind": "pytorch", "direction": d, "us": us})


def section_micro_batches(be: Any, p: ConvProblem, rows: list, out: dict) -> None:
    """2: host us per warm call for plans of 1, 2, 4, 8 micro-batches (torch, out given)."""
    t = _torch_set(p)
    n = p.batch
    for graph in (False, True):
        for d in DIRS:
            res = {}
            for parts in (1, 2, 4, 8):
                size = n // parts
                perf = mu.benchmark(be, p.with_batch(size), d, "undivided", 64 * MiB)
                a = min(perf[size], key=lambda e: e.time_ms)
                mbs = [MicroBatch(i * size, size, a.algo, a.math_type) for i in range(parts)]
                plan = make_plan(mbs, undivided_time_ms=1, workspace_limit=None)
                conv = mu.Convolution(p.x_shape, p.w_shape, padding=p.padding, backend=be,
                                      graph=graph, plans={d: plan})
                res[parts] = host_us(_calls(conv, t, True)[d])
            inc = (res[8] - res[1]) / 7
            rows.append(("micro-batches", f"graph={graph}", d.value,
                         " ".join(f"{k}:{v:.1f}" for k, v in res.items())
                         + f" us (+{inc:.1f} us each)"))
            out.setdefault("micro_batches", []).append(
                {"graph": graph, "direction": d.value, "us": res, "per_extra_us": inc})


FIVE = [
    ("densenet 3x3 128->32 56x56", (64, 128, 56, 56), (32, 128, 3, 3), 1),
    ("densenet 3x3 128->32 28x28", (64, 128, 28, 28), (32, 128, 3, 3), 1),
    ("densenet 1x1 256->128 56x56", (64, 256, 56, 56), (128, 256, 1, 1), 0),
    ("alexnet 5x5 96->256 27x27", (128, 96, 27, 27), (256, 96, 5, 5), 2),
    ("alexnet 3x3 192->384 13x13", (128, 192, 13, 13), (384, 192, 3, 3), 1),
]


def _sequence(layers: list[tuple[mu.Convolution, dict[str, Any]]]) -> Callable[[], None]:
    """fwd + bwd-data + bwd-filter of every layer in order, outputs allocated per call."""
    def run() -> None:
        for conv, t in layers:
            conv.forward(t["x"], t["w"])
            conv.backward_data(t["dy"], t["w"])
            conv.backward_filter(t["x"], t["dy"])
    return run


def _kernel_sum(be: Any, convs: list[tuple[mu.Convolution, int]], repeat: int) -> float:
    """The plans of ``convs`` (each weighted by its count) timed alone, bound once."""
    timer = make_timer(be)
    total = 0.0
    for conv, count in convs:
        p = conv.problem
        data = ConvTensors(p, be.from_host(np.random.standard_normal(p.x_shape).astype(np.float32)),
                           be.from_host(np.random.standard_normal(p.w_shape).astype(np.float32)),
                           be.from_host(np.random.standard_normal(p.output_shape).astype(np.float32)))
        for d in DIRS:
            plan = conv.plans[d]
            ws = be.alloc_workspace(max(plan.workspace_bytes, 1))
            with be.on_home_stream():
                launch = prepare(plan, be, data, 1.0, 0.0, ws, direction=d)
                total += count * timer(launch, 3, repeat)
            ws.close()
        for a in (data.x, data.w, data.y):
            a.close()
    return total


def section_five(be: Any, rows: list, out: dict) -> None:
    """3: the five-layer set through Convolution against its plans' kernel sum."""
    layers = []
    for _name, xs, wsh, pad in FIVE:
        p = ConvProblem(xs, wsh, padding=pad)
        conv = mu.Convolution(xs, wsh, padding=pad, backend=be, workspace_limit=64 * MiB)
        layers.append((conv, _torch_set(p)))
    run = _sequence(layers)
    run()  # plan every direction
    through = gpu_ms(run, iters=20)
    alone = _kernel_sum(be, [(c, 1) for c, _ in layers], repeat=20)
    gap = through / alone - 1
    rows.append(("five layers", "through Convolution vs kernel sum", "fwd+bwd",
                 f"{through:.3f} vs {alone:.3f} ms ({100 * gap:+.1f}%)"))
    out["five_layers"] = {"through_ms": through, "kernel_sum_ms": alone, "gap": gap}


def section_network(be: Any, net: str, batch: int, rows: list, out: dict) -> None:
    """4: a whole network through Convolution against bench's executed total."""
    r = run_network(net, batch, workspace_limit=64 * MiB, policy="powerOfTwo", backend=be,
                    repeat=10, warmup=3, progress=False, time_alone=False)
    bench_total = r.total("micro_ms")
    convs: dict[ConvProblem, mu.Convolution] = {}
    layers = []
    for layer in select(net, None):
        p = layer.problem(batch)
        if p not in convs:
            convs[p] = mu.Convolution(p.x_shape, p.w_shape, stride=p.stride, padding=p.padding,
                                      dilation=p.dilation, groups=p.groups, backend=be,
                                      workspace_limit=64 * MiB)
        layers.append((convs[p], _torch_set(p)))
    run = _sequence(layers)
    run()
    same = sum(1 for k in r.kernels if convs[k.problem].plans[k.direction].micro_batches
               == k.plan.micro_batches)
    through = gpu_ms(run, iters=10)
    gap = through / bench_total - 1
    rows.append((f"{net} ({batch})", "through Convolution vs bench", "fwd+bwd",
                 f"{through:.2f} vs {bench_total:.2f} ms ({100 * gap:+.1f}%); "
                 f"{same}/{len(r.kernels)} kernels with identical plans"))
    out.setdefault("networks", []).append(
        {"net": net, "batch": batch, "through_ms": through, "bench_ms": bench_total,
         "gap": gap, "same_plans": same, "kernels": len(r.kernels)})
    del layers, convs
    torch.cuda.empty_cache()


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


def section_layer(rows: list, out: dict) -> None:
    """mucudnn.torch's host cost per conv step against nn.Conv2d's (section 5)."""
    torch.backends.cudnn.benchmark = True
    res = []
    for precision in ("fp32", "amp"):
        for bias in (False, True):
            row: dict[str, Any] = {"precision": precision, "bias": bias}
            for converted in (False, True):
                row["mucudnn" if converted else "native"] = host_us(
                    _layer_step(precision, converted, bias))
            row["extra_us"] = row["mucudnn"] - row["native"]
            res.append(row)
            rows.append(("layer", f"{precision} bias={bias}", f"native {row['native']:.1f} us",
                         f"mucudnn.torch {row['mucudnn']:.1f} us (+{row['extra_us']:.1f})"))
    out["layer"] = res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="cudnn-graph")
    ap.add_argument("--sections", default="host,micro,five,nets,layer",
                    help="comma-separated: host, micro, five, nets, layer")
    ap.add_argument("--nets", default="alexnet:256,resnet18:128")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.backends.cudnn.allow_tf32 = True  # as mucudnn's default math does
    be = get_backend(args.backend)
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "device": be.device_name,
                           "cudnn": be.version, "backend": be.name, "torch": torch.__version__}
    rows: list[tuple[str, str, str, str]] = []
    small = ConvProblem((8, 64, 14, 14), (64, 64, 3, 3), padding=1)
    sections = set(args.sections.split(","))
    steps: list[tuple[str, Callable[[], None]]] = []
    if "host" in sections:
        steps.append(("host", lambda: section_host(be, small, rows, out)))
    if "micro" in sections:
        steps.append(("micro", lambda: section_micro_batches(be, small, rows, out)))
    if "five" in sections:
        steps.append(("five", lambda: section_five(be, rows, out)))
    if "nets" in sections:
        for item in args.nets.split(","):
            net, batch = item.split(":")
            steps.append((net, lambda net=net, batch=int(batch):
                          section_network(be, net, batch, rows, out)))
    if "layer" in sections:
        steps.append(("layer", lambda: section_layer(rows, out)))
    for name, step in steps:
        t0 = time.perf_counter()
        try:
            step()
        except Exception as exc:  # report and go on: one call on the device, every number
            rows.append((name, "FAILED", "", f"{type(exc).__name__}: {exc}"))
            out.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
        print(f"[{name}] {time.perf_counter() - t0:.1f} s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**out, "rows": rows}, f, indent=1)
    print(f"{be.name} {be.version} on {be.device_name}, torch {torch.__version__}")
    for r in rows:
        print(" | ".join(r))
    return 1 if out.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
