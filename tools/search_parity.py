#!/usr/bin/env python
"""Search parity: does mucudnn's search hold the engine PyTorch runs, layer by layer?

For each torchvision model named, every distinct convolution (found by one
forward pass with hooks on its ``nn.Conv2d``/``Conv3d`` modules) is run in
each direction through PyTorch's own cuDNN path with ``cudnn.benchmark``
(PyTorch's fastest), and the CUDA kernels of that call are read from
``torch.profiler``. Then mucudnn's graph backend, with the options given,
runs find() for the same problem and direction (no workspace limit: the
question is what the search holds, not what fits), also under the profiler:
find() runs every candidate it times, so the kernels it launched are those
of its candidates. A layer's direction is *held* when every kernel of
PyTorch's call was among them (Note [search parity] in
mucudnn/backends/find_options.py). The table lists per convolution and
direction PyTorch's kernels, whether they were held, and the kernels
missing; ``--json`` writes it all.

With ``--over-limit SIZE`` only the directions whose PyTorch workspace (as
``mucudnn.torch`` measures it: the allocator's peak over the call's outputs)
is over SIZE are compared: under ``mucudnn.torch``'s default search those are
the only ones a converted model plans (Note [plans only over the limit]); the
others are rows marked as fitting, not counted. Each direction compared also
gets PyTorch's own call run on micro-batches, at the largest halving of the
batch whose workspace fits SIZE: its time for the whole batch at that rate,
beside the whole batch's, is what the limit would cost PyTorch's own engine
(set it beside the plan's time in ``mucudnn.torch.report``).

    python tools/search_parity.py --models mobilenet_v2 resnext50_32x4d --batch 64
    python tools/search_parity.py --models convnext_tiny regnet_y_1_6gf --over-limit 64MiB
    python tools/search_parity.py --models convnext_tiny --precision amp --json parity.json
    python tools/search_parity.py --models mobilenet_v2 --find rtc=none parity=False  # the old search

Needs a CUDA GPU, torch and torchvision.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import sys
import time
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

import train_steps as ts  # tools/, beside this script: what a result file records of the run
import zoo_models  # the models as the zoo builds them (tools/, beside this script)
from mucudnn.__main__ import parse_size  # argparse errors
from mucudnn.backends.cudnn_graph import CudnnGraphBackend
from mucudnn.backends.find_options import FindOptions
from mucudnn.problem import ConvProblem, Direction
from mucudnn.torch import measure, native


def model_convs(name: str, batch: int, size: Optional[int], dtype: torch.dtype
                ) -> list[dict[str, Any]]:
    """The distinct convolutions of torchvision model ``name`` (built as
    zoo_bench builds it, at its input size: ``size``, or the model's own) on a
    channels-last batch (one forward pass)."""
    spec = zoo_models.model_spec(name, size)
    model = zoo_models.build_model(spec).cuda().to(memory_format=torch.channels_last)
    size = spec.size
    seen: dict[tuple, dict[str, Any]] = {}

    def hook(module: nn.Module, args: tuple) -> None:
        x = args[0]
        m: Any = module
        if isinstance(m.padding, str):
            return  # 'same'/'valid' layers: not in torchvision's classification models
        key = (tuple(x.shape), tuple(m.weight.shape), tuple(m.stride), tuple(m.padding),
               tuple(m.dilation), m.groups)
        seen.setdefault(key, {"layer": module_names[module], "x": key[0], "w": key[1],
                              "stride": key[2], "padding": key[3], "dilation": key[4],
                              "groups": key[5]})

    module_names = {m: n for n, m in model.named_modules()}
    handles = [m.register_forward_pre_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Conv2d, nn.Conv3d))]
    x = torch.randn(batch, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16,
                                         enabled=dtype == torch.bfloat16):
        model(x)
    for h in handles:
        h.remove()
    return list(seen.values())


def cuda_kernels(fn: Callable[[], Any]) -> list[str]:
    """The names of the CUDA kernels ``fn()`` launches, in order (profiled)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    # aten's own kernels (zero fills, casts) are PyTorch's bookkeeping, not cuDNN's engine
    return [e.name for e in prof.events()
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
            and "at::native" not in e.name and not e.name.startswith("Memset")]


def torch_call(conv: dict[str, Any], direction: Direction, dtype: torch.dtype
               ) -> Callable[[], Any]:
    """PyTorch's own cuDNN call of ``conv`` in ``direction`` (channels-last)."""
    cl = torch.channels_last
    x = torch.randn(conv["x"], device="cuda", dtype=dtype).to(memory_format=cl)
    w = torch.randn(conv["w"], device="cuda", dtype=dtype).to(memory_format=cl)
    args = (list(conv["stride"]), list(conv["padding"]), list(conv["dilation"]))
    y = torch.ops.aten.convolution(x, w, None, *args, False, [0, 0], conv["groups"])
    dy = torch.randn_like(y)
    mask = {Direction.FORWARD: None, Direction.BACKWARD_DATA: [True, False, False],
            Direction.BACKWARD_FILTER: [False, True, False]}[direction]

    def call() -> Any:
        if mask is None:
            return torch.ops.aten.convolution(x, w, None, *args, False, [0, 0], conv["groups"])
        return torch.ops.aten.convolution_backward(dy, x, w, None, *args, False, [0, 0],
                                                   conv["groups"], mask)
    return call


def largest_fitting_batch(n: int, workspace_at: Callable[[int], Optional[int]], limit: int
                          ) -> Optional[tuple[int, int]]:
    """The largest of ``n // 2``, ``n // 4``, ... (down to 1) at which
    ``workspace_at(b)`` is within ``limit``, with that workspace; None where
    none is.

    >>> largest_fitting_batch(64, lambda b: 10 * b, 200)  # 32: 320, 16: 160
    (16, 160)
    >>> largest_fitting_batch(64, lambda b: None if b > 2 else 0, 200)
    (2, 0)
    >>> largest_fitting_batch(64, lambda b: 500, 200) is None
    True
    """
    b = n // 2
    while b >= 1:
        ws = workspace_at(b)
        if native.within_limit(ws, limit):
            assert ws is not None
            return b, ws
        b //= 2
    return None


def torch_under_limit(conv: dict[str, Any], direction: Direction, dtype: torch.dtype,
                      limit: int) -> Optional[dict[str, Any]]:
    """PyTorch's own call of ``conv`` run on micro-batches: at the largest halving
    of the batch whose workspace fits ``limit``, its milliseconds per call and
    for the whole batch at that rate (what a plan of PyTorch's calls would take;
    None where no halving fits)."""
    n = conv["x"][0]
    calls: dict[int, Callable[[], Any]] = {}

    def workspace_at(b: int) -> Optional[int]:
        calls[b] = call = torch_call(dict(conv, x=(b, *conv["x"][1:])), direction, dtype)
        call()  # its benchmark
        return measure.workspace_of(call)

    fit = largest_fitting_batch(n, workspace_at, limit)
    if fit is None:
        return None
    b, ws = fit
    ms = measure.time_ms([calls[b]])[0]
    return {"batch": b, "workspace_bytes": ws, "ms": ms, "ms_whole_batch": ms * n / b,
            "torch_kernels": cuda_kernels(calls[b])}


def problem_of(conv: dict[str, Any], dtype: str) -> ConvProblem:
    """The NHWC ConvProblem of a channels-last convolution in torch's shapes."""
    n, c, h, w_ = conv["x"]
    k, cg, r, s = conv["w"]
    return ConvProblem((n, h, w_, c), (k, r, s, cg), stride=conv["stride"],
                       padding=conv["padding"], dilation=conv["dilation"],
                       groups=conv["groups"], dtype=dtype, layout="NHWC")


def check(conv: dict[str, Any], direction: Direction, precision: str,
          backend: CudnnGraphBackend, over_limit: Optional[int] = None) -> dict[str, Any]:
    """PyTorch's kernels for ``conv`` in ``direction`` and whether mucudnn's find()
    ran them; with ``over_limit``, only where PyTorch's workspace is over it
    (else a row with ``fits`` set and ``held`` None: not compared)."""
    dtype = torch.bfloat16 if precision == "amp" else torch.float32
    call = torch_call(conv, direction, dtype)
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=True):
        call()  # PyTorch's own search
        torch.cuda.synchronize()
        theirs = cuda_kernels(call)
        workspace = measure.workspace_of(call)
        problem = problem_of(conv, "bfloat16" if precision == "amp" else "float32")
        if over_limit is not None and native.within_limit(workspace, over_limit):
            return {"layer": conv["layer"], "problem": problem.key(),
                    "direction": direction.value, "torch_kernels": theirs,
                    "torch_workspace": workspace, "fits": True, "held": None, "missing": []}
        torch_ms = measure.time_ms([call])[0]
        under = None if over_limit is None else \
            torch_under_limit(conv, direction, dtype, over_limit)
    found: list[Any] = []
    t = time.perf_counter()
    ours = cuda_kernels(lambda: found.extend(backend.find(problem, direction, None)))
    find_s = time.perf_counter() - t
    missing = sorted(set(theirs) - set(ours))
    if under is not None:  # the same question at the micro-batch PyTorch's call fits at
        at_b: list[Any] = []
        ours_b = cuda_kernels(lambda: at_b.extend(
            backend.find(problem.with_batch(under["batch"]), direction, None)))
        under["missing"] = sorted(set(under["torch_kernels"]) - set(ours_b))
        under["held"] = not under["missing"] and bool(under["torch_kernels"])
    best = min(found, key=lambda a: a.time_ms) if found else None
    return {"layer": conv["layer"], "problem": problem.key(), "direction": direction.value,
            "torch_kernels": theirs, "torch_workspace": workspace, "torch_ms": torch_ms,
            "torch_under_limit": under, "fits": False, "held": not missing and bool(theirs),
            "missing": missing, "candidates": len(found), "find_s": round(find_s, 3),
            "best": None if best is None else {"algo": str(best.algo), "ms": best.time_ms,
                                               "workspace_bytes": best.workspace_bytes}}


def parse_find(items: Sequence[str]) -> FindOptions:
    """``field=value`` pairs (Python literals) as FindOptions."""
    kwargs: dict[str, Any] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"--find: expected field=value, got {item!r}")
        try:
            kwargs[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            kwargs[k] = v
    return FindOptions.from_kwargs(**kwargs)


def check_model(name: str, convs: list[dict[str, Any]], precision: str,
                backend: CudnnGraphBackend, out_of_time: Callable[[], bool],
                on_conv: Callable[[dict[str, Any]], None] = lambda entry: None,
                check_one: Callable[..., dict[str, Any]] = check) -> dict[str, Any]:
    """Every direction of each of ``convs`` (``check_one``, :func:`check`), the
    model's entry of the report. ``out_of_time()`` is asked before each
    convolution; once it says so the entry stops there with ``complete`` false
    (its counts are those of the convolutions checked). ``on_conv(entry)``
    after each convolution, so a run cut short keeps what it found."""
    entry: dict[str, Any] = {"convs": len(convs), "convs_checked": 0, "kernels": 0, "held": 0,
                             "fit": 0, "complete": True, "results": []}
    for conv in convs:
        if out_of_time():
            entry["complete"] = False
            print(f"[parity] {name}: out of time after {entry['convs_checked']} of "
                  f"{len(convs)} convolutions", file=sys.stderr)
            break
        for d in Direction:
            try:
                r = check_one(conv, d, precision, backend)
            except Exception as exc:  # keep going: one layer's failure is a row
                r = {"layer": conv["layer"], "direction": d.value, "held": False,
                     "error": f"{type(exc).__name__}: {exc}", "torch_kernels": [],
                     "missing": []}
            entry["results"].append(r)
        entry["convs_checked"] += 1
        compared = [r for r in entry["results"] if not r.get("fits")]
        entry["kernels"] = len(compared)
        entry["held"] = sum(bool(r["held"]) for r in compared)
        entry["fit"] = len(entry["results"]) - len(compared)
        on_conv(entry)
    return entry


def rows_of(name: str, entry: dict[str, Any]) -> list[str]:
    """The table rows of one model's entry."""
    def held(r: dict[str, Any]) -> str:
        return "fits the limit" if r.get("fits") else "yes" if r["held"] else "NO"

    def under(r: dict[str, Any]) -> str:
        u = r.get("torch_under_limit")
        if not u:
            return "-"
        held = "held" if u.get("held") else f"NOT held: {'; '.join(u.get('missing', []))[:80]}"
        return (f"{u['ms_whole_batch']:.3f} ms ({u['batch']} a call, "
                f"{u['workspace_bytes'] / 2**20:.1f} MiB, {held}; whole batch "
                f"{r['torch_ms']:.3f} ms)")

    return [f"| {name} | {r['layer']} | {r['direction']} | {held(r)} | "
            f"{'; '.join(sorted(set(r['torch_kernels'])))[:160]} | "
            f"{'; '.join(r['missing'])[:160] or r.get('error', '')} | {under(r)} |"
            for r in entry["results"]]


def _write(path: Optional[str], out: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=None,
                    help="input size (default: the model's own, as zoo_bench.py uses it)")
    ap.add_argument("--precision", choices=["fp32cl", "amp"], default="fp32cl")
    ap.add_argument("--find", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="FindOptions fields of the search under test (default: the defaults)")
    ap.add_argument("--over-limit", type=parse_size, default=None, metavar="SIZE",
                    help="compare only the directions whose PyTorch workspace is over SIZE "
                         "(e.g. 64MiB): those a converted model plans")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no new convolution after this many seconds (a model cut short "
                         "is kept, marked incomplete)")
    ap.add_argument("--json", default=None, help="the report, rewritten after each convolution")
    args = ap.parse_args(argv)
    opts = parse_find(args.find)
    start = time.perf_counter()

    def out_of_time() -> bool:
        return args.max_seconds is not None and time.perf_counter() - start > args.max_seconds

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out: dict[str, Any] = {"environment": ts.environment(device),
                           "options": vars(args) | {"find": str(opts)}, "models": {}}
    rows = ["| model | conv | direction | held | PyTorch's kernels | missing "
            "| PyTorch's calls on micro-batches under --over-limit |",
            "|---|---|---|---|---|---|---|"]
    for name in args.models:
        if out_of_time():
            print(f"[parity] out of time before {name}", file=sys.stderr)
            break
        backend = CudnnGraphBackend(find=opts)  # fresh: every kernel's first find
        dtype = torch.bfloat16 if args.precision == "amp" else torch.float32
        convs = model_convs(name, args.batch, args.size, dtype)

        def keep(entry: dict[str, Any], name: str = name,
                 backend: CudnnGraphBackend = backend) -> None:
            out["models"][name] = entry | {"find": backend.find_profile.as_dict()}
            _write(args.json, out)

        entry = check_model(name, convs, args.precision, backend, out_of_time, keep,
                            check_one=functools.partial(check, over_limit=args.over_limit))
        keep(entry)
        rows += rows_of(name, entry)
        print(f"[parity] {name}: {entry['held']} of {entry['kernels']} kernels held "
              f"({entry['convs_checked']} of {len(convs)} distinct convolutions)", file=sys.stderr)
        backend.close()
    print("\n".join(rows))
    for name, m in out["models"].items():
        print(f"{name}: {m['held']} of {m['kernels']} held"
              + (f" ({m['fit']} more fit the limit, not compared)" if m.get("fit") else "")
              + ("" if m["complete"] else f" (cut short: {m['convs_checked']} of {m['convs']} "
                 "convolutions)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
