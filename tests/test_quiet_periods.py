"""What a quiet queue's daemon does now and then, and how often, at any size.

Three kinds of work visit every job held: the policy pass that re-plans a quiet queue (decayed
usage moves), finding the snapshot shards that changed, and the whole-queue check of upkeep.
Each runs at most once per a fixed time per job held, so an idle daemon's CPU does not grow
with its queue (at 100,000 jobs the idle share was 38% of a core). A time threshold of the
plan (a waiting job's reclaim delay ends) replans no sooner than a gap per job held after the
last pass: after a burst, each job's delay ends at its own moment. These tests make the
per-job periods large on a small queue (real daemon, fake runner, a local root, cycles driven
on a clock we move) and check when each runs; and that a restart does not re-check at once
the states it has just read.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.bucket.store import Store
from bastion.daemon import Daemon, recovery
from bastion.daemon.start import build_daemon
from launch.api import Client, new_jobspec
from tests.test_snapshot import QUOTA

JOBS = 30


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.root = str(tmp_path / "root")
        self.tmp_path = tmp_path
        Store(self.root).quota.write_default(QUOTA)
        client = Client(store=Store(self.root), expect_daemon=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the test drives the cycles itself
            for i in range(JOBS):
                client.submit(
                    new_jobspec(
                        name=f"q{i:03d}",
                        command="sleep 600",
                        user_id="u",
                        project_id="default",
                        resources={"cpu": 1},
                        runner={"kind": "fake"},
                    )
                )
        self.now = time.time()
        self.daemon = self.build()

    def build(self) -> Daemon:
        return build_daemon(
            self.root,
            work_dir=str(self.tmp_path / "work"),
            gpus=[],
            settings={"runners": {"fake": {"state_dir": str(self.tmp_path / "fake")}}},
        )

    def cycle(self, seconds: float = 1.0):
        self.now += seconds
        report = self.daemon.cycle(self.now)
        self.daemon.settle()
        return report

    def settle_in(self) -> None:
        """Cycles until every job is taken in and waits (its reason written)."""
        for _ in range(5):
            self.cycle()
        assert len(self.daemon.jobs) == JOBS


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.daemon.close()


def test_a_quiet_queue_is_replanned_once_per_period_that_grows_with_the_queue(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bastion.daemon.context.REPLAN_SECONDS_PER_JOB", 2.0)  # 30 jobs: 60 s
    rig.settle_in()
    planned = [rig.cycle(10.0).planned for _ in range(12)]  # 120 s of quiet cycles
    assert planned.count(True) == 2, planned  # at 60 s and 120 s, not every 30 s
    assert planned[5] and planned[11]


def test_the_changed_shards_are_looked_for_once_per_period_that_grows_with_the_queue(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bastion.daemon.snapshot.SNAPSHOT_SECONDS_PER_JOB", 2.0)  # 60 s
    rig.settle_in()
    runs = []
    due = rig.daemon.ctx.snapshots.due
    for _ in range(15):  # 150 s of 10 s cycles
        rig.cycle(10.0)
        if rig.daemon.ctx.snapshots.due != due:  # maybe_write looked for changed shards
            due = rig.daemon.ctx.snapshots.due
            runs.append(rig.now)
            assert due - rig.now == pytest.approx(60.0)
    assert len(runs) >= 2 and all(b - a >= 60.0 for a, b in itertools.pairwise(runs)), runs


def test_a_restart_does_not_check_at_once_the_states_it_just_read(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bastion.daemon.recovery.QUEUE_CHECK_SECONDS_PER_JOB", 2.0)  # 60 s
    monkeypatch.setattr("bastion.daemon.loop.SWEEP_EVERY_CYCLES", 1)  # an upkeep each cycle
    checks: list[float] = []
    check = recovery.check_states

    def counted(ctx) -> None:  # a spy: counts, then checks as before
        checks.append(rig.now)
        check(ctx)

    monkeypatch.setattr(recovery, "check_states", counted)
    rig.settle_in()
    rig.daemon.close()
    rig.daemon = rig.build()  # a restart: its first cycle reads every state
    start = rig.now + 1.0
    for _ in range(20):
        rig.cycle(5.0)
    assert checks, "the whole-queue check still runs"
    assert min(checks) - start >= 60.0, (start, checks)


def test_a_time_threshold_replans_no_sooner_than_a_gap_that_grows_with_the_queue(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiting jobs' reclaim delays end 240 s after they came (the quota's default): that
    threshold replans, but no sooner than the gap after the last pass (here 30 jobs x 10 s),
    and long before a quiet queue's period (30 jobs x 100 s)."""
    monkeypatch.setattr("bastion.daemon.context.REPLAN_SECONDS_PER_JOB", 100.0)
    monkeypatch.setattr("bastion.daemon.context.THRESHOLD_SECONDS_PER_JOB", 10.0)
    came = rig.now
    rig.settle_in()
    last = rig.now  # the settling cycles planned (jobs came, then started)
    planned_at = [rig.now for _ in range(40) if rig.cycle(10.0).planned]  # 400 s
    assert planned_at, "the threshold never replanned"
    assert came + 240 < last + 300 <= planned_at[0] <= last + 310, (came, last, planned_at)


def test_a_restart_names_each_job_under_way_and_counts_the_waiting(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """100,000 waiting jobs made 100,000 lines of a restart's log: the waiting are counted."""
    rig.settle_in()
    rig.daemon.close()
    rig.daemon = rig.build()
    with caplog.at_level("INFO", logger="bastion.daemon"):
        rig.cycle()
    named = [r.getMessage() for r in caplog.records if "recovered in state" in r.getMessage()]
    assert len(named) == 2 and all("ACTIVE" in line for line in named), named
    assert f"recovered {JOBS} jobs: {JOBS - 2} PENDING, 2 ACTIVE" in caplog.text
