"""One daemon per root: a lease object written only with compare-and-swap.

The holder renews the lease every third of its duration, each write conditioned on the
generation it last wrote; a renewal that loses the race means someone took over, and the holder
stops acting at once. A waiter never trusts the holder's clock: it takes over only after the
lease object has stayed unchanged for a whole duration on its *own* monotonic clock, so clock
skew between machines cannot make two daemons act at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from bastion.objects import PreconditionFailed
from bastion.store import Store

log = logging.getLogger("bastion.lease")


class Lease:
    def __init__(
        self,
        store: Store,
        owner: str,
        duration: float = 60.0,
        same_owner: Callable[[dict], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.owner = owner
        self.duration = duration
        self.same_owner = same_owner or (lambda record: False)
        self.clock = clock
        self.token: str | None = None  # set while we hold it
        self._renewed = 0.0
        self._seen: tuple[str, float] | None = None  # (token, first seen) of another's lease
        self._waiting_for = ""

    @property
    def held(self) -> bool:
        return self.token is not None

    def hold(self) -> bool:
        """Acquire or renew as needed; True while this daemon may act."""
        now = self.clock()
        if self.token is not None:
            if now - self._renewed < self.duration / 3:
                return True
            return self._renew(now)
        return self._try_acquire(now)

    def _record(self) -> dict:
        return {"owner": self.owner, "renewed": time.time(), "duration": self.duration}

    def _renew(self, now: float) -> bool:
        try:
            self.token = self.store.write_lease(self._record(), self.token)
            self._renewed = now
            return True
        except PreconditionFailed:
            log.error(
                "lease on %s was taken by another daemon; stopping at once", self.store.root_url
            )
            self.token = None
            return False
        except Exception as e:  # bucket unreachable: we hold it until it would expire
            still = now - self._renewed < self.duration * 0.9
            log.warning(
                "could not renew the lease (%s); %s",
                e,
                "still within its term" if still else "it may expire: pausing",
            )
            if not still:
                self.token = None
            return still

    def _try_acquire(self, now: float) -> bool:
        try:
            current = self.store.read_lease()
            if current is None:
                return self._take(None, now, "no lease existed")
            record, token = current
            if record.get("released") or self.same_owner(record):
                return self._take(token, now, f"lease of {record.get('owner')} was released")
            if self._seen is None or self._seen[0] != token:
                self._seen = (token, now)
            waited = now - self._seen[1]
            if waited >= self.duration:
                return self._take(
                    token,
                    now,
                    f"lease of {record.get('owner')} expired (unchanged for {waited:.0f}s)",
                )
            holder = str(record.get("owner"))
            if holder != self._waiting_for:
                log.warning(
                    "another daemon (%s) holds the lease on %s; waiting until it is "
                    "released or unchanged for %.0fs",
                    holder,
                    self.store.root_url,
                    self.duration,
                )
                self._waiting_for = holder
        except Exception as e:
            log.warning("could not read the lease: %s", e)
        return False

    def _take(self, expected: str | None, now: float, why: str) -> bool:
        try:
            self.token = self.store.write_lease(self._record(), expected)
        except PreconditionFailed:
            log.info("another daemon took the lease first")
            self._seen = None
            return False
        self._renewed = now
        self._seen = None
        self._waiting_for = ""
        log.info("took the lease on %s: %s", self.store.root_url, why)
        return True

    def release(self) -> None:
        if self.token is None:
            return
        try:
            self.store.write_lease({**self._record(), "released": True}, self.token)
        except Exception as e:
            log.warning("could not release the lease: %s", e)
        self.token = None
