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
* Reclaim delay (rule 5 of issue 13: at most an eighth of AXLearn's preemptions): a
  within-quota job preempts, or claims what others' preemptions release, only once its
  project has waited `reclaim_after_seconds` (default 240 s, at most the minimum runtime,
  counted from the earliest wait of the project's jobs that fit its quota). Before that it
  holds capacity as it frees, and jobs that finish meanwhile often spare the preemption.
  Borrowers that block it are protected for the minimum runtime anyway, so the wait stays
  within one reclaim period. Measured with AXLearn's scheduler replayed on the same traces
  (benchmarks/axlearn_model.py): 240 s took the largest ratio of our preemptions to
  AXLearn's from 0.15 to 0.11 on mixed traces and from 0.31 to 0.16 on two resource types.
* Fewest victims (rule 5 again): a reclaim that needs several victims in priority order
  (lowest priority, newest first) takes instead the set found widest first (each time the
  candidate covering most of what is still lacking) when that set is smaller: one 8-unit
  borrower rather than four 2-unit ones (quota/reclaim.py, `_fewest`). The candidates, and
  the check that each victim finds its project over its quota, are the same.
* A waiting job claims its own project's backfill only if it would get what that backfill
  frees (`_overtaken`): taking the jobs ahead of it in its project's queue in order, each
  that fits the project's quota without that backfill counted in, it must still fit.
  Otherwise the freed quota would go to those jobs in the next pass (queue order; the aged
  head blocks only the jobs after it) and the preemption would be in vain; its backfill is
  then an ordinary running job for it (and for other projects' reclaims).
  Both measured on bench_fairness.py's 15 traces: the largest ratio to AXLearn's
  preemptions went from 0.157 to 0.113 on two resource types and from 0.217 to 0.107 with
  projects always over their share (an owner's within-quota reclaims in the over-share
  traces took four or six 2-unit borrowers where one or two larger ones would do, and aged
  heads took back backfill whose units a higher-priority job of theirs then started in).
  Where a borrower holds the whole pool when its owner returns, AXLearn preempts only 17 to
  23 times, and the owner's return alone needs 4 to 8 victims to honour rule 2: the ratio
  stays above an eighth there for any such policy; bench_fairness.py prints that bound
  beside our count (at the return ours is at or near it given the borrower jobs then
  running; the rest are borrower jobs restarted, as rule 1 wants, in capacity the owner
  could not use yet, and taken back when it could).
Measured from event logs by quota/rules.py, see benchmarks/bench_fairness.py.

Cost: the pass is about O(running + jobs that could start) after sorting each project's
queue; the jobs that cannot start (most of 50,000 pending in a full pool) are passed over in
bulk (see _scan, _lend) and only get their place in their project's queue (Plan.waiting):
their WAIT decisions, whose texts jobs of the same shape share but for the position, are made
when read, from the final state of the pass (_Waiting, model.Decisions), and Plan.wait_text
gives the stable part the daemon compares without making them. The daemon makes the decisions
of the jobs whose wait changed and of the first few of each queue (for the queue summary);
`bastion why`, the simulator and tests read any or all of them, the same as if made in the
pass. The plain pass it must equal is kept in tests/quota/pass_reference.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable, Mapping, Sequence

from quota.capacity import EPS, Capacity, add, fmt_ratio, fmt_units, least_need, shortfall
from quota.config import QuotaConfig
from quota.model import Decision, Decisions, JobRequest, Phase, Plan, Verdict
from quota.reasons import behind_reason, full_reason, stable_wait, wait_reason
from quota.reclaim import REPEATED, Reclaim
from quota.within import Within, within

__all__ = ["EPS", "invalid_reason", "run"]


def run(
    config: QuotaConfig, jobs: Sequence[JobRequest], usage: Mapping[str, float], now: float
) -> Plan:
    """One pass, with the cyclic garbage collector paused while it runs.

    A pass over 50,000 pending jobs allocates per job (queue entries, sort keys, names in
    queue order); with the collector on, those allocations set off full collections that
    walk every live object (all the jobs too), measured at a sixth of the pass when it made
    a decision (a tuple) for each of them. Nothing of the pass depends on
    the collector: what it drops, reference counting frees, and the few cycles it leaves
    (the pass and its helpers refer to each other) are collected on the collector's next
    run after it, as before. The collector's state is restored as it was."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _Pass(config, jobs, usage, now).run()
    finally:
        if paused:
            gc.enable()


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
        self.order: dict[str, list[str]] = {}  # project -> its waiting jobs in queue order
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
        self.head_project: str | None = None
        # project -> its first job from which on (in queue order) the jobs that nothing let
        # start still need their "behind" marks (see _lend; set in _finish_waits)
        self.tail_from: dict[str, str] = {}
        self.zero_need: set[str] = set()  # projects with valid pending jobs that need nothing
        self.first: Within | None = None
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
            if self.anchored:
                self._overtaken(queues)
        self.reclaim = Reclaim(self, [j for j in held if j.phase is Phase.RUNNING])
        if self.reclaimers:
            # A project whose jobs another project's reclaim is still stopping lost them in
            # this state of the world too: what was deferred in the pass that chose them
            # stays deferred until they are gone (the same world, no new preemption).
            mine = {j.name: j.project_id for j in pending if j.name in self.reclaimers}
            for j in held:
                by = mine.get(j.preempted_by or "") if j.phase is Phase.RELEASING else None
                if by is not None and by != j.project_id:
                    self.reclaim.lost_to_others.add(j.project_id)
        first = Within(self, self.reclaim, queues)
        self.rank_in = first.rank_in
        first.run()
        self._lend(first)
        self._finish_waits(queues)
        return Plan(
            decisions=Decisions(names, self.decisions, _Waiting(self)),
            reserved=self.reserved,
            free=dict(self.cap.total),
            usage=self.usage,
            quotas=self.quotas,
            within_quota=frozenset(first.admitted),
            waiting=self.order,
        )

    def _overtaken(self, queues: Mapping[str, list[JobRequest]]) -> None:
        """Drop a waiting job's claim on its own project's backfill when the jobs ahead of it
        in its project's queue would take the quota that backfill frees: taken in queue order,
        each that fits the project's usage without that backfill (plus those before it) is
        counted in, and if the waiting job no longer fits after them, what its backfill frees
        would go to them in the next pass, and preempting it would be in vain. Those backfill
        jobs are ordinary running jobs for it then (other projects' reclaims count them as
        borrowing, if they are)."""
        own: dict[str, list[str]] = {}
        for a, jobs in self.anchored.items():
            p = self.pending_project[a]
            if any(b.project_id == p for b in jobs):
                own.setdefault(p, []).append(a)
        for p, names in sorted(own.items()):
            q, used = self.quota(p), self.usage.get(p, {})
            left = set(names)
            ahead: list[tuple[tuple, Mapping[str, int]]] = []
            for j in queues.get(p, ()):
                if not left:
                    break
                if j.name in left:
                    left.discard(j.name)
                    trial = dict(used)
                    for b in self.anchored[j.name]:
                        if b.project_id == p:
                            add(trial, b.resources, -1)
                    nofit: set[tuple] = set()  # (usage only grows: such jobs never fit)
                    for shape, k in ahead:
                        if shape not in nofit:
                            if within(trial, k, q):
                                add(trial, k)
                            else:
                                nofit.add(shape)
                    if not within(trial, j.resources, q):
                        kept = [b for b in self.anchored[j.name] if b.project_id != p]
                        if kept:
                            self.anchored[j.name] = kept
                        else:
                            del self.anchored[j.name]
                ahead.append((tuple(j.resources.items()), j.resources))

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
        """Valid pending jobs per project: priority, then user's decayed usage, then age.

        (The same walk finds the aged head, see _head: one walk over 50,000 jobs, not two.)"""
        queues: dict[str, list[JobRequest]] = {}
        pool, config, quotas = self.pool, self.config, self.quotas
        cutoff = self.now - self.knobs.reserve_after_seconds
        best: tuple[float, bool, float, str] | None = None
        for j in pending:
            if config.is_member(j.user_id, j.project_id):
                some = False
                for r, n in j.resources.items():
                    if n < 0 or n > pool.get(r, 0):
                        break
                    some = some or n > 0
                else:
                    p = j.project_id
                    queues.setdefault(p, []).append(j)
                    if not some:
                        self.zero_need.add(p)
                    t = j.submit_time
                    if (
                        t <= cutoff
                        and (best is None or (t <= best[0] and arrival(j) < best))
                        and within({}, j.resources, quotas.get(p, {}))
                    ):
                        best = arrival(j)
                        self.head_project = p
                    continue
            self.decide(j, Verdict.REJECT, invalid_reason(config, j) or "invalid")
        self.head = best[-1] if best else None
        key = queue_key(self.user_usage)
        for q in queues.values():
            q.sort(key=key)
        return dict(sorted(queues.items()))

    # _head: the oldest valid job that has waited `reserve_after_seconds` and fits its
    # project's quota (found by _queues). While its project's running jobs leave it no room,
    # later jobs of its project wait, so a stream of small jobs cannot keep it out; it
    # becomes within quota as its project drains, and then reclaims. (Holding free capacity
    # for it as well was measured in the simulator: it restarted large borrowers only for
    # owners to preempt them again.) Depending only on age and quota, the choice does not
    # flip when a plan is applied. Arrivals are unique (they end with the name), so the
    # oldest is the same whatever order the jobs are walked in.

    # -- pass 2: lend what is left ---------------------------------------------------------------

    def _lend(self, first: Within) -> None:
        """Borrowers in turn: what the within-quota pass left is lent, project by project."""
        done, waits = self.decisions, self.waits
        lists = {}
        for p, lst in first.lenders.items():
            lst = [j for j in lst if j.name not in done and j.name not in waits]
            if p in first.unsorted:
                rank = first.rank_in(p)
                lst.sort(key=lambda j: rank[j.name])
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
                least = self._least_need(lists)
            if not any(n > 0 for n in total.values()) or any(
                total.get(r, 0) < n for r, n in least.items()
            ):
                # No job left fits (all need r, less is free): order is moot from here on.
                heap.append((0.0, 0.0, 0.0, p, i + 1))
                rest = sorted(heap, key=lambda e: (e[-2], e[-1]))
                if not self.reserved and (
                    (least and any(total.get(r, 0) < n for r, n in least.items()))
                    or (not least and not self.zero_need and not any(n > 0 for n in total.values()))
                ):
                    # Every job left needs more of some r than is free, and none can start in
                    # held capacity: only the marks of jobs waiting behind their project's
                    # head or claims are left to set.
                    # _finish_waits sets them as it walks the queues anyway.
                    for *_, q, k in rest:
                        if k < len(lists[q]) and (q in first.heads or first.claims.get(q)):
                            self.tail_from[q] = lists[q][k].name
                    self.first = first
                    return
                for *_, q, k in rest:
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

    def _least_need(self, lists: Mapping[str, list[JobRequest]]) -> dict[str, int]:
        """For each resource every job needs, the smallest amount any of them needs (a
        valid job needs only resources of the pool)."""
        return least_need([j.resources for lst in lists.values() for j in lst], self.pool)

    def _backfill_held(self, p: str, j: JobRequest, anchors: list[str]) -> bool:
        """Start j in capacity held for waiting jobs (its own project's, or any when j
        borrows: a project within its quota is never preempted for another), as their
        backfill, only from jobs that wait for protected borrowers (one whose reclaim is
        under way keeps what it holds). The most recently held capacity is taken first."""
        need = j.resources
        total = self.cap.total
        rank = self.rank_in(p).__getitem__
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
                or self.waits.get(a, _NONE)[0] not in _LENDS
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
        """A WAIT decision for every pending job left, with its position in its project.

        self.order lists each project's waiting jobs in queue order (a job's position is its
        index there). The jobs whose wait was set in the pass (claims, holds, marks made in
        _lend) get their decision now; the others (most of 50,000 waiting jobs: waiting for
        capacity, or behind their project's aged head or first claim, as _lend_one would
        mark them) only on reading, from the final state of the pass (see _Waiting)."""
        for got in self.reserved.values():
            add(self.held_total, got)
        decisions, waits, order = self.decisions, self.waits, self.order
        new, wait_verdict = tuple.__new__, Verdict.WAIT
        for p, queue in queues.items():
            names = [n for j in queue if (n := j.name) not in decisions]
            if not names:
                continue
            order[p] = names
            if not waits or waits.keys().isdisjoint(names):
                continue
            q, used = self.quota(p), self.usage.get(p, {})
            ahead = -1
            for j in queue:
                name = j.name
                if name in decisions:
                    continue
                ahead += 1
                if name not in waits:
                    continue
                why = wait_reason(self, j, ahead, q, used)
                # (Decision is a named tuple: made directly, it costs a tenth of a call)
                decisions[name] = new(
                    Decision, (name, wait_verdict, why, None, None, (), stable_wait(self, j), ahead)
                )


class _Waiting:
    """The WAIT decisions that _finish_waits leaves to be made on reading (model.Decisions
    asks for them): from the final state of the pass, exactly what making them in the pass
    gave, the text of each shape of job formatted once."""

    def __init__(self, ps: _Pass) -> None:
        self.ps = ps
        self.first = ps.first
        self._jobs: dict[str, JobRequest] | None = None
        self._pos: dict[str, dict[str, int]] = {}  # project -> job -> position
        self._tail: dict[str, int] = {}  # project -> position of its tail_from job
        self._stable: dict[tuple, str] = {}  # shape -> stable text
        self._uses: dict[tuple[str, tuple], bool] = {}  # see wait_of

    def job(self, name: str) -> JobRequest | None:
        if self._jobs is None:
            self._jobs = {j.name: j for j in self.ps.jobs}
        return self._jobs.get(name)

    def stable(self, j: JobRequest) -> str:
        shape = tuple(j.resources.items())
        text = self._stable.get(shape)
        if text is None:
            text = self._stable[shape] = stable_wait(self.ps, j)
        return text

    def wait_text(self, name: str) -> str | None:
        """The stable text of a waiting job left to read (every one of them has the text of
        its shape: it waits for capacity, or behind a job that does not move it)."""
        j = self.job(name)
        return None if j is None else self.stable(j)

    def decision(self, name: str) -> Decision:
        j = self.job(name)
        if j is None:
            raise KeyError(name)
        ps, p = self.ps, j.project_id
        pos = self._pos.get(p)
        if pos is None:
            names = ps.order.get(p, ())
            pos = self._pos[p] = {n: i for i, n in enumerate(names)}
            tail = ps.tail_from.get(p)
            # (marks apply from the tail job on; without one, to no job)
            self._tail[p] = (
                pos.get(tail, len(names))
                if tail is not None and self.first is not None
                else len(names)
            )
        ahead = pos[name]
        head = None
        if ahead >= self._tail[p] and j.preemptions < REPEATED:
            # What _lend_one would have marked (see _lend): behind the project's aged
            # head, else behind its first job that waits on a reclaim.
            first = self.first
            assert first is not None
            head = first.followers.get(name)
            if head is None or head in ps.started:
                head = None
                claim = first.claims.get(p)
                if claim:
                    key = (p, tuple(j.resources.items()))
                    u = self._uses.get(key)
                    if u is None:
                        u = self._uses[key] = any(
                            n > 0 and r in claim for r, n in j.resources.items()
                        )
                    if u:
                        head = first.claim_names[p][0]
        if head is None:
            text = full_reason(ps, j, ps.usage.get(p, {}), ps.quota(p))
        else:
            text = behind_reason(ps, head, p)
        return Decision(
            name,
            Verdict.WAIT,
            f"{text}; {ahead} job{'' if ahead == 1 else 's'} ahead in {p}",
            wait=self.stable(j),
            ahead=ahead,
        )


_NONE = ("", None)
# Waits whose held capacity may be lent as backfill: the job cannot start before borrowers
# become preemptible, or before its reclaim delay is over.
_LENDS = frozenset({"protected", "delayed"})


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
