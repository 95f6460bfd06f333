#!/usr/bin/env python
"""Probe: how fast can cuDNN itself fold a first layer's input (space-to-depth)?

``tools/space_to_depth_probe.py`` found the folded first layers much faster
than the original ones, with the rearrangement done by torch copies. A
mucudnn plan must do it with cuDNN, inside its workspace, per micro-batch.
This probe times two ways on the GPU, for AlexNet's and ResNet's first layer
(float32, channels-last x), and checks each against torch's fold:

* ``boxes``: zero the folded buffer, then ``cudnnTransformTensor`` once per
  (row, column) phase of the s x s block: a strided 4-D copy of the pixels of
  that phase into their channel slot (channel order (i, j, c));
* ``fold``: one ``cudnnTransformTensorEx`` with a tensor transform
  descriptor (``cudnnSetTensorTransformDescriptor``: padding and fold per
  dimension, NHWC destination), its destination from ``cudnnInitTransformDest``;
  its channel order is found by comparison with both candidate orders; then
  the way back (``CUDNN_TRANSFORM_UNFOLD``), checked against x.

    python tools/fold_transform_probe.py --batch 256 32
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mucudnn._cudnn.descriptors import TensorDescriptor  # noqa: E402
from mucudnn._cudnn.handle import Handle  # noqa: E402
from mucudnn._cudnn.prototypes import lib  # noqa: E402
from mucudnn._cudnn.structs import cudnnTensorTransformDescriptor_t  # noqa: E402

#: name -> (C, H, W, stride, padding, R)
LAYERS = {"alexnet": (3, 227, 227, 4, 0, 11), "resnet": (3, 224, 224, 2, 3, 7)}
NHWC = 1  # cudnnTensorFormat_t CUDNN_TENSOR_NHWC
FOLD, UNFOLD = 0, 1


def fold_reference(x: torch.Tensor, s: int, p: int, order: str) -> torch.Tensor:
    """x (N, C, H, W) padded by p and to multiples of s, folded; channel order
    "ijc" or "cij"; returned as an NHWC-contiguous (N, H', W', C') tensor."""
    n, c, h, w = x.shape
    hp, wp = h + 2 * p, w + 2 * p
    x = F.pad(x, (p, p + (-wp) % s, p, p + (-hp) % s))
    h2, w2 = x.shape[2] // s, x.shape[3] // s
    x = x.reshape(n, c, h2, s, w2, s)
    x = x.permute(0, 2, 4, 3, 5, 1) if order == "ijc" else x.permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n, h2, w2, s * s * c).contiguous()


def timed(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / reps)
    return statistics.median(out)


def boxes(handle: Handle, x: torch.Tensor, c: int, h: int, w: int, s: int, p: int,
          out: torch.Tensor) -> list:
    """The (src descriptor, src pointer, dst descriptor, dst pointer) of each
    phase's strided copy (x NHWC (n, h, w, c); out NHWC (n, h2, w2, s*s*c))."""
    n, h2, w2, c2 = out.shape
    el = x.element_size()
    calls = []
    for i in range(s):
        # folded rows h' with 0 <= s*h' + i - p < h
        r0 = max(0, -(-(p - i) // s))
        r1 = min(h2, (h - 1 + p - i) // s + 1)
        for j in range(s):
            q0 = max(0, -(-(p - j) // s))
            q1 = min(w2, (w - 1 + p - j) // s + 1)
            if r1 <= r0 or q1 <= q0:
                continue
            dims = (n, c, r1 - r0, q1 - q0)
            src = TensorDescriptor(dims, (h * w * c, 1, s * w * c, s * c), "float32")
            dst = TensorDescriptor(dims, (h2 * w2 * c2, 1, w2 * c2, c2), "float32")
            src_off = ((s * r0 + i - p) * w + (s * q0 + j - p)) * c
            dst_off = (r0 * w2 + q0) * c2 + (i * s + j) * c
            calls.append((src, x.data_ptr() + el * src_off, dst, out.data_ptr() + el * dst_off))
    return calls


def run_boxes(handle: Handle, calls: list, out: torch.Tensor) -> None:
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    out.zero_()
    for src, sp, dst, dp in calls:
        lib.cudnnTransformTensor(handle, ctypes.byref(one), src, ctypes.c_void_p(sp),
                                 ctypes.byref(zero), dst, ctypes.c_void_p(dp))


def fold_descriptor(nb: int, pad_before, pad_after, fold, direction: int):
    d = cudnnTensorTransformDescriptor_t()
    lib.cudnnCreateTensorTransformDescriptor(ctypes.byref(d))
    arr_i = ctypes.c_int32 * len(pad_before)
    arr_u = ctypes.c_uint32 * len(fold)
    lib.cudnnSetTensorTransformDescriptor(d, nb, NHWC, arr_i(*pad_before), arr_i(*pad_after),
                                          arr_u(*fold), direction)
    return d


def probe(name: str, batch: int, handle: Handle) -> dict:
    c, h, w, s, p, _ = LAYERS[name]
    dev = torch.device("cuda")
    x_nchw = torch.randn(batch, c, h, w, device=dev)
    x = x_nchw.permute(0, 2, 3, 1).contiguous()  # NHWC memory
    res: dict = {"layer": name, "batch": batch}
    ref = {o: fold_reference(x_nchw, s, p, o) for o in ("ijc", "cij")}
    out = torch.empty_like(ref["ijc"])
    calls = boxes(handle, x, c, h, w, s, p, out)
    run_boxes(handle, calls, out)
    torch.cuda.synchronize()
    res["boxes"] = {"calls": len(calls),
                    "max_abs_error": float((out - ref["ijc"]).abs().max()),
                    "ms": timed(lambda: run_boxes(handle, calls, out))}
    res["torch_ms"] = timed(lambda: fold_reference(x_nchw, s, p, "ijc"))
    # cuDNN's own fold. A first probe (docs/BENCHMARKS.md, "Thirteenth session") found the
    # convention: padBeforeA/padAfterA have an entry per dimension (N, C, H, W),
    # foldA one per spatial dimension.
    hp, wp = h + 2 * p, w + 2 * p
    pb, pa, fo = [0, 0, p, p], [0, 0, p + (-hp) % s, p + (-wp) % s], [s, s]
    src = TensorDescriptor((batch, c, h, w), (h * w * c, 1, w * c, c), "float32")
    entry: dict = {"pad_before": pb, "pad_after": pa, "fold": fo}
    res["fold"] = entry
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    try:
        tdesc = fold_descriptor(4, pb, pa, fo, FOLD)
        dst = TensorDescriptor()
        size = ctypes.c_size_t()
        lib.cudnnInitTransformDest(tdesc, src, dst, ctypes.byref(size))
        _, dims, strides = dst.get_nd()
        entry.update(dest_dims=list(dims), dest_strides=list(strides), dest_bytes=size.value)
        buf = torch.zeros(size.value // 4 + 1, device=dev)
        args = (handle, tdesc, ctypes.byref(one), src, ctypes.c_void_p(x.data_ptr()),
                ctypes.byref(zero), dst, ctypes.c_void_p(buf.data_ptr()))

        def go(args: tuple = args) -> None:
            lib.cudnnTransformTensorEx(*args)
        go()
        torch.cuda.synchronize()
        got = torch.as_strided(buf, (dims[0], dims[2], dims[3], dims[1]),
                               (strides[0], strides[2], strides[3], strides[1]))
        for o, r in ref.items():
            if tuple(got.shape) == tuple(r.shape):
                entry[f"max_abs_error_{o}"] = float((got - r).abs().max())
        entry["ms"] = timed(go)
        # and back: unfold the folded tensor into x's shape (the padding dropped?)
        udesc = fold_descriptor(4, pb, pa, fo, UNFOLD)
        back = TensorDescriptor()
        usize = ctypes.c_size_t()
        lib.cudnnInitTransformDest(udesc, dst, back, ctypes.byref(usize))
        _, bdims, bstrides = back.get_nd()
        entry.update(unfold_dims=list(bdims), unfold_strides=list(bstrides),
                     unfold_bytes=usize.value)
        ubuf = torch.zeros(usize.value // 4 + 1, device=dev)
        uargs = (handle, udesc, ctypes.byref(one), dst, ctypes.c_void_p(buf.data_ptr()),
                 ctypes.byref(zero), back, ctypes.c_void_p(ubuf.data_ptr()))

        def ungo(args: tuple = uargs) -> None:
            lib.cudnnTransformTensorEx(*args)
        ungo()
        torch.cuda.synchronize()
        if tuple(bdims) == (batch, c, h, w):
            un = torch.as_strided(ubuf, (batch, h, w, c), (bstrides[0], bstrides[2],
                                                          bstrides[3], bstrides[1]))
            entry["unfold_max_abs_error"] = float((un - x).abs().max())
        entry["unfold_ms"] = timed(ungo)
        # the padding dropped on the way back: negative pads, or a crop of rows
        neg = fold_descriptor(4, [-v for v in pb], [-v for v in pa], fo, UNFOLD)
        try:
            nback = TensorDescriptor()
            lib.cudnnInitTransformDest(neg, dst, nback, ctypes.byref(usize))
            _, ndims, nstrides = nback.get_nd()
            entry.update(neg_unfold_dims=list(ndims), neg_unfold_strides=list(nstrides))
            nbuf = torch.zeros(usize.value // 4 + 1, device=dev)
            nargs = (handle, neg, ctypes.byref(one), dst, ctypes.c_void_p(buf.data_ptr()),
                     ctypes.byref(zero), nback, ctypes.c_void_p(nbuf.data_ptr()))

            def nego(args: tuple = nargs) -> None:
                lib.cudnnTransformTensorEx(*args)
            nego()
            torch.cuda.synchronize()
            if tuple(ndims) == (batch, c, h, w):
                un = torch.as_strided(nbuf, (batch, h, w, c), (nstrides[0], nstrides[2],
                                                              nstrides[3], nstrides[1]))
                entry["neg_unfold_max_abs_error"] = float((un - x).abs().max())
            entry["neg_unfold_ms"] = timed(nego)
        except Exception as exc:  # noqa: BLE001
            entry["neg_unfold_error"] = f"{type(exc).__name__}: {exc}"
        # crop by rows: (m, 1, H, W*C) views, one cudnnTransformTensor
        hu, wu = bdims[2], bdims[3]
        crop_src = TensorDescriptor((batch, 1, h, w * c), (hu * wu * c, 1, wu * c, 1), "float32")
        crop_dst = TensorDescriptor((batch, 1, h, w * c), (h * w * c, 1, w * c, 1), "float32")
        cbuf = torch.zeros(batch * h * w * c, device=dev)
        src_ptr = ubuf.data_ptr() + 4 * (pb[2] * wu + pb[3]) * c
        cargs = (handle, ctypes.byref(one), crop_src, ctypes.c_void_p(src_ptr), ctypes.byref(zero),
                 crop_dst, ctypes.c_void_p(cbuf.data_ptr()))

        def crop(args: tuple = cargs) -> None:
            lib.cudnnTransformTensor(*args)
        crop()
        torch.cuda.synchronize()
        entry["crop_max_abs_error"] = float((cbuf.view(batch, h, w, c) - x).abs().max())
        entry["crop_ms"] = timed(crop)
    except Exception as exc:  # noqa: BLE001 - a probe reports what cuDNN says
        entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["traceback"] = traceback.format_exc(limit=3)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", nargs="+", choices=sorted(LAYERS), default=sorted(LAYERS))
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 32])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    handle = Handle(torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)
    results = [probe(n, b, handle) for n in args.layers for b in args.batch]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    for r in results:
        print(json.dumps({k: v for k, v in r.items()}, default=str)[:1500])
    return 0


if __name__ == "__main__":
    sys.exit(main())
