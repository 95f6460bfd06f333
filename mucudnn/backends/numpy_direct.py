"""The NumPy backend's DIRECT algorithm (:attr:`NumpyAlgo.DIRECT
<mucudnn.backends.numpy.NumpyAlgo>`): one batched GEMM per filter tap, no
workspace; the definition the other algorithms are held to on non-finite
values (Note [padding products], Note [FFT and non-finite inputs])."""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem
from .numpy_dtypes import compute_dtype
from .numpy_geometry import grouped, padding_reads, taps

__all__ = ["Direct"]


class Direct:
    """One batched GEMM per filter tap; zero workspace.

    Note: "zero workspace" is the declared scratch: the per-tap strided slices
    NumPy copies to feed BLAS are ordinary temporaries no larger than x or y.
    """

    @staticmethod
    def forward(p: ConvProblem, x: np.ndarray, w: np.ndarray, ws: np.ndarray) -> np.ndarray:
        cdt = compute_dtype(p)
        g = p.groups
        n = p.batch
        xg = grouped(x, g)                                      # (N, G, Cg, H...)
        wg = w.astype(cdt).reshape((g, p.w_dims[0] // g) + w.shape[1:])  # (G, Kg, Cg, R...)
        yg = np.zeros((n, g, p.w_dims[0] // g) + p.y_dims[2:], cdt)
        for _, tap, osl, isl in taps(p):
            xs = xg[(Ellipsis,) + isl]
            sub = xs.shape[3:]
            xs = xs.astype(cdt).reshape(n, g, xs.shape[2], -1)
            wt = wg[(Ellipsis,) + tap]                          # (G, Kg, Cg)
            yg[(Ellipsis,) + osl] += np.matmul(wt, xs).reshape(yg.shape[:3] + sub)
        if any(p.padding) and not np.isfinite(wg).all():       # Note [padding products]
            bad = ~np.isfinite(wg).all(axis=2)                  # (G, Kg, R...)
            for tap, reads in padding_reads(p):
                hit = bad[(Ellipsis,) + tap]                    # (G, Kg)
                if hit.any():
                    np.copyto(yg, cdt.type(np.nan),
                              where=hit.reshape(hit.shape + (1,) * (yg.ndim - 3)) & reads)
        return yg.reshape(p.y_dims)

    @staticmethod
    def backward_data(p: ConvProblem, w: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        cdt = compute_dtype(p)
        g = p.groups
        n = p.batch
        kg = p.w_dims[0] // g
        wg = w.astype(cdt).reshape((g, kg) + w.shape[1:])      # (G, Kg, Cg, R...)
        dyg = grouped(dy, g)                                    # (N, G, Kg, O...)
        dx = np.zeros((n, g, p.w_dims[1]) + p.x_dims[2:], cdt)
        for _, tap, osl, isl in taps(p):
            ds = dyg[(Ellipsis,) + osl]
            sub = ds.shape[3:]
            ds = ds.astype(cdt).reshape(n, g, kg, -1)
            wt = np.swapaxes(wg[(Ellipsis,) + tap], 1, 2)       # (G, Cg, Kg)
            dx[(Ellipsis,) + isl] += np.matmul(wt, ds).reshape(dx.shape[:3] + sub)
        return dx.reshape(p.x_dims)

    @staticmethod
    def backward_filter(p: ConvProblem, x: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        cdt = compute_dtype(p)
        g = p.groups
        kg, cg = p.w_dims[0] // g, p.w_dims[1]
        xg = grouped(x, g)
        dyg = grouped(dy, g)
        dw = np.zeros((g, kg, cg) + p.w_dims[2:], cdt)
        for _, tap, osl, isl in taps(p):
            # (G, Kg, N*P) @ (G, N*P, Cg): one GEMM per group sums batch and pixels.
            ds = np.ascontiguousarray(np.moveaxis(dyg[(Ellipsis,) + osl], 0, 2), cdt)
            xs = np.ascontiguousarray(np.moveaxis(xg[(Ellipsis,) + isl], 0, 2), cdt)
            dw[(Ellipsis,) + tap] = np.matmul(ds.reshape(g, kg, -1),
                                              xs.reshape(g, cg, -1).swapaxes(1, 2))
        if any(p.padding) and not np.isfinite(dyg).all():      # Note [padding products]
            bad = (~np.isfinite(dyg)).any(axis=0)               # (G, Kg, O...)
            axes = tuple(range(2, bad.ndim))
            for tap, reads in padding_reads(p):
                hit = (bad & reads).any(axis=axes)              # (G, Kg)
                np.copyto(dw[(Ellipsis,) + tap], cdt.type(np.nan), where=hit[:, :, None])
        return dw.reshape(p.w_dims)
