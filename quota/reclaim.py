"""Choosing victims: borrowers only, lowest priority then least work lost (most recent
checkpoint, else newest) first, then the minimal set.

A job of another project is a candidate only while that project uses more than its quota of
a resource the reclaimer still lacks (so a project within its quota is never preempted for
another), and only after its minimum runtime. Jobs of the reclaimer's own project of lower
priority are candidates only when the `preempt_within_project` knob is on, after borrowers.
As in Kueue, greedy selection is followed by a walk back that drops victims not needed.
When that leaves several victims, the same candidates taken widest first (most of what is
still lacking covered by each) are taken instead if they are fewer: every preemption counts
(issue 13, rule 5), and one large borrower often frees what four small ones would.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from quota.capacity import EPS, add, fmt_ratio, fmt_units
from quota.model import JobRequest, Phase
from quota.passview import PassView

REPEATED = 2  # jobs preempted this often already are chosen last, never run as backfill


def unsaved_since(j: JobRequest) -> float | None:
    """Since when a running job's work would be lost if it stopped now: its last reported
    checkpoint, or its start when it has reported none since (a checkpoint from before this
    attempt saved nothing of it). None: neither is known."""
    c, s = j.last_checkpoint, j.start_time
    if c is None or (s is not None and c < s):
        return s
    return c


def victim_order(now: float) -> Callable[[JobRequest], tuple[bool, int, float, float, str]]:
    """Candidates in the order they are taken: jobs preempted twice already last; then
    lowest priority (highest number) first; among equals the one that loses the least work
    (the most recent checkpoint, issue 25; a job that never checkpointed counts from its
    start, so without checkpoints this is Kueue's most recently started first), then the
    most recently started. Measured on bench_fairness.py's 15 traces, every job
    checkpointing every 10 min at a random phase: 46.5 accelerator-hours lost to preemption
    with this preference, 61.1 without (newest first)."""

    def key(j: JobRequest) -> tuple[bool, int, float, float, str]:
        since = unsaved_since(j)
        unsaved = max(0.0, now - since) if since is not None else float("inf")
        started = j.start_time if j.start_time is not None else float("-inf")
        return (j.preemptions >= REPEATED, -j.priority, unsaved, -started, j.name)

    return key


def first_to_go(
    jobs: Sequence[JobRequest],
    usage: Mapping[str, Mapping[str, float]],
    quotas: Mapping[str, Mapping[str, float]],
    now: float,
) -> dict[str, list[str]]:
    """Per project over its quota: the running jobs a reclaim would take first (in
    ``victim_order``), as many as cover what the project borrows. The label a job got when it
    started ("within quota" or "borrowing idle capacity") goes stale as the project's other
    jobs start and end; this says which ones would go now (issue 27)."""
    running: dict[str, list[JobRequest]] = {}
    for j in jobs:
        if j.phase is Phase.RUNNING:
            running.setdefault(j.project_id, []).append(j)
    out: dict[str, list[str]] = {}
    for p, candidates in sorted(running.items()):
        quota = quotas.get(p, {})
        over = {r: n - quota.get(r, 0.0) for r, n in usage.get(p, {}).items()}
        over = {r: n for r, n in over.items() if n > EPS}
        names: list[str] = []
        for j in sorted(candidates, key=victim_order(now)):
            if not over:
                break
            if not any(r in over for r in j.resources):
                continue
            names.append(j.name)
            for r, n in j.resources.items():
                if r in over and (over[r] - n) <= EPS:
                    del over[r]
                elif r in over:
                    over[r] -= n
        if names:
            out[p] = names
    return out


class Reclaim:
    def __init__(self, ps: PassView, running: list[JobRequest]) -> None:
        self.ps = ps
        self.cands = sorted(running, key=victim_order(ps.now))
        # job -> (project, request): alike candidates are alike borrowers (see select)
        self.shapes = {j.name: (j.project_id, tuple(j.resources.items())) for j in running}
        self.eligible = {j.name: ps.eligible(j) for j in running}
        self.chosen: set[str] = set()
        self.reasons: dict[str, str] = {}
        self.blocked_until: float | None = None  # set when a selection fails
        self.lost_to_others: set[str] = set()  # projects that lost jobs to others this pass
        self._sizes: dict[str, list[tuple[int, int]]] | None = None  # see _one
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
        """Victims freeing `cshort` capacity (and `qshort` of the job's own quota), or None.

        1. The job's own backfill, preemptible at once; 2. borrowers of other projects in
        `victim_order` (then, with `preempt_within_project`, its own project's lower-priority jobs);
        3. Kueue's walk back drops the victims not needed after all; 4. the candidates taken
        widest first, when that needs fewer victims."""
        self.blocked_until = None
        pick = _Picking(job.project_id, dict(cshort), dict(qshort))
        self._take_backfill(job, pick)
        self._take_running(job, pick)
        if not pick.done:
            return None
        chosen, picked = pick.chosen, pick.picked
        _drop_unneeded(chosen, pick.project, pick.cs, pick.qs)
        if len(chosen) > 1 and not qshort:
            fewer = self._fewest(job, cshort)
            if fewer is not None and len(fewer) < len(chosen):
                chosen = fewer
                mine = {c.name for c in self._backfill_of(job)}
                picked = {c.name for c in fewer if c.name in mine}
        self._commit(job, chosen, picked)
        return chosen

    def _take_backfill(self, job: JobRequest, pick: _Picking) -> None:
        """Step 1: the backfill started in capacity held for the job, preemptible at once,
        the smallest loss (units x unsaved time, see _loss) first, then the newest; a job of
        another project only while that project borrows what we lack."""
        cs, qs = pick.cs, pick.qs
        for c in sorted(self._backfill_of(job), key=self._loss):
            if pick.done:
                break
            if c.project_id == pick.project:
                useful = _uses(c, cs, qs)
            else:
                useful = _uses(c, cs, {}) and self._borrowing_in(
                    c, cs, pick.delta.get(c.project_id, {}), discount=False
                )
            if useful:
                pick.take(c)
                pick.picked.add(c.name)

    def _take_running(self, job: JobRequest, pick: _Picking) -> None:
        """Step 2: other projects' borrowers past their minimum runtime (those still inside
        it set `blocked_until`), then, when the knob allows, the job's own project's jobs of
        lower priority."""
        p = pick.project
        # (project, request) -> whether such a job is a borrower useful to us; cleared when
        # a victim changes what we lack (every running job is a candidate of every reclaim)
        borrowing: dict[tuple, bool] = {}
        for own in (False, True) if self.ps.knobs.preempt_within_project else (False,):
            if pick.done:
                return
            for c in self.cands:
                if c.name in self.chosen or c.name in pick.picked or (c.project_id == p) != own:
                    continue
                if own:
                    useful = c.priority > job.priority and _uses(c, pick.cs, pick.qs)
                else:
                    key = self.shapes[c.name]
                    useful = borrowing.get(key)
                    if useful is None:
                        useful = borrowing[key] = self._borrowing_in(
                            c, pick.cs, pick.delta.get(c.project_id, {})
                        )
                if not useful:
                    continue
                if not self.eligible[c.name]:
                    until = (c.start_time or 0.0) + self.ps.knobs.min_runtime_seconds
                    self.blocked_until = min(self.blocked_until or until, until)
                    continue
                pick.take(c)
                borrowing.clear()
                if pick.done:
                    break

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
        one = self._one(p, cs, backfill, names)
        if one is not None:
            return [one]
        # Candidates alike (project, request) differ only in their order: one group each,
        # its members in select's order (every running job is a candidate of every reclaim).
        groups: dict[tuple, list[tuple[int, JobRequest]]] = {}
        for i, c in enumerate(backfill):
            groups[(True, c.name)] = [(i - len(backfill), c)]
        for i, c in enumerate(self.cands):
            if (
                c.project_id != p
                and c.name not in self.chosen
                and c.name not in names
                and self.eligible[c.name]
            ):
                groups.setdefault((False, c.project_id, tuple(c.resources.items())), []).append(
                    (i, c)
                )
        lists = [lst[::-1] for lst in groups.values()]  # (pop() takes the first)
        chosen: list[JobRequest] = []
        while not _done(cs, {}):
            best, most, first = -1, 0, 0
            for k, lst in enumerate(lists):
                if not lst:
                    continue
                i, c = lst[-1]
                cover = sum(
                    min(n, cs[r]) for r, n in c.resources.items() if n > 0 and cs.get(r, 0) > 0
                )
                if cover < most or (cover == most and (cover == 0 or i > first)):
                    continue
                if c.project_id != p and not self._borrowing_in(
                    c, cs, delta.get(c.project_id, {}), discount=c.name not in names
                ):
                    continue
                best, most, first = k, cover, i
            if best < 0:
                return None
            c = lists[best].pop()[1]
            chosen.append(c)
            _sub(cs, c.resources)
            if c.project_id != p:
                add(delta.setdefault(c.project_id, {}), c.resources)
        _drop_unneeded(chosen, p, cs, {})
        return chosen

    def _one(
        self, p: str, cs: Mapping[str, int], backfill: list[JobRequest], names: set[str]
    ) -> JobRequest | None:
        """The first candidate (in _fewest's order) that frees all of `cs` alone, if any: what
        _fewest's first step takes then, found through the candidates' sizes (most reclaims
        that need several victims in priority order need one larger victim only)."""
        need = [(r, n) for r, n in cs.items() if n > 0]
        for c in backfill:
            if all(c.resources.get(r, 0) >= n for r, n in need) and (
                c.project_id == p or self._borrowing_in(c, cs, {}, discount=False)
            ):
                return c
        if not need:
            return None
        if self._sizes is None:  # per resource: (-units, position in cands), largest first
            self._sizes = {}
            for i, c in enumerate(self.cands):
                for r, n in c.resources.items():
                    if n > 0:
                        self._sizes.setdefault(r, []).append((-n, i))
            for lst in self._sizes.values():
                lst.sort()
        r0, n0 = max(need, key=lambda rn: rn[1])
        sizes = self._sizes.get(r0, [])
        big = bisect.bisect_right(sizes, (-n0, len(self.cands)))  # those with >= n0 of r0
        hits = sorted(i for _, i in sizes[:big])
        for i in hits:
            c = self.cands[i]
            if (
                c.project_id != p
                and c.name not in self.chosen
                and c.name not in names
                and self.eligible[c.name]
                and all(c.resources.get(r, 0) >= n for r, n in need)
                and self._borrowing_in(c, cs, {})
            ):
                return c
        return None

    def taken(self, name: str) -> bool:
        return name in self.chosen

    def _loss(self, c: JobRequest) -> tuple[float, float, str]:
        """Backfill victims, smallest loss first: units x work since the last checkpoint (or
        the start: units x time run), then the newest."""
        since = unsaved_since(c)
        lost = max(0.0, self.ps.now - (since if since is not None else self.ps.now))
        return (
            sum(n for n in c.resources.values() if n > 0) * lost,
            -(c.start_time or 0.0),
            c.name,
        )

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


@dataclass
class _Picking:
    """Victims chosen so far for one reclaim, and what is still lacking."""

    project: str  # the reclaimer's
    cs: dict[str, int]  # capacity still lacking
    qs: dict[str, int]  # the reclaimer's own quota still lacking
    chosen: list[JobRequest] = field(default_factory=list)
    picked: set[str] = field(default_factory=set)  # its backfill among them
    delta: dict[str, dict[str, int]] = field(default_factory=dict)  # taken from other projects
    done: bool = False

    def __post_init__(self) -> None:
        self.done = _done(self.cs, self.qs)

    def take(self, c: JobRequest) -> None:
        self.chosen.append(c)
        _sub(self.cs, c.resources)
        if c.project_id == self.project:
            _sub(self.qs, c.resources)
        else:
            add(self.delta.setdefault(c.project_id, {}), c.resources)
        self.done = _done(self.cs, self.qs)


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
