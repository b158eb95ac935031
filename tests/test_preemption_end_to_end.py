"""Quota through the real daemon: a borrower is preempted when the owner's job needs its room."""

from __future__ import annotations

import json

from tests.harness import wait_for

QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = 4
[project_membership]
research = ["alice"]
prod = ["bob"]
[project_resources.research]
cpu = 0.5
[project_resources.prod]
cpu = 0.5
[scheduling]
min_runtime_seconds = 0
preemption_grace_seconds = 1
"""


def _write_quota(bastion, text: str = QUOTA) -> None:
    bastion.put("project-quotas", "project-quotas.config", data=text)


def _status(bastion, name):
    return (bastion.state(name) or {}).get("status")


def test_owner_reclaims_borrowed_capacity(bastion, tmp_path):
    """The borrowers run until a1 has run (at most 30 s), not for a fixed time: with a fixed
    sleep, a slow launch of a1 let b1 end first, and a1 took its room without a preemption."""
    _write_quota(bastion)
    bastion.start()
    a1_ran = tmp_path / "a1-ran"
    until_a1 = f"for i in $(seq 150); do [ -e {a1_ran} ] && break; sleep 0.2; done"
    for name in ("b1", "b2"):  # prod borrows research's idle half
        bastion.cli(
            "launch",
            f"--name={name}",
            "--project_id=prod",
            "--user_id=bob",
            "--resources=cpu=2",
            "--",
            f"echo {name} attempt $BASTION_ATTEMPT; {until_a1}; echo {name} done",
        )
        wait_for(lambda n=name: _status(bastion, n) == "ACTIVE", what=f"{name} running")
    bastion.cli(
        "launch",
        "--name=a1",
        "--project_id=research",
        "--user_id=alice",
        "--resources=cpu=2",
        "--",
        f"echo a1 runs; sleep 1; touch {a1_ran}",
    )
    a1 = bastion.wait_complete("a1", timeout=30)
    assert a1["state"]["outcome"] == "SUCCEEDED"

    b2 = bastion.wait_complete("b2", timeout=40)  # requeued, restarted, finished
    b1 = bastion.wait_complete("b1", timeout=40)
    assert b1["state"]["attempt"] == 1 and b1["state"]["preemptions"] == 0
    assert b2["state"]["outcome"] == "SUCCEEDED"
    assert b2["state"]["attempt"] == 2 and b2["state"]["preemptions"] == 1
    log = bastion.log("b2")
    assert log.index("b2 attempt 1") < log.index("attempt 2 of b2") < log.index("b2 attempt 2")
    assert log.count("b2 done") == 1
    assert "it was stopped (preempt:" in log and "a1" in log
    history = bastion.cli("history", "b2").stdout
    assert "PREEMPT" in history and "a1" in history and "REQUEUED" in history
    verdicts = [
        d
        for stamp in bastion.listdir("history", "decisions")
        for d in json.loads(bastion.read("history", "decisions", stamp))["decisions"]
    ]
    assert any(
        d["verdict"] == "PREEMPT" and d["name"] == "b2" and d["preempted_by"] == "a1"
        for d in verdicts
    )


def test_non_member_and_oversized_jobs_are_rejected(bastion):
    _write_quota(bastion)
    bastion.cli("launch", "--name=intruder", "--project_id=research", "--user_id=bob", "--", "true")
    bastion.cli(
        "launch",
        "--name=huge",
        "--project_id=prod",
        "--user_id=bob",
        "--resources=cpu=64",
        "--",
        "true",
    )
    bastion.cli(
        "launch",
        "--name=tpu",
        "--project_id=prod",
        "--user_id=bob",
        "--resources=v4=8",
        "--",
        "true",
    )
    bastion.once()
    intruder = bastion.complete("intruder")["state"]
    assert intruder["outcome"] == "REJECTED" and "prod" in intruder["reason"]
    assert bastion.complete("huge")["state"]["outcome"] == "REJECTED"
    assert "v4" in bastion.complete("tpu")["state"]["reason"]


def test_pending_reason_list_and_why(bastion):
    _write_quota(bastion)
    bastion.cli(
        "launch",
        "--name=big",
        "--project_id=prod",
        "--user_id=bob",
        "--resources=cpu=4",
        "--",
        "sleep 30",
    )
    bastion.once()
    bastion.cli(
        "launch",
        "--name=next",
        "--project_id=prod",
        "--user_id=bob",
        "--resources=cpu=2",
        "--",
        "true",
    )
    bastion.once()
    assert _status(bastion, "next") == "PENDING"
    reason = bastion.state("next")["reason"]
    assert reason and "cpu" in reason
    assert reason == "waiting for capacity: needs 2 cpu"  # its own: nothing other jobs move
    listed = bastion.cli("list").stdout
    assert "needs 2 cpu, 0 cpu free" in listed and "0 jobs ahead in prod" in listed  # live
    why = bastion.cli("why", "next").stdout
    assert "next" in why and "prod" in why and "cpu" in why


def test_invalid_quota_file_keeps_last_good(bastion):
    _write_quota(bastion)
    bastion.once()
    _write_quota(
        bastion,
        QUOTA.replace("cpu = 0.5\n[project_resources.prod]", "cpu = -1\n[project_resources.prod]"),
    )
    bastion.cli(
        "launch",
        "--name=still",
        "--project_id=prod",
        "--user_id=bob",
        "--resources=cpu=1",
        "--",
        "echo ok",
    )
    bastion.start()
    assert bastion.wait_complete("still")["state"]["outcome"] == "SUCCEEDED"
    assert "invalid" in bastion.daemon_output()
