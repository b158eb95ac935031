"""Slurm's job semantics, the pure parts: time limits (bastion/timelimits.py and the table's
TimedOut row), dependencies and group limits (bastion/dependencies.py), the spec's fields
(bastion/spec_scheduling.py), and arrays and sweeps expanded in the client
(launch/expand.py). No processes, no bucket: the daemon and the CLI are in
tests/test_job_rules_end_to_end.py."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from bastion.bucket.store import Store
from bastion.dependencies import Gate, Member, dependency_verdict, find_cycle, group_held
from bastion.jobspec import JobSpec, SpecError, new_jobspec
from bastion.jobstate import Outcome, Status, StopKind
from bastion.lifecycle import RUN, Cancel, Observed, Preempt, Stop, TimedOut
from bastion.runners.base import AttemptPhase, Observation
from bastion.timelimits import fmt_duration, parse_time_limit, time_left, time_used
from launch import expand
from launch.api import Client
from launch.submitting import SubmitRefused
from tests.test_lifecycle import T0, active, admit, step

# -- time limits: how they are written -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2h", 7200),
        ("90m", 5400),
        ("1h30m", 5400),
        ("45s", 45),
        ("1d", 86400),
        ("1-00:00:00", 86400),  # sbatch's days-hours:minutes:seconds
        ("2-3", 2 * 86400 + 3 * 3600),  # days-hours
        ("1-2:30", 86400 + 2 * 3600 + 30 * 60),  # days-hours:minutes
        ("30", 1800),  # sbatch: a bare number is minutes
        ("1:30", 90),  # minutes:seconds
        ("1:00:00", 3600),  # hours:minutes:seconds
    ],
)
def test_time_limits_parse_as_sbatch_takes_them(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["2x", "", "h", "1-", "-1", "1:2:3:4", "two hours", "0", "0s"])
def test_a_malformed_time_limit_names_the_flag_and_the_forms(text):
    with pytest.raises(SpecError) as e:
        parse_time_limit(text, "--time")
    assert str(e.value).startswith("--time: ")
    assert "2h" in str(e.value) or "more than 0" in str(e.value)


def test_a_time_limit_over_a_year_is_refused():
    with pytest.raises(SpecError, match="at most"):
        parse_time_limit("400d")


def test_fmt_duration_shows_the_two_largest_units():
    assert [fmt_duration(s) for s in (12, 250, 5400, 93600)] == ["12s", "4m10s", "1h30m", "1d2h"]


# -- time limits: what counts ----------------------------------------------------------------


def test_only_running_time_counts_summed_over_attempts_preemption_excluded():
    state = active(now=T0)  # RUNNING since T0
    assert time_used(state, T0 + 100) == 100
    state = step(state, Preempt("reclaimed", "other", 30.0), T0 + 100).state
    ended = Observed(RUN, Observation(AttemptPhase.FAILED, "", 143))
    state = step(state, ended, T0 + 110).state  # the stop took 10 s: still running time
    assert state.status is Status.PENDING and state.ran_seconds == 110
    assert time_used(state, T0 + 5000) == 110  # pending (preempted) time does not count
    state = step(state, admit(), T0 + 5000).state
    assert time_used(state, T0 + 5050) == 110  # provisioning: not running yet
    running = Observed(RUN, Observation(AttemptPhase.RUNNING, ""))
    state = step(state, running, T0 + 5050).state
    assert time_used(state, T0 + 5060) == 120
    assert time_left(200, state, T0 + 5060) == 80
    assert time_left(None, state, T0 + 5060) is None


def test_a_time_limit_stops_the_attempt_then_ends_timeout_without_requeue():
    state = active()
    result = step(state, TimedOut("time limit 1m reached", 30.0), T0 + 60)
    assert result.state.status is Status.ACTIVE
    assert result.state.stop.kind == StopKind.TIMEOUT.value
    assert result.effects == [Stop(RUN, T0 + 90)]  # the grace, as a cancel gets
    assert [name for name, _ in result.events] == ["TIME_LIMIT"]
    assert step(result.state, TimedOut("again", 30.0), T0 + 61).effects == []  # once
    ended = Observed(RUN, Observation(AttemptPhase.FAILED, "", 143))
    final = step(result.state, ended, T0 + 62).state
    assert final.status is Status.COMPLETED and final.outcome is Outcome.TIMEOUT
    assert final.reason == "time limit 1m reached"
    assert final.display_status == "TIMEOUT"


def test_a_time_limit_overrides_a_preemption_in_progress_but_not_a_cancel():
    preempting = step(active(), Preempt("reclaimed", "other", 30.0), T0 + 1).state
    timed = step(preempting, TimedOut("time limit reached", 30.0), T0 + 2).state
    assert timed.stop.kind == StopKind.TIMEOUT.value
    ended = Observed(RUN, Observation(AttemptPhase.FAILED, "", 143))
    assert step(timed, ended, T0 + 3).state.outcome is Outcome.TIMEOUT  # not requeued

    cancelling = step(active(), Cancel("cancelled by bob", 30.0), T0 + 1).state
    after = step(cancelling, TimedOut("time limit reached", 30.0), T0 + 2).state
    assert after.stop.kind == StopKind.CANCEL.value


# -- dependencies and group limits -----------------------------------------------------------


def test_a_dependency_waits_with_the_reason_users_read():
    verdict = dependency_verdict(["train"], False, {"train": "ACTIVE"})
    assert verdict.gate is Gate.WAIT and verdict.reason == "waiting for train (RUNNING)"
    two = dependency_verdict(["a", "b"], False, {"a": "SUCCEEDED", "b": "PENDING"})
    assert two.reason == "waiting for b (PENDING)"
    assert dependency_verdict(["a"], False, {"a": "SUCCEEDED"}).gate is Gate.READY


@pytest.mark.parametrize("end", ["FAILED", "CANCELLED", "TIMEOUT", "REJECTED"])
def test_a_failed_dependency_can_never_be_satisfied_unless_any_end_will_do(end):
    verdict = dependency_verdict(["train"], False, {"train": end})
    assert verdict.gate is Gate.NEVER and verdict.reason == f"dependency train {end}"
    assert dependency_verdict(["train"], True, {"train": end}).gate is Gate.READY


def test_a_vanished_dependency_can_never_be_satisfied():
    verdict = dependency_verdict(["gone"], True, {"gone": None})
    assert verdict.gate is Gate.NEVER and "gone" in verdict.reason


def test_a_group_limit_offers_the_lowest_indices_up_to_the_room_left():
    members = [Member(f"a-{i}", i, "PENDING") for i in range(6)]
    members[4] = Member("a-4", 4, "ACTIVE")  # one holds capacity already
    held = group_held("a", members, 3)
    assert sorted(held) == ["a-2", "a-3", "a-5"]  # a-0 and a-1 are offered (3 - 1 running)
    assert all(v.gate is Gate.WAIT for v in held.values())
    assert "at most 3" in held["a-5"].reason
    assert group_held("a", members, None) == {}


def test_a_cycle_is_found_through_live_dependencies():
    after_of = {"b": ["c"], "c": ["a"]}
    assert find_cycle("a", ["b"], after_of) == ["a", "b", "c", "a"]
    assert find_cycle("a", ["a"], {}) == ["a", "a"]
    assert find_cycle("a", ["b"], {"b": ["c"], "c": []}) == []


# -- the spec's fields -----------------------------------------------------------------------


def _spec(**fields) -> JobSpec:
    return new_jobspec(name="j", command="true", user_id="u", project_id="p", **fields)


def test_scheduling_fields_round_trip_and_are_written_only_when_set():
    plain = _spec()
    assert {"time_limit", "after", "after_any", "group"}.isdisjoint(plain.to_json())
    spec = _spec(time_limit="2h", after="a, b", after_any=True)
    loaded = JobSpec.loads(spec.dumps())
    assert (loaded.time_limit, loaded.after, loaded.after_any) == (7200, ["a", "b"], True)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("time_limit", -5, "field time_limit"),
        ("time_limit", "2h", "field time_limit"),  # the spec holds seconds; the API parses text
        ("after", [], "field after"),
        ("after", ["../x"], "field after"),
        ("after", ["a", "a"], "twice"),
        ("after_any", "yes", "field after_any"),
        ("group", {"name": "g", "index": -1, "size": 1}, "field group.index"),
        ("group", {"name": "g", "index": 0, "size": 1, "max_running": 0}, "max_running"),
        ("group", {"name": "g", "index": 0, "size": 1, "colour": 1}, "unknown key"),
    ],
)
def test_a_bad_scheduling_field_in_a_spec_names_the_field(field, value, says):
    data = _spec().to_json()
    data[field] = value
    with pytest.raises(SpecError, match=says):
        JobSpec.from_json(data)


# -- arrays ----------------------------------------------------------------------------------


def test_array_forms_give_the_indices_and_the_limit():
    assert [m.index for m in expand.parse_array("0-3").members] == [0, 1, 2, 3]
    assert expand.parse_array("0-99%8").max_running == 8
    assert [m.index for m in expand.parse_array("1,3,5").members] == [1, 3, 5]
    assert [m.index for m in expand.parse_array("0-9:2").members] == [0, 2, 4, 6, 8]
    assert [m.index for m in expand.parse_array("1,4-8:2%2").members] == [1, 4, 6, 8]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0-999999", "1,000,000"),
        ("0-9999999999", "limit is 10,000"),
        ("a-b", "not an index or range"),
        ("5-1", "runs backwards"),
        ("0-9%0", "at least 1"),
        ("0-9%x", "at least 1"),
        ("", "not an index or range"),
    ],
)
def test_a_bad_array_is_refused_naming_the_flag(text, says):
    with pytest.raises(SpecError) as e:
        expand.parse_array(text)
    assert str(e.value).startswith("--array: ") and says in str(e.value)


def test_array_members_get_their_names_group_and_index():
    template = _spec(env_vars={"KEEP": "1"})
    specs = expand.expand(template, expand.parse_array("0-2%2"))
    assert [s.name for s in specs] == ["j-0", "j-1", "j-2"]
    assert specs[1].env_vars == {
        "KEEP": "1",
        "BASTION_ARRAY_ID": "j",
        "BASTION_ARRAY_INDEX": "1",
        "BASTION_ARRAY_SIZE": "3",
    }
    assert specs[2].group == {"name": "j", "index": 2, "size": 3, "kind": "array", "max_running": 2}
    assert len({s.metadata.job_id for s in specs}) == 3  # each a submission of its own
    for spec in specs:
        JobSpec.loads(spec.dumps())


def test_a_member_name_past_the_limit_is_refused_naming_the_fix():
    template = new_jobspec(name="n" * 62, command="true", user_id="u", project_id="p")
    with pytest.raises(SpecError, match="shorter --name"):
        expand.expand(template, expand.parse_array("0-10"))


# -- sweeps ----------------------------------------------------------------------------------


def _sweep(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return str(path)


def test_a_sweep_of_axes_is_every_combination(tmp_path):
    found = expand.load_sweep(
        _sweep(tmp_path, 'max_running = 2\n[axes]\nLR = [0.1, 0.01]\nOPT = ["adam", "sgd"]\n')
    )
    assert found.max_running == 2 and found.kind == "sweep"
    assert [m.env for m in found.members] == [
        {"LR": "0.1", "OPT": "adam"},
        {"LR": "0.1", "OPT": "sgd"},
        {"LR": "0.01", "OPT": "adam"},
        {"LR": "0.01", "OPT": "sgd"},
    ]
    specs = expand.expand(_spec(), found)
    assert specs[3].name == "j-3" and specs[3].env_vars["OPT"] == "sgd"
    assert specs[3].group["kind"] == "sweep"


def test_a_sweep_of_points_is_that_list(tmp_path):
    found = expand.load_sweep(
        _sweep(tmp_path, "[[points]]\nLR = 0.1\nWARM = true\n[[points]]\nLR = 0.2\nWARM = false\n")
    )
    assert [m.env for m in found.members] == [
        {"LR": "0.1", "WARM": "true"},
        {"LR": "0.2", "WARM": "false"},
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[axis]\nLR = [1]\n", "unknown key 'axis'; did you mean 'axes'?"),
        ("[axes]\nLR = 1\n", "axes.LR must be a non-empty list"),
        ("[axes]\nLR = []\n", "axes.LR must be a non-empty list"),
        ('[axes]\n"1LR" = [1]\n', "is not a variable name"),
        ("[axes]\nBASTION_X = [1]\n", "is not a variable name"),
        ("[axes]\nA = [1]\n[[points]]\nA = 1\n", "not both"),
        ("max_running = 2\n", "not neither"),
        ("max_running = 0\n[axes]\nA = [1]\n", "at least 1"),
        ("[axes]\nA = [{x = 1}]\n", "must be a string, number or boolean"),
        ("[axes\n", "not valid TOML"),
        ("[axes]\n" + "".join(f"A{i} = [{', '.join(['1'] * 10)}]\n" for i in range(5)), "limit"),
    ],
)
def test_a_sweep_file_with_a_typo_names_the_file_the_key_and_the_fix(tmp_path, text, says):
    path = _sweep(tmp_path, text)
    with pytest.raises(SpecError) as e:
        expand.load_sweep(path)
    assert path in str(e.value) and says in str(e.value)


def test_a_missing_sweep_file_is_named(tmp_path):
    with pytest.raises(SpecError, match="cannot read it"):
        expand.load_sweep(str(tmp_path / "nope.toml"))


# -- the Python API refuses the same, writing nothing ----------------------------------------


def test_client_launch_refuses_bad_input_and_writes_nothing(tmp_path):
    store = Store(str(tmp_path / "root"))
    client = Client(store=store)
    done = _spec().to_json()
    store.complete.write("a", {"spec": done, "state": {"status": "COMPLETED"}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no daemon: the writes are what is checked
        (waiting,) = client.launch("b", "true", user_id="u", after="a")
        assert waiting.after == ["a"]
        before = sorted(store.specs.list())
        with pytest.raises(SubmitRefused, match="a would wait for itself: a -> b -> a"):
            client.launch("a", "true", user_id="u", after="b")
        with pytest.raises(SubmitRefused, match="no job named 'nosuch'"):
            client.launch("x", "true", user_id="u", after="nosuch")
        with pytest.raises(SpecError, match="1,000,000"):
            client.launch("x", "true", user_id="u", array="0-999999")
        with pytest.raises(SpecError, match="time_limit: '2x'"):
            client.launch("x", "true", user_id="u", time_limit="2x")
        with pytest.raises(SpecError, match="array or sweep"):
            client.launch("x", "true", user_id="u", array="0-1", sweep="s.toml")
        assert sorted(store.specs.list()) == before == ["b"]
        members = client.launch("g", "true", user_id="u", array="0-2%2", time_limit=60)
        assert sorted(store.specs.list()) == ["b", "g-0", "g-1", "g-2"]
        assert {m.time_limit for m in members} == {60}
        with pytest.raises(SubmitRefused, match="active jobs already"):
            client.launch("g", "true", user_id="u", array="2-3")
        assert sorted(store.specs.list()) == ["b", "g-0", "g-1", "g-2"]  # g-3 not written
