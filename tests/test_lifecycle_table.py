"""The lifecycle table as data (bastion.lifecycle.ROWS): every event type has rows, every
(status, event) pair either has a row or provably changes nothing, and the daemon's own
writes of a job's state (birth, spec updates, the could-not-watch reason, tier changes,
history notes, starts again) are rows too, so the table is the only writer of job state."""

from __future__ import annotations

import typing

from hypothesis import given, settings
from hypothesis import strategies as st

from bastion import lifecycle
from bastion.jobstate import AttemptRecord, JobState, Status, StopRecord
from bastion.runners.base import AttemptPhase, Observation

EVENT_TYPES = typing.get_args(lifecycle.Event)
TEXT = st.text(max_size=20)


def _event_strategy(kind: type) -> st.SearchStrategy:
    """Any instance of an event type, its fields drawn by type."""
    observation = st.builds(
        Observation,
        phase=st.sampled_from(list(AttemptPhase)),
        reason=TEXT,
        exit_code=st.none() | st.integers(0, 255),
        retryable=st.booleans(),
    )
    by_field = {
        "purpose": st.sampled_from([lifecycle.RUN, lifecycle.CLEANUP]),
        "observation": observation,
        "handle": st.just({"name": "h"}),
        "tier": st.none() | st.integers(0, 2),
        "grace": st.floats(0, 60),
        "give_up_after": st.none() | st.floats(0, 600),
        "attempt": st.none() | st.integers(1, 5),
        "log_size": st.integers(0, 100),
        "log_start": st.none() | st.integers(0, 100),
        "backfill_for": st.just(()),
        "by": st.none() | TEXT,
    }
    fields = {
        name: by_field.get(name, TEXT)
        for name in kind.__dataclass_fields__  # type: ignore[attr-defined]
    }
    if kind is lifecycle.TierKept:
        fields["tier"] = st.integers(0, 2)
    return st.builds(kind, **fields)


def _state_strategy() -> st.SearchStrategy:
    record = st.fixed_dictionaries(
        {
            "kind": st.just("local"),
            "name": st.just("bst-x-a1"),
            "phase": st.just("RUNNING"),
            "origin": st.just(0),
            "handle": st.none() | st.just({"name": "h"}),
        }
    )
    stop = st.none() | st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["PREEMPT", "CANCEL", "UPDATE"]),
            "since": st.just(0.0),
            "deadline": st.floats(0, 100),
            "reason": TEXT,
        }
    )
    return st.builds(
        JobState,
        status=st.sampled_from(list(Status)),
        attempt=st.integers(0, 3),
        reason=TEXT,
        run_attempt=st.none() | record.map(AttemptRecord.from_json),
        stop=stop.map(lambda s: s and StopRecord.from_json(s)),
        job_identity=st.sampled_from(["", "id-1"]),
        tier=st.none() | st.integers(0, 2),
    )


def test_every_event_type_has_at_least_one_row():
    with_rows = {row.event for row in lifecycle.ROWS}
    assert set(EVENT_TYPES) - with_rows == set()


def test_every_row_says_what_it_does():
    assert all(row.says for row in lifecycle.ROWS)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_an_event_without_a_row_changes_nothing(data):
    """Walks (status, event) pairs: no row means the same state, no effect, no history."""
    state = data.draw(_state_strategy())
    kind = data.draw(st.sampled_from(EVENT_TYPES))
    event = data.draw(_event_strategy(kind))
    before = JobState.loads(state.dumps())
    result = lifecycle.transition(state, event, now=50.0, job="j", has_cleanup=False)
    assert state.dumps() == before.dumps()  # the input is never modified
    if lifecycle.row_for(state, event) is None:
        assert result.state.dumps() == state.dumps()
        assert result.effects == [] and result.events == [] and result.notes == []


def test_a_new_spec_is_born_through_the_table():
    state = JobState(submit_time=1.0)
    event = lifecycle.Detected("id-1", "sha256:ab", "sub123", "job-uuid")
    result = lifecycle.transition(state, event, now=2.0)
    assert (result.state.job_identity, result.state.spec_digest) == ("id-1", "sha256:ab")
    assert result.state.submission == "sub123"
    assert result.state.events[-1]["event"] == "PENDING"
    assert result.state.reason == "spec detected (job_id=job-uuid)"
    again = lifecycle.transition(result.state, lifecycle.Detected("id-2", "d", "s", "j"), 3.0)
    assert again.state.job_identity == "id-1"  # a second birth changes nothing


def test_blind_then_sighted_restores_the_reason_from_before():
    state = JobState(status=Status.ACTIVE, reason="running on node a")
    blind = lifecycle.transition(state, lifecycle.Blind("could not watch attempt 1: boom"), 1.0)
    assert blind.state.reason.startswith("could not watch attempt")
    back = lifecycle.transition(blind.state, lifecycle.Sighted("running on node a"), 2.0)
    assert back.state.reason == "running on node a"
    other = JobState(status=Status.ACTIVE, reason="something newer")
    assert lifecycle.transition(other, lifecycle.Sighted("old"), 3.0).state.reason == (
        "something newer"
    )  # only a could-not-watch reason is undone


def test_tier_changes_of_a_running_job_are_recorded_without_a_restart():
    state = JobState(status=Status.ACTIVE, tier=0)
    result = lifecycle.transition(state, lifecycle.TierKept(1), 1.0)
    assert result.state.tier == 1 and result.effects == []


def test_start_again_starts_only_an_attempt_not_known_started():
    unstarted = JobState(status=Status.ACTIVE, run_attempt=AttemptRecord.admitted("local", "a1", 0))
    assert lifecycle.transition(unstarted, lifecycle.StartAgain("run"), 1.0).effects == [
        lifecycle.Start("run")
    ]
    started = JobState(status=Status.ACTIVE, run_attempt=unstarted.run_attempt.started({"pid": 1}))
    assert lifecycle.transition(started, lifecycle.StartAgain("run"), 1.0).effects == []


def test_a_note_adds_a_history_line_and_keeps_the_reason():
    state = JobState(status=Status.ACTIVE, attempt=2, reason="running")
    result = lifecycle.transition(state, lifecycle.Noted("DELETED", "deleted node x", 1), 5.0)
    assert result.state.reason == "running"
    assert result.state.events[-1] == {
        "time": 5.0,
        "event": "DELETED",
        "status": "ACTIVE",
        "attempt": 1,
        "reason": "deleted node x",
    }
