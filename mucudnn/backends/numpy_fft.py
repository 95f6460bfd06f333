"""The NumPy backend's FFT algorithm (:attr:`NumpyAlgo.FFT
<mucudnn.backends.numpy.NumpyAlgo>`): input, filter and output transformed
to the frequency domain, channels contracted per frequency, transformed back;
and the FFT sizes its workspace is counted from."""

from __future__ import annotations

import inspect
from typing import Sequence

import numpy as np

from ..problem import ConvProblem
from .numpy_dtypes import complex_dtype, compute_dtype
from .numpy_geometry import carve, prod

__all__ = ["FFT", "fft_sizes", "fft_freqs"]

#: Whether numpy.fft takes out= (NumPy >= 2.0).
_FFT_OUT = "out" in inspect.signature(np.fft.rfft).parameters


def fft_sizes(p: ConvProblem) -> tuple[int, ...]:
    """FFT size per spatial dim: the padded input length rounded up to a fast size.

    Note: ``L >= H + 2 * pad`` is enough for every direction: it holds the
    dilated filter, the upsampled dy convolved with it, and (with padding taken
    as a circular shift instead of a padded copy) it needs ``L >= H + pad``.
    """
    from scipy.fft import next_fast_len  # Note [heavy imports where they are used]
    return tuple(next_fast_len(h + 2 * q, real=True) for h, q in zip(p.x_dims[2:], p.padding))


def fft_freqs(sizes: Sequence[int]) -> int:
    """Frequencies a real FFT of ``sizes`` keeps (half a spectrum on the last axis)."""
    return prod(sizes[:-1]) * (sizes[-1] // 2 + 1)


class FFT:
    """Frequency-domain convolution; the three spectra live in the workspace.

    Spectra are kept frequency-major, (F..., N, C), so the channel contraction
    at every frequency is one BLAS GEMM on strided views.

    Note: padding is never materialised: the circular correlation of the
    unpadded x is read at index ``o * s - pad (mod L)``, which is exact because
    ``L >= H + pad`` puts the wrapped indices on zeros.

    The methods expect finite operands small enough not to overflow: a
    transform spreads a NaN over its whole sample and overflows on values near
    the type's maximum. The backend runs them wrapped so (``_IMPLS`` in
    numpy.py; Note [FFT and non-finite inputs], _numpy_guard.py).
    """

    @staticmethod
    def _buffers(p: ConvProblem, ws: np.ndarray, first_n_c: tuple[int, int],
                 second: tuple[int, int], third: tuple[int, int]):
        sizes = fft_sizes(p)
        fshape = sizes[:-1] + (sizes[-1] // 2 + 1,)
        cdt = complex_dtype(p)
        # Carve in the order of the workspace formula: (N, C), (K, Cg), (N, K).
        return sizes, carve(ws, [(fshape + first_n_c, cdt), (fshape + second, cdt),
                                 (fshape + third, cdt)])

    @staticmethod
    def _rfft_into(a: np.ndarray, sizes: tuple[int, ...], out: np.ndarray) -> np.ndarray:
        """rfftn of (A, B, spatial...) a, zero-extended to ``sizes``, into the
        frequency-major (F..., A, B) buffer ``out``."""
        nd = len(sizes)
        axes = tuple(range(2, 2 + nd))
        view = np.moveaxis(out, tuple(range(nd)), axes)         # (A, B, F...) view
        if not _FFT_OUT:  # NumPy < 2.0: no out=
            view[...] = np.fft.rfftn(a, s=sizes, axes=axes)
            return out
        # Note: np.fft.rfftn(out=...) needs the input as long as s on every axis
        # but the last, so the zero extension is done here: the real transform
        # of the last axis fills the corner the input covers, the rest is zeroed,
        # then the complex transforms run in place along the other axes.
        corner = (Ellipsis,) + tuple(slice(0, h) for h in a.shape[2:-1]) + (slice(None),)
        if a.shape[2:-1] != tuple(sizes[:-1]):
            view.fill(0)
        np.fft.rfft(a, n=sizes[-1], axis=-1, out=view[corner])
        for ax in axes[:-1]:
            np.fft.fft(view, axis=ax, out=view)
        return out

    @staticmethod
    def _filter_spectrum(p: ConvProblem, w: np.ndarray, sizes: tuple[int, ...], sign: int,
                         out: np.ndarray) -> None:
        """The (dilated) filter's spectrum into the frequency-major (F..., K, Cg) buffer.

        ``sign=-1`` is the DFT, ``sign=+1`` its conjugate (what correlation needs).

        Note: the filter has only R taps per axis, so its transform is a direct
        DFT by small matrix products (taps x frequencies), with the dilation put
        in the phases; an FFT over the mostly-zero, filter-sized buffer walks
        K x Cg lines with huge strides and was ten times slower.
        """
        nd = len(sizes)
        m = p.w_dims[0] * p.w_dims[1]
        cdt = complex_dtype(p)
        a = np.moveaxis(w, (0, 1), (nd, nd + 1)).astype(cdt).reshape(p.w_dims[2:] + (m,))
        mats = []
        for i, (r, d, L) in enumerate(zip(p.w_dims[2:], p.dilation, sizes)):
            f = np.arange(L // 2 + 1 if i == nd - 1 else L)
            mats.append(np.exp(sign * 2j * np.pi * np.outer(f, np.arange(r) * d) / L).astype(cdt))
        for i in range(nd - 1, 0, -1):   # the small axes first, axis 0 last, straight into out
            a = np.ascontiguousarray(np.moveaxis(np.tensordot(mats[i], a, axes=(1, i)), 0, i))
        np.matmul(mats[0], a.reshape(a.shape[0], -1), out=out.reshape(sizes[0], -1))

    @staticmethod
    def _inverse_at(spec: np.ndarray, sizes: tuple[int, ...],
                    idx: Sequence[np.ndarray]) -> np.ndarray:
        """irfftn of the frequency-major (F..., M) ``spec`` evaluated only at the
        indices ``idx[i]`` of each spatial axis: (len(idx[0]), ..., M), real.

        Note: a direct inverse DFT at the few points backward-filter needs (R
        per axis) instead of a full irfftn of the K x Cg x L... buffer. The
        last axis holds half a spectrum, so its bins are weighted as irfft does
        (1 for DC and Nyquist, 2 otherwise) and the real part is taken at the end.
        """
        nd = len(sizes)
        mats = []
        for i, (j, L) in enumerate(zip(idx, sizes)):
            half = i == nd - 1
            f = np.arange(L // 2 + 1 if half else L)
            e = np.exp(2j * np.pi * np.outer(j, f) / L) / L
            if half:
                c = np.full(f.size, 2.0)
                c[0] = 1.0
                if L % 2 == 0:
                    c[-1] = 1.0
                e = e * c
            mats.append(e.astype(spec.dtype))
        a = np.matmul(mats[0], spec.reshape(spec.shape[0], -1)).reshape((len(idx[0]),) + spec.shape[1:])
        for i in range(1, nd):
            a = np.moveaxis(np.tensordot(mats[i], a, axes=(1, i)), 0, i)
        return np.ascontiguousarray(a.real)

    @staticmethod
    def _upsampled(p: ConvProblem, dy: np.ndarray) -> np.ndarray:
        """dy with (stride - 1) zeros between outputs, compute dtype."""
        if all(s == 1 for s in p.stride):
            return dy.astype(compute_dtype(p))
        o1 = tuple((o - 1) * s + 1 for o, s in zip(p.y_dims[2:], p.stride))
        up = np.zeros(p.y_dims[:2] + o1, compute_dtype(p))
        up[(Ellipsis,) + tuple(slice(None, None, s) for s in p.stride)] = dy
        return up

    @staticmethod
    def _pick(r: np.ndarray, idx: Sequence[np.ndarray]) -> np.ndarray:
        """r[idx0, idx1, ...] on the leading spatial axes (an outer product of indices)."""
        return r[np.ix_(*idx)] if len(idx) > 1 else r[idx[0]]

    @classmethod
    def forward(cls, p: ConvProblem, x: np.ndarray, w: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        n, c = p.x_dims[:2]
        k, cg = p.w_dims[:2]
        kg = k // g
        sizes, (xf, wf, yf) = cls._buffers(p, ws, (n, c), (k, cg), (n, k))
        nd = len(sizes)
        cls._rfft_into(x.astype(compute_dtype(p), copy=False), sizes, xf)
        cls._filter_spectrum(p, w, sizes, +1, wf)                # conjugate: correlation
        f = xf.shape[:nd]
        a = xf.reshape(f + (n, g, cg)).swapaxes(nd, nd + 1)      # (F..., G, N, Cg)
        b = wf.reshape(f + (g, kg, cg)).swapaxes(nd + 1, nd + 2)  # (F..., G, Cg, Kg)
        yv = yf.reshape(f + (g, n, kg))
        np.matmul(a, b, out=yv)
        r = np.fft.irfftn(yv, s=sizes, axes=tuple(range(nd)))    # (L..., G, N, Kg)
        idx = [(np.arange(o) * s - q) % L
               for o, s, q, L in zip(p.y_dims[2:], p.stride, p.padding, sizes)]
        r = cls._pick(r, idx)                                    # (O..., G, N, Kg)
        r = np.moveaxis(r, tuple(range(nd)), tuple(range(3, 3 + nd)))   # (G, N, Kg, O...)
        return np.ascontiguousarray(np.swapaxes(r, 0, 1)).reshape(p.y_dims)

    @classmethod
    def backward_data(cls, p: ConvProblem, w: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        n, c = p.x_dims[:2]
        k, cg = p.w_dims[:2]
        kg = k // g
        sizes, (dxf, wf, dyf) = cls._buffers(p, ws, (n, c), (k, cg), (n, k))
        nd = len(sizes)
        cls._rfft_into(cls._upsampled(p, dy), sizes, dyf)
        cls._filter_spectrum(p, w, sizes, -1, wf)                # convolution
        f = dyf.shape[:nd]
        a = dyf.reshape(f + (n, g, kg)).swapaxes(nd, nd + 1)     # (F..., G, N, Kg)
        b = wf.reshape(f + (g, kg, cg))                           # (F..., G, Kg, Cg)
        dxv = dxf.reshape(f + (g, n, cg))
        np.matmul(a, b, out=dxv)
        r = np.fft.irfftn(dxv, s=sizes, axes=tuple(range(nd)))   # (L..., G, N, Cg)
        r = r[tuple(slice(q, q + h) for q, h in zip(p.padding, p.x_dims[2:]))]
        r = np.moveaxis(r, tuple(range(nd)), tuple(range(3, 3 + nd)))   # (G, N, Cg, H...)
        return np.ascontiguousarray(np.swapaxes(r, 0, 1)).reshape(p.x_dims)

    @classmethod
    def backward_filter(cls, p: ConvProblem, x: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        g = p.groups
        n, c = p.x_dims[:2]
        k, cg = p.w_dims[:2]
        kg = k // g
        sizes, (xf, dwf, dyf) = cls._buffers(p, ws, (n, c), (k, cg), (n, k))
        nd = len(sizes)
        cls._rfft_into(x.astype(compute_dtype(p), copy=False), sizes, xf)
        cls._rfft_into(cls._upsampled(p, dy), sizes, dyf)
        np.conjugate(dyf, out=dyf)
        f = xf.shape[:nd]
        a = dyf.reshape(f + (n, g, kg)).transpose(
            tuple(range(nd)) + (nd + 1, nd + 2, nd))              # (F..., G, Kg, N)
        b = xf.reshape(f + (n, g, cg)).swapaxes(nd, nd + 1)      # (F..., G, N, Cg)
        dwv = dwf.reshape(f + (g, kg, cg))
        np.matmul(a, b, out=dwv)
        idx = [(np.arange(rr) * d - q) % L
               for rr, d, q, L in zip(p.w_dims[2:], p.dilation, p.padding, sizes)]
        r = cls._inverse_at(dwv, sizes, idx)                     # (R..., G, Kg, Cg)
        r = np.moveaxis(r, tuple(range(nd)), tuple(range(3, 3 + nd)))   # (G, Kg, Cg, R...)
        return np.ascontiguousarray(r).reshape(p.w_dims)
