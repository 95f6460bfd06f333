"""WD (workspace division): one workspace budget shared by many kernels.

Kernel k (a layer and direction) picks exactly one plan c from its Pareto
front: minimise ``sum t[k,c] x[k,c]`` subject to ``sum_c x[k,c] = 1`` for every
k and ``sum m[k,c] x[k,c] <= W``, x binary (a multiple-choice knapsack),
solved with :func:`scipy.optimize.milp` (HiGHS).

Before the solver runs, plans larger than W and plans dominated within their
own front are dropped; if every kernel's fastest remaining plan already fits
W together, that is the answer and no solver is needed. The solver's answer is
checked in exact integer bytes against W (HiGHS works to a tolerance) and
re-solved with a tightened budget if it overshoots by rounding.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Hashable, Mapping, Sequence, TypeVar

import numpy as np

from ..problem import Plan
from ..errors import InvalidValueError

__all__ = ["optimize_wd"]

log = logging.getLogger("mucudnn")

K = TypeVar("K", bound=Hashable)


def _prune(plans: Sequence[Plan], budget: int) -> list[Plan]:
    """Plans that fit ``budget`` and are not dominated, ascending workspace, time decreasing."""
    fit = sorted((p for p in plans if p.workspace_bytes <= budget),
                 key=lambda p: (p.workspace_bytes, p.time_ms))
    out: list[Plan] = []
    for p in fit:
        if not out or p.time_ms < out[-1].time_ms:
            out.append(p)
    return out


def optimize_wd(fronts: Mapping[K, Sequence[Plan]], total_workspace: int, *,
                time_limit: float | None = 60.0) -> dict[K, Plan]:
    """Pick one plan per kernel so that their workspaces sum to at most
    ``total_workspace`` bytes and their times sum to a minimum.

    ``fronts`` maps a kernel key (e.g. ``("conv2", Direction.FORWARD)`` or
    ``"conv2/fwd"``) to its candidate plans (usually :func:`pareto_front`'s
    list; any list of plans works). Returns ``{key: chosen Plan}``.

    Raises ValueError for a negative budget, an empty front, or when the
    smallest plans of all kernels together exceed the budget (a front with a
    zero-workspace plan always fits).
    """
    if isinstance(total_workspace, bool) or not hasattr(total_workspace, "__index__"):
        if isinstance(total_workspace, float) and float(total_workspace).is_integer():
            total_workspace = int(total_workspace)
        else:
            raise InvalidValueError(
                f"total_workspace: expected an int number of bytes, got {total_workspace!r}")
    W = int(total_workspace)
    if W < 0:
        raise InvalidValueError(f"total_workspace: expected >= 0 bytes, got {W}")
    keys = list(fronts)
    if not keys:
        return {}
    cands: list[list[Plan]] = []
    need = 0
    for k in keys:
        plans = list(fronts[k])
        if not plans:
            raise InvalidValueError(f"optimize_wd: kernel {k!r} has no candidate plan")
        pruned = _prune(plans, W)
        if not pruned:
            smallest = min(p.workspace_bytes for p in plans)
            raise InvalidValueError(
                f"optimize_wd: infeasible: kernel {k!r} needs at least {smallest} bytes of "
                f"workspace, more than total_workspace={W}")
        need += pruned[0].workspace_bytes
        cands.append(pruned)
    if need > W:
        raise InvalidValueError(
            f"optimize_wd: infeasible: the smallest plans of the {len(keys)} kernels need "
            f"{need} bytes together, more than total_workspace={W}")
    # Everyone's fastest fits: nothing to trade.
    if sum(c[-1].workspace_bytes for c in cands) <= W:
        return {k: c[-1] for k, c in zip(keys, cands)}

    t0 = time.perf_counter()
    pick = _solve_milp(cands, W, time_limit)
    log.debug("optimize_wd: %d kernels, %d candidates, solved in %.3f s", len(keys),
              sum(len(c) for c in cands), time.perf_counter() - t0)
    return {k: c[i] for k, c, i in zip(keys, cands, pick)}


@contextlib.contextmanager
def _quiet_stdout():
    """Silence file descriptor 1 around the solver.

    Note: the HiGHS bundled with SciPy 1.17 prints debug lines
    ("HighsMipSolverData::transformNewIntegerFeasibleSolution ...") straight to
    the C-level stdout even with disp=False; a library must not write to its
    user's stdout, so fd 1 points at /dev/null for the duration of the call.
    """
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
        finally:
            os.close(devnull)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _solve_milp(cands: list[list[Plan]], W: int, time_limit: float | None) -> list[int]:
    # Note [heavy imports where they are used]
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_array
    sizes = [len(c) for c in cands]
    n = sum(sizes)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    t = np.array([p.time_ms for c in cands for p in c], dtype=float)
    m = np.array([p.workspace_bytes for c in cands for p in c], dtype=float)
    # Subtract each kernel's minimum workspace so the budget row carries only the
    # trade-off part, and scale bytes so the row's coefficients are O(1).
    base = np.array([c[0].workspace_bytes for c in cands], dtype=float)
    m_rel = m - np.repeat(base, sizes)
    slack = float(W) - float(base.sum())
    scale = max(slack, 1.0)
    rows = np.repeat(np.arange(len(cands)), sizes)
    one_per = csr_array((np.ones(n), (rows, np.arange(n))), shape=(len(cands), n))
    t_shift = t - np.repeat([c[-1].time_ms for c in cands], sizes)  # >= 0, better conditioned
    options = {"disp": False, "mip_rel_gap": 1e-6}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    budget = slack
    for _ in range(4):
        with _quiet_stdout():
            res = milp(
                c=t_shift,
                integrality=np.ones(n),
                bounds=Bounds(0, 1),
                constraints=[LinearConstraint(one_per, 1, 1),
                             LinearConstraint((m_rel / scale)[None, :], -np.inf, budget / scale)],
                options=options)
        if res.x is None:
            raise InvalidValueError(f"optimize_wd: the solver found no solution ({res.message})")
        pick = [int(np.argmax(res.x[s:s + k])) for s, k in zip(start, sizes)]
        used = sum(c[i].workspace_bytes for c, i in zip(cands, pick))
        if used <= W:
            if res.status != 0:
                log.warning("optimize_wd: solver stopped early (%s); using its best solution",
                            res.message)
            return pick
        budget -= (used - W) + 1e-9 * scale  # rounding overshoot: tighten and re-solve
    # Fall back to the always-feasible choice.
    return [0] * len(cands)
