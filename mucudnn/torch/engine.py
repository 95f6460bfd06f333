"""The bridge between torch tensors and :class:`mucudnn.Convolution`.

Everything here runs *outside* autograd: it takes plain tensors in torch's
logical shapes (x ``(N, C, *spatial)``, w ``(K, C/groups, *kernel)``), picks
the memory layout, finds (or builds) the :class:`~mucudnn.Convolution` of the
problem in a bounded cache, and calls its ``forward`` / ``backward_data`` /
``backward_filter`` with outputs allocated through torch's allocator.

* Layout: channels-first (NCHW/NCDHW) unless ``x`` or ``w`` is in
  ``torch.channels_last``/``channels_last_3d`` memory format, as cuDNN under
  PyTorch chooses; then the tensors are used as NHWC/NDHWC views (a
  channels-last NCHW tensor permuted to ``(N, H, W, C)`` is contiguous: no
  copy) and results come back permuted to torch's logical order, i.e. in the
  channels-last memory format.
* CPU tensors run on the NumPy backend through NumPy views of the tensors
  (bfloat16 through an int16 view and ``ml_dtypes.bfloat16``); CUDA tensors
  are passed to the engine as torch tensors (zero-copy), on the backend
  ``mucudnn.get_backend(backend, device=index)`` of their device.
* Determinism: while ``torch.backends.cudnn.deterministic`` or
  ``torch.use_deterministic_algorithms(True)`` is on, calls plan with the
  configurations cuDNN marks deterministic only (``Convolution(...,
  deterministic=True)``; Note [deterministic plans] in
  :mod:`mucudnn.optimizer.benchmark`), so that results are bitwise
  reproducible run to run. Both flags are read at every call, as the TF32
  flag is, and are part of the cache key: a change takes effect at the next
  call. (The NumPy backend, for CPU tensors, is deterministic either way.)
* A Convolution is kept per distinct (shapes, dtype, layout, math mode,
  options, device, determinism) in an LRU of :data:`MAX_CONVOLUTIONS`
  entries named ``"torch.convolutions"`` (:func:`mucudnn.caches.clear_all`
  empties it). A new batch size is a new problem and gets its own
  Convolution (and plans).

>>> import torch
>>> cfg = ConvConfig((1, 1), (1, 1), (1, 1), 1, 64 << 20, "powerOfTwo", "", "")
>>> y = forward(torch.ones(2, 3, 5, 5), torch.ones(4, 3, 3, 3), None, cfg)
>>> tuple(y.shape), float(y[0, 0, 2, 2])
((2, 4, 5, 5), 27.0)
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, NamedTuple

import torch

from ..api import Convolution
from ..caches import LRU
from ..errors import MucudnnError, UnsupportedDtypeError
from ..exec.arrays import torch_workspace
from ..problem import ConvProblem, Direction
from . import native as _native, settings as _settings, standin as _standin
from .layout import (BIAS_VIEW as _BIAS_VIEW, CL as _CL, LAYOUT as _LAYOUT, channels_last,
                     empty as _empty, packed as _packed, to_numpy as _numpy, view as _view)
from .tokens import (PlanSource, TorchBridgeError, backend_for as _backend_for, backend_token,
                     plan_source, register_plan_source)

__all__ = ["ConvConfig", "MAX_CONVOLUTIONS", "DTYPES", "PlanSource", "backend_token",
           "convolution", "deterministic", "forward", "backward", "warm_call",
           "key_deterministic", "output_shape", "plan_source", "register_plan_source",
           "TorchBridgeError",
           "clear"]

log = logging.getLogger("mucudnn")

#: Bound of the cache of Convolutions (one per distinct problem and options).
MAX_CONVOLUTIONS = 512

#: torch dtypes mucudnn convolves, by mucudnn's name.
DTYPES: dict[torch.dtype, str] = {torch.float32: "float32", torch.float16: "float16",
                                  torch.bfloat16: "bfloat16", torch.float64: "float64"}


class ConvConfig(NamedTuple):
    """Everything of a convolution that is not a tensor (hashable; the custom
    ops take the same fields as separate arguments).

    ``workspace_limit`` is -1 for no limit; ``backend`` is "" for the default
    (or a token from :func:`backend_token`); ``plans`` is "" or the token of a
    registered :class:`PlanSource` followed by ``":"`` and a layer name.
    """

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    workspace_limit: int
    policy: str
    backend: str
    plans: str


_CONVS: "LRU[tuple, Convolution]" = LRU("torch.convolutions", MAX_CONVOLUTIONS)


def _policy(policy: str) -> Any:
    """The policy as Convolution takes it ("64,32" -> (64, 32))."""
    if policy and (policy[0].isdigit()):
        return tuple(int(v) for v in policy.split(","))
    return policy


# -- shapes and layouts -------------------------------------------------------------------------
def output_shape(x_shape: Any, w_shape: Any, stride: Any, padding: Any,
                 dilation: Any) -> list[Any]:
    """torch's logical output shape ``(N, K, *spatial)`` (works on SymInts too).

    >>> output_shape((2, 3, 9, 9), (4, 3, 3, 3), (2, 2), (1, 1), (1, 1))
    [2, 4, 5, 5]
    """
    out = [x_shape[0], w_shape[0]]
    for i in range(len(x_shape) - 2):
        k = dilation[i] * (w_shape[i + 2] - 1) + 1
        out.append((x_shape[i + 2] + 2 * padding[i] - k) // stride[i] + 1)
    return out


#: torch's two determinism switches. The getters behind
#: ``torch.backends.cudnn.deterministic`` (a module property: ~0.5 µs a read)
#: and ``torch.are_deterministic_algorithms_enabled()``: ~0.1 µs together.
_CUDNN_DETERMINISTIC: Any = getattr(torch._C, "_get_cudnn_deterministic", None) \
    or (lambda: torch.backends.cudnn.deterministic)
_DETERMINISTIC_ALGORITHMS: Any = getattr(torch._C, "_get_deterministic_algorithms", None) \
    or torch.are_deterministic_algorithms_enabled


def deterministic() -> bool:
    """True while torch asks for deterministic convolutions:
    ``torch.backends.cudnn.deterministic`` or
    ``torch.use_deterministic_algorithms(True)`` (read at every call;
    Note [deterministic plans]).

    >>> import torch
    >>> with torch.backends.cudnn.flags(deterministic=True):
    ...     deterministic()
    True
    """
    return bool(_CUDNN_DETERMINISTIC() or _DETERMINISTIC_ALGORITHMS())


def key_deterministic(key: tuple) -> bool:
    """Whether the Convolution of cache ``key`` (as :class:`PlanSource` gets it)
    plans deterministically."""
    return bool(key[-1])


def _math(dtype: torch.dtype, device: torch.device) -> str:
    if dtype == torch.float32 and device.type == "cuda" and not torch.backends.cudnn.allow_tf32:
        return "fma"  # PyTorch forbids TF32 for convolutions: so do we
    return "default"


_NULL = contextlib.nullcontext()


def _on_device(device: torch.device) -> Any:
    """``torch.cuda.device(device)`` when it is not the current device (the
    engine imports arrays on the current device only)."""
    if device.type == "cuda" and device.index is not None \
            and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _NULL


def _no_autocast(device: torch.device) -> Any:
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return _NULL


# -- the Convolution cache -----------------------------------------------------------------------
def convolution(xv: torch.Tensor, wv: torch.Tensor, layout: str, cfg: ConvConfig) -> Convolution:
    """The cached Convolution for packed tensors ``xv``/``wv`` in ``layout``."""
    dev = xv.device
    math = _math(xv.dtype, dev)
    key = (tuple(xv.shape), tuple(wv.shape), xv.dtype, layout, math, dev.type, dev.index, cfg,
           deterministic())  # last: key_deterministic
    conv = _CONVS.get(key)
    if conv is None:
        conv = _CONVS.get_or_create(key, lambda: _make(key, xv, wv, layout, math, cfg))
    return conv


def _problem(xv: torch.Tensor, wv: torch.Tensor, layout: str, math: str,
             cfg: ConvConfig) -> ConvProblem:
    """The ConvProblem of packed tensors ``xv``/``wv`` in ``layout``."""
    dtype = DTYPES.get(xv.dtype)
    if dtype is None:
        raise UnsupportedDtypeError(
            f"input: mucudnn convolves {[str(d) for d in DTYPES]}, got {xv.dtype}")
    return ConvProblem(tuple(xv.shape), tuple(wv.shape), stride=cfg.stride,
                       padding=cfg.padding, dilation=cfg.dilation, groups=cfg.groups,
                       dtype=dtype, layout=layout, math=math)


def _make(key: tuple, xv: torch.Tensor, wv: torch.Tensor, layout: str, math: str,
          cfg: ConvConfig) -> Convolution:
    problem = _problem(xv, wv, layout, math, cfg)
    dtype = problem.dtype
    be = _backend_for(cfg.backend, xv.device)
    plans = None
    if cfg.plans:
        tok, _, layer = cfg.plans.partition(":")
        source = plan_source(tok)
        if source is None:
            raise TorchBridgeError(f"plans: no plan source {tok!r} (its model was deleted?)")
        plans = source.plans_for(layer, problem, be, key)
    limit = None if cfg.workspace_limit < 0 else cfg.workspace_limit
    det = key_deterministic(key)
    log.debug("mucudnn.torch: new Convolution %s on %s%s%s", problem.key(), be.name,
              " with forced plans" if plans else "", " (deterministic)" if det else "")
    return Convolution(problem.x_shape, problem.w_shape, stride=problem.stride,
                       padding=problem.padding, dilation=problem.dilation,
                       groups=problem.groups, dtype=dtype, layout=layout, math=math,
                       workspace_limit=limit, policy=_policy(cfg.policy), backend=be,
                       plans=dict(plans) if plans else None, deterministic=det)


def forget(key: tuple) -> None:
    """Drop one cached Convolution (its next use builds it again)."""
    _CONVS.pop(key)
    _WARM.clear()  # records hold Convolutions (Note [the warm torch path])


def clear(backends: bool = True) -> None:
    """Forget every cached Convolution of mucudnn.torch. ``backends`` is kept
    for callers that pass it: the per-device backends are ``get_backend``'s
    singletons (not a cache; docs/DESIGN.md, "Caches"), kept either way.

    >>> clear(); cached_convolutions()
    []
    """
    _CONVS.clear()
    _WARM.clear()
    _native.clear()
    _standin.reset()
    GENERATION[0] += 1  # modules' settled signatures lapse


#: Counts :func:`clear` calls: a converted module's settled signatures (Note
#: [host cost of a converted layer]) hold for the generation that settled them.
GENERATION = [0]
#: Counts first calls compared with PyTorch's (Note [the whole-step trial] times
#: only steps with none).
CALIBRATIONS = [0]


def cached_convolutions() -> list[Convolution]:
    """The Convolutions mucudnn.torch holds now (most recently used last).

    >>> import torch
    >>> cfg = ConvConfig((1, 1), (0, 0), (1, 1), 1, -1, "undivided", "", "")
    >>> _ = forward(torch.ones(3, 2, 4, 4), torch.ones(5, 2, 3, 3), None, cfg)
    >>> cached_convolutions()[-1].problem.key()
    'conv2d:x=3x2x4x4:w=5x2x3x3:stride=1x1:pad=0x0:dil=1x1:g=1:float32:acc=float32:NCHW:math=default'
    """
    return _CONVS.values()


# -- the three directions ------------------------------------------------------------------------
def _run(method: Any, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    if out.device.type == "cpu":
        method(_numpy(a), _numpy(b), _numpy(out))
    else:
        method(a, b, out)


def forward(x: torch.Tensor, w: torch.Tensor, bias: "torch.Tensor | None",
            cfg: ConvConfig) -> torch.Tensor:
    """``conv(x, w) + bias`` in torch's logical shapes; the output is
    channels-last when the convolution ran NHWC/NDHWC."""
    warm = warm_call(x, w, cfg)  # Note [the warm torch path]
    if warm is not None:
        return warm.forward(x, w, bias)
    return _forward(x, w, bias, cfg)


def backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, cfg: ConvConfig,
             need_x: bool, need_w: bool, need_bias: bool
             ) -> tuple["torch.Tensor | None", "torch.Tensor | None", "torch.Tensor | None"]:
    """``(dx, dw, dbias)`` for the gradient ``dy`` of :func:`forward`'s output;
    None for each one not asked for. ``dbias`` is ``dy`` summed over the batch
    and spatial dimensions."""
    warm = warm_call(x, w, cfg)  # Note [the warm torch path]
    if warm is not None:
        return warm.backward(dy, x, w, need_x, need_w, need_bias)
    return _backward(dy, x, w, cfg, need_x, need_w, need_bias)


def _forward(x: torch.Tensor, w: torch.Tensor, bias: "torch.Tensor | None",
             cfg: ConvConfig) -> torch.Tensor:
    """:func:`forward` through :class:`~mucudnn.Convolution`'s checked path
    (CPU tensors, empty batches)."""
    cl = channels_last(x, w)
    nd = x.dim()
    shape = output_shape(x.shape, w.shape, cfg.stride, cfg.padding, cfg.dilation)
    dev = x.device
    # Note [outputs are not views]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # Outputs are allocated in torch's logical shape (channels-last strides
    # where the convolution runs NHWC) and the engine writes through a packed
    # view of them, so what the autograd Function returns is a base tensor: an
    # in-place op on it (VGG's and AlexNet's ReLU(inplace=True) right after a
    # conv) is then allowed, as after a native conv.
    if shape[0] == 0:
        return _empty(shape, x.dtype, dev, cl)
    xv, wv = _view(x, cl), _view(w, cl)
    with _on_device(dev), _no_autocast(dev):
        # the problem first: it refuses an output no tensor can hold, naming the
        # argument, before the allocation would fail in torch (the warm path's
        # record builds it first too)
        conv = convolution(xv, wv, _LAYOUT[(nd, cl)], cfg)
        y = _empty(shape, x.dtype, dev, cl)
        yv = _packed(y, cl)
        _run(conv.forward, xv, wv, yv)
        if bias is not None:
            yv.add_(bias if cl else bias.view(_BIAS_VIEW[nd]))
    return y


def _backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, cfg: ConvConfig,
              need_x: bool, need_w: bool, need_bias: bool
              ) -> tuple["torch.Tensor | None", "torch.Tensor | None", "torch.Tensor | None"]:
    """:func:`backward` through :class:`~mucudnn.Convolution`'s checked path."""
    cl = channels_last(x, w)
    nd = x.dim()
    dev = x.device
    dx = dw = db = None
    if need_bias:
        with _no_autocast(dev):  # sum autocasts to float32; the gradient keeps dy's dtype
            db = dy.sum(dim=[0] + list(range(2, nd)))
    if not (need_x or need_w):
        return dx, dw, db
    if need_x:
        dx = _empty(x.shape, x.dtype, dev, cl)  # Note [outputs are not views]
    if need_w:
        dw = _empty(w.shape, w.dtype, dev, cl)
    if x.shape[0] == 0:
        if dw is not None:
            dw.zero_()
    else:
        xv, wv, dyv = _view(x, cl), _view(w, cl), _view(dy, cl)
        with _on_device(dev), _no_autocast(dev):
            conv = convolution(xv, wv, _LAYOUT[(nd, cl)], cfg)
            if dx is not None:
                _run(conv.backward_data, dyv, wv, _packed(dx, cl))
            if dw is not None:
                _run(conv.backward_filter, xv, dyv, _packed(dw, cl))
    return dx, dw, db


# -- the warm path -------------------------------------------------------------------------------
# Note [the warm torch path]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# A conv step through Convolution's checked path costs hundreds of
# microseconds of host time more than a native conv's, enough to slow
# host-bound eager training by tens of percent (docs/BENCHMARKS.md). So for
# CUDA tensors the three directions of one signature (logical shapes and
# strides, dtype, device, options, TF32 and determinism flags) are resolved
# once into a _Warm record: the Convolution, its three kernels' ``launch`` and
# the output shape and memory format. A call then makes its operands
# contiguous in that memory format (a no-op for a model's tensors), allocates
# outputs in torch's logical shape (Note [outputs are not views]) and launches
# on torch's current stream with a workspace from torch's caching allocator;
# shapes and dtypes hold by construction, so Convolution's per-call checks are
# skipped (argument checks happen in functional.py before any device work).
# CPU tensors and empty batches take the checked path. The eager autograd
# Function looks its record up once, in the forward, and keeps it on ``ctx``
# for the backward (run with the TF32 and determinism flags its forward saw).
# Why this is not api.torch_fast.TorchFast: see Note [two torch warm paths] in
# mucudnn/api/torch_fast.py.
_WARM: "LRU[tuple, _Warm]" = LRU("torch.warm_calls", MAX_CONVOLUTIONS)
_TF32: Any = getattr(torch._C, "_get_cudnn_allow_tf32", None) \
    or (lambda: torch.backends.cudnn.allow_tf32)
#: torch's current raw stream of a device, and its current device (None in a
#: torch built without CUDA: every call then takes the checked path).
_STREAM: Any = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_CUR_DEVICE: Any = getattr(torch._C, "_cuda_getDevice", None)
_EMPTY_LIKE = torch.empty_like
#: whether torch's current stream is capturing a CUDA graph: the C call, as it runs
#: on a call's path (Note [captured steps run the GPU's choice]); never in a build
#: without CUDA, where that call is a placeholder that raises
CAPTURING: Callable[[], bool] = torch._C._cuda_isCurrentStreamCapturing \
    if torch.version.cuda else (lambda: False)
_LAST = threading.local()
#: A converted forward through the caller's path, ``step(x, w, cfg) -> y``.
HostStep = Callable[[torch.Tensor, torch.Tensor, ConvConfig], torch.Tensor]


def warm_call(x: torch.Tensor, w: torch.Tensor, cfg: ConvConfig,
              step: "HostStep | None" = None) -> "_Warm | None":
    """The warm record of this call's signature (made on first use; Note [the
    warm torch path]); None where the checked path must run (CPU tensors, an
    empty batch). Its ``forward(x, w, bias)`` and ``backward(dy, x, w,
    need_x, need_w, need_bias)`` are :func:`forward`'s and :func:`backward`'s
    for tensors of this signature; the autograd Function keeps the forward's
    record for its backward. ``step(x, w, cfg)``: the caller's converted call,
    host-timed once per signature (Note [host cost of a converted layer])."""
    if not x.is_cuda:
        return None
    # the strides stand for the memory format: the layout follows from them
    key = (x.shape, x.stride(), w.shape, w.stride(), x.dtype, x.get_device(), cfg, _TF32(),
           deterministic())
    return resolve(key, x, w, cfg, step)


#: The operand a transposed layer's record is made and compared with: the
#: problem's input for the layer's input ``x``, weight ``w``, ``cfg`` and whether
#: it runs channels-last (Note [transposed convolutions] in :mod:`.transposed`).
ProblemInput = Callable[[torch.Tensor, torch.Tensor, ConvConfig, bool], torch.Tensor]


def resolve(key: tuple, x: torch.Tensor, w: torch.Tensor, cfg: ConvConfig,
            step: "HostStep | None", problem_input: "ProblemInput | None" = None
            ) -> "_Warm | None":
    """The record kept under ``key`` for a CUDA call on ``x`` and ``w``: found,
    or made and compared with PyTorch's calls (Note [never slower than native]),
    and host-timed with ``step`` where that was left for a later call. A
    transposed layer's record (``problem_input`` given) is made from the
    problem's input, which that function makes, instead of ``x``; the
    directions a step runs follow from ``x`` needing its gradient either way."""
    warm = _WARM.peek(key)
    if warm is None:
        if x.shape[0] == 0 or _STREAM is None:
            return None
        px = _operand(x, w, cfg, problem_input)
        warm = _Warm(px, w, channels_last(x, w), cfg, key, transposed=problem_input is not None)
        _WARM.put(key, warm)  # before calibrating: the host timing calls through it
        if _settings.enabled() and not CAPTURING():
            warm.calibrate(px, w, key, step, x.requires_grad)
    elif warm.standin is not None:  # Note [planning after the first step] (standin.py)
        if CAPTURING():
            _standin.warn_captured()
        else:
            warm.standin_calls += 1
            if _standin.due(warm, warm.standin, warm.standin_calls):
                warm.calibrate(_operand(x, w, cfg, problem_input), w, key, step,
                               x.requires_grad)
    elif step is not None and warm.host_pending and not CAPTURING():
        # the host cost was not timed
        warm.calibrate(_operand(x, w, cfg, problem_input), w, key, step, x.requires_grad)
    _LAST.warm = warm
    return warm


def _operand(x: torch.Tensor, w: torch.Tensor, cfg: ConvConfig,
             problem_input: "ProblemInput | None") -> torch.Tensor:
    """The operand a record is made and compared with: ``x``, or a transposed
    layer's problem input (:data:`ProblemInput`)."""
    return x if problem_input is None else problem_input(x, w, cfg, channels_last(x, w))


def last_warm() -> "_Warm | None":
    """The warm record the calling thread's latest :func:`warm_call` returned
    (None before any, and after :func:`forget_last` until a call returns one);
    a converted module reads it after its call (Note [host cost of a converted
    layer])."""
    return getattr(_LAST, "warm", None)


def warm_record(key: tuple) -> "_Warm | None":
    """The warm state kept for the signature ``key`` (a converted module's
    ``_mu_seen`` entry; None where none is kept)."""
    return _WARM.peek(key)


def forget_last() -> None:
    """Clear :func:`last_warm` for the calling thread."""
    _LAST.warm = None


class _Warm:
    """One signature's resolved state (Note [the warm torch path]); each
    direction runs its plan's launcher or PyTorch's own call (Note [never
    slower than native] in :mod:`.native`)."""

    __slots__ = ("conv", "fwd", "bwd_data", "bwd_filter", "y_shape", "fmt", "index",
                 "ws", "bias_view", "sum_dims", "cfg", "det", "tf32", "native", "captured",
                  "fits", "host_pending", "key", "transposed", "x_shape", "out_pad",
                  "standin", "standin_calls", "__weakref__")

    def __init__(self, x: torch.Tensor, w: torch.Tensor, cl: bool, cfg: ConvConfig,
                 key: tuple, transposed: bool = False) -> None:
        nd = x.dim()
        dev = x.device
        with _on_device(dev):
            conv = convolution(_view(x, cl), _view(w, cl), _LAYOUT[(nd, cl)], cfg)
        self.conv = conv
        self._launch_from(conv)
        #: the step whose call made stand-ins that the launchers run, or None
        #: (Note [planning after the first step] in :mod:`.standin`); their calls since
        self.standin: "int | None" = None
        self.standin_calls = 0
        if _settings.replays():  # Note [replay after repeated addresses] (exec/graph.py)
            for d in Direction:
                conv.kernel(d).replay_repeated()
        self.y_shape = tuple(output_shape(x.shape, w.shape, cfg.stride, cfg.padding,
                                          cfg.dilation))
        self.fmt = _CL[nd] if cl else torch.contiguous_format
        self.index = x.get_device()
        # See Note [transient workspace in a training step] (mucudnn/exec/arrays.py)
        self.ws = torch_workspace(dev, keep=False)
        self.bias_view = _BIAS_VIEW[nd]
        self.sum_dims = [0] + list(range(2, nd))
        self.cfg = cfg
        self.det = bool(key[-1])
        self.tf32 = bool(key[-2])
        #: per direction (forward, backward-data, backward-filter): PyTorch's call runs
        self.native = (False, False, False)
        #: per direction, under CUDA-graph capture where that differs from
        #: ``native`` (Note [captured steps run the GPU's choice]); else None
        self.captured: "tuple[bool, bool, bool] | None" = None
        #: per direction: PyTorch's call was measured and its workspace fits the
        #: limit (Note [the whole-step trial] may run it)
        self.fits = (False, False, False)
        #: compared without the host timing (a first call outside autograd)
        self.host_pending = False
        #: the signature's key (:func:`warm_call`'s), which its record is kept under
        self.key = key
        #: the record is a transposed layer's, whose forward is :meth:`data` (Note
        #: [transposed convolutions] in :mod:`.transposed`); its output shape and padding
        self.transposed = transposed
        self.x_shape = tuple(x.shape)
        self.out_pad = _native.output_padding(self.x_shape, self.y_shape, tuple(w.shape),
                                              cfg) if transposed else None

    def _launch_from(self, conv: Convolution) -> None:
        """Launch ``conv``'s kernels in every direction."""
        self.fwd = conv.kernel(Direction.FORWARD).launch
        self.bwd_data = conv.kernel(Direction.BACKWARD_DATA).launch
        self.bwd_filter = conv.kernel(Direction.BACKWARD_FILTER).launch

    def _standin(self, x: torch.Tensor, w: torch.Tensor, need_dx: bool,
                 limit: "int | None") -> Any:
        """``native.calibrate``'s ``standin`` for this call (Note [planning after the
        first step] in :mod:`.standin`): every direction a step runs launches an
        untimed plan on :func:`standin.twin`'s backend until a later call plans it,
        under ``limit`` bytes."""
        cl = self.fmt is not torch.contiguous_format

        def make(directions: list[Direction]) -> "dict[Direction, Any] | None":
            twin = _standin.twin(self.conv.backend)
            if twin is None:
                return None
            cfg = self.cfg._replace(policy="undivided", backend=backend_token(twin))
            try:
                conv = convolution(_view(x, cl), _view(w, cl), self.conv.problem.layout, cfg)
                plans = {d: _standin.plan(twin, conv.problem, d, limit, self.det)
                         for d in directions}
                for d, plan in plans.items():
                    if plan is None:  # See Note [untimed stand-ins]
                        log.info("mucudnn.torch: no stand-in for %s %s; planned now",
                                 conv.problem.key(), d.value)
                        return None
                    conv.kernel(d).set_plan(plan)
            except MucudnnError as exc:
                log.info("mucudnn.torch: no stand-in for %s (%s); planned now",
                         self.conv.problem.key(), exc)
                return None
            self._launch_from(conv)
            self.standin, self.standin_calls = _standin.STEPS[0], 0
            _standin.opened(self)
            return plans

        def standin(skip: "Direction | None") -> "_native.Record | None":
            return _standin.record(skip, make, (tuple(x.shape), tuple(w.shape)),
                                   str(x.dtype).replace("torch.", ""), self.cfg, cl, need_dx,
                                   self.transposed, limit)
        return standin

    def calibrate(self, x: torch.Tensor, w: torch.Tensor, key: tuple,
                  step: "HostStep | None", need_dx: bool) -> None:
        """Compare with PyTorch's own call (Note [never slower than native]);
        with ``step``, also on the host (Note [host cost of a converted layer]).
        ``need_dx``: whether the layer's input needs its gradient. A first call
        may run stand-ins instead of planning, and the call that plans them
        replaces them (Note [planning after the first step] in :mod:`.standin`)."""
        cfg = self.cfg
        limit = None if cfg.workspace_limit < 0 else cfg.workspace_limit
        self.host_pending = step is None
        CALIBRATIONS[0] += 1  # Note [the whole-step trial]: this step is not a steady one
        standin = None
        if self.standin is not None:
            self.standin = None
            self._launch_from(self.conv)
        elif _standin.deferring(self.conv.backend, bool(cfg.plans)):
            standin = self._standin(x, w, need_dx, limit)
        with _device_ctx(self.index):
            rec = _native.calibrate(
                key, self.conv, x.contiguous(memory_format=self.fmt),
                w.contiguous(memory_format=self.fmt), self.y_shape, cfg, self.fmt,
                {Direction.FORWARD: self.fwd, Direction.BACKWARD_DATA: self.bwd_data,
                 Direction.BACKWARD_FILTER: self.bwd_filter},
                self.ws, lambda: _STREAM(self.index), limit, self.det, self.tf32, step, need_dx,
                self.transposed, standin)
        fwd, bd, bf = (rec.choices[d].runs == _native.TORCH for d in Direction)
        self.native = (fwd, bd, bf)
        cf, cd, cb = (rec.choices[d].captured == _native.TORCH for d in Direction)
        self.captured = None if (cf, cd, cb) == self.native else (cf, cd, cb)
        fit = [_native.fits(rec.choices[d]) for d in Direction]
        self.fits = (fit[0], fit[1], fit[2])

    def runs_native(self) -> "tuple[bool, bool, bool]":
        """Per direction, whether this call runs PyTorch's own: :attr:`native`,
        or :attr:`captured` under CUDA-graph capture (Note [captured steps run
        the GPU's choice])."""
        if self.captured is not None and CAPTURING():
            return self.captured
        return self.native

    def forward(self, x: torch.Tensor, w: torch.Tensor,
                bias: "torch.Tensor | None") -> torch.Tensor:
        fmt = self.fmt
        x = x.contiguous(memory_format=fmt)
        w = w.contiguous(memory_format=fmt)
        index = self.index
        native = self.runs_native()
        if native[0]:
            with _device_ctx(index):
                y = _native.native_forward(x, w, self.cfg, self.det, self.tf32)
        else:
            y = torch.empty(self.y_shape, dtype=x.dtype, device=x.device, memory_format=fmt)
            with _device_ctx(index):
                self.fwd(x.data_ptr(), w.data_ptr(), y.data_ptr(), 1.0, 0.0, _STREAM(index),
                         self.ws)
        if bias is not None:
            y.add_(bias.view(self.bias_view))
        return y

    def data(self, dy: torch.Tensor, w: torch.Tensor,
             bias: "torch.Tensor | None") -> torch.Tensor:
        """A transposed layer's forward: the problem's backward-data of ``dy`` (the
        layer's input) and ``w``, plus ``bias`` (Note [transposed convolutions])."""
        fmt = self.fmt
        dy = dy.contiguous(memory_format=fmt)
        w = w.contiguous(memory_format=fmt)
        index = self.index
        native = self.runs_native()
        with _device_ctx(index):
            if native[1]:
                x = _native.native_transposed(dy, w, self.cfg, self.out_pad, self.det, self.tf32)
            else:
                x = torch.empty(self.x_shape, dtype=dy.dtype, device=dy.device,
                                memory_format=fmt)
                self.bwd_data(x.data_ptr(), w.data_ptr(), dy.data_ptr(), 1.0, 0.0,
                              _STREAM(index), self.ws)
        if bias is not None:
            x.add_(bias.view(self.bias_view))
        return x

    def backward(self, dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, need_x: bool,
                 need_w: bool, need_bias: bool
                 ) -> tuple["torch.Tensor | None", "torch.Tensor | None", "torch.Tensor | None"]:
        db = dx = dw = None
        if need_bias:
            if torch.is_autocast_enabled("cuda"):
                with torch.autocast("cuda", enabled=False):  # sum would autocast to float32
                    db = dy.sum(dim=self.sum_dims)
            else:
                db = dy.sum(dim=self.sum_dims)
        if not (need_x or need_w):
            return dx, dw, db
        fmt = self.fmt
        dy = dy.contiguous(memory_format=fmt)
        index = self.index
        native = self.runs_native()
        _, native_x, native_w = native
        with _device_ctx(index):
            if (need_x and native_x) or (need_w and native_w):
                nx, nw = need_x and native_x, need_w and native_w
                ndx, ndw = _native.native_backward(
                    dy, x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt),
                    self.cfg, nx, nw, self.det, self.tf32)
                if nx:
                    dx, need_x = ndx, False
                if nw:
                    dw, need_w = ndw, False
            stream = _STREAM(index)
            # empty_like(t, memory_format=fmt): t's shape, dtype and device in
            # ``fmt``, as torch.empty(...) would make it, with less argument parsing
            if need_x:
                w = w.contiguous(memory_format=fmt)
                dx = _EMPTY_LIKE(x, memory_format=fmt)
                self.bwd_data(dx.data_ptr(), w.data_ptr(), dy.data_ptr(), 1.0, 0.0, stream,
                              self.ws)
            if need_w:
                x = x.contiguous(memory_format=fmt)
                dw = _EMPTY_LIKE(w, memory_format=fmt)
                self.bwd_filter(x.data_ptr(), dw.data_ptr(), dy.data_ptr(), 1.0, 0.0, stream,
                                self.ws)
        return dx, dw, db


def _device_ctx(index: int) -> Any:
    """``torch.cuda.device(index)`` unless it is the current device already."""
    if _CUR_DEVICE is not None and _CUR_DEVICE() != index:
        return torch.cuda.device(index)
    return _NULL
