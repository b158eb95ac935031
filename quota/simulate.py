"""Offline what-if: replay a trace through the same `schedule` the daemon runs.

Model (deterministic, so metrics can be re-derived from the events):
* The simulated daemon decides at t0, t0 + poll, t0 + 2 poll, ... (t0 = first submission),
  with usage from a UsageLedger advanced at every decision. A job submitted between polls
  waits for the next one. While nothing is pending or releasing, idle polls are skipped
  (the policy cannot decide anything then), which changes no result.
* A started job finishes exactly `duration` seconds after its start and frees its
  resources at once. A preempted job holds its resources for `preemption_grace_seconds`
  (SIGTERM to SIGKILL, the worst case), then is pending again and starts from scratch, or
  from its last checkpoint if it checkpoints (TraceJob.checkpoint_every): the work saved is
  not done again. A running job reports its last checkpoint to the policy
  (JobRequest.last_checkpoint) unless `report_checkpoints` is off.

Metrics (time integrals over the piecewise-constant state):
* utilization[r]: mean of held/capacity (held = running + releasing) over the time some
  valid job was pending; 1.0 if no job ever waited.
* share_attainment[p]: over the time p's demand (running + releasing + pending) reached its
  quota in some resource, the fraction during which p's running usage reached its quota in
  each such resource, or none of p's pending (or releasing) jobs fit in the quota p had
  left (jobs are indivisible). 1.0 if p never demanded its quota.
* idle_while_fit_fraction, max_deprivation_seconds, attainment, within_quota_preemptions,
  within_project_violations: the rules of issue 13, measured from the events alone by
  quota/rules.py (see there; the reclaim period is min runtime + grace + two polls).
* wait_seconds: time each job spent pending, summed over its attempts (mean, p95 by nearest
  rank, mean by project); lost_resource_seconds: resource units x work lost by preempted
  attempts (run time since the attempt's last checkpoint, or its start; each preempt event
  says its `lost_seconds`); makespan_seconds: last finish minus first submission.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from quota.capacity import EPS, add
from quota.config import QuotaConfig
from quota.model import JobRequest, Phase, Verdict
from quota.policy import schedule
from quota.queues import invalid_reason
from quota.rules import measure
from quota.trace import TraceError, TraceJob, parse_trace
from quota.usage import UsageLedger

__all__ = ["SimulationResult", "TraceError", "TraceJob", "parse_trace", "simulate"]


@dataclass(frozen=True)
class SimulationResult:
    metrics: dict[str, Any]
    events: list[dict[str, Any]]


def simulate(
    config: QuotaConfig,
    trace: Sequence[TraceJob],
    poll_seconds: float,
    *,
    report_checkpoints: bool = True,
) -> SimulationResult:
    """Replay `trace` under `config`; see the module docstring for the model and metrics.
    `report_checkpoints=False`: jobs checkpoint and resume the same, but the policy is not
    told (it chooses victims as if none did): what the preference by lost work is worth."""
    if not poll_seconds > 0:
        raise ValueError(f"poll_seconds must be > 0, got {poll_seconds}")
    return _Sim(config, trace, poll_seconds, report_checkpoints).run()


@dataclass(slots=True)
class _Job:
    spec: TraceJob
    valid: bool
    phase: Phase | None = None  # None: not submitted yet, or gone
    start: float = 0.0
    tier: int | None = None
    attempt: int = 0
    since: float = 0.0  # pending since
    wait: float = 0.0
    preemptions: int = 0
    started: bool = False
    saved: float = 0.0  # work kept by checkpoints of earlier attempts (not done again)
    backfill_for: tuple[str, ...] = ()
    preempted_by: str | None = None  # while releasing (the daemon keeps it in the job state)


@dataclass
class _Project:
    quota: dict[str, float]
    usage: dict[str, int] = field(default_factory=dict)  # running
    demand: dict[str, int] = field(default_factory=dict)  # running + releasing + pending
    pending: set[str] = field(default_factory=set)
    demanding: float = 0.0  # seconds with demand >= quota
    attained: float = 0.0


class _Sim:
    def __init__(
        self, config: QuotaConfig, trace: Sequence[TraceJob], poll: float, report: bool = True
    ) -> None:
        self.config, self.poll, self.report_checkpoints = config, poll, report
        self.knobs = config.scheduling
        self.pool = config.pool
        self.jobs = {t.name: _Job(t, invalid_reason(config, _request(t)) is None) for t in trace}
        if len(self.jobs) != len(trace):
            raise ValueError("trace job names must be unique")
        self.arrivals = sorted(trace, key=lambda t: (t.submit, t.name))
        self.next_arrival = 0
        self.t0 = self.arrivals[0].submit if trace else 0.0
        self.timers: list[tuple[float, int, str, int]] = []  # (time, kind, name, attempt)
        self.events: list[dict[str, Any]] = []
        self.projects = {
            p: _Project(dict(q)) for p, q in config.quotas.items() if any(v > 0 for v in q.values())
        }
        self.held: dict[str, int] = {}
        self.pending = 0
        self.active: set[str] = set()  # pending, running or releasing
        self.clock = self.t0
        self.util: dict[str, float] = {r: 0.0 for r in self.pool}
        self.waiting_time = 0.0
        self.lost = 0.0
        self.preemptions = 0
        self.last_finish = self.t0
        self.ledger = UsageLedger(self.knobs.usage_half_life_seconds, self.t0, {})

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> SimulationResult:
        t = self.t0
        while True:
            self._advance_to(t)
            if not self.active and self.next_arrival >= len(self.arrivals):
                break
            self._decide(t)
            t = self._next_poll(t)
        return SimulationResult(self._metrics(), self.events)

    def _next_poll(self, t: float) -> float:
        if any(self.jobs[n].phase in (Phase.PENDING, Phase.RELEASING) for n in self.active):
            return t + self.poll
        nxt = [self.timers[0][0]] if self.timers else []
        if self.next_arrival < len(self.arrivals):
            nxt.append(self.arrivals[self.next_arrival].submit)
        if not nxt:
            return t + self.poll
        k = max(1, math.ceil((min(nxt) - self.t0) / self.poll - EPS))
        return max(t + self.poll, self.t0 + k * self.poll)

    def _advance_to(self, t: float) -> None:
        """Apply finishes, releases and arrivals up to t, in time order."""
        while True:
            timer = self.timers[0][0] if self.timers else math.inf
            arrival = (
                self.arrivals[self.next_arrival].submit
                if self.next_arrival < len(self.arrivals)
                else math.inf
            )
            when = min(timer, arrival)
            if when > t:
                break
            self._integrate(when)
            if timer <= arrival:
                _, kind, name, attempt = heapq.heappop(self.timers)
                job = self.jobs[name]
                if job.attempt == attempt:
                    (self._finish if kind == 0 else self._release)(job, when)
            else:
                self._arrive(self.arrivals[self.next_arrival], when)
                self.next_arrival += 1
        self._integrate(t)

    def _decide(self, t: float) -> None:
        reqs = [self._as_request(self.jobs[n], t) for n in sorted(self.active)]
        running = [r for r in reqs if r.phase is not Phase.PENDING]
        self.ledger = self.ledger.advance(running, t)
        plan = schedule(self.config, reqs, self.ledger.by_user, t)
        order = {Verdict.REJECT: 0, Verdict.PREEMPT: 1, Verdict.START: 2}
        acts = sorted(
            (order[d.verdict], d.name) for d in plan.decisions.values() if d.verdict in order
        )
        for _, name in acts:
            d = plan.decisions[name]
            job = self.jobs[name]
            if d.verdict is Verdict.REJECT:
                self._leave(job)
                self._event(t, "reject", job, d.reason)
            elif d.verdict is Verdict.PREEMPT:
                self._preempt(job, t, d.reason, d.preempted_by)
            else:
                self._start(job, t, d.tier, d.reason, d.backfill_for)
        for d in plan.decisions.values():
            if d.verdict is Verdict.KEEP and d.tier is not None:
                self.jobs[d.name].tier = d.tier  # recorded, never a restart

    # -- transitions -----------------------------------------------------------------------

    def _arrive(self, spec: TraceJob, t: float) -> None:
        job = self.jobs[spec.name]
        job.phase, job.since = Phase.PENDING, t
        self.active.add(spec.name)
        if job.valid:
            self.pending += 1
            proj = self.projects.get(spec.project_id)
            if proj is not None:
                proj.pending.add(spec.name)
                add(proj.demand, spec.resources)

    def _start(
        self, job: _Job, t: float, tier: int | None, reason: str, backfill_for: tuple[str, ...] = ()
    ) -> None:
        spec = job.spec
        job.phase, job.start, job.tier, job.started = Phase.RUNNING, t, tier, True
        job.backfill_for = backfill_for
        job.wait += t - job.since
        job.attempt += 1
        self.pending -= 1
        add(self.held, spec.resources)
        proj = self.projects.get(spec.project_id)
        if proj is not None:
            proj.pending.discard(spec.name)
            add(proj.usage, spec.resources)
        heapq.heappush(self.timers, (t + spec.duration - job.saved, 0, spec.name, job.attempt))
        self._event(t, "start", job, reason, backfill_for=list(backfill_for))

    def _preempt(self, job: _Job, t: float, reason: str, by: str | None) -> None:
        spec = job.spec
        job.phase = Phase.RELEASING
        job.preempted_by = by
        job.preemptions += 1
        job.attempt += 1  # the pending finish is void
        self.preemptions += 1
        checkpoint = spec.last_checkpoint(job.start, t)
        since = job.start if checkpoint is None else checkpoint
        job.saved += since - job.start
        self.lost += sum(spec.resources.values()) * (t - since)
        proj = self.projects.get(spec.project_id)
        if proj is not None:
            add(proj.usage, spec.resources, -1)
            proj.pending.add(spec.name)  # unserved demand from now on
        release = t + self.knobs.preemption_grace_seconds
        heapq.heappush(self.timers, (release, 1, spec.name, job.attempt))
        self._event(t, "preempt", job, reason, preempted_by=by, lost_seconds=t - since)

    def _release(self, job: _Job, t: float) -> None:
        spec = job.spec
        job.phase, job.since, job.tier = Phase.PENDING, t, None
        self.pending += 1
        add(self.held, spec.resources, -1)
        proj = self.projects.get(spec.project_id)
        if proj is not None:
            proj.pending.add(spec.name)

    def _finish(self, job: _Job, t: float) -> None:
        spec = job.spec
        add(self.held, spec.resources, -1)
        proj = self.projects.get(spec.project_id)
        if proj is not None:
            add(proj.usage, spec.resources, -1)
            add(proj.demand, spec.resources, -1)
        self.last_finish = max(self.last_finish, t)
        self._event(t, "finish", job, f"completed after {spec.duration:g}s")
        self._leave(job)

    def _leave(self, job: _Job) -> None:
        job.phase = None
        self.active.discard(job.spec.name)

    def _event(self, t: float, kind: str, job: _Job, reason: str, **extra: Any) -> None:
        s = job.spec
        self.events.append(
            {
                "time": t,
                "event": kind,
                "name": s.name,
                "project_id": s.project_id,
                "resources": dict(s.resources),
                "tier": job.tier,
                "reason": reason,
                **extra,
            }
        )

    def _as_request(self, job: _Job, t: float) -> JobRequest:
        s = job.spec
        running = job.phase is not Phase.PENDING
        told = job.phase is Phase.RUNNING and self.report_checkpoints
        return JobRequest(
            s.name,
            s.project_id,
            s.user_id,
            s.resources,
            s.priority,
            s.submit,
            job.phase or Phase.PENDING,
            job.start if running else None,
            job.tier if running else None,
            job.preempted_by if job.phase is Phase.RELEASING else None,
            backfill_for=job.backfill_for if running else (),
            preemptions=job.preemptions,
            pending_since=None if running else job.since,
            last_checkpoint=s.last_checkpoint(job.start, t) if told else None,
        )

    # -- metrics ------------------------------------------------------------------------------

    def _integrate(self, t: float) -> None:
        dt = t - self.clock
        if dt <= 0:
            return
        self.clock = t
        if self.pending > 0:
            self.waiting_time += dt
            for r, n in self.held.items():
                if r in self.util:
                    self.util[r] += n * dt
        for proj in self.projects.values():
            demanding, attained = _attainment(proj, self.jobs)
            if demanding:
                proj.demanding += dt
                if attained:
                    proj.attained += dt

    def _metrics(self) -> dict[str, Any]:
        util = {
            r: (self.util[r] / (self.waiting_time * n) if self.waiting_time > 0 else 1.0)
            for r, n in sorted(self.pool.items())
            if n > 0
        }
        share = {
            p: (pr.attained / pr.demanding if pr.demanding > 0 else 1.0)
            for p, pr in sorted(self.projects.items())
        }
        started = [j for j in self.jobs.values() if j.started]
        waits = sorted(j.wait for j in started)
        by_project: dict[str, list[float]] = {}
        for j in started:
            by_project.setdefault(j.spec.project_id, []).append(j.wait)
        return {
            "utilization": util,
            "share_attainment": share,
            "wait_seconds": {
                "mean": sum(waits) / len(waits) if waits else 0.0,
                "p95": waits[max(0, math.ceil(0.95 * len(waits)) - 1)] if waits else 0.0,
                "by_project": {p: sum(w) / len(w) for p, w in sorted(by_project.items())},
            },
            "preemptions": self.preemptions,
            "lost_resource_seconds": self.lost,
            "max_preemptions_per_job": max((j.preemptions for j in self.jobs.values()), default=0),
            "makespan_seconds": self.last_finish - self.t0 if started else 0.0,
            "jobs": {
                "total": len(self.jobs),
                "started": len(started),
                "rejected": sum(1 for e in self.events if e["event"] == "reject"),
            },
            **self._rules(),
        }

    def _rules(self) -> dict[str, Any]:
        """Issue 13's rules, measured from the event log alone (quota/rules.py)."""
        k = self.knobs
        jobs = {
            n: {
                "project_id": j.spec.project_id,
                "submit": j.spec.submit,
                "resources": dict(j.spec.resources),
                "priority": j.spec.priority,
            }
            for n, j in self.jobs.items()
            if j.valid
        }
        m = measure(
            self.pool,
            self.config.quotas,
            jobs,
            self.events,
            k.preemption_grace_seconds,
            k.min_runtime_seconds + k.preemption_grace_seconds + 2 * self.poll,
        )
        keys = (
            "idle_while_fit_fraction",
            "max_deprivation_seconds",
            "attainment",
            "within_quota_preemptions",
            "within_project_violations",
        )
        return {key: m[key] for key in keys}


def _attainment(proj: _Project, jobs: dict[str, _Job]) -> tuple[bool, bool]:
    q = proj.quota
    hot = [r for r, v in q.items() if v > 0 and proj.demand.get(r, 0) >= v - EPS]
    if not hot:
        return False, False
    if all(proj.usage.get(r, 0) >= q[r] - EPS for r in hot):
        return True, True
    fits = any(
        all(
            proj.usage.get(r, 0) + n <= q.get(r, 0.0) + EPS
            for r, n in jobs[name].spec.resources.items()
            if n > 0
        )
        for name in proj.pending
    )
    return True, not fits


def _request(t: TraceJob) -> JobRequest:
    return JobRequest(t.name, t.project_id, t.user_id, t.resources, t.priority, t.submit)
