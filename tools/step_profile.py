#!/usr/bin/env python
"""Where a training step's GPU time goes: native PyTorch against a converted model.

``tools/train_bench.py`` times whole steps; this profiles them (Note [step
profile]). For one model, precision and execution, it builds the training
state of each mode (``train_steps.TrainJob``: same initial weights, same
data), warms each up, and then, under ``torch.profiler``, runs ``--steps``
steps of each mode. Per mode it reports

* the step time (CUDA events, measured outside the profiler, modes in turn),
* the GPU kernel time per step by category (convolution kernels, batch norm,
  elementwise, reductions, the optimizer, memset/memcpy, other) and in all,
  and the time some kernel ran (busy): the step time minus the busy time is
  where the GPU waited,
* per convolution call, in the order of the step (eager execution only: the
  kernels are attributed to the op that launched them): the op, its input
  shapes and its GPU time per step. PyTorch's ``aten::convolution`` and
  ``aten::convolution_backward`` are matched with mucudnn's ``ConvFunction``
  forward and backward by their position in the step, so the table shows,
  layer by layer, which convolutions take longer,
* the kernels whose time per step differs most between the modes, by name,
* with ``--host-profile N``: the host milliseconds per step of each mode (the
  time to issue ``N`` steps, no sync inside: the median of rounds with the
  modes in turn, and once under cProfile) and
  the functions taking the most host time per step (cProfile's own and
  cumulative times): where a host-bound step's time goes.

Examples::

    python tools/step_profile.py --model resnet18 --precision fp32cl --execution graph
    python tools/step_profile.py --model resnet18 --precision fp32cl --execution eager \\
        --json out/profile.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import sys
import time
from typing import Any, Iterable, Mapping, Sequence

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


import train_bench as tb  # its arguments and defaults
import train_steps as ts  # the training steps themselves
import zoo_models  # torchvision's classification names

# Note [step profile]
# ~~~~~~~~~~~~~~~~~~~
# What a converted model's step costs beyond native's shows in three places:
# its convolution kernels (each layer's plan against the algorithm PyTorch's
# benchmark chose), kernels that are not convolutions (copies or memsets a
# converted call may add), and time the GPU is idle (host work not hidden
# behind the GPU: in eager mode the Python of each call; captured graphs
# remove it). Kernel categories come from kernel names (``CATEGORIES``, first
# match wins); cuDNN's convolution kernels have no common prefix, so "conv"
# lists the families cuDNN 9 uses on Hopper and Ampere (xmma, cutlass,
# implicit GEMM, its layout transposes and Winograd). Host times (--host-profile)
# are taken before any profiler session runs in the process, in rounds with the
# modes in turn: the host of a shared machine drifts, and timing one mode
# after the other can put a difference on every torch call of one mode (batch
# norm's included, which mucudnn never runs) that interleaved step rounds do
# not show. Kernels on two streams at once (a pair plan's lanes, Note
# [micro-batches in pairs]) overlap: the kernel time sums them, the busy
# time counts the time any kernel runs, and the GPU waited for the step time
# minus the busy time; a convolution op's time sums its kernels alike.

#: (category, regex on the kernel name), first match wins
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("memset/memcpy", r"^Mem(set|cpy)"),
    ("batch norm", r"batch_norm|bn_fw|bn_bw|batchnorm"),
    ("optimizer", r"multi_tensor_apply|foreach|_amp_"),
    ("conv", r"xmma|cutlass|cudnn|implicit_convolve|implicit_gemm|conv|wgrad|dgrad|fprop|"
             r"nchwToNhwc|nhwcToNchw|winograd|fft|precomputed|cask|sm\d\d_|generateWinograd|"
             r"scalePackedTensor|computeOffsets|computeBOffsets|kern_precompute|im2col|"
             r"splitKreduce|split_k"),
    ("reduction", r"reduce|Reduce"),
    ("elementwise", r"elementwise|vectorized|unrolled|index|fill|copy"),
)

#: profiler op names of one convolution call (its kernels' time is attributed to it)
CONV_OPS = re.compile(r"^(aten::convolution|aten::convolution_backward|ConvFunction|"
                      r"ConvFunctionBackward|mucudnn::conv|mucudnn::conv_backward)$")


def category(name: str) -> str:
    """The category of a kernel (``CATEGORIES``).

    >>> category("sm90_xmma_wgrad_implicit_gemm_indexed_f32f32_tf32f32_f32_nhwckrsc_nhwc")
    'conv'
    >>> category("void at::native::batch_norm_collect_statistics_channels_last_kernel<float>")
    'batch norm'
    >>> category("Memset (Device)")
    'memset/memcpy'
    >>> category("void at::native::(anonymous namespace)::max_pool_forward_nhwc<float>")
    'other'
    """
    for cat, pattern in CATEGORIES:
        if re.search(pattern, name):
            return cat
    return "other"


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This tool's arguments, and ``train_bench``'s (its checks applied) for the jobs."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--model", choices=sorted(set(tb.MODELS) | set(zoo_models.zoo_names()[0])),
                    default="resnet18", metavar="NAME",
                    help="a bench network or any torchvision classification model (default resnet18)")
    ap.add_argument("--precision", choices=ts.PRECISIONS, default="fp32cl")
    ap.add_argument("--execution", choices=ts.EXECUTIONS, default="graph")
    ap.add_argument("--modes", nargs="+", choices=ts.MODES, default=["native", "wr"])
    ap.add_argument("--batch", type=tb._positive, default=None)
    ap.add_argument("--warmup", type=tb._positive, default=5)
    ap.add_argument("--steps", type=tb._positive, default=5, help="profiled steps per mode")
    ap.add_argument("--timed-rounds", type=tb._positive, default=5,
                    help="rounds of --steps timed steps of every mode, outside the profiler")
    ap.add_argument("--top", type=tb._positive, default=25,
                    help="kernels listed by their difference between modes")
    ap.add_argument("--host-profile", type=tb._positive, default=None, metavar="N",
                    help="also time N steps' host issue per mode, and cProfile them")
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    known, rest = ap.parse_known_args(argv)
    if known.device == "cuda" and known.execution == "graph" and known.warmup < 3:
        ap.error("--warmup: CUDA-graph capture needs at least 3 warm-up steps")
    # the remaining options (--workspace, --policy, --backend, ...) are train_bench's
    # (train_bench checks --models against its own networks; main() hands the
    # jobs --model's name, so its --models is a placeholder)
    tb_argv = ["--models", "tiny", "--precisions", known.precision, "--execution",
               known.execution, "--modes", *known.modes, "--warmup", str(known.warmup),
               "--device", known.device, *rest]
    return known, tb.parse_args(tb_argv)


def kernel_events(prof: Any) -> list[Any]:
    """The GPU kernel (and memset/memcpy) events of a profile."""
    return [e for e in prof.events() if e.device_type == DeviceType.CUDA]


def by_category(kernels: Iterable[Any], steps: int) -> dict[str, float]:
    """GPU ms per step of each category, and ``"all"``."""
    out: dict[str, float] = collections.defaultdict(float)
    for e in kernels:
        ms = e.time_range.elapsed_us() / 1e3 / steps
        out[category(e.name)] += ms
        out["all"] += ms
    return dict(out)


def busy_ms(kernels: Iterable[Any], steps: int) -> float:
    """GPU ms per step in which some kernel runs: the union of the kernels'
    time ranges, where kernels on two streams at once count once (Note [step
    profile]).

    >>> from types import SimpleNamespace as N
    >>> ev = lambda a, b: N(time_range=N(start=a, end=b))
    >>> busy_ms([ev(0, 1000), ev(500, 1500), ev(2000, 2500)], steps=1)
    2.0
    """
    total, end = 0.0, None
    for e in sorted(kernels, key=lambda e: e.time_range.start):
        a, b = e.time_range.start, e.time_range.end
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e3 / steps


def by_name(kernels: Iterable[Any], steps: int) -> dict[str, tuple[float, float]]:
    """Per kernel name: (GPU ms per step, launches per step)."""
    ms: dict[str, float] = collections.defaultdict(float)
    n: dict[str, int] = collections.defaultdict(int)
    for e in kernels:
        ms[e.name] += e.time_range.elapsed_us() / 1e3 / steps
        n[e.name] += 1
    return {k: (ms[k], n[k] / steps) for k in ms}


def conv_calls(prof: Any, steps: int) -> list[dict]:
    """The convolution ops of the profile's last step, in order: op name, input
    shapes, GPU ms (the kernels each launched, its children included, summed:
    Note [step profile])."""
    ops = sorted((e for e in prof.events() if e.device_type == DeviceType.CPU
                  and CONV_OPS.match(e.name)), key=lambda e: e.time_range.start)
    # nested matches (a custom op inside its Function) count once: the outermost
    outer: list[Any] = []
    for e in ops:
        if outer and e.time_range.start < outer[-1].time_range.end:
            continue
        outer.append(e)
    per_step = len(outer) // steps if steps else 0
    last = outer[len(outer) - per_step:] if per_step else []
    return [{"op": e.name, "shapes": [list(s) for s in (e.input_shapes or []) if s],
             "ms": e.device_time_total / 1e3} for e in last]


def profile_job(job: ts.TrainJob, steps: int) -> tuple[dict, list[dict], dict, float]:
    """``steps`` profiled steps of ``job``: kernel ms by category, its conv calls
    (eager), kernel ms by name, and the busy ms (:func:`busy_ms`)."""
    job.set_flags()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 record_shapes=not job.graphed) as prof:
        for _ in range(steps):
            job.next_batch()
            job.step()
        ts.sync(job.device)
    kernels = kernel_events(prof)
    calls = [] if job.graphed else conv_calls(prof, steps)
    return by_category(kernels, steps), calls, by_name(kernels, steps), busy_ms(kernels, steps)


#: rounds of host issue timing, the modes in turn (Note [step profile]): their median
HOST_ROUNDS = 3


def issue_ms(job: ts.TrainJob, steps: int) -> float:
    """Host milliseconds per step to issue ``steps`` steps of ``job`` (no sync
    inside: with the GPU idle between kernels this is the step's critical path)."""
    job.set_flags()
    ts.sync(job.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        job.next_batch()
        job.step()
    ms = (time.perf_counter() - t0) * 1e3 / steps
    ts.sync(job.device)
    return ms


def host_profiles(jobs: Mapping[str, ts.TrainJob], steps: int, top: int) -> dict[str, dict]:
    """Per mode of ``jobs``: the host ms per step of issuing ``steps`` steps
    (:func:`issue_ms`) in :data:`HOST_ROUNDS` rounds with the modes in turn,
    their median, and one run under cProfile with its ``top`` functions
    (:func:`train_steps.host_profile`: seconds over the ``steps`` steps). The
    modes alternate so that a host that slows or speeds up during the run
    colours every mode alike."""
    rounds: dict[str, list[float]] = {m: [] for m in jobs}
    for _ in range(HOST_ROUNDS):
        for mode, job in jobs.items():
            rounds[mode].append(issue_ms(job, steps))
    out = {}
    for mode, job in jobs.items():
        profiled, functions = ts.host_profile(lambda job=job: issue_ms(job, steps), top)
        out[mode] = {"issue_ms": statistics.median(rounds[mode]), "issue_rounds_ms": rounds[mode],
                     "steps": steps, "profiled_issue_ms": profiled, "functions": functions}
    return out


def host_rows(mode: str, h: Mapping[str, Any]) -> list[str]:
    """Markdown: one mode's host profile, per step."""
    each = ", ".join(f"{v:.2f}" for v in h.get("issue_rounds_ms", ()))
    lines = [f"{mode}: host ms per step {h['issue_ms']:.2f} (median of rounds {each}; "
             f"{h['profiled_issue_ms']:.2f} under cProfile)", "",
             "| function | calls a step | own ms a step | cumulative ms a step |",
             "|---|---|---|---|"]
    n = h["steps"]
    for key in ("self", "cumulative"):
        for r in h["functions"][key]:
            lines.append(f"| `{r['function'][:100]}` | {r['calls'] / n:g} | "
                         f"{r['self_s'] * 1e3 / n:.3f} | {r['cumulative_s'] * 1e3 / n:.3f} |")
        lines.append("| | | | |")
    return lines


def layer_rows(calls: Mapping[str, list[dict]], modes: Sequence[str]) -> list[str]:
    """Markdown rows: the i-th convolution op of every mode side by side."""
    n = min(len(c) for c in calls.values()) if calls else 0
    rows = [f"| # | {' | '.join(f'{m} op | {m} ms' for m in modes)} | shapes ({modes[0]}) |",
            "|---|" + "---|---|" * len(modes) + "---|"]
    for i in range(n):
        cells = " | ".join(f"{calls[m][i]['op']} | {calls[m][i]['ms']:.3f}" for m in modes)
        rows.append(f"| {i} | {cells} | {calls[modes[0]][i]['shapes'][:2]} |")
    return rows


def diff_rows(names: Mapping[str, Mapping[str, tuple[float, float]]], modes: Sequence[str],
              top: int) -> list[str]:
    """Markdown rows: the ``top`` kernels whose ms per step differ most from the
    first mode's."""
    ref = modes[0]
    keys = set().union(*(names[m] for m in modes))

    def spread(k: str) -> float:
        return max(abs(names[m].get(k, (0.0, 0))[0] - names[ref].get(k, (0.0, 0))[0])
                   for m in modes)

    rows = [f"| kernel | {' | '.join(f'{m} ms (n)' for m in modes)} |",
            "|---|" + "---|" * len(modes)]
    for k in sorted(keys, key=spread, reverse=True)[:top]:
        cells = " | ".join("%.3f (%g)" % names[m].get(k, (0.0, 0)) for m in modes)
        rows.append(f"| `{k[:90]}` | {cells} |")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    known, args = parse_args(argv)
    device = torch.device(known.device)
    name, precision, execution = known.model, known.precision, known.execution
    batch = known.batch or tb.DEFAULT_BATCH.get(name, zoo_models.BATCH)
    torch.manual_seed(args.seed)
    init_state = ts.build_model(name).state_dict()  # its _metadata too (MNASNet reads it)
    jobs = []
    for mode in known.modes:
        jobs.append(ts.TrainJob(args, name, mode, precision, execution, batch, init_state,
                                device))
        jobs[-1].warm_up(args.warmup)
    times = ts.time_rounds(jobs, known.timed_rounds, known.steps, device)
    result: dict[str, Any] = {"model": name, "precision": precision, "execution": execution,
                              "batch": batch, "modes": known.modes, "steps": known.steps,
                              "environment": ts.environment(device), "per_mode": {}}
    cats, calls, names = {}, {}, {}
    # the host first: no profiler session has run in the process yet (Note [step profile])
    hosts = host_profiles(dict(zip(known.modes, jobs)), known.host_profile, known.top) \
        if known.host_profile else {}
    for mode, job, t in zip(known.modes, jobs, times):
        before = ts.graph_replays()
        cats[mode], calls[mode], names[mode], busy = profile_job(job, known.steps)
        step_ms = statistics.median(x for r in t for x in r)
        result["per_mode"][mode] = {"step_ms": step_ms, "kernel_ms": cats[mode],
                                    "busy_ms": busy, "idle_ms": step_ms - busy,
                                    "conv_calls": calls[mode],
                                    "kernels": {k: list(v) for k, v in names[mode].items()},
                                    "replay": ts.replays_between(before, ts.graph_replays())}
    for mode, h in hosts.items():
        result["per_mode"][mode]["host"] = h
    for job in jobs:
        job.release()
    lines = [f"{name} {precision} {execution} batch {batch}: GPU ms per step", "",
             f"| mode | step | kernels | GPU busy | GPU idle | "
             f"{' | '.join(c for c, _ in CATEGORIES)} | other |",
             "|---|" + "---|" * (len(CATEGORIES) + 5)]
    for mode in known.modes:
        pm = result["per_mode"][mode]
        cells = " | ".join(f"{cats[mode].get(c, 0.0):.3f}" for c, _ in CATEGORIES)
        lines.append(f"| {mode} | {pm['step_ms']:.3f} | {cats[mode].get('all', 0.0):.3f} | "
                     f"{pm['busy_ms']:.3f} | {pm['idle_ms']:.3f} | {cells} | "
                     f"{cats[mode].get('other', 0.0):.3f} |")
    for mode in known.modes:
        if result["per_mode"][mode]["replay"]:
            lines += ["", f"CUDA graphs of planned launches in the profiled steps, {mode}: "
                          f"{result['per_mode'][mode]['replay']}"]
    if execution == "eager" and len(known.modes) > 1:
        lines += ["", "Convolution ops in step order:", ""] + layer_rows(calls, known.modes)
    if len(known.modes) > 1:
        lines += ["", f"Kernels that differ most from {known.modes[0]}:", ""]
        lines += diff_rows(names, known.modes, known.top)
    for mode, h in hosts.items():
        lines += [""] + host_rows(mode, h)
    result["markdown"] = "\n".join(lines)
    if known.json:
        os.makedirs(os.path.dirname(os.path.abspath(known.json)), exist_ok=True)
        with open(known.json, "w") as f:
            json.dump(result, f, indent=1)
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
