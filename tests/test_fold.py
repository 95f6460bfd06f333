"""Folded first layers (Note [folded first layers] in mucudnn/backends/fold.py) on
the CPU: which problems fold and into what, the transforms on host arrays, the
NumPy backend's folded configurations against the float64 reference (every
direction, alpha and beta, micro-batched plans that accumulate), the planner
choosing them end to end through a Convolution, and cuDNN's transform
descriptor (the real library, no GPU needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mucudnn import ConvProblem, Direction
from mucudnn._cudnn.descriptors import (TensorDescriptor, TensorTransformDescriptor,
                                        live_descriptor_counts)
from mucudnn.backends import fold
from mucudnn.backends.fold_cudnn import FoldTransforms
from mucudnn.backends.numpy import NumpyAlgo, NumpyBackend
from mucudnn.problem import packed_strides
from conftest import needs_cudnn_transforms
from conv_support import (FakeRawTransform, RewritesFirstBackend, check_mixed_plan,
                          check_rewritten_run, composition, convolution_for, run_direction)
from reference import reference, rel_err

ALEXNET = ConvProblem((256, 227, 227, 3), (96, 11, 11, 3), stride=4, layout="NHWC")
RESNET = ConvProblem((256, 224, 224, 3), (64, 7, 7, 3), stride=2, padding=3, layout="NHWC")


@st.composite
def foldable(draw, batch=None):
    """A small problem that folds: NHWC, one stride s >= 2, few channels."""
    s = draw(st.integers(2, 4))
    c = draw(st.integers(1, 64 // (s * s)))
    r, q = draw(st.integers(1, 2 * s + 2)), draw(st.integers(1, 2 * s + 2))
    ph, pw = draw(st.integers(0, r - 1)), draw(st.integers(0, q - 1))
    h = draw(st.integers(max(1, r - 2 * ph), 3 * s + 6))
    w = draw(st.integers(max(1, q - 2 * pw), 3 * s + 6))
    n = batch if batch is not None else draw(st.integers(1, 5))
    k = draw(st.integers(1, 5))
    p = ConvProblem((n, h, w, c), (k, r, q, c), stride=s, padding=(ph, pw), layout="NHWC",
                    math="fma")
    assume(fold.fold_of(p) is not None)
    return p


def _tensors(p, rng):
    return tuple(rng.standard_normal(shape).astype(np.float32)
                 for shape in (p.x_shape, p.w_shape, p.output_shape))


def test_first_layers_fold_into_what_the_note_says():
    a, r = fold.fold_of(ALEXNET), fold.fold_of(RESNET)
    assert (a.s, a.inner.x_shape, a.inner.w_shape, a.pad_after) == (
        4, (256, 57, 57, 48), (96, 3, 3, 48), (1, 1))
    assert (r.s, r.inner.x_shape, r.inner.w_shape, r.pad_before, r.pad_after) == (
        2, (256, 115, 115, 12), (64, 4, 4, 12), (3, 3), (3, 3))
    for f in (a, r):
        assert f.inner.output_shape == f.problem.output_shape
        assert f.inner.stride == (1, 1) and f.inner.padding == (0, 0)


@pytest.mark.parametrize("p, why", [
    (ConvProblem((8, 3, 227, 227), (96, 3, 11, 11), stride=4), "NCHW"),
    (ConvProblem((8, 227, 227, 3), (96, 11, 11, 3), stride=(4, 2), layout="NHWC"), "stride"),
    (ConvProblem((8, 56, 56, 64), (64, 3, 3, 64), stride=2, padding=1, layout="NHWC"), "C*s*s"),
    (ConvProblem((8, 20, 20, 4), (8, 3, 3, 2), stride=2, groups=2, layout="NHWC"), "groups"),
    (ConvProblem((8, 20, 20, 3), (8, 3, 3, 3), stride=2, dilation=2, layout="NHWC"), "dilation"),
    (ConvProblem((8, 20, 20, 3), (8, 3, 3, 3), stride=1, layout="NHWC"), "stride 1"),
    (ConvProblem((2, 13, 9, 2), (5, 5, 3, 2), stride=3, padding=1, layout="NHWC"), "output"),
    (ConvProblem((2, 20, 20, 3, 3), (8, 3, 3, 3, 3), stride=2, layout="NDHWC"), "3-D"),
    (ConvProblem((8, 20, 20, 3), (8, 3, 3, 3), stride=2, dtype="float64", layout="NHWC"),
     "float64"),
])
def test_what_does_not_fold(p, why):
    assert fold.fold_of(p) is None, why


@pytest.mark.parametrize("algo, want", [
    ("fold4|e12;k3=1", (4, "e12;k3=1")), ("fold2|1", (2, 1)), ("fold3|e0", (3, "e0")),
    (1, None), ("e12;k3=1", None), ("fold|e1", None), ("foldx|e1", None), ("fold4|", None),
    ("fold4", None), ("fold\u00b2|e1", None), ("fold2|\u00b2", (2, "\u00b2")),
])
def test_fold_ids(algo, want):
    assert fold.split_fold_id(algo) == want
    if want is not None:
        assert fold.fold_id(*want) == algo


@settings(max_examples=60, deadline=None)
@given(p=foldable(), seed=st.integers(0, 2**16))
def test_the_folded_problem_computes_the_same_sums(p, seed):
    """conv(fold(x), fold(w)) == conv(x, w); its backward passes, unfolded, are
    the original's; and fold/unfold are inverse where nothing is dropped."""
    f = fold.fold_of(p)
    rng = np.random.default_rng(seed)
    x, w, dy = (a.astype(np.float64) for a in _tensors(p, rng))
    xf, wf = fold.fold_x(f, x), fold.fold_w(f, w)
    assert xf.shape == f.inner.x_shape and wf.shape == f.inner.w_shape
    inner = f.inner
    assert rel_err(reference(inner, Direction.FORWARD, xf, wf, dy),
                   reference(p, Direction.FORWARD, x, w, dy)) < 1e-12
    dxf = reference(inner, Direction.BACKWARD_DATA, xf, wf, dy)
    assert rel_err(fold.unfold_x(f, dxf), reference(p, Direction.BACKWARD_DATA, x, w, dy)) < 1e-12
    dwf = reference(inner, Direction.BACKWARD_FILTER, xf, wf, dy)
    assert rel_err(fold.unfold_w(f, dwf),
                   reference(p, Direction.BACKWARD_FILTER, x, w, dy)) < 1e-12
    np.testing.assert_array_equal(fold.unfold_x(f, xf), x)
    np.testing.assert_array_equal(fold.unfold_w(f, wf), w)


@settings(max_examples=40, deadline=None)
@given(p=foldable(), d=st.sampled_from(list(Direction)), inner=st.sampled_from(list(NumpyAlgo)),
       alpha=st.sampled_from([1.0, 0.5, -2.0]), beta=st.sampled_from([0.0, 1.0, 0.25]),
       seed=st.integers(0, 2**16))
def test_numpy_folded_configuration_matches_the_reference(p, d, inner, alpha, beta, seed):
    be = NumpyBackend()
    f = fold.fold_of(p)
    algo = fold.fold_id(f.s, int(inner))
    assert be.supports(p, d, algo)
    need = be.workspace_size(p, d, algo)
    assert need == fold.regions(f, p.batch).inner + be.workspace_size(f.inner, d, inner)
    x, w, y = _tensors(p, np.random.default_rng(seed))
    check_rewritten_run(be, p, d, algo, need, x, w, y, alpha, beta, 1e-5)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), d=st.sampled_from(list(Direction)),
       alpha=st.sampled_from([1.0, 0.5]), beta=st.sampled_from([0.0, 1.0, -0.5]),
       seed=st.integers(0, 2**16))
def test_micro_batched_folded_plan_equals_the_unsplit_reference(data, d, alpha, beta, seed):
    """A plan of folded micro-batches (mixed with unfolded ones) gives the
    whole batch's result; backward-filter accumulates over micro-batches."""
    n = data.draw(st.integers(2, 7))
    p = data.draw(foldable(batch=n))
    f = fold.fold_of(p)
    be = NumpyBackend()
    sized = [(s, data.draw(st.sampled_from([fold.fold_id(f.s, 0), fold.fold_id(f.s, 1), 0, 1])))
             for s in composition(data.draw, n)]
    check_mixed_plan(be, p, d, sized, alpha, beta, seed, 1e-5)


def test_numpy_find_adds_folded_configurations_only_where_asked_and_they_fold():
    p = ConvProblem((2, 19, 19, 3), (4, 5, 5, 3), stride=2, padding=1, layout="NHWC")
    f = fold.fold_of(p)
    assert f is not None
    plain = NumpyBackend(repeats=1).find(p, Direction.FORWARD, None)
    assert all(isinstance(a.algo, int) for a in plain)
    be = NumpyBackend(repeats=1, fold=True)
    got = be.find(p, Direction.FORWARD, None)
    folded = [a for a in got if isinstance(a.algo, str)]
    assert sorted(a.algo for a in folded) == [fold.fold_id(2, int(a)) for a in NumpyAlgo]
    for a in got:
        assert a.workspace_bytes == be.workspace_size(p, Direction.FORWARD, a.algo)
    # the regions count against the limit
    limit = fold.regions(f, p.batch).inner - 1
    assert not [a for a in be.find(p, Direction.FORWARD, limit) if isinstance(a.algo, str)]
    q = ConvProblem((2, 3, 19, 19), (4, 3, 5, 5), stride=2, padding=1)
    assert all(isinstance(a.algo, int) for a in be.find(q, Direction.FORWARD, None))


def test_a_folded_id_for_a_problem_that_does_not_fold_is_refused():
    be = NumpyBackend()
    q = ConvProblem((2, 19, 19, 3), (4, 5, 5, 3), stride=1, padding=1, layout="NHWC")
    assert not be.supports(q, Direction.FORWARD, "fold2|0")
    with pytest.raises(ValueError, match="folded by 2 cannot run"):
        be.workspace_size(q, Direction.FORWARD, "fold2|0")
    p = ConvProblem((2, 19, 19, 3), (4, 5, 5, 3), stride=2, padding=1, layout="NHWC")
    with pytest.raises(ValueError, match="folded by 3 cannot run"):
        be.workspace_size(p, Direction.FORWARD, "fold3|0")


@pytest.mark.parametrize("d", list(Direction), ids=str)
def test_a_convolution_plans_and_runs_folded_configurations(d, tmp_path, monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "c.sqlite"))
    # (24 x 24 x 3 and 12 x 12 x 4 floats a sample: any micro-batch offset keeps alignment)
    p = ConvProblem((6, 24, 24, 3), (4, 7, 7, 3), stride=2, padding=3, layout="NHWC", math="fma")
    f = fold.fold_of(p)
    limit = fold.regions(f, 2).inner  # folded micro-batches of 2 (DIRECT needs no more) fit
    conv = convolution_for(p, backend=RewritesFirstBackend("fold"), workspace_limit=limit)
    x, w, y = _tensors(p, np.random.default_rng(3))
    got = run_direction(conv, d, x, w, y, alpha=0.5, beta=0.25)
    plan = conv.plans[d]
    assert all(fold.split_fold_id(m.algo) is not None for m in plan.micro_batches), plan
    assert len(plan.micro_batches) > 1 and plan.workspace_bytes <= limit
    assert rel_err(got, reference(p, d, x, w, y, 0.5, 0.25)) < 1e-5


@needs_cudnn_transforms
@settings(max_examples=40, deadline=None)
@given(p=foldable(), dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
       size=st.integers(1, 5))
def test_cudnn_transforms_fold_to_the_inner_problem_and_back(p, dtype, size):
    """The transform descriptors a folded launcher uses, as cuDNN itself reads
    them (cudnnInitTransformDest, no GPU needed): x rows and the filter fold to
    the inner problem's packed NHWC tensors and unfold back to the originals."""
    p = ConvProblem(p.x_shape, p.w_shape, stride=p.stride, padding=p.padding,
                    layout="NHWC", dtype=dtype)
    f = fold.fold_of(p)
    tf = FoldTransforms(f, size)
    try:
        inner = f.inner.with_batch(size)
        for t, src, want in ((tf.fold_x_t, tf.x, inner.x_dims), (tf.fold_w_t, tf.w, inner.w_dims),
                             (tf.unfold_x_t, tf.xf, p.with_batch(size).x_dims),
                             (tf.unfold_w_t, tf.wf, p.w_dims)):
            dims, strides, nbytes = t.destination_of(src)
            assert dims == want
            assert strides == tuple(packed_strides(want, "NHWC"))
            assert nbytes == math.prod(want) * p.itemsize
        assert tf.xf_bytes == fold.regions(f, size).a_bytes
    finally:
        tf.close()


@needs_cudnn_transforms
def test_transform_descriptor_reads_back_and_computes_the_folded_shape():
    before = live_descriptor_counts()["transform"]
    with TensorTransformDescriptor([0, 0, 0, 0], [0, 0, 1, 1], [4, 4]) as t:
        assert t.get() == ("NHWC", (0, 0, 0, 0), (0, 0, 1, 1), (4, 4), "fold")
        with TensorDescriptor((256, 3, 227, 227), format="NHWC") as src:
            dims, strides, nbytes = t.destination_of(src)
        assert dims == (256, 48, 57, 57) and strides == (155952, 1, 2736, 48)
        assert nbytes == 256 * 57 * 57 * 48 * 4
        assert live_descriptor_counts()["transform"] == before + 1
        assert "fold=(4, 4)" in repr(t)
    assert live_descriptor_counts()["transform"] == before
    with pytest.raises(ValueError, match="closed"):
        t.get()
    u = TensorTransformDescriptor([0, 0, -3, -3], [0, 0, -3, -3], [2, 2], unfold=True)
    with TensorDescriptor((8, 12, 115, 115), format="NHWC") as src:
        assert u.destination_of(src)[0] == (8, 3, 224, 224)
    assert u.get()[4] == "unfold"
    u.close()
    with pytest.raises(ValueError, match="fold"):
        TensorTransformDescriptor([0] * 4, [0] * 4, [0, 2])
    with pytest.raises(ValueError, match="pad_before"):
        TensorTransformDescriptor([0] * 3, [0] * 4, [2, 2])
    assert live_descriptor_counts()["transform"] == before


# -- Note [candidate sets in keys] ---------------------------------------------------------------
class _Counting(NumpyBackend):
    """NumPy, counting its find() calls per problem key."""

    def __init__(self, fold: bool) -> None:
        super().__init__(repeats=1, fold=fold)
        self.finds: list[str] = []

    def find(self, problem, direction, workspace_limit):
        self.finds.append(problem.key())
        return super().find(problem, direction, workspace_limit)


_FOLDS = ConvProblem((4, 19, 19, 3), (4, 5, 5, 3), stride=2, padding=1, layout="NHWC")
_STAYS = ConvProblem((4, 3, 19, 19), (4, 3, 5, 5), stride=2, padding=1)


def test_cache_name_marks_the_problems_whose_candidates_folding_changes():
    plain, folding = NumpyBackend(), NumpyBackend(fold=True)
    assert plain.cache_name(_FOLDS) == plain.cache_name(_STAYS) == "numpy"
    assert folding.cache_name(_FOLDS) == "numpy" + fold.CACHE_SUFFIX
    assert folding.cache_name(_STAYS) == "numpy"
    # an adapted object without cache_name keys every problem by its name
    from mucudnn.backends.base import adapt

    class Bare:
        name = "bare"

        def find(self, problem, direction, workspace_limit):
            return []

    assert adapt(Bare()).cache_name(_FOLDS) == "bare"


def test_a_cache_written_without_folding_is_measured_again_where_it_folds(tmp_path):
    """A stale entry (a cache from before folding, or from fold=False) is not
    read by a backend that folds, for the problems that fold only; each keeps
    its own entries, and the plain backend still reads its own."""
    from mucudnn.optimizer import BenchmarkCache
    from mucudnn.optimizer.benchmark import benchmark

    cache = BenchmarkCache(tmp_path / "c.sqlite")
    old = _Counting(fold=False)
    for p in (_FOLDS, _STAYS):
        benchmark(old, p, Direction.FORWARD, "undivided", 64 << 20, cache=cache)
    assert old.finds == [_FOLDS.key(), _STAYS.key()]
    new = _Counting(fold=True)
    got = {p: benchmark(new, p, Direction.FORWARD, "undivided", 64 << 20, cache=cache)[4]
           for p in (_FOLDS, _STAYS)}
    assert new.finds == [_FOLDS.key()]  # the plain problem came from the cache
    assert any(fold.split_fold_id(a.algo) for a in got[_FOLDS])
    assert not any(fold.split_fold_id(a.algo) for a in got[_STAYS])
    names = sorted((k[0], k[3]) for k in cache.keys())
    assert names == sorted([("numpy", _FOLDS.key()), ("numpy", _STAYS.key()),
                            ("numpy+fold", _FOLDS.key())])
    # a backend's entries are listed (and exported) with its folded variant's
    assert sorted(e.backend for e in cache.entries("numpy")) == ["numpy", "numpy", "numpy+fold"]
    # both read back their own, without finding again
    again_old, again_new = _Counting(fold=False), _Counting(fold=True)
    for be in (again_old, again_new):
        benchmark(be, _FOLDS, Direction.FORWARD, "undivided", 64 << 20, cache=cache)
    assert again_old.finds == again_new.finds == []
    assert not any(fold.split_fold_id(a.algo) for a in cache.get(again_old, _FOLDS, "forward"))


class _FoldFirstSameKey(RewritesFirstBackend):
    """RewritesFirstBackend("fold") under NumPy's own version: only cache_name
    tells it from a plain NumpyBackend."""

    def __init__(self) -> None:
        super().__init__("fold")
        self.version = NumpyBackend().version


def test_plans_of_a_backend_that_folds_are_not_memoised_for_one_that_does_not(tmp_path):
    from mucudnn.optimizer.planner import Planner

    cache = tmp_path / "c.sqlite"
    limit = fold.regions(fold.fold_of(_FOLDS), _FOLDS.batch).inner + (1 << 20)
    folding = Planner(_FoldFirstSameKey(), limit, "undivided", cache=cache)
    plain = Planner(NumpyBackend(repeats=1), limit, "undivided", cache=cache)
    assert folding.key(_FOLDS, Direction.FORWARD) != plain.key(_FOLDS, Direction.FORWARD)
    assert folding.key(_STAYS, Direction.FORWARD) == plain.key(_STAYS, Direction.FORWARD)
    first = folding.plan(_FOLDS, Direction.FORWARD)
    assert all(fold.split_fold_id(m.algo) for m in first.micro_batches), first
    second = plain.plan(_FOLDS, Direction.FORWARD)
    assert not any(fold.split_fold_id(m.algo) for m in second.micro_batches), second


def test_an_offline_backend_replays_the_folded_measurements_where_the_cache_has_them(tmp_path):
    from mucudnn.optimizer import BenchmarkCache
    from mucudnn.optimizer.benchmark import benchmark
    from mucudnn.optimizer.offline import CachedBackend

    path = tmp_path / "c.sqlite"
    cache = BenchmarkCache(path)
    for p in (_FOLDS, _STAYS):
        benchmark(NumpyBackend(repeats=1), p, Direction.FORWARD, "undivided", 1 << 30, cache=cache)
    stale = CachedBackend("numpy", cache=path)
    assert stale.cache_name(_FOLDS) == "numpy"  # only plain entries: those
    assert not any(fold.split_fold_id(a.algo)
                   for a in benchmark(stale, _FOLDS, "forward", "undivided", 1 << 30, cache=path)[4])
    benchmark(_FoldFirstSameKey(), _FOLDS, Direction.FORWARD, "undivided", 1 << 30, cache=cache)
    replay = CachedBackend("numpy", cache=path)
    assert (replay.cache_name(_FOLDS), replay.cache_name(_STAYS)) == ("numpy+fold", "numpy")
    got = benchmark(replay, _FOLDS, "forward", "undivided", 1 << 30, cache=path)[4]
    assert any(fold.split_fold_id(a.algo) for a in got)


@needs_cudnn_transforms
def test_the_fold_transforms_pass_each_descriptor_and_raise_cudnns_status():
    """FoldTransforms issues cudnnTransformTensorEx through the raw binding (Note
    [raw bindings]): each transform with its own transform, source and
    destination descriptors, folds with alpha 1 and beta 0, unfolds with the
    caller's scalars, on the handle's pointer; a non-zero status raises cuDNN's
    error naming the call; after close() the descriptors passed are NULL."""
    import ctypes

    from mucudnn._cudnn.errors import CudnnError

    f = fold.fold_of(RESNET)
    tf = FoldTransforms(f, 8)
    h = {name: getattr(tf, name).handle for name in
         ("x", "xf", "w", "wf", "fold_x_t", "unfold_x_t", "fold_w_t", "unfold_w_t")}
    assert len(set(h.values())) == 8 and 0 not in h.values()
    raw = tf._run = FakeRawTransform(scalars=(2, 5))  # (h, t, alpha, src_d, src, beta, dst_d, dst)
    calls, handle = raw.calls, raw.HANDLE
    tf.fold_x(handle, 1000, 2000)
    tf.fold_w(handle, 3000, 4000)
    tf.unfold_x(handle, 2000, 1000, ctypes.c_float(2.0), ctypes.c_float(0.5))
    tf.unfold_w(handle, 4000, 3000, ctypes.c_float(1.0), ctypes.c_float(1.0))
    assert calls == [
        (77, h["fold_x_t"], 1.0, h["x"], 1000, 0.0, h["xf"], 2000),
        (77, h["fold_w_t"], 1.0, h["w"], 3000, 0.0, h["wf"], 4000),
        (77, h["unfold_x_t"], 2.0, h["xf"], 2000, 0.5, h["x"], 1000),
        (77, h["unfold_w_t"], 1.0, h["wf"], 4000, 1.0, h["w"], 3000)]
    raw.status = 3  # CUDNN_STATUS_BAD_PARAM
    with pytest.raises(CudnnError, match="cudnnTransformTensorEx"):
        tf.fold_x(handle, 1000, 2000)
    tf.close()
    raw.status = 0
    tf.fold_x(handle, 1000, 2000)
    assert calls[-1][1] == calls[-1][3] == calls[-1][6] == 0
