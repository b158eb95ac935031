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
  smallest loss (units x time since its last checkpoint, or its start) then newest first,
  and only if the whole reclaim succeeds. Marks naming jobs that have since started, left,
  or came back later count for nothing. Judging whether a job fits its quota, and the turn
  order, discount its own project's backfill for it.
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
  frees (anchors.py, `drop_overtaken`): taking the jobs ahead of it in its project's queue
  in order, each that fits the project's quota without that backfill counted in, it must
  still fit.
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
bulk (see within.py `_scan`, lend.py) and only get their place in their project's queue
(Plan.waiting): their WAIT decisions, whose texts jobs of the same shape share but for the
position, are made when read, from the final state of the pass (waiting.py `LazyWaits`,
model.Decisions), and Plan.wait_text
gives the stable part the daemon compares without making them. The daemon makes the decisions
of the jobs whose wait changed and of the first few of each queue (for the queue summary);
`bastion why`, the simulator and tests read any or all of them, the same as if made in the
pass. The pass reads as its numbered steps (`_Pass.run`); each step past the first two is a
module of its own: anchors.py, reclaim.py, within.py, lend.py, waiting.py.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence

from quota.anchors import anchor_backfill, drop_overtaken
from quota.capacity import Capacity, add, fmt_ratio, fmt_units
from quota.config import QuotaConfig
from quota.lend import Lending
from quota.model import Decision, Decisions, JobRequest, Phase, Plan, Verdict
from quota.queue_memo import QueueMemo
from quota.queues import build_queues
from quota.reclaim import Reclaim
from quota.waiting import LazyWaits, finish_waits
from quota.within import Within, within

__all__ = ["run"]


def run(
    config: QuotaConfig,
    jobs: Sequence[JobRequest],
    usage: Mapping[str, float],
    now: float,
    memo: QueueMemo | None = None,
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
        return _Pass(config, jobs, usage, now, memo).run()
    finally:
        if paused:
            gc.enable()


class _Pass:
    """One pass's working state and the primitives its steps share (see PassView); the steps
    themselves are the modules `run` calls in order."""

    def __init__(
        self,
        config: QuotaConfig,
        jobs: Sequence[JobRequest],
        usage: Mapping[str, float],
        now: float,
        memo: QueueMemo | None = None,
    ) -> None:
        self.config, self.jobs, self.user_usage, self.now = config, jobs, usage, now
        self.memo = memo
        self.knobs = config.scheduling
        self.pool = config.pool
        self.quotas = config.quotas
        self.cap = Capacity(config.tiers)
        self.decisions: dict[str, Decision] = {}
        self.order: dict[str, list[str]] = {}  # project -> its waiting jobs in queue order
        self.queues: dict[str, list[JobRequest]] = {}  # project -> valid pending, in order
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
        # start still need their "behind" marks (set by lend.py, read by waiting.py)
        self.tail_from: dict[str, str] = {}
        self.zero_need: set[str] = set()  # projects with valid pending jobs that need nothing
        self.first: Within | None = None
        # pending job -> running backfill jobs started in capacity held for it
        self.anchored: dict[str, list[JobRequest]] = {}
        self.pending_project: dict[str, str] = {}  # anchors of running backfill and of holds
        self.pending_need: dict[str, Mapping[str, int]] = {}

    # -- driver ------------------------------------------------------------------------------

    def run(self) -> Plan:
        """The pass, step by step (each step sees what the ones before it decided)."""
        names, held, pending = self._split()
        # 1. Running and releasing jobs hold their capacity (KEEP).
        self._hold(held)
        # 2. Reject invalid pending jobs; order each project's queue; find the aged head.
        queues = self.queues = self._queue(pending)
        # 3. The backfill marks that still count, and claims on backfill others would take.
        anchor_backfill(self, held, pending)
        if self.anchored:
            drop_overtaken(self, queues)
        # 4. Running jobs become candidate victims; projects still losing jobs to another
        #    project's reclaim defer their own.
        self.reclaim = Reclaim(self, [j for j in held if j.phase is Phase.RUNNING])
        self._defer_for_releasing(held, pending)
        # 5. Within-quota jobs start, or reclaim from borrowers, projects taking turns.
        first = Within(self, self.reclaim, queues)
        first.run()
        # 6. What is left is lent to borrowers (and as backfill).
        if Lending(self, first).run():
            self.first = first  # lending stopped early: marks are made on reading
        # 7. Every pending job left waits, with its position.
        finish_waits(self, queues)
        return Plan(
            decisions=Decisions(names, self.decisions, LazyWaits(self)),
            reserved=self.reserved,
            free=dict(self.cap.total),
            usage=self.usage,
            quotas=self.quotas,
            within_quota=frozenset(first.admitted),
            waiting=self.order,
            aged_head=self.head,
            delays_end=tuple(
                sorted({detail[1] for kind, detail in self.waits.values() if kind == "delayed"})
            ),
        )

    def _split(self) -> tuple[list[str], list[JobRequest], list[JobRequest]]:
        """Names in input order (unique, or ValueError), held jobs, pending jobs."""
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError("job names must be unique")
        waiting = Phase.PENDING  # (two comprehensions: half the time of one loop that appends)
        held = [j for j in self.jobs if j.phase is not waiting]
        pending = [j for j in self.jobs if j.phase is waiting]
        return names, held, pending

    def _queue(self, pending: list[JobRequest]) -> dict[str, list[JobRequest]]:
        """Step 2: the valid pending jobs in queue order per project; invalid ones REJECT."""
        found = build_queues(self.config, pending, self.user_usage, self.now, self.memo)
        for j, why in found.rejects:
            self.decide(j, Verdict.REJECT, why)
        self.head, self.head_project = found.head, found.head_project
        self.zero_need = found.zero_need
        return found.by_project

    def _defer_for_releasing(self, held: list[JobRequest], pending: list[JobRequest]) -> None:
        """A project whose jobs another project's reclaim is still stopping lost them in
        this state of the world too: what was deferred in the pass that chose them stays
        deferred until they are gone (the same world, no new preemption)."""
        if not self.reclaimers:
            return
        mine = {j.name: j.project_id for j in pending if j.name in self.reclaimers}
        for j in held:
            by = mine.get(j.preempted_by or "") if j.phase is Phase.RELEASING else None
            if by is not None and by != j.project_id:
                self.reclaim.lost_to_others.add(j.project_id)

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
