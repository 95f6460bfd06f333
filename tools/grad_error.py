#!/usr/bin/env python
"""One training step's gradients against float64: native PyTorch and a converted model.

The 30-step loss check of ``tools/train_bench.py`` compares two training runs
whose losses drift apart whichever convolution algorithms differ (Note [loss
noise floor] there). This asks the question under it directly (Note
[gradient error]): is one step's gradient of a model converted by
``mucudnn.torch`` as accurate as native PyTorch's? For a torchvision model (or
``tiny``) and one batch of synthetic data, it computes the loss and every
parameter's gradient three ways from the same weights:

* ``float64``: the model and data in double precision (the reference),
* ``native``: PyTorch's own convolutions in ``--precision``
  (``cudnn.benchmark`` on, as train_bench's native runs),
* ``converted``: ``mucudnn.torch.convert(model, workspace_limit=--workspace)``,

each after one untimed warm-up pass (planning, PyTorch's benchmark), in
training mode (batch norm on batch statistics). Per convolution layer it
reports the relative error ``||g - g64|| / ||g64||`` of native's and the
converted model's weight gradient, their ratio and (converted) the layer's
backward-filter and backward-data plans; then the same over all parameters,
and the loss's relative error. ``--json`` keeps every number. The helpers of
one step against float64 that ``tools/zoo_bench.py --grad-check`` uses live
here too (Note [gradient check]).

Examples::

    python tools/grad_error.py --models resnet18 resnet50 --precision fp32strict --deterministic
    python tools/grad_error.py --models resnet50 --precision fp32cl --json out/grad.json
    python tools/grad_error.py --device cpu --models tiny --batch 4   # smoke test
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn


import train_bench as tb  # model names, batch sizes, argument parsers
import train_steps as ts  # the models, the machine's description
import mucudnn.torch as mt
from mucudnn.torch import engine
from mucudnn.torch.standin import STANDIN_STEPS

# Note [gradient error]
# ~~~~~~~~~~~~~~~~~~~~~
# Two training runs that differ only in their convolution algorithms round
# differently at every step, and SGD on random labels amplifies that
# (train_bench's Note [loss noise floor]); after 30 steps the losses'
# difference says little about either run's accuracy. One step from the same
# weights does: float64 is the reference, and the converted model's gradients
# should be as close to it as native's (each algorithm is exact to its
# precision; micro-batches only change the summation order of the weight
# gradient, accumulated in the output's precision). A layer whose converted
# error is far above native's would be a real defect; a step-1 loss difference
# larger than another algorithm choice makes, with gradients as accurate as
# native's, is the amplification, not the gradients.

PRECISIONS = ("fp32strict", "fp32", "fp32cl")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--models", nargs="+", choices=tb.MODELS, default=["resnet18"])
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32strict",
                    help="fp32strict: TF32 off; fp32: TF32 on; fp32cl: TF32 on, channels_last")
    ap.add_argument("--batch", type=tb._positive, default=None,
                    help="mini-batch size (default per model: %s)" % tb.DEFAULT_BATCH)
    ap.add_argument("--workspace", type=tb.parse_size, default=64 << 20,
                    help="the converted model's workspace limit per kernel (default 64MiB)")
    ap.add_argument("--policy", type=tb.parse_policy, default=None,
                    help="mucudnn batch policy (default: mucudnn's)")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.backends.cudnn.deterministic for native and converted")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--top", type=tb._positive, default=8,
                    help="layers listed, largest converted/native error ratio first")
    ap.add_argument("--json", default=None, help="write every number here")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA GPU (use --device cpu for a smoke test)")
    return args


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``||got - ref|| / ||ref||`` in float64 (``||got||`` where ref is 0).

    >>> rel_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]))
    0.0
    >>> round(rel_error(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.5])), 6)
    0.09245
    """
    g, r = got.detach().double().cpu(), ref.detach().double().cpu()
    den = float(r.norm())
    num = float((g - r).norm())
    return num / den if den else num


# -- one step of a model against float64, as tools/zoo_bench.py checks it ---------------------
# Note [gradient check]
# ~~~~~~~~~~~~~~~~~~~~~
# From one set of initial weights and one batch, one step's gradients of
# native and converted (in the precision under test) are each compared with
# those of the native model in float64 on the same device (no autocast; TF32
# does not apply to float64), never with each other: both round differently
# from the exact gradient, and the question is whether converted rounds more.
# Batch norm stays in training mode (every run sees the same batch), but
# dropout and stochastic depth are switched off: their random masks would
# differ between the runs, an error no convolution makes. Each gradient is
# that of the last of :data:`PASSES` passes over the batch, with no optimizer
# step between them: a converted model's first pass runs untimed stand-ins and
# the next STANDIN_STEPS measure and plan (Note [planning after the first
# step] in mucudnn/torch/standin.py), so the last pass runs what the steady
# steps of training run (native's first pass benchmarks and runs the chosen
# algorithms already). The converted first pass's gradients, the stand-ins',
# are compared with float64 as well (zoo_bench's ``converted_first_step``).
# Kinks make the errors noisy: a pre-activation within rounding of 0 (ReLU) or a near-tie in max
# pooling can fall on the other side than in float64, moving a whole gradient
# element. On the CPU, tiny at 64x64 (batch 8) had one such ReLU flip in the
# converted float32 forward and none in native's, so features.0's error was
# 3.6e-3 against native's 7e-6, while the converted model in float64 matched
# native float64 to 2e-14: read one layer's or one model's ratio with that in
# mind, the median over layers and models less so. At random initialisation
# one step's gradient is ill-conditioned, so the absolute errors are large and
# alike for both sides: ResNet-18 at batch 8 had 0.10 (fp32cl, TF32) and 0.37
# (amp) on the H200, and 6.5e-4 (float32 without TF32) on the CPU. The
# converted/native ratio is the number to read. The batch is the timed
# steps' unless --grad-batch says otherwise: which layers exceed the limit,
# and so run plans rather than PyTorch's call, depends on it (at a small batch
# both sides may run the same kernels), and ``planned_kernels`` counts the
# converted step's plans.
def deterministic_train(model: nn.Module) -> nn.Module:
    model.train()
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) or type(m).__name__ == "StochasticDepth":
            m.eval()
    return model


#: Forward and backward passes over one batch before a gradient is read (Note
#: [gradient check]): the first, then the steps that replace a converted
#: model's stand-ins, then the one read.
PASSES = 2 + STANDIN_STEPS


def _passes(model: nn.Module, x: torch.Tensor, t: torch.Tensor, amp: bool = False,
            passes: int = PASSES) -> tuple[torch.Tensor, dict]:
    """``passes`` forward and backward passes under bfloat16 autocast with
    ``amp`` (Note [gradient check]): the last's loss, its gradients left on
    the parameters, and the first's gradients (float64).

    >>> m = nn.Linear(2, 3)
    >>> loss, first = _passes(m, torch.ones(4, 2), torch.zeros(4, dtype=torch.long), passes=2)
    >>> bool(torch.equal(first["weight"], m.weight.grad.double()))  # the same math each pass
    True
    """
    first: dict = {}
    for i in range(passes):
        model.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), t)
        loss.backward()
        if i == 0:
            first = _grads_of(model)
    return loss, first


def _grads_of(model: nn.Module) -> dict:
    """Every parameter's gradient now, in float64."""
    return {n: p.grad.detach().double() for n, p in model.named_parameters() if p.grad is not None}


def pass_grads(model: nn.Module, x: torch.Tensor, t: torch.Tensor, amp: bool,
               passes: int = PASSES) -> tuple[dict, dict]:
    """Every parameter's gradient (float64) of the first and of the last of
    ``passes`` forward and backward passes (:func:`_passes`)."""
    _, first = _passes(model, x, t, amp, passes)
    return first, _grads_of(model)


def grad_errors(grads: dict, ref: dict, conv_keys: Sequence[str]) -> dict:
    """Relative errors of ``grads`` against ``ref``: per conv weight (median,
    max) and of all parameters together.

    >>> ref = {"c.weight": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])}
    >>> e = grad_errors({"c.weight": torch.tensor([3.0, 4.5]), "b": torch.tensor([0.0])},
    ...                 ref, ["c.weight"])
    >>> e["conv_median"], e["all"]
    (0.1, 0.1)
    """
    conv = [rel_error(grads[k], ref[k]) for k in conv_keys]
    num = sum(float((grads[k].cpu() - ref[k].cpu()).norm()) ** 2 for k in ref)
    den = sum(float(ref[k].cpu().norm()) ** 2 for k in ref)
    return {"conv_median": statistics.median(conv) if conv else None,
            "conv_max": max(conv) if conv else None, "conv_layers": conv,
            "all": math.sqrt(num / den) if den else math.sqrt(num)}


def planned_kernels(model: nn.Module) -> int | None:
    """How many of a converted model's kernels (layer and direction) ran
    mucudnn's plans rather than PyTorch's call; None where its report lists no
    kernel (off the GPU nothing is compared with PyTorch's call) or the
    installed mucudnn has no report."""
    try:
        totals = mt.report(model).as_dict()["totals"]
    except Exception:  # noqa: BLE001 - a count for the record; the errors stand without it
        return None
    if not totals.get("kernels"):
        return None
    return int(totals["kernels"]) - int(totals["torch_kernels"])


def _grads(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> tuple[float, dict]:
    """The loss and every parameter's gradient of the last of :data:`PASSES`
    forward and backward passes (:func:`_passes`)."""
    loss, _ = _passes(model, x, t)
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                  if p.grad is not None}


def _plans(model: nn.Module) -> dict[str, dict[str, str]]:
    """Per converted conv layer: its backward plans ("direction": "sizes: algos"),
    from the Convolution objects mucudnn.torch made for the layer's shapes."""
    convs = list(engine._CONVS.values())
    out: dict[str, dict[str, str]] = {}
    for name, m in model.named_modules():
        shape = getattr(m, "_grad_error_input", None)
        if shape is None:
            continue
        w = tuple(m.weight.shape)
        for c in convs:
            p = c.problem
            if (tuple(p.x_dims) == shape and tuple(p.w_dims) == w
                    and tuple(p.stride) == tuple(m.stride) and tuple(p.padding) == tuple(m.padding)):
                out[name] = {str(d): f"{plan.describe()}: "
                             + ", ".join(sorted({str(mb.algo) for mb in plan.micro_batches}))
                             for d, plan in c.plans.items()}
                break
    return out


def _record_inputs(model: nn.Module) -> list[Any]:
    def hook(mod: nn.Module, inputs: tuple) -> None:
        mod._grad_error_input = tuple(inputs[0].shape)  # type: ignore[assignment]
    return [m.register_forward_pre_hook(hook) for m in model.modules()
            if isinstance(m, (nn.Conv2d, nn.Conv3d))]


def compare(args: argparse.Namespace, name: str, device: torch.device) -> dict:
    """One model: the loss and gradient errors of native and converted."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = args.deterministic
    tf32 = args.precision != "fp32strict"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    fmt = torch.channels_last if args.precision == "fp32cl" else torch.contiguous_format
    torch.manual_seed(args.seed)
    base = ts.build_model(name).train()
    batch = args.batch or tb.DEFAULT_BATCH[name]
    size = ts.IMAGE_SIZE.get(name, 224)
    gen = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    t = torch.randint(0, ts.NUM_CLASSES, (batch,), generator=gen)

    ref_model = copy.deepcopy(base).double().to(device)
    loss64, g64 = _grads(ref_model, x.double().to(device), t.to(device))
    del ref_model

    xs = x.to(device).contiguous(memory_format=fmt)
    targets = t.to(device)
    native = copy.deepcopy(base).to(device).to(memory_format=fmt)
    loss_n, g_n = _grads(native, xs, targets)
    del native
    options: dict[str, Any] = {"workspace_limit": args.workspace}
    if args.policy is not None:
        options["policy"] = args.policy
    converted = mt.convert(copy.deepcopy(base).to(device).to(memory_format=fmt), **options)
    hooks = _record_inputs(converted)
    loss_c, g_c = _grads(converted, xs, targets)
    for h in hooks:
        h.remove()
    plans = _plans(converted)

    layers = []
    for lname, m in base.named_modules():
        if not isinstance(m, (nn.Conv2d, nn.Conv3d)):
            continue
        key = f"{lname}.weight"
        en, ec = rel_error(g_n[key], g64[key]), rel_error(g_c[key], g64[key])
        layers.append({"layer": lname, "weight": list(m.weight.shape), "native": en,
                       "converted": ec, "ratio": ec / en if en else math.inf,
                       "plans": plans.get(lname, {})})

    def total(gs: dict) -> float:
        num = sum(float((gs[k].double().cpu() - g64[k].double().cpu()).norm()) ** 2 for k in g64)
        den = sum(float(g64[k].double().cpu().norm()) ** 2 for k in g64)
        return math.sqrt(num / den)

    return {"model": name, "precision": args.precision, "batch": batch,
            "deterministic": args.deterministic,
            "loss": {"float64": loss64, "native": loss_n, "converted": loss_c,
                     "native_rel": abs(loss_n - loss64) / abs(loss64),
                     "converted_rel": abs(loss_c - loss64) / abs(loss64),
                     "converted_vs_native": abs(loss_c - loss_n) / abs(loss_n)},
            "all_parameters": {"native": total(g_n), "converted": total(g_c)},
            "conv_layers": layers}


def summary_lines(r: dict, top: int) -> Iterable[str]:
    """The printed form of one model's comparison."""
    ls = r["conv_layers"]
    yield (f"\n{r['model']} {r['precision']} batch {r['batch']}"
           f"{' deterministic' if r['deterministic'] else ''}: loss rel. error native "
           f"{r['loss']['native_rel']:.2e}, converted {r['loss']['converted_rel']:.2e} "
           f"(converted vs native {r['loss']['converted_vs_native']:.2e})")
    a = r["all_parameters"]
    yield f"all parameters' gradient, rel. error: native {a['native']:.2e}, converted {a['converted']:.2e}"
    if ls:
        med_n = statistics.median(v["native"] for v in ls)
        med_c = statistics.median(v["converted"] for v in ls)
        yield (f"conv weight gradients ({len(ls)} layers), rel. error median: native "
               f"{med_n:.2e}, converted {med_c:.2e}; max: native "
               f"{max(v['native'] for v in ls):.2e}, converted {max(v['converted'] for v in ls):.2e}")
        yield "| layer | weight | native | converted | ratio | converted plans |"
        yield "|---|---|---|---|---|---|"
        for v in sorted(ls, key=lambda v: -v["ratio"])[:top]:
            plans = "; ".join(f"{d} {p}" for d, p in v["plans"].items())
            yield (f"| {v['layer']} | {'x'.join(map(str, v['weight']))} | {v['native']:.2e} | "
                   f"{v['converted']:.2e} | {v['ratio']:.2f} | {plans} |")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    report: dict[str, Any] = {"environment": ts.environment(device),
                              "args": {k: v for k, v in vars(args).items()}, "models": []}
    for name in args.models:
        r = compare(args, name, device)
        report["models"].append(r)
        for line in summary_lines(r, args.top):
            print(line, flush=True)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
