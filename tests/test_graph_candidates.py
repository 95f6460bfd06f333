"""Properties of cudnn-graph's candidate rules (mucudnn.backends.graph_candidates):
pure functions of what heuristics and engine configs report, so they are checked
on the CPU for random candidate sets, against the rules' own statements."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, strategies as st

from mucudnn._cudnn import graph_descriptors as gd
from mucudnn._cudnn.enums import BackendBehaviorNote as Behavior
from mucudnn.backends.graph_candidates import (far_cut, fitting, long_run, note_ratios, rtc_cut,
                                               top_k_cut)

RTC = int(Behavior.RUNTIME_COMPILATION)


@st.composite
def candidates(draw, max_size=12):
    """Distinct engine configs, each with a workspace (0 for some) and maybe the
    runtime-compilation note."""
    idx = draw(st.lists(st.integers(0, 80), min_size=1, max_size=max_size, unique=True))
    return [gd.EngineConfigInfo(i, (), (), (RTC,) if draw(st.booleans()) else (),
                                workspace_bytes=draw(st.sampled_from([0, 1 << 20, 64 << 20])))
            for i in idx]


@st.composite
def rankings(draw, cands):
    """Each of up to three heuristics modes ranks a random subset of ``cands``."""
    ids = [c.id for c in cands]
    modes = draw(st.lists(st.sampled_from(["A", "B", "FALLBACK"]), unique=True, max_size=3))
    out = {}
    for m in modes:
        order = draw(st.permutations(ids))
        out[m] = order[:draw(st.integers(0, len(ids)))]
    return out


@given(data=st.data())
def test_far_cut_drops_only_configs_far_behind_and_keeps_one_without_workspace(data):
    """See Note [far behind at another size]: what is left is in the candidates'
    order, holds every config never seen more than ``ratio`` behind, and, where
    the candidates had a config without workspace, still has one."""
    cands = data.draw(candidates())
    behind = {c.id: data.draw(st.floats(1.0, 500.0)) for c in cands if data.draw(st.booleans())}
    ratio = data.draw(st.one_of(st.none(), st.floats(1.5, 100.0)))
    keep_zero = data.draw(st.booleans())
    kept = far_cut(cands, behind, ratio, keep_zero)
    assert kept == [c for c in cands if c in kept]  # a subsequence, in order
    if ratio is None:
        assert kept == cands
        return
    near = [c for c in cands if behind.get(c.id, 0.0) <= ratio]
    assert all(c in kept for c in near)
    if not keep_zero:  # Note [one zero-workspace find per kernel]: nothing added
        assert kept == near
        return
    extra = [c for c in kept if c not in near]
    assert len(extra) <= 1 and all(c.workspace_bytes == 0 for c in extra)
    if any(c.workspace_bytes == 0 for c in cands):
        assert any(c.workspace_bytes == 0 for c in kept)


@given(times=st.lists(st.lists(st.floats(0.01, 1000.0), min_size=1, max_size=6),
                      min_size=1, max_size=4))
def test_note_ratios_keeps_each_configs_least_ratio(times):
    """See Note [far behind at another size]: over several find() calls, each
    config's recorded ratio is its least time over the best of one call, so the
    fastest config of any call is recorded at 1."""
    behind: dict[str, float] = {}
    expect: dict[str, float] = {}
    for call in times:
        results = [SimpleNamespace(algo=f"e{i}", time_ms=t) for i, t in enumerate(call)]
        note_ratios(behind, results)
        best = min(call)
        for i, t in enumerate(call):
            expect[f"e{i}"] = min(expect.get(f"e{i}", float("inf")), t / best)
    assert behind == expect
    assert min(behind.values()) == 1.0


@given(data=st.data())
def test_top_k_cut_keeps_each_modes_best_k(data):
    """See Note [find cut-offs]: every config among some mode's ``k`` best-ranked
    candidates is kept, nothing else but one config without workspace."""
    cands = data.draw(candidates())
    ranks = data.draw(rankings(cands))
    k = data.draw(st.one_of(st.none(), st.integers(1, 6)))
    keep_zero = data.draw(st.booleans())
    kept = top_k_cut(cands, k, ranks, keep_zero)
    assert kept == [c for c in cands if c in kept]
    if k is None or len(cands) <= k:
        assert kept == cands
        return
    best = {i for ids in ranks.values() for i in ids[:k]}
    if not keep_zero:  # Note [one zero-workspace find per kernel]: nothing added
        assert {c.id for c in kept} == best
        return
    assert {c.id for c in kept} - best <= {next((c.id for c in cands if c.workspace_bytes == 0),
                                                None)}
    assert best <= {c.id for c in kept}
    if any(c.workspace_bytes == 0 for c in cands):
        assert any(c.workspace_bytes == 0 for c in kept)


@given(data=st.data())
def test_rtc_cut_leaves_out_runtime_compiled_configs(data):
    """See Note [runtime-compiled engines]: "all" keeps everything; "none" keeps no
    runtime-compiled config unless nothing else is left (then all of them);
    "first" keeps those a mode ranks first, and never fewer than "none"."""
    cands = data.draw(candidates())
    ranks = data.draw(rankings(cands))
    assert rtc_cut(cands, "all", ranks) == cands
    none = rtc_cut(cands, "none", ranks)
    plain = [c for c in cands if RTC not in c.behavior_notes]
    assert none == (plain or cands)
    first = rtc_cut(cands, "first", ranks)
    assert set(none) <= set(first) <= set(cands)
    tops = {ids[0] for ids in ranks.values() if ids}
    assert all(c.id in tops for c in first if RTC in c.behavior_notes) or not plain


@given(needs=st.lists(st.tuples(st.integers(0, 100), st.one_of(st.none(), st.integers(0, 100))),
                      max_size=8),
       want=st.integers(0, 100))
def test_fitting_prefers_configs_that_accumulate(needs, want):
    """See Note [beta and workspace]: each config is timed at the larger of its two
    needs, within ``want``; configs refused with beta = 1 only where no other
    fits, at their beta = 0 need."""
    found = [(f"p{i}", f"c{i}", n0, n1) for i, (n0, n1) in enumerate(needs)]
    plans, refused = fitting(found, want)
    both = [(p, c, max(n0, n1)) for p, c, n0, n1 in found if n1 is not None
            and max(n0, n1) <= want]
    lone = [(p, c, n0) for p, c, n0, n1 in found if n1 is None and n0 <= want]
    if both:
        assert plans == both and refused == len(lone)
    else:
        assert plans == lone and refused == 0
    assert all(need <= want for _p, _c, need in plans)


@given(first=st.floats(0.0, 2000.0), launch=st.floats(-1.0, 50.0),
       long_ms=st.one_of(st.none(), st.floats(0.001, 100.0)))
def test_long_run_reports_the_warm_up_less_loading_at_or_over_the_bound(first, launch, long_ms):
    """See Note [long runs]: a warm-up run of at least ``long_ms`` once loading is
    taken off is reported as that time; anything shorter, or no bound, is not."""
    got = long_run(first, launch, long_ms)
    t = first - max(0.0, launch)
    if long_ms is None or t < long_ms:
        assert got is None
    else:
        assert got == t and long_ms <= got <= first
