"""``FindOptions``: how the graph backend's find() searches, as one frozen value.

Every option that changes which engine configurations find() finalizes and
times, or how it times them, is a field here. A backend holds one
``FindOptions``; its :meth:`FindOptions.key` enters the backend's
``cache_name`` and so the benchmark cache and the plan memo (Note [candidate
sets in keys] in :mod:`mucudnn.backends.base`): two differently configured
backends never share entries or plans.

>>> FindOptions().key()
'+parity+hold'
>>> FindOptions(rtc="all", top_k=None).key()
'+top_k=None+rtc=all+parity+hold'
>>> FindOptions.from_kwargs(find_rtc="none", find_repeat=5).repeat
5
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from .._cudnn.graph_descriptors import HEUR_MODE_NAMES
from ..errors import InvalidTypeError, InvalidValueError
from .graph_candidates import LONG_RUN_MS, RTC_CHOICES, SEARCH_MODES, ZERO_CHOICES

__all__ = ["FindOptions", "LEGACY_KEYWORDS", "BASELINE", "EARLIER_DEFAULTS", "default_search_name",
           "stored_search_names"]


# Note [search parity]
# ~~~~~~~~~~~~~~~~~~~~
# PyTorch's cuDNN path (aten/src/ATen/native/cudnn/Conv_v8.cpp,
# with ``cudnn.benchmark``) times every engine configuration that heuristics
# mode INSTANT (our "A") and the FALLBACK list name, runtime-compiled engines
# included, and runs the fastest. Specialised kernels (depthwise ``c1_k1``
# kernels) come from runtime-compiled engines, and some fast configurations
# rank below the top-k cut (Note [find cut-offs]), so a search with both cuts
# misses what PyTorch runs and the converted layer loses to native. With
# ``parity`` (the default) the first find() of each kernel (a layer and
# direction, at the largest micro-batch size, asked first) times every
# candidate that needs no compilation, whatever its rank (finalizing and
# timing one costs milliseconds), and, for the forward and backward-data
# of a grouped convolution and the backward-filter of a 16-bit depthwise
# one, the runtime-compiled ones within the top-k of some heuristics mode
# (each compilation costs a fraction of a second, and heuristics rank the
# specialised engines high where they apply). Other kernels'
# runtime-compiled configs follow ``rtc`` as at any other find(): the
# specialised runtime-compiled kernels PyTorch runs are a depthwise layer's
# forward and backward-data (``conv2d_c1_k1_nhwc``,
# ``dgrad2d_c1_k1_nhwc_specialized``) and, in bf16 and fp16, its
# backward-filter (``wgrad2d_c1_k1_nhwc``); for ungrouped convolutions, and
# for every other backward-filter, it runs precompiled ones (implicit
# GEMMs, cuBLASLt, CUTLASS, xmma depthwise and indexed wgrad kernels), while
# compilation is most of the planning of the kernels a converted model plans,
# its first layers and its grouped backward-filters (docs/BENCHMARKS.md,
# "Search parity"; the rule is ``graph_candidates.parity_compiles``). A
# split's chunk problems (Note [split groups]) are mucudnn's own, not what
# PyTorch runs, so their finds compile only where ``rtc`` says: each factor
# is a kernel of its own, and compiling for every one multiplied the cold
# cost of a 16-bit depthwise backward-filter whose unsplit plan won. The one
# exception is the chunks as slices of Note [which slices are searched] (one
# factor, where a compiled engine is what wins there). The finds of the
# smaller sizes after the first are cut as before and carry the
# configurations that led, runtime-compiled ones included where the first
# find compiled them: compilation is paid once per kernel, and again only
# for a configuration that won. ``tools/search_parity.py`` checks it per
# layer against the kernels PyTorch runs.


# Note [the host's share of a find]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Held timing (Note [held timing]) gives each candidate the GPU's time alone.
# Some engines issue many kernels a call: the grouped convolutions' engines
# that fit a small workspace loop over the groups (a slice, a convolution and
# a copy back for each), and cuDNN's host time to issue them can reach the
# GPU's time to run them. A step whose GPU waits for its host (an eager step
# of a grouped network on a fast GPU) pays that host time, which the held
# figure never shows. With ``host``, each timed run counts the larger of its
# GPU time (the events) and the host's time in the launch call (the clock
# around it): what the run costs a step bound by its host, and what it costs
# a step bound by its GPU where the GPU's is the larger. A plan's
# micro-batches are launches of their own, so the planner's sum over them
# counts the host's time of each. Off by default: where the GPU is the bound,
# a plan chosen for its host time gives up GPU time for nothing.


@dataclasses.dataclass(frozen=True)
class FindOptions:
    """How :class:`~mucudnn.backends.cudnn_graph.CudnnGraphBackend` searches.

    ``heuristic_modes``: which heuristics find() asks, in order (mode B is
    skipped where cuDNN does not support it). ``warmup`` / ``repeat``:
    untimed and timed runs per candidate (the median of ``repeat`` >= 3).
    ``prefilter``: skip candidates whose engine config reports more workspace
    than the cap before finalizing them. ``top_k``: finalize and time only the
    candidates among the ``k`` best-ranked of some heuristics mode, plus the
    best-ranked one that needs no workspace; None times every candidate (Note
    [find cut-offs]). ``probe_ratio``: a candidate whose first timed run is
    more than this many times the best median so far is not run again; None
    always takes the median. ``cold_ratio``: a candidate whose timed warm-up
    already took more than this many times the best median is reported with
    that one time (Note [cold probe]); None: never. ``rtc``: which configs of
    engines that compile kernels at run time find() times, ``"all"``,
    ``"first"`` or ``"none"`` (Note [runtime-compiled engines]). ``parity``:
    the first find() of a kernel times every candidate whatever its rank, and,
    for a grouped convolution's forward and backward-data, the
    runtime-compiled ones within ``top_k``, whatever ``rtc`` says (Note
    [search parity]).
    ``retime``: time the k fastest of each find() again (Note [re-timing the
    winners]). ``skip_ratio``: a config more than this many times behind the
    best at every size found before is not timed again (Note [far behind at
    another size]); None: always. ``long_ms``: a candidate whose warm-up took
    at least this many ms is reported with that one time (Note [long runs]).
    ``zero``: ``"each"`` times the best-ranked zero-workspace config at every
    find(), ``"once"`` only under a cap of 0 (Note [one zero-workspace find
    per kernel]). ``carry``: time the configs that led other sizes (Note
    [carried to other sizes]). ``fold``: also time folded configurations of
    strided first layers (Note [folded first layers]). ``split``: also time
    depthwise convolutions split into chunks of their groups where the cap
    leaves configurations out (Note [split groups]). ``pair``: also time the
    backward-filter of grouped convolutions as micro-batches in pairs on two
    streams where the cap leaves configurations out (Note [micro-batches in
    pairs]); off by default, since in training steps it sped some grouped
    networks up and slowed others. ``search``:
    ``"heuristics"`` or ``"knobs"`` (Note [knob search]), with
    ``knob_values`` values per knob and at most ``max_configs`` added configs.
    ``hold`` (the default): time the GPU alone, each candidate's timed runs
    queued on the stream held until they are all issued (Note [held
    timing]), as a step whose GPU runs behind its host runs them; off: the
    host's time to issue a call counts where the GPU waits for it.
    ``host``: each timed run counts at least the host's time to issue it
    (Note [the host's share of a find]); off (the default): the GPU's alone.
    """

    heuristic_modes: tuple[str, ...] = ("A", "B", "FALLBACK")
    warmup: int = 1
    repeat: int = 3
    prefilter: bool = True
    top_k: Optional[int] = 6
    probe_ratio: Optional[float] = 1.5
    cold_ratio: Optional[float] = 4.0
    rtc: str = "none"
    parity: bool = True
    retime: int = 2
    skip_ratio: Optional[float] = 16.0
    long_ms: Optional[float] = LONG_RUN_MS
    zero: str = "each"
    carry: bool = True
    fold: bool = True
    split: bool = True
    pair: bool = False
    search: str = "heuristics"
    knob_values: int = 6
    max_configs: int = 256
    hold: bool = True
    host: bool = False

    def __post_init__(self) -> None:
        modes = self.heuristic_modes
        if isinstance(modes, str) or not isinstance(modes, (tuple, list)):
            raise InvalidTypeError(f"heuristic_modes: expected a sequence of mode names, got "
                                   f"{modes!r}")
        modes = tuple(str(m).upper() for m in modes)
        for m in modes:
            if m not in HEUR_MODE_NAMES:
                raise InvalidValueError(f"heuristic_modes: expected some of "
                                        f"{list(HEUR_MODE_NAMES)}, got {m!r}")
        object.__setattr__(self, "heuristic_modes", modes)
        _int(self, "warmup", 0)
        _int(self, "repeat", 3)
        _int(self, "retime", 0)
        _int(self, "knob_values", 1)
        _int(self, "max_configs", 1)
        if self.top_k is not None:
            _int(self, "top_k", 1)
        for name in ("probe_ratio", "cold_ratio", "skip_ratio"):
            _ratio(self, name)
        if self.long_ms is not None:
            v = _number(self, "long_ms")
            if not v > 0.0:
                raise InvalidValueError(f"long_ms: expected None or a number of ms > 0, got "
                                        f"{self.long_ms!r}")
        for name in ("prefilter", "parity", "carry", "fold", "split", "pair", "hold", "host"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidTypeError(f"{name}: expected True or False, got "
                                       f"{getattr(self, name)!r}")
        for name, choices in (("rtc", RTC_CHOICES), ("zero", ZERO_CHOICES),
                              ("search", SEARCH_MODES)):
            if getattr(self, name) not in choices:
                raise InvalidValueError(f"{name}: expected one of {list(choices)}, got "
                                        f"{getattr(self, name)!r}")

    @classmethod
    def from_kwargs(cls, base: "FindOptions | None" = None, **kwargs: Any) -> "FindOptions":
        """``base`` (default: the defaults) with fields replaced, by field name or
        by the backend's keyword names (``find_rtc=``, ``search_knob_values=``,
        ...: :data:`LEGACY_KEYWORDS`)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        changes: dict[str, Any] = {}
        for k, v in kwargs.items():
            name = LEGACY_KEYWORDS.get(k, k)
            if name not in fields:
                raise InvalidTypeError(f"{k}: not an option of the graph backend's find(); "
                                       f"expected one of {sorted(fields | set(LEGACY_KEYWORDS))}")
            changes[name] = v
        try:
            return dataclasses.replace(base or cls(), **changes)
        except (InvalidValueError, InvalidTypeError) as exc:
            # name the argument as it was given (``find_repeat``, not ``repeat``)
            msg = str(exc)
            for k in kwargs:
                field = LEGACY_KEYWORDS.get(k, k)
                if k != field and msg.startswith(field + ":"):
                    raise type(exc)(k + msg[len(field):]) from None
            raise

    def key(self) -> str:
        """What this search adds to the backend's name in cache and plan keys:
        ``"+field=value"`` for each field that differs from :data:`BASELINE`
        (the search under which entries of the bare name were measured), in
        field order; ``fold``, ``split``, ``pair`` and ``search`` are keyed
        elsewhere (the ``"+fold"`` suffix of problems that fold, the
        ``"+split"`` and ``"+pair"`` suffixes of problems that split or pair,
        the ``"cudnn-graph+knobs"`` name), and
        ``parity``, ``hold`` and ``host`` read ``"+parity"`` / ``"+noparity"``,
        ``"+hold"`` / ``"+nohold"`` and ``"+host"`` / ``"+nohost"``."""
        parts = []
        for f in dataclasses.fields(self):
            if f.name in _KEYED_ELSEWHERE:
                continue
            v = getattr(self, f.name)
            if v == getattr(BASELINE, f.name):
                continue
            if f.name in ("parity", "hold", "host"):
                parts.append(("+" if v else "+no") + f.name)
            elif f.name == "heuristic_modes":
                parts.append("+modes=" + ",".join(v))
            else:
                parts.append(f"+{f.name}={v}")
        return "".join(parts)


def _int(opts: FindOptions, name: str, least: int) -> None:
    v = getattr(opts, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise InvalidValueError(f"{name}: expected an int >= {least}, got {v!r}")


def _number(opts: FindOptions, name: str) -> float:
    v = getattr(opts, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidValueError(f"{name}: expected None or a finite number, got {v!r}")
    object.__setattr__(opts, name, float(v))
    return float(v)


def _ratio(opts: FindOptions, name: str) -> None:
    if getattr(opts, name) is None:
        return
    if not _number(opts, name) > 1.0:
        raise InvalidValueError(f"{name}: expected None or a number > 1, got "
                                f"{getattr(opts, name)!r}")


#: The backend's keyword names of FindOptions fields (``find_<field>`` and
#: the knob search's ``search_*``); field names are accepted as they are.
LEGACY_KEYWORDS = {
    "find_warmup": "warmup", "find_repeat": "repeat", "find_prefilter": "prefilter",
    "find_top_k": "top_k", "find_probe_ratio": "probe_ratio", "find_cold_ratio": "cold_ratio",
    "find_rtc": "rtc", "find_parity": "parity", "find_retime": "retime",
    "find_skip_ratio": "skip_ratio", "find_long_ms": "long_ms", "find_zero": "zero",
    "find_carry": "carry", "find_split": "split", "find_pair": "pair",
    "search_knob_values": "knob_values",
    "search_max_configs": "max_configs", "find_hold": "hold", "find_host": "host",
}

#: Fields whose effect on the candidates is keyed by other means.
_KEYED_ELSEWHERE = ("fold", "split", "pair", "search")

#: The search under which the bare backend name's entries were measured
#: (before ``parity`` and ``hold`` existed); :meth:`FindOptions.key` is the
#: difference.
BASELINE = FindOptions(parity=False, hold=False)


def _default_options(name: str) -> Optional[FindOptions]:
    """The options a graph backend named ``name`` searches with by default
    (None for other backends)."""
    if name == "cudnn-graph":
        return FindOptions()
    if name == "cudnn-graph+knobs":
        return FindOptions(search="knobs")
    return None


def default_search_name(name: str) -> str:
    """The name a graph backend ``name`` with default :class:`FindOptions`
    keeps its measurements under (``name`` itself for other backends).

    >>> default_search_name("cudnn-graph"), default_search_name("numpy")
    ('cudnn-graph+parity+hold', 'numpy')
    """
    opts = _default_options(name)
    return name if opts is None else name + opts.key()


#: The searches that were the default before the current one, newest first,
#: as their changes to it (``hold`` off: before Note [held timing]). A cache
#: made by an earlier release keeps its measurements under their names.
EARLIER_DEFAULTS: tuple[dict[str, Any], ...] = ({"hold": False},)


def stored_search_names(name: str) -> tuple[str, ...]:
    """The names under which a cache may hold backend ``name``'s measurements
    made with default options, in the order to prefer them: the default
    search's (:func:`default_search_name`), then the earlier defaults' (a
    cache from an earlier release; :data:`EARLIER_DEFAULTS`), then the bare
    name (before ``parity`` existed). Other backends: ``name`` alone.

    >>> stored_search_names("cudnn-graph")
    ('cudnn-graph+parity+hold', 'cudnn-graph+parity', 'cudnn-graph')
    >>> stored_search_names("numpy")
    ('numpy',)
    """
    opts = _default_options(name)
    if opts is None:
        return (name,)
    earlier = [name + dataclasses.replace(opts, **changes).key() for changes in EARLIER_DEFAULTS]
    return tuple(dict.fromkeys([name + opts.key(), *earlier, name]))
