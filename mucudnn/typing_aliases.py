"""Argument types named once for the rooms of every level above this one
(instead of ``Any``): what a public parameter accepts, for readers and type
checkers. Nothing here checks a value; the room that takes one does.

``ArrayLike``, ``DTypeLike`` and ``DescriptorLike`` stay ``Any`` to a type
checker (what they accept is duck-typed, from libraries mucudnn does not
import), and name what is accepted. :mod:`mucudnn.optimizer.types` re-exports
``PolicyLike`` with the planning arguments' other types.
"""

from __future__ import annotations

from typing import Any, Iterable, Union

import numpy as np

__all__ = ["Address", "AddressOrArray", "ArrayLike", "DTypeLike", "DescriptorLike", "PolicyLike"]

#: An array mucudnn reads or writes: a NumPy array (host backends), a
#: :class:`mucudnn.cuda.DeviceArray`, or any object exporting
#: ``__cuda_array_interface__`` (v2/v3) or ``__dlpack__`` (PyTorch, CuPy, JAX,
#: Numba, ...); a result is of the kind the inputs were.
ArrayLike = Any
#: An element type: a name (``"float32"``, ``"fp16"``, ``"bfloat16"``, a NumPy
#: spelling such as ``"<f4"``), a NumPy dtype or scalar type, a ``torch.dtype``,
#: or another library's dtype object whose ``name`` is a supported one
#: (:func:`mucudnn.dtypes.dtype_name`).
DTypeLike = Any
#: A cuDNN-style tensor, filter or convolution descriptor: a
#: :mod:`mucudnn._cudnn` descriptor, a mapping, or an object with ``get()``,
#: ``info()`` or ``describe()`` or with ``dims``/``strides``/``dtype``/...
#: attributes (:func:`mucudnn.exec.handle.problem_from_descriptors`).
DescriptorLike = Any
#: A device address: a Python or NumPy integer (> 0 where it is an array's).
Address = Union[int, np.integer]
#: What a cuDNN-shaped call takes for an array: a device address, or on a
#: host backend a NumPy array.
AddressOrArray = Union[Address, np.ndarray]
#: A batch-size policy: a name ("fitted", "powerOfTwo", "all", "undivided",
#: ...) or explicit micro-batch sizes.
PolicyLike = Union[str, Iterable[int]]
