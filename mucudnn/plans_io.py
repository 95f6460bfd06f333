"""Reading plans back: what ``python -m mucudnn optimize --json`` writes, or one Plan's JSON.

``optimize --json plans.json`` writes a list of ``{"layer": ..., "direction": ...,
**plan.to_dict()}``. :func:`load_plans` reads that (or one plan's
``Plan.to_json()``), checks every field and, given the problems the plans are
for, that each plan is for its layer's problem and that its micro-batches tile
the batch, so a wrong file fails here, naming the entry, layer and field, and
not at the first forward::

    python -m mucudnn optimize --net alexnet --batch 4 --backend numpy --json plans.json

    plans = mu.load_plans("plans.json", "alexnet", batch=4)   # {(layer, Direction): Plan}
    conv5 = {d: p for (layer, d), p in plans.items() if layer == "conv5"}
    conv = mu.Convolution((4, 384, 13, 13), (256, 384, 3, 3), padding=1,
                          backend="numpy", plans=conv5)

Plans name the backend's algorithms (ints for the legacy API and NumPy,
engine-config strings for the graph API): use them with the backend that made them.

>>> import json
>>> from mucudnn.problem import ConvProblem, MicroBatch, make_plan
>>> p = ConvProblem((4, 8, 5, 5), (8, 8, 3, 3), padding=1)
>>> plan = make_plan([MicroBatch(0, 2, 1), MicroBatch(2, 2, 1)], undivided_time_ms=1.0,
...                  workspace_limit=0, problem=p, direction="forward")
>>> text = json.dumps([{"layer": "conv", **plan.to_dict()}])
>>> plans = load_plans(text, {"conv": p})
>>> plans["conv", Direction.FORWARD].describe()
'2 x 2'
>>> load_plans(text, {"conv": p.with_batch(8)})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
mucudnn.plans_io.PlanMismatchError: plans: entry 0 (layer 'conv', forward): problem: ...
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Union

from .backends import Backend, get_backend
from .errors import InvalidTypeError, InvalidValueError, MucudnnError
from .networks import network
from .problem import ConvProblem, Direction, Plan, PlanFormatError

__all__ = ["load_plans", "check_plan", "PlanFormatError", "PlanMismatchError", "PlanFileError",
           "MAX_BYTES"]

Source = Union[str, bytes, "os.PathLike[str]", list, dict]


#: The largest plans file or text read (bytes); larger ones are refused.
MAX_BYTES = 64 << 20
#: The longest algo / math_type string of a plan (as the benchmark cache's).
MAX_ID = 512


class PlanMismatchError(MucudnnError, ValueError):
    """A well-formed plan that does not fit its problem: another problem,
    micro-batches that do not tile the batch, or (``backend=``) a configuration
    the backend does not have."""


class PlanFileError(MucudnnError, OSError):
    """A plans file that cannot be read, or is larger than :data:`MAX_BYTES`."""


class PlanFileNotFoundError(PlanFileError, FileNotFoundError):
    """A plans file that does not exist."""


def load_plans(source: Source, problems: "Mapping[str, ConvProblem] | str | None" = None, *,
               batch: int | None = None, dtype: str = "float32", layout: str = "NCHW",
               math: str = "default", backend: "str | Backend | None" = None
               ) -> dict[tuple[str | None, Direction], Plan]:
    """Plans read from ``source``, as ``{(layer, Direction): Plan}`` in file order.

    ``source`` is a path (str or PathLike), JSON text (str or bytes) or the
    parsed JSON: a list of plans as ``python -m mucudnn optimize --json``
    writes, or one plan's ``Plan.to_json()`` (its layer is None unless it has
    a ``"layer"`` key).

    ``problems`` are the problems the plans are for: ``{layer: ConvProblem}``,
    or a network name (``"alexnet"``) built at ``batch`` (default: the
    network's usual batch) with ``dtype``, ``layout`` and ``math``. Given
    them, every plan must name one of their layers and be for that layer's
    problem (a plan without a problem gets it). Every plan's micro-batches
    must tile its problem's batch (offsets 0, b1, b1 + b2, ... up to the
    batch), and its workspace must cover its micro-batches'.

    Every micro-batch's ``algo`` and ``math_type`` must look like a backend's
    id (an int in [0, 2**31) or a string of 1..512 characters); given
    ``backend`` (a Backend or its name), each must be one that backend has
    for its problem at that size, so a plan made for another backend fails
    here and not at the first forward.

    Raises :class:`PlanFormatError` (a ValueError) for a malformed file (not
    UTF-8/16/32 JSON, nested too deeply, a bad field) and
    :class:`PlanMismatchError` (a ValueError) for a plan that does not fit,
    each naming the entry, its layer and the field; :class:`PlanFileError`
    (an OSError) naming the file where it cannot be read or holds more than
    :data:`MAX_BYTES` (64 MiB).
    """
    data, where = _read(source)
    expected = _expected_problems(problems, batch, dtype, layout, math)
    be = None if backend is None else get_backend(backend)
    if isinstance(data, Mapping):
        entries: list = [data]
    elif isinstance(data, list):
        entries = data
    else:
        raise PlanFormatError(f"{where}: expected a list of plans or one plan (a JSON object), "
                              f"got {type(data).__name__}")
    if not entries:
        raise PlanFormatError(f"{where}: holds no plans")
    out: dict[tuple[str | None, Direction], Plan] = {}
    for i, entry in enumerate(entries):
        key, plan = _entry(entry, f"{where}: entry {i}", expected, be)
        if key in out:
            raise PlanFormatError(f"{where}: entry {i}: a second plan for layer {key[0]!r}, "
                                  f"{key[1].value}")
        out[key] = plan
    return out


def check_plan(plan: Plan, problem: ConvProblem | None = None, where: str = "plan") -> None:
    """Check that ``plan`` fits ``problem`` (default: its own): the same problem,
    micro-batches that tile the batch, a workspace that covers them.

    Raises :class:`PlanMismatchError` starting with ``where``.
    """
    if problem is not None and plan.problem is not None and plan.problem != problem:
        raise PlanMismatchError(f"{where}: problem: {_difference(plan.problem, problem)}")
    problem = problem if problem is not None else plan.problem
    offset = 0
    for i, m in enumerate(plan.micro_batches):
        if m.offset != offset:
            raise PlanMismatchError(
                f"{where}: micro_batches[{i}].offset: expected {offset} (the micro-batches "
                f"must tile the batch in order), got {m.offset}")
        offset += m.size
    if problem is not None and offset != problem.batch:
        raise PlanMismatchError(
            f"{where}: micro_batches: sizes {plan.describe()} add up to {offset}, "
            f"expected the problem's batch {problem.batch}")
    need = max(m.workspace_bytes for m in plan.micro_batches)
    if plan.workspace_bytes < need:
        raise PlanMismatchError(
            f"{where}: workspace_bytes: {plan.workspace_bytes} is less than a micro-batch's "
            f"{need}")


# -- helpers ----------------------------------------------------------------------------------
def _read(source: Any) -> tuple[Any, str]:
    """The parsed JSON and a name for messages (the path, or "plans")."""
    if isinstance(source, (list, dict)):
        return source, "plans"
    where = "plans"
    if isinstance(source, (bytes, bytearray)):
        if len(source) > MAX_BYTES:
            raise PlanFormatError(f"plans: {len(source)} bytes of JSON, more than {MAX_BYTES}")
        text = _decode(bytes(source), where)
    elif isinstance(source, str) and source.lstrip()[:1] in ("[", "{"):
        text = source
    elif isinstance(source, (str, os.PathLike)):
        where = os.fsdecode(os.fspath(source))
        text = _decode(_read_file(where), where)
    else:
        raise InvalidTypeError(f"source: expected a path, JSON text or parsed JSON, "
                               f"got {type(source).__name__}")
    try:
        return json.loads(text), where
    except RecursionError:
        raise PlanFormatError(f"{where}: JSON nested too deeply to be a plan file") from None
    except ValueError as exc:
        raise PlanFormatError(f"{where}: not valid JSON ({exc})") from None


def _read_file(path: str) -> bytes:
    """At most :data:`MAX_BYTES` of the file ``path``; PlanFileError naming it when
    it cannot be read or is larger (a device such as /dev/zero never ends)."""
    if not path.strip() or "\0" in path:
        raise InvalidValueError(f"source: expected a path, JSON text or parsed JSON, got "
                                f"{_short(path)}")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        cls = PlanFileNotFoundError if isinstance(exc, FileNotFoundError) else PlanFileError
        raise cls(f"{path}: cannot read the plans file ({exc.strerror or exc})") from None
    if len(data) > MAX_BYTES:
        raise PlanFileError(f"{path}: larger than {MAX_BYTES} bytes; a plans file is a few "
                            "kilobytes (is this the right file?)")
    return data


def _decode(data: bytes, where: str) -> str:
    """JSON bytes as text: UTF-8, or UTF-16/32 where the bytes say so (RFC 8259, as
    json.loads does); PlanFormatError naming ``where`` otherwise."""
    encoding = json.detect_encoding(data)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise PlanFormatError(f"{where}: expected JSON text in UTF-8 (or UTF-16/32), got "
                              f"bytes that are not {encoding} at offset {exc.start}") from None


def _check_ids(plan: Plan, where: str, backend: Any) -> None:
    """Every micro-batch's algo and math_type: an id of the shape backends use
    (an int in [0, 2**31) or a str of 1..MAX_ID characters) and, with ``backend``,
    one it can run at that size (its ``workspace_size`` answers)."""
    for i, m in enumerate(plan.micro_batches):
        for field in ("algo", "math_type"):
            v = getattr(m, field)
            ok = (0 < len(v) <= MAX_ID and "\0" not in v) if isinstance(v, str) \
                else 0 <= v < 1 << 31
            if not ok:
                raise PlanFormatError(
                    f"{where}: micro_batches[{i}].{field}: expected a backend's id (an int in "
                    f"[0, 2**31) or a string of 1..{MAX_ID} characters without NUL), "
                    f"got {_short(v)}")
        if backend is None or plan.problem is None or plan.direction is None:
            continue
        try:
            backend.workspace_size(plan.problem.with_batch(m.size), plan.direction, m.algo,
                                   m.math_type)
        except NotImplementedError:
            continue
        except (MucudnnError, ValueError, TypeError, LookupError, OverflowError) as exc:
            raise PlanMismatchError(
                f"{where}: micro_batches[{i}].algo: backend {backend.name} has no "
                f"configuration {_short(m.algo)} (math_type {_short(m.math_type)}) for this "
                f"problem ({exc})") from None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _expected_problems(problems: Any, batch: Any, dtype: str, layout: str,
                       math: str) -> dict[str, ConvProblem] | None:
    if isinstance(problems, str):
        return network(problems, batch, dtype=dtype, layout=layout, math=math)
    if batch is not None:
        raise InvalidValueError("batch: is only used with a network name as problems")
    if problems is None:
        return None
    if not isinstance(problems, Mapping):
        raise InvalidTypeError(f"problems: expected {{layer: ConvProblem}}, a network name or "
                               f"None, got {type(problems).__name__}")
    for k, v in problems.items():
        if not isinstance(v, ConvProblem):
            raise InvalidTypeError(f"problems[{k!r}]: expected a ConvProblem, "
                                   f"got {type(v).__name__}")
    return dict(problems)


def _entry(entry: Any, where: str, expected: dict[str, ConvProblem] | None, backend: Any,
           ) -> tuple[tuple[str | None, Direction], Plan]:
    if not isinstance(entry, Mapping):
        raise PlanFormatError(f"{where}: expected a plan (a JSON object), "
                              f"got {type(entry).__name__}")
    layer = entry.get("layer")
    if layer is not None and not isinstance(layer, str):
        raise PlanFormatError(f"{where}: layer: expected a string, got {layer!r}")
    direction = entry.get("direction")
    where += f" (layer {layer!r}{f', {direction}' if isinstance(direction, str) else ''})"
    try:
        plan = Plan.from_dict({k: v for k, v in entry.items() if k != "layer"})
    except PlanFormatError as exc:
        raise PlanFormatError(f"{where}: {exc}") from None
    if plan.direction is None:
        raise PlanFormatError(f"{where}: direction: missing (expected one of "
                              f"{', '.join(d.value for d in Direction)})")
    if expected is not None:
        if layer is None:
            raise PlanFormatError(f"{where}: layer: missing, and needed to find its problem")
        if layer not in expected:
            raise PlanMismatchError(f"{where}: layer: not among the given problems' layers "
                                    f"({', '.join(expected)})")
        if plan.problem is None:
            plan = plan.with_context(expected[layer], plan.direction)
        check_plan(plan, expected[layer], where)
    else:
        check_plan(plan, None, where)
    _check_ids(plan, where, backend)
    assert plan.direction is not None  # checked by check_plan
    return (layer, plan.direction), plan


def _difference(got: ConvProblem, want: ConvProblem) -> str:
    a, b = got.to_dict(), want.to_dict()
    fields = [k for k in b if a.get(k) != b[k]]
    text = "; ".join(f"{k} is {a.get(k)} in the file, {b[k]} expected" for k in fields)
    if fields == ["x_shape"] and a["x_shape"][1:] == b["x_shape"][1:]:
        text += f" (a plan for batch {got.batch}, not {want.batch})"
    return text
