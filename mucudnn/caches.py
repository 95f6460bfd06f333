"""The one LRU helper, and the registry that :func:`mucudnn.clear_caches` empties.

Every in-memory cache of mucudnn is an :class:`LRU` with a name, a bound and
an owner (docs/DESIGN.md lists them all: what, key, bound, owner, how
cleared). Creating one registers it (weakly), so :func:`clear_all` reaches
every live cache, including those that belong to one backend or one layer.
Values that hold resources are released by ``on_evict`` when dropped, whether
by the bound, by :meth:`LRU.clear` or by :meth:`LRU.pop`.

>>> c = LRU("example", maxsize=2)
>>> c.put("a", 1); c.put("b", 2); c.put("c", 3)
>>> list(c.keys()), c.get("a")
(['b', 'c'], None)
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, Iterator, TypeVar
from .errors import InvalidValueError

__all__ = ["LRU", "clear_all", "live_caches"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_registry: "weakref.WeakSet[LRU[Any, Any]]" = weakref.WeakSet()
_registry_lock = threading.Lock()


class LRU(Generic[K, V]):
    """A bounded, thread-safe map that forgets its least recently used entries.

    ``name`` identifies the cache in docs/DESIGN.md and in :func:`live_caches`;
    ``maxsize`` is the most entries kept; ``on_evict(key, value)`` runs for each
    entry dropped (never while the lock is held, so it may call back in).
    """

    __slots__ = ("name", "maxsize", "_on_evict", "_data", "_lock", "__weakref__")

    def __init__(self, name: str, maxsize: int,
                 on_evict: Callable[[K, V], None] | None = None) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise InvalidValueError(f"maxsize: expected an int >= 1, got {maxsize!r}")
        self.name = str(name)
        self.maxsize = maxsize
        self._on_evict = on_evict
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        with _registry_lock:
            _registry.add(self)

    def get(self, key: K, default: Any = None) -> Any:
        """The value of ``key`` (now the most recent), or ``default``."""
        with self._lock:
            try:
                v = self._data[key]
            except KeyError:
                return default
            self._data.move_to_end(key)
            return v

    def peek(self, key: K, default: Any = None) -> Any:
        """The value of ``key`` or ``default``, without the lock and without
        making it the most recent: for hot paths whose misses are cheap to
        refill (a read of the underlying dict is atomic under the GIL).

        >>> c = LRU("peek example", maxsize=1); c.put("a", 1)
        >>> c.peek("a"), c.peek("b", 0)
        (1, 0)
        """
        return self._data.get(key, default)

    def put(self, key: K, value: V) -> None:
        """Store ``value`` under ``key``, dropping the oldest entries over the bound."""
        dropped: list[tuple[K, V]] = []
        with self._lock:
            old = self._data.pop(key, _MISSING)
            if old is not _MISSING and old is not value:
                dropped.append((key, old))  # type: ignore[arg-type]
            self._data[key] = value
            while len(self._data) > self.maxsize:
                dropped.append(self._data.popitem(last=False))
        self._evict(dropped)

    def get_or_create(self, key: K, make: Callable[[], V]) -> V:
        """The value of ``key``, made by ``make()`` and stored when absent.

        ``make`` runs outside the lock; if two threads race, the first stored wins
        and the other value is evicted at once.
        """
        v = self.get(key, _MISSING)
        if v is not _MISSING:
            return v  # type: ignore[return-value]
        new = make()
        with self._lock:
            v = self._data.get(key, _MISSING)
            if v is _MISSING:
                self._data[key] = new
                dropped = []
                while len(self._data) > self.maxsize:
                    dropped.append(self._data.popitem(last=False))
                won = True
            else:
                dropped, won = [(key, new)], False
        self._evict(dropped)
        return new if won else v  # type: ignore[return-value]

    def pop(self, key: K) -> None:
        """Drop ``key`` (evicting its value) if present."""
        with self._lock:
            v = self._data.pop(key, _MISSING)
        if v is not _MISSING:
            self._evict([(key, v)])  # type: ignore[list-item]

    def clear(self) -> None:
        """Drop every entry (each evicted)."""
        with self._lock:
            dropped = list(self._data.items())
            self._data.clear()
        self._evict(dropped)

    def _evict(self, dropped: list[tuple[K, V]]) -> None:
        if self._on_evict is None:
            return
        for k, v in dropped:
            self._on_evict(k, v)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._data)

    def values(self) -> list[V]:
        with self._lock:
            return list(self._data.values())

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"LRU({self.name!r}, {len(self._data)}/{self.maxsize})"


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def live_caches() -> list[LRU[Any, Any]]:
    """Every LRU alive now (process-wide and per-object ones)."""
    with _registry_lock:
        return list(_registry)


def clear_all() -> None:
    """Empty every live cache (evicting, so held resources are released)."""
    for c in live_caches():
        c.clear()
