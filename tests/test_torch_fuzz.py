"""A fuzzer of mucudnn.torch's functional API against torch's own
convolutions on the CPU (NumPy backend), in float64: hypothesis draws
``conv1d``/``conv2d``/``conv3d`` and ``conv_transpose1d``/``2d``/``3d``
arguments (shapes, strides, paddings and output paddings, paddings including
``'same'``/``'valid'``, dilations, groups, dtypes, bias, batched or not,
channels-last, argument forms) and checks that outputs, gradients, forward-AD
tangents, double-backward gradients and vmap results match
``F.conv1d``/``F.conv2d``/``F.conv3d``; and that a bad value of any argument raises a
:class:`mucudnn.MucudnnError` that is also the builtin ``ValueError`` /
``TypeError`` and names the argument, never a raw torch or NumPy error.

Shapes stay tiny: the NumPy backend is exact but slow. ``HYPOTHESIS_PROFILE``
picks the example counts (conftest.py: 'ci' 40, 'fuzz10k' 10,000)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch (pip install torch)")

import torch.nn.functional as F  # noqa: E402

import mucudnn  # noqa: E402
import mucudnn.torch as mt  # noqa: E402

D = torch.float64
MINE = {1: mt.conv1d, 2: mt.conv2d, 3: mt.conv3d}
NATIVE = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
MINE_T = {1: mt.conv_transpose1d, 2: mt.conv_transpose2d, 3: mt.conv_transpose3d}
NATIVE_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


pytestmark = pytest.mark.usefixtures("cache_off")


@dataclasses.dataclass
class Case:
    """One drawn convolution: tensors' shapes and the arguments as passed."""

    nd: int
    x_shape: tuple
    w_shape: tuple
    bias: bool
    kwargs: dict
    channels_last: bool
    seed: int
    options: dict
    #: a transposed convolution (weight (C_in, C_out/groups, *k))
    transposed: bool = False

    @property
    def out_channels(self) -> int:
        return self.w_shape[1] * self.kwargs.get("groups", 1) if self.transposed \
            else self.w_shape[0]

    def tensors(self, dtype: Any = D) -> tuple:
        g = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.x_shape, dtype=D, generator=g)
        w = torch.randn(self.w_shape, dtype=D, generator=g)
        b = torch.randn(self.out_channels, dtype=D, generator=g) if self.bias else None
        if self.channels_last and x.dim() == self.nd + 2:
            if self.nd == 1:  # an (N, L, C) tensor's transpose
                x = x.transpose(1, 2).contiguous().transpose(1, 2)
            else:
                fmt = torch.channels_last if self.nd == 2 else torch.channels_last_3d
                x = x.contiguous(memory_format=fmt)
        return tuple(None if t is None else t.to(dtype) for t in (x, w, b))

    def mine(self, x, w, b):
        return (MINE_T if self.transposed else MINE)[self.nd](x, w, b, **self.kwargs,
                                                              **self.options)

    def native(self, x, w, b):
        return (NATIVE_T if self.transposed else NATIVE)[self.nd](x, w, b, **self.kwargs)


def _form(draw, values: tuple, nd: int) -> Any:
    """An int, a tuple or a list of ``values`` (all equal values may be one int)."""
    kind = draw(st.sampled_from(["tuple", "list", "int"] if len(set(values)) == 1
                                else ["tuple", "list"]))
    return values[0] if kind == "int" else (tuple(values) if kind == "tuple" else list(values))


def _options(draw) -> dict:
    """mucudnn's own options, each passed or left at its default."""
    options: dict = {}
    if draw(st.booleans()):
        options["workspace_limit"] = draw(st.sampled_from([None, 0, 4096, 1 << 20]))
    if draw(st.booleans()):
        options["policy"] = draw(st.sampled_from(["powerOfTwo", "all", "undivided", [2, 1]]))
    return options


def _layer(draw: Any, nd: "int | None") -> tuple:
    """What a convolution and a transposed one draw alike: (nd, groups,
    channels and filters per group, batch, kernel, dilation)."""
    nd = nd or draw(st.sampled_from([1, 2, 2, 3]))
    groups = draw(st.integers(1, 3))
    cg, kg = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    n = draw(st.sampled_from([1, 2, 2, 0]))
    big = {1: 5, 2: 3, 3: 2}[nd]
    kernel = tuple(draw(st.integers(1, big)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    return nd, groups, cg, kg, n, kernel, dilation


@st.composite
def cases(draw, nd: "int | None" = None) -> Case:
    nd, groups, cg, kg, n, kernel, dilation = _layer(draw, nd)
    padding_kind = draw(st.sampled_from(["ints", "ints", "same", "valid"]))
    stride = (1,) * nd if padding_kind == "same" else \
        tuple(draw(st.integers(1, 3)) for _ in range(nd))
    pad = tuple(draw(st.integers(0, 2)) for _ in range(nd)) if padding_kind == "ints" \
        else (0,) * nd
    spatial = tuple(max(1, dilation[i] * (kernel[i] - 1) + 1 - 2 * pad[i]
                        + draw(st.integers(0, {1: 5, 2: 3, 3: 1}[nd]))) for i in range(nd))
    kwargs: dict = {}
    if padding_kind in ("same", "valid"):
        kwargs["padding"] = padding_kind
    elif any(pad) or draw(st.booleans()):
        kwargs["padding"] = _form(draw, pad, nd)
    if any(s != 1 for s in stride) or draw(st.booleans()):
        kwargs["stride"] = _form(draw, stride, nd)
    if any(d != 1 for d in dilation) or draw(st.booleans()):
        kwargs["dilation"] = _form(draw, dilation, nd)
    if groups != 1 or draw(st.booleans()):
        kwargs["groups"] = groups
    batched = draw(st.booleans()) or n != 1
    x_shape = ((n,) if batched else ()) + (cg * groups,) + spatial
    options = _options(draw)
    return Case(nd, x_shape, (kg * groups, cg) + kernel, draw(st.booleans()), kwargs,
                batched and draw(st.booleans()), draw(st.integers(0, 2**16)), options)


@st.composite
def transposed_cases(draw, nd: "int | None" = None) -> Case:
    """A valid transposed convolution (Note [transposed convolutions]): output
    paddings below the stride, an output of at least one element."""
    nd, groups, cg, kg, n, kernel, dilation = _layer(draw, nd)
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    out_pad = tuple(draw(st.integers(0, s - 1)) for s in stride)
    spatial = tuple(draw(st.integers(1, {1: 5, 2: 3, 3: 2}[nd])) for _ in range(nd))
    # a padding that leaves an output of at least one element
    pad = tuple(draw(st.integers(0, max(0, ((spatial[i] - 1) * stride[i] + dilation[i]
                                            * (kernel[i] - 1) + out_pad[i]) // 2)))
                for i in range(nd))
    kwargs: dict = {}
    for name, v in (("padding", pad), ("stride", stride), ("output_padding", out_pad),
                    ("dilation", dilation)):
        if any(e != (1 if name in ("stride", "dilation") else 0) for e in v) \
                or draw(st.booleans()):
            kwargs[name] = _form(draw, v, nd)
    if groups != 1 or draw(st.booleans()):
        kwargs["groups"] = groups
    batched = draw(st.booleans()) or n != 1
    x_shape = ((n,) if batched else ()) + (cg * groups,) + spatial
    options = _options(draw)
    return Case(nd, x_shape, (cg * groups, kg) + kernel, draw(st.booleans()), kwargs,
                batched and draw(st.booleans()), draw(st.integers(0, 2**16)), options, True)


def either_cases() -> Any:
    """Convolutions and transposed ones."""
    return st.one_of(cases(), transposed_cases())


def _close(a, b, tol=1e-9):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# -- valid arguments: mucudnn equals torch ----------------------------------------------------------

@given(either_cases(),
       st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]))
def test_outputs_match_native(case, dtype):
    x, w, b = case.tensors(dtype)
    y = case.mine(x, w, b)
    ref = case.native(*case.tensors())
    assert y.dtype == dtype and y.shape == ref.shape
    tol = {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 3e-2)
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * scale)


@pytest.mark.slow
@given(either_cases())
def test_gradients_match_native(case):
    got, want = [], []
    for f, out in ((case.mine, got), (case.native, want)):
        ts = [t if t is None else t.requires_grad_() for t in case.tensors()]
        y = f(*ts)
        g = torch.randn(y.shape, dtype=D, generator=torch.Generator().manual_seed(case.seed))
        out.append(y.detach())
        out.extend(torch.autograd.grad(y, [t for t in ts if t is not None], g))
    for a, b in zip(got, want):
        _close(a, b)


@pytest.mark.slow
@given(either_cases())
def test_forward_ad_matches_native(case):
    primals = tuple(t for t in case.tensors() if t is not None)
    g = torch.Generator().manual_seed(case.seed + 1)
    tangents = tuple(torch.randn(t.shape, dtype=D, generator=g) for t in primals)

    def call(f):
        return lambda *ts: f(*ts, None) if len(ts) == 2 else f(*ts)

    got = torch.func.jvp(call(case.mine), primals, tangents)
    want = torch.func.jvp(call(case.native), primals, tangents)
    _close(got[0], want[0])
    _close(got[1], want[1])


@pytest.mark.slow
@given(either_cases())
def test_double_backward_matches_native(case):
    got, want = [], []
    for f, out in ((case.mine, got), (case.native, want)):
        ts = [t if t is None else t.requires_grad_() for t in case.tensors()]
        x, w = ts[0], ts[1]
        loss = f(*ts).sin().sum()
        gx, gw = torch.autograd.grad(loss, (x, w), create_graph=True)
        penalty = gx.square().sum() + gw.square().sum()
        grads = torch.autograd.grad(penalty, (x, w), allow_unused=True)
        # torch leaves an empty batch's second-order gradients unused (None)
        out.extend(torch.zeros_like(t) if g is None else g for g, t in zip(grads, (x, w)))
    for a, b in zip(got, want):
        _close(a, b)


@given(either_cases(), st.sampled_from([(0, None), (None, 0), (0, 0)]))
def test_vmap_matches_native(case, in_dims):
    x, w, b = case.tensors()
    g = torch.Generator().manual_seed(case.seed + 2)
    xs = torch.randn((2,) + tuple(x.shape), dtype=D, generator=g) if in_dims[0] == 0 else x
    ws = torch.randn((2,) + tuple(w.shape), dtype=D, generator=g) if in_dims[1] == 0 else w
    got = torch.func.vmap(lambda a, c: case.mine(a, c, b), in_dims=in_dims)(xs, ws)
    want = torch.func.vmap(lambda a, c: case.native(a, c, b), in_dims=in_dims)(xs, ws)
    _close(got, want)


# -- bad arguments: mucudnn errors naming them -------------------------------------------------------

#: (argument, bad value, the names its error may give). A value is a callable
#: where it depends on the case.
BAD: list = [
    ("stride", 0, ("stride",)), ("stride", -1, ("stride",)), ("stride", 1.5, ("stride",)),
    ("stride", "2", ("stride",)), ("stride", None, ("stride",)), ("stride", True, ("stride",)),
    ("stride", lambda nd: (1,) * (nd + 1), ("stride",)), ("stride", (), ("stride",)),
    ("stride", [1.0, 1.0, 1.0][:2], ("stride",)),
    ("padding", -1, ("padding",)), ("padding", "full", ("padding",)),
    ("padding", lambda nd: (0,) * (nd + 1), ("padding",)), ("padding", 0.5, ("padding",)),
    ("padding", None, ("padding",)), ("padding", object(), ("padding",)),
    ("dilation", 0, ("dilation",)), ("dilation", -2, ("dilation",)), ("dilation", 2.0, ("dilation",)),
    ("dilation", [1, "a"], ("dilation",)),
    ("groups", 0, ("groups",)), ("groups", -1, ("groups",)), ("groups", 1.5, ("groups",)),
    ("groups", "1", ("groups",)), ("groups", None, ("groups",)), ("groups", True, ("groups",)),
    ("groups", 7, ("groups", "weight")),
    ("workspace_limit", -1, ("workspace_limit",)), ("workspace_limit", 1.5, ("workspace_limit",)),
    ("workspace_limit", True, ("workspace_limit",)), ("workspace_limit", "64MB", ("workspace_limit",)),
    ("policy", "bogus", ("policy",)), ("policy", [], ("policy",)), ("policy", [0], ("policy",)),
    ("policy", [1.5], ("policy",)), ("policy", 3, ("policy",)), ("policy", None, ("policy",)),
    ("backend", "nope", ("backend",)), ("backend", 3, ("backend",)), ("backend", object(), ("backend",)),
    ("backend", "cudnn", ("backend",)),
]

#: Bad tensors: (argument, how to make it from (x, w, b), names).
BAD_TENSORS: list = [
    ("input", lambda x, w, b: x.tolist(), ("input",)),
    ("input", lambda x, w, b: x.numpy(), ("input",)),
    ("input", lambda x, w, b: x.flatten(), ("input",)),
    ("input", lambda x, w, b: x.unsqueeze(0).unsqueeze(0), ("input",)),
    ("input", lambda x, w, b: x.long(), ("input",)),
    ("input", lambda x, w, b: x.to(torch.complex128), ("input",)),
    ("input", lambda x, w, b: x[..., :0], ("input",)),  # torch takes it in an empty batch
    ("input", lambda x, w, b: x.to("meta"), ("input", "weight")),
    ("weight", lambda x, w, b: None, ("weight",)),
    ("weight", lambda x, w, b: w[0], ("weight",)),
    ("weight", lambda x, w, b: torch.cat([w, w], 1), ("weight",)),
    ("weight", lambda x, w, b: w.float(), ("weight",)),
    ("weight", lambda x, w, b: w.long(), ("weight",)),
    ("weight", lambda x, w, b: w.to("meta"), ("weight",)),
    ("bias", lambda x, w, b: torch.zeros(w.shape[0] + 1, dtype=D), ("bias",)),
    ("bias", lambda x, w, b: torch.zeros((), dtype=D), ("bias",)),
    ("bias", lambda x, w, b: [0.0] * w.shape[0], ("bias",)),
    ("bias", lambda x, w, b: torch.zeros(w.shape[0], dtype=torch.float32), ("bias", "weight")),
]


def _check_error(exc: BaseException, names: tuple) -> None:
    assert isinstance(exc, mucudnn.MucudnnError), f"{type(exc).__mro__}: {exc}"
    assert isinstance(exc, (ValueError, TypeError)), type(exc).__mro__
    msg = str(exc)
    assert any(msg.startswith(n + ":") or f"{n}:" in msg for n in names), (names, msg)


@given(cases(), st.sampled_from(BAD))
def test_a_bad_argument_raises_a_mucudnn_error_naming_it(case, bad):
    name, value, names = bad
    if callable(value):
        value = value(case.nd)
    x, w, b = case.tensors()
    kwargs = {**case.kwargs, **case.options, name: value}
    if name == "stride" and kwargs.get("padding") == "same":
        kwargs["padding"] = 0
    f = MINE[case.nd]
    if name == "groups" and value == 7:
        kwargs["padding"] = 0 if kwargs.get("padding") == "same" else kwargs.get("padding", 0)
    with pytest.raises(Exception) as info:
        f(x, w, b, **kwargs)
    _check_error(info.value, names)


#: bad values of a transposed convolution's own argument, and of padding it takes
#: no string for
BAD_TRANSPOSED: list = [
    ("output_padding", -1, ("output_padding",)), ("output_padding", 1.5, ("output_padding",)),
    ("output_padding", 99, ("output_padding",)), ("output_padding", "1", ("output_padding",)),
    ("output_padding", lambda nd: (0,) * (nd + 1), ("output_padding",)),
    ("padding", "same", ("padding",)), ("padding", "valid", ("padding",)),
]


@given(transposed_cases(), st.sampled_from(BAD + BAD_TRANSPOSED))
def test_a_bad_transposed_argument_raises_a_mucudnn_error_naming_it(case, bad):
    name, value, names = bad
    if callable(value):
        value = value(case.nd)
    if name == "padding" and value == "full":
        value = "same"
    x, w, b = case.tensors()
    kwargs = {**case.kwargs, **case.options, name: value}
    if name in ("stride", "dilation"):  # the output padding is checked against them
        kwargs.pop("output_padding", None)
    with pytest.raises(Exception) as info:
        MINE_T[case.nd](x, w, b, **kwargs)
    _check_error(info.value, names)


@given(cases(), st.sampled_from(BAD_TENSORS))
def test_a_bad_tensor_raises_a_mucudnn_error_naming_it(case, bad):
    name, make, names = bad
    x, w, b = case.tensors()
    if b is None and name == "bias":
        b = torch.zeros(w.shape[0], dtype=D)
    args = {"input": x, "weight": w, "bias": b}
    args[name] = make(x, w, b)
    f = MINE[case.nd]
    ref = None
    if args["input"] is not x and isinstance(args["input"], torch.Tensor) \
            and args["input"].dtype == D and 0 in args["input"].shape[1:]:
        try:  # a zero-size input: where torch takes it (an empty batch), so must we
            ref = case.native(args["input"], args["weight"], args["bias"])
        except RuntimeError:
            pass
    if ref is not None:
        _close(f(args["input"], args["weight"], args["bias"], **case.kwargs, **case.options),
               ref)
        return
    with pytest.raises(Exception) as info:
        f(args["input"], args["weight"], args["bias"], **case.kwargs, **case.options)
    _check_error(info.value, names)


@given(cases(), st.integers(0, 3))
def test_an_input_smaller_than_the_kernel_raises_naming_input(case, cut):
    x, w, b = case.tensors()
    k = case.w_shape[2]
    if "padding" in case.kwargs and case.kwargs["padding"] == "same":
        return
    x = x[..., : max(1, min(cut, k - 1))] if k > 1 else x[..., :0]
    try:
        ref = case.native(x, w, b)
    except RuntimeError:
        ref = None
    if ref is not None:  # torch accepts it: so must we, with the same result
        _close(case.mine(x, w, b), ref)
        return
    with pytest.raises(Exception) as info:
        case.mine(x, w, b)
    _check_error(info.value, ("input",))


@given(cases(), st.sampled_from([10 ** 12, 2 ** 70]))
def test_a_padding_no_output_can_hold_is_refused_naming_it(case, padding):
    """The problem refuses it (Note [sizes that cannot exist]) before the
    output's allocation would fail inside torch."""
    x, w, b = case.tensors()
    if x.dim() == case.nd + 2 and x.shape[0] == 0:
        return  # an empty batch allocates nothing
    kwargs = {**case.kwargs, **case.options, "padding": padding, "stride": 1}
    with pytest.raises(Exception) as info:
        MINE[case.nd](x, w, b, **kwargs)
    _check_error(info.value, ("padding",))
