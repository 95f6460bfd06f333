#!/usr/bin/env python
"""Training across torchvision's model zoo: native PyTorch vs models converted by mucudnn.torch.

For each model named by ``--models`` (any classification or segmentation name
``torchvision.models.get_model`` knows, ``unet``, the U-Net with transposed
convolutions, or ``tiny``, a small built-in CNN for smoke tests), each
precision (``fp32cl``: float32 with TF32, channels-last; ``amp``: autocast
bfloat16, channels-last) and each execution (``eager``;
``graph``: the whole training step captured with ``torch.cuda.graph`` after the
warm-up), on synthetic data with SGD, it compares two sides:

* ``native``: PyTorch's own convolutions, ``torch.backends.cudnn.benchmark=True``;
* ``converted``: ``mucudnn.torch.convert(model, workspace_limit=--workspace)``
  (with ``--backend-option KEY=VALUE``: on a cudnn-graph backend with those
  options, e.g. ``find_hold=True``).

Measured per model and precision:

* step time: both sides' training states built at once, warmed up, two
  untimed rotations of the rounds (Note [a warm rotation] in train_steps.py),
  then ``--rounds`` rounds of ``--steps`` timed steps of each side in turn
  (Note [interleaved steps] in train_bench.py; Note [balanced round order] in
  train_steps.py): each side's median step and
  the median over rounds of converted/native, and per round the CUDA graphs
  the converted side captured and the launches it issued directly;
* peak memory of each side's steady-state steps (``max_memory_allocated`` and
  the peak of requested bytes, Note [memory per side]) and the drop of
  ``mem_get_info``'s free bytes;
* with ``--cold``: the wall seconds of each side's first training step in a
  fresh process, the converted side with an empty mucudnn benchmark cache
  (``--cold-repeat N``: the medians of N such pairs);
* with ``--grad-check``: one steady step's gradients of each side against
  float64, and the converted first step's (Note [gradient check] in
  grad_error.py);
* the converted model's ``mucudnn.torch.report`` (which layers run mucudnn's
  plans), where the installed mucudnn has one.

With ``--control`` the converted side is a second native model (Note [control
runs]): the ratio then measures the harness, not mucudnn.

segmentation models (fcn_*, deeplabv3_*, lraspp_*, unet) train on their
logits (torchvision's ``out``) with per-pixel cross-entropy on random labels; inception_v3 runs at
299x299. A failed stage (out of memory, a capture that does not work for a
model) is recorded and the rest goes on. Results go to ``--json`` after every
model and precision; a markdown table with the geometric mean of the ratios
per precision is printed last. ``--isolate`` runs each model (all its
precisions) in a process of its own, so a crash in native code ends only that
one (Note [isolated models] in zoo_isolated.py). mucudnn
must be importable (installed, or ``PYTHONPATH`` set to the checkout).
Examples::

    python tools/zoo_bench.py --models resnet50 mobilenet_v2 --json docs/results/zoo.json
    python tools/zoo_bench.py --models efficientnet_b0 --precisions amp --execution eager graph
    python tools/zoo_bench.py --models fcn_resnet50 convnext_tiny --cold --grad-check --isolate
    python tools/zoo_bench.py --device cpu --models tiny --batch 2 --size 32   # smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import faulthandler
import json
import math
import os
import statistics
import sys
import time
import traceback
import types
from typing import Any, Callable, Sequence

import torch
from torch import nn

import train_bench as tb  # tools/, beside this script: argument types, the progress bar
import train_steps as ts  # training state, timing, rounds
from frontier import parse_option  # tools/: KEY=VALUE of --backend-option
from round_stats import extra_rounds, geomean, ratio_text  # ratios, rounds
from results_tables import side_peak  # tools/: the peak the zoo compares
import grad_error  # tools/: the relative error against float64
import zoo_cold  # tools/: cold first steps in fresh processes
import zoo_isolated  # tools/: --isolate's child processes
from zoo_models import (  # noqa: F401  (tools/: the models; SegmentationLogits for callers)
    BATCH, BUILT_IN, ModelSpec, SegmentationLogits, build_model, model_spec, zoo_names)
import mucudnn.torch as mt
from mucudnn.backends import get_backend

torchvision = ts.torchvision
tqdm = tb.tqdm

SIDES = zoo_cold.SIDES  # ("native", "converted")
PRECISIONS = ("fp32cl", "amp")
EXECUTIONS = ("eager", "graph")
#: the memory of each side is read over this many steps after its warm-up
MEMORY_STEPS = 2
#: timed rounds where --rounds is not given (host-bound steps vary round to round),
#: rounded up to balance the order of three sides (Note [balanced round order] in
#: train_steps.py)
ROUNDS = 16


# -- models: tools/zoo_models.py ---------------------------------------------------------------
class ZooJob(ts.TrainJob):
    """train_bench's training state (warm-up, capture, timed steps, release) for
    any zoo model: a side's model and optimizer, static inputs and labels
    (per-pixel for segmentation), channels-last in both precisions."""

    def __init__(self, args: argparse.Namespace, spec: ModelSpec, side: str, precision: str,
                 execution: str, init_state: dict, device: torch.device) -> None:
        # TrainJob's attributes, made for a zoo model (its own __init__ builds train_bench's)
        self.mode = "wr" if side == "converted" else "native"
        self.precision, self.execution, self.device = precision, execution, device
        self.graphed, self.amp, self.deterministic = execution == "graph", precision == "amp", False
        self.num_classes = spec.num_classes
        self.set_flags()
        model = build_model(spec)
        model.load_state_dict(init_state)
        self.model = model.to(device).to(memory_format=torch.channels_last)
        if side == "converted" and not args.control:  # Note [control runs]
            mt.convert(self.model, workspace_limit=args.workspace,
                       backend=converted_backend(args, device))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        b, s = args.batch, spec.size
        self.x = torch.empty(b, 3, s, s, device=device, memory_format=torch.channels_last)
        shape = (b, s, s) if spec.task == "segmentation" else (b,)
        self.t = torch.empty(shape, dtype=torch.long, device=device)
        self.gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        self.graph = None
        self.static_loss = None

    def next_batch(self) -> None:
        self.x.normal_(generator=self.gen)
        self.t.random_(0, self.num_classes, generator=self.gen)


# -- arguments ------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    ap.add_argument("--models", nargs="+", default=["resnet50"], metavar="NAME",
                    help="torchvision classification or segmentation models, unet or tiny "
                         "(space- or comma-separated)")
    ap.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=None,
                    help="default: fp32cl amp (fp32cl on the CPU)")
    ap.add_argument("--execution", nargs="+", choices=EXECUTIONS, default=["eager"])
    ap.add_argument("--no-steps", action="store_true",
                    help="no step timing: only --cold and --grad-check (which need no warm side)")
    ap.add_argument("--batch", type=tb._positive, default=BATCH,
                    help=f"mini-batch (default {BATCH})")
    ap.add_argument("--size", type=tb._positive, default=None,
                    help="image side (default 224; 32 for tiny; inception_v3 always 299)")
    ap.add_argument("--workspace", type=tb.parse_size, default=64 << 20,
                    help="the converted side's workspace limit per kernel (default 64MiB)")
    ap.add_argument("--warmup", type=tb._positive, default=16,
                    help="untimed steps per side first (>= 3 before a capture; default 16: "
                         "the converted side's step trial ends within them)")
    ap.add_argument("--rounds", type=tb._positive, default=None,
                    help=f"timed rounds (default {ROUNDS}, and with --with-control "
                         f"{ts.balanced_rounds(ROUNDS, 3)}, a multiple of 6: "
                         "Note [balanced round order] in train_steps.py)")
    ap.add_argument("--steps", type=tb._positive, default=5,
                    help="timed steps per side and round (default 5)")
    ap.add_argument("--resolve", type=float, default=0.0, metavar="SECONDS",
                    help="a row whose ratio's interval holds the 1.02 target after --rounds "
                         "gets as many rounds more as SECONDS buy (Note [resolving a ratio] "
                         "in round_stats.py; default 0: none)")
    ap.add_argument("--control", action="store_true",
                    help="an A/A run: the 'converted' side is a second native model (Note "
                         "[control runs]); its JSON is not a result tools/results_page.py shows")
    ap.add_argument("--with-control", action="store_true",
                    help="a third side, a second native model timed in the same rounds: each "
                         "row's A/A ratio beside converted/native (Note [control runs])")
    ap.add_argument("--cold", action="store_true",
                    help="first-step seconds of each side in a fresh process (Note [cold steps])")
    ap.add_argument("--cold-profile", type=int, default=0, metavar="N",
                    help="profile each cold first step on the host (cProfile) and keep its N "
                         "functions of most cumulative and of most own time; the step's "
                         "seconds are then profiled ones (Note [cold steps])")
    ap.add_argument("--cold-repeat", type=tb._positive, default=1, metavar="N",
                    help="N fresh-process pairs per model, the sides' order alternating; each "
                         "side's figures are the medians (Note [cold steps]; default 1)")
    ap.add_argument("--cold-steps", type=tb._positive, default=8, metavar="N",
                    help="steps each --cold process times, one by one, from its first (Note "
                         "[cold steps]; at least 2, default 8)")
    ap.add_argument("--cold-timeout", type=float, default=300.0,
                    help="seconds allowed for each --cold process (default 300)")
    ap.add_argument("--grad-check", action="store_true",
                    help="one step's gradient errors against float64 (Note [gradient check] "
                         "in grad_error.py)")
    ap.add_argument("--grad-batch", type=tb._positive, default=None,
                    help="mini-batch of --grad-check (default: --batch, so that the layers "
                         "over the limit are those of the timed steps; Note [gradient check])")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no model or precision (no model, with --isolate) that the "
                         "longest one so far would carry past this many seconds (a run cut "
                         "short by an outer time limit loses the model in progress)")
    ap.add_argument("--json", default=None, help="write all numbers here (after every model)")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    ap.add_argument("--isolate", action="store_true",
                    help="each model (all its precisions) in a process of its own "
                         "(Note [isolated models])")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds allowed for each precision of an --isolate process "
                         "(default 600)")
    ap.add_argument("--backend-option", action="append", type=parse_option, default=[],
                    metavar="KEY=VALUE", dest="backend_options",
                    help="an option of the converted side's cudnn-graph backend (repeatable; "
                         "e.g. find_hold=True); none: the default backend")
    ap.add_argument("--cold-child", choices=SIDES, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    classification, segmentation = zoo_names()
    known = {*BUILT_IN, *classification, *segmentation}
    args.models = list(dict.fromkeys(m for item in args.models for m in item.split(",") if m))
    if not args.models:
        ap.error("--models: expected at least one model name")
    unknown = [m for m in args.models if m not in known]
    if unknown:
        hint = ("torchvision is not installed: only tiny and unet" if torchvision is None else
                "see torchvision.models.list_models() (classification, segmentation)")
        ap.error(f"--models: unknown {', '.join(unknown)} ({hint})")
    if args.precisions is None:
        args.precisions = list(PRECISIONS) if args.device == "cuda" else ["fp32cl"]
    if args.device == "cpu" and ("amp" in args.precisions or "graph" in args.execution):
        ap.error("--device cpu: runs fp32cl eager only (no autocast or CUDA graphs there)")
    if args.with_control and args.control:
        ap.error("--with-control: --control already times native against native")
    if args.rounds is None:  # Note [balanced round order] in train_steps.py
        args.rounds = ts.balanced_rounds(ROUNDS, len(SIDES) + args.with_control)
    if args.resolve < 0:
        ap.error("--resolve: seconds >= 0")
    if args.cold_steps < 2:
        ap.error("--cold-steps: at least 2 (the first step and the second)")
    if args.cold_profile < 0 or (args.cold_profile and not (args.cold or args.cold_child)):
        ap.error("--cold-profile: a number of functions >= 0, with --cold")
    if args.no_steps and not (args.cold or args.grad_check):
        ap.error("--no-steps: give --cold or --grad-check (there is nothing else to measure)")
    if "graph" in args.execution and args.warmup < 3:
        ap.error("--warmup: CUDA-graph capture needs at least 3 warm-up steps")
    if args.backend_options and args.device != "cuda":
        ap.error("--backend-option: the cudnn-graph backend's options need --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA GPU (use --device cpu for a smoke test)")
    return args


# -- step time and memory -------------------------------------------------------------------------
def step_stats(step_ms: dict[str, Sequence[Sequence[float]]]) -> dict[str, Any]:
    """Per side the median of all its step times (ms, per round), and the
    median over rounds of (converted's round median / native's).

    With a ``control`` side (``--with-control``), the same for control / native.

    >>> s = step_stats({"native": [[10, 12], [20, 22]], "converted": [[11, 13], [21, 24]]})
    >>> s["native_ms"], s["converted_ms"], s["round_ratios"], round(s["ratio"], 4)
    (16.0, 17.0, [1.0909090909090908, 1.0714285714285714], 1.0812)
    >>> step_stats({"native": [[10], [20]], "converted": [[11], [21]],
    ...             "control": [[10], [19]]})["control_round_ratios"]
    [1.0, 0.95]
    """
    st = ts.interleaved_stats(step_ms, "native")
    rounds = st["round_median_ms"]

    def ratios(side: str) -> list[float]:
        return [c / n for c, n in zip(rounds[side], rounds["native"])]
    out = {"native_ms": st["median_ms"]["native"], "converted_ms": st["median_ms"]["converted"],
           "ratio": statistics.median(ratios("converted")), "round_ratios": ratios("converted"),
           "step_ms": step_ms}
    if "control" in step_ms:
        out.update(control_ratio=statistics.median(ratios("control")),
                   control_round_ratios=ratios("control"))
    return out


# Note [control runs]
# ~~~~~~~~~~~~~~~~~~~
# The two sides are built one after the other and time their steps in turns,
# so the harness itself may favour one (allocator state, order, what the other
# side left cached). With --control the "converted" side is a second native
# model built exactly as the first: its ratio is the harness's bias and noise
# for that model, against which a converted/native ratio is read. With
# --with-control that second native model is a third side in the same rounds,
# so each row carries its own A/A ratio.
#
# See Note [the whole-step trial] (mucudnn/torch/step_trial.py) for --warmup's default.
#
# Note [memory per side]
# ~~~~~~~~~~~~~~~~~~~~~~
# Both sides' training states live together for the interleaved rounds, so a
# peak read while one side steps would include the other's weights, gradients
# and momenta. Each side is therefore built, warmed up and measured
# (MEMORY_STEPS steady-state steps, peak statistics reset before them) before
# the next side is built, and torch.cuda.memory_allocated just before building
# it (what earlier sides hold, idle) is subtracted from its peak. The
# free-bytes drop is read over the same span after empty_cache, so blocks
# cached by an earlier side are not reused unseen; it includes what torch's
# allocator reserves beyond the peak, the CUDA graph pools and any memory
# allocated outside torch. What a process allocates once and keeps (cuBLAS
# takes its workspace per stream from torch's allocator, for one) counts in
# the first side's peak only, so a second native model (--with-control) read
# lower than the first, as the converted side did. So on CUDA a primer, a
# native model of the same execution warmed up and dropped, runs before the
# first side.
#
# The allocated peak also depends on what the caching allocator holds when a
# side runs, not on the side alone: a request served from a cached block of
# the large pool takes the whole block, counted in allocated bytes, unless
# more than 1 MiB would be left over (PyTorch's block-splitting rule), so the
# same requests read up to 1 MiB more each after another side's history. Each
# side therefore also records its peak of requested bytes (the sizes its
# tensors asked for, ``requested_bytes.all.peak`` less what was requested
# before it was built), which no cached block changes; the zoo's comparison of
# peaks reads it where a file has it.
def _requested(device: torch.device, which: str) -> int | None:
    """The caching allocator's requested bytes on ``device``, ``which`` is
    ``"current"`` or ``"peak"``; None where this torch does not count them
    (the comparison then reads the allocated peak, never a zero)."""
    return torch.cuda.memory_stats(device).get(f"requested_bytes.all.{which}")


def _requested_peak(device: torch.device, asked: int | None) -> int | None:
    """The requested-bytes peak since the last reset, less ``asked`` (what was
    requested before the side was built); None where either is not counted."""
    peak = _requested(device, "peak")
    return None if peak is None or asked is None else peak - asked


def _prime(args: argparse.Namespace, spec: ModelSpec, precision: str, execution: str,
           init_state: dict, device: torch.device) -> None:
    """The primer of Note [memory per side]."""
    job = ZooJob(args, spec, "native", precision, execution, init_state, device)
    try:
        job.warm_up(3)
        ts.sync(device)
    finally:
        job.release()
    ts.cleanup(device)


def measure_steps(args: argparse.Namespace, spec: ModelSpec, precision: str, execution: str,
                  init_state: dict, device: torch.device, log: Callable[[str], None],
                  entry: dict) -> dict:
    """Both sides' memory (Note [memory per side]) and interleaved step times."""
    cuda = device.type == "cuda"
    out: dict[str, Any] = {"memory": {}}
    jobs: list[ZooJob] = []
    sides = SIDES + ("control",) if args.with_control else SIDES
    try:
        for side in sides:
            if not jobs:
                ts.cleanup(device)
                if cuda:
                    _prime(args, spec, precision, execution, init_state, device)
            elif cuda:
                torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(device) if cuda else 0
            asked = _requested(device, "current") if cuda else None
            free0 = ts.free_bytes(device)
            t0 = time.perf_counter()
            job = ZooJob(args, spec, side, precision, execution, init_state, device)
            jobs.append(job)
            job.warm_up(args.warmup)
            ts.sync(device)
            log(f"  {execution} {side}: built and warmed up in {time.perf_counter() - t0:.1f} s")
            if side == "converted" and "report" not in entry and not args.control:
                add_report(job.model, entry, log, converted_backend(args, device))
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            job.timed_steps(MEMORY_STEPS, ts.Timer(device))
            ts.sync(device)
            free1 = ts.free_bytes(device)
            out["memory"][side] = {
                "peak_bytes": torch.cuda.max_memory_allocated(device) - base if cuda else None,
                "requested_peak_bytes": _requested_peak(device, asked) if cuda else None,
                "device_used_bytes": free0 - free1 if cuda else None}  # type: ignore[operator]
        ts.warm_rotation(jobs, device)  # Note [a warm rotation] in train_steps.py
        per_round = ts.ReplayRounds()
        t0 = time.perf_counter()
        times = ts.time_rounds(jobs, args.rounds, args.steps, device, after_round=per_round)
        st = step_stats(dict(zip(sides, times)))
        more = ts.balanced_rounds(extra_rounds(st["round_ratios"], args.resolve,
                                               (time.perf_counter() - t0) / args.rounds), len(sides))
        if more:  # Note [resolving a ratio] in round_stats.py
            log(f"  {execution}: the interval holds the target; {more} rounds more")
            later = ts.time_rounds(jobs, more, args.steps, device, first=args.rounds,
                                   after_round=per_round)
            st = step_stats(dict(zip(sides, [a + b for a, b in zip(times, later)])))
        out.update(st, extra_rounds=more,
                   replay=per_round.total(), replay_rounds=per_round.as_dict())
    finally:
        for job in jobs:
            job.release()
        jobs.clear()
        ts.cleanup(device)
    return out


#: the converted side's backend made from --backend-option, per device (the
#: options are the process's own)
_BACKENDS: dict[int, Any] = {}


def converted_backend(args: argparse.Namespace, device: torch.device) -> Any:
    """The converted side's backend: None (the default one) without
    ``--backend-option``, else one cudnn-graph backend with those options per
    process and device."""
    if not args.backend_options:
        return None
    index = device.index or 0
    if index not in _BACKENDS:
        _BACKENDS[index] = get_backend("cudnn-graph", device=index, **dict(args.backend_options))
    return _BACKENDS[index]


def add_report(model: nn.Module, entry: dict, log: Callable[[str], None],
               backend: Any = None) -> None:
    """mucudnn.torch.report's account of the converted model (where it exists);
    ``backend``: the one it was converted with (None: the default)."""
    if not hasattr(mt, "report"):
        return
    try:
        rep = mt.report(model)
        entry["report"] = rep.as_dict() | {"find_profile": ts.find_profile(
            next(model.parameters()).device, backend)}
        log(str(rep))
    except Exception as exc:  # noqa: BLE001 - a report is optional; the timing goes on
        entry.setdefault("errors", {})["report"] = f"{type(exc).__name__}: {exc}"


# -- cold first steps (Note [cold steps] in zoo_cold.py) --------------------------------------
def cold_child(args: argparse.Namespace) -> int:
    """One side's first ``--cold-steps`` steps in this fresh process, each timed
    (Note [cold steps] in zoo_cold.py), printed as JSON after
    :data:`zoo_cold.COLD_PREFIX`."""
    device = torch.device(args.device)
    spec = model_spec(args.models[0], args.size)
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    init_state = build_model(spec).state_dict()
    job = ZooJob(args, spec, args.cold_child, args.precisions[0], "eager", init_state, device)
    ts.sync(device)
    build_s = time.perf_counter() - t0
    seconds, out = [], {}
    for i in range(args.cold_steps):
        job.next_batch()
        ts.sync(device)
        t1 = time.perf_counter()
        if i == 0 and args.cold_profile > 0:
            def first() -> None:
                job.step()
                ts.sync(device)
            _, out["profile"] = ts.host_profile(first, args.cold_profile)
            out["profiled"] = True
        else:
            job.step()
            ts.sync(device)
        seconds.append(time.perf_counter() - t1)
    if args.cold_child == "converted":
        # Note [first-call seconds] in mucudnn/torch/native.py: what the first calls paid for
        out["first_calls"] = mt.report(job.model).as_dict().get("first_calls")
        out["find_profile"] = ts.find_profile(device, converted_backend(args, device))
    print(zoo_cold.COLD_PREFIX + json.dumps({"first_step_s": seconds[0],
                                             "second_step_s": seconds[1],
                                             "steps_s": seconds, "steps_total_s": sum(seconds),
                                             "build_s": build_s, **out}), flush=True)
    return 0


# -- gradient check (Note [gradient check] in grad_error.py) ------------------------------------
def grad_check(args: argparse.Namespace, spec: ModelSpec, precision: str,
               device: torch.device) -> dict:
    """Native's and converted's gradient errors against float64 in a steady
    step, and the converted first step's (its stand-ins): Note [gradient
    check] in grad_error.py."""
    torch.manual_seed(args.seed)
    base = grad_error.deterministic_train(build_model(spec))
    gen = torch.Generator().manual_seed(args.seed + 2)
    b, s = args.grad_batch or args.batch, spec.size
    x = torch.randn(b, 3, s, s, generator=gen)
    t = torch.randint(0, spec.num_classes, (b, s, s) if spec.task == "segmentation" else (b,),
                      generator=gen).to(device)
    conv_keys = [f"{n}.weight" for n, m in base.named_modules()
                 if isinstance(m, (nn.Conv2d, nn.Conv3d))]
    ts.cleanup(device)
    _, g64 = grad_error.pass_grads(copy.deepcopy(base).double().to(device),
                                   x.double().to(device), t, False, passes=2)
    ts.cleanup(device)
    xs = x.to(device).contiguous(memory_format=torch.channels_last)
    out: dict[str, Any] = {"batch": b, "conv_layers": conv_keys}
    for side in SIDES:
        # the flags a ZooJob sets: cudnn.benchmark, TF32 per precision
        ts.TrainJob.set_flags(types.SimpleNamespace(  # type: ignore[arg-type]
            mode="native", precision=precision, deterministic=False))
        model = copy.deepcopy(base).to(device).to(memory_format=torch.channels_last)
        if side == "converted":
            mt.convert(model, workspace_limit=args.workspace,
                       backend=converted_backend(args, device))
        first, last = grad_error.pass_grads(model, xs, t, precision == "amp")
        out[side] = grad_error.grad_errors(last, g64, conv_keys)
        if side == "converted":  # its first step's stand-ins (Note [gradient check])
            out["planned_kernels"] = grad_error.planned_kernels(model)
            out["converted_first_step"] = grad_error.grad_errors(first, g64, conv_keys)
        del model
        ts.cleanup(device)
    n, c = out["native"]["all"], out["converted"]["all"]
    out["ratio"] = c / n if n else (math.inf if c else 1.0)
    return out


# -- the whole benchmark --------------------------------------------------------------------------
def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v / 2**20:.0f}"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def summary_lines(entries: Sequence[dict]) -> list[str]:
    """The markdown table (a row per model, precision and execution) and the
    geometric mean of the converted/native ratios per precision and execution.
    ``graphs captured/direct``: the converted side's CUDA-graph captures and
    direct launches in the timed rounds (Note [a warm rotation] in
    train_steps.py), with the host milliseconds of those captures where the
    file records them (Note [what replay costs the host] in
    mucudnn/exec/graph.py); ``-`` where no kernel replays."""
    lines = ["| model | precision | execution | native ms | converted ms | ratio | "
             "requested peak MiB native/converted | cold s native/converted | "
             "grad err native/converted | graphs captured/direct |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[tuple[str, str], list[float]] = {}
    for e in entries:
        cold, grad = e.get("cold", {}), e.get("grad") or {}
        cold_s = "/".join(_num(cold.get(s, {}).get("first_step_s"), ".1f") for s in SIDES)
        grad_s = "/".join(_num(grad.get(s, {}).get("all"), ".1e") for s in SIDES)
        # an entry measured without steps (--no-steps) still shows its cold and gradient figures
        for ex, st in (e.get("steps") or {"-": {}}).items():
            mem = st.get("memory", {})
            peak = "/".join(_mib(side_peak(mem.get(s))) for s in SIDES)
            if "ratio" in st:
                ratios.setdefault((e["precision"], ex), []).append(st["ratio"])
            replay = st.get("replay")
            graphs = "-" if not replay else f"{replay['captures']}/{replay['direct']}"
            if replay and "capture_s" in replay:
                graphs += f" ({1e3 * replay['capture_s']:.1f} ms)"
            lines.append(
                f"| {e['model']} | {e['precision']} | {ex} | {_num(st.get('native_ms'), '.2f')} | "
                f"{_num(st.get('converted_ms'), '.2f')} | {ratio_text(st)} | "
                f"{peak} | {cold_s} | {grad_s} | {graphs} |")
    for (p, ex), rs in ratios.items():
        lines.append(f"geometric mean converted/native, {p} {ex}: {geomean(rs):.3f} "
                     f"over {len(rs)} models")
    return lines


def run_model(args: argparse.Namespace, entry: dict, device: torch.device,
              log: Callable[[str], None], save: Callable[[], None]) -> None:
    """Every stage for ``entry``'s model and precision, filling it in and
    calling ``save`` after each (a crash in native code keeps what was done).
    A failed stage is recorded in ``errors`` (``oom`` lists the stages out of
    memory) and the rest goes on."""
    name, precision = entry["model"], entry["precision"]
    spec = model_spec(name, args.size)
    entry.update(task=spec.task, batch=args.batch, size=spec.size, steps={}, errors={})
    errors: dict[str, str] = entry["errors"]

    def stage(tag: str, work: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        log(f"{name} {precision}: {tag} ...")
        save()  # what the stages before stored
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 - recorded; the next stage runs
            errors[tag] = f"{type(exc).__name__}: {exc}"
            entry.setdefault("tracebacks", {})[tag] = traceback.format_exc()
            if ts.is_oom(exc):
                entry.setdefault("oom", []).append(tag)
            log(f"  {tag} FAILED: {errors[tag][:300]}")
            ts.cleanup(device)
            return None
        finally:
            log(f"  {tag}: {time.perf_counter() - t0:.1f} s")
            save()

    torch.manual_seed(args.seed)
    init_state = stage("build", lambda: build_model(spec).state_dict())
    if init_state is None:
        return
    for ex in [] if args.no_steps else args.execution:
        st = stage(ex, lambda ex=ex: measure_steps(args, spec, precision, ex, init_state, device,
                                                   log, entry))
        if st is not None:
            entry["steps"][ex] = st
            log(f"  {ex}: native {st['native_ms']:.2f} ms, converted {st['converted_ms']:.2f} ms, "
                f"ratio {st['ratio']:.3f}")
    if args.cold:
        entry["cold"] = {}
        primer = stage("cold primer", lambda: zoo_cold.run_cold(args, spec, precision, "native"))
        if primer is not None:
            entry["cold_primer"] = primer
        zoo_cold.run_cold_pairs(args, spec, precision, stage, entry["cold"])
        for side, c in entry["cold"].items():
            log(f"  cold {side}: first step {c['first_step_s']:.2f} s"
                + (f" (median of {len(c['first_step_samples'])})" if args.cold_repeat > 1 else ""))
    if args.grad_check:
        g = stage("grad-check", lambda: grad_check(args, spec, precision, device))
        if g is not None:
            entry["grad"] = g
            log(f"  grad error vs float64: native {g['native']['all']:.2e}, converted "
                f"{g['converted']['all']:.2e}")


def over_budget(elapsed: float, longest: float, max_seconds: float | None) -> str | None:
    """Why ``--max-seconds`` starts no further model after ``elapsed`` seconds,
    the longest model so far having taken ``longest`` (None: start it).

    >>> over_budget(100.0, 30.0, 120.0)
    '--max-seconds: the longest model so far (30 s) would end past it'
    >>> over_budget(130.0, 0.0, 120.0), over_budget(80.0, 30.0, 120.0), over_budget(1e9, 1.0, None)
    ('--max-seconds reached', None, None)
    """
    if max_seconds is None:
        return None
    if elapsed > max_seconds:
        return "--max-seconds reached"
    if elapsed + longest > max_seconds:
        return f"--max-seconds: the longest model so far ({longest:.0f} s) would end past it"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.cold_child:
        return cold_child(args)
    with contextlib.suppress(OSError, ValueError, AttributeError):  # stderr with no file
        faulthandler.enable()  # a crash in native code says where (the JSON keeps what was done)
    if args.isolate:
        zoo_isolated.stop_children_on_sigterm()
    device = torch.device(args.device)
    started = time.perf_counter()
    report: dict[str, Any] = {"environment": ts.environment(device), "options": vars(args),
                              "results": [], "skipped": []}
    pairs = [(m, p) for m in args.models for p in args.precisions]
    bar = (tqdm(total=len(pairs), unit="model", file=sys.stderr)
           if tqdm is not None and not args.no_progress else None)

    def log(msg: str) -> None:
        if bar is not None:
            bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    def save() -> None:
        report["elapsed_s"] = time.perf_counter() - started
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1, default=str)

    longest = 0.0  # seconds of the longest model (--isolate) or row so far
    for name, precs in ([(m, args.precisions) for m in args.models] if args.isolate
                        else [(m, [p]) for m, p in pairs]):
        why = over_budget(time.perf_counter() - started, longest, args.max_seconds)
        if why is not None:
            report["skipped"].extend({"model": name, "precision": p, "reason": why}
                                     for p in precs)
            continue
        if bar is not None:
            bar.set_description(f"{name} {' '.join(precs)}")
        t0 = time.perf_counter()
        if args.isolate:  # each row keeps the seconds its child gave it
            report["results"].extend(
                zoo_isolated.run_isolated(os.path.abspath(__file__), argv, args, name))
            took = time.perf_counter() - t0
        else:
            entry: dict[str, Any] = {"model": name, "precision": precs[0]}
            report["results"].append(entry)
            run_model(args, entry, device, log, save)
            took = entry["seconds"] = time.perf_counter() - t0
        longest = max(longest, took)
        log(f"{name} {' '.join(precs)}: took {took:.1f} s")
        save()
        if bar is not None:
            bar.update(len(precs))
    if bar is not None:
        bar.close()
    save()
    print("\n".join(summary_lines(report["results"])), flush=True)
    for e in report["results"]:
        for tag, err in e["errors"].items():
            print(f"FAILED {e['model']} {e['precision']} {tag}: {err[:300]}", flush=True)
    for s in report["skipped"]:
        print(f"skipped {s['model']} {s['precision']}: {s['reason']}", flush=True)
    # success: every model measured what was asked (its steps, or with --no-steps no failed stage)
    return 0 if all(not e["errors"] if args.no_steps else e["steps"]
                    for e in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
