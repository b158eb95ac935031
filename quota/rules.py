"""The scheduling rules of issue 13, measured from an event log alone (no policy).

`bastion simulate --json` reports these figures, and benchmarks/bench_fairness.py loads this
file by path to score other policies' logs (an older checkout's included), so it imports
nothing from the quota package but the tolerance (quota.capacity.EPS). Inputs: the pool,
the quota per project in absolute units, the jobs (name -> project, submit time, resources,
priority), the events (time order, as the simulator writes them: start / preempt / finish /
reject), the preemption grace (a victim holds its resources that long, then is pending
again) and the reclaim period (minimum runtime + grace + two polls).

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
    """The figures of the module docstring for one event log (a replay of it, instant by
    instant: arrivals and releases, then the decisions of that instant)."""
    events = list(events)
    rejected = {e["name"] for e in events if e["event"] == "reject"}
    valid = {n: j for n, j in jobs.items() if n not in rejected}
    replay = _Replay(pool, quotas, valid, period)
    changes = _changes(valid, events, grace)
    i = 0
    replay.clock = changes[0][0] if changes else 0.0
    while i < len(changes):
        t = changes[i][0]
        replay.integrate(t)
        touched: set[str] = set()
        instant_victims: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
        while i < len(changes) and changes[i][0] == t:
            replay.apply(changes[i][3], t, touched, instant_victims)
            i += 1
        replay.count_within_quota(instant_victims)
        replay.track_fit(t)
        replay.track_episodes(touched, t)
    return replay.result()


def _changes(
    valid: Mapping[str, Mapping[str, Any]], events: list[Mapping[str, Any]], grace: float
) -> list[tuple[float, int, int, Any]]:
    """Changes in time order: (time, order, kind, payload); arrivals and releases before
    the decisions of the same instant (as the simulator applies them)."""
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
    return changes


class _Replay:
    """The state of the pool between event times, and the figures accumulated so far."""

    def __init__(
        self,
        pool: Mapping[str, int],
        quotas: Mapping[str, Mapping[str, float]],
        valid: Mapping[str, Mapping[str, Any]],
        period: float,
    ) -> None:
        self.quotas, self.valid, self.period = quotas, valid, period
        self.free = dict(pool)
        self.since: dict[str, float] = {}  # pending job -> pending since
        # pending job -> fits idle capacity without a break since
        self.fit_since: dict[str, float] = {}
        self.usage: dict[str, dict[str, int]] = {}  # running, per project
        self.start_of: dict[str, float] = {}
        self.backfill_start: dict[str, bool] = {}
        self.preempts: dict[str, int] = {}
        self.lost = 0.0
        self.pending_time = self.idle_fit = 0.0
        self.clock = 0.0
        self.episode: dict[str, float] = {}  # project -> open since
        self.ep_total: dict[str, float] = {}
        self.ep_over: dict[str, float] = {}
        self.ep_max: dict[str, float] = {}
        self.worst: dict[str, tuple[float, float]] = {}
        self.wq_violations = 0
        self.wp_violations = 0

    def integrate(self, t: float) -> None:
        """Pending time and idle-while-fit time over [clock, t)."""
        if t > self.clock and self.since:
            self.pending_time += t - self.clock
            if self.fit_since:
                first = min(self.fit_since.values()) + WAIT_COUNTED_AFTER
                if first < t:
                    self.idle_fit += t - max(self.clock, first)
        self.clock = t

    def apply(
        self,
        what: Any,
        t: float,
        touched: set[str],
        instant_victims: dict[str, list[tuple[str, Mapping[str, Any]]]],
    ) -> None:
        """One change: an arrival (a name), a release (a tuple) or an event (a mapping)."""
        valid = self.valid
        if isinstance(what, str):  # arrival
            self.since[what] = t
            touched.add(valid[what]["project_id"])
            return
        if isinstance(what, tuple):  # release of a preempted job
            n = what[1]
            _add(self.free, valid[n]["resources"])
            self.since[n] = t
            touched.add(valid[n]["project_id"])
            return
        e, n = what, what["name"]
        j = valid[n]
        p, res = j["project_id"], j["resources"]
        if e["event"] == "finish":
            _add(self.free, res)
            _add(self.usage.setdefault(p, {}), res, -1)
        elif e["event"] == "start":
            self._start(n, p, res, t, bool(e.get("backfill_for")))
        else:
            self._preempt(e, n, j, t, instant_victims)
        touched.add(p)

    def _start(self, n: str, p: str, res: Mapping[str, int], t: float, backfill: bool) -> None:
        fit = _within(self.usage.get(p, {}), res, self.quotas.get(p, {}))
        if fit and p in self.episode:
            self._close(p, t)
        self.since.pop(n, None)
        _add(self.free, res, -1)
        _add(self.usage.setdefault(p, {}), res)
        self.start_of[n] = t
        self.backfill_start[n] = backfill

    def _preempt(
        self,
        e: Mapping[str, Any],
        n: str,
        j: Mapping[str, Any],
        t: float,
        instant_victims: dict[str, list[tuple[str, Mapping[str, Any]]]],
    ) -> None:
        p, res = j["project_id"], j["resources"]
        self.preempts[n] = self.preempts.get(n, 0) + 1
        self.lost += sum(res.values()) * (t - self.start_of.get(n, t))
        by = preemptor(e)
        bj = self.valid.get(by or "")
        if bj is not None and bj["project_id"] != p:
            instant_victims.setdefault(p, []).append((n, dict(self.usage.get(p, {}))))
        elif bj is not None:
            higher = bj["priority"] < j["priority"]
            waited = by in self.since and self.since[by] <= self.start_of.get(n, t) + EPS
            if not higher and not (self.backfill_start.get(n) and waited):
                self.wp_violations += 1
        _add(self.usage.setdefault(p, {}), res, -1)

    def count_within_quota(
        self, instant_victims: dict[str, list[tuple[str, Mapping[str, Any]]]]
    ) -> None:
        """Victims of another project's job that do not find their project over its quota,
        one project's victims of one instant removed smallest first."""
        valid = self.valid
        for p, victims in instant_victims.items():
            used = dict(victims[0][1])  # usage before the first removal at this instant
            q = self.quotas.get(p, {})
            for n, _ in sorted(
                victims, key=lambda v: (sum(valid[v[0]]["resources"].values()), v[0])
            ):
                res = valid[n]["resources"]
                if not any(
                    n_ > 0 and used.get(r, 0) > q.get(r, 0.0) + EPS for r, n_ in res.items()
                ):
                    self.wq_violations += 1
                _add(used, res, -1)

    def track_fit(self, t: float) -> None:
        """Which pending jobs fit idle capacity, and since when without a break."""
        for n in self.since:
            if _fits(self.valid[n]["resources"], self.free):
                self.fit_since.setdefault(n, t)
            else:
                self.fit_since.pop(n, None)
        for n in [n for n in self.fit_since if n not in self.since]:
            del self.fit_since[n]

    def track_episodes(self, touched: set[str], t: float) -> None:
        """Open or close the deprivation episodes of the projects that changed."""
        for p in sorted(touched):
            if p not in self.quotas:
                continue
            now_fit = self._fitting(p)
            if p in self.episode and not now_fit:
                self._close(p, t)
            elif now_fit and p not in self.episode:
                self.episode[p] = t

    def _fitting(self, p: str) -> bool:
        q, used = self.quotas.get(p, {}), self.usage.get(p, {})
        return any(
            self.valid[n]["project_id"] == p and _within(used, self.valid[n]["resources"], q)
            for n in self.since
        )

    def _close(self, p: str, t: float) -> None:
        t0 = self.episode.pop(p)
        length = t - t0
        self.ep_total[p] = self.ep_total.get(p, 0.0) + length
        self.ep_over[p] = self.ep_over.get(p, 0.0) + max(0.0, length - self.period)
        if length > self.ep_max.get(p, -1.0):
            self.ep_max[p] = length
            self.worst[p] = (t0, t)

    def result(self) -> dict[str, Any]:
        for p in list(self.episode):
            self._close(p, self.clock)
        quotas, ep_total = self.quotas, self.ep_total
        projects = sorted(p for p, q in quotas.items() if any(v > 0 for v in q.values()))
        return {
            "idle_while_fit_fraction": (
                self.idle_fit / self.pending_time if self.pending_time > 0 else 0.0
            ),
            "max_deprivation_seconds": {p: self.ep_max.get(p, 0.0) for p in projects},
            "worst_deprivation": {p: self.worst[p] for p in projects if p in self.worst},
            "attainment": {
                p: (1.0 - self.ep_over.get(p, 0.0) / ep_total[p]) if ep_total.get(p) else 1.0
                for p in projects
            },
            "within_quota_preemptions": self.wq_violations,
            "within_project_violations": self.wp_violations,
            "max_preemptions_per_job": max(self.preempts.values(), default=0),
            "preemptions": sum(self.preempts.values()),
            "lost_resource_seconds": self.lost,
        }
