"""AXLearn's bastion scheduler, replayed on a trace: how often it stops running jobs.

A model of what /work/shared/reference/axlearn-bastion.md describes (apple/axlearn 34aed43c),
for bench_fairness.py's comparison with our policy (issue 13, rule 5: a trace's preemptions
stay at most an eighth of AXLearn's). It keeps AXLearn's algorithm and its flaws, since those
are what the comparison is about:

* One loop every `update_interval_seconds` (30 s, section 0 and 10). Every cycle the
  scheduler re-decides from scratch for all PENDING and ACTIVE jobs (section 3.2 (b), 4.4):
  no stickiness, no minimum runtime, no grace period, no hysteresis. A running job whose
  verdict is "no" is killed at once and goes back to PENDING (a preemption), and its
  capacity goes to the newcomer in the same cycle (section 4.4). Jobs restart from scratch.
* Per project (`ProjectJobSorter`, section 4.2 step 2): each user's jobs sorted by
  (priority, creation_time, job_id); users taken from a heap keyed by (priority of the
  user's next job, usage, creation_time of next, job_id, user_id), where usage is the demand
  of that user's jobs already placed in this queue, summed over resource types.
* Across projects (`TierScheduler.schedule`, section 4.3): quotas are fractions normalised
  per resource type (step 2); jobs needing more than the pool of some type go to the back of
  their project's queue (step 3); projects are taken from a heap keyed by
  (max(0, max over the head job's resources r of (usage[p][r] + demand[r]) /
  max(quota[p][r], 1e-8)), head job's creation_time, project id) (step 4), usage being what
  this cycle already admitted for p; the head job runs if it fits what is left, else it is
  rejected and the loop goes on (no head-of-line blocking, step 5.4).
* Tiers (step 5.3, section 4.4): a forward pass picks the highest tier the job touches, a
  backward pass consumes from that tier down. A running job whose tier changes is killed
  and restarted the next cycle (RESCHEDULING, section 3.2 (b)): counted as a preemption.
* Bookkeeping flaws kept (section 3.2 (c), 4.4): a job whose process exited is still ACTIVE
  (and counted) in the cycle that notices the exit, then CLEANING and counted no more. Jobs
  are first seen at the cycle after their submission (the spec is listed each cycle).

Not modelled (absent from the traces): elastic jobs, parent dependencies, dry run, user
states, validation failures, the per-project sorter overrides.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Job:
    name: str
    project: str
    user: str
    submit: float
    duration: float
    resources: dict[str, int]
    priority: int
    status: str = "NEW"  # NEW (not seen yet), PENDING, ACTIVE, GONE (cleaning / completed)
    tier: int | None = None
    finish: float = math.inf  # of the current attempt, while ACTIVE
    preemptions: int = 0  # killed while running: verdict "no", or a tier change


@dataclass
class AxlearnResult:
    preemptions: int = 0
    max_preemptions_per_job: int = 0
    tier_restarts: int = 0
    per_job: dict[str, int] = field(default_factory=dict)


def _sort_project(jobs: list[_Job]) -> list[_Job]:
    """ProjectJobSorter (section 4.2 step 2): priority-major, then a round robin between users
    weighted by the demand already placed, then FIFO (job_id: the name, for determinism)."""
    per_user: dict[str, list[_Job]] = {}
    for j in jobs:
        per_user.setdefault(j.user, []).append(j)
    for lst in per_user.values():
        lst.sort(key=lambda j: (j.priority, j.submit, j.name), reverse=True)  # pop() = next
    usage = dict.fromkeys(per_user, 0)
    heap = [(lst[-1].priority, 0, lst[-1].submit, lst[-1].name, u) for u, lst in per_user.items()]
    heapq.heapify(heap)
    out = []
    while heap:
        *_, u = heapq.heappop(heap)
        j = per_user[u].pop()
        out.append(j)
        usage[u] += sum(j.resources.values())
        if per_user[u]:
            nxt = per_user[u][-1]
            heapq.heappush(heap, (nxt.priority, usage[u], nxt.submit, nxt.name, u))
    return out


def _schedule(
    tiers: Sequence[Mapping[str, int]], quota: Mapping[str, Mapping[str, float]], jobs: list[_Job]
) -> dict[str, int | None]:
    """TierScheduler (section 4.3): job name -> tier it runs on, or None (rejected)."""
    left = [dict(t) for t in tiers]
    remaining: dict[str, int] = {}
    for t in tiers:
        for r, n in t.items():
            remaining[r] = remaining.get(r, 0) + n
    total = dict(remaining)
    queues: dict[str, list[_Job]] = {}
    for j in jobs:
        queues.setdefault(j.project, []).append(j)
    for p, q in queues.items():
        q = _sort_project(q)
        big = {j.name for j in q if any(n > total.get(r, 0) for r, n in j.resources.items())}
        # demote unschedulable jobs to the back, in stable order (step 3)
        queues[p] = [j for j in q if j.name not in big] + [j for j in q if j.name in big]
    usage: dict[str, dict[str, int]] = {p: {} for p in queues}

    def key(p: str, j: _Job) -> tuple[float, float, str]:
        ratio = (
            max(
                (usage[p].get(r, 0) + n) / max(quota.get(p, {}).get(r, 0.0), 1e-8)
                for r, n in j.resources.items()
            )
            if j.resources
            else 0.0
        )
        return (max(0.0, ratio), j.submit, p)

    pos = dict.fromkeys(queues, 0)
    heap = [(*key(p, q[0]), p) for p, q in queues.items() if q]
    heapq.heapify(heap)
    verdicts: dict[str, int | None] = {}
    while heap:
        *_, p = heapq.heappop(heap)
        j = queues[p][pos[p]]
        pos[p] += 1
        if all(n <= remaining.get(r, 0) for r, n in j.resources.items()):
            final = 0
            for r, n in j.resources.items():  # forward pass: the highest tier touched
                need = n
                for i, t in enumerate(left):
                    if need <= 0:
                        break
                    got = min(need, t.get(r, 0))
                    if got > 0:
                        need -= got
                        final = max(final, i)
            for r, n in j.resources.items():  # backward pass: consume from that tier down
                need = n
                for i in range(final, -1, -1):
                    got = min(need, left[i].get(r, 0))
                    left[i][r] = left[i].get(r, 0) - got
                    need -= got
                remaining[r] = remaining.get(r, 0) - n
                usage[p][r] = usage[p].get(r, 0) + n
            verdicts[j.name] = final
        else:
            verdicts[j.name] = None
        if pos[p] < len(queues[p]):
            heapq.heappush(heap, (*key(p, queues[p][pos[p]]), p))
    return verdicts


def replay(
    tiers: Sequence[Mapping[str, int]],
    shares: Mapping[str, Mapping[str, float]],
    trace: Sequence[Mapping[str, Any]],
    interval: float = 30.0,
) -> AxlearnResult:
    """Replay trace jobs (name, project_id, user_id, submit, duration, resources, priority)."""
    pool: dict[str, int] = {}
    for t in tiers:
        for r, n in t.items():
            pool[r] = pool.get(r, 0) + n
    quota = {
        p: {
            r: f / max(sum(s.get(r, 0.0) for s in shares.values()), 1e-8) * pool[r]
            for r, f in s.items()
            if r in pool
        }
        for p, s in shares.items()
    }
    jobs = [
        _Job(
            j["name"],
            j["project_id"],
            j["user_id"],
            float(j["submit"]),
            float(j["duration"]),
            dict(j["resources"]),
            int(j["priority"]),
        )
        for j in trace
    ]
    jobs.sort(key=lambda j: (j.submit, j.name))
    if not jobs:
        return AxlearnResult()
    t = jobs[0].submit
    out = AxlearnResult()
    arrived = 0
    live: list[_Job] = []
    while arrived < len(jobs) or live:
        while arrived < len(jobs) and jobs[arrived].submit <= t:
            jobs[arrived].status = "PENDING"
            live.append(jobs[arrived])
            arrived += 1
        verdicts = _schedule(tiers, quota, live)
        for j in live:
            tier = verdicts.get(j.name)
            if j.status == "PENDING":
                if tier is not None:
                    j.status, j.tier, j.finish = "ACTIVE", tier, t + j.duration
            elif j.finish <= t:
                j.status = "GONE"  # the exit is noticed: CLEANING, not counted from now on
            elif tier is None or tier != j.tier:
                j.status, j.tier, j.finish = "PENDING", None, math.inf
                j.preemptions += 1
                out.preemptions += 1
                out.tier_restarts += tier is not None
        live = [j for j in live if j.status != "GONE"]
        # Skip cycles in which nothing can change: no job pending, none finishing or arriving.
        nxt = t + interval
        if not any(j.status == "PENDING" for j in live):
            soon = min(
                [j.finish for j in live] + ([jobs[arrived].submit] if arrived < len(jobs) else []),
                default=nxt,
            )
            if soon > nxt:
                nxt = t + math.ceil((soon - t) / interval) * interval
        t = nxt
    out.per_job = {j.name: j.preemptions for j in jobs if j.preemptions}
    out.max_preemptions_per_job = max(out.per_job.values(), default=0)
    return out
