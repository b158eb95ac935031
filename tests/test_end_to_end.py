"""The whole loop through the real CLI, the real daemon and real processes on a local root."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil

from tests.harness import wait_for

COUNT_TO_3 = "for i in 1 2 3; do echo line $i; sleep 0.3; done"


def test_launch_logs_follow_list_history(bastion):
    bastion.start()
    out = bastion.cli(
        "launch", "--name=hello", "--project_id=default", "--", "bash", "-c", COUNT_TO_3
    ).stdout
    assert "submitted hello" in out
    follow = bastion.cli("logs", "hello", "--follow", "--follow_poll_seconds=0.1", timeout=60)
    lines = [ln for ln in follow.stdout.splitlines() if ln.startswith("line")]
    assert lines == ["line 1", "line 2", "line 3"]
    assert "attempt 1 of hello started" in follow.stdout
    record = bastion.wait_complete("hello")
    assert record["state"]["outcome"] == "SUCCEEDED"
    assert record["state"]["exit_code"] == 0
    assert not bastion.exists("jobs", "active", "hello")
    assert not bastion.exists("jobs", "states", "hello")

    assert "hello" not in bastion.cli("list").stdout
    table = bastion.cli("list", "--all").stdout
    assert "hello" in table and "SUCCEEDED" in table
    listed = json.loads(bastion.cli("list", "--all", "--json").stdout)
    (job,) = [j for j in listed if j["name"] == "hello"]
    assert job["status"] == "SUCCEEDED" and job["project_id"] == "default"
    assert job["user_id"] == "tester"

    history = bastion.cli("history", "hello").stdout
    for event in ("PENDING", "STARTED", "SUCCEEDED"):
        assert event in history
    assert "now: SUCCEEDED" in history

    (daemon_log,) = [n for n in bastion.listdir("logs") if n.startswith("_bastion-")]
    wait_for(lambda: "hello: SUCCEEDED" in bastion.log(daemon_log), what="daemon log upload")


def test_job_env_and_failure_exit_code(bastion):
    bastion.start()
    bastion.cli(
        "launch",
        "--name=envjob",
        "--env=GREETING=hi",
        "--",
        'echo "$BASTION_JOB_NAME $BASTION_ATTEMPT $GREETING $BASTION_ROOT"; exit 3',
    )
    record = bastion.wait_complete("envjob")
    assert record["state"]["outcome"] == "FAILED"
    assert record["state"]["exit_code"] == 3
    assert f"envjob 1 hi {bastion.root}" in bastion.log("envjob")
    proc = bastion.cli("logs", "envjob", "--follow", "--exit_status", check=False)
    assert proc.returncode == 3
    assert bastion.cli("logs", "envjob", "--follow").returncode == 0


def test_cancel_running_job_kills_whole_group_after_grace(bastion, tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    bastion.start("--grace_seconds=1")
    # The job ignores SIGTERM and leaves a grandchild that ignores it too.
    bastion.cli(
        "launch",
        "--name=stubborn",
        "--",
        f"trap '' TERM; (trap '' TERM; sleep 300) & echo $! > {pidfile}; "
        "echo started; while true; do sleep 0.1; done",
    )
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="grandchild")
    grandchild = int(pidfile.read_text())
    bastion.cli("cancel", "stubborn")
    record = bastion.wait_complete("stubborn", timeout=30)
    assert record["state"]["outcome"] == "CANCELLED"
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == "zombie"
    history = bastion.cli("history", "stubborn").stdout
    assert "KILLED" in history and "cancelled by tester" in history


def test_cancel_pending_job_and_unknown_name(bastion):
    cpus = os.cpu_count()
    bastion.cli("launch", "--name=blocker", f"--resources=cpu={cpus}", "--", "sleep 60")
    bastion.once()
    assert bastion.state("blocker")["status"] == "ACTIVE"
    bastion.cli("launch", "--name=waiting", "--resources=cpu=1", "--", "true")
    bastion.once()
    waiting = bastion.state("waiting")
    assert waiting["status"] == "PENDING" and waiting["reason"]
    assert "waiting" in bastion.cli("list").stdout
    bastion.cli("cancel", "waiting")
    bastion.once()
    record = bastion.complete("waiting")
    assert record["state"]["outcome"] == "CANCELLED" and record["state"]["attempt"] == 0
    proc = bastion.cli("cancel", "nosuchjob", check=False)
    assert proc.returncode == 1 and "no job named 'nosuchjob'" in proc.stderr
    proc = bastion.cli("logs", "nosuchjob", check=False)
    assert proc.returncode == 1 and "nosuchjob" in proc.stderr


def test_kill_9_daemon_adopts_running_job(bastion, tmp_path):
    marker = tmp_path / "starts"
    daemon = bastion.start()
    bastion.cli(
        "launch",
        "--name=survivor",
        "--",
        f"echo start >> {marker}; for i in $(seq 1 20); do echo tick $i; sleep 0.1; done",
    )
    wait_for(lambda: marker.exists(), what="job start")
    time.sleep(0.5)
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    time.sleep(0.5)
    bastion.start()
    record = bastion.wait_complete("survivor", timeout=40)
    assert marker.read_text().count("start") == 1
    assert record["state"]["outcome"] == "SUCCEEDED" and record["state"]["attempt"] == 1
    log = bastion.log("survivor")
    assert [ln for ln in log.splitlines() if ln.startswith("tick")] == [
        f"tick {i}" for i in range(1, 21)
    ]


def test_kill_9_daemon_notices_job_finished_while_down(bastion, tmp_path):
    daemon = bastion.start()
    bastion.cli("launch", "--name=quick", "--", "sleep 1; echo done; exit 7")
    wait_for(lambda: (bastion.state("quick") or {}).get("status") == "ACTIVE", what="ACTIVE")
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    time.sleep(2)
    bastion.start()
    record = bastion.wait_complete("quick")
    assert record["state"]["outcome"] == "FAILED" and record["state"]["exit_code"] == 7
    assert "done" in bastion.log("quick")


def test_malformed_spec_is_rejected_and_others_run(bastion):
    bastion.put("jobs", "active", "broken", data="{this is not json")
    bastion.put(
        "jobs",
        "active",
        "wrongtype",
        data=json.dumps(
            {
                "version": 1,
                "name": "wrongtype",
                "command": "true",
                "cleanup_command": None,
                "env_vars": None,
                "metadata": {
                    "user_id": "u",
                    "project_id": "default",
                    "creation_time": "2026-01-01 00:00:00.000000",
                    "resources": {"cpu": 1.5},
                    "priority": 5,
                },
            }
        ),
    )
    bastion.cli("launch", "--name=good", "--", "echo fine")
    bastion.start()
    assert bastion.wait_complete("good")["state"]["outcome"] == "SUCCEEDED"
    broken = bastion.wait_complete("broken")
    assert broken["state"]["outcome"] == "REJECTED"
    assert "not valid JSON" in broken["state"]["reason"]
    assert broken["spec_text"] == "{this is not json"
    wrong = bastion.wait_complete("wrongtype")
    assert "metadata.resources.cpu" in wrong["state"]["reason"]
    assert not bastion.exists("jobs", "active", "broken")


def test_name_mismatch_is_rejected_never_acted_on(bastion, tmp_path):
    marker = tmp_path / "ran"
    bastion.cli("launch", "--name=victim", "--", "sleep 3")
    spec = json.loads(bastion.read("jobs", "active", "victim"))
    spec["command"] = f"touch {marker}"
    bastion.put("jobs", "active", "impostor", data=json.dumps(spec))
    bastion.start()
    impostor = bastion.wait_complete("impostor")
    assert impostor["state"]["outcome"] == "REJECTED"
    assert "file name is the job's key" in impostor["state"]["reason"]
    assert bastion.wait_complete("victim")["state"]["outcome"] == "SUCCEEDED"
    assert not marker.exists()


def test_axlearn_spec_runs(bastion):
    spec = {
        "version": 1,
        "name": "ax1",
        "command": "echo from axlearn",
        "cleanup_command": None,
        "env_vars": {"X": "1"},
        "metadata": {
            "user_id": "alice",
            "project_id": "default",
            "creation_time": "2026-01-01 12:00:00.000000",
            "resources": {"cpu": 1},
            "priority": 3,
            "job_id": None,
            "version": None,
            "scaling_specs": None,
        },
    }
    bastion.put("jobs", "active", "ax1", data=json.dumps(spec))
    bastion.start()
    assert bastion.wait_complete("ax1")["state"]["outcome"] == "SUCCEEDED"
    assert "from axlearn" in bastion.log("ax1")


def test_stale_cancel_is_deleted_not_applied_to_later_job(bastion):
    bastion.put(
        "jobs", "user_states", "later", data=json.dumps({"status": "CANCELLING", "metadata": {}})
    )
    bastion.once()
    assert not bastion.exists("jobs", "user_states", "later")
    bastion.cli("launch", "--name=later", "--", "echo survived")
    bastion.start()
    assert bastion.wait_complete("later")["state"]["outcome"] == "SUCCEEDED"


def test_cancel_for_an_earlier_job_of_same_name_is_stale(bastion):
    bastion.cli("launch", "--name=again", "--", "sleep 1")
    bastion.put(
        "jobs",
        "user_states",
        "again",
        data=json.dumps({"status": "CANCELLING", "job_identity": "some-earlier-job"}),
    )
    bastion.start()
    assert bastion.wait_complete("again")["state"]["outcome"] == "SUCCEEDED"


def test_cleanup_command_has_its_own_log(bastion):
    bastion.start()
    bastion.cli(
        "launch",
        "--name=tidy",
        "--cleanup_command=echo cleaning $BASTION_JOB_NAME",
        "--",
        "echo working",
    )
    record = bastion.wait_complete("tidy")
    assert record["state"]["outcome"] == "SUCCEEDED"
    assert "cleaning tidy" in bastion.log("tidy.cleanup")
    assert "working" in bastion.log("tidy") and "cleaning" not in bastion.log("tidy")


def test_update_restarts_running_job_as_new_attempt(bastion, tmp_path):
    bastion.start("--grace_seconds=2")
    bastion.cli("launch", "--name=evolve", "--", "echo old; sleep 300")
    wait_for(lambda: "old" in bastion.log("evolve"), what="first attempt output")
    bastion.cli("update", "evolve", "--", "echo new")
    record = bastion.wait_complete("evolve")
    assert record["state"]["outcome"] == "SUCCEEDED" and record["state"]["attempt"] == 2
    log = bastion.log("evolve")
    assert log.index("old") < log.index("attempt 2 of evolve") < log.index("new")


def test_resubmitted_name_shows_only_its_own_log(bastion):
    bastion.start()
    bastion.cli("launch", "--name=twice", "--", "echo first run")
    bastion.wait_complete("twice")
    bastion.store.objects.delete(f"{bastion.store.root}/jobs/complete/twice")
    bastion.cli("launch", "--name=twice", "--", "echo second run")
    bastion.wait_complete("twice")
    out = bastion.cli("logs", "twice").stdout
    assert "second run" in out and "first run" not in out
    assert "first run" in bastion.log("twice")  # the bucket object keeps both


def test_bad_cli_input_is_a_clear_error(bastion):
    proc = bastion.cli("launch", "--name=bad name", "--", "true", check=False)
    assert proc.returncode == 1 and "not a safe identifier" in proc.stderr
    proc = bastion.cli("launch", "--name=x", "--resources=v4=eight", "--", "true", check=False)
    assert proc.returncode == 1 and "v4" in proc.stderr
    proc = bastion.cli("launch", "--name=x", check=False)
    assert proc.returncode == 2 and "give the command after --" in proc.stderr
    bastion.cli("launch", "--name=dup", "--", "true")
    proc = bastion.cli("launch", "--name=dup", "--", "true", check=False)
    assert proc.returncode == 1 and "already active" in proc.stderr


def test_attempt_of_a_job_deleted_while_daemon_down_is_killed(bastion, tmp_path):
    pidfile = tmp_path / "pid"
    daemon = bastion.start()
    bastion.cli("launch", "--name=orphan", "--", f"echo $$ > {pidfile}; sleep 300")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="job start")
    pid = int(pidfile.read_text())
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    bastion.store.specs.delete("orphan")
    bastion.store.states.delete("orphan")
    bastion.start()
    wait_for(
        lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
        what="orphan attempt to be killed",
    )
