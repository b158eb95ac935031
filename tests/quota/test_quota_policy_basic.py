"""The basic path: fit in order, validation rejects, tiers, reasons, ordering inside a project."""

from __future__ import annotations

import random

from quota_helpers import cfg, names, pend, running

from quota.config import default_quota
from quota.model import Phase, Verdict
from quota.policy import explain, schedule

NOW = 10_000.0


def test_jobs_that_fit_start_and_the_rest_wait() -> None:
    c = cfg({"v4": 10}, {"a": 1.0})
    jobs = [pend(f"a{i}", "a", 4, submit=i) for i in (1, 2, 3)]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.START) == ["a1", "a2"]
    assert names(plan, Verdict.WAIT) == ["a3"]
    assert set(plan.decisions) == {"a1", "a2", "a3"}


def test_smaller_later_job_backfills_when_it_fits() -> None:
    c = cfg({"v4": 10}, {"a": 1.0})
    jobs = [
        pend("big", "a", 8, submit=NOW),
        pend("huge", "a", 9, submit=NOW),
        pend("small", "a", 2, submit=NOW),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.START) == ["big", "small"]


def test_reject_non_member_and_names_the_users_projects() -> None:
    c = cfg(
        {"v4": 10},
        {"a": 0.5, "b": 0.5, "c": 0.0},
        members={"a": ["alice"], "b": ["bob", "al"], "c": ["alice"]},
    )
    plan = schedule(
        c, [pend("j", "b", 1, user="alice"), pend("k", "zzz", 1, user="alice")], {}, NOW
    )
    d = plan.decisions["j"]
    assert d.verdict is Verdict.REJECT
    assert d.reason == "user alice is not a member of project b; alice belongs to: a, c"
    assert plan.decisions["k"].reason.startswith(
        "user alice is not a member of project zzz (no such project)"
    )


def test_reject_unknown_resource_and_larger_than_pool() -> None:
    c = cfg([{"v4": 10}, {"v4": 5}], {"a": 1.0})
    plan = schedule(
        c, [pend("u", "a", {"v5": 1}), pend("big", "a", 16), pend("ok", "a", 15)], {}, NOW
    )
    assert plan.decisions["u"].reason == "unknown resource type v5; the pool has 15 v4"
    assert plan.decisions["big"].reason == (
        "larger than the whole pool: needs 16 v4, the pool has 15 v4"
    )
    assert plan.decisions["ok"].verdict is Verdict.START


def test_unknown_type_rejected_without_blocking_others() -> None:
    c = cfg({"v4": 10}, {"a": 0.5, "b": 0.5})
    plan = schedule(c, [pend("a1", "a", {"unknown": 1, "v4": 1}), pend("b2", "b", 5)], {}, NOW)
    assert names(plan, Verdict.REJECT) == ["a1"]
    assert names(plan, Verdict.START) == ["b2"]


def test_zero_resource_job_always_starts_on_tier_0() -> None:
    c = cfg([{"v4": 1}, {"v4": 1}], {"a": 1.0})
    plan = schedule(c, [running("r", "a", 2, tier=1), pend("free", "a", {})], {}, NOW)
    assert plan.decisions["free"].verdict is Verdict.START
    assert plan.decisions["free"].tier == 0


def test_reserved_tier_first_then_spot() -> None:
    c = cfg([{"v4": 10}, {"v4": 5}], {"a": 1.0})
    plan = schedule(
        c,
        [pend("a1", "a", 8, submit=1), pend("a2", "a", 4, submit=2), pend("a3", "a", 2, submit=3)],
        {},
        NOW,
    )
    tiers = {n: d.tier for n, d in plan.decisions.items()}
    # a2 spans tiers 0 and 1 so its label is 1, and it takes tier 1 first (backward pass),
    # which leaves tier 0 for a3.
    assert tiers == {"a1": 0, "a2": 1, "a3": 0}


def test_accumulation_across_tiers_gives_the_highest_tier() -> None:
    c = cfg([{"v4": 1}, {"v4": 1}, {"v4": 1}], {"a": 1.0})
    assert schedule(c, [pend("b1", "a", 3)], {}, NOW).decisions["b1"].tier == 2


def test_multi_resource_tier_is_the_highest_any_resource_needs() -> None:
    c = cfg([{"v4": 4, "cpu": 1}, {"v4": 4, "cpu": 8}], {"a": 1.0})
    assert schedule(c, [pend("j", "a", {"v4": 2, "cpu": 2})], {}, NOW).decisions["j"].tier == 1


def test_running_job_keeps_its_tier_label_no_restart() -> None:
    c = cfg([{"v4": 10}, {"v4": 5}], {"a": 1.0})
    jobs = [running("spot", "a", 4, tier=1), pend("new", "a", 10)]
    plan = schedule(c, jobs, {}, NOW)
    assert plan.decisions["spot"].verdict is Verdict.KEEP
    assert plan.decisions["spot"].tier == 1
    # The running job is charged to tier 1, so tier 0 is whole for the newcomer.
    assert plan.decisions["new"].verdict is Verdict.START
    assert plan.decisions["new"].tier == 0


def test_running_job_without_tier_gets_a_label() -> None:
    c = cfg([{"v4": 2}, {"v4": 5}], {"a": 1.0})
    plan = schedule(c, [running("r", "a", 4, tier=None)], {}, NOW)
    assert plan.decisions["r"].verdict is Verdict.KEEP
    assert plan.decisions["r"].tier == 1


def test_releasing_job_is_kept_and_holds_capacity() -> None:
    c = cfg({"v4": 10}, {"a": 1.0})
    jobs = [running("old", "a", 8, phase=Phase.RELEASING), pend("new", "a", 4)]
    plan = schedule(c, jobs, {}, NOW)
    assert plan.decisions["old"].verdict is Verdict.KEEP
    assert plan.decisions["old"].reason.startswith("releasing")
    assert plan.decisions["new"].verdict is Verdict.WAIT


def test_pool_shrunk_below_running_jobs_evicts_nobody() -> None:
    # Kueue: "Should not evict admitted workloads when nominal quota is reduced below usage".
    c = cfg({"v4": 4}, {"a": 0.5, "b": 0.5})
    jobs = [running("a1", "a", 4, start=0), running("b1", "b", 4, start=0), pend("b2", "b", 1)]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.KEEP) == ["a1", "b1"]
    assert names(plan, Verdict.PREEMPT) == []
    assert plan.decisions["b2"].verdict is Verdict.WAIT


def test_priority_then_user_usage_then_age_inside_a_project() -> None:
    c = cfg({"v4": 1}, {"a": 1.0})
    jobs = [
        pend("old-heavy", "a", 1, submit=1, user="heavy"),
        pend("new-light", "a", 1, submit=5, user="light"),
        pend("urgent", "a", 1, submit=9, prio=1, user="heavy"),
    ]
    usage = {"heavy": 1000.0, "light": 10.0}
    assert names(schedule(c, jobs, usage, NOW), Verdict.START) == ["urgent"]
    plan = schedule(c, jobs[:2], usage, NOW)
    assert names(plan, Verdict.START) == ["new-light"]
    plan = schedule(c, jobs[:2], {}, NOW)
    assert names(plan, Verdict.START) == ["old-heavy"]


def test_wait_reason_in_absolute_units_with_position() -> None:
    c = cfg({"v4": 1000}, {"p1": 0.59, "p2": 0.41})
    jobs = [running(f"r{i}", "p2", 41, start=0) for i in range(10)]
    jobs += [running("p1-big", "p1", 590, start=0)]
    jobs += [pend(f"w{i}", "p2", 8, submit=NOW - 10 + i) for i in range(4)]
    plan = schedule(c, jobs, {}, NOW)
    assert plan.decisions["w3"].reason == (
        "needs 8 v4, 0 v4 free; project p2 at quota 410/410 v4; 3 jobs ahead in p2"
    )


def test_default_quota_runs_everything_that_fits() -> None:
    c = default_quota({"cpu": 4, "gpu": 1})
    plan = schedule(
        c,
        [
            pend("j1", "default", {"cpu": 2, "gpu": 1}),
            pend("j2", "default", {"cpu": 2, "gpu": 1}),
            pend("j3", "other", {"cpu": 1}),
        ],
        {},
        NOW,
    )
    assert names(plan, Verdict.START) == ["j1"]
    assert names(plan, Verdict.WAIT) == ["j2"]
    assert "belongs to: default" in plan.decisions["j3"].reason


def test_same_input_same_output_in_any_order() -> None:
    c = cfg({"v4": 20, "cpu": 16}, {"a": 0.5, "b": 0.3, "c": 0.2})
    rng = random.Random(7)
    jobs = [
        running(
            f"r{i}",
            "abc"[i % 3],
            {"v4": rng.randint(1, 4), "cpu": rng.randint(0, 3)},
            start=rng.uniform(0, NOW),
            prio=rng.randint(1, 5),
        )
        for i in range(6)
    ]
    jobs += [
        pend(
            f"p{i}",
            "abc"[i % 3],
            {"v4": rng.randint(1, 6)},
            prio=rng.randint(1, 5),
            submit=rng.uniform(0, NOW),
            user=f"u{i % 4}",
        )
        for i in range(30)
    ]
    first = schedule(c, jobs, {"u1": 5.0}, NOW)
    for _ in range(5):
        rng.shuffle(jobs)
        again = schedule(c, jobs, {"u1": 5.0}, NOW)
        assert dict(again.decisions) == dict(first.decisions)


def test_explain_names_quota_usage_position_and_what_must_change() -> None:
    c = cfg({"v4": 10}, {"a": 0.5, "b": 0.5})
    jobs = [
        running("a1", "a", 5, start=0),
        running("b1", "b", 5, start=0),
        pend("b2", "b", 4, submit=NOW - 5),
        pend("b3", "b", 2, submit=NOW - 1),
    ]
    text = explain(c, jobs, {}, NOW, "b3")
    assert "job b3: WAIT" in text
    assert "project b: quota 5 v4 of pool 10 v4; using 5 v4" in text
    assert "position: 2 of 2 waiting in b" in text and "ahead: b2" in text
    assert "2 v4 more must be free in the pool" in text
    assert "b's usage must drop by 2 v4" in text
    assert "no job named nope" in explain(c, jobs, {}, NOW, "nope")


def test_explain_within_quota_and_rejected_jobs() -> None:
    c = cfg({"v4": 10}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=600, reclaim_after_seconds=0)
    jobs = [
        running("b1", "b", 10, start=NOW - 60),
        pend("a1", "a", 4, submit=NOW),
        pend("bad", "a", {"v9": 1}),
    ]
    text = explain(c, jobs, {}, NOW, "a1")
    assert "borrowers become preemptible at t=10540" in text
    assert "to start: nothing: it fits a's guaranteed quota" in text
    assert "within one reclaim period (660s" in text
    text = explain(c, jobs, {}, NOW, "bad")
    assert "job bad: REJECT" in text and "unknown resource type v9" in text
    assert "nothing will: fix the job" in text
    text = explain(c, jobs, {}, NOW, "b1")
    assert "job b1: KEEP on tier 0" in text and "borrowed 5 v4" in text
    # Issue 27: the verdict in words: where it runs and what would preempt it.
    headline = text.splitlines()[0]
    assert "running on" in headline and "borrowing" in headline, headline
