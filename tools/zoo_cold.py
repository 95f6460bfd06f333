"""Cold first steps for tools/zoo_bench.py: each side's first training step in a
fresh process (zoo_bench.py ``--cold-child``), repeated in alternating pairs.

Note [cold steps]
~~~~~~~~~~~~~~~~~
The first training step of a process is where PyTorch's cudnn.benchmark times
its algorithms and mucudnn.torch benchmarks its configurations and plans, so
it is measured in a fresh process per side (zoo_bench.py with --cold-child),
the converted side with MUCUDNN_CACHE set to a new file: nothing carried over
from earlier runs or the parent. The clock starts after the model is built,
moved to the device (CUDA initialised) and converted, and stops when the
step's optimizer update has finished; each of the next steps is timed alike
(``--cold-steps``, ``steps_s`` and their sum ``steps_total_s``), since a
converted model plans the signatures its first step ran stand-ins for in the
steps after it (Note [planning after the first step] in
mucudnn/torch/standin.py): the first step alone no longer shows all that a
cold start costs. The first process on a machine also pays
for reading the CUDA libraries from disk and filling the CUDA JIT cache, which
later processes find ready: so a primer (one native child, its numbers kept
apart as ``cold_primer``) runs before the measured pair, and neither side is
charged for what the other left behind. PyTorch's own benchmarking makes a
first step's seconds vary by several seconds from one process to the next,
so ``--cold-repeat N`` runs N pairs, native first in the odd ones and
converted first in the even ones, and keeps each side's medians
(:func:`cold_medians`) with every sample. ``--cold-profile N`` runs each
side's first step under cProfile and keeps the N functions of most
cumulative and of most own host time (``profile``; ``profiled`` marks such
a side): where a slow first step spends its time, at the price of slowing
its Python.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import mucudnn
from zoo_models import ModelSpec  # tools/: the models

#: the two sides, in the order a pair's first run takes them
SIDES = ("native", "converted")
#: the line a cold child prints its JSON after
COLD_PREFIX = "ZOO_COLD "
#: the script a cold child runs
ZOO_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zoo_bench.py")


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child running zoo_bench.py: PYTHONPATH
    leads to the mucudnn this process imported (installed or not)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(mucudnn.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def cold_medians(samples: Sequence[dict]) -> dict:
    """One side's cold figures over its ``samples`` (:func:`run_cold`'s dicts, in
    the order run): the median of each number, those in nested dicts (the
    report's ``first_calls``) included, every first step in
    ``first_step_samples``, and the first sample's profile where one was kept.

    >>> m = cold_medians([{"first_step_s": 9.0, "first_calls": {"seconds": 8.5}},
    ...                   {"first_step_s": 7.0, "first_calls": {"seconds": 6.5}},
    ...                   {"first_step_s": 8.0, "first_calls": {"seconds": 7.5}}])
    >>> m["first_step_s"], m["first_calls"], m["first_step_samples"]
    (8.0, {'seconds': 7.5}, [9.0, 7.0, 8.0])
    >>> cold_medians([{"first_step_s": 2.0, "signatures": 11},
    ...               {"first_step_s": 3.0, "signatures": 11}])["signatures"]
    11
    """
    def medians(dicts: list[dict]) -> dict:
        out = dict(dicts[0])
        for key, value in dicts[0].items():
            if isinstance(value, int) and not isinstance(value, bool):  # a count stays one
                out[key] = statistics.median_low(d[key] for d in dicts)
            elif isinstance(value, float):
                out[key] = statistics.median(d[key] for d in dicts)
            elif isinstance(value, dict) and all(isinstance(d.get(key), dict) for d in dicts):
                out[key] = medians([d[key] for d in dicts])
        return out

    out = medians(list(samples))
    out["first_step_samples"] = [s["first_step_s"] for s in samples]
    return out


def run_cold_pairs(args: argparse.Namespace, spec: ModelSpec, precision: str,
                   stage: Callable[[str, Callable[[], Any]], Any], out: dict[str, dict]) -> None:
    """``--cold-repeat`` pairs of :func:`run_cold` (Note [cold steps]), each run
    through ``stage(tag, work)``; after each run, ``out[side]`` is that side's
    :func:`cold_medians` so far (a side none of whose runs finished is absent)."""
    n = args.cold_repeat
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for i in range(n):
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            tag = f"cold {side}" + (f" {i + 1}/{n}" if n > 1 else "")
            c = stage(tag, lambda side=side: run_cold(args, spec, precision, side))
            if c is not None:
                runs[side].append(c)
                out[side] = cold_medians(runs[side])


def run_cold(args: argparse.Namespace, spec: ModelSpec, precision: str, side: str) -> dict:
    """zoo_bench.py's ``cold_child`` in a fresh process; its numbers and the
    process's wall seconds."""
    with tempfile.TemporaryDirectory(prefix="zoo-cold-") as tmp:
        env = child_env(MUCUDNN_CACHE=os.path.join(tmp, "cache.sqlite"))
        cmd = [sys.executable, ZOO_BENCH, "--cold-child", side,
               "--models", spec.name, "--precisions", precision, "--device", args.device,
               "--batch", str(args.batch), "--size", str(spec.size),
               "--workspace", str(args.workspace), "--seed", str(args.seed), "--lr", str(args.lr),
               "--cold-profile", str(args.cold_profile), "--cold-steps", str(args.cold_steps),
               *(f"--backend-option={k}={v!r}" for k, v in args.backend_options)]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.cold_timeout)
        wall = time.perf_counter() - t0
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(COLD_PREFIX)]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"cold {side} process exited {r.returncode}: "
                           f"{(r.stderr or r.stdout)[-1500:]}")
    return {**json.loads(lines[-1][len(COLD_PREFIX):]), "process_s": wall}
