"""A converted layer's backward-data and backward-filter at once, on two streams.

Note [overlapped backward]
~~~~~~~~~~~~~~~~~~~~~~~~~~
A layer's backward-data and backward-filter read the same ``dy`` and write
different outputs; PyTorch runs them one after the other on the step's
stream. A kernel that leaves part of the GPU idle (a grouped convolution's
backward-filter under a workspace cap runs micro-batches of fewer blocks
than the GPU has multiprocessors) lets the other run beside it. So the first
call of a signature that runs a plan in a backward direction
(:func:`eligible`) also times its two backward directions, as they run,
one after the other and at once (:func:`time_pair`), and overlaps them where
that was faster by more than :data:`MARGIN` (:func:`overlaps`).

Overlapped (:func:`run_pair`), the backward-filter runs on a second stream
of the device (one per device), which first waits for the step's stream;
the step's stream waits for it before the layer returns, so autograd and
everything after the layer see the two as one call on the step's stream,
captured CUDA graphs included (a fork joined inside the capture). Both
kernels' workspaces are live together, so a layer overlaps only where their
sum is within the limit: the cap holds for the layer, not only per kernel.
The backward-filter's output, made on the second stream, is marked used on
the step's stream, so the allocator does not hand its block to that stream
again before the step's stream is done with it. A layer settled on
PyTorch's calls runs torch.nn's code (Note [host cost of a converted layer]
in :mod:`.native`), whose backward PyTorch runs: not overlapped. Transposed
layers are not overlapped either (their backward pair is their problem's
forward and backward-filter; not measured). ``MUCUDNN_TORCH_OVERLAP=0``
turns it off for signatures met from then on (:func:`enabled`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch

from ..problem import Direction
from .measure import time_ms

__all__ = ["enabled", "MARGIN", "PAIR", "pair_workspace", "eligible", "overlaps", "time_pair", "run_pair",
           "side_stream"]

#: The overlapped pair runs only where it took less than ``1 - MARGIN`` of the
#: pair one after the other (timing noise is a few percent).
MARGIN = 0.03

#: The backward directions a layer overlaps.
PAIR = (Direction.BACKWARD_DATA, Direction.BACKWARD_FILTER)

#: One second stream per CUDA device, made at its first overlapped call (as
#: many entries as devices).
_SIDE: dict[int, torch.cuda.Stream] = {}


def enabled() -> bool:
    """False while ``MUCUDNN_TORCH_OVERLAP`` is ``0``/``off``/``false``/``no``
    (read at each signature's first call; See Note [overlapped backward])."""
    return os.environ.get("MUCUDNN_TORCH_OVERLAP", "1").strip().lower() not in (
        "0", "off", "false", "no")


def side_stream(index: int) -> torch.cuda.Stream:
    """The second stream of CUDA device ``index`` (See Note [overlapped backward])."""
    s = _SIDE.get(index)
    if s is None:
        s = _SIDE.setdefault(index, torch.cuda.Stream(device=index))
    return s


def pair_workspace(runs: dict[Direction, str], torch_workspace: dict[Direction, Optional[int]],
                   plan_workspace: dict[Direction, int]) -> Optional[int]:
    """The bytes of workspace the two backward directions hold at once: each
    one's plan's (``plan_workspace``) where ``runs`` says ``"mucudnn"``, else
    PyTorch's measured workspace; None where one is unknown.

    >>> runs = {Direction.BACKWARD_DATA: "torch", Direction.BACKWARD_FILTER: "mucudnn"}
    >>> ws = {Direction.BACKWARD_DATA: 4 << 20, Direction.BACKWARD_FILTER: 100 << 20}
    >>> pair_workspace(runs, ws, {Direction.BACKWARD_FILTER: 50 << 20}) >> 20
    54
    >>> pair_workspace(runs, {Direction.BACKWARD_DATA: None}, {Direction.BACKWARD_FILTER: 0})
    """
    total = 0
    for d in PAIR:
        ws = plan_workspace.get(d) if runs[d] == "mucudnn" else torch_workspace.get(d)
        if ws is None:
            return None
        total += int(ws)
    return total


def eligible(runs: dict[Direction, str], torch_workspace: dict[Direction, Optional[int]],
             plan_workspace: dict[Direction, int], limit: Optional[int], need_dx: bool,
             transposed: bool) -> bool:
    """Whether a layer whose directions run ``runs`` may overlap its backward
    pair (See Note [overlapped backward]): a step runs both (``need_dx``), a
    plan runs in one of them, the layer is not transposed, and the pair's
    workspace (:func:`pair_workspace`) is within ``limit`` (None: no limit).

    >>> runs = {Direction.BACKWARD_DATA: "torch", Direction.BACKWARD_FILTER: "mucudnn"}
    >>> ws = {Direction.BACKWARD_DATA: 4 << 20}
    >>> eligible(runs, ws, {Direction.BACKWARD_FILTER: 60 << 20}, 64 << 20, True, False)
    True
    >>> eligible(runs, ws, {Direction.BACKWARD_FILTER: 62 << 20}, 64 << 20, True, False)
    False
    >>> eligible({d: "torch" for d in PAIR}, {d: 0 for d in PAIR}, {}, None, True, False)
    False
    """
    if (not need_dx or transposed or all(runs[d] != "mucudnn" for d in PAIR)
            or not enabled()):
        return False
    ws = pair_workspace(runs, torch_workspace, plan_workspace)
    return ws is not None and (limit is None or ws <= limit)


def overlaps(times: Optional[tuple[float, float]]) -> bool:
    """Whether a layer whose backward pair took ``times`` (one after the other,
    at once; None: not timed) runs it at once (See Note [overlapped backward]).

    >>> overlaps((0.40, 0.33)), overlaps((0.40, 0.395)), overlaps(None)
    (True, False, False)
    """
    return times is not None and times[1] < times[0] * (1.0 - MARGIN)


def run_pair(dx_fn: Callable[[], Any], dw_fn: Callable[[], Any],
             index: int) -> tuple[Any, Any]:
    """``(dx_fn(), dw_fn())`` with ``dw_fn`` on device ``index``'s second stream
    and ``dx_fn`` on the current one, joined before returning (See Note
    [overlapped backward]). Both run with torch's current stream set to theirs."""
    main = torch.cuda.current_stream(index)
    side = side_stream(index)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        dw = dw_fn()
    dx = dx_fn()
    main.wait_stream(side)
    if isinstance(dw, torch.Tensor):
        dw.record_stream(main)
    return dx, dw


def time_pair(dx_fn: Callable[[], Any], dw_fn: Callable[[], Any],
              index: int) -> tuple[float, float]:
    """GPU ms of the backward pair one after the other and at once
    (:func:`run_pair`), timed as PyTorch's calls are (Note [timing the GPU
    alone] in :mod:`.measure`)."""
    def one_after() -> None:
        dx_fn()
        dw_fn()

    seq, both = time_ms([one_after, lambda: run_pair(dx_fn, dw_fn, index)])
    return seq, both
