"""What the daemon does with input nobody should have given it, through the real CLI and daemon:
a reused spec file, a forged state, a name like another job's cleanup log, a huge spec, a
hostile cancel request, a full work-dir disk. Each loses nothing and strands nothing."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from bastion.jobspec import SpecError, new_jobspec
from tests.harness import Bastion, gated, wait_for

FIXED_SPEC = {
    "version": 1,
    "name": "reused",
    "command": "echo ran $BASTION_ATTEMPT_NAME",
    "cleanup_command": None,
    "env_vars": None,
    "metadata": {
        "user_id": "tester",
        "project_id": "default",
        "creation_time": "2026-01-01 00:00:00.000000",
        "resources": {},
        "priority": 5,
        "job_id": None,
        "version": None,
    },
}


def test_a_resubmitted_spec_file_runs_again(local_bastion: Bastion):
    """A script that writes the same spec file (same creation_time, no job_id) twice gets two
    runs: attempt names are unique per submission, and finished attempts leave nothing."""
    local_bastion.start()
    local_bastion.put("jobs", "active", "reused", data=json.dumps(FIXED_SPEC))
    first = local_bastion.wait_complete("reused", timeout=30)
    assert first["state"]["outcome"] == "SUCCEEDED"
    local_bastion.put("jobs", "active", "reused", data=json.dumps(FIXED_SPEC))
    wait_for(
        lambda: local_bastion.log("reused").count("ran bst-") == 2,
        timeout=30,
        what="the second run's output",
    )
    names = [
        line.split()[1]
        for line in local_bastion.log("reused").splitlines()
        if line.startswith("ran ")
    ]
    assert len(set(names)) == 2, names  # two submissions, two attempt names
    attempts = Path(local_bastion.env["XDG_STATE_HOME"]) / "bastion" / "attempts"
    wait_for(lambda: not any(attempts.glob("*/bst-*")), what="attempt directories removed")


def test_a_forged_state_is_reported_and_replaced_never_acted_on(local_bastion: Bastion, tmp_path):
    marker, gate = tmp_path / "started", tmp_path / "gate"
    local_bastion.start("--lease_seconds=10")
    local_bastion.cli("launch", "--name=victim", "--bundler=none", "--", gated(marker, gate))
    wait_for(lambda: "tick 3" in local_bastion.log("victim"), what="the job to run")
    real = local_bastion.state("victim")
    forged = {
        **real,
        "status": "COMPLETED",
        "outcome": "SUCCEEDED",
        "runner": {
            **real["runner"],
            "handle": {"name": real["runner"]["name"], "host": "x", "pid": 1, "create_time": 0},
        },
    }
    local_bastion.put("jobs", "states", "victim", data=json.dumps(forged))
    wait_for(
        lambda: "overwritten by someone else" in local_bastion.daemon_output(),
        timeout=30,
        what="the daemon to notice the foreign write",
    )
    wait_for(
        lambda: (local_bastion.state("victim") or {}).get("status") == "ACTIVE",
        what="the daemon's own state back",
    )
    assert "tick" in local_bastion.log("victim") and marker.read_text().split() == ["victim"]
    gate.touch()
    record = local_bastion.wait_complete("victim", timeout=30)
    assert record["state"]["outcome"] == "SUCCEEDED" and record["state"]["attempt"] == 1


def test_a_rejected_name_like_another_jobs_cleanup_log_destroys_nothing(local_bastion: Bastion):
    local_bastion.start()
    local_bastion.cli(
        "launch", "--name=x", "--bundler=none", "--cleanup_command=echo tidy", "--", "echo main"
    )
    local_bastion.wait_complete("x", timeout=30)
    cleanup_log = local_bastion.log("x.cleanup")
    assert "tidy" in cleanup_log
    spec = {**FIXED_SPEC, "name": "x.cleanup"}
    local_bastion.put("jobs", "active", "x.cleanup", data=json.dumps(spec))
    record = local_bastion.wait_complete("x.cleanup", timeout=30)
    assert record["state"]["outcome"] == "REJECTED"
    assert local_bastion.log("x.cleanup") == cleanup_log


def test_a_spec_over_128_kib_runs_and_a_command_over_the_limit_is_refused_at_submit(
    local_bastion: Bastion,
):
    big = new_jobspec(
        name="big",
        command='echo big ran; test -z "$_BASTION_SERIALIZED_JOBSPEC"',
        user_id="tester",
        project_id="default",
    )
    big.extra["notes"] = "n" * (200 << 10)  # a spec of 200 KiB: no longer passed in one variable
    local_bastion.put("jobs", "active", "big", data=big.dumps())
    local_bastion.start()
    record = local_bastion.wait_complete("big", timeout=30)
    assert record["state"]["outcome"] == "SUCCEEDED", record["state"]
    with pytest.raises(SpecError, match="the limit is 102,400"):
        new_jobspec(
            name="huge", command="echo " + "x" * (130 << 10), user_id="u", project_id="default"
        )


def test_a_deeply_nested_cancel_request_is_consumed_once(local_bastion: Bastion):
    local_bastion.start()
    local_bastion.cli("launch", "--name=target", "--bundler=none", "--", "sleep 30")
    wait_for(
        lambda: (local_bastion.state("target") or {}).get("status") == "ACTIVE",
        what="the job to run",
    )
    local_bastion.put("jobs", "user_states", "target", data="[" * 100_000 + "]" * 100_000)
    wait_for(
        lambda: not local_bastion.exists("jobs", "user_states", "target"),
        what="the request to be consumed",
    )
    assert "Traceback" not in local_bastion.daemon_output()
    assert (local_bastion.state("target") or {}).get("status") == "ACTIVE"
    local_bastion.cli("cancel", "target")
    assert local_bastion.wait_complete("target", timeout=60)["state"]["outcome"] == "CANCELLED"


@contextlib.contextmanager
def _small_disk(path: Path, size: str = "2m"):
    path.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_work_dir_disk_holds_the_job_with_a_reason_then_it_completes(
    local_bastion: Bastion, tmp_path
):
    """The daemon's work dir fills up (a job's own output can do it): the finished job is not
    recorded as failed, its output is not lost; it waits, saying why, until there is room."""
    with _small_disk(tmp_path / "small") as disk:
        work = disk / "work"
        local_bastion.start(work_dir=str(work))
        gate = tmp_path / "gate"
        local_bastion.cli(
            "launch",
            "--name=chatty",
            "--bundler=none",
            "--",
            f"while [ ! -e {gate} ]; do sleep 0.05; done; "
            "for i in $(seq 1 3000); do echo line $i; done",
        )
        wait_for(
            lambda: (local_bastion.state("chatty") or {}).get("status") == "ACTIVE",
            what="the job to run",
        )
        filler = disk / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
        gate.touch()
        wait_for(
            lambda: "could not" in str((local_bastion.state("chatty") or {}).get("reason")),
            timeout=30,
            what="the job to say why it waits",
        )
        assert not local_bastion.exists("jobs", "complete", "chatty")
        filler.unlink()
        record = local_bastion.wait_complete("chatty", timeout=60)
    assert record["state"]["outcome"] == "SUCCEEDED", record["state"]
    log = local_bastion.log("chatty")
    assert all(f"line {i}\n" in log for i in (1, 1500, 3000))
