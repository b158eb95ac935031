"""The daemon's JobIndex (bastion/daemon/jobindex.py) stays what a walk of every job finds.

The real daemon in-process on a local root, with the fake runner: jobs that wait for others,
a group with a limit, a spec update that drops its dependency, a cancel, jobs that finish and
are archived, and a restart (recovery). After every cycle the index must equal the walk the
policy pass made before it had one.
"""

from __future__ import annotations

import time
from pathlib import Path

from bastion import lifecycle
from bastion.daemon import Daemon
from bastion.daemon.start import build_daemon
from bastion.jobspec import JobSpec
from bastion.jobstate import Status
from launch.api import Client, new_jobspec

Index = tuple[dict[str, float], set[str], dict[str, set[str]]]


def walked(daemon: Daemon) -> Index:
    """What the index must hold, found the old way: every job looked at."""
    not_started: dict[str, float] = {}
    gated: set[str] = set()
    waiting_with: dict[str, set[str]] = {}
    for job in daemon.ctx.jobs.values():
        state, spec = job.state, job.spec
        if state.status is Status.PENDING:
            waiting_with.setdefault(state.reason, set()).add(job.name)
        if state.status is Status.PENDING and state.reason.startswith(lifecycle.NOT_STARTED):
            not_started[job.name] = state.end_time or 0.0
        if spec is not None and (spec.after or (spec.group or {}).get("max_running") is not None):
            gated.add(job.name)
    return not_started, gated, waiting_with


def indexed(daemon: Daemon) -> Index:
    index = daemon.ctx.index
    return dict(index.not_started), set(index.gated), index.waiting_with


def daemon_on(root: Path, work: Path) -> Daemon:
    settings = {"default_runner": "fake", "runners": {"fake": {"state_dir": str(work / "fake")}}}
    return build_daemon(str(root), work_dir=str(work), gpus=[], settings=settings)


def cycles(daemon: Daemon, n: int) -> None:
    for _ in range(n):
        daemon.cycle(time.time())
        daemon.settle()
        assert indexed(daemon) == walked(daemon)
        time.sleep(0.02)


def submit(
    client: Client, name: str, seconds: float = 0.0, error: str = "", **spec: object
) -> None:
    runner: dict[str, object] = {"kind": "fake"}
    if seconds:
        runner["fake_provision_seconds"] = seconds
    if error:
        runner["fake_start_error"] = error
    client.submit(
        new_jobspec(
            name=name,
            command="true",
            user_id="tester",
            project_id="default",
            runner=runner,
            **spec,  # type: ignore[arg-type]
        )
    )


def drop_dependencies(client: Client, name: str) -> None:
    """A spec edited in the bucket (as any writer may): the same job, waiting for nothing."""
    spec = JobSpec.loads(client.store.specs.read(name))
    spec.after = []
    spec.metadata.version = (spec.metadata.version or 0) + 1
    client.store.specs.replace(name, spec.validate().dumps())
    client.store.requests.write_marker(name)


def test_the_index_matches_a_walk_of_every_job_through_rules_updates_ends_and_a_restart(
    tmp_path: Path,
) -> None:
    root, work = tmp_path / "root", tmp_path / "work"
    client = Client(str(root), expect_daemon=False)
    daemon = daemon_on(root, work)
    try:
        submit(client, "first", seconds=0.5)
        submit(client, "second", after=["first"])
        submit(client, "bad", error="refused (fake)")
        submit(client, "third", after=["bad"])  # never satisfied: ends CANCELLED
        for i in range(3):
            group = {"name": "g", "kind": "array", "index": i, "size": 3, "max_running": 1}
            submit(client, f"g-{i}", seconds=0.3, group=group)
        submit(client, "plain")
        cycles(daemon, 3)
        assert {"second", "g-0", "g-1", "g-2"} <= indexed(daemon)[1]
        assert "plain" not in indexed(daemon)[1]

        drop_dependencies(client, "second")
        cycles(daemon, 2)
        assert "second" not in indexed(daemon)[1]
        client.cancel("g-2", user_id="tester")
        cycles(daemon, 30)
        done = {"first", "second", "third", "bad", "plain", "g-0", "g-1", "g-2"}
        assert all((root / "jobs" / "complete" / n).exists() for n in done), client.list_jobs()
        assert not (done & indexed(daemon)[1])  # archived
        assert client.get("third").status == "CANCELLED"

        submit(client, "long", seconds=600)
        submit(client, "later", after=["long"])
        submit(
            client,
            "h-0",
            seconds=600,
            group={"name": "h", "kind": "array", "index": 0, "size": 1, "max_running": 1},
        )
        cycles(daemon, 2)
    finally:
        daemon.close()

    restarted = daemon_on(root, work)  # recovery fills the index from the bucket
    try:
        cycles(restarted, 3)
        assert {"later", "h-0"} <= indexed(restarted)[1]
    finally:
        restarted.close()
