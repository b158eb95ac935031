"""Plan: the pure policy pass (quota/) on the cycle's jobs; its decisions become lifecycle
events, and the queue summary and decision records are published.
"""

from __future__ import annotations

import json
import logging
import time
from itertools import filterfalse
from typing import Any

from bastion import heap, lifecycle
from bastion.daemon import events, gates
from bastion.daemon.context import (
    DECISION_RECORD_BYTES,
    DECISION_RECORDS_KEPT,
    QUEUE_NAMES_KEPT,
    QUEUE_REASONS_KEPT,
    Context,
    Job,
    NotHolding,
    replan_period,
    threshold_gap,
)
from bastion.jobstate import Status
from bastion.lifecycle import RUN
from bastion.retry import error_text
from bastion.runners.base import (
    attempt_name,
)
from quota.config import QuotaConfig
from quota.model import JobRequest, Phase, Plan
from quota.policy import Decision, Verdict, replan_by, schedule
from quota.reclaim import first_to_go

log = logging.getLogger("bastion.daemon")


def run_pass(ctx: Context, now: float) -> bool:
    """One policy pass and its decisions applied; False when it was not needed. The
    collector is paused for it, as the pass itself pauses it (quota.engine.run): what it
    makes per job (the requests' list, the waits by text) lives until it ends, and the
    collections it set off found nothing (at 100,000 jobs taken in without a restart, up to
    0.15 s of a pass)."""
    config = ctx.quota.config
    if not ctx.inputs_changed and config is ctx.planned_config and now < ctx.replan_at:
        return False  # no job changed and no time threshold passed: the last plan stands
    with heap.paused():
        return _run_pass(ctx, config, now)


def _run_pass(ctx: Context, config: QuotaConfig | None, now: float) -> bool:
    ctx.inputs_changed = False
    ctx.planned_config = config
    period = replan_period(len(ctx.jobs))
    ctx.replan_at = now + period
    not_started = holding(ctx, now)  # runners that could not start them: back later
    held = gates.hold_back(ctx, now) | set(not_started)  # dependencies, group limits too
    requests = offered(ctx, held, now)
    if config is None:
        for job in ctx.jobs.values():
            if job.state.status is Status.PENDING and job.name not in held:
                invalid = f"waiting for a valid quota file: {ctx.quota.error}"
                events.apply(ctx, job, lifecycle.QuotaInvalid(invalid), now)
        return True
    holding_capacity = [r for r in requests if r.phase is not Phase.PENDING]  # (a few)
    usage = ctx.quota.usage_for(holding_capacity, now)
    plan = schedule(config, requests, usage, now, ctx.queue_memo)
    threshold = max(
        replan_by(config, requests, now, now + period, plan),
        now + threshold_gap(len(ctx.jobs)),
    )
    ctx.replan_at = min([threshold, *not_started.values()])  # a start's retry: on time
    grace = config.scheduling.preemption_grace_seconds
    changed = []
    failed = False
    for name in sorted(to_apply(ctx, plan)):
        job = ctx.jobs[name]
        before = (job.state.status, job.state.reason)
        decision = plan.decisions[name]  # (made only here for most waiting jobs)
        try:
            event = event_for(ctx, job, decision, grace)
            if event is not None:
                events.apply(ctx, job, event, now)
        except Exception as e:
            log.exception("%s: acting on %s failed", name, decision.verdict)
            failed_act = lifecycle.ActFailed(f"could not {decision.verdict.value.lower()}: {e}")
            events.apply(ctx, job, failed_act, now)
            failed = True
        if (job.state.status, job.state.reason) != before:
            changed.append(decision)
    # The plan's own starts and preemptions are what it assumed: no new pass for them.
    ctx.inputs_changed = failed
    record_decisions(ctx, changed, now)
    publish_queue(ctx, plan, first_to_go(holding_capacity, plan.usage, plan.quotas, now))
    return True


def offered(ctx: Context, held: set[str], now: float) -> list[JobRequest]:
    """What the policy sees of every job not ``held``. (Each walk of 100,000 jobs costs: when
    none is held, as mostly, their names are not looked at.)"""
    jobs = ctx.jobs.values()
    if held:
        return [r for j in jobs if j.name not in held and (r := j.policy_request(now))]
    return [r for j in jobs if (r := j.policy_request(now))]


def to_apply(ctx: Context, plan: Plan) -> list[str]:
    """The jobs whose decision may change them: all but those that wait as they waited
    (most of a large queue; found before sorting, which then orders only the few). By text:
    a waiting job is looked up among the jobs that wait with that reason now."""
    waiting_with = ctx.index.waiting_with
    out = []
    for text, names in plan.by_wait().items():
        same = waiting_with.get(text) if text is not None else None
        if same is None:
            out += names
        else:  # (those that wait as they waited: nothing to apply, nothing to write)
            out += filterfalse(same.__contains__, names)
    return out


def holding(ctx: Context, now: float) -> dict[str, float]:
    """Jobs whose runner could not start them (lifecycle.NOT_STARTED) wait, holding nothing,
    for ``start_give_up_seconds`` after they let go before the policy sees them again: else
    it would admit them at once, and they would hold quota for another futile try. Job name
    -> when it is seen again."""
    give_up = ctx.start_give_up_seconds
    return {
        name: let_go + give_up
        for name, let_go in ctx.index.not_started.items()
        if now < let_go + give_up
    }


def publish_queue(ctx: Context, plan: Plan, going: dict[str, list[str]]) -> None:
    """The facts every waiting job shares (order, free capacity, usage) in one object,
    written when they change: one request where rewriting each waiting job's state to
    carry its own position would be thousands. ``going``: per project over its quota, the
    running jobs a reclaim would take first (`bastion list` labels them)."""
    order = {p: names for p, names in plan.waiting.items() if names}  # (queue order)
    projects = {
        p: {
            "waiting": len(order.get(p, ())),
            "order": order.get(p, [])[:QUEUE_NAMES_KEPT],
            "reasons": {  # the whole story for the first few; `bastion why` for any job
                d.name: d.reason[:500] for d in plan.first_waits(p, QUEUE_REASONS_KEPT)
            },
            "usage": dict(plan.usage.get(p, {})),
            "quota": dict(plan.quotas.get(p, {})),
            **({"first_to_go": going[p]} if p in going else {}),
        }
        for p in sorted(set(order) | set(plan.usage) | set(going))
    }
    summary = {"free": dict(plan.free), "projects": projects}
    raw = json.dumps(summary, sort_keys=True)
    if raw == ctx.queue_written:
        return
    try:
        ctx.may_act()
        ctx.store.queue.write({**summary, "time": time.time(), "cycle": ctx.cycles})
        ctx.queue_written = raw
    except NotHolding:
        raise
    except Exception as e:  # a reader sees the last one; written again next cycle
        log.error("could not write the queue summary: %s", error_text(e))


def event_for(ctx: Context, job: Job, decision: Decision, grace: float) -> lifecycle.Event | None:
    state, verdict = job.state, decision.verdict
    if verdict is Verdict.START and state.status is Status.PENDING:
        if job.spec is None:
            return None
        name = attempt_name(ctx.store.root_url, job.name, state.submission, state.attempt + 1, RUN)
        return lifecycle.Admit(
            tier=decision.tier,
            reason=decision.reason,
            attempt_name=name,
            runner_kind=events.runner_kind(ctx, job),
            log_size=ctx.logs.total(job.name),
            backfill_for=tuple(decision.backfill_for),
            spec_digest=job.spec.digest(),
            log_start=ctx.logs.total(job.name) if state.attempt == 0 else None,
        )
    if verdict is Verdict.PREEMPT:
        return lifecycle.Preempt(decision.reason, decision.preempted_by, job.grace(grace))
    if verdict is Verdict.REJECT:
        return lifecycle.Reject(decision.reason)
    if verdict is Verdict.WAIT:
        # The stable part only: positions and free capacity go to the queue summary.
        return lifecycle.Wait(decision.wait or decision.reason)
    if verdict is Verdict.KEEP and decision.tier is not None and state.tier != decision.tier:
        ctx.inputs_changed = True
        return lifecycle.TierKept(decision.tier)  # recorded, never a restart
    return None


def record_decisions(ctx: Context, changed: list[Decision], now: float) -> None:
    """One decision-log record per cycle in which a job's decision changed (a start, a
    preemption, a rejection, a new kind of wait), bounded in bytes: a burst of thousands
    of changes keeps the first and counts the rest."""
    if not changed:
        return
    entries, size, omitted = [], 0, 0
    for i, d in enumerate(changed):
        entry = {
            "name": d.name,
            "verdict": d.verdict.value,
            "reason": (d.wait or d.reason)[:500],
            "tier": d.tier,
            "preempted_by": d.preempted_by,
        }
        cost = len(json.dumps(entry))
        if size + cost > DECISION_RECORD_BYTES:
            omitted = len(changed) - i
            break
        entries.append(entry)
        size += cost
    record: dict[str, Any] = {"time": now, "cycle": ctx.cycles, "decisions": entries}
    if omitted:
        record["omitted"] = omitted
    try:
        ctx.store.decisions.write(now, record)
        ctx.decision_records += 1
        if ctx.decision_records % 100 == 0:
            ctx.store.decisions.prune(keep=DECISION_RECORDS_KEPT)
    except Exception:
        log.exception("could not write the decision log")
