"""The environment's switches of :mod:`mucudnn.torch`, each read where it
takes effect: ``MUCUDNN_TORCH_NATIVE`` (:func:`enabled`),
``MUCUDNN_TORCH_REPLAY`` (:func:`replays`), ``MUCUDNN_TORCH_SEARCH``
(:func:`search`) and ``MUCUDNN_TORCH_DEFER`` (:func:`defers`). A value
that is none of a switch's is refused, naming the variable and the values it
takes."""

from __future__ import annotations

import os

from ..errors import InvalidValueError

__all__ = ["enabled", "replays", "search", "defers", "REPLAY_DEFAULT", "SEARCHES"]


#: The values a switch in the environment reads as on, and as off.
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def _read(name: str, allowed: tuple[str, ...], default: str) -> str:
    """The environment's ``name`` in lower case (``default`` where unset or
    empty), refused where it is none of ``allowed``."""
    v = os.environ.get(name, "").strip().lower() or default
    if v not in allowed:
        raise InvalidValueError(f"{name}: expected one of {list(allowed)}, got {v!r}")
    return v


def enabled() -> bool:
    """False while ``MUCUDNN_TORCH_NATIVE`` is ``0``/``off``/``false``/``no``."""
    return os.environ.get("MUCUDNN_TORCH_NATIVE", "1").strip().lower() not in _OFF


#: Whether planned launches replay where ``MUCUDNN_TORCH_REPLAY`` is unset
#: or empty (tools/results_zoo.py labels results against the same default).
REPLAY_DEFAULT = True


def replays() -> bool:
    """``MUCUDNN_TORCH_REPLAY``: ``1``/``on``/``true``/``yes`` replays each
    planned launch as a CUDA graph once its addresses repeat (Note [replay
    after repeated addresses] in :mod:`mucudnn.exec.graph`); ``0``/``off``
    launches directly; unset or empty, :data:`REPLAY_DEFAULT` (on). Read
    when a signature's record is made.

    >>> replays() in (True, False)
    True
    """
    return _read("MUCUDNN_TORCH_REPLAY", _ON + _OFF, "1" if REPLAY_DEFAULT else "0") in _ON


#: ``MUCUDNN_TORCH_SEARCH`` values (Note [plans only over the limit]).
SEARCHES = ("all", "over-limit")


def search() -> str:
    """``MUCUDNN_TORCH_SEARCH``: ``"over-limit"`` (the default) or ``"all"``
    (Note [plans only over the limit]).

    >>> search() in SEARCHES
    True
    """
    return _read("MUCUDNN_TORCH_SEARCH", SEARCHES, "over-limit")


def defers() -> bool:
    """``MUCUDNN_TORCH_DEFER``: ``1``/``on``/``true``/``yes`` (the default)
    runs stand-ins at a signature's first call inside a converted model's steps
    and plans it in a later step; ``0``/``off`` plans at the first call (Note
    [planning after the first step] in :mod:`mucudnn.torch.standin`). Read
    at each first call.

    >>> defers() in (True, False)
    True
    """
    return _read("MUCUDNN_TORCH_DEFER", _ON + _OFF, "1") in _ON
