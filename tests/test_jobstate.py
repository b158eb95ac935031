"""The state wire format: AXLearn-compatible shape, legacy text, bounded events."""

import json

from bastion.jobstate import KEPT_FIRST_EVENTS, MAX_EVENTS, JobState, Outcome, Status


def test_round_trip_keeps_axlearn_shape():
    state = JobState(status=Status.ACTIVE, attempt=2, tier=1, reason="running")
    data = json.loads(state.dumps())
    assert data["status"] == "ACTIVE" and data["metadata"] == {"tier": 1}
    assert JobState.loads(state.dumps()).to_json() == state.to_json()


def test_legacy_plain_text_status_loads():
    assert JobState.loads(b"active\n").status is Status.ACTIVE


def test_completed_jobs_display_their_outcome():
    state = JobState(status=Status.COMPLETED, outcome=Outcome.FAILED)
    assert state.display_status == "FAILED"
    assert JobState(status=Status.CLEANING, outcome=Outcome.FAILED).display_status == "CLEANING"


def test_events_are_bounded_keeping_the_first_and_the_latest():
    state = JobState()
    for i in range(MAX_EVENTS + 50):
        state.add_event({"n": i})
    numbers = [e["n"] for e in state.events]
    assert len(numbers) == MAX_EVENTS
    assert numbers[:KEPT_FIRST_EVENTS] == list(range(KEPT_FIRST_EVENTS))
    assert numbers[-1] == MAX_EVENTS + 49
    assert numbers[KEPT_FIRST_EVENTS] == KEPT_FIRST_EVENTS + 50
