"""The slurm runner end to end: the real daemon in-process (``cycle`` then ``settle``), the
session's real two-node Slurm (tests/slurm_cluster.py), the real agents under ``srun``, a
local-directory root.

Jobs are submitted as ``bastion launch --runner=slurm --runner_option=nodes=2`` writes them:
runner ``{"kind": "slurm", "nodes": "2"}``; the quota file gives the default project a pool
with the cluster's CPUs and GPUs (the embedded default is this machine's own pool)."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bastion.daemon import SWEEP_EVERY_CYCLES, Daemon
from bastion.daemon.start import build_daemon
from bastion.runners import base
from bastion.runners.base import Attempt
from bastion.runners.slurm import SlurmRunner, comment_for
from launch.api import Client, new_jobspec
from tests.slurm_cluster import SlurmCluster
from tests.test_slurm_runner import AGENT_ARGS

QUOTA = """[toml-schema]
version = "1"
[total_resources]
cpu = 64
gpu = 8
[project_membership]
default = [".*"]
[project_resources.default]
cpu = 1.0
gpu = 1.0
"""
CPUS = os.cpu_count() or 1  # per node: a job asking 2 * CPUS over 2 nodes fills the cluster


class Rig:
    def __init__(self, tmp: Path, slurm: SlurmCluster) -> None:
        self.tmp, self.slurm = tmp, slurm
        self.root = tmp / "root"
        (self.root / "project-quotas").mkdir(parents=True)
        (self.root / "project-quotas" / "project-quotas.config").write_text(QUOTA)
        self.client = Client(str(self.root), expect_daemon=False)
        self.daemons: list[Daemon] = []

    def daemon(self, work: str = "work", **more: Any) -> Daemon:
        slurm = {
            "python": sys.executable,
            "agent_args": AGENT_ARGS,
            "listing_ttl": 0,
            "slurm_output": str(self.tmp / "%x.out"),
            "heartbeat_timeout": 30,
            "jobcomp_file": str(self.slurm.jobcomp),
            **more,
        }
        settings = {"default_runner": "local", "runners": {"slurm": slurm}}
        daemon = build_daemon(
            str(self.root), work_dir=str(self.tmp / work), gpus=[], settings=settings
        )
        self.daemons.append(daemon)
        return daemon

    @staticmethod
    def runner(daemon: Daemon) -> SlurmRunner:
        runner = daemon.runners.get("slurm")
        assert isinstance(runner, SlurmRunner)
        return runner

    def submit(
        self, name: str, command: str, resources: dict[str, int] | None = None, **options: Any
    ) -> None:
        self.client.submit(
            new_jobspec(
                name=name,
                command=command,
                user_id="tester",
                project_id="default",
                resources=resources or {"cpu": 1},
                runner={"kind": "slurm", **options},
            )
        )

    def drive(
        self, daemon: Daemon, done: Callable[[], bool], what: str, timeout: float = 60
    ) -> int:
        deadline, steps = time.monotonic() + timeout, 0
        while not done():
            if time.monotonic() > deadline:
                states = {j.name: (j.status, j.reason) for j in self.client.list_jobs(True)}
                raise AssertionError(
                    f"timed out waiting for {what} after {steps} cycles: "
                    f"{states}\nSlurm: {self.slurm.jobs()}"
                )
            daemon.cycle(time.time())
            daemon.settle()
            steps += 1
            time.sleep(0.1)
        return steps

    def finished(self, name: str) -> bool:
        return (self.root / "jobs" / "complete" / name).exists()

    def log(self, name: str) -> str:
        path = self.root / "logs" / name
        return path.read_text() if path.exists() else ""

    def worker_log(self, name: str, worker: int) -> str:
        return b"".join(self.client.worker_output(name, worker)).decode()

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.close()


@pytest.fixture
def rig(tmp_path: Path, slurm: SlurmCluster) -> Iterator[Rig]:
    r = Rig(tmp_path, slurm)
    try:
        yield r
    finally:
        r.close()


HELLO = 'echo "hello from $BASTION_WORKER of $BASTION_NUM_WORKERS on $SLURMD_NODENAME"'


def test_one_and_two_node_jobs_succeed_with_every_workers_log(rig: Rig) -> None:
    rig.submit("one", HELLO)
    rig.submit("two", HELLO, resources={"cpu": 2}, nodes="2")
    daemon = rig.daemon()
    rig.drive(daemon, lambda: rig.finished("one") and rig.finished("two"), "both to finish")
    for name in ("one", "two"):
        info = rig.client.get(name)
        assert (info.status, info.state.attempt, info.state.exit_code) == ("SUCCEEDED", 1, 0)
    assert "hello from 0 of 1 on n" in rig.log("one")
    assert "hello from 0 of 2 on n1" in rig.log("two")
    assert rig.worker_log("two", 1).endswith("hello from 1 of 2 on n2\n")
    history = [(e["event"], e["reason"]) for e in rig.client.history("two")]
    assert any(
        event == "PLACED" and "Slurm job" in why and "(2 nodes)" in why for event, why in history
    ), history
    assert not (rig.root / "agents" / "two").exists()  # records deleted with the job


def test_a_job_exiting_3_fails_with_3(rig: Rig) -> None:
    rig.submit("three", "echo about to fail; exit 3")
    daemon = rig.daemon()
    rig.drive(daemon, lambda: rig.finished("three"), "three to finish")
    info = rig.client.get("three")
    assert (info.status, info.state.exit_code) == ("FAILED", 3)
    assert "about to fail" in rig.log("three")


def _processes_with(token: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(token in part for part in p.info["cmdline"] or ()):
            found.append(p)
    return found


def test_cancel_stops_the_job_and_its_processes(rig: Rig) -> None:
    token = uuid.uuid4().hex
    rig.submit("stopme", f"echo up; sleep 300 # {token}", resources={"cpu": 2}, nodes="2")
    daemon = rig.daemon()
    rig.drive(daemon, lambda: "up" in rig.log("stopme"), "stopme to run")
    assert _processes_with(token)
    rig.client.cancel("stopme", user_id="tester")
    rig.drive(daemon, lambda: rig.finished("stopme"), "stopme to end", timeout=40)
    assert rig.client.get("stopme").status == "CANCELLED"
    assert not [j for j in rig.slurm.live() if "stopme" in j["name"]]
    assert not _processes_with(token)


def test_a_low_partition_job_preempted_by_a_high_one_is_requeued_as_attempt_2(
    rig: Rig,
) -> None:
    marker = f"{rig.tmp}/ran-once-$BASTION_WORKER"  # per worker: the two nodes race
    low = (
        f"if [ -e {marker} ]; then echo second run; else touch {marker}; echo first run; "
        "sleep 300; fi"
    )
    whole = {"cpu": 2 * CPUS}
    rig.submit("low", low, resources=whole, nodes="2", partition="low")
    daemon = rig.daemon()
    rig.drive(daemon, lambda: "first run" in rig.log("low"), "low to run")
    rig.submit("high", "echo high ran; sleep 1", resources=whole, nodes="2", partition="high")
    rig.drive(
        daemon, lambda: rig.finished("low") and rig.finished("high"), "both to finish", timeout=90
    )
    info = rig.client.get("low")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 2)
    log = rig.log("low")
    assert log.index("first run") < log.index("second run")
    reasons = [e["reason"] for e in rig.client.history("low")]
    assert any("preempted by Slurm" in r for r in reasons), reasons
    assert rig.client.get("high").status == "SUCCEEDED"


def test_daemon_killed_between_sbatch_and_state_write_adopts_without_a_second_submit(
    rig: Rig,
) -> None:
    rig.submit("crash", 'echo "once on $BASTION_WORKER"')
    first = rig.daemon("work-1")
    runner = rig.runner(first)
    submitted, never = threading.Event(), threading.Event()
    real_start = runner.start

    def start_then_die(attempt: Attempt):
        real_start(attempt)  # the Slurm job is submitted ...
        submitted.set()
        never.wait(60)  # ... and the daemon dies before it takes in the handle
        raise SystemExit("killed")

    runner.start = start_then_die  # type: ignore[method-assign]
    first.cycle(time.time())
    assert submitted.wait(30)
    assert rig.client.get("crash").state.run_attempt.handle is None
    second = rig.daemon("work-2")
    try:
        rig.drive(second, lambda: rig.finished("crash"), "crash to finish")
    finally:
        never.set()
    assert rig.client.get("crash").status == "SUCCEEDED"
    assert rig.log("crash").count("once on 0") == 1
    prefix = base.name_prefix(str(rig.root)) + "crash-"
    assert len([j for j in rig.slurm.jobs() if j["name"].startswith(prefix)]) == 1  # one sbatch


def test_an_orphan_of_this_root_is_cancelled_and_another_roots_job_left_alone(rig: Rig) -> None:
    daemon = rig.daemon()
    runner = rig.runner(daemon)
    other_root = str(rig.tmp / "other-root")
    orphan = Attempt(
        name=base.attempt_name(runner.root, "gone", "sub", 1, "run"),
        job="gone",
        attempt=1,
        command="sleep 300",
        env={},
    )
    theirs = Attempt(
        name=base.attempt_name(other_root, "theirs", "sub", 1, "run"),
        job="theirs",
        attempt=1,
        command="sleep 300",
        env={},
    )
    for a, tag in ((orphan, runner.tag), (theirs, base.root_tag(other_root))):
        rig.slurm.run(
            "sbatch",
            "--parsable",
            f"--job-name={a.name}",
            "--output=/dev/null",
            f"--comment={comment_for(a, tag)}",
            "--wrap=sleep 300",
        )
    rig.drive(
        daemon,
        lambda: not [j for j in rig.slurm.live() if j["name"] == orphan.name],
        "the orphan to be cancelled",
        timeout=40,
    )
    for _ in range(SWEEP_EVERY_CYCLES + 1):
        daemon.cycle(time.time())
        daemon.settle()
    assert [j["name"] for j in rig.slurm.live()] == [theirs.name]


def test_the_time_limit_warns_the_command_then_fails_the_job_as_timeout_not_requeued(
    rig: Rig,
) -> None:
    """``--time=2`` with the warning 60 s before: the command gets SIGTERM (here it only says
    so and goes on), its output is flushed, and at the limit Slurm ends the job as TIMEOUT:
    FAILED with "time limit", one attempt. (Slurm checks limits about every 30 s, so the
    margins are a minute.)"""
    command = "trap 'echo cmd-warned' TERM; echo cmd-up; while true; do sleep 0.2; done"
    rig.submit("limited", command, time="2")
    daemon = rig.daemon(warn_seconds=60)
    rig.drive(daemon, lambda: rig.finished("limited"), "the time limit", timeout=240)
    info = rig.client.get("limited")
    assert (info.status, info.state.attempt) == ("FAILED", 1)
    assert "time limit" in info.reason and "TIMEOUT" in info.reason, info.reason
    log = rig.log("limited")
    assert "\ncmd-up\n" in log and "\ncmd-warned\n" in log, log
    assert log.index("cmd-up") < log.index("cmd-warned"), log
    assert not [e for e in rig.client.history("limited") if "REQUEUED" in e["event"]]


def test_a_node_failure_mid_run_is_a_preemption_requeued_once_the_node_is_back(
    rig: Rig,
) -> None:
    """slurmd of the job's node killed: Slurm marks the node down and the job NODE_FAIL
    (SlurmdTimeout=10); the attempt is preempted, not failed, and attempt 2 runs once the
    node is back."""
    marker = f"{rig.tmp}/node-fail-ran"
    token = uuid.uuid4().hex
    command = (
        f"if [ -e {marker} ]; then echo second run; else touch {marker}; echo first run; "
        f"sleep 300; fi # {token}"
    )
    rig.submit("nodefail", command)
    daemon = rig.daemon()
    rig.drive(daemon, lambda: "first run" in rig.log("nodefail"), "the first run")
    (job,) = [j for j in rig.slurm.jobs() if "nodefail" in j["name"]]
    node = rig.slurm.run("squeue", "-h", "-j", job["id"], "-o", "%N").strip()
    pid = int((rig.slurm.dir / f"slurmd-{node}.pid").read_text())
    os.kill(pid, 9)
    try:
        rig.drive(
            daemon,
            lambda: rig.client.get("nodefail").state.attempt == 2,
            "the node failure to requeue",
            timeout=120,
        )
    finally:
        rig.slurm.run("slurmd", "-N", node)
        for p in _processes_with(token):  # linuxproc: the dead node's processes outlive it
            p.kill()
    rig.drive(daemon, lambda: rig.finished("nodefail"), "attempt 2 to finish", timeout=120)
    info = rig.client.get("nodefail")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 2)
    reasons = [e["reason"] for e in rig.client.history("nodefail")]
    assert any("NODE_FAIL (node failure)" in r for r in reasons), reasons
    assert "second run" in rig.log("nodefail")


def test_shared_fs_output_reaches_the_jobs_log_through_the_daemon(rig: Rig) -> None:
    out = rig.tmp / "shared"
    out.mkdir()
    rig.submit("nfs", 'echo "line $BASTION_WORKER"; exit 0', resources={"cpu": 2}, nodes="2")
    daemon = rig.daemon(output="shared_fs", output_dir=str(out))
    rig.drive(daemon, lambda: rig.finished("nfs"), "nfs to finish")
    info = rig.client.get("nfs")
    assert (info.status, info.state.exit_code) == ("SUCCEEDED", 0)
    log = rig.log("nfs")
    assert "\nline 0\n" in log and "line 1" not in log, log  # the job's log is worker 0's
