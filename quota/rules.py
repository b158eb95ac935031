"""The scheduling rules of issue 13, measured from an event log alone (stdlib only, no policy).

`bastion simulate --json` reports these figures, and benchmarks/bench_fairness.py loads this
file by path to score other policies' logs (an older checkout's included), so it imports
nothing from the quota package. Inputs: the pool, the quota per project in absolute units,
the jobs (name -> project, submit time, resources, priority), the events (time order, as the
simulator writes them: start / preempt / finish / reject), the preemption grace (a victim
holds its resources that long, then is pending again) and the reclaim period (minimum
runtime + grace + two polls).

Definitions (state is piecewise constant between event times):
* idle_while_fit_fraction: over the time some job is pending, the fraction during which a
  pending job has fitted in idle capacity without a break for more than 60 s (pool minus
  running and releasing jobs; capacity a policy holds for a waiting job counts as idle; the
  first 60 s of each such wait are not counted: poll latency).
* max_deprivation_seconds[p]: longest episode during which p has a pending job that fits
  its quota minus its running usage and none such starts. An episode ends when such a job
  starts or when no such job is left (a start that leaves another such job opens a new one).
* attainment[p]: 1 - (episode time beyond the first reclaim period of each episode) /
  (episode time); 1.0 without episodes.
* within_quota_preemptions: victims taken from a project by another project's job that do
  not find it above its quota (in a resource they hold) when removed, the victims of one
  project at one instant removed smallest first (largest last, Kueue's order).
* within_project_violations: preemptions inside a project neither for a higher-priority
  job nor of a backfill job started after its preemptor began waiting.
* max_preemptions_per_job, preemptions, lost_resource_seconds (units x run time lost).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from quota.capacity import EPS

WAIT_COUNTED_AFTER = 60.0
_BY = re.compile(r"preempted by (?:higher-priority )?(\S+)")


def preemptor(event: Mapping[str, Any]) -> str | None:
    """The job a preemption was for (the `preempted_by` key, or the reason's text)."""
    by = event.get("preempted_by")
    if by:
        return str(by)
    m = _BY.search(str(event.get("reason", "")))
    return m.group(1) if m else None


def _fits(need: Mapping[str, int], have: Mapping[str, float]) -> bool:
    return all(n <= have.get(r, 0) + EPS for r, n in need.items() if n > 0)


def _within(used: Mapping[str, int], need: Mapping[str, int], q: Mapping[str, float]) -> bool:
    return all(used.get(r, 0) + n <= q.get(r, 0.0) + EPS for r, n in need.items() if n > 0)


def _add(acc: dict[str, int], res: Mapping[str, int], sign: int = 1) -> None:
    for r, n in res.items():
        acc[r] = acc.get(r, 0) + sign * n


def measure(
    pool: Mapping[str, int],
    quotas: Mapping[str, Mapping[str, float]],
    jobs: Mapping[str, Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    grace: float,
    period: float,
) -> dict[str, Any]:
    events = list(events)
    rejected = {e["name"] for e in events if e["event"] == "reject"}
    valid = {n: j for n, j in jobs.items() if n not in rejected}
    # Changes in time order: (time, order, kind, payload); arrivals and releases before
    # the decisions of the same instant (as the simulator applies them).
    changes: list[tuple[float, int, int, Any]] = []
    for n, j in valid.items():
        changes.append((float(j["submit"]), 0, 0, n))
    for i, e in enumerate(events):
        if e["name"] not in valid:
            continue
        kind = {"finish": 1, "preempt": 3, "start": 4}.get(e["event"])
        if kind is None:
            continue
        changes.append((float(e["time"]), 1 if kind == 1 else 2, i, e))
        if kind == 3:
            changes.append((float(e["time"]) + grace, 0, i, ("release", e["name"])))
    changes.sort(key=lambda c: (c[0], c[1], c[2]))

    free = dict(pool)
    since: dict[str, float] = {}  # pending job -> pending since
    fit_since: dict[str, float] = {}  # pending job -> fits idle capacity without a break since
    usage: dict[str, dict[str, int]] = {}  # running, per project
    start_of: dict[str, float] = {}
    backfill_start: dict[str, bool] = {}
    preempts: dict[str, int] = {}
    lost = 0.0
    pending_time = idle_fit = 0.0
    episode: dict[str, float] = {}  # project -> open since
    ep_total: dict[str, float] = {}
    ep_over: dict[str, float] = {}
    ep_max: dict[str, float] = {}
    worst: dict[str, tuple[float, float]] = {}
    wq_violations = 0
    wp_violations = 0

    def fitting(p: str) -> bool:
        q, used = quotas.get(p, {}), usage.get(p, {})
        return any(
            valid[n]["project_id"] == p and _within(used, valid[n]["resources"], q) for n in since
        )

    def close(p: str, t: float) -> None:
        t0 = episode.pop(p)
        length = t - t0
        ep_total[p] = ep_total.get(p, 0.0) + length
        ep_over[p] = ep_over.get(p, 0.0) + max(0.0, length - period)
        if length > ep_max.get(p, -1.0):
            ep_max[p] = length
            worst[p] = (t0, t)

    i = 0
    clock = changes[0][0] if changes else 0.0
    while i < len(changes):
        t = changes[i][0]
        # integrate [clock, t)
        if t > clock and since:
            pending_time += t - clock
            if fit_since:
                first = min(fit_since.values()) + WAIT_COUNTED_AFTER
                if first < t:
                    idle_fit += t - max(clock, first)
        clock = t
        touched: set[str] = set()
        instant_victims: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
        while i < len(changes) and changes[i][0] == t:
            _, _, _, what = changes[i]
            i += 1
            if isinstance(what, str):  # arrival
                since[what] = t
                touched.add(valid[what]["project_id"])
                continue
            if isinstance(what, tuple):  # release of a preempted job
                n = what[1]
                _add(free, valid[n]["resources"])
                since[n] = t
                touched.add(valid[n]["project_id"])
                continue
            e, n = what, what["name"]
            j = valid[n]
            p, res = j["project_id"], j["resources"]
            if e["event"] == "finish":
                _add(free, res)
                _add(usage.setdefault(p, {}), res, -1)
            elif e["event"] == "start":
                fit = _within(usage.get(p, {}), res, quotas.get(p, {}))
                if fit and p in episode:
                    close(p, t)
                since.pop(n, None)
                _add(free, res, -1)
                _add(usage.setdefault(p, {}), res)
                start_of[n] = t
                backfill_start[n] = bool(e.get("backfill_for"))
            else:  # preempt
                preempts[n] = preempts.get(n, 0) + 1
                lost += sum(res.values()) * (t - start_of.get(n, t))
                by = preemptor(e)
                bj = valid.get(by or "")
                if bj is not None and bj["project_id"] != p:
                    instant_victims.setdefault(p, []).append((n, dict(usage.get(p, {}))))
                elif bj is not None:
                    higher = bj["priority"] < j["priority"]
                    waited = by in since and since[by] <= start_of.get(n, t) + EPS
                    if not higher and not (backfill_start.get(n) and waited):
                        wp_violations += 1
                _add(usage.setdefault(p, {}), res, -1)
            touched.add(p)
        for p, victims in instant_victims.items():
            used = dict(victims[0][1])  # usage before the first removal at this instant
            q = quotas.get(p, {})
            for n, _ in sorted(
                victims, key=lambda v: (sum(valid[v[0]]["resources"].values()), v[0])
            ):
                res = valid[n]["resources"]
                if not any(
                    n_ > 0 and used.get(r, 0) > q.get(r, 0.0) + EPS for r, n_ in res.items()
                ):
                    wq_violations += 1
                _add(used, res, -1)
        for n in since:
            if _fits(valid[n]["resources"], free):
                fit_since.setdefault(n, t)
            else:
                fit_since.pop(n, None)
        for n in [n for n in fit_since if n not in since]:
            del fit_since[n]
        for p in sorted(touched):
            if p not in quotas:
                continue
            now_fit = fitting(p)
            if p in episode and not now_fit:
                close(p, t)
            elif now_fit and p not in episode:
                episode[p] = t
    for p in list(episode):
        close(p, clock)
    projects = sorted(p for p, q in quotas.items() if any(v > 0 for v in q.values()))
    return {
        "idle_while_fit_fraction": idle_fit / pending_time if pending_time > 0 else 0.0,
        "max_deprivation_seconds": {p: ep_max.get(p, 0.0) for p in projects},
        "worst_deprivation": {p: worst[p] for p in projects if p in worst},
        "attainment": {
            p: (1.0 - ep_over.get(p, 0.0) / ep_total[p]) if ep_total.get(p) else 1.0
            for p in projects
        },
        "within_quota_preemptions": wq_violations,
        "within_project_violations": wp_violations,
        "max_preemptions_per_job": max(preempts.values(), default=0),
        "preemptions": sum(preempts.values()),
        "lost_resource_seconds": lost,
    }
