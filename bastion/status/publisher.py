"""Writing the status page off the cycle's path.

The cycle offers a page at most every ``every_cycles`` cycles, with a count of the changes to
its jobs (a state or spec replaced, a job come or gone: ``Context.job_changes``) and a way to
list them. A page is made only when something changed (that count, the queue summary, new
ledger records) or it is REFRESH_SECONDS old, so a live daemon's page is never a minute old
and a quiet one is not rewritten each cycle. The jobs are listed (references, no copy of a
state, no I/O) only when they changed: a page refreshed for its age alone is made from the
last ``JobsView``, so a quiet queue of 100,000 jobs costs no pass over them. One background
thread renders and writes the page; while it runs, offers are declined, so at most one render
is in flight and its cost never adds up behind the cycle.

The page's ledger view is read once (the last 7 days, in the background) and then kept up by
the records the daemon appends; the queue-length samples are kept in ``status.json`` and read
back by the next daemon.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bastion.bucket.store import Store
from bastion.jobstate import Outcome
from bastion.status.data import DAY, RECENT_SHOWN, WEEK, Job, JobsView, jobs_view, page_data
from bastion.status.html import render
from bastion.usage.report import Attempt, merge, read_attempts

log = logging.getLogger("bastion.daemon")
EVERY_CYCLES = 5  # at most one render per this many cycles
REFRESH_SECONDS = 30.0  # rewritten at least this often, changed or not (the page's age)
QUEUE_SAMPLE_SECONDS = 300.0  # one queue-length point per 5 minutes: 288 a day
NOTED_OUTCOMES = (Outcome.FAILED, Outcome.REJECTED)


class PagePublisher:
    def __init__(self, store: Store, every_cycles: int = EVERY_CYCLES) -> None:
        self.store = store
        self.every_cycles = every_cycles
        self.daemon = f"written by the daemon on {socket.gethostname()} pid {os.getpid()}"
        self._busy = threading.Lock()
        self._thread: threading.Thread | None = None
        self._attempts: dict[str, Attempt] | None = None  # read at the first render
        self._records: list[dict[str, Any]] = []  # appended since the last render
        self._queue_lengths: list[list[float]] | None = None
        self._finished: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_SHOWN)
        self._fingerprint: tuple[int, int] | None = None
        self._view: JobsView | None = None  # of the jobs at the last change (data.JobsView)
        self._written_at = -REFRESH_SECONDS
        self.renders = 0
        self.last_seconds = 0.0
        self.last_bytes = 0

    def note_finished(
        self, name: str, project: str, user: str, outcome: str, reason: str, at: float
    ) -> None:
        """A job that ended failed or rejected (it may have had no attempt for the ledger)."""
        self._finished.append(
            {
                "name": name,
                "project": project,
                "user": user,
                "what": outcome,
                "reason": reason,
                "time": at,
            }
        )

    def offer(
        self,
        cycle: int,
        changes: int,
        jobs: Callable[[], Sequence[Job]],
        queue: Mapping[str, Any] | None,
        records: list[dict[str, Any]],
        now: float,
    ) -> bool:
        """On the cycle's thread: start a render when one is due (True), else nothing.
        ``changes`` grows whenever a job changes; ``jobs()`` lists them, called only then."""
        self._records.extend(records)
        if cycle % self.every_cycles:
            return False
        fingerprint = (changes, id(queue))
        quiet = fingerprint == self._fingerprint and not self._records
        if quiet and time.monotonic() - self._written_at < REFRESH_SECONDS:
            return False
        if not self._busy.acquire(blocking=False):
            return False  # the last render is still running: this one is skipped
        changed = fingerprint != self._fingerprint or self._view is None
        self._fingerprint = fingerprint
        records, self._records = self._records, []
        self._thread = threading.Thread(
            target=self._render,
            args=(list(jobs()) if changed else None, queue, records, now),
            name="status-page",
            daemon=True,
        )
        self._thread.start()
        return True

    def wait(self, timeout: float = 30.0) -> None:
        """Until the render in flight (if any) is written (tests, shutdown)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _render(
        self,
        jobs: list[Job] | None,
        queue: Mapping[str, Any] | None,
        records: list[dict[str, Any]],
        now: float,
    ) -> None:
        """Make and write the page: of ``jobs``, or (None: they did not change) of the last
        view of them."""
        started = time.perf_counter()
        try:
            if jobs is not None or self._view is None:
                self._view = jobs_view(jobs or [], queue, self.store.reports.log_link)
            attempts = self._ledger(now, records)
            lengths = self._sample_queue(self._view.counts["waiting"], now)
            data = page_data(
                root_url=self.store.root_url,
                view=self._view,
                queue=queue,
                attempts=list(attempts.values()),
                finished=list(self._finished),
                queue_lengths=lengths,
                daemon=self.daemon,
                now=now,
                log_link=self.store.reports.log_link,  # beside the page: ../logs/NAME
            )
            page = render(data).encode()
            self.store.reports.write_page(page, data)
            self._written_at = time.monotonic()
            self.renders += 1
            self.last_bytes = len(page)
        except Exception:
            self._fingerprint = None  # tried again at the next offer
            log.exception("could not write the status page")
        finally:
            self.last_seconds = time.perf_counter() - started
            self._busy.release()

    def _ledger(self, now: float, records: list[dict[str, Any]]) -> dict[str, Attempt]:
        """The last week's attempts: read from the ledger once, then kept up by the records
        this daemon appends (ended attempts older than a week are dropped)."""
        if self._attempts is None:
            self._attempts = read_attempts(self.store, now - WEEK, now)
        merge(records, into=self._attempts)
        old = [k for k, a in self._attempts.items() if a.end is not None and now - a.end > WEEK]
        for key in old:
            del self._attempts[key]
        return self._attempts

    def _sample_queue(self, waiting: int, now: float) -> list[list[float]]:
        if self._queue_lengths is None:
            try:
                earlier = self.store.reports.read_page_data() or {}
            except Exception:  # unreadable: the plot starts again
                earlier = {}
            self._queue_lengths = [
                [float(t), float(n)]
                for t, n in earlier.get("queue_lengths") or []
                if now - float(t) <= DAY
            ]
        points = self._queue_lengths
        if points and now - points[-1][0] < QUEUE_SAMPLE_SECONDS and len(points) > 1:
            points[-1] = [now, float(waiting)]  # the newest point follows the queue until then
        else:
            points.append([now, float(waiting)])
        while points and now - points[0][0] > DAY:
            points.pop(0)
        return points
