"""One-off backends are collected with their workspace pools (issue 34, M3):
the registry of pools held each backend alive through its own pools, so every
backend that ever ran kept its pools and buffers for good. Counted with gc and
the resident size, never timed."""

from __future__ import annotations

import gc
import os
import sys
import weakref

import numpy as np
import pytest

import mucudnn as mu
from mucudnn.api.functional import _CONVS
from mucudnn.backends.numpy import NumpyBackend
from mucudnn.exec.workspace import PoolOrphanedError, WorkspacePool, pool_for

MiB = 1 << 20


pytestmark = pytest.mark.usefixtures("cache_off")


def _live_numpy_backends() -> int:
    gc.collect()
    return sum(type(o) is NumpyBackend for o in gc.get_objects())


def test_a_backend_and_its_pools_are_collected_together():
    be = NumpyBackend()
    pools = [pool_for(be, s) for s in (None, 5, 6)]
    for p in pools:
        p.ensure(MiB)
    refs = [weakref.ref(be)] + [weakref.ref(p) for p in pools]
    buffers = [weakref.ref(p._buffer) for p in pools]
    assert pool_for(be, 5) is pools[1]  # still one pool per stream while the backend lives
    del be, pools, p
    gc.collect()
    assert [r() for r in refs + buffers] == [None] * 7


def test_a_registered_pool_used_after_its_backend_went_says_so():
    be = NumpyBackend()
    pool = pool_for(be)
    del be
    gc.collect()
    with pytest.raises(PoolOrphanedError, match="backend no longer exists") as info:
        pool.ensure(MiB)
    assert isinstance(info.value, (mu.MucudnnError, ReferenceError))


def test_a_pool_made_by_hand_keeps_its_backend():
    pool = WorkspacePool(NumpyBackend())
    gc.collect()
    addr, size = pool.ensure(MiB)
    assert size >= MiB and pool.backend.is_host


def _one_off_pools(n: int) -> None:
    for _ in range(n):
        be = NumpyBackend()
        pool = pool_for(be)
        pool.ensure(MiB)
        pool._buffer[:] = 1  # resident, not only reserved


def _one_off_calls(n: int, x: np.ndarray, w: np.ndarray) -> None:
    for _ in range(n):
        y = mu.conv2d(x, w, padding=1, backend=NumpyBackend(), policy="undivided")
        assert y.shape == (2, 4, 5, 5)


def _rss() -> int:
    """Resident bytes of this process now (not the peak)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _growth(run, n: int) -> tuple[int, int]:
    """(resident bytes kept by ``n`` more one-off runs after a warm-up, NumPy
    backends alive afterwards)."""
    run(max(n // 10, 20))
    gc.collect()
    before = _rss()
    run(n)
    gc.collect()
    return _rss() - before, _live_numpy_backends()


def _check_one_off(n: int) -> None:
    mu.clear_caches()
    base = _live_numpy_backends()
    # each pool allocates (and touches) 1 MiB: kept pools would hold n MiB
    grown, live = _growth(_one_off_pools, n)
    assert live <= base, (live, base)
    assert grown < 50 * MiB, grown
    x = np.ones((2, 3, 5, 5), np.float32)
    w = np.ones((4, 3, 3, 3), np.float32)
    grown, live = _growth(lambda k: _one_off_calls(k, x, w), n)
    # the functional helpers keep their Convolution objects (and so their
    # backends) in a bounded cache, and nothing else keeps a backend
    assert live <= base + _CONVS.maxsize, (live, base)
    assert grown < 50 * MiB, grown
    mu.clear_caches()
    assert _live_numpy_backends() <= base


needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.mark.slow
@needs_proc
def test_one_off_backends_leave_nothing_behind():
    _check_one_off(500)


@needs_proc
@pytest.mark.slow
def test_ten_thousand_one_off_backends_leave_nothing_behind():
    _check_one_off(10_000)
