"""A daemon killed (-9) in the middle of a cycle on a busy root of thousands of jobs, restarted
from its snapshot: every state it takes back is the bucket's, byte for byte, and no attempt is
started twice (issue 26's "restart loses nothing and runs nothing twice", at a size CI affords).

The daemon runs in a subprocess on the fake runner (attempts are files, so thousands cost
nothing), writing its snapshot every second; jobs finish, start, are cancelled and submitted
while it runs, so the shards are always behind the states by some changes when the kill lands.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

from bastion.bucket.snapshot import SHARDS
from bastion.bucket.store import Store
from bastion.daemon import recovery
from bastion.daemon.start import build_daemon
from bastion.jobspec import JobSpec
from bastion.jobstate import JobState, Status
from launch.api import Client, new_jobspec
from tests.harness import REPO, wait_for

JOBS = 5000
QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = 200
[project_membership]
default = [".*"]
[project_resources.default]
cpu = 1.0
"""
DAEMON = """
import sys, time
from bastion.daemon import snapshot
from bastion.daemon.start import build_daemon
snapshot.SNAPSHOT_SECONDS = 1.0  # so the kill finds a snapshot a few changes behind
snapshot.SNAPSHOT_SECONDS_PER_JOB = 0.0  # (5,000 jobs would make it 5 s)
root, work, state_dir = sys.argv[1:4]
daemon = build_daemon(root, work_dir=work, gpus=[], settings={
    "default_runner": "fake", "runners": {"fake": {"state_dir": state_dir}}})
print("cycling", flush=True)
daemon.run(0.2)
"""


def _specs(names: list[str], rng: random.Random) -> list[JobSpec]:
    return [
        new_jobspec(
            name=name,
            command=f"sleep {rng.choice([1, 2, 3, 600])}",
            user_id="u",
            project_id="default",
            resources={"cpu": 1},
            runner={"kind": "fake"},
        )
        for name in names
    ]


def _submit(client: Client, specs: list[JobSpec]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a daemon that has not written its record yet
        for spec in specs:
            client.submit(spec)


def _attempts(state_dir: Path) -> set[str]:
    """The attempts the fake runner has made (one file each, named after the attempt)."""
    return {file.stem for file in state_dir.glob("*.json")}


def _job_of(attempt: str) -> str:
    """bst-<root>-<job>-<submission>-a<N>: the job names here have no '-'."""
    return attempt.split("-")[2]


def test_a_daemon_killed_mid_cycle_restarts_from_its_snapshot_losing_nothing(tmp_path):
    rng = random.Random(26)
    root = str(tmp_path / "root")
    quota = Path(root, "project-quotas", "project-quotas.config")
    quota.parent.mkdir(parents=True)
    quota.write_text(QUOTA)
    client = Client(root, expect_daemon=False)
    first = _specs([f"j{i:05d}" for i in range(JOBS)], rng)
    _submit(client, first)
    long_ones = [spec.name for spec in first if spec.command == "sleep 600"]
    state_dir = tmp_path / "fake"
    work = tmp_path / "work"
    out = open(tmp_path / "daemon.out", "wb")  # noqa: SIM115
    daemon = subprocess.Popen(
        [sys.executable, "-c", DAEMON, root, str(work), str(state_dir)],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    store = Store(root)
    try:
        # taken in: a state, or already finished (a short job can end before the last intake)
        taken = lambda: len(store.states.list()) + len(store.complete.list()) >= JOBS  # noqa: E731
        wait_for(taken, 300, what="every job taken in")
        wait_for(lambda: len(store.snapshot.read_all()) >= JOBS / 2, 60, what="a snapshot")
        # churn: jobs end and others start; some are cancelled, some submitted, then the kill
        late = _specs([f"late{i:03d}" for i in range(50)], rng)
        for i, spec in enumerate(late):
            if i % 2:
                client.submit(spec)
            else:
                client.cancel(long_ones[i], user_id="u")  # pending or running, not ended
            time.sleep(rng.uniform(0, 0.1))
        time.sleep(rng.uniform(0.5, 2.0))
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
    finally:
        if daemon.poll() is None:
            daemon.kill()
        out.close()
    bucket = {name: store.states.read(name) for name in store.states.list()}
    made_before = _attempts(state_dir)
    recorded = {  # long jobs whose attempt the bucket records (written ahead of its start)
        name: state.run_attempt.name
        for name, state in ((n, JobState.loads(raw)) for n, raw in bucket.items() if raw)
        if state.status is Status.ACTIVE
        and state.run_attempt is not None
        and JobSpec.loads(store.specs.read(name) or b"").command == "sleep 600"
    }
    # alive at the kill, and cannot have ended since (sleep 600); the others were recorded,
    # but the kill came before their start: the restart starts them, under the same name
    running = {name: attempt for name, attempt in recorded.items() if attempt in made_before}
    unstarted = {name: attempt for name, attempt in recorded.items() if name not in running}
    assert running, "no long job was running at the kill: the test checks nothing"

    restarted = build_daemon(
        root,
        work_dir=str(work),
        gpus=[],
        settings={"default_runner": "fake", "runners": {"fake": {"state_dir": str(state_dir)}}},
    )
    try:
        before = dict(restarted.store.ops)
        recovery.recover(restarted.ctx, restarted.store.specs.list())
        reads = restarted.store.ops["read"] - before.get("read", 0)
        assert reads < SHARDS + len(bucket) / 4, f"{reads} reads: the snapshot was not used"
        taken = {name: job.written for name, job in restarted.jobs.items()}
        assert taken == bucket, "a state taken back differs from the bucket's"
        for name, job in restarted.jobs.items():
            if job.spec is not None:  # from the snapshot: what the bucket holds
                raw = store.specs.read(name)
                assert raw is not None and JobSpec.loads(raw) == job.spec, name
        restarted.ctx.recovered = True
        for _ in range(10):
            restarted.cycle(time.time())
            restarted.settle()
        new = _attempts(state_dir) - made_before
        assert new, "the restarted daemon started nothing: the test checks nothing"
        twice = sorted(a for a in new if _job_of(a) in running)
        assert not twice, f"started again while their attempt ran: {twice[:5]}"
        for name, attempt in unstarted.items():  # by the name written ahead, or not at all
            assert {a for a in new if _job_of(a) == name} <= {attempt}, (name, new)
        for name, attempt in running.items():
            state = restarted.jobs[name].state
            assert state.run_attempt is not None and state.run_attempt.name == attempt, name
    finally:
        restarted.close()
