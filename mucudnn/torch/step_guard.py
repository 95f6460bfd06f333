"""The step guard: settled layers run torch.nn's call with no check of their own
in steps whose inputs match two checked ones.

Note [guarded steps]
~~~~~~~~~~~~~~~~~~~~
A converted layer settled on PyTorch's own convolution (Note [host cost of a
converted layer] in :mod:`.native`) still checks each call's signature before
it runs torch.nn's ``_conv_forward``: about a dozen tensor and flag reads and
a set lookup. In a tight loop that is a few microseconds; inside a model's
forward, between other layers' code, it is several times that, and where the
host bounds the step it is the step's time (Note [the whole-step trial]).

What decides a layer's signatures is the forward's arguments, the layers'
weights and the global flags; the code between them decides the same
signatures at every call unless data decides shapes. So, as torch.compile's
guards do, the check moves to the step. :class:`StepGuard` (a forward pre-
and post-hook on the root :func:`mucudnn.torch.convert` was given) keys each
training forward (module in training mode, gradients enabled) on its
arguments (each tensor's shape, strides, dtype, device and gradient need;
plain scalars by value), CUDA autocast's state, the TF32 and determinism
flags and the engine's generation (:func:`mucudnn.torch.clear` starts again).
Forwards under one key are checked as before, and every converted layer's
calls are recorded (its signatures, and whether each ran PyTorch's settled
call). Once two consecutive forwards of one key agree for a layer (the same
signatures in the same order, every one settled), the layer is guarded for
that key. In each later forward of the key, each guarded layer runs with
torch.nn's own ``_conv_forward`` set on the instance, so no mucudnn code runs
between torch.nn and the convolution; the post-hook (which also runs when the
forward raises) takes it away, so calls outside the root's forward are
checked as before. The layers not guarded yet go on being checked and
recorded, and join once two forwards agree for them (a verdict settled late).
The key also holds the weights (shape, strides, dtype, device) of every layer
those forwards called: a weight's layout decides the layouts after it
(PyTorch's convolution follows it, Note [the layout PyTorch suggests] in
:mod:`.layout`), so a changed one starts the key again.

Nothing is guarded while the model's step trial runs (which signatures run
PyTorch's call depends on the way it tries), under CUDA-graph capture,
``torch.compile`` (a part compiled on its own records nothing, so its layers
stay as its graph holds them and no instance attribute trips its guards) or
a ``mode="wd"`` recording, in a ``DataParallel``
replica, for a forward with an argument that is neither a tensor nor a plain
scalar (a list of images: detection models, whose head shapes data decides),
or for a layer whose calls differed between the two checked forwards. What
stays unchecked is a layer whose input shapes data decides yet came out the
same in both checked forwards; that one may run PyTorch's call for a shape
never compared, with PyTorch's own result and workspace.
"""

from __future__ import annotations

import threading
import types
from typing import Any, Optional

import torch
from torch import nn

from . import engine, recording
from .step_trial import StepTrial

__all__ = ["StepGuard", "guard_of", "install", "drop"]

_COMPILING = torch.compiler.is_compiling
_AUTOCAST = torch.is_autocast_enabled
_AUTOCAST_DTYPE = torch.get_autocast_dtype
_SCALARS = (bool, int, float, str, type(None))
#: the instance attribute a guarded layer's torch.nn call is set under
_ATTR = "_conv_forward"


class _Recording(threading.local):
    #: (layer, signature or None) of every converted call in the calling thread's
    #: checked forward, None outside one (:class:`StepGuard`); None for a call
    #: that did not run PyTorch's settled call
    calls: "list[tuple[Any, Optional[tuple]]] | None" = None


#: read by :class:`~mucudnn.torch.modules.MucudnnConvMixin` on every call it checks
RECORDING = _Recording()


class _Unguarded(Exception):
    """An argument the key cannot hold."""


def _arg_key(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return (a.shape, a.stride(), a.dtype, a.device, a.requires_grad)
    if type(a) in _SCALARS:
        return (type(a), a)
    raise _Unguarded


def _key(args: tuple, kwargs: dict) -> Optional[tuple]:
    """What decides a training forward's layer signatures besides the code and
    the weights (Note [guarded steps]); None where an argument cannot be keyed."""
    try:
        return (tuple(_arg_key(a) for a in args),
                tuple((k, _arg_key(v)) for k, v in kwargs.items()),
                _AUTOCAST("cuda") and _AUTOCAST_DTYPE("cuda"), engine._TF32(),
                engine.deterministic(), engine.GENERATION[0])
    except _Unguarded:
        return None


def _weight_key(layer: nn.Module) -> tuple:
    """A converted layer's weight as its signatures hold it (the parameter read
    from the module's dict where it is one: ``nn.Module.__getattr__`` is Python)."""
    w: Any = layer._parameters.get("weight")
    if w is None:
        w = layer.weight  # a parametrised weight
    return (w.shape, w.stride(), w.dtype, w.device)


class StepGuard:
    """One converted model's guard (Note [guarded steps]): ``guarded`` holds
    the layers validated for the current key, ``weights`` the weight of every
    converted layer the validated forwards called.

    >>> g = StepGuard(StepTrial())
    >>> g.guarded, g.key
    ((), None)
    """

    def __init__(self, trial: StepTrial) -> None:
        self.trial = trial
        self._reset(None)

    def _reset(self, key: Optional[tuple]) -> None:
        self.key = key
        #: the last forward's checked calls per layer (those not guarded), under ``key``
        self.previous: "dict[nn.Module, tuple] | None" = None
        #: (layer, torch.nn's call bound to it), validated for ``key``
        self.guarded: "tuple[tuple[nn.Module, Any], ...]" = ()
        #: layer -> :func:`_weight_key` of every layer the validating forwards
        #: called: part of the key, as a weight's layout decides the layouts after it
        self.weights: "dict[nn.Module, tuple]" = {}
        #: the guarded layers set on in the forward now running (``guarded``'s own tuple)
        self._armed: "tuple[tuple[nn.Module, Any], ...]" = ()

    # settled measurements are this process's, not the model's
    def __getstate__(self) -> dict:
        return {"trial": self.trial}

    def __setstate__(self, state: dict) -> None:
        self.trial = state["trial"]
        self._reset(None)

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The forward pre-hook: arm the guarded layers, or record a checked forward."""
        if _COMPILING():
            return
        RECORDING.calls = None
        if self.trial.kept is None and (self.key is not None or self.guarded):
            self._reset(None)  # mucudnn.torch.clear() started the trial again
        if self.trial.kept is None or not module.training or not torch.is_grad_enabled() \
                or recording.RECORDER is not None or engine.CAPTURING() \
                or getattr(module, "_is_replica", False):
            return
        key = _key(args, kwargs)
        if key is None:
            self._reset(None)
            return
        if key != self.key or any(_weight_key(layer) != k for layer, k in self.weights.items()):
            self._reset(key)
        for layer, call in self.guarded:
            layer.__dict__[_ATTR] = call
        self._armed = self.guarded
        RECORDING.calls = []  # the layers not guarded yet

    def post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """The forward hook (run also when the forward raises): disarm, or
        compare the checked forward with the one before it."""
        if _COMPILING():
            return
        for layer, _ in self._armed:
            layer.__dict__.pop(_ATTR, None)
        self._armed = ()
        calls, RECORDING.calls = RECORDING.calls, None
        if calls is None or output is None:
            return
        per: dict[nn.Module, list] = {}
        for layer, sig in calls:
            per.setdefault(layer, []).append(sig)
        now = {layer: tuple(sigs) for layer, sigs in per.items()}
        previous, self.previous = self.previous, now
        if previous is None:
            return
        # a subclass with its own _conv_forward, or an instance given one, keeps it
        more = tuple(
            (layer, types.MethodType(type(layer)._mu_torch_conv, layer))  # type: ignore[attr-defined]
            for layer, sigs in now.items()
            if previous.get(layer) == sigs and all(s is not None for s in sigs)
            and getattr(layer, "_mu_guardable", False) and _ATTR not in layer.__dict__)
        self.guarded += more
        if self.guarded:
            for layer in now:
                self.weights.setdefault(layer, _weight_key(layer))


def guard_of(module: nn.Module) -> Optional[StepGuard]:
    """The :class:`StepGuard` hooked on ``module`` (None where there is none)."""
    for hook in module._forward_pre_hooks.values():
        guard = getattr(hook, "__self__", None)
        if isinstance(guard, StepGuard):
            return guard
    return None


def install(module: nn.Module, trial: StepTrial) -> StepGuard:
    """Hook a fresh :class:`StepGuard` for ``trial`` on ``module`` (dropping
    every one in its tree)."""
    drop(module)
    guard = StepGuard(trial)
    module.register_forward_pre_hook(guard.pre, with_kwargs=True)
    module.register_forward_hook(guard.post, with_kwargs=True, always_call=True)
    return guard


def drop(module: nn.Module) -> None:
    """Remove every :class:`StepGuard` hooked in ``module``'s tree."""
    for m in module.modules():
        for hooks in (m._forward_pre_hooks, m._forward_hooks):
            for key in [k for k, h in hooks.items()
                        if isinstance(getattr(h, "__self__", None), StepGuard)]:
                del hooks[key]
