"""The cloud path end to end through the daemon: the real daemon in-process (``cycle`` then
``settle``), the TPU stand-in behind the real googleapiclient, the real agents started by the
stand-in's ``on_ready`` hook (tests/test_cloud_runners.py ``Guests``), a local-directory root.

Jobs are submitted as ``bastion launch --instance_type=tpu-v4-32`` writes them: runner
``{"kind": "tpu", "accelerator_type": "v4-32"}`` and resources ``{"v4": 32}``; the quota file
gives the default project a pool with v4 capacity (the embedded default pool is this machine's
CPUs and memory only, which would never admit a v4 job). Cloud time moves one ``tick()`` per
daemon cycle; agents run in real time, so every wait is bounded.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.bucket.store import Store
from bastion.daemon import SWEEP_EVERY_CYCLES, Daemon
from bastion.daemon.start import build_daemon
from bastion.runners.base import Attempt
from bastion.runners.google.tpu import TpuRunner
from launch.api import Client, new_jobspec
from launch.why import explain_job
from tests.conftest import fresh_gcs_root
from tests.standins.compute import ComputeServer
from tests.standins.tpu import TpuServer
from tests.test_cloud_runners import FAST, SLICE_ECHO, ZA, ZB, Guests, P

QUOTA = """[toml-schema]
version = "1"
[total_resources]
v4 = 256
cpu = 64
[project_membership]
default = [".*"]
[project_resources.default]
v4 = 1.0
cpu = 1.0
"""
LOOP = "for i in $(seq 1 100000); do echo line $i; sleep 0.02; done"


class Cloud:
    """A root, the TPU stand-in, the guests, and daemons on them."""

    def __init__(self, tmp: Path, server: TpuServer, guests: Guests) -> None:
        self.tmp, self.server, self.guests = tmp, server, guests
        self.root = tmp / "root"
        self.client = Client(str(self.root), expect_daemon=False)
        (self.root / "project-quotas").mkdir(parents=True, exist_ok=True)
        (self.root / "project-quotas" / "project-quotas.config").write_text(QUOTA)
        self.daemons: list[Daemon] = []
        self.tpu_settings: dict[str, Any] = {
            "project": P,
            "zones": [ZA, ZB],
            "api_endpoint": server.endpoint,
            "python": sys.executable,
            "agent_args": FAST,
            "listing_ttl": 0,
            "heartbeat_timeout": 30,
        }

    def daemon(self, work: str = "work", **more: Any) -> Daemon:
        tpu = {**self.tpu_settings, **more}
        settings = {"default_runner": "local", "runners": {"tpu": tpu, "tpu-qr": tpu}}
        daemon = build_daemon(
            str(self.root), work_dir=str(self.tmp / work), gpus=[], settings=settings
        )
        self.runner(daemon).sleep = lambda _s: None
        daemon.runners.get("tpu-qr").sleep = lambda _s: None
        self.daemons.append(daemon)
        return daemon

    @staticmethod
    def runner(daemon: Daemon) -> TpuRunner:
        runner = daemon.runners.get("tpu")
        assert isinstance(runner, TpuRunner)
        return runner

    def submit(
        self, name: str, command: str, acc: str = "v4-32", kind: str = "tpu", **options: Any
    ) -> None:
        self.client.submit(
            new_jobspec(
                name=name,
                command=command,
                user_id="tester",
                project_id="default",
                resources={"v4": int(acc.split("-")[1])},
                runner={"kind": kind, "accelerator_type": acc, **options},
            )
        )

    def step(self, daemon: Daemon) -> None:
        daemon.cycle(time.time())
        daemon.settle()
        self.server.tick()

    def drive(
        self, daemon: Daemon, done: Callable[[], bool], what: str, timeout: float = 60
    ) -> int:
        deadline, steps = time.monotonic() + timeout, 0
        while not done():
            if time.monotonic() > deadline:
                states = {
                    n: (self.runner_record(n).get("phase"), self.info(n).reason)
                    for n in self.names()
                }
                raise AssertionError(f"timed out waiting for {what} after {steps} cycles: {states}")
            self.step(daemon)
            steps += 1
            time.sleep(0.05)
        return steps

    def names(self) -> list[str]:
        states = self.root / "jobs" / "states"
        return (
            sorted(p.name for p in states.iterdir() if not p.name.startswith("."))
            if states.exists()
            else []
        )

    def finished(self, name: str) -> bool:
        return (self.root / "jobs" / "complete" / name).exists()

    def info(self, name: str):
        return self.client.get(name)

    def runner_record(self, name: str) -> dict[str, Any]:
        """The run attempt's record as the bucket holds it (JSON key "runner"); {}: none."""
        state = self.client.get(name).state
        record = state.run_attempt if state else None
        return record.to_json() if record is not None else {}

    def log(self, name: str) -> str:
        path = self.root / "logs" / name
        return path.read_text() if path.exists() else ""

    def events(self, name: str) -> list[str]:
        return [e["event"] for e in self.client.history(name)]

    def creates(self) -> list[tuple]:
        return [r for r in self.server.requests if r[0] == "POST" and r[1].endswith("/nodes")]

    def node_names(self) -> list[str]:
        return sorted(n.rsplit("/", 1)[1] for n in self.server.nodes)

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.close()


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    guests = Guests(tmp_path)

    def on_ready(node: dict, worker: int, metadata: dict) -> None:
        if "startup-script" in metadata:  # a node made by hand (an orphan) runs nothing
            guests.on_ready(node, worker, metadata)

    with TpuServer(on_ready=on_ready) as server:
        c = Cloud(tmp_path, server, guests)
        try:
            yield c
        finally:
            c.close()
            guests.close()


def attempt_section(log: str, n: int) -> str:
    """The output of attempt ``n`` between its start and end markers."""
    m = re.search(
        rf"=== \[bastion\] attempt {n} of [^\n]* ===\n(.*?)=== \[bastion\] attempt {n} ", log, re.S
    )
    assert m, log[-2000:]
    return m.group(1)


def assert_attempt_output_has_no_gap(log: str, n: int) -> None:
    """Attempt ``n`` printed ``line 1``, ``line 2``, ... (LOOP): all of it up to its end."""
    out = attempt_section(log, n)
    count = out.count("\n")
    assert count >= 5 and out == "".join(f"line {i}\n" for i in range(1, count + 1))


def node_gone(cloud: Cloud, name: str) -> Callable[[], bool]:
    return lambda: name not in cloud.node_names()


# -- 1. happy path on a 4-worker v4-32 --------------------------------------------------------


def test_happy_path_v4_32_four_workers(cloud: Cloud) -> None:
    cloud.submit("train", 'echo "hello from $BASTION_WORKER of $BASTION_NUM_WORKERS"')
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: cloud.finished("train"), "train to finish")
    info = cloud.info("train")
    assert (info.status, info.state.attempt, info.state.exit_code) == ("SUCCEEDED", 1, 0)
    name = next(iter(cloud.guests.workers))
    assert len(cloud.guests.workers[name]) == 4 and cloud.guests.wait(name) == [0, 0, 0, 0]
    assert attempt_section(cloud.log("train"), 1) == "hello from 0 of 4\n"
    assert "attempt 1 exited with status 0" in cloud.log("train")
    assert [r[1].split("/")[5] for r in cloud.creates()] == [ZA]
    body = cloud.creates()[0][3]
    assert body["acceleratorType"] == "v4-32" and body["labels"]["bastion-job"] == "train"
    cloud.drive(daemon, node_gone(cloud, name), "the node to be deleted", timeout=20)
    deletes = [r for r in cloud.server.requests if r[0] == "DELETE"]
    assert len(deletes) == 1
    gets = [r for r in cloud.server.requests if r[0] == "GET" and r[1].endswith("/" + name)]
    assert gets == []  # verified gone by the zone's listing of a later cycle, not a GET per node
    # The job is recorded as finished only once its node is verified gone, and says so.
    history = [(e["event"], e["reason"]) for e in cloud.client.history("train")]
    assert ("PLACED", f"attempt 1 on TPU node {name} (4 workers) in {ZA}") in history
    assert ("DELETED", f"deleted TPU node {name} (4 workers) in {ZA}") in history
    assert [e for e, _ in history].index("DELETED") > [e for e, _ in history].index("SUCCEEDED")
    assert not (cloud.root / "agents" / "train").exists()  # the agents' records went with it
    assert Store(str(cloud.root)).runs.list("train", name)  # ... and their output stays


# -- 2. a daemon killed between the create call and its state write -------------------------


def test_daemon_killed_between_create_and_state_write_adopts(cloud: Cloud) -> None:
    cloud.submit("crash", 'echo "once on $BASTION_WORKER"')
    first = cloud.daemon("work-1")
    runner = cloud.runner(first)
    created, never = threading.Event(), threading.Event()
    real_start = runner.start

    def start_then_die(attempt: Attempt):
        real_start(attempt)  # the node is created ...
        created.set()
        never.wait(60)  # ... and the daemon dies before it takes in the handle
        raise SystemExit("killed")

    runner.start = start_then_die  # type: ignore[method-assign]
    first.cycle(time.time())  # the state (attempt name, no handle) is written; start in flight
    assert created.wait(20)
    record = cloud.runner_record("crash")
    assert record["name"] and record.get("handle") is None
    assert len(cloud.creates()) == 1
    second = cloud.daemon("work-2")  # a fresh daemon on another machine
    try:
        cloud.drive(second, lambda: cloud.finished("crash"), "crash to finish")
    finally:
        never.set()
    info = cloud.info("crash")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1)
    assert len(cloud.creates()) == 1  # adopted by name, never created again
    assert attempt_section(cloud.log("crash"), 1) == "once on 0\n"


# -- 3. phantom 409 -------------------------------------------------------------------------


def test_phantom_409_is_adopted(cloud: Cloud) -> None:
    cloud.server.phantom_409()
    cloud.submit("phantom", "echo adopted")
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: cloud.finished("phantom"), "phantom to finish")
    info = cloud.info("phantom")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1)
    assert len(cloud.creates()) == 1
    assert attempt_section(cloud.log("phantom"), 1) == "adopted\n"


# -- 4. stockout in zone A, then zone B; quota with a readable reason and no hot loop --------


def test_stockout_in_zone_a_requeues_into_zone_b(cloud: Cloud) -> None:
    cloud.server.stockout(ZA)
    cloud.submit("stock", "echo landed")
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: cloud.finished("stock"), "stock to finish")
    info = cloud.info("stock")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 2)
    assert "PROVISIONING_FAILED" in cloud.events("stock")
    history = [e for e in cloud.client.history("stock") if e["event"] == "PROVISIONING_FAILED"]
    assert f"stockout in {ZA}" in history[0]["reason"]
    assert [r[1].split("/")[5] for r in cloud.creates()] == [ZA, ZB]
    names = [r[2]["nodeId"] for r in cloud.creates()]
    assert names[0].endswith("-a1") and names[1].endswith("-a2")
    assert attempt_section(cloud.log("stock"), 2) == "landed\n"


def test_quota_error_waits_with_a_readable_reason_without_a_hot_loop(cloud: Cloud) -> None:
    cloud.server.quota()  # every zone
    cloud.submit("quota", "echo finally")
    daemon = cloud.daemon(zone_block_seconds=3)
    for _ in range(8):
        cloud.step(daemon)
    info = cloud.info("quota")
    assert info.status != "FAILED" and info.state.attempt == 1
    assert "quota TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI exhausted" in info.reason
    assert "us-central2" in info.reason and "europe-west4" in info.reason
    assert len(cloud.creates()) == 2  # one per region over 8 cycles, then blocked
    why = explain_job(cloud.client, "quota").splitlines()
    assert why[0].startswith("job quota: KEEP")  # the policy admitted it: the cloud holds it
    assert why[-1].startswith("  now: ") and "TPUV2sPreemptiblePodPerProject" in why[-1]
    cloud.server.lift_quota()
    cloud.drive(daemon, lambda: cloud.finished("quota"), "quota to finish after the lift")
    info = cloud.info("quota")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1)
    assert len(cloud.creates()) == 3


# -- 5. a queued resource stuck past its deadline ------------------------------------------


def test_queued_resource_past_its_deadline_is_requeued_into_the_next_zone(cloud: Cloud) -> None:
    cloud.server.stockout(ZA)  # the request waits in ZA's queue until its validUntil passes
    cloud.submit("queued", "echo from the queue", kind="tpu-qr")
    daemon = cloud.daemon(queue_seconds=300)
    reasons: set[str] = set()

    def done() -> bool:
        reasons.add(cloud.info("queued").reason)
        return cloud.finished("queued")

    cloud.drive(daemon, done, "queued to finish")
    info = cloud.info("queued")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 2)
    assert f"attempt 1: queued: waiting for capacity in {ZA}" in reasons
    (failed,) = [e for e in cloud.client.history("queued") if e["event"] == "PROVISIONING_FAILED"]
    assert f"stockout in {ZA}" in failed["reason"] and "validUntil" in failed["reason"]
    qr_posts = [r for r in cloud.server.requests if r[1].endswith("/queuedResources")]
    zones = [r[1].split("/")[5] for r in qr_posts if r[0] == "POST"]
    assert zones == [ZA, ZB]
    assert attempt_section(cloud.log("queued"), 2) == "from the queue\n"
    cloud.drive(daemon, lambda: not cloud.server.qrs, "every queued resource deleted", timeout=20)


# -- 6. spot preemption while running -------------------------------------------------------


def test_spot_preemption_requeues_on_a_new_node(cloud: Cloud) -> None:
    cloud.submit("spot", LOOP, spot=True)
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: "line 5\n" in cloud.log("spot"), "output of attempt 1")
    first = cloud.runner_record("spot")["name"]
    cloud.drive(
        daemon,
        lambda: cloud.runner_record("spot").get("workers") == ["running"] * 4,
        "every worker's health in the state",
    )
    cloud.guests.preempt(first)  # the metadata notice, then the node turns PREEMPTED
    cloud.server.preempt(first)
    cloud.drive(daemon, lambda: cloud.info("spot").state.attempt == 2, "attempt 2")
    cloud.drive(
        daemon,
        lambda: (
            cloud.runner_record("spot").get("phase") == "RUNNING"
            and first not in cloud.node_names()
        ),
        "attempt 2 running and the old node deleted",
    )
    second = cloud.runner_record("spot")["name"]
    assert second != first and second.endswith("-a2") and first.endswith("-a1")
    info = cloud.info("spot")
    assert info.state.provider_preemptions == 1 and info.status != "FAILED"
    assert "PROVIDER_PREEMPTED" in cloud.events("spot")
    told = [(e["event"], e["attempt"], e["reason"]) for e in cloud.client.history("spot")]
    placed = [(a, r.split()[5]) for e, a, r in told if e == "PLACED"]  # (attempt, node)
    assert placed == [(1, first), (2, second)]
    assert ("DELETED", 1, f"deleted TPU node {first} (4 workers) in {ZA}") in told  # its attempt
    log = cloud.log("spot")
    assert "attempt 1 was preempted by the provider" in log
    assert_attempt_output_has_no_gap(log, 1)
    assert cloud.node_names() == [second]
    cloud.client.cancel("spot", user_id="tester")
    cloud.drive(daemon, lambda: cloud.finished("spot"), "the cancel")
    cloud.drive(daemon, lambda: not cloud.node_names(), "every node deleted", timeout=20)
    assert cloud.info("spot").status == "CANCELLED"


def test_spot_preemption_log_has_everything_the_agents_flushed(cloud: Cloud) -> None:
    """The agents flush their last chunk and exit record during the spot window, after the
    node already reads PREEMPTED; the daemon reads an attempt's log to its end once, when the
    attempt is finished, so the runner reports PREEMPTED only once every worker's exit record
    is in (or ``flush_seconds`` later). Before that fix the log missed the last lines."""
    cloud.submit("flush", LOOP, spot=True)
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: "line 5\n" in cloud.log("flush"), "output of attempt 1")
    first = cloud.runner_record("flush")["name"]
    cloud.guests.preempt(first)
    cloud.server.preempt(first)
    cloud.drive(daemon, lambda: cloud.info("flush").state.attempt == 2, "attempt 2")
    cloud.guests.wait(first)
    exit_record = Store(str(cloud.root)).agents.read("flush", first, 0, "exit")
    assert exit_record["preempted"] is True
    assert len(attempt_section(cloud.log("flush"), 1)) == exit_record["output_bytes"]


# -- 12. one worker of four exits 1 ---------------------------------------------------------


def test_one_worker_exits_1_fails_the_job(cloud: Cloud) -> None:
    cloud.submit("bad", 'if [ "$BASTION_WORKER" = 2 ]; then echo bad; exit 1; fi; sleep 60')
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: cloud.finished("bad"), "bad to finish")
    info = cloud.info("bad")
    assert (info.status, info.state.exit_code, info.state.attempt) == ("FAILED", 1, 1)
    assert "attempt 1 exited with status 1" in cloud.log("bad")
    name = next(iter(cloud.guests.workers))
    cloud.guests.shutdown(name)  # the VMs' power-off as the node is deleted
    cloud.drive(daemon, node_gone(cloud, name), "the node to be deleted", timeout=20)


def test_one_worker_exits_1_names_the_worker(cloud: Cloud) -> None:
    """The runner says "worker 2 exited with status 1"; lifecycle._observed drops any runner
    reason containing "status" (to avoid "status 1 (status 1)"), so the job's reason is just
    "command exited with status 1" and ``bastion list``/``why`` never say which worker."""
    cloud.submit("which", 'if [ "$BASTION_WORKER" = 2 ]; then exit 1; fi; sleep 60')
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: cloud.finished("which"), "which to finish")
    assert "worker 2 exited with status 1" in cloud.info("which").reason


# -- 9. orphans -----------------------------------------------------------------------------


def test_orphan_node_deleted_unlabelled_left_alone(cloud: Cloud) -> None:
    daemon = cloud.daemon()
    api = cloud.runner(daemon).client.nodes()
    body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}
    parent = f"projects/{P}/locations/{ZB}"
    labels = {"bastion-root": cloud.runner(daemon).tag}
    api.create(
        parent=parent,
        nodeId="orphan",
        body={**body, "labels": labels, "metadata": {"bastion-job-name": "gone"}},
    ).execute()
    api.create(parent=parent, nodeId="someone-elses", body=body).execute()
    cloud.server.tick(2)  # both READY (no startup script: no guest runs)
    cloud.drive(daemon, node_gone(cloud, "orphan"), "the orphan to be deleted", timeout=20)
    assert cloud.node_names() == ["someone-elses"]
    for _ in range(3):
        cloud.step(daemon)
    assert cloud.node_names() == ["someone-elses"]


# -- cost: API calls per steady-state cycle ---------------------------------------------------


@pytest.mark.parametrize("jobs", [1, 4])
def test_api_calls_per_steady_state_cycle(cloud: Cloud, jobs: int) -> None:
    for i in range(jobs):
        cloud.submit(f"steady{i}", "sleep 60", acc="v4-8")
    daemon = cloud.daemon(listing_ttl=0.5)
    jobs_ = range(jobs)
    cloud.drive(
        daemon,
        lambda: all(cloud.runner_record(f"steady{i}").get("phase") == "RUNNING" for i in jobs_),
        "every job running",
    )
    time.sleep(0.6)
    counts, bucket = [], []
    for _ in range(3):
        before, ops = len(cloud.server.requests), dict(cloud.runner(daemon).store.ops)
        report = daemon.cycle(time.time())
        daemon.settle()
        counts.append(len(cloud.server.requests) - before)
        runner_ops = {k: v - ops.get(k, 0) for k, v in cloud.runner(daemon).store.ops.items()}
        bucket.append((report.ops, {k: v for k, v in runner_ops.items() if v}))
        time.sleep(0.6)
    print(f"API calls per steady cycle with {jobs} running jobs: {counts}; bucket ops {bucket}")
    assert all(c <= 1 for c in counts), counts  # one listing of the one zone in use
    for i in range(jobs):
        cloud.client.cancel(f"steady{i}", user_id="tester")
    cloud.drive(daemon, lambda: all(cloud.finished(f"steady{i}") for i in range(jobs)), "cancels")


# -- what users see of a multi-host job: each worker's health and each worker's own output ---


def _cli(cloud: Cloud, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", f"--root={cloud.root}", *args],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_list_shows_each_worker_and_logs_reads_any_worker(cloud: Cloud) -> None:
    command = 'echo "w$BASTION_WORKER says hi"; if [ "$BASTION_WORKER" = 3 ]; then exit 0; fi; '
    cloud.submit("multi", command + LOOP)
    daemon = cloud.daemon()
    healthy = ["running", "running", "running", "exit 0"]
    cloud.drive(
        daemon,
        lambda: cloud.runner_record("multi").get("workers") == healthy,
        "three workers running and worker 3 done",
    )
    info = cloud.info("multi")
    assert info.worker_summary == "3/4 running; exit 0: w3"
    listed = _cli(cloud, "list")
    header, row = listed.stdout.splitlines()[:2]
    assert "WORKERS" in header and "3/4 running; exit 0: w3" in row, listed.stdout
    assert _cli(cloud, "list", "--json").stdout.count('"workers"') >= 1

    cloud.drive(
        daemon,
        lambda: b"line 3\n" in b"".join(cloud.client.worker_output("multi", 2)),
        "worker 2's output in the bucket",
    )
    two = _cli(cloud, "logs", "multi", "--worker=2")
    assert two.returncode == 0, two.stderr
    assert two.stdout.startswith("=== [bastion] attempt 1, worker 2 ===\nw2 says hi\nline 1\n")
    every = _cli(cloud, "logs", "multi", "--worker=all").stdout.splitlines()
    assert {"[a1 w0] w0 says hi", "[a1 w3] w3 says hi", "[a1 w1] line 1"} <= set(every)
    assert all(line.startswith("[a1 w") for line in every)
    missing = _cli(cloud, "logs", "multi", "--worker=7")
    assert missing.returncode == 1 and "workers 0..3 only" in missing.stderr
    bad = _cli(cloud, "logs", "multi", "--worker=two")
    assert bad.returncode != 0 and "--worker=two" in bad.stderr
    cloud.drive(daemon, lambda: "w0 says hi" in cloud.log("multi"), "worker 0's line merged")
    assert "w2 says hi" not in cloud.log("multi")  # the job's log is worker 0's alone

    cloud.client.cancel("multi", user_id="tester")
    cloud.drive(daemon, lambda: cloud.finished("multi"), "the cancel")
    after = _cli(cloud, "logs", "multi", "--worker=1")  # still there once the job is over
    assert after.returncode == 0 and "w1 says hi" in after.stdout


def test_worker_logs_of_a_one_process_job_are_its_log(cloud: Cloud) -> None:
    cloud.client.submit(
        new_jobspec(
            name="solo",
            command="echo alone",
            user_id="tester",
            project_id="default",
            resources={"cpu": 1},
        )
    )
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: cloud.finished("solo"), "solo to finish")
    zero = _cli(cloud, "logs", "solo", "--worker=0")
    assert zero.returncode == 0 and "alone\n" in zero.stdout
    one = _cli(cloud, "logs", "solo", "--worker=1")
    assert one.returncode == 1 and "a one-process job has only worker 0" in one.stderr


# -- queued resources through the daemon: a spot QR suspended by the service ----------------


def qr_names(cloud: Cloud) -> list[str]:
    return sorted(n.rsplit("/", 1)[1] for n in cloud.server.qrs)


def test_spot_queued_resource_suspended_by_the_service_requeues_on_a_new_one(
    cloud: Cloud,
) -> None:
    cloud.submit(
        "qrspot",
        f'if [ "$BASTION_ATTEMPT" = 1 ]; then {LOOP}; fi; echo second run',
        kind="tpu-qr",
        spot=True,
    )
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: "line 5\n" in cloud.log("qrspot"), "output of attempt 1")
    first = cloud.runner_record("qrspot")["name"]
    assert qr_names(cloud) == [first]
    (post,) = [
        r for r in cloud.server.requests if r[0] == "POST" and r[1].endswith("/queuedResources")
    ]
    assert post[2]["queuedResourceId"] == first and post[3]["spot"] == {}
    cloud.guests.preempt(first)  # the metadata notice ...
    cloud.server.preempt(first)  # ... QR SUSPENDING (then SUSPENDED) by the SERVICE
    cloud.drive(daemon, lambda: cloud.info("qrspot").state.attempt == 2, "attempt 2")
    info = cloud.info("qrspot")
    assert info.status != "FAILED" and info.state.provider_preemptions == 1
    cloud.drive(
        daemon,
        lambda: cloud.finished("qrspot") and first not in qr_names(cloud),
        "attempt 2 to finish and the old queued resource to be deleted",
    )
    info = cloud.info("qrspot")
    assert (info.status, info.state.attempt, info.state.exit_code) == ("SUCCEEDED", 2, 0)
    told = [(e["event"], e["attempt"], e["reason"]) for e in cloud.client.history("qrspot")]
    placed = [(a, r.split()[5]) for e, a, r in told if e == "PLACED"]  # (attempt, QR)
    second = placed[-1][1]
    assert placed == [(1, first), (2, second)]
    assert second != first and first.endswith("-a1") and second.endswith("-a2")
    assert ("PROVIDER_PREEMPTED", 1) in [(e, a) for e, a, _ in told]
    deleted = [(a, r) for e, a, r in told if e == "DELETED"]
    assert (1, f"deleted queued resource {first} (4 workers) in {ZA}") in deleted
    qr_posts = [
        r[2]["queuedResourceId"]
        for r in cloud.server.requests
        if r[0] == "POST" and r[1].endswith("/queuedResources")
    ]
    assert qr_posts == [first, second]
    log = cloud.log("qrspot")
    assert "attempt 1 was preempted by the provider" in log
    assert_attempt_output_has_no_gap(log, 1)
    assert attempt_section(log, 2) == "second run\n"
    cloud.drive(
        daemon,
        lambda: not cloud.server.qrs and not cloud.server.nodes,
        "every queued resource and node deleted",
        timeout=20,
    )


# -- what users see of a queued resource waiting for capacity --------------------------------


def test_list_shows_queued_for_a_queued_resource_waiting_for_capacity(cloud: Cloud) -> None:
    cloud.server.stockout(ZA)  # the request waits in ZA's queue (WAITING_FOR_RESOURCES)
    cloud.submit("waits", "echo got capacity", kind="tpu-qr")
    daemon = cloud.daemon(queue_seconds=3600)

    def waiting() -> bool:
        qrs = list(cloud.server.qrs.values())
        return (
            len(qrs) == 1
            and qrs[0]["state"]["state"] == "WAITING_FOR_RESOURCES"
            and cloud.runner_record("waits").get("phase") == "QUEUED"
        )

    cloud.drive(daemon, waiting, "the queued resource waiting for resources")
    cloud.step(daemon)  # one more cycle: it stays queued, in ZA, without a new request
    listed = _cli(cloud, "list")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[:2] == ["NAME", "STATE"]
    assert row.split()[:2] == ["waits", "QUEUED"], listed.stdout
    assert f"waiting for capacity in {ZA}" in row, listed.stdout
    assert "waiting for capacity in" in cloud.info("waits").reason
    qr_posts = [
        r for r in cloud.server.requests if r[0] == "POST" and r[1].endswith("/queuedResources")
    ]
    assert [r[1].split("/")[5] for r in qr_posts] == [ZA]
    assert not cloud.server.nodes
    cloud.server.restock(ZA)
    cloud.drive(daemon, lambda: cloud.finished("waits"), "waits to finish after the restock")
    info = cloud.info("waits")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1)
    assert _cli(cloud, "list", "--all").stdout.splitlines()[1].split()[:2] == ["waits", "SUCCEEDED"]


# -- the endpoint from the environment, as the README documents ------------------------------


def test_tpu_endpoint_from_the_environment_variable(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    del cloud.tpu_settings["api_endpoint"]
    monkeypatch.setenv("BASTION_TPU_API_ENDPOINT", cloud.server.endpoint)
    cloud.submit("envpoint", 'echo "via env on $BASTION_WORKER"', acc="v4-8")
    daemon = cloud.daemon()
    assert "api_endpoint" not in daemon.runners.get("tpu").settings
    assert cloud.runner(daemon).endpoint == cloud.server.endpoint
    cloud.drive(daemon, lambda: cloud.finished("envpoint"), "envpoint to finish")
    info = cloud.info("envpoint")
    assert (info.status, info.state.attempt, info.state.exit_code) == ("SUCCEEDED", 1, 0)
    ((_, path, query, body),) = cloud.creates()
    assert path == f"/v2/projects/{P}/locations/{ZA}/nodes"
    assert body["labels"]["bastion-job"] == "envpoint"
    placed = [e["reason"] for e in cloud.client.history("envpoint") if e["event"] == "PLACED"]
    assert placed == [f"attempt 1 on TPU node {query['nodeId']} (1 worker) in {ZA}"]
    assert attempt_section(cloud.log("envpoint"), 1) == "via env on 0\n"


# -- both TPU runners on one zone: a multislice queued resource through the sweeps ------------


class AnyRootCloud(Cloud):
    """``Cloud`` on any root URL: a local directory, or gs:// on the GCS emulator (the agents
    inherit ``STORAGE_EMULATOR_HOST``)."""

    def __init__(self, tmp: Path, server: TpuServer, guests: Guests, root: str) -> None:
        super().__init__(tmp, server, guests)
        self.root = root  # type: ignore[assignment]
        self.store = Store(root)
        self.client = Client(root, expect_daemon=False)
        self.store.quota.write_default(QUOTA)

    def names(self) -> list[str]:
        return sorted(self.store.states.list())

    def finished(self, name: str) -> bool:
        return self.store.complete.read(name) is not None

    def log(self, name: str) -> str:
        return self.client.read_log(name).decode()


@pytest.fixture(params=["local", "gcs"])
def any_cloud(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AnyRootCloud]:
    root = str(tmp_path / "root")
    if request.param == "gcs":
        request.getfixturevalue("gcs_emulator")
        root = fresh_gcs_root()
    guests = Guests(tmp_path)

    def on_ready(node: dict, worker: int, metadata: dict) -> None:
        if "startup-script" in metadata:
            guests.on_ready(node, worker, metadata)

    with TpuServer(on_ready=on_ready) as server:
        c = AnyRootCloud(tmp_path, server, guests, root)
        try:
            yield c
        finally:
            c.close()
            guests.close()


def test_multislice_job_keeps_its_nodes_through_sweeps_with_both_tpu_runners_on_one_zone(
    any_cloud: AnyRootCloud,
) -> None:
    """``tpu`` and ``tpu-qr`` both configured on one zone, a ``tpu-v5p-16`` job with
    ``num_replicas=2``: one queued resource asking for a multislice, whose nodes the ``tpu``
    runner never takes for orphans. The sweeps that run while it runs leave it alone, it
    succeeds, every worker has its own number and knows its slice, and then it is deleted."""
    cloud = any_cloud
    gate = cloud.tmp / "release"
    cloud.submit(
        "multi",
        f"{SLICE_ECHO}; while [ ! -e {gate} ]; do sleep 0.1; done",
        acc="v5p-16",
        kind="tpu-qr",
        num_replicas=2,
    )
    daemon = cloud.daemon(zones=[ZA])

    def started() -> bool:
        name = cloud.runner_record("multi").get("name")
        return bool(name) and all(
            cloud.store.agents.read("multi", name, w, "started") for w in range(4)
        )

    cloud.drive(daemon, started, "all 4 workers to start", timeout=180)
    name = cloud.runner_record("multi")["name"]
    ((_, _, query, body),) = [
        r for r in cloud.server.requests if r[0] == "POST" and r[1].endswith("/queuedResources")
    ]
    (spec,) = body["tpu"]["nodeSpec"]
    assert query["queuedResourceId"] == name and "nodeId" not in spec
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": name}
    nodes = [f"{name}-0", f"{name}-1"]
    assert cloud.node_names() == nodes
    # Defense in depth: a node named as a part of the live attempt but carrying no more than
    # the root's label (its other labels lost), which the tpu runner lists as its own.
    stray = {
        "acceleratorType": "v4-8",
        "runtimeVersion": "tpu-ubuntu2204-base",
        "labels": {"bastion-root": cloud.runner(daemon).tag},
    }
    cloud.runner(daemon).client.nodes().create(
        parent=f"projects/{P}/locations/{ZA}", nodeId=f"{name}-s9", body=stray
    ).execute()
    nodes.append(f"{name}-s9")
    for _ in range(SWEEP_EVERY_CYCLES + 3):  # at least one sweep, and the effects after it
        cloud.step(daemon)
    assert not [r for r in cloud.server.requests if r[0] == "DELETE"]
    assert cloud.node_names() == nodes
    assert {n["state"] for n in cloud.server.nodes.values()} == {"READY"}
    assert cloud.runner_record("multi").get("phase") == "RUNNING"
    coordinator = cloud.server.nodes[f"projects/{P}/locations/{ZA}/nodes/{name}-0"][
        "networkEndpoints"
    ][0]["ipAddress"]
    gate.touch()
    cloud.drive(daemon, lambda: cloud.finished("multi"), "multi to finish")
    info = cloud.info("multi")
    assert (info.status, info.state.attempt, info.state.exit_code) == ("SUCCEEDED", 1, 0)
    outputs = [b"".join(cloud.client.worker_output("multi", w)).decode() for w in range(4)]
    assert outputs == [
        f"=== [bastion] attempt 1, worker {w} ===\n"
        f"w {w} of 4 slice {w // 2} of 2 megascale {w // 2} of 2 at {coordinator}\n"
        for w in range(4)
    ]
    assert not cloud.server.qrs and set(cloud.node_names()) <= {f"{name}-s9"}
    # The stray, an orphan once its attempt ended, goes at the next sweep (one may have run
    # already while the job finished: how many cycles that took depends on the root).
    cloud.drive(daemon, node_gone(cloud, f"{name}-s9"), "the stray, orphaned now, to go")


# -- a worker that never starts (issue 20, defect 3) ------------------------------------------

BOOT_QUOTA = QUOTA.replace("cpu = 64\n", "cpu = 64\ngpu = 64\n").replace(
    "cpu = 1.0\n", "cpu = 1.0\ngpu = 1.0\n"
)
# seconds for every worker to start: a pip install that fails takes seconds on a busy test
# machine, and on gs:// each of the script's copies to the bucket (gcloud) a few more; the
# failure's output must land before the deadline to be shown
START_TIMEOUT = {"local": 20, "gcs": 40}


class Boot:
    """The daemon with one cloud runner (``tpu``: a v4-8 node, ``gce``: a GPU VM) in one
    zone, on a local or gs:// root; its workers' startup scripts run by bash (``Guests``)."""

    def __init__(self, tmp: Path, kind: str, root: str, server: Any, guests: Guests) -> None:
        self.tmp, self.kind, self.root, self.server, self.guests = tmp, kind, root, server, guests
        self.root_kind = "gcs" if root.startswith("gs://") else "local"
        self.client = Client(root, expect_daemon=False)
        self.put("project-quotas/project-quotas.config", BOOT_QUOTA.encode())
        self.daemons: list[Daemon] = []

    def put(self, path: str, data: bytes) -> str:
        """An object in the root, written as a user would; its URL."""
        store = self.client.store
        full = f"{store.root}/{path}"
        if self.root_kind == "local":
            store.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        store.fs.pipe_file(full, data)
        return store.bucket.url(*path.split("/"))

    def daemon(self, **more: Any) -> Daemon:
        runner = {
            "project": P,
            "zones": [ZA],
            "api_endpoint": self.server.endpoint,
            "agent_args": FAST,
            "listing_ttl": 0,
            "heartbeat_timeout": 30,
            **more,
        }
        daemon = build_daemon(
            self.root,
            work_dir=str(self.tmp / "work"),
            gpus=[],
            settings={"default_runner": "local", "runners": {self.kind: runner}},
        )
        daemon.runners.get(self.kind).sleep = lambda _s: None
        self.daemons.append(daemon)
        return daemon

    def submit(self, name: str, command: str) -> None:
        tpu = self.kind == "tpu"
        self.client.submit(
            new_jobspec(
                name=name,
                command=command,
                user_id="tester",
                project_id="default",
                resources={"v4": 8} if tpu else {"gpu": 8},
                runner={"kind": "tpu", "accelerator_type": "v4-8"}
                if tpu
                else {"kind": "gce", "machine_type": "a3-highgpu-8g"},
            )
        )

    def creates(self) -> list[tuple]:
        collection = "/nodes" if self.kind == "tpu" else "/instances"
        return [r for r in self.server.requests if r[0] == "POST" and r[1].endswith(collection)]

    def history(self, name: str) -> list[tuple[str, str]]:
        return [(e["event"], e["reason"]) for e in self.client.history(name)]

    def drive(self, daemon: Daemon, done: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self.history('boot')}")
            daemon.cycle(time.time())
            daemon.settle()
            self.server.tick()
            time.sleep(0.1)

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.close()


@pytest.fixture(params=["tpu-local", "tpu-gcs", "gce-local", "gce-gcs"])
def boot(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Boot]:
    kind, where = request.param.split("-")
    root = str(tmp_path / "root")
    if where == "gcs":
        request.getfixturevalue("gcs_emulator")
        root = fresh_gcs_root()
    guests = Guests(tmp_path)
    server = (
        TpuServer(on_ready=guests.on_ready)
        if kind == "tpu"
        else ComputeServer(on_ready=guests.on_ready, console=guests.console)
    )
    with server:
        b = Boot(tmp_path, kind, root, server, guests)
        try:
            yield b
        finally:
            b.close()
            guests.close()


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A bare image's ``python3``: new enough, with pip, without the agent or any of its
    dependencies (a virtual environment of this interpreter), so its startup script must
    ``pip install`` the agent."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return str(where / "bin" / "python")


def _fails_to_start(boot: Boot, more: dict[str, Any]) -> tuple[str, float, set[str]]:
    """Submit a job whose worker never starts; drive the daemon until its attempt fails.
    The failure's reason, the seconds from the machines' coming up (as the job shows it) to
    the failure, and every reason the job showed meanwhile."""
    timeout = START_TIMEOUT[boot.root_kind]
    boot.submit("boot", "echo never")
    daemon = boot.daemon(start_timeout_seconds=timeout, **more)
    reasons: set[str] = set()
    up: list[float] = []

    def failed() -> bool:
        reason = boot.client.get("boot").reason
        reasons.add(reason)
        if not up and "waiting for workers to start" in reason:
            up.append(time.monotonic())
        return any(e == "PROVISIONING_FAILED" for e, _ in boot.history("boot"))

    boot.drive(daemon, failed, "the attempt to fail", timeout=timeout + 90)
    (why,) = [r for e, r in boot.history("boot") if e == "PROVISIONING_FAILED"]
    assert up, reasons
    return why, time.monotonic() - up[0], reasons


def test_a_worker_whose_startup_script_exits_1_is_reported_at_the_deadline_with_its_output(
    boot: Boot, bare_python: str
) -> None:
    """The issue's bare image: the script's ``pip install`` of the agent fails (a package
    that is not a wheel stands for google-re2's failed build on Python 3.9) and the script
    exits 1. Before: ``provisioning: node CREATING`` for ever, the node READY and the quota
    held. Now: "waiting for workers to start (0 of 1)" while the machines are up, then at
    ``start_timeout_seconds`` the attempt fails with pip's own words, requeued, its zone
    backing off (no second create while it does), and ``why`` says what to fix."""
    url = boot.put("packages/broken/bastion-0.0.0-py3-none-any.whl", b"not a wheel")
    why, took, reasons = _fails_to_start(boot, {"python": bare_python, "package_url": url})
    timeout = START_TIMEOUT[boot.root_kind]
    assert "attempt 1: running: waiting for workers to start (0 of 1)" in reasons
    noun = "TPU node" if boot.kind == "tpu" else "VM"
    assert f"worker 0 did not start within {timeout} s of its {noun} coming up" in why
    assert "bastion-0.0.0-py3-none-any.whl" in why and "ERROR" in why  # pip's words
    assert "bastion logs boot --worker=0" in why
    assert timeout - 1 <= took <= timeout + 30, took
    assert len(boot.creates()) == 1
    daemon = boot.daemons[0]
    for _ in range(5):  # requeued: the next attempt waits for the zone's backoff
        daemon.cycle(time.time())
        daemon.settle()
    assert len(boot.creates()) == 1
    now = explain_job(boot.client, "boot").splitlines()[-1]
    assert now.startswith("  now: ") and "attempt 2 waits to start" in now
    assert "worker 0 did not start" in now and "settings python, image / runtime_version" in now
    assert "start_timeout_seconds" in now and "backing off" in now
    shown = b"".join(boot.client.worker_output("boot", 0)).decode()
    assert "worker 0 wrote no output; its startup script printed" in shown
    assert "ERROR" in shown and "boots on" in shown


def test_a_worker_whose_startup_script_hangs_is_reported_at_the_deadline(
    boot: Boot, bare_python: str
) -> None:
    """The script hangs in its ``pip install`` (a package index that accepts the connection
    and never answers): the attempt fails at ``start_timeout_seconds`` with what the script
    printed before it hung (copied to the bucket before anything that can hang; for a GCE VM
    also on its serial port)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nothing ever answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/bastion-0.0.0-py3-none-any.whl"
        why, took, reasons = _fails_to_start(boot, {"python": bare_python, "package_url": url})
    finally:
        silent.close()
    timeout = START_TIMEOUT[boot.root_kind]
    assert "attempt 1: running: waiting for workers to start (0 of 1)" in reasons
    assert f"worker 0 did not start within {timeout} s" in why
    assert "worker 0's startup script printed: bastion: worker 0 of " in why and "boots on" in why
    assert timeout - 1 <= took <= timeout + 30, took
    assert len(boot.creates()) == 1
