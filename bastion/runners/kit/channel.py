"""The agent channel: what the in-guest agents say about an attempt, and when it wins.

Why: a remote attempt has two witnesses. The provider says whether the machines exist (up,
being repaired, preempted, gone); the agents (:mod:`bastion.agent`) say, through the bucket,
whether the command started, is alive, and how it ended. The rule for which one to believe is
the same for every provider, so it is written once here:

- machines up: the agents' word, and "waiting for workers to start (k of N)" until every
  worker said ``started``; ``start_timeout`` seconds after the machines were first seen up
  with a worker still silent, the attempt fails (:meth:`AgentChannel.up`);
- machines in a transient state (repairing, restarting): the agents' word once any worker
  started, else provisioning (:meth:`AgentChannel.transient`);
- machines gone without a preemption: what the agents reported if they all finished, else
  LOST (:meth:`AgentChannel.gone`);
- machines preempted or otherwise ended by the provider: the provider's outcome, unless every
  worker had already succeeded; and only once every started worker flushed its exit record,
  or ``flush_seconds`` after the end was first seen (:meth:`AgentChannel.ended`).

Cost: the agents' records of every live attempt come from one listing of ``ROOT/agents/``
per cycle (:class:`bastion.runners.kit.listing.CycleListing`), read through one
:class:`bastion.runners.kit.records.RemoteRecords` per attempt.

A handle here is any runner's handle with ``job``, ``name`` and ``workers``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from bastion.bucket.runs import parse_run_name, run_name
from bastion.bucket.store import ObjectInfo, Store
from bastion.runners.base import AttemptPhase, Handle, Observation
from bastion.runners.kit.listing import CycleListing
from bastion.runners.kit.records import RemoteRecords

AgentListing = dict[tuple[str, str], dict[str, ObjectInfo]]


def last_lines(text: str, lines: int = 8, limit: int = 800) -> str:
    """The last non-blank ``lines`` of ``text`` as one line (" | " between them), at most
    ``limit`` characters from its end: what a failure reason can carry."""
    kept = [" ".join(line.split()) for line in text.splitlines() if line.strip()][-lines:]
    joined = " | ".join(kept)
    return joined if len(joined) <= limit else "..." + joined[-(limit - 3) :]


class AgentChannel:
    def __init__(
        self,
        store: Store,
        heartbeat_timeout: float,
        flush_seconds: float,
        start_timeout: float,
        listing_ttl: float,
    ) -> None:
        self.store = store
        self.heartbeat_timeout = heartbeat_timeout
        self.flush_seconds = flush_seconds
        self.start_timeout = start_timeout
        self.listing: CycleListing[None, AgentListing] = CycleListing(
            lambda _key: store.agents.list_all(), listing_ttl
        )
        self._lock = threading.Lock()
        self._records: dict[str, RemoteRecords] = {}
        self._ended_at: dict[str, float] = {}  # attempt -> when its end was first seen
        self._up_at: dict[str, float] = {}  # attempt -> when its machines were first seen up
        self._not_started: dict[str, Observation] = {}  # attempts failed by start_timeout
        self._settled: dict[str, dict[str, ObjectInfo]] = {}  # ended attempts' last records

    def begin_cycle(self) -> None:
        self.listing.begin_cycle()

    def agent_listing(self) -> AgentListing:
        """Every live attempt's agent records, listed once per cycle for all polls."""
        return self.listing.get(None)

    def attempt_records(self, handle: Handle) -> dict[str, ObjectInfo]:
        with self._lock:
            settled = self._settled.get(handle["name"])
        if settled is not None:
            return settled
        return self.agent_listing().get((handle["job"], handle["name"]), {})

    def settled(self, handle: Handle) -> Observation | None:
        """What the agents say once the provider says the attempt is over, from a listing of
        its records made now (see :meth:`settled_records`)."""
        return self.records(handle).observe(self.settled_records(handle), time.time())

    def settled_records(self, handle: Handle) -> dict[str, ObjectInfo]:
        """The attempt's records listed now, not the cycle's listing; kept once every worker
        has its exit record (nothing changes after that), for its output and later polls.

        Why not the cycle's listing: it may predate the agents' last records. A short job
        can start, print, exit and leave the provider between the two listings, and judging
        it from the older one called it LOST (requeued: run twice) or cut its output short."""
        name = handle["name"]
        with self._lock:
            kept = self._settled.get(name)
        if kept is not None:
            return kept
        records = self.store.agents.list(handle["job"], name)
        if all(run_name(w, "exit") in records for w in range(int(handle["workers"]))):
            with self._lock:
                self._settled[name] = records
        return records

    def records(self, handle: Handle) -> RemoteRecords:
        with self._lock:
            found = self._records.get(handle["name"])
            if found is None:
                found = RemoteRecords(
                    self.store,
                    handle["job"],
                    handle["name"],
                    int(handle["workers"]),
                    self.heartbeat_timeout,
                )
                self._records[handle["name"]] = found
            return found

    def agents(self, handle: Handle) -> Observation | None:
        """What the agents say (None: none started yet)."""
        return self.records(handle).observe(self.attempt_records(handle), time.time())

    def gone(self, handle: Handle, why: str, wait_flush: bool = False) -> Observation:
        """The machines are gone (or going) without a preemption: what the agents reported
        if they all finished, else LOST (requeued as a new attempt).

        ``wait_flush``: where the provider's object goes before its processes do (a pod's
        container outlives its API object by its grace period), started agents that have
        not finished still speak for ``flush_seconds`` after the end was first seen."""
        seen = self.settled(handle)
        if seen is not None and seen.finished and seen.phase is not AttemptPhase.LOST:
            return seen
        if wait_flush and seen is not None and not seen.finished:
            with self._lock:
                first = self._ended_at.setdefault(handle["name"], time.monotonic())
            if time.monotonic() - first < self.flush_seconds:
                return Observation(
                    AttemptPhase.RUNNING, f"{seen.reason}; {why}", workers=seen.workers
                )
        with self._lock:
            self._ended_at.pop(handle["name"], None)
        return Observation(AttemptPhase.LOST, why, retryable=True)

    def preempted(self, handle: Handle, why: str) -> Observation:
        """Preempted: not the job's failure, unless every worker had already succeeded."""
        return self.ended(handle, Observation(AttemptPhase.PREEMPTED, why, retryable=True))

    def ended(self, handle: Handle, outcome: Observation) -> Observation:
        """The provider ended the machines (a preemption, a dead man's switch): ``outcome``,
        unless every worker had already succeeded.

        The agents flush their last output and exit records within the spot window, after
        the provider already says so; the daemon reads the log to its end once an attempt is
        finished and never again, so the attempt is reported finished only once every
        started worker has its exit record, or ``flush_seconds`` after the end was seen."""
        name = handle["name"]
        records = self.settled_records(handle)
        seen = self.records(handle).observe(records, time.time())
        if seen is not None and seen.phase is AttemptPhase.SUCCEEDED:
            return seen
        if seen is not None and not self._flushed(handle, records):
            with self._lock:
                first = self._ended_at.setdefault(name, time.monotonic())
            if time.monotonic() - first < self.flush_seconds:
                return Observation(
                    AttemptPhase.RUNNING,
                    f"{outcome.reason}; the agents are flushing",
                    workers=seen.workers,
                )
        with self._lock:
            self._ended_at.pop(name, None)
        return outcome

    def flushed(self, handle: Handle) -> bool:
        """Every worker that started has its exit record."""
        return self._flushed(handle, self.attempt_records(handle))

    @staticmethod
    def _flushed(handle: Handle, listing: dict[str, ObjectInfo]) -> bool:
        started = [w for w in range(int(handle["workers"])) if run_name(w, "started") in listing]
        return all(run_name(w, "exit") in listing for w in started)

    def up(
        self,
        handle: Handle,
        came_up: Callable[[], None],
        timed_out: Callable[[list[int]], Observation],
    ) -> Observation:
        """The machines are up: what the agents say, and "waiting for workers to start (k of
        N)" while some have not said ``started``. ``came_up()`` once every worker started.

        A worker that never starts (its startup failed: an image whose Python cannot run the
        agent, a package install that failed or hangs) would otherwise hold the machines and
        the quota forever with nothing running: ``start_timeout`` seconds after the machines
        were first seen up, the attempt is ``timed_out(silent workers)``, and stays so."""
        name, n = handle["name"], int(handle["workers"])
        with self._lock:
            failed = self._not_started.get(name)
            first = self._up_at.setdefault(name, time.monotonic())
        if failed is not None:
            return failed
        seen = self.agents(handle)
        if seen is not None and seen.finished:
            return seen
        listing = self.attempt_records(handle)
        waiting = [w for w in range(n) if run_name(w, "started") not in listing]
        if not waiting and seen is not None:
            came_up()
            return seen
        if time.monotonic() - first > self.start_timeout:
            failed = timed_out(waiting)
            with self._lock:
                self._not_started[name] = failed
            return failed
        return Observation(
            AttemptPhase.RUNNING,
            f"waiting for workers to start ({n - len(waiting)} of {n})",
            workers=seen.workers if seen else (),
        )

    def transient(self, handle: Handle, what: str) -> Observation:
        """The machines are in ``what`` state between create and delete other than up (a TPU
        node REPAIRING after a maintenance event, RESTARTING, ...): the agents' word once any
        started (a worker that stays silent is lost after ``heartbeat_timeout``), else
        PROVISIONING."""
        seen = self.agents(handle)
        if seen is None:
            return Observation(AttemptPhase.PROVISIONING, what)
        if seen.finished:
            return seen
        return Observation(AttemptPhase.RUNNING, f"{seen.reason}; {what}", workers=seen.workers)

    def startup_output(self, handle: Handle, worker: int) -> str | None:
        """The last lines the worker's startup script printed, as one line: what the script
        copied to the bucket (:func:`bastion.runners.startup.bootstrap_lines`)."""
        try:
            data = self.store.runs.read_bootstrap(handle["job"], handle["name"], worker)
        except OSError:
            return None
        return last_lines(data.decode(errors="replace")) if data else None

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        """Worker 0's output (the job's log), from the cycle's listing of the records."""
        return self.records(handle).read_output(
            offset, limit, worker=0, listing=self.attempt_records(handle)
        )

    def owned_records(self, prefix: str, names: set[str]) -> list[tuple[str, str, int]]:
        """(job, attempt, workers) of every attempt named ``prefix...`` whose records are
        listed but which is not in ``names``: records that outlived their machines (a
        daemon that died between the two deletions), for the sweep to delete."""
        found = []
        for (job, name), records in self.agent_listing().items():
            if name not in names and name.startswith(prefix):
                workers = 1 + max((p[0] for r in records if (p := parse_run_name(r))), default=0)
                found.append((job, name, workers))
        return found

    def delete(self, handle: Handle) -> None:
        """The machines are verified gone: their agents' records go too (output stays)."""
        self.store.agents.delete(handle["job"], handle["name"])
        self.forget(handle["name"])

    def forget(self, name: str) -> None:
        with self._lock:
            self._records.pop(name, None)
            self._ended_at.pop(name, None)
            self._settled.pop(name, None)
            self._up_at.pop(name, None)
            self._not_started.pop(name, None)

    def close(self) -> None:
        with self._lock:
            self._records.clear()
