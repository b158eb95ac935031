"""Archive: a finished job whose attempts are gone is written to jobs/complete and leaves the
active set.
"""

from __future__ import annotations

import functools
import logging

from bastion.bucket.logs import job_log_name
from bastion.daemon import pools, status_page
from bastion.daemon.context import DELETE_WAIT_SECONDS, Context, Job
from bastion.jobspec import JobSpec, name_problem
from bastion.jobstate import Status
from bastion.retry import error_text

log = logging.getLogger("bastion.daemon")


def finalize_all(ctx: Context, now: float) -> None:
    """COMPLETED jobs whose state is written: recorded in complete/ and forgotten. Their
    bucket requests (history, record, two deletes each) run in the pool, jobs in parallel:
    a hundred jobs ending at once cost one round of requests, not four hundred in a row."""
    deleting = {
        owner for owner, since in ctx.deletes_of.values() if now - since < DELETE_WAIT_SECONDS
    }
    ready = [
        job
        for job in ctx.attending()  # a finished job is never quiet
        if job.state.status is Status.COMPLETED
        and not job.inflight
        and not job.effects
        and job.name not in deleting
        and not job.unwritten()
    ]
    if not ready:
        return
    mirrors = mirror_names(ctx)
    for job in ready:
        if name_problem(job.name) is None:  # a rejected name owns no log
            for log_name in (job.name, job_log_name(job.name, cleanup=True)):
                if log_name in mirrors:
                    ctx.logs.close(log_name)
    ctx.may_act()
    results = ctx.pool.map(pools.quietly(functools.partial(finalize, ctx, now=now)), ready)
    for job, result in zip(ready, results, strict=True):
        if isinstance(result, Exception):
            log.error(
                "%s: could not record the finished job (will retry): %s",
                job.name,
                error_text(result),
            )
        else:
            ctx.jobs.pop(job.name, None)  # its end was news to the policy already
            ctx.index.forget(job)
            ctx.job_changes += 1
            ctx.finished_status[job.name] = job.state.display_status  # for its dependents
            ctx.ledger.forget(job.name)  # its last attempt's end is in the ledger already
            status_page.note_finished(ctx, job)


def finalize(ctx: Context, job: Job, now: float) -> None:
    """In the pool: one finished job's record in complete/, then its spec and state go."""
    state = job.state
    valid_name = name_problem(job.name) is None
    record = {"spec": job.spec.to_json() if job.spec else None, "state": state.to_json()}
    if job.spec is None:  # never read (a failed read after a recovery) or never valid
        try:
            raw = ctx.store.specs.read(job.name)
        except ValueError as e:  # a symlink or an oversized object: never copied
            raw = f"<not copied: {e}>".encode()
        try:
            record["spec"] = JobSpec.loads(raw).to_json() if raw else None
        except Exception:  # not a valid spec: its text, for the user to see
            record["spec_text"] = raw.decode(errors="replace")[:10_000] if raw else None
        if raw is None:  # deleted by an earlier try of this finalize: keep what it recorded
            earlier = ctx.store.complete.read(job.name)
            if (
                earlier
                and earlier.get("spec")
                and earlier.get("state", {}).get("submission") == state.submission
            ):
                record["spec"] = earlier["spec"]
    submission = f"{int(state.submit_time or now):012d}-{state.submission or 'x'}"
    if valid_name:
        ctx.store.history.save(job.name, submission, state.events)  # long-term record
        ctx.store.finished_runs.save(job.name, submission, record)  # reachable after a relaunch
    ctx.store.complete.write(job.name, record)
    ctx.store.specs.delete(job.name)
    ctx.store.states.delete(job.name)


def mirror_names(ctx: Context) -> set[str]:
    return set(ctx.logs.mirrors())
