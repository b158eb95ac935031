"""The local runner with real processes: status, restarts, process groups, pids, GPUs."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bastion.outputs.supervise import JOB_GROUP_FILE
from bastion.runners import base, launcher, localproc
from bastion.runners.base import Attempt, AttemptPhase, Observation, RunnerError
from bastion.runners.launcher import LAUNCHER_ARG
from bastion.runners.local import LocalRunner
from tests.harness import (
    REPO,
    PidNamespace,
    kill_all,
    kill_shared_supervisors,
    processes_with_env,
    unshare_refused,
    wait_for,
)

ROOT = "gs://bastion-test/local"
OTHER_ROOT = "gs://bastion-test/other"

# Starts one attempt from a separate Python process that exits at once, so the attempt lives on
# with no parent that can wait() for it: what a daemon killed with -9 leaves behind.
START_AND_EXIT = """
import json, sys
from bastion.runners.base import Attempt
from bastion.runners.local import LocalRunner
attempts_dir, root, name, command, gpus, tag = sys.argv[1:7]
runner = LocalRunner(attempts_dir, gpus=[0, 1, 2, 3], root=root)
attempt = Attempt(name=name, job=name, attempt=1, command=command,
                  env={"BASTION_TEST_TAG": tag}, resources={"gpu": int(gpus)})
print(json.dumps(runner.start(attempt)))
"""


def name_of(job: str, root: str = ROOT) -> str:
    return base.attempt_name(root, job, "sub", 1, "run")


class Rig:
    def __init__(self, tmp: Path, shared: bool = True) -> None:
        self.shared = shared
        self.tmp = tmp
        self.attempts_dir = str(tmp / "attempts")
        self.tag = os.urandom(8).hex()

    def runner(
        self,
        gpus: list[int] | None = None,
        root: str = ROOT,
        leftover_grace: float = 10.0,
        shared: bool | None = None,
    ) -> LocalRunner:
        return LocalRunner(
            self.attempts_dir,
            gpus=gpus or [],
            root=root,
            leftover_grace=leftover_grace,
            shared=self.shared if shared is None else shared,
        )

    def attempt(
        self, job: str, command: str, gpus: int = 0, root: str = ROOT, **env: str
    ) -> Attempt:
        return Attempt(
            name=name_of(job, root),
            job=job,
            attempt=1,
            command=command,
            env={"BASTION_TEST_TAG": self.tag, **env},
            resources={"gpu": gpus},
        )

    def dir(self, job: str, root: str = ROOT) -> Path:
        return Path(self.attempts_dir) / name_of(job, root)

    def log(self, job: str) -> str:
        path = self.dir(job) / "output"
        return path.read_text() if path.exists() else ""

    def go(self, key: str) -> Path:
        return self.tmp / f"go-{key}"

    def wait_go(self, key: str) -> str:
        """A command fragment that blocks until the test releases it."""
        return f"while [ ! -e {self.go(key)} ]; do sleep 0.02; done"

    def command_started(self, job: str) -> None:
        """Wait until the wrapper has started the job's command (it records the command's
        group then): a stop before that ends an attempt whose job never ran (LOST)."""
        group = self.dir(job) / JOB_GROUP_FILE
        wait_for(lambda: group.exists() and group.read_text().strip(), what=f"{job}'s command")

    def start_elsewhere(self, job: str, command: str, gpus: int = 0) -> dict[str, Any]:
        """Start an attempt from a process that exits right away; returns the handle."""
        script = [START_AND_EXIT, self.attempts_dir, ROOT, name_of(job), command, str(gpus)]
        return json.loads(run_python([sys.executable, "-c", *script, self.tag]))

    def processes(self) -> list[psutil.Process]:
        return processes_with_env("BASTION_TEST_TAG", self.tag)

    def close(self) -> None:
        kill_shared_supervisors(self.tmp)
        kill_all(self.processes())


def run_python(argv: list[str]) -> str:
    """What a separate Python process of this checkout prints (``argv``: its command line)."""
    return subprocess.run(
        argv,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def hold_claim(directory: Path) -> subprocess.Popen[bytes]:
    """Another process holding the attempt's claim, as a start frozen in its middle does;
    returns once it holds it (kill it to let go)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, time\n"
            f"fd = os.open({str(directory / '.claim')!r}, os.O_WRONLY | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('claimed', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"claimed"
    return holder


@pytest.fixture(params=[True, False], ids=["shared", "forked"])
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """Every behaviour holds with either supervisor (``[runners.local] supervisor``)."""
    r = Rig(tmp_path, shared=request.param)
    yield r
    r.close()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def supervised_pid(rig: Rig, job: str, handle: dict[str, Any]) -> int:
    """What a delete must end: the attempt's wrapper, or the job's shell when its supervisor
    is a shared one (which runs on for other attempts)."""
    if not handle.get("shared"):
        return int(handle["pid"])
    rig.command_started(job)
    return int((rig.dir(job) / JOB_GROUP_FILE).read_text())


def outcome(obs: Observation) -> tuple[AttemptPhase, int | None]:
    return obs.phase, obs.exit_code


def finished(runner: LocalRunner, handle: dict[str, Any]) -> tuple[AttemptPhase, int | None]:
    obs = wait_for(
        lambda: (o := runner.poll(handle)).finished and o, timeout=20, what="the attempt"
    )
    return outcome(obs)


def running(runner: LocalRunner, handle: dict[str, Any]) -> bool:
    return runner.poll(handle).phase == AttemptPhase.RUNNING


def read_pid(path: Path) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), what=str(path)))


def past() -> float:
    return time.time() - 1  # a stop deadline already reached: force


def future() -> float:
    return time.time() + 300


# -- lifecycle ----------------------------------------------------------------------------------


def test_start_then_poll_running_then_finished(rig: Rig) -> None:
    runner = rig.runner()
    handle = runner.start(rig.attempt("a1", f"echo hello; {rig.wait_go('a1')}; exit 5"))
    assert handle["name"] == name_of("a1")
    assert handle["host"] == socket.gethostname()
    assert os.getpgid(handle["pid"]) == handle["pid"]  # its own process group
    assert json.loads(json.dumps(handle)) == handle  # persisted in the state as JSON
    wait_for(lambda: "hello" in rig.log("a1"), what="output")
    assert running(runner, handle)
    rig.go("a1").touch()
    assert finished(runner, handle) == (AttemptPhase.FAILED, 5)
    assert outcome(runner.poll(handle)) == (AttemptPhase.FAILED, 5)  # asking again: the same answer
    assert runner.read_output(handle, 0, 1000) == b"hello\n"
    assert runner.read_output(handle, 2, 2) == b"ll"


def test_exit_status_of_a_running_attempt_survives_a_restart(rig: Rig) -> None:
    handle = rig.start_elsewhere("r1", f"echo started; {rig.wait_go('r1')}; exit 7")
    proc = psutil.Process(handle["pid"])
    assert proc.ppid() != os.getpid()  # nobody here can wait() for it
    runner = rig.runner(gpus=[0, 1, 2, 3])
    assert [(o.name, o.finished) for o in runner.list_owned()] == [(name_of("r1"), False)]
    assert runner.start(rig.attempt("r1", "exit 99"))["pid"] == handle["pid"]  # adopted
    assert running(runner, handle)
    rig.go("r1").touch()
    assert finished(runner, handle) == (AttemptPhase.FAILED, 7)
    assert rig.log("r1") == "started\n"


def test_exit_status_of_an_attempt_that_ended_while_nobody_watched(rig: Rig) -> None:
    handle = rig.start_elsewhere("r2", "echo bye; exit 9")
    wait_for(lambda: gone(handle["pid"]), what="the orphaned attempt to end")
    runner = rig.runner()
    assert [(o.name, o.finished) for o in runner.list_owned()] == [(name_of("r2"), True)]
    assert outcome(runner.poll(handle)) == (AttemptPhase.FAILED, 9)
    assert rig.log("r2") == "bye\n"


def test_stop_reaches_grandchildren_and_records_143(rig: Rig) -> None:
    runner = rig.runner()
    pidfile = rig.tmp / "gc.pid"
    handle = runner.start(rig.attempt("t1", f"sleep 300 & echo $! > {pidfile}; wait"))
    grandchild = read_pid(pidfile)
    # The job runs in a group of its own, apart from its wrapper (which must outlive it to
    # sync its outputs once more): the group the wrapper recorded
    job_group = int((Path(rig.attempts_dir) / handle["name"] / "job_pgid").read_text())
    assert os.getpgid(grandchild) == job_group != handle["pid"]
    runner.stop(handle, future())
    # checked before poll(): poll() itself SIGKILLs the group once the leader is gone
    wait_for(lambda: gone(grandchild), what="the grandchild to get SIGTERM")
    assert finished(runner, handle) == (AttemptPhase.FAILED, 128 + signal.SIGTERM)


def test_stop_at_the_deadline_kills_grandchildren_that_ignore_sigterm(rig: Rig) -> None:
    runner = rig.runner()
    pidfile = rig.tmp / "gc.pid"
    handle = runner.start(
        rig.attempt(
            "k1",
            f"trap '' TERM; (trap '' TERM; sleep 300) & echo $! > {pidfile}; "
            "while true; do sleep 0.05; done",
        )
    )
    grandchild = read_pid(pidfile)
    runner.stop(handle, future())
    runner.stop(handle, future())  # repeated before the deadline: nothing more
    time.sleep(0.3)
    assert running(runner, handle)  # SIGTERM is ignored all the way down
    assert not gone(grandchild)
    runner.stop(handle, past())
    wait_for(lambda: gone(grandchild), what="the grandchild to get SIGKILL")
    obs = wait_for(lambda: (o := runner.poll(handle)).finished and o, what="the attempt")
    # The wrapper killed the job at the deadline and lived on to sync and record it
    assert outcome(obs) == (AttemptPhase.FAILED, 128 + signal.SIGKILL)


def test_finish_kills_what_the_leader_left_behind(rig: Rig) -> None:
    runner = rig.runner()
    pidfile = rig.tmp / "gc.pid"
    handle = runner.start(rig.attempt("f1", f"sleep 300 & echo $! > {pidfile}; exit 0"))
    grandchild = read_pid(pidfile)
    assert finished(runner, handle) == (AttemptPhase.SUCCEEDED, 0)
    wait_for(lambda: gone(grandchild), what="the straggler to be killed")


# -- what an attempt leaves behind: processes that left its group and session ----------------------


def marked(job: str) -> list[psutil.Process]:
    """Processes carrying the attempt's marker: none may outlive its deletion."""
    return processes_with_env("BASTION_ATTEMPT_NAME", name_of(job))


def escaped_sleep(pidfile: Path, ignore_term: bool = False) -> str:
    """A command fragment: a ``sleep 300`` in a session of its own, its pid in ``pidfile``."""
    if ignore_term:  # an ignored signal stays ignored across exec
        return f"setsid sh -c \"trap '' TERM; exec sleep 300\" & echo $! > {pidfile}"
    return f"setsid sleep 300 & echo $! > {pidfile}"


def left_its_session(pidfile: Path) -> int:
    """The escaped process's pid, once it runs ``sleep`` in its own session."""
    pid = read_pid(pidfile)

    def settled() -> bool:
        try:
            return os.getsid(pid) == pid and psutil.Process(pid).name() == "sleep"
        except (OSError, psutil.Error):
            return False

    wait_for(settled, what="the escaped sleep")
    return pid


def test_a_stopped_attempt_ends_a_process_that_left_its_session_and_names_it(rig: Rig) -> None:
    """A stop signals the group; a `setsid` child is not in it and ran on after the attempt
    was recorded as ended. Now it is found by its marker once the command has ended."""
    runner = rig.runner()
    pidfile = rig.tmp / "escaped.pid"
    handle = runner.start(rig.attempt("s1", f"{escaped_sleep(pidfile)}; sleep 300"))
    escaped = left_its_session(pidfile)
    runner.stop(handle, future())
    obs = wait_for(lambda: (o := runner.poll(handle)).finished and o, what="the attempt")
    assert outcome(obs) == (AttemptPhase.FAILED, 128 + signal.SIGTERM)
    assert obs.note == f"killed 1 process left behind: sleep (pid {escaped})"
    assert runner.poll(handle).note == obs.note  # asked again: the same, noted once by the daemon
    wait_for(lambda: runner.delete(handle), timeout=10, what="delete to be verified")
    assert gone(escaped) and marked("s1") == []


def test_a_process_left_behind_by_a_command_that_exited_0_is_ended_with_it(rig: Rig) -> None:
    runner = rig.runner()
    pidfile = rig.tmp / "escaped.pid"
    handle = runner.start(
        rig.attempt("s2", f"{escaped_sleep(pidfile)}; {rig.wait_go('s2')}; exit 0")
    )
    escaped = left_its_session(pidfile)
    rig.go("s2").touch()
    obs = wait_for(lambda: (o := runner.poll(handle)).finished and o, what="the attempt")
    assert outcome(obs) == (AttemptPhase.SUCCEEDED, 0)
    assert obs.note == f"killed 1 process left behind: sleep (pid {escaped})"
    wait_for(lambda: gone(escaped), timeout=5, what="SIGTERM to end it")
    assert runner.delete(handle) is True and marked("s2") == []


def test_a_left_behind_process_that_ignores_sigterm_is_killed_after_the_grace(rig: Rig) -> None:
    runner = rig.runner(leftover_grace=1.5)
    pidfile = rig.tmp / "escaped.pid"
    handle = runner.start(rig.attempt("s3", f"{escaped_sleep(pidfile, ignore_term=True)}"))
    escaped = left_its_session(pidfile)
    obs = wait_for(lambda: (o := runner.poll(handle)).finished and o, what="the attempt")
    assert obs.note == f"killed 1 process left behind: sleep (pid {escaped})"
    assert runner.delete(handle) is False  # SIGTERM is ignored: not gone, not verified
    time.sleep(0.3)
    assert not gone(escaped)
    wait_for(lambda: runner.delete(handle), timeout=10, what="SIGKILL after the grace")
    assert gone(escaped) and marked("s3") == [] and not rig.dir("s3").exists()


def test_what_an_adopted_attempt_left_behind_is_ended_by_the_next_daemon(rig: Rig) -> None:
    """The daemon that started it is gone (kill -9): the marker still finds the escaped
    process; and a daemon killed between the end of the attempt and its deletion leaves
    the record that lets the next one finish the job and say what was killed."""
    pidfile = rig.tmp / "escaped.pid"
    handle = rig.start_elsewhere("s4", f"{escaped_sleep(pidfile)}; {rig.wait_go('s4')}")
    escaped = left_its_session(pidfile)
    rig.go("s4").touch()
    wait_for(lambda: gone(handle["pid"]), what="the adopted attempt to end")
    obs = wait_for(lambda: (o := rig.runner().poll(handle)).finished and o, what="the end")
    assert obs.note == f"killed 1 process left behind: sleep (pid {escaped})"
    restarted = rig.runner()
    assert restarted.poll(handle).note == obs.note
    wait_for(lambda: restarted.delete(handle), timeout=10, what="delete to be verified")
    assert gone(escaped) and marked("s4") == []


def test_a_runner_setting_for_the_leftover_grace_must_be_seconds(tmp_path: Path) -> None:
    from bastion.runners.local import from_settings

    settings = {"root": ROOT, "attempts_dir": str(tmp_path), "gpus": []}
    assert from_settings({**settings, "leftover_grace": 2}).leftover_grace == 2.0
    with pytest.raises(RunnerError, match=r"\[runners.local\] leftover_grace = 'soon'"):
        from_settings({**settings, "leftover_grace": "soon"})


@pytest.mark.parametrize("rig", [False], ids=["forked"], indirect=True)
def test_wrappers_are_forked_by_one_launcher_and_known_by_their_lock_after_a_restart(
    rig: Rig,
) -> None:
    runner = rig.runner()
    first = runner.start(rig.attempt("a", rig.wait_go("a")))
    second = runner.start(rig.attempt("b", rig.wait_go("b")))
    wrappers = [psutil.Process(h["pid"]) for h in (first, second)]
    assert wrappers[0].ppid() == wrappers[1].ppid() != os.getpid()  # one launcher, not us
    assert LAUNCHER_ARG in wrappers[0].cmdline()  # (its argv is the launcher's)
    restarted = rig.runner()  # a new daemon: it knows the wrapper by its lock
    assert running(restarted, first)
    rig.command_started("a")  # (a stop before it would end a job that never ran: LOST)
    restarted.stop(first, time.time() + 30)
    assert finished(restarted, first) == (AttemptPhase.FAILED, 143)
    rig.go("b").touch()
    assert finished(runner, second) == (AttemptPhase.SUCCEEDED, 0)


@pytest.mark.parametrize("rig", [False], ids=["forked"], indirect=True)
def test_a_launcher_that_died_is_replaced_and_its_wrappers_run_on(rig: Rig) -> None:
    runner = rig.runner()
    first = runner.start(rig.attempt("a", rig.wait_go("a")))
    launcher = psutil.Process(psutil.Process(first["pid"]).ppid())
    launcher.kill()
    launcher.wait(10)
    second = runner.start(rig.attempt("b", "exit 4"))
    assert psutil.Process(second["pid"]).ppid() not in (launcher.pid, os.getpid())
    assert finished(runner, second) == (AttemptPhase.FAILED, 4)
    assert running(runner, first)  # its wrapper outlived the launcher, as it outlives a daemon
    rig.go("a").touch()
    assert finished(runner, first) == (AttemptPhase.SUCCEEDED, 0)


@pytest.mark.parametrize("rig", [True], ids=["shared"], indirect=True)
def test_one_shared_supervisor_runs_every_attempt_and_a_restarted_runner_knows_each_by_its_lock(
    rig: Rig,
) -> None:
    runner = rig.runner()
    first = runner.start(rig.attempt("a", rig.wait_go("a")))
    second = runner.start(rig.attempt("b", rig.wait_go("b")))
    assert first["shared"] and second["shared"] and first["pid"] == second["pid"]
    supervisor = psutil.Process(first["pid"])
    argv = supervisor.cmdline()  # (the launcher's: ... bastion-launcher FD shared)
    assert argv[-3] == LAUNCHER_ARG and argv[-1] == launcher.SHARED_ARG
    restarted = rig.runner()  # a new daemon: it knows each attempt by its lock
    assert running(restarted, first) and running(restarted, second)
    rig.command_started("a")
    restarted.stop(first, time.time() + 30)
    assert finished(restarted, first) == (AttemptPhase.FAILED, 143)
    assert running(runner, second) and supervisor.is_running()  # the other runs on
    rig.go("b").touch()
    assert finished(runner, second) == (AttemptPhase.SUCCEEDED, 0)


@pytest.mark.parametrize("rig", [True], ids=["shared"], indirect=True)
def test_a_shared_supervisor_outlives_its_runner_until_its_last_attempt_ends(rig: Rig) -> None:
    runner = rig.runner()
    handle = runner.start(rig.attempt("a", rig.wait_go("a")))
    supervisor = psutil.Process(handle["pid"])
    runner.close()  # the daemon ends: the attempt runs on, supervised
    time.sleep(0.5)
    assert supervisor.is_running() and running(rig.runner(), handle)
    rig.go("a").touch()
    assert finished(rig.runner(), handle) == (AttemptPhase.SUCCEEDED, 0)
    supervisor.wait(10)  # (psutil.TimeoutExpired if it lingers once its attempts ended)


@pytest.mark.parametrize("rig", [True], ids=["shared"], indirect=True)
def test_a_killed_shared_supervisor_is_replaced_and_its_attempts_end_without_a_status(
    rig: Rig,
) -> None:
    """Its attempts' jobs outlive it, as a job outlives a killed wrapper: each attempt ends
    FAILED without a status (none recorded it), and what still runs of it is stopped."""
    runner = rig.runner(leftover_grace=0.5)
    first = runner.start(rig.attempt("a", rig.wait_go("a")))
    rig.command_started("a")
    supervisor = psutil.Process(first["pid"])
    supervisor.kill()
    supervisor.wait(10)
    second = runner.start(rig.attempt("b", "exit 4"))
    assert second["pid"] != first["pid"]
    assert finished(runner, second) == (AttemptPhase.FAILED, 4)
    obs = wait_for(lambda: (o := runner.poll(first)).finished and o, what="the first attempt")
    assert outcome(obs) == (AttemptPhase.FAILED, None)
    assert "killed before it could report" in obs.reason
    wait_for(lambda: runner.delete(first), timeout=10, what="its job stopped")
    assert not [p for p in rig.processes() if str(rig.go("a")) in " ".join(p.cmdline())]


@pytest.mark.parametrize("rig", [True], ids=["shared"], indirect=True)
def test_a_shared_attempt_told_to_stop_is_warned_and_killed_at_its_deadline(rig: Rig) -> None:
    """Told through its stop file (a signal would reach every attempt of the process): the
    job is warned, and killed once the deadline, moved earlier, has passed."""
    runner = rig.runner()
    handle = runner.start(rig.attempt("a", f"trap 'echo warned' TERM; {rig.wait_go('a')}"))
    rig.command_started("a")
    told = time.monotonic()
    runner.stop(handle, time.time() + 60)
    wait_for(lambda: b"warned" in runner.read_output(handle, 0, 1000), what="the warning")
    assert time.monotonic() - told < 0.9  # nudged to look now, not at its next look (1 s)
    assert running(runner, handle)
    runner.stop(handle, time.time() + 0.5)  # a cancel moves the deadline
    assert finished(runner, handle) == (AttemptPhase.FAILED, 128 + signal.SIGKILL)


@pytest.mark.parametrize("rig", [True], ids=["shared"], indirect=True)
def test_a_shared_supervisor_told_to_stop_stops_every_attempt_it_runs(rig: Rig) -> None:
    """A host shutting down signals the supervisor: each job is warned as a stop warns it,
    and each attempt ends with the job's own status, synced and recorded."""
    runner = rig.runner()
    command = "trap 'echo warned; exit 7' TERM; {}".format
    handles = [runner.start(rig.attempt(j, command(rig.wait_go(j)))) for j in ("a", "b")]
    for job in ("a", "b"):
        rig.command_started(job)
    os.kill(handles[0]["pid"], signal.SIGTERM)
    for handle in handles:
        assert finished(runner, handle) == (AttemptPhase.FAILED, 7)
        assert b"warned\n" in runner.read_output(handle, 0, 100)  # (after bash's "Terminated")
    psutil.Process(handles[0]["pid"]).wait(10)  # told to stop, it takes no more: it ended
    after = runner.start(rig.attempt("c", "exit 5"))  # with another supervisor
    assert after["pid"] != handles[0]["pid"]
    assert finished(runner, after) == (AttemptPhase.FAILED, 5)


def test_attempts_started_from_many_threads_at_once_each_get_their_own_answer(rig: Rig) -> None:
    """The effects pool starts a burst from many threads: each start's handle is its own
    attempt's (its output, its status), and each ran once."""
    runner = rig.runner()
    jobs = [f"t{i}" for i in range(24)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        handles = list(
            pool.map(lambda j: runner.start(rig.attempt(j, f"echo {j}; exit {len(j)}")), jobs)
        )
    for job, handle in zip(jobs, handles, strict=True):
        assert handle["name"] == name_of(job)
        assert int((rig.dir(job) / "pid").read_text()) == handle["pid"]
        assert finished(runner, handle) == (AttemptPhase.FAILED, len(job))
        assert runner.read_output(handle, 0, 100) == f"{job}\n".encode()


@pytest.mark.parametrize("rig", [True], ids=["shared"], indirect=True)
def test_a_storm_of_stop_nudges_leaves_the_shared_supervisor_answering(rig: Rig) -> None:
    """A thousand stops at once nudge it a thousand times, each nudge's handler run in its
    main thread: one that took a lock was run again while it held it, and the supervisor hung
    for good (no answer, no stop seen, never ended)."""
    runner = rig.runner()
    first = runner.start(rig.attempt("a", rig.wait_go("a")))
    rig.command_started("a")
    for _ in range(5000):
        os.kill(first["pid"], signal.SIGUSR1)
    second = runner.start(rig.attempt("b", "exit 3"))  # answered: its loop runs on
    assert second["pid"] == first["pid"]
    assert finished(runner, second) == (AttemptPhase.FAILED, 3)
    runner.stop(first, time.time() + 0.5)  # and its looker still sees a stop file
    assert finished(runner, first) == (AttemptPhase.FAILED, 143)


@pytest.mark.parametrize("rig", [True], ids=["shared"], indirect=True)
def test_a_bad_supervisor_setting_is_named(rig: Rig) -> None:
    from bastion.runners.local import from_settings

    settings = {"root": ROOT, "attempts_dir": rig.attempts_dir, "gpus": []}
    assert from_settings({**settings, "supervisor": "forked"}).starter._launcher.shared is False
    with pytest.raises(RunnerError, match=r"\[runners.local\] supervisor = 'one': give 'shared'"):
        from_settings({**settings, "supervisor": "one"})


def test_an_environment_too_large_for_the_launcher_but_not_for_exec_is_exec_d(rig: Rig) -> None:
    runner = rig.runner()
    big = {"BIG1": "x" * 100_000, "BIG2": "y" * 100_000}  # exec takes it; one message does not
    handle = runner.start(
        rig.attempt("a", f"{rig.wait_go('a')}; echo ${{#BIG1}} ${{#BIG2}}", **big)
    )
    assert psutil.Process(handle["pid"]).ppid() == os.getpid()
    rig.go("a").touch()
    assert finished(runner, handle) == (AttemptPhase.SUCCEEDED, 0)
    assert runner.read_output(handle, 0, 100) == b"100000 100000\n"


def test_records_written_at_once_by_two_threads_never_fail(tmp_path: Path) -> None:
    """A start writes handle.json while a look from another thread (the sweep's listing, the
    GPU ledger's), which found the wrapper by the pid the launcher wrote, writes it too."""
    path = str(tmp_path / "handle.json")
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(300):
                localproc.write_json(path, {"writer": n, "i": i})
        except BaseException as e:  # (reported below)
            errors.append(e)

    writers = [threading.Thread(target=write, args=(n,)) for n in range(2)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    assert not errors
    assert localproc.read_json(path)["i"] == 299
    assert os.listdir(tmp_path) == ["handle.json"]


def test_a_launcher_that_cannot_run_here_is_given_up_and_wrappers_are_exec_d(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher that dies before its first answer (here: one that exits at once) forked
    nothing: the start is tried again (TryAgain), and from then on every wrapper is exec'd,
    so the job runs, once."""
    monkeypatch.setattr(launcher, "_CODE", "import sys; sys.exit(3)")
    runner = rig.runner()
    attempt = rig.attempt("a", "echo ran")
    with pytest.raises(base.TryAgain, match="nothing was started"):
        runner.start(attempt)
    handle = runner.start(attempt)  # the daemon's retry
    assert finished(runner, handle) == (AttemptPhase.SUCCEEDED, 0)
    assert runner.read_output(handle, 0, 100) == b"ran\n"
    second = runner.start(rig.attempt("b", "true"))
    assert finished(runner, second) == (AttemptPhase.SUCCEEDED, 0)


@pytest.mark.parametrize("rig", [False], ids=["forked"], indirect=True)
def test_a_closed_runner_ends_its_launcher(rig: Rig) -> None:
    runner = rig.runner()
    handle = runner.start(rig.attempt("a", rig.wait_go("a")))
    launcher = psutil.Process(psutil.Process(handle["pid"]).ppid())
    runner.close()
    launcher.wait(10)  # (psutil.TimeoutExpired if it lingers)
    rig.go("a").touch()
    assert finished(rig.runner(), handle) == (AttemptPhase.SUCCEEDED, 0)


def test_without_the_launcher_each_wrapper_is_exec_d_and_a_bad_setting_is_named(rig: Rig) -> None:
    from bastion.runners.local import from_settings

    settings = {"root": ROOT, "attempts_dir": rig.attempts_dir, "gpus": []}
    runner = from_settings({**settings, "launcher": False})
    handle = runner.start(rig.attempt("a", f"{rig.wait_go('a')}; exit 3"))
    wrapper = psutil.Process(handle["pid"])
    assert wrapper.ppid() == os.getpid() and wrapper.cmdline()[-1] == str(rig.dir("a"))
    rig.go("a").touch()
    assert finished(runner, handle) == (AttemptPhase.FAILED, 3)
    with pytest.raises(RunnerError, match=r"\[runners.local\] launcher = 'yes': give true"):
        from_settings({**settings, "launcher": "yes"})


def marked_by(root: str) -> list[psutil.Process]:
    """Processes of any attempt of ``root`` (the daemon carries BASTION_ROOT, not the marker)."""
    found = []
    for proc in processes_with_env("BASTION_ROOT", root):
        with contextlib.suppress(psutil.Error):
            if "BASTION_ATTEMPT_NAME" in proc.environ():
                found.append(proc)
    return found


def test_a_cancelled_job_leaves_no_process_and_its_history_names_what_was_killed(
    local_bastion, tmp_path: Path
) -> None:
    pidfile = tmp_path / "escaped.pid"
    local_bastion.start()
    local_bastion.cli("launch", "--name=escaper", "--", f"{escaped_sleep(pidfile)}; sleep 300")
    escaped = left_its_session(pidfile)
    local_bastion.cli("cancel", "escaper")
    record = local_bastion.wait_complete("escaper")
    assert record["state"]["outcome"] == "CANCELLED"
    history = local_bastion.cli("history", "escaper").stdout
    assert f"killed 1 process left behind: sleep (pid {escaped})" in history
    wait_for(lambda: gone(escaped), timeout=10, what="the escaped sleep to end")
    wait_for(lambda: not marked_by(local_bastion.root), timeout=10, what="no marked process")


def test_a_job_that_exits_0_leaving_a_process_behind_has_it_ended_and_named(
    local_bastion, tmp_path: Path
) -> None:
    pidfile, go = tmp_path / "escaped.pid", tmp_path / "go"
    local_bastion.start()
    command = f"{escaped_sleep(pidfile)}; while [ ! -e {go} ]; do sleep 0.05; done; exit 0"
    local_bastion.cli("launch", "--name=leaver", "--", command)
    escaped = left_its_session(pidfile)
    go.touch()
    record = local_bastion.wait_complete("leaver")
    assert record["state"]["outcome"] == "SUCCEEDED"
    history = local_bastion.cli("history", "leaver").stdout
    assert f"killed 1 process left behind: sleep (pid {escaped})" in history
    wait_for(lambda: gone(escaped), timeout=10, what="the escaped sleep to end")
    wait_for(lambda: not marked_by(local_bastion.root), timeout=10, what="no marked process")


# -- delete ---------------------------------------------------------------------------------------


def test_delete_removes_a_finished_attempts_directory(rig: Rig) -> None:
    runner = rig.runner()
    handle = runner.start(rig.attempt("d1", "echo x; exit 0"))
    assert finished(runner, handle) == (AttemptPhase.SUCCEEDED, 0)
    assert rig.dir("d1").is_dir()
    assert runner.delete(handle) is True
    assert not rig.dir("d1").exists()
    assert runner.list_owned() == []
    assert runner.delete(handle) is True  # idempotent


def test_delete_of_a_running_attempt_kills_it_and_is_true_only_once_gone(rig: Rig) -> None:
    runner = rig.runner()
    pidfile = rig.tmp / "gc.pid"
    handle = runner.start(rig.attempt("d2", f"sleep 300 & echo $! > {pidfile}; wait"))
    grandchild = read_pid(pidfile)
    supervised = supervised_pid(rig, "d2", handle)
    assert runner.delete(handle) is False  # killed, not yet verified gone
    wait_for(lambda: runner.delete(handle), what="delete to be verified")
    assert gone(supervised) and not rig.dir("d2").exists()
    # SIGKILL was sent to the whole group; the kernel may take a moment to end the straggler
    wait_for(lambda: gone(grandchild), timeout=5, what="the grandchild to die")


# -- identity: pids, hosts, foreign processes ------------------------------------------------------


def recycled(handle: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``handle`` as if its pid had been recycled by ``other``'s process."""
    return {**handle, "pid": other["pid"], "create_time": other["create_time"] - 1000.0}


def test_a_recycled_pid_is_never_signalled(rig: Rig) -> None:
    runner = rig.runner()
    old = runner.start(rig.attempt("old", "exit 0"))
    assert finished(runner, old) == (AttemptPhase.SUCCEEDED, 0)
    other = runner.start(rig.attempt("other", rig.wait_go("other")))
    stale = recycled(old, other)
    runner.stop(stale, future())
    runner.stop(stale, past())
    with pytest.raises(psutil.TimeoutExpired):
        psutil.Process(other["pid"]).wait(timeout=0.5)
    assert running(runner, other)
    rig.go("other").touch()
    assert finished(runner, other) == (AttemptPhase.SUCCEEDED, 0)  # it ran to its end, untouched


def test_a_reaped_pid_reused_by_another_child_is_never_signalled(rig: Rig) -> None:
    """Our own children are looked up by attempt, not by pid alone."""
    runner = rig.runner()
    old = runner.start(rig.attempt("old", "exit 0"))
    other = runner.start(rig.attempt("other", rig.wait_go("other")))
    stale = {**old, "pid": other["pid"], "create_time": other["create_time"]}
    runner.stop(stale, past())
    # old's files go (once old's own "exit 0" has ended); other's process is not old's
    wait_for(lambda: runner.delete(stale), timeout=10, what="old to be deleted")
    with pytest.raises(psutil.TimeoutExpired):
        psutil.Process(other["pid"]).wait(timeout=0.5)
    assert running(runner, other)
    rig.go("other").touch()
    assert finished(runner, other) == (AttemptPhase.SUCCEEDED, 0)


def test_polling_a_recycled_pid_reports_finished_and_signals_nobody(rig: Rig) -> None:
    runner = rig.runner()
    old = runner.start(rig.attempt("old", "exit 0"))
    assert finished(runner, old) == (AttemptPhase.SUCCEEDED, 0)
    # Another job now has the pid (and so the process group id) the old handle names.
    other = runner.start(rig.attempt("other", rig.wait_go("other")))
    assert outcome(runner.poll(recycled(old, other))) == (AttemptPhase.SUCCEEDED, 0)
    with pytest.raises(psutil.TimeoutExpired):
        psutil.Process(other["pid"]).wait(timeout=0.5)
    rig.go("other").touch()
    assert finished(runner, other) == (AttemptPhase.SUCCEEDED, 0)


def test_a_forged_handle_naming_an_unrelated_process_never_signals_it(rig: Rig) -> None:
    """Issue 8 item 8: never signal a process the runner did not start, even when a handle
    names its real pid and create time (the process even leads its own group)."""
    runner = rig.runner()
    old = runner.start(rig.attempt("old", "exit 0"))
    assert finished(runner, old) == (AttemptPhase.SUCCEEDED, 0)
    stranger = subprocess.Popen(
        ["sleep", "60"], start_new_session=True, env={**os.environ, "BASTION_TEST_TAG": rig.tag}
    )
    try:
        created = psutil.Process(stranger.pid).create_time()
        forged = {**old, "pid": stranger.pid, "create_time": created}
        fresh = rig.runner()  # not its parent either
        for r in (runner, fresh):
            assert r.poll(forged).phase != AttemptPhase.RUNNING
            r.stop(forged, future())
            r.stop(forged, past())
        assert fresh.delete(forged) is True  # the attempt's files go, the stranger stays
        assert runner.delete(forged) is True
        assert not rig.dir("old").exists()
        time.sleep(0.3)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_handle_from_another_host_is_lost_and_never_touched(rig: Rig) -> None:
    runner = rig.runner(gpus=[0, 1, 2, 3])
    handle = runner.start(rig.attempt("h1", rig.wait_go("h1"), gpus=2))
    foreign = {**handle, "host": "not-" + socket.gethostname()}
    second = rig.runner(gpus=[0, 1, 2, 3])
    assert second.poll(foreign).phase == AttemptPhase.LOST
    second.stop(foreign, past())
    assert second.delete(foreign) is True  # nothing of it is on this host
    assert rig.dir("h1").is_dir() and running(runner, handle)
    rig.go("h1").touch()
    assert finished(runner, handle) == (AttemptPhase.SUCCEEDED, 0)


# -- never twice: a daemon killed between the start and handle.json -----------------------------


def counting(marker: Path) -> str:
    return f"echo start >> {marker}; sleep 60"


def starts(marker: Path) -> int:
    return marker.read_text().count("start") if marker.exists() else 0


def test_starting_an_attempt_twice_adopts_the_first(rig: Rig) -> None:
    marker = rig.tmp / "starts"
    first = rig.runner().start(rig.attempt("twice", counting(marker)))
    restarted = rig.runner()  # a new daemon, same attempts directory
    second = restarted.start(rig.attempt("twice", counting(marker)))
    assert second["pid"] == first["pid"]
    wait_for(lambda: starts(marker), what="the command to run")
    time.sleep(0.3)
    assert starts(marker) == 1
    assert running(restarted, second)


@pytest.mark.parametrize("lost", ["handle.json", "handle.json+pid"])
def test_killed_before_handle_json_adopts_the_running_process(rig: Rig, lost: str) -> None:
    """Issue 8 item 3: the daemon died after starting the process but before writing
    handle.json (and, worse, before the wrapper wrote its pid): a restarted daemon finds the
    process (by its pid file, else by its argv naming the attempt directory), never reruns it."""
    marker = rig.tmp / "starts"
    first = rig.runner().start(rig.attempt("k", counting(marker)))
    directory = rig.dir("k")
    wait_for(lambda: starts(marker), what="the command to run")
    for name in lost.split("+"):
        (directory / name).unlink()
    restarted = rig.runner()
    again = restarted.start(rig.attempt("k", counting(marker)))
    assert again["pid"] == first["pid"]
    assert again["create_time"] == pytest.approx(first["create_time"], abs=0.05)
    time.sleep(0.3)
    assert starts(marker) == 1
    assert running(restarted, again)
    assert [o.name for o in restarted.list_owned()] == [name_of("k")]
    supervised = supervised_pid(rig, "k", again)
    assert restarted.delete(again) is False
    wait_for(lambda: restarted.delete(again), what="delete of the adopted attempt")
    assert gone(supervised)


def test_a_claimed_attempt_that_never_ran_is_started_once(rig: Rig) -> None:
    """The directory exists, empty, and no process names it: killed after the claim, before the
    spawn. start() runs it now, and only once."""
    marker = rig.tmp / "starts"
    rig.dir("c").mkdir(parents=True)
    runner = rig.runner()
    owned = runner.list_owned()
    assert [(o.name, o.finished) for o in owned] == [(name_of("c"), True)]
    handle = runner.start(rig.attempt("c", counting(marker)))
    wait_for(lambda: starts(marker), what="the command to run")
    again = rig.runner().start(rig.attempt("c", counting(marker)))
    assert again["pid"] == handle["pid"]
    time.sleep(0.3)
    assert starts(marker) == 1
    assert running(runner, handle)


# -- roots --------------------------------------------------------------------------------------


def test_two_roots_in_one_attempts_dir_each_list_only_their_own(rig: Rig) -> None:
    mine, theirs = rig.runner(root=ROOT), rig.runner(root=OTHER_ROOT)
    a = mine.start(rig.attempt("same-job", "exit 0"))
    b = theirs.start(rig.attempt("same-job", "exit 0", root=OTHER_ROOT))
    assert a["name"] != b["name"]
    assert [o.name for o in mine.list_owned()] == [a["name"]]
    assert [o.name for o in theirs.list_owned()] == [b["name"]]
    assert finished(mine, a) == finished(theirs, b) == (AttemptPhase.SUCCEEDED, 0)


# -- GPUs -----------------------------------------------------------------------------------------

ECHO_GPUS = 'echo "gpus=[${CUDA_VISIBLE_DEVICES-unset}]"'


def seen_gpus(rig: Rig, job: str) -> list[int] | None:
    """The CUDA_VISIBLE_DEVICES the job printed, as a list; None if it has not printed yet."""
    for line in rig.log(job).splitlines():
        if line.startswith("gpus=[") and line.endswith("]"):
            text = line[len("gpus=[") : -1]
            assert text != "unset", "CUDA_VISIBLE_DEVICES was not set at all"
            return [int(g) for g in text.split(",") if g]
    return None


def printed_gpus(rig: Rig, job: str) -> list[int]:
    return wait_for(lambda: (g := seen_gpus(rig, job)) is not None and (g,), what=job)[0]


def test_gpu_jobs_get_disjoint_devices_and_cpu_jobs_none(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the daemon's own view must not leak
    runner = rig.runner(gpus=[0, 1, 2, 3])
    a = runner.start(rig.attempt("g-a", f"{ECHO_GPUS}; {rig.wait_go('g-a')}", gpus=2))
    b = runner.start(rig.attempt("g-b", f"{ECHO_GPUS}; {rig.wait_go('g-b')}", gpus=2))
    cpu = runner.start(rig.attempt("g-cpu", f"{ECHO_GPUS}; {rig.wait_go('g-cpu')}", gpus=0))
    got_a, got_b = printed_gpus(rig, "g-a"), printed_gpus(rig, "g-b")
    assert len(got_a) == len(got_b) == 2
    assert not set(got_a) & set(got_b)
    assert set(got_a) | set(got_b) == {0, 1, 2, 3}
    assert (got_a, got_b) == (a["gpus"], b["gpus"])
    assert printed_gpus(rig, "g-cpu") == [] and cpu["gpus"] == []

    with pytest.raises(RunnerError, match=r"needs 1 GPUs but only 0 of 4 are free"):
        runner.start(rig.attempt("g-c", ECHO_GPUS, gpus=1))
    assert not rig.dir("g-c").exists()  # nothing was started, nothing claimed
    assert name_of("g-c") not in [o.name for o in runner.list_owned()]

    rig.go("g-a").touch()
    assert finished(runner, a) == (AttemptPhase.SUCCEEDED, 0)
    c = runner.start(rig.attempt("g-c", f"{ECHO_GPUS}; {rig.wait_go('g-c')}", gpus=2))
    assert printed_gpus(rig, "g-c") == got_a  # exactly the GPUs the finished job freed
    for job, handle in (("g-b", b), ("g-c", c), ("g-cpu", cpu)):
        rig.go(job).touch()
        assert finished(runner, handle) == (AttemptPhase.SUCCEEDED, 0)


def test_adopted_attempts_keep_their_gpus(rig: Rig) -> None:
    handle = rig.start_elsewhere("ad", f"{ECHO_GPUS}; {rig.wait_go('ad')}", gpus=2)
    assert printed_gpus(rig, "ad") == handle["gpus"] == [0, 1]
    runner = rig.runner(gpus=[0, 1, 2, 3])  # a restarted daemon: finds "ad" running
    with pytest.raises(RunnerError, match=r"needs 3 GPUs but only 2 of 4 are free"):
        runner.start(rig.attempt("new3", ECHO_GPUS, gpus=3))
    two = runner.start(rig.attempt("new2", f"{ECHO_GPUS}; {rig.wait_go('new2')}", gpus=2))
    assert printed_gpus(rig, "new2") == [2, 3]
    rig.go("ad").touch()
    assert finished(runner, handle) == (AttemptPhase.SUCCEEDED, 0)  # it ends: its GPUs free up
    again = runner.start(rig.attempt("again", ECHO_GPUS, gpus=2))
    assert printed_gpus(rig, "again") == [0, 1]
    assert finished(runner, again) == (AttemptPhase.SUCCEEDED, 0)
    rig.go("new2").touch()
    assert finished(runner, two) == (AttemptPhase.SUCCEEDED, 0)


@pytest.mark.parametrize("failure", ["nul-in-env", "output-is-a-directory"])
def test_a_start_that_fails_frees_its_gpus(rig: Rig, failure: str) -> None:
    runner = rig.runner(gpus=[0, 1, 2, 3])
    if failure == "nul-in-env":  # a spec's env_vars may hold "\u0000": Popen raises ValueError
        bad = rig.attempt("bad", "exit 0", gpus=2, BAD="a\0b")
    else:
        (rig.dir("bad") / "output").mkdir(parents=True)
        bad = rig.attempt("bad", "exit 0", gpus=2)
    with pytest.raises((ValueError, OSError)):
        runner.start(bad)
    handle = runner.start(rig.attempt("all", "exit 0", gpus=4))
    assert handle["gpus"] == [0, 1, 2, 3]
    assert finished(runner, handle) == (AttemptPhase.SUCCEEDED, 0)


def test_an_attempt_being_started_by_another_process_is_not_started_again(rig: Rig) -> None:
    """A standby daemon on this host asks to start the attempt that a frozen holder is in the
    middle of starting (it holds the attempt's claim): the standby waits (TryAgain) and, once
    the claim is free, adopts what the holder started."""
    directory = rig.dir("claimed")
    directory.mkdir(parents=True)
    holder = hold_claim(directory)
    marker = rig.tmp / "claimed-ran"
    attempt = rig.attempt("claimed", f"echo ran >> {marker}; {rig.wait_go('claimed')}")
    try:
        with pytest.raises(base.TryAgain, match="being started by another process"):
            rig.runner().start(attempt)
        assert not marker.exists()
    finally:
        holder.kill()
        holder.wait()
    handle = rig.runner().start(attempt)  # the claim is free and nothing ran: it runs now
    again = rig.runner().start(attempt)
    assert again["pid"] == handle["pid"]
    rig.go("claimed").touch()
    wait_for(lambda: marker.exists(), what="the command")
    assert marker.read_text() == "ran\n"


def test_an_attempt_being_started_elsewhere_is_never_judged_ended(rig: Rig) -> None:
    """A frozen daemon holds an attempt's claim in the middle of its start (its directory
    made, no process yet). The daemon that took over must not list it as ended, nor poll it
    as lost: it would requeue the job while the frozen start can still run it (the chaos test
    saw that job run twice). Once the holder lets go without starting, it is ended."""
    directory = rig.dir("frozen")
    directory.mkdir(parents=True)
    holder = hold_claim(directory)
    runner = rig.runner()
    never_started = {"name": name_of("frozen"), "host": runner.host, "pid": 0, "create_time": 0}
    try:
        assert name_of("frozen") not in {o.name for o in runner.list_owned()}
        seen = runner.poll(never_started)
        assert seen.phase is AttemptPhase.PROVISIONING, seen
    finally:
        holder.kill()
        holder.wait()
    owned = {o.name: o for o in runner.list_owned()}
    assert owned[name_of("frozen")].finished
    assert runner.poll(never_started).phase is AttemptPhase.LOST


def test_a_handle_listed_before_its_start_finished_is_polled_as_what_started(rig: Rig) -> None:
    """A handle without a pid (listed while its directory was only claimed) is looked up
    again when polled: the attempt that started since runs, it is not 'never started'."""
    runner = rig.runner()
    handle = runner.start(rig.attempt("late", rig.wait_go("late")))
    stale = {"name": handle["name"], "host": handle["host"], "pid": 0, "create_time": 0}
    assert runner.poll(stale).phase is AttemptPhase.RUNNING
    rig.go("late").touch()
    assert finished(runner, handle) == (AttemptPhase.SUCCEEDED, 0)


# Polls or stops an attempt from inside a PID namespace (a daemon in a container): prints the
# phase and reason it sees.
FROM_INSIDE = """
import json, sys, time
from bastion.runners.local import LocalRunner
attempts_dir, root, what, handle = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
runner = LocalRunner(attempts_dir, gpus=[0, 1, 2, 3], root=root)
if what == "stop":
    runner.stop(handle, time.time() + 1)
    print("asked")
else:
    seen = runner.poll(handle)
    print(json.dumps([seen.phase.value, seen.reason]))
"""


@pytest.fixture
def namespace() -> Iterator[PidNamespace]:
    refused = unshare_refused()
    if refused:
        pytest.skip(refused)
    ns = PidNamespace()
    yield ns
    ns.close()


def _from_inside(rig: Rig, ns: PidNamespace, what: str, handle: dict[str, Any]) -> str:
    argv = [sys.executable, "-c", FROM_INSIDE, rig.attempts_dir, ROOT, what, json.dumps(handle)]
    return run_python(ns.enter(argv)).strip()


def test_a_wrapper_a_pid_namespace_cannot_see_is_running_there_until_it_ends(
    rig: Rig, namespace: PidNamespace
) -> None:
    """Started on the host, polled by a daemon in a container: its pids mean nothing there.
    Before, the attempt was judged ended ("killed before it could report its status", or
    "its wrapper ended before the command started") and requeued while it ran: the chaos
    test's j150 ran twice. The wrapper's liveness lock is seen from every namespace."""
    handle = rig.runner().start(rig.attempt("boxed", f"{rig.wait_go('boxed')}; echo ran"))
    seen = json.loads(_from_inside(rig, namespace, "poll", handle))
    assert seen[0] == AttemptPhase.RUNNING.value, seen
    rig.go("boxed").touch()
    wait_for(lambda: (rig.dir("boxed") / "exit").exists(), timeout=30, what="the job to end")
    wait_for(lambda: not localproc.held_alive(str(rig.dir("boxed"))), timeout=30, what="exit")
    seen = json.loads(_from_inside(rig, namespace, "poll", handle))
    assert seen[0] == AttemptPhase.SUCCEEDED.value, seen
    assert "ran" in rig.log("boxed")


def test_a_daemon_in_a_pid_namespace_stops_a_wrapper_it_cannot_see_through_its_stop_file(
    rig: Rig, namespace: PidNamespace
) -> None:
    handle = rig.runner().start(rig.attempt("stopped", "sleep 120"))
    rig.command_started("stopped")
    assert _from_inside(rig, namespace, "stop", handle) == "asked"
    wait_for(lambda: (rig.dir("stopped") / "exit").exists(), timeout=30, what="the stop")
    assert not rig.processes()
    seen = rig.runner().poll(handle)
    assert seen.phase is not AttemptPhase.RUNNING, seen


@pytest.mark.parametrize("launcher", [True, False], ids=["forked", "exec'd"])
def test_a_stop_right_after_the_start_stops_the_job_and_never_loses_the_attempt(
    rig: Rig, launcher: bool
) -> None:
    """The wrapper is known (its pid written) before it has set its handlers: a stop in that
    window killed it outright, and an attempt whose job was about to run was judged never
    started (LOST). Its stop signals are blocked until its handlers are set."""
    runner = LocalRunner(rig.attempts_dir, gpus=[], root=ROOT, launcher=launcher)
    handles = [runner.start(rig.attempt(f"quick{i}", "sleep 60")) for i in range(5)]
    for handle in handles:
        runner.stop(handle, future())
    assert [finished(runner, h) for h in handles] == [(AttemptPhase.FAILED, 143)] * 5


def test_a_started_wrapper_already_leads_its_own_process_group(rig: Rig) -> None:
    """The runner signals an attempt's group by the wrapper's pid: a forked wrapper that has
    not yet made its session when the start returns would lose that signal."""
    runner = rig.runner()
    handles = [runner.start(rig.attempt(f"g{i}", "sleep 60")) for i in range(20)]
    assert [os.getpgid(h["pid"]) for h in handles] == [h["pid"] for h in handles]
