"""What the daemon reads back from a remote attempt's agents (shared by the cloud runners).

The in-guest agent (:mod:`bastion.agent`) reports only through the bucket, per worker:
``started``, ``heartbeat``, ``exit`` records and numbered output chunks (names in
:class:`bastion.store.Store`, section runs). :class:`RemoteRecords` turns one listing of the
attempt into an :class:`Observation` and serves worker output by byte offset.

Cost: one recursive listing per attempt per call (the caller makes it and passes it to both
``observe`` and ``read_output``), plus a read per record or chunk that changed since the last
call (records are cached by token, chunk sizes by sequence number), so a steady state costs
O(changes). One listing per attempt is acceptable for now; a runner with many attempts may
later list ``ROOT/runs/`` once per cycle and split the result by attempt.

Heartbeats are compared to the daemon's clock (``now``): a worker's clock skewed by more than
a fraction of ``heartbeat_timeout`` would read as lost, so the timeout should be generous
(several heartbeat periods).
"""

from __future__ import annotations

import bisect
from typing import Any

from bastion.runners.base import Observation, Phase
from bastion.store import ObjectInfo, Store


class RemoteRecords:
    def __init__(
        self, store: Store, job: str, attempt: str, num_workers: int, heartbeat_timeout: float
    ) -> None:
        self.store, self.job, self.attempt = store, job, attempt
        self.num_workers = num_workers
        self.heartbeat_timeout = heartbeat_timeout
        self._records: dict[tuple[int, str], tuple[str, dict[str, Any] | None]] = {}
        self._sizes: dict[int, list[int]] = {}  # worker -> sizes of chunks 0..n-1
        self._starts: dict[int, list[int]] = {}  # worker -> byte offset of each chunk

    def list(self) -> dict[str, ObjectInfo]:
        return self.store.list_run(self.job, self.attempt)

    def _record(
        self, listing: dict[str, ObjectInfo], worker: int, kind: str
    ) -> dict[str, Any] | None:
        """A record from the listing, read again only when its token changed."""
        info = listing.get(Store.run_name(worker, kind))
        if info is None:
            return None
        cached = self._records.get((worker, kind))
        if cached is None or cached[0] != info.token:
            record = self.store.read_run_record(self.job, self.attempt, worker, kind)
            cached = (info.token, record)
            self._records[(worker, kind)] = cached
        return cached[1]

    def observe(self, listing: dict[str, ObjectInfo], now: float) -> Observation | None:
        """The attempt as its agents report it; None when no worker has started yet (the
        caller asks the cloud: still provisioning, or the machines are gone).

        Preemption wins over failure (a preempted worker's command dies of SIGTERM, which is
        not the job's fault); among failures the earliest exit is named, since the other
        workers are then stopped and exit non-zero too."""
        started = {w for w in range(self.num_workers) if Store.run_name(w, "started") in listing}
        if not started:
            return None
        exits = {}
        for w in started:
            record = self._record(listing, w, "exit")
            if record is not None:
                exits[w] = record
        for w, record in sorted(exits.items()):
            if record.get("preempted"):
                reason = f"worker {w} was preempted: {record.get('reason', '')}".rstrip(": ")
                return Observation(Phase.PREEMPTED, reason, record.get("code"), retryable=True)
        failed = [(r.get("time", 0), w, r) for w, r in exits.items() if r.get("code") != 0]
        if failed:
            _, w, record = min(failed, key=lambda item: item[:2])
            code = record.get("code")
            said = str(record.get("reason") or "")
            why = said if said and said != f"exited with status {code}" else ""
            reason = f"worker {w} exited with status {code}" + (f": {why}" if why else "")
            return Observation(Phase.FAILED, reason, code)
        if len(exits) == self.num_workers:
            return Observation(Phase.SUCCEEDED, f"all {self.num_workers} workers exited 0", 0)
        for w in sorted(started - exits.keys()):
            beat = self._record(listing, w, "heartbeat") or self._record(listing, w, "started")
            last = float((beat or {}).get("time", 0))
            if now - last > self.heartbeat_timeout:
                reason = f"worker {w} stopped heartbeating ({now - last:.0f}s since its last)"
                return Observation(Phase.LOST, reason, retryable=True)
        running = len(started - exits.keys())
        return Observation(Phase.RUNNING, f"{running} of {self.num_workers} workers running")

    def _index(self, listing: dict[str, ObjectInfo], worker: int) -> tuple[list[int], list[int]]:
        """Sizes and start offsets of the worker's contiguous chunks, extended by new ones."""
        sizes = self._sizes.setdefault(worker, [])
        starts = self._starts.setdefault(worker, [])
        while (info := listing.get(Store.run_name(worker, "log", len(sizes)))) is not None:
            starts.append(starts[-1] + sizes[-1] if sizes else 0)
            sizes.append(info.size)
        return sizes, starts

    def read_output(
        self,
        offset: int,
        limit: int,
        worker: int = 0,
        listing: dict[str, ObjectInfo] | None = None,
    ) -> bytes:
        """At most ``limit`` bytes of the worker's output from ``offset`` (the chunks in order,
        as one stream); b"" when nothing new. Reads only the chunks the range touches."""
        if listing is None:
            listing = self.list()
        sizes, starts = self._index(listing, worker)
        out = bytearray()
        seq = bisect.bisect_right(starts, offset) - 1
        while seq >= 0 and seq < len(sizes) and len(out) < limit:
            skip = offset + len(out) - starts[seq]
            if skip < sizes[seq]:
                data = self.store.read_run_chunk(self.job, self.attempt, worker, seq, start=skip)
                out += data[: limit - len(out)]
            seq += 1
        return bytes(out)
