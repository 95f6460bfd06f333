"""Arguments are parsed exactly and sizes that cannot exist are refused up front
(issue 34, M6 and L8): huge paddings, strides and batches failed late (a
MemoryError for 14.6 TiB, an OverflowError, minutes of benchmarking), a 0-d
padding array failed inside NumPy, retime=2.5 ran as 2 and the size string
"9007199254740993" became ...992."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mucudnn as mu
from mucudnn.backends.numpy import HostOutOfMemoryError, NumpyBackend
from mucudnn.optimizer.benchmark import benchmark
from mucudnn.optimizer.dp import optimize_wr
from mucudnn.optimizer.policies import MAX_BATCH, MAX_SIZES, batch_sizes
from mucudnn.problem import MAX_DIM, MAX_TENSOR_BYTES, AlgoPerf, ConvProblem
from mucudnn.units import UNITS, int_tuple, parse_bytes, parse_count


pytestmark = pytest.mark.usefixtures("cache_off")


X = np.ones((1, 1, 3, 3), np.float32)
W = np.ones((1, 1, 3, 3), np.float32)


# -- M6: sizes that cannot exist ---------------------------------------------------------

@pytest.mark.parametrize("kw, name", [
    (dict(padding=10**6), "padding"),          # y would take 14.6 TiB
    (dict(padding=(0, 2**40)), "padding"),
    (dict(stride=2**63), "stride"),            # beyond cuDNN's int64 fields
    (dict(dilation=2**63), "dilation"),
])
def test_huge_geometry_is_refused_up_front_naming_the_argument(kw, name):
    with pytest.raises(mu.InvalidValueError, match=f"^{name}: ") as info:
        mu.conv2d(X, W, backend="numpy", **kw)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("x_shape, name", [
    ((2**63, 1, 1, 1), "x_shape"),             # beyond cuDNN's int64 fields
    ((2**30, 64, 64, 64), "x_shape"),          # 1024 TiB of x
])
def test_huge_shapes_are_refused_up_front(x_shape, name):
    with pytest.raises(mu.InvalidValueError, match=f"^{name}: "):
        ConvProblem(x_shape, (1, x_shape[1], 1, 1))


dims = st.integers(1, 2**64)


@given(st.tuples(dims, st.integers(1, 8), dims, dims), st.integers(1, 8), st.integers(1, 5),
       st.integers(0, 2**64), st.integers(1, 2**64), st.sampled_from(["float16", "float64"]))
def test_every_problem_made_fits_the_bounds(x, k, r, pad, stride, dtype):
    """Either a problem is refused with an InvalidValueError naming an argument,
    or every field fits int64 and every tensor the byte bound (checked here from
    the definition, independently of the code)."""
    try:
        ConvProblem(x, (k, x[1], r, r), padding=pad, stride=stride, dtype=dtype)
    except mu.InvalidValueError as exc:
        assert str(exc).split(":")[0] in ("x_shape", "w_shape", "padding", "stride")
        return
    item = {"float16": 2, "float64": 8}[dtype]
    out = [(h + 2 * pad - r) // stride + 1 for h in x[2:]]
    for shape in (x, (k, x[1], r, r), (x[0], k, *out)):
        assert max(shape) < 2**63
        assert item * math.prod(shape) < MAX_TENSOR_BYTES
    assert max(pad, stride) < MAX_DIM == 2**63


def test_policy_all_is_refused_at_a_huge_batch_before_any_work():
    calls = []

    class Counting(NumpyBackend):
        def find(self, *a, **k):
            calls.append(a)
            return super().find(*a, **k)

    p = ConvProblem((MAX_BATCH, 3, 8, 8), (4, 3, 3, 3))
    with pytest.raises(mu.InvalidValueError, match=f"^policy: 'all' lists {MAX_BATCH} sizes"):
        benchmark(Counting(), p, "forward", "all", 1 << 20, cache=False, progress=False)
    with pytest.raises(mu.InvalidValueError, match="^policy: "):
        mu.optimize(p, "forward", policy="all", backend=Counting())
    assert calls == []
    assert len(batch_sizes("all", MAX_SIZES)) == MAX_SIZES
    with pytest.raises(mu.InvalidValueError, match="explicit list"):
        batch_sizes(range(1, MAX_SIZES + 2), MAX_SIZES + 1)


@pytest.mark.parametrize("batch", [MAX_BATCH + 1, 10**8, 2**31])
@pytest.mark.parametrize("policy", ["all", "powerOfTwo", "fitted", "undivided", [8]])
def test_a_batch_too_large_to_plan_is_refused_before_any_work(batch, policy):
    """Plans are solved over every batch size up to the batch: a batch of 2**31
    allocated 16 GiB of tables under any policy."""
    calls = []

    class Counting(NumpyBackend):
        def find(self, *a, **k):
            calls.append(a)
            return super().find(*a, **k)

    p = ConvProblem((batch, 1, 1, 1), (1, 1, 1, 1))
    with pytest.raises(mu.InvalidValueError, match=f"^batch: {batch} samples are over"):
        mu.optimize(p, "forward", policy=policy, backend=Counting())
    with pytest.raises(mu.InvalidValueError, match="^batch: "):
        optimize_wr({batch: [AlgoPerf(0, 1.0, 0)]}, batch, None, policy)
    assert calls == []


def test_a_host_that_cannot_hold_the_problem_says_so():
    """A problem that fits the bounds but not this host: a MucudnnError that is
    a MemoryError, naming the problem, before any timing."""
    p = ConvProblem((2**19, 1024, 32, 32), (4, 1024, 1, 1))  # x: 2 TiB of float32
    with pytest.raises(HostOutOfMemoryError, match="^problem conv2d:x=524288x1024x32x32") as info:
        NumpyBackend().find(p, "forward", None)
    assert isinstance(info.value, (mu.MucudnnError, MemoryError))


# -- L8: exact parsing ---------------------------------------------------------------

@pytest.mark.parametrize("value, nd, want", [
    (np.array(1), 2, (1, 1)), (np.int64(2), 3, (2, 2, 2)), (np.array([1, 2]), 2, (1, 2)),
    ([np.int32(0), 3], 2, (0, 3)),
])
def test_padding_accepts_0d_integer_arrays_as_scalars(value, nd, want):
    assert int_tuple("padding", value, nd, 0) == want
    layout = "NCHW" if nd == 2 else "NCDHW"
    p = ConvProblem((1, 1) + (4,) * nd, (1, 1) + (3,) * nd, padding=value, layout=layout)
    assert p.padding == want


@pytest.mark.parametrize("value", [np.array(1.0), np.array([[1, 2]]), 1.0, "1", None, True,
                                   np.array(True), [1.5, 2]])
def test_padding_refuses_what_is_not_integers_naming_it(value):
    with pytest.raises(mu.InvalidTypeError, match="^padding: expected an int or a tuple"):
        ConvProblem((1, 1, 4, 4), (1, 1, 3, 3), padding=value)


def test_conv2d_takes_a_0d_padding_array():
    y = mu.conv2d(X, W, padding=np.array(1), backend="numpy")
    assert y.shape == (1, 1, 3, 3) and float(y[0, 0, 1, 1]) == 9.0


@pytest.mark.parametrize("retime", [2.5, "2.5", float("nan"), 2.0**60])
def test_retime_refuses_a_number_that_is_not_a_whole_int(retime):
    p = ConvProblem((2, 1, 3, 3), (1, 1, 3, 3))
    with pytest.raises(mu.InvalidValueError, match="^retime: "):
        benchmark(NumpyBackend(repeats=1), p, "forward", "undivided", 0, cache=False,
                  retime=retime, progress=False)


@pytest.mark.parametrize("value, want", [(2.0, 2), ("3", 3), (np.int16(4), 4), (np.array(5), 5),
                                         ("9007199254740993", 9007199254740993)])
def test_counts_are_exact(value, want):
    assert parse_count(value, "retime") == want


def test_numpy_backend_repeats_are_exact():
    assert NumpyBackend(repeats=np.int64(2)).repeats == 2
    with pytest.raises(mu.InvalidValueError, match="^repeats: "):
        NumpyBackend(repeats=2.5)


def test_a_size_string_is_parsed_exactly():
    assert parse_bytes("9007199254740993") == 9007199254740993
    assert mu.Convolution((1, 1, 3, 3), (1, 1, 3, 3), backend="numpy",
                          workspace_limit="9007199254740993").workspace_limit == 2**53 + 1


@given(st.integers(0, 10**22), st.integers(0, 6), st.sampled_from(sorted(UNITS)))
def test_size_strings_equal_their_exact_value(mantissa, decimals, unit):
    """A size string is its exact decimal value times the unit, rounded down
    (checked with fractions), or refused when that is 2**63 or more."""
    text = str(mantissa)
    if decimals:
        text = text[:-decimals] + "." + text[-decimals:] if len(text) > decimals else \
            "0." + text.zfill(decimals)
    exact = Fraction(mantissa, 10**decimals) * UNITS[unit]
    if exact >= 2**63:
        with pytest.raises(mu.InvalidValueError, match="too large"):
            parse_bytes(text + unit)
    else:
        assert parse_bytes(text + unit) == math.floor(exact)


def test_huge_exponents_cost_nothing():
    with pytest.raises(mu.InvalidValueError, match="too large"):
        parse_bytes("1e999999999")
    assert parse_bytes("1e-999999999") == 0
