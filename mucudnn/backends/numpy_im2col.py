"""The NumPy backend's IM2COL_GEMM algorithm (:attr:`NumpyAlgo.IM2COL_GEMM
<mucudnn.backends.numpy.NumpyAlgo>`): the column matrix of the input's
windows, built inside the workspace, and one GEMM per group."""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem
from .numpy_dtypes import compute_dtype
from .numpy_geometry import carve, grouped, prod, taps, taps_cover_all

__all__ = ["Im2col"]


class Im2col:
    """The column matrix (G, Cg*T, N*P) lives in the workspace."""

    @staticmethod
    def _cols(p: ConvProblem, ws: np.ndarray) -> np.ndarray:
        g, cg = p.groups, p.w_dims[1]
        t = prod(p.w_dims[2:])
        (cols,) = carve(ws, [((g, cg, t, p.batch) + p.y_dims[2:], compute_dtype(p))])
        return cols                                             # (G, Cg, T, N, O...)

    @classmethod
    def _im2col(cls, p: ConvProblem, x: np.ndarray, ws: np.ndarray) -> np.ndarray:
        cols = cls._cols(p, ws)
        if not taps_cover_all(p):
            cols.fill(0)  # Note: only padding leaves parts of the columns unwritten
        xt = np.moveaxis(grouped(x, p.groups), 0, 2)            # (G, Cg, N, H...) view
        for flat, _, osl, isl in taps(p):
            # Note: the cast from x's dtype to the compute dtype happens in this copy.
            cols[(slice(None), slice(None), flat, slice(None)) + osl] = xt[(Ellipsis,) + isl]
        return cols

    @staticmethod
    def _dy_gemm(p: ConvProblem, dy: np.ndarray) -> np.ndarray:
        """dy as (G, Kg, N*P) in the compute dtype (a temporary the size of dy)."""
        g = p.groups
        kg = p.w_dims[0] // g
        d = np.moveaxis(grouped(dy, g), 0, 2)                   # (G, Kg, N, O...)
        return np.ascontiguousarray(d, compute_dtype(p)).reshape(g, kg, -1)

    @classmethod
    def forward(cls, p: ConvProblem, x: np.ndarray, w: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        kg = p.w_dims[0] // g
        cols = cls._im2col(p, x, ws)
        wm = w.astype(compute_dtype(p)).reshape(g, kg, -1)
        yg = np.matmul(wm, cols.reshape(g, wm.shape[2], -1))    # (G, Kg, N*P)
        yg = yg.reshape((g, kg, p.batch) + p.y_dims[2:])
        return np.moveaxis(yg, 2, 0).reshape(p.y_dims)

    @classmethod
    def backward_data(cls, p: ConvProblem, w: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        kg = p.w_dims[0] // g
        cdt = compute_dtype(p)
        cols = cls._cols(p, ws)
        wm = w.astype(cdt).reshape(g, kg, -1).swapaxes(1, 2)    # (G, Cg*T, Kg)
        np.matmul(wm, cls._dy_gemm(p, dy), out=cols.reshape(g, wm.shape[1], -1))
        dx = np.zeros((g, p.w_dims[1], p.batch) + p.x_dims[2:], cdt)   # (G, Cg, N, H...)
        for flat, _, osl, isl in taps(p):                       # col2im
            dx[(Ellipsis,) + isl] += cols[(slice(None), slice(None), flat, slice(None)) + osl]
        return np.moveaxis(dx, 2, 0).reshape(p.x_dims)

    @classmethod
    def backward_filter(cls, p: ConvProblem, x: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        cols = cls._im2col(p, x, ws)
        cm = cols.reshape(g, p.w_dims[1] * prod(p.w_dims[2:]), -1)    # (G, Cg*T, N*P)
        dw = np.matmul(cls._dy_gemm(p, dy), cm.swapaxes(1, 2))  # (G, Kg, Cg*T)
        return dw.reshape(p.w_dims)
