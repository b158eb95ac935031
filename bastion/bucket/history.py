"""``ROOT/history/``: what the daemon keeps for people and for its own restarts.

history/jobs/<name>/<submission>   a finished submission's events (``store.history``)
history/decisions/<time>           the scheduler's decision records (``store.decisions``)
history/queue                      the queue summary (``store.queue``)
history/daemon                     who runs the daemon, where (``store.daemon_info``)
history/usage                      the usage ledger (``store.usage``)
history/quota-last-good            the last quota file that parsed (``store.quota``)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from bastion.bucket.counted import CountedObjects

HISTORY = "history"


class History:
    """Finished submissions' events, one object per submission under history/jobs/<name>/."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def save(self, name: str, submission: str, events: list[dict[str, Any]]) -> None:
        """A plain overwrite, so saving again after a failure whose answer was lost is
        harmless; ``submission`` sorts by time (see read)."""
        lines = "".join(json.dumps(event, sort_keys=True) + "\n" for event in events)
        self._bucket.write(lines.encode(), HISTORY, "jobs", name, submission)

    def read(self, name: str) -> Iterator[dict[str, Any]]:
        """Every finished submission's events under this name, oldest first."""
        for submission in sorted(self._bucket.list(HISTORY, "jobs", name)):
            raw = self._bucket.read(HISTORY, "jobs", name, submission) or b""
            for line in raw.decode(errors="replace").splitlines():
                if line.strip():
                    yield json.loads(line)


class Decisions:
    """The scheduler's decision log: one record per planning pass, the newest kept."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def write(self, now: float, record: dict[str, Any]) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f".{int(now * 1e6) % 10**6:06d}"
        self._bucket.write(json.dumps(record, sort_keys=True).encode(), HISTORY, "decisions", stamp)

    def list(self) -> list[str]:
        """Record names, oldest first (they sort by time)."""
        return sorted(self._bucket.list(HISTORY, "decisions"))

    def sizes(self) -> dict[str, int]:
        """Each record's size, by name (one listing)."""
        return {name: info.size for name, info in self._bucket.list(HISTORY, "decisions").items()}

    def read(self, stamp: str) -> dict[str, Any] | None:
        raw = self._bucket.read(HISTORY, "decisions", stamp)
        return json.loads(raw) if raw else None

    def prune(self, keep: int) -> None:
        """Keep the newest ``keep`` records (names sort by time)."""
        for stamp in self.list()[:-keep]:
            self._bucket.delete(HISTORY, "decisions", stamp)


class Queue:
    """``history/queue``: what every waiting job shares and changes whenever any job moves
    (positions, free capacity, usage); one object, so a job's state need not."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def write(self, summary: dict[str, Any]) -> None:
        self._bucket.write(json.dumps(summary, sort_keys=True).encode(), HISTORY, "queue")

    def read(self) -> dict[str, Any] | None:
        raw = self._bucket.read(HISTORY, "queue")
        try:
            summary = json.loads(raw) if raw else None
        except ValueError:
            return None  # torn or foreign: shown as unknown, never fatal to a reader
        return summary if isinstance(summary, dict) else None


class JsonRecord:
    """One JSON object at a fixed name under history/ (``daemon``, ``usage``, ``capabilities``);
    a torn or foreign one reads as None, as if nothing were written."""

    def __init__(self, bucket: CountedObjects, name: str) -> None:
        self._bucket = bucket
        self._name = name

    def write(self, record: dict[str, Any]) -> None:
        self._bucket.write(json.dumps(record, sort_keys=True).encode(), HISTORY, self._name)

    def read(self) -> dict[str, Any] | None:
        raw = self._bucket.read(HISTORY, self._name)
        try:
            record = json.loads(raw) if raw else None
        except ValueError:
            return None
        return record if isinstance(record, dict) else None


class FinishedRuns:
    """``history/runs/<name>/<submission>``: each finished submission's record (its spec and
    final state, as jobs/complete keeps the latest one's), so a relaunched name keeps every
    earlier run reachable: its state's ``log_start`` says where its output begins in
    logs/<name>, the next run's where it ends. ``submission`` sorts by time."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def save(self, name: str, submission: str, record: dict[str, Any]) -> None:
        """A plain overwrite: saving again after a lost answer is harmless."""
        self._bucket.write(
            json.dumps(record, sort_keys=True).encode(), HISTORY, "runs", name, submission
        )

    def list(self, name: str) -> list[str]:
        """The submissions of ``name`` that finished, oldest first."""
        return sorted(self._bucket.list(HISTORY, "runs", name))

    def read(self, name: str, submission: str) -> dict[str, Any] | None:
        raw = self._bucket.read(HISTORY, "runs", name, submission)
        return json.loads(raw) if raw else None
