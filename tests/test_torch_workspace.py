"""Note [torch workspace] on the CPU: the per-device, per-stream workspace
buffers kept in torch's caching allocator, with torch's CUDA entry points
(current stream, capture state, allocation, free memory) replaced by fakes
that record what the allocator asks of them. The same behaviour on a real GPU:
tests/test_engine_gpu.py (``test_workspace_comes_from_torch_for_torch_calls``,
``test_torch_workspace_grows_to_the_largest_need``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import mucudnn.torch as mt  # noqa: E402
from mucudnn.errors import WorkspaceUnavailable  # noqa: E402
from mucudnn.exec import arrays  # noqa: E402

MiB = 1 << 20


class FakeCuda:
    """torch's CUDA side as TorchWorkspace sees it: a current stream per device,
    a capture flag, an allocator with a byte budget, free memory."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, budget: int = 1 << 40) -> None:
        self.stream = 7
        self.capturing = False
        self.budget = budget
        self.allocations: list[int] = []
        monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", self._stream, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: self.capturing,
                            raising=False)
        monkeypatch.setattr(torch, "empty", self._empty)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (123, 456))
        monkeypatch.setattr(arrays, "_TORCH_WORKSPACES", {})
        monkeypatch.setattr(arrays, "_TRANSIENT_WORKSPACES", {})

    def _stream(self, index: int) -> int:
        assert index == 0
        return self.stream

    def _empty(self, shape: tuple, dtype: object, device: object) -> "torch.Tensor":
        (n,) = shape
        assert dtype is torch.uint8 and str(device) == "cuda:0"
        if n > self.budget:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} bytes")
        self.allocations.append(n)
        return torch.zeros(n, dtype=torch.uint8)  # a CPU tensor stands in for the buffer


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda(monkeypatch)


def test_one_allocator_per_device(cuda):
    ws = arrays.torch_workspace(torch.device("cuda", 0))
    assert arrays.torch_workspace(torch.device("cuda:0")) is ws
    assert ws.index == 0 and ws.held_bytes == 0


def test_a_buffer_is_kept_per_stream_and_reused(cuda):
    ws = arrays.torch_workspace(torch.device("cuda", 0))
    keep, addr, size = ws(1000)
    assert keep is None and size == MiB and cuda.allocations == [MiB]
    assert ws(MiB) == (None, addr, MiB)  # fits: no allocation
    assert cuda.allocations == [MiB]
    cuda.stream = 9  # another stream: its own buffer
    _, addr9, size9 = ws(5)
    assert addr9 != addr and size9 == MiB and len(cuda.allocations) == 2
    assert arrays.torch_workspace_bytes() == 2 * MiB
    assert arrays.torch_workspace_bytes(0) == 2 * MiB and arrays.torch_workspace_bytes(1) == 0
    cuda.stream = 7
    assert ws(10)[1] == addr


def test_growth_is_in_powers_of_two_and_retires_the_old_buffer(cuda):
    ws = arrays.torch_workspace(torch.device("cuda", 0))
    _, a1, _ = ws(MiB)
    _, a2, n2 = ws(3 * MiB + 1)
    _, a3, n3 = ws(5 * MiB)
    assert (n2, n3) == (4 * MiB, 8 * MiB) and len({a1, a2, a3}) == 3
    assert cuda.allocations == [MiB, 4 * MiB, 8 * MiB]
    # the outgrown ones stay held until release (a launch elsewhere may use them)
    assert ws.held_bytes == 13 * MiB < 2 * (2 * 5 * MiB)
    assert ws(2 * MiB)[1] == a3
    assert arrays.release_torch_workspaces() == 13 * MiB and ws.held_bytes == 0
    assert ws(1)[2] == MiB  # grows again after a release


def test_capture_takes_a_fresh_buffer_per_launch_and_keeps_none(cuda):
    ws = arrays.torch_workspace(torch.device("cuda", 0))
    _, kept, _ = ws(100)
    cuda.capturing = True
    keep1, p1, n1 = ws(100)
    keep2, p2, n2 = ws(100)
    # held by the launch (keepalive), exactly the need, never the kept buffer
    assert keep1 is not None and keep2 is not None and (n1, n2) == (100, 100)
    assert kept not in (p1, p2) and ws.held_bytes == MiB
    cuda.capturing = False
    assert ws(100)[1] == kept


def test_a_transient_allocator_gives_each_launch_its_own_block_and_keeps_none(cuda):
    """See Note [transient workspace in a training step]: exactly the need, held
    by the launch alone; nothing kept, counted or released afterwards."""
    ws = arrays.torch_workspace(torch.device("cuda", 0), keep=False)
    assert ws is arrays.torch_workspace(torch.device("cuda:0"), keep=False)
    assert ws is not arrays.torch_workspace(torch.device("cuda", 0)) and not ws.keep
    keep1, p1, n1 = ws(1000)
    keep2, p2, n2 = ws(1000)
    assert keep1 is not None and keep2 is not None and (n1, n2) == (1000, 1000) and p1 != p2
    assert cuda.allocations == [1000, 1000] and ws.held_bytes == 0
    assert arrays.torch_workspace_bytes() == 0 and ws.release() == 0
    cuda.budget = 10
    with pytest.raises(WorkspaceUnavailable, match="torch could not allocate 11 bytes"):
        ws(11)


def test_out_of_memory_tries_the_exact_need_then_names_it(cuda):
    cuda.budget = 3 * MiB
    ws = arrays.torch_workspace(torch.device("cuda", 0))
    # 2.5 MiB rounds to 4 MiB, over the budget: the exact need is taken instead
    _, _, n = ws(5 * MiB // 2)
    assert n == 5 * MiB // 2 and cuda.allocations == [5 * MiB // 2]
    with pytest.raises(WorkspaceUnavailable, match=r"workspace: torch could not allocate "
                                                   r"4194305 bytes") as err:
        ws(4 * MiB + 1)
    assert err.value.available == 123  # what the device said was free
    assert ws(MiB)[2] == n  # the buffer it had is still there


def test_workspace_bytes_and_release_of_mucudnn_torch(cuda, monkeypatch):
    """``mucudnn.torch.workspace_bytes`` counts the kept buffers of CUDA devices
    (not of the CPU) and ``release_workspace`` drops them."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no synchronize here
    pools, cpu = mt.workspace_bytes("cuda:0"), mt.workspace_bytes("cpu")
    arrays.torch_workspace(torch.device("cuda", 0))(3 * MiB)
    assert mt.workspace_bytes("cuda:0") == pools + 4 * MiB
    assert mt.workspace_bytes("cpu") == cpu
    assert mt.release_workspace() >= 4 * MiB and arrays.torch_workspace_bytes() == 0
