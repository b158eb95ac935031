"""The state wire format: AXLearn-compatible shape, legacy text, bounded events."""

import json
import sys

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


def test_a_loaded_state_is_what_the_constructor_makes_and_owns_its_lists():
    """from_json fills the fields directly (not through __init__): a field the JSON lacks is
    at its default, a loaded state counts as changed until written, and two loaded states
    never share the default events list or metadata dict."""
    empty = JobState.from_json({})
    assert empty == JobState() and vars(empty).keys() == vars(JobState()).keys()
    assert empty.changed
    full = JobState(status=Status.ACTIVE, attempt=3, reason="r", pending_since=1.5, tier=2)
    full.add_event({"event": "STARTED"})
    assert JobState.from_json(json.loads(full.dumps())).to_json() == full.to_json()
    first, second = JobState.loads(b"{}"), JobState.loads(b"{}")
    first.mark_written()
    first.add_event({"n": 1})
    first.metadata["x"] = 1
    assert second.events == [] and second.metadata == {} and first.changed
    assert JobState().events == [] and JobState().metadata == {}
    # set in __init__'s order, so its attributes share the class's table of keys (100,000
    # states held: 60 MB less than a dict of their own each)
    loaded = JobState.from_json(json.loads(full.dumps()))
    assert sys.getsizeof(vars(loaded)) == sys.getsizeof(vars(JobState()))


def test_a_copy_is_what_replace_makes_marked_changed_with_events_of_its_own():
    import dataclasses

    state = JobState.loads(
        JobState(status=Status.ACTIVE, attempt=3, reason="running", submit_time=1.5).dumps()
    )
    state.add_event({"n": 1})
    state.mark_written()
    copied, replaced = state.copy(), dataclasses.replace(state, events=list(state.events))
    assert copied == replaced and copied.to_json() == state.to_json()
    assert copied.changed and not state.changed  # a new state is unwritten
    assert list(vars(copied)) == list(vars(replaced))  # same key order: one shared key table
    copied.add_event({"n": 2})
    assert len(state.events) == 1  # the table changes the copy's events, never the original's
