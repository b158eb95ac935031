"""Issue 27: a job whose runner cannot start anything (no credentials) says so and lets go.

The real TPU runner (googleapiclient, google-auth) against the TPU stand-in, with its settings
asking for the default credentials and GOOGLE_APPLICATION_CREDENTIALS naming a file that does
not exist: google-auth refuses exactly as on a machine never logged in. Before the fix the job
showed "waits to start" while holding its quota, retried every cycle, and then FAILED.
"""

from __future__ import annotations

import logging
import sys
import time

import pytest

from bastion.daemon.readiness import check_runners
from bastion.daemon.start import build_daemon
from launch import Client, new_jobspec
from launch.why import explain_job
from tests.standins.tpu import TpuServer

QUOTA = """[toml-schema]
version = "1"
[total_resources]
v4 = 32
cpu = 4
[project_membership]
default = [".*"]
"""
GIVE_UP = 3.0


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    with TpuServer() as server:
        root = tmp_path / "root"
        (root / "project-quotas").mkdir(parents=True)
        (root / "project-quotas" / "project-quotas.config").write_text(QUOTA)
        tpu = {
            "project": "proj",
            "zones": ["us-central2-b"],
            "api_endpoint": server.endpoint,
            "credentials": "default",  # google-auth's chain, as with Google's endpoint
            "python": sys.executable,
        }
        settings = {"runners": {"tpu": tpu}, "start_give_up_seconds": GIVE_UP}
        daemon = build_daemon(
            str(root), work_dir=str(tmp_path / "work"), gpus=[], settings=settings
        )
        try:
            yield daemon, Client(str(root), expect_daemon=False), server
        finally:
            daemon.close()


def cycle(daemon) -> None:
    daemon.cycle(time.time())
    daemon.settle()


def test_the_daemon_says_at_start_which_runner_has_no_credentials(no_credentials, caplog):
    daemon, _, _ = no_credentials
    with caplog.at_level(logging.INFO, logger="bastion.daemon"):
        problems = check_runners(daemon.runners)
    assert problems["local"] == ""
    assert "no Google credentials" in problems["tpu"]
    lines = [r.getMessage() for r in caplog.records if "runner tpu" in r.getMessage()]
    assert len(lines) == 1 and "cannot start jobs" in lines[0]
    assert "gcloud auth application-default login" in lines[0]


def test_a_job_that_cannot_start_backs_off_then_waits_pending_holding_no_quota(
    no_credentials, caplog
):
    daemon, client, server = no_credentials
    client.submit(
        new_jobspec(
            name="tpujob",
            command="echo hi",
            user_id="tester",
            project_id="default",
            resources={"v4": 32},
            runner={"kind": "tpu", "accelerator_type": "v4-32"},
        )
    )
    cycles, why_while_waiting = 0, ""
    with caplog.at_level(logging.WARNING, logger="bastion.daemon"):
        deadline = time.monotonic() + 60
        while client.get("tpujob").status != "PENDING" or cycles < 3:
            assert time.monotonic() < deadline, client.get("tpujob").reason
            cycle(daemon)
            cycles += 1
            now = client.get("tpujob")
            if not why_while_waiting and "waits to start" in (
                now.state.reason if now.state else ""
            ):
                why_while_waiting = explain_job(client, "tpujob")
            time.sleep(0.1)
    # admitted but never started: why says so, never "starting or running"
    assert "its runner has not started it" in why_while_waiting, why_while_waiting
    assert "starting or running" not in why_while_waiting
    assert "lets go of its quota at" in why_while_waiting
    tries = [r for r in caplog.records if "trying again" in r.getMessage()]
    assert 2 <= len(tries) <= 6 and cycles > len(tries) + 3, (len(tries), cycles)  # backed off
    info = client.get("tpujob")
    assert info.status == "PENDING"
    assert info.state.reason.startswith("could not start: no Google credentials")
    assert "no quota held" in info.state.reason and info.state.run_attempt is None
    events = [e["event"] for e in client.history("tpujob")]
    assert "NOT_STARTED" in events and "FAILED" not in events
    assert not [r for r in server.requests if r[0] == "POST"]  # nothing was ever created

    # held: the policy does not admit it again (and take its quota) until the hold ends
    for _ in range(5):
        cycle(daemon)
    held = client.get("tpujob")
    assert held.status == "PENDING" and held.state.reason == info.state.reason
    usage = (client.queue().get("projects") or {}).get("default", {}).get("usage", {})
    assert usage.get("v4", 0) == 0

    why = explain_job(client, "tpujob")
    assert "could not start" in why and "gcloud auth application-default login" in why
