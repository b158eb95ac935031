"""What a quiet queue's daemon does now and then, and how often, at any size.

Three kinds of work visit every job held: the policy pass that re-plans a quiet queue (decayed
usage moves), finding the snapshot shards that changed, and the whole-queue check of upkeep.
Each runs at most once per a fixed time per job held, so an idle daemon's CPU does not grow
with its queue (at 100,000 jobs the idle share was 38% of a core). A time threshold the plan
depends on (a reclaim delay one of its jobs waits out ends) replans no sooner than a gap per
job held after the last pass; the others (after a burst, each job's delay ends at its own
moment) do not replan at all. These tests make the
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
        self.submit([f"q{i:03d}" for i in range(JOBS)])
        self.now = time.time()
        self.daemon = self.build()

    def submit(self, names: list[str]) -> None:
        """Jobs ``sleep 600`` on the fake runner, one cpu each, as a user submits them."""
        client = Client(store=Store(self.root), expect_daemon=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the test drives the cycles itself
            for name in names:
                client.submit(
                    new_jobspec(
                        name=name,
                        command="sleep 600",
                        user_id="u",
                        project_id="default",
                        resources={"cpu": 1},
                        runner={"kind": "fake"},
                    )
                )

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


def test_thresholds_that_cannot_change_the_plan_do_not_replan_a_quiet_queue(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiting jobs' reclaim delays end 240 s after they came (the quota's default), each
    at its own moment, but none can change the plan: their project holds all its quota, so
    none waits out a delay. The queue keeps its plan until its quiet period (30 jobs x 100 s);
    before the plan said what it depends on, each delay replanned (after the gap, here 30 jobs
    x 10 s)."""
    monkeypatch.setattr("bastion.daemon.context.REPLAN_SECONDS_PER_JOB", 100.0)
    monkeypatch.setattr("bastion.daemon.context.THRESHOLD_SECONDS_PER_JOB", 10.0)
    rig.settle_in()
    planned_at = [rig.now for _ in range(40) if rig.cycle(10.0).planned]  # 400 s
    assert planned_at == []


TWO_PROJECTS = """\
[toml-schema]
version = "1"
[total_resources]
cpu = 2
[project_membership]
owner = [".*"]
borrower = [".*"]
[project_resources.owner]
cpu = 0.5
[project_resources.borrower]
cpu = 0.5
"""


def test_a_reclaim_delay_the_plan_waits_out_replans_when_it_ends_no_sooner_than_the_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A borrower holds the pool; the owner's job comes and, within its quota, waits out its
    reclaim delay (240 s). Its end replans on time (the cycle after it), and no sooner than
    the gap after the last pass (3 jobs x 60 s)."""
    monkeypatch.setattr("bastion.daemon.context.REPLAN_SECONDS_PER_JOB", 1000.0)
    monkeypatch.setattr("bastion.daemon.context.THRESHOLD_SECONDS_PER_JOB", 60.0)
    store = Store(str(tmp_path / "root"))
    store.quota.write_default(TWO_PROJECTS)
    client = Client(store=store, expect_daemon=False)

    def submit(name: str, project: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the test drives the cycles itself
            client.submit(
                new_jobspec(
                    name=name,
                    command="sleep 6000",
                    user_id="u",
                    project_id=project,
                    resources={"cpu": 1},
                    runner={"kind": "fake"},
                )
            )

    daemon = build_daemon(
        store.root_url,
        work_dir=str(tmp_path / "work"),
        gpus=[],
        settings={"runners": {"fake": {"state_dir": str(tmp_path / "fake")}}},
    )
    now = time.time()
    try:
        for name in ("b1", "b2"):
            submit(name, "borrower")
        for _ in range(3):
            now += 1.0
            daemon.cycle(now)
            daemon.settle()
        submit("o1", "owner")
        came = now + 1.0
        planned_at = []
        for _ in range(40):  # 400 s
            now += 10.0 if planned_at or now > came + 5 else 1.0
            if daemon.cycle(now).planned:
                planned_at.append(now)
            daemon.settle()
        first, *later = planned_at
        assert first <= came + 3  # the owner's job came: planned at once
        assert later and came + 240 <= later[0] <= came + 250, (came, planned_at)
        assert later[0] - first >= 3 * 60.0
    finally:
        daemon.close()


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
