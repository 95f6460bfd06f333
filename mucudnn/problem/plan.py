"""What planning makes of a problem: AlgoPerf (one measured configuration),
MicroBatch (one call of a plan) and Plan (a kernel's micro-batch sequence),
each checked when it is made, with their dict (JSON) forms."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import operator
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Union

from ..errors import InvalidTypeError, InvalidValueError
from ..typing_aliases import PolicyLike
from ..units import is_integer
from .conv_problem import ConvProblem, problem_from_dict
from .dict_form import PlanFormatError, check_keys, construct, join_path
from .direction import Direction

__all__ = ["AlgoPerf", "MicroBatch", "Plan", "make_plan", "UNLIMITED_WORKSPACE"]

#: The workspace limit that stands for "unlimited" where an API takes None (1 PiB).
UNLIMITED_WORKSPACE = 1 << 50


@dataclass(frozen=True)
class AlgoPerf:
    """One measured algorithm: ``algo`` is backend-specific (an int for the
    legacy cuDNN API and NumPy, a string engine-config id for the graph API)."""

    algo: Union[int, str]
    time_ms: float
    workspace_bytes: int
    math_type: Union[int, str] = 0
    determinism: Union[int, str, None] = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AlgoPerf":
        return cls(**d)


def _int_field(name: str, v: Any, minimum: int) -> int:
    if not is_integer(v):
        raise InvalidTypeError(f"{name}: expected an int >= {minimum}, got {v!r}")
    n = operator.index(v)
    if n < minimum:
        raise InvalidValueError(f"{name}: expected an int >= {minimum}, got {n}")
    return n


def _id_field(name: str, v: Any) -> Union[int, str]:
    """An algorithm or math-type id: an int (legacy API, NumPy) or a string (graph API)."""
    if isinstance(v, str):
        return v
    if is_integer(v):
        return operator.index(v)
    raise InvalidTypeError(f"{name}: expected an int or a string (the backend's id), got {v!r}")


def _time_field(name: str, v: Any, allow_inf: bool = False) -> float:
    what = "a number >= 0 (milliseconds)" + (" or inf" if allow_inf else ", finite")
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InvalidTypeError(f"{name}: expected {what}, got {v!r}")
    t = float(v)
    if math.isnan(t) or t < 0 or (math.isinf(t) and not allow_inf):
        raise InvalidValueError(f"{name}: expected {what}, got {t!r}")
    return t


@dataclass(frozen=True)
class MicroBatch:
    """One call of a plan: rows [offset, offset + size) with one algorithm.

    ``offset`` is an int >= 0, ``size`` an int >= 1, ``algo`` and ``math_type``
    the backend's ids (ints, or strings for the graph API), ``workspace_bytes``
    an int >= 0 and ``time_ms`` a finite number >= 0; NumPy numbers become
    Python ones.

    >>> MicroBatch(0, 32, algo=1, workspace_bytes=1 << 20, time_ms=0.25).size
    32
    """

    offset: int
    size: int
    algo: Union[int, str]
    math_type: Union[int, str] = 0
    workspace_bytes: int = 0
    time_ms: float = 0.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "offset", _int_field("offset", self.offset, 0))
        set_(self, "size", _int_field("size", self.size, 1))
        set_(self, "algo", _id_field("algo", self.algo))
        set_(self, "math_type", _id_field("math_type", self.math_type))
        set_(self, "workspace_bytes", _int_field("workspace_bytes", self.workspace_bytes, 0))
        set_(self, "time_ms", _time_field("time_ms", self.time_ms))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MicroBatch":
        """The inverse of :meth:`to_dict`; PlanFormatError naming the field otherwise."""
        return _micro_from_dict(d, "")


@dataclass(frozen=True)
class Plan:
    """A micro-batch sequence for one kernel.

    ``workspace_bytes`` is the max over the micro-batches (they run one after
    another on one stream); ``undivided_time_ms`` is the best single call under
    the same limit (``inf`` where none fits), so every plan reports its speedup.
    Fields are checked when a Plan is made (``micro_batches`` a non-empty
    sequence of MicroBatch, becoming a tuple; ``direction`` a Direction or its
    name; times finite and >= 0 except ``undivided_time_ms``, which may be
    ``inf``; ``workspace_limit`` an int >= 0 or None). Whether the micro-batches
    tile a batch is checked where the plan meets its problem (the engine,
    :func:`mucudnn.load_plans`).
    """

    problem: ConvProblem | None
    direction: Direction | None
    micro_batches: tuple[MicroBatch, ...]
    workspace_bytes: int
    time_ms: float
    undivided_time_ms: float
    workspace_limit: int | None
    policy: Any = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.problem is not None and not isinstance(self.problem, ConvProblem):
            raise InvalidTypeError(
                f"problem: expected a ConvProblem or None, got {type(self.problem).__name__}")
        d = self.direction
        if d is not None and not isinstance(d, Direction):
            if not isinstance(d, str):
                raise InvalidTypeError(f"direction: expected a Direction, its name or None, "
                                       f"got {d!r}")
            set_(self, "direction", Direction.parse(d))
        mbs = self.micro_batches
        if isinstance(mbs, (str, bytes, Mapping)) or not hasattr(mbs, "__iter__"):
            raise InvalidTypeError(
                f"micro_batches: expected a sequence of MicroBatch, got {type(mbs).__name__}")
        mbs = tuple(mbs)
        if not mbs:
            raise InvalidValueError("micro_batches: expected at least one MicroBatch, got none")
        for i, m in enumerate(mbs):
            if not isinstance(m, MicroBatch):
                raise InvalidTypeError(
                    f"micro_batches[{i}]: expected a MicroBatch, got {type(m).__name__}")
        set_(self, "micro_batches", mbs)
        set_(self, "workspace_bytes", _int_field("workspace_bytes", self.workspace_bytes, 0))
        set_(self, "time_ms", _time_field("time_ms", self.time_ms))
        set_(self, "undivided_time_ms",
             _time_field("undivided_time_ms", self.undivided_time_ms, allow_inf=True))
        if self.workspace_limit is not None:
            set_(self, "workspace_limit", _int_field("workspace_limit", self.workspace_limit, 0))

    @property
    def batch(self) -> int:
        return sum(m.size for m in self.micro_batches)

    @property
    def speedup(self) -> float:
        """undivided_time_ms / time_ms (``inf`` where no undivided call fits)."""
        return self.undivided_time_ms / self.time_ms if self.time_ms > 0 else float("nan")

    def describe(self) -> str:
        """A short human form: ``"2 x 128"`` or ``"52 + 52 + 48"``."""
        sizes = [m.size for m in self.micro_batches]
        if sizes and all(s == sizes[0] for s in sizes):
            return f"{len(sizes)} x {sizes[0]}" if len(sizes) > 1 else f"{sizes[0]}"
        return " + ".join(str(s) for s in sizes)

    def with_context(self, problem: ConvProblem | None, direction: Direction | None) -> "Plan":
        return dataclasses.replace(self, problem=problem, direction=direction)

    def to_dict(self) -> dict[str, Any]:
        policy = self.policy if isinstance(self.policy, (str, type(None))) else list(self.policy)
        return {
            "problem": self.problem.to_dict() if self.problem is not None else None,
            "direction": self.direction.value if self.direction is not None else None,
            "micro_batches": [m.to_dict() for m in self.micro_batches],
            "workspace_bytes": self.workspace_bytes,
            "time_ms": self.time_ms,
            "undivided_time_ms": _json_float(self.undivided_time_ms),
            "workspace_limit": self.workspace_limit,
            "policy": policy,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        """The inverse of :meth:`to_dict`. Anything else raises
        :class:`PlanFormatError` naming the field; a list (what ``python -m
        mucudnn optimize --json`` writes) points to :func:`mucudnn.load_plans`."""
        return _plan_from_dict(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, s: "str | bytes") -> "Plan":
        """One plan from :meth:`to_json`'s text; :class:`PlanFormatError` otherwise."""
        try:
            d = json.loads(s)
        except ValueError as exc:
            raise PlanFormatError(f"plan: not valid JSON ({exc})") from None
        return cls.from_dict(d)


def _micro_from_dict(d: Any, where: str) -> MicroBatch:
    args = check_keys(d, where, "micro-batch", ("offset", "size", "algo"),
                      ("math_type", "workspace_bytes", "time_ms"))
    return construct(MicroBatch, args, where)


def _plan_from_dict(d: Any, where: str = "") -> "Plan":
    if isinstance(d, list):
        raise PlanFormatError(
            f"{where or 'plan'}: expected one plan (a JSON object), got a list; a list of plans "
            "as 'python -m mucudnn optimize --json' writes it is read by mucudnn.load_plans")
    args = check_keys(d, where, "plan", ("micro_batches", "workspace_bytes", "time_ms",
                                         "undivided_time_ms"),
                      ("problem", "direction", "workspace_limit", "policy"))
    raw = args["micro_batches"]
    if not isinstance(raw, list):
        raise PlanFormatError(f"{join_path(where, 'micro_batches')}: expected a list, "
                              f"got {type(raw).__name__}")
    args["micro_batches"] = tuple(_micro_from_dict(m, join_path(where, f"micro_batches[{i}]"))
                                  for i, m in enumerate(raw))
    if args.get("problem") is not None:
        args["problem"] = problem_from_dict(args["problem"], join_path(where, "problem"))
    if args["undivided_time_ms"] is None:
        args["undivided_time_ms"] = float("inf")
    if isinstance(args.get("policy"), list):
        args["policy"] = tuple(args["policy"])
    for k in ("problem", "direction", "workspace_limit"):
        args.setdefault(k, None)
    return construct(Plan, args, where)


def _json_float(v: float) -> float | None:
    return None if v == float("inf") else v


def make_plan(micro_batches: Iterable[MicroBatch], *, undivided_time_ms: float,
              workspace_limit: int | None, policy: "PolicyLike | None" = None,
              problem: ConvProblem | None = None, direction: Direction | None = None) -> Plan:
    """Build a Plan from its micro-batches, deriving total time and workspace."""
    mbs = tuple(micro_batches)
    return Plan(problem=problem, direction=direction, micro_batches=mbs,
                workspace_bytes=max((m.workspace_bytes for m in mbs), default=0),
                time_ms=sum(m.time_ms for m in mbs), undivided_time_ms=undivided_time_ms,
                workspace_limit=workspace_limit, policy=policy)
