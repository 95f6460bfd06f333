"""The NumPy backend's types: each problem dtype as a NumPy dtype (bfloat16
through ml_dtypes, looked up on every use) and the real and complex types the
algorithms compute in."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ..errors import UnsupportedOperationError
from ..problem import ConvProblem, conv_dtype

__all__ = ["np_dtype", "compute_dtype", "complex_dtype"]


def _bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, or NotImplementedError telling how to get it."""
    # Note: imported on every call (a dict lookup once loaded) rather than cached
    # at module import, so the dependency stays optional and tests can hide it.
    try:
        mod = importlib.import_module("ml_dtypes")
    except ImportError:
        raise UnsupportedOperationError(
            "bfloat16 on the NumPy backend needs ml_dtypes: pip install ml_dtypes") from None
    return np.dtype(mod.bfloat16)


def np_dtype(name: Any) -> np.dtype:
    """NumPy dtype of one of the problem's dtype names ('float32', 'bfloat16', ...)."""
    name = conv_dtype(name)
    if name == "bfloat16":
        return _bfloat16()
    return np.dtype(name)


def compute_dtype(p: ConvProblem) -> np.dtype:
    # Note: float16/bfloat16 accumulate in float32 like cuDNN's default; a
    # problem's compute_type of "float16" is treated as float32 here too (the
    # CPU truth does not emulate lower-precision accumulation).
    return np.dtype(np.float64) if p.dtype == "float64" or p.compute_type == "float64" \
        else np.dtype(np.float32)


def complex_dtype(p: ConvProblem) -> np.dtype:
    return np.dtype(np.complex128) if compute_dtype(p) == np.float64 else np.dtype(np.complex64)
