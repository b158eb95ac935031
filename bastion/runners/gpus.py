"""The host's GPU ledger: which attempt holds which GPU of this machine, for every runner that
places work here (``local`` processes, ``docker`` containers).

Each runner hands out GPU indices from its own ``gpus`` setting, but the GPUs are the host's:
a local job and a Docker job must never both be given GPU 0 (the quota counts the machine's
GPUs once). So the runners a daemon makes share one ledger (``Runners`` passes it to every
factory as ``settings["gpu_ledger"]``; a runner made on its own gets a private one), and
allocate and free through it, keyed by attempt name.

The ledger keeps nothing on disk: each runner's record of what it started is the truth (the
local runner's handles, the ``bastion.gpus`` label of Docker's containers). A runner *joins*
the ledger when it is made, with a listing of its live attempts and their GPUs; the ledger
reads every listing not read yet before its next allocation, under its lock. A restarted
daemon makes every runner that holds something of its root in its first cycle (the recovery
sweep lists them all) before it starts anything, so the ledger is whole before the first
start; a runner made later is read before the allocation that follows it. A listing that
fails (an engine briefly unreachable) is read again at the next allocation, which waits
(:class:`TryAgain`) rather than hand out a GPU the unread runner may hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bastion.runners.base import RunnerError, TryAgain

# What a runner reports when it joins: (attempt name, its GPU indices) per live attempt.
Listing = Callable[[], Iterable[tuple[str, Sequence[int]]]]

SETTING = "gpu_ledger"  # the key under which ``Runners`` hands the shared ledger to factories


class GpuLedger:
    """GPU indices held per attempt name; thread-safe (attempts start in parallel)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, ...]] = {}
        self._unread: dict[str, Listing] = {}  # runners that joined, listing not read yet

    def join(self, runner: str, listing: Listing) -> None:
        """``runner`` places work on this host's GPUs; what its live attempts hold (``listing``)
        is read before the next allocation. Joining again replaces an unread listing."""
        with self._lock:
            self._unread[runner] = listing

    def allocate(
        self, name: str, count: int, pool: Sequence[int], where: str, busy: Iterable[int] = ()
    ) -> list[int]:
        """``count`` GPUs of ``pool`` that no attempt in the ledger holds (nor any in ``busy``:
        what the caller knows is taken outside this daemon), now held by ``name``. An attempt
        that holds GPUs already keeps them (a start asked again). RunnerError when too few
        are free, naming ``where`` they were looked for."""
        if count <= 0:
            return []
        with self._lock:
            self._read_unread()
            held = self._held.get(name)
            if held is not None:
                return list(held)
            taken = {gpu for gpus in self._held.values() for gpu in gpus} | set(busy)
            free = [gpu for gpu in pool if gpu not in taken]
            if len(free) < count:
                raise RunnerError(
                    f"the job needs {count} GPUs but only {len(free)} of {len(pool)} are free "
                    f"on {where}"
                )
            self._held[name] = tuple(free[:count])
            return free[:count]

    def free(self, name: str) -> None:
        """``name`` holds nothing any more (call only once nothing of it can use its GPUs)."""
        with self._lock:
            self._held.pop(name, None)

    def held(self) -> dict[str, list[int]]:
        """Attempt name to GPU indices, as far as read (for messages and tests)."""
        with self._lock:
            return {name: list(gpus) for name, gpus in self._held.items()}

    def _read_unread(self) -> None:
        for runner, listing in list(self._unread.items()):
            try:
                found = list(listing())
            except Exception as e:  # kept unread: asked again at the next allocation
                raise TryAgain(
                    f"cannot tell which GPUs the {runner} runner's attempts hold yet: {e}"
                ) from e
            for name, gpus in found:
                if gpus:
                    self._held.setdefault(name, tuple(int(g) for g in gpus))
            del self._unread[runner]


def ledger_of(settings: Mapping[str, Any]) -> GpuLedger:
    """The ledger a factory was handed in its settings, else a private one (a runner made on
    its own, as tests do, accounts for its own attempts only, as before)."""
    ledger = settings.get(SETTING)
    return ledger if isinstance(ledger, GpuLedger) else GpuLedger()
