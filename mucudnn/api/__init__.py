"""The public API: :class:`Convolution` (a layer with cached micro-batch plans)
and the functional helpers :func:`conv1d`, :func:`conv2d`, :func:`conv3d`,
:func:`conv_transpose1d`/``2d``/``3d``, :func:`conv_backward_data`,
:func:`conv_backward_filter`.

>>> import numpy as np
>>> from mucudnn import Direction
>>> from mucudnn.api import Convolution
>>> conv = Convolution((8, 3, 9, 9), (4, 3, 3, 3), padding=1, backend="numpy")
>>> x = np.ones((8, 3, 9, 9), np.float32); w = np.ones((4, 3, 3, 3), np.float32)
>>> y = conv.forward(x, w)
>>> y.shape, float(y[0, 0, 4, 4])
((8, 4, 9, 9), 27.0)
>>> conv.plans[Direction.FORWARD].batch
8

Arrays
------
``x``, ``w``, ``dy`` (and the optional outputs) may be

* NumPy arrays. On the NumPy backend they are used in place. On a GPU backend
  they are copied to the device and the result is copied back: a NumPy array
  comes back (the given output array, written in place, when one is given).
  Non-contiguous NumPy *inputs* are copied (``np.ascontiguousarray``); a
  non-contiguous NumPy *output* is a ValueError (it could not be written in place).
* :class:`mucudnn.cuda.DeviceArray` (GPU backends): used in place; a result
  allocated for you is a DeviceArray. The call runs on the array's stream
  (``x.stream``, else the backend's home stream ``conv.backend.stream``),
  asynchronously; ``to_numpy``/``backend.synchronize()`` wait.
* CUDA torch tensors, CuPy arrays and any other object with
  ``__cuda_array_interface__`` (Numba, ...): used zero-copy. A given output is
  written in place and returned. With no output given, a torch input gets a
  ``torch.empty`` tensor on the same device and a CuPy input a ``cupy.empty``
  array; other producers get a DeviceArray.
* Anything else with ``__dlpack__``/``__dlpack_device__`` (JAX arrays, CPU
  torch tensors, other libraries' arrays behind the protocol): CUDA arrays are
  used zero-copy, their producer asked to order its pending work before the
  backend's home stream (the call runs there); their memory is held until the
  call's work is done. Host (CPU) arrays are taken as NumPy views, zero-copy,
  and treated as NumPy arrays. A result allocated for you comes back in the
  caller's kind through the producer's ``from_dlpack`` (a JAX array for JAX
  inputs, a torch tensor for CPU torch tensors), else as a DeviceArray (or
  NumPy array); a given output is written in place and returned as given
  (read-only ones, and JAX arrays, which are immutable, are refused).

Streams (Note [streams] in ``backends/_device.py``): a call runs on the
stream its inputs' producer orders work on, as a native library call does:
torch's current stream, CuPy's current stream, a DeviceArray's stream, the v3
``stream`` field of ``__cuda_array_interface__``, the backend's home stream for
DLPack arrays (whose producer ordered its work before it). No event and no
host wait is added (for DLPack arrays, one event marks when their memory may be
given back). For a producer whose stream is unknown (interface v2) the device is
synchronised before the call and the call's stream before returning. Device
arrays must be C-contiguous (no copy is made) and on the backend's device.

Workspace: calls with torch tensors or CuPy arrays take their workspace from
that framework's allocator (so it is counted in ``torch.cuda.memory_allocated``,
and CUDA-graph capture by torch works; for torch one buffer per device and
stream is kept between calls, Note [torch workspace] in exec/arrays.py);
every other call, and every call with ``graph=True``, uses the backend's
workspace pool for the stream (``conv.pool``), which is never more
than the plan's workspace and is freed by ``conv.pool.release()``.

The warm path: a call whose arguments have the kinds, shapes, dtypes, device
and contiguity of the previous call's goes straight to the bound launchers
(for torch tensors a handful of attribute reads); anything that differs takes
the full validation below, so every change is noticed.

Every argument is validated before any device work (planning included):
wrong shapes, dtypes, kinds, devices, contiguity, ``beta != 0`` without an
output all raise ValueError/TypeError naming the argument.

``graph=True`` captures each direction's micro-batch sequence as a CUDA graph
and replays it (re-captured when pointers, alpha or beta change); on the NumPy
backend it is a documented no-op (:attr:`Convolution.graph_active` is False).

The modules, by job (each public name is importable from here):
:mod:`.convolution` (the layer and the full path of a call),
:mod:`.torch_fast` (the warm path for CUDA torch tensors),
:mod:`.functional` (the functional helpers and :func:`clear_caches`),
:mod:`.handle` (:class:`MicroBatchHandle`).
"""

from __future__ import annotations

from .convolution import Convolution
from .functional import (clear_caches, conv1d, conv2d, conv3d, conv_backward_data,
                         conv_backward_filter, conv_transpose1d, conv_transpose2d,
                         conv_transpose3d)
from .handle import MicroBatchHandle

__all__ = ["Convolution", "MicroBatchHandle", "conv1d", "conv2d", "conv3d", "conv_backward_data",
           "conv_backward_filter", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
           "clear_caches"]
