#!/usr/bin/env python
"""Cold start: how long a user waits for the first plans, and where the time goes.

For each network (AlexNet 256, ResNet-18 128, ResNet-50 128 by default: the
bench networks) and each configuration, a fresh process optimises every
distinct conv kernel (layer x direction) as ``Convolution`` would on its first
call: WR, ``--workspace`` per kernel (64 MiB), ``--policy`` (fitted), the
cudnn-graph backend, an empty benchmark cache. It reports

* ``process s``: from the worker's first line (before importing anything) to
  the last plan: imports, CUDA context, cuDNN handle and optimisation;
* ``optimise s``: the optimisation alone, and its breakdown from the backend's
  :class:`~mucudnn.backends._device.FindProfile` (heuristics, finalization,
  timing; candidates, skipped before finalization, finalized, timed);
* ``sizes``: micro-batch sizes benchmarked (Note [size pruning]);
* ``predicted ms`` and ``executed ms``: the chosen plans' total (each distinct
  kernel weighted by how often it occurs) as Find predicted it and as executed
  (bound launchers on the backend's stream, CUDA events, 3 warm-up, median
  of 10), so configurations can be compared on plan quality.

Configurations (``--configs``, :data:`CONFIGS`): ``serial`` (how find()
worked before: one thread, every candidate finalized and fully timed),
``exhaustive`` (every candidate that fits the cap, finalized on the pool,
fully timed: the plan-quality reference), ``default`` (the backend's
defaults: Note [find cut-offs]), and variants of it.

``--devices 0,1`` benchmarks on several GPUs of the host: the worker hands
every distinct kernel to :func:`mucudnn.optimizer.benchmark_many` (this
process on the first GPU, a worker process on each other, longest kernels first; Note [benchmarking on several
devices]) with ``functools.partial(CudnnGraphBackend, **options)`` and solves
WR per kernel as on one GPU; ``process s`` still counts from the worker's
first line, so it includes starting the GPU processes. The breakdown columns
come from the worker's own backend, which does not benchmark then: they show
``-``. ``executed ms`` runs the plans on device 0 of the worker.

``--precision bf16cl`` runs the networks in bfloat16 channels-last (NHWC), as
AMP training with channels-last does, PyTorch's iteration too (default fp32
NCHW).

``--torch`` adds PyTorch's first training iteration over the same
convolutions in a fresh process (``cudnn.benchmark=True``, every distinct
layer's forward and backward with x and w requiring grad), from the worker's
first line, CUDA context included: the reference the cold-start target names.

    python tools/cold_start.py --nets alexnet resnet18 resnet50 --torch --json out/cold.json
    python tools/cold_start.py --nets alexnet resnet18 resnet50 --devices 0,1 --json out/cold2.json
    python tools/cold_start.py --nets resnet50 --torch --jit-cache fresh   # a never-used machine

``--jit-cache fresh`` runs each worker with an empty CUDA JIT cache of its own
(Note [JIT cache in cold runs]); rows record ``jit_cache`` and the cache's
size after the worker.
"""

from __future__ import annotations

import time

T_PROCESS = time.perf_counter()  # before any import: the process-level clock

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any


from frontier import PRECISIONS  # --precision: fp32 NCHW, bf16cl: AMP channels-last

#: name -> CudnnGraphBackend keyword arguments (find_threads None: the backend's default).
#: "prune_sizes": False benchmarks every size of the policy (Note [size pruning]).
CONFIGS: dict[str, dict[str, Any]] = {
    # how find() worked before: one thread, every candidate finalized and timed
    "serial": dict(find_threads=1, find_prefilter=False, find_top_k=None,
                   find_probe_ratio=None, find_cold_ratio=None, find_rtc="all",
                   find_skip_ratio=None, find_long_ms=None, prune_sizes=False),
    # every size, every candidate that fits the cap, each timed fully
    "exhaustive": dict(find_top_k=None, find_probe_ratio=None, find_cold_ratio=None,
                       find_rtc="all", find_skip_ratio=None, find_long_ms=None,
                       prune_sizes=False),
    # the defaults without the timed warm-up run (Note [cold probe])
    "no-cold-probe": dict(find_cold_ratio=None),
    # the defaults: the 8 best-ranked candidates (+ one without workspace), probing
    "default": {},
    "top4": dict(find_top_k=4),
    "top12": dict(find_top_k=12),
    "default-noB": dict(heuristic_modes=("A", "FALLBACK")),
    # See Note [runtime-compiled engines]: with them (the default before), or only
    # where a mode ranks one first
    "rtc-all": dict(find_rtc="all"),
    "rtc-first": dict(find_rtc="first"),
    # See Note [re-timing the winners]: the default times each find()'s two
    # fastest again, warm; without it, and with four
    "no-retime": dict(find_retime=0),
    "retime4": dict(find_retime=4),
    # See Note [far behind at another size]: the default skips configs 16x behind at
    # a larger size; without that cut, and with a tighter one
    "no-skip": dict(find_skip_ratio=None),
    "skip4": dict(find_skip_ratio=4.0),
    # See Note [long runs]: without the one-run timing of long runs
    "no-long": dict(find_long_ms=None),
    # See Note [one zero-workspace find per kernel]: the zero-workspace config timed
    # once per kernel (at its smallest size) instead of at every find()
    "zero-once": dict(find_zero="once"),
    # See Note [carried to other sizes]: the default times configs that led, or that
    # the cap left out, at a larger size also at the smaller ones; without that
    "no-carry": dict(find_carry=False),
    # See Note [folded first layers]: the default also times strided first layers
    # folded by space-to-depth (their inner finds add to the cold start); without
    "no-fold": dict(fold=False),
}


def _size(text: str) -> int:
    """``--workspace``: bytes or a size with a unit (the command line's parser,
    imported here, not at the top, so the parent's imports stay light)."""
    from mucudnn.__main__ import parse_size
    return parse_size(text)


def _problems(net: str, batch: int | None, precision: str = "fp32") -> dict:
    """The distinct problems of ``net`` in ``precision`` (tools/frontier.py's
    PRECISIONS: how its problems are built)."""
    from mucudnn.networks import network, unique_problems
    spec = PRECISIONS[precision]
    return unique_problems(network(net, batch, dtype=spec["dtype"], layout=spec["layout"],
                                   math=spec["math"]))


def worker_mucudnn(net: str, batch: int | None, config: str, limit: int, policy: str,
                   execute: bool, devices: list[int] | None = None,
                   keep_cache: str | None = None, precision: str = "fp32") -> dict[str, Any]:
    from mucudnn.backends.cudnn_graph import CudnnGraphBackend
    from mucudnn.bench import make_timer, random_tensors
    from mucudnn.exec import prepare
    from mucudnn.optimizer import benchmark, optimize_wr, spread
    from mucudnn.problem import Direction

    options = dict(CONFIGS[config])
    prune = options.pop("prune_sizes", True)
    # See Note [benchmarking on several devices]: with devices the GPU processes
    # benchmark and this one needs a backend only to execute the plans (made
    # after them, so it is not on the clock).
    be = CudnnGraphBackend(**options) if not devices else None
    t_ready = time.perf_counter()
    groups = _problems(net, batch, precision)
    plans = {}
    sizes = 0
    tasks = [(p, d) for p in groups for d in Direction]
    spread_info: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cold.sqlite")
        t0 = time.perf_counter()
        if devices:
            # spread.run is benchmark_many with the per-device accounting
            res = spread.run(tasks, policy, limit, functools.partial(CudnnGraphBackend, **options),
                             cache, devices=devices, prune_sizes=prune, progress=False)
            perfs = res.perfs
            spread_info = {"per_device": {str(k): list(v) for k, v in res.per_device.items()},
                           "startup": {str(k): v for k, v in res.startup.items()},
                           "task_seconds": sum(res.seconds),
                           "longest_task_s": max(res.seconds, default=0.0)}
        else:
            # what optimize() (and so Convolution's first call) does, pruning aside
            perfs = [benchmark(be, p, d, policy, limit, cache=cache, progress=False,
                               prune_sizes=prune) for p, d in tasks]
        for (p, d), perf in zip(tasks, perfs):
            sizes += len(perf)
            plans[p, d] = optimize_wr(perf, p.batch, limit, policy, quantum=p.batch_quantum())
        t1 = time.perf_counter()
        if keep_cache:  # every measurement of this run, for offline analysis
            from mucudnn.optimizer.cache_tools import export
            os.makedirs(keep_cache, exist_ok=True)
            export(os.path.join(keep_cache, f"{net}-{config}.sqlite"), source=cache, force=True)
    if be is None and execute:
        be = CudnnGraphBackend(**options)  # device 0, after the clock stopped
    out: dict[str, Any] = {
        "net": net, "threads": be.find_threads if be is not None else None,
        "options": repr(CONFIGS[config]), "devices": devices, "spread": spread_info,
        "kernels": len(plans), "sizes": sizes, "process_s": t1 - T_PROCESS, "startup_s": t_ready - T_PROCESS,
        "optimise_s": t1 - t0,
        "profile": be.find_profile.as_dict() if be is not None and not devices else {},
        "predicted_ms": sum(q.time_ms * len(groups[p]) for (p, _d), q in plans.items()),
        "plans": {f"{p.key()} {d.value}": [[(m.size, str(m.algo)) for m in q.micro_batches],
                                                 q.time_ms]
                  for (p, d), q in plans.items()},
    }
    if execute:
        assert be is not None
        timer = make_timer(be)
        total = 0.0
        for i, ((p, d), q) in enumerate(plans.items()):
            data = random_tensors(be, p, seed=i)
            ws = be.alloc_workspace(max(q.workspace_bytes, 1))
            with be.on_home_stream():
                launch = prepare(q, be, data, 1.0, 0.0, ws, direction=d)
                total += timer(launch, 3, 10) * len(groups[p])
            del data, ws
        out["executed_ms"] = total
    return out


def worker_torch(net: str, batch: int | None, precision: str = "fp32") -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    groups = _problems(net, batch, precision)
    dev = torch.device("cuda")
    torch.cuda.init()
    t_ready = time.perf_counter()
    dtype = getattr(torch, PRECISIONS[precision]["dtype"])
    fmt = torch.channels_last if PRECISIONS[precision]["layout"] == "NHWC" \
        else torch.contiguous_format

    def tensor(dims: tuple) -> Any:  # logical (N, C, H, W) dims, laid out as the precision says
        return torch.randn(dims, device=dev, dtype=dtype).to(
            memory_format=fmt).requires_grad_()

    def iteration() -> None:
        for p in groups:
            x = tensor(p.x_dims)
            w = tensor(p.w_dims)
            y = F.conv2d(x, w, stride=p.stride, padding=p.padding, dilation=p.dilation,
                         groups=p.groups)
            y.backward(torch.randn_like(y))
        torch.cuda.synchronize()

    t0 = time.perf_counter()
    iteration()
    t1 = time.perf_counter()
    iteration()
    t2 = time.perf_counter()
    return {"net": net, "process_s": t1 - T_PROCESS, "startup_s": t_ready - T_PROCESS,
            "first_iteration_s": t1 - t0, "second_iteration_s": t2 - t1,
            "kernels": 3 * len(groups)}


# Note [JIT cache in cold runs]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Some cuDNN engines compile their kernels at run time, and the driver keeps
# what it compiled in its JIT cache (CUDA_CACHE_PATH, by default
# ~/.nv/ComputeCache). On a fresh H200 machine the first cold ResNet-18 process
# spent 10.0 s finalizing plans and a second one 3.2 s (docs/BENCHMARKS.md,
# "Sixth session"). ``--jit-cache fresh`` gives each worker (PyTorch's too) an
# empty cache of its own, as on a machine that has never run these engines;
# ``shared`` (the default) uses the user's, as a second run on the same machine
# would. Each row records which, and the cache's size after the worker.
JIT_CACHES = ("shared", "fresh")


def _jit_cache_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def _run_worker(args: list[str], timeout: float, jit_cache: str = "shared") -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    env = dict(os.environ)
    fresh = tempfile.mkdtemp(prefix="jit-cache-") if jit_cache == "fresh" else None
    if fresh is not None:  # Note [JIT cache in cold runs]
        env["CUDA_CACHE_PATH"] = fresh
    cache_dir = env.get("CUDA_CACHE_PATH") or os.path.expanduser("~/.nv/ComputeCache")
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker-json", path,
                            *args], capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode != 0:
            return {"error": (r.stderr or r.stdout)[-2000:]}
        with open(path) as fh:
            out: dict[str, Any] = json.load(fh)
        out["jit_cache"] = jit_cache
        out["jit_cache_bytes_after"] = _jit_cache_bytes(cache_dir)
        return out
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        os.unlink(path)
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)


def _devices(text: str | None) -> list[int] | None:
    """``--devices 0,1`` as a list (None when not given), parsed as the command
    line's ``--devices`` is."""
    if not text:
        return None
    from mucudnn.__main__ import CommandLineError, parse_devices
    try:
        return parse_devices(text)
    except CommandLineError as exc:
        raise SystemExit(f"cold_start.py: {exc}") from None


#: The FindProfile columns of the table (after "sizes").
BREAKDOWN_COLUMNS = 10


def _breakdown(pr: dict[str, Any]) -> str:
    """The FindProfile columns; ``-`` where there is none (several devices: the
    GPU processes' backends measured, not the worker's)."""
    if not pr:
        return " | ".join(["-"] * BREAKDOWN_COLUMNS)
    modes = ", ".join(f"{m} {v:.1f}" for m, v in pr.get("modes_s", {}).items())
    rtc = (f" (runtime-compiled {pr.get('finalized_rtc', 0)}: "
           f"{pr.get('finalize_rtc_s', 0):.1f} of {pr.get('finalize_thread_s', 0):.1f} "
           f"thread s; {pr.get('rtc_cut', 0)} left out)")
    # See Note [far behind at another size]: find_skip_ratio's cut, where it ran
    far = f" (+{pr['far_cut']} far behind)" if pr.get("far_cut") else ""
    # See Note [carried to other sizes]: find_carry's additions, where it ran
    carried = f" (+{pr['carried']} carried)" if pr.get("carried") else ""
    return (f"{pr['heuristics_s']:.1f} ({modes}) | {pr['finalize_s']:.1f}{rtc} | "
            f"{pr['timing_s']:.1f} (first launches {pr.get('first_launch_s', 0):.1f}, "
            f"GPU {pr.get('gpu_s', 0):.1f}, scratch {pr.get('scratch_s', 0):.1f}) | "
            f"{pr['configs']} | {pr['skipped']} | {pr['cut']}{far} | "
            f"{pr['finalized']} | {pr['timed']}{carried} | {pr['probed_out']} + {pr.get('cold_out', 0)}"
            f" + {pr.get('long_runs', 0)} | "
            f"{pr['workspace_mismatch']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", nargs="+", default=["alexnet", "resnet18", "resnet50"])
    ap.add_argument("--batch", type=int, default=None, help="default: each network's own")
    ap.add_argument("--configs", nargs="+", default=["exhaustive", "default"],
                    choices=sorted(CONFIGS))
    ap.add_argument("--workspace", type=_size, default=64 << 20,
                    help="per kernel: bytes, or a size such as 128MiB")
    ap.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32",
                    help="fp32 (NCHW) or bf16cl (bfloat16 channels-last, as AMP runs)")
    ap.add_argument("--policy", default="fitted")
    ap.add_argument("--torch", action="store_true", help="also PyTorch's first iteration")
    ap.add_argument("--no-execute", action="store_true", help="skip executing the plans")
    ap.add_argument("--devices", default=None, metavar="0,1",
                    help="benchmark on these CUDA devices, one process each (default: one "
                         "GPU, in the worker)")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds per worker")
    ap.add_argument("--jit-cache", choices=JIT_CACHES, default="shared",
                    help="the driver's JIT cache for each worker: the user's (shared) or an "
                         "empty one of its own (fresh: a machine that never ran these engines)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep-caches", default=None, metavar="DIR",
                    help="copy each run's benchmark cache to DIR/NET-CONFIG.sqlite (every "
                         "measurement it made; MUCUDNN_CACHE=that python -m mucudnn optimize "
                         "--offline plans from it without a GPU)")
    # worker mode (internal)
    ap.add_argument("--worker-json", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    devices = _devices(a.devices)  # a bad list fails here, not in every worker

    if a.worker_json:
        net = a.nets[0]
        if a.worker == "torch":
            res = worker_torch(net, a.batch, a.precision)
        else:
            res = worker_mucudnn(net, a.batch, a.worker, a.workspace, a.policy,
                                 not a.no_execute, devices, a.keep_caches, a.precision)
        with open(a.worker_json, "w") as fh:
            json.dump(res, fh)
        return 0

    results: list[dict[str, Any]] = []
    common = ["--workspace", str(a.workspace), "--policy", a.policy, "--precision", a.precision]
    if a.batch:
        common += ["--batch", str(a.batch)]
    if a.no_execute:
        common.append("--no-execute")
    if devices:
        common += ["--devices", ",".join(map(str, devices))]
    if a.keep_caches:
        common += ["--keep-caches", os.path.abspath(a.keep_caches)]

    def save() -> None:
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as fh:
                json.dump(results, fh, indent=1)

    for net in a.nets:
        if a.torch:
            r = _run_worker(["--worker", "torch", "--nets", net, *common], a.timeout,
                            a.jit_cache)
            r.update(config="torch", net=net, precision=a.precision)
            results.append(r)
            save()
            print(f"[{net} torch] {r.get('process_s', r.get('error'))}", flush=True)
        for c in a.configs:
            r = _run_worker(["--worker", c, "--nets", net, *common], a.timeout, a.jit_cache)
            r.setdefault("devices", devices)
            r.update(config=c, net=net, precision=a.precision)
            results.append(r)
            save()
            print(f"[{net} {c}] {r.get('optimise_s', r.get('error'))}"
                  + (f" spread {r['spread']}" if r.get("spread") else ""), flush=True)

    print("| net | config | devices | process s | optimise s | sizes | heuristics s | finalize s "
          "| timing s | candidates | skipped | cut | finalized | timed "
          "| probed out + cold out + long runs "
          "| ws mismatch | predicted ms | executed ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        label = r["net"] if r.get("precision", "fp32") == "fp32" else f"{r['net']} ({r['precision']})"
        if "error" in r:
            print(f"| {label} | {r['config']} | error: {r['error'][-300:]!r} |")
            continue
        if r["config"] == "torch":
            print(f"| {label} | PyTorch first iteration | default | {r['process_s']:.1f} | "
                  f"{r['first_iteration_s']:.1f} | | | | | | | | | | | | | "
                  f"(2nd iteration {r['second_iteration_s']:.2f} s) |")
            continue
        ex = r.get("executed_ms")
        devs = ",".join(map(str, r.get("devices") or [])) or "default"
        threads = f" ({r['threads']} threads)" if r.get("threads") else ""
        print(f"| {label} | {r['config']}{threads} | {devs} | {r['process_s']:.1f} | "
              f"{r['optimise_s']:.1f} | {r['sizes']} | {_breakdown(r.get('profile') or {})} | "
              f"{r['predicted_ms']:.2f} | {'' if ex is None else f'{ex:.2f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
