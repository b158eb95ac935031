"""One scheduling pass: validate, hold running jobs, admit within quota (reclaiming), lend the rest.

Why the pass looks like this:
* Within-quota jobs are admitted before borrowers (Kueue's "nominal first"). Victims of a
  reclaim are borrowers, so a requeued victim never re-enters ahead of its reclaimer.
* Capacity of RELEASING jobs is earmarked for within-quota jobs, and the jobs they were
  preempted for go first: the next pass sees the reclaim under way and preempts nobody else
  (same world, no new preemption).
* A within-quota job that must wait holds the free capacity it needs, so new borrowers
  (protected by the minimum runtime once started) cannot keep it out: it starts within one
  reclaim period. The oldest job that has waited `reserve_after_seconds` holds capacity the
  same way against later borrowers, and blocks later jobs of its own project, so small jobs
  cannot starve a large one.
* Running jobs are charged to the tier they run on; a tier label never causes a restart.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from quota.capacity import Capacity, add, fmt_ratio, fmt_units
from quota.config import QuotaConfig
from quota.model import Decision, JobRequest, Phase, Plan, Verdict
from quota.reasons import full_reason, wait_reason
from quota.reclaim import Reclaim
from quota.within import EPS, Within, within

__all__ = ["EPS", "invalid_reason", "run"]


def run(config: QuotaConfig, jobs: Sequence[JobRequest], usage: Mapping[str, float],
        now: float) -> Plan:
    return _Pass(config, jobs, usage, now).run()


class _Pass:
    def __init__(self, config: QuotaConfig, jobs: Sequence[JobRequest],
                 usage: Mapping[str, float], now: float) -> None:
        self.config, self.jobs, self.user_usage, self.now = config, jobs, usage, now
        self.knobs = config.scheduling
        self.pool = config.pool
        self.quotas = config.quotas
        self.cap = Capacity(config.tiers)
        self.decisions: dict[str, Decision] = {}
        self.usage: dict[str, dict[str, int]] = {}  # RUNNING (+ started - preempted) per project
        self.earmark: dict[str, int] = {}  # capacity of RELEASING jobs, for within-quota jobs
        self.reclaimers: set[str] = set()  # jobs named by RELEASING jobs as their preemptor
        self.reserved: dict[str, dict[str, int]] = {}
        self.waits: dict[str, tuple[str, object]] = {}  # name -> (kind, detail); text at the end
        self.started: set[str] = set()
        self.members: dict[tuple[str, str], bool] = {}
        self.held_total: dict[str, int] = {}
        self.reason_cache: dict[object, str] = {}

    # -- driver ------------------------------------------------------------------------------

    def run(self) -> Plan:
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError("job names must be unique")
        held = [j for j in self.jobs if j.phase is not Phase.PENDING]
        self._hold(held)
        self.reclaim = Reclaim(self, [j for j in held if j.phase is Phase.RUNNING])
        queues = self._queues([j for j in self.jobs if j.phase is Phase.PENDING])
        self.head = self._head(queues)
        first = Within(self, queues)
        first.run()
        self._lend(first.lenders, first.followers, first.claims, first.claimants)
        self._finish_waits(queues)
        decisions = {j.name: self.decisions[j.name] for j in self.jobs}
        return Plan(decisions=decisions, reserved=self.reserved, free=dict(self.cap.total),
                    usage=self.usage, quotas=self.quotas, within_quota=frozenset(first.admitted))

    def quota(self, project: str) -> Mapping[str, float]:
        return self.quotas.get(project, {})

    def proj_usage(self, project: str) -> dict[str, int]:
        u = self.usage.get(project)
        if u is None:
            u = self.usage[project] = {}
        return u

    def eligible(self, j: JobRequest) -> bool:
        """A running job may be preempted only after its minimum runtime."""
        return j.start_time is None or self.now - j.start_time >= self.knobs.min_runtime_seconds

    def decide(self, job: JobRequest, verdict: Verdict, reason: str, tier: int | None = None,
               by: str | None = None) -> None:
        self.decisions[job.name] = Decision(job.name, verdict, reason, tier, by)

    def start(self, j: JobRequest) -> None:
        p = j.project_id
        tier = self.cap.take(j.resources)
        used = self.proj_usage(p)
        add(used, j.resources)
        self.started.add(j.name)
        q = self.quota(p)
        if within({}, used, q):
            why = f"within quota: project {p} at {fmt_ratio(used, q, j.resources)} with this job"
        else:
            why = (f"borrowing idle capacity: project {p} at {fmt_ratio(used, q, j.resources)} "
                   "with this job (preemptible when owners need it)")
        self.decide(j, Verdict.START, why, tier)

    # -- running and releasing jobs ------------------------------------------------------------

    def _hold(self, held: list[JobRequest]) -> None:
        def key(j: JobRequest) -> tuple[float, float, str]:
            return (j.tier if j.tier is not None else 1e9, j.start_time or 0.0, j.name)

        for j in sorted(held, key=key):
            tier = self.cap.hold(j.resources, j.tier)
            shown = j.tier if j.tier is not None else tier
            if j.phase is Phase.RELEASING:
                add(self.earmark, j.resources)
                if j.preempted_by:
                    self.reclaimers.add(j.preempted_by)
                self.decide(j, Verdict.KEEP, f"releasing: being stopped, holds "
                            f"{fmt_units(j.resources)} until it exits", shown)
            else:
                add(self.proj_usage(j.project_id), j.resources)
                self.decide(j, Verdict.KEEP, "running", shown)

    # -- pending jobs: validation and order ----------------------------------------------------

    def _queues(self, pending: list[JobRequest]) -> dict[str, list[JobRequest]]:
        """Valid pending jobs per project: priority, then user's decayed usage, then age."""
        queues: dict[str, list[JobRequest]] = {}
        members, pool, config = self.members, self.pool, self.config
        for j in pending:
            key = (j.user_id, j.project_id)
            member = members.get(key)
            if member is None:
                member = members[key] = config.is_member(j.user_id, j.project_id)
            if member:
                for r, n in j.resources.items():
                    if n < 0 or n > pool.get(r, 0):
                        break
                else:
                    queues.setdefault(j.project_id, []).append(j)
                    continue
            self.decide(j, Verdict.REJECT, invalid_reason(config, j) or "invalid")
        uu = self.user_usage
        for q in queues.values():
            q.sort(key=lambda j: (j.priority, uu.get(j.user_id, 0.0), j.submit_time, j.name))
        return dict(sorted(queues.items()))

    def _head(self, queues: dict[str, list[JobRequest]]) -> str | None:
        """The oldest job waiting `reserve_after_seconds` that fits its project's quota but not
        on top of what the project runs now (it waits for its own project to drain).

        Only this one job holds capacity against backfill (Slurm-like, one reservation at a
        time): the capacity it needs is not lent to later jobs, and later jobs of its project
        wait, so a stream of small jobs cannot starve it. More holders would fragment the pool.
        """
        cutoff = self.now - self.knobs.reserve_after_seconds
        best: tuple[float, str] | None = None
        held: dict[str, dict[str, int]] = {}  # releasing jobs count: same head while they stop
        for j in self.jobs:
            if j.phase is not Phase.PENDING:
                add(held.setdefault(j.project_id, {}), j.resources)
        for p, queue in queues.items():
            q, used = self.quota(p), held.get(p, {})
            for j in queue:
                if j.submit_time <= cutoff and (best is None or (j.submit_time, j.name) < best) \
                        and within({}, j.resources, q) and not within(used, j.resources, q):
                    best = (j.submit_time, j.name)
        return best[1] if best else None

    # -- pass 2: lend what is left ---------------------------------------------------------------

    def _lend(self, lenders: dict[str, list[JobRequest]], followers: dict[str, str],
              claims: dict[str, dict[str, int]], claimants: dict[str, str]) -> None:
        """Borrowers in turn. A project whose within-quota job waits on a reclaim lends its
        other jobs nothing of the resources that job needs: they would push it out of quota."""
        for p, claim in claims.items():
            for j in lenders.get(p, []):
                if j.name not in followers and any(
                        n > 0 and claim.get(r, 0) > 0 for r, n in j.resources.items()):
                    followers[j.name] = claimants[p]
        lists = {p: [j for j in lst if j.name not in self.decisions and j.name not in self.waits]
                 for p, lst in lenders.items()}
        heap = [(*self._lend_key(p, lst[0]), p, 0) for p, lst in lists.items() if lst]
        heapq.heapify(heap)
        cap = self.cap
        while heap:
            *_, p, i = heapq.heappop(heap)
            j = lists[p][i]
            head = followers.get(j.name)
            if head is not None and head not in self.started:
                self.waits[j.name] = ("behind", head)
            elif cap.fits(j.resources):
                self.start(j)
            else:
                self.waits[j.name] = ("full", None)
                if j.name == self.head:
                    got = cap.reserve(j.resources)
                    if got:
                        self.reserved[j.name] = got
                if not any(n > 0 for n in cap.total.values()):
                    heap.append((0.0, 0.0, 0.0, 0.0, p, i + 1))
                    self._drain(lists, followers, heap)
                    return
            if i + 1 < len(lists[p]):
                heapq.heappush(heap, (*self._lend_key(p, lists[p][i + 1]), p, i + 1))

    def _drain(self, lists: dict[str, list[JobRequest]], followers: dict[str, str],
               heap: list[tuple[float, float, float, float, str, int]]) -> None:
        """The pool is full: only jobs that need nothing can start; the order no longer matters."""
        for *_, p, i in sorted(heap, key=lambda e: (e[-2], e[-1])):
            for j in lists[p][i:]:
                head = followers.get(j.name)
                if head is not None and head not in self.started:
                    self.waits[j.name] = ("behind", head)
                elif self.cap.fits(j.resources):
                    self.start(j)
                else:
                    self.waits[j.name] = ("full", None)

    def _lend_key(self, p: str, j: JobRequest) -> tuple[float, float, float, float]:
        """Jobs that waited `reserve_after_seconds` first, oldest first; then AXLearn's order:
        the project that would be least over its quota goes first."""
        if self.now - j.submit_time >= self.knobs.reserve_after_seconds:
            return (0.0, j.submit_time, 0.0, 0.0)
        used, q = self.usage.get(p, {}), self.quota(p)
        ratio, excess = 0.0, 0.0
        for r, n in j.resources.items():
            total = used.get(r, 0) + n
            share = q.get(r, 0.0)
            if share > 0:
                ratio = max(ratio, total / share)
            elif total > 0:
                ratio = float("inf")
                excess += total
        return (1.0, ratio, excess, j.submit_time)

    # -- reasons for waiting jobs ----------------------------------------------------------------

    def _finish_waits(self, queues: dict[str, list[JobRequest]]) -> None:
        for got in self.reserved.values():
            add(self.held_total, got)
        decisions = self.decisions
        for p, queue in queues.items():
            q, used = self.quota(p), self.usage.get(p, {})
            ahead = 0
            for j in queue:
                name = j.name
                if name in decisions:
                    continue
                if name in self.waits or name in self.reserved:
                    why = wait_reason(self, j, ahead, q, used)
                else:  # the common case, kept short: 50,000 of these must stay cheap
                    why = f"{full_reason(self, j, used, q)}; {ahead} job" \
                          f"{'' if ahead == 1 else 's'} ahead in {p}"
                decisions[name] = Decision(name, Verdict.WAIT, why)
                ahead += 1


def invalid_reason(config: QuotaConfig, j: JobRequest) -> str | None:
    """Why a pending job can never run as submitted (REJECT), or None."""
    if not config.is_member(j.user_id, j.project_id):
        mine = config.projects_of(j.user_id)
        known = "" if j.project_id in config.membership else " (no such project)"
        return (f"user {j.user_id} is not a member of project {j.project_id}{known}; "
                f"{j.user_id} belongs to: {', '.join(mine) or 'no project'}")
    pool = config.pool
    unknown = sorted(r for r, n in j.resources.items() if n > 0 and r not in pool)
    if unknown:
        return f"unknown resource type {', '.join(unknown)}; the pool has {fmt_units(pool)}"
    negative = sorted(r for r, n in j.resources.items() if n < 0)
    if negative:
        return f"negative resource request for {', '.join(negative)}"
    big = {r: n for r, n in j.resources.items() if n > pool.get(r, 0)}
    if big:
        return (f"larger than the whole pool: needs {fmt_units(big)}, the pool has "
                f"{fmt_units({r: pool.get(r, 0) for r in big})}")
    return None
