"""Choosing victims: borrowers only, lowest priority then newest first, then the minimal set.

A job of another project is a candidate only while that project uses more than its quota of
a resource the reclaimer still lacks (so a project within its quota is never preempted for
another), and only after its minimum runtime. Jobs of the reclaimer's own project of lower
priority are candidates only when the `preempt_within_project` knob is on, after borrowers.
As in Kueue, greedy selection is followed by a walk back that drops victims not needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pass_reference.capacity import add, fmt_ratio, fmt_units
from quota.model import JobRequest

if TYPE_CHECKING:
    from pass_reference.engine import _Pass

EPS = 1e-6


REPEATED = 2  # jobs preempted this often already are chosen last, never run as backfill


def _order(j: JobRequest) -> tuple[bool, int, float, str]:
    """Jobs preempted twice already last; then lowest priority (highest number) first,
    then the most recently started."""
    started = j.start_time if j.start_time is not None else float("-inf")
    return (j.preemptions >= REPEATED, -j.priority, -started, j.name)


class Reclaim:
    def __init__(self, ps: _Pass, running: list[JobRequest]) -> None:
        self.ps = ps
        self.cands = sorted(running, key=_order)
        self.eligible = {j.name: ps.eligible(j) for j in running}
        self.chosen: set[str] = set()
        self.reasons: dict[str, str] = {}
        self.blocked_until: float | None = None  # set when a selection fails
        self.lost_to_others: set[str] = set()  # projects that lost jobs to others this pass
        self.by_project: dict[str, list[JobRequest]] = {}
        for j in self.cands:
            self.by_project.setdefault(j.project_id, []).append(j)
        # Per project: its running backfill behind its own waiting jobs. A reclaim by another
        # project does not count it as borrowing (the project's own job takes it back), so
        # victims taken at one instant find their project over quota whatever the order.
        self.own_backfill: dict[str, dict[str, int]] = {}
        self.own_anchors: dict[str, int] = {}  # backfill job -> its own project's anchors
        for a, jobs in sorted(ps.anchored.items()):
            ap = ps.pending_project.get(a, "")
            q, used = ps.quota(ap), dict(ps.usage.get(ap, {}))
            add(used, ps.pending_need.get(a, {}))
            for j in jobs:
                if j.project_id == ap:
                    add(used, j.resources, -1)
            if any(n > q.get(r, 0.0) + EPS for r, n in used.items()):
                continue  # an anchor that its backfill does not bring within quota
            for j in jobs:
                if ps.pending_project.get(a) == j.project_id:
                    n = self.own_anchors.get(j.name, 0)
                    self.own_anchors[j.name] = n + 1
                    if not n:
                        add(self.own_backfill.setdefault(j.project_id, {}), j.resources)

    def anchor_started(self, name: str) -> None:
        """A waiting job started: its own project's backfill for it is ordinary now."""
        for j in self.ps.anchored.get(name, ()):
            n = self.own_anchors.get(j.name, 0)
            if n and self.ps.pending_project.get(name) == j.project_id:
                self._undiscount(j, n - 1)

    def _undiscount(self, j: JobRequest, left: int) -> None:
        self.own_anchors[j.name] = left
        if not left:
            add(self.own_backfill[j.project_id], j.resources, -1)

    def lower_priority_usage(self, project: str, priority: int) -> dict[str, int]:
        """Units of the project's preemptible running jobs of lower priority than `priority`."""
        out: dict[str, int] = {}
        for j in self.by_project.get(project, ()):
            if j.priority > priority and self.eligible[j.name] and j.name not in self.chosen:
                add(out, j.resources)
        return out

    def select(
        self, job: JobRequest, cshort: Mapping[str, int], qshort: Mapping[str, int]
    ) -> list[JobRequest] | None:
        """Victims freeing `cshort` capacity (and `qshort` of the job's own quota), or None."""
        ps = self.ps
        p = job.project_id
        cs, qs = dict(cshort), dict(qshort)
        delta: dict[str, dict[str, int]] = {}
        chosen: list[JobRequest] = []
        self.blocked_until = None
        same_ok = ps.knobs.preempt_within_project
        done = _done(cs, qs)
        # First its backfill: started in capacity held for it, preemptible at once, the
        # smallest loss (units x time run) first, then the newest.
        picked: set[str] = set()
        for c in sorted(
            (
                c
                for c in ps.anchored.get(job.name, ())
                if c.name not in self.chosen and c.name in self.eligible
            ),
            key=self._loss,
        ):
            if done:
                break
            own = c.project_id == p
            if own:
                useful = _uses(c, cs, qs)
            else:
                useful = _uses(c, cs, {}) and self._borrowing_in(
                    c, cs, delta.get(c.project_id, {}), discount=False
                )
            if not useful:
                continue
            chosen.append(c)
            picked.add(c.name)
            _sub(cs, c.resources)
            if own:
                _sub(qs, c.resources)
            else:
                add(delta.setdefault(c.project_id, {}), c.resources)
            done = _done(cs, qs)
        for own in (False, True) if same_ok else (False,):
            if done:
                break
            for c in self.cands:
                if c.name in self.chosen or c.name in picked or (c.project_id == p) != own:
                    continue
                if own:
                    useful = c.priority > job.priority and _uses(c, cs, qs)
                else:
                    useful = self._borrowing_in(c, cs, delta.get(c.project_id, {}))
                if not useful:
                    continue
                if not self.eligible[c.name]:
                    until = (c.start_time or 0.0) + ps.knobs.min_runtime_seconds
                    self.blocked_until = min(self.blocked_until or until, until)
                    continue
                chosen.append(c)
                _sub(cs, c.resources)
                if own:
                    _sub(qs, c.resources)
                else:
                    add(delta.setdefault(c.project_id, {}), c.resources)
                if _done(cs, qs):
                    done = True
                    break
        if not done:
            return None
        _drop_unneeded(chosen, p, cs, qs)
        if len(chosen) > 1 and not qshort:
            fewer = self._fewest(job, cshort)
            if fewer is not None and len(fewer) < len(chosen):
                chosen = fewer
                mine = {c.name for c in self._backfill_of(job)}
                picked = {c.name for c in fewer if c.name in mine}
        self._commit(job, chosen, picked)
        return chosen

    def _backfill_of(self, job: JobRequest) -> list[JobRequest]:
        return [
            c
            for c in self.ps.anchored.get(job.name, ())
            if c.name not in self.chosen and c.name in self.eligible
        ]

    def _fewest(self, job: JobRequest, cshort: Mapping[str, int]) -> list[JobRequest] | None:
        """The same candidates as `select` (the job's backfill, then borrowers past their
        minimum runtime), taken widest first: each time the one that covers the most of what
        is still lacking, ties in select's order. Several small victims where one larger
        would do are so many more preemptions (rule 5 of issue 13), so `select` takes this
        set when it has fewer victims than the one chosen in priority order."""
        p = job.project_id
        cs: dict[str, int] = dict(cshort)
        delta: dict[str, dict[str, int]] = {}
        backfill = sorted(self._backfill_of(job), key=self._loss)
        names = {c.name for c in backfill}
        pool = backfill + [
            c
            for c in self.cands
            if c.name not in self.chosen
            and c.name not in names
            and c.project_id != p
            and self.eligible[c.name]
        ]
        chosen: list[JobRequest] = []
        taken: set[str] = set()
        while not _done(cs, {}):
            best, most = None, 0
            for c in pool:
                if c.name in taken:
                    continue
                cover = sum(
                    min(n, cs[r]) for r, n in c.resources.items() if n > 0 and cs.get(r, 0) > 0
                )
                if cover <= most:
                    continue
                if c.project_id != p and not self._borrowing_in(
                    c, cs, delta.get(c.project_id, {}), discount=c.name not in names
                ):
                    continue
                best, most = c, cover
            if best is None:
                return None
            chosen.append(best)
            taken.add(best.name)
            _sub(cs, best.resources)
            if best.project_id != p:
                add(delta.setdefault(best.project_id, {}), best.resources)
        _drop_unneeded(chosen, p, cs, {})
        return chosen

    def taken(self, name: str) -> bool:
        return name in self.chosen

    def _loss(self, c: JobRequest) -> tuple[float, float, str]:
        ran = max(0.0, self.ps.now - (c.start_time if c.start_time is not None else self.ps.now))
        return (sum(n for n in c.resources.values() if n > 0) * ran, -(c.start_time or 0.0), c.name)

    def _borrowing_in(
        self, c: JobRequest, cs: Mapping[str, int], delta: Mapping[str, int], discount: bool = True
    ) -> bool:
        """c's project uses more than its quota of a resource that c holds and we lack, counting
        its running jobs only (victims of one project at one instant each find it over)."""
        p = c.project_id
        used, q = self.ps.usage.get(p, {}), self.ps.quota(p)
        fresh = self.ps.fresh.get(p, {})  # started in this pass: not running yet
        # its own waiting jobs take these back (not discounted when c is our backfill)
        own = self.own_backfill.get(p, {}) if discount else {}
        return any(
            n > 0
            and cs.get(r, 0) > 0
            and used.get(r, 0) - fresh.get(r, 0) - own.get(r, 0) - delta.get(r, 0)
            > q.get(r, 0.0) + EPS
            for r, n in c.resources.items()
        )

    def _commit(
        self,
        job: JobRequest,
        victims: list[JobRequest],
        backfill: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        ps = self.ps
        p = job.project_id
        q = ps.quota(p)
        after = dict(ps.usage.get(p, {}))
        add(after, job.resources)
        for v in victims:
            vp = v.project_id
            vq = ps.quota(vp)
            before = dict(ps.usage.get(vp, {}))
            if v.name in backfill:
                why = (
                    f"preempted by {job.name} of project {p}: it ran as backfill in "
                    f"capacity held for {job.name} (or behind it), which can start now "
                    f"and needs "
                    f"{fmt_units(job.resources)}; project {vp} at "
                    f"{fmt_ratio(before, vq, v.resources)} of its quota"
                )
            elif vp == p:
                why = (
                    f"preempted by higher-priority {job.name} (priority {job.priority} over "
                    f"{v.priority}) of the same project {p}, which needs "
                    f"{fmt_units(job.resources)}; {p} at "
                    f"{fmt_ratio(before, q, job.resources)} of its quota"
                )
            else:
                why = (
                    f"preempted by {job.name} of project {p}, reclaiming its guaranteed "
                    f"quota: {p} needs {fmt_units(job.resources)} "
                    f"({fmt_ratio(after, q, job.resources)} with it); project {vp} was "
                    f"borrowing ({fmt_ratio(before, vq, v.resources)})"
                )
            self.reasons[v.name] = why
            self.chosen.add(v.name)
            if vp != p:
                self.lost_to_others.add(vp)
            add(ps.proj_usage(vp), v.resources, -1)
            if self.own_anchors.get(v.name):  # gone: no longer discounted
                self._undiscount(v, 0)


def _drop_unneeded(
    chosen: list[JobRequest], p: str, cs: dict[str, int], qs: dict[str, int]
) -> None:
    """Kueue's walk back: drop, latest chosen first, the victims not needed after all."""
    for c in reversed(list(chosen)):
        own = c.project_id == p
        if all(cs[r] + c.resources.get(r, 0) <= 0 for r in cs) and (
            not own or all(qs[r] + c.resources.get(r, 0) <= 0 for r in qs)
        ):
            chosen.remove(c)
            _sub(cs, c.resources, -1)
            if own:
                _sub(qs, c.resources, -1)


def _done(cs: Mapping[str, int], qs: Mapping[str, int]) -> bool:
    return all(n <= 0 for n in cs.values()) and all(n <= 0 for n in qs.values())


def _uses(c: JobRequest, cs: Mapping[str, int], qs: Mapping[str, int]) -> bool:
    return any(n > 0 and (cs.get(r, 0) > 0 or qs.get(r, 0) > 0) for r, n in c.resources.items())


def _sub(acc: dict[str, int], res: Mapping[str, int], sign: int = 1) -> None:
    for r in acc:
        acc[r] -= sign * res.get(r, 0)
