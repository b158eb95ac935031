"""Issue 25: among preemption victims of equal standing, the one that loses the least work.

A running job may report its last checkpoint (JobRequest.last_checkpoint); work since then
(or since its start, when it reported none in this attempt) is what a preemption loses.
Priority and the preempted-twice rule still come first; without checkpoints the order is the
old one (most recently started first)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from quota_helpers import cfg, names, pend, running

from quota.explain import ago
from quota.model import JobRequest, Verdict
from quota.policy import explain, schedule
from quota.reclaim import unsaved_since, victim_order
from quota.simulate import simulate
from quota.trace import TraceError, TraceJob, parse_trace

NOW = 100_000.0


def ckpt(job: JobRequest, at: float | None) -> JobRequest:
    return replace(job, last_checkpoint=at)


def two_borrowers(old: JobRequest, new: JobRequest) -> list[JobRequest]:
    """b borrows 4 of a's 2 units: a's job needs 2, so one of b's 2-unit jobs goes."""
    return [old, new, pend("a1", "a", 2, submit=NOW - 1000)]


CONFIG = cfg({"v4": 4}, {"a": 0.5, "b": 0.5})


def test_equal_standing_victim_is_the_one_with_the_most_recent_checkpoint() -> None:
    # b-new started later (Kueue would take it), but b-old checkpointed a minute ago.
    jobs = two_borrowers(
        ckpt(running("b-old", "b", 2, start=NOW - 7200), NOW - 60),
        ckpt(running("b-new", "b", 2, start=NOW - 3600), NOW - 1800),
    )
    assert names(schedule(CONFIG, jobs, {}, NOW), Verdict.PREEMPT) == ["b-old"]


def test_a_job_that_never_checkpointed_counts_from_its_start() -> None:
    # b-old: 10 min since its checkpoint; b-new: never checkpointed, started 5 min ago.
    jobs = two_borrowers(
        ckpt(running("b-old", "b", 2, start=NOW - 7200), NOW - 600),
        running("b-new", "b", 2, start=NOW - 300),
    )
    assert names(schedule(CONFIG, jobs, {}, NOW), Verdict.PREEMPT) == ["b-new"]
    # b-new started 20 min ago instead: it has more unsaved work than b-old, which goes.
    jobs[1] = running("b-new", "b", 2, start=NOW - 1200)
    assert names(schedule(CONFIG, jobs, {}, NOW), Verdict.PREEMPT) == ["b-old"]


def test_without_checkpoints_the_newest_job_goes_as_before() -> None:
    jobs = two_borrowers(
        running("b-old", "b", 2, start=NOW - 7200), running("b-new", "b", 2, start=NOW - 3600)
    )
    assert names(schedule(CONFIG, jobs, {}, NOW), Verdict.PREEMPT) == ["b-new"]


def test_a_checkpoint_from_before_this_attempt_saves_nothing_of_it() -> None:
    # b-old's checkpoint (its earlier attempt) predates its start 20 min ago: it loses 20
    # min; b-new, started 30 min ago, checkpointed 25 min ago: it loses 25 min.
    jobs = two_borrowers(
        ckpt(running("b-old", "b", 2, start=NOW - 1200), NOW - 5000),
        ckpt(running("b-new", "b", 2, start=NOW - 1800), NOW - 1500),
    )
    assert names(schedule(CONFIG, jobs, {}, NOW), Verdict.PREEMPT) == ["b-old"]


def test_priority_still_comes_before_lost_work() -> None:
    # The lower-priority job goes, though it checkpointed just now and the other never did.
    jobs = two_borrowers(
        ckpt(running("b-low", "b", 2, start=NOW - 7200, prio=5), NOW - 1),
        running("b-high", "b", 2, start=NOW - 7200, prio=2),
    )
    assert names(schedule(CONFIG, jobs, {}, NOW), Verdict.PREEMPT) == ["b-low"]


def test_jobs_preempted_twice_stay_last_whatever_their_checkpoint() -> None:
    twice = replace(ckpt(running("b-twice", "b", 2, start=NOW - 7200), NOW - 1), preemptions=2)
    jobs = two_borrowers(twice, running("b-once", "b", 2, start=NOW - 7200))
    assert names(schedule(CONFIG, jobs, {}, NOW), Verdict.PREEMPT) == ["b-once"]


def test_backfill_victims_smallest_lost_work_first() -> None:
    # Two backfill jobs of a's queue head: the one whose work since its checkpoint is the
    # smallest goes (units x unsaved time), though it ran longest.
    c = cfg({"v4": 4}, {"a": 1.0})
    head = replace(pend("head", "a", 2, submit=NOW - 5000), pending_since=NOW - 5000)
    long_ran = replace(
        ckpt(running("bf-long", "a", 2, start=NOW - 4000), NOW - 10), backfill_for=("head",)
    )
    short_ran = replace(running("bf-short", "a", 2, start=NOW - 600), backfill_for=("head",))
    plan = schedule(c, [head, long_ran, short_ran], {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["bf-long"]
    assert plan.decisions["bf-long"].preempted_by == "head"


def test_victim_order_key_is_pure_and_orders_by_unsaved_work() -> None:
    key = victim_order(NOW)
    a = ckpt(running("a", "b", 1, start=NOW - 100), NOW - 10)
    b = running("b", "b", 1, start=NOW - 50)
    c = running("c", "b", 1, start=NOW - 500)
    assert sorted([c, b, a], key=key) == [a, b, c]
    assert unsaved_since(a) == NOW - 10 and unsaved_since(b) == NOW - 50
    assert unsaved_since(pend("p", "b", 1)) is None


def test_why_says_when_a_running_job_last_checkpointed() -> None:
    job = ckpt(running("b1", "b", 2, start=NOW - 3600), NOW - 240)
    text = explain(CONFIG, [job], {}, NOW, "b1")
    assert "  last checkpoint 4 min ago" in text.splitlines()


def test_why_says_nothing_of_checkpoints_for_a_job_that_never_reported_one() -> None:
    text = explain(CONFIG, [running("b1", "b", 2, start=NOW - 3600)], {}, NOW, "b1")
    assert "checkpoint" not in text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (45, "45 s ago"),
        (240, "4 min ago"),
        (9000, "2.5 h ago"),
        (-30, "30 s in the future (the job's clock is ahead)"),
    ],
)
def test_ago_reads_as_a_person_would_say_it(seconds: float, text: str) -> None:
    assert ago(seconds) == text


# -- the simulator: jobs that checkpoint resume, and report it (or not) ---------------------

SIM = cfg(
    {"v4": 4},
    {"a": 0.5, "b": 0.5},
    min_runtime_seconds=0,
    preemption_grace_seconds=10,
    reserve_after_seconds=1e9,
)


def test_a_preempted_job_resumes_from_its_last_checkpoint_in_the_simulator() -> None:
    # b1 (4 v4, b's quota is 2) starts at 0 and checkpoints at 3, 7, 11, ...; a1 arrives at
    # 10 and preempts it: checkpoint 7, so 3 s of 4 v4 are lost and 7 s kept. b1 is back
    # once a1 ends (30 + 20 = 50) and needs 100 - 7 more seconds.
    c = cfg(
        {"v4": 4},
        {"a": 0.5, "b": 0.5},
        min_runtime_seconds=0,
        preemption_grace_seconds=20,
        reserve_after_seconds=1e9,
    )
    b1 = TraceJob("b1", "b", "u", 0, 100, {"v4": 4}, 3, checkpoint_every=4, checkpoint_phase=3)
    a1 = TraceJob("a1", "a", "u", 10, 20, {"v4": 2}, 3)
    r = simulate(c, [b1, a1], poll_seconds=10)
    assert [(e["time"], e["event"], e["name"]) for e in r.events] == [
        (0, "start", "b1"),
        (10, "preempt", "b1"),
        (30, "start", "a1"),
        (50, "finish", "a1"),
        (50, "start", "b1"),
        (143, "finish", "b1"),
    ]
    assert r.events[1]["lost_seconds"] == 3
    assert r.metrics["lost_resource_seconds"] == 12


def _two_borrowers_trace() -> list[TraceJob]:
    """b-old checkpoints every 5 s (at 1, 6, ..., 96), b-new never; a1 at 100 needs one of
    them: b-old loses 4 s of work, b-new (started at 10) 90 s."""
    return [
        TraceJob("b-old", "b", "u", 0, 1000, {"v4": 2}, 3, checkpoint_every=5, checkpoint_phase=1),
        TraceJob("b-new", "b", "u", 10, 1000, {"v4": 2}, 3),
        TraceJob("a1", "a", "u", 100, 50, {"v4": 2}, 3),
    ]


def test_the_simulated_policy_takes_the_victim_that_loses_least_when_told() -> None:
    told = simulate(SIM, _two_borrowers_trace(), poll_seconds=10)
    (preempt,) = [e for e in told.events if e["event"] == "preempt"]
    assert (preempt["time"], preempt["name"], preempt["lost_seconds"]) == (100, "b-old", 4)
    assert told.metrics["lost_resource_seconds"] == 2 * 4


def test_without_reports_the_simulated_policy_takes_the_newest_as_before() -> None:
    blind = simulate(SIM, _two_borrowers_trace(), poll_seconds=10, report_checkpoints=False)
    (preempt,) = [e for e in blind.events if e["event"] == "preempt"]
    assert (preempt["time"], preempt["name"], preempt["lost_seconds"]) == (100, "b-new", 90)
    assert blind.metrics["lost_resource_seconds"] == 2 * 90


def test_trace_checkpoint_fields_are_read_and_bad_ones_named() -> None:
    good = {"name": "j1", "project_id": "p", "user_id": "u", "submit": 0, "duration": 5}
    good["resources"] = {"v4": 1}
    (job,) = parse_trace(json.dumps({**good, "checkpoint_every": 600, "checkpoint_phase": 90}))
    assert (job.checkpoint_every, job.checkpoint_phase) == (600.0, 90.0)
    assert job.last_checkpoint(1000, 1000 + 89) is None
    assert job.last_checkpoint(1000, 1000 + 1300) == 1000 + 90 + 2 * 600  # (1090, 1690, 2290)
    (plain,) = parse_trace(json.dumps(good))
    assert plain.checkpoint_every is None and plain.last_checkpoint(0, 1e6) is None
    bad = json.dumps({**good, "checkpoint_every": 0, "checkpoint_phase": -1})
    with pytest.raises(TraceError) as e:
        parse_trace(bad, "t.jsonl")
    assert e.value.problems == [
        "t.jsonl:1: field checkpoint_every: must be a number of seconds > 0, got 0",
        "t.jsonl:1: field checkpoint_phase: must be a number of seconds >= 0, got -1",
    ]
