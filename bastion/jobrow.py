"""A job's row for the readers of the whole queue (``bastion list``): what a listing shows of a
job, computed by the daemon when it writes the snapshot (bastion/bucket/snapshot.py).

At 20,000 jobs, parsing and validating every spec and state costs a reader about 130 us a job
(2.6 s); a row is a small JSON object decoded in a few microseconds, and the state it was
taken with is printed as the bytes it is. The row is only ever used beside the spec and state
bytes of the same snapshot entry, and only while the bucket lists both with the entry's
tokens; anything a row does not answer (a running job's workers, a time limit's countdown, a
waiting job's place in the queue) is answered from those bytes, parsed then.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from bastion.jobspec import JobSpec
from bastion.jobstate import JobState
from bastion.policy_inputs import Standing


def spec_fields(spec: JobSpec) -> dict[str, Any]:
    """A job's spec as `bastion list --json` shows it (fields named as in the spec)."""
    meta = spec.metadata
    data: dict[str, Any] = {
        "command": spec.command,
        "user_id": meta.user_id,
        "project_id": meta.project_id,
        "resources": meta.resources,
        "priority": meta.priority,
        "job_id": meta.job_id,
        "creation_time": meta.creation_time.isoformat() + "Z",
        "runner": spec.runner,
        "bundle": spec.bundle,  # enough to rerun the exact code
    }
    for key in ("time_limit", "after", "group"):
        if getattr(spec, key):
            data[key] = getattr(spec, key)
    return data


def created(fields: dict[str, Any]) -> dt.datetime:
    """The spec's creation time from ``spec_fields`` (naive UTC, as the spec holds it);
    ValueError for a row that is not ours."""
    return dt.datetime.fromisoformat(str(fields["creation_time"]).removesuffix("Z"))


@dataclass(frozen=True, slots=True)
class StateSummary:
    """What a row takes from the state: taken by the loop that owns the state (attribute
    reads, no serialization), so the writer's thread never reads a state being changed."""

    phase: str  # the lifecycle status (PENDING, ACTIVE, COMPLETED)
    shown: str  # the status as users read it (display_status)
    reason: str
    log_start: int
    standing: Standing  # what the policy reads of it, for `bastion why`

    @classmethod
    def of(cls, state: JobState) -> StateSummary:
        shown = state.display_status
        return cls(state.status.value, shown, state.reason, state.log_start, Standing.of(state))


def encode(spec: JobSpec, summary: StateSummary) -> bytes:
    row = {
        "phase": summary.phase,
        "status": summary.shown,
        "reason": summary.reason,
        "log_start": summary.log_start,
        "spec": spec_fields(spec),
        "standing": summary.standing.to_json(),
    }
    return json.dumps(row, separators=(",", ":")).encode()


@dataclass(slots=True)
class JobRow:
    """A row as read back: ValueError from ``loads`` for anything this code did not write
    (and from ``standing``, for its standing: parsed on first use, by `bastion why` alone)."""

    phase: str
    status: str
    reason: str
    log_start: int
    spec: dict[str, Any]
    standing_json: Any = field(repr=False)
    parsed_standing: Standing | None = field(default=None, repr=False)

    @property
    def standing(self) -> Standing:
        if self.parsed_standing is None:
            self.parsed_standing = Standing.from_json(self.standing_json)
        return self.parsed_standing

    @classmethod
    def loads(cls, raw: bytes) -> JobRow:
        data = json.loads(raw)
        try:
            fields = ("phase", "status", "reason", "log_start", "spec", "standing")
            row = cls(*(data[f] for f in fields))
        except (KeyError, TypeError):
            raise ValueError("not a row: a field is missing") from None
        spec = row.spec if isinstance(row.spec, dict) else {}
        texts = (row.phase, row.status, row.reason, spec.get("user_id"), spec.get("project_id"))
        texts += (spec.get("creation_time"),)
        typed = type(row.log_start) is int and isinstance(spec.get("resources"), dict)
        if not typed or not all(isinstance(t, str) for t in texts):
            raise ValueError("not a row: a field has the wrong type")
        return row
