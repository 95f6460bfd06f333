"""One function for every NumPy algorithm: no overflow before the result's own,
and DIRECT's values wherever an output is NaN, infinite or about to be.

:class:`Guarded` wraps an algorithm class of the NumPy backend
(:mod:`.numpy_direct`, :mod:`.numpy_im2col`, :mod:`.numpy_fft`:
``forward(p, x, w, ws)``, ``backward_data(p, w, dy, ws)``,
``backward_filter(p, x, dy, ws)``, canonical arrays in, a fresh canonical array
in the compute type out) and gives it the same three methods. The Note below
says what it does and why.

>>> import numpy as np
>>> from mucudnn import ConvProblem
>>> from mucudnn.backends.numpy import _IMPLS
>>> p = ConvProblem((1, 3, 1, 1), (1, 3, 1, 1))
>>> x = np.array([3e38, 3e38, -3e38], np.float32).reshape(p.x_dims)   # 3e38 + 3e38 overflows
>>> w = np.ones(p.w_dims, np.float32)
>>> [float(_IMPLS[a].forward(p, x, w, np.empty(0, np.uint8)).item()) for a in (0, 1, 2)]
[3.0000000054977558e+38, 3.0000000054977558e+38, 3.0000000054977558e+38]
"""

# Note [FFT and non-finite inputs]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The NumPy backend is the project's CPU truth: DIRECT, IM2COL_GEMM and FFT must
# compute the same function on every input, NaN, +-inf and huge values
# included, up to rounding; otherwise a result would depend on which algorithm
# the timing picked. Two things broke that, the FFT worst:
#
# 1. A transform mixes every input of a sample into every frequency, so one NaN
#    or inf in x (or dy, or w) made every output of its sample (of dw, for
#    backward filter) NaN; DIRECT makes NaN/inf only the outputs whose receptive
#    field holds it.
# 2. A finite 1e38 float32 input overflowed inside the transform (sums of up to
#    L values, then products of spectra), so outputs whose exact value fits
#    float32 came back inf or NaN. DIRECT and IM2COL overflowed too, in partial
#    sums that later cancel (3e38 + 3e38 - 3e38).

# What Guarded does around every algorithm:
#
# - Range. Before a call, the largest finite magnitudes 2**ka, 2**kb of the two
#   operands bound every product, partial sum, spectrum and spectral product by
#   2**(ka + kb + t), t = log2 of a generous count of terms (N, C, K, the filter
#   taps and the padded spatial size squared, for the transforms). When that
#   stays below the compute type's maximum, the usual case, nothing can
#   overflow and the algorithm runs as it is. Otherwise, for float32 compute,
#   the algorithm runs in float64 ("a wider type": no float32 product, however
#   large, comes near float64's range, and none of the small ones underflows),
#   on a temporary float64 workspace outside the caller's, and the result is
#   rounded back to float32: +-inf exactly where the exact result does not fit.
#   For float64 compute there is no wider type: the larger operand is scaled by
#   the smallest power of two that keeps the bound below the maximum (exact,
#   but for values below 2**(min_exp + shift), which lose bits) and the result
#   scaled back. (Scaling is not used for float32: with both operands near
#   2**128 the shift needed would flush every small product to zero.)
# - Non-finite inputs. IM2COL and FFT run on copies with every NaN and +-inf
#   replaced by 0, so each output outside the receptive field of a non-finite
#   value is exact. DIRECT runs too, in the same type, when an operand held a
#   NaN or inf, or some output is within a factor 16 of the output type's
#   maximum, or the algorithm's rounding (below 2**(ka + kb + t) times the
#   type's epsilon) could reach that far (a transform's rounding spreads over
#   the whole output, so with both operands near 3e38 an exact -3.8e38 could
#   come back as a finite 0); its value is taken wherever either result is not
#   finite or that large, where rounding decides whether it overflows on store. DIRECT is the
#   definition: an output is NaN or +-inf as the IEEE sum of its products makes
#   it, the padding's zeros included (an inf weight over the padding makes NaN;
#   Note [padding products] in numpy_geometry.py).
#   So the three algorithms put NaN, +inf and -inf at exactly the same places,
#   with the same values there, and agree up to rounding everywhere else.
#
# "Up to rounding" is each algorithm's own: DIRECT's and IM2COL's error in an
# output is relative to the sum of |products| that make it; a transform's is
# relative to the norms of the operands it transforms (per sample and channel
# pair), whether or not their large values reach that output: a 3e38 in dy that
# falls in the padding still costs a small dx a few 1e-7 of 3e38 * |w|, as in
# any FFT convolution, cuDNN's included.
#
# Cost in the usual case: a min and a max per operand per call, and for IM2COL
# and FFT one max over the result. Copies, the float64 run and the DIRECT run
# happen only for inputs that need them.

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

__all__ = ["Guarded", "term_bits"]

#: DIRECT decides outputs within this factor of the output type's maximum.
_NEAR_TOP = 2.0 ** -4


def term_bits(p: Any) -> int:
    """log2 of a generous bound on the number of terms any algorithm sums into
    one value (products, spectra, spectral products) for problem ``p``."""
    n, c = p.x_dims[:2]
    k = p.w_dims[0]
    padded = math.prod(2 * (h + 2 * q) for h, q in zip(p.x_dims[2:], p.padding))
    return math.ceil(math.log2(n * c * k * math.prod(p.w_dims[2:]) * padded * padded))


def _largest(dtype: Any) -> float:
    """The largest finite value of a float type (NumPy's or ml_dtypes')."""
    try:
        return float(np.finfo(dtype).max)
    except ValueError:  # ml_dtypes' types (bfloat16) have their own finfo
        import ml_dtypes  # optional: only present when such a type was made

        return float(ml_dtypes.finfo(dtype).max)


class _Operand:
    """One operand: its largest finite magnitude's exponent, whether every value
    is finite, and the copies the algorithms get."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        with np.errstate(invalid="ignore"):
            m = max(abs(float(a.max())), abs(float(a.min()))) if a.size else 0.0
        self.finite = math.isfinite(m)
        if not self.finite:
            m = float(np.abs(np.where(np.isfinite(a), a, 0)).max())
        self.exp = math.frexp(m)[1]  # m < 2**exp

    def value(self, clean: bool, shift: int) -> np.ndarray:
        """The operand, non-finite values as 0 when ``clean``, times 2**-shift."""
        a = self.a
        if clean and not self.finite:
            a = np.where(np.isfinite(a), a, a.dtype.type(0))
        if shift:
            a = np.ldexp(a, -shift).astype(a.dtype, copy=False)
        return a


class Guarded:
    """``impl``'s three methods under the Note's rules.

    ``direct``: the DIRECT class (``impl`` itself for DIRECT, which needs no
    fallback); ``compute_dtype(p)``: the type the algorithms compute in;
    ``output_dtype(p)``: the type results are stored in; ``workspace_bytes(p)``:
    what ``impl`` needs for ``p`` (for the float64 run's own workspace).
    """

    def __init__(self, impl: Any, direct: Any, compute_dtype: Callable[[Any], np.dtype],
                 output_dtype: Callable[[Any], np.dtype],
                 workspace_bytes: Callable[[Any], int]) -> None:
        self.impl, self.direct = impl, direct
        self.compute_dtype, self.output_dtype = compute_dtype, output_dtype
        self.workspace_bytes = workspace_bytes
        self.exact = impl is direct

    def __repr__(self) -> str:
        return f"Guarded({self.impl.__name__})"

    def forward(self, p: Any, x: np.ndarray, w: np.ndarray, ws: np.ndarray) -> np.ndarray:
        return self._run("forward", p, x, w, ws)

    def backward_data(self, p: Any, w: np.ndarray, dy: np.ndarray, ws: np.ndarray) -> np.ndarray:
        return self._run("backward_data", p, w, dy, ws)

    def backward_filter(self, p: Any, x: np.ndarray, dy: np.ndarray,
                        ws: np.ndarray) -> np.ndarray:
        return self._run("backward_filter", p, x, dy, ws)

    def _run(self, method: str, p: Any, a: np.ndarray, b: np.ndarray,
             ws: np.ndarray) -> np.ndarray:
        cdt = self.compute_dtype(p)
        oa, ob = _Operand(a), _Operand(b)
        bits = oa.exp + ob.exp + term_bits(p)        # every value below 2**bits
        excess = bits + 2 - np.finfo(cdt).maxexp
        run_p, run_cdt, shift_a, shift_b = p, cdt, 0, 0
        if excess > 0 and cdt == np.float32:
            run_p, run_cdt = dataclasses.replace(p, compute_type="float64"), np.dtype(np.float64)
            ws = np.empty(self.workspace_bytes(run_p), np.uint8)
        elif excess > 0:
            shift_a, shift_b = (excess, 0) if oa.exp >= ob.exp else (0, excess)
        clean = not self.exact
        with np.errstate(invalid="ignore", over="ignore"):
            r = self._call(self.impl, method, run_p, oa.value(clean, shift_a),
                           ob.value(clean, shift_b), ws, shift_a + shift_b, cdt)
            if self.exact:
                return r
            out_max = _largest(self.output_dtype(p))
            top = out_max * _NEAR_TOP
            # Rounding of a sum of terms below 2**bits: below 2**(bits + machep).
            noisy = bits + np.finfo(run_cdt).machep >= math.frexp(top)[1]
            if (oa.finite and ob.finite and not noisy
                    and (r.size == 0 or max(r.max(), -r.min()) < top)):
                return r  # finite, far from overflow, and no rounding could get it there
            d = self._call(self.direct, method, run_p, oa.value(False, shift_a),
                           ob.value(False, shift_b), ws, shift_a + shift_b, cdt)
            take = ~(np.abs(r) < top) | ~(np.abs(d) < top)
            r[take] = d[take]
        return r

    @staticmethod
    def _call(impl: Any, method: str, p: Any, a: np.ndarray, b: np.ndarray, ws: np.ndarray,
              shift: int, cdt: np.dtype) -> np.ndarray:
        r = getattr(impl, method)(p, a, b, ws)
        if shift:
            r = np.ldexp(r, shift)
        return np.asarray(r, cdt) if r.dtype != cdt else r
