"""The local wrapper's wait for its job: woken by the job's exit, not by polling.

A wrapper lives as long as its job, days for a training run. ``Popen.wait(timeout)`` polled
about 65 times a second (1.3 ms of CPU a second per wrapper, a core for 1,000 running jobs).
"""

from __future__ import annotations

import errno
import os
import subprocess
import time

import pytest

from bastion.outputs.supervise import ExitWatch


def _wakeups() -> int:
    """This thread's voluntary context switches so far (each sleep that ended is one)."""
    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


def test_the_wait_ends_when_the_job_exits_not_at_the_timeout() -> None:
    child = subprocess.Popen(["bash", "-c", "sleep 0.3; exit 7"])
    with ExitWatch(child) as watch:
        t0 = time.monotonic()
        status = watch.wait(30.0)
        took = time.monotonic() - t0
    assert status == 7
    assert child.returncode == 7  # reaped: no zombie left behind
    assert took < 10.0, f"waited {took:.1f} s for a job that ran 0.3 s"


def test_a_running_job_gives_none_after_the_timeout() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        with ExitWatch(child) as watch:
            assert watch.wait(0.2) is None
            assert child.poll() is None
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd on this platform")
def test_a_wrapper_waiting_on_a_running_job_sleeps_through_the_wait() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        with ExitWatch(child) as watch:
            before = _wakeups()
            assert watch.wait(1.0) is None
            woke = _wakeups() - before
    finally:
        child.kill()
        child.wait()
    # Popen.wait(timeout=1) wakes about 24 times in that second (sleeps of 0.5 ms to 50 ms)
    assert woke <= 3, f"the wait woke {woke} times in one second"


def test_without_a_pidfd_the_wait_still_ends_with_the_job(monkeypatch) -> None:
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open: function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd, raising=False)
    child = subprocess.Popen(["bash", "-c", "exit 3"])
    with ExitWatch(child) as watch:
        status = None
        deadline = time.monotonic() + 30
        while status is None and time.monotonic() < deadline:
            status = watch.wait(0.2)
    assert status == 3
