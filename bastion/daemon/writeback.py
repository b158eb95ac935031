"""Write back: logs, then the states that changed (the write-ahead record of what the effects
will do), the usage ledger and the daemon's own log.
"""

from __future__ import annotations

import functools
import logging
import time

from bastion.bucket.logs import CLEANUP_SUFFIX
from bastion.bucket.objects import PreconditionFailed
from bastion.daemon import accounting, pools
from bastion.daemon.context import (
    DAEMON_LOG_SYNC_SECONDS,
    USAGE_SAVE_SECONDS,
    Context,
    Job,
    NotHolding,
)
from bastion.jobstate import Status
from bastion.retry import ReadBack, each, error_text, read_back

log = logging.getLogger("bastion.daemon")


def write_back_job(ctx: Context, item: tuple[Job | None, list[str]]) -> bool:
    """A job's new log bytes, then its state if it changed (False: nothing to write)."""
    job, logs = item
    ended = job is not None and job.state.status is Status.COMPLETED
    for name in logs:
        try:
            if ended:
                ctx.logs.flush(name)  # past the per-sync chunk bound: the last bytes too
            else:
                ctx.logs.sync(name)
        except Exception as e:
            log.error("%s: log upload failed; it will be retried: %s", name, error_text(e))
    if job is None:
        return False
    ctx.may_act()
    return write_state(ctx, job)


def write_back(ctx: Context) -> None:
    """Upload new log bytes and changed states: one pass, jobs in parallel.

    For each job its logs go first and then its state, so a state that says the job ended
    is written after the log's last bytes; a failed log upload is retried next cycle and
    does not hold the state back. A burst's thousands of uploads share one pass."""
    logs_of = logs_by_job(set(ctx.logs.mirrors()) - {ctx.daemon_log})
    work: list[tuple[Job | None, list[str]]] = []
    for job in ctx.attending():  # a quiet job has no unwritten state
        logs = logs_of.pop(job.name, [])
        if logs or job.unwritten():
            work.append((job, logs))
    for name in [name for name in logs_of if name in ctx.jobs]:  # new output of quiet jobs
        work.append((ctx.jobs[name], logs_of.pop(name)))
    orphans = sorted(name for names in logs_of.values() for name in names)
    work.extend((None, [name]) for name in orphans)  # logs of jobs no longer here
    accounting.record_attempts(ctx)  # ahead of the states that say an attempt began or ended

    # States alone (most of a burst: new jobs have no logs yet) go in one call; jobs with
    # logs to upload first, in the pool meanwhile
    alone = [job for job, logs in work if job is not None and not logs]
    work = [item for item in work if item[0] is None or item[1]]
    in_pool = ctx.pool.map(pools.quietly(functools.partial(write_back_job, ctx)), work)
    written_alone = write_states(ctx, alone)
    results = [*in_pool, *written_alone]
    changed = False
    for job, result in zip([job for job, _ in work] + alone, results, strict=True):
        if job is None:
            continue
        changed = changed or result is not False
        if isinstance(result, (PreconditionFailed, NotHolding)):
            ctx.lost_ownership = True
        elif isinstance(result, Exception):
            log.error("%s: could not write state (will retry): %s", job.name, error_text(result))
    if ctx.lost_ownership:
        raise NotHolding
    ctx.usage_unsaved = ctx.usage_unsaved or changed
    save_usage(ctx)


def logs_by_job(mirrors: set[str]) -> dict[str, list[str]]:
    """The local log mirrors by the job they belong to: its own log, then its cleanup's."""
    owned: dict[str, list[str]] = {}
    for name in sorted(mirrors, key=lambda n: n.endswith(CLEANUP_SUFFIX)):
        owned.setdefault(name.removesuffix(CLEANUP_SUFFIX), []).append(name)
    return owned


def save_usage(ctx: Context, force: bool = False) -> None:
    """The usage ledger needs saving only when a job's state changed (see QuotaSource),
    and then at most every USAGE_SAVE_SECONDS: a daemon that dies re-creates the accrual
    since from the jobs running at its restart, so at most that long is misattributed."""
    if not ctx.usage_unsaved:
        return
    if not force and time.monotonic() - ctx.usage_saved_at < USAGE_SAVE_SECONDS:
        return
    try:
        ctx.quota.save_usage()
        ctx.usage_saved_at = time.monotonic()
        ctx.usage_unsaved = False
    except Exception:
        log.exception("could not save the usage ledger")


def check_marks(ctx: Context) -> None:
    """Now and then, every state's bytes against what was written: a change that escaped
    the marks (an in-place edit of a nested value) is a bug, reported and written."""
    for job in ctx.jobs.values():
        if not job.state.changed and job.squeezed and job.state.dumps() != job.written:
            log.error("%s: its state changed without a mark; writing it", job.name)
            job.state.changed = True
            ctx.attend(job)


def sync_daemon_log(ctx: Context, force: bool = False) -> None:
    """The daemon's own log, at most every DAEMON_LOG_SYNC_SECONDS unless ``force``."""
    if not force and time.monotonic() - ctx.daemon_log_synced_at < DAEMON_LOG_SYNC_SECONDS:
        return
    ctx.daemon_log_synced_at = time.monotonic()
    try:
        ctx.logs.sync(ctx.daemon_log)
    except Exception as e:  # logging it would only add to the same log
        print(f"bastion: daemon log upload failed: {e}", flush=True)


def read_back_state(ctx: Context, job: Job) -> ReadBack[tuple[bytes, str]]:
    """The job's state object (bytes, token) now, and whether it holds bytes this daemon
    wrote or tried: a state write whose answer was lost."""
    return read_back(
        lambda: ctx.store.states.read_with_token(job.name),
        lambda now: now[0] in (job.written, *job.attempted),
    )


def write_state(ctx: Context, job: Job) -> bool:
    """Write the job's state if its bytes changed (False: unchanged, nothing sent)."""
    raw = _to_write(job)
    if raw is None:
        return False
    try:
        token = ctx.store.states.write(job.name, raw, job.state_token)
    except PreconditionFailed as e:
        token = _after_conflict(ctx, job, raw, e)
    _written(job, raw, token)
    return True


def write_states(ctx: Context, jobs: list[Job]) -> list[bool | Exception]:
    """``write_state`` of each job, the writes sent in one call (States.write_many: on GCS
    one hop into gcsfs's event loop for a burst's thousand states); a job whose write failed
    has its exception in its place. A lost precondition is resolved as ``write_state``
    resolves it, in the pool (every write of a burst conflicts when another writer came)."""
    try:
        ctx.may_act()
    except NotHolding as e:
        return [e] * len(jobs)
    raws = [_to_write(job) for job in jobs]
    sent = [i for i, raw in enumerate(raws) if raw is not None]
    answers: list[str | Exception | None] = [None] * len(jobs)  # None: unchanged, not sent
    writes = [(jobs[i].name, raws[i], jobs[i].state_token) for i in sent]
    for i, answer in zip(sent, ctx.store.states.write_many(writes, ctx.pool), strict=True):
        answers[i] = answer
    lost = [i for i in sent if isinstance(answers[i], PreconditionFailed)]
    conflicts = [(jobs[i], raws[i], answers[i]) for i in lost]
    resolved = each(functools.partial(_after_conflict, ctx), conflicts, ctx.pool)
    for i, answer in zip(lost, resolved, strict=True):
        answers[i] = answer
    results: list[bool | Exception] = []
    for job, raw, answer in zip(jobs, raws, answers, strict=True):
        if isinstance(answer, str):
            _written(job, raw, answer)
        results.append(answer if isinstance(answer, Exception) else answer is not None)
    return results


def _to_write(job: Job) -> bytes | None:
    """The state's bytes when they differ from what was written (noted as tried: a write
    whose answer is lost is recognised as ours), else None."""
    raw = job.state.dumps()
    if raw == job.written:
        job.state.mark_written()
        return None
    job.attempted += (raw,)
    return raw


def _written(job: Job, raw: bytes, token: str) -> None:
    job.state_token = token
    job.written = raw
    job.attempted = ()
    job.state.mark_written()


def _after_conflict(ctx: Context, job: Job, raw: bytes, error: PreconditionFailed) -> str:
    """A conditional write of ``raw`` lost its precondition: the token once our bytes are
    in place. Our own earlier write may have landed with its answer lost, or its new token
    may be unknown: then the object holds bytes we wrote or tried, and we carry on from its
    token. Otherwise another daemon (or someone else) wrote it: ``error`` again."""
    back = read_back_state(ctx, job)
    current = back.found
    if not back.ours:
        if ctx.lease is None or not ctx.lease.valid():
            raise error
        # We hold the lease, so no daemon wrote this: a foreign write. Our state
        # stands; the forged bytes are reported and replaced, never acted on.
        log.error(
            "%s: its state was overwritten by someone else (not a daemon); "
            "restoring the daemon's own state",
            job.name,
        )
        return ctx.store.states.write(job.name, raw, current[1] if current else None)
    assert current is not None  # ours: our own bytes are there
    job.state_token = current[1]
    if current[0] == raw:
        return current[1]
    return ctx.store.states.write(job.name, raw, job.state_token)
