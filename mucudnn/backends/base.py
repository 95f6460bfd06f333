"""The Backend protocol every implementation follows, and the tensors a call takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Union, runtime_checkable

from ..problem import AlgoPerf, ConvProblem, Direction


@dataclass(frozen=True)
class ConvTensors:
    """The three tensors of one convolution call, in forward naming.

    ``x`` is the input (dx for backward-data), ``w`` the filter (dw for
    backward-filter), ``y`` the output (dy for the backward passes). Which one
    is written depends on the direction: forward writes y, backward-data writes
    x, backward-filter writes w. Arrays are of the backend's own kind (NumPy
    arrays for "numpy", DeviceArrays for the GPU backends), packed in the
    problem's layout with the problem's shapes.
    """

    problem: ConvProblem
    x: Any
    w: Any
    y: Any


#: Which tensor each direction writes.
OUTPUT_OF = {Direction.FORWARD: "y", Direction.BACKWARD_DATA: "x",
             Direction.BACKWARD_FILTER: "w"}


@runtime_checkable
class Backend(Protocol):
    """What the optimizer and the engine need of a convolution library.

    Arrays are of the backend's own kind; ``workspace`` is a 1-D uint8 array of
    that kind (or None for zero bytes) whose slices are views, so WD plans can
    hand each kernel a segment of one allocation.
    """

    name: str
    device_name: str
    version: str

    def find(self, problem: ConvProblem, direction: Direction,
             workspace_limit: int) -> list[AlgoPerf]:
        """Every algorithm that ran for ``problem`` (at its own batch) within
        ``workspace_limit``, fastest first."""
        ...

    def workspace_size(self, problem: ConvProblem, direction: Direction,
                       algo: Union[int, str], math_type: Union[int, str] = 0) -> int:
        """Bytes of workspace ``algo`` needs for ``problem``."""
        ...

    def run(self, direction: Direction, algo: Union[int, str], math_type: Union[int, str],
            tensors: ConvTensors, alpha: float, beta: float, workspace: Any) -> None:
        """One call: output = alpha * conv(...) + beta * output, in place."""
        ...

    # -- arrays of the backend's kind -------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        """An uninitialised packed array of the backend's kind."""
        ...

    def from_host(self, array: Any) -> Any:
        """A copy of a NumPy array as an array of the backend's kind."""
        ...

    def to_host(self, array: Any) -> Any:
        """A NumPy copy of an array of the backend's kind (waits for pending work)."""
        ...

    def alloc_workspace(self, nbytes: int) -> Any:
        """A 1-D uint8 array of ``nbytes`` of the backend's kind; slices are views."""
        ...

    def synchronize(self) -> None:
        """Wait until every call issued so far has finished."""
        ...
