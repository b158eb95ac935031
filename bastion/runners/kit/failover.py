"""Where not to create for a while, and what a failed create means for its attempt.

Why: a provider out of capacity (a stockout), out of quota, or failing creates for a reason
that may pass (an internal error, a machine preempted while it was made) must not be asked
again at once, or the daemon's requeued attempts turn into a hot loop of creates. The blocks
live in memory with an expiry: a stockout blocks its place (a zone) for ``block_seconds``, a
quota its region, and any other failed create backs its place off exponentially
(``backoff_seconds * 2**k`` up to ``backoff_max_seconds``, ``k`` its failed creates in a row),
until a create there comes up (:meth:`Failover.came_up`). A start with every place blocked
names each reason and until when, without calling the provider.

Places are strings the runner chooses (a zone; a cluster or a partition for other runners);
``region_of`` names the wider place a quota covers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from bastion.runners.base import AttemptPhase, Observation


def brief(text: str, limit: int = 200) -> str:
    """One line of at most ``limit`` characters (a provider's message can be long)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Blocks:
    """Places and regions not to create in until an expiry, with the reason to show; and each
    place's failed creates in a row, which make its next backoff longer."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        region_of: Callable[[str], str] | None = None,
    ) -> None:
        self.clock = clock  # expiries
        self.wall = wall  # "until when", for people
        self.region_of = region_of
        self._until: dict[str, tuple[float, str]] = {}
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def block(self, key: str, reason: str, seconds: float) -> str:
        """Block ``key`` (``zone:Z``, ``region:R``, ``backoff:Z``) for ``seconds``; the reason as
        shown, with the time (UTC) the block ends."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(self.wall() + seconds))
        shown = f"{reason}; blocked until {stamp}"
        with self._lock:
            self._until[key] = (self.clock() + seconds, shown)
        return shown

    def back_off(self, zone: str, reason: str, base: float, cap: float) -> str:
        """A create failed in ``zone``: block it for ``base * 2**k`` seconds (at most ``cap``),
        ``k`` being its failures in a row before this one."""
        with self._lock:
            k = self._failures.get(zone, 0)
            self._failures[zone] = k + 1
        seconds = min(base * 2 ** min(k, 40), cap)
        n = "1 failed create" if k == 0 else f"{k + 1} failed creates in a row"
        why = f"{reason} ({n} in {zone}: backing off {seconds:.0f} s)"
        return self.block(f"backoff:{zone}", why, seconds)

    def succeeded(self, zone: str) -> None:
        """A create in ``zone`` came up: its next failure backs off from the start again."""
        with self._lock:
            self._failures.pop(zone, None)

    def failures(self, zone: str) -> int:
        with self._lock:
            return self._failures.get(zone, 0)

    def reason(self, zone: str) -> str | None:
        """Why ``zone`` is blocked (its own block, its region's or its backoff; the one that
        lasts longest), or None."""
        now = self.clock()
        keys = [f"zone:{zone}", f"backoff:{zone}"]
        if self.region_of is not None:
            keys.append(f"region:{self.region_of(zone)}")
        with self._lock:
            found = [self._until.get(key, (0.0, "")) for key in keys]
        live = [(until, why) for until, why in found if until > now]
        return max(live)[1] if live else None


class Failover:
    """The blocks, and the classification of a failed create into an :class:`Observation`.

    A failed create is counted once per attempt however often it is polled, and not at all
    for an attempt we stopped ourselves (a create cut short by our own delete)."""

    def __init__(
        self,
        block_seconds: float,
        backoff_seconds: float,
        backoff_max_seconds: float,
        region_of: Callable[[str], str] | None = None,
    ) -> None:
        self.block_seconds = block_seconds
        self.backoff_seconds = backoff_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.blocks = Blocks(region_of=region_of)
        self._lock = threading.Lock()
        self._failed_creates: set[str] = set()  # attempts whose failed create was counted
        self._stopped: set[str] = set()  # attempts we asked to stop (their end is ours)

    def reason(self, place: str) -> str | None:
        """Why not to create in ``place`` now, or None."""
        return self.blocks.reason(place)

    def stockout(self, place: str, message: str) -> Observation:
        """No capacity in ``place``: blocked for ``block_seconds``; FAILED, retryable."""
        self.blocks.block(f"zone:{place}", f"stockout in {place}", self.block_seconds)
        return Observation(AttemptPhase.FAILED, f"stockout in {place}: {message}", retryable=True)

    def quota(self, region: str, why: str) -> str:
        """A quota of ``region`` is exhausted: blocked for ``block_seconds``; the shown reason."""
        return self.blocks.block(f"region:{region}", why, self.block_seconds)

    def create_failed(
        self,
        name: str,
        place: str,
        why: str,
        phase: AttemptPhase = AttemptPhase.FAILED,
        reason: str | None = None,
    ) -> Observation:
        """Attempt ``name``'s create failed in ``place`` for a reason that may pass (neither
        a stockout nor a quota): ``phase`` (FAILED, or PREEMPTED while creating), retryable,
        and the place backs off exponentially (:meth:`Blocks.back_off`), so that the daemon's
        new attempt tries the next place and, once every place is blocked, waits instead of
        making create calls in a loop. ``reason``: the block's reason, when the first 200
        characters of ``why`` would not do."""
        with self._lock:
            count = name not in self._failed_creates and name not in self._stopped
            self._failed_creates.add(name)
        if count:
            self.blocks.back_off(
                place, reason or brief(why), self.backoff_seconds, self.backoff_max_seconds
            )
        return Observation(phase, why, retryable=True)

    def came_up(self, place: str) -> None:
        """An attempt's machines are up and every worker started: creates work in ``place``."""
        self.blocks.succeeded(place)

    def stopped(self, name: str) -> None:
        """We asked attempt ``name`` to stop: its end is ours (no backoff, no other cause)."""
        with self._lock:
            self._stopped.add(name)

    def was_stopped(self, name: str) -> bool:
        with self._lock:
            return name in self._stopped

    def forget(self, name: str) -> None:
        with self._lock:
            self._stopped.discard(name)
            self._failed_creates.discard(name)
