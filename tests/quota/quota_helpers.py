"""Builders for quota tests: configs through the real TOML parser, jobs in one line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from quota.config import QuotaConfig, parse_quota
from quota.model import JobRequest, Phase, Plan, Verdict


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def quota_toml(
    tiers: Sequence[Mapping[str, int]],
    shares: Mapping[str, Mapping[str, float]],
    members: Mapping[str, Sequence[str]] | None = None,
    **knobs: object,
) -> str:
    lines = ["[toml-schema]", 'version = "1"']
    for t in tiers:
        lines.append("[[total_resources]]" if len(tiers) > 1 else "[total_resources]")
        lines += [f"{r} = {n}" for r, n in t.items()]
    members = members if members is not None else {p: [".*"] for p in shares}
    lines.append("[project_membership]")
    lines += [f"{p} = {toml_value(list(m))}" for p, m in members.items()]
    for p, s in shares.items():
        lines.append(f"[project_resources.{p}]")
        lines += [f"{r} = {f!r}" for r, f in s.items()]
    if knobs:
        lines.append("[scheduling]")
        lines += [f"{k} = {toml_value(v)}" for k, v in knobs.items()]
    return "\n".join(lines) + "\n"


def cfg(
    pool: Mapping[str, int] | Sequence[Mapping[str, int]],
    shares: Mapping[str, Mapping[str, float] | float],
    members: Mapping[str, Sequence[str]] | None = None,
    **knobs: object,
) -> QuotaConfig:
    """shares: project -> fraction of every pool resource, or project -> {resource: fraction}."""
    tiers = [pool] if isinstance(pool, Mapping) else list(pool)
    resources = sorted({r for t in tiers for r in t})
    full = {
        p: (s if isinstance(s, Mapping) else {r: s for r in resources}) for p, s in shares.items()
    }
    return parse_quota(quota_toml(tiers, full, members, **knobs), "test.toml")


def pend(
    name: str,
    project: str,
    res: Mapping[str, int] | int,
    *,
    prio: int = 3,
    submit: float = 0.0,
    user: str = "u",
) -> JobRequest:
    resources = {"v4": res} if isinstance(res, int) else dict(res)
    return JobRequest(name, project, user, resources, prio, submit)


def running(
    name: str,
    project: str,
    res: Mapping[str, int] | int,
    *,
    start: float = 0.0,
    prio: int = 3,
    tier: int | None = 0,
    user: str = "u",
    submit: float = 0.0,
    phase: Phase = Phase.RUNNING,
) -> JobRequest:
    resources = {"v4": res} if isinstance(res, int) else dict(res)
    return JobRequest(name, project, user, resources, prio, submit, phase, start, tier)


def names(plan: Plan, verdict: Verdict) -> list[str]:
    return sorted(n for n, d in plan.decisions.items() if d.verdict is verdict)


def apply(plan: Plan, jobs: Sequence[JobRequest], now: float) -> list[JobRequest]:
    """The daemon's reaction to a plan: starts run, victims release, rejects leave."""
    out = []
    for j in jobs:
        d = plan.decisions[j.name]
        if d.verdict is Verdict.START:
            out.append(
                replace(
                    j, phase=Phase.RUNNING, start_time=now, tier=d.tier, backfill_for=d.backfill_for
                )
            )
        elif d.verdict is Verdict.PREEMPT:
            out.append(replace(j, phase=Phase.RELEASING, preempted_by=d.preempted_by))
        elif d.verdict is Verdict.KEEP and j.phase is Phase.RUNNING:
            out.append(replace(j, tier=d.tier))
        elif d.verdict is not Verdict.REJECT:
            out.append(j)
    return out


def released(jobs: Sequence[JobRequest]) -> list[JobRequest]:
    """Every releasing job has exited and is pending again (a new attempt; the daemon counts
    its preemptions)."""
    return [
        replace(
            j,
            phase=Phase.PENDING,
            start_time=None,
            tier=None,
            preempted_by=None,
            backfill_for=(),
            preemptions=j.preemptions + 1,
        )
        if j.phase is Phase.RELEASING
        else j
        for j in jobs
    ]
