"""Step 8 of a pass: a WAIT decision for every pending job left, with its place in its queue.

Most of 50,000 waiting jobs wait for capacity, or behind their project's aged head or first
claim; their decisions, whose texts jobs of the same shape share but for the position, are
made only when read (`LazyWaits`, asked by model.Decisions), from the final state of the
pass: exactly what making them in the pass gave.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from itertools import groupby
from operator import attrgetter

from quota.capacity import add
from quota.model import Decision, JobRequest, Verdict
from quota.passview import PassView
from quota.reasons import behind_reason, full_reason, stable_wait, wait_reason
from quota.reclaim import REPEATED


def finish_waits(ps: PassView, queues: dict[str, list[JobRequest]]) -> None:
    """A WAIT decision for every pending job left, with its position in its project.

    ps.order lists each project's waiting jobs in queue order (a job's position is its
    index there). The jobs whose wait was set in the pass (claims, holds, marks made while
    lending) get their decision now; the others only on reading (see LazyWaits)."""
    for got in ps.reserved.values():
        add(ps.held_total, got)
    decisions, waits, order = ps.decisions, ps.waits, ps.order
    new, wait_verdict = tuple.__new__, Verdict.WAIT
    for p, queue in queues.items():
        names = [n for j in queue if (n := j.name) not in decisions]
        if not names:
            continue
        order[p] = names
        if not waits or waits.keys().isdisjoint(names):
            continue
        q, used = ps.quota(p), ps.usage.get(p, {})
        ahead = -1
        for j in queue:
            name = j.name
            if name in decisions:
                continue
            ahead += 1
            if name not in waits:
                continue
            why = wait_reason(ps, j, ahead, q, used)
            # (Decision is a named tuple: made directly, it costs a tenth of a call)
            decisions[name] = new(
                Decision, (name, wait_verdict, why, None, None, (), stable_wait(ps, j), ahead)
            )


class LazyWaits:
    """The WAIT decisions that finish_waits leaves to be made on reading (model.Decisions
    asks for them): from the final state of the pass, exactly what making them in the pass
    gave, the text of each shape of job formatted once."""

    def __init__(self, ps: PassView) -> None:
        self.ps = ps
        self.first = ps.first
        self._jobs: dict[str, JobRequest] | None = None
        self._pos: dict[str, dict[str, int]] = {}  # project -> job -> position
        self._tail: dict[str, int] = {}  # project -> position of its tail_from job
        self._stable: dict[tuple, str] = {}  # shape -> stable text
        self._uses: dict[tuple[str, tuple], bool] = {}  # see _behind

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

    def by_wait(self, made: Mapping[str, Decision]) -> dict[str | None, list[str]]:
        """Every job of the pass by its stable wait text (None: it does not wait; no order
        within a text is promised): ``made`` holds the decisions made in the pass; every
        other job waits, in its project's order (``ps.order``), with the text of its shape.
        A project whose queue's jobs share one resources mapping (the daemon interns them: a
        sweep's jobs do) gives its whole order to that text at once, so 100,000 waiting jobs
        of a sweep are not looked at one by one (0.03 s of each pass, where the jobs lie
        scattered in a daemon's memory); the others are gathered by mapping, the text
        formatted once per mapping, through its shape."""
        wait, ps = Verdict.WAIT, self.ps
        groups: dict[str | None, list[str]] = {}
        for name, d in made.items():
            text = (d.wait or d.reason) if d.verdict is wait else None
            groups.setdefault(text, []).append(name)
        for p, names in ps.order.items():
            queue = ps.queues[p]
            if _one_shape(queue):
                if not made.keys().isdisjoint(names):
                    names = [n for n in names if n not in made]
                one = next((j for j in queue if j.name not in made), None)
                if one is not None:
                    groups.setdefault(self.stable(one), []).extend(names)
                continue
            by_mapping: dict[int, list[str]] = {}  # (the mappings live as long as ps.jobs)
            for j in queue:
                if j.name in made:
                    continue
                names = by_mapping.get(id(j.resources))
                if names is None:
                    names = by_mapping[id(j.resources)] = groups.setdefault(self.stable(j), [])
                names.append(j.name)
        return groups

    def decision(self, name: str) -> Decision:
        j = self.job(name)
        if j is None:
            raise KeyError(name)
        return self._decide(j, self._positions(j.project_id)[name])

    def leading(self, p: str, names: Sequence[str], made: Mapping[str, Decision]) -> list[Decision]:
        """The decisions of ``names``, the first waiting jobs of p's queue in order: their
        positions are their indexes, their requests are found walking p's queue, so the maps of
        every job and every position that reading one decision builds are not (at 100,000
        waiting jobs, 0.02 s of each pass, for the queue summary's first 50 reasons)."""
        queue = iter(self.ps.queues.get(p, ()))
        out = []
        for ahead, name in enumerate(names):
            d = made.get(name)
            if d is None:  # (names come in queue order: the walk goes on from the last one)
                j = next((j for j in queue if j.name == name), None)
                if j is None:
                    raise KeyError(name)
                d = self._decide(j, ahead)
            out.append(d)
        return out

    def _decide(self, j: JobRequest, ahead: int) -> Decision:
        """The WAIT decision of j, ``ahead`` jobs behind the first of its project's queue."""
        ps, p = self.ps, j.project_id
        head = self._behind(j, p) if ahead >= self._tail_at(p) else None
        if head is None:
            text = full_reason(ps, j, ps.usage.get(p, {}), ps.quota(p))
        else:
            text = behind_reason(ps, head, p)
        return Decision(
            j.name,
            Verdict.WAIT,
            f"{text}; {ahead} job{'' if ahead == 1 else 's'} ahead in {p}",
            wait=self.stable(j),
            ahead=ahead,
        )

    def _positions(self, p: str) -> dict[str, int]:
        """Each waiting job's position in p's queue."""
        pos = self._pos.get(p)
        if pos is None:
            pos = self._pos[p] = {n: i for i, n in enumerate(self.ps.order.get(p, ()))}
        return pos

    def _tail_at(self, p: str) -> int:
        """The position in p's queue from which on its waiting jobs get marks (see
        ps.tail_from); without a tail job, the queue's length: no job."""
        at = self._tail.get(p)
        if at is None:
            names = self.ps.order.get(p, [])
            tail = self.ps.tail_from.get(p)
            at = len(names)
            if tail is not None and self.first is not None:
                with contextlib.suppress(ValueError):  # (a search in C: no map of positions)
                    at = names.index(tail)
            self._tail[p] = at
        return at

    def _behind(self, j: JobRequest, p: str) -> str | None:
        """What the lending step would have marked j behind: its project's aged head, else
        its project's first job that waits on a reclaim (None: it waits for capacity)."""
        if j.preemptions >= REPEATED:
            return None
        first = self.first
        assert first is not None
        head = first.followers.get(j.name)
        if head is None or head in self.ps.started:
            head = None
            claim = first.claims.get(p)
            if claim:
                key = (p, tuple(j.resources.items()))
                u = self._uses.get(key)
                if u is None:
                    u = self._uses[key] = any(n > 0 and r in claim for r, n in j.resources.items())
                if u:
                    head = first.claim_names[p][0]
        return head


def _one_shape(jobs: Sequence[JobRequest]) -> bool:
    """Whether all ``jobs`` share one resources mapping (one run of one id, found in C)."""
    runs = groupby(map(id, map(attrgetter("resources"), jobs)))
    return next(runs, None) is not None and next(runs, None) is None
