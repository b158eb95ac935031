"""The Python API end to end: build, validate, serialize, submit, list, read, follow, cancel."""

from __future__ import annotations

import pytest

from launch import Client, JobExists, JobSpec, NoDaemonWarning, SpecError, UnknownJob, new_jobspec
from tests.harness import wait_for


def test_python_api_round_trip(bastion):
    client = Client(bastion.root)
    spec = new_jobspec(
        name="api-job",
        command="for i in 1 2; do echo api $i; sleep 0.2; done",
        user_id="alice",
        project_id="default",
        resources={"cpu": 1},
        priority=2,
        env_vars={"K": "V"},
    )
    assert JobSpec.loads(spec.dumps()).to_json() == spec.to_json()
    with pytest.warns(NoDaemonWarning, match="no daemon has ever run"):  # none started yet
        client.submit(spec)
    with pytest.warns(NoDaemonWarning):
        client.submit(spec)  # the same submission again (a retry) is idempotent
    other = new_jobspec(name="api-job", command="true", user_id="bob", project_id="default")
    with pytest.raises(JobExists, match="already active"):
        client.submit(other)
    (listed,) = client.list_jobs()
    assert listed.name == "api-job" and listed.status == "SUBMITTED"
    assert listed.spec.metadata.priority == 2

    bastion.start()
    text = "".join(client.follow_log("api-job", poll_seconds=0.1, timeout=30))
    assert "api 1\napi 2\n" in text
    info = client.get("api-job")
    assert info.finished and info.status == "SUCCEEDED" and info.state.exit_code == 0
    assert [j.name for j in client.list_jobs(include_completed=True)] == ["api-job"]
    assert client.list_jobs() == []
    events = [e["event"] for e in client.history("api-job")]
    assert events[0] == "PENDING" and events[-1] == "SUCCEEDED"
    assert b"api 2" in client.read_log("api-job")


def test_python_api_cancel_and_errors(bastion):
    client = Client(bastion.root)
    with pytest.raises(SpecError, match=r"metadata\.priority"):
        new_jobspec(name="x", command="true", user_id="u", project_id="p", priority=0)
    with pytest.raises(SpecError, match="safe identifier"):
        new_jobspec(name="no/slash", command="true", user_id="u", project_id="p")
    with pytest.raises(UnknownJob):
        client.get("never-was")
    with pytest.raises(UnknownJob):
        client.cancel("never-was")
    with pytest.warns(NoDaemonWarning, match="no daemon has ever run"):  # started just below
        client.submit(
            new_jobspec(name="long", command="sleep 60", user_id="u", project_id="default")
        )
    bastion.start()
    wait_for(lambda: client.get("long").status == "ACTIVE", what="long to run")
    client.cancel("long", user_id="u")
    info = client.wait("long", poll_seconds=0.1, timeout=30)
    assert info.status == "CANCELLED"
    with pytest.raises(UnknownJob, match="already finished"):
        client.cancel("long")
