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

import orjson

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


def created_at(text: Any) -> dt.datetime:
    """A spec's creation time as ``spec_fields`` writes it (naive UTC, as the spec holds it);
    ValueError for a row that is not ours."""
    return dt.datetime.fromisoformat(str(text).removesuffix("Z"))


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


ROW_V3 = b"row 3\n"


def group_name(fields: dict[str, Any]) -> str | None:
    """The array or sweep a spec's fields (``spec_fields``) make it a member of."""
    group = fields.get("group")
    return str(group.get("name")) if isinstance(group, dict) and group else None


def encode(spec: JobSpec, summary: StateSummary) -> bytes:
    """``row 3``, a JSON array of what a table and `bastion why` read, then the spec's fields
    as `bastion list --json` prints them: a reader decodes the short array and copies the
    fields' text into its output without decoding it."""
    fields = spec_fields(spec)
    meta = spec.metadata
    head = [
        summary.phase,
        summary.shown,
        summary.reason,
        summary.log_start,
        summary.standing.to_json(),
        meta.project_id,
        meta.user_id,
        meta.resources,
        meta.priority,
        fields["creation_time"],
        group_name(fields),
        "time_limit" in fields,
    ]
    return b"".join(
        [
            ROW_V3,
            json.dumps(head, separators=(",", ":")).encode(),
            b"\n",
            json.dumps(fields).encode(),
        ]
    )


@dataclass(slots=True)
class JobRow:
    """A row as read back: ValueError from ``loads`` for anything this code did not write
    (and from ``standing``, for its standing: parsed on first use, by `bastion why` alone).
    ``spec`` (the fields) is decoded on first use; ``spec_text`` is their JSON text (None
    for a row of the first version, a JSON object)."""

    phase: str
    status: str
    reason: str
    log_start: int
    standing_json: Any = field(repr=False)
    project_id: str
    user_id: str
    resources: dict[str, Any]
    priority: Any
    creation_time: str
    group: str | None
    timed: bool  # the spec has a time limit
    spec_text: str | None = field(default=None, repr=False)
    decoded_spec: dict[str, Any] | None = field(default=None, repr=False)
    parsed_standing: Standing | None = field(default=None, repr=False)

    @property
    def standing(self) -> Standing:
        if self.parsed_standing is None:
            self.parsed_standing = Standing.from_json(self.standing_json)
        return self.parsed_standing

    @property
    def spec(self) -> dict[str, Any]:
        if self.decoded_spec is None:
            decoded = json.loads(self.spec_text or "{}")
            self.decoded_spec = decoded if isinstance(decoded, dict) else {}
        return self.decoded_spec

    def spec_json(self) -> str:
        """The spec's fields as JSON text: as the row holds them (version 3), else encoded."""
        return self.spec_text if self.spec_text is not None else json.dumps(self.spec)

    @classmethod
    def loads(cls, raw: bytes) -> JobRow:
        if raw.startswith(ROW_V3):
            head, _, text = raw[len(ROW_V3) :].partition(b"\n")
            try:
                row = cls(*_decoded(head), spec_text=text.decode())
            except (TypeError, UnicodeDecodeError):
                raise ValueError("not a row: fields missing or too many") from None
        else:
            row = cls._first_version(json.loads(raw))
        if not (  # (one expression: a reader of 20,000 jobs checks 20,000 rows)
            type(row.phase) is str
            and type(row.status) is str
            and type(row.reason) is str
            and type(row.project_id) is str
            and type(row.user_id) is str
            and type(row.creation_time) is str
            and type(row.log_start) is int
            and type(row.resources) is dict
            and type(row.timed) is bool
            and (row.group is None or type(row.group) is str)
        ):
            raise ValueError("not a row: a field has the wrong type")
        return row

    @classmethod
    def _first_version(cls, data: Any) -> JobRow:
        """A row written before ``row 3``: one JSON object, the spec's fields inside."""
        try:
            spec = data["spec"] if isinstance(data["spec"], dict) else {}
            return cls(
                *(data[f] for f in ("phase", "status", "reason", "log_start", "standing")),
                spec.get("project_id"),
                spec.get("user_id"),
                spec.get("resources"),
                spec.get("priority"),
                spec.get("creation_time"),
                group_name(spec),
                "time_limit" in spec,
                decoded_spec=spec,
            )
        except (KeyError, TypeError):
            raise ValueError("not a row: a field is missing") from None


def _decoded(head: bytes) -> Any:
    """A row's head as ``json.loads`` decodes it: orjson's decoder first (1.0 against 4.3 us a
    row; a reader of 20,000 jobs decodes 20,000), json's for what orjson refuses and json takes
    (NaN, integers past 64 bits), so that both accept and refuse the same rows."""
    try:
        return orjson.loads(head)
    except orjson.JSONDecodeError:
        return json.loads(head.decode())
