"""The simulator on small traces whose metrics are worked out by hand."""

from __future__ import annotations

import json

import pytest
from quota_helpers import cfg

from quota.simulate import simulate
from quota.trace import TraceError, TraceJob, parse_trace


def tj(
    name: str,
    project: str,
    submit: float,
    duration: float,
    v4: int,
    *,
    prio: int = 3,
    user: str = "u",
) -> TraceJob:
    return TraceJob(name, project, user, submit, duration, {"v4": v4}, prio)


def test_reclaim_trace_metrics_by_hand() -> None:
    # t=0 b1 (10 v4, b's quota is 5) starts on the idle pool. t=10 a1 (5, within a's quota)
    # arrives: b1 is preempted (lost 10 v4 x 10 s), holds the pool for the 20 s grace, and
    # is requeued at 30 when a1 starts. a1 ends at 80; b1 runs 80..180.
    c = cfg(
        {"v4": 10},
        {"a": 0.5, "b": 0.5},
        min_runtime_seconds=0,
        preemption_grace_seconds=20,
        reserve_after_seconds=1e9,
    )
    r = simulate(c, [tj("b1", "b", 0, 100, 10), tj("a1", "a", 10, 50, 5)], poll_seconds=10)
    m = r.metrics
    assert m["preemptions"] == 1
    assert m["max_preemptions_per_job"] == 1
    assert m["lost_resource_seconds"] == 100
    assert m["makespan_seconds"] == 180
    # a1 waits 10..30; b1 waits 30..80 (its time running before the preemption is no wait)
    assert m["wait_seconds"] == {"mean": 35.0, "p95": 50.0, "by_project": {"a": 20.0, "b": 50.0}}
    # pending during [10,30) with 10 held and [30,80) with 5 held
    assert m["utilization"] == {"v4": pytest.approx((10 * 20 + 5 * 50) / (70 * 10))}
    # a demands its quota over [10,80) and has it over [30,80); b's only job exceeds its quota
    assert m["share_attainment"] == {"a": pytest.approx(50 / 70), "b": 1.0}
    assert [(e["time"], e["event"], e["name"], e["tier"]) for e in r.events] == [
        (0, "start", "b1", 0),
        (10, "preempt", "b1", 0),
        (30, "start", "a1", 0),
        (80, "finish", "a1", 0),
        (80, "start", "b1", 0),
        (180, "finish", "b1", 0),
    ]
    preempt = r.events[1]
    assert preempt["project_id"] == "b" and preempt["resources"] == {"v4": 10}
    assert "preempted by a1 of project a" in preempt["reason"]


def test_jobs_that_fit_never_wait_and_utilization_is_full() -> None:
    c = cfg({"v4": 8}, {"a": 1.0})
    r = simulate(c, [tj("j1", "a", 0, 30, 4), tj("j2", "a", 0, 60, 4)], poll_seconds=30)
    m = r.metrics
    assert m["utilization"] == {"v4": 1.0}
    assert m["wait_seconds"]["mean"] == 0.0
    assert m["makespan_seconds"] == 60
    assert m["share_attainment"] == {"a": 1.0}


def test_poll_interval_delays_starts_and_counts_as_wait() -> None:
    # j2 arrives at 5 while j1 holds the pool until 20; the next poll is at 30.
    c = cfg({"v4": 4}, {"a": 1.0})
    r = simulate(c, [tj("j1", "a", 0, 20, 4), tj("j2", "a", 5, 10, 4)], poll_seconds=30)
    m = r.metrics
    assert [(e["time"], e["event"], e["name"]) for e in r.events] == [
        (0, "start", "j1"),
        (20, "finish", "j1"),
        (30, "start", "j2"),
        (40, "finish", "j2"),
    ]
    assert m["wait_seconds"]["by_project"] == {"a": 12.5}
    # j2 pending over [5,30): 4 of 4 held for 15 s, then nothing for 10 s
    assert m["utilization"]["v4"] == pytest.approx(15 * 4 / (25 * 4))
    assert m["makespan_seconds"] == 40


def test_invalid_jobs_are_rejected_at_the_first_poll_and_not_counted() -> None:
    c = cfg({"v4": 4}, {"a": 1.0}, members={"a": ["alice"]})
    r = simulate(
        c,
        [
            tj("ok", "a", 0, 10, 4, user="alice"),
            tj("bad", "a", 0, 10, 1, user="eve"),
            tj("huge", "a", 0, 10, 5, user="alice"),
        ],
        poll_seconds=10,
    )
    rejects = {e["name"]: e["reason"] for e in r.events if e["event"] == "reject"}
    assert set(rejects) == {"bad", "huge"}
    assert "eve belongs to: no project" in rejects["bad"]
    assert r.metrics["jobs"] == {"total": 3, "started": 1, "rejected": 2}
    assert r.metrics["wait_seconds"]["mean"] == 0.0


def test_idle_gaps_are_skipped_but_polls_stay_on_the_grid() -> None:
    c = cfg({"v4": 4}, {"a": 1.0})
    r = simulate(c, [tj("j1", "a", 0, 10, 4), tj("j2", "a", 100_000, 10, 4)], poll_seconds=30)
    assert [(e["time"], e["event"]) for e in r.events][-2:] == [
        (100_020, "start"),
        (100_030, "finish"),
    ]


def test_no_thrash_under_a_stream_of_borrowers() -> None:
    c = cfg({"v4": 16}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=120, preemption_grace_seconds=30)
    trace = [tj(f"b{i}", "b", i * 20, 600, 2) for i in range(40)]
    trace += [tj(f"a{i}", "a", 300 + i * 400, 500, 8) for i in range(5)]
    m = simulate(c, trace, poll_seconds=30).metrics
    assert m["max_preemptions_per_job"] <= 1
    assert m["share_attainment"]["a"] > 0.5


def test_trace_errors_name_line_and_field() -> None:
    good = {
        "name": "j1",
        "project_id": "p",
        "user_id": "u",
        "submit": 0,
        "duration": 5,
        "resources": {"v4": 1},
        "extra": "ignored",
    }
    lines = [
        json.dumps(good),
        "",
        "# comment",
        "{nope",
        json.dumps({**good, "name": "j2", "duration": 0, "resources": {"v4": -1}}),
        json.dumps({**good, "priority": 9}),
        "[1]",
        json.dumps({**good, "name": "j3", "submit": "soon", "project_id": ""}),
    ]
    with pytest.raises(TraceError) as e:
        parse_trace("\n".join(lines), "t.jsonl")
    assert e.value.problems == [
        "t.jsonl:4: not valid JSON (Expecting property name enclosed in double quotes at column 2)",
        "t.jsonl:5: field duration: must be a number of seconds > 0, got 0",
        "t.jsonl:5: field resources.v4: must be a whole number >= 0, got -1",
        "t.jsonl:6: field priority: must be a whole number from 1 (highest) to 5, got 9",
        "t.jsonl:7: must be a JSON object, got list",
        "t.jsonl:8: field project_id: must be a non-empty string, got ''",
        "t.jsonl:8: field submit: must be a number of seconds >= 0, got 'soon'",
    ]
    jobs = parse_trace(json.dumps(good) + "\n" + json.dumps({**good, "name": "j2"}))
    assert jobs[0] == TraceJob("j1", "p", "u", 0.0, 5.0, {"v4": 1}, 3)
    with pytest.raises(TraceError, match=r"<trace>:2: field name: 'j1' repeats line 1"):
        parse_trace(json.dumps(good) + "\n" + json.dumps(good))


def test_same_trace_same_result_in_any_line_order() -> None:
    c = cfg({"v4": 16}, {"a": 0.5, "b": 0.3, "c": 0.2}, min_runtime_seconds=60)
    trace = [
        tj(
            f"j{i}",
            "abc"[i % 3],
            (i * 37) % 900,
            100 + (i * 53) % 700,
            1 + (i * 7) % 8,
            prio=1 + i % 5,
            user=f"u{i % 4}",
        )
        for i in range(60)
    ]
    first = simulate(c, trace, poll_seconds=30)
    again = simulate(c, list(reversed(trace)), poll_seconds=30)
    assert again.metrics == first.metrics
    assert again.events == first.events
    assert first.metrics["jobs"]["started"] == 60
