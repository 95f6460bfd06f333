"""The NumPy backend: every algorithm in every direction against the naive float64
reference (tests/reference.py), find(), workspaces, arrays, bfloat16 availability."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mucudnn import Backend, ConvProblem, Direction, get_backend
from mucudnn.backends.base import OUTPUT_OF, ConvTensors
from mucudnn.backends.numpy import NumpyAlgo, NumpyBackend
from mucudnn.problem import from_canonical

from reference import reference, rel_err

HAVE_ML_DTYPES = importlib.util.find_spec("ml_dtypes") is not None
DTYPES = ["float64", "float32", "float16"] + (["bfloat16"] if HAVE_ML_DTYPES else [])
TOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}
ALGOS = list(NumpyAlgo)

be = NumpyBackend(repeats=1)


def np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# -- strategies ------------------------------------------------------------------------------

@st.composite
def problems(draw, dtypes=tuple(DTYPES)):
    nd = draw(st.sampled_from([2, 2, 3]))
    layout = draw(st.sampled_from(["NCHW", "NHWC"] if nd == 2 else ["NCDHW", "NDHWC"]))
    g = draw(st.integers(1, 3))
    c, k = g * draw(st.integers(1, 3)), g * draw(st.integers(1, 3))
    small = nd == 3
    r = draw(st.lists(st.integers(1, 2 if small else 3), min_size=nd, max_size=nd))
    s = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    d = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    pad = draw(st.lists(st.integers(0, 2), min_size=nd, max_size=nd))
    h = [draw(st.integers(max(1, (ri - 1) * di + 1 - 2 * pi), (ri - 1) * di + (4 if small else 7)))
         for ri, di, pi in zip(r, d, pad)]
    n = draw(st.integers(1, 3))
    return ConvProblem(from_canonical((n, c) + tuple(h), layout),
                       from_canonical((k, c // g) + tuple(r), layout),
                       stride=tuple(s), padding=tuple(pad), dilation=tuple(d), groups=g,
                       layout=layout, dtype=draw(st.sampled_from(dtypes)))


def random_tensors(p: ConvProblem, seed: int):
    rng = np.random.default_rng(seed)
    dt = np_dtype(p.dtype)
    return [rng.standard_normal(shape).astype(dt)
            for shape in (p.x_shape, p.w_shape, p.output_shape)]


def run_one(p, direction, algo, x, w, y, alpha, beta, prior_nan=False, workspace=...):
    """Run on copies; returns the written tensor. ``workspace=...``: allocate what it needs."""
    t = ConvTensors(p, x.copy(), w.copy(), y.copy())
    out = getattr(t, OUTPUT_OF[direction])
    if prior_nan:
        out[...] = np.nan
    if workspace is ...:
        workspace = be.alloc_workspace(be.workspace_size(p, direction, algo))
    be.run(direction, algo, 0, t, alpha, beta, workspace)
    return out


# -- correctness ------------------------------------------------------------------------------

@given(p=problems(), alpha=st.sampled_from([1.0, 0.5, -2.0]),
       beta=st.sampled_from([0.0, 1.0, -0.75]), seed=st.integers(0, 2**16))
def test_every_algorithm_and_direction_matches_reference(p, alpha, beta, seed):
    x, w, y = random_tensors(p, seed)  # already rounded to p.dtype: the reference sees the same
    for direction in Direction:
        want = reference(p, direction, x, w, y, alpha, beta)
        for algo in ALGOS:
            got = run_one(p, direction, algo, x, w, y, alpha, beta, prior_nan=(beta == 0))
            assert got.dtype == np_dtype(p.dtype)
            err = rel_err(got, want)
            assert err < TOL[p.dtype], (algo.name, str(direction), p, err)


@pytest.mark.parametrize("direction", list(Direction))
@pytest.mark.parametrize("algo", ALGOS)
def test_realistic_layer_float32(direction, algo):
    """A ResNet-like layer with stride 2 (FFT subsampling) in NHWC."""
    p = ConvProblem((2, 14, 14, 16), (8, 3, 3, 16), stride=2, padding=1, layout="NHWC")
    x, w, y = random_tensors(p, 7)
    got = run_one(p, direction, algo, x, w, y, 1.0, 0.0)
    assert rel_err(got, reference(p, direction, x, w, y)) < 1e-5


def test_beta_zero_ignores_nan_and_beta_one_accumulates():
    p = ConvProblem((2, 3, 6, 6), (4, 3, 3, 3), padding=1)
    x, w, y = random_tensors(p, 1)
    for direction in Direction:
        for algo in ALGOS:
            out = run_one(p, direction, algo, x, w, y, 1.0, 0.0, prior_nan=True)
            assert np.isfinite(out).all()
            once = run_one(p, direction, algo, x, w, y, 1.0, 0.0)
            t = ConvTensors(p, x.copy(), w.copy(), y.copy())
            getattr(t, OUTPUT_OF[direction])[...] = 0
            ws = be.alloc_workspace(be.workspace_size(p, direction, algo))
            be.run(direction, algo, 0, t, 1.0, 0.0, ws)
            be.run(direction, algo, 0, t, 1.0, 1.0, ws)
            np.testing.assert_allclose(getattr(t, OUTPUT_OF[direction]), 2 * once, rtol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_micro_batch_views_write_into_the_parent(layout):
    """Forward/backward-data on rows [2, 5) write exactly those rows of the caller's arrays."""
    full = ConvProblem(from_canonical((6, 4, 7, 7), layout), from_canonical((5, 4, 3, 3), layout),
                       padding=1, layout=layout)
    x, w, y = random_tensors(full, 3)
    sub = full.with_batch(3)
    for algo in ALGOS:
        y_out = np.full_like(y, 9.0)
        ws = be.alloc_workspace(be.workspace_size(sub, Direction.FORWARD, algo))
        be.run(Direction.FORWARD, algo, 0, ConvTensors(sub, x[2:5], w, y_out[2:5]), 1.0, 0.0, ws)
        want = reference(full, Direction.FORWARD, x, w, y)
        assert rel_err(y_out[2:5], want[2:5]) < 1e-5
        assert (y_out[:2] == 9).all() and (y_out[5:] == 9).all()
        dx = np.full_like(x, 9.0)
        ws = be.alloc_workspace(be.workspace_size(sub, Direction.BACKWARD_DATA, algo))
        be.run(Direction.BACKWARD_DATA, algo, 0, ConvTensors(sub, dx[2:5], w, y[2:5]), 1.0, 0.0, ws)
        want = reference(full, Direction.BACKWARD_DATA, x, w, y)
        assert rel_err(dx[2:5], want[2:5]) < 1e-5
        assert (dx[:2] == 9).all() and (dx[5:] == 9).all()


# -- workspaces -----------------------------------------------------------------------------

P_WS = ConvProblem((4, 6, 9, 9), (8, 3, 3, 3), groups=2, padding=1)


@pytest.mark.parametrize("direction", list(Direction))
def test_workspace_behaviour_with_batch(direction):
    sizes = {a: [be.workspace_size(P_WS.with_batch(b), direction, a) for b in (1, 2, 4, 8)]
             for a in ALGOS}
    assert sizes[NumpyAlgo.DIRECT] == [0, 0, 0, 0]
    im = sizes[NumpyAlgo.IM2COL_GEMM]
    assert im[0] > 0 and im == [im[0] * b for b in (1, 2, 4, 8)]  # linear in the batch
    # the column matrix: C * taps x N * output pixels, float32
    assert im[0] == 6 * 9 * 1 * 81 * 4
    fft = sizes[NumpyAlgo.FFT]
    assert all(a < b for a, b in zip(fft, fft[1:])) and fft[0] > 0
    # float64 doubles both
    p64 = ConvProblem(P_WS.x_shape, P_WS.w_shape, groups=2, padding=1, dtype="float64")
    assert be.workspace_size(p64, direction, NumpyAlgo.IM2COL_GEMM) == 2 * im[2]
    # float16 computes in float32: the same bytes as float32
    p16 = ConvProblem(P_WS.x_shape, P_WS.w_shape, groups=2, padding=1, dtype="float16")
    assert be.workspace_size(p16, direction, NumpyAlgo.IM2COL_GEMM) == im[2]


@pytest.mark.parametrize("direction", list(Direction))
def test_find_sorted_with_real_workspaces(direction):
    perfs = be.find(P_WS, direction, workspace_limit=1 << 30)
    assert sorted(a.algo for a in perfs) == [0, 1, 2]
    assert [a.time_ms for a in perfs] == sorted(a.time_ms for a in perfs)
    for a in perfs:
        assert isinstance(a.algo, int) and a.time_ms > 0 and a.math_type == 0
        assert a.workspace_bytes == be.workspace_size(P_WS, direction, a.algo)
    # the limit filters: zero bytes leaves only DIRECT; just below im2col's need drops it
    assert [a.algo for a in be.find(P_WS, direction, 0)] == [NumpyAlgo.DIRECT]
    im = be.workspace_size(P_WS, direction, NumpyAlgo.IM2COL_GEMM)
    fft = be.workspace_size(P_WS, direction, NumpyAlgo.FFT)
    limited = {a.algo for a in be.find(P_WS, direction, min(im, fft) - 1)}
    assert limited == {NumpyAlgo.DIRECT}
    limited = {a.algo for a in be.find(P_WS, direction, max(im, fft) - 1)}
    assert limited == {NumpyAlgo.DIRECT, NumpyAlgo.IM2COL_GEMM if im < fft else NumpyAlgo.FFT}
    with pytest.raises(ValueError, match="workspace_limit"):
        be.find(P_WS, direction, -1)


def test_find_grows_with_batch_for_im2col_and_fft():
    for direction in Direction:
        small = {a.algo: a.workspace_bytes for a in be.find(P_WS.with_batch(1), direction, None)}
        big = {a.algo: a.workspace_bytes for a in be.find(P_WS.with_batch(8), direction, None)}
        assert small[NumpyAlgo.DIRECT] == big[NumpyAlgo.DIRECT] == 0
        assert big[NumpyAlgo.IM2COL_GEMM] == 8 * small[NumpyAlgo.IM2COL_GEMM] > 0
        assert big[NumpyAlgo.FFT] > small[NumpyAlgo.FFT] > 0


@pytest.mark.parametrize("direction", list(Direction))
@pytest.mark.parametrize("algo", [NumpyAlgo.IM2COL_GEMM, NumpyAlgo.FFT])
def test_too_small_workspace_raises(direction, algo):
    x, w, y = random_tensors(P_WS, 0)
    need = be.workspace_size(P_WS, direction, algo)
    for ws in (None, be.alloc_workspace(need - 1), be.alloc_workspace(0)):
        with pytest.raises(ValueError, match="workspace"):
            run_one(P_WS, direction, algo, x, w, y, 1.0, 0.0, workspace=ws)
    # a larger workspace, or a slice of one, is fine
    big = be.alloc_workspace(need + 1000)
    run_one(P_WS, direction, algo, x, w, y, 1.0, 0.0, workspace=big[1000:])
    with pytest.raises(TypeError, match="workspace"):
        run_one(P_WS, direction, algo, x, w, y, 1.0, 0.0, workspace=np.zeros(need, np.float32))


@pytest.mark.parametrize("direction", list(Direction))
@pytest.mark.parametrize("algo", [NumpyAlgo.IM2COL_GEMM, NumpyAlgo.FFT])
def test_algorithms_really_use_the_workspace(direction, algo):
    """The column matrix / spectra are built inside the caller's buffer, and all of
    it is used (no slack in the reported size); bytes beyond it are left alone."""
    x, w, y = random_tensors(P_WS, 0)
    need = be.workspace_size(P_WS, direction, algo)
    ws = np.full(need + 64, 0xAB, np.uint8)
    run_one(P_WS, direction, algo, x, w, y, 1.0, 0.0, workspace=ws)
    assert (ws[need:] == 0xAB).all()
    touched = ws[:need] != 0xAB
    assert touched.mean() > 0.5
    assert touched[need - 64:].any()  # the last segment is used too


def test_direct_runs_without_workspace():
    x, w, y = random_tensors(P_WS, 0)
    for direction in Direction:
        t = ConvTensors(P_WS, x.copy(), w.copy(), y.copy())
        be.run(direction, NumpyAlgo.DIRECT, 0, t, 1.0, 0.0, None)


# -- argument checking --------------------------------------------------------------------

def test_run_checks_its_arguments():
    x, w, y = random_tensors(P_WS, 0)
    ws = be.alloc_workspace(1 << 20)
    with pytest.raises(ValueError, match="algo"):
        be.run(Direction.FORWARD, 7, 0, ConvTensors(P_WS, x, w, y), 1.0, 0.0, ws)
    with pytest.raises(ValueError, match="tensors.y"):
        be.run(Direction.FORWARD, 0, 0, ConvTensors(P_WS, x, w, y[:2]), 1.0, 0.0, ws)
    with pytest.raises(ValueError, match="tensors.x"):
        be.run(Direction.FORWARD, 0, 0, ConvTensors(P_WS, x.astype(np.float64), w, y), 1.0, 0.0, ws)
    ro = y.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        be.run(Direction.FORWARD, 0, 0, ConvTensors(P_WS, x, w, ro), 1.0, 0.0, ws)
    with pytest.raises(ValueError, match="direction"):
        be.run("sideways", 0, 0, ConvTensors(P_WS, x, w, y), 1.0, 0.0, ws)
    # algo by enum, int, or name; direction by its string
    for algo in (NumpyAlgo.FFT, 2, "fft"):
        be.run("forward", algo, 0, ConvTensors(P_WS, x, w, y.copy()), 1.0, 0.0, ws)


# -- arrays, identity, registry ---------------------------------------------------------------

def test_array_helpers_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for f in (be.from_host, be.to_host):
        b = f(a)
        assert isinstance(b, np.ndarray) and b.flags.c_contiguous
        np.testing.assert_array_equal(a, b)
        b[0, 0] = 100
        assert a[0, 0] == 0
    assert be.from_host(a.T).flags.c_contiguous
    e = be.empty((2, 3), "float16")
    assert e.shape == (2, 3) and e.dtype == np.float16
    assert be.empty((4,), "float64").dtype == np.float64
    wsp = be.alloc_workspace(100)
    assert wsp.shape == (100,) and wsp.dtype == np.uint8
    assert be.alloc_workspace(0).size == 0
    be.synchronize()


def test_identity_and_registry():
    b = get_backend("numpy")
    assert isinstance(b, NumpyBackend) and isinstance(b, Backend)
    assert b is get_backend("NumPy")
    assert b.name == "numpy" and b.version == np.__version__
    assert isinstance(b.device_name, str) and b.device_name
    assert get_backend(be) is be


@pytest.mark.skipif(not HAVE_ML_DTYPES, reason="ml_dtypes not installed")
def test_bfloat16_arrays():
    e = be.empty((2, 3), "bfloat16")
    assert e.dtype.name == "bfloat16"


def test_bfloat16_without_ml_dtypes_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # makes `import ml_dtypes` fail
    p = ConvProblem((2, 3, 5, 5), (4, 3, 3, 3), dtype="bfloat16")
    with pytest.raises(NotImplementedError, match="pip install ml_dtypes"):
        be.empty((2, 3), "bfloat16")
    with pytest.raises(NotImplementedError, match="pip install ml_dtypes"):
        be.find(p, Direction.FORWARD, 1 << 30)
    x = np.zeros(p.x_shape, np.float32)
    w = np.zeros(p.w_shape, np.float32)
    y = np.zeros(p.output_shape, np.float32)
    with pytest.raises(NotImplementedError, match="pip install ml_dtypes"):
        be.run(Direction.FORWARD, 0, 0, ConvTensors(p, x, w, y), 1.0, 0.0, None)
    # other dtypes are unaffected
    assert be.empty((2,), "float16").dtype == np.float16


def test_host_backend_is_safe_across_threads():
    """Two threads share the NumPy backend's workspace pool; results stay right."""
    import threading

    import mucudnn as mu
    from mucudnn.problem import MicroBatch, make_plan

    from reference import reference, rel_err
    p = ConvProblem((8, 8, 16, 16), (8, 8, 3, 3), padding=1)
    plan = make_plan([MicroBatch(0, 8, 1)], undivided_time_ms=1.0, workspace_limit=None)
    convs = [mu.Convolution(p.x_shape, p.w_shape, padding=1, backend="numpy",
                            plans={Direction.FORWARD: plan}) for _ in range(2)]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(p.x_shape).astype(np.float32) for _ in range(2)]
    w = rng.standard_normal(p.w_shape).astype(np.float32)
    refs = [reference(p, Direction.FORWARD, x, w, None) for x in xs]
    errors = []

    def worker(i):
        for _ in range(15):
            errors.append(rel_err(convs[i].forward(xs[i], w), refs[i]))
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(errors) == 30 and max(errors) < 1e-5
