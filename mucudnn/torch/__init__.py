"""mucudnn.torch: micro-batched convolutions inside PyTorch training.

Three lines convert a model::

    import mucudnn.torch as mt
    model = mt.convert(model, workspace_limit=64 << 20)   # every nn.Conv*d, nn.ConvTranspose*d
    # ... train as before: same parameters, same optimizer, same state_dict

or build layers directly (:class:`Conv1d`, :class:`Conv2d`, :class:`Conv3d`,
:class:`ConvTranspose1d`/``2d``/``3d``, subclasses of torch's) or call
:func:`conv1d`/:func:`conv2d`/:func:`conv3d` and
:func:`conv_transpose1d`/``2d``/``3d`` (as ``torch.nn.functional``'s; 1-D
convolutions run as 2-D ones of height 1, as PyTorch runs them on cuDNN, and
a transposed convolution as the backward-data of the convolution it is the
adjoint of, Note [transposed convolutions] in :mod:`.transposed`).
Forward, backward-data and backward-filter each run micro-batched with the
fastest cuDNN algorithms whose workspace fits the limit
(:class:`mucudnn.Convolution` underneath, one per distinct problem, cached).

What runs where
---------------
* CUDA tensors run on mucudnn's GPU backend of their device
  (``mucudnn.get_backend(backend, device=index)``; cudnn-graph by default),
  zero-copy, on torch's current stream.
* CPU tensors run on the NumPy backend (slow, exact; it is how the autograd
  path is tested without a GPU).
* ``torch.channels_last`` tensors run NHWC plans without copies and return
  channels-last outputs, as native convolutions do; under
  ``torch.autocast`` inputs and weight are cast to the autocast dtype. In
  float32 under a workspace cap, make the model channels-last
  (``model.to(memory_format=torch.channels_last)``): cuDNN's fast float32
  NCHW engines copy their operands to NHWC inside their workspace, so a cap
  splits their batch (Note [fp32 transposes in workspace] in
  :mod:`mucudnn.problem`; docs/BENCHMARKS.md has the converted steps'
  times against native channels-last and NCHW ones).
* ``torch.compile`` sees the custom ops ``mucudnn::conv``,
  ``mucudnn::conv_backward`` and ``mucudnn::conv_transpose`` (fake
  implementations give shapes), so a
  compiled model keeps each convolution as one node; eager mode uses an
  ``autograd.Function`` (less host time per call).
* Beyond first-order eager autograd, as native convolutions: forward-mode
  AD (``torch.autograd.forward_ad`` dual tensors, ``torch.func.jvp``,
  ``jacfwd``), double backward (``create_graph=True``: gradient penalties,
  ``gradgradcheck``, ``torch.func.hessian``) and ``torch.func`` transforms
  (``vmap``, ``grad``, ``jacrev``) run on mucudnn's three directions, each
  the adjoint of the others (Note [three bilinear directions] in
  :mod:`.autodiff`; ``vmap`` folds the vmapped dimension into the batch or
  the groups, Note [vmap by folding]). The first-order eager path is
  unchanged by them.
* Never slower than native: the first eager call of each convolution on a
  GPU (inside a converted model's training steps, its first call in the
  second or third step: the first runs untimed stand-ins, Note [planning
  after the first step] in :mod:`.standin`) times each direction's plan against PyTorch's own cuDNN call
  (``cudnn.benchmark``) and measures PyTorch's workspace; a direction runs
  PyTorch's call where that fits the same limit and is no slower (Note
  [never slower than native] in :mod:`.native`; PyTorch's workspace is
  read from the allocator's running totals, leaving ``torch.cuda``'s
  peak-memory statistics to the user, Note [measuring without resetting the
  peak] in :mod:`.measure`; ``MUCUDNN_TORCH_NATIVE=0`` turns it off).
  ``print(mt.report(model))`` after the third step lists what each layer
  runs, both times and PyTorch's workspace.
* CUDA graphs: after three warm-up steps (which plan and allocate), a whole
  training step can be captured with ``torch.cuda.graph`` and replayed. A
  capture runs each direction's faster side on the GPU, plan or PyTorch's
  call, whatever the eager steps' host rules chose (Note [captured steps run
  the GPU's choice] in :mod:`.native`; plans for directions that fit the
  limit are searched under ``MUCUDNN_TORCH_SEARCH=all``).
* Replay: a planned direction's launch is replayed as a CUDA graph once a
  call repeats its addresses (the steady steps of a training loop), so that
  an engine issuing many kernels costs an eager step's host one graph launch
  (Note [replay after repeated addresses] in :mod:`mucudnn.exec.graph`). On
  by default; ``MUCUDNN_TORCH_REPLAY=0`` launches directly.
* ``torch.backends.cudnn.deterministic = True`` or
  ``torch.use_deterministic_algorithms(True)``: plans use only the
  configurations cuDNN marks deterministic (``mucudnn.Convolution(...,
  deterministic=True)``), so convolutions are bitwise reproducible run to
  run. Read at every call, as ``torch.backends.cudnn.allow_tf32`` is: a
  change takes effect at the next call (:func:`.engine.deterministic`).

Where the workspace comes from
------------------------------
As for PyTorch's own convolutions: from PyTorch's caching allocator, on
torch's current stream, a block per launch of exactly the bytes the plan needs,
given back once the launch is enqueued, so that only what runs at a step's
peak counts in it (Note [transient workspace in a training step] in
:mod:`mucudnn.exec.arrays`). ``mucudnn.Convolution`` called with CUDA torch
tensors instead keeps one buffer per device and stream between calls, grown in
powers of two to the largest need seen (Note [torch workspace]: a fresh
allocation per launch costs host time). Either is counted in
``torch.cuda.memory_allocated``, so in ``max_memory_allocated`` peaks and
under ``set_per_process_memory_fraction``; CUDA-graph capture takes a fresh
one per launch from the graph's private pool. Each plan's need is at most
``workspace_limit`` (WR mode) or the kernel's share of ``total_workspace``
(WD mode). mucudnn's own pools (:class:`mucudnn.exec.workspace.WorkspacePool`,
allocated with ``cudaMalloc`` outside torch) serve only NumPy, DeviceArray and
``graph=True`` calls. :func:`workspace_bytes` gives what both hold between
calls, :func:`release_workspace` frees both.

Caches (each a :class:`mucudnn.caches.LRU`; :func:`mucudnn.caches.clear_all` empties them)
--------------------------------------------------------------------------------------------
* ``torch.convolutions`` (:mod:`.engine`, :data:`MAX_CONVOLUTIONS` = 512): one
  :class:`mucudnn.Convolution` per packed x/w shape, dtype, layout, math mode,
  device, options and determinism; :func:`clear` empties it too.
* ``torch.options`` (:mod:`.functional`, 64): checked ``workspace_limit``/``policy``/``backend``.
* ``torch.native_choices`` (:mod:`.native`, 512): per convolution signature, whether
  each direction runs the plan or PyTorch's own call, with both times (Note [never
  slower than native]); :func:`report` prints them.
* ``torch.wd_plans`` (one per :class:`WDPlanner`, 4096): WD plans by (layer, problem);
  once emptied, the next forward plans again.

>>> import torch
>>> from torch import nn
>>> model = convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()))
>>> y = model(torch.randn(2, 3, 5, 5))
>>> y.sum().backward()
>>> tuple(model[0].weight.grad.shape)
(4, 3, 3, 3)
"""

from __future__ import annotations

import torch  # noqa: F401  (this package is the only room of mucudnn that imports torch)

from .convert import MODES, ConvertWarning, WDPlanner, convert
from .distributed import SharedPlans, share_plans
from .engine import MAX_CONVOLUTIONS, TorchBridgeError, cached_convolutions, clear
from .functional import (DEFAULT_WORKSPACE_LIMIT, TorchTypeError, TorchValueError, conv1d, conv2d,
                         conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d)
from .modules import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from .ops import ConvFunction
from .report import LayerReport, Report, report
from .standin import StandinWarning
from .workspace import release_workspace, workspace_bytes

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
           "ConvFunction", "ConvertWarning", "DEFAULT_WORKSPACE_LIMIT",
           "MAX_CONVOLUTIONS",
           "MODES", "SharedPlans", "TorchBridgeError", "TorchTypeError", "TorchValueError",
           "WDPlanner", "cached_convolutions", "clear", "conv1d", "conv2d", "conv3d",
           "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convert",
           "release_workspace", "share_plans", "workspace_bytes", "report", "Report",
           "LayerReport", "StandinWarning"]
