"""Reading the values' dict form back (what their ``to_dict`` writes and JSON
carries): PlanFormatError, the one error for a dict that describes none, and
the checks every ``from_dict`` makes, naming the field's path
(``micro_batches[1].size``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import InvalidTypeError, InvalidValueError, UnsupportedDtypeError

__all__ = ["PlanFormatError", "check_keys", "construct", "join_path"]


class PlanFormatError(InvalidValueError, KeyError):
    """A dict or JSON text that should describe a Plan (or its problem) does
    not: not an object, a missing or unknown key, or a field of the wrong type
    or value. The message names the field (``micro_batches[1].size: ...``).

    A ValueError, and a KeyError for code that caught the bare KeyError a
    missing key used to raise (with a readable message, unlike KeyError's).
    """

    __str__ = Exception.__str__  # KeyError would quote the message


def join_path(where: str, key: str) -> str:
    """``key`` under the path ``where`` (``""`` at the top)."""
    return f"{where}.{key}" if where else key


def check_keys(d: Any, where: str, what: str, required: Sequence[str],
               optional: Sequence[str] = ()) -> dict[str, Any]:
    """``d`` as a dict after checking it has every required key and no other;
    errors name the path ``where`` (``""`` at the top)."""
    if not isinstance(d, Mapping):
        raise PlanFormatError(f"{where or what}: expected an object (a dict), "
                              f"got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    if missing:
        raise PlanFormatError(f"{join_path(where, missing[0])}: missing from the {what}")
    unknown = [k for k in d if k not in required and k not in optional]
    if unknown:
        raise PlanFormatError(f"{where or what}: unknown key {unknown[0]!r}; expected keys "
                              f"{', '.join(list(required) + list(optional))}")
    return dict(d)


def construct(cls: type, args: dict[str, Any], where: str) -> Any:
    """``cls(**args)``, its field errors re-raised as PlanFormatError under ``where``."""
    try:
        return cls(**args)
    except PlanFormatError:
        raise
    except (InvalidValueError, InvalidTypeError, UnsupportedDtypeError) as exc:
        raise PlanFormatError(f"{where + '.' if where else ''}{exc}") from None
