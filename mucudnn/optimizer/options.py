"""What every planning call is given besides its kernels, checked once.

:func:`plan_options` checks ``policy``, ``backend``, ``cache``,
``deterministic``, ``retime``, ``progress`` and ``devices`` (every check the
planning functions made each on their own before) and returns a frozen
:class:`PlanOptions`; the public functions (:func:`~.api.optimize`,
:func:`~.api.optimize_kernels`, :func:`~.api.plan_jointly`,
:func:`~.spread.benchmark_many`, :func:`mucudnn.bench.run_network`) build one at
their top and hand it down, so nothing below checks them again.

>>> o = plan_options("powerOfTwo", "numpy", False)
>>> o.policy, o.backend.name, o.cache.enabled, o.devices
('powerOfTwo', 'numpy', False, None)
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union, cast

from ..backends import (DEFAULT_GPU_BACKEND, Backend, CudnnBackend, CudnnGraphBackend,
                        NumpyBackend, available_backends, get_backend)
from ..cuda import device_count, require_device
from ..errors import InvalidTypeError, InvalidValueError
from ..units import parse_count
from .cache import BenchmarkCache, resolve
from .policies import DEFAULT_POLICY, normalize_policy
from .types import BackendLike, CacheLike, DevicesLike, PolicyLike

__all__ = ["PlanOptions", "plan_options", "check_deterministic", "check_byte_count",
           "check_devices", "check_ordinals"]


@dataclass(frozen=True)
class PlanOptions:
    """Checked planning arguments (build one with :func:`plan_options`).

    ``policy`` is normalised (:func:`~.policies.normalize_policy`), ``cache``
    resolved. Without ``devices`` (None), ``backend`` is the complete Backend
    that benchmarks in this process; with ``devices`` (a tuple of checked
    ordinals) it is None and ``spec`` is what each worker builds its backend
    from (a name or a picklable factory), ``host`` whether that is a host
    backend (Note [benchmarking on several devices] in :mod:`.spread`).
    """

    policy: Union[str, tuple[int, ...]]
    cache: BenchmarkCache
    deterministic: bool = False
    retime: int = 0
    progress: "bool | None" = None
    backend: "Backend | None" = None
    devices: "tuple[int, ...] | None" = None
    spec: Any = None
    host: bool = False
    gpu: bool = False

    @property
    def backend_name(self) -> str:
        """The in-process backend's name ("" with ``devices``: the workers report theirs)."""
        return self.backend.name if self.backend is not None else ""


def plan_options(policy: PolicyLike = DEFAULT_POLICY, backend: BackendLike = None,
                 cache: CacheLike = None, *, deterministic: bool = False, retime: int = 0,
                 progress: "bool | None" = None, devices: DevicesLike = None) -> PlanOptions:
    """Every planning argument checked, once: a :class:`PlanOptions`.

    Raises InvalidTypeError/InvalidValueError naming the argument (``devices``
    and, with it, ``backend`` before anything touches a device). With
    ``devices``, ``backend`` is a name, None or a picklable factory; a GPU
    backend's ordinals are checked against this machine's devices.
    """
    norm = normalize_policy(policy)  # a one-shot iterable is read once
    check_deterministic(deterministic)
    n_retime = parse_count(retime, "retime")  # exactly: 2.5 is refused, not run as 2
    if devices is None:
        # a factory is for devices= only: adapt() refuses it here, naming ``backend``
        be = get_backend(cast("Backend | str | None", backend))
        return PlanOptions(norm, resolve(cache), deterministic, n_retime, progress, backend=be)
    devs = check_devices(devices)
    spec, host, gpu = _backend_spec(backend)
    if gpu:
        check_ordinals(devs)
    return PlanOptions(norm, resolve(cache), deterministic, n_retime, progress,
                       devices=devs, spec=spec, host=host, gpu=gpu)


def check_deterministic(value: Any) -> bool:
    """A ``deterministic`` argument: True or False; InvalidTypeError (a TypeError)
    naming it otherwise."""
    if not isinstance(value, bool):
        raise InvalidTypeError(f"deterministic: expected True or False, got {value!r}")
    return value


def check_byte_count(name: str, value: Any) -> int:
    """An int >= 0 of bytes; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 0:
        raise InvalidValueError(f"{name}: expected an int >= 0 (bytes), got {value!r}")
    return int(value)


def check_devices(devices: Any) -> tuple[int, ...]:
    """A ``devices`` argument: a non-empty sequence of distinct CUDA device
    ordinals (ints >= 0), returned as a tuple; InvalidTypeError (a TypeError)
    or InvalidValueError (a ValueError) naming ``devices`` otherwise.

    >>> check_devices([0, 1])
    (0, 1)
    >>> check_devices("0,1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mucudnn.errors.InvalidTypeError: devices: expected a sequence of CUDA device ordinals ...
    """
    want = "a sequence of CUDA device ordinals such as [0, 1]"
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise InvalidTypeError(f"devices: expected {want}, got {devices!r} "
                               f"({type(devices).__name__})")
    out = []
    for d in devices:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise InvalidTypeError(f"devices: expected {want}, got the entry {d!r} "
                                   f"({type(d).__name__})")
        if int(d) < 0:
            raise InvalidValueError(f"devices: expected ordinals >= 0, got {int(d)}")
        out.append(int(d))
    if not out:
        raise InvalidValueError(f"devices: expected {want}, got an empty sequence")
    twice = sorted({d for d in out if out.count(d) > 1})
    if twice:
        raise InvalidValueError(f"devices: each device once, got {out} "
                                f"(repeated: {', '.join(map(str, twice))})")
    return tuple(out)


def _default_backend_name() -> str:
    """``MUCUDNN_BACKEND`` if set, else the default GPU backend, as get_backend()
    would pick on a GPU, without touching the device."""
    env = os.environ.get("MUCUDNN_BACKEND", "").strip().lower()
    if env:
        if env not in available_backends():
            raise InvalidValueError(f"MUCUDNN_BACKEND: expected one of {available_backends()}, "
                                    f"got {env!r}")
        return env
    return DEFAULT_GPU_BACKEND


def _factory_target(spec: Any) -> Any:
    while isinstance(spec, functools.partial):
        spec = spec.func
    return spec


def _backend_spec(backend: Any) -> tuple[Any, bool, bool]:
    """(what the workers build their backend from, whether it is a host backend
    (built without a device), whether it is one of the library's GPU backends
    (whose ordinals are checked here; another factory checks its own)).
    Note [benchmarking on several devices]."""
    if backend is None:
        backend = _default_backend_name()
    if isinstance(backend, str):
        key = backend.lower()
        if key not in available_backends():
            raise InvalidValueError(f"backend: expected one of {available_backends()}, "
                                    f"got {backend!r}")
        host = key == NumpyBackend.name
        return key, host, not host
    target = _factory_target(backend)
    if not isinstance(target, type) and hasattr(backend, "find"):
        raise InvalidTypeError(
            f"backend: with devices=, each worker process builds its own backend, so pass a "
            f"backend name, None, or a picklable factory called as factory(device=i) (a "
            f"Backend class, or functools.partial(CudnnGraphBackend, find_top_k=4)); got the "
            f"instance {backend!r}")
    if not callable(backend):
        raise InvalidTypeError(f"backend: expected a backend name, None or a factory "
                               f"(callable as factory(device=i)), got {backend!r}")
    try:
        pickle.dumps(backend)
    except Exception as exc:
        raise InvalidTypeError(
            f"backend: with devices=, the factory goes to worker processes and must be "
            f"picklable (a module-level class or function, or functools.partial of one), "
            f"got {backend!r}: {exc}") from None
    if isinstance(target, type):
        # the library's GPU backends: their ordinals can be checked here
        return backend, bool(getattr(target, "is_host", False)), \
            issubclass(target, (CudnnBackend, CudnnGraphBackend))
    return backend, False, False


def check_ordinals(devices: tuple[int, ...]) -> None:
    """InvalidValueError naming ``devices`` where one is not a CUDA device of
    this machine (NoDeviceError where there is none)."""
    n = device_count()
    if n == 0:
        require_device()  # NoDeviceError, with the runtime's reason
    bad = [d for d in devices if d >= n]
    if bad:
        raise InvalidValueError(f"devices: this machine has {n} CUDA device"
                                f"{'s' if n != 1 else ''} (ordinals 0..{n - 1}), got {list(devices)}")
