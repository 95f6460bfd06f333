"""Runs a Plan on a Backend: micro-batch views, alpha/beta, workspace, graph replay, MicroBatchHandle.

Modules: :mod:`.views` (micro-batch views), :mod:`.runner` (``execute``),
:mod:`.workspace` (per-device pool, WD segments), :mod:`.fallback` (re-plan
under the free workspace), :mod:`.graph` (CUDA-graph replay), :mod:`.kernel`
(one kernel's plan and state), :mod:`.arrays` (argument kinds), :mod:`.handle`
(:class:`MicroBatchHandle`).
"""

from .fallback import replan_under, zero_workspace_plan
from .graph import GraphCache, LaunchCache, supports_graphs
from .handle import MicroBatchHandle, problem_from_descriptors
from .kernel import Kernel, WorkspaceFallbackWarning
from .runner import execute, micro_batch_betas, prepare, resolve_workspace
from .views import batch_view, check_micro_batches, micro_batch_tensors
from .workspace import (ALIGN, SegmentedWorkspace, WorkspacePool, WorkspaceUnavailable,
                        carve_segments, get_pool)

__all__ = [
    "ALIGN", "GraphCache", "Kernel", "LaunchCache", "MicroBatchHandle", "SegmentedWorkspace",
    "WorkspaceFallbackWarning", "WorkspacePool", "WorkspaceUnavailable", "batch_view",
    "carve_segments", "check_micro_batches", "execute", "get_pool", "micro_batch_betas",
    "micro_batch_tensors", "prepare", "problem_from_descriptors", "replan_under", "resolve_workspace",
    "supports_graphs", "zero_workspace_plan",
]
