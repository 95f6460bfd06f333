"""Every exception mucudnn raises is a MucudnnError that is also the builtin it
always was (issue 34, L1): a scan of the source for raises of builtin exception
classes, and a fuzzed sample of bad calls of the public API checked for both
classes."""

from __future__ import annotations

import ast
import builtins
import inspect
import pathlib
import importlib
import pkgutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mucudnn as mu
from mucudnn.backends.numpy import NumpyBackend
from mucudnn.problem import ConvProblem, Direction, from_canonical

ROOT = pathlib.Path(mu.__file__).resolve().parent
#: Builtin exception classes; warnings are issued, not raised, and are left out.
BUILTIN_EXCEPTIONS = frozenset(
    n for n in dir(builtins)
    if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)
    and not issubclass(getattr(builtins, n), Warning))
#: Exceptions the interpreter's protocols need bare (never argument errors).
PROTOCOL = frozenset({"StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt",
                      "SystemExit"})
#: Files that may still raise builtin classes (none: every file of the
#: library raises MucudnnError subclasses); an entry names whose work it is.
PENDING: dict[str, str] = {}


def _pending_key(rel: str) -> str:
    return "torch" if rel.startswith("torch/") else rel


def builtin_raises(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """``file:line: ValueError`` for each raise or construction of a builtin
    exception class in ``path`` (and ``class X(KeyError)`` for each exception
    class deriving from builtins only); a bare ``raise`` aside."""
    tree = ast.parse(path.read_text(), str(path))
    hits: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Raise) and node.exc is not None:
            fn = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = fn.id if isinstance(fn, ast.Name) else None
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
        elif isinstance(node, ast.ClassDef):
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            # a private class is control flow inside its module (caught there);
            # MucudnnError is the one base that derives from Exception alone
            if bases and all(b in BUILTIN_EXCEPTIONS for b in bases) \
                    and not node.name.startswith("_") and node.name != "MucudnnError":
                hits.add((node.lineno, f"class {node.name}({', '.join(bases)})"))
            continue
        if name in BUILTIN_EXCEPTIONS and name not in PROTOCOL:
            hits.add((node.lineno, name))
    return [f"{path.relative_to(root)}:{line}: {what}" for line, what in sorted(hits)]


def _scan() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        hits = builtin_raises(path)
        if hits:
            found.setdefault(_pending_key(str(path.relative_to(ROOT))), []).extend(hits)
    return found


def test_the_scan_finds_builtin_raises(tmp_path):
    """The scanner itself: raises, constructions and classes of builtins are found,
    mucudnn's classes and a bare re-raise are not."""
    src = ("from .errors import InvalidValueError\n"
           "class Bad(KeyError):\n    pass\n"
           "class Good(InvalidValueError, KeyError):\n    pass\n"
           "def f(x):\n"
           "    if x: raise ValueError('a')\n"
           "    if x > 1: raise TypeError\n"
           "    err = RuntimeError('b')\n"
           "    try:\n        pass\n    except OSError:\n        raise\n"
           "    raise InvalidValueError('c')\n")
    probe = tmp_path / "probe.py"
    probe.write_text(src)
    hits = [h.split(": ", 1)[1] for h in builtin_raises(probe, tmp_path)]
    assert hits == ["class Bad(KeyError)", "ValueError", "TypeError", "RuntimeError"]


def test_the_library_raises_no_builtin_exception_class():
    found = _scan()
    unexpected = {k: v for k, v in found.items() if k not in PENDING}
    assert not unexpected, ("raise a MucudnnError subclass that is also the builtin "
                            "(mucudnn.errors.InvalidValueError, InvalidTypeError, ...):\n"
                            + "\n".join(h for v in unexpected.values() for h in v))


def test_every_exception_class_of_the_library_is_a_mucudnn_error():
    """Classes, imported: every public exception class defined in mucudnn (outside
    the pending files) derives from MucudnnError."""
    bad = []
    for info in pkgutil.walk_packages([str(ROOT)], "mucudnn."):
        rel = info.name[len("mucudnn."):].replace(".", "/") + ".py"
        if _pending_key(rel) in PENDING or info.name.endswith("__main__"):
            continue
        try:
            mod = importlib.import_module(info.name)
        except mu.MissingDependencyError:
            continue
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) \
                    and not issubclass(obj, (Warning, mu.MucudnnError)) \
                    and obj.__module__ == info.name and not name.startswith("_"):
                bad.append(f"{info.name}.{name}")
    assert not bad, bad


# -- behaviour: bad calls of the public API -----------------------------------------------

NP = NumpyBackend()
DTYPES = [np.float16, np.float32, np.float64]
OTHER_DTYPES = [np.int8, np.int32, np.int64, np.uint8, np.uint16, np.complex64, np.complex128,
                np.bool_, np.float16, np.float32, np.float64]


@st.composite
def problems(draw):
    layout = draw(st.sampled_from(["NCHW", "NHWC", "NCDHW", "NDHWC"]))
    nd = 2 if len(layout) == 4 else 3
    g = draw(st.integers(1, 2))
    c, k = g * draw(st.integers(1, 2)), g * draw(st.integers(1, 2))
    r = draw(st.integers(1, 2))
    pad = draw(st.integers(0, 1))
    h = draw(st.integers(max(1, r - 2 * pad), 4))
    return ConvProblem(from_canonical((draw(st.integers(1, 3)), c) + (h,) * nd, layout),
                       from_canonical((k, c // g) + (r,) * nd, layout), padding=pad, groups=g,
                       layout=layout, dtype=draw(st.sampled_from(["float16", "float32",
                                                                  "float64"])))


def _bad_calls(draw):
    """(description, a callable making one bad call) on a drawn problem."""
    P = draw(problems())
    dt = np.dtype(P.dtype)
    conv = mu.Convolution(P.x_shape, P.w_shape, padding=P.padding, groups=P.groups,
                          layout=P.layout, dtype=P.dtype, backend=NP, policy="undivided",
                          cache=False)
    d = draw(st.sampled_from(list(Direction)))
    roles = {Direction.FORWARD: ("x", "w", "y"), Direction.BACKWARD_DATA: ("y", "w", "x"),
             Direction.BACKWARD_FILTER: ("x", "y", "w")}[d]
    run = {Direction.FORWARD: conv.forward, Direction.BACKWARD_DATA: conv.backward_data,
           Direction.BACKWARD_FILTER: conv.backward_filter}[d]
    args = [np.zeros(P.shape_of(r), dt) for r in roles]
    kwargs: dict = {}
    slot = draw(st.integers(0, 2))
    kind = draw(st.sampled_from(["shape", "dtype", "type", "readonly", "noncontig", "alias",
                                 "kind", "alpha", "beta", "ndim"]))
    r = roles[slot]
    if kind == "shape":
        shape = list(P.shape_of(r))
        i = draw(st.integers(0, len(shape) - 1))
        shape[i] = draw(st.integers(1, 40).filter(lambda v: v != shape[i]))
        args[slot] = np.zeros(shape, dt)
    elif kind == "dtype":
        args[slot] = np.zeros(P.shape_of(r), draw(st.sampled_from(
            [t for t in OTHER_DTYPES if np.dtype(t) != dt])))
    elif kind == "type":
        args[slot] = draw(st.one_of(st.none(), st.text(max_size=3), st.integers(),
                                    st.floats(), st.lists(st.floats(), max_size=3),
                                    st.just(object()), st.just({"a": 1})))
        if args[slot] is None and slot == 2:
            kwargs["beta"] = 1.0  # beta reads the output: a missing one is an error
    elif kind == "readonly":
        args[2].setflags(write=False)
    elif kind == "noncontig":
        out = P.shape_of(roles[2])
        big = np.zeros(out[:-1] + (2 * out[-1],), dt)
        args[2] = big[..., ::2] if out[-1] > 1 or len(out) < 2 else \
            np.zeros((2 * out[0],) + out[1:], dt)[::2]
        if args[2].flags.c_contiguous:  # a stride on an axis of extent 1 only
            return "noncontig (none here)", lambda: run(args[0], args[1], "not an array")
    elif kind == "alias":
        # the output shares memory with an input (from a drawn offset)
        i = 0 if slot != 1 else 1
        n_out = int(np.prod(P.shape_of(roles[2])))
        off = draw(st.integers(0, args[i].size - 1))
        big = np.zeros(off + max(n_out, args[i].size), dt)
        args[i] = big[:args[i].size].reshape(args[i].shape)
        args[2] = big[off:off + n_out].reshape(P.shape_of(roles[2]))
    elif kind == "kind":
        # device memory (by its __cuda_array_interface__) among NumPy arrays, or no array
        args[slot] = draw(st.sampled_from([_FakeCuda(P.shape_of(r), dt),
                                           np.zeros(P.shape_of(r), dt).tolist()]))
    elif kind == "alpha":
        kwargs["alpha"] = draw(st.one_of(st.sampled_from([float("nan"), float("inf"),
                                                          -float("inf")]),
                                         st.text(max_size=2), st.none(), st.booleans(),
                                         st.complex_numbers(min_magnitude=1e-3)))
    elif kind == "beta":
        kwargs["beta"] = draw(st.one_of(st.sampled_from([float("nan"), float("inf")]),
                                        st.text(max_size=2), st.none(), st.booleans(),
                                        st.floats(allow_nan=False, allow_infinity=False)
                                        .filter(lambda v: v != 0)))
        if isinstance(kwargs["beta"], float) and np.isfinite(kwargs["beta"]):
            args[2] = None  # a beta that reads a missing output
    elif kind == "ndim":
        args[slot] = np.zeros(P.shape_of(r) + (1,) * draw(st.integers(1, 2)), dt)
    return f"{d.value} {kind} slot {slot} {P}", lambda: run(*args, **kwargs)


class _FakeCuda:
    """A device array by its ``__cuda_array_interface__`` (never dereferenced:
    each call is refused before any device work)."""

    def __init__(self, shape, dtype):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": np.dtype(dtype).str,
                                         "data": (1 << 40, False), "version": 3,
                                         "strides": None, "stream": None}


@given(st.data())
def test_bad_convolution_calls_raise_mucudnn_errors(data):
    what, call = _bad_calls(data.draw)
    with pytest.raises(Exception) as info:
        call()
    exc = info.value
    assert isinstance(exc, mu.MucudnnError), (what, type(exc).__mro__, exc)
    assert isinstance(exc, (ValueError, TypeError)), (what, type(exc).__mro__, exc)


@pytest.mark.parametrize("make, builtin", [
    (lambda: mu.Convolution((2, 3, 5, 5), (4, 3, 3, 3), policy="bogus", backend="numpy"),
     ValueError),
    (lambda: mu.Convolution((2, 3, 5, 5), (4, 3, 3, 3), policy=[0], backend="numpy"),
     ValueError),
    (lambda: mu.Convolution((2, 3, 5, 5), (4, 3, 3, 3), policy=[2.5], backend="numpy"),
     ValueError),
    (lambda: mu.Convolution((2, 3, 5, 5), (4, 3, 3, 3), policy=7, backend="numpy"),
     ValueError),
    (lambda: mu.Convolution((2, 3, 5, 5), (4, 3, 3, 3), backend="bogus"), ValueError),
    (lambda: mu.Convolution((2, 3, 5, 5), (4, 3, 3, 3), backend="numpy", graph=1), TypeError),
    (lambda: mu.get_backend("numpy", device=0), ValueError),
    (lambda: mu.get_backend(NP, device=0), TypeError),
    (lambda: NP.workspace_size(ConvProblem((2, 3, 5, 5), (4, 3, 3, 3)), "forward", 7), ValueError),
    (lambda: NP.workspace_size(ConvProblem((2, 3, 5, 5), (4, 3, 3, 3)), "forward", 2.5),
     ValueError),
    (lambda: NP.workspace_size(ConvProblem((2, 3, 5, 5), (4, 3, 3, 3)), "forward", "gemm"),
     ValueError),
    (lambda: mu.conv2d(np.zeros((2, 3, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32),
                       layout="NCDHW", backend="numpy"), ValueError),
    (lambda: mu.conv2d(np.zeros((2, 3, 5, 5), np.int8), np.zeros((4, 3, 3, 3), np.int8),
                       backend="numpy"), ValueError),
])
def test_bad_names_and_options_raise_mucudnn_errors(make, builtin):
    with pytest.raises(builtin) as info:
        make()
    assert isinstance(info.value, mu.MucudnnError), type(info.value).__mro__
