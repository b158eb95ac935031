"""The states of jobs with no log bytes to upload (a burst's new jobs) are written in one call
(``writeback.write_states`` through ``States.write_many``), on a real local root; each is still
a compare-and-swap whose lost precondition is looked into, job by job."""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.bucket.store import Store
from bastion.daemon import Daemon
from bastion.daemon.start import build_daemon
from bastion.jobstate import Status
from launch.api import Client, new_jobspec

QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = 1
[project_membership]
default = [".*"]
[project_resources.default]
cpu = 1.0
"""


class Rig:
    """A daemon holding its lease on a local root, one cycle at a time."""

    def __init__(self, tmp_path: Path) -> None:
        root = str(tmp_path / "root")
        self.store = Store(root)
        self.store.quota.write_default(QUOTA)
        self.client = Client(store=Store(root), expect_daemon=False)
        self.daemon: Daemon = build_daemon(
            root,
            work_dir=str(tmp_path / "work"),
            gpus=[],
            lease_seconds=60,
            settings={
                "default_runner": "fake",
                "runners": {"fake": {"state_dir": str(tmp_path / "fake")}},
            },
        )

    def step(self) -> None:
        assert self.daemon.lease is not None and self.daemon.lease.hold()
        self.daemon.cycle(time.time())
        self.daemon.settle()

    def submit(self, name: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no daemon loop: we drive it
            self.client.submit(
                new_jobspec(
                    name=name,
                    command="sleep 60",
                    user_id="u",
                    project_id="default",
                    resources={"cpu": 1},
                    runner={"kind": "fake"},
                )
            )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.daemon.close()


def test_a_burst_of_new_jobs_is_written_once_each_and_the_listing_agrees(rig: Rig) -> None:
    """Thirty jobs taken in by one cycle: thirty state writes, each at the token the listing
    then shows, so the next cycle writes nothing."""
    rig.step()
    for i in range(30):
        rig.submit(f"job-{i:02d}")
    writes = rig.daemon.store.ops["write"]
    rig.step()
    assert rig.daemon.store.ops["write"] - writes >= 30
    listed = rig.store.states.list()
    waiting = [j for j in rig.daemon.jobs.values() if j.state.status is Status.PENDING]
    assert len(waiting) == 29  # (one was started: the quota has one cpu)
    for job in waiting:
        assert job.state_token == listed[job.name].token
        assert rig.store.states.read(job.name) == job.written and not job.unwritten()
    rig.step()
    after = rig.store.states.list()
    assert all(after[j.name].token == listed[j.name].token for j in waiting)  # none rewritten


def test_a_waiting_jobs_state_written_by_someone_else_is_replaced_never_acted_on(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A pending job's state goes out in the one call; someone else wrote it meanwhile. Its
    precondition is lost, the bytes there are not ours, and the daemon holds the lease: no
    daemon wrote them. The forgery is reported and the daemon's own state restored."""
    rig.step()
    rig.submit("runs")
    rig.step()
    rig.submit("waits")
    rig.step()
    assert rig.daemon.jobs["waits"].state.status is Status.PENDING
    forged = {**json.loads(rig.store.states.read("waits") or b"{}"), "status": "COMPLETED"}
    rig.store.bucket.write(json.dumps(forged).encode(), "jobs", "states", "waits")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rig.client.update("waits", "sleep 61", user_id="u")  # its state changes: written
    with caplog.at_level(logging.ERROR, logger="bastion.daemon"):
        rig.step()
    assert "overwritten by someone else" in caplog.text
    job = rig.daemon.jobs["waits"]
    assert job.state.status is Status.PENDING and not rig.daemon.ctx.lost_ownership
    assert rig.store.states.read("waits") == job.written
    assert json.loads(job.written)["status"] == "PENDING"
