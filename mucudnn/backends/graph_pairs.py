"""The graph backend's search of micro-batches in pairs (Note [micro-batches
in pairs] in :mod:`.pair`): which pair configurations find() times for a
problem, and their timing as one call on find's scratch. :class:`GraphPairs`
is find() (:class:`.graph_find.GraphFind`) with its pairs hook filled, over
the binding (:class:`.graph_bind.GraphBind`) that runs them."""

from __future__ import annotations

import logging
import statistics
from typing import Optional

from .._cudnn.errors import CudnnError
from ..cuda import CudaError, time_on_stream
from ..errors import UnsupportedConfigError
from ..problem import AlgoPerf, ConvProblem, Direction
from . import pair as _pair
from .graph_bind import GraphBind
from .graph_find import GraphFind

__all__ = ["GraphPairs"]

log = logging.getLogger("mucudnn")


class GraphPairs(GraphBind, GraphFind):
    """find() with micro-batches in pairs (Note [micro-batches in pairs])."""

    def _find_pairs(self, problem: ConvProblem, direction: Direction,
                    limit: Optional[int]) -> list[AlgoPerf]:
        """See Note [micro-batches in pairs]: for each count of calls a lane, the
        configs that led the find() of a part's rows under half the cap left
        by the scratch, each run in pairs and timed as one call; none where the
        limit bites neither at this batch nor at twice it (where the planner
        looks for micro-batches)."""
        with self.on_home_stream():
            cap = self.find_workspace_cap()
        want = cap if limit is None else min(limit, cap)
        if not (self._limit_bites(problem, direction, want)
                or self._limit_bites(problem.with_batch(2 * problem.batch), direction, want)):
            return []
        lane = (want - _pair.scratch_bytes(problem, direction)) // 2 // _pair.ALIGNMENT \
            * _pair.ALIGNMENT
        if lane < 0:
            return []
        out: list[AlgoPerf] = []
        for calls in _pair.PAIR_CALLS:
            if not _pair.divides(problem.batch, calls):
                continue
            inner = self._find_configs(problem.with_batch(problem.batch // (2 * calls)), direction,
                                     lane)
            for perf in inner[:_pair.PAIR_TOP]:
                timed = self._time_pair(problem, direction, _pair.pair_id(perf.algo, calls), want)
                if timed is not None:
                    out.append(AlgoPerf(algo=_pair.pair_id(perf.algo, calls), time_ms=timed[0],
                                        workspace_bytes=timed[1], math_type=0,
                                        determinism=perf.determinism))
        return out

    def _time_pair(self, problem: ConvProblem, direction: Direction, algo: str,
                   want: int) -> Optional[tuple[float, int]]:
        """(median ms, workspace bytes) of pair configuration ``algo`` run on
        find's scratch as one call, both lanes included (Note [micro-batches
        in pairs]); None where it needs more than ``want`` or cannot run."""
        with self.on_home_stream():
            try:
                launch = self.bind(direction, algo, 0, problem, 0, problem.batch, 1.0, 0.0)
                need = int(launch.workspace_bytes)
                ptrs = self._find_pointers(problem, direction)
                ws_ptr, have = self._find_workspace(need)
                if need > want or have < need:
                    return None
                times = time_on_stream(lambda: launch(*ptrs, ws_ptr or 0, have), self.stream,
                                       warmup=max(1, self.find_options.warmup),
                                       repeat=self.find_options.repeat,
                                       held=self.find_options.hold, host=self.find_options.host)
                self.stream.synchronize()
            except (CudnnError, CudaError, UnsupportedConfigError) as exc:
                # a pair is an extra: where its calls or its join cannot run, find() goes on
                log.info("mucudnn: cannot pair %s %s as %s: %s", problem, direction, algo, exc)
                return None
        self.find_profile.gpu_s += sum(times) / 1e3
        return float(statistics.median(times)), need
