"""Kueue's preemption scenarios (peers.md 2.1), translated: projects are ClusterQueues of one
cohort, the guaranteed quota is nominalQuota, reclaimWithinCohort=Any, and
withinClusterQueue=LowerPriority only with the preempt_within_project knob."""

from __future__ import annotations

from dataclasses import replace

from quota_helpers import apply, cfg, names, pend, released, running

from quota.model import Phase, Verdict
from quota.policy import explain, replan_by, schedule

NOW = 100_000.0
OLD = 0.0  # started long ago: past any minimum runtime


def test_preempt_lowest_priority() -> None:
    c = cfg({"v4": 3}, {"a": 1.0}, preempt_within_project=True)
    jobs = [
        running("low", "a", 1, prio=5),
        running("mid", "a", 1, prio=3),
        running("high", "a", 1, prio=1),
        pend("in", "a", 1, prio=1),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["low"]
    d = plan.decisions["low"]
    assert d.preempted_by == "in"
    assert "higher-priority in (priority 1 over 5) of the same project a" in d.reason


def test_borrowers_lowest_priority_goes_first() -> None:
    c = cfg({"v4": 4}, {"a": 0.5, "b": 0.5})
    jobs = [
        running("b-low", "b", 1, prio=5),
        running("b-mid", "b", 1, prio=3),
        running("b-high", "b", 2, prio=1),
        pend("a1", "a", 1),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["b-low"]


def test_minimal_set_excludes_low_priority() -> None:
    # Greedy takes low (1) then mid (2); walking back, mid alone frees enough: low stays.
    c = cfg({"v4": 6}, {"a": 0.5, "b": 0.5})
    jobs = [
        running("b-low", "b", 1, prio=5),
        running("b-mid", "b", 2, prio=4),
        running("b-own", "b", 3, prio=1),
        pend("a1", "a", 2),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["b-mid"]


def test_only_preempt_jobs_using_the_missing_resource() -> None:
    # Kueue: "only preempt workloads using the chosen flavor".
    c = cfg({"v4": 4, "cpu": 4}, {"a": 0.5, "b": 0.5})
    jobs = [
        running("b-cpu", "b", {"cpu": 4}, prio=5),
        running("b-v4", "b", {"v4": 4}, prio=1),
        pend("a1", "a", {"v4": 2}),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["b-v4"]


def test_reclaim_quota_from_borrower() -> None:
    c = cfg({"v4": 10}, {"a": 0.5, "b": 0.5})
    jobs = [running("b1", "b", 5, start=1), running("b2", "b", 5, start=2), pend("a1", "a", 5)]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["b2"]  # the most recently started
    assert plan.decisions["b2"].reason == (
        "preempted by a1 of project a, reclaiming its guaranteed quota: a needs 5 v4 "
        "(5/5 v4 with it); project b was borrowing (10/5 v4)"
    )
    assert plan.decisions["a1"].verdict is Verdict.WAIT
    assert "preempting borrower(s) b2" in plan.decisions["a1"].reason


def test_reclaim_regardless_of_the_borrowers_priority() -> None:
    c = cfg({"v4": 4}, {"a": 0.5, "b": 0.5})
    jobs = [
        running("b1", "b", 2, prio=1),
        running("b2", "b", 2, prio=1),
        pend("a1", "a", 2, prio=5),
    ]
    assert len(names(schedule(c, jobs, {}, NOW), Verdict.PREEMPT)) == 1


def test_no_workloads_borrowing() -> None:
    c = cfg({"v4": 10}, {"a": 0.5, "b": 0.5})
    jobs = [running("a1", "a", 5), running("b1", "b", 4), pend("a2", "a", 2)]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == []
    assert plan.decisions["a2"].verdict is Verdict.WAIT


def test_cant_preempt_when_everyone_under_nominal() -> None:
    c = cfg({"v4": 9}, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    jobs = [
        running("a1", "a", 3),
        running("b1", "b", 3),
        running("c1", "c", 2),
        pend("c2", "c", 2),
        pend("a2", "a", 2),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == []
    assert names(plan, Verdict.START) == []


def test_project_at_exactly_its_quota_is_not_preempted() -> None:
    jobs = [running("b1", "b", 5), running("x", "c", 5), pend("a1", "a", 4)]
    c = cfg({"v4": 10}, {"a": 0.4, "b": 0.5, "c": 0.1})
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["x"]  # c borrows 4; b sits at its 5


def test_cannot_preempt_when_the_incoming_job_exceeds_its_quota() -> None:
    # Kueue: "can't preempt huge workload if the incoming is also huge".
    c = cfg({"v4": 10}, {"a": 0.5, "b": 0.5})
    jobs = [running("b1", "b", 8), pend("a1", "a", 6)]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == []
    assert "larger than" not in plan.decisions["a1"].reason


def test_nominal_first_despite_borrowing_another_resource() -> None:
    # Kueue: "nominal first: workload fitting within nominal can preempt despite high DRS".
    c = cfg({"v4": 4, "cpu": 4}, {"a": 0.5, "b": 0.5})
    jobs = [
        running("a-cpu", "a", {"cpu": 4}),
        running("b-v4", "b", {"v4": 4}),
        pend("a1", "a", {"v4": 2}),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["b-v4"]


def test_preempt_newer_workloads_with_the_same_priority() -> None:
    c = cfg({"v4": 4}, {"a": 0.5, "b": 0.5})
    jobs = [
        running("b-old", "b", 2, start=10),
        running("b-new", "b", 2, start=20),
        pend("a1", "a", 2),
    ]
    assert names(schedule(c, jobs, {}, NOW), Verdict.PREEMPT) == ["b-new"]


def test_same_project_priority_preemption_is_off_by_default() -> None:
    c = cfg({"v4": 2}, {"a": 1.0})
    jobs = [running("low", "a", 2, prio=5), pend("high", "a", 2, prio=1)]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == []
    c = cfg({"v4": 2}, {"a": 1.0}, preempt_within_project=True)
    assert names(schedule(c, jobs, {}, NOW), Verdict.PREEMPT) == ["low"]


def test_same_priority_in_project_is_never_preempted_even_with_knob() -> None:
    c = cfg({"v4": 2}, {"a": 1.0}, preempt_within_project=True)
    jobs = [running("r", "a", 2, prio=3), pend("p", "a", 2, prio=3)]
    assert names(schedule(c, jobs, {}, NOW), Verdict.PREEMPT) == []


def test_minimum_runtime_protects_then_reclaims() -> None:
    c = cfg({"v4": 4}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=600, reclaim_after_seconds=0)
    jobs = [running("b1", "b", 4, start=NOW - 100), pend("a1", "a", 2, submit=NOW)]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == []
    assert "borrowers become preemptible at t=100500" in plan.decisions["a1"].reason
    plan = schedule(c, jobs, {}, NOW + 500)
    assert names(plan, Verdict.PREEMPT) == ["b1"]


def test_releasing_capacity_is_earmarked_no_second_preemption() -> None:
    c = cfg({"v4": 4}, {"a": 0.5, "b": 0.5})
    jobs = [
        running("b1", "b", 1, start=1),
        running("b2", "b", 1, start=2),
        running("b3", "b", 1, start=3),
        running("b4", "b", 1, start=4),
        pend("a1", "a", 2),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["b3", "b4"]
    jobs = apply(plan, jobs, NOW)
    for t in (NOW + 1, NOW + 30, NOW + 60):  # victims still stopping: nobody else is hit
        again = schedule(c, jobs, {}, t)
        assert names(again, Verdict.PREEMPT) == []
        assert "waiting for stopping jobs to release 2 v4" in again.decisions["a1"].reason


def test_victim_is_not_readmitted_into_the_capacity_it_freed() -> None:
    c = cfg({"v4": 4}, {"a": 0.5, "b": 0.5})
    jobs = [running("b1", "b", 2, start=1), running("b2", "b", 2, start=2), pend("a1", "a", 2)]
    plan = schedule(c, jobs, {}, NOW)
    jobs = released(apply(plan, jobs, NOW))
    plan = schedule(c, jobs, {}, NOW + 30)
    assert names(plan, Verdict.START) == ["a1"]
    assert plan.decisions["b2"].verdict is Verdict.WAIT


def test_scenario_does_not_flap() -> None:
    # Two projects each want more than their share; after the first reclaim the state is
    # stable: the same inputs never preempt again, and victims never preempt back.
    c = cfg({"v4": 8}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=0)
    jobs = [
        running("b-big", "b", 6, start=1),
        pend("a1", "a", 4, submit=2),
        pend("b2", "b", 2, submit=3),
    ]
    preempted: list[str] = []
    t = NOW
    for _ in range(12):
        plan = schedule(c, jobs, {}, t)
        preempted += names(plan, Verdict.PREEMPT)
        jobs = released(apply(plan, jobs, t))
        t += 30
    assert preempted == ["b-big"]
    phases = {j.name: j.phase for j in jobs}
    assert phases == {"b-big": Phase.PENDING, "a1": Phase.RUNNING, "b2": Phase.RUNNING}


def test_within_quota_job_holds_free_capacity_against_new_borrowers() -> None:
    c = cfg({"v4": 10}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=600)
    jobs = [
        running("b1", "b", 4, start=NOW - 60),
        running("b2", "b", 4, start=NOW - 60),
        pend("a1", "a", 5, submit=NOW),
        pend("b3", "b", 2, submit=NOW),
    ]
    plan = schedule(c, jobs, {}, NOW)
    # b3 borrows the 2 v4 held for a1, as its backfill: a1 may take it back at once.
    assert "a1" not in plan.reserved
    d = plan.decisions["b3"]
    assert d.verdict is Verdict.START and d.backfill_for == ("a1",)
    assert d.reason.startswith("backfill: runs in capacity held for a1")
    jobs = apply(plan, jobs, NOW)
    assert schedule(c, jobs, {}, NOW).preemptions() == []  # b1, b2 protected: no new victim
    # Once b1 and b2 pass their minimum runtime, a1 takes b3 (1 s old, a backfill) and b1.
    later = NOW + 541
    plan = schedule(c, jobs, {}, later)
    pre = {d.name: d for d in plan.preemptions()}
    assert sorted(pre) == ["b1", "b3"] and all(d.preempted_by == "a1" for d in pre.values())
    assert "ran as backfill in capacity held for a1" in pre["b3"].reason


def test_large_within_quota_job_starts_within_one_reclaim_period() -> None:
    """Small borrowers keep arriving; the big within-quota job still starts in time."""
    c = cfg({"v4": 16}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=300, preemption_grace_seconds=60)
    jobs = [running(f"b{i}", "b", 1, start=NOW - 10 * i) for i in range(16)]
    jobs.append(pend("big", "a", 8, submit=NOW))
    t, started, preempted = NOW, None, 0
    for k in range(40):
        jobs.append(pend(f"s{k}", "b", 1, submit=t))  # a fresh small job every cycle
        plan = schedule(c, jobs, {}, t)
        if plan.decisions["big"].verdict is Verdict.START:
            started = t
            break
        assert (
            not plan.starts()
            or k < 1
            or all(d.name == "big" or "big" in d.backfill_for for d in plan.starts())
        ), "a borrower took the held capacity, not as backfill"
        jobs = released(apply(plan, jobs, t))  # victims stop within a cycle
        if k % 4 == 3:  # now and then a running borrower finishes, freeing one unit
            done = min((j for j in jobs if j.phase is Phase.RUNNING), key=lambda j: j.start_time)
            jobs.remove(done)
        preempted += len(plan.preemptions())
        t += 30
    assert started is not None and started - NOW <= 300 + 60 + 30
    assert preempted > 0  # it did need to reclaim


def test_later_jobs_of_an_aged_head_run_as_its_backfill() -> None:
    c = cfg({"v4": 10}, {"a": 0.8, "b": 0.2}, reserve_after_seconds=300)
    jobs = [
        running("r1", "a", 6, start=0),
        pend("big", "a", 8, submit=NOW - 400),
        pend("small", "a", 2, submit=NOW - 10),
    ]
    plan = schedule(c, jobs, {}, NOW)
    d = plan.decisions["small"]
    assert d.verdict is Verdict.START and d.backfill_for == ("big",)
    young = schedule(c, jobs, {}, NOW - 200)  # before the head has aged: not a backfill
    assert young.decisions["small"].verdict is Verdict.START
    assert young.decisions["small"].backfill_for == ()
    # r1 finishes; a b job took 1 unit meanwhile: big is within a's quota once its backfill
    # goes, and takes it back (1 s old: no minimum runtime for a backfill).
    jobs = [j for j in apply(plan, jobs, NOW) if j.name != "r1"]
    jobs.append(running("b1", "b", 1, start=NOW))
    plan = schedule(c, jobs, {}, NOW + 1)
    pre = plan.decisions["small"]
    assert pre.verdict is Verdict.PREEMPT and pre.preempted_by == "big"
    assert "ran as backfill in capacity held for big" in pre.reason


def test_only_the_oldest_entitled_job_blocks_its_project() -> None:
    # a-old (6 of a's 6) waits for a to drain: a's later jobs wait behind it, b's do not,
    # and no free capacity is held for it (it is not within quota yet).
    c = cfg({"v4": 10}, {"a": 0.6, "b": 0.4}, reserve_after_seconds=300)
    jobs = [
        running("a1", "a", 1, start=0),
        running("b1", "b", 6, start=0),
        pend("a-old", "a", 6, submit=NOW - 1000),
        pend("a-new", "a", 1, submit=NOW - 900),
        pend("b-new", "b", 2, submit=NOW - 5),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert plan.decisions["a-old"].verdict is Verdict.WAIT
    assert plan.reserved == {}
    assert plan.decisions["a-new"].backfill_for == ("a-old",)
    assert plan.decisions["b-new"].verdict is Verdict.START
    young = schedule(c, jobs, {}, NOW - 800)  # before a-old has waited 300 s
    assert young.decisions["a-new"].verdict is Verdict.START


def test_jobs_beyond_their_quota_never_block_or_hold() -> None:
    c = cfg({"v4": 10}, {"a": 0.5, "b": 0.5}, reserve_after_seconds=300)
    jobs = [
        running("b1", "b", 7, start=0),
        pend("a-huge", "a", 8, submit=NOW - 9000),
        pend("a2", "a", 4, submit=NOW - 900),
        pend("a3", "a", 4, submit=NOW - 800),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert "a-huge" not in plan.reserved
    assert names(plan, Verdict.PREEMPT) == ["b1"]  # a2 is within quota and reclaims


def test_reclaimer_keeps_its_turn_while_its_victim_stops() -> None:
    # a1 preempted x3; while x3 stops, b1 arrives. b is further below its quota, so b1 would
    # go first and take what x3 frees: a1 keeps its turn instead, and b1 reclaims on its own.
    c = cfg({"v4": 12}, {"a": 0.3, "b": 0.6, "x": 0.1}, reclaim_after_seconds=0)
    jobs = [
        running("x1", "x", 4, start=1),
        running("x2", "x", 4, start=2),
        running("x3", "x", 3, start=3),
        running("b0", "b", 1, start=0),
        pend("a1", "a", 3, submit=NOW),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["x3"]
    jobs = [*apply(plan, jobs, NOW), pend("b1", "b", 3, submit=NOW + 10)]
    assert next(j for j in jobs if j.name == "x3").preempted_by == "a1"
    plan = schedule(c, jobs, {}, NOW + 10)
    assert "waiting for stopping jobs" in plan.decisions["a1"].reason
    assert names(plan, Verdict.PREEMPT) == ["x2"]
    assert plan.decisions["x2"].preempted_by == "b1"
    # Without the name of the reclaimer the newcomer would have taken a1's place.
    anonymous = [replace(j, preempted_by=None) for j in jobs]
    assert schedule(c, anonymous, {}, NOW + 10).decisions["x2"].preempted_by == "a1"


def test_why_says_a_job_is_backfill_and_what_may_reclaim_it() -> None:
    c = cfg({"v4": 10}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=600)
    jobs = [
        running("b1", "b", 4, start=NOW - 60),
        running("b2", "b", 4, start=NOW - 60),
        pend("a1", "a", 5, submit=NOW),
        pend("b3", "b", 2, submit=NOW),
    ]
    text = explain(c, jobs, {}, NOW, "b3")
    assert "job b3: START" in text and "backfill: started in capacity held for a1" in text
    assert "a1 (project a, 5 v4) may preempt it at once when it can start" in text
    jobs = apply(schedule(c, jobs, {}, NOW), jobs, NOW)
    assert "a1 (project a, 5 v4) may preempt it" in explain(c, jobs, {}, NOW + 30, "b3")
    gone = [j for j in jobs if j.name != "a1"]
    assert "none of which waits any more" in explain(c, gone, {}, NOW + 30, "b3")


def test_jobs_first_seen_in_the_same_cycle_go_by_creation_time_then_name() -> None:
    c = cfg({"v4": 4}, {"a": 1.0})
    jobs = [pend("p1", "a", 4, submit=NOW), pend("runner", "a", 4, submit=NOW)]
    assert names(schedule(c, jobs, {}, NOW), Verdict.START) == ["p1"]  # by name
    jobs = [replace(jobs[0], creation_time=200.0), replace(jobs[1], creation_time=100.0)]
    assert names(schedule(c, jobs, {}, NOW), Verdict.START) == ["runner"]
    # The daemon's submit time stays first: an older creation_time does not jump the queue.
    jobs = [replace(jobs[0], submit_time=NOW - 30), jobs[1]]
    assert names(schedule(c, jobs, {}, NOW), Verdict.START) == ["p1"]


def test_reclaim_waits_for_the_delay_and_capacity_that_frees_meanwhile_spares_it() -> None:
    """A within-quota job preempts only once its project has waited reclaim_after_seconds:
    before that it holds what is free; a borrower that finishes meanwhile spares the
    preemption, one that does not is preempted when the delay is over."""
    c = cfg({"v4": 4}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=300, reclaim_after_seconds=240)
    jobs = [
        running("b1", "b", 2, start=1),
        running("b2", "b", 2, start=2),
        pend("a1", "a", 2, submit=NOW),
    ]
    for t in (NOW, NOW + 239):
        plan = schedule(c, jobs, {}, t)
        assert names(plan, Verdict.PREEMPT) == []
        assert (
            f"borrowers are preempted for it from t={NOW + 240:.0f}" in plan.decisions["a1"].reason
        )
    assert replan_by(c, jobs, NOW, NOW + 3600) == NOW + 240
    # (given the plan too: a1 waits its delay out)
    assert replan_by(c, jobs, NOW, NOW + 3600, schedule(c, jobs, {}, NOW)) == NOW + 240
    assert names(schedule(c, jobs, {}, NOW + 240), Verdict.PREEMPT) == ["b2"]
    # b2 finished at NOW + 100: a1 starts in what it freed, nobody is preempted.
    done = [j for j in jobs if j.name != "b2"]
    assert names(schedule(c, done, {}, NOW + 100), Verdict.START) == ["a1"]


def test_reclaim_delay_counts_from_the_projects_first_fitting_wait_and_never_exceeds_min_runtime() -> (  # noqa: E501
    None
):
    """A newer job of a project that already waits is not delayed again; and the delay is
    at most the minimum runtime, so one reclaim period still bounds the wait."""
    c = cfg({"v4": 4}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=300, reclaim_after_seconds=240)
    jobs = [
        running("b1", "b", 2, start=1),
        running("b2", "b", 2, start=2),
        pend("a0", "a", 2, submit=NOW, prio=4),
        pend("a1", "a", 2, submit=NOW + 200, prio=1),
    ]
    plan = schedule(c, jobs, {}, NOW + 240)
    assert names(plan, Verdict.PREEMPT) == ["b2"] and plan.decisions["b2"].preempted_by == "a1"
    short = cfg({"v4": 4}, {"a": 0.5, "b": 0.5}, min_runtime_seconds=60, reclaim_after_seconds=240)
    assert short.scheduling.reclaim_delay_seconds == 60
    jobs = [running("b1", "b", 4, start=1), pend("a1", "a", 2, submit=NOW)]
    assert names(schedule(short, jobs, {}, NOW + 59), Verdict.PREEMPT) == []
    assert names(schedule(short, jobs, {}, NOW + 60), Verdict.PREEMPT) == ["b1"]


def test_why_shows_the_position_the_policy_gives_jobs_seen_in_the_same_cycle() -> None:
    """`bastion why` orders a project's queue as the policy does: creation time breaks ties
    of the daemon's submit time, so "runner" (created first) is ahead of "p1"."""
    c = cfg({"v4": 4}, {"a": 1.0})
    jobs = [
        running("r0", "a", 4, start=NOW - 10),
        replace(pend("p1", "a", 4, submit=NOW), creation_time=200.0),
        replace(pend("runner", "a", 4, submit=NOW), creation_time=100.0),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert plan.decisions["runner"].ahead == 0 and plan.decisions["p1"].ahead == 1
    assert "position: 2 of 2 waiting in a" in explain(c, jobs, {}, NOW, "p1")
    assert "ahead: runner" in explain(c, jobs, {}, NOW, "p1")
    assert "position: 1 of 2 waiting in a" in explain(c, jobs, {}, NOW, "runner")


def test_one_larger_victim_rather_than_several_small_ones() -> None:
    # Priority order would take b's four low-priority 2-unit jobs; one 8-unit job of b frees
    # the same room with one preemption (rule 5 of issue 13: few preemptions). b is over its
    # quota before and after either way.
    c = cfg({"v4": 16}, {"a": 0.5, "b": 0.5})
    jobs = [
        *(running(f"b-small{i}", "b", 2, prio=5, start=i) for i in range(4)),
        running("b-big", "b", 8, prio=1),
        pend("a1", "a", 8),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["b-big"]
    assert plan.decisions["b-big"].preempted_by == "a1"
    # No single job frees enough: the widest first, then the next in priority order (the
    # newest of the lowest priority) for the rest, two victims instead of four.
    jobs = [
        *(running(f"b-small{i}", "b", 2, prio=5, start=i) for i in range(5)),
        running("b-mid", "b", 6, prio=1),
        pend("a1", "a", 8),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["b-mid", "b-small4"]


def test_backfill_is_not_taken_back_for_a_job_that_jobs_ahead_would_overtake() -> None:
    # s runs as backfill for the aged head. Once s goes, head fits a's quota, but hi (higher
    # priority, ahead of head in a's queue) fits it too and would take what s frees in the
    # next pass: preempting s would be in vain, so nobody preempts it.
    c = cfg({"v4": 10}, {"a": 0.8, "b": 0.2})
    s = replace(running("s", "a", 2, start=NOW - 10), backfill_for=("head",))
    jobs = [
        running("r", "a", 6),
        s,
        running("b1", "b", 2),
        pend("head", "a", 2, prio=4, submit=NOW - 5000),
        pend("hi", "a", 2, prio=2, submit=NOW - 100),
    ]
    plan = schedule(c, jobs, {}, NOW)
    assert names(plan, Verdict.PREEMPT) == []
    assert plan.decisions["head"].verdict is Verdict.WAIT
    # Without hi, head takes its backfill back at once.
    plan = schedule(c, [j for j in jobs if j.name != "hi"], {}, NOW)
    assert names(plan, Verdict.PREEMPT) == ["s"]
    assert plan.decisions["s"].preempted_by == "head"
