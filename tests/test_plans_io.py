"""mucudnn.load_plans reads what `python -m mucudnn optimize --json` writes, checks
it field by field and against the problems it is for, and the plans run."""

from __future__ import annotations

import gzip
import json
import pathlib
import shutil

import numpy as np
import pytest
from hypothesis import event, given, strategies as st

import mucudnn as mu
import reference
from mucudnn.__main__ import main
from mucudnn.errors import MucudnnError
from mucudnn.networks import network
from mucudnn.plans_io import MAX_BYTES, PlanFileError, PlanMismatchError, check_plan
from mucudnn.problem import ConvProblem, Direction, MicroBatch, Plan, PlanFormatError, make_plan

DATA = pathlib.Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def numpy_plans(tmp_path_factory):
    """optimize --json on the NumPy backend: two layers, two directions, batch 4."""
    tmp = tmp_path_factory.mktemp("plans")
    mp = pytest.MonkeyPatch()
    mp.setenv("MUCUDNN_CACHE", str(tmp / "cache.sqlite"))
    out = tmp / "plans.json"
    try:
        rc = main(["optimize", "--net", "alexnet", "--backend", "numpy", "--batch", "4",
                   "--layers", "conv4,conv5", "--directions", "forward,backward_filter",
                   "--workspace", "1MiB", "--no-progress", "--json", str(out)])
    finally:
        mp.undo()
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def h200_cache(tmp_path_factory):
    """The shipped H200 benchmark cache, decompressed (sqlite cannot read the .gz)."""
    path = tmp_path_factory.mktemp("h200") / "h200.sqlite"
    with gzip.open(DATA / "h200-benchmark-cache.sqlite.gz") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def _round_trip(path):
    entries = json.loads(path.read_text())
    plans = mu.load_plans(path)
    assert len(plans) == len(entries)
    for entry, ((layer, d), plan) in zip(entries, plans.items()):
        assert isinstance(d, Direction) and isinstance(plan, Plan)
        # exactly what optimize wrote, field for field
        assert {"layer": layer, "direction": d.value, **plan.to_dict()} == entry
    return plans


@pytest.mark.slow
def test_numpy_round_trip(numpy_plans):
    plans = _round_trip(numpy_plans)
    assert set(plans) == {(l, d) for l in ("conv4", "conv5")
                          for d in (Direction.FORWARD, Direction.BACKWARD_FILTER)}
    checked = mu.load_plans(numpy_plans, "alexnet", batch=4)
    assert checked == plans
    probs = network("alexnet", 4)
    assert mu.load_plans(str(numpy_plans), {"conv4": probs["conv4"],
                                            "conv5": probs["conv5"]}) == plans
    # text, bytes and parsed JSON read the same
    text = numpy_plans.read_text()
    assert mu.load_plans(text) == mu.load_plans(text.encode()) == \
        mu.load_plans(json.loads(text)) == plans


@pytest.mark.slow
def test_loaded_plans_run_in_a_convolution(numpy_plans):
    plans = mu.load_plans(numpy_plans, "alexnet", batch=4)
    conv5 = {d: p for (layer, d), p in plans.items() if layer == "conv5"}
    p = conv5[Direction.FORWARD].problem
    conv = mu.Convolution(p.x_shape, p.w_shape, padding=1, backend="numpy", plans=conv5,
                          cache="off")
    for d, plan in conv5.items():
        assert [(m.offset, m.size, m.algo) for m in conv.plan(d).micro_batches] == \
            [(m.offset, m.size, m.algo) for m in plan.micro_batches]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(p.x_shape, dtype=np.float32)
    w = rng.standard_normal(p.w_shape, dtype=np.float32)
    ref = mu.Convolution(p.x_shape, p.w_shape, padding=1, backend="numpy",
                         policy="undivided", cache="off").forward(x, w)
    y = conv.forward(x, w)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("net,mode", [("alexnet", "wr"), ("resnet18", "wd")])
def test_h200_cache_round_trip_offline(h200_cache, tmp_path, monkeypatch, net, mode):
    monkeypatch.setenv("MUCUDNN_CACHE", str(h200_cache))
    out = tmp_path / "plans.json"
    rc = main(["optimize", "--net", net, "--offline", "--mode", mode, "--no-progress",
               "--json", str(out)])
    assert rc == 0
    plans = _round_trip(out)
    assert len(plans) == 3 * len(network(net))
    assert mu.load_plans(out, net) == plans  # the usual batch: alexnet 256, resnet18 128
    assert any(len(p.micro_batches) > 1 for p in plans.values())  # micro-batched for real
    assert all(isinstance(m.algo, str) for p in plans.values() for m in p.micro_batches)
    with pytest.raises(PlanMismatchError, match=r"x_shape is \[.*\] in the file, .*batch"):
        mu.load_plans(out, net, batch=64)


def test_one_plan_and_plan_from_json(numpy_plans):
    entry = json.loads(numpy_plans.read_text())[0]
    del entry["layer"]
    plan = Plan.from_json(json.dumps(entry))
    assert mu.load_plans(plan.to_json()) == {(None, plan.direction): plan}
    with pytest.raises(PlanFormatError, match="layer: missing"):
        mu.load_plans(plan.to_json(), "alexnet", batch=4)


# -- what a wrong file says ----------------------------------------------------------------------------
def _entries(numpy_plans):
    return json.loads(numpy_plans.read_text())


def _fails(data, match, exc=PlanFormatError, **kw):
    with pytest.raises(exc, match=match) as e:
        mu.load_plans(data, **kw)
    assert isinstance(e.value, MucudnnError) and isinstance(e.value, ValueError)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_fields_name_entry_layer_and_field(numpy_plans):
    es = _entries(numpy_plans)
    es[1]["micro_batches"][0]["size"] = "one"
    msg = _fails(es, r"^plans: entry 1 \(layer 'conv4', backward_filter\): "
                     r"micro_batches\[0\]\.size: expected an int >= 1, got 'one'$")
    es = _entries(numpy_plans)
    del es[2]["time_ms"]
    _fails(es, r"entry 2 \(layer 'conv5', forward\): time_ms: missing")
    es = _entries(numpy_plans)
    es[0]["direction"] = "sideways"
    _fails(es, r"entry 0 \(layer 'conv4', sideways\): direction: expected one of")
    es = _entries(numpy_plans)
    es[0]["problem"]["padding"] = [1]
    _fails(es, r"entry 0 .*: problem\.padding: expected 2 values")
    es = _entries(numpy_plans)
    es[3]["layer"] = 5
    _fails(es, r"entry 3: layer: expected a string")
    es = _entries(numpy_plans)
    es[0]["workspace_bytes"] = -1
    _fails(es, r"entry 0 .*: workspace_bytes: expected an int >= 0")
    del msg


def test_bad_files(tmp_path, numpy_plans):
    f = tmp_path / "broken.json"
    f.write_text(numpy_plans.read_text()[:-40])
    _fails(f, rf"^{f}: not valid JSON")
    _fails("[]", "holds no plans")
    _fails("[1, 2]", r"entry 0: expected a plan \(a JSON object\), got int")
    _fails(b"42", r"^plans: expected a list of plans or one plan \(a JSON object\), got int")
    with pytest.raises(FileNotFoundError):
        mu.load_plans(tmp_path / "missing.json")
    with pytest.raises(TypeError, match="source:"):
        mu.load_plans(42)
    es = _entries(numpy_plans)
    _fails(es + es[:1], r"entry 4: a second plan for layer 'conv4', forward")


def test_plans_must_fit_their_problems(numpy_plans):
    es = _entries(numpy_plans)
    _fails(es, r"entry 0 \(layer 'conv4', forward\): problem: x_shape is \[4, 384, 13, 13\] "
               r"in the file, \[8, 384, 13, 13\] expected \(a plan for batch 4, not 8\)",
           exc=PlanMismatchError, problems="alexnet", batch=8)
    _fails(es, r"problem: dtype is float32 in the file, float16 expected", exc=PlanMismatchError,
           problems="alexnet", batch=4, dtype="float16")
    _fails(es, r"layer: not among the given problems' layers \(conv1, conv2", exc=PlanMismatchError,
           problems={n: p for n, p in network("alexnet", 4).items() if n != "conv4"})
    # micro-batches that do not tile the batch
    es = _entries(numpy_plans)
    es[0]["micro_batches"] = [dict(es[0]["micro_batches"][0], offset=0, size=2),
                              dict(es[0]["micro_batches"][0], offset=3, size=1)]
    _fails(es, r"entry 0 .*: micro_batches\[1\]\.offset: expected 2 .*got 3",
           exc=PlanMismatchError)
    es[0]["micro_batches"][1]["offset"] = 2
    _fails(es, r"micro_batches: sizes 2 \+ 1 add up to 3, expected the problem's batch 4",
           exc=PlanMismatchError)
    es = _entries(numpy_plans)
    es[0]["micro_batches"][0]["workspace_bytes"] = es[0]["workspace_bytes"] + 1
    _fails(es, r"workspace_bytes: \d+ is less than a micro-batch's", exc=PlanMismatchError)


def test_problems_argument_is_checked(numpy_plans):
    with pytest.raises(TypeError, match="problems:"):
        mu.load_plans(numpy_plans, ["alexnet"])
    with pytest.raises(TypeError, match=r"problems\['conv4'\]: expected a ConvProblem"):
        mu.load_plans(numpy_plans, {"conv4": (4, 384, 13, 13)})
    with pytest.raises(ValueError, match="batch: is only used with a network name"):
        mu.load_plans(numpy_plans, batch=4)
    with pytest.raises(ValueError, match="net: expected one of"):
        mu.load_plans(numpy_plans, "lenet", batch=4)


def test_a_plan_without_problem_takes_the_given_one():
    p = network("alexnet", 2)["conv5"]
    plan = make_plan([MicroBatch(0, 1, 0), MicroBatch(1, 1, 0)], undivided_time_ms=1.0,
                     workspace_limit=None, direction=Direction.FORWARD)
    got = mu.load_plans([{"layer": "conv5", **plan.to_dict()}], {"conv5": p})
    assert got["conv5", Direction.FORWARD].problem == p
    check_plan(got["conv5", Direction.FORWARD])


# -- hostile files ------------------------------------------------------------------------------
SMALL = ConvProblem((4, 3, 6, 6), (5, 3, 3, 3), padding=1)


def _one_plan(algo=1, layer="c", **mb):
    plan = make_plan([MicroBatch(0, 4, algo, **mb)], undivided_time_ms=1.0, workspace_limit=0,
                     problem=SMALL, direction="forward")
    return {"layer": layer, **plan.to_dict()}


@pytest.mark.parametrize("depth", [2_000, 100_000, 1_000_000])
@pytest.mark.parametrize("opener", ["[", "{\"a\":"])
def test_deeply_nested_file_is_a_format_error_naming_it(tmp_path, depth, opener):
    f = tmp_path / "deep.json"
    f.write_text(opener * depth)
    with pytest.raises(PlanFormatError, match=rf"^{f}: ") as info:
        mu.load_plans(f)
    assert isinstance(info.value, MucudnnError)
    with pytest.raises(PlanFormatError, match=r"^plans: "):
        mu.load_plans(opener * depth)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-8-sig"])
def test_utf16_and_utf32_files_are_read(tmp_path, encoding):
    """JSON may come in UTF-16/32 (RFC 8259; what json.loads accepts as bytes)."""
    f = tmp_path / "p.json"
    f.write_bytes(json.dumps([_one_plan(layer="é")]).encode(encoding))
    plans = mu.load_plans(f)
    assert list(plans) == [("é", Direction.FORWARD)]


def test_latin1_file_is_a_format_error_naming_it(tmp_path):
    f = tmp_path / "p.json"
    f.write_bytes(json.dumps([_one_plan(layer="é")], ensure_ascii=False).encode("latin-1"))
    with pytest.raises(PlanFormatError, match=rf"^{f}: expected JSON text in UTF-8"):
        mu.load_plans(f)


def test_huge_files_and_devices_are_refused_without_reading_them_whole(tmp_path):
    for path in ("/dev/zero", "/dev/urandom"):
        with pytest.raises(PlanFileError, match=rf"^{path}: larger than {MAX_BYTES} bytes"):
            mu.load_plans(path)
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: MAX_BYTES + 1 bytes without writing them
        f.truncate(MAX_BYTES + 1)
    with pytest.raises(PlanFileError, match=rf"^{big}: larger than"):
        mu.load_plans(big)
    with pytest.raises(PlanFileError, match=rf"^{tmp_path}: cannot read") as info:
        mu.load_plans(tmp_path)
    assert isinstance(info.value, OSError)


@pytest.mark.parametrize("algo", [-1, 1 << 31, "", "x" * 513, "a\0b"])
def test_algo_that_no_backend_uses_is_refused_at_load(algo):
    with pytest.raises(PlanFormatError, match=r"entry 0 .*micro_batches\[0\]\.algo: expected"):
        mu.load_plans([_one_plan(algo)])


@pytest.mark.parametrize("algo", [42, "e5;k2=0", "bogus"])
def test_algo_the_backend_lacks_is_refused_at_load_with_backend(algo):
    assert mu.load_plans([_one_plan(algo)])  # the shape of an id: no backend to ask
    with pytest.raises(PlanMismatchError,
                       match=r"entry 0 \(layer 'c', forward\): micro_batches\[0\]\.algo: "
                             r"backend numpy has no configuration"):
        mu.load_plans([_one_plan(algo)], {"c": SMALL}, backend="numpy")
    plans = mu.load_plans([_one_plan(2)], {"c": SMALL}, backend="numpy")
    assert plans["c", Direction.FORWARD].micro_batches[0].algo == 2


# Hostile JSON: mutations of a valid plan entry and arbitrary JSON values.
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
_json = st.recursive(_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                   st.dictionaries(st.text(max_size=8), c,
                                                                   max_size=4)),
                     max_leaves=20)
_FIELDS = ["offset", "size", "algo", "math_type", "workspace_bytes", "time_ms"]
_TOP = ["direction", "workspace_bytes", "time_ms", "undivided_time_ms", "workspace_limit",
        "problem", "micro_batches", "layer", "policy"]


@st.composite
def _hostile_sources(draw):
    kind = draw(st.sampled_from(["valid", "mutated", "json", "bytes", "nested"]))
    if kind == "valid":  # a random tiling with the NumPy backend's ids, as names or ints
        sizes, left = [], SMALL.batch
        while left:
            sizes.append(draw(st.integers(1, left)))
            left -= sizes[-1]
        algos = st.sampled_from([0, 1, 2, "DIRECT", "im2col_gemm", "FFT"])
        mbs = [MicroBatch(sum(sizes[:i]), n, draw(algos),
                          workspace_bytes=draw(st.integers(0, 1 << 20)))
               for i, n in enumerate(sizes)]
        plan = make_plan(mbs, undivided_time_ms=1.0, workspace_limit=None, problem=SMALL,
                         direction="forward")
        return [{"layer": "c", **plan.to_dict()}]
    if kind == "json":
        return draw(_json)
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "nested":
        return draw(st.sampled_from(["[", "{\"a\":", "[{\"micro_batches\":"])) * \
            draw(st.integers(1, 50_000))
    entry = _one_plan(draw(st.sampled_from([0, 1, 2])))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "mb", "drop"]))
        if where == "top":
            entry[draw(st.sampled_from(_TOP))] = draw(_json)
        elif where == "mb" and isinstance(entry.get("micro_batches"), list) \
                and entry["micro_batches"] and isinstance(entry["micro_batches"][0], dict):
            entry["micro_batches"][0][draw(st.sampled_from(_FIELDS))] = draw(_json)
        elif entry:
            entry.pop(draw(st.sampled_from(sorted(entry))), None)
    return [entry] if draw(st.booleans()) else json.dumps(entry, allow_nan=True)


@given(source=_hostile_sources())
def test_hostile_plan_json_loads_valid_or_raises_a_mucudnn_error(source):
    """Every hostile input either loads as plans that fit SMALL and run on the
    NumPy backend exactly as the float64 reference, or raises a MucudnnError
    whose message starts with where it came from."""
    try:
        plans = mu.load_plans(source, {"c": SMALL}, backend="numpy")
    except MucudnnError as exc:
        event(f"refused: {type(exc).__name__}")
        named = ("plans", "source:") + ((source,) if isinstance(source, str) else ())
        assert str(exc).startswith(named), str(exc)
        assert isinstance(exc, (ValueError, TypeError, OSError))
        return
    event("loaded")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SMALL.x_shape).astype(np.float32)
    w = rng.standard_normal(SMALL.w_shape).astype(np.float32)
    for (layer, d), plan in plans.items():
        assert layer == "c" and d is Direction.FORWARD and plan.problem == SMALL
        conv = mu.Convolution(SMALL.x_shape, SMALL.w_shape, padding=1, backend="numpy",
                              cache=False, workspace_limit=None, plans={d: plan})
        np.testing.assert_allclose(conv.forward(x, w), reference.forward(SMALL, x, w),
                                   rtol=1e-4, atol=1e-4)
        ran = conv.plans[d].micro_batches  # the plan given ran (workspace raised to its need)
        assert [(m.offset, m.size, m.algo) for m in ran] == \
            [(m.offset, m.size, m.algo) for m in plan.micro_batches]
