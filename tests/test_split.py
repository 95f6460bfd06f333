"""Grouped convolutions split into chunks of their groups (Note [split groups] in
mucudnn/backends/split.py) on the CPU: which problems split and into what, the
NumPy backend's split configurations against the float64 reference (every
direction, layout, alpha and beta, micro-batched plans that accumulate), the
planner choosing them through a Convolution, the keys of the caches, the
cudnn-graph find()'s search of factors (Note [split at the first find]) with
its finds replaced by tables, and the cuDNN copy descriptors (the real
library, no GPU needed)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mucudnn import ConvProblem, Direction
from mucudnn.backends import split
from mucudnn.backends.numpy import NumpyAlgo, NumpyBackend
from mucudnn.problem import AlgoPerf, MicroBatch, Plan
from mucudnn.problem.slice_problem import SliceProblem
from conftest import needs_cudnn_transforms
from conv_support import (FakeRawTransform, RewritesFirstBackend, check_mixed_plan,
                          check_rewritten_run, composition, convolution_for, grouped_problems,
                          run_direction)
from reference import reference, rel_err

CONVNEXT = ConvProblem((64, 56, 56, 96), (96, 7, 7, 1), padding=3, groups=96, layout="NHWC")
RESNEXT = ConvProblem((64, 128, 56, 56), (128, 4, 3, 3), padding=1, groups=32)


def splittable(batch=None):
    """A small grouped problem with at least one split factor: either layout,
    2-D or 3-D, strides, paddings, dilations, several channels per group."""
    return grouped_problems([2, 4, 6, 8, 16], st.integers(1, 4) if batch is None else batch)


def _tensors(p, rng):
    return tuple(rng.standard_normal(shape) for shape in (p.x_shape, p.w_shape, p.output_shape))


def test_depthwise_and_grouped_layers_split_into_what_the_note_says():
    assert split.split_factors(CONVNEXT) == (2, 4, 8, 16)
    assert split.searched_factors(CONVNEXT) == (2, 4, 8)  # 16 chunks: 6 x 196 B filter slices
    assert split.split_factors(RESNEXT) == (2, 4, 8, 16) and split.searched_factors(RESNEXT) == ()
    s = split.split_of(CONVNEXT, 16)
    assert (s.chunk.x_shape, s.chunk.w_shape, s.chunk.groups) == ((64, 56, 56, 6), (6, 7, 7, 1), 6)
    assert s.chunk.output_shape == (64, 56, 56, 6)
    r = split.split_of(RESNEXT, 8)
    assert (r.chunk.x_shape, r.chunk.w_shape, r.chunk.groups) == ((64, 16, 56, 56), (16, 4, 3, 3), 4)
    # the regions hold one chunk of x and one of y, 256-byte aligned
    reg = split.regions(s, 64)
    assert reg.a_bytes == reg.b_bytes == 64 * 56 * 56 * 6 * 4
    assert reg.b % 256 == 0 and reg.inner >= reg.b + reg.b_bytes


@pytest.mark.parametrize("p", [
    ConvProblem((2, 8, 5, 5), (8, 8, 3, 3)),                # one group
    ConvProblem((2, 6, 5, 5), (6, 2, 3, 3), groups=3),      # 3 groups: no power of two
], ids=["ungrouped", "three-groups"])
def test_what_does_not_split(p):
    assert split.split_factors(p) == ()
    assert all(split.split_of(p, k) is None for k in split.SPLIT_FACTORS)
    be = NumpyBackend()
    assert not be.supports(p, Direction.FORWARD, "split2|0")
    with pytest.raises(ValueError, match="split into 2 chunks cannot run"):
        be.workspace_size(p, Direction.FORWARD, "split2|0")


@pytest.mark.parametrize("algo, want", [
    ("split4|e30;k3=1", (4, "e30;k3=1")), ("split16|2", (16, 2)), ("split|0", None),
    ("splitx|0", None), ("split2|", None), ("fold2|0", None), (3, None), ("e12", None),
    # digits str.isdigit() allows and int() refuses (a fuzzed plan file's)
    ("split\u00b2|split2|0", None), ("split2|\u00b2", (2, "\u00b2"))])
def test_split_ids(algo, want):
    assert split.parse_split_id(algo) == want
    if want is not None:
        assert split.split_id(*want) == algo


@settings(max_examples=60, deadline=None)
@given(p=splittable(), seed=st.integers(0, 2**16), data=st.data())
def test_chunks_are_the_slices_of_the_operands(p, seed, data):
    """Chunk i's convolution of x's, w's and y's slices is the whole problem's
    restricted to those channels, and chunk_offsets are where the slices
    start in memory."""
    k = data.draw(st.sampled_from(split.split_factors(p)))
    s = split.split_of(p, k)
    x, w, dy = _tensors(p, np.random.default_rng(seed))
    c_axis = 1 if p.layout in ("NCHW", "NCDHW") else -1
    cx, cy, kc = s.chunk.x_dims[1], s.chunk.y_dims[1], s.chunk.w_shape[0]
    whole = {d: reference(p, d, x, w, dy) for d in Direction}
    for i in (0, k - 1):
        xi = np.take(x, range(i * cx, (i + 1) * cx), axis=c_axis)
        yi = np.take(dy, range(i * cy, (i + 1) * cy), axis=c_axis)
        wi = w[i * kc:(i + 1) * kc]
        got = {d: reference(s.chunk, d, xi, wi, yi) for d in Direction}
        assert rel_err(got[Direction.FORWARD], np.take(whole[Direction.FORWARD],
                       range(i * cy, (i + 1) * cy), axis=c_axis)) < 1e-12
        assert rel_err(got[Direction.BACKWARD_DATA], np.take(whole[Direction.BACKWARD_DATA],
                       range(i * cx, (i + 1) * cx), axis=c_axis)) < 1e-12
        assert rel_err(got[Direction.BACKWARD_FILTER],
                       whole[Direction.BACKWARD_FILTER][i * kc:(i + 1) * kc]) < 1e-12
        ox, ow, oy = split.chunk_offsets(s, i)
        for arr, sub, off in ((x, xi, ox), (dy, yi, oy), (w, wi, ow)):
            flat_first = np.flatnonzero(arr == sub.flat[0])
            assert off // p.itemsize in flat_first


@settings(max_examples=60, deadline=None)
@given(p=splittable(), d=st.sampled_from(list(Direction)), inner=st.sampled_from(list(NumpyAlgo)),
       alpha=st.sampled_from([1.0, 0.5, -2.0]), beta=st.sampled_from([0.0, 1.0, 0.25]),
       seed=st.integers(0, 2**16), data=st.data())
def test_numpy_split_configuration_matches_the_reference(p, d, inner, alpha, beta, seed, data):
    be = NumpyBackend()
    k = data.draw(st.sampled_from(split.split_factors(p)))
    s = split.split_of(p, k)
    algo = split.split_id(k, int(inner))
    assert be.supports(p, d, algo)
    need = be.workspace_size(p, d, algo)
    assert need == split.regions(s, p.batch).inner + be.workspace_size(s.chunk, d, inner)
    x, w, y = _tensors(p, np.random.default_rng(seed))
    check_rewritten_run(be, p, d, algo, need, x, w, y, alpha, beta, 1e-10)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), d=st.sampled_from(list(Direction)),
       alpha=st.sampled_from([1.0, 0.5]), beta=st.sampled_from([0.0, 1.0, -0.5]),
       seed=st.integers(0, 2**16))
def test_micro_batched_split_plan_equals_the_unsplit_reference(data, d, alpha, beta, seed):
    """A plan of split micro-batches (mixed with unsplit ones, any factor)
    gives the whole batch's result; backward-filter accumulates over
    micro-batches."""
    n = data.draw(st.integers(2, 6))
    p = data.draw(splittable(batch=n))
    be = NumpyBackend()
    sized = []
    for s in composition(data.draw, n):
        k = data.draw(st.sampled_from(split.split_factors(p)))
        sized.append((s, data.draw(st.sampled_from([split.split_id(k, 0), split.split_id(k, 1),
                                                    0, 1]))))
    check_mixed_plan(be, p, d, sized, alpha, beta, seed, 1e-10)


def test_numpy_find_adds_split_configurations_only_where_asked_and_they_are_searched():
    """See Note [which convolutions split]: depthwise problems only (2 x 2
    float32 filters: 16-byte slices)."""
    p = ConvProblem((2, 4, 9, 9), (4, 1, 2, 2), padding=1, groups=4)
    plain = NumpyBackend(repeats=1).find(p, Direction.BACKWARD_FILTER, None)
    assert all(isinstance(a.algo, int) for a in plain)
    be = NumpyBackend(repeats=1, split=True)
    got = be.find(p, Direction.BACKWARD_FILTER, None)
    ids = sorted(a.algo for a in got if isinstance(a.algo, str))
    assert ids == sorted(split.split_id(k, int(a)) for k in (2, 4) for a in NumpyAlgo)
    for a in got:
        assert a.workspace_bytes == be.workspace_size(p, Direction.BACKWARD_FILTER, a.algo)
    # the regions count against the limit
    limit = split.regions(split.split_of(p, 4), p.batch).inner - 1
    assert not [a for a in be.find(p, Direction.BACKWARD_FILTER, limit)
                if isinstance(a.algo, str)]
    # ungrouped, and grouped with several channels a group: not searched (their ids still run)
    for q in (ConvProblem((2, 8, 9, 9), (8, 8, 3, 3), padding=1),
              ConvProblem((2, 8, 9, 9), (8, 2, 3, 3), padding=1, groups=4)):
        assert all(isinstance(a.algo, int) for a in be.find(q, Direction.FORWARD, None))
    assert split.split_factors(q) == (2, 4) and split.searched_factors(q) == ()
    assert be.supports(q, Direction.FORWARD, "split2|0")


@pytest.mark.parametrize("d", list(Direction), ids=str)
def test_a_convolution_plans_and_runs_split_configurations(d, tmp_path, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "c.sqlite"))
    p = ConvProblem((6, 12, 12, 8), (8, 3, 3, 1), padding=1, groups=8, layout="NHWC",
                    math="fma")
    limit = split.regions(split.split_of(p, 2), 2).inner + 4096  # split micro-batches of 2 fit
    conv = convolution_for(p, backend=RewritesFirstBackend("split"), workspace_limit=limit)
    rng = np.random.default_rng(5)
    x, w, y = (a.astype(np.float32) for a in _tensors(p, rng))
    got = run_direction(conv, d, x, w, y, alpha=0.5, beta=0.25)
    plan = conv.plans[d]
    assert all(split.parse_split_id(m.algo) is not None for m in plan.micro_batches), plan
    assert plan.workspace_bytes <= limit
    assert rel_err(got, reference(p, d, x, w, y, 0.5, 0.25)) < 1e-5


def test_cache_names_and_plans_mark_the_problems_whose_candidates_splitting_changes(tmp_path):
    from mucudnn.optimizer import BenchmarkCache
    from mucudnn.optimizer.benchmark import benchmark
    from mucudnn.optimizer.offline import CachedBackend
    from mucudnn.optimizer.planner import Planner

    grouped = ConvProblem((4, 8, 9, 9), (8, 1, 3, 3), padding=1, groups=8)
    plain_p = ConvProblem((4, 8, 9, 9), (8, 8, 3, 3), padding=1)
    wide = ConvProblem((4, 8, 9, 9), (8, 2, 3, 3), padding=1, groups=4)
    plain, splitting = NumpyBackend(repeats=1), NumpyBackend(repeats=1, split=True)
    assert plain.cache_name(grouped) == splitting.cache_name(plain_p) == "numpy"
    assert splitting.cache_name(wide) == "numpy"  # Note [which convolutions split]
    assert splitting.cache_name(grouped) == "numpy" + split.CACHE_SUFFIX
    assert (Planner(plain, cache="off").key(grouped, "forward")
            != Planner(splitting, cache="off").key(grouped, "forward"))
    path = tmp_path / "c.sqlite"
    cache = BenchmarkCache(path)
    for be in (plain, splitting):
        benchmark(be, grouped, Direction.FORWARD, "undivided", 1 << 30, cache=cache)
    assert sorted(e.backend for e in cache.entries("numpy")) == ["numpy", "numpy+split"]
    assert not any(split.parse_split_id(a.algo) for a in cache.get(plain, grouped, "forward"))
    assert any(split.parse_split_id(a.algo) for a in cache.get(splitting, grouped, "forward"))
    replay = CachedBackend("numpy", cache=path)
    assert replay.cache_name(grouped) == "numpy+split" and replay.cache_name(plain_p) == "numpy"


@settings(max_examples=60, deadline=None)
@given(c=st.sampled_from([8, 16, 24, 32, 48, 96, 144, 384, 768]), r=st.integers(1, 7),
       dtype=st.sampled_from(["float32", "float16", "bfloat16", "float64"]),
       layout=st.sampled_from(["NCHW", "NHWC"]))
def test_searched_factors_keep_every_filter_slice_aligned(c, r, dtype, layout):
    """See Note [which convolutions split]: a depthwise problem's searched
    factors are exactly its factors whose every chunk's filter slice starts at
    a multiple of FILTER_ALIGNMENT bytes."""
    w = (c, 1, r, r) if layout == "NCHW" else (c, r, r, 1)
    x = (2, c, 9, 9) if layout == "NCHW" else (2, 9, 9, c)
    p = ConvProblem(x, w, padding=r // 2, groups=c, layout=layout, dtype=dtype)
    got = split.searched_factors(p)
    for k in split.split_factors(p):
        s = split.split_of(p, k)
        aligned = all(split.chunk_offsets(s, i)[1] % split.FILTER_ALIGNMENT == 0
                      for i in range(k))
        assert (k in got) == aligned


# -- cudnn-graph's search of factors (Note [split at the first find]) -----------------------------
@pytest.fixture
def no_device(monkeypatch):
    """No device: DeviceBackend's set-up is a table's."""
    from mucudnn.backends import _device

    def init(self, device=None, stream=None, find_workspace_limit=None):
        import threading
        self.find_workspace_limit = find_workspace_limit
        self.device = 0
        self._lock = threading.RLock()
        self.find_profile = _device.FindProfile()

    monkeypatch.setattr(_device.DeviceBackend, "__init__", init)


def _table_split_backend(bites: bool, **options):
    """A cudnn-graph backend whose finds are tables: the whole problem's best
    config takes 10 ms; a chunk problem's takes 1 ms per chunk times
    ``FACTOR_MS[k]``; the limit bites where ``bites`` says."""
    from mucudnn.backends.cudnn_graph import CudnnGraphBackend

    class Table(CudnnGraphBackend):
        def on_home_stream(self):
            return contextlib.nullcontext()

        def find_workspace_cap(self):
            return 1 << 40

        def _limit_bites(self, problem, direction, want):
            return bites

        def _find_configs(self, problem, direction, limit, whole=None, beat_ms=None):
            sliced = isinstance(problem, SliceProblem)
            self.finds.append((problem.groups, problem.batch) + (("slice",) if sliced else ()))
            if problem.groups == WHOLE.groups:
                return [AlgoPerf("e1", 10.0, 0)]
            k = WHOLE.groups // problem.groups
            if sliced:
                return [AlgoPerf("e19;k2=0", SLICE_MS / k * problem.batch / WHOLE.batch, 0)]
            return [AlgoPerf("e2", FACTOR_MS[k] / k * problem.batch / WHOLE.batch, 1 << 20)]

        def _time_split(self, sp, direction, size):
            return 0.0

    be = Table(find_workspace_limit=1 << 40, **options)
    be.finds = []
    return be


WHOLE = ConvProblem((64, 14, 14, 384), (384, 7, 7, 1), padding=3, groups=384, layout="NHWC")
#: a chunked call's time for the whole batch, by factor: 4 leads
FACTOR_MS = {2: 12.0, 4: 8.0, 8: 9.0, 16: 11.0}
#: a call on slices' time for the whole batch (bf16 only, where slices are searched)
SLICE_MS = 6.0


def test_a_16_bit_depthwise_backward_filter_also_tries_slices_and_keeps_them_where_they_led(
        no_device):
    """In bf16 the first find also times the chunks as slices at the fewest
    chunks (Note [which slices are searched]; no regions, the inner time
    twice); they led, so a later size tries them alone; forward never tries
    them."""
    be = _table_split_backend(bites=True)
    d = Direction.BACKWARD_FILTER
    bf16 = ConvProblem(WHOLE.x_shape, WHOLE.w_shape, padding=3, groups=384, layout="NHWC",
                       dtype="bfloat16")
    first = be.find(bf16, d, 1 << 30)
    assert be.finds == [(384, 64), (192, 64), (96, 64), (48, 64), (24, 64), (192, 64, "slice")]
    assert first[0].algo == "slice2|e19;k2=0" and first[0].time_ms == pytest.approx(SLICE_MS)
    assert first[0].workspace_bytes == 0
    be.finds.clear()
    later = be.find(bf16.with_batch(32), d, 1 << 30)
    assert be.finds == [(384, 32), (192, 32, "slice")]
    assert {a.algo for a in later} == {"e1", "slice2|e19;k2=0"}
    be.finds.clear()
    be.find(bf16, Direction.FORWARD, 1 << 30)
    assert be.finds == [(384, 64), (192, 64), (96, 64), (48, 64), (24, 64)]
    # where slices lose, a later size tries the packed factor that led
    old = SLICE_MS
    globals()["SLICE_MS"] = 50.0
    try:
        other = _table_split_backend(bites=True)
        other.find(bf16, d, 1 << 30)
        other.finds.clear()
        assert other.find(bf16.with_batch(32), d, 1 << 30)[0].algo == "split4|e2"
        assert other.finds == [(384, 32), (96, 32)]
    finally:
        globals()["SLICE_MS"] = old


def test_the_first_find_tries_every_factor_and_later_ones_the_factor_that_led(no_device):
    be = _table_split_backend(bites=True)
    d = Direction.BACKWARD_FILTER
    first = be.find(WHOLE, d, 1 << 30)
    assert be.finds == [(384, 64), (192, 64), (96, 64), (48, 64), (24, 64)]
    assert first[0].algo == "split4|e2" and first[0].time_ms == pytest.approx(8.0)
    assert {a.algo for a in first} == {"e1", "split2|e2", "split4|e2", "split8|e2", "split16|e2"}
    assert first[0].workspace_bytes == (1 << 20) + split.regions(split.split_of(WHOLE, 4), 64).inner
    be.finds.clear()
    later = be.find(WHOLE.with_batch(32), d, 1 << 30)
    assert be.finds == [(384, 32), (96, 32)]
    assert {a.algo for a in later} == {"e1", "split4|e2"}
    assert be.find_profile.split_finds == 5
    # a kernel whose first split search did not lead tries none later
    slow = _table_split_backend(bites=True)
    old = dict(FACTOR_MS)
    FACTOR_MS.update({k: 50.0 for k in FACTOR_MS})
    try:
        slow.find(WHOLE, d, 1 << 30)
        slow.finds.clear()
        slow.find(WHOLE.with_batch(32), d, 1 << 30)
        assert slow.finds == [(384, 32)]
    finally:
        FACTOR_MS.update(old)


def test_no_split_where_the_limit_does_not_bite_or_when_asked_not_to(no_device):
    d = Direction.BACKWARD_FILTER
    for be in (_table_split_backend(bites=False), _table_split_backend(bites=True, split=False)):
        assert [a.algo for a in be.find(WHOLE, d, 64 << 20)] == ["e1"]
        assert be.finds == [(384, 64)]
    # the regions alone over the cap: that factor is not found
    be = _table_split_backend(bites=True)
    tight = split.regions(split.split_of(WHOLE, 8), 64).inner
    be.find(WHOLE, d, tight)
    assert (48, 64) in be.finds and (96, 64) not in be.finds and (192, 64) not in be.finds


def test_a_factor_whose_copies_cannot_be_timed_is_left_out_and_find_goes_on(no_device):
    """No memory to time a factor's copies (or cuDNN refusing them): that
    factor is not reported, the others and the unsplit configs are."""
    from mucudnn._cudnn.errors import CudnnError
    from mucudnn.cuda import CudaOutOfMemoryError

    be = _table_split_backend(bites=True)
    fail = {4: CudaOutOfMemoryError("cudaMalloc", "cudaErrorMemoryAllocation", "out of memory"),
            8: CudnnError("cudnnTransformTensor", 3)}

    def time_split(sp, direction, size):
        if sp.k in fail:
            raise fail[sp.k]
        return 0.0

    be._time_split = time_split
    got = {a.algo for a in be.find(WHOLE, Direction.BACKWARD_FILTER, 1 << 30)}
    assert got == {"e1", "split2|e2", "split16|e2"}


@needs_cudnn_transforms
def test_the_copies_are_timed_on_scratch_buffers_freed_after(no_device, monkeypatch):
    """_time_split times one chunk's copies (SplitCopies.run_chunk on the handle,
    from a whole-tensor scratch to a chunk scratch of scratch_bytes), reports
    the median and frees the buffers and the descriptors, on failure too."""
    from mucudnn.backends import graph_find
    from mucudnn.backends.split_cudnn import SplitCopies

    from mucudnn.backends.cudnn_graph import CudnnGraphBackend

    be = CudnnGraphBackend(find_workspace_limit=1 << 40)
    be.on_home_stream = contextlib.nullcontext
    bufs, ran, closed = [], [], []

    class Buf:
        def __init__(self, n):
            self.nbytes, self.ptr, self.open = n, 4096 * (len(bufs) + 1), True
            bufs.append(self)

        def close(self):
            self.open = False

    be.alloc_workspace = Buf
    be.handle = "h"
    be.stream = type("S", (), {"synchronize": lambda self: None})()
    monkeypatch.setattr(SplitCopies, "run_chunk",
                        lambda self, h, d, a, b: ran.append((h, d, a, b)))
    real_close = SplitCopies.close
    monkeypatch.setattr(SplitCopies, "close", lambda self: (closed.append(1), real_close(self)))

    def timing(fn, stream, warmup, repeat, held=False, host=False):
        fn()
        return [3.0, 1.0, 2.0]

    monkeypatch.setattr(graph_find, "time_on_stream", timing)
    sp = split.split_of(WHOLE, 8)
    d = Direction.BACKWARD_FILTER
    assert be._time_split(sp, d, 64) == 2.0
    want = SplitCopies(sp, 64).scratch_bytes
    assert [b.nbytes for b in bufs] == list(want) and not any(b.open for b in bufs)
    assert ran == [("h", d, bufs[0].ptr, bufs[1].ptr)] and closed == [1]

    def failing(fn, stream, warmup, repeat, held=False, host=False):
        raise RuntimeError("boom")

    monkeypatch.setattr(graph_find, "time_on_stream", failing)
    bufs.clear()
    with pytest.raises(RuntimeError, match="boom"):
        be._time_split(sp, d, 32)
    assert len(bufs) == 2 and not any(b.open for b in bufs) and closed == [1, 1]


# -- the cuDNN copies (descriptors only) -----------------------------------------------------------
@needs_cudnn_transforms
@pytest.mark.parametrize("p", [CONVNEXT, RESNEXT], ids=["NHWC", "NCHW"])
def test_cudnn_copy_descriptors_describe_the_slices_and_the_packed_chunks(p):
    from mucudnn.backends.split_cudnn import SplitCopies

    s = split.split_of(p, 4)
    cp = SplitCopies(s, 8)
    try:
        c = s.chunk.with_batch(8)
        assert cp.x_slice.dims == cp.x_chunk.dims == c.x_dims
        assert cp.y_slice.dims == cp.y_chunk.dims == c.y_dims
        from mucudnn.problem import packed_strides
        assert cp.x_slice.strides == packed_strides(p.with_batch(8).x_dims, p.layout)
        assert cp.x_chunk.strides == packed_strides(c.x_dims, p.layout)
        assert cp.scratch_bytes[1] == max(c.x_shape[0] * np.prod(c.x_shape[1:]),
                                          np.prod(c.output_shape)) * 4
    finally:
        cp.close()


def test_the_torch_report_names_the_rewrites_a_plan_runs():
    pytest.importorskip("torch")
    from mucudnn.torch.report import _plan_text

    d = Direction.BACKWARD_FILTER
    mbs = (MicroBatch(0, 32, "split8|e30", 0, 9 << 20), MicroBatch(32, 32, "split8|e30", 0, 9 << 20))
    assert _plan_text(Plan(CONVNEXT, d, mbs, 9 << 20, 1.0, 1.0, None)) == \
        "2 x 32 (split by 8), 9.0 MiB"
    mixed = (MicroBatch(0, 48, "e30", 0, 1 << 20), MicroBatch(48, 16, "split4|e1", 0, 1 << 20))
    assert _plan_text(Plan(CONVNEXT, d, mixed, 1 << 20, 1.0, 1.0, None)) == \
        "48 + 16 (split by 4), 1.0 MiB"
    sliced = (MicroBatch(0, 64, "slice2|e19;k2=0", 0, 0),)
    assert _plan_text(Plan(CONVNEXT, d, sliced, 0, 1.0, 1.0, None)) == \
        "64 (split by 2 as slices), 0.0 MiB"
    plain = (MicroBatch(0, 64, "e30", 0, 0),)
    assert _plan_text(Plan(CONVNEXT, d, plain, 0, 1.0, 1.0, None)) == "64, 0.0 MiB"


@settings(max_examples=200, deadline=None)
@given(head=st.sampled_from(["split", "Split", "split ", "fold", "", "splitsplit"]),
       k=st.one_of(st.integers(-3, 40).map(str), st.text(max_size=3)),
       sep=st.sampled_from(["|", "||", "", ":"]),
       inner=st.one_of(st.integers(-1, 4).map(str), st.text(max_size=6), st.just("split2|0")))
def test_any_configuration_id_from_a_file_runs_or_is_refused_by_name(head, k, sep, inner):
    """An id a plan file can hold: the NumPy backend supports it or not, and
    workspace_size() either answers or raises a MucudnnError naming ``algo``."""
    import mucudnn as mu

    algo = f"{head}{k}{sep}{inner}"
    p = ConvProblem((2, 8, 5, 5), (8, 2, 3, 3), padding=1, groups=4)
    be = NumpyBackend()
    parsed = split.parse_split_id(algo)
    if parsed is not None:
        assert split.split_id(*parsed) == algo or str(parsed[1]) != inner
    try:
        ok = be.supports(p, Direction.FORWARD, algo)
    except mu.MucudnnError as exc:
        assert isinstance(exc, (ValueError, TypeError)) and "algo" in str(exc)
        ok = False
    try:
        need = be.workspace_size(p, Direction.FORWARD, algo)
    except mu.MucudnnError as exc:
        assert isinstance(exc, (ValueError, TypeError)) and "algo" in str(exc), exc
        assert not ok
    else:
        assert need >= 0


@needs_cudnn_transforms
@pytest.mark.parametrize("k", [2, 8])
def test_the_chunk_copies_pass_each_operands_descriptors_and_raise_cudnns_status(k):
    """SplitCopies issues cudnnTransformTensor through the raw binding (Note [raw
    bindings]): gathers from the whole tensor's slice to the packed chunk with
    alpha 1 and beta 0, scatters the other way with the caller's scalars, on
    the handle's pointer; a non-zero status raises cuDNN's error naming the
    call; after close() the descriptors passed are NULL."""
    from mucudnn.backends.split_cudnn import SplitCopies
    from mucudnn._cudnn.errors import CudnnError

    sp = split.splitting(WHOLE, k)
    cp = SplitCopies(sp, 64)
    xs, xc, ys, yc = (d.handle for d in (cp.x_slice, cp.x_chunk, cp.y_slice, cp.y_chunk))
    assert len({xs, xc, ys, yc}) == 4 and 0 not in (xs, xc, ys, yc)
    raw = cp._run = FakeRawTransform(scalars=(1, 4))  # (h, alpha, src_d, src, beta, dst_d, dst)
    calls, handle = raw.calls, raw.HANDLE
    cp.gather_x(handle, 1000, 2000)
    cp.gather_y(handle, 3000, 4000)
    cp.scatter_x(handle, 2000, 1000, cp.scalar(2.0), cp.scalar(0.5))
    cp.scatter_y(handle, 4000, 3000, cp.scalar(1.0), cp.scalar(1.0))
    assert calls == [(77, 1.0, xs, 1000, 0.0, xc, 2000), (77, 1.0, ys, 3000, 0.0, yc, 4000),
                     (77, 2.0, xc, 2000, 0.5, xs, 1000), (77, 1.0, yc, 4000, 1.0, ys, 3000)]
    raw.status = 3  # CUDNN_STATUS_BAD_PARAM
    with pytest.raises(CudnnError, match="cudnnTransformTensor"):
        cp.gather_x(handle, 1000, 2000)
    cp.close()
    raw.status = 0
    cp.gather_x(handle, 1000, 2000)
    assert calls[-1][2] == calls[-1][5] == 0
