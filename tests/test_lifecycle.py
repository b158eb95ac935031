"""The lifecycle table (bastion/lifecycle.py) row by row: pure, no processes, no I/O.

One test per row of the table in the module docstring, plus the properties the daemon relies
on: the input state is never modified, a cancel wins over later preemptions, Tick escalates a
stop exactly once, and events that have no row change nothing.
"""

from __future__ import annotations

import copy

import pytest

from bastion import lifecycle
from bastion.jobstate import JobState, Outcome, Status, StopKind
from bastion.lifecycle import (
    CLEANUP,
    RUN,
    Admit,
    Cancel,
    CleanupAdmit,
    Delete,
    Log,
    NeedsCleanup,
    Observed,
    Preempt,
    Reject,
    Start,
    StartDeferred,
    Started,
    StartFailed,
    Stop,
    Tick,
    Update,
    Wait,
    start_marker,
    transition,
)
from bastion.runners.base import AttemptPhase, Observation

JOB = "alice-train"
NAME = "bst-abcdef-alice-train-12345678-a1"
CLEANUP_NAME = "bst-abcdef-alice-train-12345678-a1c"
T0 = 1_700_000_000.0
HANDLE = {"name": NAME}


def admit(name: str = NAME, log_size: int = 0, tier: int | None = 0) -> Admit:
    return Admit(
        tier=tier, reason="fits tier 0", attempt_name=name, runner_kind="fake", log_size=log_size
    )


def step(state: JobState, event, now: float = T0, has_cleanup: bool = False):
    return transition(state, event, now, job=JOB, has_cleanup=has_cleanup)


def observed(
    phase: AttemptPhase, reason: str = "", exit_code: int | None = None, purpose: str = RUN
):
    return Observed(purpose, Observation(phase, reason, exit_code))


def pending() -> JobState:
    return JobState(submit_time=T0 - 10, submission="12345678abcd", reason="spec detected")


def active(phase: AttemptPhase | None = AttemptPhase.RUNNING, now: float = T0) -> JobState:
    """An admitted attempt, started (handle recorded) and, with ``phase``, observed."""
    state = step(pending(), admit(), now).state
    state = step(state, Started(RUN, HANDLE), now).state
    if phase is not None:
        state = step(state, observed(phase), now).state
    return state


def cancelling(now: float = T0, grace: float = 30.0) -> JobState:
    return step(active(), Cancel("cancelled by bob", grace), now).state


def cleaning(
    outcome_phase: AttemptPhase = AttemptPhase.SUCCEEDED, exit_code: int | None = 0
) -> JobState:
    state = step(active(), observed(outcome_phase, exit_code=exit_code), T0 + 5, True).state
    assert state.status is Status.CLEANING
    state = step(state, CleanupAdmit(CLEANUP_NAME, "fake", 0), T0 + 5, True).state
    return step(state, Started(CLEANUP, {"name": CLEANUP_NAME}), T0 + 5, True).state


def event_names(result) -> list[str]:
    return [name for name, _ in result.events]


def deletes(result) -> list[Delete]:
    return [e for e in result.effects if isinstance(e, Delete)]


def logs(result) -> list[Log]:
    return [e for e in result.effects if isinstance(e, Log)]


# -- PENDING -------------------------------------------------------------------------------


def test_pending_admit_starts_an_attempt():
    state = pending()
    state.attempt = 2  # two earlier attempts (e.g. preempted)
    result = step(state, admit(log_size=123, tier=1), T0)
    new = result.state
    assert new.status is Status.ACTIVE
    assert new.attempt == 3
    assert new.tier == 1
    assert new.start_time == T0
    assert new.running_since is None and new.end_time is None and new.exit_code is None
    marker = start_marker(JOB, 3, 1, T0)
    assert new.run_attempt.to_json() == {
        "kind": "fake",
        "name": NAME,
        "handle": None,
        "origin": 123 + len(marker.encode()),
        "phase": "STARTING",
    }
    assert result.effects == [Log(RUN, marker), Start(RUN)]
    assert "attempt 3" in marker and JOB in marker
    assert event_names(result) == ["STARTED"]
    assert new.display_status == "STARTING"


def test_pending_admit_origin_counts_marker_bytes_not_characters():
    job = "jöb-ü"  # non-ASCII job name: the marker has more bytes than characters
    result = transition(pending(), admit(log_size=7), T0, job=job)
    marker = start_marker(job, 1, 0, T0)
    assert len(marker.encode()) > len(marker)
    assert result.state.run_attempt.origin == 7 + len(marker.encode())


def test_pending_reject_completes_rejected():
    result = step(pending(), Reject("spec rejected: bad"))
    assert result.state.status is Status.COMPLETED
    assert result.state.outcome is Outcome.REJECTED
    assert result.state.reason == "spec rejected: bad"
    assert result.state.end_time == T0
    assert result.effects == []
    assert result.state.display_status == "REJECTED"


def test_pending_cancel_completes_cancelled():
    result = step(pending(), Cancel("cancelled by bob", 30.0))
    assert result.state.status is Status.COMPLETED
    assert result.state.outcome is Outcome.CANCELLED
    assert result.state.reason == "cancelled by bob"
    assert result.effects == []  # nothing to stop: no attempt exists
    assert result.state.stop is None
    assert event_names(result) == ["CANCELLED"]


def test_pending_wait_sets_only_the_reason():
    state = pending()
    result = step(state, Wait("over quota"))
    assert result.state.reason == "over quota"
    assert result.effects == [] and result.events == []
    assert dataclass_without_reason(result.state) == dataclass_without_reason(state)


def dataclass_without_reason(state: JobState) -> dict:
    data = state.to_json()
    data.pop("reason")
    return data


# -- ACTIVE --------------------------------------------------------------------------------


def test_active_started_records_the_handle_once():
    state = step(pending(), admit()).state
    result = step(state, Started(RUN, HANDLE))
    assert result.state.run_attempt.handle == HANDLE
    assert result.state.status is Status.ACTIVE
    assert result.effects == []
    again = step(result.state, Started(RUN, {"name": "other"}))
    assert again.state.run_attempt.handle == HANDLE  # a later answer does not replace it


def test_active_start_failed_completes_failed_and_deletes():
    state = step(pending(), admit()).state
    result = step(state, StartFailed(RUN, "no such image: foo"), T0 + 1)
    new = result.state
    assert new.status is Status.COMPLETED
    assert new.outcome is Outcome.FAILED
    assert "no such image: foo" in new.reason
    assert new.run_attempt is None
    assert deletes(result) == [Delete(RUN, "fake", NAME, None)]
    [line] = logs(result)
    assert "could not start" in line.text and "no such image: foo" in line.text
    assert not any(isinstance(e, Start) for e in result.effects)
    assert new.display_status == "FAILED"


@pytest.mark.parametrize("phase", [AttemptPhase.QUEUED, AttemptPhase.PROVISIONING])
def test_active_observed_waiting_phase_sets_phase_and_reason(phase):
    state = active(phase=None)
    result = step(state, observed(phase, reason="no capacity in zone"), T0 + 1)
    new = result.state
    assert new.status is Status.ACTIVE
    assert new.run_attempt.phase == phase.value
    assert phase.value.lower() in new.reason and "no capacity in zone" in new.reason
    assert "attempt 1" in new.reason
    assert new.display_status == phase.value
    assert new.running_since is None
    assert result.effects == []


def test_active_observed_running_sets_running_since_once():
    state = active(phase=AttemptPhase.PROVISIONING)
    first = step(state, observed(AttemptPhase.RUNNING), T0 + 5).state
    assert first.running_since == T0 + 5
    assert first.run_attempt.phase == "RUNNING"
    assert first.display_status == "ACTIVE"
    second = step(first, observed(AttemptPhase.RUNNING), T0 + 50).state
    assert second.running_since == T0 + 5
    assert second == first


def test_active_reason_follows_the_runner_not_the_first_state_it_saw():
    """A TPU node is CREATING, then READY while its worker has not started: the job must not
    read "provisioning: node CREATING" for as long as the worker does not start (issue 20)."""
    state = step(
        active(phase=None), observed(AttemptPhase.PROVISIONING, reason="node CREATING"), T0 + 1
    ).state
    assert state.reason == "attempt 1: provisioning: node CREATING"
    seen = observed(AttemptPhase.RUNNING, reason="waiting for workers to start (0 of 1)")
    state = step(state, seen, T0 + 2).state
    assert state.reason == "attempt 1: running: waiting for workers to start (0 of 1)"
    assert step(state, seen, T0 + 3).state == state  # unchanged words: nothing to write
    state = step(
        state, observed(AttemptPhase.RUNNING, reason="1 of 1 workers running"), T0 + 4
    ).state
    assert state.reason == "attempt 1: running: 1 of 1 workers running"
    assert state.running_since == T0 + 2
    direct = step(active(phase=None), observed(AttemptPhase.RUNNING, reason="pid 7"), T0 + 1).state
    assert direct.reason == active(phase=None).reason  # a runner that starts at once: as before
    stopping = step(state, Cancel("cancelled by bob", 30.0), T0 + 5).state
    after = step(stopping, observed(AttemptPhase.RUNNING, reason="0 of 1 workers running"), T0 + 6)
    assert after.state.reason == stopping.reason  # a stop keeps its reason


def test_active_preempt_stops_and_records_the_stop():
    state = active()
    result = step(state, Preempt("tier 0 job needs the gpus", "bob-job", 10.0), T0 + 1)
    new = result.state
    assert new.status is Status.ACTIVE
    assert new.preemptions == 1
    assert new.stop.kind == StopKind.PREEMPT.value
    assert new.stop.by == "bob-job"
    assert new.stop.deadline == T0 + 11
    assert result.effects == [Stop(RUN, T0 + 11)]
    assert event_names(result) == ["PREEMPT"]
    again = step(new, Preempt("again", "carol-job", 10.0), T0 + 2)
    assert again.state == new and again.effects == []  # one stop at a time


def test_active_update_stops_and_records_the_stop():
    result = step(active(), Update("spec updated; restarting with it", 30.0), T0 + 1)
    assert result.state.status is Status.ACTIVE
    assert result.state.stop.kind == StopKind.UPDATE.value
    assert result.state.preemptions == 0
    assert result.effects == [Stop(RUN, T0 + 31)]


def test_active_cancel_goes_cancelling_with_stop_at_now_plus_grace():
    result = step(active(), Cancel("cancelled by bob", 30.0), T0 + 2)
    new = result.state
    assert new.status is Status.CANCELLING
    assert new.stop.kind == StopKind.CANCEL.value
    assert new.stop.deadline == T0 + 32
    assert new.stop.since == T0 + 2
    assert result.effects == [Stop(RUN, T0 + 32)]


def test_cancel_after_preempt_takes_over_the_stop_keeping_its_deadline():
    state = step(active(), Preempt("needed", "x", 10.0), T0).state
    result = step(state, Cancel("cancelled by bob", 30.0), T0 + 5)
    assert result.state.status is Status.CANCELLING
    assert result.state.stop.kind == StopKind.CANCEL.value
    assert result.state.stop.deadline == T0 + 10
    ended = step(result.state, observed(AttemptPhase.FAILED, exit_code=143), T0 + 6)
    assert ended.state.status is Status.COMPLETED
    assert ended.state.outcome is Outcome.CANCELLED


def test_later_preempt_or_update_does_not_override_a_cancel():
    state = cancelling()
    for event in (Preempt("needed", "x", 1.0), Update("new spec", 1.0)):
        result = step(state, event, T0 + 1)
        assert result.state == state
        assert result.effects == [] and result.events == []
    assert state.preemptions == 0


def test_active_finished_after_preempt_stop_requeues_and_deletes():
    state = step(active(), Preempt("needed", "x", 10.0), T0).state
    result = step(state, observed(AttemptPhase.FAILED, "terminated", 143), T0 + 3)
    new = result.state
    assert new.status is Status.PENDING
    assert new.outcome is None
    assert new.stop is None and new.run_attempt is None and new.tier is None
    assert new.running_since is None
    assert new.exit_code == 143
    assert new.preemptions == 1 and new.provider_preemptions == 0
    assert event_names(result) == ["REQUEUED"]
    assert deletes(result) == [Delete(RUN, "fake", NAME, HANDLE)]
    [line] = logs(result)
    assert "attempt 1" in line.text and "stopped (preempt" in line.text
    readmitted = step(new, admit(name=NAME.replace("-a1", "-a2")), T0 + 4).state
    assert readmitted.attempt == 2 and readmitted.status is Status.ACTIVE


def test_active_finished_after_update_stop_requeues():
    state = step(active(), Update("new spec", 10.0), T0).state
    result = step(state, observed(AttemptPhase.SUCCEEDED, exit_code=0), T0 + 3)
    assert result.state.status is Status.PENDING
    assert result.state.outcome is None
    assert "updated" in result.state.reason
    assert len(deletes(result)) == 1


def test_active_provider_preemption_requeues_without_counting_a_failure():
    state = active()
    result = step(state, observed(AttemptPhase.PREEMPTED, "spot reclaimed"), T0 + 9)
    new = result.state
    assert new.status is Status.PENDING
    assert new.outcome is None
    assert new.provider_preemptions == 1
    assert new.preemptions == 0
    assert new.run_attempt is None
    assert event_names(result) == ["PROVIDER_PREEMPTED"]
    assert "spot reclaimed" in new.reason and "attempt 2" in new.reason
    assert deletes(result) == [Delete(RUN, "fake", NAME, HANDLE)]
    assert "preempted by the provider" in logs(result)[0].text
    assert new.display_status == "PENDING"


def test_active_lost_requeues_with_the_reason():
    result = step(active(), observed(AttemptPhase.LOST, "host gone"), T0 + 9)
    new = result.state
    assert new.status is Status.PENDING
    assert new.outcome is None
    assert "host gone" in new.reason
    assert event_names(result) == ["LOST"]
    assert new.provider_preemptions == 0
    assert deletes(result) == [Delete(RUN, "fake", NAME, HANDLE)]
    assert "was lost (host gone)" in logs(result)[0].text


def test_active_succeeded_without_cleanup_completes():
    result = step(active(), observed(AttemptPhase.SUCCEEDED, exit_code=0), T0 + 9)
    new = result.state
    assert new.status is Status.COMPLETED
    assert new.outcome is Outcome.SUCCEEDED
    assert new.exit_code == 0 and new.end_time == T0 + 9
    assert new.run_attempt is None
    assert not any(isinstance(e, NeedsCleanup) for e in result.effects)
    assert deletes(result) == [Delete(RUN, "fake", NAME, HANDLE)]
    assert "exited with status 0" in logs(result)[0].text
    assert new.display_status == "SUCCEEDED"


def test_active_succeeded_with_cleanup_goes_cleaning():
    result = step(active(), observed(AttemptPhase.SUCCEEDED, exit_code=0), T0 + 9, has_cleanup=True)
    new = result.state
    assert new.status is Status.CLEANING
    assert new.outcome is Outcome.SUCCEEDED
    assert NeedsCleanup() in result.effects
    assert deletes(result) == [Delete(RUN, "fake", NAME, HANDLE)]
    assert event_names(result) == ["CLEANING"]


def test_active_failed_exit_3_completes_failed():
    result = step(active(), observed(AttemptPhase.FAILED, "exited with status 3", 3), T0 + 9)
    new = result.state
    assert new.status is Status.COMPLETED
    assert new.outcome is Outcome.FAILED
    assert "exited with status 3" in new.reason
    assert new.exit_code == 3
    assert "exited with status 3" in logs(result)[0].text
    assert new.display_status == "FAILED"


def test_active_failed_without_a_status_says_what_the_runner_said_not_killed():
    why = "VM ended by its dead man's switch (max_run_seconds = 604800)"
    new = step(active(), observed(AttemptPhase.FAILED, why), T0 + 9).state
    assert (new.outcome, new.exit_code) == (Outcome.FAILED, None)
    assert new.reason == f"attempt 1 failed: {why}"
    assert "killed" not in new.reason


# -- CANCELLING, CLEANING, Tick ------------------------------------------------------------


def test_cancelling_finished_completes_cancelled():
    result = step(cancelling(), observed(AttemptPhase.FAILED, "terminated", 143), T0 + 1)
    new = result.state
    assert new.status is Status.COMPLETED
    assert new.outcome is Outcome.CANCELLED
    assert new.reason == "cancelled by bob"
    assert new.stop is None and new.run_attempt is None
    assert deletes(result) == [Delete(RUN, "fake", NAME, HANDLE)]


def test_cancelling_finished_with_cleanup_goes_cleaning_then_keeps_cancelled():
    state = cancelling()
    result = step(state, observed(AttemptPhase.FAILED, "terminated", 143), T0 + 1, has_cleanup=True)
    assert result.state.status is Status.CLEANING
    assert result.state.outcome is Outcome.CANCELLED
    assert NeedsCleanup() in result.effects
    state = step(result.state, CleanupAdmit(CLEANUP_NAME, "fake", 0), T0 + 1, True).state
    state = step(state, Started(CLEANUP, {"name": CLEANUP_NAME}), T0 + 1, True).state
    done = step(state, observed(AttemptPhase.SUCCEEDED, exit_code=0, purpose=CLEANUP), T0 + 2, True)
    assert done.state.status is Status.COMPLETED
    assert done.state.outcome is Outcome.CANCELLED


def test_cleaning_admit_names_and_starts_the_cleanup():
    state = step(active(), observed(AttemptPhase.SUCCEEDED, exit_code=0), T0 + 5, True).state
    result = step(state, CleanupAdmit(CLEANUP_NAME, "fake", 42), T0 + 5, True)
    assert result.state.cleanup_attempt.to_json() == {
        "kind": "fake",
        "name": CLEANUP_NAME,
        "handle": None,
        "origin": 42,
        "phase": "STARTING",
    }
    assert result.effects == [Start(CLEANUP)]
    again = step(result.state, CleanupAdmit("other", "fake", 0), T0 + 6, True)
    assert again.state == result.state and again.effects == []


@pytest.mark.parametrize(
    ("run_phase", "run_code", "outcome"),
    [(AttemptPhase.SUCCEEDED, 0, Outcome.SUCCEEDED), (AttemptPhase.FAILED, 3, Outcome.FAILED)],
)
@pytest.mark.parametrize("cleanup_code", [0, 1])
def test_cleaning_finished_completes_keeping_the_run_outcome(
    run_phase, run_code, outcome, cleanup_code
):
    state = cleaning(run_phase, run_code)
    cleanup_phase = AttemptPhase.SUCCEEDED if cleanup_code == 0 else AttemptPhase.FAILED
    obs = observed(cleanup_phase, exit_code=cleanup_code, purpose=CLEANUP)
    result = step(state, obs, T0 + 7, has_cleanup=True)
    new = result.state
    assert new.status is Status.COMPLETED
    assert new.outcome is outcome
    assert new.exit_code == run_code  # the run's, not the cleanup's
    assert new.cleanup_attempt is None
    assert deletes(result) == [Delete(CLEANUP, "fake", CLEANUP_NAME, {"name": CLEANUP_NAME})]
    assert f"exited with status {run_code}" in new.reason  # the run's reason stays
    assert ("(cleanup" in new.reason) == (cleanup_code != 0)


def test_completed_after_cleanup_does_not_say_the_cleanup_is_running():
    state = cleaning(AttemptPhase.FAILED, 3)
    obs = observed(AttemptPhase.SUCCEEDED, exit_code=0, purpose=CLEANUP)
    new = step(state, obs, T0 + 7, has_cleanup=True).state
    assert new.status is Status.COMPLETED
    assert "running the cleanup command" not in new.reason


def test_cleaning_start_failed_completes_keeping_the_run_outcome():
    state = step(active(), observed(AttemptPhase.SUCCEEDED, exit_code=0), T0 + 5, True).state
    state = step(state, CleanupAdmit(CLEANUP_NAME, "fake", 0), T0 + 5, True).state
    result = step(state, StartFailed(CLEANUP, "boom"), T0 + 6, True)
    assert result.state.status is Status.COMPLETED
    assert result.state.outcome is Outcome.SUCCEEDED
    assert "boom" in result.state.reason
    assert deletes(result) == [Delete(CLEANUP, "fake", CLEANUP_NAME, None)]


def test_tick_before_the_deadline_reissues_stop_without_killed():
    state = cancelling(now=T0, grace=30.0)
    result = step(state, Tick(), T0 + 10)
    assert result.effects == [Stop(RUN, T0 + 30)]
    assert result.events == []
    assert not result.state.stop.forced
    assert result.state.status is Status.CANCELLING


def test_tick_after_the_deadline_records_killed_once():
    state = cancelling(now=T0, grace=30.0)
    first = step(state, Tick(), T0 + 30)
    assert first.effects == [Stop(RUN, T0 + 30)]
    assert event_names(first) == ["KILLED"]
    assert "30s" in first.events[0][1]
    assert first.state.stop.forced is True
    second = step(first.state, Tick(), T0 + 40)
    assert second.effects == [Stop(RUN, T0 + 30)]
    assert second.events == []
    assert second.state == first.state


def test_tick_without_a_stop_does_nothing():
    for state in (pending(), active()):
        result = step(state, Tick(), T0 + 100)
        assert result.state == state and result.effects == [] and result.events == []


# -- properties ----------------------------------------------------------------------------


def _all_moves():
    """(state, event, has_cleanup) covering every row of the table."""
    preempting = step(active(), Preempt("needed", "x", 10.0), T0).state
    running_cleanup = cleaning()
    return [
        (pending(), admit(), False),
        (pending(), Reject("no"), False),
        (pending(), Cancel("c", 1.0), False),
        (pending(), Wait("w"), False),
        (step(pending(), admit()).state, Started(RUN, HANDLE), False),
        (step(pending(), admit()).state, StartFailed(RUN, "err"), False),
        (active(AttemptPhase.QUEUED), observed(AttemptPhase.RUNNING), False),
        (active(None), observed(AttemptPhase.PROVISIONING, "x"), False),
        (active(), Preempt("p", "x", 10.0), False),
        (active(), Update("u", 10.0), False),
        (active(), Cancel("c", 10.0), False),
        (preempting, observed(AttemptPhase.FAILED, exit_code=143), False),
        (preempting, Cancel("c", 10.0), False),
        (active(), observed(AttemptPhase.PREEMPTED, "spot"), False),
        (active(), observed(AttemptPhase.LOST, "gone"), False),
        (active(), observed(AttemptPhase.SUCCEEDED, exit_code=0), True),
        (active(), observed(AttemptPhase.FAILED, exit_code=3), False),
        (cancelling(), observed(AttemptPhase.FAILED, exit_code=143), False),
        (cancelling(), Tick(), False),
        (step(cancelling(), Tick(), T0 + 99).state, Tick(), False),
        (running_cleanup, observed(AttemptPhase.SUCCEEDED, exit_code=0, purpose=CLEANUP), True),
        (running_cleanup, observed(AttemptPhase.RUNNING, purpose=CLEANUP), True),
    ]


@pytest.mark.parametrize("case", range(len(_all_moves())))
def test_the_input_state_is_never_mutated(case):
    state, event, has_cleanup = _all_moves()[case]
    before = copy.deepcopy(state)
    before_json = state.dumps()
    result = step(state, event, T0 + 99, has_cleanup=has_cleanup)
    assert state == before
    assert state.dumps() == before_json
    assert result.state is not state
    assert result.state.events is not state.events


def _no_row_cases():
    completed = step(active(), observed(AttemptPhase.SUCCEEDED, exit_code=0), T0 + 9).state
    never_started = step(pending(), admit()).state
    return [
        (pending(), Preempt("p", "x", 1.0)),
        (pending(), Update("u", 1.0)),
        (pending(), Tick()),
        (pending(), observed(AttemptPhase.RUNNING)),
        (pending(), Started(RUN, HANDLE)),
        (pending(), StartFailed(RUN, "err")),
        (pending(), CleanupAdmit(CLEANUP_NAME, "fake", 0)),
        (active(), admit()),
        (active(), Reject("no")),
        (active(), Wait("w")),
        (active(), CleanupAdmit(CLEANUP_NAME, "fake", 0)),
        (active(), observed(AttemptPhase.RUNNING, purpose=CLEANUP)),
        (never_started, Tick()),
        (cancelling(), admit()),
        (cancelling(), Cancel("again", 1.0)),
        (cancelling(), Wait("w")),
        (cleaning(), Cancel("late", 1.0)),
        (cleaning(), Preempt("p", "x", 1.0)),
        (cleaning(), admit()),
        (completed, admit()),
        (completed, Cancel("late", 1.0)),
        (completed, Reject("no")),
        (completed, Preempt("p", "x", 1.0)),
        (completed, observed(AttemptPhase.SUCCEEDED, exit_code=0)),
        (completed, Tick()),
    ]


@pytest.mark.parametrize("case", range(len(_no_row_cases())))
def test_events_without_a_row_change_nothing(case):
    state, event = _no_row_cases()[case]
    result = step(state, event, T0 + 123)
    assert result.state == state, type(event).__name__
    assert result.effects == []
    assert result.events == []


def test_cancelling_cancel_again_keeps_the_first_deadline():
    state = cancelling(now=T0, grace=30.0)
    result = step(state, Cancel("again", 5.0), T0 + 1)
    assert result.state.stop.deadline == T0 + 30
    assert result.state.status is Status.CANCELLING


def test_result_defaults_and_module_names():
    assert lifecycle.RUN == "run" and lifecycle.CLEANUP == "cleanup"
    result = lifecycle.Result(pending())
    assert result.effects == [] and result.events == []


# -- starts that keep failing (issue 21, point 2) ------------------------------------------------


def test_start_deferred_records_its_first_failure_and_says_when_it_gives_up():
    state = step(pending(), admit()).state
    first = step(state, StartDeferred(RUN, "engine busy", give_up_after=60), T0 + 1).state
    assert first.status is Status.ACTIVE and first.run_attempt.deferred_since == T0 + 1
    assert first.reason.startswith("attempt 1 waits to start: engine busy; gives up at ")
    later = step(first, StartDeferred(RUN, "engine busy", give_up_after=60), T0 + 30).state
    assert later.run_attempt.deferred_since == T0 + 1  # the first failure's time is kept
    assert later == first  # nothing new to write while it waits


def test_start_deferred_past_its_bound_fails_the_job_with_the_last_reason():
    state = step(pending(), admit()).state
    state = step(state, StartDeferred(RUN, "engine busy", give_up_after=60), T0 + 1).state
    result = step(state, StartDeferred(RUN, "engine gone", give_up_after=60), T0 + 61)
    new = result.state
    assert (new.status, new.outcome) == (Status.COMPLETED, Outcome.FAILED)
    assert "engine gone" in new.reason and "gave up" in new.reason
    assert new.run_attempt is None and deletes(result) == [Delete(RUN, "fake", NAME, None)]
    assert "could not start" in logs(result)[0].text


def test_a_wait_for_capacity_has_no_bound():
    state = step(pending(), admit()).state
    state = step(state, StartDeferred(RUN, "waiting for capacity", None), T0 + 1).state
    state = step(state, StartDeferred(RUN, "waiting for capacity", None), T0 + 86_400).state
    assert state.status is Status.ACTIVE and "gives up" not in state.reason


def test_cancel_of_a_start_that_waits_ends_cancelled_at_the_next_tick():
    state = step(pending(), admit()).state
    state = step(state, StartDeferred(RUN, "engine busy", give_up_after=600), T0 + 1).state
    state = step(state, Cancel("cancelled by bob", 30.0), T0 + 2).state
    assert state.status is Status.CANCELLING
    result = step(state, Tick(), T0 + 3)
    new = result.state
    assert (new.status, new.outcome) == (Status.COMPLETED, Outcome.CANCELLED)
    assert new.reason == "cancelled by bob" and new.run_attempt is None
    assert deletes(result) == [Delete(RUN, "fake", NAME, None)]


def test_cancel_whose_start_then_fails_transiently_ends_cancelled():
    state = step(pending(), admit()).state  # its start is in flight when the cancel comes
    state = step(state, Cancel("cancelled by bob", 30.0), T0 + 1).state
    assert step(state, Tick(), T0 + 2).state.status is Status.CANCELLING  # may still start
    new = step(state, StartDeferred(RUN, "engine busy", 600), T0 + 2).state
    assert (new.status, new.outcome) == (Status.COMPLETED, Outcome.CANCELLED)
