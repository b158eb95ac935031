"""The bridge from bucket objects to the pure policy: a job's spec and state as a JobRequest.

The daemon and `bastion why` both build the policy's input here, so the explanation a user
reads is computed from exactly what the daemon decides on.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from bastion.jobspec import JobSpec
from bastion.jobstate import JobState, Status
from quota.policy import JobRequest, Phase


def phase_of(state: JobState) -> Phase | None:
    """How the policy sees a job's capacity; None for jobs that hold and want nothing."""
    if state.status is Status.PENDING:
        return Phase.PENDING
    if state.status is Status.ACTIVE and not state.stop:
        return Phase.RUNNING
    if state.status in (Status.ACTIVE, Status.CANCELLING, Status.CLEANING):
        return Phase.RELEASING  # still holds its resources until it is gone
    return None


def job_request(name: str, spec: JobSpec | None, state: JobState, now: float) -> JobRequest | None:
    phase = phase_of(state)
    if phase is None or spec is None:
        return None
    meta = spec.metadata
    return JobRequest(
        name=name,
        project_id=meta.project_id,
        user_id=meta.user_id,
        resources=meta.resources,
        priority=meta.priority,
        submit_time=state.submit_time or now,
        phase=phase,
        # Minimum runtime counts from running, not from provisioning: a job still being
        # provisioned has run for no time at all.
        start_time=state.running_since or (now if phase is not Phase.PENDING else None),
        tier=state.tier,
        # A victim still stopping keeps its room earmarked for the job that reclaimed it.
        preempted_by=state.stop.by if state.stop is not None and phase is Phase.RELEASING else None,
        creation_time=meta.creation_time.replace(tzinfo=dt.UTC).timestamp(),
        backfill_for=tuple(state.metadata.get("backfill_for") or ()),
        preemptions=state.preemptions,
        # The job's last progress report (BASTION_OUTPUT_DIR/.bastion/checkpoint.json): among
        # victims of equal standing the policy takes the one that loses least work.
        last_checkpoint=state.last_checkpoint,
        pending_since=(state.pending_since or state.submit_time or now)
        if phase is Phase.PENDING
        else None,
    )


def policy_requests(
    jobs: Iterable[tuple[str, JobSpec | None, JobState]], now: float
) -> list[JobRequest]:
    """The policy's input: every job that holds or wants capacity, as (name, spec, state).
    The one place both the daemon's pass and ``bastion why`` build it."""
    return [r for name, spec, state in jobs if (r := job_request(name, spec, state, now))]
