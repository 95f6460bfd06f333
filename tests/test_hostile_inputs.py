"""Findings of the hostile-input review (issue 11) in the engine and the API: each of
these failed before its fix. Plus a fuzz suite over the public API: invalid input
gets a ValueError/TypeError naming the argument before any work; valid input equals
the float64 reference."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mucudnn as mu
from mucudnn.backends import BackendBase, get_backend
from mucudnn.exec import problem_from_descriptors
from mucudnn.problem import AlgoPerf, ConvProblem, Direction, MicroBatch, make_plan, \
    packed_strides
from mucudnn.units import parse_bytes

from reference import reference, rel_err

NP = get_backend("numpy")


pytestmark = pytest.mark.usefixtures("cache_off")


def _descs(p, dtypes=("float32", "float32", "float32"), **conv):
    ns = types.SimpleNamespace
    xd = ns(dims=p.x_dims, strides=packed_strides(p.x_dims, p.layout), dtype=dtypes[0])
    wd = ns(dims=p.w_dims, format="NHWC" if p.channels_last else "NCHW", dtype=dtypes[1])
    yd = ns(dims=p.y_dims, strides=packed_strides(p.y_dims, p.layout), dtype=dtypes[2])
    c = dict(padding=p.padding, stride=p.stride, dilation=p.dilation, group_count=p.groups,
             compute_type="float32", math_type=0)
    c.update(conv)
    return xd, wd, ns(**c), yd


P = ConvProblem((4, 6, 7, 7), (8, 3, 3, 3), padding=1, groups=2)


# -- MicroBatchHandle --------------------------------------------------------------------------

def test_handle_refuses_descriptors_of_different_dtypes():
    """x float and y half made cuDNN write twice y's bytes: a device-memory overwrite."""
    with pytest.raises(ValueError, match="data types differ"):
        problem_from_descriptors(*_descs(P, ("float32", "float32", "float16")))


@pytest.mark.parametrize("dt", ["INT8", 3, "CUDNN_DATA_INT32", "FP8_E4M3"])
def test_handle_refuses_integer_and_unknown_dtypes(dt):
    """INT8 used to become float32."""
    with pytest.raises(mu.UnsupportedDtypeError, match="x_desc"):
        problem_from_descriptors(*_descs(P, (dt, dt, dt)))


@pytest.mark.parametrize("conv, match", [
    (dict(padding=(1.5, 1)), "padding|ints"),
    (dict(group_count=0), "groups"),
    (dict(math_type=99), "math type"),
    (dict(stride=(0, 1)), "stride"),
])
def test_handle_refuses_bad_convolution_descriptors(conv, match):
    with pytest.raises((ValueError, TypeError), match=match):
        problem_from_descriptors(*_descs(P, **conv))


def test_handle_refuses_a_negative_workspace_limit():
    with pytest.raises(ValueError, match="workspace_limit"):
        mu.MicroBatchHandle("numpy", workspace_limit=-5)
    with pytest.raises(TypeError, match="workspace_limit"):
        mu.MicroBatchHandle("numpy", workspace_limit=True)


def test_handle_refuses_an_output_overlapping_an_input():
    """dw overlapping x gave a silently wrong result."""
    h = mu.MicroBatchHandle("numpy", policy="undivided")
    xd, wd, cd, yd = _descs(P)
    buf = np.zeros(P.x_shape, np.float32)
    x = buf
    dw = buf.reshape(-1)[:np.prod(P.w_shape)].reshape(P.w_shape)
    dy = np.zeros(P.output_shape, np.float32)
    with pytest.raises(ValueError, match="dw: overlaps x"):
        h.convolution_backward_filter(1.0, xd, x, yd, dy, cd, 0, None, 0, 0.0, wd, dw)


# -- the workspace limit is a bound that holds ------------------------------------------------

class Understating(BackendBase):
    """The NumPy backend whose find() claims every algorithm needs no workspace (a
    tampered or stale cache entry does the same)."""

    name = "understating"

    def __init__(self):
        self.device_name, self.version = "cpu", "1"

    def find(self, problem, direction, workspace_limit):
        return [AlgoPerf(a.algo, a.time_ms / 10 if a.workspace_bytes else a.time_ms, 0,
                         a.math_type) for a in NP.find(problem, direction, 1 << 40)]

    def workspace_size(self, problem, direction, algo, math_type=0):
        return NP.workspace_size(problem, direction, algo, math_type)

    def run(self, *a):
        NP.run(*a)

    def empty(self, shape, dtype):
        return NP.empty(shape, dtype)

    def alloc_workspace(self, n):
        return NP.alloc_workspace(n)


def test_an_understated_workspace_never_runs_over_the_limit():
    be = Understating()
    p = ConvProblem((8, 16, 12, 12), (16, 16, 3, 3), padding=1)
    limit = 1024
    conv = mu.Convolution(p.x_shape, p.w_shape, padding=1, backend=be, workspace_limit=limit,
                          policy="undivided", cache=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(p.x_shape).astype(np.float32)
    w = rng.standard_normal(p.w_shape).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mu.FallbackWarning)
        y = conv.forward(x, w)
    assert conv.plans[Direction.FORWARD].workspace_bytes <= limit
    assert conv.pool.size <= limit or conv.pool.size == 0
    assert rel_err(y, reference(p, "forward", x, w, None)) < 1e-5


def test_a_forced_plan_over_the_limit_is_refused():
    """A 64 MiB limit used to end with a 5 GiB pool when the plan said so."""
    p = ConvProblem((8, 16, 12, 12), (16, 16, 3, 3), padding=1)
    need = NP.workspace_size(p, Direction.FORWARD, 1)
    plan = make_plan([MicroBatch(0, 8, 1, 0, need)], undivided_time_ms=1, workspace_limit=None)
    conv = mu.Convolution(p.x_shape, p.w_shape, padding=1, backend="numpy",
                          workspace_limit=need - 1, plans={"forward": plan}, cache=False)
    x = np.ones(p.x_shape, np.float32)
    w = np.ones(p.w_shape, np.float32)
    with pytest.raises(ValueError, match=r"plans\[forward\].*workspace_limit"):
        conv.forward(x, w)


# -- errors that came late or named nothing ---------------------------------------------------

def test_big_endian_arrays_are_refused_before_any_planning(monkeypatch):
    calls = []
    monkeypatch.setattr(NP, "find", lambda *a: calls.append(a) or [])
    conv = mu.Convolution(P.x_shape, P.w_shape, padding=1, groups=2, backend="numpy",
                          cache=False)
    x = np.ones(P.x_shape, ">f4")
    with pytest.raises(TypeError, match="^x: .*byte order"):
        conv.forward(x, np.ones(P.w_shape, np.float32))
    assert calls == [] and not conv.plans


@pytest.mark.parametrize("text", ["1e400", "inf", "nan", "-1", "64 parsecs", "1e19"])
def test_sizes_out_of_range_are_one_clean_error(text, monkeypatch):
    with pytest.raises(ValueError, match="workspace_limit"):
        parse_bytes(text, "workspace_limit")
    with pytest.raises(ValueError, match="workspace_limit"):
        mu.Convolution(P.x_shape, P.w_shape, groups=2, backend="numpy", workspace_limit=text)
    if text != "inf":  # the variable's documented word for "no limit"
        monkeypatch.setenv("MUCUDNN_WORKSPACE_LIMIT", text)
        with pytest.raises(ValueError, match="MUCUDNN_WORKSPACE_LIMIT"):
            mu.exec.get_pool(NP).effective_limit()


def test_bad_workspace_limit_is_the_same_error_everywhere():
    for bad, kind in ((-1, ValueError), (1.5j, TypeError), (True, TypeError), ("lots", ValueError)):
        for make in (lambda v: mu.Convolution(P.x_shape, P.w_shape, groups=2, backend="numpy",
                                              workspace_limit=v),
                     lambda v: mu.optimize(P, "forward", v, backend="numpy", cache=False),
                     lambda v: mu.MicroBatchHandle("numpy", workspace_limit=v)):
            with pytest.raises(kind, match="workspace_limit"):
                make(bad)


# -- fuzz: the public API --------------------------------------------------------------------

_INTS = st.one_of(st.integers(-3, 9), st.tuples(st.integers(-1, 4), st.integers(-1, 4)),
                  st.just(1.5), st.just("2"), st.none(), st.just(True))
_KW = {"stride": _INTS, "padding": _INTS, "dilation": _INTS, "groups": _INTS}


_CONVOLUTION_ARGS = dict(
       x=st.tuples(*[st.integers(-1, 6)] * 4), w=st.tuples(*[st.integers(-1, 4)] * 4),
       kw=st.fixed_dictionaries({}, optional=_KW),
       dtype=st.sampled_from(["float32", "float64", "int8", "bogus", None]),
       layout=st.sampled_from(["NCHW", "NHWC", "nchw", "NCDHW", 3]),
       limit=st.one_of(st.integers(-5, 1 << 20), st.sampled_from(["64KiB", "x", None, 2.5])),
       policy=st.sampled_from(["powerOfTwo", "all", "undivided", "bogus", (2, 1), (0,), 3]))


def check_convolution(x, w, kw, dtype, layout, limit, policy):
    """Any argument either makes a Convolution that computes the reference, or raises
    ValueError/TypeError naming an argument, before any work (the NumPy backend's find
    is not called on a refused call)."""
    names = ("x_shape", "w_shape", "stride", "padding", "dilation", "groups", "dtype", "layout",
             "workspace_limit", "policy")
    try:
        conv = mu.Convolution(x, w, dtype=dtype if dtype is not None else "float32",
                              layout=layout, workspace_limit=limit, policy=policy,
                              backend="numpy", cache=False, **kw)
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        assert any(msg.startswith(n) or f"{n}:" in msg for n in names), msg
        return
    p = conv.problem
    if p.dtype != "float32" or np.prod(p.x_shape) > 2000:
        return
    rng = np.random.default_rng(0)
    xa = rng.standard_normal(p.x_shape).astype(np.float32)
    wa = rng.standard_normal(p.w_shape).astype(np.float32)
    try:
        y = conv.forward(xa, wa)
    except ValueError as exc:  # e.g. no plan fits a tiny limit: named, never a crash
        assert "workspace" in str(exc) or "plan" in str(exc), exc
        return
    assert rel_err(y, reference(p, "forward", xa, wa, None)) < 1e-5


_CALL_ARGS = dict(args=st.lists(st.sampled_from([
    np.ones((2, 3, 5, 5), np.float32), np.ones((2, 3, 5, 5), np.float64),
    np.ones((4, 3, 3, 3), np.float32), np.ones((2, 4, 3, 3), np.float32),
    np.ones((2, 3, 5, 5), ">f4"), np.ones((3, 5, 5), np.float32), "x", None, 3,
    np.ones((2, 3, 5, 5), np.float32)[:, :, ::2]]), min_size=3, max_size=3),
    alpha=st.sampled_from([1.0, 0.0, -2, float("nan"), "1", None, True]),
    beta=st.sampled_from([0.0, 1.0, float("inf"), "0", None]))


def check_call(args, alpha, beta):
    conv = mu.Convolution((2, 3, 5, 5), (4, 3, 3, 3), backend="numpy", policy="undivided",
                          cache=False)
    # copies: the sampled arrays are shared between examples and y is written in place
    x, w, y = (a.copy() if isinstance(a, np.ndarray) else a for a in args)
    prior = y.copy() if isinstance(y, np.ndarray) else y
    try:
        out = conv.forward(x, w, y, alpha=alpha, beta=beta)
    except (ValueError, TypeError) as exc:
        assert str(exc).split(":")[0] in ("x", "w", "y", "alpha", "beta") or \
            str(exc).startswith(("x is", "w is")), exc
        return
    assert out.shape == (2, 4, 3, 3)
    want = reference(conv.problem, "forward", x, w, prior, float(alpha), float(beta))
    assert rel_err(out, want) < 1e-5


# The fixed CI budget (the hypothesis profile's), and 10,000 examples under -m slow.
test_fuzz_convolution = settings(deadline=None)(given(**_CONVOLUTION_ARGS)(check_convolution))
test_fuzz_calls = settings(deadline=None)(given(**_CALL_ARGS)(check_call))
test_fuzz_convolution_10000 = pytest.mark.slow(settings(deadline=None, max_examples=10_000)(
    given(**_CONVOLUTION_ARGS)(check_convolution)))
test_fuzz_calls_10000 = pytest.mark.slow(settings(deadline=None, max_examples=10_000)(
    given(**_CALL_ARGS)(check_call)))
