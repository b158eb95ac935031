"""The scheduling policy: a pure function of (quota, jobs, usage, now) -> decisions with reasons.

No I/O and no clock: the daemon, `bastion why` and the simulator all call the same code, so a
decision can be replayed and explained. See quota/engine.py for how one pass works.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quota.config import QuotaConfig
from quota.engine import run
from quota.explain import explain_plan
from quota.model import Decision, JobRequest, Phase, Plan, Verdict
from quota.queue_memo import QueueMemo

__all__ = [
    "Decision",
    "JobRequest",
    "Phase",
    "Plan",
    "QueueMemo",
    "Verdict",
    "explain",
    "replan_by",
    "schedule",
]


def schedule(
    config: QuotaConfig,
    jobs: Sequence[JobRequest],
    usage: Mapping[str, float],
    now: float,
    memo: QueueMemo | None = None,
) -> Plan:
    """Decide START/KEEP/PREEMPT/WAIT/REJECT for every job; deterministic in its inputs.
    ``memo`` (a caller that plans again and again, as the daemon does): the queues of its
    last pass, kept for the next; the plan is the same with or without it."""
    return run(config, jobs, usage, now, memo)


def replan_by(
    config: QuotaConfig,
    jobs: Sequence[JobRequest],
    now: float,
    horizon: float,
    plan: Plan | None = None,
) -> float:
    """The earliest time after ``now`` (at most ``horizon``) at which a pass over these same
    jobs could decide differently only because time passed: a running job reaching its
    minimum runtime (it becomes preemptible), a waiting job reaching ``reserve_after_seconds``
    (it becomes the aged head) or the end of its reclaim delay (it may preempt). Until then,
    and while no job changes, the daemon may keep the last plan instead of running the pass
    again. (Decayed user usage also moves with time; it reorders users within a priority,
    which the horizon bounds.)

    Given ``plan`` (the pass over these jobs at ``now``), only what it depends on: with an
    aged head, no later crossing (every job that ages later is younger than the head, which
    keeps its place until it changes); of the reclaim delays, only those its waiting jobs
    wait out (a job's delay matters only once it is within quota and short of capacity,
    which no time passing brings about). After a burst, each of 100,000 jobs crosses both at
    its own moment: without the plan the daemon replanned every 20 s for half an hour, for
    thresholds that changed nothing."""
    knobs = config.scheduling
    soonest = horizon
    delay = knobs.reclaim_delay_seconds
    ages = plan is None or plan.aged_head is None
    delays = plan is None
    if plan is not None:
        soonest = min([soonest, *(t for t in plan.delays_end if t > now)])
    waiting = Phase.PENDING
    for j in [j for j in jobs if j.phase is not waiting]:  # (a few: most jobs wait)
        if j.start_time is not None:
            t = j.start_time + knobs.min_runtime_seconds
            if now < t < soonest:
                soonest = t
    if delays:  # a waiting job's reclaim delay ends (it may preempt from then on)
        for j in jobs:
            if j.phase is waiting:
                since = j.submit_time if j.pending_since is None else j.pending_since
                if now < since + delay < soonest:
                    soonest = since + delay
    if ages:  # a waiting job reaches reserve_after_seconds (the soonest found in C)
        reserve = knobs.reserve_after_seconds
        ages_at = [j.submit_time + reserve for j in jobs if j.phase is waiting]
        first = min(filter(float(now).__lt__, ages_at), default=soonest)  # (after now)
        soonest = min(soonest, first)
    return soonest


def explain(
    config: QuotaConfig,
    jobs: Sequence[JobRequest],
    usage: Mapping[str, float],
    now: float,
    name: str,
) -> str:
    """`bastion why NAME`: quota, usage, borrowing, position, and what would let it start."""
    return explain_plan(config, jobs, usage, now, schedule(config, jobs, usage, now), name)
