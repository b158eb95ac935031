"""One scheduling pass: validate, hold running jobs, admit within quota (reclaiming), lend the rest.

Why the pass looks like this:
* Within-quota jobs are admitted before borrowers (Kueue's "nominal first"). Victims of a
  reclaim are borrowers, so a requeued victim never re-enters ahead of its reclaimer.
* Capacity of RELEASING jobs is earmarked for within-quota jobs, and the jobs they were
  preempted for go first: the next pass sees the reclaim under way and preempts nobody else
  (same world, no new preemption).
* A within-quota job that must wait holds the free capacity it needs, so new borrowers
  (protected by the minimum runtime once started) cannot keep it out: it starts within one
  reclaim period. Its project's other jobs do not borrow what it needs meanwhile.
* The oldest job that has waited `reserve_after_seconds` and fits its project's quota
  blocks the later jobs of its project until it starts, so small jobs cannot starve it.
* Running jobs are charged to the tier they run on; a tier label never causes a restart.

Preemptible backfill (issue 13: work conserving and no deprivation at once). Capacity held
for a waiting job, and the room its project's quota keeps for it, need not sit idle:
* A job that would wait behind a job of its project (the aged head, or a within-quota job
  waiting on a reclaim), or that fits only in free capacity held for a job waiting on
  borrowers still inside their minimum runtime, starts as *backfill* for those jobs
  (Decision.backfill_for; the daemon stores it and passes it back as
  JobRequest.backfill_for). Held capacity is lent only to jobs of the holder's project that
  come after it in queue order, or to borrowers of other projects (a project within its
  quota is never preempted for another); a job whose reclaim is under way keeps its hold.
* When such a waiting job can start, its backfill goes first among its victims, at once
  (no minimum runtime; inside its project whatever the priority, Kueue's rule 4 of the
  issue: it was started after the reclaimer was waiting, which `pending_since` proves),
  smallest loss (units x time run) then newest first, and only if the whole reclaim
  succeeds. Marks naming jobs that have since started, left, or came back later count for
  nothing. Judging whether a job fits its quota, and the turn order, discount its own
  project's backfill for it.
* Other projects' reclaims count a project's running jobs only (not those started in the
  same pass) and do not count as borrowing its backfill for its own waiting job that would
  bring that job within quota, so the victims taken from one project at one instant each
  find it over its quota whatever order they are removed in.
* At most three preemptions: a job preempted twice (JobRequest.preemptions) never runs as
  backfill again and is chosen last among victims.
Measured from event logs by quota/rules.py, see benchmarks/bench_fairness.py.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from pass_reference.capacity import Capacity, add, fmt_ratio, fmt_units, shortfall
from pass_reference.reasons import full_reason, stable_wait, wait_reason
from pass_reference.reclaim import REPEATED, Reclaim
from pass_reference.within import EPS, Within, within
from quota.config import QuotaConfig
from quota.model import Decision, JobRequest, Phase, Plan, Verdict

__all__ = ["EPS", "invalid_reason", "run"]


def run(
    config: QuotaConfig, jobs: Sequence[JobRequest], usage: Mapping[str, float], now: float
) -> Plan:
    return _Pass(config, jobs, usage, now).run()


class _Pass:
    def __init__(
        self,
        config: QuotaConfig,
        jobs: Sequence[JobRequest],
        usage: Mapping[str, float],
        now: float,
    ) -> None:
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
        self.fresh: dict[str, dict[str, int]] = {}  # per project: units started this pass
        self.held_total: dict[str, int] = {}
        self.reason_cache: dict[object, str] = {}
        self.head: str | None = None  # see _head
        # pending job -> running backfill jobs started in capacity held for it
        self.anchored: dict[str, list[JobRequest]] = {}

    # -- driver ------------------------------------------------------------------------------

    def run(self) -> Plan:
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError("job names must be unique")
        held, pending = [], []
        for j in self.jobs:
            (pending if j.phase is Phase.PENDING else held).append(j)
        self._hold(held)
        queues = self._queues(pending)  # (rejects invalid jobs: they anchor nothing)
        self.pending_project: dict[str, str] = {}  # anchors of running backfill and of holds
        self.pending_need: dict[str, Mapping[str, int]] = {}
        if any(j.backfill_for for j in held):
            by_name = {j.name: j for j in pending if j.name not in self.decisions}
            for j in held:
                if j.phase is not Phase.RUNNING:
                    continue
                for a in j.backfill_for:
                    w = by_name.get(a)
                    if w is None:
                        continue
                    since = w.submit_time if w.pending_since is None else w.pending_since
                    if j.start_time is None or since <= j.start_time:
                        self.anchored.setdefault(a, []).append(j)
                        self.pending_project[a] = w.project_id
                        self.pending_need[a] = w.resources
            self._overtaken(queues)  # (policy change after cf5ed6b, as in quota/engine.py)
        self.reclaim = Reclaim(self, [j for j in held if j.phase is Phase.RUNNING])
        if self.reclaimers:  # (policy change after cf5ed6b, as in quota/engine.py)
            mine = {j.name: j.project_id for j in pending if j.name in self.reclaimers}
            for j in held:
                by = mine.get(j.preempted_by or "") if j.phase is Phase.RELEASING else None
                if by is not None and by != j.project_id:
                    self.reclaim.lost_to_others.add(j.project_id)
        self.head = self._head(queues)
        first = Within(self, queues)
        self.rank = first.rank
        first.run()
        self._lend(first)
        self._finish_waits(queues)
        decisions = {j.name: self.decisions[j.name] for j in self.jobs}
        return Plan(
            decisions=decisions,
            reserved=self.reserved,
            free=dict(self.cap.total),
            usage=self.usage,
            quotas=self.quotas,
            within_quota=frozenset(first.admitted),
        )

    def _overtaken(self, queues: Mapping[str, list[JobRequest]]) -> None:
        """A waiting job keeps no claim on its own project's backfill when, the jobs ahead
        of it in its project's queue taken in order where they fit the project's quota without
        that backfill, it no longer fits."""
        for a in sorted(self.anchored):
            p = self.pending_project[a]
            mine = [b for b in self.anchored[a] if b.project_id == p]
            if not mine:
                continue
            queue = queues.get(p, [])
            k = [j.name for j in queue].index(a)
            trial = dict(self.usage.get(p, {}))
            for b in mine:
                add(trial, b.resources, -1)
            for j in queue[:k]:
                if within(trial, j.resources, self.quota(p)):
                    add(trial, j.resources)
            if not within(trial, queue[k].resources, self.quota(p)):
                kept = [b for b in self.anchored[a] if b.project_id != p]
                if kept:
                    self.anchored[a] = kept
                else:
                    del self.anchored[a]

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

    def decide(
        self,
        job: JobRequest,
        verdict: Verdict,
        reason: str,
        tier: int | None = None,
        by: str | None = None,
    ) -> None:
        self.decisions[job.name] = Decision(job.name, verdict, reason, tier, by)

    def anchored_usage(self, name: str, project: str) -> dict[str, int]:
        """Units of `project`'s running backfill jobs that the waiting job `name` may take."""
        out: dict[str, int] = {}
        for b in self.anchored.get(name, ()):
            if b.project_id == project and not self.reclaim.taken(b.name):
                add(out, b.resources)
        return out

    def start(self, j: JobRequest, backfill_for: tuple[str, ...] = ()) -> None:
        p = j.project_id
        tier = self.cap.take(j.resources)
        used = self.proj_usage(p)
        add(used, j.resources)
        add(self.fresh.setdefault(p, {}), j.resources)
        self.started.add(j.name)
        if j.name in self.anchored:
            self.reclaim.anchor_started(j.name)
        q = self.quota(p)
        if within({}, used, q):
            why = f"within quota: project {p} at {fmt_ratio(used, q, j.resources)} with this job"
        else:
            why = (
                f"borrowing idle capacity: project {p} at {fmt_ratio(used, q, j.resources)} "
                "with this job (preemptible when owners need it)"
            )
        if backfill_for:
            why = (
                f"backfill: runs in capacity held for {', '.join(backfill_for)}, which may "
                f"preempt it at once (no minimum runtime) when it can start; {why}"
            )
        self.decisions[j.name] = Decision(j.name, Verdict.START, why, tier, None, backfill_for)

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
                self.decide(
                    j,
                    Verdict.KEEP,
                    f"releasing: being stopped, holds {fmt_units(j.resources)} until it exits",
                    shown,
                )
            else:
                add(self.proj_usage(j.project_id), j.resources)
                self.decide(j, Verdict.KEEP, "running", shown)

    # -- pending jobs: validation and order ----------------------------------------------------

    def _queues(self, pending: list[JobRequest]) -> dict[str, list[JobRequest]]:
        """Valid pending jobs per project: priority, then user's decayed usage, then age."""
        queues: dict[str, list[JobRequest]] = {}
        pool, config = self.pool, self.config
        for j in pending:
            if config.is_member(j.user_id, j.project_id):
                for r, n in j.resources.items():
                    if n < 0 or n > pool.get(r, 0):
                        break
                else:
                    queues.setdefault(j.project_id, []).append(j)
                    continue
            self.decide(j, Verdict.REJECT, invalid_reason(config, j) or "invalid")
        uu = self.user_usage
        for q in queues.values():
            q.sort(
                key=lambda j: (
                    j.priority,
                    uu.get(j.user_id, 0.0),
                    j.submit_time,
                    j.creation_time is None,
                    j.creation_time or 0.0,
                    j.name,
                )
            )
        return dict(sorted(queues.items()))

    def _head(self, queues: dict[str, list[JobRequest]]) -> str | None:
        """The oldest job that has waited `reserve_after_seconds` and fits its project's quota.

        While its project's running jobs leave it no room, later jobs of its project wait, so
        a stream of small jobs cannot keep it out; it becomes within quota as its project
        drains, and then reclaims. (Holding free capacity for it as well was measured in the
        simulator: it restarted large borrowers only for owners to preempt them again.)
        Depending only on age and quota, the choice does not flip when a plan is applied.
        """
        cutoff = self.now - self.knobs.reserve_after_seconds
        best: tuple[float, bool, float, str] | None = None
        for p, queue in queues.items():
            q = self.quota(p)
            for j in queue:
                if (
                    j.submit_time <= cutoff
                    and (best is None or arrival(j) < best)
                    and within({}, j.resources, q)
                ):
                    best = arrival(j)
        return best[-1] if best else None

    # -- pass 2: lend what is left ---------------------------------------------------------------

    def _lend(self, first: Within) -> None:
        """Borrowers in turn: what the within-quota pass left is lent, project by project."""
        rank = first.rank.__getitem__
        done, waits = self.decisions, self.waits
        lists = {}
        for p, lst in first.lenders.items():
            lst = [j for j in lst if j.name not in done and j.name not in waits]
            if p in first.unsorted:
                lst.sort(key=lambda j: rank(j.name))
            lists[p] = lst
        heap = [(*self._lend_key(p, lst[0]), p, 0) for p, lst in lists.items() if lst]
        heapq.heapify(heap)
        total = self.cap.total
        least: dict[str, int] | None = None
        while heap:
            *_, p, i = heapq.heappop(heap)
            self._lend_one(p, lists[p][i], first)
            if least is None and not any(n > 0 for n in total.values()):
                least = {}  # nothing free: only jobs that need nothing can start
            elif least is None:
                least = _least_need([j for lst in lists.values() for j in lst])
            if not any(n > 0 for n in total.values()) or any(
                total.get(r, 0) < n for r, n in least.items()
            ):
                # No job left fits (all need r, less is free): order is moot from here on.
                heap.append((0.0, 0.0, 0.0, p, i + 1))
                for *_, q, k in sorted(heap, key=lambda e: (e[-2], e[-1])):
                    for j in lists[q][k:]:
                        self._lend_one(q, j, first)
                return
            if i + 1 < len(lists[p]):
                heapq.heappush(heap, (*self._lend_key(p, lists[p][i + 1]), p, i + 1))

    def _lend_one(self, p: str, j: JobRequest, first: Within) -> None:
        if j.name in self.decisions or j.name in self.waits:
            return  # admitted within quota once its project's head started
        anchors: list[str] = []  # waiting jobs it runs as backfill for, if it starts
        head = first.followers.get(j.name)
        if head is not None and head not in self.started:
            # Behind its project's aged head: it runs as backfill, which the head preempts
            # when it can start, so small jobs cannot keep the head out.
            anchors.append(head)
        claim = first.claims.get(p)
        if claim:
            for r, n in j.resources.items():
                if n > 0 and r in claim:
                    # Its project's within-quota jobs wait on a reclaim: what it takes of
                    # their quota is theirs again when they can start.
                    anchors += first.claim_names[p]
                    break
        if j.preemptions >= REPEATED:
            anchors = []  # preempted twice already: it runs as an ordinary job or waits
        total = self.cap.total
        for r, n in j.resources.items():  # (inline: this runs for every waiting job)
            if n > total.get(r, 0):
                fits = False
                break
        else:
            fits = True
        if fits:
            self.start(j, tuple(sorted(set(anchors))))
            if first.heads.get(p) == j.name:
                first.unblock(p)
            return
        if self.reserved and j.preemptions < REPEATED and self._backfill_held(p, j, anchors):
            return
        if anchors:
            self.waits[j.name] = ("behind", anchors[0])
        # else it waits for capacity: the default reason, written by _finish_waits

    def _backfill_held(self, p: str, j: JobRequest, anchors: list[str]) -> bool:
        """Start j in capacity held for waiting jobs (its own project's, or any when j
        borrows: a project within its quota is never preempted for another), as their
        backfill, only from jobs that wait for protected borrowers (one whose reclaim is
        under way keeps what it holds). The most recently held capacity is taken first."""
        need = j.resources
        total = self.cap.total
        rank = self.rank.__getitem__
        borrowing = not within(self.usage.get(p, {}), need, self.quota(p))
        have = {r: total.get(r, 0) for r in need}
        takes: list[tuple[str, dict[str, int]]] = []
        lack = shortfall(need, have)
        for a in reversed(list(self.reserved)):
            if not lack:
                break
            own = self.pending_project.get(a) == p
            if (
                (not borrowing and not own)
                or self.waits.get(a, _NONE)[0] != "protected"
                or (own and rank(a) > rank(j.name))
            ):
                continue  # (a job whose reclaim is under way keeps what it holds; nobody
                # backfills behind a job of its own project that comes after it)
            got = self.reserved[a]
            take = {r: min(n, got.get(r, 0)) for r, n in lack.items() if got.get(r, 0) > 0}
            if take:
                takes.append((a, take))
                lack = shortfall(lack, take)
        if lack:
            return False
        for a, take in takes:
            self.cap.unreserve(a, take)
            got = self.reserved[a]
            for r, n in take.items():
                got[r] -= n
            self.reserved[a] = {r: n for r, n in got.items() if n > 0}
            if not self.reserved[a]:
                del self.reserved[a]
            anchors.append(a)
        self.start(j, tuple(sorted(set(anchors))))
        return True

    def _lend_key(self, p: str, j: JobRequest) -> tuple[float, float, float]:
        """AXLearn's order: the project that would be least over its quota goes first.

        (Putting long-waiting jobs first was tried in the simulator: requeued victims, old by
        submission, restarted first and were preempted again, more often.)"""
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
        return (ratio, excess, j.submit_time)

    # -- reasons for waiting jobs ----------------------------------------------------------------

    def _finish_waits(self, queues: dict[str, list[JobRequest]]) -> None:
        for got in self.reserved.values():
            add(self.held_total, got)
        decisions, waits, cache = self.decisions, self.waits, self.reason_cache
        for p, queue in queues.items():
            q, used = self.quota(p), self.usage.get(p, {})
            ahead = 0
            for j in queue:
                name = j.name
                if name in decisions:
                    continue
                wait = waits.get(name)
                if wait is not None and wait[0] == "behind" and wait[1] in cache:
                    # (inline: with a waiting head or claimant in most projects, most jobs)
                    why = f"{cache[wait[1]]}; {ahead} job{'' if ahead == 1 else 's'} ahead in {p}"
                elif wait is not None:
                    why = wait_reason(self, j, ahead, q, used)
                else:  # the common case, kept short: 50,000 of these must stay cheap
                    why = (
                        f"{full_reason(self, j, used, q)}; {ahead} job"
                        f"{'' if ahead == 1 else 's'} ahead in {p}"
                    )
                decisions[name] = Decision(
                    name, Verdict.WAIT, why, wait=stable_wait(self, j), ahead=ahead
                )
                ahead += 1


_NONE = ("", None)


def arrival(j: JobRequest) -> tuple[float, bool, float, str]:
    """Queue order among equals: first seen by the daemon, then the spec's creation time
    (jobs seen in the same cycle), then name."""
    c = j.creation_time
    return (j.submit_time, c is None, c or 0.0, j.name)


def _least_need(jobs: list[JobRequest]) -> dict[str, int]:
    """For each resource every job needs, the smallest amount any of them needs."""
    if not jobs:
        return {}
    least = {r: n for r, n in jobs[0].resources.items() if n > 0}
    for j in jobs:
        res = j.resources
        for r in list(least):
            n = res.get(r, 0)
            if n <= 0:
                del least[r]
            elif n < least[r]:
                least[r] = n
        if not least:
            break
    return least


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
