"""Feeding the lifecycle table: an event becomes the job's next state, its effects and its
history lines (the only way a step changes a job's state).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from bastion import lifecycle
from bastion.bucket.logs import job_log_name
from bastion.daemon.context import Context, Job
from bastion.jobstate import JobState
from bastion.lifecycle import CLEANUP
from bastion.policy_inputs import job_request
from bastion.retry import error_text
from bastion.runners.base import (
    attempt_name,
)
from quota.model import JobRequest

log = logging.getLogger("bastion.daemon")


def seen_by_policy(job: Job, state: JobState, now: float) -> JobRequest | None:
    """What a pass would see of the job, less when its minimum runtime started counting: a
    running job's start moving later (provisioning, then running) only delays when it becomes
    preemptible, and the last plan's replan time (quota.policy.replan_by) is already earlier."""
    request = job_request(job.name, job.spec, state, now)
    return None if request is None else dataclasses.replace(request, start_time=None)


def apply(ctx: Context, job: Job, event: lifecycle.Event, now: float) -> None:
    """Feed one event to the table; keep its effects (log lines are written at once:
    they are local appends that later offsets depend on)."""
    has_cleanup = bool(job.spec and job.spec.cleanup_command)
    result = lifecycle.transition(job.state, event, now, job=job.name, has_cleanup=has_cleanup)
    if not result.effects and not result.events and result.state == job.state:
        return  # nothing changed: the state stays unmarked (a quiet cycle writes nothing)
    if not ctx.inputs_changed and seen_by_policy(job, job.state, now) != seen_by_policy(
        job, result.state, now
    ):
        ctx.inputs_changed = True  # what the policy sees of this job moved: plan again
    before, job.state = job.state, result.state
    ctx.index.saw_state(job, before)
    ctx.attend(job)
    for name, reason in result.events:
        log.info("%s: %s: %s", job.name, name, reason)
    for name, text, _ in result.notes:
        log.info("%s: %s: %s", job.name, name, text)
    for effect in result.effects:
        if isinstance(effect, lifecycle.Log):
            log_line(ctx, job, effect.purpose, effect.text)
        elif isinstance(effect, lifecycle.NeedsCleanup):
            log_name = job_log_name(job.name, cleanup=True)
            apply(
                ctx,
                job,
                lifecycle.CleanupAdmit(
                    attempt_name=attempt_name_for(ctx, job, CLEANUP),
                    runner_kind=runner_kind(ctx, job),
                    log_size=ctx.logs.total(log_name),
                ),
                now,
            )
        elif isinstance(effect, lifecycle.Delete):
            ctx.deleting[effect.name] = (effect.kind, effect.handle)
            if effect.handle is not None:  # the job is recorded once this is gone
                ctx.deletes_of.setdefault(effect.name, (job.name, time.time()))
        else:
            job.effects += (effect,)


def log_line(ctx: Context, job: Job, purpose: str, text: str) -> None:
    log_name = job_log_name(job.name, cleanup=purpose == CLEANUP)
    job.pending_log += ((log_name, text),)
    try:
        while job.pending_log:
            ctx.logs.write(*job.pending_log[0])
            job.pending_log = job.pending_log[1:]
    except OSError as e:  # a full work-dir disk: the line waits, the job goes on
        log.error(
            "%s: could not write to the local log mirror (retrying): %s", job.name, error_text(e)
        )


def runner_kind(ctx: Context, job: Job) -> str:
    return ctx.runners.kind_for(job.spec.runner_kind if job.spec else None)


def attempt_name_for(ctx: Context, job: Job, purpose: str) -> str:
    state = job.state
    return attempt_name(ctx.store.root_url, job.name, state.submission, state.attempt, purpose)
