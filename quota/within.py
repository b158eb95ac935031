"""Pass 1: jobs that fit their project's guaranteed quota start, or reclaim it from borrowers.

Projects take turns (the one furthest below its quota first), each walking its own queue in
order. Whether a job is within quota is decided when its turn comes, against the project's
usage at that moment, so preemptions chosen earlier in the pass are already counted: one pass
decides everything the next pass would (a project cut below its quota by a reclaim gets to
reclaim in the same pass). Reclaimers named by RELEASING jobs go first, with what they freed.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Mapping

from quota.capacity import EPS, add, least_need, shortfall
from quota.model import JobRequest, Verdict
from quota.passview import PassView
from quota.reclaim import REPEATED, Reclaim


def within(used: Mapping[str, float], need: Mapping[str, int], q: Mapping[str, float]) -> bool:
    """Whether usage plus need stays within quota for every resource the job needs."""
    for r, n in need.items():  # noqa: SIM110 (a plain loop: this runs for every pending job)
        if n > 0 and used.get(r, 0) + n > q.get(r, 0.0) + EPS:
            return False
    return True


def quota_shortfall(
    used: Mapping[str, int], need: Mapping[str, int], q: Mapping[str, float]
) -> dict[str, int]:
    total = dict(used)
    add(total, need)
    return {
        r: int(-(-(total[r] - q.get(r, 0.0) - EPS) // 1))
        for r in need
        if need[r] > 0 and total[r] > q.get(r, 0.0) + EPS
    }


class Within:
    def __init__(self, ps: PassView, reclaim: Reclaim, queues: dict[str, list[JobRequest]]) -> None:
        self.ps = ps
        self.reclaim = reclaim
        self.queues = queues
        self.claims: dict[str, dict[str, int]] = {}  # within-quota jobs that wait, per project
        self.claimants: dict[str, str] = {}  # project -> its first within-quota job that waits
        self.claim_names: dict[str, list[str]] = {}  # project -> its within-quota jobs that wait
        self.lenders: dict[str, list[JobRequest]] = {p: [] for p in queues}
        self.followers: dict[str, str] = {}  # job -> aged head of its project it waits behind
        self.heads: dict[str, str] = {}
        self.admitted: set[str] = set()
        self._rank: dict[str, dict[str, int]] = {}  # see rank_in
        self._least: dict[str, dict[str, int]] = {}  # see _beyond
        self._special: dict[str, list[int]] = {}  # see _next_special
        self._since: dict[str, float] = {}  # see _reclaim_due
        self.unsorted: set[str] = set()  # projects whose lenders may be out of queue order
        self._same: dict[str, bool] = {}
        self._pos = dict.fromkeys(queues, 0)  # next index of each queue to classify
        self._version = dict.fromkeys(queues, 0)  # heap entries of older versions are stale
        self._heap: list[tuple[float, float, str, int, int]] = []

    def rank_in(self, p: str) -> dict[str, int]:
        """Position of each job in p's queue (built for the few projects that need it)."""
        rank = self._rank.get(p)
        if rank is None:
            rank = self._rank[p] = {j.name: i for i, j in enumerate(self.queues[p])}
        return rank

    def claimed(self, p: str) -> dict[str, int]:
        used = dict(self.ps.usage.get(p, {}))
        add(used, self.claims.get(p, {}))
        return used

    def run(self) -> None:
        self._sticky()
        for p in self.queues:
            self._push(p)
        self._turns()

    def _turns(self) -> None:
        """Projects take turns with their next job within quota, furthest below quota first."""
        while self._heap:
            _, _, p, i, version = heapq.heappop(self._heap)
            if version != self._version[p]:
                continue
            j = self.queues[p][i]
            if j.name not in self.admitted:
                self._admit(j, same_project=self._same[j.name])
            self._push(p)

    def _push(self, p: str) -> None:
        i = self._scan(p)
        if i is not None:
            heapq.heappush(self._heap, (*self._key(p, self.queues[p][i]), p, i, self._version[p]))

    def _scan(self, p: str) -> int | None:
        """Walk p's queue to its next job within quota (the ones passed over go to lenders).

        Only p's own admissions change whether p's jobs fit its quota (a reclaim that takes
        p's jobs reopens them), so other projects' turns need not interleave with the walk.
        Once a job is passed over and no job of p can fit what is left of its quota, the walk
        jumps to the next job that needs a closer look (the aged head, a job with backfill),
        passing the ones between over at once: most of 50,000 waiting jobs are here."""
        queue = self.queues[p]
        q = self.ps.quota(p)
        claimed = self.claimed(p)
        done, waits = self.ps.decisions, self.ps.waits  # (decided in the lending pass)
        knob, head = self.ps.knobs.preempt_within_project, self.ps.head
        anchored = self.ps.anchored
        lenders = self.lenders[p]
        beyond: bool | None = None  # no job of p fits its quota now (asked once per walk)
        i = self._pos[p]
        n = len(queue)
        while i < n:
            j = queue[i]
            i += 1
            name = j.name
            if name in self.admitted or name in done or name in waits:
                continue
            if p not in self.heads:  # the common cases first, inline (this runs for every job)
                for r, k in j.resources.items():
                    if k > 0 and claimed.get(r, 0) + k > q.get(r, 0.0) + EPS:
                        break
                else:
                    self._same[name] = False
                    self._pos[p] = i
                    return i - 1
                if not knob and name != head and name not in anchored:
                    lenders.append(j)
                    if beyond is None:
                        beyond = self._beyond(p, q, claimed)
                    if beyond:
                        k = self._next_special(p, i)
                        if k > i:
                            # (decided ones among them too: whoever reads lenders skips
                            # jobs that are decided or wait, as the walk does)
                            lenders += queue[i:k]
                            i = k
                    continue
            elif beyond is not False:
                # (behind p's aged head: when no job of p fits, the rest at once)
                if beyond is None:
                    beyond = self._beyond(p, q, claimed)
                if beyond:
                    self._follow_head(p, queue[i - 1 :])
                    i = n
                    continue
            same = self._classify(p, j, q, claimed)
            if same is not None:
                self._same[j.name] = same
                self._pos[p] = i
                return i - 1
        self._pos[p] = i
        return None

    def _follow_head(self, p: str, rest: list[JobRequest]) -> None:
        """What _classify does for each of ``rest`` when none fits p's quota: each follows
        p's aged head to the lenders (decided ones too, skipped by whoever reads either)."""
        self.followers.update(dict.fromkeys([b.name for b in rest], self.heads[p]))
        self.lenders[p] += rest

    def _beyond(self, p: str, q: Mapping[str, float], claimed: Mapping[str, int]) -> bool:
        """Whether no job of p's queue fits p's quota over `claimed`: every one of them
        needs at least least[r] of some resource r, and that much more would exceed it."""
        least = self._least.get(p)
        if least is None:
            least = self._least[p] = least_need([j.resources for j in self.queues[p]], self.ps.pool)
        return any(claimed.get(r, 0) + m > q.get(r, 0.0) + EPS for r, m in least.items())

    def _next_special(self, p: str, i: int) -> int:
        """Index of p's next job at or after i that the walk must classify on its own (the
        aged head, or a job that running backfill was started for), else the queue's end."""
        special = self._special.get(p)
        if special is None:
            ps = self.ps
            names = [a for a in ps.anchored if ps.pending_project.get(a) == p]
            if ps.head is not None and ps.head_project == p:
                names.append(ps.head)
            rank = self.rank_in(p) if names else {}
            special = self._special[p] = sorted(rank[n] for n in names if n in rank)
        k = bisect.bisect_left(special, i)
        return special[k] if k < len(special) else len(self.queues[p])

    def reopen(self, p: str) -> None:
        """p lost jobs to a reclaim, or its head started: the jobs it passed over (and those
        behind its head) are judged again, in their turn, against its usage now."""
        ps = self.ps
        if not ps.knobs.preempt_within_project:
            q, claimed = ps.quota(p), self.claimed(p)
            if all(q.get(r, 0.0) - claimed.get(r, 0) <= EPS for r in {*q, *claimed}):
                return  # still at or over its quota everywhere: nothing of p can fit it
        done, waits = ps.decisions, ps.waits
        back = [
            j
            for j in self.lenders.get(p, [])
            if j.name not in self.admitted and j.name not in done and j.name not in waits
        ]
        if not back:
            return
        head = self.heads.pop(p, None)
        if head is not None:
            self.followers = {f: h for f, h in self.followers.items() if h != head}
        self.lenders[p] = []
        self.unsorted.add(p)
        rank = self.rank_in(p)
        self._pos[p] = min(rank[j.name] for j in back)
        self._version[p] += 1
        self._push(p)

    def unblock(self, p: str) -> None:
        """p's head started (borrowing, in the lending pass): judge the jobs behind it now."""
        self.reopen(p)
        self._turns()

    def _key(self, p: str, j: JobRequest) -> tuple[float, float]:
        """The project that would be furthest below its quota goes first, then the oldest."""
        q = self.ps.quota(p)
        used = self.claimed(p)
        add(used, j.resources)
        if j.name in self.ps.anchored:
            add(used, self.ps.anchored_usage(j.name, p), -1)  # its own backfill goes for it
        share = max((used.get(r, 0) / s for r, s in q.items() if s > 0), default=0.0)
        return (share, j.submit_time)

    def _sticky(self) -> None:
        """Jobs whose reclaim is under way go first (cf. kueue#7157): releasing capacity is
        fungible, and what they counted on last pass is all still there, so none of them
        needs a new victim."""
        ps = self.ps
        if not ps.reclaimers:
            return
        pending = {j.name: j for q in self.queues.values() for j in q if j.name in ps.reclaimers}
        named = sorted((pending[n].submit_time, n) for n in ps.reclaimers if n in pending)
        for _, name in named:
            j = pending[name]
            claimed = self.claimed(j.project_id)
            add(claimed, ps.anchored_usage(name, j.project_id), -1)  # its backfill goes
            if not within(claimed, j.resources, ps.quota(j.project_id)):
                continue
            # What it preempted for is still on its way: use that before free capacity,
            # which the others counted on last pass.
            mark = {r: min(n, ps.earmark.get(r, 0)) for r, n in j.resources.items() if n > 0}
            rest = shortfall(j.resources, mark)
            if any(mark.values()) and not shortfall(rest, ps.cap.total):
                self.admitted.add(name)
                self._wait(j, mark, ("releasing", mark), hold=rest)
            else:
                self._admit(j, same_project=False)

    def _classify(
        self, p: str, j: JobRequest, q: Mapping[str, float], claimed: dict[str, int]
    ) -> bool | None:
        """None: j goes to the borrowing pass; else whether it needs own lower-priority jobs."""
        ps = self.ps
        head = self.heads.get(p)
        if head is not None:
            self.followers[j.name] = head
            if within(claimed, j.resources, q):
                return False  # within quota: it starts (or reclaims), as the head's backfill
            self.lenders[p].append(j)
            return None
        fit = self._fit(p, j, q, claimed)
        if fit is not None:
            return fit
        if j.name == ps.head:
            self.heads[p] = j.name  # later jobs of p must not refill the capacity it waits for
        self.lenders[p].append(j)
        return None

    def _fit(
        self, p: str, j: JobRequest, q: Mapping[str, float], claimed: Mapping[str, int]
    ) -> bool | None:
        """False: within quota; True: within once own lower-priority jobs go; None: not."""
        if within(claimed, j.resources, q):
            return False
        claim = self.claims.get(p, {})
        mine = self.ps.anchored_usage(j.name, p) if j.name in self.ps.anchored else None
        if (
            mine
            and p not in self.reclaim.lost_to_others
            and not any(n > 0 and claim.get(r, 0) > 0 for r, n in j.resources.items())
        ):
            # (Not while a job of p ahead of it waits for the same resources: what its
            # backfill frees would go to that job, and it would only preempt in vain; nor in
            # a pass where p lost jobs to another project, whose victims must each have
            # found p over its quota: next pass.)
            # Its project's backfill (started behind it) counts as its own quota: it is
            # within quota, and those jobs are its first victims if capacity is short.
            trial = dict(claimed)
            add(trial, mine, -1)
            if within(trial, j.resources, q):
                return False
        if self.ps.knobs.preempt_within_project and not any(
            n > 0 and claim.get(r, 0) > 0 for r, n in j.resources.items()
        ):
            # (A within-quota job of p that waits keeps what it claimed: no such jumps.)
            lower = self.reclaim.lower_priority_usage(p, j.priority)
            if lower:
                trial = dict(claimed)
                add(trial, lower, -1)
                if within(trial, j.resources, q):
                    return True
        return None

    def _admit(self, j: JobRequest, same_project: bool) -> None:
        ps = self.ps
        cshort = shortfall(j.resources, ps.cap.total)
        if not cshort:
            # It fits free capacity, so it starts (work conserving), even if it then borrows.
            self.admitted.add(j.name)
            head = self.followers.get(j.name)
            ps.start(
                j,
                (head,)
                if head is not None and head not in ps.started and j.preemptions < REPEATED
                else (),
            )
            return
        if same_project:
            self._admit_over_own(j, cshort)
            return
        self.admitted.add(j.name)
        # Not yet: its project has waited less than the reclaim delay. It neither preempts
        # nor claims what others' preemptions release (which keeps a plan's claims the same
        # in the next pass); capacity that frees by itself meanwhile is held for it, and may
        # spare the preemption. The delay counts from the earliest wait of p's jobs that fit
        # its quota, so p is never kept from it longer than before.
        delay = ps.knobs.reclaim_delay_seconds
        since = j.submit_time if j.pending_since is None else j.pending_since
        due = since + delay
        if ps.now < due:
            due = min(due, self._fitting_since(j.project_id, ps.now - delay) + delay)
        if ps.now < due:
            self._wait(j, {}, ("delayed", (cshort, due)))
            return
        after = shortfall(cshort, ps.earmark)
        if not after:
            self._wait(j, cshort, ("releasing", cshort))
            return
        victims = self.reclaim.select(j, after, {})
        if victims is None:
            self._wait(j, cshort, ("protected", (after, {}, self.reclaim.blocked_until)))
            return
        self._preempt(j, cshort, victims)

    def _fitting_since(self, p: str, cutoff: float) -> float:
        """The earliest time one of p's pending jobs that fit p's quota over its usage now
        became pending (p has been kept from its quota at least since then), or any time at
        or before `cutoff` if that is all the caller needs to know (found sooner)."""
        since = self._since.get(p)
        if since is None:
            q, used = self.ps.quota(p), self.ps.usage.get(p, {})
            since = math.inf
            for j in self.queues[p]:
                t = j.submit_time if j.pending_since is None else j.pending_since
                if t < since and within(used, j.resources, q):
                    since = t
                    if t <= cutoff:
                        break  # (cutoff is the same in a pass: now - the delay)
            self._since[p] = since
        return since

    def _admit_over_own(self, j: JobRequest, cshort: Mapping[str, int]) -> None:
        """Within quota only once its project's lower-priority jobs go (the knob is on): as in
        Kueue, preempt them (and borrowers) for everything it lacks, or leave it to the
        borrowing pass; it never claims releasing capacity while outside its quota."""
        ps = self.ps
        p = j.project_id
        qshort = quota_shortfall(self.claimed(p), j.resources, ps.quota(p))
        victims = self.reclaim.select(j, cshort, qshort)
        if victims is None:
            self.lenders[p].append(j)
            self.unsorted.add(p)
            return
        self.admitted.add(j.name)
        self._preempt(j, cshort, victims)

    def _preempt(self, j: JobRequest, cshort: Mapping[str, int], victims: list[JobRequest]) -> None:
        ps = self.ps
        for v in victims:
            add(ps.earmark, v.resources)
        self._wait(j, cshort, ("reclaiming", [v.name for v in victims]))
        for v in victims:
            ps.decide(v, Verdict.PREEMPT, self.reclaim.reasons[v.name], v.tier, j.name)
        for vp in sorted({v.project_id for v in victims}):
            self.reopen(vp)  # (its own project too, when its backfill went)

    def _wait(
        self,
        j: JobRequest,
        cshort: Mapping[str, int],
        why: tuple[str, object],
        hold: Mapping[str, int] | None = None,
    ) -> None:
        """Claim `cshort` from releasing capacity, and hold free capacity (all it needs, or
        `hold`) so that nobody after it takes it."""
        ps = self.ps
        for r, n in cshort.items():
            ps.earmark[r] = max(0, ps.earmark.get(r, 0) - n)
        got = ps.cap.reserve(j.resources if hold is None else hold, j.name)
        if got:
            ps.reserved[j.name] = got
            ps.pending_project[j.name] = j.project_id
        add(
            self.claims.setdefault(j.project_id, {}),
            {r: n for r, n in j.resources.items() if n > 0},
        )
        self.claimants.setdefault(j.project_id, j.name)
        self.claim_names.setdefault(j.project_id, []).append(j.name)
        ps.waits[j.name] = why
