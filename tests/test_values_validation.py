"""Values are checked where they are made: shapes, MicroBatch and Plan fields,
Plan JSON and byte sizes; every error names its field and derives from
MucudnnError as well as the builtin it always was."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mucudnn.errors import MucudnnError
from mucudnn.problem import ConvProblem, Direction, MicroBatch, Plan, PlanFormatError, make_plan
from mucudnn.units import parse_bytes

P = ConvProblem((4, 3, 5, 5), (2, 3, 3, 3), padding=1)


# -- shapes ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.ones((2, 4), dtype=np.int64), [[2, 3], [5, 5]],
                                 np.ones((4, 1), dtype=np.int64)])
def test_nested_shapes_are_rejected_naming_the_argument(bad):
    with pytest.raises(TypeError, match="x_shape: expected a sequence of ints") as e:
        ConvProblem(bad, (2, 3, 3, 3))
    assert isinstance(e.value, MucudnnError)
    with pytest.raises(TypeError, match="w_shape"):
        ConvProblem((4, 3, 5, 5), bad)


def test_array_shapes_are_described_on_one_line():
    with pytest.raises(TypeError) as e:
        ConvProblem(np.ones((2, 4), dtype=np.int64), (2, 3, 3, 3))
    assert str(e.value) == "x_shape: expected a sequence of ints, got a 2-D array of shape (2, 4)"
    with pytest.raises(TypeError, match="got a 0-D array of shape"):
        ConvProblem(np.int64(4), (2, 3, 3, 3))


def test_numpy_integer_shapes_still_work():
    p = ConvProblem(np.array([4, 3, 5, 5]), tuple(np.int32(v) for v in (2, 3, 3, 3)))
    assert p.x_shape == (4, 3, 5, 5) and all(type(v) is int for v in p.x_shape)


def test_problem_errors_are_mucudnn_errors():
    for kw in ({"groups": 0}, {"layout": "NCWH"}, {"stride": 1.5}):
        with pytest.raises(MucudnnError):
            ConvProblem((4, 3, 5, 5), (2, 3, 3, 3), **kw)
    with pytest.raises(ValueError) as e:
        Direction.parse("sideways")
    assert isinstance(e.value, MucudnnError)


# -- MicroBatch -------------------------------------------------------------------------
BAD_MICRO = [
    # (kwargs, exception, the field the message must name)
    ({"size": "one"}, TypeError, "size"),
    ({"size": 0}, ValueError, "size"),
    ({"size": 2.0}, TypeError, "size"),
    ({"size": True}, TypeError, "size"),
    ({"offset": -1}, ValueError, "offset"),
    ({"offset": "0"}, TypeError, "offset"),
    ({"workspace_bytes": -5}, ValueError, "workspace_bytes"),
    ({"workspace_bytes": 1.5}, TypeError, "workspace_bytes"),
    ({"time_ms": float("nan")}, ValueError, "time_ms"),
    ({"time_ms": float("inf")}, ValueError, "time_ms"),
    ({"time_ms": -1.0}, ValueError, "time_ms"),
    ({"time_ms": "fast"}, TypeError, "time_ms"),
    ({"algo": None}, TypeError, "algo"),
    ({"algo": 1.0}, TypeError, "algo"),
    ({"math_type": [0]}, TypeError, "math_type"),
]


@pytest.mark.parametrize("kw,exc,field", BAD_MICRO)
def test_micro_batch_fields_are_checked(kw, exc, field):
    args = {"offset": 0, "size": 4, "algo": 1} | kw
    with pytest.raises(exc, match=rf"^{field}: expected") as e:
        MicroBatch(**args)
    assert isinstance(e.value, MucudnnError)


def test_micro_batch_normalises_numpy_numbers():
    m = MicroBatch(np.int64(4), np.int32(2), np.int64(1), 0, np.int64(64), np.float32(0.5))
    assert (m.offset, m.size, m.algo, m.workspace_bytes, m.time_ms) == (4, 2, 1, 64, 0.5)
    assert all(type(v) is int for v in (m.offset, m.size, m.algo, m.workspace_bytes))
    assert type(m.time_ms) is float
    json.dumps(m.to_dict())  # NumPy scalars would not serialise
    assert MicroBatch(0, 1, "e7-k3").algo == "e7-k3"


# -- Plan --------------------------------------------------------------------------------
def _plan(**kw):
    args = dict(problem=P, direction=Direction.FORWARD,
                micro_batches=(MicroBatch(0, 2, 1, 0, 8, 0.1), MicroBatch(2, 2, 0, 0, 0, 0.2)),
                workspace_bytes=8, time_ms=0.3, undivided_time_ms=0.5, workspace_limit=64)
    return Plan(**(args | kw))


BAD_PLAN = [
    ({"micro_batches": (MicroBatch(0, 4, 1), {"offset": 0})}, TypeError, r"micro_batches\[1\]"),
    ({"micro_batches": ()}, ValueError, "micro_batches"),
    ({"micro_batches": None}, TypeError, "micro_batches"),
    ({"workspace_bytes": -1}, ValueError, "workspace_bytes"),
    ({"workspace_bytes": "8"}, TypeError, "workspace_bytes"),
    ({"time_ms": float("nan")}, ValueError, "time_ms"),
    ({"time_ms": float("inf")}, ValueError, "time_ms"),
    ({"undivided_time_ms": float("nan")}, ValueError, "undivided_time_ms"),
    ({"undivided_time_ms": -2.0}, ValueError, "undivided_time_ms"),
    ({"workspace_limit": -1}, ValueError, "workspace_limit"),
    ({"workspace_limit": 1.5}, TypeError, "workspace_limit"),
    ({"problem": "conv2"}, TypeError, "problem"),
    ({"direction": "sideways"}, ValueError, "direction"),
    ({"direction": 3}, TypeError, "direction"),
]


@pytest.mark.parametrize("kw,exc,field", BAD_PLAN)
def test_plan_fields_are_checked(kw, exc, field):
    with pytest.raises(exc, match=rf"^{field}") as e:
        _plan(**kw)
    assert isinstance(e.value, MucudnnError)


def test_plan_accepts_what_the_planners_make():
    plan = _plan(micro_batches=[MicroBatch(0, 4, 1)], direction="backward_data",
                 undivided_time_ms=float("inf"), workspace_limit=None)
    assert plan.micro_batches == (MicroBatch(0, 4, 1),)  # a list becomes a tuple
    assert plan.direction is Direction.BACKWARD_DATA
    assert math.isinf(plan.speedup)
    # a plan with a gap is a valid value (the engine refuses to run it)
    gap = make_plan([MicroBatch(0, 2, 0), MicroBatch(3, 3, 0)], undivided_time_ms=1,
                    workspace_limit=None)
    assert gap.batch == 5


# -- Plan JSON -----------------------------------------------------------------------------
def test_plan_from_json_of_a_list_says_what_to_use():
    text = json.dumps([{"layer": "conv1", "direction": "forward", **_plan().to_dict()}])
    with pytest.raises(PlanFormatError, match="load_plans") as e:
        Plan.from_json(text)
    assert isinstance(e.value, (MucudnnError, ValueError))


@pytest.mark.parametrize("key", ["micro_batches", "workspace_bytes", "time_ms",
                                 "undivided_time_ms"])
def test_plan_from_dict_missing_key_names_it(key):
    d = _plan().to_dict()
    del d[key]
    with pytest.raises(PlanFormatError, match=f"{key}: missing") as e:
        Plan.from_dict(d)
    # still a KeyError for code that caught the bare one, but a readable message
    assert isinstance(e.value, KeyError) and isinstance(e.value, MucudnnError)
    assert str(e.value).startswith(key)


def test_plan_from_dict_names_the_bad_nested_field():
    d = _plan().to_dict()
    d["micro_batches"][1]["size"] = "one"
    with pytest.raises(PlanFormatError, match=r"micro_batches\[1\]\.size: expected an int"):
        Plan.from_dict(d)
    d = _plan().to_dict()
    d["micro_batches"][0]["sizes"] = 2
    with pytest.raises(PlanFormatError, match=r"micro_batches\[0\]: unknown key 'sizes'"):
        Plan.from_dict(d)
    d = _plan().to_dict()
    d["problem"]["x_shape"] = [4, 3, 0, 5]
    with pytest.raises(PlanFormatError, match=r"problem\.x_shape: expected positive"):
        Plan.from_dict(d)
    d = _plan().to_dict()
    d["problem"]["colour"] = "red"
    with pytest.raises(PlanFormatError, match=r"problem: unknown key 'colour'"):
        Plan.from_dict(d)


def test_plan_json_round_trip_keeps_every_field():
    plan = _plan(undivided_time_ms=float("inf"), policy=(4, 2))
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.policy == (4, 2) and math.isinf(back.undivided_time_ms)


# -- byte sizes -------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["1e400", "9" * 400, "64 parsecs", "-1", "nan", "inf", "",
                                 "1e19", str(1 << 63), "8EiB"])
def test_parse_bytes_errors_are_one_line_mucudnn_errors(bad):
    with pytest.raises(ValueError) as e:
        parse_bytes(bad, "MUCUDNN_WORKSPACE_LIMIT")
    assert isinstance(e.value, MucudnnError)
    msg = str(e.value)
    assert msg.startswith("MUCUDNN_WORKSPACE_LIMIT: ") and "\n" not in msg


def test_parse_bytes_type_errors():
    for bad in (True, None, [64], float("nan"), -3):
        with pytest.raises((TypeError, ValueError)) as e:
            parse_bytes(bad, "workspace")
        assert isinstance(e.value, MucudnnError) and str(e.value).startswith("workspace: ")


@given(st.text(max_size=40))
def test_parse_bytes_never_fails_otherwise(text):
    try:
        n = parse_bytes(text)
    except MucudnnError as e:
        assert isinstance(e, ValueError) and str(e).startswith("size: ")
    else:
        assert isinstance(n, int) and 0 <= n < 1 << 63

