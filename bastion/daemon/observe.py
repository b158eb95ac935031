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
from bastion.runners.base import Observation

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
    for (job, purpose), result in watched(ctx, work):
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


def watched(
    ctx: Context, work: list[tuple[Job, str]]
) -> list[tuple[tuple[Job, str], Observation | Exception]]:
    """Each item's observation (or the error that kept it from being seen), in ``work``'s
    order. Attempts of runners whose polls are cheap are watched in this thread while the
    others' are in the I/O pool. Watching reads the bucket for a log whose base is not known
    yet (a daemon on a new work directory adopting running attempts): those bases are learned
    in the pool first, and a log still unknown after that (the bucket failed) is watched in
    the pool, so that the loop's thread never waits out a request's retries."""
    watch_one = pools.quietly(functools.partial(watch, ctx))
    logs = [job_log_name(job.name, cleanup=purpose == CLEANUP) for job, purpose in work]
    cheap = [_cheap_polls(ctx, item) for item in work]
    unknown = {log for log, c in zip(logs, cheap, strict=True) if c and not ctx.logs.knows(log)}
    if unknown:
        list(ctx.pool.map(pools.quietly(ctx.logs.base), unknown))
    here = [c and ctx.logs.knows(log) for log, c in zip(logs, cheap, strict=True)]
    pooled = ctx.pool.map(watch_one, [i for i, h in zip(work, here, strict=True) if not h])
    mine = iter([watch_one(i) for i, h in zip(work, here, strict=True) if h])  # meanwhile
    theirs = iter(list(pooled))
    return [(item, next(mine if h else theirs)) for item, h in zip(work, here, strict=True)]


def _cheap_polls(ctx: Context, item: tuple[Job, str]) -> bool:
    record = lifecycle.attempt_record(item[0].state, item[1])
    try:
        return record is not None and ctx.runners.get(record.kind).cheap_polls
    except Exception:  # no such runner here: its watch says so, from the pool
        return False


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
