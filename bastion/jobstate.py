"""The job state: written only by the daemon to ``ROOT/jobs/states/<name>``.

The JSON keeps AXLearn's shape (``{"status": ..., "metadata": {"tier": ...}}``) and adds what a
user needs to see why a job is where it is: attempt, times, exit code, outcome and the reason of
the last transition, plus the runner's handle so a restarted daemon adopts instead of restarting.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any

from bastion.attempt_records import AttemptRecord, StopKind, StopRecord
from bastion.interning import interned

__all__ = ["AttemptRecord", "JobState", "Outcome", "Status", "StopKind", "StopRecord"]

MAX_EVENTS = 100  # per job state; the first few and the latest are kept
KEPT_FIRST_EVENTS = 10


class Status(enum.StrEnum):
    PENDING = "PENDING"
    ACTIVE = "ACTIVE"
    CANCELLING = "CANCELLING"
    CLEANING = "CLEANING"
    COMPLETED = "COMPLETED"


class Outcome(enum.StrEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    REJECTED = "REJECTED"
    TIMEOUT = "TIMEOUT"  # stopped at its time limit (Slurm's TIMEOUT); never requeued


@dataclass
class JobState:
    status: Status = Status.PENDING
    outcome: Outcome | None = None
    reason: str = ""
    attempt: int = 0
    job_identity: str = ""  # JobSpec.identity of the submission this state belongs to
    spec_digest: str = ""  # JobSpec.digest() the current attempt runs
    submit_time: float | None = None  # when the daemon first saw the spec
    start_time: float | None = None  # start of the current/last attempt
    end_time: float | None = None
    exit_code: int | None = None
    tier: int | None = None
    submission: str = ""  # the daemon's own id for this submission: attempt names derive from it
    # The daemon's records of the current run attempt and of the cleanup command's attempt
    # (JSON keys "runner" and "cleanup_runner", as older daemons wrote them); the record's
    # handle is the runner's, opaque to the daemon (see bastion.lifecycle).
    run_attempt: AttemptRecord | None = None
    cleanup_attempt: AttemptRecord | None = None
    stop: StopRecord | None = None  # the stop Bastion asked of the run attempt, if any
    running_since: float | None = None  # when the runner first reported RUNNING (min runtime)
    pending_since: float | None = None  # when the job last became pending (submit or requeue)
    provider_preemptions: int = 0  # attempts the provider took away (not the job's failures)
    log_start: int = 0  # offset in logs/<name> where this submission's output begins
    preemptions: int = 0
    # Seconds the job's earlier attempts of this submission ran (from RUNNING to their end):
    # what its time limit counts, so time pending or preempted never does.
    ran_seconds: float = 0.0
    # When the job last reported a checkpoint (the "time" of its BASTION_OUTPUT_DIR/.bastion/
    # checkpoint.json, as its runner saw it); None: never. Kept across attempts.
    last_checkpoint: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)  # lifecycle, bounded
    metadata: dict[str, Any] = field(default_factory=dict)  # AXLearn-compatible extras (tier)

    changed = True  # not a field: see __setattr__

    def __setattr__(self, name: str, value: Any) -> None:
        # Any assignment marks the state changed since the daemon last wrote it, so the daemon
        # serializes only states that may differ instead of every state every cycle. (A new
        # state, dataclasses.replace included, starts marked.)
        object.__setattr__(self, name, value)
        if name != "changed" and not self.changed:
            object.__setattr__(self, "changed", True)

    def mark_written(self) -> None:
        """The daemon wrote (or read) exactly this state: unchanged until the next change."""
        object.__setattr__(self, "changed", False)

    def copy(self) -> JobState:
        """A new state with the same fields and a list of events of its own (what the
        lifecycle table changes), marked changed: ``dataclasses.replace`` without its
        ``__init__`` through the class ``__setattr__`` per field (20 -> 8 us; the table makes
        one per transition, two for each job a burst takes in). Fields are set in
        ``__init__``'s order, so the instances share one table of keys (see from_json)."""
        new, assign = object.__new__(JobState), object.__setattr__
        for name in _FIELD_NAMES:
            assign(new, name, getattr(self, name))
        assign(new, "events", list(self.events))
        return new

    def add_event(self, event: dict[str, Any]) -> None:
        """Keep the first events (how it started) and the latest; drop the middle."""
        self.changed = True
        self.events.append(event)
        if len(self.events) > MAX_EVENTS:
            del self.events[KEPT_FIRST_EVENTS]

    def to_json(self) -> dict[str, Any]:
        # Shallow: json.dumps walks the nested dicts itself, and the daemon serializes every
        # state each cycle to see which changed (dataclasses.asdict deep-copies: 3x slower).
        data = {f.name: getattr(self, f.name) for f in _PLAIN_FIELDS}
        data["status"] = self.status.value
        run, cleanup, stop = self.run_attempt, self.cleanup_attempt, self.stop
        data["runner"] = run.to_json() if run is not None else None
        data["cleanup_runner"] = cleanup.to_json() if cleanup is not None else None
        data["stop"] = stop.to_json() if stop is not None else None
        data["outcome"] = self.outcome.value if self.outcome else None
        if self.tier is not None:
            data["metadata"] = {**self.metadata, "tier": self.tier}
        return data

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobState:
        """Filled in without ``__init__``'s class ``__setattr__`` per field (a third of the
        load; a restart loads every state, 100,000: 0.35 s): what ``__init__`` does, every
        field set in the order of the fields, at its default unless the JSON holds it; marked
        changed. (In that order, not by updating ``__dict__``: instances whose attributes
        are set in one order share one table of keys, and a state costs 600 bytes less.)"""
        values = {**_DEFAULTS, "events": [], "metadata": {}}
        values.update((k, v) for k, v in data.items() if k in _PLAIN_NAMES)
        values["status"] = Status(str(data.get("status", "PENDING")).upper())
        for key, name, record_type in _RECORDS:
            raw = data.get(key)
            if isinstance(raw, dict) and raw:  # (an empty record is none, as it was)
                values[name] = record_type.from_json(raw)
        if data.get("outcome"):
            values["outcome"] = Outcome(data["outcome"])
        state, assign = object.__new__(cls), object.__setattr__
        for name in _FIELD_NAMES:
            assign(state, name, values[name])
        return state

    @classmethod
    def loads(cls, raw: bytes) -> JobState:
        text = raw.decode().strip()
        if not text.startswith("{"):  # AXLearn's legacy plain-text status, e.g. "active\n"
            return cls(status=Status(text.upper()))
        return cls.from_json(interned(json.loads(text)))

    @property
    def display_status(self) -> str:
        """What users read: COMPLETED jobs show their outcome."""
        if self.status is Status.COMPLETED and self.outcome:
            return self.outcome.value
        phase = self.run_attempt.phase if self.run_attempt is not None else None
        if self.status is Status.ACTIVE and phase in ("STARTING", "QUEUED", "PROVISIONING"):
            return str(phase)
        return self.status.value


# The records' JSON keys are those older daemons wrote (the attributes' names explain better).
_RECORDS: tuple[tuple[str, str, type[AttemptRecord] | type[StopRecord]], ...] = (
    ("runner", "run_attempt", AttemptRecord),
    ("cleanup_runner", "cleanup_attempt", AttemptRecord),
    ("stop", "stop", StopRecord),
)
_PLAIN_FIELDS = tuple(
    f for f in dataclasses.fields(JobState) if f.name not in {name for _, name, _ in _RECORDS}
)
_PLAIN_NAMES = frozenset(f.name for f in _PLAIN_FIELDS)
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(JobState))  # __init__'s order
# Every field's default but the two mutable ones (a fresh list and dict per state).
_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(JobState) if f.name not in ("events", "metadata")
}
