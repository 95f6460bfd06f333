"""The cuDNN graph (backend) API backend for ``get_backend("cudnn-graph")``.

``find()`` builds the operation graph of the problem (one convolution
operation), takes engine configurations from heuristics mode A, mode B (where
supported: 2-D, ungrouped, undilated) and FALLBACK, de-duplicates them by
engine-config id, builds and finalizes an execution plan for each from its id
(the same path ``run()`` takes), drops those that fail to finalize and those
whose workspace exceeds ``min(workspace_limit, find cap)``, and times each on
real random buffers (CUDA events on the backend's stream, 1 warm-up, median of
``find_repeat`` >= 3 runs). ``AlgoPerf.algo`` is the engine-config id
``"e<engine global index>;k<knob type>=<value>..."`` (knob types ascending),
from which ``run()`` rebuilds the plan. With ``fold`` (the default) a strided
first layer over few channels in channels-last also gets the configs of its
problem folded by space-to-depth, ``"fold<s>|<engine config id>"``, timed
with their transforms (Note [folded first layers] in :mod:`.fold`). With
``split`` (the default) a depthwise convolution whose configs the cap leaves
out also gets those of its problem split into chunks of its groups,
``"split<k>|<engine config id>"``, timed with their copies (Note [split
groups] in :mod:`.split`). With ``pair`` (off by default) the backward-filter
of a grouped convolution whose configs the cap leaves out also gets configs
of parts of its batch run in pairs on two streams, ``"pair[<j>]|<engine
config id>"``, timed as one call (Note [micro-batches in pairs] in
:mod:`.pair`).

Numerics follow the problem's math mode, from each engine's numerical notes:
``"fma"`` drops engines noted TENSOR_CORE (TF32 for float32) or
DOWN_CONVERT_INPUTS; ``"default"`` and ``"tensor_op"`` drop DOWN_CONVERT_INPUTS;
all but ``"tensor_op_allow_conversion"`` drop REDUCED_PRECISION_REDUCTION
(the problem's compute type is the accumulation type, as in the legacy API).
``determinism`` is 0 for engines noted NONDETERMINISTIC, else 1.

Alpha and beta are baked into the operation, and cuDNN sees each tensor's byte
alignment (the largest power of two <= 16 dividing its pointer), so finalized
plans are cached per (problem at that batch, direction, id, alpha, beta,
alignments of x, w, y): LRU, bounded, closed on eviction, as are the operation
graphs they are built on and the variant packs (pointers baked in) of each
plan. ``bind()`` returns a launcher that only calls
``cudnnBackendExecute(handle, plan, variant_pack)``.

The workspace contract is :meth:`workspace_size` (the plan with 16-byte
aligned tensors, alpha 1, beta 0), which planning uses. A launcher's own
``workspace_bytes`` is that of the plan for its alignments and scalars. Where
an engine config cannot run at the call's alignments or scalars, ``bind``
raises :class:`~mucudnn.errors.UnsupportedConfigError`; it never substitutes
another config (the engine asks the planner, so ``Convolution.plans`` always
names what runs).

The backend is one class over four modules, one job each:
:mod:`.graph_plans` (operation graphs and finalized plans, their caches and
lifetimes), :mod:`.graph_engines` (heuristics' engine configs and the knob
space), :mod:`.graph_find` (find()'s search and timing) and
:mod:`.graph_bind` (workspace_size, run and bind: the workspace contract).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from .._cudnn import graph_descriptors as gd
from .._cudnn.enums import BackendBehaviorNote as Behavior
from ..errors import InvalidValueError
from ..problem import AlgoPerf, ConvProblem, Direction
from . import fold as _fold
from .find_options import FindOptions
from .graph_candidates import SEARCH_MODES, knob_variants, numerics_allowed, parity_cache_name
from .graph_pairs import GraphPairs
from .graph_plans import canonical_id

__all__ = ["CudnnGraphBackend", "CudnnGraphKnobsBackend", "SEARCH_MODES", "knob_variants", "numerics_allowed",
           "format_engine_config_id", "parse_engine_config_id", "canonical_id"]

format_engine_config_id = gd.format_engine_config_id
parse_engine_config_id = gd.parse_engine_config_id


class CudnnGraphBackend(GraphPairs):
    """cuDNN's graph (backend) API as a :class:`~mucudnn.backends.base.Backend`.

    ``device``, ``stream``, ``find_workspace_limit``: see
    :class:`~mucudnn.backends._device.DeviceBackend` (device, streams, handle and
    arrays are shared with the legacy backend). ``find``: how find() searches,
    a :class:`~mucudnn.backends.find_options.FindOptions` (default: its
    defaults); keyword options are its fields, by name or by the backend's
    keyword names (``find_rtc="all"`` is ``FindOptions(rtc="all")``). Its
    ``key()`` enters :meth:`cache_name`, so two differently configured
    backends never share benchmark-cache entries or plans (Note [candidate
    sets in keys]). ``find_threads``: host threads that finalize find()'s
    candidate plans (default: the CPU count, at most 16; 1 finalizes on the
    calling thread; Note [parallel finalization]); it changes no result.
    ``plan_cache_size``, ``graph_cache_size``, ``pack_cache_size``: LRU
    bounds (plans, operation graphs, variant packs per plan).

    Raises :class:`mucudnn.cuda.NoDeviceError` where there is no GPU or driver.

    >>> CudnnGraphBackend.name
    'cudnn-graph'
    """

    name = "cudnn-graph"

    def __init__(self, device: Optional[int] = None, stream: Any = None,
                 find_workspace_limit: Optional[int] = None, *,
                 find: Optional[FindOptions] = None, find_threads: Optional[int] = None,
                 plan_cache_size: int = 256, graph_cache_size: int = 256,
                 pack_cache_size: int = 64, **find_options: Any) -> None:
        opts = FindOptions.from_kwargs(find, **find_options)
        if find_threads is None:
            find_threads = min(16, os.cpu_count() or 1)
        for n, v in (("plan_cache_size", plan_cache_size), ("graph_cache_size", graph_cache_size),
                     ("pack_cache_size", pack_cache_size), ("find_threads", find_threads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidValueError(f"{n}: expected an int >= 1, got {v!r}")
        super().__init__(device=device, stream=stream, find_workspace_limit=find_workspace_limit)
        #: the search, one frozen value (its key() enters cache_name)
        self.find_options = opts
        self.find_threads = int(find_threads)
        self.finds_zero_once = opts.zero == "once"
        self.fold = opts.fold
        self.split = opts.split
        self.pair = opts.pair
        # See Note [knob search]: a different candidate set measures differently, so
        # its benchmark-cache entries and memoised plans are kept apart.
        self.name = "cudnn-graph+knobs" if opts.search == "knobs" else "cudnn-graph"
        self._search_key = self.name + opts.key()
        self._pool = None
        self.plan_cache_size = int(plan_cache_size)
        self.graph_cache_size = int(graph_cache_size)
        self.pack_cache_size = int(pack_cache_size)
        self._init_plan_caches()
        self._init_find_memory()

    def cache_name(self, problem: ConvProblem) -> str:
        """``name`` with the search's key (:meth:`FindOptions.key`),
        ``"+fold"`` for problems that fold while ``fold`` is on,
        ``"+wgrad-rtc"`` for problems whose backward-filter ``parity``
        compiles, ``"+split"`` for problems that split while ``split`` is
        on and ``"+pair"`` for problems paired while ``pair`` is on (Note
        [candidate sets in keys])."""
        name = _fold.cache_name(self._search_key, problem) if self.fold else self._search_key
        if self.find_options.parity:
            name = parity_cache_name(name, problem)
        return self._group_suffixes(name, problem)

    def first_fit(self, problem: ConvProblem, direction: "Direction | str",
                  workspace_limit: Optional[int], deterministic: bool = False
                  ) -> Optional[AlgoPerf]:
        """The engine config that heuristics rank first (their modes in order)
        whose numerics ``problem`` allows, that compiles no kernel at run time,
        that is deterministic where ``deterministic`` asks, and whose finalized
        plan needs at most ``workspace_limit`` bytes (None: the find cap),
        found without timing anything: its ``time_ms`` is 0.0, not a
        measurement. None where no config qualifies.
        See Note [untimed stand-ins] in :mod:`mucudnn.torch.standin`."""
        direction = Direction.parse(direction)
        want = self.find_workspace_cap() if workspace_limit is None else int(workspace_limit)
        rtc = int(Behavior.RUNTIME_COMPILATION)
        for info in self.engine_configs(problem, direction):
            if (not numerics_allowed(problem.math, info.numerical_notes)
                    or rtc in info.behavior_notes or (deterministic and not info.deterministic)
                    or (info.workspace_bytes is not None and info.workspace_bytes > want)):
                continue
            plan = self._build_plans(problem, direction, [(info.id, 0.0)]).get((info.id, 0.0))
            if plan is not None and plan.workspace_bytes <= want:
                return AlgoPerf(algo=plan.id, time_ms=0.0, workspace_bytes=plan.workspace_bytes,
                                math_type=0, determinism=1 if info.deterministic else 0)
        return None

    def clear_cache(self) -> None:
        """Drop every cached plan and operation graph (those no launcher holds are
        closed now, Note [plan lifetimes])."""
        with self._lock:
            self._drain_releases()
            self._plans.clear()
            self._graphs.clear()
            self._behind.clear()
            self._carry.clear()
            self._searched.clear()
            self._split_led.clear()

    def close(self) -> None:
        """Release plans, graphs, find()'s finalizing threads and scratch, and the
        cuDNN handle."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.clear_cache()
        super().close()


class CudnnGraphKnobsBackend(CudnnGraphBackend):
    """``get_backend("cudnn-graph+knobs")``: :class:`CudnnGraphBackend` with
    ``search="knobs"`` (Note [knob search]); the same options otherwise."""

    name = "cudnn-graph+knobs"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("search", "knobs")
        super().__init__(*args, **kwargs)

