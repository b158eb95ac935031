"""Who may change a job, and who did (issue 21, point 4), through the real CLI and daemon.

The bucket is the security boundary, so nothing here is authentication: the CLI and the
Python API refuse to update or cancel another user's job without --force (force=True), and
every UPDATE and CANCEL in the history names who asked and the job's owner beside it."""

from __future__ import annotations

import json
import time

import pytest

from launch import Client, NoDaemonWarning, NotOwner, new_jobspec
from tests.harness import wait_for


def _running(b, name: str, text: str) -> None:
    wait_for(lambda: text in b.log(name), timeout=30, what=f"{text!r} in {name}'s log")


def _snapshot(b, name: str) -> tuple[bytes | None, list[str]]:
    """What a refused request must leave as it was: the spec and the pending requests."""
    return b.read("jobs", "active", name), b.listdir("jobs", "user_states")


def test_another_users_cancel_is_refused_without_force_and_names_both_with_it(local_bastion):
    b = local_bastion
    b.start()
    b.cli(
        "launch", "--name=alicejob", "--user_id=alice", "--bundler=none", "--", "echo up; sleep 300"
    )
    _running(b, "alicejob", "up")
    before = _snapshot(b, "alicejob")
    proc = b.cli("cancel", "alicejob", "--user_id=mallory", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "'alice'" in proc.stderr and "'mallory'" in proc.stderr and "--force" in proc.stderr
    time.sleep(1)  # a few daemon cycles: had anything been written, it would have acted
    assert _snapshot(b, "alicejob") == before
    assert b.state("alicejob")["status"] == "ACTIVE"

    b.cli("cancel", "alicejob", "--user_id=mallory", "--force")
    record = b.wait_complete("alicejob")
    assert record["state"]["outcome"] == "CANCELLED"
    assert "cancelled by mallory (owner alice)" in b.cli("history", "alicejob").stdout


def test_another_users_update_is_refused_without_force_and_runs_as_the_owner_with_it(
    local_bastion,
):
    b = local_bastion
    b.start()
    b.cli(
        "launch",
        "--name=alicejob",
        "--user_id=alice",
        "--bundler=none",
        "--",
        'echo "v1 as $BASTION_USER_ID"; sleep 300',
    )
    _running(b, "alicejob", "v1 as alice")
    before = _snapshot(b, "alicejob")
    new = 'echo "v2 as $BASTION_USER_ID"; sleep 300'
    proc = b.cli("update", "alicejob", "--user_id=bob", "--", new, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "'alice'" in proc.stderr and "--force" in proc.stderr
    time.sleep(1)
    assert _snapshot(b, "alicejob") == before
    assert b.state("alicejob")["attempt"] == 1

    b.cli("update", "alicejob", "--user_id=bob", "--force", "--", new)
    _running(b, "alicejob", "v2 as alice")  # the owner's identity, as before the update
    spec = json.loads(b.read("jobs", "active", "alicejob"))
    assert spec["metadata"]["user_id"] == "alice" and spec["metadata"]["updated_by"] == "bob"
    history = b.cli("history", "alicejob").stdout
    assert "spec updated by bob (owner alice): command changed" in history
    b.cli("cancel", "alicejob", "--user_id=alice")
    b.wait_complete("alicejob")


def test_the_owners_own_cancel_needs_no_force_and_names_the_owner(local_bastion):
    b = local_bastion  # the CLI's user is $BASTION_USER=tester
    b.cli("launch", "--name=mine", "--bundler=none", "--", "sleep 300")
    b.cli("cancel", "mine")
    b.once()
    record = b.complete("mine")
    assert record["state"]["outcome"] == "CANCELLED"
    assert record["state"]["reason"] == "cancelled by tester (owner tester)"


def test_requests_that_do_not_say_who_asked_are_honoured_and_read_as_unknown(local_bastion):
    """AXLearn's cancel request names nobody; one from a client before ``requested_by`` has
    only ``user_id``; a name with a newline cannot forge a history line."""
    b = local_bastion
    requests = {
        "axlearn": {"status": "CANCELLING", "metadata": {}},
        "older": {"status": "CANCELLING", "user_id": "bob", "time": 0},
        "forged": {"status": "CANCELLING", "requested_by": "eve\n2026-01-01 00:00:00Z  forged"},
    }
    for name in requests:
        b.cli("launch", f"--name={name}", "--user_id=alice", "--bundler=none", "--", "sleep 300")
    for name, request in requests.items():
        b.put("jobs", "user_states", name, data=json.dumps(request))
    b.once()
    reasons = {name: b.complete(name)["state"]["reason"] for name in requests}
    assert reasons["axlearn"] == "cancelled by unknown (owner alice)"
    assert reasons["older"] == "cancelled by bob (owner alice)"
    assert reasons["forged"] == "cancelled by eve?2026-01-01 00:00:00Z  forged (owner alice)"
    assert all(b.complete(name)["state"]["outcome"] == "CANCELLED" for name in requests)


def test_python_api_refuses_another_users_job_unless_forced(local_bastion, monkeypatch):
    b = local_bastion
    client = Client(b.root)
    with pytest.warns(NoDaemonWarning):  # none needed: the refusal is the client's
        client.submit(
            new_jobspec(name="alicejob", command="sleep 300", user_id="alice", project_id="default")
        )
    before = _snapshot(b, "alicejob")
    monkeypatch.setenv("BASTION_USER", "carol")
    with pytest.raises(NotOwner, match=r"'alice'.*'carol' \(from \$BASTION_USER\).*force=True"):
        client.cancel("alicejob")
    with pytest.raises(NotOwner, match="'bob'"):
        client.update("alicejob", "sleep 1", user_id="bob")
    assert _snapshot(b, "alicejob") == before

    spec = client.update("alicejob", "sleep 1", user_id="bob", force=True)
    assert (spec.metadata.user_id, spec.metadata.updated_by) == ("alice", "bob")
    client.cancel("alicejob", force=True)
    request = json.loads(b.read("jobs", "user_states", "alicejob"))
    assert request["requested_by"] == "carol" and request["status"] == "CANCELLING"
