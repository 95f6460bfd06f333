"""``convert(model)``: run every convolution of a model micro-batched.

Conversion is in place: each module of type exactly ``nn.Conv1d``,
``nn.Conv2d``, ``nn.Conv3d`` or ``nn.ConvTranspose1d``/``2d``/``3d`` becomes
mucudnn's module of that name (:class:`~mucudnn.torch.Conv2d`,
:class:`~mucudnn.torch.ConvTranspose2d`, ...; its class is
swapped, as torch's lazy modules do), so it keeps its identity, its
``Parameter`` objects (an optimizer made before ``convert`` keeps working),
its hooks and its ``state_dict`` keys. Also converted:

* ``nn.LazyConv1d``/``2d``/``3d`` and ``nn.LazyConvTranspose1d``/``2d``/``3d``
  (Note [lazy transposed convolutions]) not yet materialised: they become
  mucudnn's modules when their first forward materialises them (their
  ``cls_to_become``), that forward included;
* parametrized convolutions (``torch.nn.utils.parametrizations.weight_norm``,
  ``spectral_norm``, ``torch.nn.utils.parametrize``): their class becomes a
  parametrized mucudnn class (``remove_parametrizations`` then leaves a
  mucudnn module);
* modules an earlier ``convert`` converted: they take the new options and
  mode (Note [converting again]).

Other subclasses of these classes (which may override ``forward``) are left
native with a :class:`ConvertWarning` naming them (their workspace is then
PyTorch's, not held to the limit); mucudnn modules built directly keep the
options they were built with. A transposed convolution runs as the
backward-data of the convolution it is the adjoint of (Note [transposed
convolutions] in :mod:`.transposed`).

Two modes:

* ``"wr"`` (workspace reuse, the default): every kernel (layer and direction)
  is planned on its own under ``workspace_limit``; plans share one workspace
  buffer per device, so the memory held is the largest plan's workspace.
* ``"wd"`` (workspace division): all convolutions of the model are planned
  jointly under one budget ``total_workspace`` through
  :func:`mucudnn.optimize_network` (the integer program). Their shapes are
  known only when the model runs, so planning happens at the **first
  forward**: that forward runs each convolution with a plan of its own under
  ``total_workspace`` (benchmarks at that cap are what the joint plan needs
  anyway, so the benchmark cache serves both) and records its problem; when
  the converted module's forward returns, the recorded problems are planned
  jointly and the chosen plans installed, so the first backward pass and
  every later call use them. Each new set of shapes (another batch size) is
  planned the same way once. With gradients enabled at that moment all three
  directions are planned, otherwise the forward direction only (the others
  are then planned on their own under ``total_workspace`` if ever run).
  Warm up before capturing CUDA graphs: nothing may be planned in a capture.

In both modes, while ``torch.backends.cudnn.deterministic`` or
``torch.use_deterministic_algorithms(True)`` is on, the plans use only the
configurations cuDNN marks deterministic (read at every call, so a change
takes effect at the next call; in WD mode the next forward plans jointly
again under the new setting): training is then bitwise reproducible run to
run as far as the convolutions go.

>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))
>>> w = model[0].weight
>>> model = convert(model, workspace_limit=32 << 20)
>>> type(model[0]).__name__, model[0].weight is w
('Conv2d', True)
>>> tuple(model(torch.randn(2, 3, 6, 6)).shape)
(2, 4, 6, 6)
"""

from __future__ import annotations

import logging
import numbers
import threading
import warnings
from typing import Any, Mapping, cast

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..backends import Backend
from ..caches import LRU
from ..optimizer import DEFAULT_POLICY, optimize_network
from ..problem import ConvProblem, Direction, Plan
from ..typing_aliases import PolicyLike
from . import engine, step_guard, step_trial
from .functional import DEFAULT_WORKSPACE_LIMIT, TorchTypeError, TorchValueError, options
from .modules import (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d,
                      MucudnnConvMixin)

__all__ = ["convert", "WDPlanner", "MODES", "ConvertWarning"]

log = logging.getLogger("mucudnn")

MODES = ("wr", "wd")
_CLASSES: dict[type, type] = {nn.Conv1d: Conv1d, nn.Conv2d: Conv2d, nn.Conv3d: Conv3d,
                              nn.ConvTranspose1d: ConvTranspose1d,
                              nn.ConvTranspose2d: ConvTranspose2d,
                              nn.ConvTranspose3d: ConvTranspose3d}
_LAZY: dict[type, type] = {nn.LazyConv1d: Conv1d, nn.LazyConv2d: Conv2d,
                           nn.LazyConv3d: Conv3d, nn.LazyConvTranspose1d: ConvTranspose1d,
                           nn.LazyConvTranspose2d: ConvTranspose2d,
                           nn.LazyConvTranspose3d: ConvTranspose3d}
#: The convolutions :func:`convert` leaves native and says so (ConvertWarning).
_NATIVE_KINDS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                 nn.ConvTranspose3d)


# Note [lazy transposed convolutions]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A lazy module becomes its ``cls_to_become`` in a forward pre-hook, after
# ``nn.Module.__call__`` has bound the forward it will run: the lazy class's.
# A lazy ``Conv*d``'s forward calls ``self._conv_forward``, which the new
# class provides, so that first forward is mucudnn's; a lazy
# ``ConvTranspose*d``'s forward runs ``F.conv_transpose*d`` itself, so the call
# that materialises it is torch's own (its workspace PyTorch's) and every later
# one mucudnn's.


class ConvertWarning(UserWarning):
    """:func:`convert` left a convolution native (the message names it)."""


class WDPlanner:
    """The joint (WD) planner of one converted model (see the module doc).

    ``plans`` maps ``(layer name, problem key)`` to ``{Direction: Plan}`` for
    every problem planned so far (under the determinism torch asks for now:
    deterministic and other plans are kept apart); :meth:`plan_pending` plans
    the problems seen since the last call. It is reachable as
    ``model.mucudnn_planner``.
    """

    def __init__(self, total_workspace: int, policy: PolicyLike, backend: str,
                 token: "str | None" = None) -> None:
        self.total_workspace = int(total_workspace)
        self.policy = policy
        self.backend = backend
        #: keyed by (layer name, problem key, deterministic)
        self._plans: "LRU[tuple[str, str, bool], dict[Direction, Plan]]" = LRU("torch.wd_plans",
                                                                                4096)
        self._pending: dict[tuple[str, str, bool], tuple[ConvProblem, Backend, tuple]] = {}
        self._lock = threading.Lock()
        self.token = engine.register_plan_source(self, token)

    # A copied model (copy.deepcopy) shares its planner, whose token its layers
    # name; a pickled one gets a fresh planner under the same token (plans are
    # made again at its first forward).
    def __deepcopy__(self, memo: dict) -> "WDPlanner":
        return self

    def __reduce__(self) -> tuple:
        return (_restore_planner, (self.total_workspace, self.policy, self.backend, self.token))

    # engine.PlanSource
    def plans_for(self, layer: str, problem: ConvProblem, backend: Backend,
                  key: tuple) -> "Mapping[Direction, Plan] | None":
        name = (layer, problem.key(), engine.key_deterministic(key))
        hit = self._plans.get(name)
        if hit is not None:
            return hit
        with self._lock:
            self._pending[name] = (problem, backend, key)
        return None

    @property
    def plans(self) -> dict[tuple[str, str], dict[Direction, Plan]]:
        """``{(layer name, problem key): {Direction: Plan}}`` planned so far (a copy),
        deterministic ones while torch asks for determinism (:func:`engine.deterministic`),
        the others otherwise."""
        det = engine.deterministic()
        return {k[:2]: dict(v) for k in self._plans.keys()
                if k[2] == det and (v := self._plans.get(k)) is not None}

    @property
    def pending(self) -> int:
        """How many recorded problems wait for the joint plan."""
        return len(self._pending)

    def plan_pending(self, directions: "tuple[Direction, ...] | None" = None) -> int:
        """Plan every recorded problem jointly (one integer program per device)
        under ``total_workspace`` and install the plans; returns how many."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        try:
            self._plan(pending, directions)
        except BaseException:
            with self._lock:  # keep them for the next forward
                self._pending = {**pending, **self._pending}
            raise
        return len(pending)

    def _plan(self, pending: dict, directions: "tuple[Direction, ...] | None") -> None:
        dirs = directions or (Direction.FORWARD, Direction.BACKWARD_DATA,
                              Direction.BACKWARD_FILTER)
        # one joint plan per backend and determinism (Note [deterministic plans])
        groups: dict[tuple[int, bool],
                     tuple[Backend, dict[tuple[str, str, bool], ConvProblem]]] = {}
        for name, (problem, be, _key) in pending.items():
            groups.setdefault((id(be), name[2]), (be, {}))[1][name] = problem
        for (_, det), (be, problems) in groups.items():
            chosen = optimize_network(problems, self.total_workspace, directions=dirs,
                                      policy=self.policy, backend=be, deterministic=det)
            got: dict[tuple[str, str, bool], dict[Direction, Plan]] = {}
            for (name, d), plan in chosen.items():
                got.setdefault(name, {})[d] = plan
            for name, plans in got.items():
                self._plans.put(name, plans)
            log.info("mucudnn.torch: WD plans for %d convolutions under %d bytes: %d bytes of "
                     "workspace in all", len(problems), self.total_workspace,
                     sum(p.workspace_bytes for p in chosen.values()))
        for _problem, _be, key in pending.values():
            engine.forget(key)  # rebuilt with the plans at the next call


def _restore_planner(total_workspace: int, policy: Any, backend: str, token: str) -> WDPlanner:
    live = engine.plan_source(token)
    if isinstance(live, WDPlanner):
        return live
    return WDPlanner(total_workspace, policy, backend, token=token)


def _after_forward(module: nn.Module, args: Any, output: Any) -> None:
    planner = getattr(module, "mucudnn_planner", None)
    if planner is not None and planner.pending:
        dirs = None if torch.is_grad_enabled() else (Direction.FORWARD,)
        planner.plan_pending(dirs)


# Note [the WD hook outside torch.compile]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The WD forward hook plans in Python and must not be traced, so it calls
# :func:`_after_forward` wrapped in ``torch.compiler.disable``. That wrapper
# imports torch._dynamo, a long import, so it is made at the first WD
# convert, not when mucudnn.torch is imported: a WR model, the default, never
# pays it. The hook is one object whose pickle refers to it, so a WD model
# pickles and copies (a function made at run time would not).
class _WDHook:
    """The WD forward hook (Note [the WD hook outside torch.compile])."""

    def __init__(self) -> None:
        self._fn = torch.compiler.disable(_after_forward)

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        self._fn(module, args, output)

    def __reduce__(self) -> tuple:
        return (_wd_hook, ())


_WD_HOOK: "list[_WDHook]" = []


def _wd_hook() -> _WDHook:
    """The one :class:`_WDHook`, made on first use."""
    if not _WD_HOOK:
        _WD_HOOK.append(_WDHook())
    return _WD_HOOK[0]


# Note [converting again]
# ~~~~~~~~~~~~~~~~~~~~~~~
# ``convert`` run again over a model (a re-run notebook cell, or new options)
# re-configures every module an earlier ``convert`` converted with the new
# options and mode, so none keeps naming a planner that is gone. The WD
# planners and their forward hooks found in the converted tree are removed
# first; a WD convert with the same budget, policy and backend as the planner
# already on ``module`` keeps that planner (and the plans it has made).
def _reuse_planner(module: nn.Module, planner: WDPlanner) -> WDPlanner:
    old = module.__dict__.get("mucudnn_planner")
    if isinstance(old, WDPlanner) and (old.total_workspace, old.backend, _policy_key(old.policy)) \
            == (planner.total_workspace, planner.backend, _policy_key(planner.policy)):
        return old
    return planner


def _policy_key(policy: Any) -> str:
    return options(None, policy, None).policy


def _drop_planners(module: nn.Module) -> None:
    for m in module.modules():
        if "mucudnn_planner" in m.__dict__:
            del m.mucudnn_planner
        hooks = m._forward_hooks
        for key in [k for k, h in hooks.items() if isinstance(h, _WDHook)]:
            del hooks[key]


def _convert_one(m: nn.Module) -> bool:
    """Make ``m`` a mucudnn convolution where :func:`convert` converts it; False
    where it is not one to convert."""
    cls = type(m)
    target = _CLASSES.get(cls)
    if target is not None:
        m.__class__ = target
        return True
    target = _LAZY.get(cls)
    if target is not None:  # materialised by its first forward, as target
        m.cls_to_become = target  # type: ignore[assignment]
        return True
    if isinstance(m, MucudnnConvMixin):
        return bool(getattr(m, "_mu_converted", False))
    if parametrize.is_parametrized(m) and cls.__bases__[0] in _CLASSES:
        # the class parametrize made (properties, __getstate__, __deepcopy__), over ours
        body = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
        m.__class__ = type(cls.__name__, (_CLASSES[cls.__bases__[0]],), body)
        return True
    return False


def convert(module: nn.Module, *, workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
            policy: PolicyLike = DEFAULT_POLICY, mode: str = "wr",
            total_workspace: "int | None" = None,
            backend: "str | Backend | None" = None) -> nn.Module:
    """Make every ``nn.Conv1d``/``Conv2d``/``Conv3d`` and
    ``nn.ConvTranspose1d``/``2d``/``3d`` in ``module`` (itself included,
    nested ones too) run micro-batched, in place; returns ``module``.
    Subclasses it does not know stay native, with a :class:`ConvertWarning`
    naming them.

    ``mode="wr"``: each kernel planned on its own under ``workspace_limit``
    bytes. ``mode="wd"``: all kernels planned jointly under
    ``total_workspace`` bytes at the first forward (see the module doc;
    ``workspace_limit`` is then unused). ``policy`` and ``backend`` are as in
    :func:`mucudnn.torch.conv2d`.

    >>> from torch import nn
    >>> m = convert(nn.Sequential(nn.Conv2d(1, 2, 3)), mode="wd", total_workspace=1 << 20)
    >>> m.mucudnn_planner.total_workspace, m[0].extra_repr().endswith("mode='wd'")
    (1048576, True)
    """
    if not isinstance(module, nn.Module):
        raise TorchTypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if mode not in MODES:
        raise TorchValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    planner = None
    if mode == "wd":
        if total_workspace is None:
            raise TorchValueError("total_workspace: mode='wd' needs a total workspace budget in "
                                  "bytes, got None")
        if isinstance(total_workspace, bool) or not isinstance(total_workspace, numbers.Integral):
            raise TorchTypeError(f"total_workspace: expected an int (bytes), got {total_workspace!r}")
        if total_workspace < 0:
            raise TorchValueError(f"total_workspace: expected >= 0 bytes, got {total_workspace}")
        opts = options(int(total_workspace), policy, backend)
        planner = WDPlanner(int(total_workspace), policy, opts.backend)
    else:
        if total_workspace is not None:
            raise TorchValueError("total_workspace: only mode='wd' takes a total budget; "
                                  "mode='wr' limits each kernel with workspace_limit")
        options(workspace_limit, policy, backend)  # check before touching the model
    if planner is not None:
        planner = _reuse_planner(module, planner)
    _drop_planners(module)
    trial = step_trial.install(module)  # Note [the whole-step trial]
    step_guard.install(module, trial)  # Note [guarded steps]
    converted, native = 0, []
    for name, m in module.named_modules():
        if not _convert_one(m):
            if isinstance(m, _NATIVE_KINDS) and not isinstance(m, MucudnnConvMixin):
                native.append(f"{name or '(the module)'} ({type(m).__name__})")
            continue
        # a lazy module becomes a mixin only once materialised: its attributes first
        mu = cast(MucudnnConvMixin, m)
        if planner is not None:
            MucudnnConvMixin._mu_setup(mu, int(total_workspace),  # type: ignore[arg-type]
                                       policy, backend, plans=f"{planner.token}:{name}")
        else:
            MucudnnConvMixin._mu_setup(mu, workspace_limit, policy, backend)
        mu._mu_converted = True
        mu._mu_step = trial
        converted += 1
    if native:
        warnings.warn(f"mucudnn.torch.convert: left native, their workspace not held to the "
                      f"limit (subclasses of torch.nn's convolutions it does not know): "
                      f"{', '.join(native)}", ConvertWarning, stacklevel=2)
    if planner is not None:
        module.mucudnn_planner = planner  # type: ignore[assignment]
        module.register_forward_hook(_wd_hook())
    log.info("mucudnn.torch: converted %d convolution(s) (mode %s)", converted, mode)
    return module
