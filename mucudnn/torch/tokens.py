"""Which backend and which forced plans a torch call uses: ``backend=``
instances and WD plan sources, named by tokens that ``ConvConfig`` and the
cache keys can hold (Note [backend tokens])."""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import Any, Mapping, Protocol

import torch

from ..backends import Backend, available_backends, default_name, get_backend
from ..errors import InvalidTypeError, MucudnnError
from ..problem import ConvProblem, Direction, Plan

__all__ = ["PlanSource", "TorchBridgeError", "backend_token", "register_plan_source",
           "plan_source", "backend_for"]


class PlanSource(Protocol):
    """Where forced plans come from (``mucudnn.torch.convert``'s WD mode).

    ``plans_for`` is called when a Convolution is built for ``layer``; it
    returns the plans to install, or None (then the Convolution plans each
    direction itself and the source may remember ``key`` to :func:`forget` it
    once it has plans). ``key_deterministic(key)`` says whether the call asks
    for deterministic plans.
    """

    def plans_for(self, layer: str, problem: ConvProblem, backend: Backend,
                  key: tuple) -> "Mapping[Direction, Plan] | None": ...


#: Backend instances given by the caller, by token, held weakly (Note [backend tokens]).
_BACKEND_OBJECTS: "weakref.WeakValueDictionary[str, Backend]" = weakref.WeakValueDictionary()
#: id(backend) -> (a weak reference to it, its token), for finding a live one's token.
_BACKEND_TOKENS: dict[int, tuple["weakref.ReferenceType[Backend]", str]] = {}
_PLAN_SOURCES: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
_counter = [0]


class TorchBridgeError(MucudnnError, ValueError):
    """A tensor or option mucudnn.torch cannot run (wrong device kind for the backend)."""


# -- tokens ----------------------------------------------------------------------------------
# Note [backend tokens]
# ~~~~~~~~~~~~~~~~~~~~~
# A Backend instance passed as ``backend=`` is named by a token ``"@<n>"``
# (ConvConfig and the cache keys hold strings), registered weakly: the token
# lives exactly as long as the object. A module that was given the instance
# holds it (so its token stays valid), a dropped one is collected with its
# pools, and a token is never reused (a new object, even at a recycled
# address, gets a new token). What holds a backend strongly is bounded: the
# Convolutions of the LRUs here (emptied by :func:`clear`).
def backend_token(backend: "str | Backend | None") -> str:
    """The string form of a ``backend=`` argument ("" for the default).

    Names are checked against :func:`mucudnn.available_backends`; a Backend
    instance is registered (weakly) and named ``"@<n>"`` (Note [backend tokens]).

    >>> backend_token(None), backend_token("NumPy")
    ('', 'numpy')
    """
    if backend is None:
        return ""
    if isinstance(backend, str):
        name = backend.strip().lower()
        if name not in available_backends():
            raise TorchBridgeError(f"backend: expected one of {available_backends()} or None, "
                                   f"got {backend!r}")
        return name
    if isinstance(backend, Backend):
        key = id(backend)
        hit = _BACKEND_TOKENS.get(key)
        if hit is not None and hit[0]() is backend:
            return hit[1]
        with _LOCK:
            _counter[0] += 1
            tok = f"@{_counter[0]}"
            _BACKEND_OBJECTS[tok] = backend
            _BACKEND_TOKENS[key] = (weakref.ref(backend, _forget_token(key, tok)), tok)
            return tok
    raise InvalidTypeError(f"backend: expected a backend name, a mucudnn Backend or None, "
                           f"got {type(backend).__name__}")


def _forget_token(key: int, tok: str) -> Any:
    def forget(_ref: Any) -> None:  # the backend was collected
        hit = _BACKEND_TOKENS.get(key)
        if hit is not None and hit[1] == tok:
            _BACKEND_TOKENS.pop(key, None)
    return forget


def register_plan_source(source: PlanSource, token: "str | None" = None) -> str:
    """Register ``source`` (held weakly) and return its token for ``ConvConfig.plans``
    (a new unique one, or ``token``: a source unpickled in another process keeps its name)."""
    tok = token or f"src-{uuid.uuid4().hex[:16]}"
    if ":" in tok:
        raise TorchBridgeError(f"token: expected no ':' in a plan source token, got {tok!r}")
    with _LOCK:
        _PLAN_SOURCES[tok] = source
    return tok


def plan_source(token: str) -> "PlanSource | None":
    """The plan source registered under ``token``, if it is alive."""
    return _PLAN_SOURCES.get(token)


def backend_for(token: str, device: torch.device) -> Backend:
    if token[:1] == "@" and token not in _BACKEND_OBJECTS:
        raise TorchBridgeError(f"backend: the Backend instance named {token!r} was garbage "
                               "collected (keep a reference to it while it is used; Note "
                               "[backend tokens])")
    if device.type == "cpu":
        if token in ("", "numpy"):
            return get_backend("numpy")
        obj = _BACKEND_OBJECTS.get(token)
        if obj is not None and obj.name == "numpy":
            return obj
        raise TorchBridgeError(
            f"backend: {token if obj is None else obj.name!r} runs CUDA tensors, but the input "
            "is a CPU tensor (CPU tensors run on the 'numpy' backend: backend=None or 'numpy')")
    if device.type != "cuda":
        raise TorchBridgeError(f"input: mucudnn runs CPU and CUDA tensors, got a tensor on {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    # get_backend keeps one backend (so one workspace pool) per (name, device):
    # no memo of its own here.
    obj = _BACKEND_OBJECTS.get(token)
    if obj is not None:
        be = obj
    else:
        try:
            # a CUDA tensor's device exists: no device count (default_name)
            be = get_backend(token or default_name(gpu=True), device=index)
        except TypeError as exc:
            raise TorchBridgeError(
                f"backend: {token or 'the default backend'} cannot run on CUDA device {index} "
                f"({exc}); pick a GPU backend ('cudnn-graph' or 'cudnn')") from exc
    if be.name == "numpy":
        raise TorchBridgeError(
            "backend: the 'numpy' backend takes CPU tensors, but the input is on "
            f"{device} (unset MUCUDNN_BACKEND=numpy or pass backend='cudnn-graph')")
    return be
