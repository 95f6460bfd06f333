"""Which engine configurations cudnn-graph's find() times, and how it judges
them: the rules of Notes [find cut-offs], [cold probe], [runtime-compiled
engines], [beta and workspace] and [knob search], as functions of what
heuristics and the engine configs report. No device work here;
:class:`~mucudnn.backends.cudnn_graph.CudnnGraphBackend` applies them.

>>> numerics_allowed("fma", [int(Note.TENSOR_CORE)])
False
"""

from __future__ import annotations

import time
from typing import Any, Collection, Iterable, Mapping, MutableMapping, Optional, Sequence

from .._cudnn import graph_descriptors as gd
from .._cudnn.enums import BackendBehaviorNote as Behavior
from .._cudnn.enums import BackendNumericalNote as Note
from ..problem import ConvProblem, Direction

__all__ = ["CARRY_LEAD", "COLD_PROBE_FLOOR_MS", "PARITY_SUFFIX", "RTC_CHOICES", "SEARCH_MODES",
           "FirstTimed", "parity_cache_name",
           "carried_ids", "cold_out", "far_cut", "fitting", "knob_variants",
           "leaders", "note_ratios", "over_cap", "numerics_allowed", "parity_compiles",
           "remember", "rtc_cut", "top_k_cut"]


#: find()'s search spaces (Note [knob search]).
SEARCH_MODES = ("heuristics", "knobs")


def numerics_allowed(math: str, numerical_notes: Sequence[int]) -> bool:
    """Whether an engine with ``numerical_notes`` may run a problem of math mode ``math``."""
    notes = {int(n) for n in numerical_notes}
    if math == "tensor_op_allow_conversion":
        return True
    if int(Note.REDUCED_PRECISION_REDUCTION) in notes or int(Note.DOWN_CONVERT_INPUTS) in notes:
        return False
    if math == "fma" and int(Note.TENSOR_CORE) in notes:
        return False
    return True


#: See Note [cold probe]: a warm-up run must also be at least this much slower than
#: the best so far to end a candidate's timing (covers lazy module loading).
COLD_PROBE_FLOOR_MS = 1.0

# Note [cold probe]
# ~~~~~~~~~~~~~~~~~
# Timing is most of a cold find(), and most of that goes to candidates far
# behind the best, which still ran twice (warm-up, then the probe run of Note
# [find cut-offs]). So the warm-up run is timed as well, and a candidate whose
# warm-up took more than ``find_cold_ratio`` times the best median so far, and
# over COLD_PROBE_FLOOR_MS more, stops there, reported with that time. A first
# run includes one-time costs (lazy module loading, cold caches), so it can
# only overstate: the ratio is wider than the probe's and the floor keeps
# short kernels, whose first run is mostly loading, from being judged by it.
# Loading happens in the host's launch call while the GPU waits between the
# two events, so the host seconds of that call (``FirstTimed``) are taken off
# the warm-up's time before it is judged (``_cold_out``): a fast engine whose
# first run was nearly all loading is not reported at its loading time.
# Measurements: docs/BENCHMARKS.md, "Cold start".


def top_k_cut(cands: list[gd.EngineConfigInfo], k: Optional[int],
              rankings: dict[str, list[str]],
              keep_zero: bool = True) -> list[gd.EngineConfigInfo]:
    """Note [find cut-offs]
    ~~~~~~~~~~~~~~~~~~~~

    Of the candidates (which fit the cap), those among the ``k`` best-ranked of
    some heuristics mode's ranking (``rankings``: mode -> config ids, best
    first), plus (with ``keep_zero``) the best-ranked one known to need no
    workspace, which runs under any limit (a plan for a tight budget, or a
    re-plan when memory runs out); in heuristics order. Without ``keep_zero``
    the zero-workspace config is left to a find() under a cap of 0 (Note [one
    zero-workspace find per kernel]).

    Timing every candidate is what makes a cold find() slow: a network's
    kernels have about thirty candidates per micro-batch size, and most of
    the time goes to the slow ones that heuristics rank last. Each mode keeps
    its own best (mode A's ranking alone missed AlexNet's best backward-filter
    engines, which only FALLBACK names). Cutting is checked against timing
    everything on the bench networks (executed plan totals, docs/BENCHMARKS.md,
    "Cold start").
    """
    if k is None or len(cands) <= k:
        return list(cands)
    allowed = {c.id for c in cands}
    keep: set[str] = set()
    for ids in rankings.values():
        keep.update([i for i in ids if i in allowed][:k])
    if keep_zero and not any(c.workspace_bytes == 0 for c in cands if c.id in keep):
        zero = next((c for c in cands if c.workspace_bytes == 0), None)
        if zero is not None:
            keep.add(zero.id)
    return [c for c in cands if c.id in keep]


# Note [runtime-compiled engines]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Some engines (behaviour note RUNTIME_COMPILATION) generate and compile their
# kernels when a plan is finalized, for that problem. On a machine whose CUDA
# JIT cache has never seen them (tools/cold_start.py --jit-cache fresh) they
# are nearly all of a cold find()'s finalization, a fraction of a second each,
# and their compilations do not overlap on the thread pool. ``find_rtc``
# chooses which of them find() finalizes: "all", "first" (a config that some
# heuristics mode ranks first among the candidates) or "none"; where only such
# configs are candidates, all of them are kept. The default is "none": it
# halves a cold optimisation for executed plans within the run-to-run spread
# (docs/BENCHMARKS.md, "Cold start").
#: find_rtc values (Note [runtime-compiled engines]).
RTC_CHOICES = ("all", "first", "none")


def parity_compiles(problem: ConvProblem, direction: Direction) -> bool:
    """See Note [search parity]: whether a kernel's first find() times the
    runtime-compiled configs within the top k whatever ``find_rtc`` says:
    for the forward and backward-data of grouped convolutions, and the
    backward-filter of 16-bit depthwise ones (one input channel per group),
    where cuDNN's specialised kernels are compiled at run time.

    >>> dw = ConvProblem((8, 7, 7, 64), (64, 7, 7, 1), padding=3, groups=64, layout="NHWC")
    >>> [parity_compiles(dw, d) for d in Direction]
    [True, True, False]
    >>> dw16 = ConvProblem((8, 7, 7, 64), (64, 7, 7, 1), padding=3, groups=64, layout="NHWC",
    ...                    dtype="bfloat16")
    >>> [parity_compiles(dw16, d) for d in Direction]
    [True, True, True]
    >>> parity_compiles(ConvProblem((8, 64, 7, 7), (64, 64, 3, 3)), Direction.FORWARD)
    False
    """
    if problem.groups == 1:
        return False
    if direction is not Direction.BACKWARD_FILTER:
        return True
    return problem.w_dims[1] == 1 and problem.itemsize == 2


#: See Note [candidate sets in keys]: what a search with ``parity`` appends to its
#: name in the keys of problems whose backward-filter it compiles
#: (:func:`parity_cache_name`), so that their measurements from before it did are
#: taken again rather than replayed without that kernel.
PARITY_SUFFIX = "+wgrad-rtc"


def parity_cache_name(name: str, problem: ConvProblem) -> str:
    """The name a search with ``parity`` keeps ``problem``'s measurements and
    plans under: with :data:`PARITY_SUFFIX` where its backward-filter compiles
    (:func:`parity_compiles`), else ``name``.

    >>> dw = dict(padding=3, groups=64, layout="NHWC")
    >>> parity_cache_name("g", ConvProblem((8, 7, 7, 64), (64, 7, 7, 1), dtype="bfloat16", **dw))
    'g+wgrad-rtc'
    >>> parity_cache_name("g", ConvProblem((8, 7, 7, 64), (64, 7, 7, 1), **dw))
    'g'
    """
    return name + PARITY_SUFFIX if parity_compiles(problem, Direction.BACKWARD_FILTER) else name


def rtc_cut(cands: list[gd.EngineConfigInfo], rule: str,
             rankings: dict[str, list[str]]) -> list[gd.EngineConfigInfo]:
    """See Note [runtime-compiled engines]: ``cands`` without the configs of engines
    that compile their kernels at run time, except (``rule="first"``) one
    that some heuristics mode ranks first among ``cands``; all of them for
    ``"all"``, and all of them where nothing else would be left.

    >>> rtc = int(Behavior.RUNTIME_COMPILATION)
    >>> c = [gd.EngineConfigInfo(i, (), (), (rtc,) if i < 2 else ()) for i in range(4)]
    >>> [x.global_index for x in rtc_cut(c, "first", {"A": ["e1", "e0", "e2"]})]
    [1, 2, 3]
    >>> [x.global_index for x in rtc_cut(c, "none", {"A": ["e1"]})]
    [2, 3]
    >>> [x.global_index for x in rtc_cut(c[:2], "none", {})]
    [0, 1]
    >>> [x.global_index for x in rtc_cut(c[:2], "first", {"A": ["e1"]})]
    [0, 1]
    """
    if rule == "all":
        return list(cands)
    rtc = int(Behavior.RUNTIME_COMPILATION)
    first: set[str] = set()
    if rule == "first":
        allowed = {c.id for c in cands}
        for ids in rankings.values():
            top = next((i for i in ids if i in allowed), None)
            if top is not None:
                first.add(top)
    if all(rtc in c.behavior_notes for c in cands):
        return list(cands)  # nothing else would be left, whatever the rule
    return [c for c in cands if rtc not in c.behavior_notes or c.id in first]


def fitting(found: list[tuple[Any, Any, int, Optional[int]]],
             want: int) -> tuple[list[tuple[Any, Any, int]], int]:
    """See Note [beta and workspace]: of ``(plan, config, beta = 0 need, beta = 1
    need)`` entries (the last None where cuDNN refuses the config with beta =
    1, so it cannot accumulate micro-batches), the ``(plan, config, need)``
    to time: need = the larger of the two, at most ``want``. Configs that
    cannot accumulate are left out while any other fits (their count comes
    back too); otherwise they are kept at their beta = 0 need, as they still
    run a whole batch in one call.

    >>> fitting([("p", "a", 10, 30), ("q", "b", 5, None), ("r", "c", 90, 0)], 50)
    ([('p', 'a', 30)], 1)
    >>> fitting([("q", "b", 5, None), ("r", "c", 90, 0)], 50)
    ([('q', 'b', 5)], 0)
    """
    plans = [(p, c, max(n0, n1)) for p, c, n0, n1 in found
             if n1 is not None and max(n0, n1) <= want]
    lone = [(p, c, n0) for p, c, n0, n1 in found if n1 is None and n0 <= want]
    return (plans, len(lone)) if plans else (lone, 0)


def knob_variants(base: Sequence[tuple[int, int]], knobs: Sequence[gd.KnobInfo],
                  values: int) -> list[tuple[tuple[int, int], ...]]:
    """See Note [knob search]: the knob settings tried around ``base`` (an engine
    config's knob choices): ``base`` itself, then each knob moved alone through
    up to ``values`` of its values, the others kept; sorted knob tuples, no
    repeats.

    >>> knob_variants([(2, 1)], [gd.KnobInfo(2, 0, 2), gd.KnobInfo(3, 0, 1)], 6)
    [((2, 1),), ((2, 0),), ((2, 2),), ((2, 1), (3, 0)), ((2, 1), (3, 1))]
    """
    start = dict(base)
    out: dict[tuple[tuple[int, int], ...], None] = {tuple(sorted(start.items())): None}
    for k in knobs:
        for v in k.values(values):
            d = dict(start)
            d[k.knob_type] = v
            out.setdefault(tuple(sorted(d.items())), None)
    return list(out)


class FirstTimed:
    """``run`` whose first call's host seconds go to ``prof.first_launch_s``
    and ``host_s`` (a plan's first launch loads its kernels); later calls are
    ``run`` alone."""

    __slots__ = ("run", "prof", "first", "host_s")

    def __init__(self, run: Any, prof: Any) -> None:
        self.run, self.prof, self.first, self.host_s = run, prof, True, 0.0

    def __call__(self) -> Any:
        if not self.first:
            return self.run()
        self.first = False
        t = time.perf_counter()
        try:
            return self.run()
        finally:
            self.host_s = time.perf_counter() - t
            self.prof.first_launch_s += self.host_s


def cold_out(first_ms: float, launch_ms: float, best_ms: float, ratio: float) -> bool:
    """See Note [cold probe]: whether a candidate whose warm-up run took ``first_ms``
    on the GPU clock, of which ``launch_ms`` the host spent in the launch call
    (loading the kernels, while the GPU waited), is far enough behind the best
    median so far to stop timing it.

    >>> cold_out(1.32, 0.0, 0.135, 4.0)   # slow, or so it seems
    True
    >>> cold_out(1.32, 1.20, 0.135, 4.0)  # its first launch loaded the kernel
    False
    """
    return first_ms - launch_ms > max(ratio * best_ms, best_ms + COLD_PROBE_FLOOR_MS)


# Note [long runs]
# ~~~~~~~~~~~~~~~~
# Find() times each candidate by its warm-up run, then ``find_repeat`` runs
# (their median), and re-times the fastest two (Note [re-timing the winners]):
# up to eight runs. For a config heuristics offer where nothing faster fits,
# hundreds of milliseconds a run, that is seconds of a cold optimisation spent
# on one candidate. The biases that the warm-up, the median and re-timing
# remove are microseconds (kernel loading, an idle GPU's clocks, Note [cold
# probe]); so a run of LONG_RUN_MS or more is timed by its warm-up run alone,
# less the host seconds its launch call spent loading kernels, and is not
# re-timed.

#: cudnn-graph's ``find_zero``: when find() times the zero-workspace config
#: that heuristics do not rank among the first k (Note [one zero-workspace
#: find per kernel], mucudnn/optimizer/benchmark.py)
ZERO_CHOICES = ("each", "once")

#: See Note [long runs]: a warm-up run at least this long (less its launch call's
#: loading) is the candidate's one timing.
LONG_RUN_MS = 20.0


def long_run(first_ms: float, launch_ms: float,
             long_ms: Optional[float] = LONG_RUN_MS) -> Optional[float]:
    """See Note [long runs]: the time to report for a candidate whose warm-up run
    took ``first_ms`` on the GPU clock, ``launch_ms`` of it in the host's
    launch call, if that is a run of ``long_ms`` or more; None otherwise (and
    always, for ``long_ms`` None).

    >>> long_run(430.5, 0.5)
    430.0
    >>> long_run(21.0, 2.0) is None   # 19 ms once its kernels were loaded
    True
    >>> long_run(430.5, 0.5, None) is None
    True
    """
    if long_ms is None:
        return None
    t = first_ms - max(0.0, launch_ms)
    return t if t >= long_ms else None


# Note [far behind at another size]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A benchmark finds one kernel at several batch sizes (Note [size pruning]:
# largest first) and times much the same engine configs at each; the engines
# far behind the best at one size (heuristics still name some among their
# first six) are far behind at every size, and their runs are a large part of
# a cold find()'s GPU time. With ``find_skip_ratio`` r, a config whose time was
# more than r times the best of its find() at every size of the kernel timed
# so far is neither finalized nor timed at the next size. The best-ranked
# config that needs no workspace stays where it would be the only one (the
# plan for a tight budget, Note [find cut-offs]). The default r = 16 cut the
# cold optimisation with no loss of plan quality (docs/BENCHMARKS.md).


def far_cut(cands: Sequence[gd.EngineConfigInfo], behind: Mapping[str, float],
            ratio: Optional[float], keep_zero: bool = True) -> list[gd.EngineConfigInfo]:
    """See Note [far behind at another size]: ``cands`` without those whose least
    time over the best of a find() at another size (``behind``: config id ->
    ratio) is over ``ratio``; None keeps them all. With ``keep_zero``, the
    best-ranked config that needs no workspace stays where it would be the
    only one.

    >>> c = [gd.EngineConfigInfo(i, (), (), (), workspace_bytes=w)
    ...      for i, w in ((5, 1 << 20), (0, 0), (1, 0))]
    >>> [x.global_index for x in far_cut(c, {"e0": 160.0, "e1": 330.0, "e5": 1.0}, 16.0)]
    [5, 0]
    >>> [x.global_index for x in far_cut(c, {"e0": 3.0}, 16.0)]
    [5, 0, 1]
    """
    if ratio is None or not behind:
        return list(cands)
    keep = [c for c in cands if behind.get(c.id, 0.0) <= ratio]
    if keep_zero and not any(c.workspace_bytes == 0 for c in keep):
        zero = next((c for c in cands if c.workspace_bytes == 0), None)
        if zero is not None:
            keep = [c for c in cands if c in keep or c is zero]
    return keep


def note_ratios(behind: MutableMapping[str, float], results: Sequence[Any]) -> None:
    """See Note [far behind at another size]: record each result's time over the
    best of ``results`` (AlgoPerf-like: ``algo``, ``time_ms``), keeping each
    config's least ratio.

    >>> from types import SimpleNamespace as R
    >>> b = {"e0": 40.0}
    >>> note_ratios(b, [R(algo="e0", time_ms=30.0), R(algo="e25", time_ms=1.5)])
    >>> b
    {'e0': 20.0, 'e25': 1.0}
    """
    times = [r.time_ms for r in results if r.time_ms > 0]
    if not times:
        return
    best = min(times)
    for r in results:
        if r.time_ms > 0:
            key = str(r.algo)
            behind[key] = min(behind.get(key, float("inf")), r.time_ms / best)


# Note [carried to other sizes]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Heuristics name engine configs for one problem, batch size included, and a
# config they rank first at one size may not be among those find() times at
# another, where it would be the best that fits the cap. ``find_carry=True``
# makes find() remember, per kernel (problem at batch 1, direction), two kinds
# of configs: over the cap (:func:`over_cap`), those some heuristics mode ranks
# among its first k, which find() would have timed but for their workspace
# (the descent goes on to smaller sizes where they fit, Note [size pruning]);
# and leaders (:func:`leaders`), the results within CARRY_LEAD of the best. At
# every later find() of the kernel those that are not already candidates (nor
# far behind, Note [far behind at another size]) are built on this size's
# graph and, where cuDNN accepts them, the numerics allow them, they compile
# nothing at run time (unless ``find_rtc="all"``) and fit the cap, timed with
# the rest (``FindProfile.carried``). A carried config that runs without leading
# is forgotten (:func:`remember`). Sizes answered from the benchmark cache add
# nothing. On by default; ``find_carry=False`` turns it off (docs/BENCHMARKS.md).

#: See Note [carried to other sizes]: a result within this factor of its find()'s
#: best is a leader, carried to the kernel's other sizes.
CARRY_LEAD = 1.1


def over_cap(infos: Sequence[gd.EngineConfigInfo], want: int,
             rankings: Mapping[str, Sequence[str]], k: Optional[int]) -> list[str]:
    """See Note [carried to other sizes]: the ids of the configs in ``infos``
    (numerics allowed) that some heuristics mode ranks among its first ``k``
    of them (all, for None) and that need more than ``want`` bytes: those the
    cut of Note [find cut-offs] would keep without the cap; by mode, then
    rank, no repeats (a config whose workspace is not reported is not over).

    >>> c = [gd.EngineConfigInfo(i, (), workspace_bytes=w)
    ...      for i, w in ((17, 400), (48, 60), (34, 300), (1, 0), (2, 500))]
    >>> over_cap(c, 64, {"A": ["e48", "e17", "e34"], "B": ["e9", "e34", "e2", "e1"]}, 6)
    ['e17', 'e34', 'e2']
    >>> over_cap(c, 64, {"B": ["e9", "e1", "e34"]}, 1)
    []
    >>> over_cap(c, 1000, {"A": ["e17"]}, None)
    []
    """
    by_id = {c.id: c for c in infos}
    out: dict[str, None] = {}
    for ids in rankings.values():
        ranked = [i for i in ids if i in by_id]  # numerics allowed
        for i in ranked if k is None else ranked[:k]:
            ws = by_id[i].workspace_bytes
            if ws is not None and ws > want:
                out.setdefault(i, None)
    return list(out)


def leaders(results: Sequence[Any], ratio: float = CARRY_LEAD) -> list[str]:
    """See Note [carried to other sizes]: the configs of ``results`` (AlgoPerf-like:
    ``algo``, ``time_ms``) that ran within ``ratio`` times the best, fastest first.

    >>> from types import SimpleNamespace as R
    >>> leaders([R(algo="e48", time_ms=0.83), R(algo="e17", time_ms=0.57),
    ...          R(algo="e34", time_ms=0.62), R(algo="e1", time_ms=4.4)])
    ['e17', 'e34']
    """
    timed = sorted((r for r in results if r.time_ms > 0), key=lambda r: r.time_ms)
    if not timed:
        return []
    best = timed[0].time_ms
    return [str(r.algo) for r in timed if r.time_ms <= ratio * best]


def remember(memory: MutableMapping[str, None], results: Sequence[Any],
             carried: Collection[str]) -> None:
    """See Note [carried to other sizes]: after a find() whose ``results``
    (AlgoPerf-like) include the ``carried`` configs, keep its leaders in
    ``memory`` and drop the carried configs that ran without leading: a
    config carried down for its rank at a larger size is timed once, at the
    first smaller size where it fits, and carried on only while it leads.

    >>> from types import SimpleNamespace as R
    >>> memory = dict.fromkeys(["e17", "e34", "e0"])
    >>> remember(memory, [R(algo="e17", time_ms=0.17), R(algo="e48", time_ms=0.24),
    ...                   R(algo="e34", time_ms=0.26)], {"e17", "e34"})
    >>> list(memory)
    ['e17', 'e0']
    """
    lead = leaders(results)
    for r in results:
        key = str(r.algo)
        if key in carried and key not in lead:
            memory.pop(key, None)
    memory.update(dict.fromkeys(lead))


def carried_ids(blocked: Iterable[str], have: Collection[str], behind: Mapping[str, float],
                ratio: Optional[float]) -> list[str]:
    """See Note [carried to other sizes]: of the ids remembered (``blocked``: over
    the cap, or leaders) at other sizes, those to add to a find() whose candidates are ``have``:
    not among them, and (with ``ratio``) not more than ``ratio`` times behind
    the best of a find() at another size (``behind``, Note [far behind at
    another size]).

    >>> carried_ids(["e17", "e34", "e0"], {"e34"}, {"e0": 40.0, "e17": 1.0}, 16.0)
    ['e17']
    >>> carried_ids(["e17", "e0"], set(), {"e0": 40.0}, None)
    ['e17', 'e0']
    """
    return [i for i in blocked
            if i not in have and (ratio is None or behind.get(i, 0.0) <= ratio)]
