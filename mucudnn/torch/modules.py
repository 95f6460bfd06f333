"""``Conv1d``, ``Conv2d``, ``Conv3d`` and ``ConvTranspose1d``/``2d``/``3d``:
``torch.nn``'s modules whose convolutions run micro-batched by mucudnn.

They are subclasses with the same constructor (plus keyword-only
``workspace_limit``, ``policy``, ``backend``), the same parameters and the same
``state_dict`` keys, so a model can load either kind's checkpoint. A
``padding_mode`` other than ``"zeros"`` is handled as torch does: ``F.pad``
with that mode, then a convolution without padding. As native convolutions,
they honour ``torch.backends.cudnn.deterministic`` and
``torch.use_deterministic_algorithms(True)`` at every call: deterministic
plans only (see :func:`mucudnn.torch.conv2d`). On a device mucudnn does not
run on (``meta`` tensors for shape inference or deferred initialisation, or
any device but CUDA and the CPU) they run torch's own convolution.

>>> import torch
>>> conv = Conv2d(3, 8, 3, padding=1, workspace_limit=16 << 20)
>>> tuple(conv(torch.randn(2, 3, 8, 8)).shape)
(2, 8, 8, 8)
>>> sorted(conv.state_dict())
['bias', 'weight']
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..backends import Backend
from ..optimizer import DEFAULT_POLICY
from ..typing_aliases import PolicyLike
from . import engine, native, recording
from .functional import (_DEVICE_TYPES, _TRANSPOSED_F, DEFAULT_WORKSPACE_LIMIT, Options,
                         TorchValueError, _convnd, _conv_transposend, options)
from .step_guard import RECORDING
from .step_trial import StepTrial

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
           "MucudnnConvMixin", "MucudnnConvTransposeMixin", "MAX_SETTLED", "MAX_SEEN"]

#: Input signatures a module remembers as settled on PyTorch's own call or as
#: fitting its limit (every settled one fits).
MAX_SETTLED = 8
#: Signatures a module remembers having run, for :func:`mucudnn.torch.report`.
MAX_SEEN = 32
_COMPILING = torch.compiler.is_compiling
_GENERATION = engine.GENERATION
_UNSETTLED: "tuple[int, frozenset, frozenset]" = (-1, frozenset(), frozenset())
_AUTOCAST = torch.is_autocast_enabled
_AUTOCAST_DTYPE = torch.get_autocast_dtype
_TF32 = engine._TF32
_CUDNN_DETERMINISTIC = engine._CUDNN_DETERMINISTIC
_DETERMINISTIC_ALGORITHMS = engine._DETERMINISTIC_ALGORITHMS


def _signature(x: torch.Tensor, w: torch.Tensor) -> tuple:
    """What decides a converted module's verdict for a call: the operands'
    shapes, strides, dtypes and device, CUDA autocast's state, whether the
    input needs its gradient (backward-data runs), and the TF32 and
    determinism flags (as :func:`engine.warm_call`'s key). Only CUDA calls are
    settled (their warm records decide), so autocast is read for CUDA alone:
    another device's call differs in ``x.device`` and never matches. It runs
    on every call of a settled layer, so it calls torch's getters directly."""
    return (x.shape, x.stride(), w.shape, w.stride(), x.dtype, w.dtype, x.device,
            _AUTOCAST("cuda") and _AUTOCAST_DTYPE("cuda"), x.requires_grad, _TF32(),
            _CUDNN_DETERMINISTIC() or _DETERMINISTIC_ALGORITHMS())


class MucudnnConvMixin:
    """What :class:`Conv1d`, :class:`Conv2d` and :class:`Conv3d` add to torch's modules; also
    what :func:`mucudnn.torch.convert` installs on an existing module."""

    _nd: int
    workspace_limit: "int | None"
    policy: Any
    backend: "str | Backend | None"
    _mu_options: Options
    _mu_plans: str
    #: (engine generation, input signatures settled on PyTorch's own
    #: convolution, signatures whose PyTorch workspace fits the limit); Note
    #: [host cost of a converted layer], Note [the whole-step trial]
    _mu_torch: "tuple[int, frozenset, frozenset]" = _UNSETTLED
    #: the model's step trial (set by :func:`mucudnn.torch.convert`)
    _mu_step: "StepTrial | None" = None
    #: set by :func:`mucudnn.torch.convert` (a later convert re-configures the module)
    _mu_converted: bool = False
    #: torch's ``_conv_forward`` for this class (set for each subclass)
    _mu_torch_conv: Any = None
    #: whether the class runs the mixin's own ``_conv_forward``, so that the
    #: step guard may set torch's in its place (Note [guarded steps])
    _mu_guardable: bool = False
    #: the keys of the signatures this module ran (up to :data:`MAX_SEEN`, in
    #: the order first met), which :func:`mucudnn.torch.report` lists it with;
    #: a list made at setup, so that a ``DataParallel`` replica's calls add to
    #: it; None after unpickling (made at the next call)
    _mu_seen: "list[tuple] | None" = None

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None, *,
                 workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
                 policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None) -> None:
        # torch's constructor, then ours (the mixin comes first in the bases)
        super().__init__(in_channels, out_channels, kernel_size, stride=stride,  # type: ignore[call-arg]
                         padding=padding, dilation=dilation, groups=groups, bias=bias,
                         padding_mode=padding_mode, device=device, dtype=dtype)
        self._mu_setup(workspace_limit, policy, backend)

    def extra_repr(self) -> str:
        return super().extra_repr() + self._mu_repr()  # type: ignore[misc]

    def _mu_setup(self, workspace_limit: "int | None", policy: Any,
                  backend: "str | Backend | None", plans: str = "") -> None:
        opts = options(workspace_limit, policy, backend)  # checks them
        self.workspace_limit = workspace_limit
        self.policy = policy
        self.backend = backend
        self._mu_options = opts
        self._mu_plans = plans
        self._mu_torch = _UNSETTLED
        self._mu_seen = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # torch's own ``_conv_forward`` past this mixin in the subclass's order,
        # as ``super()`` finds it, looked up once (the settled path's call)
        cls._mu_torch_conv = getattr(super(MucudnnConvMixin, cls), "_conv_forward", None)
        cls._mu_guardable = cls._mu_torch_conv is not None \
            and cls._conv_forward is MucudnnConvMixin._conv_forward

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor,
                      bias: "torch.Tensor | None") -> torch.Tensor:
        # See Note [host cost of a converted layer]: a signature settled on
        # PyTorch's own convolution runs torch.nn's code alone; so does one whose
        # PyTorch workspace fits while the model's step trial runs PyTorch's
        # (Note [the whole-step trial]). Every call of a settled layer runs this
        # check, so it is the first thing done, with nothing looked up twice.
        # (under torch.compile the signature is not traced: the check stops first)
        # A capture takes the converted path, which runs the GPU's choices
        # (Note [captured steps run the GPU's choice] in mucudnn/torch/native.py).
        # A checked forward of the step guard records each call (Note [guarded steps]).
        gen, settled, fits = self._mu_torch
        if fits and gen == _GENERATION[0] and recording.RECORDER is None and not _COMPILING():
            trial = self._mu_step
            torch_way = trial is not None and trial.torch
            if settled or torch_way:
                sig = _signature(input, weight)
                if (sig in settled or (torch_way and sig in fits)) and not engine.CAPTURING():
                    calls = RECORDING.calls
                    if calls is not None:
                        calls.append((self, sig))
                    return self._mu_torch_conv(input, weight, bias)
        if not _COMPILING() and RECORDING.calls is not None:  # a graph records nothing
            RECORDING.calls.append((self, None))
        if not input.is_cuda and input.device.type not in _DEVICE_TYPES:
            # meta tensors (shape inference, deferred initialisation) and devices
            # mucudnn does not run on: PyTorch's own convolution, as before converting
            return self._mu_torch_conv(input, weight, bias)
        if gen != _GENERATION[0]:  # engine.clear() forgot the verdicts and their records
            gen, settled, fits = self._mu_torch = (_GENERATION[0], frozenset(), frozenset())
            if self._mu_seen:
                self._mu_seen.clear()
        engine.forget_last()
        y = self._mu_forward(input, weight, bias)
        self._mu_note(input, weight, (), gen, settled, fits)
        return y

    def _mu_note(self, input: torch.Tensor, weight: torch.Tensor, extra: tuple, gen: int,
                 settled: frozenset, fits: frozenset) -> None:
        """After a converted call: keep the signature :func:`engine.last_warm` ran
        for the report, and whether it fits the limit or is settled on PyTorch's
        call in every direction a training step runs (:func:`native.all_in_step`)."""
        warm = engine.last_warm()
        if warm is None:
            return
        seen = self._mu_seen
        if seen is None:
            seen = self._mu_seen = []
        if warm.key not in seen and len(seen) < MAX_SEEN:  # a few keys, found by identity
            seen.append(warm.key)
        if len(fits) < MAX_SETTLED:
            skip = native.skipped(input.requires_grad, warm.transposed)
            if native.all_in_step(warm.fits, skip):
                sig = _signature(input, weight) + extra
                if native.all_in_step(warm.native, skip):
                    settled = settled | {sig}
                self._mu_torch = (gen, settled, fits | {sig})

    def _mu_forward(self, input: torch.Tensor, weight: torch.Tensor,
                    bias: "torch.Tensor | None") -> torch.Tensor:
        if self.padding_mode != "zeros":  # type: ignore[attr-defined]
            input = F.pad(input, self._reversed_padding_repeated_twice,  # type: ignore[attr-defined]
                          mode=self.padding_mode)  # type: ignore[attr-defined]
            padding: Any = 0
        else:
            padding = self.padding  # type: ignore[attr-defined]
        return _convnd(self._nd, input, weight, bias, self.stride,  # type: ignore[attr-defined]
                       padding, self.dilation, self.groups,  # type: ignore[attr-defined]
                       self._mu_options, self._mu_plans)

    def __getstate__(self) -> dict:
        # settled signatures are this process's measurements, not the model's
        state: dict = dict(super().__getstate__())  # type: ignore[misc, call-overload]
        state.pop("_mu_torch", None)  # the step trial pickles empty (StepTrial.__getstate__)
        state.pop("_mu_seen", None)
        call = state.get("_conv_forward")  # set only within a guarded forward
        if call is not None and getattr(call, "__func__", None) is type(self)._mu_torch_conv:
            del state["_conv_forward"]
        return state

    def _mu_repr(self) -> str:
        s = f", workspace_limit={self.workspace_limit}, policy={self.policy!r}"
        if self.backend is not None:
            s += f", backend={self.backend!r}"
        if self._mu_plans:
            s += ", mode='wd'"
        return s


class Conv1d(MucudnnConvMixin, nn.Conv1d):
    """``torch.nn.Conv1d`` run micro-batched by mucudnn (as a 2-D convolution
    of height 1, as PyTorch runs it on cuDNN: Note [one-dimensional
    convolutions] in :mod:`.functional`).

    >>> import torch
    >>> m = Conv1d(4, 6, 5, stride=2, padding="valid", groups=2, padding_mode="circular")
    >>> tuple(m(torch.randn(3, 4, 11)).shape)
    (3, 6, 4)
    """

    _nd = 1


class Conv2d(MucudnnConvMixin, nn.Conv2d):
    """``torch.nn.Conv2d`` run micro-batched by mucudnn.

    >>> import torch
    >>> m = Conv2d(4, 4, (3, 5), padding="same", groups=2, padding_mode="reflect")
    >>> tuple(m(torch.randn(1, 4, 6, 7)).shape)
    (1, 4, 6, 7)
    """

    _nd = 2


class Conv3d(MucudnnConvMixin, nn.Conv3d):
    """``torch.nn.Conv3d`` run micro-batched by mucudnn.

    >>> import torch
    >>> m = Conv3d(2, 3, 3, stride=2, bias=False)
    >>> tuple(m(torch.randn(2, 2, 5, 5, 5)).shape)
    (2, 3, 2, 2, 2)
    """

    _nd = 3


class MucudnnConvTransposeMixin(MucudnnConvMixin):
    """What :class:`ConvTranspose1d`, :class:`ConvTranspose2d` and
    :class:`ConvTranspose3d` add to torch's modules (Note [transposed
    convolutions] in :mod:`.transposed`). A signature settled on PyTorch's own
    call runs torch.nn's forward after the check of :class:`MucudnnConvMixin`;
    the step guard (Note [guarded steps]) does not guard these layers."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, output_padding: Any = 0, groups: int = 1, bias: bool = True,
                 dilation: Any = 1, padding_mode: str = "zeros", device: Any = None,
                 dtype: Any = None, *, workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
                 policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None) -> None:
        # torch's constructor (past MucudnnConvMixin's, whose arguments differ), then ours
        super(MucudnnConvMixin, self).__init__(  # type: ignore[call-arg]
            in_channels, out_channels, kernel_size, stride=stride, padding=padding,
            output_padding=output_padding, groups=groups, bias=bias, dilation=dilation,
            padding_mode=padding_mode, device=device, dtype=dtype)
        self._mu_setup(workspace_limit, policy, backend)

    def forward(self, input: torch.Tensor,
                output_size: "list[int] | None" = None) -> torch.Tensor:
        if self.padding_mode != "zeros":  # type: ignore[attr-defined]
            raise TorchValueError(f"padding_mode: only 'zeros' is supported for "
                                  f"{type(self).__name__}, got "
                                  f"{self.padding_mode!r}")  # type: ignore[attr-defined]
        nd = self._nd
        out_pad = self._output_padding(  # type: ignore[attr-defined]
            input, output_size, self.stride, self.padding,  # type: ignore[attr-defined]
            self.kernel_size, nd, self.dilation)  # type: ignore[attr-defined]
        weight, bias = self.weight, self.bias  # type: ignore[attr-defined]
        # See Note [host cost of a converted layer], as in MucudnnConvMixin._conv_forward
        gen, settled, fits = self._mu_torch
        if fits and gen == _GENERATION[0] and recording.RECORDER is None and not _COMPILING():
            trial = self._mu_step
            torch_way = trial is not None and trial.torch
            if settled or torch_way:
                sig = _signature(input, weight) + (tuple(out_pad),)
                if (sig in settled or (torch_way and sig in fits)) and not engine.CAPTURING():
                    return self._mu_torch_call(input, out_pad)
        if not _COMPILING() and RECORDING.calls is not None:  # never guarded: its weight is kept
            RECORDING.calls.append((self, None))
        if not input.is_cuda and input.device.type not in _DEVICE_TYPES:
            return self._mu_torch_call(input, out_pad)
        if gen != _GENERATION[0]:  # engine.clear() forgot the verdicts and their records
            gen, settled, fits = self._mu_torch = (_GENERATION[0], frozenset(), frozenset())
            if self._mu_seen:
                self._mu_seen.clear()
        engine.forget_last()
        y = _conv_transposend(nd, input, weight, bias, self.stride,  # type: ignore[attr-defined]
                              self.padding, out_pad, self.groups,  # type: ignore[attr-defined]
                              self.dilation, self._mu_options,  # type: ignore[attr-defined]
                              self._mu_plans)
        self._mu_note(input, weight, (tuple(out_pad),), gen, settled, fits)
        return y

    def _mu_torch_call(self, input: torch.Tensor, out_pad: Any) -> torch.Tensor:
        """torch.nn's own transposed convolution."""
        return _TRANSPOSED_F[self._nd](
            input, self.weight, self.bias, self.stride, self.padding,  # type: ignore[attr-defined]
            out_pad, self.groups, self.dilation)  # type: ignore[attr-defined]


class ConvTranspose1d(MucudnnConvTransposeMixin, nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` run micro-batched by mucudnn.

    >>> import torch
    >>> m = ConvTranspose1d(4, 6, 3, stride=2, output_padding=1, groups=2)
    >>> tuple(m(torch.randn(3, 4, 5)).shape)
    (3, 6, 12)
    """

    _nd = 1


class ConvTranspose2d(MucudnnConvTransposeMixin, nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` run micro-batched by mucudnn (Note
    [transposed convolutions] in :mod:`.transposed`).

    >>> import torch
    >>> m = ConvTranspose2d(4, 2, 3, stride=2, padding=1)
    >>> tuple(m(torch.randn(1, 4, 5, 5), output_size=[10, 10]).shape)
    (1, 2, 10, 10)
    """

    _nd = 2


class ConvTranspose3d(MucudnnConvTransposeMixin, nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` run micro-batched by mucudnn.

    >>> import torch
    >>> m = ConvTranspose3d(2, 3, 2, stride=2, bias=False)
    >>> tuple(m(torch.randn(1, 2, 2, 2, 2)).shape)
    (1, 3, 4, 4, 4)
    """

    _nd = 3
