"""``mucudnn.torch.native.calibrate`` on the CPU: which directions it plans, times and
hands to PyTorch's call, under both searches (Note [plans only over the limit], Note
[never slower than native]). The device-side parts are replaced by recording fakes:
PyTorch's calls (``native_forward``/``native_backward``), the plans' launchers, the
CUDA-event timer and the workspace probe, each answering from the example's table;
the thread each direction is measured on is checked (Note [PyTorch's benchmark cache
is per thread]).
What calibrate does with their answers is the code under test; that the answers
themselves are right is what the GPU tests in test_torch_native.py check.
"""

from __future__ import annotations

import types

import pytest
from hypothesis import given, strategies as st

torch = pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")

from mucudnn.problem import Direction  # noqa: E402
from mucudnn.torch import measure, native  # noqa: E402
from mucudnn.torch.engine import ConvConfig  # noqa: E402

LIMIT = 1 << 20
FWD, BD, BF = Direction

workspaces = st.one_of(st.none(), st.sampled_from([0, LIMIT // 2, LIMIT, LIMIT + 1, 4 * LIMIT]))
times_ms = st.floats(0.01, 10.0)


class Device:
    """The fakes, and what was run through them: ``calls`` in order, as
    ``(side, direction)`` with side ``"torch"`` or ``"ours"``."""

    def __init__(self, torch_ms, plan_ms, workspace, fails):
        self.torch_ms = dict(zip(Direction, torch_ms))
        self.plan_ms = dict(zip(Direction, plan_ms))
        self.workspace = dict(zip(Direction, workspace))
        self.fails = fails  # a direction PyTorch cannot run, or None
        self.calls: list[tuple[str, Direction]] = []
        self.thread: list = [None]  # the direction whose step thread runs now (None: the caller's)
        self.conv = types.SimpleNamespace(plans={}, problem=types.SimpleNamespace(key=lambda: "p"))

    def _torch(self, d, out):
        # See Note [PyTorch's benchmark cache is per thread]: a backward direction is
        # measured on the thread that runs it in a step, the forward on the caller's
        assert self.thread[-1] == (None if d is FWD else d), (d, self.thread)
        self.calls.append(("torch", d))
        if d is self.fails:
            raise RuntimeError("cuDNN: no algorithm for this configuration")
        return out

    def native_forward(self, x, w, cfg, deterministic, tf32):
        return self._torch(FWD, torch.zeros(2, 4, 3, 3))

    def native_backward(self, dy, x, w, cfg, need_x, need_w, deterministic, tf32):
        assert need_x != need_w  # calibrate asks for one direction at a time
        d = BD if need_x else BF
        out = (torch.zeros_like(x), None) if need_x else (None, torch.zeros_like(w))
        return self._torch(d, out)

    def on_step_thread(self, d, device, fn):
        self.thread.append(None if d is FWD else d)
        try:
            return fn()
        finally:
            self.thread.pop()

    def launcher(self, d):
        def launch(*args):
            self.calls.append(("ours", d))
            self.conv.plans[d] = types.SimpleNamespace(workspace_bytes=LIMIT // 4)
        return launch

    def _last(self):
        return self.calls[-1]

    def time(self, fns, repeat=measure.REPEAT):
        out = []
        for fn in fns:
            fn()
            side, d = self._last()
            out.append(self.torch_ms[d] if side == "torch" else self.plan_ms[d])
        return out

    def probe(self, fn):
        fn()
        side, d = self._last()
        assert side == "torch"
        return self.workspace[d]

    def first(self, fn):
        """measure.probe: a warm-up call, then one timed and measured."""
        fn()
        fn()
        side, d = self._last()
        assert side == "torch"
        return self.torch_ms[d], self.workspace[d]


def _calibrate(dev: Device, search: str, need_dx: bool,
               transposed: bool = False) -> tuple[native.Record, list]:
    """One first call's calibration through ``dev``'s fakes (fresh records); the
    record and the records kept."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MUCUDNN_TORCH_SEARCH", search)
        mp.setattr(native, "native_forward", dev.native_forward)
        mp.setattr(native, "native_backward", dev.native_backward)
        mp.setattr(native, "time_ms", dev.time)
        mp.setattr(native, "workspace_of", dev.probe)
        mp.setattr(native, "probe", dev.first)
        mp.setattr(native, "on_step_thread", dev.on_step_thread)
        cfg = ConvConfig((1, 1), (0, 0), (1, 1), 1, LIMIT, "fitted", "", "")
        x, w = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
        launch = {d: dev.launcher(d) for d in Direction}
        native.clear()
        state = torch.get_rng_state()
        try:
            rec = native.calibrate(("key", search, need_dx), dev.conv, x, w, (2, 4, 3, 3), cfg,
                                   torch.contiguous_format, launch, None, lambda: 0, LIMIT,
                                   False, True, None, need_dx, transposed)
            # the user's random stream is where it was: See Note [random operands of our own]
            assert torch.equal(torch.get_rng_state(), state)
            return rec, native.records()
        finally:
            native.clear()


@given(torch_ms=st.lists(times_ms, min_size=3, max_size=3),
       plan_ms=st.lists(times_ms, min_size=3, max_size=3),
       workspace=st.lists(workspaces, min_size=3, max_size=3), need_dx=st.booleans(),
       fails=st.one_of(st.none(), st.sampled_from(list(Direction))), transposed=st.booleans())
def test_over_limit_search_plans_and_launches_only_the_directions_over_the_limit(
        torch_ms, plan_ms, workspace, need_dx, fails, transposed):
    """Each direction a step runs whose PyTorch workspace fits runs PyTorch's call,
    with no plan launched or made for it; the others are planned, launched and
    run their plan (PyTorch's call cannot run there within the limit). Where
    PyTorch cannot run a direction of the step, the layer is planned whole as
    under the search of everything. A transposed layer's step skips its
    problem's forward instead of its backward-data where its input needs no
    gradient (Note [transposed convolutions])."""
    dev = Device(torch_ms, plan_ms, workspace, fails)
    rec, kept = _calibrate(dev, "over-limit", need_dx, transposed)
    assert rec.transposed is transposed
    in_step = [d for d in Direction if d is not native.skipped(need_dx, transposed)]
    if fails in in_step:
        assert set(rec.plans) == {d for _, d in dev.calls if _ == "ours"} == set(Direction)
        return
    fit = [d for d in in_step if native.within_limit(dev.workspace[d], LIMIT)]
    over = [d for d in in_step if d not in fit]
    ours = [d for side, d in dev.calls if side == "ours"]
    assert set(ours) == set(over) and set(rec.plans) == set(over)
    # the whole first call, and the planning within it (Note [first-call seconds])
    assert rec.first_s is not None and rec.plan_s is not None
    assert 0.0 <= rec.plan_s <= rec.first_s and (rec.plan_s == 0.0) == (not over)
    for d in Direction:
        c = rec.choices[d]
        if d in fit:
            assert (c.runs, c.plan_ms, c.torch_ms) == (native.TORCH, None, dev.torch_ms[d])
            assert c.torch_workspace == dev.workspace[d] and native.fits(c)
        elif d in over:
            assert (c.runs, c.plan_ms) == (native.MUCUDNN, dev.plan_ms[d])
            assert c.torch_workspace == dev.workspace[d] and not native.fits(c)
        else:  # the direction of an input that needs no gradient: never measured
            assert c.runs == native.MUCUDNN and c.torch_ms is None and d not in rec.plans
            assert ("torch", d) not in dev.calls
    assert kept == [rec]


@given(torch_ms=st.lists(times_ms, min_size=3, max_size=3),
       plan_ms=st.lists(times_ms, min_size=3, max_size=3),
       workspace=st.lists(workspaces, min_size=3, max_size=3), need_dx=st.booleans())
def test_the_search_of_everything_plans_every_direction_and_decides_each(
        torch_ms, plan_ms, workspace, need_dx):
    """MUCUDNN_TORCH_SEARCH=all: every direction is planned and timed against
    PyTorch's call, and each choice is the rule's (native.decide) on those times."""
    dev = Device(torch_ms, plan_ms, workspace, None)
    rec, _ = _calibrate(dev, "all", need_dx)
    assert set(rec.plans) == set(Direction)
    for d in Direction:
        want = native.decide(d, dev.plan_ms[d], dev.torch_ms[d], dev.workspace[d], LIMIT)
        assert rec.choices[d] == want
