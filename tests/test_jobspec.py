"""The spec wire format: AXLearn compatibility, unknown fields kept, bad types named."""

import json

import pytest

from bastion.jobspec import JobSpec, SpecError, name_problem, new_jobspec, parse_resources

AXLEARN_SPEC = {
    "version": 1,
    "name": "alice-1a2b3c",
    "command": "python3 -m axlearn.cloud.gcp.jobs.launch run --name=alice-1a2b3c -- python3 t.py",
    "cleanup_command": None,
    "env_vars": {"BASTION_SUBMISSION_TS": "1767225600"},
    "metadata": {
        "user_id": "alice",
        "project_id": "p1",
        "creation_time": "2026-01-01 12:00:00.000000",
        "resources": {"v5p": 256},
        "priority": 3,
        "job_id": "0b9e-uuid",
        "version": None,
        "scaling_specs": None,
    },
}


def test_axlearn_spec_loads_and_keeps_unknown_fields():
    data = {**AXLEARN_SPEC, "code_asset_path": "gs://b/asset.tar.gz"}
    spec = JobSpec.loads(json.dumps(data))
    assert spec.metadata.resources == {"v5p": 256}
    assert spec.metadata.creation_time.year == 2026
    assert spec.metadata.priority == 3
    round_trip = spec.to_json()
    assert round_trip["code_asset_path"] == "gs://b/asset.tar.gz"
    assert round_trip["metadata"]["scaling_specs"] is None
    assert round_trip["metadata"]["creation_time"] == "2026-01-01 12:00:00.000000"


def test_iso_creation_time_is_accepted():
    data = json.loads(json.dumps(AXLEARN_SPEC))
    data["metadata"]["creation_time"] = "2026-01-01T12:00:00Z"
    assert JobSpec.from_json(data).metadata.creation_time.hour == 12


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("metadata", "resources"), {"v4": 8.0}, "metadata.resources.v4"),
        (("metadata", "resources"), {"v4": -1}, "must not be negative"),
        (("metadata", "priority"), "high", "metadata.priority"),
        (("metadata", "priority"), 9, "out of range"),
        (("metadata", "user_id"), 7, "metadata.user_id"),
        (("metadata", "updated_by"), ["bob"], "metadata.updated_by"),
        (("metadata", "creation_time"), "yesterday", "metadata.creation_time"),
        (("env_vars",), {"A": 1}, "env_vars.A"),
        (("command",), ["ls"], "field command"),
        (("version",), 2, "schema version 2"),
        (("name",), "../etc", "not a safe identifier"),
    ],
)
def test_wrong_types_name_the_field(path, value, message):
    data = json.loads(json.dumps(AXLEARN_SPEC))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        JobSpec.from_json(data)


def test_missing_field_and_bad_json_are_named():
    data = json.loads(json.dumps(AXLEARN_SPEC))
    del data["metadata"]["project_id"]
    with pytest.raises(SpecError, match=r"metadata\.project_id is missing"):
        JobSpec.from_json(data)
    with pytest.raises(SpecError, match="not valid JSON"):
        JobSpec.loads(b"{not json")


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "a b", "x" * 64, "_hidden", ".tmp", "job.cleanup", "naïve"]
)
def test_unsafe_names(name):
    assert name_problem(name) is not None


@pytest.mark.parametrize("name", ["hello", "a", "x" * 63, "my-job_1.2", "7up"])
def test_safe_names(name):
    assert name_problem(name) is None


def test_new_jobspec_round_trips_and_digest_tracks_changes():
    spec = new_jobspec(
        name="hello", command="echo hi", user_id="u", project_id="p", resources={"cpu": 2}
    )
    loaded = JobSpec.loads(spec.dumps())
    assert loaded.to_json() == spec.to_json()
    assert loaded.digest() == spec.digest()
    loaded.command = "echo bye"
    assert loaded.digest() != spec.digest()
    assert spec.metadata.job_id and loaded.identity == spec.identity


def test_parse_resources():
    assert parse_resources("v4=8, cpu=4") == {"v4": 8, "cpu": 4}
    assert parse_resources("") == {}
    for bad in ("v4", "v4=eight", "=3", "v4=-1"):
        with pytest.raises(SpecError):
            parse_resources(bad)
