"""Runs a Plan on a Backend: micro-batch views, bound launchers, alpha/beta, workspace,
run-time re-plans (asked of a planner), CUDA-graph replay, the handle engine.

Modules: :mod:`.planning` (the Planner protocol the engine is handed),
:mod:`.views` (micro-batch views), :mod:`.runner` (``bind_plan``, ``execute``),
:mod:`.workspace` (pools per stream, WD segments), :mod:`.graph` (CUDA-graph
replay), :mod:`.kernel` (one kernel's plan and state), :mod:`.arrays`
(argument kinds and the frameworks they come from), :mod:`.handle` (the engine
of :class:`mucudnn.MicroBatchHandle`).
"""

from .arrays import ArrayInfo, inspect_array
from .graph import GraphCache, supports_graphs
from .handle import HandleEngine, problem_from_descriptors
from .kernel import FallbackWarning, Kernel, WorkspaceFallbackWarning
from .planning import Planner
from .runner import BoundPlan, bind_plan, execute, micro_batch_betas, prepare, resolve_workspace
from .views import batch_view, check_micro_batches, micro_batch_tensors
from .workspace import (ALIGN, SegmentedWorkspace, WorkspacePool, WorkspaceUnavailable,
                        carve_segments, get_pool, pool_for)

__all__ = [
    "ALIGN", "ArrayInfo", "BoundPlan", "FallbackWarning", "GraphCache", "HandleEngine", "Kernel",
    "Planner", "SegmentedWorkspace", "WorkspaceFallbackWarning", "WorkspacePool",
    "WorkspaceUnavailable", "batch_view", "bind_plan", "carve_segments", "check_micro_batches",
    "execute", "get_pool", "inspect_array", "micro_batch_betas", "micro_batch_tensors",
    "pool_for", "prepare", "problem_from_descriptors", "resolve_workspace", "supports_graphs",
]
