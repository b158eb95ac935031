"""What the daemon reads back from a remote attempt's agents (the agent channel's reader).

The in-guest agent (:mod:`bastion.agent`) reports only through the bucket, per worker:
``started``, ``heartbeat``, ``progress`` and ``exit`` records, and numbered output chunks
(names in :class:`bastion.bucket.store.Store`, section runs). :class:`RemoteRecords` turns the
attempt's records, as one listing shows them, into an :class:`Observation` with each worker's
health, and serves a worker's output by byte offset.

Cost, so that a cycle costs what changed:

- The records of every live attempt come from one listing of ``ROOT/agents/`` per cycle
  (made by :meth:`bastion.runners.kit.channel.AgentChannel.agent_listing`); output chunks
  live elsewhere, so that listing grows with the running workers, not with their output.
- A heartbeat is never read: its listing token changing is the beat, timed on the daemon's
  own clock (``now``), so a worker's skewed clock cannot make it look lost or alive.
- ``started`` and ``exit`` are read once, when they appear; ``progress`` (how many chunks
  are stored) only when its token changed, i.e. when the worker wrote output, and
  ``checkpoint`` (the job's last progress report) only when the job wrote a new one; chunks
  are then read by name, never listed. A quiet running attempt costs no request at all.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

from bastion.bucket.runs import run_name
from bastion.bucket.store import ObjectInfo, Store
from bastion.runners.base import AttemptPhase, Observation

LATE_FRACTION = 0.5  # a worker silent for this part of the timeout shows as late


class RemoteRecords:
    def __init__(
        self, store: Store, job: str, attempt: str, num_workers: int, heartbeat_timeout: float
    ) -> None:
        self.store, self.job, self.attempt = store, job, attempt
        self.num_workers = num_workers
        self.heartbeat_timeout = heartbeat_timeout
        self._records: dict[tuple[int, str], tuple[str, dict[str, Any] | None]] = {}
        self._beats: dict[int, tuple[str, float]] = {}  # worker -> (beat's token, seen at)
        self._sizes: dict[int, list[int]] = {}  # worker -> sizes of chunks 0..n-1 (known)
        self._starts: dict[int, list[int]] = {}  # worker -> byte offset of each chunk

    def list(self) -> dict[str, ObjectInfo]:
        """This attempt's records alone (the runner lists every attempt's at once)."""
        return self.store.agents.list(self.job, self.attempt)

    def _record(
        self, listing: dict[str, ObjectInfo], worker: int, kind: str
    ) -> dict[str, Any] | None:
        """A record from the listing, read again only when its token changed."""
        info = listing.get(run_name(worker, kind))
        if info is None:
            return None
        cached = self._records.get((worker, kind))
        if cached is None or cached[0] != info.token:
            record = self.store.agents.read(self.job, self.attempt, worker, kind)
            cached = (info.token, record)
            self._records[(worker, kind)] = cached
        return cached[1]

    def _silent_for(self, listing: dict[str, ObjectInfo], worker: int, now: float) -> float:
        """Seconds since the worker's heartbeat (or claim) last changed, on our clock."""
        info = listing.get(run_name(worker, "heartbeat")) or listing.get(
            run_name(worker, "started")
        )
        token = info.token if info else ""
        seen = self._beats.get(worker)
        if seen is None or seen[0] != token:
            seen = (token, now)
            self._beats[worker] = seen
        return now - seen[1]

    def observe(self, listing: dict[str, ObjectInfo], now: float) -> Observation | None:
        """:meth:`_observe`, with the job's last checkpoint report (the latest any worker's
        agent wrote: a ``checkpoint`` record, read only when its token changed)."""
        seen = self._observe(listing, now)
        if seen is None:
            return None
        times = [
            (self._record(listing, w, "checkpoint") or {}).get("time")
            for w in range(self.num_workers)
            if run_name(w, "checkpoint") in listing
        ]
        latest = max((float(t) for t in times if isinstance(t, int | float)), default=None)
        return seen if latest is None else dataclasses.replace(seen, checkpoint=latest)

    def _observe(self, listing: dict[str, ObjectInfo], now: float) -> Observation | None:
        """The attempt as its agents report it; None when no worker has started yet (the
        caller asks the cloud: still provisioning, or the machines are gone).

        Preemption wins over failure (a preempted worker's command dies of SIGTERM, which is
        not the job's fault); among failures the earliest exit is named, since the other
        workers are then stopped and exit non-zero too."""
        started = {w for w in range(self.num_workers) if run_name(w, "started") in listing}
        if not started:
            return None
        exits = {}
        for w in started:
            record = self._record(listing, w, "exit")
            if record is not None:
                exits[w] = record
        silent = {w: self._silent_for(listing, w, now) for w in started - exits.keys()}
        workers = tuple(
            _health(w in started, exits.get(w), silent.get(w, 0.0), self.heartbeat_timeout)
            for w in range(self.num_workers)
        )
        note = _left_behind(exits, self.num_workers)
        for w, record in sorted(exits.items()):
            if record.get("preempted"):
                reason = f"worker {w} was preempted: {record.get('reason', '')}".rstrip(": ")
                return Observation(
                    AttemptPhase.PREEMPTED,
                    reason,
                    record.get("code"),
                    retryable=True,
                    workers=workers,
                    note=note,
                )
        failed = [(r.get("time", 0), w, r) for w, r in exits.items() if r.get("code") != 0]
        if failed:
            _, w, record = min(failed, key=lambda item: item[:2])
            code = record.get("code")
            said = str(record.get("reason") or "")
            why = said if said and said != f"exited with status {code}" else ""
            reason = f"worker {w} exited with status {code}" + (f": {why}" if why else "")
            return Observation(AttemptPhase.FAILED, reason, code, workers=workers, note=note)
        if len(exits) == self.num_workers:
            return Observation(
                AttemptPhase.SUCCEEDED,
                "its worker exited 0"
                if self.num_workers == 1
                else f"all {self.num_workers} workers exited 0",
                0,
                workers=workers,
                note=note,
            )
        for w, seconds in sorted(silent.items()):
            if seconds > self.heartbeat_timeout:
                reason = f"worker {w} stopped heartbeating (silent for {seconds:.0f}s)"
                return Observation(AttemptPhase.LOST, reason, retryable=True, workers=workers)
        running = len(started - exits.keys())
        return Observation(
            AttemptPhase.RUNNING,
            f"{running} of {self.num_workers} workers running",
            workers=workers,
        )

    def _chunks(self, listing: dict[str, ObjectInfo], worker: int) -> int:
        """How many of the worker's chunks are stored: its exit record says so last, its
        progress record meanwhile (each read only when it changed)."""
        for kind in ("exit", "progress"):
            record = self._record(listing, worker, kind)
            if record is not None and isinstance(record.get("chunks"), int):
                return int(record["chunks"])
        return 0

    def _learn_sizes(self, worker: int, upto: int) -> None:
        """Sizes of chunks not yet read (a restarted daemon resuming mid-output): one
        listing of the worker's output."""
        sizes, starts = self._sizes.setdefault(worker, []), self._starts.setdefault(worker, [])
        listing = self.store.runs.list(self.job, self.attempt)
        while len(sizes) < upto:
            info = listing.get(run_name(worker, "log", len(sizes)))
            if info is None:
                return
            starts.append(starts[-1] + sizes[-1] if sizes else 0)
            sizes.append(info.size)

    def read_output(
        self,
        offset: int,
        limit: int,
        worker: int = 0,
        listing: dict[str, ObjectInfo] | None = None,
    ) -> bytes:
        """At most ``limit`` bytes of the worker's output from ``offset`` (the chunks in order,
        as one stream); b"" when nothing new. Reads only the chunks the range touches, by name:
        their sizes are learned as they are read (a listing only to resume past unread ones)."""
        if listing is None:
            listing = self.list()
        count = self._chunks(listing, worker)
        sizes, starts = self._sizes.setdefault(worker, []), self._starts.setdefault(worker, [])
        known_end = starts[-1] + sizes[-1] if sizes else 0
        if offset > known_end and len(sizes) < count:
            self._learn_sizes(worker, count)
            if offset > (starts[-1] + sizes[-1] if sizes else 0) and len(sizes) < count:
                return b""  # a chunk before ``offset`` is not listed yet: next time
        out = bytearray()
        seq = bisect.bisect_right(starts, offset) - 1 if sizes else 0
        if sizes and offset >= starts[-1] + sizes[-1]:
            seq = len(sizes)
        seq = max(seq, 0)
        while seq < count and len(out) < limit:
            begin = starts[seq] if seq < len(sizes) else (starts[-1] + sizes[-1] if sizes else 0)
            skip = offset + len(out) - begin
            if seq < len(sizes) and skip >= sizes[seq]:
                seq += 1
                continue
            data = self.store.runs.read_chunk(self.job, self.attempt, worker, seq, start=skip)
            if seq == len(sizes):  # read to its end from ``skip``: now its size is known
                starts.append(begin)
                sizes.append(skip + len(data))
            out += data[: limit - len(out)]
            seq += 1
        return bytes(out)


def _health(
    started: bool, exit_record: dict[str, Any] | None, silent: float, timeout: float
) -> str:
    """One word (or two) per worker, stable between changes: it is written into the job's
    state only when it changes, so no elapsed time is in it."""
    if not started:
        return "waiting"
    if exit_record is not None:
        return "preempted" if exit_record.get("preempted") else f"exit {exit_record.get('code')}"
    if silent > timeout:
        return "lost"
    return "late" if silent > timeout * LATE_FRACTION else "running"


def _left_behind(exits: dict[int, dict[str, Any]], num_workers: int) -> str:
    """What the agents killed after their commands ended, for the job's history."""
    said = [
        (w, str(r["left_behind"])[:300]) for w, r in sorted(exits.items()) if r.get("left_behind")
    ]
    if num_workers == 1:
        return said[0][1] if said else ""
    return "; ".join(f"worker {w}: {text}" for w, text in said)
