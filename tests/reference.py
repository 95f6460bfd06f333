"""An independent naive float64 convolution, the truth every backend is tested against.

Written from the definition, one filter tap at a time, in canonical
(N, C, spatial...) order; shared by the CPU and GPU tests. Deliberately simple
and slow-ish: it is only ever run on small problems.
"""

from __future__ import annotations

import itertools

import numpy as np

from mucudnn.problem import ConvProblem, Direction


def _taps(p: ConvProblem):
    """For each filter tap: the tap index and, per spatial dim, the input slice it reads."""
    out = p.y_dims[2:]
    for tap in itertools.product(*(range(r) for r in p.w_dims[2:])):
        slices = []
        for o, t, s, d, _pad in zip(out, tap, p.stride, p.dilation, p.padding):
            start = t * d  # in the padded input
            slices.append(slice(start, start + (o - 1) * s + 1, s))
        yield tap, tuple(slices)


def _pad(p: ConvProblem, xc: np.ndarray) -> np.ndarray:
    return np.pad(xc, [(0, 0), (0, 0)] + [(q, q) for q in p.padding])


def forward(p: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = conv(x, w), arrays in the problem's layout; float64 result in that layout."""
    xc = _pad(p, to_canonical_array(x, p.layout).astype(np.float64))
    wc = to_canonical_array(w, p.layout).astype(np.float64)
    g, k, cg = p.groups, p.w_dims[0], p.w_dims[1]
    kg = k // g
    y = np.zeros(p.y_dims, np.float64)
    for tap, sl in _taps(p):
        for gi in range(g):
            xs = xc[(slice(None), slice(gi * cg, (gi + 1) * cg)) + sl]
            ws = wc[(slice(gi * kg, (gi + 1) * kg), slice(None)) + tap]
            y[:, gi * kg:(gi + 1) * kg] += np.einsum("nc...,kc->nk...", xs, ws)
    return from_canonical_array(y, p.layout)


def backward_data(p: ConvProblem, w: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dx = the adjoint of forward in x."""
    wc = to_canonical_array(w, p.layout).astype(np.float64)
    dyc = to_canonical_array(dy, p.layout).astype(np.float64)
    g, k, cg = p.groups, p.w_dims[0], p.w_dims[1]
    kg = k // g
    dxp = np.zeros(p.x_dims[:2] + tuple(s + 2 * q for s, q in zip(p.x_dims[2:], p.padding)))
    for tap, sl in _taps(p):
        for gi in range(g):
            ws = wc[(slice(gi * kg, (gi + 1) * kg), slice(None)) + tap]
            dys = dyc[:, gi * kg:(gi + 1) * kg]
            dxp[(slice(None), slice(gi * cg, (gi + 1) * cg)) + sl] += np.einsum(
                "nk...,kc->nc...", dys, ws)
    crop = tuple(slice(q, q + s) for q, s in zip(p.padding, p.x_dims[2:]))
    return from_canonical_array(dxp[(slice(None), slice(None)) + crop], p.layout)


def backward_filter(p: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dw = sum over the batch of the correlation of x with dy."""
    xc = _pad(p, to_canonical_array(x, p.layout).astype(np.float64))
    dyc = to_canonical_array(dy, p.layout).astype(np.float64)
    g, k, cg = p.groups, p.w_dims[0], p.w_dims[1]
    kg = k // g
    dw = np.zeros(p.w_dims, np.float64)
    for tap, sl in _taps(p):
        for gi in range(g):
            xs = xc[(slice(None), slice(gi * cg, (gi + 1) * cg)) + sl]
            dys = dyc[:, gi * kg:(gi + 1) * kg]
            n = xs.shape[0]
            dw[(slice(gi * kg, (gi + 1) * kg), slice(None)) + tap] = np.einsum(
                "nci,nki->kc", xs.reshape(n, cg, -1), dys.reshape(n, kg, -1))
    return from_canonical_array(dw, p.layout)


def reference(p: ConvProblem, direction: Direction, x, w, y, alpha: float = 1.0,
              beta: float = 0.0) -> np.ndarray:
    """alpha * op(...) + beta * prior output, in float64, for any direction.

    ``x, w, y`` are in forward naming (``y`` is dy for the backward passes);
    the prior value of the written tensor is taken from the same arguments.
    """
    direction = Direction.parse(direction)
    if direction is Direction.FORWARD:
        r, prior = forward(p, x, w), y
    elif direction is Direction.BACKWARD_DATA:
        r, prior = backward_data(p, w, y), x
    else:
        r, prior = backward_filter(p, x, y), w
    out = alpha * r
    if beta != 0:
        out = out + beta * np.asarray(prior, np.float64)
    return out


def to_canonical_array(a: np.ndarray, layout: str) -> np.ndarray:
    a = np.asarray(a)
    if layout[1] == "C":
        return a
    nd = a.ndim
    return np.moveaxis(a, nd - 1, 1)


def from_canonical_array(a: np.ndarray, layout: str) -> np.ndarray:
    if layout[1] == "C":
        return a
    return np.moveaxis(a, 1, a.ndim - 1)


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64.

    Note: the denominator is floored at sqrt(b.size). The tests draw
    standard-normal inputs, so a real output has norm of at least about
    sqrt(size) (each element sums one or more unit-variance products); an output
    that is exactly zero (every tap lands in padding) is then judged at the
    inputs' scale rather than failing on an FFT's 1e-7 of rounding.
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    nb = max(float(np.linalg.norm(b)), float(np.sqrt(max(b.size, 1))))
    return float(np.linalg.norm(a - b) / nb)
