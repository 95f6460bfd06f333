"""``conv1d``/``conv2d``/``conv3d`` and ``conv_transpose1d``/``2d``/``3d`` with
the semantics of ``torch.nn.functional``'s, run micro-batched by mucudnn.

Arguments are checked before any device work; a wrong one raises
:class:`TorchValueError` / :class:`TorchTypeError` (a ValueError / TypeError
and a :class:`mucudnn.MucudnnError`) naming it.

>>> import torch
>>> x, w = torch.ones(2, 3, 5, 5), torch.ones(4, 3, 3, 3)
>>> y = conv2d(x, w, torch.zeros(4), padding="same")
>>> tuple(y.shape), float(y[0, 0, 2, 2]), float(y[0, 0, 0, 0])
((2, 4, 5, 5), 27.0, 12.0)
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any, NamedTuple, Sequence, Union

import torch
import torch.nn.functional as F

from ..backends import Backend
from ..caches import LRU
from ..errors import InvalidTypeError, InvalidValueError, MucudnnError
from ..optimizer import DEFAULT_POLICY, batch_sizes
from ..problem import MAX_DIM, MAX_TENSOR_BYTES, transposed_spatial
from ..typing_aliases import PolicyLike
from ..units import format_bytes, int_tuple
from . import engine, ops, transposed
from .engine import DTYPES, ConvConfig

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "Options", "options", "TorchValueError", "TorchTypeError",
           "DEFAULT_WORKSPACE_LIMIT"]

#: The default per-kernel workspace limit (64 MiB), as mucudnn's.
DEFAULT_WORKSPACE_LIMIT = 64 << 20

IntOrTuple = Union[int, Sequence[int]]


class TorchValueError(MucudnnError, ValueError):
    """An argument of mucudnn.torch has a wrong value (the message names it)."""


class TorchTypeError(MucudnnError, TypeError):
    """An argument of mucudnn.torch has a wrong type (the message names it)."""


class Options(NamedTuple):
    """Normalised ``workspace_limit`` (-1: none), ``policy`` and ``backend`` strings."""

    workspace_limit: int
    policy: str
    backend: str


_OPTIONS: "LRU[tuple, Options]" = LRU("torch.options", 64)
_COMPILING = torch.compiler.is_compiling


def options(workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
            policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None) -> Options:
    """Check and normalise the mucudnn options of a convolution.

    Checked results are cached (``torch.options``) by value *and type* of
    ``workspace_limit`` (``True`` and ``1.0`` are refused however often
    ``1`` was accepted), by normalised policy and by backend name or the
    token of a Backend instance (Note [backend tokens] in engine.py).

    >>> options(1 << 20, [32, 64], None)
    Options(workspace_limit=1048576, policy='64,32', backend='')
    """
    if _COMPILING():  # Note [options under torch.compile]
        return _check(workspace_limit, policy, backend)
    pol = policy if isinstance(policy, str) else _sizes(policy)
    bkey: Any = backend if backend is None or isinstance(backend, str) \
        else ("instance", _token(backend))
    key = (type(workspace_limit), workspace_limit, pol, bkey)
    hit = _OPTIONS.get(key)
    if hit is not None:
        return hit
    out = _check(workspace_limit, policy, backend)
    _OPTIONS.put(key, out)
    return out


# Note [options under torch.compile]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Dynamo cannot enter the options cache's lock (nor the backend registry's),
# and needs no cache: it runs ``options`` once, while tracing, and guards on
# its constant arguments. So while compiling, the arguments are checked
# without the cache.
def _check(workspace_limit: Any, policy: Any, backend: Any) -> Options:
    pol = policy if isinstance(policy, str) else _sizes(policy)
    if workspace_limit is None:
        wl = -1
    elif isinstance(workspace_limit, bool) or not isinstance(workspace_limit, numbers.Integral):
        raise TorchTypeError(f"workspace_limit: expected an int (bytes) or None, "
                             f"got {workspace_limit!r}")
    elif workspace_limit < 0:
        raise TorchValueError(f"workspace_limit: expected >= 0 bytes, got {workspace_limit}")
    else:
        wl = int(workspace_limit)
    try:
        batch_sizes(policy if isinstance(pol, str) else [int(v) for v in pol.split(",")], 1)
    except ValueError as exc:
        raise TorchValueError(str(exc)) from None
    return Options(wl, pol, _token(backend))


def _token(backend: Any) -> str:
    try:
        return engine.backend_token(backend)
    except TypeError as exc:
        raise TorchTypeError(str(exc)) from None
    except ValueError as exc:
        raise TorchValueError(str(exc)) from None


def _sizes(policy: Any) -> str:
    try:
        items = list(policy)
    except TypeError:
        raise TorchValueError(f"policy: expected 'powerOfTwo', 'all', 'undivided' or a list of "
                              f"positive batch sizes, got {policy!r}") from None
    sizes = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise TorchValueError(f"policy: explicit batch sizes must be positive ints, "
                                  f"got {v!r} in {policy!r}")
        sizes.append(int(v))
    if not sizes:
        raise TorchValueError("policy: expected at least one batch size, got an empty list")
    return ",".join(str(s) for s in sorted(set(sizes), reverse=True))


def _tuple(name: str, value: Any, nd: int, minimum: int) -> tuple[int, ...]:
    # fast paths first: a module's attributes are plain tuples of ints
    if type(value) is tuple and len(value) == nd:
        for v in value:
            if type(v) is not int or v < minimum:
                break
        else:
            return value
    elif type(value) is int and value >= minimum:
        return (value,) * nd
    # the one parser of per-dimension ints, with PyTorch's one-for-all rule
    try:
        return int_tuple(name, value, nd, minimum, one_for_all=True)
    except InvalidTypeError as exc:
        raise TorchTypeError(str(exc)) from None
    except InvalidValueError as exc:
        raise TorchValueError(str(exc)) from None


def _same_padding(nd: int, weight: torch.Tensor, stride: tuple[int, ...],
                  dilation: tuple[int, ...]) -> tuple[tuple[int, ...], list[int]]:
    """torch's padding="same": symmetric padding ``total // 2`` and, for an odd
    total (even kernels), one more row/column at the end (as ``F.pad`` pads)."""
    if any(s != 1 for s in stride):
        raise TorchValueError(f"padding: 'same' is not supported for strided convolutions "
                              f"(stride {stride}); use stride 1 or explicit padding")
    left, pad = [], [0] * (2 * nd)
    for i in range(nd):
        total = dilation[i] * (int(weight.shape[i + 2]) - 1)
        left.append(total // 2)
        pad[2 * (nd - 1 - i) + 1] = total - 2 * (total // 2)
    return tuple(left), pad


#: The device types mucudnn runs on (a converted module on any other runs torch's own).
_DEVICE_TYPES = ("cuda", "cpu")

# Note [one-dimensional convolutions]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# cuDNN has no 1-D convolution. PyTorch runs ``conv1d`` on cuDNN as a 2-D
# convolution of height 1 (``_convolution`` in aten's Convolution.cpp: the
# input made contiguous, so that a permuted input does not run NHWC, then
# ``view4d``, and stride 1, padding 0 and dilation 1 put before the width's),
# and so does mucudnn, after the same checks on the 1-D arguments: x ``(N, C,
# L)`` as ``(N, C, 1, L)``, the weight ``(K, C/g, k)`` as ``(K, C/g, 1, k)``,
# and the output's view drops the height again. So a converted ``Conv1d``
# plans, caches and reports the very problem PyTorch's own call runs, which
# its comparison with PyTorch's call (Note [never slower than native]) needs;
# its gradients flow through the views. (Arrays outside torch: Note [1-D
# arrays as height-1 views] in mucudnn/api/functional.py.)


def _operands(nd: int, input: Any, weight: Any, bias: Any, weight_dims: str) -> bool:
    """Check the operands' types and ranks; whether ``input`` is batched."""
    if not isinstance(input, torch.Tensor):
        raise TorchTypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise TorchTypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TorchTypeError(f"bias: expected a torch.Tensor or None, got {type(bias).__name__}")
    if weight.dim() != nd + 2:
        raise TorchValueError(f"weight: expected a {nd + 2}-D tensor ({weight_dims}), got shape "
                              f"{tuple(weight.shape)}")
    batched = input.dim() == nd + 2
    if not batched and input.dim() != nd + 1:
        raise TorchValueError(f"input: expected a {nd + 1}-D (unbatched) or {nd + 2}-D (batched) "
                              f"tensor, got shape {tuple(input.shape)}")
    if 0 in weight.shape:
        raise TorchValueError(f"weight: expected non-zero sizes, got shape {tuple(weight.shape)}")
    if 0 in input.shape[-nd - 1:] and (not batched or input.shape[0] != 0):
        raise TorchValueError(f"input: expected non-zero channel and spatial sizes, got shape "
                              f"{tuple(input.shape)}")
    return batched


def _groups(groups: Any) -> int:
    if type(groups) is not int and (isinstance(groups, bool)
                                    or not isinstance(groups, numbers.Integral)) or groups < 1:
        raise TorchValueError(f"groups: expected a positive int, got {groups!r}")
    return int(groups)


def _on_device_in_dtype(input: torch.Tensor, weight: torch.Tensor, bias: Any
                        ) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Check the operands' device and dtype, after autocast's cast where it is on."""
    device = input.device
    if weight.device != device or (bias is not None and bias.device != device):
        raise TorchValueError(f"weight: expected the input's device {device}, got "
                              f"weight on {weight.device}"
                              + ("" if bias is None else f", bias on {bias.device}"))
    dev = device.type
    if dev not in _DEVICE_TYPES:
        raise TorchValueError(f"input: mucudnn runs convolutions on CUDA and CPU tensors, got a "
                              f"tensor on {device}")
    if torch.is_autocast_enabled(dev):  # as autocast treats native convolutions
        dt = torch.get_autocast_dtype(dev)
        input, weight = _cast(input, dt), _cast(weight, dt)
        bias = None if bias is None else _cast(bias, dt)
    dtype = input.dtype
    if dtype not in DTYPES:
        raise TorchTypeError(f"input: expected one of {[str(d) for d in DTYPES]}, got {dtype}")
    if weight.dtype != dtype or (bias is not None and bias.dtype != dtype):
        raise TorchTypeError(f"weight: expected the input's dtype {dtype}, got "
                             f"weight {weight.dtype}"
                             + ("" if bias is None else f", bias {bias.dtype}"))
    return input, weight, bias


def _height_1(x: torch.Tensor, weight: torch.Tensor, st: tuple, pad: tuple, dil: tuple
              ) -> tuple[torch.Tensor, torch.Tensor, tuple, tuple, tuple]:
    """See Note [one-dimensional convolutions]: the operands' height-1 views
    and the 2-D geometry (stride 1, padding 0, dilation 1 for the height)."""
    return (x.contiguous().unsqueeze(2), weight.unsqueeze(2), (1,) + st, (0,) + pad,
            (1,) + dil)


def _convnd(nd: int, input: Any, weight: Any, bias: Any, stride: Any, padding: Any,
            dilation: Any, groups: Any, opts: Options, plans: str = "") -> torch.Tensor:
    batched = _operands(nd, input, weight, bias, "out_channels, in_channels/groups, *kernel")
    st = _tuple("stride", stride, nd, 1)
    dil = _tuple("dilation", dilation, nd, 1)
    groups = _groups(groups)
    extra: list[int] = []
    if isinstance(padding, str):
        if padding == "valid":
            pad = (0,) * nd
        elif padding == "same":
            pad, extra = _same_padding(nd, weight, st, dil)
        else:
            raise TorchValueError(f"padding: expected 'same', 'valid', an int or {nd} ints, "
                                  f"got {padding!r}")
    else:
        pad = _tuple("padding", padding, nd, 0)
    ws = weight.shape
    k, cg = ws[0], ws[1]
    c = input.shape[1 if batched else 0]
    if cg * groups != c:
        raise TorchValueError(f"weight: expected {c // groups if c % groups == 0 else '?'} input "
                              f"channels per group (input has {c} channels, groups={groups}), "
                              f"got weight of shape {tuple(ws)}")
    if k % groups:
        raise TorchValueError(f"weight: out_channels ({k}) must be divisible by groups ({groups})")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != k):
        raise TorchValueError(f"bias: expected shape ({k},), got {tuple(bias.shape)}")
    device = input.device
    input, weight, bias = _on_device_in_dtype(input, weight, bias)
    x = input if batched else input.unsqueeze(0)
    if extra and any(extra):
        x = F.pad(x, extra)
    xs = x.shape
    for i in range(nd):
        if xs[i + 2] + 2 * pad[i] - dil[i] * (ws[i + 2] - 1) < 1:
            raise TorchValueError(
                f"input: spatial size {tuple(xs[2:])} is smaller than the dilated kernel "
                f"{tuple(dil[j] * (ws[j + 2] - 1) + 1 for j in range(nd))} "
                f"with padding {pad}")
    if nd == 1:
        x, weight, st, pad, dil = _height_1(x, weight, st, pad, dil)
    cfg = ConvConfig(st, pad, dil, groups, opts.workspace_limit, opts.policy, opts.backend, plans)
    if xs[0] == 0:  # no device work follows: check that the backend takes this device
        engine._backend_for(cfg.backend, device)
    y = ops.apply(x, weight, bias, cfg)
    if nd == 1:
        y = y.squeeze(2)
    return y if batched else y.squeeze(0)


def _check_output(names: str, shape: Sequence[int], dtype: torch.dtype) -> None:
    """Refuse, before any allocation, an output no tensor can hold (as
    :class:`~mucudnn.ConvProblem` refuses its tensors: Note [sizes that cannot
    exist]); ``names``: the arguments that made it so large."""
    n = 1
    for v in shape:
        n *= int(v)
    nbytes = n * dtype.itemsize
    if max(shape) >= MAX_DIM or nbytes >= MAX_TENSOR_BYTES:
        raise TorchValueError(f"{names}: the output of shape {tuple(shape)} would take "
                              f"{format_bytes(nbytes)}; a tensor must take less than "
                              f"{format_bytes(MAX_TENSOR_BYTES)}")


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if t.is_floating_point() and t.dtype != torch.float64 and t.dtype != dtype:
        return t.to(dtype)
    return t


def conv1d(input: torch.Tensor, weight: torch.Tensor, bias: "torch.Tensor | None" = None,
           stride: IntOrTuple = 1, padding: "IntOrTuple | str" = 0, dilation: IntOrTuple = 1,
           groups: int = 1, *, workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
           policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None) -> torch.Tensor:
    """1-D convolution as ``torch.nn.functional.conv1d`` (see :func:`conv2d`):
    ``input`` ``(N, C, L)`` or ``(C, L)``, ``weight`` ``(K, C/groups, k)``; it
    runs as PyTorch's does on cuDNN, a 2-D convolution of height 1 (Note
    [one-dimensional convolutions]).

    >>> import torch
    >>> y = conv1d(torch.ones(2, 3, 7), torch.ones(4, 3, 3), stride=2, padding=1)
    >>> tuple(y.shape), float(y[0, 0, 0]), float(y[0, 0, 1])
    ((2, 4, 4), 6.0, 9.0)
    """
    return _convnd(1, input, weight, bias, stride, padding, dilation, groups,
                   options(workspace_limit, policy, backend))


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: "torch.Tensor | None" = None,
           stride: IntOrTuple = 1, padding: "IntOrTuple | str" = 0, dilation: IntOrTuple = 1,
           groups: int = 1, *, workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
           policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None) -> torch.Tensor:
    """2-D convolution as ``torch.nn.functional.conv2d``, micro-batched by mucudnn.

    ``input`` is ``(N, C, H, W)`` or unbatched ``(C, H, W)``; ``weight``
    ``(K, C/groups, R, S)``; ``padding`` ints, a tuple, ``"valid"`` or
    ``"same"`` (stride 1; an even kernel gets the extra row/column at the end,
    as torch). Differentiable in ``input``, ``weight`` and ``bias``.

    ``workspace_limit`` (bytes, None: no limit) caps each of the three
    kernels' workspace; ``policy`` ("fitted", the default, "powerOfTwo",
    "all", "undivided" or a list of micro-batch sizes) and ``backend`` (None: ``numpy`` for CPU tensors,
    mucudnn's default GPU backend for CUDA tensors) are as in
    :class:`mucudnn.Convolution`. Under ``torch.autocast`` the inputs are
    cast to the autocast dtype, as native convolutions are. While
    ``torch.backends.cudnn.deterministic`` or
    ``torch.use_deterministic_algorithms(True)`` is on (read at every call),
    the plans use only configurations cuDNN marks deterministic, so results
    are bitwise reproducible run to run.

    >>> import torch
    >>> y = conv2d(torch.ones(3, 5, 5), torch.ones(2, 3, 3, 3), stride=2)
    >>> tuple(y.shape), float(y[0, 0, 0])
    ((2, 2, 2), 27.0)
    """
    return _convnd(2, input, weight, bias, stride, padding, dilation, groups,
                   options(workspace_limit, policy, backend))


def conv3d(input: torch.Tensor, weight: torch.Tensor, bias: "torch.Tensor | None" = None,
           stride: IntOrTuple = 1, padding: "IntOrTuple | str" = 0, dilation: IntOrTuple = 1,
           groups: int = 1, *, workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
           policy: PolicyLike = DEFAULT_POLICY, backend: "str | Backend | None" = None) -> torch.Tensor:
    """3-D convolution as ``torch.nn.functional.conv3d`` (see :func:`conv2d`):
    ``input`` ``(N, C, D, H, W)`` or ``(C, D, H, W)``, ``weight`` ``(K, C/groups, T, R, S)``.

    >>> import torch
    >>> y = conv3d(torch.ones(1, 2, 3, 3, 3), torch.ones(1, 2, 3, 3, 3))
    >>> y.flatten().tolist()
    [54.0]
    """
    return _convnd(3, input, weight, bias, stride, padding, dilation, groups,
                   options(workspace_limit, policy, backend))


def _conv_transposend(nd: int, input: Any, weight: Any, bias: Any, stride: Any, padding: Any,
                      output_padding: Any, groups: Any, dilation: Any, opts: Options,
                      plans: str = "") -> torch.Tensor:
    """See Note [transposed convolutions] in :mod:`.transposed`."""
    batched = _operands(nd, input, weight, bias, "in_channels, out_channels/groups, *kernel")
    st = _tuple("stride", stride, nd, 1)
    dil = _tuple("dilation", dilation, nd, 1)
    if isinstance(padding, str):
        raise TorchValueError(f"padding: expected an int or {nd} ints (transposed convolutions "
                              f"take no 'same' or 'valid'), got {padding!r}")
    pad = _tuple("padding", padding, nd, 0)
    out_pad = _tuple("output_padding", output_padding, nd, 0)
    for i in range(nd):
        if out_pad[i] >= max(st[i], dil[i]):
            raise TorchValueError(f"output_padding: expected each value smaller than the stride "
                                  f"or the dilation ({st} or {dil}), got {out_pad}")
    groups = _groups(groups)
    ws = weight.shape
    c = input.shape[1 if batched else 0]
    if ws[0] != c:
        raise TorchValueError(f"weight: expected {c} input channels first (in_channels, "
                              f"out_channels/groups, *kernel), got weight of shape {tuple(ws)}")
    if c % groups:
        raise TorchValueError(f"weight: in_channels ({c}) must be divisible by groups ({groups})")
    k = ws[1] * groups
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != k):
        raise TorchValueError(f"bias: expected shape ({k},), got {tuple(bias.shape)}")
    device = input.device
    input, weight, bias = _on_device_in_dtype(input, weight, bias)
    x = input if batched else input.unsqueeze(0)
    xs = x.shape
    size = transposed_spatial(xs[2:], ws[2:], st, pad, dil, out_pad)
    if min(size) < 1:
        raise TorchValueError(f"input: the output size {size} of spatial size "
                              f"{tuple(xs[2:])} with padding {pad} is too small")
    _check_output("stride, dilation", (xs[0], k) + size, x.dtype)
    if any(out_pad[i] >= st[i] for i in range(nd)):  # Note [transposed convolutions]
        warnings.warn(f"mucudnn.torch: an output_padding {out_pad} not below the stride {st} has "
                      f"no convolution to run backward: PyTorch's own transposed convolution "
                      f"runs, its workspace not held to the limit", RuntimeWarning, stacklevel=3)
        y = _TRANSPOSED_F[nd](x, weight, bias, st, pad, out_pad, groups, dil)
        return y if batched else y.squeeze(0)
    if nd == 1:
        x, weight, st, pad, dil = _height_1(x, weight, st, pad, dil)
        size = (1,) + size
    cfg = ConvConfig(st, pad, dil, groups, opts.workspace_limit, opts.policy, opts.backend, plans)
    if xs[0] == 0:  # no device work follows: check that the backend takes this device
        engine._backend_for(cfg.backend, device)
    y = transposed.apply(x, weight, bias, cfg, size)
    if nd == 1:
        y = y.squeeze(2)
    return y if batched else y.squeeze(0)


_TRANSPOSED_F = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def conv_transpose1d(input: torch.Tensor, weight: torch.Tensor,
                     bias: "torch.Tensor | None" = None, stride: IntOrTuple = 1,
                     padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                     dilation: IntOrTuple = 1, *,
                     workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
                     policy: PolicyLike = DEFAULT_POLICY,
                     backend: "str | Backend | None" = None) -> torch.Tensor:
    """1-D transposed convolution as ``torch.nn.functional.conv_transpose1d``
    (see :func:`conv_transpose2d`), run as a 2-D one of height 1 (Note
    [one-dimensional convolutions]).

    >>> import torch
    >>> y = conv_transpose1d(torch.ones(1, 2, 3), torch.ones(2, 1, 3), stride=2)
    >>> y.flatten().tolist()
    [2.0, 2.0, 4.0, 2.0, 4.0, 2.0, 2.0]
    """
    return _conv_transposend(1, input, weight, bias, stride, padding, output_padding, groups,
                             dilation, options(workspace_limit, policy, backend))


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor,
                     bias: "torch.Tensor | None" = None, stride: IntOrTuple = 1,
                     padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                     dilation: IntOrTuple = 1, *,
                     workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
                     policy: PolicyLike = DEFAULT_POLICY,
                     backend: "str | Backend | None" = None) -> torch.Tensor:
    """2-D transposed convolution as ``torch.nn.functional.conv_transpose2d``,
    micro-batched by mucudnn: the backward-data of the convolution it is the
    adjoint of (Note [transposed convolutions] in :mod:`.transposed`).

    ``input`` is ``(N, C_in, H, W)`` or unbatched; ``weight`` ``(C_in,
    C_out/groups, R, S)``; the output ``(N, C_out, (H - 1) * stride - 2 *
    padding + dilation * (R - 1) + output_padding + 1, ...)``. The options
    are :func:`conv2d`'s. An ``output_padding`` not below the stride (one
    below the dilation, which PyTorch takes) runs PyTorch's own call, with a
    ``RuntimeWarning``.

    >>> import torch
    >>> y = conv_transpose2d(torch.ones(1, 2, 2, 2), torch.ones(2, 3, 3, 3), stride=2,
    ...                      padding=1, output_padding=1)
    >>> tuple(y.shape), float(y[0, 0, 1, 1]), float(y[0, 0, 0, 0])
    ((1, 3, 4, 4), 8.0, 2.0)
    """
    return _conv_transposend(2, input, weight, bias, stride, padding, output_padding, groups,
                             dilation, options(workspace_limit, policy, backend))


def conv_transpose3d(input: torch.Tensor, weight: torch.Tensor,
                     bias: "torch.Tensor | None" = None, stride: IntOrTuple = 1,
                     padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                     dilation: IntOrTuple = 1, *,
                     workspace_limit: "int | None" = DEFAULT_WORKSPACE_LIMIT,
                     policy: PolicyLike = DEFAULT_POLICY,
                     backend: "str | Backend | None" = None) -> torch.Tensor:
    """3-D transposed convolution as ``torch.nn.functional.conv_transpose3d``
    (see :func:`conv_transpose2d`).

    >>> import torch
    >>> y = conv_transpose3d(torch.ones(1, 1, 2, 2, 2), torch.ones(1, 1, 2, 2, 2))
    >>> tuple(y.shape), float(y[0, 0, 1, 1, 1])
    ((1, 1, 3, 3, 3), 8.0)
    """
    return _conv_transposend(3, input, weight, bias, stride, padding, output_padding, groups,
                             dilation, options(workspace_limit, policy, backend))
