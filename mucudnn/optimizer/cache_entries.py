"""Checking what the benchmark cache reads back: one entry's JSON, parsed defensively.

A cache file may have been edited, truncated or written by something else, so
nothing read from it is trusted. :func:`decode_results` turns the stored text
into AlgoPerfs or raises :class:`BadEntry` saying why; :func:`check_results`
does the same for what is about to be written, so that nothing the reader
would refuse is ever stored. A valid entry is a JSON list (at most
:data:`MAX_RESULTS` items) of flat objects with the AlgoPerf fields:

- ``algo``: an int in [0, 2**31) or a non-empty str of at most :data:`MAX_NAME` characters;
- ``time_ms``: a finite number >= 0; ``workspace_bytes``: an int in [0, 2**63);
- ``math_type`` (default 0): an int in [0, 2**31) or a short str;
- ``determinism`` (default None): None, an int in [0, 2**31) or a short str.

The text is at most :data:`MAX_TEXT` characters and nests at most two levels
(checked before ``json.loads`` runs, so deep nesting cannot recurse).

>>> decode_results('[{"algo": 1, "time_ms": 0.5, "workspace_bytes": 1024}]')
[AlgoPerf(algo=1, time_ms=0.5, workspace_bytes=1024, math_type=0, determinism=None)]
>>> decode_results('[{"algo": null, "time_ms": 0.5, "workspace_bytes": 0}]')  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
mucudnn.optimizer.cache_entries.BadEntry: algo: expected an int in [0, 2**31) or a str ... got None
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable

from ..errors import MucudnnError
from ..problem import AlgoPerf
from ..units import is_integer

__all__ = ["BadEntry", "decode_results", "encode_results", "check_results", "check_cap",
           "MAX_TEXT", "MAX_RESULTS", "MAX_NAME"]

#: Longest stored results text accepted (characters).
MAX_TEXT = 1 << 22
#: Most AlgoPerfs in one entry.
MAX_RESULTS = 4096
#: Longest algo / math_type / determinism string.
MAX_NAME = 512
#: Deepest JSON nesting of a valid entry: a list of flat objects.
MAX_DEPTH = 2
_INT_LIMIT = 1 << 31
_BYTES_LIMIT = 1 << 63
_REQUIRED = frozenset({"algo", "time_ms", "workspace_bytes"})
_FIELDS = _REQUIRED | {"math_type", "determinism"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
#: A list of bracket-free objects: nests two levels at most (most entries match).
_FLAT = re.compile(r"\s*\[\s*(?:\{[^{}\[\]]*\}\s*,?\s*)*\]\s*")


class BadEntry(MucudnnError, ValueError):
    """A stored entry that fails validation (internal: the cache drops the entry)."""


def _name(v: Any, field: str, allow_none: bool = False) -> Any:
    if allow_none and v is None:
        return None
    if isinstance(v, str):
        if 0 < len(v) <= MAX_NAME:
            return v
    elif isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _INT_LIMIT:
        return v
    raise BadEntry(f"{field}: expected {'None, ' if allow_none else ''}an int in [0, 2**31) "
                   f"or a str of 1..{MAX_NAME} characters, got {_short(v)}")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def check_perf(d: Any) -> AlgoPerf:
    """One AlgoPerf from a dict of its fields (or an AlgoPerf), checked; BadEntry otherwise."""
    if isinstance(d, AlgoPerf):
        d = d.to_dict()
    if not isinstance(d, dict):
        raise BadEntry(f"expected an object of AlgoPerf fields, got {_short(d)}")
    if not (d.keys() <= _FIELDS and d.keys() >= _REQUIRED):
        raise BadEntry(f"expected the fields {sorted(_REQUIRED)} (and optionally math_type, "
                       f"determinism), got {sorted(map(str, d))[:8]}")
    t = d["time_ms"]
    if isinstance(t, bool) or not isinstance(t, (float, int)) or not 0 <= t < math.inf:
        raise BadEntry(f"time_ms: expected a finite number >= 0, got {_short(t)}")
    ws = d["workspace_bytes"]
    if isinstance(ws, bool) or not isinstance(ws, int) or not 0 <= ws < _BYTES_LIMIT:
        raise BadEntry(f"workspace_bytes: expected an int in [0, 2**63), got {_short(ws)}")
    return AlgoPerf(_name(d["algo"], "algo"), float(t), ws,
                    _name(d.get("math_type", 0), "math_type"),
                    _name(d.get("determinism"), "determinism", allow_none=True))


def check_results(results: Iterable[Any]) -> list[AlgoPerf]:
    """Every item checked by :func:`check_perf`; BadEntry on the first bad one."""
    out = [check_perf(r) for r in results]
    if len(out) > MAX_RESULTS:
        raise BadEntry(f"expected at most {MAX_RESULTS} results, got {len(out)}")
    return out


def encode_results(results: Iterable[Any]) -> str:
    """The stored text of ``results`` (checked first).

    >>> encode_results([AlgoPerf(0, 2.0, 0)])
    '[{"algo": 0, "time_ms": 2.0, "workspace_bytes": 0, "math_type": 0, "determinism": null}]'
    """
    return json.dumps([r.to_dict() for r in check_results(results)], allow_nan=False)


def _depth(text: str) -> int:
    """The deepest bracket nesting of ``text``, strings skipped (an upper bound for bad JSON)."""
    depth = deepest = 0
    for b in _BRACKET.findall(_STRING.sub("", text)):
        if b in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_constants(name: str) -> Any:
    raise BadEntry(f"time_ms: expected a finite number, got {name}")


def decode_results(text: Any) -> list[AlgoPerf]:
    """The AlgoPerfs stored as ``text``; BadEntry when anything about it is wrong."""
    if not isinstance(text, str):
        raise BadEntry(f"results: expected JSON text, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise BadEntry(f"results: {len(text)} characters, more than {MAX_TEXT}")
    if _FLAT.fullmatch(text) is None and _depth(text) > MAX_DEPTH:  # fast path: [{..}, ..]
        raise BadEntry(f"results: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except BadEntry:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, int digit limits
        raise BadEntry(f"results: not valid JSON ({_short(str(exc))})") from None
    if not isinstance(data, list):
        raise BadEntry(f"results: expected a JSON list, got {type(data).__name__}")
    return check_results(data)


def check_cap(cap: Any) -> int:
    """A stored workspace cap: an int in [0, 2**63); BadEntry otherwise."""
    if not is_integer(cap) or not 0 <= cap < _BYTES_LIMIT:
        raise BadEntry(f"workspace_cap: expected an int in [0, 2**63), got {_short(cap)}")
    return int(cap)
