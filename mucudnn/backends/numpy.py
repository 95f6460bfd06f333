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

This module is the backend (its find, run, workspace sizes and argument
checks); each algorithm is a module of its own (:mod:`.numpy_direct`,
:mod:`.numpy_im2col`, :mod:`.numpy_fft`), and what they share is in
:mod:`.numpy_dtypes` (the types they compute in) and :mod:`.numpy_geometry`
(filter taps, padding reads, the carving of the workspace).

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
import logging
import math
import operator
import platform
import time
from typing import Any, Callable, TypeVar, Union

import numpy as np

from ..problem import AlgoPerf, ConvProblem, Direction
from . import fold as _fold
from . import pair as _pair
from . import split as _split
from ._numpy_guard import Guarded
from .base import OUTPUT_OF, BackendBase, ConvTensors
from .numpy_direct import Direct
from .numpy_dtypes import complex_dtype, compute_dtype, np_dtype
from .numpy_fft import FFT, fft_freqs, fft_sizes
from .numpy_geometry import align, prod
from .numpy_im2col import Im2col
from ..errors import InvalidTypeError, InvalidValueError, MucudnnError
from ..units import format_bytes, parse_count

__all__ = ["NumpyAlgo", "NumpyBackend", "HostOutOfMemoryError"]

log = logging.getLogger("mucudnn")

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


# -- the backend -----------------------------------------------------------------------
class NumpyBackend(BackendBase):
    """CPU convolutions in NumPy with three real algorithms (see :class:`NumpyAlgo`).

    ``repeats``: timed runs per algorithm in :meth:`find` (the median is
    reported, after one untimed warm-up run); ``seed``: the random data find uses.
    ``fold``: find() also times each algorithm on the problem folded by
    space-to-depth, where it folds (ids ``"fold{s}|{algo}"``; Note [folded
    first layers] in :mod:`mucudnn.backends.fold`). ``split``: find() also
    times each algorithm on every split of a depthwise problem's groups (ids
    ``"split{k}|{algo}"``; Note [split groups] in
    :mod:`mucudnn.backends.split`). ``pair``: find() also times each algorithm
    in pairs, one or two calls a lane, where the graph backend pairs (ids
    ``"pair|{algo}"``, ``"pair2|{algo}"``; Note [micro-batches in pairs] in
    :mod:`mucudnn.backends.pair`; here the lanes run in turn). All off by
    default here, the CPU reference; run() and workspace_size() take
    rewritten ids either way.

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

    def __init__(self, repeats: int = 3, seed: int = 0, fold: bool = False,
                 split: bool = False, pair: bool = False) -> None:
        self.repeats = parse_count(repeats, "repeats", 1)
        self.seed = seed
        self.fold = bool(fold)
        self.split = bool(split)
        self.pair = bool(pair)
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
        can; a folded one where the problem folds by its factor, a split one
        where its groups split by its factor)."""
        Direction.parse(direction)
        split = _split.parse_split_id(algo)
        if split is not None:
            _algo(split[1])
            return _split.split_of(problem, split[0]) is not None
        paired = _pair.parse_pair_id(algo)
        if paired is not None:
            _algo(paired[1])
            return _pair.divides(problem.batch, paired[0])
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
        split = _split.parse_split_id(algo)
        if split is not None:
            sp = _split.splitting(problem, split[0])
            return (_split.regions(sp, problem.batch).inner
                    + _workspace_bytes(sp.chunk, _algo(split[1])))
        paired = _pair.parse_pair_id(algo)
        if paired is not None:  # Note [micro-batches in pairs]
            return _pair_lanes(problem, direction, paired, str(algo)).need
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
        dt = np_dtype(problem.dtype)
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
        if self.split:  # Note [split groups]
            algos += [_split.split_id(k, int(a)) for k in _split.searched_factors(problem)
                      for a in NumpyAlgo]
        if self.pair and _pair.pairs(problem, direction):  # Note [micro-batches in pairs]
            algos += [_pair.pair_id(int(a), j) for j in _pair.PAIR_CALLS
                      if _pair.divides(problem.batch, j) for a in NumpyAlgo]
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
        split = _split.parse_split_id(algo)
        if split is not None:
            self._run_split(direction, split, math_type, tensors, alpha, beta, workspace)
            return
        paired = _pair.parse_pair_id(algo)
        if paired is not None:
            self._run_pair(direction, paired, math_type, tensors, alpha, beta, workspace)
            return
        algo = _algo(algo)
        p = tensors.problem
        dt = np_dtype(p.dtype)
        out_name = OUTPUT_OF[direction]
        _check_tensors(p, tensors, out_name)
        out = getattr(tensors, out_name)
        need = self.workspace_size(p, direction, algo)
        ws = _check_workspace(workspace, need, algo.name)

        x = _canon(tensors.x, p.layout)
        w = _canon(tensors.w, p.layout)
        y = _canon(tensors.y, p.layout)
        cdt = compute_dtype(p)
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
        dt = np_dtype(p.dtype)
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
        cdt = compute_dtype(p)
        if direction is Direction.BACKWARD_DATA:
            _store(tensors.x, _fold.unfold_x(f, a).astype(cdt), alpha, beta)
        else:
            _store(tensors.w, _fold.unfold_w(f, b).astype(cdt), alpha, beta)

    def _run_split(self, direction: Direction, split: tuple[int, Union[int, str]],
                   math_type: Union[int, str], tensors: ConvTensors, alpha: float,
                   beta: float, workspace: Any) -> None:
        """See Note [split groups]: chunk by chunk, copy the input slices into the
        workspace's regions, run the inner algorithm there, and copy the output
        back (alpha and beta applied there; backward-filter writes its filter
        slice in place)."""
        p = tensors.problem
        k, inner_algo = split
        sp = _split.splitting(p, k)
        dt = np_dtype(p.dtype)
        _check_tensors(p, tensors, OUTPUT_OF[direction])
        name = _split.split_id(k, inner_algo)
        ws = _check_workspace(workspace, self.workspace_size(p, direction, name), name)
        reg = _split.regions(sp, p.batch)
        chunk = sp.chunk.with_batch(p.batch)
        a = ws[reg.a:reg.a + reg.a_bytes].view(dt).reshape(chunk.x_shape)
        b = ws[reg.b:reg.b + reg.b_bytes].view(dt).reshape(chunk.output_shape)
        rest = ws[reg.inner:]
        cx, cy, kc = chunk.x_dims[1], chunk.y_dims[1], chunk.w_shape[0]
        x, y = _canon(tensors.x, p.layout), _canon(tensors.y, p.layout)
        ac, bc = _canon(a, p.layout), _canon(b, p.layout)
        cdt = compute_dtype(p)
        for i in range(k):
            xs, ys = x[:, i * cx:(i + 1) * cx], y[:, i * cy:(i + 1) * cy]
            ws_i = tensors.w[i * kc:(i + 1) * kc]
            if direction is not Direction.BACKWARD_DATA:
                ac[...] = xs
            if direction is not Direction.FORWARD:
                bc[...] = ys
            if direction is Direction.BACKWARD_FILTER:
                self.run(direction, inner_algo, math_type, ConvTensors(chunk, a, ws_i, b),
                         alpha, beta, rest)
                continue
            self.run(direction, inner_algo, math_type, ConvTensors(chunk, a, ws_i, b),
                     1.0, 0.0, rest)
            if direction is Direction.FORWARD:
                _store(ys, bc.astype(cdt), alpha, beta)
            else:
                _store(xs, ac.astype(cdt), alpha, beta)

    def _run_pair(self, direction: Direction, paired: tuple[int, str],
                  math_type: Union[int, str], tensors: ConvTensors, alpha: float, beta: float,
                  workspace: Any) -> None:
        """See Note [micro-batches in pairs]: the inner algorithm on each part of
        the batch in turn, each lane's calls in its workspace lane; for
        backward-filter the second lane accumulates into the scratch (from beta
        0), which is then added to dw."""
        p = tensors.problem
        calls, inner_algo = paired
        name = _pair.pair_id(inner_algo, calls)
        _check_tensors(p, tensors, OUTPUT_OF[direction])
        ln = _pair_lanes(p, direction, paired, name)
        sub = p.with_batch(ln.part)
        ws = _check_workspace(workspace, ln.need, name)
        x, w, y, h, lane = tensors.x, tensors.w, tensors.y, ln.part, ln.lane
        wgrad = direction is Direction.BACKWARD_FILTER
        scratch = ws[ln.scratch:].view(np_dtype(p.dtype)).reshape(w.shape) if wgrad else w
        for k, betas in enumerate(_pair.part_betas(direction, calls, beta)):
            for i, b in enumerate(betas):
                rows = slice((k * calls + i) * h, (k * calls + i + 1) * h)
                self.run(direction, inner_algo, math_type,
                         ConvTensors(sub, x[rows], scratch if k else w, y[rows]), alpha, b,
                         ws[k * lane:(k + 1) * lane])
        if wgrad:
            _store(w, scratch.astype(compute_dtype(p)), 1.0, 1.0)

    # -- arrays ------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array; ``dtype`` a name like "float16"."""
        dt = np_dtype(dtype)
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
        return (c * prod(p.w_dims[2:]) * n * prod(p.y_dims[2:])
                * compute_dtype(p).itemsize)
    # FFT: the same three frequency-domain buffers in every direction.
    n, c = p.x_dims[:2]
    k, cg = p.w_dims[:2]
    f = fft_freqs(fft_sizes(p))
    cs = complex_dtype(p).itemsize
    return align(n * c * f * cs) + align(k * cg * f * cs) + align(n * k * f * cs)


def _check_tensors(p: ConvProblem, tensors: ConvTensors, out_name: str) -> None:
    """x, w and y of ``tensors``: numpy arrays of ``p``'s shapes and dtype, the
    output ``out_name`` writeable; TypeError or ValueError naming the tensor."""
    dt = np_dtype(p.dtype)
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


def _pair_lanes(problem: ConvProblem, direction: Direction, paired: tuple[int, str],
                name: str) -> _pair.Lanes:
    """The lanes of pair configuration ``name`` (``paired``: its calls a lane
    and inner algorithm) over ``problem``'s batch, each as large as the inner
    algorithm's workspace at a part's rows (Note [micro-batches in pairs])."""
    calls, inner = paired
    part = problem.with_batch(_pair.part_rows(problem.batch, calls, name))
    return _pair.lanes(problem, direction, problem.batch, _workspace_bytes(part, _algo(inner)),
                       calls, name)


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


def _canon(a: np.ndarray, layout: str) -> np.ndarray:
    """A view of ``a`` in canonical (N, C, spatial...) order."""
    return a if layout[1] == "C" else np.moveaxis(a, -1, 1)


def _io_dtype(p: ConvProblem) -> np.dtype:
    return np_dtype(p.dtype)


#: The algorithms as run() calls them: each wrapped by Guarded, which keeps
#: anything from overflowing before the result itself does and gives DIRECT's
#: values wherever an output is NaN or infinite (Note [FFT and non-finite
#: inputs] in _numpy_guard.py).
_IMPLS = {algo: Guarded(impl, Direct, compute_dtype, _io_dtype,
                        functools.partial(_workspace_bytes, algo=algo))
          for algo, impl in ((NumpyAlgo.DIRECT, Direct), (NumpyAlgo.IM2COL_GEMM, Im2col),
                             (NumpyAlgo.FFT, FFT))}


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
