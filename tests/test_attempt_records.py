"""The typed attempt and stop records keep the bucket's JSON exactly as daemons wrote it.

``tests/data/states_from_main/`` holds state files as the daemon on main wrote them before the
records were typed (copied from ``jobs/states/<name>`` of a real root: local runner, jobs run,
cancelled past their grace, preempted by a project reclaiming its quota, cleaned up). Each must
load into typed records and be written back byte for byte, so roots written by an older daemon
keep working after an upgrade, and a newer daemon's extra keys survive an older one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bastion import lifecycle
from bastion.attempt_records import AttemptRecord, StopRecord
from bastion.jobstate import JobState, Status, StopKind
from bastion.runners.base import AttemptPhase, Observation

STATES = Path(__file__).parent / "data" / "states_from_main"
FIXTURES = sorted(STATES.glob("*.json"))


def _load(name: str) -> dict:
    return json.loads((STATES / name).read_bytes())


def _round_trip(data: dict) -> dict:
    return json.loads(JobState.loads(json.dumps(data).encode()).dumps())


def test_the_fixtures_cover_every_record_an_older_daemon_writes():
    names = {p.stem for p in FIXTURES}
    assert {"starting", "running", "cancelling", "cancelling-forced", "preempting"} <= names
    assert {"cleaning", "preempted-pending", "cancelled"} <= names


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_a_state_written_by_main_is_written_back_byte_for_byte(path):
    raw = path.read_bytes()
    assert JobState.loads(raw).dumps() == raw


def test_the_records_of_main_load_typed():
    running = JobState.loads((STATES / "running.json").read_bytes())
    record = running.run_attempt
    assert isinstance(record, AttemptRecord)
    assert record.kind == "local" and record.phase == "RUNNING" and not record.unstarted
    assert record.name == record.handle["name"] and record.origin == 77
    assert running.cleanup_attempt is None and running.stop is None

    starting = JobState.loads((STATES / "starting.json").read_bytes())
    assert starting.run_attempt.unstarted and starting.display_status == "STARTING"

    forced = JobState.loads((STATES / "cancelling-forced.json").read_bytes()).stop
    assert isinstance(forced, StopRecord)
    assert forced.kind is StopKind.CANCEL and forced.is_cancel and forced.forced
    assert forced.deadline - forced.since == pytest.approx(2.0)

    preempting = JobState.loads((STATES / "preempting.json").read_bytes()).stop
    assert preempting.kind is StopKind.PREEMPT and preempting.by == "a1"
    assert not preempting.forced

    cleaning = JobState.loads((STATES / "cleaning.json").read_bytes())
    assert cleaning.status is Status.CLEANING and cleaning.run_attempt is None
    assert cleaning.cleanup_attempt.name.endswith("-a1c")


def test_optional_attempt_keys_are_written_only_when_set():
    data = _load("starting.json")
    assert "deferred_since" not in data["runner"] and "workers" not in data["runner"]
    data["runner"] = {**data["runner"], "deferred_since": 12.5, "workers": ["running", "late"]}
    assert _round_trip(data) == data
    record = JobState.from_json(data).run_attempt
    assert record.deferred_since == 12.5 and record.workers == ("running", "late")


def test_unknown_keys_of_a_newer_daemon_are_kept_on_a_round_trip():
    data = _load("preempting.json")
    data["runner"] = {**data["runner"], "zone_hint": "us-central2-b", "retries": [1, 2]}
    data["stop"] = {**data["stop"], "requested_by": "ops"}
    data["cleanup_runner"] = {**data["runner"], "cost": {"usd": 1.5}}
    state = JobState.from_json(data)
    assert state.run_attempt.extra == {"zone_hint": "us-central2-b", "retries": [1, 2]}
    assert state.stop.extra == {"requested_by": "ops"}
    assert _round_trip(data) == data
    # An update through the table keeps them too (a copy of the record, not a new one).
    observed = lifecycle.transition(
        state,
        lifecycle.Observed("run", Observation(AttemptPhase.PROVISIONING)),
        now=state.stop.since + 0.5,
    )
    assert observed.state.run_attempt.phase == "PROVISIONING"
    assert observed.state.run_attempt.to_json()["zone_hint"] == "us-central2-b"


def test_a_stop_written_before_deadlines_gets_since_plus_grace():
    data = _load("preempting.json")
    stop = {k: v for k, v in data["stop"].items() if k != "deadline"}
    data["stop"] = {**stop, "since": 100.0, "grace": 5}
    back = _round_trip(data)
    assert back["stop"] == {**data["stop"], "deadline": 105.0}
    no_grace = {**data, "stop": {"kind": "cancel", "since": 100.0}}
    assert JobState.from_json(no_grace).stop.deadline == 130.0  # the default grace, 30 s


def test_records_missing_keys_get_defaults():
    state = JobState.from_json(
        {"status": "ACTIVE", "runner": {"kind": "local"}, "stop": {"kind": "update"}}
    )
    assert state.run_attempt == AttemptRecord(kind="local", name=None)
    assert state.run_attempt.origin == 0 and state.run_attempt.unstarted
    assert state.stop.kind is StopKind.UPDATE and state.stop.reason == ""
    assert state.stop.by is None and not state.stop.forced


def test_an_empty_record_is_no_record_as_before():
    state = JobState.from_json({"status": "ACTIVE", "runner": {}, "stop": {}})
    assert state.run_attempt is None and state.stop is None


def test_a_stop_kind_this_daemon_does_not_know_is_kept_as_written():
    data = _load("preempting.json")
    data["stop"] = {**data["stop"], "kind": "drain"}
    state = JobState.from_json(data)
    assert state.stop.kind == "drain" and not state.stop.is_cancel
    assert _round_trip(data) == data


def test_records_are_frozen_and_updated_by_named_copies():
    record = AttemptRecord.admitted("local", "bst-x-a1", 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.phase = "RUNNING"  # type: ignore[misc]
    started = record.started({"pid": 1}).with_phase("RUNNING")
    assert record.unstarted and record.phase == "STARTING"  # the original is unchanged
    assert started.handle == {"pid": 1} and started.phase == "RUNNING"
    stop = StopRecord(kind=StopKind.CANCEL, since=1.0, deadline=3.0)
    assert stop.as_forced().forced and not stop.forced


def test_the_json_keys_stay_runner_cleanup_runner_and_stop():
    state = JobState.loads((STATES / "cleaning.json").read_bytes())
    data = state.to_json()
    assert {"runner", "cleanup_runner", "stop"} <= set(data)
    assert not {"run_attempt", "cleanup_attempt"} & set(data)
    assert data["cleanup_runner"] == _load("cleaning.json")["cleanup_runner"]
