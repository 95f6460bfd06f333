"""The NumPy (CPU) backend: the project's CPU truth, with real algorithms and real workspaces.

Three algorithms, numbered like cuDNN's enums (:class:`NumpyAlgo`), each doing
all three directions (forward, backward-data, backward-filter) for every
:class:`~mucudnn.problem.ConvProblem` (2-D and 3-D, NCHW/NHWC/NCDHW/NDHWC,
groups, stride, padding, dilation):

``DIRECT`` (0)
    Loops over filter taps; each tap is one batched GEMM over batch, channels
    and pixels. Workspace: 0 bytes.
``IM2COL_GEMM`` (1)
    Builds the column matrix (C x taps) x (N x output pixels) inside the
    workspace and does one GEMM per group. Workspace:
    ``C * prod(R) * N * prod(O) * itemsize(compute)``, linear in the batch.
``FFT`` (2)
    Transforms input, filter and output to the frequency domain (FFT size per
    spatial dim ``L = next_fast_len(H + 2 * pad)``), contracts channels per
    frequency with a GEMM and transforms back. Dilation is handled by dilating
    the filter (in the phases of its DFT), stride by subsampling (forward) or
    upsampling dy (backward).
    Workspace: the three frequency-domain buffers,
    ``align64(N*C*F*cs) + align64(K*(C/g)*F*cs) + align64(N*K*F*cs)`` with
    ``F = prod(L[:-1]) * (L[-1] // 2 + 1)`` and ``cs`` the complex itemsize
    (8 for float32/float16/bfloat16 compute, 16 for float64); linear in the batch.

Arrays are NumPy arrays packed in the problem's layout. float16 and bfloat16
are computed in float32 and rounded on store; bfloat16 needs ``ml_dtypes``.

All three compute the same function on every input, NaN, +-inf and values
near the type's maximum included: nothing overflows before the result itself
does (operands whose products could reach float32's limit are computed in
float64), and an output whose receptive field holds a NaN or inf gets DIRECT's
value, padding included (Note [padding products]). See Note [FFT and
non-finite inputs] in :mod:`mucudnn.backends._numpy_guard`.

>>> from mucudnn import ConvProblem, Direction
>>> from mucudnn.backends.base import ConvTensors
>>> be = NumpyBackend()
>>> p = ConvProblem((2, 3, 8, 8), (4, 3, 3, 3), padding=1)
>>> x = np.ones(p.x_shape, np.float32); w = np.ones(p.w_shape, np.float32)
>>> y = be.empty(p.output_shape, "float32")
>>> ws = be.alloc_workspace(be.workspace_size(p, Direction.FORWARD, NumpyAlgo.IM2COL_GEMM))
>>> be.run(Direction.FORWARD, NumpyAlgo.IM2COL_GEMM, 0, ConvTensors(p, x, w, y), 1.0, 0.0, ws)
>>> float(y[0, 0, 4, 4]), float(y[0, 0, 0, 0])
(27.0, 12.0)
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import itertools
import logging
import math
import operator
import platform
import time
from typing import Any, Callable, Iterator, Sequence, TypeVar, Union

import numpy as np
from scipy.fft import next_fast_len

from ..problem import AlgoPerf, ConvProblem, Direction, conv_dtype
from . import fold as _fold
from ._numpy_guard import Guarded
from .base import OUTPUT_OF, BackendBase, ConvTensors
from ..errors import InvalidTypeError, InvalidValueError, MucudnnError, UnsupportedOperationError
from ..units import format_bytes, parse_count

__all__ = ["NumpyAlgo", "NumpyBackend", "HostOutOfMemoryError"]

log = logging.getLogger("mucudnn")

_ALIGN = 64


T = TypeVar("T")


class HostOutOfMemoryError(MucudnnError, MemoryError):
    """The host cannot allocate the arrays a NumPy-backend call or find() needs."""


def _host_array(what: str, make: Callable[[], T], nbytes: int) -> T:
    """``make()``, a host allocation of ``nbytes``; HostOutOfMemoryError naming
    ``what`` when the host has no room for it."""
    try:
        return make()
    except MemoryError:
        raise HostOutOfMemoryError(f"{what}: the host cannot allocate {format_bytes(nbytes)} "
                                   "for the NumPy backend") from None


class NumpyAlgo(enum.IntEnum):
    """Algorithm ids of the NumPy backend (the same ids serve every direction)."""

    DIRECT = 0
    IM2COL_GEMM = 1
    FFT = 2


# -- dtypes -------------------------------------------------------------------------
def _bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, or NotImplementedError telling how to get it."""
    # Note: imported on every call (a dict lookup once loaded) rather than cached
    # at module import, so the dependency stays optional and tests can hide it.
    try:
        mod = importlib.import_module("ml_dtypes")
    except ImportError:
        raise UnsupportedOperationError(
            "bfloat16 on the NumPy backend needs ml_dtypes: pip install ml_dtypes") from None
    return np.dtype(mod.bfloat16)


def _np_dtype(name: Any) -> np.dtype:
    """NumPy dtype of one of the problem's dtype names ('float32', 'bfloat16', ...)."""
    name = conv_dtype(name)
    if name == "bfloat16":
        return _bfloat16()
    return np.dtype(name)


def _compute_dtype(p: ConvProblem) -> np.dtype:
    # Note: float16/bfloat16 accumulate in float32 like cuDNN's default; a
    # problem's compute_type of "float16" is treated as float32 here too (the
    # CPU truth does not emulate lower-precision accumulation).
    return np.dtype(np.float64) if p.dtype == "float64" or p.compute_type == "float64" \
        else np.dtype(np.float32)


def _complex_dtype(p: ConvProblem) -> np.dtype:
    return np.dtype(np.complex128) if _compute_dtype(p) == np.float64 else np.dtype(np.complex64)


# -- geometry -------------------------------------------------------------------------
def _canon(a: np.ndarray, layout: str) -> np.ndarray:
    """A view of ``a`` in canonical (N, C, spatial...) order."""
    return a if layout[1] == "C" else np.moveaxis(a, -1, 1)


def _prod(t: Sequence[int]) -> int:
    return int(math.prod(t))


def _taps(p: ConvProblem) -> Iterator[tuple[int, tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]:
    """For each filter tap whose window meets the (unpadded) input: its flat
    index, its index tuple, the output slices it contributes to and the input
    slices it reads (strided).

    Note: computing the valid output range per tap, instead of padding the
    input, keeps DIRECT free of any padded copy and lets IM2COL write straight
    from x into the column buffer.
    """
    xs, out = p.x_dims[2:], p.y_dims[2:]
    for flat, tap in enumerate(itertools.product(*(range(r) for r in p.w_dims[2:]))):
        osl, isl = [], []
        for t, s, d, pad, h, o in zip(tap, p.stride, p.dilation, p.padding, xs, out):
            off = t * d - pad                      # input index = o * s + off
            lo = max(0, -(off // s))               # ceil(-off / s)
            hi = min(o - 1, (h - 1 - off) // s)
            if hi < lo:
                break
            osl.append(slice(lo, hi + 1))
            isl.append(slice(lo * s + off, hi * s + off + 1, s))
        else:
            yield flat, tap, tuple(osl), tuple(isl)


# Note [padding products]
# ~~~~~~~~~~~~~~~~~~~~~~~
# A convolution multiplies every weight by every input of its window, and the
# padding is inputs equal to 0: an output whose window puts a NaN or inf weight
# over the padding is NaN (0 * inf and 0 * NaN are NaN), as the definition over
# the padded input makes it (so PyTorch's convolutions that pad explicitly;
# some of its CPU kernels skip the padding instead), and likewise a weight
# gradient whose tap meets a NaN or inf of dy where the tap reads the padding. DIRECT skips the
# padding (_taps), so it adds those products' NaN afterwards, from where each
# tap reads the padding (_padding_reads); the other algorithms take DIRECT's
# value wherever it is not finite (Guarded). The data gradient has no padding
# products: it is the adjoint, whose terms land in the padding and are dropped.
def _padding_reads(p: ConvProblem) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """See Note [padding products]: each filter tap that reads the padding at some
    output, with a mask over the output's spatial dims, True where it does."""
    xs, out = p.x_dims[2:], p.y_dims[2:]
    nd = len(out)
    for tap in itertools.product(*(range(r) for r in p.w_dims[2:])):
        inside = np.ones((1,) * nd, bool)
        for i, (t, s, d, pad, h, o) in enumerate(zip(tap, p.stride, p.dilation, p.padding,
                                                     xs, out)):
            pos = np.arange(o) * s + t * d - pad
            inside = inside & ((pos >= 0) & (pos < h)).reshape((1,) * i + (o,) + (1,) * (nd - i - 1))
        if not inside.all():
            yield tap, ~np.broadcast_to(inside, out)


def _taps_cover_all(p: ConvProblem) -> bool:
    """True when every tap reads a full output window (no padding effects)."""
    out = p.y_dims[2:]
    n = 0
    for _, _, osl, _ in _taps(p):
        if any(s.stop - s.start != o for s, o in zip(osl, out)):
            return False
        n += 1
    return n == _prod(p.w_dims[2:])


def _fft_sizes(p: ConvProblem) -> tuple[int, ...]:
    """FFT size per spatial dim: the padded input length rounded up to a fast size.

    Note: ``L >= H + 2 * pad`` is enough for every direction: it holds the
    dilated filter, the upsampled dy convolved with it, and (with padding taken
    as a circular shift instead of a padded copy) it needs ``L >= H + pad``.
    """
    return tuple(next_fast_len(h + 2 * q, real=True) for h, q in zip(p.x_dims[2:], p.padding))


def _fft_freqs(sizes: Sequence[int]) -> int:
    return _prod(sizes[:-1]) * (sizes[-1] // 2 + 1)


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _carve(ws: np.ndarray, parts: Sequence[tuple[tuple[int, ...], np.dtype]]) -> list[np.ndarray]:
    """Views of consecutive 64-byte-aligned segments of the uint8 workspace."""
    views, off = [], 0
    for shape, dt in parts:
        nbytes = _prod(shape) * np.dtype(dt).itemsize
        views.append(ws[off:off + nbytes].view(dt).reshape(shape))
        off += _align(nbytes)
    return views


# -- the backend -----------------------------------------------------------------------
class NumpyBackend(BackendBase):
    """CPU convolutions in NumPy with three real algorithms (see :class:`NumpyAlgo`).

    ``repeats``: timed runs per algorithm in :meth:`find` (the median is
    reported, after one untimed warm-up run); ``seed``: the random data find uses.
    ``fold``: find() also times each algorithm on the problem folded by
    space-to-depth, where it folds (ids ``"fold{s}|{algo}"``; Note [folded
    first layers] in :mod:`mucudnn.backends.fold`). Off by default here, the
    CPU reference; run() and workspace_size() take folded ids either way.

    >>> be = NumpyBackend()
    >>> p = ConvProblem((4, 8, 12, 12), (8, 8, 3, 3), padding=1)
    >>> perfs = be.find(p, Direction.FORWARD, workspace_limit=1 << 30)
    >>> sorted(a.algo for a in perfs)
    [0, 1, 2]
    >>> be.workspace_size(p, Direction.FORWARD, NumpyAlgo.DIRECT)
    0
    """

    name = "numpy"
    is_host = True

    def __init__(self, repeats: int = 3, seed: int = 0, fold: bool = False) -> None:
        self.repeats = parse_count(repeats, "repeats", 1)
        self.seed = seed
        self.fold = bool(fold)
        self.version = np.__version__
        self.device_name = _cpu_name()

    def __repr__(self) -> str:
        return f"NumpyBackend(device={self.device_name!r}, numpy={self.version})"

    # -- algorithms and their workspaces -----------------------------------------
    @staticmethod
    def algorithms() -> list[NumpyAlgo]:
        """Every algorithm id of this backend."""
        return list(NumpyAlgo)

    @staticmethod
    def supports(problem: ConvProblem, direction: Direction, algo: Union[int, str]) -> bool:
        """Whether ``algo`` can run ``problem`` in ``direction`` (every algorithm
        can; a folded one where the problem folds by its factor)."""
        Direction.parse(direction)
        folded = _fold.split_fold_id(algo)
        if folded is not None:
            f = _fold.fold_of(problem)
            _algo(folded[1])
            return f is not None and f.s == folded[0]
        _algo(algo)
        return True

    def workspace_size(self, problem: ConvProblem, direction: Direction,
                       algo: Union[int, str], math_type: Union[int, str] = 0) -> int:
        """Bytes of workspace ``algo`` needs for ``problem`` (math_type is ignored).

        >>> p = ConvProblem((2, 3, 5, 5), (4, 3, 3, 3))
        >>> NumpyBackend().workspace_size(p, "forward", NumpyAlgo.IM2COL_GEMM)  # 27 x (2*3*3) x 4 B
        1944
        """
        direction = Direction.parse(direction)
        folded = _fold.split_fold_id(algo)
        if folded is not None:
            f = _fold.folding(problem, folded[0])
            inner = _workspace_bytes(f.inner, _algo(folded[1]))
            return _fold.regions(f, problem.batch).inner + inner
        return _workspace_bytes(problem, _algo(algo))

    # -- find ------------------------------------------------------------------------
    def find(self, problem: ConvProblem, direction: Direction,
             workspace_limit: int | None) -> list[AlgoPerf]:
        """Time every algorithm whose workspace fits ``workspace_limit`` (None:
        no limit) on random data of ``problem``'s shape; fastest first.

        Each time is the median of ``repeats`` runs after one warm-up run.
        """
        direction = Direction.parse(direction)
        if workspace_limit is not None and workspace_limit < 0:
            raise InvalidValueError(f"workspace_limit: expected >= 0 bytes, got {workspace_limit!r}")
        dt = _np_dtype(problem.dtype)
        rng = np.random.default_rng(self.seed)

        def rand(shape: tuple[int, ...]) -> np.ndarray:
            # Note: uniform in [0.5, 1.5) with random sign: non-zero, so no
            # algorithm can profit from zeros, and finite in every dtype.
            a = rng.uniform(0.5, 1.5, shape) * rng.choice((-1.0, 1.0), shape)
            return a.astype(dt)

        nbytes = problem.itemsize * sum(math.prod(problem.shape_of(t)) for t in "xwy")
        tensors = _host_array(f"problem {problem.key()}", lambda: ConvTensors(
            problem, rand(problem.x_shape), rand(problem.w_shape), rand(problem.output_shape)),
            nbytes)
        perfs = []
        algos: list[Union[int, str]] = list(NumpyAlgo)
        f = _fold.fold_of(problem) if self.fold else None
        if f is not None:  # Note [folded first layers]
            algos += [_fold.fold_id(f.s, int(a)) for a in NumpyAlgo]
        for algo in algos:
            ws_bytes = self.workspace_size(problem, direction, algo)
            if workspace_limit is not None and ws_bytes > workspace_limit:
                continue
            try:
                ws = self.alloc_workspace(ws_bytes) if ws_bytes else None
                times = []
                for i in range(self.repeats + 1):
                    t0 = time.perf_counter()
                    self.run(direction, algo, 0, tensors, 1.0, 0.0, ws)
                    if i:  # the first run is a warm-up
                        times.append((time.perf_counter() - t0) * 1e3)
            except MemoryError:
                log.info("numpy find: %s %s skipped (out of memory)", algo, direction)
                continue
            perfs.append(AlgoPerf(algo=algo if isinstance(algo, str) else int(algo),
                                  time_ms=float(np.median(times)),
                                  workspace_bytes=ws_bytes, math_type=0, determinism=1))
        perfs.sort(key=lambda a: (a.time_ms, a.workspace_bytes, a.algo))
        log.debug("numpy find %s %s: %s", direction, problem.key(), perfs)
        return perfs

    # -- run -------------------------------------------------------------------------
    def run(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
            tensors: ConvTensors, alpha: float, beta: float, workspace: Any) -> None:
        """output = alpha * op(...) + beta * output, in place.

        Forward writes ``tensors.y``, backward-data ``tensors.x`` (dx from dy =
        ``tensors.y``), backward-filter ``tensors.w`` (dw from x and dy). With
        ``beta == 0`` the prior output is never read (it may hold NaN).
        ``workspace`` is a 1-D uint8 array (or None for 0 bytes) of at least
        :meth:`workspace_size` bytes, else ValueError.
        """
        direction = Direction.parse(direction)
        folded = _fold.split_fold_id(algo)
        if folded is not None:
            self._run_folded(direction, folded, math_type, tensors, alpha, beta, workspace)
            return
        algo = _algo(algo)
        p = tensors.problem
        dt = _np_dtype(p.dtype)
        out_name = OUTPUT_OF[direction]
        _check_tensors(p, tensors, out_name)
        out = getattr(tensors, out_name)
        need = self.workspace_size(p, direction, algo)
        ws = _check_workspace(workspace, need, algo.name)

        x = _canon(tensors.x, p.layout)
        w = _canon(tensors.w, p.layout)
        y = _canon(tensors.y, p.layout)
        cdt = _compute_dtype(p)
        if dt != cdt:
            # Note: float16/bfloat16 inputs are widened once here (contiguous, fast)
            # rather than inside the algorithms' strided per-tap copies.
            if direction is not Direction.BACKWARD_DATA:
                x = x.astype(cdt)
            if direction is not Direction.BACKWARD_FILTER:
                w = w.astype(cdt)
            if direction is not Direction.FORWARD:
                y = y.astype(cdt)
        impl = _IMPLS[algo]
        if direction is Direction.FORWARD:
            r = impl.forward(p, x, w, ws)
        elif direction is Direction.BACKWARD_DATA:
            r = impl.backward_data(p, w, y, ws)
        else:
            r = impl.backward_filter(p, x, y, ws)
        _store(_canon(out, p.layout), r, alpha, beta)

    def _run_folded(self, direction: Direction, folded: tuple[int, Union[int, str]],
                    math_type: Union[int, str], tensors: ConvTensors, alpha: float,
                    beta: float, workspace: Any) -> None:
        """See Note [folded first layers]: fold into the workspace's regions, run the
        inner algorithm there, unfold (alpha and beta applied on the way back)."""
        p = tensors.problem
        s, inner_algo = folded
        f = _fold.folding(p, s)
        dt = _np_dtype(p.dtype)
        _check_tensors(p, tensors, OUTPUT_OF[direction])
        need = self.workspace_size(p, direction, _fold.fold_id(s, inner_algo))
        ws = _check_workspace(workspace, need, _fold.fold_id(s, inner_algo))
        reg = _fold.regions(f, p.batch)
        inner = f.inner.with_batch(p.batch)
        a = ws[reg.a:reg.a + reg.a_bytes].view(dt).reshape(inner.x_shape)
        b = ws[reg.b:reg.b + reg.b_bytes].view(dt).reshape(inner.w_shape)
        rest = ws[reg.inner:]
        if direction is not Direction.BACKWARD_DATA:
            a[...] = _fold.fold_x(f, tensors.x)
        if direction is not Direction.BACKWARD_FILTER:
            b[...] = _fold.fold_w(f, tensors.w)
        if direction is Direction.FORWARD:
            self.run(direction, inner_algo, math_type, ConvTensors(inner, a, b, tensors.y),
                     alpha, beta, rest)
            return
        self.run(direction, inner_algo, math_type, ConvTensors(inner, a, b, tensors.y),
                 1.0, 0.0, rest)
        cdt = _compute_dtype(p)
        if direction is Direction.BACKWARD_DATA:
            _store(tensors.x, _fold.unfold_x(f, a).astype(cdt), alpha, beta)
        else:
            _store(tensors.w, _fold.unfold_w(f, b).astype(cdt), alpha, beta)

    # -- arrays ------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array; ``dtype`` a name like "float16"."""
        dt = _np_dtype(dtype)
        return _host_array(f"array of shape {tuple(shape)}", lambda: np.empty(tuple(shape), dt),
                           dt.itemsize * math.prod(shape))

    def from_host(self, array: Any) -> np.ndarray:
        """A C-contiguous copy."""
        return np.array(array, order="C", copy=True)

    def to_host(self, array: Any) -> np.ndarray:
        """A C-contiguous copy."""
        return np.array(array, order="C", copy=True)

    def alloc_workspace(self, nbytes: int) -> np.ndarray:
        """A 1-D uint8 array of ``nbytes``; its slices are views."""
        if nbytes < 0:
            raise InvalidValueError(f"nbytes: expected >= 0, got {nbytes!r}")
        return np.empty(int(nbytes), np.uint8)

    def synchronize(self) -> None:
        """Nothing to wait for: every call is synchronous."""


# -- helpers of run ---------------------------------------------------------------------
def _workspace_bytes(p: ConvProblem, algo: NumpyAlgo) -> int:
    """What NumpyBackend.workspace_size reports (the same in every direction)."""
    if algo is NumpyAlgo.DIRECT:
        return 0
    if algo is NumpyAlgo.IM2COL_GEMM:
        n, c = p.x_dims[:2]
        return (c * _prod(p.w_dims[2:]) * n * _prod(p.y_dims[2:])
                * _compute_dtype(p).itemsize)
    # FFT: the same three frequency-domain buffers in every direction.
    n, c = p.x_dims[:2]
    k, cg = p.w_dims[:2]
    f = _fft_freqs(_fft_sizes(p))
    cs = _complex_dtype(p).itemsize
    return _align(n * c * f * cs) + _align(k * cg * f * cs) + _align(n * k * f * cs)


def _check_tensors(p: ConvProblem, tensors: ConvTensors, out_name: str) -> None:
    """x, w and y of ``tensors``: numpy arrays of ``p``'s shapes and dtype, the
    output ``out_name`` writeable; TypeError or ValueError naming the tensor."""
    dt = _np_dtype(p.dtype)
    for name, shape in (("x", p.x_shape), ("w", p.w_shape), ("y", p.output_shape)):
        a = getattr(tensors, name)
        if not isinstance(a, np.ndarray):
            raise InvalidTypeError(f"tensors.{name}: expected a numpy array, got {type(a).__name__}")
        if a.shape != shape:
            raise InvalidValueError(f"tensors.{name}: expected shape {shape} ({p.layout}), got {a.shape}")
        if a.dtype != dt:
            raise InvalidValueError(f"tensors.{name}: expected dtype {p.dtype}, got {a.dtype}")
    if not getattr(tensors, out_name).flags.writeable:
        raise InvalidValueError(f"tensors.{out_name}: the output array is read-only")


def _algo(algo: Union[int, str]) -> NumpyAlgo:
    """An algorithm by id, name or digits; an id that is not exactly an integer
    (2.5, True) names none (int() would truncate it to one)."""
    try:
        if isinstance(algo, str):
            return NumpyAlgo(int(algo)) if algo.isdigit() else NumpyAlgo[algo.upper()]
        if not isinstance(algo, bool):
            return NumpyAlgo(operator.index(algo))
    except (KeyError, ValueError, TypeError):
        pass
    raise InvalidValueError(
        f"algo: expected one of {[f'{a.name}={int(a)}' for a in NumpyAlgo]}, got {algo!r}")


def _check_workspace(workspace: Any, need: int, algo: str) -> np.ndarray:
    """The first ``need`` bytes of ``workspace``; TypeError or ValueError
    naming the argument and ``algo`` (the configuration's name) otherwise."""
    if workspace is None:
        have = 0
    elif not isinstance(workspace, np.ndarray):
        raise InvalidTypeError(f"workspace: expected a 1-D uint8 numpy array or None, "
                        f"got {type(workspace).__name__}")
    elif workspace.ndim != 1 or workspace.dtype != np.uint8:
        raise InvalidTypeError(f"workspace: expected a 1-D uint8 numpy array, got shape "
                        f"{workspace.shape} dtype {workspace.dtype}")
    else:
        have = workspace.nbytes
    if have < need:
        raise InvalidValueError(f"workspace: {algo} needs {need} bytes, got {have}")
    if need == 0:
        return np.empty(0, np.uint8)
    if not workspace.flags.c_contiguous or not workspace.flags.writeable:
        raise InvalidValueError("workspace: expected a contiguous, writeable array")
    return workspace[:need]


def _store(out: np.ndarray, r: np.ndarray, alpha: float, beta: float) -> None:
    """out = alpha * r + beta * out, computed in r's dtype, rounded on store."""
    r *= r.dtype.type(alpha)  # r is always a fresh array owned by the algorithm
    if beta != 0:
        r += r.dtype.type(beta) * out.astype(r.dtype)
    out[...] = r  # Note: beta == 0 never reads out, so a NaN there cannot leak


def _grouped(a: np.ndarray, g: int) -> np.ndarray:
    """(N, C, ...) -> (N, G, C/G, ...) view."""
    return a.reshape(a.shape[:1] + (g, a.shape[1] // g) + a.shape[2:])


# -- DIRECT ------------------------------------------------------------------------------
class _Direct:
    """One batched GEMM per filter tap; zero workspace.

    Note: "zero workspace" is the declared scratch: the per-tap strided slices
    NumPy copies to feed BLAS are ordinary temporaries no larger than x or y.
    """

    @staticmethod
    def forward(p: ConvProblem, x: np.ndarray, w: np.ndarray, ws: np.ndarray) -> np.ndarray:
        cdt = _compute_dtype(p)
        g = p.groups
        n = p.batch
        xg = _grouped(x, g)                                     # (N, G, Cg, H...)
        wg = w.astype(cdt).reshape((g, p.w_dims[0] // g) + w.shape[1:])  # (G, Kg, Cg, R...)
        yg = np.zeros((n, g, p.w_dims[0] // g) + p.y_dims[2:], cdt)
        for _, tap, osl, isl in _taps(p):
            xs = xg[(Ellipsis,) + isl]
            sub = xs.shape[3:]
            xs = xs.astype(cdt).reshape(n, g, xs.shape[2], -1)
            wt = wg[(Ellipsis,) + tap]                          # (G, Kg, Cg)
            yg[(Ellipsis,) + osl] += np.matmul(wt, xs).reshape(yg.shape[:3] + sub)
        if any(p.padding) and not np.isfinite(wg).all():       # Note [padding products]
            bad = ~np.isfinite(wg).all(axis=2)                  # (G, Kg, R...)
            for tap, reads in _padding_reads(p):
                hit = bad[(Ellipsis,) + tap]                    # (G, Kg)
                if hit.any():
                    np.copyto(yg, cdt.type(np.nan),
                              where=hit.reshape(hit.shape + (1,) * (yg.ndim - 3)) & reads)
        return yg.reshape(p.y_dims)

    @staticmethod
    def backward_data(p: ConvProblem, w: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        cdt = _compute_dtype(p)
        g = p.groups
        n = p.batch
        kg = p.w_dims[0] // g
        wg = w.astype(cdt).reshape((g, kg) + w.shape[1:])      # (G, Kg, Cg, R...)
        dyg = _grouped(dy, g)                                   # (N, G, Kg, O...)
        dx = np.zeros((n, g, p.w_dims[1]) + p.x_dims[2:], cdt)
        for _, tap, osl, isl in _taps(p):
            ds = dyg[(Ellipsis,) + osl]
            sub = ds.shape[3:]
            ds = ds.astype(cdt).reshape(n, g, kg, -1)
            wt = np.swapaxes(wg[(Ellipsis,) + tap], 1, 2)       # (G, Cg, Kg)
            dx[(Ellipsis,) + isl] += np.matmul(wt, ds).reshape(dx.shape[:3] + sub)
        return dx.reshape(p.x_dims)

    @staticmethod
    def backward_filter(p: ConvProblem, x: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        cdt = _compute_dtype(p)
        g = p.groups
        kg, cg = p.w_dims[0] // g, p.w_dims[1]
        xg = _grouped(x, g)
        dyg = _grouped(dy, g)
        dw = np.zeros((g, kg, cg) + p.w_dims[2:], cdt)
        for _, tap, osl, isl in _taps(p):
            # (G, Kg, N*P) @ (G, N*P, Cg): one GEMM per group sums batch and pixels.
            ds = np.ascontiguousarray(np.moveaxis(dyg[(Ellipsis,) + osl], 0, 2), cdt)
            xs = np.ascontiguousarray(np.moveaxis(xg[(Ellipsis,) + isl], 0, 2), cdt)
            dw[(Ellipsis,) + tap] = np.matmul(ds.reshape(g, kg, -1),
                                              xs.reshape(g, cg, -1).swapaxes(1, 2))
        if any(p.padding) and not np.isfinite(dyg).all():      # Note [padding products]
            bad = (~np.isfinite(dyg)).any(axis=0)               # (G, Kg, O...)
            axes = tuple(range(2, bad.ndim))
            for tap, reads in _padding_reads(p):
                hit = (bad & reads).any(axis=axes)              # (G, Kg)
                np.copyto(dw[(Ellipsis,) + tap], cdt.type(np.nan), where=hit[:, :, None])
        return dw.reshape(p.w_dims)


# -- IM2COL + GEMM -----------------------------------------------------------------------
class _Im2col:
    """The column matrix (G, Cg*T, N*P) lives in the workspace."""

    @staticmethod
    def _cols(p: ConvProblem, ws: np.ndarray) -> np.ndarray:
        g, cg = p.groups, p.w_dims[1]
        t = _prod(p.w_dims[2:])
        (cols,) = _carve(ws, [((g, cg, t, p.batch) + p.y_dims[2:], _compute_dtype(p))])
        return cols                                             # (G, Cg, T, N, O...)

    @classmethod
    def _im2col(cls, p: ConvProblem, x: np.ndarray, ws: np.ndarray) -> np.ndarray:
        cols = cls._cols(p, ws)
        if not _taps_cover_all(p):
            cols.fill(0)  # Note: only padding leaves parts of the columns unwritten
        xt = np.moveaxis(_grouped(x, p.groups), 0, 2)           # (G, Cg, N, H...) view
        for flat, _, osl, isl in _taps(p):
            # Note: the cast from x's dtype to the compute dtype happens in this copy.
            cols[(slice(None), slice(None), flat, slice(None)) + osl] = xt[(Ellipsis,) + isl]
        return cols

    @staticmethod
    def _dy_gemm(p: ConvProblem, dy: np.ndarray) -> np.ndarray:
        """dy as (G, Kg, N*P) in the compute dtype (a temporary the size of dy)."""
        g = p.groups
        kg = p.w_dims[0] // g
        d = np.moveaxis(_grouped(dy, g), 0, 2)                  # (G, Kg, N, O...)
        return np.ascontiguousarray(d, _compute_dtype(p)).reshape(g, kg, -1)

    @classmethod
    def forward(cls, p: ConvProblem, x: np.ndarray, w: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        kg = p.w_dims[0] // g
        cols = cls._im2col(p, x, ws)
        wm = w.astype(_compute_dtype(p)).reshape(g, kg, -1)
        yg = np.matmul(wm, cols.reshape(g, wm.shape[2], -1))    # (G, Kg, N*P)
        yg = yg.reshape((g, kg, p.batch) + p.y_dims[2:])
        return np.moveaxis(yg, 2, 0).reshape(p.y_dims)

    @classmethod
    def backward_data(cls, p: ConvProblem, w: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        kg = p.w_dims[0] // g
        cdt = _compute_dtype(p)
        cols = cls._cols(p, ws)
        wm = w.astype(cdt).reshape(g, kg, -1).swapaxes(1, 2)    # (G, Cg*T, Kg)
        np.matmul(wm, cls._dy_gemm(p, dy), out=cols.reshape(g, wm.shape[1], -1))
        dx = np.zeros((g, p.w_dims[1], p.batch) + p.x_dims[2:], cdt)   # (G, Cg, N, H...)
        for flat, _, osl, isl in _taps(p):                      # col2im
            dx[(Ellipsis,) + isl] += cols[(slice(None), slice(None), flat, slice(None)) + osl]
        return np.moveaxis(dx, 2, 0).reshape(p.x_dims)

    @classmethod
    def backward_filter(cls, p: ConvProblem, x: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        cols = cls._im2col(p, x, ws)
        cm = cols.reshape(g, p.w_dims[1] * _prod(p.w_dims[2:]), -1)   # (G, Cg*T, N*P)
        dw = np.matmul(cls._dy_gemm(p, dy), cm.swapaxes(1, 2))  # (G, Kg, Cg*T)
        return dw.reshape(p.w_dims)


# -- FFT ---------------------------------------------------------------------------------
class _FFT:
    """Frequency-domain convolution; the three spectra live in the workspace.

    Spectra are kept frequency-major, (F..., N, C), so the channel contraction
    at every frequency is one BLAS GEMM on strided views.

    Note: padding is never materialised: the circular correlation of the
    unpadded x is read at index ``o * s - pad (mod L)``, which is exact because
    ``L >= H + pad`` puts the wrapped indices on zeros.

    The methods expect finite operands small enough not to overflow: a
    transform spreads a NaN over its whole sample and overflows on values near
    the type's maximum. ``_IMPLS`` wraps them so (Note [FFT and non-finite
    inputs], _numpy_guard.py).
    """

    @staticmethod
    def _buffers(p: ConvProblem, ws: np.ndarray, first_n_c: tuple[int, int],
                 second: tuple[int, int], third: tuple[int, int]):
        sizes = _fft_sizes(p)
        fshape = sizes[:-1] + (sizes[-1] // 2 + 1,)
        cdt = _complex_dtype(p)
        # Carve in the order of the workspace formula: (N, C), (K, Cg), (N, K).
        return sizes, _carve(ws, [(fshape + first_n_c, cdt), (fshape + second, cdt),
                                  (fshape + third, cdt)])

    @staticmethod
    def _rfft_into(a: np.ndarray, sizes: tuple[int, ...], out: np.ndarray) -> np.ndarray:
        """rfftn of (A, B, spatial...) a, zero-extended to ``sizes``, into the
        frequency-major (F..., A, B) buffer ``out``."""
        nd = len(sizes)
        axes = tuple(range(2, 2 + nd))
        view = np.moveaxis(out, tuple(range(nd)), axes)         # (A, B, F...) view
        if not _FFT_OUT:  # NumPy < 2.0: no out=
            view[...] = np.fft.rfftn(a, s=sizes, axes=axes)
            return out
        # Note: np.fft.rfftn(out=...) needs the input as long as s on every axis
        # but the last, so the zero extension is done here: the real transform
        # of the last axis fills the corner the input covers, the rest is zeroed,
        # then the complex transforms run in place along the other axes.
        corner = (Ellipsis,) + tuple(slice(0, h) for h in a.shape[2:-1]) + (slice(None),)
        if a.shape[2:-1] != tuple(sizes[:-1]):
            view.fill(0)
        np.fft.rfft(a, n=sizes[-1], axis=-1, out=view[corner])
        for ax in axes[:-1]:
            np.fft.fft(view, axis=ax, out=view)
        return out

    @staticmethod
    def _filter_spectrum(p: ConvProblem, w: np.ndarray, sizes: tuple[int, ...], sign: int,
                         out: np.ndarray) -> None:
        """The (dilated) filter's spectrum into the frequency-major (F..., K, Cg) buffer.

        ``sign=-1`` is the DFT, ``sign=+1`` its conjugate (what correlation needs).

        Note: the filter has only R taps per axis, so its transform is a direct
        DFT by small matrix products (taps x frequencies), with the dilation put
        in the phases; an FFT over the mostly-zero, filter-sized buffer walks
        K x Cg lines with huge strides and was ten times slower.
        """
        nd = len(sizes)
        m = p.w_dims[0] * p.w_dims[1]
        cdt = _complex_dtype(p)
        a = np.moveaxis(w, (0, 1), (nd, nd + 1)).astype(cdt).reshape(p.w_dims[2:] + (m,))
        mats = []
        for i, (r, d, L) in enumerate(zip(p.w_dims[2:], p.dilation, sizes)):
            f = np.arange(L // 2 + 1 if i == nd - 1 else L)
            mats.append(np.exp(sign * 2j * np.pi * np.outer(f, np.arange(r) * d) / L).astype(cdt))
        for i in range(nd - 1, 0, -1):   # the small axes first, axis 0 last, straight into out
            a = np.ascontiguousarray(np.moveaxis(np.tensordot(mats[i], a, axes=(1, i)), 0, i))
        np.matmul(mats[0], a.reshape(a.shape[0], -1), out=out.reshape(sizes[0], -1))

    @staticmethod
    def _inverse_at(spec: np.ndarray, sizes: tuple[int, ...],
                    idx: Sequence[np.ndarray]) -> np.ndarray:
        """irfftn of the frequency-major (F..., M) ``spec`` evaluated only at the
        indices ``idx[i]`` of each spatial axis: (len(idx[0]), ..., M), real.

        Note: a direct inverse DFT at the few points backward-filter needs (R
        per axis) instead of a full irfftn of the K x Cg x L... buffer. The
        last axis holds half a spectrum, so its bins are weighted as irfft does
        (1 for DC and Nyquist, 2 otherwise) and the real part is taken at the end.
        """
        nd = len(sizes)
        mats = []
        for i, (j, L) in enumerate(zip(idx, sizes)):
            half = i == nd - 1
            f = np.arange(L // 2 + 1 if half else L)
            e = np.exp(2j * np.pi * np.outer(j, f) / L) / L
            if half:
                c = np.full(f.size, 2.0)
                c[0] = 1.0
                if L % 2 == 0:
                    c[-1] = 1.0
                e = e * c
            mats.append(e.astype(spec.dtype))
        a = np.matmul(mats[0], spec.reshape(spec.shape[0], -1)).reshape((len(idx[0]),) + spec.shape[1:])
        for i in range(1, nd):
            a = np.moveaxis(np.tensordot(mats[i], a, axes=(1, i)), 0, i)
        return np.ascontiguousarray(a.real)

    @staticmethod
    def _upsampled(p: ConvProblem, dy: np.ndarray) -> np.ndarray:
        """dy with (stride - 1) zeros between outputs, compute dtype."""
        if all(s == 1 for s in p.stride):
            return dy.astype(_compute_dtype(p))
        o1 = tuple((o - 1) * s + 1 for o, s in zip(p.y_dims[2:], p.stride))
        up = np.zeros(p.y_dims[:2] + o1, _compute_dtype(p))
        up[(Ellipsis,) + tuple(slice(None, None, s) for s in p.stride)] = dy
        return up

    @staticmethod
    def _pick(r: np.ndarray, idx: Sequence[np.ndarray]) -> np.ndarray:
        """r[idx0, idx1, ...] on the leading spatial axes (an outer product of indices)."""
        return r[np.ix_(*idx)] if len(idx) > 1 else r[idx[0]]

    @classmethod
    def forward(cls, p: ConvProblem, x: np.ndarray, w: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        n, c = p.x_dims[:2]
        k, cg = p.w_dims[:2]
        kg = k // g
        sizes, (xf, wf, yf) = cls._buffers(p, ws, (n, c), (k, cg), (n, k))
        nd = len(sizes)
        cls._rfft_into(x.astype(_compute_dtype(p), copy=False), sizes, xf)
        cls._filter_spectrum(p, w, sizes, +1, wf)                # conjugate: correlation
        f = xf.shape[:nd]
        a = xf.reshape(f + (n, g, cg)).swapaxes(nd, nd + 1)      # (F..., G, N, Cg)
        b = wf.reshape(f + (g, kg, cg)).swapaxes(nd + 1, nd + 2)  # (F..., G, Cg, Kg)
        yv = yf.reshape(f + (g, n, kg))
        np.matmul(a, b, out=yv)
        r = np.fft.irfftn(yv, s=sizes, axes=tuple(range(nd)))    # (L..., G, N, Kg)
        idx = [(np.arange(o) * s - q) % L
               for o, s, q, L in zip(p.y_dims[2:], p.stride, p.padding, sizes)]
        r = cls._pick(r, idx)                                    # (O..., G, N, Kg)
        r = np.moveaxis(r, tuple(range(nd)), tuple(range(3, 3 + nd)))   # (G, N, Kg, O...)
        return np.ascontiguousarray(np.swapaxes(r, 0, 1)).reshape(p.y_dims)

    @classmethod
    def backward_data(cls, p: ConvProblem, w: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        n, c = p.x_dims[:2]
        k, cg = p.w_dims[:2]
        kg = k // g
        sizes, (dxf, wf, dyf) = cls._buffers(p, ws, (n, c), (k, cg), (n, k))
        nd = len(sizes)
        cls._rfft_into(cls._upsampled(p, dy), sizes, dyf)
        cls._filter_spectrum(p, w, sizes, -1, wf)                # convolution
        f = dyf.shape[:nd]
        a = dyf.reshape(f + (n, g, kg)).swapaxes(nd, nd + 1)     # (F..., G, N, Kg)
        b = wf.reshape(f + (g, kg, cg))                           # (F..., G, Kg, Cg)
        dxv = dxf.reshape(f + (g, n, cg))
        np.matmul(a, b, out=dxv)
        r = np.fft.irfftn(dxv, s=sizes, axes=tuple(range(nd)))   # (L..., G, N, Cg)
        r = r[tuple(slice(q, q + h) for q, h in zip(p.padding, p.x_dims[2:]))]
        r = np.moveaxis(r, tuple(range(nd)), tuple(range(3, 3 + nd)))   # (G, N, Cg, H...)
        return np.ascontiguousarray(np.swapaxes(r, 0, 1)).reshape(p.x_dims)

    @classmethod
    def backward_filter(cls, p: ConvProblem, x: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        n, c = p.x_dims[:2]
        k, cg = p.w_dims[:2]
        kg = k // g
        sizes, (xf, dwf, dyf) = cls._buffers(p, ws, (n, c), (k, cg), (n, k))
        nd = len(sizes)
        cls._rfft_into(x.astype(_compute_dtype(p), copy=False), sizes, xf)
        cls._rfft_into(cls._upsampled(p, dy), sizes, dyf)
        np.conjugate(dyf, out=dyf)
        f = xf.shape[:nd]
        a = dyf.reshape(f + (n, g, kg)).transpose(
            tuple(range(nd)) + (nd + 1, nd + 2, nd))              # (F..., G, Kg, N)
        b = xf.reshape(f + (n, g, cg)).swapaxes(nd, nd + 1)      # (F..., G, N, Cg)
        dwv = dwf.reshape(f + (g, kg, cg))
        np.matmul(a, b, out=dwv)
        idx = [(np.arange(rr) * d - q) % L
               for rr, d, q, L in zip(p.w_dims[2:], p.dilation, p.padding, sizes)]
        r = cls._inverse_at(dwv, sizes, idx)                     # (R..., G, Kg, Cg)
        r = np.moveaxis(r, tuple(range(nd)), tuple(range(3, 3 + nd)))   # (G, Kg, Cg, R...)
        return np.ascontiguousarray(r).reshape(p.w_dims)


#: Whether numpy.fft takes out= (NumPy >= 2.0).
_FFT_OUT = "out" in inspect.signature(np.fft.rfft).parameters

#: The algorithms as run() calls them: each wrapped by Guarded, which keeps
#: anything from overflowing before the result itself does and gives DIRECT's
#: values wherever an output is NaN or infinite (Note [FFT and non-finite
#: inputs] in _numpy_guard.py).
def _io_dtype(p: ConvProblem) -> np.dtype:
    return _np_dtype(p.dtype)


_IMPLS = {algo: Guarded(impl, _Direct, _compute_dtype, _io_dtype,
                        functools.partial(_workspace_bytes, algo=algo))
          for algo, impl in ((NumpyAlgo.DIRECT, _Direct), (NumpyAlgo.IM2COL_GEMM, _Im2col),
                             (NumpyAlgo.FFT, _FFT))}


def _cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo where there is one), else "cpu"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip() or "cpu"
    except OSError:
        pass
    return platform.processor() or "cpu"
