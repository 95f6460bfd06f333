"""Fake backends for tests/test_spread.py, in a module of their own so that the
worker processes (started with "spawn") import them quickly and by name.

Every fake here is deterministic: its Find times come from the problem alone,
so plans made in any process, in any order, are the same. With
``MUCUDNN_TEST_FIND_LOG`` set (the workers inherit the environment), every
find() call appends ``pid<TAB>problem key<TAB>direction`` to that file.
"""

from __future__ import annotations

import os
import pathlib
import time
import zlib

from mucudnn.backends import BackendBase
from mucudnn.errors import UnsupportedConfigError
from mucudnn.problem import AlgoPerf

LOG = "MUCUDNN_TEST_FIND_LOG"
MEET = "MUCUDNN_TEST_MEET_DIR"


def _log(problem, direction) -> None:
    path = os.environ.get(LOG)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\t{problem.key()}\t{direction.value}\n")


def _jitter(*parts) -> float:
    """A fixed number in [0, 1) for these parts (the same in every process)."""
    return zlib.crc32(" ".join(map(str, parts)).encode()) / 2 ** 32


class FakeBackend(BackendBase):
    """Find in the shape a cap makes of real kernels: algo 0 needs no
    workspace and is slow, algo 1 is fast and needs 64 B per sample, algo 2
    is between; times scale with FLOPs, varied per problem by a fixed hash."""

    name = "fake-spread"
    device_name = "Fake GPU"
    version = "1"

    def find(self, problem, direction, workspace_limit):
        _log(problem, direction)
        n, f = problem.batch, problem.flops() * 1e-6
        out = []
        for algo, speed, ws in ((0, 4.0, 0), (1, 1.0, 64 * n), (2, 2.0, 16 * n + 32)):
            t = 0.002 + f * speed * (1 + 0.5 * _jitter(problem.key(), direction.value, algo))
            out.append(AlgoPerf(algo, t, ws))
        return sorted((a for a in out if workspace_limit is None or a.workspace_bytes
                       <= workspace_limit), key=lambda a: a.time_ms)


class DeviceFake(FakeBackend):
    """A FakeBackend "on" a device (not a host backend: built with ``device=``);
    with ``MUCUDNN_TEST_MEET_DIR`` set, find() waits until two processes
    have called it, so that both workers of a pool of two take part."""

    is_host = False

    def __init__(self, device=None, device_name=None):
        self.device = device
        if device_name is not None:
            self.device_name = device_name

    def find(self, problem, direction, workspace_limit):
        meet = os.environ.get(MEET)
        if meet:
            folder = pathlib.Path(meet)
            (folder / str(os.getpid())).touch()
            deadline = time.monotonic() + 60
            while len(list(folder.iterdir())) < 2:
                if time.monotonic() > deadline:
                    raise TimeoutError("the other worker never called find()")
                time.sleep(0.01)
        return super().find(problem, direction, workspace_limit)


def named_by_device(device):
    """A factory (a plain function: called with ``device=``) whose device name
    depends on the device: workers of a pool then disagree."""
    return DeviceFake(device, device_name=f"Fake GPU model {device}")


class Failing(FakeBackend):
    """find() fails with a library error (is it re-raised with its type?)."""

    def find(self, problem, direction, workspace_limit):
        raise UnsupportedConfigError(f"cannot run {problem.key()}", algo=3, reason="test")
