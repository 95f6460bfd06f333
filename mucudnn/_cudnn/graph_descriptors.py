"""Typed builders of the backend-API descriptors a convolution graph needs, and
the stable engine-configuration id.

Build order (each step finalizes what it builds):

    tensor x3 -> convolution -> operation (forward / backward data / backward
    filter, alpha and beta baked in) -> operation graph -> engine heuristics ->
    engine configs -> [engine (global index) + knob choices -> engine config]
    -> execution plan (needs a cuDNN handle, so a GPU) -> variant pack
    (pointers) -> cudnnBackendExecute

Groups are implied by the tensors (cudnn_graph.h, convolution forward operation
notes): x is [N, G*C, ...], w is [G*K, C, ...], y is [N, G*K, ...]; the
convolution descriptor has no group count.

An engine configuration is named by :func:`format_engine_config_id`:
``"e<global index>"`` followed by ``";k<knob type>=<value>"`` per knob choice,
knob types ascending, e.g. ``"e12;k2=3;k14=1"``; :func:`parse_engine_config_id`
reads it back, so a plan stored as JSON or in the SQLite cache can be rebuilt.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from ..problem import Direction, packed_strides
from . import loader
from .backend_api import BackendDescriptor
from .errors import CudnnError, IntFieldTypeError
from .prototypes import lib, raise_status
from .intrange import as_int
from .enums import (
    BACKEND_MIN_VERSION, BackendKnobType, BackendAttributeName as A, BackendAttributeType as T,
    BackendBehaviorNote,
    BackendDescriptorType as D, BackendHeurMode, BackendNumericalNote, ConvolutionMode,
    data_type,
)
from ..errors import InvalidValueError

log = logging.getLogger("mucudnn")

__all__ = [
    "UID_X", "UID_W", "UID_Y", "EngineConfigInfo", "format_engine_config_id",
    "parse_engine_config_id", "tensor", "convolution", "convolution_operation",
    "operation_graph", "engine_heuristics", "heuristic_engine_configs",
    "heuristic_engine_config_infos", "engine", "knob_choice",
    "engine_config", "engine_config_info", "engine_info", "execution_plan",
    "plan_workspace_size", "variant_pack", "fast_variant_pack", "uid_array", "ConvGraph",
    "pointer_alignment", "MAX_ALIGNMENT",
    "HEUR_MODE_NAMES", "KnobInfo", "engine_knob_infos",
]

#: Tensor unique ids, in forward naming (dx is "x", dw is "w", dy is "y").
UID_X, UID_W, UID_Y = 1, 2, 3
#: The largest byte alignment mucudnn declares for a tensor.
MAX_ALIGNMENT = 16

HEUR_MODE_NAMES = {"A": BackendHeurMode.A, "B": BackendHeurMode.B,
                   "FALLBACK": BackendHeurMode.FALLBACK, "INSTANT": BackendHeurMode.INSTANT}


# -- engine-configuration ids -----------------------------------------------------------

_ID_RE = re.compile(r"e(\d+)((?:;k\d+=-?\d+)*)")
_KNOB_RE = re.compile(r";k(\d+)=(-?\d+)")


def format_engine_config_id(global_index: int, knobs: Iterable[tuple[int, int]] = ()) -> str:
    """``"e<index>;k<type>=<value>..."`` with knob types ascending.

    >>> format_engine_config_id(12, [(14, 1), (2, 3)])
    'e12;k2=3;k14=1'
    """
    idx = int(global_index)
    if idx < 0:
        raise InvalidValueError(f"global_index: expected >= 0, got {global_index}")
    ks = sorted((int(t), int(v)) for t, v in knobs)
    types = [t for t, _ in ks]
    if len(set(types)) != len(types):
        raise InvalidValueError(f"knobs: a knob type appears twice in {ks}")
    if any(t < 0 for t in types):
        raise InvalidValueError(f"knobs: knob types must be >= 0, got {types}")
    return f"e{idx}" + "".join(f";k{t}={v}" for t, v in ks)


def parse_engine_config_id(algo: Any) -> tuple[int, tuple[tuple[int, int], ...]]:
    """``"e12;k2=3;k14=1"`` -> ``(12, ((2, 3), (14, 1)))`` (knobs sorted by type).

    Raises ValueError for anything else (legacy-API integer algorithms included).
    """
    if not isinstance(algo, str):
        raise InvalidValueError(
            f"algo: expected a cudnn-graph engine-config id like 'e12;k2=3', got {algo!r} "
            f"({type(algo).__name__}); legacy-API algorithm numbers do not name graph engines")
    s = algo.strip().replace(" ", "")
    m = _ID_RE.fullmatch(s)
    if m is None:
        raise InvalidValueError(
            f"algo: expected a cudnn-graph engine-config id like 'e12;k2=3', got {algo!r}")
    knobs = tuple(sorted((int(t), int(v)) for t, v in _KNOB_RE.findall(m.group(2))))
    types = [t for t, _ in knobs]
    if len(set(types)) != len(types):
        raise InvalidValueError(f"algo: knob type repeated in {algo!r}")
    return int(m.group(1)), knobs


# -- builders -----------------------------------------------------------------------------

@contextlib.contextmanager
def _building(dtype: Any, finalize: bool) -> Iterator[BackendDescriptor]:
    """A new descriptor of type ``dtype`` for the block to set attributes on;
    finalized after the block when ``finalize``; closed if anything raises."""
    d = BackendDescriptor(dtype)
    try:
        yield d
        if finalize:
            d.finalize()
    except BaseException:
        d.close()
        raise


def _ints(name: str, values: Sequence[int]) -> tuple[int, ...]:
    """``values`` as ints (never rounded: a float raises IntFieldTypeError); their
    int64 range is checked where they are set (:meth:`BackendDescriptor.set`)."""
    try:
        seq = tuple(values)
    except TypeError:
        raise IntFieldTypeError(f"{name}: expected a sequence of ints, got {values!r}") from None
    return tuple(as_int(f"{name}[{i}]", v) for i, v in enumerate(seq))


def tensor(uid: int, dims: Sequence[int], strides: Sequence[int], dtype: Any,
           alignment: int = MAX_ALIGNMENT, virtual: bool = False,
           finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_TENSOR_DESCRIPTOR: unique id, dims and strides (canonical
    N, C, spatial... order, in elements), byte alignment of its pointers, data type."""
    d, s = _ints("dims", dims), _ints("strides", strides)
    if len(d) != len(s):
        raise InvalidValueError(f"strides: expected {len(d)} values, got {len(s)}")
    with _building(D.TENSOR_DESCRIPTOR, finalize) as t:
        t.set_int64(A.TENSOR_UNIQUE_ID, as_int("uid", uid))
        t.set_data_type(A.TENSOR_DATA_TYPE, data_type(dtype))
        t.set_int64(A.TENSOR_DIMENSIONS, d)
        t.set_int64(A.TENSOR_STRIDES, s)
        t.set_int64(A.TENSOR_BYTE_ALIGNMENT, as_int("alignment", alignment))
        if virtual:
            t.set_bool(A.TENSOR_IS_VIRTUAL, True)
    return t


def convolution(padding: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                compute_type: Any = "float32",
                mode: Union[ConvolutionMode, int] = ConvolutionMode.CROSS_CORRELATION,
                post_padding: Optional[Sequence[int]] = None,
                finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: spatial dims, compute type, mode,
    dilations, filter strides, pre- and post-paddings (post defaults to pre)."""
    p, s, dl = _ints("padding", padding), _ints("stride", stride), _ints("dilation", dilation)
    post = p if post_padding is None else _ints("post_padding", post_padding)
    if not (len(p) == len(s) == len(dl) == len(post)):
        raise InvalidValueError(f"padding/stride/dilation: expected equal lengths, got {p}, {s}, {dl}")
    with _building(D.CONVOLUTION_DESCRIPTOR, finalize) as c:
        c.set_int64(A.CONVOLUTION_SPATIAL_DIMS, len(p))
        c.set_data_type(A.CONVOLUTION_COMP_TYPE, data_type(compute_type))
        c.set_enum(A.CONVOLUTION_CONV_MODE, T.CONVOLUTION_MODE, int(mode))
        c.set_int64(A.CONVOLUTION_DILATIONS, dl)
        c.set_int64(A.CONVOLUTION_FILTER_STRIDES, s)
        c.set_int64(A.CONVOLUTION_PRE_PADDINGS, p)
        c.set_int64(A.CONVOLUTION_POST_PADDINGS, post)
    return c


#: Per direction: (descriptor type, X, W, Y, CONV_DESC, ALPHA, BETA attribute names),
#: tensors in forward naming (backward data's DX is X, backward filter's DW is W).
_OPERATION = {
    "forward": (D.OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                A.OPERATION_CONVOLUTION_FORWARD_X, A.OPERATION_CONVOLUTION_FORWARD_W,
                A.OPERATION_CONVOLUTION_FORWARD_Y, A.OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                A.OPERATION_CONVOLUTION_FORWARD_ALPHA, A.OPERATION_CONVOLUTION_FORWARD_BETA),
    "backward_data": (D.OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                      A.OPERATION_CONVOLUTION_BWD_DATA_DX, A.OPERATION_CONVOLUTION_BWD_DATA_W,
                      A.OPERATION_CONVOLUTION_BWD_DATA_DY,
                      A.OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                      A.OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                      A.OPERATION_CONVOLUTION_BWD_DATA_BETA),
    "backward_filter": (D.OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                        A.OPERATION_CONVOLUTION_BWD_FILTER_X,
                        A.OPERATION_CONVOLUTION_BWD_FILTER_DW,
                        A.OPERATION_CONVOLUTION_BWD_FILTER_DY,
                        A.OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                        A.OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                        A.OPERATION_CONVOLUTION_BWD_FILTER_BETA),
}


def _direction_key(direction: Any) -> str:
    key = getattr(direction, "value", direction)
    if key not in _OPERATION:
        key = Direction.parse(direction).value
    return key


def convolution_operation(direction: Any, x: BackendDescriptor, w: BackendDescriptor,
                          y: BackendDescriptor, conv: BackendDescriptor, alpha: float = 1.0,
                          beta: float = 0.0, double_scalars: bool = False,
                          finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_OPERATION_CONVOLUTION_{FORWARD,BACKWARD_DATA,BACKWARD_FILTER}_DESCRIPTOR.

    ``x, w, y`` in forward naming (dx, dw, dy for the backward passes). ``alpha``
    and ``beta`` are set as CUDNN_TYPE_DOUBLE when ``double_scalars`` (float64
    compute) else CUDNN_TYPE_FLOAT (the header allows either).
    """
    dtype, ax, aw, ay, ac, aa, ab = _OPERATION[_direction_key(direction)]
    with _building(dtype, finalize) as op:
        op.set_descriptor(ax, x)
        op.set_descriptor(aw, w)
        op.set_descriptor(ay, y)
        op.set_descriptor(ac, conv)
        if double_scalars:
            op.set_double(aa, alpha)
            op.set_double(ab, beta)
        else:
            op.set_float(aa, alpha)
            op.set_float(ab, beta)
    return op


def operation_graph(ops: Sequence[BackendDescriptor], handle: Any = None,
                    finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR of ``ops``; ``handle`` (a cuDNN
    Handle) is set when given (CUDNN_ATTR_OPERATIONGRAPH_HANDLE)."""
    with _building(D.OPERATIONGRAPH_DESCRIPTOR, finalize) as g:
        g.set_descriptors(A.OPERATIONGRAPH_OPS, list(ops))
        if handle is not None:
            g.set_handle(A.OPERATIONGRAPH_HANDLE, handle)
    return g


def engine_heuristics(graph: BackendDescriptor, mode: Union[BackendHeurMode, int, str],
                      finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR for ``graph`` in ``mode`` (A, B, FALLBACK...)."""
    if isinstance(mode, str):
        mode = HEUR_MODE_NAMES[mode.upper()]
    with _building(D.ENGINEHEUR_DESCRIPTOR, finalize) as h:
        h.set_descriptor(A.ENGINEHEUR_OPERATION_GRAPH, graph)
        h.set_enum(A.ENGINEHEUR_MODE, T.HEUR_MODE, int(mode))
    return h


def heuristic_engine_configs(heuristics: BackendDescriptor) -> list[BackendDescriptor]:
    """CUDNN_ATTR_ENGINEHEUR_RESULTS: the engine configs, best first (finalized,
    owned by the caller)."""
    return heuristics.get_descriptors(A.ENGINEHEUR_RESULTS, D.ENGINECFG_DESCRIPTOR)


def heuristic_engine_config_infos(heuristics: BackendDescriptor
                                  ) -> list[Optional["EngineConfigInfo"]]:
    """What :func:`engine_config_info` reads of each engine config of
    CUDNN_ATTR_ENGINEHEUR_RESULTS, best first, None for one it cannot read; the
    configs themselves are raw descriptors of the read, never kept (Note
    [descriptor reads])."""
    n = heuristics.count(A.ENGINEHEUR_RESULTS, T.BACKEND_DESCRIPTOR)
    return heuristics.read_descriptors(A.ENGINEHEUR_RESULTS, D.ENGINECFG_DESCRIPTOR, n,
                                       _readable_config_info)


def _readable_config_info(cfg: BackendDescriptor) -> Optional["EngineConfigInfo"]:
    try:
        return engine_config_info(cfg)
    except CudnnError as exc:  # pragma: no cover - unreadable result
        log.debug("mucudnn: unreadable engine config: %s", exc)
        return None


def engine(graph: BackendDescriptor, global_index: int, finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_ENGINE_DESCRIPTOR: engine ``global_index`` of ``graph``."""
    with _building(D.ENGINE_DESCRIPTOR, finalize) as e:
        e.set_descriptor(A.ENGINE_OPERATION_GRAPH, graph)
        e.set_int64(A.ENGINE_GLOBAL_INDEX, as_int("global_index", global_index))
    return e


def knob_choice(knob_type: int, value: int, finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: knob ``knob_type`` set to ``value``."""
    with _building(D.KNOB_CHOICE_DESCRIPTOR, finalize) as k:
        k.set_enum(A.KNOB_CHOICE_KNOB_TYPE, T.KNOB_TYPE, int(knob_type))
        k.set_int64(A.KNOB_CHOICE_KNOB_VALUE, as_int("value", value))
    return k


def engine_config(eng: BackendDescriptor, knobs: Sequence[BackendDescriptor] = (),
                  finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: ``eng`` with knob choices ``knobs``."""
    with _building(D.ENGINECFG_DESCRIPTOR, finalize) as c:
        c.set_descriptor(A.ENGINECFG_ENGINE, eng)
        if knobs:
            c.set_descriptors(A.ENGINECFG_KNOB_CHOICES, list(knobs))
    return c


@dataclass(frozen=True)
class EngineConfigInfo:
    """What an engine config is: its id parts and its engine's notes."""

    global_index: int
    knobs: tuple[tuple[int, int], ...]
    numerical_notes: tuple[int, ...] = ()
    behavior_notes: tuple[int, ...] = ()
    #: CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE where cuDNN (>= 9.2) reports it for the
    #: config before any plan is finalized; None where it does not.
    workspace_bytes: Optional[int] = field(default=None, compare=False)

    @property
    def id(self) -> str:
        return format_engine_config_id(self.global_index, self.knobs)

    @property
    def deterministic(self) -> bool:
        return int(BackendNumericalNote.NONDETERMINISTIC) not in self.numerical_notes

    def has_note(self, note: Union[BackendNumericalNote, BackendBehaviorNote]) -> bool:
        if isinstance(note, BackendBehaviorNote):
            return int(note) in self.behavior_notes
        return int(note) in self.numerical_notes


def _type_count(cls: Any) -> int:
    """``CUDNN_*_TYPE_COUNT(S)`` of the loaded library: one more than the largest
    member of ``cls`` that exists in it (cuDNN numbers these enums densely)."""
    return _type_count_at(cls, loader.get_version())


@functools.lru_cache(maxsize=16)
def _type_count_at(cls: Any, version: int) -> int:
    return 1 + max(int(m) for name, m in cls.__members__.items()
                   if BACKEND_MIN_VERSION.get((cls, name), 0) <= version)


def _read_array(read, count_fn, requested: int):
    """Read an array attribute the way cudnn-frontend does (ask for up to the
    type count); where cuDNN refuses that, ask how many there are first."""
    try:
        return read(requested)
    except CudnnError:
        return read(count_fn())


# Note [reading descriptor arrays]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An array of descriptors (knob choices, knob infos) is read into descriptors
# created beforehand, up to the knob-type count (raw ones, Note [descriptor
# reads] in backend_api.py). Asking for the count first would save them, but
# cuDNN 9.19 answers 0 for CUDNN_ATTR_ENGINECFG_KNOB_CHOICES where the
# type-count read finds knobs: reading by that count lost every config's knobs
# (wrong plans, NOT_SUPPORTED on binding).


def engine_info(eng: BackendDescriptor) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(global index, numerical notes, behaviour notes) of a finalized engine."""
    idx = eng.get_int64_scalar(A.ENGINE_GLOBAL_INDEX)
    notes = _read_array(lambda n: eng.get_enums(A.ENGINE_NUMERICAL_NOTE, T.NUMERICAL_NOTE, n),
                        lambda: eng.count(A.ENGINE_NUMERICAL_NOTE, T.NUMERICAL_NOTE),
                        _type_count(BackendNumericalNote))
    try:
        behavior = _read_array(
            lambda n: eng.get_enums(A.ENGINE_BEHAVIOR_NOTE, T.BEHAVIOR_NOTE, n),
            lambda: eng.count(A.ENGINE_BEHAVIOR_NOTE, T.BEHAVIOR_NOTE),
            _type_count(BackendBehaviorNote))
    except CudnnError:  # pragma: no cover - read-only extra, not needed to run
        behavior = ()
    return idx, tuple(sorted(set(notes))), tuple(sorted(set(behavior)))


@dataclass(frozen=True)
class KnobInfo:
    """CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR: one knob of an engine and its range.

    >>> KnobInfo(2, 0, 10, 4).values()
    (0, 4, 8)
    >>> KnobInfo(2, 0, 100, 1).values(limit=5)
    (0, 25, 50, 75, 100)
    """

    knob_type: int
    minimum: int
    maximum: int
    stride: int = 1

    def values(self, limit: Optional[int] = None) -> tuple[int, ...]:
        """The values the knob may take (minimum to maximum by stride); where there
        are more than ``limit``, ``limit`` of them spread evenly, both ends kept."""
        step = max(1, int(self.stride))
        if self.maximum < self.minimum:
            return ()
        count = (self.maximum - self.minimum) // step + 1
        if limit is None or count <= limit:
            return tuple(self.minimum + i * step for i in range(count))
        if limit <= 1:
            return (self.minimum,)
        picks = sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})
        return tuple(self.minimum + i * step for i in picks)


def engine_knob_infos(eng: BackendDescriptor) -> tuple[KnobInfo, ...]:
    """CUDNN_ATTR_ENGINE_KNOB_INFO of a finalized engine: its knobs, by type."""
    out = _read_array(
        lambda n: eng.read_descriptors(A.ENGINE_KNOB_INFO, D.KNOB_INFO_DESCRIPTOR, n,
                                       _knob_info),
        lambda: eng.count(A.ENGINE_KNOB_INFO, T.BACKEND_DESCRIPTOR),
        _type_count(BackendKnobType))
    return tuple(sorted(out, key=lambda i: i.knob_type))


def _knob_info(k: BackendDescriptor) -> KnobInfo:
    t = k.get_enums(A.KNOB_INFO_TYPE, T.KNOB_TYPE, 1)[0]
    lo = k.get_int64_scalar(A.KNOB_INFO_MINIMUM_VALUE)
    hi = k.get_int64_scalar(A.KNOB_INFO_MAXIMUM_VALUE)
    try:
        stride = k.get_int64_scalar(A.KNOB_INFO_STRIDE)
    except (CudnnError, ValueError):  # pragma: no cover - stride is optional
        stride = 1
    return KnobInfo(int(t), int(lo), int(hi), int(stride))


def engine_config_info(cfg: BackendDescriptor) -> EngineConfigInfo:
    """Read a finalized engine config (e.g. a heuristics result): engine global
    index, knob choices (sorted by type) and the engine's notes."""
    eng = cfg.read_descriptors(A.ENGINECFG_ENGINE, D.ENGINE_DESCRIPTOR, 1, engine_info)
    if not eng:
        raise InvalidValueError("attribute ENGINECFG_ENGINE holds no descriptor")
    idx, notes, behavior = eng[0]
    knobs = _read_array(
        lambda n: cfg.read_descriptors(A.ENGINECFG_KNOB_CHOICES, D.KNOB_CHOICE_DESCRIPTOR, n,
                                       _knob_choice_value),
        lambda: cfg.count(A.ENGINECFG_KNOB_CHOICES, T.BACKEND_DESCRIPTOR),
        _type_count(BackendKnobType))
    return EngineConfigInfo(idx, tuple(sorted(knobs)), notes, behavior,
                            engine_config_workspace(cfg))


def _knob_choice_value(k: BackendDescriptor) -> tuple[int, int]:
    t = k.get_enums(A.KNOB_CHOICE_KNOB_TYPE, T.KNOB_TYPE, 1)[0]
    return int(t), int(k.get_int64_scalar(A.KNOB_CHOICE_KNOB_VALUE))


def engine_config_workspace(cfg: BackendDescriptor) -> Optional[int]:
    """CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE of a finalized engine config, in bytes:
    what its plan will need, known before finalizing one (cuDNN >= 9.2); None
    where the library is older or does not report it."""
    if loader.get_version() < BACKEND_MIN_VERSION.get(
            (A, "ENGINECFG_WORKSPACE_SIZE"), 0):
        return None
    try:
        return int(cfg.get_int64_scalar(A.ENGINECFG_WORKSPACE_SIZE))
    except CudnnError:
        return None


def execution_plan(handle: Any, cfg: BackendDescriptor, finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR of ``cfg`` on ``handle``."""
    with _building(D.EXECUTION_PLAN_DESCRIPTOR, finalize) as p:
        if handle is not None:
            p.set_handle(A.EXECUTION_PLAN_HANDLE, handle)
        p.set_descriptor(A.EXECUTION_PLAN_ENGINE_CONFIG, cfg)
    return p


def plan_workspace_size(plan: BackendDescriptor) -> int:
    """CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE of a finalized plan, in bytes."""
    return int(plan.get_int64_scalar(A.EXECUTION_PLAN_WORKSPACE_SIZE))


def variant_pack(uids: Sequence[int], pointers: Sequence[Optional[int]],
                 workspace: Optional[int] = None, finalize: bool = True) -> BackendDescriptor:
    """CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: a device pointer per tensor uid and
    the workspace pointer (None when the plan needs none)."""
    u = _ints("uids", uids)
    if len(u) != len(pointers):
        raise InvalidValueError(f"pointers: expected {len(u)} pointers, got {len(pointers)}")
    with _building(D.VARIANT_PACK_DESCRIPTOR, finalize) as v:
        v.set_int64(A.VARIANT_PACK_UNIQUE_IDS, u)
        v.set_void_ptrs(A.VARIANT_PACK_DATA_POINTERS, list(pointers))
        v.set_void_ptrs(A.VARIANT_PACK_WORKSPACE, [workspace])
    return v


# Note [variant packs on the hot path]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# CuDNN's execution takes its pointers in a variant pack, a descriptor
# finalized with them; in training every call has new pointers (fresh
# activations, gradients, workspace from the caching allocator), so each call
# builds one, as cudnn-frontend's execute does in C++. :func:`variant_pack`'s
# checked setters convert, range-check and record every value in Python on
# each of those calls. :func:`fast_variant_pack` sets the same three
# attributes through the raw entry points with arguments the caller has
# already checked (ints, the uids fixed per graph): one checked create (which
# counts the descriptor and arms its finalizer, as every descriptor's), three
# sets and a finalize.
def fast_variant_pack(uids: Any, x: int, w: int, y: int,
                      workspace: int) -> BackendDescriptor:
    """:func:`variant_pack` for the hot path (Note [variant packs on the hot
    path]): ``uids`` a ctypes int64 array of the three uids, ``x``, ``w``, ``y``
    and ``workspace`` int device pointers (``workspace`` 0 for none). Raises the
    CudnnError of the failing call.
    """
    d = BackendDescriptor(D.VARIANT_PACK_DESCRIPTOR)
    h = d.handle
    ptrs = (ctypes.c_void_p * 3)(x, w, y)
    ws = ctypes.c_void_p(workspace or None)
    set_attr = lib.raw("cudnnBackendSetAttribute")
    st = (set_attr(h, _VP_UIDS, _INT64, 3, ctypes.addressof(uids))
          or set_attr(h, _VP_DATA, _VOID_PTR, 3, ctypes.addressof(ptrs))
          or set_attr(h, _VP_WS, _VOID_PTR, 1, ctypes.addressof(ws)))
    name = "cudnnBackendSetAttribute"
    if not st:
        st = lib.raw("cudnnBackendFinalize")(h)
        name = "cudnnBackendFinalize"
    if st:
        d.close()
        raise_status(st, name, descriptor="VARIANT_PACK_DESCRIPTOR")
    d.finalized = True
    return d


def uid_array(uids: Sequence[int]) -> Any:
    """The ctypes int64 array :func:`fast_variant_pack` takes."""
    u = _ints("uids", uids)
    return (ctypes.c_int64 * len(u))(*u)


_VP_UIDS = int(A.VARIANT_PACK_UNIQUE_IDS)
_VP_DATA = int(A.VARIANT_PACK_DATA_POINTERS)
_VP_WS = int(A.VARIANT_PACK_WORKSPACE)
_INT64 = int(T.INT64)
_VOID_PTR = int(T.VOID_PTR)


def pointer_alignment(ptr: int, itemsize: int = 1) -> int:
    """The largest power of two (at most :data:`MAX_ALIGNMENT`) dividing ``ptr``
    (:data:`MAX_ALIGNMENT` for 0). ValueError when below ``itemsize``.

    >>> pointer_alignment(0x7f0000000104, 4)
    4
    """
    p = int(ptr)
    a = MAX_ALIGNMENT if p == 0 else min(MAX_ALIGNMENT, p & -p)
    if a < int(itemsize):
        raise InvalidValueError(f"pointer {p:#x} is not aligned to its element size {itemsize}")
    return a


class ConvGraph:
    """The finalized operation graph of one convolution problem and direction:
    x, w, y tensors (uids :data:`UID_X`, :data:`UID_W`, :data:`UID_Y`), the
    convolution descriptor, the operation (alpha and beta baked in) and the
    graph. ``alignments`` are the byte alignments declared for x, w, y.
    """

    def __init__(self, problem: Any, direction: Any, alpha: float = 1.0, beta: float = 0.0,
                 alignments: Sequence[int] = (MAX_ALIGNMENT,) * 3, handle: Any = None) -> None:
        self.problem = problem
        self.direction = _direction_key(direction)
        self.alpha, self.beta = float(alpha), float(beta)
        self.alignments = tuple(int(a) for a in alignments)
        self.descriptors: list[BackendDescriptor] = []
        try:
            # x and y as the problem strides them (a chunk's slices of its whole
            # tensors, Note [chunks as slices]); the filter is packed
            dims = (problem.x_dims, problem.w_dims, problem.y_dims)
            strides = (problem.x_strides, packed_strides(problem.w_dims, problem.layout),
                       problem.y_strides)
            for uid, d, st, al in zip((UID_X, UID_W, UID_Y), dims, strides, self.alignments):
                self.descriptors.append(tensor(uid, d, st, problem.dtype, al))
            self.x, self.w, self.y = self.descriptors
            self.conv = convolution(problem.padding, problem.stride, problem.dilation,
                                    problem.compute_type)
            self.descriptors.append(self.conv)
            self.op = convolution_operation(self.direction, self.x, self.w, self.y, self.conv,
                                            self.alpha, self.beta,
                                            double_scalars=problem.compute_type == "float64")
            self.descriptors.append(self.op)
            self.graph = operation_graph([self.op], handle)
            self.descriptors.append(self.graph)
        except BaseException:
            self.close()
            raise

    def engine_configs(self, mode: Union[BackendHeurMode, int, str]) -> list[BackendDescriptor]:
        """The heuristics' engine configs in ``mode``, best first (owned by the caller)."""
        with engine_heuristics(self.graph, mode) as h:
            return heuristic_engine_configs(h)

    def engine_config_infos(self, mode: Union[BackendHeurMode, int, str]
                            ) -> list[Optional["EngineConfigInfo"]]:
        """What is read of the heuristics' engine configs in ``mode``, best first
        (None: unreadable), without keeping the configs
        (:func:`heuristic_engine_config_infos`)."""
        with engine_heuristics(self.graph, mode) as h:
            return heuristic_engine_config_infos(h)

    def global_engine_count(self) -> int:
        return self.graph.get_int64_scalar(A.OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)

    @property
    def closed(self) -> bool:
        return any(d.closed for d in self.descriptors) if self.descriptors else True

    def close(self) -> None:
        for d in reversed(self.descriptors):
            d.close()

    def __enter__(self) -> "ConvGraph":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
