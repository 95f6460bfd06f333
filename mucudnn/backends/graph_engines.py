"""What cudnn-graph's find() can choose from: the engine configs heuristics
name for a problem (modes A, B where supported, FALLBACK; de-duplicated by
id, each mode's ranking kept), the least workspace of those blocked by a cap
(Note [size pruning]), the knob space around them (Note [knob search]), and
engine configs' workspaces read before any plan is built (the beta = 1 need
of Note [beta and workspace]).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Optional, Sequence, Union

from .._cudnn import graph_descriptors as gd
from .._cudnn.backend_api import BackendDescriptor
from .._cudnn.enums import BackendBehaviorNote as Behavior
from .._cudnn.errors import CudnnError
from ..cuda import using_device
from ..problem import ConvProblem, Direction
from .graph_candidates import knob_variants, numerics_allowed
from .graph_plans import FULL_ALIGNMENT as _FULL
from .graph_plans import GraphPlans

__all__ = ["GraphEngines"]

log = logging.getLogger("mucudnn")


# Note [knob search]
# ~~~~~~~~~~~~~~~~~~
# Heuristics name a few dozen engine configs, each an engine with one setting
# of its knobs (tile sizes, split-K, ...); under a tight workspace cap the best
# of those can be far behind what the same engines reach with other values.
# ``search="knobs"`` adds, for every engine the problem's numerics allow, the
# settings around each config heuristics named for it (or its defaults): each
# knob moved alone through up to ``knob_values`` of its allowed values (a
# coordinate neighbourhood; the full product runs to millions). Each setting's
# workspace is read from its engine config before any plan is built, so
# settings over the cap or refused cost microseconds; runtime-compiled engines
# keep only heuristics' configs (each setting would compile anew). At most
# ``max_configs`` added configs, by their engine's best rank, are timed per
# find(), under the name "cudnn-graph+knobs" so that measurements never mix.
# Its gains and costs: docs/BENCHMARKS.md, "Knob search" (an option, not the default).


class GraphEngines(GraphPlans):
    """Heuristics' engine configs, the knob space and engine-config workspaces
    of the cudnn-graph backend (cached on its operation graphs)."""

    def _modes_for(self, problem: ConvProblem) -> list[str]:
        modes = []
        for m in self.find_options.heuristic_modes:
            if m == "B" and (problem.nd != 2 or problem.groups != 1
                             or any(d != 1 for d in problem.dilation)):
                continue  # cudnn_graph.h: mode B has no 3-D, grouped or dilated convolutions
            modes.append(m)
        return modes

    def engine_configs(self, problem: ConvProblem, direction: Union[Direction, str],
                       alpha: float = 1.0, beta: float = 0.0,
                       aligns: tuple = _FULL) -> list[gd.EngineConfigInfo]:
        """The heuristics' engine configs for ``problem`` (modes in order, de-duplicated
        by id), with their engines' notes, before any numerics filter."""
        direction = Direction.parse(direction)
        with self._lock, using_device(self.device):
            g = self._graph(problem, direction, alpha, beta, aligns)
            if g.ids is not None:
                return list(g.ids)
            seen: dict[str, gd.EngineConfigInfo] = {}
            modes_s = self.find_profile.modes_s
            for m in self._modes_for(problem):
                t = time.perf_counter()
                try:
                    infos = g.conv.engine_config_infos(m)
                except CudnnError as exc:
                    modes_s[m] = modes_s.get(m, 0.0) + time.perf_counter() - t
                    log.debug("mucudnn: heuristics mode %s refused %s %s: %s", m, problem,
                              direction, exc)
                    continue
                ranking = g.mode_ids.setdefault(m, [])
                for info in infos:
                    if info is None:  # pragma: no cover - unreadable result
                        continue
                    seen.setdefault(info.id, info)
                    ranking.append(info.id)
                modes_s[m] = modes_s.get(m, 0.0) + time.perf_counter() - t
            g.ids = list(seen.values())
            return list(g.ids)

    def blocked_workspace(self, problem: ConvProblem, direction: Direction,
                          workspace_limit: int) -> Optional[int]:
        """The least workspace over ``workspace_limit`` of the engine configs that
        heuristics rank ahead of the first one that fits it (numerics allowed),
        from the heuristics' own workspace figures (Note [size pruning]): a
        smaller batch may fit configs that heuristics prefer over the first
        one that fits (docs/BENCHMARKS.md has measured cases)."""
        direction = Direction.parse(direction)
        limit = int(workspace_limit)
        least: Optional[int] = None
        with self.on_home_stream():
            infos = self.engine_configs(problem, direction)
        for info in infos:
            if not numerics_allowed(problem.math, info.numerical_notes):
                continue
            ws = info.workspace_bytes
            if ws is None or ws <= limit:
                break
            least = ws if least is None else min(least, ws)
        return least


    def _knob_space(self, problem: ConvProblem, direction: Direction,
                    heuristic: Sequence[gd.EngineConfigInfo]) -> list[gd.EngineConfigInfo]:
        """The knob-space configs (cached per graph; see Note [knob search]), each
        with its engine config's workspace; heuristics' own configs left out."""
        with self._lock, using_device(self.device):
            g = self._graph(problem, direction, 1.0, 0.0, _FULL)
            if g.knob_space is not None:
                return list(g.knob_space)
            t = time.perf_counter()
            rank: dict[int, int] = {}
            bases: dict[int, list[tuple[tuple[int, int], ...]]] = {}
            for r, info in enumerate(heuristic):
                rank.setdefault(info.global_index, r)
                bases.setdefault(info.global_index, []).append(info.knobs)
            seen = {info.id for info in heuristic}
            found: list[tuple[int, int, gd.EngineConfigInfo]] = []
            for idx in range(int(g.conv.global_engine_count())):
                try:
                    eng = gd.engine(g.conv.graph, idx)
                except CudnnError:
                    continue  # not an engine for this graph
                with eng:
                    try:
                        _, notes, behavior = gd.engine_info(eng)
                        knobs = gd.engine_knob_infos(eng)
                    except CudnnError as exc:  # pragma: no cover - unreadable engine
                        log.debug("mucudnn: engine %d of %s %s unreadable: %s", idx, problem,
                                  direction, exc)
                        continue
                    if not numerics_allowed(problem.math, notes):
                        continue
                    if int(Behavior.RUNTIME_COMPILATION) in behavior:
                        continue
                    for base in bases.get(idx) or [()]:
                        for setting in knob_variants(base, knobs, self.find_options.knob_values):
                            info = gd.EngineConfigInfo(idx, setting, notes, behavior)
                            if info.id in seen:
                                continue
                            seen.add(info.id)
                            try:
                                ws = self._config_workspace(eng, setting)
                            except (CudnnError, ValueError):
                                continue  # cuDNN refuses this setting
                            info = dataclasses.replace(info, workspace_bytes=ws)
                            found.append((rank.get(idx, len(heuristic)), len(found), info))
            found.sort(key=lambda e: e[:2])
            g.knob_space = [info for *_, info in found]
            self.find_profile.knob_s += time.perf_counter() - t
            return list(g.knob_space)

    @staticmethod
    def _config_workspace(eng: BackendDescriptor,
                          setting: Sequence[tuple[int, int]]) -> Optional[int]:
        """The workspace of ``eng`` with knob ``setting`` (None where cuDNN does not
        report it before a plan); CudnnError where cuDNN refuses the setting."""
        knobs: list[BackendDescriptor] = []
        try:
            for t, v in setting:
                knobs.append(gd.knob_choice(t, v))
            with gd.engine_config(eng, knobs) as cfg:
                return gd.engine_config_workspace(cfg)
        finally:
            for k in knobs:
                k.close()

    def _accumulate_need(self, problem: ConvProblem, direction: Direction,
                         algo_id: str) -> Optional[int]:
        """See Note [beta and workspace]: the workspace of ``algo_id`` on the beta = 1
        graph, read from its engine config without finalizing a plan (a plan
        only where cuDNN does not report it before one); None where cuDNN
        refuses the config with beta = 1 (it cannot accumulate)."""
        idx, knobs = gd.parse_engine_config_id(algo_id)
        with self._lock, using_device(self.device):
            g = self._graph(problem, direction, 1.0, 1.0, _FULL)
            try:
                with gd.engine(g.conv.graph, idx) as eng:
                    ws = self._config_workspace(eng, knobs)
                if ws is None:
                    ws = int(self._plan(problem, direction, algo_id, 1.0, 1.0,
                                        _FULL).workspace_bytes)
                return ws
            except (CudnnError, ValueError):
                return None
