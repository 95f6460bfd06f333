"""``share_plans``: one cold benchmark for a whole torch.distributed group.

Every rank of a data-parallel job runs the same convolutions, so each would
pay the same cold benchmark and, from Find's single-shot timings, could pick
different plans. :func:`share_plans` finds the model's convolutions from one
recorded forward pass (no plan is made there; :func:`.recording.recording`),
spreads the distinct kernels over the ranks (or gives them all to ``src``),
has each rank benchmark its share, exchanges the measurements over the
group's collectives (``all_gather_object``: JSON-able cache entries), stores
them in every rank's benchmark cache and plans every kernel there, then
checks that all ranks made the same plans (Note [shared plans]).

Call it once after :func:`mucudnn.torch.convert`, with an example input of
the training batch, on every rank (torchrun)::

    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group("nccl")
    model = mt.convert(model.cuda(), workspace_limit=64 << 20)
    mt.share_plans(model, example_batch)          # every rank, collectively
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import torch

from ..optimizer import Planner, benchmark
from ..optimizer.benchmark import resolve_cache
from ..optimizer.cache import Entry
from ..problem import UNLIMITED_WORKSPACE, Direction
from .recording import RecordedConv, recording
from .tokens import TorchBridgeError

__all__ = ["share_plans", "SharedPlans"]

log = logging.getLogger("mucudnn")

ALL_DIRECTIONS = (Direction.FORWARD, Direction.BACKWARD_DATA, Direction.BACKWARD_FILTER)


# Note [shared plans]
# ~~~~~~~~~~~~~~~~~~~
# What travels between ranks is measurements, not plans: each kernel (distinct
# problem and direction) is benchmarked by one rank, exactly as
# ``Convolution``'s planner would (its cap, policy, size pruning and
# determinism), and the cache entries it read or wrote for that kernel go to
# every rank, which stores them (``BenchmarkCache.put_many``) and then plans
# from them through the same ``Planner`` a converted layer uses: the plan memo
# then answers the layer's first call, so training starts with no benchmark.
# Planning is deterministic given the entries, so every rank makes the same
# plans; to be sure (a rank's cache may hold older entries of its own, under
# larger caps), the plans are compared across the group afterwards and any
# difference is an error naming the ranks and the kernel, never silently
# different plans. Ranks must measure on one kind of device and library:
# (backend, device name, library version) is compared first. Kernels are spread
# longest first (FLOPs) to the least-loaded rank, the same assignment computed
# on every rank.


@dataclasses.dataclass(frozen=True)
class SharedPlans:
    """What :func:`share_plans` did on this rank."""

    rank: int
    world_size: int
    kernels: int  #: distinct (problem, direction) kernels of the model
    measured_here: tuple[str, ...]  #: the kernels this rank benchmarked ("key direction")
    entries_received: int  #: cache entries stored from the other ranks
    plans: dict[str, str]  #: kernel -> plan (``Plan.describe()`` and its algorithms)


def _kernel_name(c: RecordedConv, d: Direction) -> str:
    return f"{c.problem.key()} {d.value}"


def _plan_text(plan: Any) -> str:
    return f"{plan.describe()} [{', '.join(str(m.algo) for m in plan.micro_batches)}]"


def _assign(tasks: Sequence[tuple[RecordedConv, Direction]], world: int,
            src: "int | None") -> list[int]:
    """The rank that benchmarks each task: all to ``src``, else longest first
    to the least-loaded rank (ties: the lower rank)."""
    if src is not None:
        return [src] * len(tasks)
    load = [0] * world
    owner = [0] * len(tasks)
    for i in sorted(range(len(tasks)), key=lambda i: (-tasks[i][0].problem.flops(), i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += max(1, int(tasks[i][0].problem.flops()))
    return owner


def _gather(obj: Any, world: int, group: Any) -> list[Any]:
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, obj, group=group)
    return out


def share_plans(module: torch.nn.Module, *example_inputs: Any, group: Any = None,
                src: "int | None" = None,
                directions: "Sequence[Direction | str] | None" = None) -> SharedPlans:
    """Benchmark the converted ``module``'s convolutions once across the
    torch.distributed ``group`` (default: the world) and give every rank the
    same plans (Note [shared plans]). Collective: every rank of the group
    calls it, with the same model and inputs of the same shapes. With NCCL,
    each rank's GPU must be its current device first
    (``torch.cuda.set_device(local_rank)``), as ``all_gather_object`` needs.

    ``example_inputs`` are passed to ``module`` for one forward pass, under
    ``torch.no_grad()``, in which mucudnn.torch's convolutions are only
    recorded (so under the autocast state, memory format and dtypes the
    training step uses: wrap the call in ``torch.autocast`` if the step
    runs in it). ``src``: one rank benchmarks everything (None: the kernels
    are spread over the ranks). ``directions``: the kernels to plan (default:
    forward, backward-data and backward-filter). Returns :class:`SharedPlans`.

    Raises TorchBridgeError (a ValueError) when torch.distributed is not
    initialised, when the benchmark cache is off (``MUCUDNN_CACHE=off``: the
    measurements travel through it), when ranks run on different devices or
    library versions (naming the ranks), when the module has convolutions
    planned jointly (``convert(mode="wd")``), or when ranks made different
    plans (naming the kernel).
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise TorchBridgeError("share_plans: torch.distributed is not initialised; call "
                               "torch.distributed.init_process_group first (torchrun sets "
                               "up its environment)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if src is not None and (isinstance(src, bool) or not isinstance(src, int)
                            or not 0 <= src < world):
        raise TorchBridgeError(f"src: expected a rank of the group (0..{world - 1}) or None, "
                               f"got {src!r}")
    dirs = [Direction.parse(d) for d in (ALL_DIRECTIONS if directions is None else directions)]
    with recording() as rec, torch.no_grad():
        module(*example_inputs)
    convs = list(rec.convs)
    if any(c.wd for c in convs):
        raise TorchBridgeError("share_plans: this model plans its convolutions jointly "
                               "(convert(mode='wd')); share_plans shares per-kernel (WR) plans")
    cache = resolve_cache(None)
    if not cache.enabled:
        raise TorchBridgeError("share_plans: the benchmark cache is off (MUCUDNN_CACHE); the "
                               "measurements travel through it")
    tasks = [(c, d) for c in convs for d in dirs]
    ident = sorted({(c.backend.name, c.backend.device_name, c.backend.version) for c in convs})
    seen = _gather((ident, [_kernel_name(c, d) for c, d in tasks]), world, group)
    idents = [i for i, _k in seen]
    if any(i != idents[0] for i in idents):
        names = "; ".join(f"rank {r}: {', '.join(' '.join(v) for v in i) or 'nothing'}"
                          for r, i in enumerate(idents))
        raise TorchBridgeError(f"share_plans: the ranks do not measure on one kind of device "
                               f"and library ({names}); plans measured on one would not hold "
                               "on another")
    odd = [r for r, (_i, k) in enumerate(seen) if k != seen[0][1]]
    if odd:
        raise TorchBridgeError(
            f"share_plans: rank {odd[0]} met other convolutions than rank 0 ({len(seen[odd[0]][1])} "
            f"kernels against {len(seen[0][1])}); every rank must pass the same model and "
            "example inputs of the same shapes")
    owner = _assign(tasks, world, src)
    mine: list[str] = []
    entries: list[Entry] = []
    for (c, d), r in zip(tasks, owner):
        if r != rank:
            continue
        be = c.backend
        cap = UNLIMITED_WORKSPACE if c.workspace_limit is None else c.workspace_limit
        perf = benchmark(be, c.problem, d, c.policy, cap, cache=cache, progress=False,
                         prune_sizes=True, deterministic=c.deterministic)
        mine.append(_kernel_name(c, d))
        for size in perf:
            p = c.problem.with_batch(size)
            found = cache.get(be, p, d, cap)  # every result: determinism filters later
            if found is not None:
                entries.append(Entry(be.name, be.device_name, be.version, p.key(), d.value,
                                     cap, list(found)))
    received = 0
    for r, theirs in enumerate(_gather(entries, world, group)):
        if r != rank and theirs:
            cache.put_many(theirs)
            received += len(theirs)
    plans = {_kernel_name(c, d): _plan_text(
        Planner(c.backend, c.workspace_limit, c.policy, deterministic=c.deterministic)
        .plan(c.problem, d)) for c, d in tasks}
    for r, theirs in enumerate(_gather(plans, world, group)):
        diff = sorted(k for k in plans if theirs.get(k) != plans[k])
        if diff:
            raise TorchBridgeError(
                f"share_plans: rank {r} planned {diff[0]} as {theirs.get(diff[0])}, rank {rank} "
                f"as {plans[diff[0]]} ({len(diff)} kernels differ); their benchmark caches hold "
                "different older entries: clear them (python -m mucudnn cache) and call again")
    log.info("share_plans: rank %d of %d benchmarked %d of %d kernels, stored %d entries "
             "from the others", rank, world, len(mine), len(tasks), received)
    return SharedPlans(rank, world, len(tasks), tuple(mine), received, plans)
