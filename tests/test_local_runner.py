"""The local runner with real processes: status, restarts, process groups, pids, GPUs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bastion.runners.local import Launch, LocalRunner
from tests.harness import REPO, kill_all, processes_with_env, wait_for

# Starts one attempt from a separate Python process that exits at once, so the attempt lives on
# with no parent that can wait() for it: what a daemon killed with -9 leaves behind.
START_AND_EXIT = """
import json, sys
from bastion.runners.local import Launch, LocalRunner
work_dir, key, command, log_path, gpus, tag = sys.argv[1:7]
runner = LocalRunner(work_dir, gpus=[0, 1, 2, 3])
launch = Launch(key=key, command=command, env={"BASTION_TEST_TAG": tag}, log_path=log_path,
                gpus=int(gpus))
print(json.dumps(runner.start(launch)))
"""


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.work_dir = str(tmp / "work")
        self.tag = os.urandom(8).hex()

    def launch(self, key: str, command: str, gpus: int = 0, **env: str) -> Launch:
        return Launch(
            key=key,
            command=command,
            env={"BASTION_TEST_TAG": self.tag, **env},
            log_path=self.log_path(key),
            gpus=gpus,
        )

    def log_path(self, key: str) -> str:
        return str(self.tmp / "logs" / key)

    def log(self, key: str) -> str:
        path = Path(self.log_path(key))
        return path.read_text() if path.exists() else ""

    def go(self, key: str) -> Path:
        return self.tmp / f"go-{key}"

    def wait_go(self, key: str) -> str:
        """A command fragment that blocks until the test releases it."""
        return f"while [ ! -e {self.go(key)} ]; do sleep 0.02; done"

    def start_elsewhere(self, key: str, command: str, gpus: int = 0) -> dict[str, Any]:
        """Start an attempt from a process that exits right away; returns the handle."""
        out = subprocess.run(
            [sys.executable, "-c", START_AND_EXIT, self.work_dir, key, command,
             self.log_path(key), str(gpus), self.tag],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        return json.loads(out)

    def processes(self) -> list[psutil.Process]:
        return processes_with_env("BASTION_TEST_TAG", self.tag)

    def close(self) -> None:
        kill_all(self.processes())


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.close()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def finished(runner: LocalRunner, handle: dict[str, Any]) -> tuple[bool, int | None]:
    return wait_for(lambda: (r := runner.poll(handle))[0] and r, timeout=20, what="the attempt")


def read_pid(path: Path) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), what=str(path)))


# -- lifecycle ----------------------------------------------------------------------------------


def test_start_then_poll_running_then_finished(rig: Rig) -> None:
    runner = LocalRunner(rig.work_dir, gpus=[])
    handle = runner.start(rig.launch("a1", f"echo hello; {rig.wait_go('a1')}; exit 5"))
    assert handle["kind"] == "local" and handle["key"] == "a1"
    assert handle["host"] == socket.gethostname()
    assert handle["pgid"] == handle["pid"]
    assert os.getpgid(handle["pid"]) == handle["pid"]  # its own process group
    assert json.loads(json.dumps(handle)) == handle  # persisted in the state as JSON
    wait_for(lambda: "hello" in rig.log("a1"), what="output")
    assert runner.poll(handle) == (False, None)
    rig.go("a1").touch()
    assert finished(runner, handle) == (True, 5)
    assert runner.poll(handle) == (True, 5)  # asking again gives the same answer
    assert rig.log("a1") == "hello\n"


def test_exit_status_of_a_running_attempt_survives_a_restart(rig: Rig) -> None:
    handle = rig.start_elsewhere("r1", f"echo started; {rig.wait_go('r1')}; exit 7")
    proc = psutil.Process(handle["pid"])
    assert proc.ppid() != os.getpid()  # nobody here can wait() for it
    runner = LocalRunner(rig.work_dir, gpus=[0, 1, 2, 3])
    assert runner.adopt(handle)
    assert runner.poll(handle) == (False, None)
    rig.go("r1").touch()
    assert finished(runner, handle) == (True, 7)
    assert rig.log("r1") == "started\n"


def test_exit_status_of_an_attempt_that_ended_while_nobody_watched(rig: Rig) -> None:
    handle = rig.start_elsewhere("r2", "echo bye; exit 9")
    wait_for(lambda: gone(handle["pid"]), what="the orphaned attempt to end")
    runner = LocalRunner(rig.work_dir, gpus=[])
    assert runner.adopt(handle)
    assert runner.poll(handle) == (True, 9)
    assert rig.log("r2") == "bye\n"


def test_terminate_reaches_grandchildren_and_records_143(rig: Rig) -> None:
    runner = LocalRunner(rig.work_dir, gpus=[])
    pidfile = rig.tmp / "gc.pid"
    handle = runner.start(rig.launch("t1", f"sleep 300 & echo $! > {pidfile}; wait"))
    grandchild = read_pid(pidfile)
    assert os.getpgid(grandchild) == handle["pgid"]
    runner.terminate(handle)
    # checked before poll(): poll() itself SIGKILLs the group once the leader is gone
    wait_for(lambda: gone(grandchild), what="the grandchild to get SIGTERM")
    assert finished(runner, handle) == (True, 128 + signal.SIGTERM)


def test_kill_reaches_grandchildren_that_ignore_sigterm(rig: Rig) -> None:
    runner = LocalRunner(rig.work_dir, gpus=[])
    pidfile = rig.tmp / "gc.pid"
    handle = runner.start(
        rig.launch(
            "k1",
            f"trap '' TERM; (trap '' TERM; sleep 300) & echo $! > {pidfile}; "
            "while true; do sleep 0.05; done",
        )
    )
    grandchild = read_pid(pidfile)
    runner.terminate(handle)
    assert runner.poll(handle) == (False, None)  # SIGTERM is ignored all the way down
    assert not gone(grandchild)
    runner.kill(handle)
    wait_for(lambda: gone(grandchild), what="the grandchild to get SIGKILL")
    assert finished(runner, handle) == (True, None)  # the wrapper died too: no status


def test_finish_kills_what_the_leader_left_behind(rig: Rig) -> None:
    runner = LocalRunner(rig.work_dir, gpus=[])
    pidfile = rig.tmp / "gc.pid"
    handle = runner.start(rig.launch("f1", f"sleep 300 & echo $! > {pidfile}; exit 0"))
    grandchild = read_pid(pidfile)
    assert finished(runner, handle) == (True, 0)
    wait_for(lambda: gone(grandchild), what="the straggler to be killed")


# -- identity: pids, hosts ----------------------------------------------------------------------


def recycled(handle: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``handle`` as if its pid had been recycled by ``other``'s process."""
    return {**handle, "pid": other["pid"], "pgid": other["pgid"],
            "create_time": other["create_time"] - 1000.0}


def still_running(pid: int) -> bool:
    return not gone(pid)


def test_a_recycled_pid_is_never_signalled(rig: Rig) -> None:
    runner = LocalRunner(rig.work_dir, gpus=[])
    old = runner.start(rig.launch("old", "exit 0"))
    assert finished(runner, old) == (True, 0)
    other = runner.start(rig.launch("other", rig.wait_go("other")))
    stale = recycled(old, other)
    runner.terminate(stale)
    runner.kill(stale)
    with pytest.raises(psutil.TimeoutExpired):
        psutil.Process(other["pid"]).wait(timeout=0.5)
    assert runner.poll(other) == (False, None)
    rig.go("other").touch()
    assert finished(runner, other) == (True, 0)  # it ran to its end, untouched


def test_polling_a_recycled_pid_reports_finished_and_signals_nobody(rig: Rig) -> None:
    runner = LocalRunner(rig.work_dir, gpus=[])
    old = runner.start(rig.launch("old", "exit 0"))
    assert finished(runner, old) == (True, 0)
    # Another job now has the pid (and so the process group id) the old handle names.
    other = runner.start(rig.launch("other", rig.wait_go("other")))
    assert runner.poll(recycled(old, other)) == (True, 0)
    with pytest.raises(psutil.TimeoutExpired):
        psutil.Process(other["pid"]).wait(timeout=0.5)
    rig.go("other").touch()
    assert finished(runner, other) == (True, 0)


def test_adopt_refuses_a_handle_from_another_host(rig: Rig) -> None:
    first = LocalRunner(rig.work_dir, gpus=[0, 1, 2, 3])
    handle = first.start(rig.launch("h1", rig.wait_go("h1"), gpus=2))
    foreign = {**handle, "host": "not-" + socket.gethostname()}
    second = LocalRunner(rig.work_dir, gpus=[0, 1, 2, 3])
    assert second.adopt(foreign) is False
    # a refused handle reserves nothing
    big = second.start(rig.launch("h2", "exit 0", gpus=4))
    assert big["gpus"] == [0, 1, 2, 3]
    assert finished(second, big) == (True, 0)
    rig.go("h1").touch()
    assert finished(first, handle) == (True, 0)


# -- GPUs -----------------------------------------------------------------------------------------

ECHO_GPUS = 'echo "gpus=[${CUDA_VISIBLE_DEVICES-unset}]"'


def seen_gpus(rig: Rig, key: str) -> list[int] | None:
    """The CUDA_VISIBLE_DEVICES the job printed, as a list; None if it has not printed yet."""
    for line in rig.log(key).splitlines():
        if line.startswith("gpus=[") and line.endswith("]"):
            text = line[len("gpus=[") : -1]
            assert text != "unset", "CUDA_VISIBLE_DEVICES was not set at all"
            return [int(g) for g in text.split(",") if g]
    return None


def printed_gpus(rig: Rig, key: str) -> list[int]:
    return wait_for(lambda: (g := seen_gpus(rig, key)) is not None and (g,), what=key)[0]


def test_gpu_jobs_get_disjoint_devices_and_cpu_jobs_none(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the daemon's own view must not leak
    runner = LocalRunner(rig.work_dir, gpus=[0, 1, 2, 3])
    a = runner.start(rig.launch("g-a", f"{ECHO_GPUS}; {rig.wait_go('g-a')}", gpus=2))
    b = runner.start(rig.launch("g-b", f"{ECHO_GPUS}; {rig.wait_go('g-b')}", gpus=2))
    cpu = runner.start(rig.launch("g-cpu", f"{ECHO_GPUS}; {rig.wait_go('g-cpu')}", gpus=0))
    got_a, got_b = printed_gpus(rig, "g-a"), printed_gpus(rig, "g-b")
    assert len(got_a) == len(got_b) == 2
    assert not set(got_a) & set(got_b)
    assert set(got_a) | set(got_b) == {0, 1, 2, 3}
    assert (got_a, got_b) == (a["gpus"], b["gpus"])
    assert printed_gpus(rig, "g-cpu") == [] and cpu["gpus"] == []

    with pytest.raises(RuntimeError, match=r"needs 1 GPUs but only 0 of 4 are free"):
        runner.start(rig.launch("g-c", ECHO_GPUS, gpus=1))
    assert not os.path.exists(rig.log_path("g-c"))  # nothing was started

    rig.go("g-a").touch()
    assert finished(runner, a) == (True, 0)
    c = runner.start(rig.launch("g-c", f"{ECHO_GPUS}; {rig.wait_go('g-c')}", gpus=2))
    assert printed_gpus(rig, "g-c") == got_a  # exactly the GPUs the finished job freed
    for key, handle in (("g-b", b), ("g-c", c), ("g-cpu", cpu)):
        rig.go(key).touch()
        assert finished(runner, handle) == (True, 0)


def test_adopted_handles_keep_their_gpus(rig: Rig) -> None:
    handle = rig.start_elsewhere("ad", f"{ECHO_GPUS}; {rig.wait_go('ad')}", gpus=2)
    assert printed_gpus(rig, "ad") == handle["gpus"] == [0, 1]
    runner = LocalRunner(rig.work_dir, gpus=[0, 1, 2, 3])
    assert runner.adopt(handle)
    with pytest.raises(RuntimeError, match=r"needs 3 GPUs but only 2 of 4 are free"):
        runner.start(rig.launch("new3", ECHO_GPUS, gpus=3))
    two = runner.start(rig.launch("new2", f"{ECHO_GPUS}; {rig.wait_go('new2')}", gpus=2))
    assert printed_gpus(rig, "new2") == [2, 3]
    rig.go("ad").touch()
    assert finished(runner, handle) == (True, 0)  # the adopted attempt ends: its GPUs free up
    again = runner.start(rig.launch("again", ECHO_GPUS, gpus=2))
    assert printed_gpus(rig, "again") == [0, 1]
    assert finished(runner, again) == (True, 0)
    rig.go("new2").touch()
    assert finished(runner, two) == (True, 0)


@pytest.mark.parametrize("failure", ["nul-in-env", "log-path-is-a-directory"])
def test_a_start_that_fails_frees_its_gpus(rig: Rig, failure: str) -> None:
    runner = LocalRunner(rig.work_dir, gpus=[0, 1, 2, 3])
    if failure == "nul-in-env":  # a spec's env_vars may hold "\u0000": Popen raises ValueError
        bad = rig.launch("bad", "exit 0", gpus=2, BAD="a\0b")
    else:
        os.makedirs(rig.log_path("bad"))
        bad = rig.launch("bad", "exit 0", gpus=2)
    with pytest.raises((ValueError, OSError)):
        runner.start(bad)
    handle = runner.start(rig.launch("all", "exit 0", gpus=4))
    assert handle["gpus"] == [0, 1, 2, 3]
    assert finished(runner, handle) == (True, 0)


def test_starting_an_attempt_twice_adopts_the_first(tmp_path: Path) -> None:
    """A daemon that died between starting an attempt and recording it must not, once
    restarted, start that attempt a second time: attempts are named after (job, attempt)."""
    marker = tmp_path / "starts"
    launch = Launch(
        key="job.abc.1.run",
        command=f"echo start >> {marker}; sleep 30",
        env={},
        log_path=str(tmp_path / "log"),
    )
    first = LocalRunner(str(tmp_path / "work")).start(launch)
    restarted = LocalRunner(str(tmp_path / "work"))  # a new daemon, same work dir
    second = restarted.start(launch)
    try:
        assert second["pid"] == first["pid"]
        time.sleep(0.5)
        assert marker.read_text().count("start") == 1
        assert restarted.poll(second) == (False, None)
    finally:
        restarted.kill(second)
