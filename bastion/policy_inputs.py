"""The bridge from bucket objects to the pure policy: a job's spec and state as a JobRequest.

The daemon and `bastion why` both build the policy's input here, so the explanation a user
reads is computed from exactly what the daemon decides on.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from bastion.jobspec import JobSpec
from bastion.jobstate import JobState, Status
from quota.model import JobRequest, Phase


def phase_of(state: JobState) -> Phase | None:
    """How the policy sees a job's capacity; None for jobs that hold and want nothing."""
    if state.status is Status.PENDING:
        return Phase.PENDING
    if state.status is Status.ACTIVE and not state.stop:
        return Phase.RUNNING
    if state.status in (Status.ACTIVE, Status.CANCELLING, Status.CLEANING):
        return Phase.RELEASING  # still holds its resources until it is gone
    return None


def timeless(state: JobState) -> bool:
    """Whether the request ``job_request`` builds from ``state`` is the same at any ``now``:
    ``request`` reads ``now`` only for a missing submit time, a missing pending time (which
    the submit time stands for) and a running job's missing start."""
    phase = phase_of(state)
    return phase is None or bool(
        state.submit_time and (phase is Phase.PENDING or state.running_since)
    )


@dataclass(frozen=True, slots=True)
class Standing:
    """What the policy reads of a job's state. The daemon's snapshot carries it in each job's
    row (bastion/jobrow.py), so `bastion why` builds the policy's input without parsing
    every state; ``request`` turns it into the same JobRequest either way."""

    phase: Phase | None
    submit_time: float | None = None
    running_since: float | None = None
    tier: int | None = None
    preempted_by: str | None = None  # a victim still stopping: who reclaimed its room
    backfill_for: tuple[str, ...] = ()
    preemptions: int = 0
    last_checkpoint: float | None = None
    pending_since: float | None = None

    @classmethod
    def of(cls, state: JobState) -> Standing:
        phase = phase_of(state)
        stop = state.stop
        return cls(
            phase,
            state.submit_time,
            state.running_since,
            state.tier,
            stop.by if stop is not None and phase is Phase.RELEASING else None,
            tuple(state.metadata.get("backfill_for") or ()),
            state.preemptions,
            state.last_checkpoint,
            state.pending_since,
        )

    def to_json(self) -> list[Any]:
        values = [getattr(self, f.name) for f in fields(self)]
        return [self.phase.value if self.phase else None, *values[1:]]

    @classmethod
    def from_json(cls, data: Any) -> Standing:
        """ValueError for anything ``to_json`` did not write. (Checked field by field, not
        through ``dataclasses.fields`` and ``replace``: `bastion why` reads one per job.)"""
        if not isinstance(data, list) or len(data) != _STANDING_FIELDS:
            raise ValueError("not a standing")
        phase, submit, running, tier, by, backfill, preemptions, checkpoint, pending = data
        for time_ in (submit, running, checkpoint, pending):  # (a loop: no call per time)
            if time_ is not None and type(time_) is not float and type(time_) is not int:
                raise ValueError("a standing's times are numbers")
        typed = isinstance(backfill, list) and type(preemptions) is int
        typed = typed and (tier is None or type(tier) is int)
        if not typed or not (by is None or isinstance(by, str)):
            raise ValueError("a standing's fields have the wrong types")
        return cls(
            Phase(phase) if phase is not None else None,
            submit,
            running,
            tier,
            by,
            tuple(map(str, backfill)),
            preemptions,
            checkpoint,
            pending,
        )


_STANDING_FIELDS = len(fields(Standing))


def job_request(name: str, spec: JobSpec | None, state: JobState, now: float) -> JobRequest | None:
    if spec is None:
        return None
    meta = spec.metadata
    return request(
        name,
        meta.project_id,
        meta.user_id,
        meta.resources,
        meta.priority,
        meta.creation_time.replace(tzinfo=dt.UTC).timestamp(),
        Standing.of(state),
        now,
    )


def request(
    name: str,
    project_id: str,
    user_id: str,
    resources: Mapping[str, int],
    priority: int,
    creation_time: float,
    standing: Standing,
    now: float,
) -> JobRequest | None:
    """A job as the policy sees it (None: it holds and wants nothing)."""
    phase = standing.phase
    if phase is None:
        return None
    return JobRequest(
        name=name,
        project_id=project_id,
        user_id=user_id,
        resources=resources,
        priority=priority,
        submit_time=standing.submit_time or now,
        phase=phase,
        # Minimum runtime counts from running, not from provisioning: a job still being
        # provisioned has run for no time at all.
        start_time=standing.running_since or (now if phase is not Phase.PENDING else None),
        tier=standing.tier,
        # A victim still stopping keeps its room earmarked for the job that reclaimed it.
        preempted_by=standing.preempted_by,
        creation_time=creation_time,
        backfill_for=standing.backfill_for,
        preemptions=standing.preemptions,
        # The job's last progress report (BASTION_OUTPUT_DIR/.bastion/checkpoint.json): among
        # victims of equal standing the policy takes the one that loses least work.
        last_checkpoint=standing.last_checkpoint,
        pending_since=(standing.pending_since or standing.submit_time or now)
        if phase is Phase.PENDING
        else None,
    )
