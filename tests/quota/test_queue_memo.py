"""The daemon's queue memo (quota.queues.QueueMemo): passes that reuse the last pass's queues
decide exactly what passes that sort afresh decide, whatever changed in between."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from quota_helpers import apply, released
from test_quota_properties import NOW, worlds

from quota.config import QuotaConfig, SchedulingKnobs
from quota.model import JobRequest, Phase
from quota.policy import schedule
from quota.queue_memo import QueueMemo
from quota.queues import build_queues


def _config(users: str = "u.*") -> QuotaConfig:
    return QuotaConfig(
        tiers=({"cpu": 4},),
        membership={"a": (users,), "b": (users,)},
        shares={"a": {"cpu": 0.5}, "b": {"cpu": 0.5}},
        scheduling=SchedulingKnobs(reserve_after_seconds=1e9),
    )


def _pending(i: int, rng: random.Random, project: str | None = None) -> JobRequest:
    return JobRequest(
        f"j{i}",
        project or rng.choice(("a", "b")),
        f"u{rng.randrange(3)}",
        {"cpu": rng.choice((1, 2, 8))},  # (8: larger than the pool, rejected)
        rng.randint(1, 3),
        NOW - rng.randrange(0, 1000, 10),
        creation_time=rng.choice((None, 1.0, 2.0)),
    )


def _orders(config: QuotaConfig, jobs: list[JobRequest], usage: dict, memo: QueueMemo | None):
    found = build_queues(config, jobs, usage, NOW, memo)
    return {p: [j.name for j in q] for p, q in found.by_project.items()}


def test_a_queue_that_lost_and_gained_jobs_is_in_the_order_a_fresh_sort_gives() -> None:
    rng = random.Random(7)
    config, memo = _config(), QueueMemo()
    jobs = [_pending(i, rng) for i in range(400)]
    usage = {"u0": 10.0, "u1": 0.0, "u2": 5.0}
    assert _orders(config, jobs, usage, memo) == _orders(config, jobs, usage, None)
    for step in range(30):  # a few gone, a few new, the others the same objects
        for _ in range(rng.randrange(4)):
            jobs.pop(rng.randrange(len(jobs)))
        for k in range(rng.randrange(4)):
            jobs.insert(rng.randrange(len(jobs) + 1), _pending(1000 + 10 * step + k, rng))
        if step % 10 == 9:  # (the order the jobs come in does not matter)
            rng.shuffle(jobs)
        assert _orders(config, jobs, usage, memo) == _orders(config, jobs, usage, None)


def test_users_that_swap_places_reorder_the_queue() -> None:
    rng = random.Random(3)
    config, memo = _config(), QueueMemo()
    jobs = [_pending(i, rng, "a") for i in range(200)]
    before = {"u0": 10.0, "u1": 0.0, "u2": 5.0}
    first = _orders(config, jobs, before, memo)
    decayed = {u: v / 2 for u, v in before.items()}  # the same order of users: the same queue
    assert _orders(config, jobs, decayed, memo) == first == _orders(config, jobs, decayed, None)
    swapped = {"u0": 0.0, "u1": 10.0, "u2": 5.0}
    after = _orders(config, jobs, swapped, memo)
    assert after == _orders(config, jobs, swapped, None)
    assert after != first
    tied = {"u0": 1.0, "u1": 1.0, "u2": 1.0}  # equal usage: one group, jobs by arrival
    assert _orders(config, jobs, tied, memo) == _orders(config, jobs, tied, None)


def test_many_new_jobs_and_a_changed_job_are_placed_as_a_fresh_sort_places_them() -> None:
    rng = random.Random(5)
    config, memo = _config(), QueueMemo()
    jobs = [_pending(i, rng) for i in range(100)]
    usage = {"u0": 1.0}
    _orders(config, jobs, usage, memo)
    jobs += [_pending(500 + i, rng) for i in range(QueueMemo.MOST_CHANGES + 50)]
    assert _orders(config, jobs, usage, memo) == _orders(config, jobs, usage, None)
    jobs[3] = replace(jobs[3], priority=1 if jobs[3].priority != 1 else 3)  # a new request
    assert _orders(config, jobs, usage, memo) == _orders(config, jobs, usage, None)


def test_a_project_emptied_and_refilled_is_ordered_afresh() -> None:
    rng = random.Random(9)
    config, memo = _config(), QueueMemo()
    jobs = [_pending(i, rng, "a") for i in range(50)]
    usage: dict[str, float] = {}
    _orders(config, jobs, usage, memo)
    assert _orders(config, [], usage, memo) == {}
    again = [_pending(100 + i, rng, "a") for i in range(50)]
    assert _orders(config, again, usage, memo) == _orders(config, again, usage, None)


def test_jobs_of_a_user_no_longer_a_member_leave_the_queue() -> None:
    rng = random.Random(11)
    memo = QueueMemo()
    jobs = [_pending(i, rng, "a") for i in range(60)]
    _orders(_config("u.*"), jobs, {}, memo)
    narrower = _config("u[01]")  # the quota file changed: u2's jobs are rejected now
    got = _orders(narrower, jobs, {}, memo)
    assert got == _orders(narrower, jobs, {}, None)
    assert all(not n.startswith("u2") for n in got["a"])
    names_of_u2 = {j.name for j in jobs if j.user_id == "u2"}
    assert names_of_u2 and names_of_u2.isdisjoint(got["a"])


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(worlds())
def test_passes_with_the_memo_decide_what_passes_without_it_decide(world: tuple) -> None:
    """Cycles as the daemon runs them: the plan applied, victims released, jobs cancelled and
    submitted, usage moving (in the same order of users, or not); each pass once with the
    memo kept across them and once without."""
    config, jobs, usage = world
    rng = random.Random(len(jobs))
    memo, now, fresh = QueueMemo(), NOW, 0
    for _ in range(6):
        with_memo = schedule(config, jobs, usage, now, memo)
        plain = schedule(config, jobs, usage, now)
        assert with_memo.decisions == plain.decisions
        assert with_memo.waiting == plain.waiting
        jobs = released(apply(plain, jobs, now))
        waiting = [i for i, j in enumerate(jobs) if j.phase is Phase.PENDING]
        if waiting and rng.random() < 0.5:  # a cancel
            jobs.pop(rng.choice(waiting))
        for _ in range(rng.randrange(3) if jobs else 0):  # submissions, like earlier ones
            fresh += 1
            like = rng.choice(jobs)
            jobs.append(
                replace(
                    like,
                    name=f"new{fresh}",
                    phase=Phase.PENDING,
                    start_time=None,
                    tier=None,
                    preempted_by=None,
                    backfill_for=(),
                    submit_time=now,
                )
            )
        factor = rng.choice((0.5, 1.0))
        usage = (
            {u: v * factor for u, v in usage.items()}
            if rng.random() < 0.6
            else {u: float(rng.randrange(0, 400, 100)) for u in usage}
        )
        now += 60
