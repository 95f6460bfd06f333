"""Figures: per-layer time-versus-workspace Pareto fronts and the network's
speedup-versus-limit curve, drawn from benchmark tables (the cache makes a
second drawing free). Needs matplotlib (``pip install "mucudnn[plot]"``); without
it the first call raises a one-line MissingDependencyError saying so.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Sequence

from ._optional import require
from .backends import Backend, get_backend
from .bench import single_call_plan
from .networks import select as select_layers
from .networks import unique_problems
from .optimizer import DEFAULT_POLICY, benchmark, optimize_wr, pareto_front
from .optimizer.benchmark import resolve_cache
from .optimizer.types import PolicyLike
from .problem import Direction

MIB = 1 << 20


def _pyplot() -> Any:
    matplotlib = require("matplotlib", "plot", "plotting")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional dependency, checked just above
    return plt


def speedup_curve(perfs: dict, counts: dict, batch: int, limits: Sequence[int],
                  policy: PolicyLike, quanta: "dict | None" = None) -> list[float]:
    """Predicted network speedup of WR over the best undivided calls, per limit.

    ``quanta`` maps a key of ``perfs`` to its ``ConvProblem.batch_quantum()``
    (default 1)."""
    out = []
    for lim in limits:
        micro = und = 0.0
        for key, perf in perfs.items():
            n = counts[key]
            q = (quanta or {}).get(key, 1)
            micro += n * optimize_wr(perf, batch, lim, policy, quantum=q).time_ms
            single = single_call_plan(perf, batch, lim)
            und += n * single.time_ms if single is not None else math.inf
        out.append(und / micro if micro > 0 else math.nan)
    return out


def plot_network(net: str, batch: int, *, out_dir: str = ".", dtype: str = "float32",
                 layout: str = "NCHW", math_mode: str = "default", policy: PolicyLike = DEFAULT_POLICY,
                 backend: "str | Backend | None" = None, workspace_limit: int = 64 << 20,
                 layers: Sequence[str] | None = None,
                 directions: Iterable["Direction | str"] | None = None,
                 progress: bool = True) -> list[str]:
    """Write ``<net>-pareto.png`` and ``<net>-speedup.png`` into ``out_dir``; return the paths."""
    plt = _pyplot()
    be = get_backend(backend)
    store = resolve_cache(None)
    dirs = [Direction.parse(d) for d in (directions or list(Direction))]
    probs = {l.name: l.problem(batch, dtype=dtype, layout=layout, math=math_mode)
             for l in select_layers(net, layers)}
    groups = unique_problems(probs)
    perfs, counts, quanta = {}, {}, {}
    for p, names in groups.items():
        for d in dirs:
            quanta[names[0], d] = p.batch_quantum()
            perfs[names[0], d] = benchmark(be, p, d, policy, 1 << 40, cache=store,
                                           progress=progress)
            counts[names[0], d] = len(names)
    os.makedirs(out_dir, exist_ok=True)

    n = len(groups)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (p, names) in zip(axes.flat, groups.items()):
        for d in dirs:
            front = pareto_front(perfs[names[0], d], batch, policy, quantum=p.batch_quantum())
            ws = [q.workspace_bytes / MIB for q in front]
            ax.step(ws, [q.time_ms for q in front], where="post", marker="o", ms=3,
                    label=d.value)
        ax.axvline(workspace_limit / MIB, color="grey", ls=":", lw=1)
        # Note: symlog so the zero-workspace plan sits at 0, linear below 1 MiB.
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(left=0)
        ax.set_title(f"{names[0]}" + (f" (x{len(names)})" if len(names) > 1 else ""), fontsize=9)
        ax.set_xlabel("workspace (MiB)")
        ax.set_ylabel("time (ms)")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"{net}, batch {batch}, {dtype}: Pareto fronts ({be.name} {be.version}, "
                 f"{be.device_name}; policy {policy})", fontsize=10)
    fig.tight_layout()
    pareto_png = os.path.join(out_dir, f"{net}-pareto.png")
    fig.savefig(pareto_png, dpi=110)
    plt.close(fig)

    limits = [1 << k for k in range(20, 34)]  # 1 MiB .. 8 GiB
    fig, ax = plt.subplots(figsize=(6, 4))
    curve = speedup_curve(perfs, counts, batch, limits, policy, quanta)
    ax.plot([l / MIB for l in limits], curve, marker="o", label=f"WR, {policy}")
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workspace limit per kernel (MiB)")
    ax.set_ylabel("speedup over undivided (predicted)")
    ax.set_title(f"{net}, batch {batch}, {dtype}: speedup versus workspace limit\n"
                 f"({be.name} {be.version}, {be.device_name})", fontsize=10)
    ax.legend()
    fig.tight_layout()
    speed_png = os.path.join(out_dir, f"{net}-speedup.png")
    fig.savefig(speed_png, dpi=110)
    plt.close(fig)
    return [pareto_png, speed_png]
