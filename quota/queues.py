"""Step 2 of a pass: which pending jobs are valid, each project's queue order, the aged head.

One walk over the pending jobs (up to 50,000) does all three: it rejects the jobs that can
never run as submitted, files the others by project, and finds the aged head (see `Queues`);
then each project's queue is sorted once. Pure: the pass records the rejections.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from quota.capacity import fmt_units
from quota.config import QuotaConfig
from quota.model import JobRequest
from quota.queue_memo import QueueMemo, group_ranks
from quota.within import within


@dataclass
class Queues:
    """What the walk over the pending jobs found.

    The aged head is the oldest valid job that has waited `reserve_after_seconds` and fits its
    project's quota. While its project's running jobs leave it no room, later jobs of its
    project wait, so a stream of small jobs cannot keep it out; it becomes within quota as its
    project drains, and then reclaims. (Holding free capacity for it as well was measured in
    the simulator: it restarted large borrowers only for owners to preempt them again.)
    Depending only on age and quota, the choice does not flip when a plan is applied.
    Arrivals are unique (they end with the name), so the oldest is the same whatever order
    the jobs are walked in."""

    by_project: dict[str, list[JobRequest]] = field(default_factory=dict)  # in queue order
    rejects: list[tuple[JobRequest, str]] = field(default_factory=list)  # in input order
    head: str | None = None
    head_project: str | None = None
    zero_need: set[str] = field(default_factory=set)  # projects with jobs that need nothing


def build_queues(
    config: QuotaConfig,
    pending: Sequence[JobRequest],
    user_usage: Mapping[str, float],
    now: float,
    memo: QueueMemo | None = None,
) -> Queues:
    """Valid pending jobs per project (priority, then user's decayed usage, then age), the
    invalid ones with their reason, and the aged head. ``memo``: the queues of the caller's
    last pass, reused where they still hold (the same result, sooner; see QueueMemo)."""
    out = Queues()
    queues = out.by_project
    pool, quotas = config.pool, config.quotas
    cutoff = now - config.scheduling.reserve_after_seconds
    best: tuple[float, bool, float, str] | None = None
    # A run of jobs that share one resources mapping (the daemon interns them: a sweep's
    # jobs come together) is checked once, and so is a run of one user's jobs in one project
    # at one priority (membership; the order's groups, for the memo).
    last: tuple[Mapping[str, int] | None, bool, bool] = (None, False, False)
    last_user = last_project = last_priority = None
    member = True
    groups: set[tuple[str, int, str]] = set()  # (project, priority, user) of the valid jobs
    is_member = config.is_member
    for j in pending:
        res = j.resources
        if res is last[0]:
            valid, some = last[1], last[2]
        else:
            valid, some = True, False
            for r, n in res.items():
                if n < 0 or n > pool.get(r, 0):
                    valid = False
                    break
                some = some or n > 0
            last = (res, valid, some)
        p, u = j.project_id, j.user_id
        if u is not last_user or p is not last_project or j.priority is not last_priority:
            last_user, last_project, last_priority = u, p, j.priority
            member = is_member(u, p)
            if member and memo is not None:
                groups.add((p, j.priority, u))
        if not (valid and member):
            out.rejects.append((j, invalid_reason(config, j) or "invalid"))
            continue
        queues.setdefault(p, []).append(j)
        if not some:
            out.zero_need.add(p)
        t = j.submit_time
        if (
            t <= cutoff
            and (best is None or (t <= best[0] and arrival(j) < best))
            and within({}, j.resources, quotas.get(p, {}))
        ):
            best = arrival(j)
            out.head_project = p
    out.head = best[-1] if best else None
    _order(queues, groups, user_usage, memo)
    out.by_project = dict(sorted(queues.items()))
    return out


def _order(
    queues: dict[str, list[JobRequest]],
    groups: set[tuple[str, int, str]],
    user_usage: Mapping[str, float],
    memo: QueueMemo | None,
) -> None:
    """Each project's queue put in queue order (``queue_key``), through ``memo`` if given."""
    key = queue_key(user_usage)
    if memo is None:
        for q in queues.values():
            q.sort(key=key)
        return
    ranks = group_ranks(groups, user_usage)
    for p, q in queues.items():
        queues[p] = memo.ordered(p, q, ranks.get(p, ()), key)
    memo.keep_only(queues)


def queue_key(user_usage: Mapping[str, float]) -> Callable[[JobRequest], tuple]:
    """Order of a project's queue: priority, then the user's decayed usage, then arrival
    (first seen by the daemon, then the spec's creation time, then name). `bastion why`
    shows positions in this same order."""
    uu = user_usage.get
    return lambda j: (
        j.priority,
        uu(j.user_id, 0.0),
        j.submit_time,
        j.creation_time is None,
        j.creation_time or 0.0,
        j.name,
    )


def arrival(j: JobRequest) -> tuple[float, bool, float, str]:
    """Queue order among equals: first seen by the daemon, then the spec's creation time
    (jobs seen in the same cycle), then name."""
    c = j.creation_time
    return (j.submit_time, c is None, c or 0.0, j.name)


def invalid_reason(config: QuotaConfig, j: JobRequest) -> str | None:
    """Why a pending job can never run as submitted (REJECT), or None."""
    if not config.is_member(j.user_id, j.project_id):
        mine = config.projects_of(j.user_id)
        known = "" if j.project_id in config.membership else " (no such project)"
        return (
            f"user {j.user_id} is not a member of project {j.project_id}{known}; "
            f"{j.user_id} belongs to: {', '.join(mine) or 'no project'}"
        )
    pool = config.pool
    unknown = sorted(r for r, n in j.resources.items() if n > 0 and r not in pool)
    if unknown:
        return f"unknown resource type {', '.join(unknown)}; the pool has {fmt_units(pool)}"
    negative = sorted(r for r, n in j.resources.items() if n < 0)
    if negative:
        return f"negative resource request for {', '.join(negative)}"
    big = {r: n for r, n in j.resources.items() if n > pool.get(r, 0)}
    if big:
        return (
            f"larger than the whole pool: needs {fmt_units(big)}, the pool has "
            f"{fmt_units({r: pool.get(r, 0) for r in big})}"
        )
    return None
