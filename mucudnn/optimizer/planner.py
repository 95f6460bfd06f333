"""The Planner: every plan the engine runs is decided here.

:class:`Planner` implements :class:`mucudnn.exec.planning.Planner` for one
backend, per-kernel workspace limit, policy and benchmark cache:

* :meth:`Planner.plan` -- the first plan of a kernel (WR under the limit),
  memoised per :class:`PlanKey` in one process-wide LRU, so every
  :class:`~mucudnn.Convolution` with the same options shares it;
* :meth:`Planner.replan` -- a run-time re-plan under the workspace that is
  actually free, or without configurations a backend refused;
* :meth:`Planner.plan_jointly` -- WD over named kernels (``MicroBatchHandle``).

>>> from mucudnn.backends import get_backend
>>> from mucudnn.problem import ConvProblem, Direction
>>> pl = Planner(get_backend("numpy"), workspace_limit=1 << 20, policy="undivided", cache=False)
>>> pl.plan(ConvProblem((2, 3, 8, 8), (4, 3, 3, 3)), Direction.FORWARD).batch
2
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Collection, Hashable, Mapping, Union

from ..backends import Backend
from ..caches import LRU
from ..errors import MucudnnError, UnsupportedConfigError
from ..problem import UNLIMITED_WORKSPACE, ConvProblem, Direction, MicroBatch, Plan, make_plan
from ..units import ByteSize, parse_bytes
from .api import DEFAULT_WORKSPACE_LIMIT, plan_kernels
from .benchmark import measure_kernel
from .cache import BenchmarkCache, resolve
from .dp import optimize_wr
from .options import PlanOptions, plan_options
from .policies import DEFAULT_POLICY
from .types import BackendLike, CacheLike, PolicyLike

__all__ = ["Planner", "PlanKey", "workspace_limit_bytes", "zero_workspace_plan", "PLAN_MEMO_SIZE",
           "config_faults"]

log = logging.getLogger("mucudnn")

#: Plans kept in the process-wide memo (a plan is a few hundred bytes).
PLAN_MEMO_SIZE = 4096


@dataclass(frozen=True)
class PlanKey:
    """Every input that affects which plan is chosen (as PyTorch's ConvolutionParams).

    The backend is named by what its measurements depend on (its name for the
    problem, Note [candidate sets in keys]; device; library version), so two
    instances on the same device with the same options share plans.
    """

    backend: str
    device: str
    version: str
    problem: ConvProblem
    direction: Direction
    workspace_limit: int | None
    policy: Any
    cache: str
    retime: int
    #: Configurations excluded (refused at run time), and the workspace
    #: available to a re-plan (None for a first plan).
    exclude: frozenset = frozenset()
    available: int | None = None
    #: Deterministic configurations only (Note [deterministic plans]).
    deterministic: bool = False


_PLANS: LRU[PlanKey, Plan] = LRU("optimizer.plans", PLAN_MEMO_SIZE)


# Note [entries the backend cannot run]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A benchmark-cache entry is checked when it is read (cache_entries: types and
# ranges), but not against the backend: a hand edit, ``cache import`` of
# another machine's file or a library that renamed its configurations can leave
# an entry naming a configuration the backend does not know, or recording less
# workspace than it needs. Planned from, such an entry makes every call fail
# (the configuration cannot be bound), or makes the plan over its limit,
# excluded and re-planned from the same entry for good. So every plan the
# Planner hands out is checked first: each micro-batch's configuration goes
# through ``backend.workspace_size`` at its size (what installing the plan does
# anyway; the backends memoise it). A configuration the backend refuses, or one
# needing more workspace than its entry recorded, means the entries of those
# sizes are wrong: they are invalidated (``BenchmarkCache.invalidate``: one
# warning naming the cache file), and the plan is made again, which measures
# those sizes afresh (and may now pick another size, checked the same way). A
# size is invalidated once per plan: a backend whose own find() reports what it
# cannot run is left to the kernel, which excludes the configuration and
# re-plans (exec/kernel.py).


def config_faults(backend: Backend, plan: Plan) -> dict[int, str]:
    """See Note [entries the backend cannot run]: ``{size: why}`` for the
    micro-batches of ``plan`` whose configuration ``backend`` cannot run at
    that size, or which need more workspace than the plan records."""
    p, d = plan.problem, plan.direction
    faults: dict[int, str] = {}
    if p is None or d is None:
        return faults
    for mb in plan.micro_batches:
        if mb.size in faults:
            continue
        try:
            need = int(backend.workspace_size(p.with_batch(mb.size), d, mb.algo, mb.math_type))
        except NotImplementedError:
            continue
        except MemoryError:
            raise
        except (MucudnnError, ValueError, TypeError, LookupError, OverflowError) as exc:
            faults[mb.size] = (f"backend {backend.name} cannot run configuration {mb.algo!r} "
                               f"({type(exc).__name__}: {exc})")
            continue
        if need > int(mb.workspace_bytes):
            faults[mb.size] = (f"configuration {mb.algo!r} needs {need} bytes of workspace, "
                               f"the entry says {mb.workspace_bytes}")
    return faults


def workspace_limit_bytes(value: "ByteSize | None", name: str = "workspace_limit") -> int | None:
    """A workspace limit as bytes: None (unlimited), an int >= 0 or a size string
    (``"64MiB"``); TypeError / ValueError naming ``name`` otherwise."""
    if value is None:
        return None
    return parse_bytes(value, name)


def zero_workspace_plan(problem: ConvProblem, direction: Direction, backend: BackendLike,
                        policy: "PolicyLike | None" = None, cache: CacheLike = None,
                        exclude: Collection[Hashable] = (), *,
                        deterministic: bool = False) -> Plan:
    """One undivided call with the fastest measured algorithm needing no workspace
    (from the benchmark cache where it holds the full batch); a deterministic
    one with ``deterministic=True`` (Note [deterministic plans])."""
    options = plan_options("undivided", backend, cache, deterministic=deterministic,
                           progress=False)
    return _zero_workspace_plan(options, problem, direction, policy, exclude)


def _zero_workspace_plan(options: PlanOptions, problem: ConvProblem, direction: Direction,
                         policy: "PolicyLike | None", exclude: Collection[Hashable]) -> Plan:
    """:func:`zero_workspace_plan` with checked ``options`` (their policy, retime
    and progress are not used: the full batch is measured undivided, quietly,
    without re-timing); ``policy`` is what the Plan records."""
    be = options.backend
    assert be is not None  # a Planner's options: no devices=
    options = dataclasses.replace(options, policy="undivided", retime=0, progress=False)
    # See Note [one zero-workspace find per kernel]: for such a backend the cache's
    # entry for the full batch may hold none (they were found at a smaller
    # size); then they are found here, uncached
    stores = ((options, dataclasses.replace(options, cache=resolve(False)))
              if be.finds_zero_once else (options,))
    zero: list = []
    for opts in stores:
        perf = measure_kernel(opts, problem, direction, 0)
        zero = [a for a in perf.get(problem.batch, ()) if int(a.workspace_bytes) == 0]
        if zero:
            break
    zero = [a for a in zero if a.algo not in exclude]
    if not zero:
        det = ("; deterministic=True: the non-deterministic ones were left out"
               if options.deterministic else "")
        raise UnsupportedConfigError(
            f"no zero-workspace algorithm is left for {problem} {direction} on backend "
            f"{be.name} (excluded: {sorted(map(str, exclude))}{det})")
    a = min(zero, key=lambda e: e.time_ms)
    mb = MicroBatch(0, problem.batch, a.algo, a.math_type, 0, float(a.time_ms))
    return make_plan([mb], undivided_time_ms=float(a.time_ms), workspace_limit=0,
                     policy=policy, problem=problem, direction=direction)


class Planner:
    """Plans for the kernels of one backend, workspace limit, policy and cache.

    ``workspace_limit``: bytes per kernel (an int, a size string such as
    ``"64MiB"``, or None for unlimited); ``policy``: the batch-size policy;
    ``cache``: the benchmark cache (None: the default, False/"off": none, a
    path or a BenchmarkCache); ``retime``: see :func:`mucudnn.optimizer.benchmark`;
    ``deterministic``: plan (and re-plan) with the configurations cuDNN marks
    deterministic only (Note [deterministic plans]).
    """

    def __init__(self, backend: BackendLike = None,
                 workspace_limit: "ByteSize | None" = DEFAULT_WORKSPACE_LIMIT,
                 policy: PolicyLike = DEFAULT_POLICY, cache: CacheLike = None, retime: int = 0, *,
                 deterministic: bool = False) -> None:
        self.workspace_limit = workspace_limit_bytes(workspace_limit)
        #: Every other argument, checked once (the policy normalised: a one-shot
        #: iterable is read once); the plans of :meth:`plan` may show a progress
        #: bar (as :func:`~.api.optimize`'s), re-plans and joint plans never do.
        self.options: PlanOptions = plan_options(policy, backend, cache,
                                                 deterministic=deterministic, retime=retime)
        self._quiet = dataclasses.replace(self.options, progress=False)
        be = self.options.backend
        assert be is not None  # no devices=: the backend benchmarks in this process
        self._backend: Backend = be
        self._cache_name = str(self.cache.path) if self.cache.enabled else "off"

    @property
    def backend(self) -> Backend:
        """The complete Backend that plans are measured on."""
        return self._backend

    @property
    def policy(self) -> Union[str, tuple[int, ...]]:
        """The batch-size policy, normalised (a name or sizes sorted descending)."""
        return self.options.policy

    @property
    def cache(self) -> BenchmarkCache:
        """The benchmark cache (disabled for ``cache=False``)."""
        return self.options.cache

    @property
    def retime(self) -> int:
        """How many of each size's fastest configurations are re-timed on a cache miss."""
        return self.options.retime

    @property
    def deterministic(self) -> bool:
        """Whether plans use deterministic configurations only."""
        return self.options.deterministic

    def __repr__(self) -> str:
        det = ", deterministic=True" if self.deterministic else ""
        return (f"Planner({self.backend.name!r}, workspace_limit={self.workspace_limit}, "
                f"policy={self.policy!r}, cache={self._cache_name!r}{det})")

    def _limit(self) -> int:
        return UNLIMITED_WORKSPACE if self.workspace_limit is None else self.workspace_limit

    def key(self, problem: ConvProblem, direction: "Direction | str",
            exclude: Collection[Hashable] = (),
            available: int | None = None) -> PlanKey:
        be = self.backend
        # See Note [candidate sets in keys]: the backend's name for this problem
        return PlanKey(be.cache_name(problem), be.device_name, be.version, problem,
                       Direction.parse(direction),
                       self.workspace_limit, self.policy, self._cache_name, self.retime,
                       frozenset(exclude), available, self.deterministic)

    # -- the Planner protocol ----------------------------------------------------------
    def plan(self, problem: ConvProblem, direction: Direction) -> Plan:
        """The fastest plan under the limit (memoised per :class:`PlanKey`)."""
        key = self.key(problem, direction)
        plan = _PLANS.get(key)
        if plan is None:
            plan = self._checked(lambda: plan_kernels(
                {0: (problem, key.direction)}, self.options, workspace_limit=self._limit(),
                split_sizes=True).plans[0])
            _PLANS.put(key, plan)
        return plan

    def _invalidate(self, plan: Plan, done: set[tuple[int, Direction]]) -> bool:
        """See Note [entries the backend cannot run]: invalidate the cache entries
        ``plan`` came from where the backend cannot run it, unless invalidated
        before (in ``done``: then the faulty plan came from a fresh measurement);
        whether any was."""
        faults = config_faults(self.backend, plan)
        if not faults or not self.cache.enabled:
            return False
        assert plan.problem is not None and plan.direction is not None
        fresh = False
        for size, why in faults.items():
            if (size, plan.direction) in done:
                continue
            done.add((size, plan.direction))
            self.cache.invalidate(self.backend, plan.problem.with_batch(size), plan.direction,
                                  why)
            fresh = True
        return fresh

    def _checked(self, make: Callable[[], Plan]) -> Plan:
        """``make()``, made again while it comes from cache entries the backend
        cannot run, each invalidated once (Note [entries the backend cannot run])."""
        done: set[tuple[int, Direction]] = set()
        plan = make()
        while self._invalidate(plan, done):
            plan = make()
        return plan

    def replan(self, problem: ConvProblem, direction: Direction, available: int,
               exclude: Collection[Hashable] = ()) -> Plan:
        """The fastest plan within ``available`` bytes (and the limit) using no
        configuration in ``exclude``; a zero-workspace plan as the last resort."""
        direction = Direction.parse(direction)
        available = max(0, int(available))
        key = self.key(problem, direction, exclude, available)
        plan = _PLANS.get(key)
        if plan is not None:
            return plan
        plan = self._checked(lambda: self._replan(problem, direction, available, exclude))
        _PLANS.put(key, plan)
        return plan

    def _replan(self, problem: ConvProblem, direction: Direction, available: int,
                exclude: Collection[Hashable]) -> Plan:
        cap = min(self._limit(), available)
        perf = measure_kernel(self._quiet, problem, direction, self._limit())
        if exclude:
            perf = {s: [a for a in v if a.algo not in exclude] for s, v in perf.items()}
        try:
            plan = optimize_wr(perf, problem.batch, cap, self.policy,
                               quantum=problem.batch_quantum())
            return dataclasses.replace(plan, problem=problem, direction=direction)
        except ValueError as exc:
            log.info("mucudnn: no WR plan under %d bytes for %s %s (%s); using a "
                     "zero-workspace plan", cap, problem, direction, exc)
            return _zero_workspace_plan(self._quiet, problem, direction, self.policy, exclude)

    def plan_jointly(self, kernels: Mapping[str, tuple[ConvProblem, Direction]],
                     total_workspace: int) -> dict[str, Plan]:
        """WD: one plan per kernel, workspaces summing to at most ``total_workspace``
        (made again once if a plan came from entries the backend cannot run,
        Note [entries the backend cannot run])."""
        def make() -> dict[str, Plan]:
            return plan_kernels(kernels, self._quiet, total_workspace=total_workspace).plans

        done: dict[ConvProblem, set[tuple[int, Direction]]] = {}
        plans = make()
        while any([self._invalidate(p, done.setdefault(p.problem, set()))
                   for p in plans.values() if p.problem is not None]):
            plans = make()
        return plans

