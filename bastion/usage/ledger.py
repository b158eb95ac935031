"""The daemon's side of the usage ledger: which attempt records to append, and appending them.

Records are derived from job states as the write-back pass sees them change (see
``bastion.usage.records``): an ``open`` record when an attempt is admitted, an ``end`` record
when it ends. They are appended *before* the states are written, so a daemon that dies between
the two has already recorded what its states say (and its successor may record it again,
which the reader merges by attempt id).

What makes the ledger whole across restarts and days:

- a daemon's first pass records every job it holds (open and ended attempts alike), so an end
  written to a state but not to the ledger before a crash is recorded by the next daemon;
- the first pass of each UTC day records every open attempt again, so a reader of one day
  finds the attempts that run through it without reading the days before.

Each daemon session appends to its own object per day (``ROOT/usage/<day>/<session>.jsonl``),
so two writers never share an object. The ledger grows with attempts (two records each, plus
one per open attempt per day and per restart), never with cycles: a quiet cycle writes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Iterable
from typing import Any

from bastion.bucket.store import Store
from bastion.jobspec import JobSpec
from bastion.jobstate import JobState
from bastion.usage.records import END, OPEN, attempt_record

log = logging.getLogger("bastion.daemon")

Job = tuple[str, JobSpec | None, JobState]
APPENDED_KEPT = 100_000  # records kept for the status page between its renders


def utc_day(stamp: float) -> str:
    return dt.datetime.fromtimestamp(stamp, dt.UTC).strftime("%Y-%m-%d")


def encode(records: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(
        json.dumps(r, sort_keys=True, separators=(",", ":")).encode() + b"\n" for r in records
    )


class LedgerWriter:
    """One daemon session's appends to the ledger; not thread-safe (the cycle's thread)."""

    def __init__(self, session: str | None = None) -> None:
        self.session = session or uuid.uuid4().hex[:16]
        self._seen: dict[str, tuple[str, str]] = {}  # job -> (attempt id, kind) recorded
        self._tiers: dict[str, int] = {}  # attempt id -> tier while open (a requeue clears it)
        # day -> bytes this session appended to it; None: unknown (an append failed midway)
        self._sizes: dict[str, int | None] = {}
        self._pending: list[dict[str, Any]] = []  # decided, not yet appended (a failed append)
        self._day = ""  # the day of the last full pass over open attempts
        self.appended: list[dict[str, Any]] = []  # appended since the page last took them

    @property
    def pending(self) -> int:
        return len(self._pending)

    def collect(self, changed: Iterable[Job], every: Iterable[Job], now: float) -> None:
        """Records for the jobs whose state changed; on a new day (and the first pass) for
        every job in ``every`` too. ``every`` is iterated only then."""
        day = utc_day(now)
        if day != self._day:
            first = not self._day
            self._day = day
            for job in every:
                self._note(*job, again=True, ended_too=first)
        for job in changed:
            self._note(*job)

    def forget(self, name: str) -> None:
        """The job left the daemon (archived): nothing more to record for it."""
        seen = self._seen.pop(name, None)
        if seen:
            self._tiers.pop(seen[0], None)

    def reset(self) -> None:
        """The daemon stopped acting (lost its lease): the next pass records everything."""
        self._seen.clear()
        self._day = ""

    def _note(
        self,
        name: str,
        spec: JobSpec | None,
        state: JobState,
        again: bool = False,
        ended_too: bool = True,
    ) -> None:
        previous = self._seen.get(name)
        tier = self._tiers.get(previous[0]) if previous else None
        record = attempt_record(name, spec, state, tier)
        if record is None:
            return
        key = (record["id"], record["kind"])
        if record["kind"] == OPEN and record["tier"] is not None:
            self._tiers[record["id"]] = record["tier"]
        if record["kind"] == END and not ended_too and again:
            return
        if not again and (previous == key or (previous == (record["id"], END))):
            return  # recorded already (an end is final)
        if previous and previous[0] != record["id"]:
            self._tiers.pop(previous[0], None)
        self._seen[name] = key
        if record["kind"] == END:
            self._tiers.pop(record["id"], None)
        self._pending.append(record)

    def flush(self, store: Store, now: float) -> bool:
        """Append what was decided to this session's object of today; False (kept for the
        next cycle) when the append failed."""
        if not self._pending:
            return True
        day = utc_day(now)
        data = encode(self._pending)
        size = self._sizes.get(day, 0)  # a day this session never wrote: no object yet
        try:
            store.reports.append_usage(day, self.session, data, size)
        except Exception as e:
            log.error("could not append %d record(s) to the usage ledger: %s", self.pending, e)
            self._sizes[day] = None  # unknown now: the next append asks the bucket for it
            return False
        self._sizes[day] = None if size is None else size + len(data)
        self.appended.extend(self._pending)
        del self.appended[:-APPENDED_KEPT]  # bounded when no page takes them
        self._pending.clear()
        return True
