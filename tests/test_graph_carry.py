"""Note [carried to other sizes] (cudnn-graph's ``find_carry``) on the CPU: the
rules as properties over random candidate sets, and find()'s wiring of them
with heuristics, cuDNN's engine configs and timing replaced by tables (the
GPU test in test_cudnn_graph_gpu.py runs the real thing)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from mucudnn._cudnn import graph_descriptors as gd
from mucudnn._cudnn.enums import BackendBehaviorNote as Behavior
from mucudnn._cudnn.enums import BackendNumericalNote as Note
import mucudnn as mu
from mucudnn.backends import _device, fold, graph_engines, graph_find, graph_plans, pair, split
from mucudnn.backends.cudnn_graph import CudnnGraphBackend
from mucudnn.backends.graph_candidates import (CARRY_LEAD, carried_ids, leaders, over_cap,
                                               top_k_cut)
from mucudnn.problem import AlgoPerf, ConvProblem, Direction

MiB = 1 << 20
RTC = int(Behavior.RUNTIME_COMPILATION)


# -- the rules -----------------------------------------------------------------------------------
@st.composite
def ranked(draw):
    """Configs with a workspace (None: not reported) and up to three modes'
    rankings of them (ids not among the configs stand for numerics not allowed)."""
    idx = draw(st.lists(st.integers(0, 80), min_size=1, max_size=10, unique=True))
    infos = [gd.EngineConfigInfo(i, (), workspace_bytes=draw(
        st.sampled_from([None, 0, 8 * MiB, 64 * MiB, 400 * MiB]))) for i in idx]
    ids = [c.id for c in infos] + ["e99"]
    modes = draw(st.lists(st.sampled_from(["A", "B", "FALLBACK"]), unique=True, max_size=3))
    return infos, {m: draw(st.permutations(ids))[:draw(st.integers(0, len(ids)))] for m in modes}


@given(data=ranked(), want=st.sampled_from([0, 8 * MiB, 64 * MiB, 1 << 40]),
       k=st.one_of(st.none(), st.integers(1, 6)))
def test_over_cap_is_what_the_rank_cut_would_keep_but_the_cap_leaves_out(data, want, k):
    """A config is over the cap exactly when some mode ranks it among its
    first k configs that the problem allows (top_k_cut's rule without a cap)
    and it reports more than ``want``; no repeats."""
    infos, ranks = data
    by_id = {c.id: c for c in infos}
    got = over_cap(infos, want, ranks, k)
    assert len(got) == len(set(got))
    nocap = {c.id for c in top_k_cut(infos, k, ranks, keep_zero=False)}
    ranked = {i for ids in ranks.values() for i in ids}
    assert set(got) == {i for i in nocap & ranked if by_id[i].workspace_bytes is not None
                        and by_id[i].workspace_bytes > want}


@given(times=st.lists(st.floats(0.001, 100.0), max_size=8),
       ratio=st.floats(1.0, 3.0))
def test_leaders_are_the_results_within_the_ratio_of_the_best(times, ratio):
    results = [SimpleNamespace(algo=f"e{i}", time_ms=t) for i, t in enumerate(times)]
    got = leaders(results, ratio)
    if not times:
        assert got == []
        return
    best = min(times)
    assert set(got) == {f"e{i}" for i, t in enumerate(times) if t <= ratio * best}
    assert got[0] == f"e{times.index(best)}" or times.count(best) > 1
    assert [times[int(i[1:])] for i in got] == sorted(times[int(i[1:])] for i in got)


@given(blocked=st.lists(st.sampled_from([f"e{i}" for i in range(12)]), unique=True),
       have=st.sets(st.sampled_from([f"e{i}" for i in range(12)])),
       behind=st.dictionaries(st.sampled_from([f"e{i}" for i in range(12)]),
                              st.floats(1.0, 100.0)),
       ratio=st.one_of(st.none(), st.floats(1.5, 50.0)))
def test_carried_ids_are_the_remembered_ones_not_yet_candidates_nor_far_behind(
        blocked, have, behind, ratio):
    got = carried_ids(blocked, have, behind, ratio)
    assert got == [i for i in blocked if i in got]  # in the remembered order
    assert not set(got) & have
    expect = {i for i in blocked if i not in have
              and (ratio is None or behind.get(i, 0.0) <= ratio)}
    assert set(got) == expect


# -- find()'s wiring -----------------------------------------------------------------------------
#: AlexNet conv2's backward-filter in float32 channels-last, as on the H200
#: (Note [carried to other sizes]): per batch size, the configs heuristics name
#: (mode A's order) with their workspace in MiB and time in ms; engine 17 is
#: named at 128 rows only, after a config that fits 128 MiB (as on the H200).
#: ``ENGINES``: what cuDNN reports for a config built from its id at a size
#: (absent: it refuses); e70 compiles its kernels at run time and e90 needs a
#: numerics note the problem does not allow.
NAMED = {
    128: [("e48", 125, 0.827), ("e17", 404, 0.573), ("e34", 155, 0.917), ("e70", 8, 0.60)],
    64: [("e48", 62, 0.441), ("e34", 93, 0.471)],
    32: [("e48", 31, 0.238), ("e68", 8, 0.243)],
    16: [("e48", 15, 0.132), ("e68", 8, 0.132)],
}
ENGINES = {(64, 17): 202, (32, 17): 110, (32, 70): 4, (16, 70): 2, (32, 90): 4}
TIMES = {(64, "e17"): 0.30, (32, "e17"): 0.169, (32, "e70"): 0.12, (16, "e70"): 0.06}
NOTES = {70: ((), (RTC,)), 90: ((int(Note.DOWN_CONVERT_INPUTS),), ())}


class _TableGraph(CudnnGraphBackend):
    """find() with heuristics, engine configs and timing from the tables above;
    ``rounds`` records the candidates each find() timed, by batch."""

    def __init__(self, **options):
        if "find" not in options:
            options.setdefault("find_parity", False)  # these tests are of the cuts
            options.setdefault("find_retime", 0)
        super().__init__(find_workspace_limit=1 << 40, **options)
        self.rounds: dict[int, list[str]] = {}

    def on_home_stream(self):
        return contextlib.nullcontext()

    def _infos(self, batch):
        out = []
        for algo, ws, _t in NAMED[batch]:
            idx = int(algo[1:])
            notes, behavior = NOTES.get(idx, ((), ()))
            out.append(gd.EngineConfigInfo(idx, (), notes, behavior, workspace_bytes=ws * MiB))
        return out

    def engine_configs(self, problem, direction, alpha=1.0, beta=0.0, aligns=None):
        return self._infos(problem.batch)

    def _graph(self, problem, direction, alpha, beta, aligns):
        ids = [a for a, _ws, _t in NAMED[problem.batch]]
        return SimpleNamespace(mode_ids={"A": ids}, conv=SimpleNamespace(graph=problem.batch))

    def _find_round(self, problem, direction, cands, want, timed, beat_ms=float("inf")):
        b = problem.batch
        self.rounds[b] = [c.id for c in cands]
        named = {a: t for a, _ws, t in NAMED[b]}
        return [AlgoPerf(algo=c.id, time_ms=named.get(c.id, TIMES.get((b, c.id))),
                         workspace_bytes=c.workspace_bytes) for c in cands
                if c.workspace_bytes <= want]


@pytest.fixture
def tables(monkeypatch):
    """No device: DeviceBackend's set-up and cuDNN's engine descriptors are tables."""

    def init(self, device=None, stream=None, find_workspace_limit=None):
        import threading
        self.find_workspace_limit = find_workspace_limit
        self.device = 0
        self._lock = threading.RLock()
        self.find_profile = _device.FindProfile()

    @contextlib.contextmanager
    def engine(graph, idx):
        if (graph, idx) not in ENGINES:
            raise ValueError(f"engine {idx} refused at batch {graph}")
        yield SimpleNamespace(batch=graph, idx=idx)

    monkeypatch.setattr(_device.DeviceBackend, "__init__", init)
    for module in (graph_plans, graph_engines, graph_find):
        monkeypatch.setattr(module, "using_device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(gd, "engine", engine)
    monkeypatch.setattr(gd, "engine_info", lambda e: (e.idx,) + NOTES.get(e.idx, ((), ())))
    monkeypatch.setattr(CudnnGraphBackend, "_config_workspace",
                        staticmethod(lambda e, knobs: ENGINES[e.batch, e.idx] * MiB))


P = ConvProblem((128, 27, 27, 96), (256, 5, 5, 96), padding=2, layout="NHWC")
#: P in two groups: the tables answer for it as for P (Note [search parity] tells them apart)
GROUPED = ConvProblem((128, 27, 27, 96), (256, 5, 5, 48), padding=2, groups=2, layout="NHWC")
#: P's input channels as a depthwise convolution (Note [which convolutions split])
DEPTHWISE = ConvProblem((128, 27, 27, 96), (96, 5, 5, 1), padding=2, groups=96, layout="NHWC")
#: DEPTHWISE in bfloat16, whose backward-filter parity compiles (Note [search parity])
DEPTHWISE16 = dataclasses.replace(DEPTHWISE, dtype="bfloat16")
BWD_FILTER = Direction.BACKWARD_FILTER


def _descend(be, limit, problem=P, direction=BWD_FILTER):
    return {b: be.find(problem.with_batch(b), direction, limit) for b in (128, 64, 32, 16)}


def test_a_config_blocked_at_a_larger_size_is_timed_where_it_fits(tables):
    """Under 128 MiB engine 17 is over the cap at 128 rows, where heuristics
    rank it second, after a config that fits: it is tried at 64 rows (cuDNN says 202 MiB: not timed) and
    timed at 32 (110 MiB), where heuristics do not name it; at 16 cuDNN
    refuses it. Without find_carry it is never timed."""
    plain = _TableGraph(find_carry=False)
    _descend(plain, 128 * MiB)
    assert all("e17" not in ids for ids in plain.rounds.values())
    assert plain.find_profile.carried == 0

    be = _TableGraph()  # find_carry=True is the default
    found = _descend(be, 128 * MiB)
    assert "e17" not in be.rounds[64] and "e17" not in be.rounds[16]
    assert be.rounds[32] == plain.rounds[32] + ["e17"]
    assert min(found[32], key=lambda r: r.time_ms).algo == "e17"
    assert be.find_profile.carried == 1
    for b in (128, 64, 16):
        assert be.rounds[b] == plain.rounds[b]


def test_the_leader_of_a_larger_size_is_carried_without_a_cap(tables):
    """With no cap nothing is blocked; engine 17 led at 128 rows (0.573 ms, the
    next within CARRY_LEAD of it is e70, which compiles at run time and is left
    out), so it is timed at 64 and 32 rows, and e70 only with find_rtc="all"."""
    assert 0.60 <= CARRY_LEAD * 0.573
    be = _TableGraph(find_carry=True)
    _descend(be, None)
    assert "e17" in be.rounds[128]
    assert be.rounds[64][-1:] == ["e17"] and be.rounds[32][-1:] == ["e17"]
    assert "e70" not in be.rounds[32]
    assert be.find_profile.carried == 2

    every = _TableGraph(find_carry=True, find_rtc="all")
    _descend(every, None)
    assert {"e17", "e70"} <= set(every.rounds[32]) and "e70" in every.rounds[16]


def test_carried_configs_keep_the_problems_numerics(tables, monkeypatch):
    """A remembered config whose engine the problem's numerics do not allow
    (e90: DOWN_CONVERT_INPUTS) is not timed, though cuDNN accepts it."""
    be = _TableGraph(find_carry=True)
    be.find(P.with_batch(128), BWD_FILTER, None)
    be._carry.get_or_create((P.with_batch(1).key(), BWD_FILTER.value), dict)["e90"] = None
    be.find(P.with_batch(32), BWD_FILTER, None)
    assert "e90" not in be.rounds[32] and "e17" in be.rounds[32]


def test_find_carry_is_checked_before_any_device_work():
    with pytest.raises(TypeError, match="find_carry: expected True or False"):
        CudnnGraphBackend(find_carry="yes")


def test_a_carried_config_that_does_not_lead_is_timed_once(tables, monkeypatch):
    """Engine 17 carried down from 128 rows (no cap) but slower than the best at
    64 rows is forgotten there: it is not timed at 32, although it would fit."""
    monkeypatch.setitem(TIMES, (64, "e17"), 0.90)  # behind e48's 0.441 at 64 rows
    be = _TableGraph()
    _descend(be, None)
    assert be.rounds[64][-1:] == ["e17"]
    assert "e17" not in be.rounds[32]
    assert be.find_profile.carried == 1
    memory = be._carry.get((P.with_batch(1).key(), BWD_FILTER.value))
    assert "e17" not in memory and "e48" in memory


def test_parity_times_every_candidate_at_a_kernels_first_find(tables):
    """See Note [search parity]: the first find() of a kernel times every candidate
    that needs no compilation whatever its rank, and, for a grouped
    convolution's forward and backward-data, the runtime-compiled ones within
    the top k (as PyTorch's cudnn.benchmark times every config heuristics
    name); the finds of smaller sizes after it are cut as before, and carry
    the configs that led, runtime-compiled ones included. Other kernels'
    runtime-compiled configs follow ``find_rtc`` at their first find too."""
    cut = _TableGraph(find_top_k=2)  # find_parity=False: the cuts everywhere
    missed = _descend(cut, None)
    par = _TableGraph(find_top_k=2, find_parity=True)
    found = _descend(par, None)
    assert cut.rounds[128] == ["e48", "e17"]
    assert par.rounds[128] == ["e48", "e17", "e34"]  # e70 compiles and ranks 4th
    assert par.find_profile.parity == 1 and cut.find_profile.parity == 0
    assert "e34" not in par.rounds[64] or "e34" in cut.rounds[64]  # cut below the first size
    assert min(found[128], key=lambda r: r.time_ms).algo == "e17"
    assert missed[128] and min(missed[128], key=lambda r: r.time_ms).algo == "e17"

    fwd = Direction.FORWARD  # the tables answer every direction alike
    cut4 = _TableGraph(find_top_k=4)
    _descend(cut4, None, GROUPED, fwd)
    par4 = _TableGraph(find_top_k=4, find_parity=True)
    found4 = _descend(par4, None, GROUPED, fwd)
    assert "e70" not in cut4.rounds[128] and "e70" in par4.rounds[128]
    assert "e70" in par4.rounds[32] and "e70" not in cut4.rounds[32]  # carried: it led
    assert {r.algo for r in found4[32]} >= {"e70"}


def test_a_blocked_config_that_compiles_is_carried_only_where_parity_compiles(tables, monkeypatch):
    """See Note [search parity]: engine 17, over a 128 MiB cap at 128 rows and
    fitting at 32, made to compile at run time: under parity it is carried to
    32 rows for a grouped forward and a 16-bit depthwise backward-filter,
    whose first finds compile, and not for a grouped or 32-bit depthwise
    backward-filter or an ungrouped kernel, whose first finds do not."""
    monkeypatch.setitem(NOTES, 17, ((), (RTC,)))
    dw16 = dataclasses.replace(DEPTHWISE, dtype="bfloat16")
    rounds = {}
    for name, problem, direction in (("grouped forward", GROUPED, Direction.FORWARD),
                                     ("grouped backward-filter", GROUPED, BWD_FILTER),
                                     ("depthwise backward-filter", DEPTHWISE, BWD_FILTER),
                                     ("bf16 depthwise backward-filter", dw16, BWD_FILTER),
                                     ("ungrouped backward-filter", P, BWD_FILTER)):
        be = _TableGraph(find_parity=True, find_split=False)
        _descend(be, 128 * MiB, problem, direction)
        rounds[name] = be.rounds
    assert "e17" in rounds["grouped forward"][32]
    assert "e17" in rounds["bf16 depthwise backward-filter"][32]
    assert "e17" not in rounds["grouped backward-filter"][32]
    assert "e17" not in rounds["depthwise backward-filter"][32]
    assert "e17" not in rounds["ungrouped backward-filter"][32]
    every = _TableGraph(find_parity=True, find_rtc="all")
    _descend(every, 128 * MiB)
    assert "e17" in every.rounds[32]


@pytest.mark.parametrize("rtc", ["none", "first", "all"])
def test_an_ungrouped_kernels_first_find_compiles_only_as_find_rtc_says(tables, rtc):
    """See Note [search parity]: e70 compiles at run time and ranks 4th; under
    parity with the top 4 a grouped kernel's first forward or backward-data
    find() times it whatever ``find_rtc`` says; an ungrouped kernel's, and a
    grouped backward-filter's, only where ``find_rtc`` would anywhere ("all";
    "first" keeps only a config ranked first)."""
    flat = _TableGraph(find_top_k=4, find_parity=True, find_rtc=rtc)
    _descend(flat, None)
    for direction in (Direction.FORWARD, Direction.BACKWARD_DATA):
        grouped = _TableGraph(find_top_k=4, find_parity=True, find_rtc=rtc)
        _descend(grouped, None, GROUPED, direction)
        assert "e70" in grouped.rounds[128]
        assert [c for c in flat.rounds[128] if c != "e70"] == \
            [c for c in grouped.rounds[128] if c != "e70"]
    wgrad = _TableGraph(find_top_k=4, find_parity=True, find_rtc=rtc)
    _descend(wgrad, None, GROUPED)
    assert ("e70" in flat.rounds[128]) == (rtc == "all")
    assert wgrad.rounds[128] == flat.rounds[128]
    assert flat.find_profile.rtc_cut >= (0 if rtc == "all" else 1)


class _LoggedGraph(_TableGraph):
    """A :class:`_TableGraph` that logs each find()'s (groups, candidates timed);
    ``slow`` is not a candidate of the whole problem (96 groups) and a chunk
    problem of ``slow_at`` groups times ``slow_ms`` for it."""

    slow, slow_at, slow_ms = None, None, 0.0

    def __init__(self, **options):
        super().__init__(**options)
        self.log: list[tuple[int, list[str]]] = []
        self.beats: list[float] = []

    def _find_round(self, problem, direction, cands, want, timed, beat_ms=float("inf")):
        self.beats.append(beat_ms)
        if problem.groups == 96:
            cands = [c for c in cands if c.id != self.slow]
        self.log.append((problem.groups, [c.id for c in cands]))
        out = super()._find_round(problem, direction, cands, want, timed, beat_ms)
        if problem.groups == self.slow_at:
            out = [dataclasses.replace(a, time_ms=self.slow_ms) if a.algo == self.slow else a
                   for a in out]
        return out

    def _time_split(self, sp, direction, size):
        return 0.0


def test_a_config_far_behind_the_whole_problem_is_not_timed_in_its_chunks(tables, monkeypatch):
    """See Note [far behind in another split]: DEPTHWISE's backward-filter under
    128 MiB splits by 2, 4 and 8. e5 took 24 times the best of the whole
    problem's find: no factor times it (find_skip_ratio 16, the default);
    e6, 6 times behind, is timed at every factor. e4, not a candidate of the
    whole problem, falls 30 times behind at the factor 2: the factors after it
    leave it out, and the whole problem's ratios keep only its own finds'.
    With find_skip_ratio=None every factor times them all."""
    monkeypatch.setitem(NAMED, 128, NAMED[128] + [("e5", 8, 20.0), ("e6", 8, 5.0),
                                                  ("e4", 8, 0.9)])
    assert split.searched_factors(DEPTHWISE) == (2, 4, 8)
    groups = [96, 48, 24, 12]
    be = _LoggedGraph()
    be.slow, be.slow_at, be.slow_ms = "e4", 48, 150.0
    be.find(DEPTHWISE, BWD_FILTER, 128 * MiB)
    assert [g for g, _ in be.log] == groups
    timed = dict(be.log)
    assert "e5" in timed[96] and all("e5" not in timed[g] for g in groups[1:])
    assert all("e6" in timed[g] for g in groups)
    assert "e4" in timed[48] and all("e4" not in timed[g] for g in (24, 12))
    assert be.find_profile.far_cut == 3 + 2
    # See Note [a chunk's time to beat]: 1/k of the whole problem's best (e48's)
    assert be.beats == [math.inf] + [pytest.approx(0.827 / k) for k in (2, 4, 8)]
    whole = be._behind.get((DEPTHWISE.with_batch(1).key(), BWD_FILTER.value))
    assert set(whole) == set(timed[96]) - {"e17", "e34"} and "e4" not in whole

    every = _LoggedGraph(find_skip_ratio=None)
    every.slow, every.slow_at, every.slow_ms = "e4", 48, 150.0
    every.find(DEPTHWISE, BWD_FILTER, 128 * MiB)
    assert all({"e4", "e5", "e6"} <= set(ids) for g, ids in every.log if g != 96)
    assert every.find_profile.far_cut == 0


class _Run:
    """A candidate's run as the timing harness below sees it: its id, and a
    count of its calls in ``runs``."""

    def __init__(self, algo, runs):
        self.algo, self.runs = algo, runs

    def __call__(self):
        self.runs[self.algo] = self.runs.get(self.algo, 0) + 1


def _timing_harness(be, monkeypatch, time_on_stream, runs):
    """Set ``be`` up to time candidates with ``time_on_stream`` in place of the
    GPU (each candidate's run a :class:`_Run` counting into ``runs``); returns
    the function from candidate ids to the plans to hand ``_time_plans``."""
    be.stream = SimpleNamespace(synchronize=lambda: None)
    monkeypatch.setattr(graph_find, "time_on_stream", time_on_stream)
    monkeypatch.setattr(be, "_find_pointers", lambda problem, direction: (256, 512, 768),
                        raising=False)
    monkeypatch.setattr(be, "_find_workspace", lambda n: (1024, 1 << 30), raising=False)
    monkeypatch.setattr(be, "_find_run", lambda problem, direction, p, ptrs, ws: (
        p, SimpleNamespace(close=lambda: None), _Run(p.id, runs)))
    monkeypatch.setattr(graph_find.FirstTimed, "__getattr__",
                        lambda self, name: getattr(self.run, name), raising=False)
    return lambda algos: [(SimpleNamespace(id=a, workspace_bytes=0),
                           gd.EngineConfigInfo(int(a[1:]), ()), 0) for a in algos]


@pytest.mark.parametrize("beat_ms", [math.inf, 1.0])
def test_a_chunk_find_judges_its_first_candidates_by_the_time_to_beat(tables, monkeypatch,
                                                                      beat_ms):
    """See Note [a chunk's time to beat]: e1 (10 ms a run, heuristics' first) is
    timed in full (warm-up and three runs) where nothing is to beat, and stops
    after its warm-up against 1 ms; e2 (0.5 ms) is timed in full either way and
    the times reported are the runs'."""
    ms = {"e1": 10.0, "e2": 0.5}
    runs = {a: 0 for a in ms}

    def time_on_stream(fn, stream=None, warmup=0, repeat=1, held=False, host=False):
        for _ in range(warmup + repeat):
            fn()
        return [ms[fn.algo]] * repeat

    be = _TableGraph()
    plans = _timing_harness(be, monkeypatch, time_on_stream, runs)(ms)
    out = graph_find.GraphFind._time_plans(be, P, BWD_FILTER, plans, {}, beat_ms)
    assert {a.algo: a.time_ms for a in out} == ms
    assert runs == {"e1": 1 if beat_ms == 1.0 else 4, "e2": 4}
    assert be.find_profile.cold_out == (1 if beat_ms == 1.0 else 0)


@pytest.mark.parametrize("host", [False, True])
def test_find_counts_the_host_of_each_run_where_its_options_say(tables, monkeypatch, host):
    """See Note [the host's share of a find]: every timing find() makes of a
    candidate (its runs and the re-timing of the fastest) asks for the host's
    share exactly where ``host`` is set; e1 (0.3 ms on the GPU, 0.9 ms to
    issue: a loop over groups) leads on the GPU alone and loses to e2 (0.5 ms,
    0.05 ms to issue) where the host counts."""
    gpu, issue = {"e1": 0.3, "e2": 0.5}, {"e1": 0.9, "e2": 0.05}
    asked = []

    def time_on_stream(fn, stream=None, warmup=0, repeat=1, held=False, host=False):
        asked.append((held, host))
        for _ in range(warmup + repeat):
            fn()
        a = fn.algo
        return [max(gpu[a], issue[a]) if host else gpu[a]] * repeat

    from mucudnn.backends.find_options import FindOptions
    be = _TableGraph(find=FindOptions(retime=2, host=host, cold_ratio=None))
    plans = _timing_harness(be, monkeypatch, time_on_stream, {})(gpu)
    timed: dict = {}
    out = graph_find.GraphFind._time_plans(be, P, BWD_FILTER, plans, timed)
    out = graph_find.GraphFind._retime_best(be, P, BWD_FILTER, out, timed)
    want = {a: max(gpu[a], issue[a]) if host else gpu[a] for a in gpu}
    assert {r.algo: r.time_ms for r in out} == pytest.approx(want)
    assert min(out, key=lambda r: r.time_ms).algo == ("e2" if host else "e1")
    # the warm-up run (kernels loading) is timed as it comes; every other timing asks
    held_runs = [h for h in asked if h[0]]
    assert held_runs and all(h == (True, host) for h in held_runs)
    assert be.find_options.key().endswith("+host") == host


#: A value other than the default for every FindOptions field.
OTHER = {"heuristic_modes": ("A",), "warmup": 0, "repeat": 5, "prefilter": False, "top_k": None,
         "probe_ratio": None, "cold_ratio": None, "rtc": "all", "parity": False, "retime": 1,
         "skip_ratio": None, "long_ms": 5.0, "zero": "once", "carry": False, "fold": False,
         "split": False, "pair": True, "search": "knobs", "knob_values": 3, "max_configs": 16,
         "hold": False, "host": True}


def test_every_find_option_changes_the_keys_or_cannot_change_what_find_reports(tables):
    """See Note [candidate sets in keys]: each FindOptions field, set to another
    value, changes the backend's name in the benchmark cache and the plan
    memo's key for every problem, or (``fold``, ``split``, ``pair``) for
    exactly the problems whose find() it can change: one that does not fold
    (split, pair) reports the same."""
    from mucudnn.backends.find_options import FindOptions
    from mucudnn.optimizer.planner import Planner

    assert set(OTHER) == {f.name for f in dataclasses.fields(FindOptions)}
    folds = ConvProblem((8, 32, 32, 3), (16, 3, 3, 3), stride=2, padding=1, layout="NHWC")
    base = _TableGraph(find=FindOptions(retime=0))
    for name, value in OTHER.items():
        be = _TableGraph(find=FindOptions(**{"retime": 0, name: value}))
        assert getattr(be.find_options, name) == (tuple(value) if name == "heuristic_modes"
                                                  else value)
        for problem in (P, folds, DEPTHWISE, DEPTHWISE16, GROUPED):
            key_changes = be.cache_name(problem) != base.cache_name(problem)
            plan_key_changes = (Planner(be, cache="off").key(problem, BWD_FILTER)
                                != Planner(base, cache="off").key(problem, BWD_FILTER))
            assert key_changes == plan_key_changes
            reaches = {"fold": (folds,), "split": (DEPTHWISE, DEPTHWISE16), "pair": (GROUPED,)}
            if name in reaches and problem not in reaches[name]:
                assert not key_changes, (name, problem)
                # find() adds folded (split) configs only where the problem folds (splits)
                assert (fold.fold_of(P) is None and not split.searched_factors(P)
                        and not pair.searched(P))
                assert ([r.algo for r in be.find(P.with_batch(32), BWD_FILTER, None)]
                        == [r.algo for r in base.find(P.with_batch(32), BWD_FILTER, None)])
            else:
                assert key_changes, (name, problem)


def test_parity_keys_the_problems_whose_backward_filter_it_compiles_apart(tables, tmp_path):
    """See Note [candidate sets in keys]: a search with ``parity`` compiles a
    16-bit depthwise backward-filter (Note [search parity]), so that problem's
    name gets ``+wgrad-rtc`` (before ``+split``, and ``+slice`` after it where its chunks
    are timed as slices): a cache measured before it did
    is measured again for those problems alone, and an offline replay reads the
    variant where the cache holds it."""
    from mucudnn.backends.find_options import FindOptions
    from mucudnn.backends.graph_candidates import PARITY_SUFFIX
    from mucudnn.optimizer import BenchmarkCache
    from mucudnn.optimizer.cache import Entry
    from mucudnn.optimizer.offline import CachedBackend

    on, off = _TableGraph(find=FindOptions()), _TableGraph(find=FindOptions(parity=False))
    key = on.name + on.find_options.key()
    sliced = PARITY_SUFFIX + split.CACHE_SUFFIX + split.SLICE_SUFFIX
    assert on.cache_name(DEPTHWISE16) == key + sliced
    assert [on.cache_name(p) for p in (P, GROUPED, DEPTHWISE)] == [
        key, key, key + split.CACHE_SUFFIX]
    assert _TableGraph(find=FindOptions(pair=True)).cache_name(GROUPED) == key + pair.CACHE_SUFFIX
    assert PARITY_SUFFIX not in off.cache_name(DEPTHWISE16)
    cache = BenchmarkCache(tmp_path / "c.sqlite")
    perf = AlgoPerf("e1", 1.0, 0)
    assert cache.put_many(
        Entry(name, "dev", "v", problem.key(), "backward_filter", 1 << 20, [perf])
        for name, problem in ((key + split.CACHE_SUFFIX, DEPTHWISE16),  # before parity compiled it
                              (key + PARITY_SUFFIX + split.CACHE_SUFFIX, DEPTHWISE16),  # or slices
                              (key + sliced, DEPTHWISE16),
                              (key, P))) == 4
    assert {e.backend for e in cache.entries(key)} == {
        key, key + split.CACHE_SUFFIX, key + PARITY_SUFFIX + split.CACHE_SUFFIX, key + sliced}
    replay = CachedBackend("cudnn-graph", cache=cache)
    assert replay.cache_name(DEPTHWISE16) == key + sliced
    assert replay.cache_name(P) == key


def test_find_options_name_the_argument_as_given():
    from mucudnn.backends.find_options import FindOptions

    with pytest.raises(mu.MucudnnError, match="^find_repeat: expected an int >= 3"):
        FindOptions.from_kwargs(find_repeat=2)
    with pytest.raises(ValueError, match="^rtc: expected one of"):
        FindOptions(rtc="sometimes")
    with pytest.raises(TypeError, match="find_bogus: not an option"):
        FindOptions.from_kwargs(find_bogus=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        FindOptions().rtc = "all"  # type: ignore[misc]


@pytest.mark.parametrize("rtc", ["none", "all"])
def test_a_chunks_find_compiles_only_as_find_rtc_says_and_leaves_a_layers_parity(tables, rtc):
    """See Note [search parity] and Note [split at the first find]: e70 compiles
    at run time. Under parity, a 16-bit depthwise backward-filter's first
    find() times it; its split's chunk problems (48 and 24 groups) are
    mucudnn's own, so their finds time it only where ``find_rtc`` says; the
    chunks as slices (the last find, Note [which slices are searched]) are
    timed for the compiled engines and time it. A layer whose problem is one
    of those chunks keeps a first find of its own, which compiles."""
    be = _LoggedGraph(find_parity=True, find_rtc=rtc)
    be.find(DEPTHWISE16, BWD_FILTER, 300 * MiB)
    assert split.searched_factors(DEPTHWISE16) == (2, 4)
    assert split.slice_factor(DEPTHWISE16, BWD_FILTER) == 2
    assert [g for g, _ in be.log] == [96, 48, 24, 48]
    compiled = [("e70" in ids) for _, ids in be.log]
    assert compiled == [True, rtc == "all", rtc == "all", True], be.log
    assert be.find_profile.rtc_cut == (0 if rtc == "all" else 2)
    chunk = split.splitting(DEPTHWISE16, 2).chunk
    assert chunk.groups == 48
    n = len(be.log)
    be.find(chunk, BWD_FILTER, 300 * MiB)
    assert be.log[n][0] == 48 and "e70" in be.log[n][1]
