"""The scheduling policy: a pure function of (quota, jobs, usage, now) -> decisions with reasons.

No I/O and no clock: the daemon, `bastion why` and the simulator all call the same code, so a
decision can be replayed and explained. See quota/engine.py for how one pass works.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quota.config import QuotaConfig
from quota.engine import run
from quota.explain import explain_plan
from quota.model import Decision, JobRequest, Phase, Plan, Verdict

__all__ = ["Decision", "JobRequest", "Phase", "Plan", "Verdict", "explain", "schedule"]


def schedule(config: QuotaConfig, jobs: Sequence[JobRequest], usage: Mapping[str, float],
             now: float) -> Plan:
    """Decide START/KEEP/PREEMPT/WAIT/REJECT for every job; deterministic in its inputs."""
    return run(config, jobs, usage, now)


def explain(config: QuotaConfig, jobs: Sequence[JobRequest], usage: Mapping[str, float],
            now: float, name: str) -> str:
    """`bastion why NAME`: quota, usage, borrowing, position, and what would let it start."""
    return explain_plan(config, jobs, usage, now, schedule(config, jobs, usage, now), name)
