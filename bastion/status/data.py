"""The status page's data (also written as ``ROOT/status/status.json``): pure functions of the
jobs, the queue summary the policy pass publishes, the usage ledger's attempts and the time.

Everything here is bounded, whatever the number of jobs: each project's queue shows its first
QUEUE_SHOWN jobs and counts the rest, the running list and recent endings are capped, and the
plot has a fixed number of points; so a page of 10,000 waiting jobs stays small and quick.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bastion.jobspec import JobSpec
from bastion.jobstate import JobState, Status
from bastion.usage.report import Attempt, summarize

Job = tuple[str, JobSpec | None, JobState]
Link = Callable[[str], str]  # a job's name -> the link to its log (the store knows where)
QUEUE_SHOWN = 50  # waiting jobs listed per project; the rest are counted
RUNNING_SHOWN = 200  # by project, longest-running first; the rest are counted
RECENT_SHOWN = 100  # preemptions and failures of the last day
PLOT_POINTS = 96  # one per 15 minutes over the last day
DAY, WEEK = 86400.0, 7 * 86400.0
LIVE = (Status.ACTIVE, Status.CANCELLING, Status.CLEANING)  # the running list's statuses
TEXT_CHARS = 300  # of a reason on the page (`bastion why NAME` has the whole story)


def _short(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= TEXT_CHARS else line[: TEXT_CHARS - 1] + "…"


def _who(spec: JobSpec | None) -> tuple[str, str, dict[str, int]]:
    if spec is None:
        return "?", "?", {}
    meta = spec.metadata
    return meta.project_id, meta.user_id, dict(meta.resources)


def pool_rows(queue: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Each project's quota, use, borrowed (use beyond quota) and lent (its idle quota that
    others' borrowing occupies, shared out in proportion to idle quota), per resource."""
    projects = (queue or {}).get("projects") or {}
    rows = []
    for p in sorted(projects):
        quota, usage = projects[p].get("quota") or {}, projects[p].get("usage") or {}
        waiting = int(projects[p].get("waiting") or 0)
        rows.append({"project": p, "quota": quota, "usage": usage, "waiting": waiting, "lent": {}})
    resources = sorted({r for row in rows for r in (*row["quota"], *row["usage"])})
    for row in rows:
        row["borrowed"] = {
            r: max(0.0, row["usage"].get(r, 0) - row["quota"].get(r, 0)) for r in resources
        }
        row["idle"] = {
            r: max(0.0, row["quota"].get(r, 0) - row["usage"].get(r, 0)) for r in resources
        }
    for r in resources:
        borrowed = sum(row["borrowed"][r] for row in rows)
        idle = sum(row["idle"][r] for row in rows)
        share = min(1.0, borrowed / idle) if idle else 0.0
        for row in rows:
            row["lent"][r] = row["idle"][r] * share
    for row in rows:
        row.pop("idle")
    return rows


def queue_rows(
    jobs: Sequence[Job], queue: Mapping[str, Any] | None, link: Link
) -> list[dict[str, Any]]:
    """Each project's waiting jobs in queue order with their position and one-line why."""
    pending = {name: (spec, state) for name, spec, state in jobs if state.status is Status.PENDING}
    summary = (queue or {}).get("projects") or {}
    by_project: dict[str, list[str]] = {}
    for name, (spec, _state) in pending.items():
        by_project.setdefault(_who(spec)[0], []).append(name)
    out = []
    for project in sorted(set(by_project) | {p for p in summary if summary[p].get("waiting")}):
        facts = summary.get(project) or {}
        order = [n for n in facts.get("order") or [] if n in pending]
        ordered = set(order)  # jobs the summary has not ordered yet (new, or past its 1,000)
        rest = [n for n in by_project.get(project, []) if n not in ordered]
        count = len(order) + len(rest)
        # the oldest of the rest, as many as are shown (not a sort of a 100,000-job queue)
        order += heapq.nsmallest(max(0, QUEUE_SHOWN - len(order)), rest, key=submitted(pending))
        reasons = facts.get("reasons") or {}
        shown = []
        for position, name in enumerate(order[:QUEUE_SHOWN], start=1):
            spec, state = pending[name]
            _, user, resources = _who(spec)
            why = reasons.get(name) or state.reason or "waiting for the next policy pass"
            shown.append(
                {
                    "position": position,
                    "name": name,
                    "user": user,
                    "resources": resources,
                    "why": _short(why),
                    "log": link(name),
                }
            )
        waiting = max(int(facts.get("waiting") or 0), count)
        out.append(
            {"project": project, "waiting": waiting, "jobs": shown, "more": waiting - len(shown)}
        )
    return out


def submitted(pending: Mapping[str, tuple[JobSpec | None, JobState]]) -> Callable[[str], float]:
    """A waiting job's name -> when the daemon first saw it (its place among the unordered)."""
    return lambda name: pending[name][1].submit_time or 0


def running_rows(jobs: Sequence[Job], link: Link, now: float) -> list[dict[str, Any]]:
    """Admitted jobs: runner, workers' health, how long they have run, time left to stop."""
    rows = []
    for name, spec, state in jobs:
        if state.status not in LIVE:
            continue
        project, user, resources = _who(spec)
        record = state.run_attempt or state.cleanup_attempt
        stop = state.stop
        left = stop.deadline - now if stop is not None else None
        rows.append(
            {
                "name": name,
                "project": project,
                "user": user,
                "resources": resources,
                "status": state.display_status,
                "runner": record.kind if record is not None else "",
                "workers": " ".join(record.workers or ()) if record is not None else "",
                "tier": state.tier,
                "running_for": now - float(state.start_time) if state.start_time else 0.0,
                "time_left": max(0.0, left) if left is not None else None,
                "stopping": str(stop.kind) if stop is not None else None,
                "reason": _short(state.reason),
                "log": link(name),
            }
        )
    rows.sort(key=lambda r: (r["project"], -r["running_for"], r["name"]))
    return rows[:RUNNING_SHOWN]


def recent_rows(
    attempts: Iterable[Attempt],
    finished: Iterable[Mapping[str, Any]],
    link: Link,
    now: float,
) -> list[dict[str, Any]]:
    """Preemptions and failures of the last day, newest first: attempts from the ledger, and
    jobs that ended with no attempt (a rejected spec) as the daemon saw them end."""
    rows = []
    for a in attempts:
        if a.end is None or now - a.end > DAY or not (a.preempted or a.outcome == "FAILED"):
            continue
        rows.append(
            {
                "name": a.job,
                "project": a.project,
                "user": a.user,
                "what": "PREEMPTED" if a.preempted else str(a.outcome),
                "time": a.end,
                "reason": _short(a.reason),
            }
        )
    seen = {(r["name"], r["time"]) for r in rows}
    for f in finished:
        if now - float(f["time"]) <= DAY and (f["name"], f["time"]) not in seen:
            rows.append({k: f[k] for k in ("name", "project", "user", "what", "time")})
            rows[-1]["reason"] = _short(str(f.get("reason", "")))
    rows.sort(key=lambda r: -r["time"])
    for row in rows:
        row["log"] = link(row["name"])
    return rows[:RECENT_SHOWN]


def usage_rows(attempts: Sequence[Attempt], now: float) -> dict[str, list[dict[str, Any]]]:
    """Per project: resource-hours used, borrowed and lost to preemption, last day and week."""
    out = {}
    for label, span in (("day", DAY), ("week", WEEK)):
        rows = summarize(attempts, "project", now - span, now, now)
        out[label] = [
            {
                "project": row.key[0],
                "attempts": row.attempts,
                "preempted": row.preempted,
                "used_hours": {r: s / 3600 for r, s in sorted(row.used.items())},
                "borrowed_hours": {r: s / 3600 for r, s in sorted(row.borrowed.items())},
                "lost_hours": {r: s / 3600 for r, s in sorted(row.lost.items())},
            }
            for row in rows
        ]
    return out


def plot_series(
    attempts: Sequence[Attempt], queue: Mapping[str, Any] | None, now: float
) -> dict[str, Any]:
    """Use per project and resource at PLOT_POINTS instants over the last day (a sweep over
    attempt starts and ends: linear in attempts), with each project's quota."""
    step = DAY / PLOT_POINTS
    t0 = now - DAY
    times = [t0 + step * (i + 1) for i in range(PLOT_POINTS)]
    deltas: dict[tuple[str, str], list[float]] = {}
    for a in attempts:
        end = a.end if a.end is not None else now + 1
        if end <= t0 or a.start > now:
            continue
        first = _instant_at_or_after(a.start, t0, step)
        last = _instant_at_or_after(end, t0, step)  # instants in [first, last) see it run
        for resource, count in a.resources.items():
            diff = deltas.setdefault((resource, a.project), [0.0] * (PLOT_POINTS + 1))
            diff[first] += count
            diff[last] -= count
    series: dict[str, dict[str, list[float]]] = {}
    for (resource, project), diff in sorted(deltas.items()):
        values, level = [], 0.0
        for i in range(PLOT_POINTS):
            level += diff[i]
            values.append(level)
        series.setdefault(resource, {})[project] = values
    quotas = {
        p: dict(facts.get("quota") or {})
        for p, facts in ((queue or {}).get("projects") or {}).items()
    }
    return {"times": times, "series": series, "quotas": quotas}


def _instant_at_or_after(t: float, t0: float, step: float) -> int:
    """The index of the first plot instant (t0 + step * (i + 1)) at or after ``t``."""
    return min(PLOT_POINTS, max(0, math.ceil((t - t0) / step - 1)))


@dataclass(frozen=True)
class JobsView:
    """What the page shows of the jobs, made when one of them changed: the waiting jobs'
    rows (they do not age), the live jobs (their rows say how long they ran: made at each
    render, from these few) and the counts. A page refreshed only for its age is made from
    the last view, with no pass over a queue that did not change (100,000 jobs: 0.7 s)."""

    queue: list[dict[str, Any]]
    live: list[Job]
    counts: dict[str, int]


def jobs_view(jobs: Sequence[Job], queue: Mapping[str, Any] | None, link: Link) -> JobsView:
    return JobsView(
        queue=queue_rows(jobs, queue, link),
        live=[job for job in jobs if job[2].status in LIVE],
        counts={
            "jobs": len(jobs),
            "waiting": sum(1 for _, _, s in jobs if s.status is Status.PENDING),
            "running": sum(1 for _, _, s in jobs if s.status is Status.ACTIVE),
        },
    )


def page_data(
    *,
    root_url: str,
    jobs: Sequence[Job] = (),
    view: JobsView | None = None,
    queue: Mapping[str, Any] | None,
    attempts: Sequence[Attempt],
    finished: Iterable[Mapping[str, Any]] = (),
    queue_lengths: Sequence[Sequence[float]] = (),
    daemon: str = "",
    now: float,
    log_link: Link,
) -> dict[str, Any]:
    """Everything the page shows, as JSON-able data: of ``jobs``, or of their ``view`` made
    earlier (``jobs_view``, with the same ``queue``)."""
    view = view if view is not None else jobs_view(jobs, queue, log_link)
    return {
        "rendered": now,
        "root": root_url,
        "daemon": daemon,
        "free": dict((queue or {}).get("free") or {}),
        "pool": pool_rows(queue),
        "queue": view.queue,
        "running": running_rows(view.live, log_link, now),
        "recent": recent_rows(attempts, finished, log_link, now),
        "usage": usage_rows(attempts, now),
        "plot": plot_series(attempts, queue, now),
        "queue_lengths": [list(p) for p in queue_lengths if now - p[0] <= DAY],
        "counts": dict(view.counts),
    }
