"""Helpers shared by the convolution tests (imported like ``reference``).

Two parts: running one direction through a :class:`mucudnn.Convolution` (the
NumPy-backend API tests and the GPU engine tests), and the problems, runners and
torch cross-check of the two cuDNN backend test files (``cudnn``: the legacy
API, ``cudnn-graph``: the backend API). Importing this module needs no GPU.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from hypothesis import strategies as st

import mucudnn.cuda as mc
from mucudnn._cudnn.errors import CudnnError
from mucudnn.api import Convolution
from mucudnn.backends.base import OUTPUT_OF, ConvTensors
from mucudnn.backends.numpy import NumpyAlgo, NumpyBackend
from mucudnn.errors import UnsupportedConfigError
from mucudnn.exec import execute
from mucudnn.problem import AlgoPerf, ConvProblem, Direction, MicroBatch, Plan, from_canonical
from reference import reference, rel_err, to_canonical_array

# -- a backend with non-deterministic algorithms ------------------------------------------------

class AtomicNumpyBackend(NumpyBackend):
    """The NumPy backend as a GPU's Find looks with atomics-based algorithms:
    every algorithm but DIRECT (0) reports ``determinism=0`` and a time 1000x
    shorter than measured (so it wins whenever its workspace fits); DIRECT
    stays deterministic. The results are NumPy's (all exact). Its ``version``
    differs from the plain backend's, so the plan memo keeps them apart."""

    def __init__(self) -> None:
        super().__init__(repeats=1)
        self.version = f"{self.version}+atomics"

    def find(self, problem, direction, workspace_limit):
        out = []
        for a in super().find(problem, direction, workspace_limit):
            direct = a.algo == NumpyAlgo.DIRECT
            out.append(AlgoPerf(a.algo, a.time_ms if direct else a.time_ms / 1000,
                                a.workspace_bytes, a.math_type, 1 if direct else 0))
        return sorted(out, key=lambda a: a.time_ms)


class RewritesFirstBackend(NumpyBackend):
    """NumPy with one rewrite on (``rewrite``: ``"fold"`` or ``"split"``, Notes
    [folded first layers], [split groups]), its rewritten configurations (string
    ids) reported 1000x faster than measured, so the planner picks them
    whenever they fit; a version of its own for the plan memo."""

    def __init__(self, rewrite: str) -> None:
        super().__init__(repeats=1, **{rewrite: True})
        self.version = f"{self.version}+{rewrite}-first"

    def find(self, problem, direction, workspace_limit):
        out = [AlgoPerf(a.algo, a.time_ms / 1000 if isinstance(a.algo, str) else a.time_ms,
                        a.workspace_bytes, a.math_type, a.determinism)
               for a in super().find(problem, direction, workspace_limit)]
        return sorted(out, key=lambda a: a.time_ms)


def check_rewritten_run(be, p, d, algo, need, x, w, y, alpha, beta, tol):
    """One call of ``algo`` (a folded or split configuration) on ``be`` with
    ``need`` bytes of workspace matches the reference within ``tol`` (where
    beta is 0 the output is poisoned with NaN first: it must not be read), and
    one byte less is refused, naming the configuration and ``need``."""
    t = ConvTensors(p, x.copy(), w.copy(), y.copy())
    if beta == 0:
        getattr(t, OUTPUT_OF[d])[...] = np.nan
    be.run(d, algo, 0, t, alpha, beta, be.alloc_workspace(need))
    assert rel_err(getattr(t, OUTPUT_OF[d]), reference(p, d, x, w, y, alpha, beta)) < tol
    with pytest.raises(ValueError, match=f"workspace: {re.escape(algo)} needs {need} bytes"):
        be.run(d, algo, 0, ConvTensors(p, x, w, y.copy()), 1.0, 0.0,
               be.alloc_workspace(need - 1))

# -- random problems --------------------------------------------------------------------------

@st.composite
def problems(draw, batch=None, math="fma"):
    """A small random problem: 2-D or 3-D, either layout, groups, dilation, padding,
    stride, odd sizes."""
    nd = draw(st.sampled_from([2, 2, 2, 3]))
    cl = draw(st.booleans())
    layout = {(2, False): "NCHW", (2, True): "NHWC", (3, False): "NCDHW", (3, True): "NDHWC"}[(nd, cl)]
    n = batch if batch is not None else draw(st.sampled_from([1, 2, 5, 8, 13]))
    big = n > 16
    groups = draw(st.integers(1, 1 if big else 2))
    cg = draw(st.integers(1, 4 if big else 8))
    kg = draw(st.integers(1, 4 if big else 8))
    r = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dil = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    pad = tuple(draw(st.integers(0, 2)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    smax = (6 if big else 10) if nd == 2 else 5
    spatial = []
    for ri, di, pi in zip(r, dil, pad):
        lo = max(1, di * (ri - 1) + 1 - 2 * pi)
        spatial.append(draw(st.integers(lo, max(lo, smax))))
    return ConvProblem(from_canonical((n, groups * cg) + tuple(spatial), layout),
                       from_canonical((groups * kg, cg) + r, layout), stride=stride,
                       padding=pad, dilation=dil, groups=groups, layout=layout, math=math)


@st.composite
def grouped_problems(draw, groups, batch, extra=5):
    """A small float64 problem of ``groups`` (drawn from that list) of a few
    channels each, batch ``batch`` (an int, or a strategy drawn from): either
    layout, 2-D or 3-D, strides, paddings, dilations; spatial sizes up to
    ``extra`` (2 in 3-D) past the least the kernel needs."""
    nd = draw(st.sampled_from([2, 2, 3]))
    layout = draw(st.sampled_from(["NCHW", "NHWC"] if nd == 2 else ["NCDHW", "NDHWC"]))
    g = draw(st.sampled_from(groups))
    cg, kg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n = batch if isinstance(batch, int) else draw(batch)
    ks = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    dil = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    pad = tuple(draw(st.integers(0, k - 1)) for k in ks)
    least = [max(1, d * (k - 1) + 1 - 2 * p) for k, d, p in zip(ks, dil, pad)]
    sp = tuple(draw(st.integers(lo, lo + (extra if nd == 2 else 2))) for lo in least)
    x = (n, g * cg) + sp
    w = (g * kg, cg) + ks
    if layout in ("NHWC", "NDHWC"):
        x, w = (x[0],) + x[2:] + (x[1],), (w[0],) + w[2:] + (w[1],)
    return ConvProblem(x, w, stride=stride, padding=pad, dilation=dil, groups=g,
                       layout=layout, math="fma", dtype="float64")


def check_mixed_plan(be, p, d, sized_algos, alpha, beta, seed, tol):
    """A plan of ``sized_algos`` ((rows, algo) in order, summing to ``p``'s
    batch) run by ``be`` gives the whole batch's float64 reference within
    ``tol``; backward-filter accumulates over its micro-batches."""
    mbs, off = [], 0
    for s, a in sized_algos:
        mbs.append(MicroBatch(off, s, a, 0, be.workspace_size(p.with_batch(s), d, a)))
        off += s
    ws = max(m.workspace_bytes for m in mbs)
    plan = Plan(p, d, tuple(mbs), ws, 0.0, 0.0, None)
    rng = np.random.default_rng(seed)
    x, w, y = (rng.standard_normal(shape).astype(np.dtype(p.dtype))
               for shape in (p.x_shape, p.w_shape, p.output_shape))
    t = ConvTensors(p, x.copy(), w.copy(), y.copy())
    execute(plan, be, t, alpha, beta, be.alloc_workspace(ws))
    assert rel_err(getattr(t, OUTPUT_OF[d]), reference(p, d, x, w, y, alpha, beta)) < tol


def composition(draw, n, parts=4):
    """Sizes (at most ``parts``) that sum to ``n``."""
    out, left = [], n
    while left:
        s = left if len(out) == parts - 1 else draw(st.integers(1, left))
        out.append(s)
        left -= s
    return out


# -- one direction through a Convolution -------------------------------------------------------


def normal_tensors(p, rng):
    """x, w and y of ``p``: standard normal float32 in the problem's layout."""
    return (rng.standard_normal(p.x_shape).astype(np.float32),
            rng.standard_normal(p.w_shape).astype(np.float32),
            rng.standard_normal(p.output_shape).astype(np.float32))


def convolution_for(p, **kw):
    """A Convolution with ``p``'s geometry, layout and math (``backend`` among ``kw``)."""
    return Convolution(p.x_shape, p.w_shape, stride=p.stride, padding=p.padding,
                       dilation=p.dilation, groups=p.groups, layout=p.layout, math=p.math, **kw)


def run_direction(conv, d, x, w, y, alpha=1.0, beta=0.0, poison=False, *,
                  assert_returns_out=True):
    """Run ``d`` with the written tensor pre-filled (or NaN-poisoned when beta == 0):
    NumPy in, NumPy out. With ``assert_returns_out`` the call must return that tensor."""
    out = {Direction.FORWARD: y, Direction.BACKWARD_DATA: x, Direction.BACKWARD_FILTER: w}[d].copy()
    if poison and beta == 0:
        out[...] = np.nan
    if d is Direction.FORWARD:
        r = conv.forward(x, w, out, alpha=alpha, beta=beta)
    elif d is Direction.BACKWARD_DATA:
        r = conv.backward_data(y, w, out, alpha=alpha, beta=beta)
    else:
        r = conv.backward_filter(x, y, out, alpha=alpha, beta=beta)
    if assert_returns_out:
        assert r is out
    return r


# -- the cuDNN backends on a GPU (test_cudnn_backend_gpu.py, test_cudnn_graph_gpu.py) -----------

MiB = 1 << 20
DIRECTIONS = list(Direction)

# name -> (x shape, w shape, options); shapes in the layout's own order
CASES = {
    "2d-nchw": ((4, 16, 20, 20), (32, 16, 3, 3), dict(padding=1)),
    "2d-nhwc-stride2": ((3, 17, 19, 16), (24, 3, 3, 16), dict(padding=1, stride=2, layout="NHWC")),
    "2d-grouped-dilated": ((2, 24, 15, 15), (12, 6, 3, 3), dict(padding=2, dilation=2, groups=4)),
    "2d-nhwc-grouped-5x5": ((2, 12, 12, 32), (16, 5, 5, 8),
                            dict(padding=2, stride=(1, 2), dilation=(2, 1), groups=4,
                                 layout="NHWC")),
    "2d-1x1-stride2": ((4, 8, 9, 11), (16, 8, 1, 1), dict(stride=2)),
    "2d-7x7-asym": ((2, 3, 23, 23), (8, 3, 7, 7), dict(stride=3, padding=(3, 1))),
    "3d-ncdhw": ((2, 8, 6, 7, 8), (8, 8, 3, 3, 3), dict(padding=1, stride=(1, 2, 1),
                                                       layout="NCDHW")),
    "3d-ndhwc-grouped-dilated": ((2, 6, 7, 8, 8), (8, 3, 3, 3, 4),
                                 dict(padding=(1, 2, 1), dilation=(1, 2, 1), groups=2,
                                      layout="NDHWC")),
}
# (dtype, math, tolerance vs the float64 reference)
CONFIGS = {
    "f32-fma": ("float32", "fma", 1e-5),
    "f32-default": ("float32", "default", 5e-3),
    "f16-default": ("float16", "default", 1e-2),
}


def problem(case, dtype="float32", math="default"):
    x, w, opts = CASES[case]
    return ConvProblem(x, w, dtype=dtype, math=math, **opts)


def backend_fixture(backend_class, find_limit, **options):
    """A module-scoped fixture: one ``backend_class(find_workspace_limit=find_limit,
    **options)``, closed after the module."""
    @pytest.fixture(scope="module")
    def be():
        b = backend_class(find_workspace_limit=find_limit, **options)
        yield b
        b.close()
    return be


#: Every backend, each a pytest param (the GPU ones carry the gpu marker).
BACKENDS = [pytest.param("numpy", id="numpy"),
            pytest.param("cudnn", id="cudnn", marks=pytest.mark.gpu),
            pytest.param("cudnn-graph", id="cudnn-graph", marks=pytest.mark.gpu)]


def make_backend(name, find_limit):
    """A fresh backend of ``name`` (GPU ones with a Find workspace limit)."""
    if name == "numpy":
        from mucudnn.backends import get_backend
        return get_backend("numpy")
    from mucudnn.backends import CudnnBackend, CudnnGraphBackend
    cls = CudnnBackend if name == "cudnn" else CudnnGraphBackend
    return cls(find_workspace_limit=find_limit)


def transform_based(be, p, direction, algo):
    """Whether ``algo`` is FFT- or Winograd-based (they round differently)."""
    from mucudnn._cudnn import (ConvolutionBwdDataAlgo, ConvolutionBwdFilterAlgo,
                                ConvolutionFwdAlgo)
    from mucudnn._cudnn.enums import BackendNumericalNote as Note
    if be.name == "numpy":
        return int(algo) == 2
    if be.name == "cudnn":
        names = {"FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"}
        enum = {Direction.FORWARD: ConvolutionFwdAlgo, Direction.BACKWARD_DATA:
                ConvolutionBwdDataAlgo, Direction.BACKWARD_FILTER: ConvolutionBwdFilterAlgo}
        return enum[direction](int(algo)).name in names
    notes = {i.id: set(i.numerical_notes) for i in be.engine_configs(p, direction)}
    transform = {int(Note.FFT), int(Note.WINOGRAD), int(Note.WINOGRAD_TILE_4x4),
                 int(Note.WINOGRAD_TILE_6x6), int(Note.WINOGRAD_TILE_13x13)}
    return bool(notes.get(algo, set()) & transform)


def tolerance(be, p, direction, algo, tol):
    """``tol``, widened to 1e-4 for transform-based algorithms in float32 FMA math."""
    if p.dtype == "float32" and p.math == "fma" and transform_based(be, p, direction, algo):
        return max(tol, 1e-4)
    return tol


class FindMemo:
    """``be.find`` with a fixed workspace limit, memoised for one test module (Find is
    the slow part of these tests): ``_find = FindMemo(FIND_LIMIT)``, then
    ``_find(be, p, direction)``."""

    def __init__(self, limit):
        self.limit = limit
        self._found: dict = {}

    def __call__(self, be, p, direction):
        key = (be.name, id(be), p.key(), str(direction), self.limit)
        if key not in self._found:
            self._found[key] = be.find(p, direction, self.limit)
        return self._found[key]


def uniform_tensors(p, rng, via_float32=False):
    """x, w and y of ``p``: uniform in [-1, 1), in ``p.dtype``. With ``via_float32`` the
    float64 draws are rounded to float32 first (the cudnn-graph tests: float32-exact data
    in every dtype, bfloat16 included)."""
    dt = mc.normalize_dtype(p.dtype)

    def r(shape):
        a = rng.uniform(-1, 1, size=shape)
        return (a.astype(np.float32) if via_float32 else a).astype(dt)
    return r(p.x_shape), r(p.w_shape), r(p.output_shape)


def poison(be, a):
    """Fill an array of ``be``'s kind with NaN (asynchronously on a GPU backend)."""
    if be.is_host:
        a[...] = np.nan
    else:
        a.fill_nan(stream=be.stream)


def release(*arrays):
    """Free device arrays now (host arrays need nothing)."""
    for a in arrays:
        close = getattr(a, "close", None)
        if close is not None:
            close()


def run_algo(be, p, direction, algo, math_type, hx, hw, hy, alpha=1.0, beta=0.0,
             workspace=None):
    """Run one algorithm (NumPy, legacy API) or engine config (``cudnn-graph``) on fresh
    copies; the written tensor is NaN-poisoned when beta == 0. Returns the written
    tensor on the host."""
    x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
    out = {"x": x, "w": w, "y": y}[OUTPUT_OF[direction]]
    if beta == 0:
        poison(be, out)
    # what this call needs (a graph plan's workspace depends on beta, Note [beta and
    # workspace]); for the NumPy and legacy backends it is workspace_size()
    need = be.bind(direction, algo, math_type, p, 0, p.batch, alpha, beta,
                   (16, 16, 16)).workspace_bytes
    ws = workspace if workspace is not None else (be.alloc_workspace(need) if need > 0 else None)
    be.run(direction, algo, math_type, ConvTensors(p, x, w, y), alpha, beta, ws)
    result = be.to_host(out)
    release(x, w, y, *(() if workspace is not None or ws is None else (ws,)))
    return result


def run_plan(be, p, direction, plan, hx, hw, hy, alpha=1.0, beta=0.0):
    """``plan`` executed on ``be`` over device copies of the host tensors, with
    its workspace; the written tensor on the host, in float64."""
    x, w, y = be.from_host(hx), be.from_host(hw), be.from_host(hy)
    ws = be.alloc_workspace(plan.workspace_bytes)
    try:
        t = ConvTensors(p, x, w, y)
        execute(plan, be, t, alpha, beta, ws)
        return be.to_host(getattr(t, OUTPUT_OF[direction])).astype(np.float64)
    finally:
        release(x, w, y, ws)


def check_micro_batched(be, p, direction, algos, host, tol):
    """Each of ``algos`` run as three micro-batches of ``p`` (4 + 2 + 2 rows, the
    later backward-filter ones accumulating) with alpha, beta (1, 0) and
    (0.5, 0.75) matches the float64 reference within ``tol``. A configuration
    cuDNN refuses at a smaller size, or for those scalars, is skipped (the
    engine would re-plan). Returns how many runs were compared, and each
    run's workspace need at 4 rows by id."""
    hx, hw, hy = host
    ran, needs4 = 0, {}
    for a in algos:
        try:
            needs = [be.workspace_size(p.with_batch(size), direction, a) for size in (4, 2, 2)]
        except (CudnnError, UnsupportedConfigError):
            continue
        needs4[a] = needs[0]
        mbs, off = [], 0
        for size, need in zip((4, 2, 2), needs):
            mbs.append(MicroBatch(off, size, a, 0, need))
            off += size
        plan = Plan(p, direction, tuple(mbs), max(needs), 0.0, 0.0, None)
        for alpha, beta in ((1.0, 0.0), (0.5, 0.75)):
            try:
                got = run_plan(be, p, direction, plan, hx, hw, hy, alpha, beta)
            except UnsupportedConfigError:
                continue
            want = reference(p, direction, hx.astype(np.float64), hw.astype(np.float64),
                             hy.astype(np.float64), alpha, beta)
            assert rel_err(got, want) < tol, (a, alpha, beta)
            ran += 1
    return ran, needs4


def torch_or_skip():
    torch = pytest.importorskip("torch")  # noqa: F811
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


def torch_result(p, direction, hx, hw, hy, math, via_float32=False):
    """The same convolution computed by torch on the device, canonical layout, float64.
    With ``via_float32`` the host arrays go to torch as float32 and are cast to
    ``p.dtype`` on the device (torch.from_numpy takes no bfloat16)."""
    torch = torch_or_skip()
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = math != "fma"  # TF32 only where we allow it too
    try:
        return _torch_conv(torch, p, direction, hx, hw, hy, via_float32)
    finally:
        torch.backends.cudnn.allow_tf32 = saved


def _torch_conv(torch, p, direction, hx, hw, hy, via_float32):
    import torch.nn.functional as F
    from torch.nn import grad as G

    dev = torch.device("cuda", mc.current_device())
    if via_float32:
        tdt = {"float32": torch.float32, "float16": torch.float16,
               "bfloat16": torch.bfloat16}[p.dtype]

    def t(a):
        c = np.ascontiguousarray(to_canonical_array(a, p.layout))
        if via_float32:
            return torch.from_numpy(c.astype(np.float32)).to(dev).to(tdt)
        return torch.from_numpy(c).to(dev)

    x, w, dy = t(hx), t(hw), t(hy)
    kw = dict(stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups)
    conv = F.conv2d if p.nd == 2 else F.conv3d
    if direction is Direction.FORWARD:
        r = conv(x, w, **kw)
    elif direction is Direction.BACKWARD_DATA:
        r = (G.conv2d_input if p.nd == 2 else G.conv3d_input)(p.x_dims, w, dy, **kw)
    else:
        r = (G.conv2d_weight if p.nd == 2 else G.conv3d_weight)(x, p.w_dims, dy, **kw)
    torch.cuda.synchronize()
    return r.double().cpu().numpy()


class FakeRawTransform:
    """A stand-in for a raw ``cudnnTransformTensor``/``cudnnTransformTensorEx``
    binding (Note [raw bindings]): records each call's arguments, with the
    float scalars at positions ``scalars`` (alpha, beta) read back through
    their pointers, and returns :attr:`status`."""

    #: an object a transform takes as its cuDNN handle (``.handle``: the pointer passed)
    HANDLE = type("FakeHandle", (), {"handle": 77})()

    def __init__(self, scalars: tuple[int, int]) -> None:
        self.scalars = scalars
        self.calls: list[tuple] = []
        self.status = 0

    def __call__(self, *args):
        args = list(args)
        for i in self.scalars:
            args[i] = ctypes.cast(args[i], ctypes.POINTER(ctypes.c_float)).contents.value
        self.calls.append(tuple(args))
        return self.status
