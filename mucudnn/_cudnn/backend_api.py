"""cuDNN's backend (graph) API: one typed wrapper for every backend descriptor.

:class:`BackendDescriptor` owns one ``cudnnBackendDescriptor_t``: created by
type in ``__init__`` (``cudnnBackendCreateDescriptor``), destroyed by
``close()``, by leaving a ``with`` block or (safety net) by ``weakref.finalize``.
Attributes are set and read with typed helpers (int64 arrays, float/double
scalars, enums, descriptor arrays, ``void *`` arrays, handles, booleans), all
through the checked prototype table, so a bad attribute raises
:class:`~mucudnn._cudnn.errors.BadParamError` carrying cuDNN's own message.

Integer attributes are range-checked before the call (ctypes would silently
drop the high bits): an int64 array element outside int64 raises
:class:`~mucudnn._cudnn.errors.Int64RangeError`, an int32 or enum outside int32
:class:`~mucudnn._cudnn.errors.Int32RangeError`, each naming the attribute and
index; a float where an int belongs raises ``IntFieldTypeError``.

A descriptor keeps a reference to every descriptor set into it, so Python never
frees a tensor while an operation that was built from it is alive.

:func:`live_backend_descriptors` counts descriptors created and not yet
destroyed (for leak tests).

Note (driver): creating descriptors and setting attributes needs only libcudnn;
``cudnnBackendFinalize`` of any descriptor (even a tensor) loads cuDNN's engine
sub-libraries, which link the CUDA driver library (libcuda.so.1), so it fails
with ``CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED`` on a machine without the driver.
``cudnnBackendGetAttribute`` needs a finalized descriptor.
"""

from __future__ import annotations

import ctypes
import operator
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar, Union

from ._lifetime import CudnnObject, LiveCount
from .enums import (
    BackendAttributeName, BackendAttributeType, BackendDescriptorType, DataType, data_type,
)
from .errors import CudnnError
from .intrange import as_int, int32s, int64s
from .prototypes import lib, raise_status
from .structs import cudnnBackendDescriptor_t, cudnnHandle_t
from ..errors import InvalidTypeError, InvalidValueError

__all__ = ["BackendDescriptor", "live_backend_descriptors", "live_backend_descriptor_counts",
           "ATTRIBUTE_CTYPES"]


_R = TypeVar("_R")

Name = Union[BackendAttributeName, int]
AType = Union[BackendAttributeType, int]

_T = BackendAttributeType
#: The C element type of each attribute type mucudnn reads or writes.
ATTRIBUTE_CTYPES: dict[int, Any] = {
    _T.HANDLE: ctypes.c_void_p,
    _T.DATA_TYPE: ctypes.c_int,
    _T.BOOLEAN: ctypes.c_bool,
    _T.INT64: ctypes.c_int64,
    _T.FLOAT: ctypes.c_float,
    _T.DOUBLE: ctypes.c_double,
    _T.VOID_PTR: ctypes.c_void_p,
    _T.CONVOLUTION_MODE: ctypes.c_int,
    _T.HEUR_MODE: ctypes.c_int,
    _T.KNOB_TYPE: ctypes.c_int,
    _T.NUMERICAL_NOTE: ctypes.c_int,
    _T.LAYOUT_TYPE: ctypes.c_int,
    _T.ATTRIB_NAME: ctypes.c_int,
    _T.BACKEND_DESCRIPTOR: ctypes.c_void_p,
    _T.BEHAVIOR_NOTE: ctypes.c_int,
    _T.TENSOR_REORDERING_MODE: ctypes.c_int,
    _T.INT32: ctypes.c_int32,
    _T.CHAR: ctypes.c_char,
}

#: C integer element types whose values are range-checked in :meth:`BackendDescriptor.set`.
_INT64_CTYPES = (ctypes.c_int64,)
_INT32_CTYPES = (ctypes.c_int, ctypes.c_int32)

_live = LiveCount()


def live_backend_descriptors() -> int:
    """Backend descriptors created and not yet destroyed, all types together."""
    return _live.total()


def live_backend_descriptor_counts() -> dict[str, int]:
    """Live backend descriptors by type name (only types ever created)."""
    return _live.by_kind()


def _type_name(t: int) -> str:
    try:
        return BackendDescriptorType(int(t)).name
    except ValueError:
        return f"DESCRIPTOR_TYPE_{int(t)}"


def _name_str(name: Name) -> str:
    try:
        return BackendAttributeName(int(name)).name
    except ValueError:
        return str(int(name))


def _atype_str(t: AType) -> str:
    try:
        return BackendAttributeType(int(t)).name
    except ValueError:
        return str(int(t))


def _raw(d: Any) -> Optional[int]:
    """The raw pointer of a descriptor (BackendDescriptor or int/None)."""
    if d is None:
        return None
    if isinstance(d, BackendDescriptor):
        return d._as_parameter_.value
    return int(d)


class BackendDescriptor(CudnnObject):
    """One cuDNN backend descriptor of type ``dtype`` (a
    :class:`~mucudnn._cudnn.enums.BackendDescriptorType` or its value).

    ``finalized`` says whether :meth:`finalize` succeeded (descriptors read out
    of another descriptor, like heuristics results, come back finalized).
    ``attributes`` records what was set from Python (name -> (type, values)).
    """

    __slots__ = ("type", "finalized", "attributes", "_refs")

    _ctype = cudnnBackendDescriptor_t
    _create_fn = "cudnnBackendCreateDescriptor"
    _destroy_fn = "cudnnBackendDestroyDescriptor"
    _live = _live

    def __init__(self, dtype: Union[BackendDescriptorType, int]) -> None:
        t = int(dtype)
        self.type = BackendDescriptorType(t) if t in BackendDescriptorType._value2member_map_ \
            else t
        try:
            self._create(_type_name(t), t)
        except CudnnError as exc:
            exc.add_details(descriptor_type=_type_name(t))
            raise
        self.finalized = False
        self.attributes: dict[Any, tuple[Any, tuple]] = {}
        self._refs: list[Any] = []

    # -- identity and lifetime (the rest: CudnnObject) ---------------------------------
    def _label(self) -> str:
        return f"BackendDescriptor({_type_name(int(self.type))})"

    def close(self) -> None:
        """cudnnBackendDestroyDescriptor now (idempotent). Descriptors set into
        this one stay alive while something else references them."""
        super().close()
        self._refs = []

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("finalized" if self.finalized else "open")
        return f"BackendDescriptor({_type_name(int(self.type))}, {state})"

    # -- set ------------------------------------------------------------------------------
    def set(self, name: Name, atype: AType, values: Sequence[Any]) -> "BackendDescriptor":
        """cudnnBackendSetAttribute with ``values`` as an array of ``atype``'s C type."""
        atype = int(atype)
        ctype = ATTRIBUTE_CTYPES.get(atype)
        if ctype is None:
            raise InvalidValueError(f"attribute type {_atype_str(atype)} is not supported by this wrapper")
        vals = tuple(values)
        if ctype in _INT64_CTYPES:
            vals = int64s(_name_str(name), vals, "cudnnBackendSetAttribute")
        elif ctype in _INT32_CTYPES:
            vals = int32s(_name_str(name), vals, "cudnnBackendSetAttribute", hint="")
        arr = (ctype * max(1, len(vals)))(*vals)
        self._set_raw(name, atype, len(vals), arr, vals)
        return self

    def _set_raw(self, name: Name, atype: int, count: int, arr: Any, record: tuple) -> None:
        param = self._as_parameter_
        try:
            lib.cudnnBackendSetAttribute(param, int(name), int(atype), int(count),
                                         ctypes.cast(arr, ctypes.c_void_p))
        except CudnnError as exc:
            exc.add_details(descriptor=_type_name(int(self.type)), attribute=_name_str(name),
                            attribute_type=_atype_str(atype), values=record)
            raise
        key = BackendAttributeName(int(name)) if int(name) in BackendAttributeName._value2member_map_ \
            else int(name)
        self.attributes[key] = (BackendAttributeType(atype), record)

    def set_int64(self, name: Name, values: Union[int, Iterable[int]]) -> "BackendDescriptor":
        """An int64 attribute: one int or a sequence of ints (each checked)."""
        try:
            vals: tuple = (operator.index(values),)  # type: ignore[arg-type]
        except TypeError:
            vals = tuple(values)  # type: ignore[arg-type]
        return self.set(name, _T.INT64, vals)

    def set_int32(self, name: Name, value: int) -> "BackendDescriptor":
        return self.set(name, _T.INT32, (value,))

    def set_float(self, name: Name, value: float) -> "BackendDescriptor":
        return self.set(name, _T.FLOAT, (float(value),))

    def set_double(self, name: Name, value: float) -> "BackendDescriptor":
        return self.set(name, _T.DOUBLE, (float(value),))

    def set_bool(self, name: Name, value: bool) -> "BackendDescriptor":
        return self.set(name, _T.BOOLEAN, (bool(value),))

    def set_enum(self, name: Name, atype: AType, value: int) -> "BackendDescriptor":
        """An enum-typed attribute (DATA_TYPE, CONVOLUTION_MODE, HEUR_MODE, KNOB_TYPE, ...)."""
        return self.set(name, atype, (as_int(_name_str(name), value),))

    def set_data_type(self, name: Name, dtype: Any) -> "BackendDescriptor":
        return self.set_enum(name, _T.DATA_TYPE, int(data_type(dtype)))

    def set_descriptors(self, name: Name,
                        descriptors: Sequence["BackendDescriptor"]) -> "BackendDescriptor":
        """A CUDNN_TYPE_BACKEND_DESCRIPTOR array; keeps references to them."""
        descs = list(descriptors)
        for d in descs:
            if not isinstance(d, BackendDescriptor):
                raise InvalidTypeError(f"expected BackendDescriptors, got {type(d).__name__}")
        self.set(name, _T.BACKEND_DESCRIPTOR, [_raw(d) for d in descs])
        self._refs.extend(descs)
        return self

    def set_descriptor(self, name: Name, descriptor: "BackendDescriptor") -> "BackendDescriptor":
        return self.set_descriptors(name, [descriptor])

    def set_void_ptrs(self, name: Name, pointers: Sequence[Optional[int]]) -> "BackendDescriptor":
        """A CUDNN_TYPE_VOID_PTR array (device pointers as ints; None is NULL)."""
        return self.set(name, _T.VOID_PTR, [None if p is None else int(p) or None
                                           for p in pointers])

    def set_handle(self, name: Name, handle: Any) -> "BackendDescriptor":
        """A CUDNN_TYPE_HANDLE attribute; keeps a reference to the handle object."""
        param = getattr(handle, "_as_parameter_", handle)
        raw = param.value if isinstance(param, ctypes.c_void_p) else int(param)
        self.set(name, _T.HANDLE, (raw,))
        self._refs.append(handle)
        return self

    # -- finalize -----------------------------------------------------------------------
    def finalize(self) -> "BackendDescriptor":
        """cudnnBackendFinalize; attributes are read-only afterwards."""
        param = self._as_parameter_
        try:
            lib.cudnnBackendFinalize(param)
        except CudnnError as exc:
            exc.add_details(descriptor=_type_name(int(self.type)))
            raise
        self.finalized = True
        return self

    # -- get ------------------------------------------------------------------------------
    def count(self, name: Name, atype: AType) -> int:
        """How many elements attribute ``name`` holds (a query with no array)."""
        n = ctypes.c_int64(0)
        self._get_raw(name, atype, 0, n, None)
        return int(n.value)

    def _get_raw(self, name: Name, atype: AType, requested: int, n: ctypes.c_int64,
                 arr: Any) -> None:
        param = self._as_parameter_
        try:
            lib.cudnnBackendGetAttribute(param, int(name), int(atype), int(requested),
                                         ctypes.byref(n),
                                         None if arr is None else ctypes.cast(arr, ctypes.c_void_p))
        except CudnnError as exc:
            exc.add_details(descriptor=_type_name(int(self.type)), attribute=_name_str(name),
                            attribute_type=_atype_str(atype))
            raise

    def get(self, name: Name, atype: AType, max_count: Optional[int] = None) -> tuple:
        """cudnnBackendGetAttribute -> a tuple of up to ``max_count`` values
        (default: as many as the attribute holds)."""
        atype = int(atype)
        ctype = ATTRIBUTE_CTYPES.get(atype)
        if ctype is None:
            raise InvalidValueError(f"attribute type {_atype_str(atype)} is not supported by this wrapper")
        if max_count is None:
            max_count = self.count(name, atype)
        if max_count <= 0:
            return ()
        arr = (ctype * max_count)()
        n = ctypes.c_int64(0)
        self._get_raw(name, atype, max_count, n, arr)
        k = max(0, min(int(n.value), max_count))
        return tuple(arr[:k])

    def get_int64(self, name: Name, max_count: Optional[int] = None) -> tuple[int, ...]:
        return tuple(int(v) for v in self.get(name, _T.INT64, max_count))

    def get_int64_scalar(self, name: Name) -> int:
        vals = self.get_int64(name, 1)
        if not vals:
            raise InvalidValueError(f"attribute {_name_str(name)} holds no value")
        return vals[0]

    def get_float(self, name: Name) -> float:
        return float(self.get(name, _T.FLOAT, 1)[0])

    def get_double(self, name: Name) -> float:
        return float(self.get(name, _T.DOUBLE, 1)[0])

    def get_enums(self, name: Name, atype: AType, max_count: Optional[int] = None) -> tuple[int, ...]:
        return tuple(int(v) for v in self.get(name, atype, max_count))

    def get_data_type(self, name: Name) -> DataType:
        return DataType(self.get_enums(name, _T.DATA_TYPE, 1)[0])

    def get_descriptors(self, name: Name, dtype: Union[BackendDescriptorType, int],
                        max_count: Optional[int] = None) -> list["BackendDescriptor"]:
        """A CUDNN_TYPE_BACKEND_DESCRIPTOR array read into fresh descriptors of
        type ``dtype`` (created here, as the API requires); extras are closed.
        The returned descriptors are marked finalized."""
        if max_count is None:
            max_count = self.count(name, _T.BACKEND_DESCRIPTOR)
        if max_count <= 0:
            return []
        out = [BackendDescriptor(dtype) for _ in range(max_count)]
        try:
            arr = (ctypes.c_void_p * max_count)(*[_raw(d) for d in out])
            n = ctypes.c_int64(0)
            self._get_raw(name, _T.BACKEND_DESCRIPTOR, max_count, n, arr)
        except BaseException:
            for d in out:
                d.close()
            raise
        k = max(0, min(int(n.value), max_count))
        for d in out[k:]:
            d.close()
        for d in out[:k]:
            d.finalized = True
        return out[:k]

    def get_descriptor(self, name: Name,
                       dtype: Union[BackendDescriptorType, int]) -> "BackendDescriptor":
        got = self.get_descriptors(name, dtype, 1)
        if not got:
            raise InvalidValueError(f"attribute {_name_str(name)} holds no descriptor")
        return got[0]

    def read_descriptors(self, name: Name, dtype: Union[BackendDescriptorType, int],
                         max_count: int,
                         read: Callable[["BackendDescriptor"], _R]) -> list[_R]:
        """A CUDNN_TYPE_BACKEND_DESCRIPTOR array of up to ``max_count`` elements,
        each passed to ``read`` (which returns what it needs from it); the
        elements are raw descriptors destroyed before this returns, never
        Python-owned objects (Note [descriptor reads])."""
        if max_count <= 0:
            return []
        with _RawDescriptors(int(dtype), max_count) as raw:
            n = ctypes.c_int64(0)
            self._get_raw(name, _T.BACKEND_DESCRIPTOR, max_count, n, raw.array)
            k = max(0, min(int(n.value), max_count))
            return [read(v) for v in raw.views(k)]


# Note [descriptor reads]
# ~~~~~~~~~~~~~~~~~~~~~~~
# Reading an array of descriptors out of another (an engine config's knob
# choices, an engine's knob infos, a heuristics' configs) needs descriptors of
# the element type created beforehand, as many as may come back: up to the
# knob-type count per engine config (Note [reading descriptor arrays]), some
# hundreds of thousands in a cold optimisation. BackendDescriptor objects
# (weakref finalizer, live count, destroy) cost several times more than raw
# ones, so read_descriptors() creates raw ones through unchecked bindings,
# hands ``read`` views that do not own them, and destroys them all before it
# returns. One set cannot be reused across reads: cuDNN 9.19 does not refill a
# descriptor it filled before (every config read back as the first one read).


class _Borrowed(BackendDescriptor):
    """A view of a raw descriptor this object does not own (Note [descriptor reads])."""

    __slots__ = ()

    def __init__(self, dtype: int, raw: int) -> None:  # noqa: D107 - creates nothing
        self.type = BackendDescriptorType(dtype) \
            if dtype in BackendDescriptorType._value2member_map_ else dtype
        self._handle = cudnnBackendDescriptor_t(raw)
        self.finalized = True
        self.attributes = {}
        self._refs = []

    @property
    def _as_parameter_(self) -> Any:
        return self._handle

    @property
    def handle(self) -> int:
        return self._handle.value or 0

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        """Nothing: the raw descriptor belongs to the read."""


class _RawDescriptors:
    """``count`` raw descriptors of type ``dtype`` for one read, destroyed on
    leaving the ``with`` block (Note [descriptor reads])."""

    def __init__(self, dtype: int, count: int) -> None:
        self.dtype = dtype
        self.array = (ctypes.c_void_p * count)()
        self.made = 0
        create = lib.raw("cudnnBackendCreateDescriptor")
        base = ctypes.addressof(self.array)
        step = ctypes.sizeof(ctypes.c_void_p)
        try:
            for i in range(count):
                st = create(dtype, base + i * step)
                if st:
                    raise_status(st, "cudnnBackendCreateDescriptor",
                                 descriptor_type=_type_name(dtype))
                self.made += 1
        except BaseException:
            self.destroy()
            raise

    def views(self, k: int) -> list[BackendDescriptor]:
        return [_Borrowed(self.dtype, int(v or 0)) for v in self.array[:k]]

    def destroy(self) -> None:
        destroy = lib.raw("cudnnBackendDestroyDescriptor")
        made, self.made = self.made, 0
        for v in self.array[:made]:
            destroy(v)  # a failing destroy leaks one descriptor; nothing to report to

    def __enter__(self) -> "_RawDescriptors":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()


def handle_value(handle: Any) -> Optional[int]:
    """The raw cudnnHandle_t of a Handle (or a raw pointer)."""
    param = getattr(handle, "_as_parameter_", handle)
    if isinstance(param, cudnnHandle_t):
        return param.value
    return None if param is None else int(param)
