"""Pass 1: jobs that fit their project's guaranteed quota start, or reclaim it from borrowers.

Projects take turns (the one furthest below its quota first), each walking its own queue in
order. Whether a job is within quota is decided when its turn comes, against the project's
usage at that moment, so preemptions chosen earlier in the pass are already counted: one pass
decides everything the next pass would (a project cut below its quota by a reclaim gets to
reclaim in the same pass). Reclaimers named by RELEASING jobs go first, with what they freed.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import TYPE_CHECKING

from quota.capacity import add, shortfall
from quota.model import JobRequest, Verdict

if TYPE_CHECKING:
    from quota.engine import _Pass

EPS = 1e-6


def within(used: Mapping[str, float], need: Mapping[str, int], q: Mapping[str, float]) -> bool:
    """Whether usage plus need stays within quota for every resource the job needs."""
    return all(n <= 0 or used.get(r, 0) + n <= q.get(r, 0.0) + EPS for r, n in need.items())


def quota_shortfall(used: Mapping[str, int], need: Mapping[str, int],
                    q: Mapping[str, float]) -> dict[str, int]:
    total = dict(used)
    add(total, need)
    return {r: int(-(-(total[r] - q.get(r, 0.0) - EPS) // 1))
            for r in need if need[r] > 0 and total[r] > q.get(r, 0.0) + EPS}


class Within:
    def __init__(self, ps: _Pass, queues: dict[str, list[JobRequest]]) -> None:
        self.ps = ps
        self.queues = queues
        self.claims: dict[str, dict[str, int]] = {}  # within-quota jobs that wait, per project
        self.claimants: dict[str, str] = {}  # project -> its first within-quota job that waits
        self.lenders: dict[str, list[JobRequest]] = {p: [] for p in queues}
        self.followers: dict[str, str] = {}  # job -> aged head of its project it waits behind
        self.heads: dict[str, str] = {}
        self.admitted: set[str] = set()
        self._same: dict[str, bool] = {}

    def claimed(self, p: str) -> dict[str, int]:
        used = dict(self.ps.usage.get(p, {}))
        add(used, self.claims.get(p, {}))
        return used

    def run(self) -> None:
        self._sticky()
        pos = dict.fromkeys(self.queues, 0)
        heap = []
        for p in self.queues:
            i = self._scan(p, pos)
            if i is not None:
                heap.append((*self._key(p, self.queues[p][i]), p, i))
        heapq.heapify(heap)
        while heap:
            *_, p, i = heapq.heappop(heap)
            j = self.queues[p][i]
            if j.name not in self.admitted:
                self._admit(j, same_project=self._same[j.name])
            i = self._scan(p, pos)
            if i is not None:
                heapq.heappush(heap, (*self._key(p, self.queues[p][i]), p, i))

    def _scan(self, p: str, pos: dict[str, int]) -> int | None:
        """Walk p's queue to its next job within quota (the ones passed over go to lenders).

        Only p's own admissions change whether p's jobs fit its quota (a reclaim that takes
        p's jobs revisits them), so the other projects' turns need not interleave here."""
        queue = self.queues[p]
        q = self.ps.quota(p)
        claimed = self.claimed(p)
        i = pos[p]
        while i < len(queue):
            j = queue[i]
            i += 1
            if j.name in self.admitted:
                continue
            same = self._classify(p, j, q, claimed)
            if same is not None:
                self._same[j.name] = same
                pos[p] = i
                return i - 1
        pos[p] = i
        return None
    def _key(self, p: str, j: JobRequest) -> tuple[float, float]:
        """The project that would be furthest below its quota goes first, then the oldest."""
        q = self.ps.quota(p)
        used = self.claimed(p)
        add(used, j.resources)
        share = max((used.get(r, 0) / s for r, s in q.items() if s > 0), default=0.0)
        return (share, j.submit_time)

    def _sticky(self) -> None:
        """Jobs whose reclaim is under way go first (cf. kueue#7157): releasing capacity is
        fungible, and what they counted on last pass is all still there, so none of them
        needs a new victim."""
        ps = self.ps
        pending = {j.name: j for q in self.queues.values() for j in q}
        named = sorted((pending[n].submit_time, n) for n in ps.reclaimers if n in pending)
        for _, name in named:
            j = pending[name]
            if within(self.claimed(j.project_id), j.resources, ps.quota(j.project_id)):
                self._admit(j, same_project=False)

    def _classify(self, p: str, j: JobRequest, q: Mapping[str, float],
                  claimed: dict[str, int]) -> bool | None:
        """None: j goes to the borrowing pass; else whether it needs own lower-priority jobs."""
        ps = self.ps
        head = self.heads.get(p)
        if head is not None:
            self.followers[j.name] = head
            self.lenders[p].append(j)
            return None
        fit = self._fit(p, j, q, claimed)
        if fit is not None:
            return fit
        if j.name == ps.head:
            self.heads[p] = j.name  # later jobs of p must not refill the capacity it waits for
        self.lenders[p].append(j)
        return None

    def _fit(self, p: str, j: JobRequest, q: Mapping[str, float],
             claimed: Mapping[str, int]) -> bool | None:
        """False: within quota; True: within once own lower-priority jobs go; None: not."""
        if within(claimed, j.resources, q):
            return False
        if self.ps.knobs.preempt_within_project:
            lower = self.ps.reclaim.lower_priority_usage(p, j.priority)
            if lower:
                trial = dict(claimed)
                add(trial, lower, -1)
                if within(trial, j.resources, q):
                    return True
        return None

    def _admit(self, j: JobRequest, same_project: bool) -> None:
        ps = self.ps
        p, need = j.project_id, j.resources
        self.admitted.add(j.name)
        cshort = shortfall(need, ps.cap.total)
        if not cshort:
            # It fits free capacity, so it starts (work conserving), even if it then borrows.
            ps.start(j)
            return
        qshort = quota_shortfall(self.claimed(p), need, ps.quota(p)) if same_project else {}
        after = shortfall(cshort, ps.earmark)
        if not after and not qshort:
            self._wait(j, cshort, ("releasing", cshort))
            return
        victims = ps.reclaim.select(j, after, qshort)
        if victims is None:
            self._wait(j, cshort, ("protected", (after, qshort, ps.reclaim.blocked_until)))
            return
        for v in victims:
            add(ps.earmark, v.resources)
        self._wait(j, cshort, ("reclaiming", [v.name for v in victims]))
        for v in victims:
            ps.decide(v, Verdict.PREEMPT, ps.reclaim.reasons[v.name], v.tier, j.name)
        for vp in sorted({v.project_id for v in victims} - {p}):
            self._revisit(vp)

    def _wait(self, j: JobRequest, cshort: Mapping[str, int], why: tuple[str, object]) -> None:
        """Claim what it lacks from releasing capacity, and hold what is free."""
        ps = self.ps
        for r, n in cshort.items():
            ps.earmark[r] = max(0, ps.earmark.get(r, 0) - n)
        got = ps.cap.reserve(j.resources)
        if got:
            ps.reserved[j.name] = got
        add(self.claims.setdefault(j.project_id, {}), j.resources)
        self.claimants.setdefault(j.project_id, j.name)
        ps.waits[j.name] = why

    def _revisit(self, p: str) -> None:
        """p lost jobs to a reclaim: its passed-over jobs may now fit its quota."""
        q = self.ps.quota(p)
        for j in list(self.lenders.get(p, [])):
            if j.name not in self.followers and j.name not in self.admitted:
                fit = self._fit(p, j, q, self.claimed(p))
                if fit is not None:
                    if self.heads.get(p) == j.name:  # now in quota: it blocks nobody
                        del self.heads[p]
                        self.followers = {f: h for f, h in self.followers.items() if h != j.name}
                    self._admit(j, same_project=fit)
        self.lenders[p] = [j for j in self.lenders.get(p, []) if j.name not in self.admitted]
