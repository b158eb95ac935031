"""The daemon's records of an attempt and of a stop in progress, as parts of a job's state.

A job's state (:class:`bastion.jobstate.JobState`) carries the record of its current run
attempt (JSON key ``runner``), of its cleanup command's attempt (``cleanup_runner``) and of the
stop Bastion asked of the run (``stop``). They are frozen: the lifecycle table
(:mod:`bastion.lifecycle`) makes a changed copy (``with_phase``, ``started``, ...) and sets it
on the state, so a record another state shares is never changed under it.

Their JSON is exactly what daemons wrote before these were typed (same keys, same values,
optional keys left out when unset), so roots written by an older daemon keep working, and
``from_json`` is tolerant: a missing key gets its default, and a key this daemon does not know
(a newer daemon's) is kept in ``extra`` and written back, so a round trip loses nothing.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class StopKind(enum.StrEnum):
    """Why a running attempt is being stopped; decides where the job goes once it is gone."""

    CANCEL = "cancel"  # -> CLEANING -> COMPLETED(CANCELLED)
    PREEMPT = "preempt"  # -> PENDING, new attempt later
    UPDATE = "update"  # -> PENDING, new attempt with the new spec
    TIMEOUT = "timeout"  # its time limit passed -> CLEANING -> COMPLETED(TIMEOUT)


Handle = dict[str, Any]  # the runner's, JSON-able and opaque here (bastion.runners.base.Handle)
DEFAULT_GRACE_SECONDS = 30.0  # a stop written before deadlines: its deadline is since + grace

_ATTEMPT_KEYS = frozenset(
    {"kind", "name", "handle", "origin", "phase", "deferred_since", "workers"}
)
_STOP_KEYS = frozenset({"kind", "since", "by", "deadline", "reason", "forced", "grace"})


def _extra(data: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in known}


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt the daemon started (or is about to start) for a job.

    Written to the bucket *before* the attempt is started, so a daemon that dies at any
    point finds the attempt by its ``name``; ``handle`` is None until the runner's start
    returned one (then the daemon polls, stops and deletes through it).
    """

    kind: str  # the runner's kind ("local", "tpu", ...)
    name: str | None  # the attempt's name, derived from the submission; None: an old daemon's
    handle: Handle | None = None
    origin: int = 0  # offset in the job's log where this attempt's output begins
    phase: str | None = None  # AttemptPhase's value as last observed ("STARTING" at admission)
    deferred_since: float | None = None  # when its start was first deferred (a transient error)
    workers: tuple[str, ...] | None = None  # each worker's health as the runner last said it
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys a newer daemon wrote

    @classmethod
    def admitted(cls, kind: str, name: str, origin: int) -> AttemptRecord:
        """The record of an attempt about to be started: no handle yet, STARTING."""
        return cls(kind=kind, name=name, origin=origin, phase="STARTING")

    @property
    def unstarted(self) -> bool:
        return self.handle is None

    def started(self, handle: Handle) -> AttemptRecord:
        return dataclasses.replace(self, handle=handle)

    def with_phase(self, phase: str) -> AttemptRecord:
        return dataclasses.replace(self, phase=phase)

    def with_workers(self, workers: tuple[str, ...]) -> AttemptRecord:
        return dataclasses.replace(self, workers=workers)

    def deferred(self, now: float) -> AttemptRecord:
        return dataclasses.replace(self, deferred_since=now)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            **self.extra,
            "kind": self.kind,
            "name": self.name,
            "handle": self.handle,
            "origin": self.origin,
            "phase": self.phase,
        }
        if self.deferred_since is not None:
            data["deferred_since"] = self.deferred_since
        if self.workers is not None:
            data["workers"] = list(self.workers)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttemptRecord:
        name = data.get("name")
        workers = data.get("workers")
        handle = data.get("handle")
        return cls(
            kind=str(data.get("kind") or ""),
            # (a name that is not a string cannot be found by: recovery marks it LOST)
            name=name if isinstance(name, str) else None,
            handle=handle if isinstance(handle, dict) else None,
            origin=int(data.get("origin") or 0),
            phase=None if data.get("phase") is None else str(data["phase"]),
            deferred_since=_float_or_none(data.get("deferred_since")),
            workers=tuple(workers) if isinstance(workers, list) else None,
            extra=_extra(data, _ATTEMPT_KEYS),
        )


@dataclass(frozen=True, slots=True)
class StopRecord:
    """A stop Bastion asked of a job's run attempt, and why: what it is stopped for decides
    where the job goes once the attempt is gone (see :class:`StopKind`)."""

    kind: StopKind | str  # a kind this daemon does not know (a newer one's) stays a string
    since: float  # when the stop was first asked (a later, forced stop keeps it)
    deadline: float  # past it, the runner kills the attempt
    by: str | None = None  # the job a preemption makes room for
    reason: str = ""
    forced: bool = False  # the deadline passed while it still ran (the KILLED line is written)
    grace: float | None = None  # written by daemons before deadlines; kept as it was
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys a newer daemon wrote

    @property
    def is_cancel(self) -> bool:
        return self.kind == StopKind.CANCEL

    def as_forced(self) -> StopRecord:
        return dataclasses.replace(self, forced=True)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            **self.extra,
            "kind": str(self.kind),
            "since": self.since,
            "by": self.by,
            "deadline": self.deadline,
            "reason": self.reason,
        }
        if self.forced:
            data["forced"] = True
        if self.grace is not None:
            data["grace"] = self.grace
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StopRecord:
        raw_kind = str(data.get("kind") or "")
        kind: StopKind | str = (
            StopKind(raw_kind) if raw_kind in StopKind._value2member_map_ else raw_kind
        )
        since = float(data.get("since") or 0)
        grace = _float_or_none(data.get("grace"))
        deadline = data.get("deadline")
        if deadline is None:  # written before deadlines
            deadline = since + (DEFAULT_GRACE_SECONDS if grace is None else grace)
        by = data.get("by")
        return cls(
            kind=kind,
            since=since,
            deadline=float(deadline),
            by=None if by is None else str(by),
            reason=str(data.get("reason") or ""),
            forced=bool(data.get("forced")),
            grace=grace,
            extra=_extra(data, _STOP_KEYS),
        )


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)
