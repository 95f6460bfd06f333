"""``mucudnn.torch.report(model)``: what each converted layer runs, and how fast.

After a model's first training step (the step that plans and compares, Note
[never slower than native] in :mod:`.native`), the report lists per converted
layer and direction whether mucudnn's plan or PyTorch's own convolution runs,
the plan (micro-batches and workspace), the time of each in one harness and
PyTorch's workspace, with totals of what runs and of what native PyTorch
would run, and what the limit costs: the kernels whose PyTorch workspace is
over it, the time their plans add and the limit that would admit them; and
the model's step trial (Note [the whole-step trial]) and step guard (Note
[guarded steps]); how the planned launches replayed as CUDA graphs (Note
[replay after repeated addresses] in :mod:`mucudnn.exec.graph`); and, where a CUDA-graph
capture would run the other side (Note [captured steps run the GPU's choice]
in :mod:`.native`), that side. ``print(report(model))``
gives a table; ``as_dict()`` the data.

>>> import torch
>>> from torch import nn
>>> import mucudnn.torch as mt
>>> str(report(mt.convert(nn.Sequential(nn.Conv2d(3, 4, 3))))).splitlines()[0]
'mucudnn.torch report: 1 converted layer(s), 0 with measurements (first call on a GPU compares)'
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterable, Optional

from torch import nn

from ..backends import fold as _fold
from ..backends import pair as _pair
from ..backends import split as _split
from ..problem import Direction, Plan
from . import engine, native
from .modules import MucudnnConvMixin
from .step_guard import guard_of
from .step_trial import trial_of

__all__ = ["Report", "LayerReport", "report"]

_SHORT = {Direction.FORWARD: "fwd", Direction.BACKWARD_DATA: "bwd-data",
          Direction.BACKWARD_FILTER: "bwd-filter"}


@dataclasses.dataclass(frozen=True)
class LayerReport:
    """One converted layer at one input signature: per direction what runs."""

    name: str
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    dtype: str
    channels_last: bool
    directions: dict[str, dict[str, Any]]
    #: host ms of one forward and backward, (converted, PyTorch's); None: not timed
    #: (Note [host cost of a converted layer])
    host_ms: Optional[tuple[float, float]] = None
    #: a transposed convolution: ``x_shape`` is its output, the directions are its
    #: problem's, and its forward is ``bwd-data`` (Note [transposed convolutions])
    transposed: bool = False

    @property
    def ms(self) -> float:
        """Milliseconds of what runs, summed over the measured directions a
        training step runs (backward-data only where the input needs its gradient)."""
        return sum(d["ms"] for d in self.directions.values()
                   if d["ms"] is not None and d["in_step"])

    @property
    def torch_ms(self) -> float:
        """Milliseconds native PyTorch takes for the same directions."""
        return sum(d["torch_ms"] for d in self.directions.values()
                   if d["torch_ms"] is not None and d["in_step"])


@dataclasses.dataclass(frozen=True)
class Report:
    """Every converted layer's :class:`LayerReport`s (one per input signature
    met), and the modules converted but not yet measured."""

    layers: list[LayerReport]
    unmeasured: list[str]
    #: the model's step trial (Note [the whole-step trial]): the way kept
    #: (``"plans"``, ``"torch"``, None while it runs) and its step times; None: no trial
    step_trial: Optional[dict[str, Any]] = None
    #: what the first calls cost (Note [first-call seconds] in :mod:`.native`):
    #: ``signatures`` timed, their ``seconds``, the ``planning_seconds`` of it and
    #: the ``planned_signatures`` (those that run searched plans, not stand-ins);
    #: each signature once, however many layers share it;
    #: ``standin_signatures`` that run stand-ins now and the ``deferred_seconds`` that
    #: later calls spent planning them (Note [planning after the first step])
    first_calls: Optional[dict[str, Any]] = None
    #: the model's step guard (Note [guarded steps]): ``guarded_layers``, the
    #: converted layers that run torch.nn's call unchecked in training forwards
    #: like the last two checked ones; None: no guard
    step_guard: Optional[dict[str, Any]] = None
    #: the layers' planned launches as CUDA graphs (:func:`graph_counts`); None:
    #: no kernel of theirs replays
    replay: Optional[dict[str, float]] = None

    @property
    def total_ms(self) -> float:
        return sum(layer.ms for layer in self.layers)

    @property
    def total_torch_ms(self) -> float:
        return sum(layer.torch_ms for layer in self.layers)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        dirs = [d for layer in self.layers for d in layer.directions.values() if d["in_step"]]
        runs = [d["runs"] for d in dirs]
        # what the limit costs: kernels whose PyTorch workspace is over it
        over = [d for d in dirs if d["torch_workspace"] is not None
                and not native.within_limit(d["torch_workspace"], d["limit"])]
        return {
            "layers": [dataclasses.asdict(layer) | {"ms": layer.ms, "torch_ms": layer.torch_ms}
                       for layer in self.layers],
            "unmeasured": list(self.unmeasured),
            "step_trial": self.step_trial,
            "step_guard": self.step_guard,
            "replay": self.replay,
            "first_calls": self.first_calls,
            "totals": {"ms": self.total_ms, "torch_ms": self.total_torch_ms,
                       "kernels": len(runs), "torch_kernels": runs.count(native.TORCH)},
            "over_limit": {
                "kernels": len(over),
                "ms": sum(d["plan_ms"] - d["torch_ms"] for d in over
                          if d["plan_ms"] is not None and d["torch_ms"] is not None),
                "largest_torch_workspace": max((d["torch_workspace"] for d in over),
                                               default=None)},
        }

    def __str__(self) -> str:
        head = (f"mucudnn.torch report: {len({layer.name for layer in self.layers} | set(self.unmeasured))}"
                f" converted layer(s), {len({layer.name for layer in self.layers})} with "
                "measurements (first call on a GPU compares)")
        if not self.layers:
            return head
        rows = [head, "",
                "| layer | x | direction | runs | plan | ms | PyTorch ms | PyTorch workspace |",
                "|---|---|---|---|---|---|---|---|"]
        for layer in self.layers:
            x = "x".join(str(v) for v in layer.x_shape) + (" cl" if layer.channels_last else "") \
                + (" (transposed: its output)" if layer.transposed else "")
            for dname, d in layer.directions.items():
                dname += "" if d["in_step"] else " (not in a step)"
                runs = d["runs"] if d["captured"] == d["runs"] \
                    else f"{d['runs']} ({d['captured']} captured)"
                rows.append(f"| {layer.name} | {x} | {dname} | {runs} | {d['plan']} | "
                            f"{_ms(d['ms'])} | {_ms(d['torch_ms'])} | {_mib(d['torch_workspace'])} |")
            if layer.host_ms is not None:
                rows.append(f"| {layer.name} | {x} | host, fwd+bwd | | | {_ms(layer.host_ms[0])} | "
                            f"{_ms(layer.host_ms[1])} | |")
        data = self.as_dict()
        t = data["totals"]
        rows.append(f"| total | | | {t['torch_kernels']} of {t['kernels']} PyTorch's | | "
                    f"{_ms(t['ms'])} | {_ms(t['torch_ms'])} | |")
        over = data["over_limit"]
        if over["kernels"]:
            rows += ["", f"PyTorch's workspace is over the limit in {over['kernels']} kernel(s); "
                         f"their plans take {over['ms']:+.3f} ms against PyTorch's calls, which "
                         f"a limit of {_mib(over['largest_torch_workspace'])} would admit."]
        if self.first_calls is not None:
            f = self.first_calls
            rows += ["", f"first calls: {f['signatures']} signature(s) took {f['seconds']:.2f} s, "
                         f"{f['planning_seconds']:.2f} s of it searching and timing plans "
                         f"({f['planned_signatures']} signature(s) planned)"]
            if f["deferred_seconds"] or f["standin_signatures"]:
                rows.append(f"planned after the first step: {f['deferred_seconds']:.2f} s; "
                            f"{f['standin_signatures']} signature(s) still run stand-ins")
        if self.step_trial is not None:
            rows += ["", _trial_line(self.step_trial)]
        if self.step_guard is not None and self.step_guard["guarded_layers"]:
            rows.append(f"step guard: {self.step_guard['guarded_layers']} layer(s) run "
                        "torch.nn's call unchecked in training forwards like the last two")
        if self.replay is not None and self.replay["captures"] + self.replay["direct"]:
            r = self.replay
            rows.append(f"replay: planned launches {r['replays']} replayed as CUDA graphs, "
                        f"{r['captures']} of them captured, {r['direct']} launched directly"
                        + (f"; {r['failed']} kernel(s) launch directly after a failed capture"
                           if r["failed"] else ""))
            rows.append(f"replay host time: captures {_ms(1e3 * r['capture_s'])} ms "
                        f"({_ms(1e3 * r['instantiate_s'])} ms of it instantiating), graph "
                        f"launches {_ms(1e3 * r['replay_s'])} ms, direct launches "
                        f"{_ms(1e3 * r['direct_s'])} ms (Note [what replay costs the host])")
        return "\n".join(rows)


def _trial_line(trial: dict[str, Any]) -> str:
    """One line on the step trial (Note [the whole-step trial])."""
    med = {k: statistics.median(v) if v else None for k, v in trial["step_ms"].items()}
    times = (f"median step {_ms(med['plans'])} ms with the plans, {_ms(med['torch'])} ms with "
             "PyTorch's convolutions where they fit")
    if trial["kept"] is None:
        return f"step trial: running ({times})"
    what = "the plans" if trial["kept"] == "plans" else "PyTorch's convolutions where they fit"
    return f"step trial: kept {what} ({times})"


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}"


def _mib(v: Optional[int]) -> str:
    return "-" if v is None else f"{v / 2**20:.1f} MiB"


def _plan_text(plan: Optional[Plan]) -> str:
    """A plan's micro-batch sizes, the rewrites its configurations run (Note
    [split groups], Note [folded first layers], Note [micro-batches in
    pairs]) and its workspace:
    ``"2 x 32 (split by 8), 9.0 MiB"``."""
    if plan is None:
        return "-"
    ways = []
    for m in plan.micro_batches:
        sp, fo = _split.parse_split_id(m.algo), _fold.split_fold_id(m.algo)
        sl = _split.parse_slice_id(m.algo)
        pa = _pair.parse_pair_id(m.algo)
        if pa is not None:
            ways.append(f"in pairs of {2 * pa[0]} calls on two streams")
        elif sp is not None:
            ways.append(f"split by {sp[0]}")
        elif sl is not None:
            ways.append(f"split by {sl[0]} as slices")
        elif fo is not None:
            ways.append(f"folded by {fo[0]}")
    how = f" ({', '.join(dict.fromkeys(ways))})" if ways else ""
    return f"{plan.describe()}{how}, {plan.workspace_bytes / 2**20:.1f} MiB"


#: why a direction runs PyTorch's call under the step trial's way
TRIAL_REASON = "the whole-step trial runs PyTorch's call where it fits (Note [the whole-step trial])"


def _trial_way(choices: dict[Direction, native.Choice], skip: Optional[Direction],
               torch_way: bool) -> dict[Direction, native.Choice]:
    """``choices`` as the layer runs them: while the model's step trial runs
    PyTorch's way (``torch_way``), a layer whose PyTorch workspace fits in
    every direction a step runs (all but ``skip``) runs PyTorch's call in all of them (as
    :class:`~mucudnn.torch.modules.MucudnnConvMixin` does)."""
    if not (torch_way and native.fits_in_step(choices, skip)):
        return choices
    return {d: dataclasses.replace(c, runs=native.TORCH, reason=TRIAL_REASON, on_gpu=c.captured)
            if c.runs == native.MUCUDNN and d is not skip else c
            for d, c in choices.items()}


def _directions(rec: native.Record, torch_way: bool = False) -> dict[str, dict[str, Any]]:
    out = {}
    skip = rec.skip
    for d, c in _trial_way(rec.choices, skip, torch_way).items():
        plan = rec.plans.get(d)
        out[_SHORT[d]] = {
            "runs": c.runs,
            "plan": "PyTorch's own" if c.runs == native.TORCH
            else ("stand-in: " if rec.standin and plan is not None else "") + _plan_text(plan),
            "configs": [] if plan is None else list(dict.fromkeys(
                str(m.algo) for m in plan.micro_batches)),
            "ms": c.torch_ms if c.runs == native.TORCH else c.plan_ms,
            "plan_ms": c.plan_ms,
            "torch_ms": c.torch_ms,
            "torch_workspace": c.torch_workspace,
            "plan_workspace": None if plan is None else plan.workspace_bytes,
            "limit": c.limit,
            "reason": c.reason,
            # Note [captured steps run the GPU's choice] in mucudnn/torch/native.py
            "captured": c.captured,
            "in_step": d is not skip,
        }
    return out


def report(model: nn.Module) -> Report:
    """Per converted layer of ``model``: what runs (mucudnn's plan or PyTorch's
    own convolution), its time, PyTorch's time and workspace, with totals.
    Each layer is listed with the signatures it ran (layers of one shape,
    input and options share a convolution and appear with the same figures).
    While the model's step trial runs PyTorch's way (Note [the
    whole-step trial]), a layer that fits the limit shows PyTorch's call in
    every direction a step runs, as it then runs. Call it after the first
    training step on a GPU.

    >>> import torch.nn as nn
    >>> report(nn.Linear(2, 2)).as_dict()["totals"]["kernels"]
    0
    """
    layers: list[LayerReport] = []
    unmeasured: list[str] = []
    used: dict[int, native.Record] = {}
    trials = [t for t in (trial_of(m) for m in model.modules()) if t is not None]
    torch_way = bool(trials) and trials[0].torch
    keys: list[tuple] = []
    for name, module in model.named_modules():
        if not isinstance(module, MucudnnConvMixin):
            continue
        keys += module._mu_seen or ()
        found = [r for r in (native.record(k) for k in module._mu_seen or ()) if r is not None]
        if not found:
            unmeasured.append(name)
        for r in found:
            used[id(r)] = r
            layers.append(LayerReport(name, r.x_shape, r.w_shape, r.dtype, r.channels_last,
                                      _directions(r, torch_way), r.host, r.transposed))
    guard = guard_of(model)
    convs = {id(w.conv): w.conv for w in (engine.warm_record(k) for k in keys) if w is not None}
    return Report(layers, unmeasured, trials[0].as_dict() if trials else None,
                  _first_calls(list(used.values())),
                  None if guard is None else {"guarded_layers": len(guard.guarded)},
                  graph_counts(convs.values()))


def graph_counts(convs: Iterable[Any]) -> Optional[dict[str, float]]:
    """Over the kernels of the convolutions ``convs`` that replay planned
    launches as CUDA graphs once their addresses repeat (Note [replay after
    repeated addresses] in :mod:`mucudnn.exec.graph`): how many kernels, and
    their graphs captured, launches replayed (a capture's included), launches
    made directly and kernels whose capture failed; and the host seconds of
    the captures, their instantiation alone, graph launches and direct
    launches (``capture_s``, ``instantiate_s``, ``replay_s``, ``direct_s``:
    Note [what replay costs the host]); None where none replays.

    >>> graph_counts([]) is None
    True
    """
    caches = [g for conv in convs for d in Direction if (g := conv.kernel(d).graphs) is not None]
    if not caches:
        return None
    return {"kernels": len(caches), "captures": sum(g.captures for g in caches),
            "replays": sum(g.replays for g in caches), "direct": sum(g.direct for g in caches),
            "failed": sum(g.failed is not None for g in caches),
            "capture_s": sum(g.capture_s for g in caches),
            "instantiate_s": sum(g.instantiate_s for g in caches),
            "replay_s": sum(g.replay_s for g in caches),
            "direct_s": sum(g.direct_s for g in caches)}


def _first_calls(recs: list[native.Record]) -> Optional[dict[str, Any]]:
    """Report.first_calls of ``recs`` (those whose first call was timed); None
    where none was."""
    timed = [r for r in recs if r.first_s is not None]
    if not timed:
        return None
    return {"signatures": len(timed), "seconds": sum(r.first_s or 0.0 for r in timed),
            "planning_seconds": sum(r.plan_s or 0.0 for r in timed),
            "planned_signatures": sum(1 for r in timed if r.plans and not r.standin),
            "standin_signatures": sum(1 for r in timed if r.standin),
            "deferred_seconds": sum(r.deferred_s or 0.0 for r in timed)}
