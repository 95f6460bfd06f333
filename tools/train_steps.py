"""The training steps the benchmark tools share.

Models (torchvision's by name, ``tiny`` for CPU smoke tests), one mode's
training state and step (:class:`TrainJob`: native, or converted by
``mucudnn.torch.convert`` in WR or WD mode), per-step timers, rounds of
interleaved steps (Note [interleaved steps] in train_bench.py) and the
machine's description, and a host profile of one call (:func:`host_profile`).
``train_bench.py``, ``zoo_bench.py``,
``step_profile.py``, ``grad_error.py`` and ``ddp_bench.py`` build on it.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import gc
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import mucudnn
import mucudnn.torch as mt
from mucudnn.torch import settings as mt_settings
from mucudnn.torch.report import graph_counts

try:  # only the torchvision models need it
    import torchvision
except ImportError:  # pragma: no cover - depends on the machine
    torchvision = None

MODES = ("native", "wr", "wd", "native-heur")
#: modes that run PyTorch's own convolutions
NATIVE_MODES = ("native", "native-heur")
PRECISIONS = ("fp32", "amp", "fp32strict", "fp32cl")
#: precisions whose model and inputs are channels_last
CHANNELS_LAST = ("amp", "fp32cl")
EXECUTIONS = ("eager", "graph")
IMAGE_SIZE = {"tiny": 32}
NUM_CLASSES = 1000


class TinyCNN(nn.Module):
    """A small CNN for CPU smoke tests (conv, BN, ReLU, pooling, a grouped conv)."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1, groups=2), nn.ReLU(),
            nn.Conv2d(16, 16, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


def build_model(name: str, num_classes: int = NUM_CLASSES) -> nn.Module:
    if name == "tiny":
        return TinyCNN(num_classes)
    if torchvision is None:
        raise RuntimeError(f"model {name!r} needs torchvision (pip install torchvision)")
    return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)


# -- one mode's training ---------------------------------------------------------------------
class Timer:
    """Per-step times: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def start(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, begin: Any) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((begin, e))
        else:
            self.marks.append((begin, time.perf_counter()))

    def times_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.marks]
        return [(b - a) * 1e3 for a, b in self.marks]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_bytes(device: torch.device) -> int | None:
    return int(torch.cuda.mem_get_info(device)[0]) if device.type == "cuda" else None


def cleanup(device: torch.device) -> None:
    """Free what earlier runs held: mucudnn's workspace and Convolutions (plans
    come back from the benchmark cache; backends and their handles are kept),
    torch's cached blocks."""
    gc.collect()
    sync(device)
    mt.release_workspace()
    mt.clear(backends=False)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _where(file: str, line: int, name: str) -> str:
    """A profiled function as ``path:line(name)``, the path from its package on
    (``torch/...``, ``mucudnn/...``, ``tools/...``) rather than the machine's.

    >>> _where("/venv/lib/site-packages/torch/nn/modules/conv.py", 548, "forward")
    'torch/nn/modules/conv.py:548(forward)'
    >>> _where("/work/tree/mucudnn/torch/native.py", 9, "calibrate")
    'mucudnn/torch/native.py:9(calibrate)'
    """
    path = file.replace(os.sep, "/")
    for marker in ("/site-packages/", "/dist-packages/", "/mucudnn/", "/tools/"):
        i = path.rfind(marker)
        if i >= 0:
            path = path[i + 1:] if marker in ("/mucudnn/", "/tools/") else path[i + len(marker):]
            break
    return f"{path}:{line}({name})"


def host_profile(fn: Any, top: int) -> tuple[Any, dict[str, list[dict]]]:
    """``fn()`` under cProfile: its result, and its ``top`` functions by
    cumulative host time (``"cumulative"``: the calls that contain the time)
    and by their own time (``"self"``: where it is spent, library calls
    included), each row ``function``, ``calls``, ``self_s``, ``cumulative_s``.
    cProfile slows Python-heavy code, so times under it are not comparable
    with unprofiled ones; the ranking says where the time goes.

    >>> r, rows = host_profile(lambda: sorted(range(1000)), 3)
    >>> r[:3], sorted(rows), all(len(v) <= 3 for v in rows.values())
    ([0, 1, 2], ['cumulative', 'self'], True)
    """
    prof = cProfile.Profile()
    result = prof.runcall(fn)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]

    def ranked(column: int) -> list[dict]:
        best = sorted(stats.items(), key=lambda kv: kv[1][column], reverse=True)[:top]
        return [{"function": _where(*where), "calls": int(nc), "self_s": round(tt, 4),
                 "cumulative_s": round(ct, 4)} for where, (_, nc, tt, ct, _) in best]
    return result, {"cumulative": ranked(3), "self": ranked(2)}


def prepare(args: argparse.Namespace, name: str, mode: str, precision: str,
            init_state: dict, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = build_model(name)
    model.load_state_dict(init_state)
    model = model.to(device)
    if precision in CHANNELS_LAST:
        model = model.to(memory_format=torch.channels_last)
    if mode == "wr":
        mt.convert(model, workspace_limit=args.workspace, policy=args.policy,
                   backend=args.backend)
    elif mode == "wd":
        mt.convert(model, mode="wd", total_workspace=args.total_workspace, policy=args.policy,
                   backend=args.backend)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return model, opt


class TrainJob:
    """One mode's training state: its model and optimizer (from :func:`prepare`),
    a static input batch refilled from its own generator before every step, and
    the step itself, run eagerly or, for ``graph`` execution, replayed from a
    ``torch.cuda.CUDAGraph`` captured after the warm-up (:meth:`warm_up`).

    The backend flags of its mode and precision (:meth:`set_flags`) are set on
    construction and by :meth:`warm_up`; code that interleaves several jobs
    sets them again before each job's steps."""

    def __init__(self, args: argparse.Namespace, name: str, mode: str, precision: str,
                 execution: str, batch: int, init_state: dict, device: torch.device) -> None:
        self.mode, self.precision, self.execution = mode, precision, execution
        self.device = device
        self.graphed = execution == "graph"
        self.amp = precision == "amp"
        self.deterministic = bool(getattr(args, "deterministic", False))
        self.set_flags()
        self.model, self.opt = prepare(args, name, mode, precision, init_state, device)
        size = IMAGE_SIZE.get(name, 224)
        fmt = torch.channels_last if precision in CHANNELS_LAST else torch.contiguous_format
        self.x = torch.empty(batch, 3, size, size, device=device, memory_format=fmt)
        self.t = torch.empty(batch, dtype=torch.long, device=device)
        self.gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_loss: torch.Tensor | None = None

    def set_flags(self) -> None:
        """cudnn.benchmark per mode (Note [loss noise floor] in train_bench.py), TF32
        per precision, cudnn.deterministic per ``--deterministic`` (Note
        [deterministic loss check] there)."""
        torch.backends.cudnn.benchmark = self.mode != "native-heur"
        torch.backends.cudnn.deterministic = self.deterministic
        tf32 = self.precision != "fp32strict"
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32

    def next_batch(self) -> None:
        self.x.normal_(generator=self.gen)
        self.t.random_(0, NUM_CLASSES, generator=self.gen)

    def _eager_step(self) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=not self.graphed)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp,
                            cache_enabled=not self.graphed):
            loss = F.cross_entropy(self.model(self.x), self.t)
        loss.backward()
        self.opt.step()
        return loss

    def warm_up(self, steps: int) -> tuple[list[torch.Tensor], float | None]:
        """``steps`` eager steps on fresh batches (on a side stream before a
        capture), then the capture for ``graph`` execution. Returns the
        warm-up losses and the seconds the first step took."""
        self.set_flags()
        losses: list[torch.Tensor] = []
        first_step_s = None
        t0 = time.perf_counter()
        side = torch.cuda.Stream(self.device) if self.graphed else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            for i in range(steps):
                self.next_batch()
                losses.append(self._eager_step().detach().float())
                if i == 0:
                    sync(self.device)
                    first_step_s = time.perf_counter() - t0
        if side is not None:
            torch.cuda.current_stream(self.device).wait_stream(side)
        if self.graphed:
            self.opt.zero_grad(set_to_none=True)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_loss = self._eager_step()
        return losses, first_step_s

    def step(self) -> torch.Tensor:
        """One training step on the current batch (:meth:`next_batch` first);
        its loss."""
        if self.graph is not None:
            self.graph.replay()
            assert self.static_loss is not None
            return self.static_loss
        return self._eager_step()

    def timed_steps(self, steps: int, timer: Timer) -> list[torch.Tensor]:
        """``steps`` steps on fresh batches, each timed by ``timer`` (the batch
        refill outside the interval); their losses."""
        losses = []
        for _ in range(steps):
            self.next_batch()
            begin = timer.start()
            loss = self.step()
            timer.stop(begin)
            losses.append(loss.detach().float().clone())
        return losses

    def release(self) -> None:
        """Drop the graph, model, optimizer and tensors (for :func:`cleanup`)."""
        self.graph = self.static_loss = None
        self.model = self.opt = self.x = self.t = None  # type: ignore[assignment]


# -- interleaved rounds (Note [interleaved steps] in train_bench.py) -----------------------------
# Note [balanced round order]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Within a round the jobs run one after another, so a clock or a host that
# drifts during the round favours whichever job runs first of a pair. Rotating
# the order by one each round puts every job in every place equally often, and
# for two jobs also each before the other equally often. For three or more a
# rotation alone does not: in [0, 1, 2], [1, 2, 0], [2, 0, 1] job 0 precedes
# job 1 in two rounds of three (zoo_bench's native before converted, with its
# A/A control as the third side). So the rounds go through the n rotations of
# the order, then through the n rotations of the order reversed, each pair
# then meeting in either order n times in 2n rounds. The reversed rotations
# start where no round begins with the job that ended the round before it, so
# that, as under the rotation alone, each turn of three jobs or more follows
# another job's steps. (Two jobs alternate [0, 1], [1, 0]: balanced, but each
# round begins with the job that ended the one before, which no order of two
# avoids without putting one job always first.)
def round_order(n: int, round_index: int) -> list[int]:
    """The order of ``n`` jobs in round ``round_index`` (Note [balanced round
    order]): rotated by one each round; for three jobs or more, after the n
    rotations come the n rotations of the reversed order.

    >>> [round_order(2, r) for r in range(4)]
    [[0, 1], [1, 0], [0, 1], [1, 0]]
    >>> [round_order(3, r) for r in range(7)]
    [[0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0], [1, 0, 2], [0, 2, 1], [0, 1, 2]]
    """
    if n <= 0:
        return []
    k = round_index % n
    if n < 3 or (round_index // n) % 2 == 0:
        return list(range(k, n)) + list(range(k))
    return [(n - 1 - k - i) % n for i in range(n)]


def balanced_rounds(rounds: int, n: int) -> int:
    """The fewest rounds, at least ``rounds``, over which the order of ``n``
    jobs is balanced (Note [balanced round order]): a multiple of 2n from
    three jobs on, any number for two.

    >>> balanced_rounds(16, 2), balanced_rounds(16, 3), balanced_rounds(0, 3)
    (16, 18, 0)
    """
    if n < 3:
        return rounds
    return -(-rounds // (2 * n)) * (2 * n)


def interleaved_stats(step_ms: Mapping[str, Sequence[Sequence[float]]],
                      reference: str) -> dict[str, Any]:
    """Each mode's median step time over all its steps and per round (from its
    step times in ms, per round), and for every mode but ``reference`` the
    median over rounds of (its round median / the reference's round median) - 1
    (Note [interleaved steps] in train_bench.py), under the key ``rel_vs_<reference>``.

    >>> s = interleaved_stats({"native": [[10, 12], [20, 22]], "wr": [[11, 13], [21, 24]]},
    ...                       "native")
    >>> s["round_median_ms"]["wr"], round(s["rel_vs_native"]["wr"], 4)
    ([12.0, 22.5], 0.0812)
    """
    rounds = {m: [statistics.median(r) for r in per_round] for m, per_round in step_ms.items()}
    ref = rounds[reference]
    rel = {m: statistics.median(a / b - 1 for a, b in zip(med, ref))
           for m, med in rounds.items() if m != reference}
    return {"median_ms": {m: statistics.median(t for r in per_round for t in r)
                          for m, per_round in step_ms.items()},
            "round_median_ms": rounds, f"rel_vs_{reference}": rel}


def time_rounds(jobs: Sequence[TrainJob], rounds: int, steps: int,
                device: torch.device, first: int = 0,
                after_round: Callable[[int], None] | None = None) -> list[list[list[float]]]:
    """``rounds`` rounds of ``steps`` timed steps of every job in turn, in
    :func:`round_order` (counting rounds from ``first``, so that a later call
    continues the rotation), each job's backend flags set before its steps;
    the step times in ms, ``[job][round][step]``. ``after_round(r)`` is
    called after each round's steps."""
    timers = [[Timer(device) for _ in range(rounds)] for _ in jobs]
    for r in range(rounds):
        for j in round_order(len(jobs), first + r):
            jobs[j].set_flags()
            jobs[j].timed_steps(steps, timers[j][r])
        if after_round is not None:
            after_round(r)
    return [[timer.times_ms() for timer in row] for row in timers]


# Note [a warm rotation]
# ~~~~~~~~~~~~~~~~~~~~~~
# Each side is warmed up alone, before the next is built (Note [memory per
# side] in zoo_bench.py), so the first interleaved rounds are the first steps
# that follow another side's: the caching allocator hands them blocks the
# other side left, at other addresses than the warm-up's. A converted side
# that replays its planned launches as CUDA graphs (Note [replay after
# repeated addresses] in mucudnn/exec/graph.py) then launches directly and
# captures anew until those addresses have repeated, a cost of the harness's
# order that a training loop pays once. So before the timed rounds each side
# runs :func:`warm_rotation`: twice round the rotation, WARM_ROUND_STEPS steps
# a turn (a turn's first step follows another side's, the rest its own), the
# steps discarded; the timed rounds measure the steady state of interleaved
# steps. Where another side's steps leave the allocator's blocks at new
# addresses every time, each turn that follows them still meets new address
# sets, which a loop training one model does not: :class:`ReplayRounds`
# records each timed round's captures and direct launches, and the host
# milliseconds of its captures (Note [what replay costs the host] in
# mucudnn/exec/graph.py), so that a ratio can be read against them (rounds
# that captured against rounds that did not, and what the captures took).
WARM_ROUND_STEPS = 2


def warm_rotation(jobs: Sequence[TrainJob], device: torch.device) -> None:
    """Two untimed rotations of :func:`time_rounds` (See Note [a warm rotation])."""
    time_rounds(jobs, 2 * len(jobs), WARM_ROUND_STEPS, device)


# -- the machine --------------------------------------------------------------------------------
def find_profile(device: torch.device, backend: Any = None) -> dict | None:
    """What the GPU backend's find() did in this process (``backend``'s, or
    the default one's: its ``FindProfile``'s counts and seconds: finds, split
    and runtime-compiled configurations; its per-mode seconds left out, so
    that samples median field by field), as a dict; None on the CPU or for a
    backend that keeps none. Call it once the converted side has planned (it
    builds the default backend otherwise)."""
    if device.type != "cuda":
        return None
    from mucudnn.backends import default_name, get_backend

    be = backend if backend is not None else get_backend(default_name(gpu=True),
                                                         device=device.index or 0)
    prof = getattr(be, "find_profile", None)
    if prof is None:
        return None
    return {k: v for k, v in prof.as_dict().items() if not isinstance(v, dict)}


def graph_replays() -> dict | None:
    """How mucudnn.torch's planned launches were replayed as CUDA graphs in this
    process (``MUCUDNN_TORCH_REPLAY``; Note [replay after repeated addresses]
    in mucudnn/exec/graph.py): over the kernels that replay, the captures,
    replays, direct launches and failed captures; None where none replays."""
    return graph_counts(mt.cached_convolutions())


class ReplayRounds:
    """The CUDA-graph captures and direct launches of each round of
    :func:`time_rounds` (its ``after_round``), and the host milliseconds of
    those captures, from :func:`graph_replays`' readings: whether the timed
    rounds reached the steady state of Note [a warm rotation] or kept
    capturing, and at what cost. ``as_dict()`` is None where no kernel
    replays; :meth:`total` is every count over the rounds so far."""

    def __init__(self) -> None:
        self._first = self._last = graph_replays()
        self.captures: list[int] = []
        self.direct: list[int] = []
        self.capture_ms: list[float] = []

    def total(self) -> dict | None:
        """:func:`replays_between` the reading before the first round and the
        one after the last."""
        return replays_between(self._first, self._last)

    def __call__(self, _round: int) -> None:
        now = graph_replays()
        diff = replays_between(self._last, now)
        self._last = now
        if diff is not None:
            self.captures.append(diff["captures"])
            self.direct.append(diff["direct"])
            self.capture_ms.append(round(1e3 * diff["capture_s"], 3))

    def as_dict(self) -> dict | None:
        if not self.captures:
            return None
        return {"captures": self.captures, "direct": self.direct, "capture_ms": self.capture_ms}


def replays_between(before: dict | None, after: dict | None) -> dict | None:
    """The CUDA-graph counts of :func:`graph_replays` between two readings
    (a benchmark's timed or profiled steps): whether those steps replayed
    their planned launches, captured them anew or launched them directly.
    None where no kernel replays.

    >>> replays_between({"kernels": 2, "captures": 2, "replays": 3, "direct": 2, "failed": 0},
    ...                 {"kernels": 2, "captures": 2, "replays": 43, "direct": 2, "failed": 0})
    {'kernels': 2, 'captures': 0, 'replays': 40, 'direct': 0, 'failed': 0}
    >>> replays_between(None, None) is None
    True
    """
    if after is None:
        return None
    before = before or {}
    return {k: v if k in ("kernels", "failed") else v - before.get(k, 0)
            for k, v in after.items()}


def is_oom(exc: BaseException) -> bool:
    """True for out-of-memory errors from torch, CUDA or mucudnn (its workspace)."""
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "alloc_failed" in text or "cudaerrormemoryallocation" in text


def environment(device: torch.device) -> dict:
    """What a result file records of the run: versions, the device, the UTC
    date, the commit of the tree (:func:`source_commit`) and the settings that
    change what a converted layer does (mucudnn/torch/settings.py): the
    comparison switch ``MUCUDNN_TORCH_NATIVE`` where set, and always the
    graph replay of planned launches (``MUCUDNN_TORCH_REPLAY``, ``1`` or
    ``0``), the search and the stand-ins of a first step
    (``MUCUDNN_TORCH_DEFER``, ``1`` or ``0``), as they took effect (their
    defaults are part of the result)."""
    settings = {k: os.environ[k] for k in ("MUCUDNN_TORCH_NATIVE",) if k in os.environ}
    settings["MUCUDNN_TORCH_REPLAY"] = "1" if mt_settings.replays() else "0"
    settings["MUCUDNN_TORCH_SEARCH"] = mt_settings.search()
    settings["MUCUDNN_TORCH_DEFER"] = "1" if mt_settings.defers() else "0"
    env = {"torch": torch.__version__, "mucudnn": mucudnn.__version__,
           "torchvision": getattr(torchvision, "__version__", None), "device": str(device),
           "python": sys.version.split()[0], "cuda": torch.version.cuda,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "git_commit": source_commit(), "settings": settings}
    if device.type == "cuda":
        env.update(gpu=torch.cuda.get_device_name(device), cudnn=torch.backends.cudnn.version(),
                   total_memory=torch.cuda.get_device_properties(device).total_memory)
    pinned = cpu_affinity()
    if pinned is not None:
        env["cpu_affinity"] = pinned
    return env


# Note [pinned CPUs]
# ~~~~~~~~~~~~~~~~~~
# A host-bound step (MobileNet, DenseNet, RegNet-Y under AMP) takes what the
# CPU gives the thread issuing its kernels, and on the lent machines that
# varies within a round, both sides alike, so an A/A pair of identical models
# reads apart by more than the step-time target (docs/BENCHMARKS.md, the
# A/A column). Where that comes from the scheduler
# moving the threads between CPUs, holding them to a few helps; whether it
# does is what an A/A run (zoo_bench --with-control) pinned and unpinned
# shows. ``PIN_CPUS=2-5 bash tools/gpu_run.sh ...`` runs every stage on those
# CPUs alone (``taskset``), every side of a benchmark the same, and a result
# file records the CPUs it was held to (``cpu_affinity``,
# :func:`cpu_affinity`), so a pinned run is never read as an unpinned one.
def cpu_affinity() -> str | None:
    """The CPUs this process may run on, as ``taskset -c`` lists them
    (``"2-5"``, ``"0,2,4"``), where that is fewer than the machine's; None
    where it may run on all of them or the platform does not say."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if not cpus or len(cpus) >= (os.cpu_count() or 0):
        return None
    return cpu_list(cpus)


def cpu_list(cpus: Sequence[int]) -> str:
    """Sorted CPU numbers as ``taskset -c`` writes them: runs as ranges.

    >>> cpu_list([2, 3, 4, 5]), cpu_list([0, 2, 4]), cpu_list([1, 2, 7])
    ('2-5', '0,2,4', '1-2,7')
    """
    runs: list[list[int]] = []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def source_commit() -> str | None:
    """The commit of the tree this script runs from: ``$MUCUDNN_COMMIT`` where
    set (a copy without its repository), else :func:`commit_of` this tree."""
    if os.environ.get("MUCUDNN_COMMIT"):
        return os.environ["MUCUDNN_COMMIT"]
    return commit_of(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def commit_of(root: str) -> str | None:
    """git's HEAD where ``root`` is the top of a checkout, with ``+dirty`` where
    the tracked files differ from HEAD's; None otherwise (a copy inside
    another checkout must not report that checkout's commit). The files are
    compared by content, through an index of their own, not through git's
    index: a checkout copied with its ``.git`` (a device's copy of the tree)
    can carry an index that says clean while the files are another commit's."""
    def git(*args: str, env: dict | None = None) -> str:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                              timeout=10, env=env).stdout.strip()
    try:
        top = git("rev-parse", "--show-toplevel")
        if not top or os.path.realpath(top) != os.path.realpath(root):
            return None
        head = git("rev-parse", "HEAD")
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
            git("read-tree", "HEAD", env=env)
            git("add", "-u", env=env)
            dirty = git("write-tree", env=env) != git("rev-parse", "HEAD^{tree}")
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + "+dirty" if dirty else head) or None
