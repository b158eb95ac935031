"""Observe: each live attempt is polled through its runner (in the I/O pool) and its output
copied; what a runner says becomes a lifecycle event.
"""

from __future__ import annotations

import functools
import logging

from bastion import lifecycle
from bastion.bucket.logs import job_log_name
from bastion.daemon import events, pools
from bastion.daemon.context import OUTPUT_CHUNK, Context, Job
from bastion.jobstate import Status
from bastion.lifecycle import CLEANUP, RUN
from bastion.retry import error_text
from bastion.runners.base import (
    Observation,
)

log = logging.getLogger("bastion.daemon")


def observe(ctx: Context, now: float) -> None:
    """Poll every attempt and copy its new output, in parallel; then feed what was seen."""
    for job in ctx.attending():
        if job.gone_from_bucket and job.state.status in (Status.PENDING, Status.ACTIVE):
            events.apply(
                ctx,
                job,
                lifecycle.Cancel("spec deleted from the bucket", job.grace(ctx.grace_seconds)),
                now,
            )
    work = [
        (job, purpose)
        for job in ctx.attending()
        if not job.inflight
        for purpose in (RUN, CLEANUP)
        if (record := lifecycle.attempt_record(job.state, purpose)) is not None
        and not record.unstarted
    ]
    results = ctx.pool.map(pools.quietly(functools.partial(watch, ctx)), work)
    for (job, purpose), result in zip(work, results, strict=True):
        if isinstance(result, Exception):
            log.error(
                "%s: could not watch its %s attempt: %s", job.name, purpose, error_text(result)
            )
            if job.reason_before_blind is None:
                job.reason_before_blind = job.state.reason
            blind = f"could not watch attempt {job.state.attempt}: {result}"[:500]
            events.apply(ctx, job, lifecycle.Blind(blind), now)
            continue
        if job.reason_before_blind is not None:  # watching again: the failure is over
            events.apply(ctx, job, lifecycle.Sighted(job.reason_before_blind), now)
            job.reason_before_blind = None
        try:
            if result.note and result.finished:  # before the outcome it belongs to
                events.apply(ctx, job, lifecycle.Noted("LEFTOVERS", result.note), now)
            events.apply(ctx, job, lifecycle.Observed(purpose, result), now)
        except Exception:
            log.exception("%s: could not take in what its runner reported", job.name)
    for job in ctx.attending():
        if job.state.stop and not job.inflight:
            events.apply(ctx, job, lifecycle.Tick(), now)


def watch(ctx: Context, item: tuple[Job, str]) -> Observation:
    """Poll first, then copy output: a finished attempt's output is read to its end."""
    job, purpose = item
    record = lifecycle.attempt_record(job.state, purpose)
    assert record is not None and record.handle is not None
    runner = ctx.runners.get(record.kind)
    observation = runner.poll(record.handle)
    log_name = job_log_name(job.name, cleanup=purpose == CLEANUP)
    while True:
        offset = max(0, ctx.logs.total(log_name) - record.origin)
        data = runner.read_output(record.handle, offset, OUTPUT_CHUNK)
        if data:
            ctx.logs.append(log_name, data)
        if len(data) < OUTPUT_CHUNK or not observation.finished:
            break
    return observation
