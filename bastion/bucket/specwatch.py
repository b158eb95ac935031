"""Which specs a cycle looks at: those users marked, and now and then every spec.

Listing ``jobs/active/`` costs O(N): at 10,000 waiting jobs 13 requests (pages of 800 names)
and the parse of 10,000 entries, every cycle, for cycles in which nothing or one job changed.
So the Python API and the CLI (``launch.api.Client``), after creating or replacing a spec, write
a *submission marker* ``jobs/user_states/_submitted-<ms>-<8 hex>-<name>``: a tiny object whose
name says "look at the spec of job <name>". Markers live beside the cancel requests (a name
starting with ``_`` is never a job name), so the one listing a cycle already made of
``jobs/user_states/`` now brings both: one request while fewer than 1,000 entries wait.

It is an inbox, not a log. The daemon reads the spec each marker names, with the listing token
of the bytes it read (``store.specs.read_with_token``, one request), takes it in as a listed
spec would be, and at the end of the cycle deletes the markers it consumed (in the effects pool,
one batch request per 100 on GCS). So the prefix holds only what is not yet taken in, its
listing costs O(new) whatever came before, and no client's clock is trusted: the time in the
name only sorts markers for a human listing the bucket, and a unique part keeps a second write
of the same spec from being lost when the first one's marker is deleted. While a burst waits
(the last look saw ``MARKERS_PER_LOOK`` markers or more), a look lists only the oldest
``MARKERS_PER_LOOK`` markers (a ranged listing: GCS startOffset/endOffset, S3 StartAfter, a
local directory's names before any stat) and the cancel requests around them, so taking in
100,000 specs costs O(100,000) listed names, not 100 full listings of what is left.

What a marker cannot tell (plain tools write none) the full listing still finds, by token, as
before: a spec copied in with ``gsutil cp``, replaced or deleted by hand, or written by an older
client. It runs in the first cycle after a daemon starts acting (recovery needs it), every cycle
while the last one found fewer than ``EVERY_CYCLE_BELOW`` specs (then it costs a single request
and plain tools lose nothing), and otherwise every ``FULL_LISTING_SECONDS``, or every
``LISTING_SECONDS_PER_SPEC`` per spec listed when that is longer (a listing's CPU is linear in
the queue, its period too, so an idle daemon's cost stays flat). That bounds the extra latency
of a plain-tool write on a large queue (100,000 specs: 200 s); cancels are unchanged
(requests are read every cycle), and a cancel request naming a job the daemon has not seen
yet makes it read that job's spec first, so the cancel is applied, not dropped as stale.

Nothing is lost on failures: markers are listed before the full spec listing (a marker is
written after its spec, so a full listing taken later covers what it names); a marker is
deleted only after its spec was read (or found absent); a failed read keeps it for the next
cycle; a failed delete is retried the next cycle, without reading the spec again (it was
taken in); a daemon that dies in between, or stops acting, starts with a full listing and reads
what it left.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from bastion.bucket.jobs import is_marker, marked_job
from bastion.bucket.objects import ObjectInfo
from bastion.bucket.store import Store
from bastion.jobspec import name_problem

log = logging.getLogger("bastion.bucket.specwatch")

FULL_LISTING_SECONDS = 30.0  # the longest a spec written by plain tools waits to be seen
# ... on a large queue, a listing's CPU is paid at most once per this many seconds per spec
# it lists (100,000 specs: every 200 s), so an idle daemon's cost does not grow with its queue.
LISTING_SECONDS_PER_SPEC = 0.002
# A listing of at most GcsObjects.SPLIT_EVERY (800) names is one request: then every cycle.
EVERY_CYCLE_BELOW = 801
# Markers a look takes at most (the daemon's intake per cycle). While more wait, the next look
# lists only the oldest this many (a ranged listing) and the cancel requests around them: 100,000
# markers listed in full every cycle, to take 1,000 in, made a 100,000-spec intake quadratic.
MARKERS_PER_LOOK = 1000


@dataclass
class Look:
    """What one cycle saw users write."""

    requests: dict[str, ObjectInfo]  # cancel requests, by job name
    markers: dict[str, str]  # submission marker -> the job it names
    specs: dict[str, ObjectInfo] | None  # every spec and its token, when the listing ran
    now: float
    malformed: list[str] = field(default_factory=list)  # markers no client writes
    more_markers: bool = False  # a ranged look filled its window: more wait behind it

    @property
    def full(self) -> bool:
        return self.specs is not None


class SpecWatch:
    """The cycle's look at ``jobs/user_states/`` and, when due, ``jobs/active/``."""

    def __init__(
        self,
        store: Store,
        full_listing_seconds: float = FULL_LISTING_SECONDS,
        every_cycle_below: int = EVERY_CYCLE_BELOW,
        markers_per_look: int = MARKERS_PER_LOOK,
    ) -> None:
        self.store = store
        self.full_listing_seconds = full_listing_seconds
        self.every_cycle_below = every_cycle_below
        self.markers_per_look = markers_per_look
        self._ranged = False  # the last look saw a window's worth of markers: list ranges
        self._last_full: float | None = None  # when the last full listing was taken in
        self._last_count = 0  # specs it found
        self._consumed: list[str] = []  # markers taken in this cycle, not yet handed off
        self._deleting: set[str] = set()  # consumed markers whose delete is in flight
        self._undeleted: set[str] = set()  # consumed markers whose delete failed: retried
        self._lock = threading.Lock()
        self._listed: set[str] = set()  # what the last look listed in jobs/user_states/

    def glance(self) -> bool:
        """Between cycles: whether jobs/user_states/ lists a marker or a cancel request the
        last look did not (one listing request), so the next cycle need not wait its poll:
        submit to running in about a glance's period. A failed listing says no. After a
        ranged look (a burst's markers still wait) it says yes without listing them all."""
        if self._ranged:
            return True
        try:
            entries = self.store.requests.list()
        except Exception:  # the next cycle's look reports what is wrong
            return False
        return any(entry not in self._listed for entry in entries)

    def forget(self) -> None:
        """The daemon stopped acting: the next look lists everything, and what it consumed
        but did not delete stays for whoever acts next."""
        self._last_full = None
        self._ranged = False
        self._consumed = []
        with self._lock:
            self._undeleted.clear()

    def due(self, now: float) -> bool:
        """Whether this cycle needs the full spec listing (see the module docstring)."""
        return (
            self._last_full is None
            or self._last_count < self.every_cycle_below
            or now - self._last_full >= self.listing_period()
        )

    def listing_period(self) -> float:
        """Seconds between full listings: FULL_LISTING_SECONDS, longer on a large queue."""
        return max(self.full_listing_seconds, self._last_count * LISTING_SECONDS_PER_SPEC)

    def look(self, now: float, full: bool = False) -> Look:
        """The requests and markers, then, if ``full`` or due, every spec: in this order, so
        the spec listing covers each marker it comes with."""
        with self._lock:  # before the listing: a delete that ends in between is not listed
            deleting = self._deleting | self._undeleted
        entries, more = self._entries(len(deleting))
        self._listed = set(entries)
        look = Look(requests={}, markers={}, specs=None, now=now, more_markers=more)
        for entry, info in entries.items():
            if not is_marker(entry):
                look.requests[entry] = info
            elif entry not in deleting:
                name = marked_job(entry)
                if name is None or name_problem(name):
                    look.malformed.append(entry)
                else:
                    look.markers[entry] = name
        for entry in look.malformed:
            log.error(
                "%s is not a submission marker Bastion writes "
                "(_submitted-<13 digits>-<8 hex digits>-<job name>); deleting it (a spec it "
                "meant is still found by the full listing within %gs)",
                self.store.requests.url(entry),
                self.listing_period(),
            )
        self._ranged = len(look.markers) + len(look.malformed) >= self.markers_per_look
        if full or self.due(now):
            look.specs = self.store.specs.list()
        return look

    def _entries(self, deleting: int) -> tuple[dict[str, ObjectInfo], bool]:
        """jobs/user_states/: in one listing while it is small; after a look that filled its
        window, the cancel requests and only the oldest window of markers (plus those being
        deleted, which sort first and are left out), and whether that window was full."""
        if not self._ranged:
            return self.store.requests.list(), False
        window = self.markers_per_look + deleting
        markers = self.store.requests.list_markers(window)
        return self.store.requests.list_cancels() | markers, len(markers) >= window

    def not_to_take(self) -> set[str]:
        """The markers a look made now must leave out: those consumed this cycle (until
        ``hand_off``), those being deleted, those whose delete failed (for ``peek``, whose
        listing runs while the cycle goes on)."""
        with self._lock:
            return set(self._consumed) | self._deleting | self._undeleted

    def peek(self, skip: set[str]) -> dict[str, str]:
        """The oldest window of markers but ``skip`` (``not_to_take``), each with the job it
        names: what the next look takes in while a burst waits. One ranged listing; it
        changes nothing here (bastion/daemon/prefetch.py reads their specs ahead)."""
        markers = self.store.requests.list_markers(self.markers_per_look + len(skip))
        named = {m: marked_job(m) for m in markers if m not in skip}
        return {m: name for m, name in named.items() if name and not name_problem(name)}

    def taken_in(self, look: Look, unread: set[str]) -> None:
        """The cycle took ``look`` in, except the specs in ``unread`` (their read failed, so
        their markers stay, to be read again next cycle): the others are consumed."""
        if look.specs is not None:
            self._last_full, self._last_count = look.now, len(look.specs)
        self._consumed.extend(m for m, name in look.markers.items() if name not in unread)
        self._consumed.extend(look.malformed)

    def hand_off(self) -> list[str]:
        """The consumed markers, and those whose delete failed before, to delete (``delete``,
        in the effects pool) once the cycle's own requests are sent: deleting is no one's
        hurry, and a busy cycle's pool and bucket should serve its starts first. Until the
        delete succeeds they are not taken in again (they were, and a listing still shows
        them)."""
        markers, self._consumed = self._consumed, []
        with self._lock:
            markers.extend(sorted(self._undeleted))
            self._undeleted.clear()
            self._deleting.update(markers)
        return markers

    def delete(self, markers: list[str]) -> None:
        """In the effects pool, all in one call (batch requests on GCS and S3). A marker whose
        delete failed is not taken in again (its spec was read, a second read would only cost
        a request): it is handed off again, to be deleted next cycle."""
        why = ""
        try:
            failed = self.store.requests.delete_markers(markers)
        except Exception as e:  # the call itself failed: every marker is retried
            failed, why = list(markers), f": {e}"
        if failed:
            log.warning(
                "could not delete %d of %d submission markers (%s, ...)%s; retried next cycle",
                len(failed),
                len(markers),
                self.store.requests.url(failed[0]),
                why,
            )
        with self._lock:
            self._deleting.difference_update(markers)
            self._undeleted.update(failed)
