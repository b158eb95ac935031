"""Gates: the job rules that are not quota. Time limits stop a running job at its limit
(through the same stop as a cancel: the signal, the grace, then SIGKILL); dependencies and a
group's limit hold a pending job back before the policy pass, so it holds no quota, and a
dependency that can never be satisfied ends the job CANCELLED.

The rules are pure (``bastion.timelimits``, ``bastion.dependencies``); this step gathers what
they need from the cycle's jobs (and, for a dependency already archived, its record in
``jobs/complete``, read once and remembered) and feeds the table their events.
"""

from __future__ import annotations

import logging

from bastion import lifecycle
from bastion.daemon import events
from bastion.daemon.context import Context, Job
from bastion.dependencies import Gate, Member, Verdict, dependency_verdict, group_held
from bastion.jobstate import JobState, Status, StopKind
from bastion.retry import error_text
from bastion.timelimits import fmt_duration, time_used

log = logging.getLogger("bastion.daemon")


def enforce_time_limits(ctx: Context, now: float) -> None:
    """Stop every running job whose running time reached its limit (time pending, being
    provisioned or preempted does not count: see bastion/timelimits.py)."""
    for job in ctx.attending():  # a running job is never quiet
        state, spec = job.state, job.spec
        if spec is None or spec.time_limit is None or state.status is not Status.ACTIVE:
            continue
        if state.running_since is None or (
            state.stop is not None and state.stop.kind == StopKind.TIMEOUT
        ):
            continue
        used = time_used(state, now)
        if used >= spec.time_limit:
            reason = (
                f"time limit {fmt_duration(spec.time_limit)} reached (ran {fmt_duration(used)} "
                f"over {state.attempt} attempt{'s' if state.attempt != 1 else ''})"
            )
            events.apply(ctx, job, lifecycle.TimedOut(reason, job.grace(ctx.grace_seconds)), now)


def hold_back(ctx: Context, now: float) -> set[str]:
    """The pending jobs the policy must not see this pass; each gets its reason (or ends,
    when a dependency failed)."""
    held: set[str] = set()
    verdicts = {**_dependency_verdicts(ctx), **_group_verdicts(ctx)}
    for name, verdict in sorted(verdicts.items()):
        job = ctx.jobs[name]
        if job.state.status is not Status.PENDING:
            continue
        if verdict.gate is Gate.NEVER:
            events.apply(ctx, job, lifecycle.DependencyFailed(verdict.reason), now)
        elif verdict.gate is Gate.WAIT:
            held.add(name)
            events.apply(ctx, job, lifecycle.Wait(verdict.reason), now)
    return held


def _dependency_verdicts(ctx: Context) -> dict[str, Verdict]:
    verdicts = {}
    for job in gated_jobs(ctx):
        spec = job.spec
        if spec is None or not spec.after or job.state.status is not Status.PENDING:
            continue
        status_of = {name: _status_of(ctx, name) for name in spec.after}
        verdict = dependency_verdict(spec.after, spec.after_any, status_of)
        if verdict.gate is not Gate.READY:
            verdicts[job.name] = verdict
    return verdicts


def _status_of(ctx: Context, name: str) -> str | None:
    """A dependency's status: its live state's, else its archived record's (read once: an
    archived run's outcome never changes, and a relaunch makes the name live again)."""
    job = ctx.jobs.get(name)
    if job is not None:
        return job.state.display_status
    cache = ctx.finished_status
    if name not in cache:
        try:
            record = ctx.store.complete.read(name)
        except Exception as e:  # the bucket blinked: wait, ask again next pass
            log.warning("could not read the record of dependency %s: %s", name, error_text(e))
            return "UNKNOWN"
        cache[name] = JobState.from_json(record["state"]).display_status if record else None
    return cache[name]


def _group_verdicts(ctx: Context) -> dict[str, Verdict]:
    groups: dict[str, tuple[int | None, list[Member]]] = {}
    for job in gated_jobs(ctx):
        group = (job.spec.group if job.spec else None) or {}
        if group.get("max_running") is None:
            continue
        limit, members = groups.setdefault(group["name"], (group["max_running"], []))
        members.append(Member(job.name, int(group.get("index", 0)), _member_status(job)))
    held: dict[str, Verdict] = {}
    for name, (limit, members) in groups.items():
        held.update(group_held(name, members, limit))
    return held


def gated_jobs(ctx: Context) -> list[Job]:
    """The jobs whose spec waits for others or is in a group with a limit (ctx.index)."""
    jobs = ctx.jobs
    return [job for name in ctx.index.gated if (job := jobs.get(name)) is not None]


def _member_status(job: Job) -> str:
    return job.state.status.value if job.state.status is not Status.COMPLETED else "DONE"
