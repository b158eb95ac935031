"""Fencing tokens: a start from a daemon older than one that already started is refused.

Time-based self-fencing (the lease's validity) bounds when a holder decides; a start already
under way when the holder froze can resume at any time. These pin the token that closes that
hole, with real processes, a real lease and a real daemon.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bastion.bucket.store import Store
from bastion.daemon.start import build_daemon
from bastion.lease import Lease
from bastion.runners import fence
from bastion.runners.base import AttemptPhase, Fenced, TryAgain
from launch.api import Client, new_jobspec
from tests.test_local_runner import Rig, rig  # noqa: F401  (the fixture)

# Holds a shared lock on a fence file, then waits: a start frozen in the middle (SIGSTOP).
HOLD_SHARED = """
import fcntl, os, sys, time
fd = os.open(os.path.join(sys.argv[1], ".fence"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
time.sleep(120)
"""


def test_a_start_from_an_older_term_after_a_newer_one_started_is_refused(rig: Rig) -> None:  # noqa: F811
    runner = rig.runner()
    new = dataclasses.replace(rig.attempt("fresh", "true"), fence=6)
    runner.start(new)
    stale = dataclasses.replace(rig.attempt("stale", f"touch {rig.tmp / 'ran'}"), fence=5)
    with pytest.raises(Fenced, match="term 6"):
        runner.start(stale)
    time.sleep(0.3)
    assert not (rig.tmp / "ran").exists()
    assert not rig.dir("stale").exists()  # nothing was made for it
    assert fence.current(rig.attempts_dir) == 6


def test_a_stale_holder_cannot_start_again_what_its_successor_ran_and_deleted(rig: Rig) -> None:  # noqa: F811
    """The hole time cannot close: the old holder checked its lease, froze, and resumes after
    the new holder started the same attempt, saw it finish and deleted it."""
    marker = rig.tmp / "runs"
    attempt = rig.attempt("once", f"echo run >> {marker}")
    successor = rig.runner()
    handle = successor.start(dataclasses.replace(attempt, fence=8))
    deadline = time.monotonic() + 30
    while successor.poll(handle).phase is not AttemptPhase.SUCCEEDED:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert successor.delete(handle)
    assert not rig.dir("once").exists()
    with pytest.raises(Fenced):
        rig.runner().start(dataclasses.replace(attempt, fence=7))
    time.sleep(0.3)
    assert marker.read_text() == "run\n"


def test_a_newer_term_waits_while_a_frozen_start_holds_the_fence(rig: Rig) -> None:  # noqa: F811
    runner = rig.runner()
    runner.start(dataclasses.replace(rig.attempt("first", "true"), fence=3))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_SHARED, rig.attempts_dir], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        holder.send_signal(19)  # SIGSTOP: frozen in the middle of its start
        newer = dataclasses.replace(rig.attempt("second", "true"), fence=4)
        started = time.monotonic()
        with pytest.raises(TryAgain, match="holds the fence"):
            runner.start(newer)
        assert time.monotonic() - started < 5  # bounded: the daemon is not frozen with it
        assert fence.current(rig.attempts_dir) == 3
        # The same term as the one in the file needs no bump: it starts beside the holder.
        runner.start(dataclasses.replace(rig.attempt("same", "true"), fence=3))
    finally:
        holder.kill()
        holder.wait()
    runner.start(newer)
    assert fence.current(rig.attempts_dir) == 4


def test_no_lease_means_no_fence(rig: Rig) -> None:  # noqa: F811
    runner = rig.runner()
    runner.start(dataclasses.replace(rig.attempt("a", "true"), fence=9))
    runner.start(rig.attempt("b", "true"))  # fence 0: a daemon run without a lease (tests)
    assert fence.current(rig.attempts_dir) == 9


def test_every_takeover_raises_the_term_even_after_the_lease_object_was_deleted(
    tmp_path: Path,
) -> None:
    store = Store(str(tmp_path / "root"))
    first = Lease(store, {"owner": "a"}, duration=0.2)
    assert first.hold()
    term = first.term
    assert term > 0 and first.renew() and store.lease.read()[0]["term"] == term
    first.release()
    second = Lease(store, {"owner": "b"}, duration=0.2)
    assert second.hold() and second.term > term
    second.release()
    store.bucket.delete("lease")
    assert store.lease.read() is None
    third = Lease(store, {"owner": "c"}, duration=0.2)
    assert third.hold() and third.term > second.term
    third.release()


def test_a_daemon_whose_start_is_fenced_stops_acting_and_starts_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    attempts = tmp_path / "attempts"
    daemon = build_daemon(
        str(root),
        work_dir=str(tmp_path / "work"),
        gpus=[],
        lease_seconds=30,
        settings={"runners": {"local": {"attempts_dir": str(attempts)}}},
    )
    lease = daemon.lease
    assert lease is not None
    try:
        assert lease.hold()
        # A successor with a newer term has started attempts on this host.
        with fence.fenced(str(attempts), lease.term + 1):
            pass
        marker = tmp_path / "ran"
        Client(str(root), expect_daemon=False).submit(
            new_jobspec(name="j", command=f"touch {marker}", user_id="u", project_id="default")
        )
        daemon.cycle(time.time())
        daemon.settle()
        daemon._run_cycle(1.0)  # takes in the refusal: the daemon lets go
        assert not lease.held
        assert not daemon.jobs
        time.sleep(0.3)
        assert not marker.exists()
        assert not any(p.name.startswith("bst-") for p in attempts.iterdir())
    finally:
        daemon.close()


def test_a_burst_of_starts_under_a_new_term_bumps_once_and_none_is_told_to_wait(
    tmp_path: Path,
) -> None:
    """A restarted daemon's first burst: 480 starts of a new term from 48 threads. One bumps
    the fence; the others that saw the old term wait for it in the process (holding no lock),
    then start under the shared one. Each holds the fence 100 ms, as a fork of a large daemon
    does: those that saw the old term could not get the exclusive lock past the shared ones
    of those that came after the bump, and were told to try again."""
    import concurrent.futures

    with fence.fenced(str(tmp_path), 3):
        pass
    outcomes: list[str] = []

    def start(_: int) -> None:
        try:
            with fence.fenced(str(tmp_path), 4):
                time.sleep(0.1)
                sum(range(20_000))  # some work under the GIL, as a start does
            outcomes.append("started")
        except TryAgain as e:
            outcomes.append(str(e))

    with concurrent.futures.ThreadPoolExecutor(48) as pool:  # a start always under way
        list(pool.map(start, range(480)))
    assert outcomes == ["started"] * 480, sorted(set(outcomes))
    assert fence.current(str(tmp_path)) == 4
