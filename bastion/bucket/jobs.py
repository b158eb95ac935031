"""``ROOT/jobs/``: the four inboxes and outboxes of a job, one namespace each.

jobs/active/<name>        specs, written by users (``store.specs``)
jobs/states/<name>        states, written only by the daemon (``store.states``)
jobs/user_states/<name>   cancel requests, and submission markers (``store.requests``)
jobs/complete/<name>      finished jobs' records (``store.complete``)
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from bastion.bucket.counted import CountedObjects
from bastion.bucket.objects import (
    Created,
    ObjectInfo,
    TokenRead,
    TokenWrite,
    UnacceptableObject,
)
from bastion.jobspec import MAX_SPEC_BYTES

JOBS = "jobs"
ACTIVE, STATES, USER_STATES, COMPLETE = "active", "states", "user_states", "complete"
JOB_DIRECTORIES = (ACTIVE, STATES, USER_STATES, COMPLETE)
T = TypeVar("T")

# A submission marker in jobs/user_states/: "_submitted-<ms, 13 digits>-<8 hex>-<job name>".
# Names starting with "_" are never job names, so markers and cancel requests share one
# listing (see bastion/bucket/specwatch.py for why markers exist).
MARKER_PREFIX = "_submitted-"
MARKERS_END = "_submitted."  # the first name after every marker ("." follows "-")
_HEX = frozenset("0123456789abcdef")


def marker_name(name: str, now: float | None = None) -> str:
    """A new marker for job ``name``: unique (a later write of the same spec gets its own,
    so deleting a consumed marker never drops a newer one), and sorting by the writer's
    clock for a human listing the bucket (the daemon trusts no clock: it takes them all)."""
    stamp = int((time.time() if now is None else now) * 1000)
    return f"{MARKER_PREFIX}{stamp:013d}-{uuid.uuid4().hex[:8]}-{name}"


def is_marker(entry: str) -> bool:
    """Whether a jobs/user_states/ entry is a submission marker (else a cancel request)."""
    return entry.startswith(MARKER_PREFIX)


def marked_job(marker: str) -> str | None:
    """The job a marker names; None when the marker is not of the form marker_name
    writes (any bucket writer can put anything there)."""
    stamp, _, rest = marker.removeprefix(MARKER_PREFIX).partition("-")
    unique, _, name = rest.partition("-")
    if len(stamp) != 13 or not stamp.isdigit() or len(unique) != 8 or set(unique) - _HEX:
        return None
    return name or None


def _marker_body(name: str, now: float) -> bytes:
    """A marker's bytes: for a human listing the bucket; the daemon reads only its name."""
    return json.dumps({"name": name, "time": now}, sort_keys=True).encode()


def _as_spec_error(error: UnacceptableObject) -> UnacceptableObject:
    """A spec that is no regular file says what a spec must be."""
    if error.rule == UnacceptableObject.REGULAR:
        return UnacceptableObject(error.path, error.what, "specs must be regular files")
    return error


class Specs:
    """``jobs/active/``: what users asked to run."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def url(self, name: str | None = None) -> str:
        """The spec's URL (the directory's, without a name), for messages and the job's
        environment (``BASTION_SPEC_URL``)."""
        return self._bucket.url(JOBS, ACTIVE, *([name] if name is not None else []))

    def list(self) -> dict[str, ObjectInfo]:
        return self._bucket.list(JOBS, ACTIVE)

    def read(self, name: str) -> bytes | None:
        """A spec's bytes, at most MAX_SPEC_BYTES. UnacceptableObject (its message is the
        rejection reason) for a larger one and, on a local root, for anything but a regular
        file: a link to a secret must never have its content copied into jobs/complete/."""
        return self._read_with(self._bucket.read, name)

    def read_with_token(self, name: str) -> tuple[bytes, str] | None:
        """As ``read``, with the listing token of the bytes read (one request on GCS and on a
        local root): for a spec named by a submission marker, whose token no listing gave."""
        return self._read_with(self._bucket.read_with_token, name)

    def read_many_with_token(
        self, names: Sequence[str], pool: Executor | None = None
    ) -> list[TokenRead]:
        """``read_with_token`` of each name, in order, in one call (a burst's specs: GCS sends
        them all from one call); a failed read's exception in its place."""
        paths = [(JOBS, ACTIVE, name) for name in names]
        reads = self._bucket.read_many_with_token(paths, MAX_SPEC_BYTES, pool)
        return [_as_spec_error(r) if isinstance(r, UnacceptableObject) else r for r in reads]

    def _read_with(self, reader: Callable[..., T], name: str) -> T:
        try:
            return reader(JOBS, ACTIVE, name, limit=MAX_SPEC_BYTES)
        except UnacceptableObject as e:
            raise _as_spec_error(e) from None

    def submit(self, name: str, data: bytes) -> bool:
        """Create a spec; False when a job of that name is already active."""
        return self._bucket.create(data, JOBS, ACTIVE, name)

    def submit_many(
        self, specs: Sequence[tuple[str, bytes]], pool: Executor | None = None
    ) -> list[Created]:
        """``submit`` of each (name, bytes), in order, in one call (a group's members: GCS and
        S3 send them all from one call); a failed write's exception in its place."""
        return self._bucket.create_many(
            [((JOBS, ACTIVE, name), data) for name, data in specs], pool
        )

    def replace(self, name: str, data: bytes) -> None:
        self._bucket.write(data, JOBS, ACTIVE, name)

    def delete(self, name: str) -> None:
        self._bucket.delete(JOBS, ACTIVE, name)


class States:
    """``jobs/states/``: what the daemon decided; written only by it, conditionally."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def list(self) -> dict[str, ObjectInfo]:
        return self._bucket.list(JOBS, STATES)

    def read(self, name: str) -> bytes | None:
        return self._bucket.read(JOBS, STATES, name)

    def write(self, name: str, data: bytes, expected: str | None = None) -> str:
        """Write a state only if it is still at ``expected`` (None: absent); new token.

        Raises PreconditionFailed when someone else wrote it since: a stale daemon must not
        overwrite what the current one decided."""
        return self._bucket.write_if(data, expected, JOBS, STATES, name)

    def write_many(
        self, writes: Sequence[tuple[str, bytes, str | None]], pool: Executor | None = None
    ) -> list[TokenWrite]:
        """``write`` of each (name, bytes, expected), in order, in one call (a burst's states:
        GCS sends them all from one call); a failed write's exception in its place."""
        return self._bucket.write_many_if(
            [((JOBS, STATES, name), data, expected) for name, data, expected in writes], pool
        )

    def read_with_token(self, name: str) -> tuple[bytes, str] | None:
        info = self._bucket.info(JOBS, STATES, name)
        raw = self._bucket.read(JOBS, STATES, name) if info else None
        return (raw, info.token) if info and raw is not None else None

    def delete(self, name: str) -> None:
        self._bucket.delete(JOBS, STATES, name)


class Requests:
    """``jobs/user_states/``: cancel requests (named by their job) and submission markers
    ("look at this spec", named by ``marker_name``), in one listing."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def url(self, entry: str) -> str:
        return self._bucket.url(JOBS, USER_STATES, entry)

    def list(self) -> dict[str, ObjectInfo]:
        return self._bucket.list(JOBS, USER_STATES)

    def list_markers(self, limit: int) -> dict[str, ObjectInfo]:
        """The oldest ``limit`` submission markers by name (their writers' clocks): a ranged
        listing that costs what it returns, however many more wait."""
        return self._bucket.list_range(
            JOBS, USER_STATES, start=MARKER_PREFIX, end=MARKERS_END, limit=limit
        )

    def list_cancels(self) -> dict[str, ObjectInfo]:
        """Every entry but the markers (cancel requests, and anything else a user put there):
        the ranges below and above the markers' names."""
        below = self._bucket.list_range(JOBS, USER_STATES, end=MARKER_PREFIX)
        return below | self._bucket.list_range(JOBS, USER_STATES, start=MARKERS_END)

    def read(self, name: str) -> bytes | None:
        return self._bucket.read(JOBS, USER_STATES, name)

    def write(self, name: str, data: bytes) -> None:
        self._bucket.write(data, JOBS, USER_STATES, name)

    def delete(self, name: str) -> None:
        self._bucket.delete(JOBS, USER_STATES, name)

    def write_marker(self, name: str) -> str:
        """After a spec is created or replaced: tells the daemon to read it next cycle."""
        now = time.time()
        marker = marker_name(name, now)
        self._bucket.write(_marker_body(name, now), JOBS, USER_STATES, marker)
        return marker

    def write_markers(self, names: Sequence[str], pool: Executor | None = None) -> list[Created]:
        """``write_marker`` for each job name, in order, in one call (a group's members); a
        failed write's exception in its place. Each marker's name is new (``marker_name``), so
        each is created: False would be another marker of that same job, which is as good."""
        now = time.time()
        items = [
            ((JOBS, USER_STATES, marker_name(name, now)), _marker_body(name, now)) for name in names
        ]
        return self._bucket.create_many(items, pool)

    def delete_markers(self, markers: list[str]) -> list[str]:
        """Consumed markers, in batch requests on GCS and S3 (counted once); returns those that
        could not be deleted."""
        failed = self._bucket.delete_many([(JOBS, USER_STATES, m) for m in markers])
        return [parts[-1] for parts in failed]


class Complete:
    """``jobs/complete/``: the record of every finished job."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def list(self) -> dict[str, ObjectInfo]:
        return self._bucket.list(JOBS, COMPLETE)

    def read(self, name: str) -> dict[str, Any] | None:
        raw = self._bucket.read(JOBS, COMPLETE, name)
        return json.loads(raw) if raw else None

    def write(self, name: str, record: dict[str, Any]) -> None:
        self._bucket.write(json.dumps(record, sort_keys=True).encode(), JOBS, COMPLETE, name)
