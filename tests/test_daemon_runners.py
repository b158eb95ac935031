"""The real daemon in-process with the fake runner (bastion/runners/fake.py) as its default.

ROOT is a local directory (tmp_path); users submit through ``launch.api.Client``; the test
drives the daemon one cycle at a time (``Daemon.cycle`` then ``Daemon.settle`` for the effects
in flight). The fake runner is process-free and driven by the clock, so the whole lifecycle
(queued, provisioning, provider preemption, start errors, cancel, restart and adoption, orphan
sweeps, the write-ahead state) runs in well under a second per test.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.daemon import SWEEP_EVERY_CYCLES, Daemon, effects
from bastion.daemon.start import build_daemon
from bastion.runners.base import Attempt, name_prefix
from bastion.runners.fake import FakeRunner
from launch.api import Client, JobInfo, new_jobspec


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "root"
        self.work_dir = str(tmp / "work")
        self.state_dir = str(tmp / "fake-attempts")
        self.client = Client(str(self.root), expect_daemon=False)
        self.daemons: list[Daemon] = []

    def settings(self) -> dict[str, Any]:
        return {"default_runner": "fake", "runners": {"fake": {"state_dir": self.state_dir}}}

    def daemon(self, grace_seconds: float = 30.0) -> Daemon:
        daemon = build_daemon(
            str(self.root),
            work_dir=self.work_dir,
            grace_seconds=grace_seconds,
            gpus=[],
            settings=self.settings(),
        )
        self.daemons.append(daemon)
        return daemon

    def fake(self, daemon: Daemon) -> FakeRunner:
        runner = daemon.runners.get("fake")
        assert isinstance(runner, FakeRunner)
        return runner

    def submit(self, name: str, command: str, **runner: Any) -> None:
        spec = new_jobspec(
            name=name,
            command=command,
            user_id="tester",
            project_id="default",
            runner={"kind": "fake", **runner} if "kind" not in runner else runner,
        )
        self.client.submit(spec)

    def step(self, daemon: Daemon) -> None:
        daemon.cycle(time.time())
        daemon.settle()

    def drive(
        self,
        daemon: Daemon,
        done: Callable[[], bool],
        timeout: float = 20.0,
        what: str = "",
        each: Callable[[], None] | None = None,
    ) -> int:
        deadline = time.monotonic() + timeout
        steps = 0
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what} after {steps} cycles; states: {self.states()}"
                )
            self.step(daemon)
            steps += 1
            if each is not None:
                each()
            time.sleep(0.02)
        return steps

    def info(self, name: str) -> JobInfo:
        return self.client.get(name)

    def finished(self, name: str) -> bool:
        return (self.root / "jobs" / "complete" / name).exists()

    def state(self, name: str) -> dict[str, Any] | None:
        path = self.root / "jobs" / "states" / name
        return json.loads(path.read_text()) if path.exists() else None

    def states(self) -> dict[str, Any]:
        directory = self.root / "jobs" / "states"
        if not directory.exists():
            return {}
        found: dict[str, Any] = {}
        for name in sorted(os.listdir(directory)):
            try:
                found[name] = self.state(name)
            except (OSError, ValueError) as e:  # for the message of a timeout only
                found[name] = f"unreadable: {e}"
        return found

    def log(self, name: str) -> str:
        path = self.root / "logs" / name
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.close()


def events_of(rig: Rig, name: str) -> list[str]:
    return [e["event"] for e in rig.client.history(name)]


def owned_names(rig: Rig, daemon: Daemon) -> list[str]:
    return [o.name for o in rig.fake(daemon).list_owned()]


# -- a job's whole life ---------------------------------------------------------------------


def test_queued_provisioning_running_succeeded_with_output_in_the_log(rig: Rig) -> None:
    rig.submit(
        "fake-ok",
        "echo hello from fake; sleep 0.3; echo second line; sleep 0.1",
        fake_queued_seconds=0.5,
        fake_provision_seconds=0.5,
    )
    daemon = rig.daemon()
    seen: list[tuple[str, str, str]] = []  # (display status, runner phase, reason)

    def look() -> None:
        info = rig.info("fake-ok")
        if info.state is not None:
            record = info.state.run_attempt
            phase = (record.phase if record is not None else None) or ""
            seen.append((info.status, phase, info.state.reason))

    rig.drive(daemon, lambda: rig.finished("fake-ok"), what="fake-ok to finish", each=look)

    statuses = [s for s, _, _ in seen]
    phases = [p for _, p, _ in seen]
    assert "QUEUED" in statuses and "PROVISIONING" in statuses, seen
    assert "RUNNING" in phases, seen
    first = {s: statuses.index(s) for s in ("QUEUED", "PROVISIONING")}
    assert first["QUEUED"] < first["PROVISIONING"] < phases.index("RUNNING"), seen
    queued_reasons = [r for s, _, r in seen if s == "QUEUED"]
    assert any("queued" in r for r in queued_reasons), seen
    provisioning_reasons = [r for s, _, r in seen if s == "PROVISIONING"]
    assert any("provisioning" in r for r in provisioning_reasons), seen
    # while RUNNING the status is ACTIVE (bastion list shows the job as running)
    assert {s for s, p, _ in seen if p == "RUNNING"} == {"ACTIVE"}, seen

    info = rig.info("fake-ok")
    assert info.finished
    assert info.status == "SUCCEEDED"
    assert info.state.attempt == 1
    assert info.state.exit_code == 0
    log = rig.log("fake-ok")
    assert re.fullmatch(
        r"=== \[bastion\] attempt 1 of fake-ok started at [^\n]* ===\n"
        r"hello from fake\n"
        r"second line\n"
        r"=== \[bastion\] attempt 1 exited with status 0 at [^\n]* ===\n",
        log,
    ), log
    assert owned_names(rig, daemon) == []  # the finished attempt was deleted


def test_fake_returns_a_line_echoed_at_the_very_end(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    fake = FakeRunner("/root", str(tmp_path / "fake"), clock=lambda: now[0])
    name = f"{name_prefix('/root')}job-a1"
    options = {"fake_provision_seconds": 0.5}
    handle = fake.start(Attempt(name, "job", 1, "echo a; sleep 0.3; echo b", {}, options=options))
    now[0] += 10
    assert fake.poll(handle).exit_code == 0
    assert fake.read_output(handle, 0, 100) == b"a\nb\n"


# -- provider preemption --------------------------------------------------------------------


def test_provider_preemption_requeues_as_a_new_attempt(rig: Rig) -> None:
    rig.submit("fake-spot", "echo started; sleep 30", fake_preempt_after=0.3)
    daemon = rig.daemon()
    attempt_names: dict[int, str] = {}

    def look() -> None:
        state = rig.state("fake-spot")
        if state and state.get("runner"):
            attempt_names.setdefault(state["attempt"], state["runner"]["name"])

    rig.drive(daemon, lambda: 2 in attempt_names, what="a second attempt", each=look)
    first, second = attempt_names[1], attempt_names[2]
    assert first != second
    assert first.endswith("-a1") and second.endswith("-a2")
    # the first attempt is deleted from the runner (within a cycle of being requeued)
    rig.drive(daemon, lambda: first not in owned_names(rig, daemon), what="a1 deleted")
    assert first not in owned_names(rig, daemon)

    info = rig.info("fake-spot")
    assert info.state.attempt >= 2
    assert info.state.provider_preemptions >= 1
    assert info.state.preemptions == 0
    assert info.status != "FAILED" and info.state.outcome is None
    assert "PROVIDER_PREEMPTED" in events_of(rig, "fake-spot")
    assert "FAILED" not in events_of(rig, "fake-spot")
    assert "preempted by the provider" in rig.log("fake-spot")

    rig.client.cancel("fake-spot", user_id="tester")
    rig.drive(daemon, lambda: rig.finished("fake-spot"), what="the cancel")
    assert rig.info("fake-spot").status == "CANCELLED"
    assert owned_names(rig, daemon) == []


def test_lost_attempt_is_requeued(rig: Rig) -> None:
    rig.submit("fake-lost", "sleep 30", fake_lost_after=0.2)
    daemon = rig.daemon()
    rig.drive(
        daemon,
        lambda: (rig.state("fake-lost") or {}).get("attempt", 0) >= 2,
        what="a second attempt after LOST",
    )
    assert "LOST" in events_of(rig, "fake-lost")
    assert rig.info("fake-lost").status != "FAILED"
    rig.client.cancel("fake-lost", user_id="tester")
    rig.drive(daemon, lambda: rig.finished("fake-lost"), what="the cancel")
    assert rig.info("fake-lost").status == "CANCELLED"


# -- failures to start ----------------------------------------------------------------------


def test_start_error_completes_failed_with_the_error(rig: Rig) -> None:
    rig.submit("fake-broken", "echo never", fake_start_error="no capacity in us-east5 (fake)")
    daemon = rig.daemon()
    rig.drive(daemon, lambda: rig.finished("fake-broken"), what="fake-broken to finish")
    info = rig.info("fake-broken")
    assert info.status == "FAILED"
    assert "no capacity in us-east5 (fake)" in info.reason
    assert info.state.attempt == 1
    assert "could not start" in rig.log("fake-broken")
    assert "never" not in rig.log("fake-broken")
    assert owned_names(rig, daemon) == []


def test_unknown_runner_kind_is_rejected_naming_the_kind(rig: Rig) -> None:
    # Issue 27: a spec that names no runner kind the daemon knows can never start: REJECTED
    # when the daemon reads it (was FAILED at its first start), nothing is ever started.
    rig.submit("nosuch-job", "echo never", kind="nosuch")
    daemon = rig.daemon()
    rig.drive(daemon, lambda: rig.finished("nosuch-job"), timeout=5.0, what="nosuch-job")
    info = rig.info("nosuch-job")
    assert info.status == "REJECTED"
    assert "'nosuch' is not a runner kind" in info.reason and "local" in info.reason


def test_unknown_runner_kind_leaves_nothing_to_delete(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.submit("nosuch-later", "echo never", kind="nosuch")
    daemon = rig.daemon()
    rig.drive(daemon, lambda: rig.finished("nosuch-later"), timeout=5.0, what="nosuch-later")
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="bastion"):
        for _ in range(3):
            rig.step(daemon)
    retries = [r.getMessage() for r in caplog.records if "could not delete" in r.getMessage()]
    assert retries == []
    assert not daemon.ctx.deleting


# -- cancel ---------------------------------------------------------------------------------


def test_cancel_of_a_running_fake_job(rig: Rig) -> None:
    rig.submit("fake-cancel", "echo up; sleep 60")
    daemon = rig.daemon()
    rig.drive(
        daemon,
        lambda: ((rig.state("fake-cancel") or {}).get("runner") or {}).get("phase") == "RUNNING",
        what="fake-cancel to run",
    )
    rig.client.cancel("fake-cancel", user_id="bob", force=True)
    rig.drive(daemon, lambda: rig.finished("fake-cancel"), what="fake-cancel to end")
    info = rig.info("fake-cancel")
    assert info.status == "CANCELLED"
    assert "bob" in info.reason
    assert "KILLED" not in events_of(rig, "fake-cancel")  # SIGTERM was enough
    assert owned_names(rig, daemon) == []


def test_cancel_of_a_job_that_ignores_term_is_killed_at_the_deadline(rig: Rig) -> None:
    rig.submit("fake-stubborn", "trap '' TERM; echo up; sleep 60")
    daemon = rig.daemon(grace_seconds=0.3)
    rig.drive(
        daemon,
        lambda: ((rig.state("fake-stubborn") or {}).get("runner") or {}).get("phase") == "RUNNING",
        what="fake-stubborn to run",
    )
    rig.client.cancel("fake-stubborn", user_id="tester")
    rig.drive(daemon, lambda: rig.finished("fake-stubborn"), what="fake-stubborn to end")
    info = rig.info("fake-stubborn")
    assert info.status == "CANCELLED"
    assert events_of(rig, "fake-stubborn").count("KILLED") == 1
    assert info.state.exit_code == 137


# -- restarts -------------------------------------------------------------------------------


def test_a_restarted_daemon_adopts_the_running_attempt(rig: Rig) -> None:
    rig.submit("fake-adopt", "echo one; sleep 1.0; echo two")
    old = rig.daemon()
    rig.drive(
        old,
        lambda: ((rig.state("fake-adopt") or {}).get("runner") or {}).get("phase") == "RUNNING",
        what="fake-adopt to run",
    )
    name = rig.state("fake-adopt")["runner"]["name"]
    assert owned_names(rig, old) == [name]
    old.close()  # the old daemon is gone; its attempt keeps "running"

    new = rig.daemon()
    attempts_seen: set[tuple[str, ...]] = set()
    rig.drive(
        new,
        lambda: rig.finished("fake-adopt"),
        what="fake-adopt to finish under the new daemon",
        each=lambda: attempts_seen.add(tuple(owned_names(rig, new))),
    )
    assert attempts_seen <= {(name,), ()}, attempts_seen  # never a second attempt
    info = rig.info("fake-adopt")
    assert info.status == "SUCCEEDED"
    assert info.state.attempt == 1
    log = rig.log("fake-adopt")
    assert log.count("started at") == 1
    assert log.count("one\n") == 1 and log.count("two\n") == 1
    assert owned_names(rig, new) == []


def test_recovery_sweep_deletes_an_orphan_attempt(rig: Rig) -> None:
    rig.submit("fake-live", "sleep 60")
    old = rig.daemon()
    rig.drive(old, lambda: bool(owned_names(rig, old)), what="fake-live to start")
    [live] = owned_names(rig, old)
    old.close()

    url = old.store.root_url
    orphan = f"{name_prefix(url)}gone-job-0123abcd-a1"
    stranger = "bst-ffffff-other-root-0123abcd-a1"  # another root's: never ours to delete
    direct = FakeRunner(url, rig.state_dir)
    for attempt_name in (orphan, stranger):
        direct.start(Attempt(attempt_name, "gone-job", 1, "sleep 60", env={}))
    assert sorted(owned_names(rig, old)) == sorted([live, orphan])

    new = rig.daemon()
    rig.step(new)  # recovery (with its sweep) and the deletes it decided
    assert owned_names(rig, new) == [live]
    assert os.path.exists(os.path.join(rig.state_dir, f"{stranger}.json"))
    assert rig.state("fake-live")["runner"]["name"] == live


# -- the write-ahead state ------------------------------------------------------------------


def test_the_state_names_the_attempt_before_it_is_started(rig: Rig) -> None:
    rig.submit("fake-wal", "sleep 60")
    daemon = rig.daemon()
    fake = rig.fake(daemon)
    at_start: list[tuple[str, dict[str, Any] | None]] = []
    start = fake.start

    def recording_start(attempt: Attempt):
        at_start.append((attempt.name, rig.state("fake-wal")))  # the bucket, as start begins
        return start(attempt)

    fake.start = recording_start  # type: ignore[method-assign]

    daemon.cycle(time.time())  # spec read, admitted, state written, start handed to the pool
    state = rig.state("fake-wal")
    assert state is not None and state["status"] == "ACTIVE"
    name = state["runner"]["name"]
    assert state["attempt"] == 1
    state_mtime = os.stat(rig.root / "jobs" / "states" / "fake-wal").st_mtime_ns
    daemon.settle()

    assert [n for n, _ in at_start] == [name]
    seen = at_start[0][1]
    assert seen is not None, "the attempt was started before its state was in the bucket"
    assert seen["status"] == "ACTIVE"
    assert seen["runner"]["name"] == name
    assert seen["runner"]["handle"] is None
    record = os.path.join(rig.state_dir, f"{name}.json")
    assert os.path.exists(record)
    assert state_mtime <= os.stat(record).st_mtime_ns

    rig.step(daemon)  # the handle is taken in and written back
    assert rig.state("fake-wal")["runner"]["handle"] == {"name": name}
    assert owned_names(rig, daemon) == [name]


def test_a_daemon_dying_between_state_write_and_start_starts_the_attempt_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.submit("fake-crash", "echo once; sleep 0.2")
    old = rig.daemon()
    with monkeypatch.context() as patched:  # the daemon dies before acting: no effect runs
        patched.setattr(effects, "carry_out", lambda ctx, now: None)
        old.cycle(time.time())
    state = rig.state("fake-crash")
    assert state["status"] == "ACTIVE" and state["runner"]["handle"] is None
    name = state["runner"]["name"]
    assert owned_names(rig, old) == []  # recorded, never made
    old.close()

    new = rig.daemon()
    rig.drive(new, lambda: rig.finished("fake-crash"), what="fake-crash to finish")
    info = rig.info("fake-crash")
    assert info.status == "SUCCEEDED"
    assert info.state.attempt == 1
    assert rig.log("fake-crash").count("once\n") == 1
    assert name.endswith("-a1")


def _recorded_but_not_started(rig: Rig, name: str) -> dict[str, Any]:
    """A daemon admitted ``name`` and wrote its state (naming the attempt), then died before
    starting it: the state says ACTIVE with a record that has no handle."""
    rig.submit(name, "echo hi; sleep 0.2")
    first = rig.daemon()
    original = FakeRunner.start
    FakeRunner.start = lambda self, attempt: (_ for _ in ()).throw(KeyboardInterrupt())
    try:
        first.cycle(time.time())  # admits, writes the state, then the start "dies"
        first.settle()
    finally:
        FakeRunner.start = original
    state = rig.state(name)
    assert state is not None and state["status"] == "ACTIVE"
    assert state["runner"]["name"] and state["runner"]["handle"] is None
    return state


def test_a_recorded_attempt_whose_spec_was_deleted_meanwhile_ends_cancelled(rig: Rig) -> None:
    _recorded_but_not_started(rig, "orphaned")
    (rig.root / "jobs" / "active" / "orphaned").unlink()
    daemon = rig.daemon()
    rig.drive(daemon, lambda: rig.finished("orphaned"), what="the job to end")
    record = json.loads((rig.root / "jobs" / "complete" / "orphaned").read_text())
    assert record["state"]["outcome"] == "CANCELLED", record["state"]
    assert owned_names(rig, daemon) == []


def test_a_recorded_attempt_that_the_runner_made_is_adopted_not_started_again(rig: Rig) -> None:
    state = _recorded_but_not_started(rig, "made")
    daemon = rig.daemon()
    fake = rig.fake(daemon)
    spec = json.loads((rig.root / "jobs" / "active" / "made").read_text())
    fake.start(
        Attempt(
            name=state["runner"]["name"], job="made", attempt=1, command=spec["command"], env={}
        )
    )  # the start landed after all
    starts = []
    original = FakeRunner.start
    FakeRunner.start = lambda self, attempt: starts.append(attempt.name) or original(self, attempt)
    try:
        rig.drive(daemon, lambda: rig.finished("made"), what="the job to end")
    finally:
        FakeRunner.start = original
    assert starts == [state["runner"]["name"]]  # asked once, by name: the runner adopts it
    assert owned_names(rig, daemon) == [] or owned_names(rig, daemon) == [state["runner"]["name"]]
    record = json.loads((rig.root / "jobs" / "complete" / "made").read_text())
    assert record["state"]["outcome"] == "SUCCEEDED" and record["state"]["attempt"] == 1


def test_the_sweep_leaves_alone_an_attempt_whose_delete_is_under_way(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A finished attempt's delete runs in the pool; a sweep meanwhile must not take the
    attempt, still listed, for an orphan (a warning and a second delete)."""
    rig.submit("fake-done", "true")
    daemon = rig.daemon()
    fake = rig.fake(daemon)
    gate, deletes = threading.Event(), []
    delete = fake.delete

    def held_delete(handle):  # the cloud takes its time to delete a node
        deletes.append(handle["name"])
        gate.wait(30)
        return delete(handle)

    fake.delete = held_delete
    try:
        deadline = time.monotonic() + 20
        while not deletes and time.monotonic() < deadline:
            daemon.cycle(time.time())
            time.sleep(0.02)
        assert deletes, "the finished attempt's delete never started"
        with caplog.at_level(logging.WARNING, logger="bastion.daemon"):
            for _ in range(SWEEP_EVERY_CYCLES + 1):
                daemon.cycle(time.time())
        assert "no job of this root names it" not in caplog.text
    finally:
        gate.set()
    daemon.settle()
    rig.drive(daemon, lambda: rig.client.get("fake-done").finished, what="fake-done to finish")
    assert len(deletes) == 1
    assert owned_names(rig, daemon) == []


def test_a_cycle_does_not_wait_for_the_starts_the_last_one_handed_off(rig: Rig) -> None:
    """Effects have a pool of their own: with every effect thread stuck in a slow start (a
    burst of cloud creates), the next cycle still reads, watches and cancels."""
    rig.submit("watched", "sleep 60")
    daemon = rig.daemon()
    fake = rig.fake(daemon)
    rig.drive(daemon, lambda: rig.client.get("watched").status == "ACTIVE", what="watched")
    gate, held = threading.Event(), []
    start = fake.start

    def slow_start(attempt: Attempt):
        if attempt.job.startswith("held-"):
            held.append(attempt.job)
            gate.wait(60)
        return start(attempt)

    fake.start = slow_start
    try:
        for i in range(daemon.ctx.workers):  # one start per effect thread, all of them stuck
            rig.submit(f"held-{i}", "sleep 60")
        deadline = time.monotonic() + 20
        while len(held) < daemon.ctx.workers and time.monotonic() < deadline:
            daemon.cycle(time.time())
            time.sleep(0.02)
        assert len(held) == daemon.ctx.workers
        rig.client.cancel("watched", user_id="tester")
        cycle = threading.Thread(target=daemon.cycle, args=(time.time(),), daemon=True)
        cycle.start()
        cycle.join(15)
        assert not cycle.is_alive(), "the cycle waited for the starts in flight"
        assert rig.state("watched")["status"] in ("CANCELLING", "CLEANING", "COMPLETED")
    finally:
        gate.set()
    daemon.settle()


# -- where attempts are watched ----------------------------------------------------------------


def _polls_by_thread(rig: Rig, daemon: Daemon) -> list[str]:
    """The threads the fake runner's polls are made in from now on."""
    runner = rig.fake(daemon)
    threads: list[str] = []
    poll = runner.poll

    def recorded(handle):
        threads.append(threading.current_thread().name)
        return poll(handle)

    runner.poll = recorded  # type: ignore[method-assign]
    return threads


def _running(rig: Rig, daemon: Daemon, names: list[str]) -> None:
    for name in names:
        rig.submit(name, "echo hi; sleep 60")
    rig.drive(daemon, lambda: all(_phase(rig, n) == "RUNNING" for n in names), what="running")


def _phase(rig: Rig, name: str) -> str | None:
    state = rig.state(name)
    return ((state or {}).get("runner") or {}).get("phase")


def test_attempts_of_a_runner_with_cheap_polls_are_watched_in_the_loops_thread(rig: Rig) -> None:
    daemon = rig.daemon()
    assert rig.fake(daemon).cheap_polls
    names = [f"cheap-{i}" for i in range(5)]
    _running(rig, daemon, names)
    threads = _polls_by_thread(rig, daemon)
    rig.step(daemon)
    assert threads == [threading.current_thread().name] * len(names)


def test_attempts_of_a_runner_that_makes_requests_are_watched_in_the_io_pool(rig: Rig) -> None:
    daemon = rig.daemon()
    rig.fake(daemon).cheap_polls = False  # as a cloud runner: each poll is a request
    names = [f"remote-{i}" for i in range(5)]
    _running(rig, daemon, names)
    threads = _polls_by_thread(rig, daemon)
    rig.step(daemon)
    assert len(threads) == len(names)
    assert all(t.startswith("bastion-io") for t in threads), threads


def test_a_log_not_known_yet_is_learned_in_the_pool_before_cheap_polls(
    rig: Rig, tmp_path: Path
) -> None:
    """A daemon on a new work directory (a new VM) adopts running attempts: each log's base
    is the size of the log in the bucket, a request; the loop's thread never makes it."""
    first = rig.daemon()
    names = [f"adopted-{i}" for i in range(4)]
    _running(rig, first, names)
    rig.step(first)  # their output in the bucket's logs
    rig.daemons.remove(first)
    first.close()
    rig.work_dir = str(tmp_path / "new-work")  # nothing of the first daemon's mirrors
    second = rig.daemon()
    logs = second.ctx.logs
    learned: list[tuple[str, str]] = []
    base = logs.base

    def recorded(log_name: str) -> int:
        if not logs.knows(log_name):
            learned.append((log_name, threading.current_thread().name))
        return base(log_name)

    logs.base = recorded  # type: ignore[method-assign]
    rig.drive(second, lambda: all(logs.knows(n) for n in names), what="logs known")
    assert sorted(name for name, _ in learned) == sorted(names)
    assert all(thread.startswith("bastion-io") for _, thread in learned), learned
    assert all(_phase(rig, name) == "RUNNING" for name in names)


def test_an_attempt_whose_log_the_bucket_would_not_size_is_watched_in_the_pool(
    rig: Rig, tmp_path: Path
) -> None:
    """Learning a log's base failed (the bucket refused): its watch asks again, with the
    request's retries, in the pool; the loop's thread waits on no request."""
    first = rig.daemon()
    names = [f"unsized-{i}" for i in range(3)]
    _running(rig, first, names)
    rig.daemons.remove(first)
    first.close()
    rig.work_dir = str(tmp_path / "new-work")
    second = rig.daemon()
    logs = second.ctx.logs
    base = logs.base
    refused: list[str] = []

    def refusing(log_name: str) -> int:
        if not logs.knows(log_name) and log_name not in refused:
            refused.append(log_name)  # the first try of each: the bucket says no
            raise OSError("503 Service Unavailable")
        return base(log_name)

    logs.base = refusing  # type: ignore[method-assign]
    threads = _polls_by_thread(rig, second)
    rig.step(second)
    assert sorted(refused) == sorted(names)
    assert len(threads) == len(names)
    assert all(t.startswith("bastion-io") for t in threads), threads
