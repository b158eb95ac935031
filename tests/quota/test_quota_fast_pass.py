"""The fast pass decides exactly what the plain pass (tests/quota/pass_reference) decides.

The pass is tuned for 50,000 pending jobs (early exits once nothing more can fit, reasons
built per shape of job, work skipped for jobs that cannot start). These tests replay random
worlds, large queues over mostly full pools included, through both and compare whole plans:
every decision (verdict, tier, reason text, stable wait, queue position, backfill marks,
preemptor), the held capacity, what is left free, usage and the within-quota set.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pass_reference import engine as reference

from quota.config import QuotaConfig, SchedulingKnobs
from quota.model import JobRequest, Phase, Plan, Verdict
from quota.policy import schedule

NOW = 10_000.0
SETTINGS = settings(
    max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def world(seed: int) -> tuple[QuotaConfig, list[JobRequest], dict[str, float]]:
    """A pool mostly held by running jobs (some releasing, some backfill), and a queue of up
    to 150 pending jobs, invalid ones among them, over up to six projects."""
    rng = random.Random(seed)
    types = ("v4", "cpu")[: rng.randint(1, 2)]
    ntiers = rng.randint(1, 2)
    tiers = tuple({r: rng.choice((0, 4, 8, 16, 32)) for r in types} for _ in range(ntiers))
    projects = [f"p{i}" for i in range(rng.randint(1, 6))]
    raw = {p: {r: rng.choice((0.0, 0.1, 0.25, 0.5, 1.0)) for r in types} for p in projects}
    totals = {r: sum(raw[p][r] for p in projects) for r in types}
    shares = {
        p: {r: (f / totals[r] if totals[r] else 0.0) for r, f in s.items()} for p, s in raw.items()
    }
    knobs = SchedulingKnobs(
        min_runtime_seconds=rng.choice((0.0, 300.0)),
        preempt_within_project=rng.random() < 0.4,
        reserve_after_seconds=rng.choice((0.0, 300.0, 1e9)),
        reclaim_after_seconds=0.0,
    )  # (the reference has no delay)
    config = QuotaConfig(
        tiers=tiers, membership={p: ("u[0-5]",) for p in projects}, shares=shares, scheduling=knobs
    )
    free = dict(config.pool)
    npending = rng.choice((0, 5, 20, 60, 150))
    sizes = (0, 1, 1, 2, 3, 5, 8, 16)

    def request() -> dict[str, int]:
        return {r: rng.choice(sizes) for r in types}

    jobs: list[JobRequest] = []
    for i in range(rng.randint(0, 40)):
        need = request()
        if not all(n <= free[r] for r, n in need.items()):
            continue
        for r, n in need.items():
            free[r] -= n
        phase = Phase.RELEASING if rng.random() < 0.1 else Phase.RUNNING
        backfill = (
            tuple(sorted({f"j{rng.randrange(npending)}" for _ in range(2)}))
            if npending and phase is Phase.RUNNING and rng.random() < 0.3
            else ()
        )
        by = f"j{rng.randrange(npending)}" if npending and phase is Phase.RELEASING else None
        jobs.append(
            JobRequest(
                f"r{i}",
                rng.choice(projects),
                f"u{rng.randrange(6)}",
                need,
                rng.randint(1, 5),
                NOW - 5000,
                phase,
                NOW - rng.choice((10, 200, 400, 4000)),
                rng.choice((None, *range(ntiers))),
                preempted_by=by,
                backfill_for=backfill,
                preemptions=rng.choice((0, 0, 1, 2)),
            )
        )
    for i in range(npending):
        submit = NOW - rng.choice((0, 100, 1000, 5000))
        need = request()
        if rng.random() < 0.03:
            need["tpu"] = 1  # unknown resource type: rejected
        user = f"u{rng.randrange(7)}"  # u6 is nobody's member: rejected
        jobs.append(
            JobRequest(
                f"j{i}",
                rng.choice(projects),
                user,
                need,
                rng.randint(1, 5),
                submit,
                preemptions=rng.choice((0, 0, 1, 2)),
                pending_since=rng.choice((None, submit, NOW - 50)),
                creation_time=rng.choice((None, 1.0, 2.0)),
            )
        )
    rng.shuffle(jobs)
    usage = {f"u{i}": float(rng.randrange(0, 1000, 100)) for i in range(7)}
    return config, jobs, usage


def _same(fast: Plan, ref: Plan, jobs: list[JobRequest]) -> None:
    assert list(fast.decisions) == list(ref.decisions)
    assert len(fast.decisions) == len(ref.decisions)
    project = {j.name: j.project_id for j in jobs}
    order: dict[str, list[tuple[int, str]]] = {}
    for name, d in ref.decisions.items():
        # what the daemon compares, read without making the waiting job's decision first
        text = (d.wait or d.reason) if d.verdict is Verdict.WAIT else None
        assert fast.wait_text(name) == text, name
        assert name in fast.decisions
        assert fast.decisions[name] == d, name
        assert fast.decisions[name] == d, name  # (made on reading: the same every time)
        if d.verdict is Verdict.WAIT:
            order.setdefault(project[name], []).append((d.ahead, name))
    assert "no such job" not in fast.decisions
    assert fast.waiting == {p: [n for _, n in sorted(q)] for p, q in order.items()}
    for got, verdict in (
        (fast.starts(), Verdict.START),
        (fast.preemptions(), Verdict.PREEMPT),
        (fast.waits(), Verdict.WAIT),
        (fast.rejects(), Verdict.REJECT),
    ):
        assert got == [d for d in ref.decisions.values() if d.verdict is verdict]
    assert fast.reserved == ref.reserved
    assert fast.free == ref.free
    assert fast.usage == ref.usage
    assert fast.quotas == ref.quotas
    assert fast.within_quota == ref.within_quota


@SETTINGS
@given(st.integers(0, 2**32))
def test_fast_pass_decides_exactly_as_the_plain_pass(seed: int) -> None:
    config, jobs, usage = world(seed)
    _same(schedule(config, jobs, usage, NOW), reference.run(config, jobs, usage, NOW), jobs)


@pytest.mark.parametrize("seed", range(3))
def test_fast_pass_matches_on_the_benchmark_world(seed: int) -> None:
    """bench_policy.py's shape (100 projects, a third borrowing, a nearly full two-tier pool),
    at 3,000 pending jobs: the early exits are taken here."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_policy

    rng = random.Random(seed)
    config = bench_policy.make_config(rng)
    config = dataclasses.replace(
        config, scheduling=dataclasses.replace(config.scheduling, reclaim_after_seconds=0.0)
    )
    usage = {f"u{i}": rng.uniform(0, 1e7) for i in range(500)}
    jobs = bench_policy.make_jobs(rng, 3000)
    now = bench_policy.NOW
    _same(schedule(config, jobs, usage, now), reference.run(config, jobs, usage, now), jobs)


def test_plain_pass_decides_every_frozen_golden_scenario_as_the_fast_one() -> None:
    """The proof behind tests/quota/golden: the plain pass agrees with the frozen plans."""
    from tests.quota.golden.scenarios import groups

    checked = 0
    for scenarios in groups().values():
        for scenario in scenarios:
            config, jobs, usage, now = scenario.make()
            _same(schedule(config, jobs, usage, now), reference.run(config, jobs, usage, now), jobs)
            checked += 1
    assert checked == 403
