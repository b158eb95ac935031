"""A bucket that fails half its requests must lose nothing.

The real daemon (``build_daemon``) runs in-process on ``flaky://ROOT`` (tests/flakyfs.py: a real
local directory behind an fsspec filesystem that raises a simulated 503 on a seeded fraction of
calls, sometimes after the call took effect), so the store takes its generic object-store paths.
Users submit through a ``Client`` on the plain local path of the same directory. The test calls
the daemon's own loop one iteration at a time (``Daemon.run(once=True)``: a cycle that a failed
listing aborts is logged and retried), and checks the bucket, the logs and the processes
afterwards.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bastion.bucket.logsync import LogSync
from bastion.bucket.store import Store
from bastion.daemon import Daemon
from bastion.daemon.start import build_daemon
from bastion.runners.local import default_attempts_dir
from launch.api import Client, new_jobspec
from tests.flakyfs import FailurePlan, FlakyFileSystem, Simulated503
from tests.harness import kill_all, kill_shared_supervisors, processes_with_env, wait_for


class ErrorLog(logging.Handler):
    """What the daemon logged at ERROR and above, with the type of any exception."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[tuple[str, type[BaseException] | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        kind = record.exc_info[0] if record.exc_info else None
        self.records.append((record.getMessage(), kind))

    def unexpected(self) -> list[str]:
        """Errors that a simulated 503 does not explain."""
        return [msg for msg, kind in self.records if kind is not None and kind is not Simulated503]

    def summary(self) -> dict[str, int]:
        return dict(
            collections.Counter(
                re.sub(r"\d+", "N", msg.split(":")[0]) if kind is None else kind.__name__
                for msg, kind in self.records
            )
        )


class Rig:
    """One ROOT seen two ways (flaky for the daemon, plain for users), and what ran on it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        self.work_dir = str(tmp / "work")
        self.marker = tmp / "ran.txt"
        self.go = tmp / "go"
        self.tag = uuid.uuid4().hex
        self.client = Client(
            str(self.root), expect_daemon=False
        )  # creates the directories, like a bucket that exists
        self.url = FlakyFileSystem.install(str(self.root), FailurePlan(0.0))
        self.daemons: list[Daemon] = []
        self.errors = ErrorLog()
        logging.getLogger("bastion").addHandler(self.errors)

    def set_plan(self, plan: FailurePlan) -> FailurePlan:
        FlakyFileSystem.install(str(self.root), plan)
        return plan

    def daemon(self, grace_seconds: float = 30.0) -> Daemon:
        daemon = build_daemon(
            self.url, work_dir=self.work_dir, grace_seconds=grace_seconds, gpus=[]
        )
        # not a LocalFileSystem: the generic, object-store code paths are under test
        assert isinstance(daemon.store.fs, FlakyFileSystem)
        self.daemons.append(daemon)
        return daemon

    def submit(self, name: str, command: str) -> None:
        spec = new_jobspec(
            name=name,
            command=f'echo "$BASTION_JOB_NAME" >> {self.marker}; {command}',
            user_id="tester",
            project_id="default",
            env_vars={"BASTION_TEST_TAG": self.tag},
        )
        self.client.submit(spec)

    def step(self, daemon: Daemon) -> None:
        """One iteration of the daemon's own loop (``Daemon.run``), as ``bastion start`` runs it."""
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            daemon.run(poll_seconds=0.0, once=True)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def drive(
        self, daemon: Daemon, done: Callable[[], bool], timeout: float = 40.0, what: str = ""
    ) -> int:
        """Step the daemon until ``done()``; returns the number of steps."""
        deadline = time.monotonic() + timeout
        steps = 0
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what or 'the jobs'} after {steps} "
                    f"steps; states: {self.states()}; errors: {self.errors.summary()}"
                )
            self.step(daemon)
            steps += 1
            twice = {name: n for name, n in self.ran().items() if n > 1}
            assert not twice, (
                f"commands ran more than once after {steps} steps: {twice}; "
                f"errors: {self.errors.summary()}"
            )
            time.sleep(0.01)
        return steps

    # -- the bucket, read directly ----------------------------------------------------------

    def entries(self, *parts: str) -> list[str]:
        path = self.root.joinpath(*parts)
        return sorted(os.listdir(path)) if path.exists() else []

    def states(self) -> dict[str, dict[str, Any]]:
        found = {}
        for name in self.entries("jobs", "states"):
            try:
                found[name] = json.loads(self.root.joinpath("jobs", "states", name).read_text())
            except (OSError, ValueError):
                continue
        return found

    def complete(self, name: str) -> dict[str, Any] | None:
        path = self.root / "jobs" / "complete" / name
        return json.loads(path.read_text()) if path.exists() else None

    def log(self, name: str) -> str:
        path = self.root / "logs" / name
        return path.read_text() if path.exists() else ""

    def ran(self) -> collections.Counter[str]:
        text = self.marker.read_text() if self.marker.exists() else ""
        return collections.Counter(text.split())

    def all_complete(self, names: list[str]) -> bool:
        return set(names) <= set(self.entries("jobs", "complete")) and not self.entries(
            "jobs", "active"
        )

    def processes(self) -> list[psutil.Process]:
        return processes_with_env("BASTION_TEST_TAG", self.tag)

    def close(self) -> None:
        kill_shared_supervisors(default_attempts_dir(self.url))  # (the daemons' runner's)
        kill_all(self.processes())
        for daemon in self.daemons:
            daemon.ctx.pool.shutdown(wait=True)
        FlakyFileSystem.uninstall(str(self.root))
        logging.getLogger("bastion").removeHandler(self.errors)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.close()


LOG_RE = (
    r"=== \[bastion\] attempt 1 of {name} started at [^\n]* ===\n"
    r"job {name}\n"
    r"=== \[bastion\] attempt 1 exited with status {code} at [^\n]* ===\n"
)


@pytest.mark.parametrize("fraction", [0.5, 0.2])
def test_a_flaky_bucket_loses_nothing(rig: Rig, fraction: float) -> None:
    names = [f"job-{i:02d}" for i in range(19)]
    for name in names:
        rig.submit(name, "echo job $BASTION_JOB_NAME; exit 0")
    rig.submit("fails", "echo job $BASTION_JOB_NAME; exit 3")
    names.append("fails")
    plan = rig.set_plan(FailurePlan(fraction, seed=int(fraction * 1000)))
    daemon = rig.daemon()

    # done: every job recorded in jobs/complete, and the daemon cleaned up after all of them
    rig.drive(
        daemon,
        lambda: rig.all_complete(names) and not rig.entries("jobs", "states") and not daemon.jobs,
    )
    for _ in range(5):  # a few more cycles: nothing may happen twice once everything is done
        rig.step(daemon)

    assert plan.total_failures > 0.5 * fraction * sum(plan.calls.values())
    assert plan.failures["pipe_file:after"] > 0  # the ambiguous case was exercised
    assert rig.ran() == {name: 1 for name in names}  # each command ran exactly once
    for name in names:
        record = rig.complete(name)
        assert record is not None, name
        state = record["state"]
        expected = ("FAILED", 3) if name == "fails" else ("SUCCEEDED", 0)
        assert (state["outcome"], state["exit_code"]) == expected, (name, state)
        reason = f"command exited with status {expected[1]}"
        assert state["reason"] == reason, (name, state)
        assert state["attempt"] == 1 and state["status"] == "COMPLETED"
        assert record["spec"]["name"] == name
        # the long-term history holds this submission's events once, even if finalize retried
        events = [e["event"] for e in rig.client.history(name, all_submissions=True)]
        assert events.count("PENDING") == 1 and events[-1] == state["outcome"], (name, events)
        log = rig.log(name)
        # every byte exactly once: no duplicated chunk after an ambiguous append, none lost
        assert re.fullmatch(LOG_RE.format(name=re.escape(name), code=expected[1]), log), (
            name,
            log,
        )
    assert rig.entries("jobs", "active") == []
    assert rig.entries("jobs", "states") == []
    assert rig.entries("jobs", "user_states") == []
    assert daemon.jobs == {}
    # every job's mirror was closed: only the daemon's own log may stay mirrored (its files
    # appear with its first line, which a daemon driven without its log handler never writes)
    own = daemon.daemon_log
    left = set(os.listdir(Path(rig.work_dir, "logs")))
    assert left <= {own, own + ".base"}, left
    assert wait_for(lambda: not rig.processes(), timeout=10, what="job processes to exit")
    assert rig.errors.unexpected() == []  # every error the daemon logged was a simulated 503


@pytest.mark.parametrize("fraction", [0.5])
def test_submissions_by_marker_survive_a_flaky_bucket(rig: Rig, fraction: float) -> None:
    """Jobs submitted while the daemon runs, found through their submission markers (the full
    spec listing runs only when the daemon (re)starts acting), with half the daemon's requests
    failing: a failed marker listing, spec read or marker delete must lose no submission and
    run none twice; every marker is consumed in the end."""
    daemon = rig.daemon()
    daemon.specwatch.every_cycle_below = 0  # the listing is never cheap enough for every cycle
    daemon.specwatch.full_listing_seconds = 3600.0
    full_listings = []
    list_specs = daemon.store.specs.list

    def counted_list_specs() -> dict[str, Any]:
        full_listings.append(1)
        return list_specs()

    daemon.store.specs.list = counted_list_specs  # type: ignore[method-assign]
    rig.step(daemon)  # the first cycle, on a healthy bucket: the full listing (nothing yet)
    plan = rig.set_plan(FailurePlan(fraction, seed=12))
    names = [f"late-{i:02d}" for i in range(12)]
    steps = 0
    for name in names:
        rig.submit(name, "echo job $BASTION_JOB_NAME; exit 0")
        rig.step(daemon)
        steps += 1
    steps += rig.drive(
        daemon,
        lambda: (
            rig.all_complete(names) and not daemon.jobs and not rig.entries("jobs", "user_states")
        ),
    )

    assert plan.failures["ls:before"] > 0 and plan.failures["cat_file:before"] > 0
    assert plan.failures["rm_file:after"] + plan.failures["rm_file:before"] > 0
    # Most cycles listed no spec: the markers brought the jobs in (a lost lease makes the
    # daemon start acting again with a full listing, which loses nothing either).
    assert len(full_listings) < steps / 2, (len(full_listings), steps)
    assert rig.ran() == {name: 1 for name in names}
    for name in names:
        record = rig.complete(name)
        assert record is not None and record["state"]["outcome"] == "SUCCEEDED", (name, record)
    assert rig.errors.unexpected() == []


def test_ambiguous_log_appends_are_not_duplicated(rig: Rig) -> None:
    """Every append "fails" after it reached the bucket: LogSync must re-ask, not re-send."""
    plan = rig.set_plan(
        FailurePlan(ops={"pipe_file"}, where="/logs/", first_calls=10**6, when="after")
    )
    store = Store(rig.url)
    logs = LogSync(store, str(rig.tmp / "mirrors"))
    mirror = logs.path("job")
    expected = b""
    for i in range(5):
        line = f"line {i}\n".encode()
        with open(mirror, "ab") as f:
            f.write(line)
        expected += line
        with pytest.raises(Simulated503):
            logs.sync("job")
        assert logs.sync("job") == 0  # the bucket already has it: nothing is sent twice
        assert (rig.root / "logs" / "job").read_bytes() == expected
    assert plan.failures["pipe_file:after"] == 5


@pytest.mark.parametrize(
    "failing",
    [
        pytest.param({"ops": {"ls"}, "where": "/jobs/active"}, id="listing"),
        pytest.param({"ops": {"cat_file"}, "where": "/jobs/states/"}, id="state-read"),
        pytest.param({"ops": {"cat_file"}, "where": "/history/snapshot/"}, id="snapshot-read"),
    ],
)
def test_restart_on_a_flaky_bucket_adopts_instead_of_starting_again(
    rig: Rig, failing: dict[str, Any]
) -> None:
    names = [f"long-{i}" for i in range(3)]
    for name in names:
        rig.submit(name, f"until [ -e {rig.go} ]; do sleep 0.05; done; echo job $BASTION_JOB_NAME")
    first = rig.daemon()
    rig.drive(
        first,
        lambda: all(rig.states().get(n, {}).get("status") == "ACTIVE" for n in names),
        what="the jobs to run",
    )
    # The first daemon goes away (it is never stepped again); its jobs keep running. The
    # restarted daemon's first attempt at recovery hits a 503. Each step of the first wrote
    # the snapshot (a clean stop does), so states are read only where there is none.
    if "/jobs/states/" in failing["where"]:
        shutil.rmtree(rig.root / "history" / "snapshot")
    plan = rig.set_plan(FailurePlan(first_calls=1, **failing))
    second = rig.daemon()
    for _ in range(5):
        rig.step(second)
        time.sleep(0.01)
    rig.go.touch()
    rig.drive(second, lambda: rig.all_complete(names))

    assert plan.total_failures > 0
    assert rig.ran() == {name: 1 for name in names}  # adopted, never started a second time
    for name in names:
        record = rig.complete(name)
        assert record is not None
        assert record["state"]["outcome"] == "SUCCEEDED", record["state"]


@pytest.mark.parametrize(
    "failing",
    [
        pytest.param({"ops": {"cat_file"}}, id="read"),
        pytest.param({"ops": {"rm_file"}, "when": "before"}, id="delete"),
    ],
)
def test_a_cancel_survives_a_failed_request_call(rig: Rig, failing: dict[str, Any]) -> None:
    names = [f"sleeper-{i}" for i in range(2)]
    for name in names:
        rig.submit(name, "sleep 120")
    daemon = rig.daemon(grace_seconds=1.0)
    rig.drive(
        daemon,
        lambda: all(rig.states().get(n, {}).get("status") == "ACTIVE" for n in names),
        what="the jobs to run",
    )
    plan = rig.set_plan(FailurePlan(where="/jobs/user_states/", first_calls=1, **failing))
    for name in names:
        rig.client.cancel(name, user_id="tester")
    rig.drive(daemon, lambda: rig.all_complete(names), timeout=6, what="the cancels")
    for _ in range(5):
        rig.step(daemon)

    assert plan.total_failures == len(names)
    for name in names:
        record = rig.complete(name)
        assert record is not None
        assert record["state"]["outcome"] == "CANCELLED", record["state"]
    assert rig.entries("jobs", "user_states") == []  # every request consumed


def test_an_ambiguous_state_write_is_not_taken_for_another_daemon(rig: Rig) -> None:
    rig.submit("one", "echo job $BASTION_JOB_NAME; exit 0")
    # the first write of the job's state reaches the bucket, but its answer is lost
    plan = rig.set_plan(
        FailurePlan(ops={"pipe_file"}, where="/jobs/states/", first_calls=1, when="after")
    )
    daemon = rig.daemon()
    rig.drive(daemon, lambda: rig.all_complete(["one"]))

    assert plan.failures["pipe_file:after"] == 1
    assert rig.ran() == {"one": 1}
    record = rig.complete("one")
    assert record is not None and record["state"]["outcome"] == "SUCCEEDED"
    assert [msg for msg, _ in rig.errors.records if "another daemon" in msg] == []
    assert re.fullmatch(LOG_RE.format(name="one", code=0), rig.log("one")), rig.log("one")


@pytest.mark.parametrize(
    "failing",
    [
        pytest.param({"ops": {"pipe_file"}, "where": "/jobs/complete/"}, id="complete-write"),
        pytest.param({"ops": {"rm_file"}, "where": "/jobs/active/"}, id="spec-delete"),
        pytest.param(
            {"ops": {"rm_file"}, "where": "/jobs/states/", "when": "after"}, id="state-delete"
        ),
    ],
)
def test_a_503_while_finalizing_changes_nothing_the_user_sees(
    rig: Rig, failing: dict[str, Any]
) -> None:
    rig.submit("one", "echo job $BASTION_JOB_NAME; exit 0")
    plan = rig.set_plan(FailurePlan(first_calls=1, **failing))  # one failure, in _finalize
    daemon = rig.daemon()
    rig.drive(daemon, lambda: rig.all_complete(["one"]) and not rig.entries("jobs", "states"))
    for _ in range(3):  # and the daemon settles: it has nothing left to do for the job
        rig.step(daemon)

    assert plan.total_failures == 1
    record = rig.complete("one")
    assert record is not None
    state = record["state"]
    assert (state["outcome"], state["reason"]) == ("SUCCEEDED", "command exited with status 0")
    assert rig.ran() == {"one": 1}
    assert [msg for msg, _ in rig.errors.records if "another daemon" in msg] == []
    assert daemon.jobs == {}


def test_an_error_without_a_message_is_logged_by_its_type(rig: Rig) -> None:
    """A timeout says nothing (``str(TimeoutError())`` is empty): the daemon's log names its
    type, where it used to end at "could not record the finished job (will retry): "."""
    rig.submit("one", "exit 0")
    plan = rig.set_plan(
        FailurePlan(first_calls=1, ops={"pipe_file"}, where="/jobs/complete/", silent=True)
    )
    daemon = rig.daemon()
    rig.drive(daemon, lambda: rig.all_complete(["one"]) and not rig.entries("jobs", "states"))

    assert plan.total_failures == 1
    logged = [msg for msg, _ in rig.errors.records if "could not record the finished job" in msg]
    assert logged == ["one: could not record the finished job (will retry): TimeoutError"]
