#!/usr/bin/env python
"""Training throughput and memory: native PyTorch vs models converted by mucudnn.torch.

For one model (or several) from torchvision (resnet18, resnet50, vgg16, alexnet;
``tiny`` is a small built-in CNN for smoke tests), synthetic data, SGD with
momentum, it trains with each combination of

* mode: ``native`` (``torch.backends.cudnn.benchmark=True``), ``wr``
  (``mucudnn.torch.convert``, ``--workspace`` per kernel), ``wd`` (one
  ``--total-workspace`` budget for all kernels), and on request
  ``native-heur`` (native with ``cudnn.benchmark=False``: the algorithms
  cuDNN's heuristics pick instead of the fastest timed ones; its losses
  against ``native``'s are the noise floor of the loss check, Note [loss
  noise floor]);
* precision: ``fp32`` (TF32 allowed, PyTorch's default for convolutions),
  ``amp`` (autocast bfloat16, channels_last model and inputs) and
  ``fp32strict`` (TF32 off for convolutions and matmuls: the precision in
  which converted losses must track native ones within 1e-3 for 30 steps) and
  ``fp32cl`` (as ``fp32``, with a channels_last model and inputs: Note [fp32
  transposes in workspace] in mucudnn/problem/layouts.py);
* execution: ``eager`` and ``graph`` (the whole training step captured with
  ``torch.cuda.graph`` after the warm-up steps and replayed);

and reports the median step time (CUDA events), images/s,
``torch.cuda.max_memory_allocated``, the device memory actually used (the
drop of ``torch.cuda.mem_get_info``'s free bytes: it includes mucudnn's
workspace, which is allocated outside torch's allocator), and the losses of
the first 30 steps (warm-up steps included). Every run of a model starts from
the same initial weights and sees the same data, so losses are comparable;
the maximum relative difference of each converted run's losses from the
native run's (same precision and execution) is reported.

``--deterministic`` trains every mode with
``torch.backends.cudnn.deterministic = True`` (Note [deterministic loss
check]): bitwise repeatable runs, whose losses differ from native's only by
the algorithms chosen; a native run given ``--reference`` is then compared
with the earlier run's native losses too (0 when repeatable).

``--constrained`` adds the constrained-memory mode: under a per-process memory
fraction emulating a ``--memory`` GPU (16 GiB), the largest batch each mode
can train (searched over ``--constrained-batches``, catching out-of-memory)
and its images/s. mucudnn's workspace lives outside torch's allocator, so for
converted models the fraction is reduced by their workspace budget
(``--workspace`` or ``--total-workspace``): every mode gets the same total.

``--interleave ROUNDS`` compares the modes on one GPU clock (Note
[interleaved steps]): after the runs of each model, precision and execution,
the training state of every selected mode is built at once (for ``graph``
execution, each mode's step captured into its own graph), warmed up, and
ROUNDS rounds each run ``--interleave-steps`` (K, default 5) timed steps of
every mode in turn, in an order rotated each round. Per mode: the median
step time over all its interleaved steps and, for every mode but native, the
median over rounds of (its round median / native's round median) - 1 (against
the first mode, ``rel_vs_<mode>``, when native is not selected): the JSON's
``interleaved`` list and a markdown table after the runs' table. On the CPU
only eager execution runs, as for the runs.

Results go to ``--json`` after every run (a time-out keeps what was done); a
short table is printed last. ``--max-seconds`` stops starting new runs after
that many seconds. Examples::

    python tools/train_bench.py --models resnet50 --json out/resnet50.json
    python tools/train_bench.py --models vgg16 --precisions amp --execution graph
    python tools/train_bench.py --models resnet50 vgg16 --constrained --modes native wr
    python tools/train_bench.py --models resnet18 --precisions fp32cl --modes native wr --interleave 10
    python tools/train_bench.py --device cpu --models tiny --steps 2 --warmup 1   # smoke test
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import math
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Sequence

import torch

import mucudnn
import mucudnn.torch as mt
from mucudnn.__main__ import parse_policy, parse_size  # argparse errors
from mucudnn.units import format_bytes

# tools/, beside this script: the training steps, shared with the other benchmarks
from train_steps import (EXECUTIONS, MODES, NATIVE_MODES, PRECISIONS, Timer, TrainJob,
                         build_model, cleanup, environment, free_bytes, interleaved_stats,
                         is_oom, sync, time_rounds)

try:
    from tqdm.auto import tqdm
except ImportError:  # pragma: no cover
    tqdm = None

MODELS = ("resnet18", "resnet50", "vgg16", "alexnet", "tiny")
DEFAULT_MODES = ("native", "wr", "wd")
DEFAULT_BATCH = {"alexnet": 256, "resnet18": 256, "resnet50": 128, "vgg16": 128, "tiny": 8}
LOSSES_KEPT = 30
LOSS_TRACK_TOL = 1e-3

# Note [loss noise floor]
# ~~~~~~~~~~~~~~~~~~~~~~~
# The issue asks converted losses to track native ones within 1e-3 (relative)
# for 30 steps in float32. Two runs that differ only in which cuDNN algorithms
# compute the convolutions round differently (a different summation order,
# each result still exact to float32's or TF32's precision), and 30 SGD steps
# on random labels amplify that: on the H200 converted ResNet-18 in strict
# fp32 tracked within 1.65e-3 eager and 9.2e-4 captured (docs/BENCHMARKS.md,
# "More training runs"). How much of that is any change of algorithm, not
# mucudnn's, is what ``native-heur`` measures: PyTorch itself with cuDNN's
# heuristic choices (cudnn.benchmark=False) instead of its timed ones,
# reported against ``native`` like a converted run. It must run in a process
# of its own: PyTorch's cuDNN plan cache (``benchmark_cache`` in
# aten/src/ATen/native/cudnn/Conv_v8.cpp) is keyed without the benchmark flag
# and consulted first, so after ``native`` the same process would rerun
# native's timed plans (the eleventh session's 2.00e-3 / 1.42e-3 were that:
# PyTorch against itself with the same algorithms, its run-to-run
# nondeterminism). So on CUDA the two modes are refused together;
# ``--reference`` names an earlier run's JSON whose ``native`` losses the runs
# here are compared with.
DEFAULT_CONSTRAINED_BATCHES = "64,96,128,160,192,224,256,320,384,448,512"

# Note [deterministic loss check]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# With ``--deterministic`` every mode trains with
# ``torch.backends.cudnn.deterministic = True``: PyTorch times only the
# algorithms cuDNN marks deterministic, and mucudnn.torch plans only with such
# configurations (Note [deterministic plans] in mucudnn/optimizer/benchmark.py).
# Then a run is bitwise repeatable, so the loss check separates what the
# converted model changes (other algorithms, summing in another order) from
# run-to-run nondeterminism (atomics in some backward algorithms), which the
# plain runs mix (Note [loss noise floor]). A native run given ``--reference``
# with a native run of the same model, precision and execution is compared with
# it too: two processes, the same algorithms; 0 when they are deterministic.
# Each loss-tracking entry keeps the per-step relative differences
# (``rel_diffs``), to show how a difference grows over the steps.



# -- arguments ------------------------------------------------------------------------------------
def _batches(text: str) -> list[int]:
    try:
        out = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated batch sizes, got {text!r}") from None
    if not out or out[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive batch sizes, got {text!r}")
    return out


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text}")
    return v


def _nonnegative(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative int, got {text}")
    return v


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=["resnet50"])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(DEFAULT_MODES),
                    help="native-heur: PyTorch with cudnn.benchmark=False, the noise floor "
                         "of the loss check (Note [loss noise floor]; not run by default)")
    ap.add_argument("--reference", default=None, metavar="JSON",
                    help="an earlier run's --json: its native losses are the reference where "
                         "this run has no native run (native-heur runs alone: "
                         "Note [loss noise floor])")
    ap.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=["fp32", "amp"])
    ap.add_argument("--execution", choices=EXECUTIONS + ("both",), default="both")
    ap.add_argument("--batch", type=_positive, default=None,
                    help="mini-batch size (default per model: %s)" % DEFAULT_BATCH)
    ap.add_argument("--steps", type=_positive, default=30, help="timed steps (default 30)")
    ap.add_argument("--warmup", type=_positive, default=12,
                    help="untimed steps first (planning, cudnn.benchmark, the converted "
                         "step trial; >= 3 before a capture; default 12)")
    ap.add_argument("--workspace", type=parse_size, default=64 << 20,
                    help="WR workspace limit per kernel (default 64MiB)")
    ap.add_argument("--total-workspace", type=parse_size, default=512 << 20,
                    help="WD budget for all kernels (default 512MiB)")
    ap.add_argument("--policy", type=parse_policy, default=mucudnn.optimizer.DEFAULT_POLICY,
                    help="fitted (default), powerOfTwo, all, undivided or sizes like 64,48,32")
    ap.add_argument("--backend", default=None, help="mucudnn backend (default: mucudnn's)")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.backends.cudnn.deterministic=True for every mode: PyTorch and "
                         "mucudnn.torch use only deterministic convolution algorithms (Note "
                         "[deterministic loss check])")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--constrained", action="store_true",
                    help="also find the largest trainable batch under --memory")
    ap.add_argument("--constrained-only", action="store_true",
                    help="run only the constrained-memory search")
    ap.add_argument("--constrained-models", nargs="+", choices=MODELS,
                    default=["resnet50", "vgg16"])
    ap.add_argument("--memory", type=parse_size, default=16 << 30,
                    help="emulated GPU memory for --constrained (default 16GiB)")
    ap.add_argument("--constrained-batches", type=_batches,
                    default=_batches(DEFAULT_CONSTRAINED_BATCHES))
    ap.add_argument("--constrained-steps", type=_positive, default=5)
    ap.add_argument("--constrained-precision", choices=PRECISIONS, default="fp32")
    ap.add_argument("--refine", type=int, default=2,
                    help="bisection steps between the last batch that fit and the first that did not")
    ap.add_argument("--interleave", type=_nonnegative, default=0, metavar="ROUNDS",
                    help="after the runs of each model, precision and execution, train every "
                         "mode at once for ROUNDS rounds of --interleave-steps steps each, "
                         "in turn (Note [interleaved steps]; default 0: off)")
    ap.add_argument("--interleave-steps", type=_positive, default=5, metavar="K",
                    help="timed steps per mode and round of --interleave (default 5)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no new run after this many seconds")
    ap.add_argument("--json", default=None, help="write all numbers here (after every run)")
    ap.add_argument("--progress", action="store_true", help="a tqdm bar over the runs")
    args = ap.parse_args(argv)
    if args.warmup < 3 and args.execution in ("graph", "both") and args.device == "cuda":
        ap.error("--warmup: CUDA-graph capture needs at least 3 warm-up steps")
    if args.device == "cpu" and args.constrained:
        ap.error("--constrained: needs --device cuda (a per-process memory fraction)")
    if args.device == "cuda" and {"native", "native-heur"} <= set(args.modes):
        ap.error("--modes: native and native-heur need processes of their own on CUDA "
                 "(PyTorch's cuDNN plan cache ignores cudnn.benchmark; "
                 "Note [loss noise floor]): run native-heur alone with --reference NATIVE_RUN.json")
    if args.reference is not None and not os.path.isfile(args.reference):
        ap.error(f"--reference: no such file: {args.reference}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA GPU (use --device cpu for a smoke test)")
    try:
        mt.functional.options(args.workspace, args.policy, args.backend)
    except (ValueError, TypeError) as exc:
        ap.error(str(exc))
    return args


# -- runs ---------------------------------------------------------------------------------------
def train_run(args: argparse.Namespace, name: str, mode: str, precision: str, execution: str,
              batch: int, init_state: dict, device: torch.device, steps: int | None = None,
              warmup: int | None = None, keep_losses: int = LOSSES_KEPT) -> dict:
    """Train ``warmup + steps`` steps; return the run's numbers (see the module doc)."""
    steps = args.steps if steps is None else steps
    warmup = args.warmup if warmup is None else warmup
    free0 = free_bytes(device)
    job = TrainJob(args, name, mode, precision, execution, batch, init_state, device)
    losses, first_step_s = job.warm_up(warmup)
    timer = Timer(device)
    losses += job.timed_steps(steps, timer)
    times = timer.times_ms()
    sync(device)
    free1 = free_bytes(device)
    med = statistics.median(times)
    out = {
        "model": name, "mode": mode, "precision": precision, "execution": execution,
        "batch": batch, "steps": steps, "warmup": warmup,
        "median_step_ms": med, "images_per_s": batch / (med / 1e3),
        "step_ms": times, "first_step_s": first_step_s,
        "losses": ([float(v) for v in torch.stack(losses[:keep_losses]).cpu()]
                   if keep_losses else []),
        "max_memory_allocated": (torch.cuda.max_memory_allocated(device)
                                 if device.type == "cuda" else None),
        "device_memory_used": (free0 - free1) if free0 is not None and free1 is not None else None,
        "mucudnn_workspace_bytes": mt.workspace_bytes(device) if mode not in NATIVE_MODES else 0,
    }
    if mode not in NATIVE_MODES:
        # what a step launches: micro-batches of every plan of this run's batch
        # (each costs host time in eager mode, docs/BENCHMARKS.md "The call path")
        plans = [pl for c in mt.cached_convolutions() if c.problem.batch == batch
                 for pl in c.plans.values()]
        out["mucudnn_plans"] = len(plans)
        out["mucudnn_micro_batches"] = sum(len(pl.micro_batches) for pl in plans)
    planner = getattr(job.model, "mucudnn_planner", None)
    if planner is not None:
        chosen = [p for plans in planner.plans.values() for p in plans.values()]
        out["wd_kernels"] = len(chosen)
        out["wd_planned_workspace_bytes"] = sum(p.workspace_bytes for p in chosen)
    # release the model, its buffers and the graph before the next run
    job.release()
    return out


# -- interleaved steps ----------------------------------------------------------------------------
# Note [interleaved steps]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# The runs above train one mode after another, and each reports its own median
# step time. Between runs the GPU's clock moves (Note [interleaved timing] in
# mucudnn/bench.py: under the power cap the H200's SM clock ranged over
# 1545-1965 MHz), by about 2% from run to run on the H200, so a 1.5%
# difference between native and converted read off two runs is not resolved.
# ``--interleave ROUNDS`` compares the modes on one clock, as mucudnn's kernel
# timing does: after a model's, precision's and execution's runs, the training
# state of every mode is built at once (each from the same initial weights,
# with its own optimizer and input batch, and for graph execution its own
# captured graph), each is warmed up, and then ROUNDS rounds each run
# ``--interleave-steps`` timed steps of every mode in turn, the order rotated
# by one each round so that no mode always comes first in a round (and, for
# three modes or more, reversed every n rounds: Note [balanced round order] in
# train_steps.py). Each mode's
# time is the median of all its steps; its difference from native is the
# median over rounds of (its median in the round / native's median in the
# same round) - 1, so drift between rounds cancels in each ratio. What
# interleaving does not remove is the choice cudnn.benchmark makes once per
# process (docs/BENCHMARKS.md, "`find_carry`": PyTorch's own ResNet-18 moved
# within a 2.6% band over five processes): native's interleaved steps run with
# this process's one choice, so only repeating the whole command measures it.
def interleaved_run(args: argparse.Namespace, name: str, precision: str, execution: str,
                    batch: int, init_state: dict, device: torch.device,
                    modes: Sequence[str]) -> dict:
    """Every mode's training state at once, warmed up, then ``--interleave``
    rounds of ``--interleave-steps`` steps of each (Note [interleaved steps]);
    the medians and the differences from native (or from the first mode, when
    native is not among them: the key says which)."""
    modes = list(modes)
    jobs: list[TrainJob] = []
    try:
        for mode in modes:
            jobs.append(TrainJob(args, name, mode, precision, execution, batch, init_state,
                                 device))
            jobs[-1].warm_up(args.warmup)
        times = time_rounds(jobs, args.interleave, args.interleave_steps, device)
    finally:
        for job in jobs:
            job.release()
        jobs.clear()
    reference = "native" if "native" in modes else modes[0]
    step_ms = dict(zip(modes, times))
    return {"model": name, "precision": precision, "execution": execution, "batch": batch,
            "rounds": args.interleave, "steps_per_round": args.interleave_steps,
            "warmup": args.warmup, "modes": modes, "order": "rotated by one each round",
            "reference": reference, **interleaved_stats(step_ms, reference), "step_ms": step_ms}


def interleaved_rows(entry: dict) -> list[str]:
    """The markdown table rows of one :func:`interleaved_run` result, a row per mode."""
    ref = entry["reference"]
    rel = entry[f"rel_vs_{ref}"]
    return [f"| {entry['model']} | {entry['precision']} | {entry['execution']} | {m} | "
            f"{entry['batch']} | {entry['median_ms'][m]:.3f} | "
            f"{f'{100 * rel[m]:+.2f}%' if m in rel else '-'} |" for m in entry["modes"]]


# -- constrained memory ---------------------------------------------------------------------------
def _index(device: torch.device) -> int:
    """The CUDA device ordinal (set_per_process_memory_fraction needs one)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def search_largest_batch(try_batch: Callable[[int], bool], candidates: Sequence[int],
                         refine: int = 2, quantum: int = 16) -> tuple[int | None, dict[int, bool]]:
    """The largest batch for which ``try_batch`` succeeds: ascend ``candidates``
    until the first failure, then bisect (multiples of ``quantum``) ``refine``
    times between the last success and that failure. Returns (best, tried).

    >>> search_largest_batch(lambda b: b <= 200, [64, 128, 256, 512], refine=3)
    (192, {64: True, 128: True, 256: False, 192: True, 224: False, 208: False})
    """
    tried: dict[int, bool] = {}
    best, fail = None, None
    for b in sorted(candidates):
        ok = tried[b] = bool(try_batch(b))
        if not ok:
            fail = b
            break
        best = b
    lo = best if best is not None else 0
    for _ in range(max(0, refine)):
        if fail is None:
            break
        mid = (lo + fail) // 2 // quantum * quantum
        if mid <= lo or mid >= fail or mid < 1:
            break
        ok = tried[mid] = bool(try_batch(mid))
        if ok:
            lo = best = mid
        else:
            fail = mid
    return best, tried


def constrained(args: argparse.Namespace, name: str, mode: str, init_state: dict,
                device: torch.device, log: Callable[[str], None]) -> dict:
    total = torch.cuda.get_device_properties(device).total_memory
    # Every mode's workspace comes from torch's caching allocator (mucudnn.torch
    # takes it there per call, as native convolutions do), so one fraction for all.
    reserve = 0
    fraction = max(0.0, min(1.0, (args.memory - reserve) / total))
    results: dict[int, dict] = {}

    # three warm-up steps: the first step's stand-ins are planned by the third, so the
    # timed steps are steady ones (See Note [planning after the first step])
    def attempt(b: int) -> bool:
        cleanup(device)
        torch.cuda.set_per_process_memory_fraction(fraction, _index(device))
        try:
            r = train_run(args, name, mode, args.constrained_precision, "eager", b, init_state,
                          device,
                          steps=args.constrained_steps, warmup=3, keep_losses=0)
            results[b] = r
            log(f"  constrained {name} {mode} batch {b}: ok, {r['images_per_s']:.0f} img/s")
            return True
        except Exception as exc:  # noqa: BLE001 - out of memory is the expected failure
            if not is_oom(exc):
                raise
            log(f"  constrained {name} {mode} batch {b}: out of memory")
            return False
        finally:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(1.0, _index(device))

    best, tried = search_largest_batch(attempt, args.constrained_batches, args.refine)
    r = results.get(best) if best is not None else None
    return {"model": name, "mode": mode, "precision": args.constrained_precision,
            "memory_bytes": args.memory,
            "workspace_reserve_bytes": reserve, "memory_fraction": fraction,
            "largest_batch": best, "images_per_s": r["images_per_s"] if r else None,
            "median_step_ms": r["median_step_ms"] if r else None,
            "max_memory_allocated": r["max_memory_allocated"] if r else None,
            "device_memory_used": r["device_memory_used"] if r else None,
            "tried": {str(k): v for k, v in tried.items()}}


# -- the whole benchmark --------------------------------------------------------------------------------
def loss_tracking(runs: list[dict], reference: Sequence[dict] = ()) -> list[dict]:
    """Max relative difference of each converted (or ``native-heur``, Note
    [loss noise floor]) run's losses from the native run of the same model,
    precision and execution: this run's, else ``reference``'s (the runs of an
    earlier report). A native run is compared with ``reference``'s native run
    (run to run, Note [deterministic loss check]). Each entry has the per-step
    differences, ``rel_diffs``.

    >>> ref = [{"model": "m", "precision": "p", "execution": "e", "mode": "native",
    ...         "losses": [2.0, 1.0]}]
    >>> heur = [{"model": "m", "precision": "p", "execution": "e", "mode": "native-heur",
    ...          "losses": [2.0, 1.002]}]
    >>> t = loss_tracking(heur, ref)[0]
    >>> round(t["max_rel_diff"], 6), t["reference"], [round(d, 6) for d in t["rel_diffs"]]
    (0.002, 'reference', [0.0, 0.002])
    >>> again = [{**ref[0], "losses": [2.0, 1.0]}]
    >>> [(t["mode"], t["max_rel_diff"]) for t in loss_tracking(again, ref)]
    [('native', 0.0)]
    """
    def natives(rs: Iterable[dict]) -> dict:
        return {(r["model"], r["precision"], r["execution"]): r["losses"]
                for r in rs if r.get("mode") == "native" and r.get("losses")}
    here, earlier = natives(runs), natives(reference)
    out = []
    for r in runs:
        key = (r["model"], r["precision"], r["execution"])
        native = r.get("mode") == "native"
        ref = earlier.get(key) if native else here.get(key, earlier.get(key))
        if not r.get("losses") or ref is None:
            continue
        n = min(len(ref), len(r["losses"]))
        diffs = [abs(a - b) / abs(b) if b else abs(a - b) for a, b in zip(r["losses"][:n], ref[:n])]
        worst = max(diffs) if diffs else math.nan
        out.append({"model": r["model"], "mode": r["mode"], "precision": r["precision"],
                    "execution": r["execution"], "steps_compared": n, "max_rel_diff": worst,
                    "within_1e-3": bool(worst <= LOSS_TRACK_TOL),
                    "reference": "this run" if key in here and not native else "reference",
                    "rel_diffs": diffs})
    return out


def ordered_modes(modes: Sequence[str]) -> list[str]:
    """The order in which modes run: as in MODES, but WD before WR (WD benchmarks
    under the larger cap, whose cache entries also serve WR).

    >>> ordered_modes(["native-heur", "wr", "wd", "native"])
    ['native', 'wd', 'wr', 'native-heur']
    """
    return sorted(modes, key=lambda m: MODES.index(m) if m != "wd" else 0.5)


def plan_runs(args: argparse.Namespace, device: torch.device) -> list[tuple[str, str, str, str]]:
    """(model, precision, mode, execution) of every run, grouped by model,
    precision and execution (graph execution only on CUDA)."""
    execs = list(EXECUTIONS) if args.execution == "both" else [args.execution]
    if device.type != "cuda":
        execs = [e for e in execs if e == "eager"]
    modes = ordered_modes(args.modes)
    return [(m, p, mode, e) for m in args.models for p in args.precisions for e in execs
            for mode in modes]


def _row(r: dict) -> str:
    mem = r.get("max_memory_allocated")
    used = r.get("device_memory_used")
    return (f"{r['model']:9s} {r['precision']:10s} {r['execution']:5s} {r['mode']:6s} "
            f"{r['batch']:5d} {r['median_step_ms']:9.2f} {r['images_per_s']:9.0f} "
            f"{format_bytes(mem) if mem is not None else '-':>10s} "
            f"{format_bytes(used) if used is not None else '-':>10s}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    started = time.perf_counter()
    report: dict[str, Any] = {"environment": environment(device), "args": {
        k: v for k, v in vars(args).items()}, "runs": [], "loss_tracking": [],
        "constrained": [], "skipped": [], "interleaved": []}

    def log(msg: str) -> None:
        print(msg, flush=True)

    reference: list[dict] = []
    if args.reference:
        with open(args.reference, encoding="utf-8") as f:
            reference = list(json.load(f).get("runs", []))

    def save() -> None:
        report["loss_tracking"] = loss_tracking(report["runs"], reference)
        if args.json:
            d = os.path.dirname(os.path.abspath(args.json))
            os.makedirs(d, exist_ok=True)
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1, default=str)

    def out_of_time() -> bool:
        return args.max_seconds is not None and time.perf_counter() - started > args.max_seconds

    inits: dict[str, dict] = {}

    def init_state(name: str) -> dict:
        if name not in inits:
            torch.manual_seed(args.seed)
            inits[name] = build_model(name).state_dict()  # its _metadata too (MNASNet reads it)
        return inits[name]

    def attempt(tag: str, fields: dict, work: Callable[[], dict]) -> dict | None:
        """``work()``'s record, or one with the error (a failed run must not end
        the benchmark); None, and a skip noted, past --max-seconds."""
        if out_of_time():
            report["skipped"].append({"run": tag, "reason": "--max-seconds reached"})
            return None
        log(f"run {tag} batch {fields['batch']} ...")
        cleanup(device)
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 - recorded as a failed run
            log(f"  FAILED: {type(exc).__name__}: {exc}")
            return {**fields, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()}

    def one_run(name: str, mode: str, precision: str, execution: str, batch: int) -> dict:
        r = train_run(args, name, mode, precision, execution, batch, init_state(name), device)
        log(f"  {r['median_step_ms']:.2f} ms/step, {r['images_per_s']:.0f} img/s, "
            f"first step {r['first_step_s']:.1f} s")
        return r

    def interleave(name: str, precision: str, execution: str) -> None:
        modes = ordered_modes(args.modes)
        batch = args.batch or DEFAULT_BATCH[name]

        def work() -> dict:
            e = interleaved_run(args, name, precision, execution, batch, init_state(name),
                                device, modes)
            rel = e[f"rel_vs_{e['reference']}"]
            log("  " + ", ".join(f"{m} {e['median_ms'][m]:.2f} ms/step"
                                 + (f" ({100 * rel[m]:+.2f}%)" if m in rel else "")
                                 for m in modes))
            return e

        e = attempt(f"interleaved {name} {precision} {execution} {' '.join(modes)}",
                    {"model": name, "precision": precision, "execution": execution,
                     "batch": batch, "modes": modes}, work)
        if e is not None:
            cleanup(device)
            report["interleaved"].append(e)
            save()

    runs = [] if args.constrained_only else plan_runs(args, device)
    bar = tqdm(total=len(runs), unit="run") if (args.progress and tqdm and runs) else None
    # runs come grouped by (model, precision, execution); Note [interleaved steps] after each
    for (name, precision, execution), group in itertools.groupby(
            runs, key=lambda run: (run[0], run[1], run[3])):
        for _, _, mode, _ in group:
            batch = args.batch or DEFAULT_BATCH[name]

            r = attempt(f"{name} {precision} {execution} {mode}",
                        {"model": name, "mode": mode, "precision": precision,
                         "execution": execution, "batch": batch},
                        functools.partial(one_run, name, mode, precision, execution, batch))
            if r is None:
                continue
            report["runs"].append(r)
            save()
            if bar is not None:
                bar.update()
        if args.interleave:
            interleave(name, precision, execution)
    if bar is not None:
        bar.close()
    if args.constrained or args.constrained_only:
        for name in args.constrained_models:
            for mode in args.modes:
                if out_of_time():
                    report["skipped"].append({"run": f"constrained {name} {mode}",
                                              "reason": "--max-seconds reached"})
                    continue
                log(f"constrained {name} {mode} under {format_bytes(args.memory)} ...")
                try:
                    c = constrained(args, name, mode, init_state(name), device, log)
                except Exception as exc:  # noqa: BLE001
                    c = {"model": name, "mode": mode, "error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()}
                    log(f"  FAILED: {c['error']}")
                report["constrained"].append(c)
                save()
    cleanup(device)
    report["elapsed_s"] = time.perf_counter() - started
    save()
    # the short table, last
    ok = [r for r in report["runs"] if "error" not in r]
    if ok:
        log(f"\n{'model':9s} {'prec':4s} {'exec':5s} {'mode':6s} {'batch':>5s} "
            f"{'ms/step':>9s} {'img/s':>9s} {'max alloc':>10s} {'dev used':>10s}")
        for r in ok:
            log(_row(r))
    inter = [e for e in report["interleaved"] if "error" not in e]
    if inter:
        ref = inter[0]["reference"]  # every block has the same modes
        vs = f"vs {ref}" + ("" if ref == "native" else " (native not among the modes)")
        log(f"\ninterleaved (Note [interleaved steps]): median ms/step over all rounds; {vs}: "
            "median over rounds of round median / reference's - 1")
        log(f"| model | precision | execution | mode | batch | ms/step | {vs} |")
        log("|---|---|---|---|---|---|---|")
        for e in inter:
            for row in interleaved_rows(e):
                log(row)
    for t in report["loss_tracking"]:
        src = "" if t.get("reference") != "reference" else " (--reference's)"
        log(f"losses {t['model']} {t['precision']} {t['execution']} {t['mode']} vs native{src}: "
            f"max rel diff {t['max_rel_diff']:.2e} over {t['steps_compared']} steps")
    for c in report["constrained"]:
        if "error" in c:
            continue
        ips = f"{c['images_per_s']:.0f} img/s" if c["images_per_s"] else "-"
        log(f"constrained {c['model']} {c['mode']}: largest batch {c['largest_batch']} ({ips})")
    failed = [r for r in report["runs"] + report["constrained"] + report["interleaved"]
              if "error" in r]
    for r in failed:
        log(f"FAILED {r['model']} {r.get('precision', '')} {r.get('execution', '')} "
            f"{r.get('mode', 'interleaved')}: {r['error']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
