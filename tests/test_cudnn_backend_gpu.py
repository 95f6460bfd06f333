"""The legacy-API backend (cudnn) and the cuDNN handle on a real GPU: what is
particular to them (marker gpu; skipped without one). What every backend must do
is checked for all of them in tests/test_backend_conformance.py.

Leak checks: 10,000 descriptor cycles leave device memory and the live
descriptor counter unchanged; the descriptor cache is bounded.
"""

from __future__ import annotations

import gc

import pytest

import mucudnn.cuda as mc
from mucudnn import Direction
from mucudnn._cudnn import (
    ConvolutionDescriptor, FilterDescriptor, Handle, MathType, TensorDescriptor, get_handle,
    live_descriptors, live_handles,
)
from mucudnn.backends.cudnn import CudnnBackend
from mucudnn.errors import InvalidValueError, UnsupportedConfigError
from conv_support import MiB, backend_fixture, problem

pytestmark = pytest.mark.gpu

FIND_LIMIT = 512 * MiB
be = backend_fixture(CudnnBackend, FIND_LIMIT)


def test_find_keeps_fma_math_and_reports_determinism(be):
    p = problem("2d-nchw", "float32", "fma")
    for d in (Direction.FORWARD, Direction.BACKWARD_DATA, Direction.BACKWARD_FILTER):
        found = be.find(p, d, FIND_LIMIT)
        assert found and all(a.math_type == MathType.FMA_MATH for a in found)
        assert all(a.determinism in (0, 1) for a in found)


def test_an_algorithm_cudnn_refuses_is_a_typed_error(be):
    p = problem("3d-ncdhw", "float32", "fma")
    with pytest.raises(UnsupportedConfigError, match="algorithm 99"):  # no such algorithm
        be.bind(Direction.FORWARD, 99, 0, p, 0, p.batch, 1.0, 0.0, (16, 16, 16))


@pytest.mark.parametrize("algo", ["e19;k2=0", "split2|0", "slice2|e0", "fold2|1", True, 1.5])
def test_another_backends_id_is_refused_naming_algo(be, algo):
    """The graph backend's and the rewrites' ids are not legacy algorithms: a
    clear InvalidValueError naming ``algo`` and the names it takes."""
    p = problem("2d-nchw", "float32", "fma")
    for call in (lambda: be.workspace_size(p, Direction.BACKWARD_FILTER, algo),
                 lambda: be.bind(Direction.BACKWARD_FILTER, algo, 0, p, 0, p.batch)):
        with pytest.raises(InvalidValueError, match=r"^algo: expected a backward_filter "
                                                    r"algorithm .*'ALGO_0=0'"):
            call()
    assert be.workspace_size(p, Direction.BACKWARD_FILTER, "algo_1") == \
        be.workspace_size(p, Direction.BACKWARD_FILTER, 1)


# -- handles and descriptors -----------------------------------------------------------------

def test_handle_stream_binding_and_cache():
    s = mc.Stream()
    with Handle(stream=s) as h:
        assert h.stream_handle == s.handle and h.stream is s
        h.set_stream(0)  # the legacy default stream
        assert h.stream_handle == 0
        h.set_stream(None)  # mucudnn's default stream
        assert h.stream_handle == mc.default_stream().handle
    assert h.closed
    assert get_handle() is get_handle()
    assert get_handle().stream_handle == mc.default_stream().handle
    before = live_handles()
    for _ in range(20):
        Handle().close()
    assert live_handles() == before
    s.close()


def test_descriptor_cycles_leak_nothing():
    p = problem("3d-ndhwc-grouped-dilated", "float16", "fma")
    gc.collect()
    mc.synchronize()
    free0, _ = mc.mem_get_info()
    live0 = live_descriptors()
    for _ in range(10_000):
        with TensorDescriptor.for_x(p) as x, FilterDescriptor.for_w(p) as w, \
                ConvolutionDescriptor.for_problem(p) as c:
            assert c.output_dims(x, w) == p.y_dims
    gc.collect()
    assert live_descriptors() == live0
    free1, _ = mc.mem_get_info()
    assert free1 == free0


def test_descriptor_cache_is_bounded_and_closed():
    gc.collect()
    live0 = live_descriptors()
    with CudnnBackend(descriptor_cache_size=2, find_workspace_limit=16 * MiB) as b:
        problems = [problem("2d-1x1-stride2", "float32", "fma").with_batch(n)
                    for n in (1, 2, 3, 4, 5)]
        for _ in range(3):
            for q in problems:
                b.workspace_size(q, Direction.FORWARD, 0, MathType.FMA_MATH)
                assert len(b._descs) <= 2
        assert live_descriptors() - live0 <= 2 * 4
    assert live_descriptors() == live0
