"""Binding and running cudnn-graph's plans. ``bind()`` returns a launcher that
only calls ``cudnnBackendExecute(handle, plan, variant_pack)`` with the
cached plan for the micro-batch (its alignments and scalars) and a variant
pack cached per pointers; a folded config (``"fold<s>|<engine config id>"``)
folds its operands around the inner config's launcher (Note [folded first
layers] in :mod:`.fold`); a split config (``"split<k>|<engine config id>"``)
runs the inner config's launcher on each chunk of the groups (Note [split
groups] in :mod:`.split`); a pair config (``"pair[<j>]|<engine config
id>"``) runs the inner config's launcher on 2j parts of the micro-batch, j on
the caller's stream and j on the backend's side stream (Note [micro-batches
in pairs] in :mod:`.pair`).

The workspace contract is :meth:`GraphBind.workspace_size` (the plan with
16-byte aligned tensors, alpha 1, beta 0; Note [beta and workspace]), which
planning uses. A launcher's own ``workspace_bytes`` is that of the plan for
its alignments and scalars. Where an engine config cannot run at the call's
alignments or scalars, ``bind`` raises
:class:`~mucudnn.errors.UnsupportedConfigError`; it never substitutes another
config (the engine asks the planner, so ``Convolution.plans`` always names
what runs).
"""

from __future__ import annotations

import ctypes
import math
import weakref
from typing import Any, Union

from .._cudnn import graph_descriptors as gd
from .._cudnn.errors import CudnnError
from .._cudnn.prototypes import lib, raise_status
from ..errors import InvalidValueError, UnsupportedConfigError
from ..problem import ConvProblem, Direction
from . import fold as _fold
from . import pair as _pair
from . import split as _split
from ._device import array_pointer
from .base import ConvTensors, Launcher
from .fold_cudnn import FoldTransforms
from .pair_cudnn import PairJoin
from .split_cudnn import SplitCopies
from .graph_engines import GraphEngines
from .graph_plans import FULL_ALIGNMENT as _FULL
from .graph_plans import canonical_id

__all__ = ["GraphBind"]

_MAX = gd.MAX_ALIGNMENT


def lowbit(n: int) -> int:
    """The largest power of two dividing ``n`` (capped at the graph API's 16 bytes)."""
    return gd.MAX_ALIGNMENT if n == 0 else min(gd.MAX_ALIGNMENT, n & -n)


def row_offsets(problem: ConvProblem, offset: int) -> tuple[int, int]:
    """Byte offsets of row ``offset`` in ``problem``'s x (dx) and y (dy)."""
    item = problem.itemsize
    return (offset * math.prod(problem.x_shape[1:]) * item,
            offset * math.prod(problem.output_shape[1:]) * item)


# Note [beta and workspace]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# Beta is baked into a graph plan, and a plan that accumulates (beta != 0) can
# need more workspace than the beta = 0 one. Every micro-batch of a
# backward-filter plan but the first runs with beta = 1, so for that direction
# the need is the larger of the two, the beta = 1 one read from its engine
# config (CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, equal to the plan's:
# test_accumulate_need_is_the_beta_one_plans) so that find() finalizes one
# plan per candidate, not two. An engine config that cuDNN refuses with
# beta = 1 cannot run a micro-batch after the first: find() leaves it out of
# backward-filter results unless no other config is left; here it keeps its
# beta = 0 need, and binding it with beta = 1 is refused and re-planned.
# Forward and backward-data run with the caller's beta; a launcher reports
# its own need, which the engine checks before running.


class GraphBind(GraphEngines):
    """workspace_size, run and bind of the cudnn-graph backend."""

    def workspace_size(self, problem: ConvProblem, direction: Direction,
                       algo: Union[int, str], math_type: Union[int, str] = 0) -> int:
        """CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE of engine config ``algo`` for
        ``problem`` (16-byte aligned tensors, alpha 1); see Note [beta and workspace]."""
        direction = Direction.parse(direction)
        folded = _fold.split_fold_id(algo)
        if folded is not None:  # Note [folded first layers]
            f = _fold.folding(problem, folded[0])
            return (_fold.regions(f, problem.batch).inner
                    + self._workspace_need(f.inner, direction, canonical_id(folded[1])))
        split = _split.parse_split_id(algo)
        if split is not None:  # Note [split groups]
            sp = _split.splitting(problem, split[0])
            return (_split.regions(sp, problem.batch).inner
                    + self.workspace_size(sp.chunk, direction, split[1], math_type))
        sliced = _split.parse_slice_id(algo)
        if sliced is not None:  # Note [chunks as slices]: no copies, no regions
            sp = _split.splitting(problem, sliced[0])
            return self.workspace_size(_split.slice_of(sp), direction, sliced[1], math_type)
        paired = _pair.parse_pair_id(algo)
        if paired is not None:  # Note [micro-batches in pairs]
            calls, inner_algo = paired
            part = _pair.part_rows(problem.batch, calls, algo)
            inner = self._workspace_need(problem.with_batch(part), direction,
                                         canonical_id(inner_algo))
            return _pair.lanes(problem, direction, problem.batch, inner, calls, algo).need
        return self._workspace_need(problem, direction, canonical_id(algo))

    def _workspace_need(self, problem: ConvProblem, direction: Direction, algo_id: str) -> int:
        """The workspace planning uses for ``algo_id`` (see Note [beta and workspace])."""
        need = int(self._plan(problem, direction, algo_id, 1.0, 0.0, _FULL).workspace_bytes)
        if direction is Direction.BACKWARD_FILTER:
            need = max(need, self._accumulate_need(problem, direction, algo_id) or 0)
        return need

    def run(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
            tensors: ConvTensors, alpha: float = 1.0, beta: float = 0.0,
            workspace: Any = None) -> None:
        """One convolution on the home stream (asynchronous); see :meth:`bind`."""
        p = tensors.problem
        ptrs = (array_pointer("x", tensors.x, p.x_shape, p.dtype),
                array_pointer("w", tensors.w, p.w_shape, p.dtype),
                array_pointer("y", tensors.y, p.output_shape, p.dtype))
        ax, aw, ay = (gd.pointer_alignment(q, p.itemsize) for q in ptrs)
        aligns = (ax, aw, ay)
        ws_size = 0 if workspace is None else int(workspace.nbytes)
        ws_ptr = int(workspace.ptr) if ws_size else 0
        launch = self.bind(direction, algo, math_type, p, 0, p.batch, alpha, beta, aligns)
        if ws_size < launch.workspace_bytes:
            raise InvalidValueError(
                f"workspace: engine config {launch.algo} ({Direction.parse(direction)}) needs "
                f"{launch.workspace_bytes} bytes for {p!r}, got {ws_size}")
        with self.on_home_stream():
            launch(*ptrs, ws_ptr, ws_size)

    def bind(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
             problem: ConvProblem, offset: int, size: int, alpha: float = 1.0,
             beta: float = 0.0, aligns: tuple[int, int, int] = _FULL) -> Launcher:
        """A launcher for rows ``[offset, offset + size)`` of ``problem``:
        ``launch(x, w, y, workspace, workspace_bytes)`` with whole-batch device
        pointers calls ``cudnnBackendExecute(handle, plan, variant_pack)``.

        The plan is the cached one for (the micro-batch's problem, direction,
        ``algo``, alpha, beta, the micro-batch pointers' alignments: ``aligns``
        of the whole-batch tensors lowered by the rows' byte offset); the
        launcher holds it (Note [plan lifetimes]). Variant packs (pointers baked
        in) are cached per plan. Raises
        :class:`~mucudnn.errors.UnsupportedConfigError` when the engine config
        does not finalize for these alignments and scalars.
        """
        direction = Direction.parse(direction)
        alpha, beta = float(alpha), float(beta)
        if offset < 0 or size < 1 or offset + size > problem.batch:
            raise InvalidValueError(f"micro-batch rows [{offset}, {offset + size}) outside the batch "
                             f"of {problem.batch}")
        folded = _fold.split_fold_id(algo)
        if folded is not None:
            return self._bind_folded(direction, folded, math_type, problem, offset, size,
                                     alpha, beta, aligns)
        split = _split.parse_split_id(algo)
        if split is not None:
            return self._bind_split(direction, split, math_type, problem, offset, size,
                                    alpha, beta, aligns)
        sliced = _split.parse_slice_id(algo)
        if sliced is not None:
            return self._bind_slice(direction, sliced, math_type, problem, offset, size,
                                    alpha, beta, aligns)
        paired = _pair.parse_pair_id(algo)
        if paired is not None:
            return self._bind_pair(direction, paired, math_type, problem, offset, size,
                                   alpha, beta, aligns)
        algo_id = canonical_id(algo)
        sub = problem.with_batch(size)
        ox, oy = row_offsets(problem, offset)
        mb_aligns = (min(int(aligns[0]), lowbit(ox)), int(aligns[1]),
                     min(int(aligns[2]), lowbit(oy)))
        with self._lock:
            try:
                plan = self._plan(sub, direction, algo_id, alpha, beta, mb_aligns)
            except CudnnError as exc:
                raise UnsupportedConfigError(
                    f"algo: engine config {algo_id} cannot run {sub!r} {direction} with "
                    f"pointers aligned to {mb_aligns} bytes (alpha {alpha}, beta {beta}): {exc}",
                    algo=algo_id, reason=str(exc)) from exc
            plan.acquire()
        execute = lib.raw("cudnnBackendExecute")
        h = self.handle.handle
        pd = plan.plan.handle
        packs = plan.packs
        uids = gd.uid_array((gd.UID_X, gd.UID_W, gd.UID_Y))
        make_pack = gd.fast_variant_pack
        # the previous call's pointers, its pack's handle and the pack (held, so
        # that the handle stays valid while the packs cache may evict it)
        last: list[Any] = [None, None, None]

        def fail(status: int, ws_size: int) -> None:
            raise_status(status, "cudnnBackendExecute", problem=sub, direction=str(direction),
                         algo=algo_id, workspace_bytes=ws_size)

        def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
            key = (x + ox, w, y + oy, ws)  # the micro-batch's own pointers: the plan's
            if key == last[0]:             # packs serve every micro-batch that uses it
                ph = last[1]
            else:
                pack = packs.peek(key)  # lock-free: a miss only builds the pack again
                if pack is None:  # Note [variant packs on the hot path]
                    pack = make_pack(uids, key[0], key[1], key[2], ws)
                    packs.put(key, pack)
                ph = pack.handle
                last[0], last[1], last[2] = key, ph, pack
            st = execute(h, pd, ph)
            if st:
                fail(st, ws_size)

        launch = self._launcher(call, (plan, self.handle), plan.workspace_bytes, plan.id)
        weakref.finalize(launch, self._release_plan, plan)
        return launch

    def _bind_folded(self, direction: Direction, folded: tuple[int, Union[int, str]],
                     math_type: Union[int, str], problem: ConvProblem, offset: int, size: int,
                     alpha: float, beta: float, aligns: tuple[int, int, int]) -> Launcher:
        """See Note [folded first layers]: a launcher that folds this micro-batch's
        operands into the workspace's regions, runs the inner config's launcher
        there, and unfolds its result (alpha and beta applied there)."""
        s, inner_algo = folded
        f = _fold.folding(problem, s)
        reg = _fold.regions(f, size)
        ox, oy = row_offsets(problem, offset)
        y_align = min(int(aligns[2]), lowbit(oy))
        fwd = direction is Direction.FORWARD
        inner = self.bind(direction, inner_algo, math_type, f.inner.with_batch(size), 0, size,
                          alpha if fwd else 1.0, beta if fwd else 0.0, (_MAX, _MAX, y_align))
        try:
            tf = FoldTransforms(f, size)
        except CudnnError as exc:
            raise UnsupportedConfigError(
                f"algo: cannot fold {problem!r} for {direction}: {exc}",
                algo=_fold.fold_id(s, inner_algo), reason=str(exc)) from exc
        need = reg.inner + int(inner.workspace_bytes)
        handle = self.handle
        ca, cb = ctypes.c_float(alpha), ctypes.c_float(beta)
        a_off, b_off, i_off = reg.a, reg.b, reg.inner
        fold_x, fold_w, unfold_x, unfold_w = tf.fold_x, tf.fold_w, tf.unfold_x, tf.unfold_w
        name = _fold.fold_id(s, inner_algo)

        def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
            if ws_size < need:
                raise InvalidValueError(f"workspace: folded config {name} ({direction}) needs {need} "
                                 f"bytes for {size} rows of {problem!r}, got {ws_size}")
            a, b = ws + a_off, ws + b_off
            if direction is Direction.FORWARD:
                fold_x(handle, x + ox, a)
                fold_w(handle, w, b)
                inner(a, b, y + oy, ws + i_off, ws_size - i_off)
            elif direction is Direction.BACKWARD_DATA:
                fold_w(handle, w, b)
                inner(a, b, y + oy, ws + i_off, ws_size - i_off)
                unfold_x(handle, a, x + ox, ca, cb)
            else:
                fold_x(handle, x + ox, a)
                inner(a, b, y + oy, ws + i_off, ws_size - i_off)
                unfold_w(handle, b, w, ca, cb)

        return self._launcher(call, (inner, tf, handle), need, name)

    def _bind_split(self, direction: Direction, split: tuple[int, Union[int, str]],
                    math_type: Union[int, str], problem: ConvProblem, offset: int, size: int,
                    alpha: float, beta: float, aligns: tuple[int, int, int]) -> Launcher:
        """See Note [split groups]: a launcher that, chunk by chunk, copies this
        micro-batch's input slices into the workspace's regions, runs the inner
        config's launcher there and copies its output back (alpha and beta
        applied there, or in the inner call for backward-filter)."""
        k, inner_algo = split
        sp = _split.splitting(problem, k)
        reg = _split.regions(sp, size)
        ox, oy = row_offsets(problem, offset)
        offs = [_split.chunk_offsets(sp, i) for i in range(k)]
        w_align = min(int(aligns[1]), lowbit(offs[1][1]))
        wgrad = direction is Direction.BACKWARD_FILTER
        inner = self.bind(direction, inner_algo, math_type, sp.chunk.with_batch(size), 0, size,
                          alpha if wgrad else 1.0, beta if wgrad else 0.0, (_MAX, w_align, _MAX))
        try:
            cp = SplitCopies(sp, size)
        except CudnnError as exc:
            raise UnsupportedConfigError(
                f"algo: cannot split {problem!r} for {direction}: {exc}",
                algo=_split.split_id(k, inner_algo), reason=str(exc)) from exc
        need = reg.inner + int(inner.workspace_bytes)
        handle = self.handle
        ca, cb = cp.scalar(alpha), cp.scalar(beta)
        a_off, b_off, i_off = reg.a, reg.b, reg.inner
        gather_x, gather_y, scatter_x, scatter_y = (cp.gather_x, cp.gather_y, cp.scatter_x,
                                                    cp.scatter_y)
        name = _split.split_id(k, inner_algo)

        def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
            if ws_size < need:
                raise InvalidValueError(f"workspace: split config {name} ({direction}) needs {need} "
                                        f"bytes for {size} rows of {problem!r}, got {ws_size}")
            a, b, wi, rest = ws + a_off, ws + b_off, ws + i_off, ws_size - i_off
            for cx, cw, cy in offs:
                xi, yi = x + ox + cx, y + oy + cy
                if direction is Direction.FORWARD:
                    gather_x(handle, xi, a)
                    inner(a, w + cw, b, wi, rest)
                    scatter_y(handle, b, yi, ca, cb)
                elif direction is Direction.BACKWARD_DATA:
                    gather_y(handle, yi, b)
                    inner(a, w + cw, b, wi, rest)
                    scatter_x(handle, a, xi, ca, cb)
                else:
                    gather_x(handle, xi, a)
                    gather_y(handle, yi, b)
                    inner(a, w + cw, b, wi, rest)

        return self._launcher(call, (inner, cp, handle), need, name)

    def _bind_slice(self, direction: Direction, sliced: tuple[int, Union[int, str]],
                    math_type: Union[int, str], problem: ConvProblem, offset: int, size: int,
                    alpha: float, beta: float, aligns: tuple[int, int, int]) -> Launcher:
        """See Note [chunks as slices]: a launcher that runs the inner config's
        launcher on each chunk in place, its x and y slices of this micro-batch's
        whole tensors and its filter slice (alpha and beta applied by each call)."""
        k, inner_algo = sliced
        sp = _split.splitting(problem, k)
        ox, oy = row_offsets(problem, offset)
        offs = [_split.chunk_offsets(sp, i) for i in range(k)]
        # every chunk's offsets are multiples of the second chunk's
        inner_aligns = (min(int(aligns[0]), lowbit(ox), lowbit(offs[1][0])),
                        min(int(aligns[1]), lowbit(offs[1][1])),
                        min(int(aligns[2]), lowbit(oy), lowbit(offs[1][2])))
        inner = self.bind(direction, inner_algo, math_type, _split.slice_of(sp).with_batch(size),
                          0, size, alpha, beta, inner_aligns)
        need = int(inner.workspace_bytes)
        name = _split.slice_id(k, inner_algo)
        starts = [(ox + cx, cw, oy + cy) for cx, cw, cy in offs]

        def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
            for cx, cw, cy in starts:
                inner(x + cx, w + cw, y + cy, ws, ws_size)

        return self._launcher(call, (inner,), need, name)

    def _bind_pair(self, direction: Direction, paired: tuple[int, str],
                   math_type: Union[int, str], problem: ConvProblem, offset: int, size: int,
                   alpha: float, beta: float, aligns: tuple[int, int, int]) -> Launcher:
        """See Note [micro-batches in pairs]: a launcher that runs the inner
        config's launcher on the parts of this micro-batch, the first half of
        them in turn on the caller's stream and the second half in turn on the
        backend's side stream, each lane in a workspace of its own, and joins
        the two (for backward-filter, adding the second lane's gradient from
        the scratch into dw)."""
        calls, inner_algo = paired
        algo = _pair.pair_id(inner_algo, calls)
        part = _pair.part_rows(size, calls, algo)
        wgrad = direction is Direction.BACKWARD_FILTER
        betas = _pair.part_betas(direction, calls, beta)
        # the second lane's backward-filter calls write the scratch (16-byte aligned: checked per call)
        second_aligns = (aligns[0], _MAX, aligns[2]) if wgrad else aligns
        lanes = [[self.bind(direction, inner_algo, math_type, problem,
                            offset + (k * calls + i) * part, part, alpha, betas[k][i],
                            second_aligns if k else aligns)
                  for i in range(calls)] for k in (0, 1)]
        ln = _pair.lanes(problem, direction, size,
                         max(int(f.workspace_bytes) for lane in lanes for f in lane), calls, algo)
        try:
            side = self.side_stream()
            pj = PairJoin(problem, wgrad)
        except CudnnError as exc:
            raise UnsupportedConfigError(f"algo: cannot pair {problem!r} for {direction}: {exc}",
                                         algo=algo, reason=str(exc)) from exc
        need, lane, scratch = ln.need, ln.lane, ln.scratch
        first, second = lanes
        handle, lock = self.handle, self._lock

        def call(x: int, w: int, y: int, ws: int, ws_size: int) -> None:
            if ws_size < need:
                raise InvalidValueError(f"workspace: pair config {algo} ({direction}) needs {need} "
                                        f"bytes for {size} rows of {problem!r}, got {ws_size}")
            ws = ws or 0  # None where no bytes are needed
            if wgrad and (ws + scratch) % _MAX:
                raise InvalidValueError(f"workspace: pair config {algo} needs a workspace "
                                        f"aligned to {_MAX} bytes, got address {ws:#x}")
            w2 = ws + scratch if wgrad else w
            with lock:  # the handle's stream moves to the side lane and back
                main = self.active_stream
                pj.split_off(main, side)
                for f in first:
                    f(x, w, y, ws, lane)
                self.activate(side.handle)
                try:
                    for f in second:
                        f(x, w2, y, ws + lane, lane)
                finally:
                    self.activate(main)
                    pj.merge(main, side)
                if wgrad:
                    pj.add(handle, ws + scratch, w)

        return self._launcher(call, (first, second, pj, side, handle), need, algo)
