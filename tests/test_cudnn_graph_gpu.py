"""The cudnn-graph backend (cuDNN's backend API) on a real GPU: what is particular
to it (marker gpu). What every backend must do is checked for all of them in
tests/test_backend_conformance.py.

Here: engine numerical notes against the math mode, engine-config ids, alpha and
beta baked into the plan (part of the plan key), pointer alignment below 16 bytes
(micro-batch views: the engine either runs or is refused with
UnsupportedConfigError, never swapped), and the bounded plan/graph/pack caches.
"""

from __future__ import annotations

import functools
import gc

import numpy as np
import pytest

import mucudnn.backends._device as device_backend
import mucudnn.backends.graph_candidates as graph_candidates
from mucudnn import ConvProblem, Direction
from mucudnn._cudnn import graph_descriptors as gd
from mucudnn._cudnn.backend_api import live_backend_descriptors
from mucudnn._cudnn.errors import CudnnError
from mucudnn._cudnn.enums import BackendNumericalNote as Note
from mucudnn.backends import fold
from mucudnn.backends.base import OUTPUT_OF, ConvTensors
from mucudnn.backends.cudnn_graph import CudnnGraphBackend
from mucudnn.errors import UnsupportedConfigError
from mucudnn.optimizer import benchmark, optimize_wr
from conv_support import CASES, DIRECTIONS, MiB, FindMemo, backend_fixture, problem, \
    uniform_tensors
from reference import reference, rel_err

pytestmark = pytest.mark.gpu

FIND_LIMIT = 256 * MiB
be = backend_fixture(CudnnGraphBackend, FIND_LIMIT)
_find = FindMemo(FIND_LIMIT)
_host = functools.partial(uniform_tensors, via_float32=True)


@pytest.mark.parametrize("math", ["fma", "default"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_found_engines_follow_the_math_mode(be, case, math, direction):
    p = problem(case, "float32", math)
    notes = {i.id: set(i.numerical_notes) for i in be.engine_configs(p, direction)}
    f = fold.fold_of(p)  # Note [folded first layers]: a folded id names an inner config
    inner_notes = ({i.id: set(i.numerical_notes) for i in be.engine_configs(f.inner, direction)}
                   if f is not None else {})
    for perf in _find(be, p, direction):
        folded = fold.split_fold_id(perf.algo)
        algo, known = (perf.algo, notes) if folded is None else (folded[1], inner_notes)
        assert folded is None or folded[0] == f.s
        assert isinstance(algo, str) and gd.format_engine_config_id(
            *gd.parse_engine_config_id(algo)) == algo
        assert perf.math_type == 0
        n = known[algo]
        assert int(Note.DOWN_CONVERT_INPUTS) not in n
        assert int(Note.REDUCED_PRECISION_REDUCTION) not in n
        if math == "fma":
            assert int(Note.TENSOR_CORE) not in n, perf
        assert (perf.determinism == 0) == (int(Note.NONDETERMINISTIC) in n)
        assert be.workspace_size(p, direction, perf.algo) == perf.workspace_bytes


def test_alpha_beta_are_part_of_the_plan_key(be):
    p = problem("2d-1x1-stride2", "float32", "fma")
    a = _find(be, p, Direction.FORWARD)[0].algo
    rng = np.random.default_rng(9)
    hx, hw, hy = _host(p, rng)
    x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
    ws = be.alloc_workspace(be.workspace_size(p, Direction.FORWARD, a) or 1)
    l0 = be.bind(Direction.FORWARD, a, 0, p, 0, p.batch, 1.0, 0.0)
    l1 = be.bind(Direction.FORWARD, a, 0, p, 0, p.batch, 1.0, 1.0)
    assert l0.keep[0] is not l1.keep[0]  # two finalized plans
    assert be.bind(Direction.FORWARD, a, 0, p, 0, p.batch, 1.0, 0.0).keep[0] is l0.keep[0]
    with be.on_home_stream():
        l0(x.ptr, w.ptr, y.ptr, ws.ptr, ws.nbytes)
        l1(x.ptr, w.ptr, y.ptr, ws.ptr, ws.nbytes)  # y = conv + conv
    got = be.to_host(y)
    assert rel_err(got, 2 * reference(p, Direction.FORWARD, hx, hw, hy)) < 1e-5
    for arr in (x, w, y, ws):
        arr.close()


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("float16", 1e-2)])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_micro_batch_views_below_16_byte_alignment(be, direction, dtype, tol):
    """Rows of 3*5*7 elements: a view at row 1 is 4-byte (float32) or 2-byte (float16)
    aligned. Every engine found for the aligned problem either gives the right answer
    there or is refused with UnsupportedConfigError (never another engine in its place),
    and at least one runs."""
    p = ConvProblem((3, 3, 5, 7), (4, 3, 3, 3), padding=1, dtype=dtype,
                    math="fma" if dtype == "float32" else "default")
    q = p.with_batch(2)
    rng = np.random.default_rng(21)
    hx, hw, hy = _host(p, rng)
    truth = reference(q, direction, hx[1:], hw, hy[1:])
    perfs = _find(be, q, direction)
    assert perfs
    ran = 0
    for perf in perfs[:6]:
        x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
        out = {"x": x, "w": w, "y": y}[OUTPUT_OF[direction]]
        if direction is Direction.BACKWARD_FILTER:
            out.fill_nan(stream=be.stream)
        else:
            out[1:].fill_nan(stream=be.stream)
        aligns = (gd.pointer_alignment(x.ptr), 16, gd.pointer_alignment(y.ptr))
        try:
            launch = be.bind(direction, perf.algo, 0, p, 1, 2, 1.0, 0.0, aligns)
        except UnsupportedConfigError as exc:
            assert exc.algo == perf.algo
            continue
        assert launch.algo == perf.algo
        ws = be.alloc_workspace(max(launch.workspace_bytes, 1))
        with be.on_home_stream():
            launch(x.ptr, w.ptr, y.ptr, ws.ptr, ws.nbytes)
        got = be.to_host(out)
        got = got if direction is Direction.BACKWARD_FILTER else got[1:]
        assert rel_err(got, truth) < tol, perf
        ran += 1
        for a in (x, w, y, ws):
            a.close()
    assert ran, "no engine ran at this alignment"


def test_caches_are_bounded_and_closed():
    gc.collect()
    live0 = live_backend_descriptors()
    with CudnnGraphBackend(find_workspace_limit=16 * MiB, plan_cache_size=2,
                           graph_cache_size=2, pack_cache_size=2,
                           heuristic_modes=("A",)) as b:
        problems = [ConvProblem((n, 8, 9, 11), (16, 8, 1, 1), stride=2, math="fma")
                    for n in (1, 2, 3, 4)]
        rng = np.random.default_rng(1)
        for q in problems:
            a = b.find(q, Direction.FORWARD, 16 * MiB)[0].algo
            hx, hw, hy = _host(q, rng)
            x, w, y = b.from_host(hx), b.from_host(hw), b.from_host(hy)
            ws = b.alloc_workspace(b.workspace_size(q, Direction.FORWARD, a) or 1)
            launch = b.bind(Direction.FORWARD, a, 0, q, 0, q.batch, 1.0, 0.0)
            with b.on_home_stream():
                launch(x.ptr, w.ptr, y.ptr, ws.ptr, ws.nbytes)
            assert rel_err(b.to_host(y), reference(q, Direction.FORWARD, hx, hw, hy)) < 1e-4
            sizes = b.cache_sizes()
            assert sizes["plans"] <= 2 and sizes["graphs"] <= 2 and sizes["packs"] <= 4
            for arr in (x, w, y, ws):
                arr.close()
        # a launcher holds its plan (Note [plan lifetimes]): evicted from the cache, it
        # still runs; dropping the launcher closes it
        for q in problems[:3]:
            b.find(q, Direction.FORWARD, 16 * MiB)
        x, w, y = (b.from_host(a) for a in _host(problems[-1], rng))
        ws = b.alloc_workspace(launch.workspace_bytes or 1)
        with b.on_home_stream():
            launch(x.ptr, w.ptr, y.ptr, ws.ptr, ws.nbytes)
        b.synchronize()
        del launch
        for arr in (x, w, y, ws):
            arr.close()
    gc.collect()
    assert live_backend_descriptors() == live0


def _each_runs_correctly(b, p, direction, found, seed):
    """Each of find()'s ``found`` configs of ``p``, run by backend ``b``,
    matches the float64 reference."""
    hx, hw, hy = _host(p, np.random.default_rng(seed))
    want = reference(p, direction, hx, hw, hy)
    for r in found:
        x, w, y = b.from_host(hx), b.from_host(hw), b.from_host(hy)
        ws = b.alloc_workspace(r.workspace_bytes or 1)
        b.run(direction, r.algo, 0, ConvTensors(p, x, w, y), 1.0, 0.0, ws)
        out = {"x": x, "w": w, "y": y}[OUTPUT_OF[direction]]
        assert rel_err(b.to_host(out), want) < 2e-2, r.algo


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
@pytest.mark.parametrize("case", ["2d-nchw", "2d-grouped-dilated", "2d-nhwc-stride2"])
def test_parallel_finalization_finds_what_serial_finds(case, direction):
    """See Note [parallel finalization]: plans finalized on a thread pool (one handle)
    are the plans the calling thread finalizes: the same configs, the same
    workspace needs, and each runs correctly."""
    p = problem(case, "float32", "default")
    found = {}
    for threads, prefilter in ((1, False), (8, True)):
        with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_threads=threads,
                               find_prefilter=prefilter, find_top_k=None,
                               find_probe_ratio=None) as b:
            res = b.find(p, direction, 8 * MiB)
            found[threads] = {r.algo: r.workspace_bytes for r in res}
            prof = b.find_profile
            assert prof.calls == 1 and prof.timed == len(res) >= 1
            assert prof.workspace_mismatch == 0
            if threads == 8:
                assert prof.skipped >= 0 and prof.finalized <= 2 * prof.configs
                _each_runs_correctly(b, p, direction, res, seed=3)
    # the pre-filter only skips configs that could not fit 8 MiB anyway
    assert found[1] == found[8]


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_held_timing_finds_configs_that_run_correctly(direction, caplog):
    """See Note [held timing]: find_hold=True times the same candidates, each
    found config runs correctly, and no hold waits for its timeout; the same
    with the host's share counted (Note [the host's share of a find]), under
    its own key."""
    caplog.set_level("DEBUG", logger="mucudnn")  # a timed-out hold is logged
    p = ConvProblem((8, 14, 14, 32), (64, 3, 3, 1), padding=1, groups=32, layout="NHWC")
    found = {}
    for hold, host in ((False, False), (True, False), (True, True)):
        with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_hold=hold, find_host=host,
                               find_probe_ratio=None, find_cold_ratio=None) as b:
            res = b.find(p, direction, 8 * MiB)
            found[hold, host] = {r.algo for r in res}
            assert res and all(r.time_ms > 0 for r in res)
            assert ("+host" in b.cache_name(p)) == host
            if hold:
                _each_runs_correctly(b, p, direction, res, seed=5)
    assert found[True, False] == found[False, False] == found[True, True]
    assert not any("timed out" in r.getMessage() for r in caplog.records)


def test_engine_config_workspace_is_the_plans():
    """CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE (read from heuristics results before any
    plan exists) equals the finalized plan's workspace, so the pre-filter of
    Note [parallel finalization] drops nothing that would have fit."""
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT) as b:
        seen = 0
        for case in ("2d-nchw", "2d-1x1-stride2", "2d-7x7-asym"):
            p = problem(case, "float32", "default")
            for d in DIRECTIONS:
                for info in b.engine_configs(p, d):
                    if info.workspace_bytes is None:
                        continue
                    try:
                        plan = b._plan(p, d, info.id, 1.0, 0.0, (16, 16, 16))
                    except Exception:
                        continue
                    assert plan.workspace_bytes == info.workspace_bytes, (case, d, info.id)
                    seen += 1
        assert seen > 10


def test_accumulate_need_is_the_beta_one_plans():
    """See Note [beta and workspace]: the beta = 1 workspace read from the engine
    config (no plan finalized) equals the finalized beta = 1 plan's, for every
    backward-filter config heuristics name that finalizes; find() finalizes
    one plan per candidate (no beta = 1 plans) and reports each result's need
    as the larger of the two."""
    d = Direction.BACKWARD_FILTER
    seen = 0
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT) as b:
        for case in ("2d-nchw", "2d-1x1-stride2", "2d-7x7-asym", "2d-grouped-dilated"):
            for dtype in ("float32", "float16"):
                p = problem(case, dtype, "default")
                for info in b.engine_configs(p, d):
                    try:
                        p1 = b._plan(p, d, info.id, 1.0, 1.0, (16, 16, 16))
                    except Exception:
                        continue
                    assert b._accumulate_need(p, d, info.id) == p1.workspace_bytes, \
                        (case, dtype, info.id)
                    seen += 1
        assert seen > 10
        p = problem("2d-nchw", "float32", "default")
        b.clear_cache()
        b.find_profile.reset()
        found = b.find(p, d, FIND_LIMIT)
        prof = b.find_profile
        assert found and prof.finalized <= prof.configs - prof.skipped - prof.cut
        for r in found:  # every result can accumulate (runs with beta = 1)
            need = max(b._plan(p, d, r.algo, 1.0, 0.0, (16, 16, 16)).workspace_bytes,
                       b._plan(p, d, r.algo, 1.0, 1.0, (16, 16, 16)).workspace_bytes)
            assert r.workspace_bytes == need == b.workspace_size(p, d, r.algo), r.algo
        # configs refused with beta = 1 were counted and left out
        refused = [i.id for i in b.engine_configs(p, d)
                   if b._accumulate_need(p, d, i.id) is None]
        assert not set(refused) & {r.algo for r in found}
        for algo in refused:
            with pytest.raises(CudnnError):
                b._plan(p, d, algo, 1.0, 1.0, (16, 16, 16))


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_find_rtc_leaves_out_runtime_compiled_engines(direction):
    """See Note [runtime-compiled engines]: find_rtc="none" times no config of an
    engine that compiles at run time (unless only those are candidates),
    "first" only those a mode ranks first; "all" finds a superset of both."""
    from mucudnn._cudnn.enums import BackendBehaviorNote as Behavior
    rtc = int(Behavior.RUNTIME_COMPILATION)
    p = problem("2d-nchw", "float16", "default")
    found = {}
    for rule in ("all", "first", "none"):
        # the cuts apply after a kernel's first find (See Note [search parity])
        with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_rtc=rule,
                               find_parity=False) as b:
            notes = {i.id: i.behavior_notes for i in b.engine_configs(p, direction)}
            got = b.find(p, direction, FIND_LIMIT)
            assert got
            found[rule] = {r.algo for r in got}
            n_rtc = sum(rtc in notes[a] for a in found[rule])
            if rule == "none" and len(found[rule]) > n_rtc:
                assert n_rtc == 0
            if rule != "all":
                assert b.find_profile.rtc_cut >= 0
    assert found["none"] <= found["all"] and found["first"] <= found["all"]
    assert found["none"] <= found["first"]


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_a_first_find_compiles_for_depthwise_layers_and_not_for_ungrouped_ones(direction):
    """See Note [search parity]: under the default search a kernel's first find()
    times runtime-compiled configs within the top k for a depthwise layer's
    forward and backward-data (where cuDNN's specialised kernels compile at
    run time) and its 16-bit backward-filter, and none for its fp32
    backward-filter or for an ungrouped layer, where precompiled candidates
    exist."""
    from mucudnn._cudnn.enums import BackendBehaviorNote as Behavior
    rtc = int(Behavior.RUNTIME_COMPILATION)
    # MobileNet-V2's depthwise 3x3, whose forward PyTorch runs as conv2d_c1_k1_nhwc
    depthwise = ConvProblem((32, 56, 56, 144), (144, 3, 3, 1), padding=1, groups=144,
                            layout="NHWC")
    flat = ConvProblem((32, 56, 56, 64), (64, 3, 3, 64), padding=1, layout="NHWC")
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_retime=0) as b:
        compiled = {}
        for p in (depthwise, flat):
            notes = {i.id: i.behavior_notes for i in b.engine_configs(p, direction)}
            b.find_profile.reset()
            got = b.find(p, direction, FIND_LIMIT)
            assert got, p
            compiled[p] = (b.find_profile.finalized_rtc,
                           sum(rtc in notes.get(r.algo, ()) for r in got),
                           any(rtc not in n for n in notes.values()))
    n_final, n_found, others = compiled[flat]
    assert others and n_final == 0 and n_found == 0
    n_final, n_found, others = compiled[depthwise]
    assert n_found <= n_final
    if direction is Direction.FORWARD:  # the c1_k1 kernel compiles at run time
        assert n_final >= 1
    if direction is Direction.BACKWARD_FILTER:  # PyTorch's fp32 wgrad kernels are precompiled
        assert others and n_final == 0 and n_found == 0
        # in 16 bits PyTorch's is runtime-compiled (wgrad2d_c1_k1_nhwc): the first find compiles
        dw16 = ConvProblem((32, 56, 56, 144), (144, 3, 3, 1), padding=1, groups=144,
                           layout="NHWC", dtype="bfloat16")
        with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_retime=0) as b:
            got = b.find(dw16, direction, FIND_LIMIT)
            assert got and b.find_profile.finalized_rtc >= 1
            _each_runs_correctly(b, dw16, direction, got, seed=11)


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_find_skip_ratio_skips_configs_far_behind_at_a_larger_size(direction):
    """See Note [far behind at another size]: with find_skip_ratio=2, the configs
    over twice the best at batch 64 are not timed at batch 32 (counted in
    far_cut), except one that needs no workspace where no other would be
    left; without the option, the batch 32 find() times them."""
    p = ConvProblem((64, 64, 56, 56), (64, 64, 3, 3), padding=1)
    small = p.with_batch(32)
    # find_carry off: what it adds at the small size is its own test's
    # parity off: the cuts apply to every find (See Note [search parity])
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_retime=0,
                           find_carry=False, find_parity=False) as b:
        plain = {r.algo: r for r in b.find(small, direction, FIND_LIMIT)}
        assert b.find_profile.far_cut == 0
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_retime=0,
                           find_skip_ratio=2.0, find_carry=False, find_parity=False) as b:
        big = b.find(p, direction, FIND_LIMIT)
        best = min(r.time_ms for r in big)
        far = {r.algo for r in big if r.time_ms > 2.0 * best}
        assert len(far & set(plain)) >= 2, "the test needs slow configs at both sizes"
        got = {r.algo: r for r in b.find(small, direction, FIND_LIMIT)}
        kept = far & set(got)
        assert len(kept) <= 1 and all(got[a].workspace_bytes == 0 for a in kept)
        assert b.find_profile.far_cut >= len(far & set(plain)) - len(kept) >= 1
        assert set(got) <= set(plain) | far


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_find_zero_once_leaves_the_zero_workspace_config_to_one_find(direction):
    """See Note [one zero-workspace find per kernel]: with find_zero="once", find()
    reports what the default reports less at most the one zero-workspace config
    heuristics do not rank among the first k; a find() under a cap of 0 reports
    only zero-workspace configs, and benchmark() adds them once, so a budget of
    nothing still has a plan, whose configuration computes the convolution."""
    p = problem("2d-nchw", "float32", "default")
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT) as b:
        each = {r.algo: r for r in b.find(p, direction, 8 * MiB)}
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_zero="once") as b:
        assert b.finds_zero_once
        once = {r.algo: r for r in b.find(p, direction, 8 * MiB)}
        extra = set(each) - set(once)
        assert set(once) <= set(each) and len(extra) <= 1
        assert all(each[a].workspace_bytes == 0 for a in extra)
        zero = b.find(p, direction, 0)
        assert zero and all(r.workspace_bytes == 0 for r in zero)
        perf = benchmark(b, p, direction, "powerOfTwo", 8 * MiB, cache=False,
                         progress=False, prune_sizes=True)
        plan = optimize_wr(perf, p.batch, 0, "powerOfTwo")
        assert plan.workspace_bytes == 0
        mb = plan.micro_batches[0]
        sub = p.with_batch(mb.size)
        rng = np.random.default_rng(7)
        hx, hw, hy = _host(sub, rng)
        want = reference(sub, direction, hx, hw, hy)
        x, w, y = b.from_host(hx), b.from_host(hw), b.from_host(hy)
        b.run(direction, mb.algo, mb.math_type, ConvTensors(sub, x, w, y), 1.0, 0.0,
              b.alloc_workspace(1))
        out = {"x": x, "w": w, "y": y}[OUTPUT_OF[direction]]
        assert rel_err(b.to_host(out), want) < 2e-2


@pytest.mark.parametrize("limit", [None, 128 * MiB], ids=["no-cap", "128MiB"])
def test_find_carry_adds_what_led_or_was_blocked_at_a_larger_size(limit):
    """See Note [carried to other sizes]: AlexNet conv2's float32 channels-last
    backward-filter (the H200 case), found at 128 rows and then at 32: with
    find_carry the 32-row find() reports every config the plain one reports,
    plus only configs remembered at 128 rows (counted in ``carried``), all
    within the cap, and each of those computes the convolution (against
    float64)."""
    direction = Direction.BACKWARD_FILTER
    p = ConvProblem((128, 27, 27, 96), (256, 5, 5, 96), padding=2, layout="NHWC")
    small = p.with_batch(32)
    opts = dict(find_workspace_limit=FIND_LIMIT * 4, find_retime=0, find_skip_ratio=None)
    with CudnnGraphBackend(find_carry=False, **opts) as b:
        b.find(p, direction, limit)
        plain = {r.algo for r in b.find(small, direction, limit)}
        assert b.find_profile.carried == 0
    with CudnnGraphBackend(find_carry=True, **opts) as b:
        b.find(p, direction, limit)
        memory = set(b._carry.get((p.with_batch(1).key(), direction.value)) or ())
        assert memory, "the leaders of a find() are remembered"
        got = {r.algo: r for r in b.find(small, direction, limit)}
        extra = set(got) - plain
        assert plain <= set(got) and extra <= memory
        assert b.find_profile.carried >= len(extra)
        cap = limit if limit is not None else FIND_LIMIT * 4
        assert all(r.workspace_bytes <= cap for r in got.values())
        if not extra:
            pytest.skip("heuristics name every remembered config at 32 rows on this "
                        "GPU and cuDNN: nothing was carried to check")
        rng = np.random.default_rng(11)
        hx, hw, hy = _host(small, rng)
        want = reference(small, direction, hx, hw, hy)
        for algo in sorted(extra):
            x, w, y = b.from_host(hx), b.from_host(hw), b.from_host(hy)
            ws = b.alloc_workspace(got[algo].workspace_bytes or 1)
            b.run(direction, algo, 0, ConvTensors(small, x, w, y), 1.0, 0.0, ws)
            assert rel_err(b.to_host(w), want) < 2e-2, algo
            for arr in (x, w, y, ws):
                arr.close()


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_find_retime_times_the_fastest_again(direction):
    """See Note [re-timing the winners]: find_retime=2 reports the same configs as
    without it (re-timing changes times, never the set), times two of them
    again per call (a plan cache of 2 evicts them meanwhile: rebuilt), and the
    re-timed times are those of configs that run."""
    p = problem("2d-nchw", "float32", "default")
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_retime=0) as b:
        plain = {r.algo for r in b.find(p, direction, FIND_LIMIT)}
        assert b.find_profile.retimed == 0
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_retime=2,
                           plan_cache_size=2) as b:
        got = b.find(p, direction, FIND_LIMIT)
        assert {r.algo for r in got} == plain
        assert b.find_profile.retimed == min(2, len(got))
        assert all(r.time_ms > 0 for r in got)
        assert [r.time_ms for r in got] == sorted(r.time_ms for r in got)


def test_blocked_workspace_names_what_the_cap_leaves_out():
    """See Note [size pruning]: AlexNet conv1's bf16 channels-last backward-filter
    (the H200 case): at batch 64 the engines heuristics rank first need tens of
    MB of workspace, so under 1 MiB the blocked workspace is theirs, it shrinks
    with the batch, and under a cap they fit there is none; every number is one
    the heuristics report for a config that find() skipped for the cap."""
    d = Direction.BACKWARD_FILTER
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT) as b:
        got = {}
        for n in (64, 32):
            p = ConvProblem((n, 224, 224, 3), (64, 11, 11, 3), stride=4, padding=2,
                            dtype="bfloat16", layout="NHWC")
            got[n] = b.blocked_workspace(p, d, 1 * MiB)
            over = [i.workspace_bytes for i in b.engine_configs(p, d)
                    if i.workspace_bytes is not None and i.workspace_bytes > 1 * MiB]
            assert got[n] is not None and got[n] in over
            assert b.blocked_workspace(p, d, max(over)) is None
            found = b.find(p, d, 1 * MiB)
            assert found and all(r.workspace_bytes <= 1 * MiB for r in found)
        assert got[32] < got[64] and got[64] > 8 * MiB


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_find_cut_offs_keep_the_best_ranked(direction):
    """See Note [find cut-offs]: with find_top_k=k, find() times the k best-ranked
    candidates of each heuristics mode that fit (plus one that needs no
    workspace), a subset of what timing everything finds; probing reports
    every timed candidate."""
    p = problem("2d-nchw", "float32", "default")
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_top_k=None,
                           find_probe_ratio=None) as b:
        full = {r.algo for r in b.find(p, direction, 8 * MiB)}
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_top_k=2,
                           find_probe_ratio=1.01, find_parity=False) as b:
        res = b.find(p, direction, 8 * MiB)
        prof = b.find_profile
        assert 1 <= len(res) <= 7 and {r.algo for r in res} <= full
        assert prof.cut >= prof.configs - prof.skipped - 7
        assert prof.timed == len(res) and prof.probed_out <= len(res)
        # the timing's parts: each timed plan's first launch (host) and the timed
        # runs (GPU, at least the medians reported) are within the timing seconds
        assert 0 < prof.first_launch_s < prof.timing_s
        assert sum(r.time_ms for r in res) / 1e3 <= prof.gpu_s < prof.timing_s


def test_cold_probe_reports_every_candidate(monkeypatch):
    """See Note [cold probe]: with the warm-up run timed, find() still reports every
    candidate it timed without the probe, each under the cap; with a ratio just
    over 1 some candidates stop after their warm-up (counted in cold_out)."""
    p = problem("2d-nchw", "float32", "default")
    d = Direction.BACKWARD_FILTER
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_top_k=None,
                           find_probe_ratio=None, find_cold_ratio=None) as b:
        full = {r.algo for r in b.find(p, d, 8 * MiB)}
        assert b.find_profile.cold_out == 0
    monkeypatch.setattr(graph_candidates, "COLD_PROBE_FLOOR_MS", 0.0)
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_top_k=None,
                           find_probe_ratio=None, find_cold_ratio=1.01) as b:
        res = b.find(p, d, 8 * MiB)
        assert {r.algo for r in res} == full
        assert all(r.workspace_bytes <= 8 * MiB and r.time_ms > 0 for r in res)
        assert 0 < b.find_profile.cold_out < len(res)
    with pytest.raises(ValueError, match="find_cold_ratio"):
        CudnnGraphBackend(find_cold_ratio=1.0)


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_long_runs_are_timed_once(direction):
    """See Note [long runs]: with find_long_ms below every run, each candidate is
    timed by its warm-up run alone (counted in long_runs) and nothing is
    re-timed; find() still reports the candidates it reports without the
    rule, each with a positive time no more than the GPU seconds spent."""
    p = problem("2d-nchw", "float32", "default")
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_long_ms=None) as b:
        full = {r.algo for r in b.find(p, direction, 8 * MiB)}
        assert b.find_profile.long_runs == 0 and b.find_profile.retimed > 0
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, find_long_ms=1e-6) as b:
        res = b.find(p, direction, 8 * MiB)
        prof = b.find_profile
        assert {r.algo for r in res} == full
        assert prof.timed == len(res) and prof.long_runs + prof.cold_out <= prof.timed
        assert prof.long_runs >= 1 and prof.retimed == 0
        assert all(r.time_ms > 0 for r in res)
        assert sum(r.time_ms for r in res) / 1e3 <= prof.gpu_s


def _owned_config_info(cfg):
    """engine_config_info's reading through descriptors the caller creates and
    owns: the reference for the read scratch."""
    from mucudnn._cudnn.enums import (
        BackendAttributeName as A, BackendAttributeType as T, BackendDescriptorType as D)
    with cfg.get_descriptor(A.ENGINECFG_ENGINE, D.ENGINE_DESCRIPTOR) as eng:
        idx = eng.get_int64_scalar(A.ENGINE_GLOBAL_INDEX)
    knobs = []
    for k in cfg.get_descriptors(A.ENGINECFG_KNOB_CHOICES, D.KNOB_CHOICE_DESCRIPTOR, 64):
        with k:
            knobs.append((k.get_enums(A.KNOB_CHOICE_KNOB_TYPE, T.KNOB_TYPE, 1)[0],
                          k.get_int64_scalar(A.KNOB_CHOICE_KNOB_VALUE)))
    return gd.format_engine_config_id(idx, knobs)


def test_raw_reads_read_what_owned_descriptors_read():
    """See Note [descriptor reads]: heuristics' configs and their knobs read through
    raw descriptors created per read are, config for config, what
    Python-owned descriptors hold; no descriptor is left behind."""
    compared = knobbed = 0
    live = live_backend_descriptors()
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT) as b:
        for case in ("2d-nchw", "2d-1x1-stride2", "2d-nhwc-stride2"):
            for dtype in ("float32", "float16"):
                p = problem(case, dtype, "default")
                for d in DIRECTIONS:
                    g = b._graph(p, d, 1.0, 0.0, (16, 16, 16)).conv
                    for mode in b._modes_for(p):
                        got = [i.id for i in g.engine_config_infos(mode) if i is not None]
                        owned = g.engine_configs(mode)
                        try:
                            want = [_owned_config_info(c) for c in owned]
                        finally:
                            for c in owned:
                                c.close()
                        assert got == want, (case, dtype, d, mode)
                        assert len(set(got)) > 1 or len(got) <= 1  # not one config repeated
                        compared += len(got)
                        knobbed += sum(bool(gd.parse_engine_config_id(i)[1]) for i in got)
    gc.collect()
    assert live_backend_descriptors() == live
    assert compared >= 50 and knobbed >= 20, (compared, knobbed)


def test_engine_knob_infos_are_readable_ranges():
    """CUDNN_ATTR_ENGINE_KNOB_INFO of the engines heuristics name: typed ranges
    (min <= max, stride >= 1); each named config rebuilt from its engine and
    knobs reports the heuristics' workspace, and knob settings one step from
    it (Note [knob search]) are accepted by cuDNN."""
    from mucudnn.backends.graph_candidates import knob_variants

    p = problem("2d-nchw", "float32", "default")
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT) as b:
        infos = b.engine_configs(p, Direction.BACKWARD_DATA)
        # the backend's own graph: built on its handle, as find() and run() build
        g = b._graph(p, Direction.BACKWARD_DATA, 1.0, 0.0, (16, 16, 16)).conv
        rebuilt = knobbed = accepted = 0
        for info in infos[:12]:
            with gd.engine(g.graph, info.global_index) as eng:
                knobs = gd.engine_knob_infos(eng)
                for k in knobs:
                    assert k.minimum <= k.maximum and k.stride >= 1, (info.id, k)
                knobbed += len(knobs)
                ws = CudnnGraphBackend._config_workspace(eng, info.knobs)
                assert ws == info.workspace_bytes, info.id
                rebuilt += 1
                for setting in knob_variants(info.knobs, knobs, 2)[1:]:
                    try:
                        CudnnGraphBackend._config_workspace(eng, setting)
                    except Exception:
                        continue
                    accepted += 1
    assert rebuilt >= 3 and knobbed >= 3 and accepted >= 3, (rebuilt, knobbed, accepted)


@pytest.mark.parametrize("direction", DIRECTIONS, ids=str)
def test_knob_search_adds_configs_that_run_correctly(direction):
    """See Note [knob search]: search="knobs" times heuristics' configs plus knob
    settings around them; every config it reports fits the limit and computes
    the convolution (checked against float64), and every config the
    heuristics-only search timed is timed by it too."""
    p = problem("2d-nchw", "float32", "default")
    limit = 2 * MiB
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT) as b:
        base = b.find(p, direction, limit)
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT, search="knobs",
                           search_knob_values=3, search_max_configs=24) as b:
        assert b.name == "cudnn-graph+knobs"
        with CudnnGraphBackend(search="heuristics") as plain:
            assert plain.name == "cudnn-graph"
        res = b.find(p, direction, limit)
        prof = b.find_profile
        assert prof.knob_configs >= 1 and prof.knob_s > 0
        assert len(res) > len(base) - 1
        assert all(r.workspace_bytes <= limit for r in res)
        # heuristics' own configs are all still candidates (Note [knob search]);
        # which of them runs fastest is a benchmark's question, not a test's
        assert {q.algo for q in base} <= {r.algo for r in res}
        extra = [r for r in res if r.algo not in {q.algo for q in base}][:6]
        assert extra
        _each_runs_correctly(b, p, direction, extra, seed=5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_find_scratch_repeats_one_random_block(dtype, monkeypatch):
    """See Note [find scratch]: the scratch is one host-drawn block of random values
    repeated over the array on the device (a partial block at the end); every
    value is non-zero, of magnitude in [0.25, 1.75]."""
    monkeypatch.setattr(device_backend, "RANDOM_BLOCK", 1000)
    with CudnnGraphBackend(find_workspace_limit=FIND_LIMIT) as b:
        a = b._random((3 * 1000 + 17,), dtype)
        got = np.asarray(a.to_numpy(), dtype=np.float32)
        a.close()
    assert got.shape == (3017,)
    block = got[:1000]
    assert len(np.unique(block)) > 100  # random, not a constant (bf16 has ~490 values here)
    for k in range(1, 4):
        part = got[1000 * k:1000 * (k + 1)]
        assert np.array_equal(part, block[:len(part)])
    assert np.all((np.abs(got) >= 0.24) & (np.abs(got) <= 1.76))

