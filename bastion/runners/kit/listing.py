"""A listing made once per daemon cycle and shared by every caller of that cycle.

Why: a poll must not ask a provider about one attempt. The runner lists a whole zone (or the
agents' records, or a cluster's jobs) once, and every poll of the cycle looks its attempt up
in that listing, so a cycle costs O(zones), not O(jobs). Once a daemon drives the cycles
(:meth:`CycleListing.begin_cycle`) a listing lasts exactly one cycle, however long it takes
(a time-to-live would list twice in a slow cycle or reuse a stale listing in the next quick
one); without a daemon (tests, tools) it lasts ``ttl`` seconds. Concurrent callers of one key
wait for one call instead of making their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_NEVER = float("-inf")


class CycleListing(Generic[K, V]):
    """``load(key)`` cached per key for one cycle (or ``ttl`` seconds before any cycle)."""

    def __init__(self, load: Callable[[K], V], ttl: float) -> None:
        self._load = load
        self.ttl = ttl
        self.per_cycle = False  # set once a daemon drives the cycles
        self._entries: dict[K, tuple[float, V]] = {}
        self._locks: dict[K, threading.Lock] = {}
        self._lock = threading.Lock()

    def begin_cycle(self) -> None:
        """A daemon cycle begins: from now on every listing lasts until the next one."""
        with self._lock:
            self.per_cycle = True
            self._entries.clear()

    def _stale(self, at: float) -> bool:
        if at == _NEVER:
            return True
        return not self.per_cycle and time.monotonic() - at > self.ttl

    def get(self, key: K, fresh: bool = False) -> V:
        """The listing of ``key``, made now if it is stale (or ``fresh`` is asked)."""
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            found = self._entries.get(key)
            if fresh or found is None or self._stale(found[0]):
                found = (time.monotonic(), self._load(key))
                self._entries[key] = found
            return found[1]

    def invalidate(self, key: K) -> None:
        """The next ``get`` of ``key`` lists afresh (a create was just made there)."""
        self._entries.pop(key, None)

    def deleted(self, key: K) -> None:
        """A delete call was made in ``key``: without a daemon the next look lists afresh;
        with one, the next cycle's listing shows it (re-listing after each of a thousand
        deletes would be a listing per job)."""
        if not self.per_cycle:
            self.invalidate(key)
