"""Act: the effects the table decided (start, stop, delete an attempt) run in the effects pool
after the states are written; their results are taken in at the next cycle.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from bastion import lifecycle
from bastion.daemon import events, pools
from bastion.daemon.context import (
    MAX_SPEC_ENV_BYTES,
    START_RETRY_FIRST_SECONDS,
    START_RETRY_MAX_SECONDS,
    Context,
    Job,
    NotHolding,
)
from bastion.jobstate import AttemptRecord
from bastion.lifecycle import CLEANUP, RUN
from bastion.retry import error_text
from bastion.runners.base import (
    Attempt,
    CannotStart,
    Fenced,
    NoCapacity,
    RunnerError,
    attempt_number,
)

log = logging.getLogger("bastion.daemon")


def carry_out(ctx: Context, now: float) -> None:
    """Hand decided effects to the pool, for jobs whose state (the write-ahead record of
    what is about to happen) is in the bucket. Results are taken in next cycle."""
    if ctx.start_retries:
        retry_starts(ctx, now)
    ready = [
        job for job in ctx.attending() if job.effects and not job.inflight and not job.unwritten()
    ]
    deletes = list(ctx.deleting.items())
    if not ready and not deletes:
        return
    ctx.may_act()
    batch: list[Callable[[], None]] = []
    for job in ready:
        effects, job.effects = job.effects, ()
        job.inflight += 1
        attempt = {
            p: attempt_for(ctx, job, p)
            for p in (RUN, CLEANUP)
            if any(isinstance(e, lifecycle.Start) and e.purpose == p for e in effects)
        }
        records = {p: lifecycle.attempt_record(job.state, p) for p in (RUN, CLEANUP)}
        batch.append(functools.partial(effects_of, ctx, job.name, effects, records, attempt))
    for name, (kind, handle) in deletes:
        ctx.deleting.pop(name, None)
        ctx.deletes_in_pool.add(name)  # the sweep must not take it for an orphan
        batch.append(functools.partial(delete_attempt, ctx, name, kind, handle))
    # A few tasks of many effects each: a thousand separate submissions make the decision
    # loop fight the pool's threads (busy forking processes) for the executor's locks.
    size = max(1, -(-len(batch) // ctx.workers))
    for i in range(0, len(batch), size):
        submit(ctx, pools.run_all, batch[i : i + size])


def submit(ctx: Context, call: Callable[..., None], *args: Any) -> concurrent.futures.Future[None]:
    if ctx.effects_pool is None:  # made at first use: a standby daemon needs none
        ctx.effects_pool = pools.started_pool(ctx.workers, "bastion-effects")
    future = ctx.effects_pool.submit(call, *args)
    ctx.futures.add(future)
    future.add_done_callback(ctx.futures.discard)
    return future


def attempt_for(ctx: Context, job: Job, purpose: str) -> Attempt | None:
    record = lifecycle.attempt_record(job.state, purpose)
    spec = job.spec
    if record is None or spec is None:
        return None
    command = spec.command if purpose == RUN else (spec.cleanup_command or "true")
    return Attempt(
        name=str(record.name),
        job=job.name,
        attempt=job.state.attempt,
        command=command,
        env={**job_env(ctx, job), "BASTION_PURPOSE": purpose},  # (run or cleanup)
        resources=dict(spec.metadata.resources),
        options=spec.runner_options,
        bundle=spec.bundle,
        fence=ctx.lease.term if ctx.lease is not None else 0,
        tier=job.state.tier,
        labels={
            "bastion-job": job.name[:63].lower(),
            "bastion-attempt": str(job.state.attempt),
        },
    )


def effects_of(
    ctx: Context,
    job_name: str,
    effects: Sequence[lifecycle.Effect],
    records: dict[str, AttemptRecord | None],
    attempts: dict[str, Attempt | None],
) -> None:
    """In the pool: one job's effects, in order; results go to ``_done``."""
    results: list[lifecycle.Event] = []
    try:
        for effect in effects:
            record = records.get(effect.purpose)
            if record is None:
                continue
            ctx.may_act()
            if isinstance(effect, lifecycle.Start):
                attempt = attempts.get(effect.purpose)
                if attempt is None:  # its spec is gone: nothing to start it from (if the
                    # runner has it after all, it is an orphan now: the sweep deletes it)
                    results.append(lifecycle.StartFailed(effect.purpose, "its spec is gone"))
                    continue
                try:
                    handle = ctx.runners.get(record.kind).start(attempt)
                except RunnerError as e:  # the job's error: its attempt fails with it
                    log.error("%s: could not start %s: %s", job_name, attempt.name, error_text(e))
                    results.append(lifecycle.StartFailed(effect.purpose, str(e)[:1000]))
                    continue
                except Fenced:
                    raise
                except Exception as e:  # transient: the same start again, backing off
                    bound = None if isinstance(e, NoCapacity) else ctx.start_give_up_seconds
                    log.warning(
                        "%s: starting %s: %s; trying again", job_name, attempt.name, error_text(e)
                    )
                    requeue = isinstance(e, CannotStart)
                    deferred = lifecycle.StartDeferred(effect.purpose, str(e)[:500], bound, requeue)
                    results.append(deferred)
                    continue
                record = record.started(handle)
                records[effect.purpose] = record
                results.append(lifecycle.Started(effect.purpose, handle))
            elif isinstance(effect, lifecycle.Stop) and record.handle is not None:
                ctx.runners.get(record.kind).stop(record.handle, effect.deadline)
    except NotHolding:
        # As a cycle that cannot prove the lease: act no more and drop what we know. Else
        # the start would be lost while the daemon went on (its attempt recorded, never
        # made, and retried by nothing): a recovery, once the lease is ours again, makes it.
        log.error("%s: effects not carried out: the lease is not certainly ours", job_name)
        ctx.lost_ownership = True
    except Fenced as e:  # a newer daemon has started attempts: we are a stale holder
        log.error("%s: effects not carried out: %s", job_name, error_text(e))
        ctx.lost_ownership = True
    except Exception:
        log.exception("%s: carrying out effects failed; retried next cycle", job_name)
    with ctx.results_lock:
        ctx.effect_results.extend((job_name, event) for event in results)
        ctx.effect_results.append((job_name, None))  # marks the batch as finished


def delete_attempt(ctx: Context, name: str, kind: str, handle: dict[str, Any] | None) -> None:
    try:
        ctx.may_act()
        # An attempt that never started has nothing to delete (its kind may be unknown).
        gone = handle is None or ctx.runners.get(kind).delete(handle)
    except NotHolding:  # tried again once we act (or dropped if we let go)
        gone = False
    except Exception as e:
        log.error("could not delete attempt %s (will retry): %s", name, error_text(e))
        gone = False
    with ctx.results_lock:
        if gone:
            ctx.deleted.append((name, kind, handle))
        else:
            ctx.undeleted.append((name, kind, handle))


def take_in_results(ctx: Context) -> None:
    with ctx.results_lock:
        done, ctx.effect_results = ctx.effect_results, []
        undeleted, ctx.undeleted = ctx.undeleted, []
        deleted, ctx.deleted = ctx.deleted, []
    for name, kind, handle in undeleted:  # retried next cycle until verified gone
        ctx.deletes_in_pool.discard(name)
        ctx.deleting.setdefault(name, (kind, handle))
    now = time.time()
    for name, kind, handle in deleted:
        ctx.deletes_in_pool.discard(name)
        owner = ctx.deletes_of.pop(name, None)
        job = ctx.jobs.get(owner[0]) if owner else None
        if job is not None and (what := describe(ctx, kind, handle)):
            events.apply(
                ctx, job, lifecycle.Noted("DELETED", f"deleted {what}", attempt_number(name)), now
            )
    for job_name, event in done:
        job = ctx.jobs.get(job_name)
        if job is None:
            continue
        if event is None:
            job.inflight = max(0, job.inflight - 1)
        elif isinstance(event, lifecycle.StartDeferred):
            events.apply(ctx, job, event, now)  # the job says why it waits, or it gave up
            start_later(ctx, job, event, now)
        else:
            ctx.start_retries.pop((job_name, getattr(event, "purpose", "")), None)
            events.apply(ctx, job, event, now)
            if isinstance(event, lifecycle.Started):
                note_placed(ctx, job, event, now)


def start_later(ctx: Context, job: Job, event: lifecycle.StartDeferred, now: float) -> None:
    """Schedule the next try of a start that failed transiently: next cycle after the
    first failure, then 1, 2, 4 ... seconds later up to START_RETRY_MAX_SECONDS (none for
    a wait for capacity: the runner backs off each zone itself), and never after its
    give-up time, so the last try is the one that gives up on time."""
    record = lifecycle.attempt_record(job.state, event.purpose)
    key = (job.name, event.purpose)
    if record is None or not record.unstarted:  # it ended (gave up, cancelled)
        ctx.start_retries.pop(key, None)
        return
    tries = ctx.start_retries.get(key, (0, 0.0))[0] + 1
    delay = 0.0
    if event.give_up_after is not None and tries > 1:
        delay = min(START_RETRY_MAX_SECONDS, START_RETRY_FIRST_SECONDS * 2 ** (tries - 2))
        since = record.deferred_since or now
        delay = max(0.0, min(delay, since + event.give_up_after - now))
    ctx.start_retries[key] = (tries, now + delay)


def retry_starts(ctx: Context, now: float) -> None:
    """Hand back the starts whose next try is due (their jobs' attempts still unstarted)."""
    for key, (_, due) in list(ctx.start_retries.items()):
        job = ctx.jobs.get(key[0])
        record = lifecycle.attempt_record(job.state, key[1]) if job else None
        if job is None or record is None or not record.unstarted:
            del ctx.start_retries[key]
        elif due <= now and not job.inflight and lifecycle.Start(key[1]) not in job.effects:
            # (Its result reschedules or ends it; one lost to an error is tried again.)
            events.apply(ctx, job, lifecycle.StartAgain(key[1]), now)


def note_placed(ctx: Context, job: Job, event: lifecycle.Started, now: float) -> None:
    record = lifecycle.attempt_record(job.state, event.purpose)
    if record is not None and (what := describe(ctx, record.kind, event.handle)):
        events.apply(
            ctx, job, lifecycle.Noted("PLACED", f"attempt {job.state.attempt} on {what}"), now
        )


def describe(ctx: Context, kind: str, handle: dict[str, Any] | None) -> str | None:
    """What an attempt occupies, in the runner's words, for the job's history."""
    if handle is None:
        return None
    try:
        return ctx.runners.get(kind).describe(handle)
    except Exception:  # an unknown kind: nothing to tell
        return None


def job_env(ctx: Context, job: Job) -> dict[str, str]:
    spec, state = job.spec, job.state
    assert spec is not None
    env = {
        "BASTION_JOB_NAME": job.name,
        "BASTION_ATTEMPT": str(state.attempt),
        "BASTION_ROOT": ctx.store.root_url,
        "BASTION_JOB_ID": spec.metadata.job_id or "",
        "BASTION_PROJECT_ID": spec.metadata.project_id,
        "BASTION_USER_ID": spec.metadata.user_id,
        "BASTION_TIER": "" if state.tier is None else str(state.tier),
        "BASTION_SPEC_URL": ctx.store.specs.url(job.name),
        # Where the job's outputs live (the runner's supervisor restores and syncs them) and
        # how it is warned before a stop (bastion/outputs/).
        "BASTION_STOP_SIGNAL": spec.stop_signal or "TERM",
        "BASTION_GRACE_SECONDS": f"{job.grace(ctx.grace_seconds):g}",
    }
    if ctx.store.outputs.reachable_elsewhere():
        env["BASTION_OUTPUT_URL"] = ctx.store.outputs.url(job.name)
    if job.spec_json[0] is not spec:  # serialized once per spec, not once per attempt
        job.spec_json = (spec, json.dumps(spec.to_json()))
    serialized = job.spec_json[1]
    if len(serialized) <= MAX_SPEC_ENV_BYTES:  # AXLearn's variable; past this, the URL
        env["_BASTION_SERIALIZED_JOBSPEC"] = serialized
    if spec.metadata.version:
        env["BASTION_JOB_VERSION"] = str(spec.metadata.version)
    env.update(spec.env_vars or {})
    return env
