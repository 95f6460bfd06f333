"""ConvProblem validation and geometry; Direction; AlgoPerf/MicroBatch/Plan values and JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mucudnn.problem import (
    AlgoPerf, ConvProblem, Direction, MicroBatch, Plan, from_canonical, make_plan,
    packed_strides, to_canonical)

# -- validation --------------------------------------------------------------------------

INVALID = [
    # (x_shape, w_shape, kwargs, exception, the argument the message must name)
    ((0, 3, 5, 5), (4, 3, 3, 3), {}, ValueError, "x_shape"),
    ((2, 3, -5, 5), (4, 3, 3, 3), {}, ValueError, "x_shape"),
    ((2, 3, 5, 5), (4, 0, 3, 3), {}, ValueError, "w_shape"),
    ((2, 3, 5, 5), (-4, 3, 3, 3), {}, ValueError, "w_shape"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"stride": 0}, ValueError, "stride"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"stride": (1, -1)}, ValueError, "stride"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"dilation": 0}, ValueError, "dilation"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"padding": -1}, ValueError, "padding"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"groups": 0}, ValueError, "groups"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"groups": -3}, ValueError, "groups"),
    # rank mismatch between x, w and the layout
    ((2, 3, 5, 5, 5), (4, 3, 3, 3), {}, ValueError, "x_shape"),
    ((2, 3, 5, 5), (4, 3, 3, 3, 3), {}, ValueError, "w_shape"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"layout": "NCDHW"}, ValueError, "x_shape"),
    ((2, 3, 5, 5, 5), (4, 3, 3, 3), {"layout": "NDHWC"}, ValueError, "w_shape"),
    ((2, 3, 5), (4, 3, 3), {}, ValueError, "x_shape"),
    # per-dimension tuples of the wrong length
    ((2, 3, 5, 5), (4, 3, 3, 3), {"stride": (1, 1, 1)}, ValueError, "stride"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"padding": (1,)}, ValueError, "padding"),
    ((2, 3, 5, 5, 5), (4, 3, 3, 3, 3), {"layout": "NCDHW", "dilation": (1, 2)},
     ValueError, "dilation"),
    # input channels != groups x filter channels
    ((2, 3, 5, 5), (4, 2, 3, 3), {}, ValueError, "channels"),
    ((2, 4, 5, 5), (4, 4, 3, 3), {"groups": 2}, ValueError, "channels"),
    ((2, 5, 5, 3), (4, 3, 3, 2), {"layout": "NHWC"}, ValueError, "channels"),
    # output channels not divisible by groups
    ((2, 4, 5, 5), (5, 2, 3, 3), {"groups": 2}, ValueError, "divisible"),
    ((2, 6, 5, 5), (4, 2, 3, 3), {"groups": 3}, ValueError, "divisible"),
    # output size < 1
    ((2, 3, 2, 2), (4, 3, 3, 3), {}, ValueError, "output size"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"dilation": 3}, ValueError, "output size"),
    ((2, 3, 9, 2), (4, 3, 3, 3), {"padding": (0, 0)}, ValueError, "output size"),
    # unknown dtype, layout, math mode, compute type
    ((2, 3, 5, 5), (4, 3, 3, 3), {"dtype": "int8"}, ValueError, "dtype"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"dtype": "float128"}, ValueError, "dtype"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"layout": "NCWH"}, ValueError, "layout"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"layout": 4}, ValueError, "layout"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"math": "fast"}, ValueError, "math"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"math": None}, ValueError, "math"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"compute_type": "int32"}, ValueError, "compute_type"),
    # wrong types
    (5, (4, 3, 3, 3), {}, TypeError, "x_shape"),
    ((2, 3, 5.5, 5), (4, 3, 3, 3), {}, TypeError, "x_shape"),
    ((2, 3, 5, 5), (4, 3, "3", 3), {}, TypeError, "w_shape"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"groups": 1.0}, TypeError, "groups"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"groups": True}, TypeError, "groups"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"stride": True}, TypeError, "stride"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"padding": 1.5}, TypeError, "padding"),
]


@pytest.mark.parametrize("x, w, kw, exc, name", INVALID,
                         ids=[f"{i}-{c[4]}" for i, c in enumerate(INVALID)])
def test_invalid_problem_names_the_argument(x, w, kw, exc, name):
    with pytest.raises(exc, match=name):
        ConvProblem(x, w, **kw)


def test_invalid_messages_say_what_was_expected():
    with pytest.raises(ValueError, match=r"expected.*1 2|expected 2 values"):
        ConvProblem((2, 3, 5, 5), (4, 3, 3, 3), stride=(1, 1, 1))
    with pytest.raises(ValueError, match="expected one of"):
        ConvProblem((2, 3, 5, 5), (4, 3, 3, 3), dtype="int8")
    with pytest.raises(ValueError, match="expected filter channels 3"):
        ConvProblem((2, 3, 5, 5), (4, 2, 3, 3))


def test_keyword_only_geometry():
    with pytest.raises(TypeError):
        ConvProblem((2, 3, 5, 5), (4, 3, 3, 3), 1)  # type: ignore[misc]


# -- normalisation -------------------------------------------------------------------------

def test_ints_expand_to_tuples_and_names_normalise():
    p = ConvProblem([2, 3, 5, 5], [4, 3, 3, 3], stride=2, padding=(1, 0), dilation=np.int64(1),
                    layout="nchw", math="FMA", dtype=np.float32)
    assert p.x_shape == (2, 3, 5, 5) and isinstance(p.x_shape, tuple)
    assert p.stride == (2, 2) and p.padding == (1, 0) and p.dilation == (1, 1)
    assert p.layout == "NCHW" and p.math == "fma" and p.dtype == "float32"
    assert p.compute_type == "float32"
    assert ConvProblem((2, 3, 5, 5), (4, 3, 3, 3), dtype=np.dtype("float64")).compute_type == "float64"
    for alias, name in [("half", "float16"), ("float", "float32"), ("double", "float64"),
                        ("bf16", "bfloat16"), (np.float16, "float16")]:
        assert ConvProblem((2, 3, 5, 5), (4, 3, 3, 3), dtype=alias).dtype == name
    assert ConvProblem((2, 3, 5, 5), (4, 3, 3, 3), dtype="float16").compute_type == "float32"


def test_direction_parse():
    assert Direction.parse("fwd") is Direction.FORWARD
    assert Direction.parse("backward-data") is Direction.BACKWARD_DATA
    assert Direction.parse("WGRAD") is Direction.BACKWARD_FILTER
    assert Direction.parse(Direction.FORWARD) is Direction.FORWARD
    assert str(Direction.BACKWARD_FILTER) == "backward_filter"
    with pytest.raises(ValueError, match="direction"):
        Direction.parse("sideways")


# -- geometry ---------------------------------------------------------------------------------

def _out_len_by_counting(h: int, r: int, pad: int, s: int, d: int) -> int:
    """Output positions counted one by one: window starts whose last tap stays in the padded input."""
    return sum(1 for start in range(0, h + 2 * pad, s) if start + (r - 1) * d < h + 2 * pad)


def test_output_shape_examples():
    assert ConvProblem((256, 96, 27, 27), (256, 96, 5, 5), padding=2).output_shape == (256, 256, 27, 27)
    assert ConvProblem((8, 3, 224, 224), (64, 3, 7, 7), stride=2, padding=3).output_shape == (8, 64, 112, 112)
    assert ConvProblem((8, 224, 224, 3), (64, 7, 7, 3), stride=2, padding=3,
                       layout="NHWC").output_shape == (8, 112, 112, 64)
    p3 = ConvProblem((2, 4, 8, 9, 10), (6, 2, 3, 3, 3), groups=2, stride=(1, 2, 3),
                     padding=(1, 0, 2), dilation=(1, 1, 2), layout="NCDHW")
    assert p3.output_shape == (2, 6, 8, 4, 4)
    assert p3.nd == 3 and p3.y_dims == p3.output_shape
    p3c = ConvProblem((2, 8, 9, 10, 4), (6, 3, 3, 3, 2), groups=2, stride=(1, 2, 3),
                      padding=(1, 0, 2), dilation=(1, 1, 2), layout="NDHWC")
    assert p3c.output_shape == (2, 8, 4, 4, 6) and p3c.y_dims == p3.y_dims


@st.composite
def problems(draw):
    nd = draw(st.sampled_from([2, 3]))
    layout = draw(st.sampled_from(["NCHW", "NHWC"] if nd == 2 else ["NCDHW", "NDHWC"]))
    g = draw(st.integers(1, 3))
    c, k = g * draw(st.integers(1, 3)), g * draw(st.integers(1, 3))
    r = draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd))
    s = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    d = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    pad = draw(st.lists(st.integers(0, 3), min_size=nd, max_size=nd))
    h = [draw(st.integers(max(1, (ri - 1) * di + 1 - 2 * pi), (ri - 1) * di + 8))
         for ri, di, pi in zip(r, d, pad)]
    n = draw(st.integers(1, 5))
    x = from_canonical((n, c) + tuple(h), layout)
    w = from_canonical((k, c // g) + tuple(r), layout)
    return ConvProblem(x, w, stride=tuple(s), padding=tuple(pad), dilation=tuple(d), groups=g,
                       layout=layout), (n, k) + tuple(
        _out_len_by_counting(*a) for a in zip(h, r, pad, s, d))


@given(problems())
def test_output_shape_matches_counting(case):
    p, y_canonical = case
    assert p.y_dims == y_canonical
    assert p.output_shape == from_canonical(y_canonical, p.layout)
    assert to_canonical(p.output_shape, p.layout) == y_canonical
    assert p.shape_of("y") == p.output_shape and p.shape_of("x") == p.x_shape
    assert p.flops() == 2 * math.prod(y_canonical) * math.prod(p.w_dims[1:])


def test_canonical_helpers():
    assert to_canonical((2, 5, 6, 3), "NHWC") == (2, 3, 5, 6)
    assert from_canonical((2, 3, 5, 6), "NHWC") == (2, 5, 6, 3)
    assert to_canonical((2, 3, 5, 6), "NCHW") == (2, 3, 5, 6)
    assert to_canonical((2, 4, 5, 6, 3), "NDHWC") == (2, 3, 4, 5, 6)
    assert packed_strides((2, 3, 4, 5), "NCHW") == (60, 20, 5, 1)
    assert packed_strides((2, 3, 4, 5), "NHWC") == (60, 1, 15, 3)
    a = np.empty((2, 4, 5, 3))  # NHWC of canonical (2, 3, 4, 5)
    assert packed_strides((2, 3, 4, 5), "NHWC") == tuple(
        s // a.itemsize for s in np.moveaxis(a, -1, 1).strides)


# -- with_batch, key, hashing ---------------------------------------------------------------

def test_with_batch():
    p = ConvProblem((8, 16, 10, 10), (12, 4, 3, 3), groups=4, stride=2, padding=1, dilation=2,
                    dtype="float16", layout="NCHW", math="fma")
    q = p.with_batch(3)
    assert q.x_shape == (3, 16, 10, 10) and q.batch == 3
    assert q.output_shape == (3,) + p.output_shape[1:]
    assert dataclasses.replace(q, x_shape=p.x_shape) == p
    assert (q.w_shape, q.stride, q.padding, q.dilation, q.groups, q.dtype, q.layout, q.math) == \
        (p.w_shape, p.stride, p.padding, p.dilation, p.groups, p.dtype, p.layout, p.math)
    assert p.with_batch(8) == p and p.with_batch(np.int64(3)) == q
    n = ConvProblem((8, 10, 10, 16), (12, 3, 3, 4), groups=4, layout="NHWC")
    assert n.with_batch(5).x_shape == (5, 10, 10, 16)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n"):
            p.with_batch(bad)


BASE = dict(x_shape=(8, 16, 10, 10), w_shape=(12, 8, 3, 3), stride=1, padding=1, dilation=1,
            groups=2, dtype="float32", layout="NCHW", math="default")
VARIANTS = {
    "batch": dict(x_shape=(4, 16, 10, 10)),
    "x_spatial": dict(x_shape=(8, 16, 11, 10)),
    "x_channels": dict(x_shape=(8, 24, 10, 10), w_shape=(12, 12, 3, 3)),
    "k": dict(w_shape=(14, 8, 3, 3)),
    "filter": dict(w_shape=(12, 8, 3, 1)),
    "stride": dict(stride=(1, 2)),
    "padding": dict(padding=(1, 0)),
    "dilation": dict(dilation=(2, 1)),
    "groups": dict(w_shape=(12, 4, 3, 3), groups=4),
    "dtype": dict(dtype="float16"),
    "dtype64": dict(dtype="float64"),
    "layout": dict(x_shape=(8, 10, 10, 16), w_shape=(12, 3, 3, 8), layout="NHWC"),
    "math": dict(math="fma"),
    "compute_type": dict(dtype="float16", compute_type="float16"),
}


def _make(**kw):
    d = dict(BASE, **kw)
    return ConvProblem(d.pop("x_shape"), d.pop("w_shape"), **d)


def test_key_is_stable_and_exact():
    assert ConvProblem((8, 3, 5, 5), (4, 3, 3, 3)).key() == (
        "conv2d:x=8x3x5x5:w=4x3x3x3:stride=1x1:pad=0x0:dil=1x1:g=1:float32:acc=float32"
        ":NCHW:math=default")
    a = ConvProblem((8, 3, 5, 5), (4, 3, 3, 3), stride=(1, 1), padding=0, layout="nchw",
                    dtype=np.float32)
    b = ConvProblem([8, 3, 5, 5], [4, 3, 3, 3])
    assert a.key() == b.key() and a == b and hash(a) == hash(b)
    p3 = ConvProblem((2, 3, 4, 5, 6), (4, 3, 1, 2, 3), layout="NCDHW")
    assert p3.key().startswith("conv3d:x=2x3x4x5x6:w=4x3x1x2x3:stride=1x1x1")


def test_key_differs_for_every_field():
    keys = {"base": _make().key()}
    for name, kw in VARIANTS.items():
        keys[name] = _make(**kw).key()
    assert len(set(keys.values())) == len(keys), keys
    problems_ = [_make()] + [_make(**kw) for kw in VARIANTS.values()]
    assert len(set(problems_)) == len(problems_)
    # every dataclass field is covered by some variant
    changed = set()
    base = _make()
    for kw in VARIANTS.values():
        v = _make(**kw)
        changed |= {f.name for f in dataclasses.fields(ConvProblem)
                    if getattr(v, f.name) != getattr(base, f.name)}
    assert changed == {f.name for f in dataclasses.fields(ConvProblem)}


def test_hashable_and_immutable():
    p = _make()
    assert {p: 1}[_make()] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.groups = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x_shape = (1, 16, 10, 10)  # type: ignore[misc]
    assert isinstance(p.stride, tuple) and isinstance(p.w_shape, tuple)


def test_problem_dict_round_trip():
    for kw in [{}] + list(VARIANTS.values()):
        p = _make(**kw)
        q = ConvProblem.from_dict(json.loads(json.dumps(p.to_dict())))
        assert q == p and q.key() == p.key()


@given(problems(), st.sampled_from(["float32", "float16", "bfloat16", "float64"]),
       st.sampled_from(["default", "tensor_op"]))
def test_from_key_inverts_key(case, dtype, math_mode):
    p = dataclasses.replace(case[0], dtype=dtype, math=math_mode,
                            compute_type="float64" if dtype == "float64" else "float32")
    q = ConvProblem.from_key(p.key())
    assert q == p and q.key() == p.key()


def test_from_key_round_trips_every_variant_and_names_the_argument():
    for kw in [{}] + list(VARIANTS.values()):
        p = _make(**kw)
        assert ConvProblem.from_key(p.key()) == p
    good = _make().key()
    bad = [good.replace("conv2d", "pool2d"), good.replace(":g=", ":groups="),
           good.replace("math=", "m="), good.replace("x=", "x=8xA"), good + ":extra",
           good.replace("acc=", "")]
    for key in bad:
        with pytest.raises(ValueError, match=r"key: expected 'conv<N>d:x="):
            ConvProblem.from_key(key)
    with pytest.raises(TypeError, match="key: expected a str"):
        ConvProblem.from_key(None)  # type: ignore[arg-type]
    # a well-formed key of an invalid problem: the constructor names the field
    with pytest.raises(ValueError, match="groups"):
        ConvProblem.from_key(re.sub(r":g=\d+:", ":g=0:", good))


# -- AlgoPerf, MicroBatch, Plan ------------------------------------------------------------

def test_algoperf_round_trip():
    for a in [AlgoPerf(algo=1, time_ms=0.37, workspace_bytes=109 << 20),
              AlgoPerf(algo="eng3:k2=1", time_ms=1.5, workspace_bytes=0, math_type="tensor_op",
                       determinism=1)]:
        assert AlgoPerf.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    a = AlgoPerf(1, 0.5, 10)
    assert a.math_type == 0 and a.determinism is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.time_ms = 1.0  # type: ignore[misc]


def _plan(problem=None, direction=None, undivided=0.9, policy="powerOfTwo"):
    mbs = [MicroBatch(0, 128, 1, 0, 56 << 20, 0.2), MicroBatch(128, 100, 0, 0, 0, 0.3),
           MicroBatch(228, 28, 2, 1, 1 << 20, 0.1)]
    return make_plan(mbs, undivided_time_ms=undivided, workspace_limit=64 << 20, policy=policy,
                     problem=problem, direction=direction)


def test_plan_values():
    plan = _plan()
    assert plan.batch == 256
    assert plan.workspace_bytes == 56 << 20
    assert plan.time_ms == pytest.approx(0.6)
    assert plan.speedup == pytest.approx(1.5)
    assert plan.describe() == "128 + 100 + 28"
    even = make_plan([MicroBatch(0, 128, 1), MicroBatch(128, 128, 1)], undivided_time_ms=1.0,
                     workspace_limit=None)
    assert even.describe() == "2 x 128" and even.workspace_bytes == 0


def test_plan_json_round_trip():
    p = ConvProblem((256, 96, 27, 27), (256, 96, 5, 5), padding=2)
    for plan in [_plan(), _plan(p, Direction.BACKWARD_FILTER),
                 _plan(p.with_batch(4), Direction.FORWARD, undivided=float("inf"), policy=None),
                 _plan(policy="all")]:
        s = plan.to_json()
        json.loads(s)  # strict JSON (no Infinity)
        assert "Infinity" not in s
        back = Plan.from_json(s)
        assert back == plan
        assert back.problem == plan.problem and back.direction is plan.direction
        assert back.micro_batches == plan.micro_batches
        assert back.undivided_time_ms == plan.undivided_time_ms
    ctx = _plan().with_context(p, Direction.FORWARD)
    assert ctx.problem == p and ctx.direction is Direction.FORWARD


@pytest.mark.parametrize("kw", [dict(stride=(2.9, 2.9)), dict(padding=(0.5, 0.5)),
                                dict(dilation=("2", "1")), dict(padding="12"),
                                dict(stride=(True, 1))])
def test_per_dimension_values_must_be_ints(kw):
    """Each element is checked as a scalar is: int() must not truncate or parse."""
    name = next(iter(kw))
    with pytest.raises(TypeError, match=name):
        ConvProblem((1, 1, 9, 9), (1, 1, 3, 3), **kw)
    import numpy as np
    assert ConvProblem((1, 1, 9, 9), (1, 1, 3, 3), stride=(np.int64(2), 1)).stride == (2, 1)
