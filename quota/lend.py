"""Step 7 of a pass: lend what the within-quota step left, project by project (AXLearn's order).

Borrowers take turns, the project that would be least over its quota first. A job that would
wait behind a job of its project (the aged head, or a within-quota job waiting on a reclaim)
starts as backfill for those jobs; one that fits only in capacity held for a job waiting on
protected borrowers starts as backfill there (see quota/engine.py). Once no job left fits
what is free, the order is moot and the rest are passed over in bulk.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from quota.capacity import least_need, shortfall
from quota.model import JobRequest
from quota.passview import PassView
from quota.reclaim import REPEATED
from quota.within import Within, within

_NONE = ("", None)
# Waits whose held capacity may be lent as backfill: the job cannot start before borrowers
# become preemptible, or before its reclaim delay is over.
_LENDS = frozenset({"protected", "delayed"})


class Lending:
    """The lending step over one pass (`ps`), after its within-quota step (`first`)."""

    def __init__(self, ps: PassView, first: Within) -> None:
        self.ps = ps
        self.first = first

    def run(self) -> bool:
        """Borrowers in turn. True when it stopped early with every job left unable to start:
        the "behind" marks of the jobs not walked are then made on reading (ps.tail_from)."""
        ps, first = self.ps, self.first
        lists = self._borrower_lists()
        heap = [(*self._lend_key(p, lst[0]), p, 0) for p, lst in lists.items() if lst]
        heapq.heapify(heap)
        total = ps.cap.total
        least: dict[str, int] | None = None
        while heap:
            *_, p, i = heapq.heappop(heap)
            self._lend_one(p, lists[p][i])
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
                if not ps.reserved and (
                    (least and any(total.get(r, 0) < n for r, n in least.items()))
                    or (not least and not ps.zero_need and not any(n > 0 for n in total.values()))
                ):
                    # Every job left needs more of some r than is free, and none can start in
                    # held capacity: only the marks of jobs waiting behind their project's
                    # head or claims are left to set.
                    # finish_waits sets them as it walks the queues anyway.
                    for *_, q, k in rest:
                        if k < len(lists[q]) and (q in first.heads or first.claims.get(q)):
                            ps.tail_from[q] = lists[q][k].name
                    return True
                for *_, q, k in rest:
                    for j in lists[q][k:]:
                        self._lend_one(q, j)
                return False
            if i + 1 < len(lists[p]):
                heapq.heappush(heap, (*self._lend_key(p, lists[p][i + 1]), p, i + 1))
        return False

    def _borrower_lists(self) -> dict[str, list[JobRequest]]:
        """Each project's jobs the within-quota step passed over and left undecided, in
        queue order."""
        done, waits, first = self.ps.decisions, self.ps.waits, self.first
        lists = {}
        for p, lst in first.lenders.items():
            lst = [j for j in lst if j.name not in done and j.name not in waits]
            if p in first.unsorted:
                rank = first.rank_in(p)
                lst.sort(key=lambda j: rank[j.name])
            lists[p] = lst
        return lists

    def _lend_one(self, p: str, j: JobRequest) -> None:
        ps, first = self.ps, self.first
        if j.name in ps.decisions or j.name in ps.waits:
            return  # admitted within quota once its project's head started
        anchors = self._anchors(p, j)  # waiting jobs it runs as backfill for, if it starts
        total = ps.cap.total
        for r, n in j.resources.items():  # (inline: this runs for every waiting job)
            if n > total.get(r, 0):
                fits = False
                break
        else:
            fits = True
        if fits:
            ps.start(j, tuple(sorted(set(anchors))))
            if first.heads.get(p) == j.name:
                first.unblock(p)
            return
        if ps.reserved and j.preemptions < REPEATED and self._backfill_held(p, j, anchors):
            return
        if anchors:
            ps.waits[j.name] = ("behind", anchors[0])
        # else it waits for capacity: the default reason, written by finish_waits

    def _anchors(self, p: str, j: JobRequest) -> list[str]:
        """The waiting jobs of j's project that j, if it starts, runs as backfill for."""
        first = self.first
        anchors: list[str] = []
        head = first.followers.get(j.name)
        if head is not None and head not in self.ps.started:
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
        return anchors

    def _least_need(self, lists: Mapping[str, list[JobRequest]]) -> dict[str, int]:
        """For each resource every job needs, the smallest amount any of them needs (a
        valid job needs only resources of the pool)."""
        return least_need([j.resources for lst in lists.values() for j in lst], self.ps.pool)

    def _backfill_held(self, p: str, j: JobRequest, anchors: list[str]) -> bool:
        """Start j in capacity held for waiting jobs (its own project's, or any when j
        borrows: a project within its quota is never preempted for another), as their
        backfill, only from jobs that wait for protected borrowers (one whose reclaim is
        under way keeps what it holds). The most recently held capacity is taken first."""
        ps = self.ps
        takes = self._held_takes(p, j)
        if takes is None:
            return False
        for a, take in takes:
            ps.cap.unreserve(a, take)
            got = ps.reserved[a]
            for r, n in take.items():
                got[r] -= n
            ps.reserved[a] = {r: n for r, n in got.items() if n > 0}
            if not ps.reserved[a]:
                del ps.reserved[a]
            anchors.append(a)
        ps.start(j, tuple(sorted(set(anchors))))
        return True

    def _held_takes(self, p: str, j: JobRequest) -> list[tuple[str, dict[str, int]]] | None:
        """What j would take of each hold it may use (most recent first), or None if the
        free and held capacity it may use together do not cover it."""
        ps = self.ps
        need = j.resources
        total = ps.cap.total
        rank = self.first.rank_in(p).__getitem__
        borrowing = not within(ps.usage.get(p, {}), need, ps.quota(p))
        have = {r: total.get(r, 0) for r in need}
        takes: list[tuple[str, dict[str, int]]] = []
        lack = shortfall(need, have)
        for a in reversed(list(ps.reserved)):
            if not lack:
                break
            own = ps.pending_project.get(a) == p
            if (
                (not borrowing and not own)
                or ps.waits.get(a, _NONE)[0] not in _LENDS
                or (own and rank(a) > rank(j.name))
            ):
                continue  # (a job whose reclaim is under way keeps what it holds; nobody
                # backfills behind a job of its own project that comes after it)
            got = ps.reserved[a]
            take = {r: min(n, got.get(r, 0)) for r, n in lack.items() if got.get(r, 0) > 0}
            if take:
                takes.append((a, take))
                lack = shortfall(lack, take)
        return None if lack else takes

    def _lend_key(self, p: str, j: JobRequest) -> tuple[float, float, float]:
        """AXLearn's order: the project that would be least over its quota goes first.

        (Putting long-waiting jobs first was tried in the simulator: requeued victims, old by
        submission, restarted first and were preempted again, more often.)"""
        used, q = self.ps.usage.get(p, {}), self.ps.quota(p)
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
