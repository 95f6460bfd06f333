"""The workspace mucudnn.torch keeps between calls: torch's caching
allocator's buffers (Note [torch workspace] in mucudnn/exec/arrays.py) and the
pools of the Convolutions it caches; how much, and freeing it."""

from __future__ import annotations

from typing import Any

import torch

from ..exec.arrays import release_torch_workspaces, torch_workspace_bytes
from .engine import cached_convolutions

__all__ = ["workspace_bytes", "release_workspace"]


def workspace_bytes(device: "torch.device | str | int | None" = None) -> int:
    """Bytes of workspace held now between calls (on ``device`` only, when
    given): the buffers kept in torch's caching allocator for calls on CUDA
    tensors (Note [torch workspace] in mucudnn/exec/arrays.py), plus the
    backends' own pools (cudaMalloc, outside torch; see the package docstring).

    >>> workspace_bytes("cpu") >= 0
    True
    """
    dev = None if device is None else torch.device(device)
    if dev is not None and dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    pools: dict[int, Any] = {}
    for conv in cached_convolutions():
        be_dev = getattr(conv.backend, "device", None)
        if dev is not None:
            if dev.type == "cpu" and conv.backend.name != "numpy":
                continue
            if dev.type == "cuda" and (conv.backend.name == "numpy" or be_dev != dev.index):
                continue
        pool = conv.pool
        pools[id(pool)] = pool
    kept = 0 if dev is not None and dev.type == "cpu" else \
        torch_workspace_bytes(None if dev is None else dev.index)
    return kept + sum(int(p.size) for p in pools.values())


def release_workspace() -> int:
    """Free the workspace kept between calls: the buffers kept in torch's
    caching allocator (back to torch's cache) and the pools mucudnn.torch's
    Convolutions use (they grow again on the next call); returns the bytes
    freed. Waits for the GPU first. Captured CUDA graphs that used a pool must
    be deleted first (captures take torch's workspace from their own pool).

    >>> release_workspace() >= 0
    True
    """
    convs = cached_convolutions()
    pools: dict[int, Any] = {id(conv.pool): conv.pool for conv in convs}
    on_gpu = torch_workspace_bytes() or any(c.backend.name != "numpy" for c in convs)
    if on_gpu and torch.cuda.is_available():
        torch.cuda.synchronize()
    freed = release_torch_workspaces()
    for pool in pools.values():
        freed += int(pool.size)
        pool.release()
    return freed
