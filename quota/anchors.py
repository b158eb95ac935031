"""Step 3 of a pass: which running backfill jobs a waiting job may still take back at once.

A running job started as backfill names the waiting jobs whose held capacity it took
(JobRequest.backfill_for). A mark counts only while that job is still pending, valid, and has
been waiting since before the backfill started (`pending_since` proves it): marks naming
jobs that have since started, left, or came back later count for nothing. A waiting job then
keeps its claim on its own project's backfill only if it would get what that backfill frees
(`drop_overtaken`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quota.capacity import add
from quota.model import JobRequest, Phase
from quota.passview import PassView
from quota.within import within


def anchor_backfill(
    ps: PassView, held: Sequence[JobRequest], pending: Sequence[JobRequest]
) -> None:
    """Fill ps.anchored (waiting job -> its running backfill), ps.pending_project and
    ps.pending_need from the marks that still count (rejected jobs anchor nothing)."""
    running = [j for j in held if j.phase is Phase.RUNNING and j.backfill_for]
    if not running:
        return  # (no mark at all: the usual case, and no walk of every pending job)
    named = {a for j in running for a in j.backfill_for}
    decided = ps.decisions
    by_name = {j.name: j for j in pending if j.name in named and j.name not in decided}
    for j in running:
        for a in j.backfill_for:
            w = by_name.get(a)
            if w is None:
                continue
            since = w.submit_time if w.pending_since is None else w.pending_since
            if j.start_time is None or since <= j.start_time:
                ps.anchored.setdefault(a, []).append(j)
                ps.pending_project[a] = w.project_id
                ps.pending_need[a] = w.resources


def drop_overtaken(ps: PassView, queues: Mapping[str, list[JobRequest]]) -> None:
    """Drop a waiting job's claim on its own project's backfill when the jobs ahead of it
    in its project's queue would take the quota that backfill frees: taken in queue order,
    each that fits the project's usage without that backfill (plus those before it) is
    counted in, and if the waiting job no longer fits after them, what its backfill frees
    would go to them in the next pass, and preempting it would be in vain. Those backfill
    jobs are ordinary running jobs for it then (other projects' reclaims count them as
    borrowing, if they are)."""
    own: dict[str, list[str]] = {}
    for a, jobs in ps.anchored.items():
        p = ps.pending_project[a]
        if any(b.project_id == p for b in jobs):
            own.setdefault(p, []).append(a)
    for p, names in sorted(own.items()):
        q, used = ps.quota(p), ps.usage.get(p, {})
        left = set(names)
        ahead: list[tuple[tuple, Mapping[str, int]]] = []
        for j in queues.get(p, ()):
            if not left:
                break
            if j.name in left:
                left.discard(j.name)
                if not _fits_after(ps, j, p, used, q, ahead):
                    kept = [b for b in ps.anchored[j.name] if b.project_id != p]
                    if kept:
                        ps.anchored[j.name] = kept
                    else:
                        del ps.anchored[j.name]
            ahead.append((tuple(j.resources.items()), j.resources))


def _fits_after(
    ps: PassView,
    j: JobRequest,
    p: str,
    used: Mapping[str, int],
    q: Mapping[str, float],
    ahead: Sequence[tuple[tuple, Mapping[str, int]]],
) -> bool:
    """Whether j still fits p's quota once its own backfill is gone and the jobs ahead of it
    that fit (in queue order) have taken their share."""
    trial = dict(used)
    for b in ps.anchored[j.name]:
        if b.project_id == p:
            add(trial, b.resources, -1)
    nofit: set[tuple] = set()  # (usage only grows: such jobs never fit)
    for shape, k in ahead:
        if shape not in nofit:
            if within(trial, k, q):
                add(trial, k)
            else:
                nofit.add(shape)
    return within(trial, j.resources, q)
