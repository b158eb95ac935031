"""Recovery (the first cycle of a daemon that acts): every state read back from the bucket, and
the periodic check that no one else wrote a state we own.
"""

from __future__ import annotations

import collections
import functools
import logging
import time

from bastion import lifecycle
from bastion.bucket.objects import ObjectInfo, UnacceptableObject
from bastion.bucket.snapshot import shard_of, still_current
from bastion.daemon import events, pools, snapshot, sweep, writeback
from bastion.daemon.context import QUEUE_CHECK_SECONDS_PER_JOB, Context, Job
from bastion.daemon.statebytes import squeeze
from bastion.daemon.writeback import read_back_state
from bastion.jobspec import JobSpec, SpecError
from bastion.jobstate import JobState, Status
from bastion.lifecycle import CLEANUP, RUN
from bastion.runners.base import (
    AttemptPhase,
    Observation,
)

log = logging.getLogger("bastion.daemon")


def recover(ctx: Context, specs: dict[str, ObjectInfo], cycle_time: float | None = None) -> None:
    """First cycle: load every state, so attempts are found by name, never started again.
    Every state was just read and marked, so the whole-queue check (``upkeep``) is next due
    one period after ``cycle_time`` (the cycle's clock), not at the first upkeep: at 100,000
    jobs that check costs about 5 s of CPU and would find nothing."""
    if cycle_time is not None:
        ctx.queue_checked_at = cycle_time
    if ctx.info:
        ctx.store.daemon_info.write({**ctx.info, "acting_since": time.time()})
    ctx.logs.forget_remote()
    states = ctx.store.states.list()
    raws, fresh_specs = read_states(ctx, specs, states)
    ctx.jobs.clear()
    ctx.index.clear()
    ctx.job_changes += 1
    ctx.attention.clear()
    for name, raw in sorted(raws.items()):
        if raw is None:
            continue
        try:
            if isinstance(raw, UnacceptableObject):
                raise raw
            state = JobState.loads(raw)
        except Exception as e:
            log.error("%s: unreadable state file (%s); treating the job as new", name, e)
            continue
        state.mark_written()
        job = Job(name=name, state=state, squeezed=squeeze(raw), state_token=states[name].token)
        ctx.jobs[name] = job
        ctx.index.saw_state(job, None)
        if name in fresh_specs:
            restore_spec(job, fresh_specs[name], specs[name].token)
            ctx.index.saw_spec(job)
        if name not in specs and state.status is not Status.COMPLETED:
            job.gone_from_bucket = True
        lose_unnamed_attempts(ctx, job)
        if not job.quiet():  # (a quiet job has nothing under way: no step looks at it)
            ctx.attend(job)
        if state.status is not Status.PENDING or state.attempt:  # the waiting: counted below
            log.info(
                "%s: recovered in state %s (attempt %d)", name, state.status.value, state.attempt
            )
    log.info("recovered %d jobs: %s", len(ctx.jobs), counted(ctx))
    now = time.time()
    snapshot.known(ctx.snapshots, filter(None, map(snapshot.key, ctx.jobs.values())), now)
    snapshot.baseline(ctx)
    sweep.sweep(ctx)
    for job in ctx.jobs.values():
        for purpose in (RUN, CLEANUP):
            # Recorded before the start, which may or may not have happened: start is
            # idempotent by name (a runner that has it adopts it), so it happens once.
            # (Most jobs of a large queue have no record: nothing to feed the table.)
            if lifecycle.attempt_record(job.state, purpose) is not None:
                events.apply(ctx, job, lifecycle.StartAgain(purpose), now)


def lose_unnamed_attempts(ctx: Context, job: Job) -> None:
    """An attempt recorded by a daemon from before attempts had names: nothing can find it
    by name, so it is lost."""
    for purpose in (RUN, CLEANUP):
        record = lifecycle.attempt_record(job.state, purpose)
        if record is not None and record.name is None:
            lost = Observation(
                AttemptPhase.LOST, "recorded by an older daemon without an attempt name"
            )
            events.apply(ctx, job, lifecycle.Observed(purpose, lost), time.time())


def counted(ctx: Context) -> str:
    """``99980 PENDING, 20 ACTIVE``: the jobs held, by status."""
    counts = collections.Counter(job.state.status.value for job in ctx.jobs.values())
    return ", ".join(f"{n} {status}" for status, n in counts.most_common()) or "none"


def read_states(
    ctx: Context, specs: dict[str, ObjectInfo], states: dict[str, ObjectInfo]
) -> tuple[dict[str, bytes | UnacceptableObject | None], dict[str, bytes]]:
    """Every listed state's bytes: from the snapshot where its token is the one listed now,
    else read (with retries). Also the specs the snapshot holds at their listed token."""
    entries = ctx.store.snapshot.read_all(ctx.pool.map)
    ctx.snapshots.rowless = {shard_of(n) for n, e in entries.items() if e.spec and not e.row}
    fresh_states, fresh_specs = still_current(entries, specs, states)
    reads = [n for n in states if n not in fresh_states]
    read = pools.retrying(functools.partial(read_state_or_problem, ctx))
    raws: dict[str, bytes | UnacceptableObject | None] = dict(fresh_states)
    raws.update(zip(reads, ctx.pool.map(read, reads), strict=True))
    log.info("recovery: %d states from the snapshot, %d read", len(fresh_states), len(reads))
    return raws, fresh_specs


def restore_spec(job: Job, raw: bytes, token: str) -> None:
    """The spec the snapshot holds at the token listed now: taken in already, so it is not
    read again (one that does not load is read as if it were new)."""
    try:
        spec = JobSpec.loads(raw)
    except SpecError:
        return
    if spec.name == job.name:
        job.spec, job.token = spec, token


def upkeep(ctx: Context, now: float) -> None:
    """Every SWEEP_EVERY_CYCLES cycles: orphaned attempts are swept; and, no more often than
    QUEUE_CHECK_SECONDS_PER_JOB per job held (each check's CPU is linear in the queue: at
    100,000 jobs a serialization of every state and a listing of every state object, once
    per 500 s), every state is checked against what was written and the bucket holds, and
    every job that is not quiet to be in the attention set."""
    sweep.sweep(ctx)
    if now - ctx.queue_checked_at < len(ctx.jobs) * QUEUE_CHECK_SECONDS_PER_JOB:
        return
    ctx.queue_checked_at = now
    check_attention(ctx)
    writeback.check_marks(ctx)
    check_states(ctx)


def check_attention(ctx: Context) -> None:
    """Every job that is not quiet is in the attention set (Context.attention): one left
    out is a change that escaped events.apply (a bug), reported and attended to."""
    for name, job in ctx.jobs.items():
        if name not in ctx.attention and not job.quiet():
            log.error("%s: not quiet, but no step was attending to it; attending now", name)
            ctx.attend(job)


def check_states(ctx: Context) -> None:
    """Only the daemon writes states. One whose listing token is not the token of our own
    last write was written (or deleted) by someone else: report it and write ours back
    over it on this cycle's write-back, never acting on what it says."""
    listed = ctx.store.states.list()
    for name, job in ctx.jobs.items():
        info = listed.get(name)
        if not job.squeezed or job.state_token is None:
            continue
        if job.state.status is Status.COMPLETED and info is None:
            continue  # our own finalize deleted it (its answer lost): not a foreign delete
        if info is not None and info.token != job.state_token:
            back = read_back_state(ctx, job)
            if back.ours and back.found is not None:
                job.state_token = back.found[1]  # our own write, whose answer was lost
                ctx.attend(job)  # (its key in the snapshot moved)
                continue
        if info is None or info.token != job.state_token:
            log.error(
                "%s: its state object was %s by someone else; restoring the daemon's own",
                name,
                "deleted" if info is None else "overwritten",
            )
            job.written = b""  # differs from the state: written back, over the foreign one
            job.state.changed = True
            ctx.attend(job)


def read_state_or_problem(ctx: Context, name: str) -> bytes | UnacceptableObject | None:
    try:
        return ctx.store.states.read(name)
    except UnacceptableObject as e:  # not a regular file: a problem, not a retry
        return e
