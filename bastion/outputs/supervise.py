"""The local runner's wrapper: the process that supervises one attempt's command.

Started by :class:`bastion.runners.local.LocalRunner` as ``python -c <import and main()>
bastion-job:<attempt> COMMAND DIRECTORY`` in a session of its own, so it outlives the daemon
(a restarted daemon adopts the attempt by DIRECTORY, the last argument); or, by default, run
in a thread of the local runner's shared supervisor (bastion/runners/localshared.py), which
writes the ``pid`` file for it and tells it to stop only through the stop file. In order:

1. ``DIRECTORY/pid``: its own pid, before anything else (a daemon killed right after the
   fork still finds the attempt). Its stop signals come blocked (:func:`stop_signals_held`,
   around the fork) and are taken once its handlers are set: a stop that came first is
   handled as in 4, never fatal to a wrapper whose job has yet to start.
2. Restores ``$BASTION_OUTPUT_DIR`` from ``$BASTION_OUTPUT_URL`` (the bucket's
   ``ROOT/outputs/<job>/``); a restore that keeps failing fails the attempt with the reason
   rather than start the job without its checkpoint.
3. Runs ``bash -c COMMAND`` in a process group of its own, syncing the directory back every
   ``$BASTION_SYNC_SECONDS`` (5) in a thread.
4. On SIGTERM (the runner's stop: its deadline is in ``DIRECTORY/stop``) or SIGINT/SIGHUP, it
   warns the job with ``$BASTION_STOP_SIGNAL`` (TERM), waits until the deadline (else
   ``$BASTION_GRACE_SECONDS``), then SIGKILLs the job's group. The job is in a group of its
   own precisely so that this process is not killed with it: the final sync runs after the
   job has ended, so a file the job finished before its grace ran out is never lost. After a
   stop "ended" means the whole group, not the shell: ``cd src && python train.py`` loses its
   shell to the warning at once while python is still saving.
5. Final sync, the attempt's summary, then ``DIRECTORY/exit`` (the status, as a shell gives
   it: 128 + signal for a signal), and it exits with that status.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from bastion.outputs.syncer import SYNC_SECONDS, Periodic, Syncer

if TYPE_CHECKING:
    from bastion.bucket.store import Store

STOP_FILE = "stop"  # {"deadline": epoch seconds}, written by the runner before its SIGTERM
JOB_GROUP_FILE = "job_pgid"  # the job's process group, for the runner's last resort
RESTORE_TRIES = 4
DEFAULT_GRACE = 30.0
GROUP_KILL_WAIT = 5.0  # after the deadline's SIGKILL, for a group that still lists members
# While the job runs, how often the wrapper looks for the stop file that a daemon which cannot
# signal it writes: each look wakes the process (1,000 wrappers looking 5 times a second took a
# fifth of a core). Once stopping, how often it looks at the stop's deadline.
LOOK_SECONDS = 1.0
STOPPING_LOOK_SECONDS = 0.2
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Blocks the stop signals in this thread while a wrapper is forked or exec'd from it.
    The wrapper inherits the mask and takes them once its handlers are set (:func:`main`).
    Its pid is known, and a stop may come, from the moment it exists: without this, a stop
    in that window killed it outright, and an attempt whose job was about to run was judged
    never started."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def wrapper_argv(name: str, command: str, directory: str) -> list[str]:
    """The command line the local runner starts: ``-c`` second, DIRECTORY last (how the
    runner recognises its wrapper among processes)."""
    code = "from bastion.outputs.supervise import main; main()"
    return [sys.executable, "-c", code, f"bastion-job:{name}", command, directory]


class Supervisor:
    """One attempt's command, supervised (steps 2 to 5 above). A wrapper runs one in its main
    thread; the shared supervisor (bastion/runners/localshared.py) runs one per attempt in a
    thread of its own and hands each its ``cwd``, its ``stdio`` (stdin and output
    descriptors: the process's own are not the attempt's) and ``store_of`` (one bucket
    client per root for all its attempts) and ``look_seconds``: how often it looks at the stop
    file while no stop was asked (a shared supervisor's runner nudges it to look at once,
    so it looks rarely). Asked to stop without a signal (the stop file),
    it reads the stop's deadline again while it stops: a cancel can move it earlier."""

    def __init__(
        self,
        command: str,
        directory: str,
        env: dict[str, str],
        cwd: str | None = None,
        stdio: tuple[int, int] | None = None,
        store_of: Callable[[str], Store] | None = None,
        look_seconds: float = LOOK_SECONDS,
    ) -> None:
        self.command = command
        self.directory = directory
        self.env = env
        self.cwd = cwd
        self.stdio = stdio
        self.store_of = store_of
        self.look_seconds = look_seconds  # at the stop file, while no stop was asked
        self.child: subprocess.Popen[bytes] | None = None
        self.periodic: Periodic | None = None  # the syncs while the job runs
        self.stop_asked_at: float | None = None
        self.deadline: float | None = None
        self.syncer: Syncer | None = None

    # -- signals ---------------------------------------------------------------------------

    def on_signal(self, signum: int, _frame: Any) -> None:
        """The runner asked the attempt to stop: warn the job once, note the deadline (asked
        again, only the deadline is read again: a second warning means "now" to many jobs)."""
        if self.stop_asked_at is not None:
            self.deadline = self._deadline(self.stop_asked_at)
            return
        self.stop_asked_at = time.time()
        self.deadline = self._deadline(self.stop_asked_at)
        self._signal_job(stop_signal(self.env))

    @property
    def _stop_file(self) -> str:
        return os.path.join(self.directory, STOP_FILE)

    def _deadline(self, now: float) -> float:
        with (
            contextlib.suppress(OSError, ValueError, TypeError, KeyError),
            open(self._stop_file) as f,
        ):
            return float(json.load(f)["deadline"])
        try:
            return now + float(self.env.get("BASTION_GRACE_SECONDS") or DEFAULT_GRACE)
        except ValueError:
            return now + DEFAULT_GRACE

    def say(self, text: str) -> None:
        """A line of the supervisor's own in the attempt's output."""
        if self.stdio is None:
            print(text, flush=True)
            return
        with contextlib.suppress(OSError):
            os.write(self.stdio[1], f"{text}\n".encode())

    def _signal_job(self, sig: int) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, sig)

    # -- the attempt -----------------------------------------------------------------------

    def restore(self) -> str | None:
        """Restore the outputs; the reason it could not, or None."""
        out_dir, root = self.env.get("BASTION_OUTPUT_DIR"), self.env.get("BASTION_ROOT")
        if not out_dir or not root or not self.env.get("BASTION_OUTPUT_URL"):
            return None  # no outputs for this attempt (a daemon that gives none)
        from bastion.bucket.store import Store

        store_of = self.store_of or Store
        error = ""
        for attempt in range(RESTORE_TRIES):
            try:
                self.syncer = Syncer(
                    store_of(root).outputs,
                    self.env.get("BASTION_JOB_NAME", ""),
                    out_dir,
                    worker=0,
                    attempt=int(self.env.get("BASTION_ATTEMPT") or 0),
                )
                self.syncer.stats.purpose = self.env.get("BASTION_PURPOSE") or "run"
                self.syncer.restore()
                return None
            except Exception as e:  # the bucket is down: a few tries, then the attempt fails
                error = f"{type(e).__name__}: {e}"
                time.sleep(min(2.0**attempt, 8.0))
        return (
            f"bastion: could not restore {self.env.get('BASTION_OUTPUT_URL')} into "
            f"{out_dir} ({error}); the job was not started without its outputs"
        )

    def run(self) -> int:
        problem = self.restore()
        if problem:
            self.say(problem)
            return 1
        env = {**self.env}
        stdio: dict[str, Any] = {}
        if self.stdio is not None:
            stdio = {"stdin": self.stdio[0], "stdout": self.stdio[1], "stderr": self.stdio[1]}
        self.child = subprocess.Popen(
            ["bash", "-c", self.command], env=env, process_group=0, cwd=self.cwd, **stdio
        )
        _write(os.path.join(self.directory, JOB_GROUP_FILE), str(self.child.pid))
        if self.stop_asked_at is not None:  # asked to stop while restoring
            self._signal_job(stop_signal(self.env))
        status = self._wait()
        if self.periodic is not None:
            self.periodic.stop()
        if self.syncer is not None:
            self.syncer.sync(final=True)
            self.syncer.write_summary()
        return status

    def _wait(self) -> int:
        assert self.child is not None
        killed = False  # the job's group got SIGKILL at the deadline
        period = sync_seconds(self.env)
        sync_from = time.monotonic() + period if self.syncer is not None else math.inf
        with ExitWatch(self.child) as watch:
            while (code := watch.wait(self._look(sync_from))) is None:
                if self.periodic is None and time.monotonic() >= sync_from:
                    self.periodic = Periodic(self.syncer, period).start(first=0.0)
                self.look_for_a_stop()
                killed = self._kill_at_deadline(killed, time.time())
        if self.stop_asked_at is not None:
            self._until_the_group_ends(killed)
        return 128 - code if code < 0 else code

    def look_for_a_stop(self) -> None:
        """A stop asked without a signal: by a daemon in another PID namespace, which cannot
        signal what it cannot see, or any stop of a shared supervisor's attempt (signals
        are the whole process's). Once stopping, the deadline is read again (moved earlier
        by a cancel; a signal would have said so)."""
        if self.stop_asked_at is None:
            if os.path.exists(self._stop_file):
                self.on_signal(signal.SIGTERM, None)
        else:
            self.deadline = self._deadline(self.stop_asked_at)

    def _look(self, sync_from: float) -> float:
        """Seconds until the next look: at the stop file, the deadline, and once, when the
        job has outlived a sync period, to start the periodic syncs. Started then, not with
        the job: most jobs of a burst have ended by then, and a thread started per attempt
        waits for the new thread to run (under a shared supervisor's busy GIL, a switch
        interval or more)."""
        look = self.look_seconds if self.stop_asked_at is None else STOPPING_LOOK_SECONDS
        if self.periodic is None:
            look = min(look, max(0.0, sync_from - time.monotonic()))
        return look

    def _kill_at_deadline(self, killed: bool, now: float) -> bool:
        """SIGKILL the job's group once the stop's deadline has passed; whether it was."""
        if not killed and self.deadline is not None and now >= self.deadline:
            self._signal_job(signal.SIGKILL)
            return True
        return killed

    def _until_the_group_ends(self, killed: bool) -> None:
        """Asked to stop, the shell may end before the programs under it: ``bash -c "cd src &&
        python train.py"`` has no handler of its own and dies of the warning at once, while
        python saves its checkpoint. The group is the job: the final sync waits for all of it,
        until the deadline (then SIGKILL), so what they wrote in their grace is synced. A group
        that outlives a SIGKILL (members this process may not signal, zombies nobody reaps)
        is waited for GROUP_KILL_WAIT seconds more, no longer."""
        assert self.child is not None
        given_up_at: float | None = None
        while _group_alive(self.child.pid):
            self.look_for_a_stop()
            now = time.time()
            killed = self._kill_at_deadline(killed, now)
            if killed:
                given_up_at = given_up_at or now + GROUP_KILL_WAIT
                if now >= given_up_at:
                    return
            time.sleep(0.1)


class ExitWatch:
    """Sleeps until the job's shell exits or a timeout passes, woken by the exit itself.

    Why: ``Popen.wait(timeout)`` polls (sleeps of 0.5 ms doubling to 50 ms): 45 wake-ups a
    second for a job that runs for days. Measured on 1,000 running local jobs: their wrappers
    took 1.4 cores of this 2-core host. A pidfd (Linux 5.3) becomes readable when the process
    ends, so the wrapper wakes only for its own look at the stop file (``LOOK_SECONDS``).
    Where there is none (not Linux, an old kernel), Popen's polling remains."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        self._fd: int | None = None
        self._poll: select.poll | None = None
        try:
            self._fd = os.pidfd_open(child.pid)  # (a zombie has one too: it is our child)
        except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
            return
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)

    def __enter__(self) -> ExitWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def wait(self, timeout: float) -> int | None:
        """The shell's status once it has ended (reaped), or None after ``timeout`` s. A
        signal handled meanwhile does not cut the wait short (PEP 475)."""
        if self._poll is None:
            try:
                return self.child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        if not self._poll.poll(max(1, round(timeout * 1000))):
            return None
        return self.child.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal: still the job's
        return True
    return True


def stop_signal(env: dict[str, str]) -> int:
    name = (env.get("BASTION_STOP_SIGNAL") or "TERM").upper().removeprefix("SIG")
    return int(getattr(signal, f"SIG{name}", signal.SIGTERM))


def sync_seconds(env: dict[str, str]) -> float:
    try:
        return max(0.2, float(env.get("BASTION_SYNC_SECONDS") or SYNC_SECONDS))
    except ValueError:
        return SYNC_SECONDS


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> None:
    """``argv``: ``[-c, bastion-job:<attempt>, COMMAND, DIRECTORY]`` (``sys.argv``)."""
    args = sys.argv if argv is None else argv
    command, directory = args[-2], args[-1]
    _write(os.path.join(directory, "pid"), str(os.getpid()))
    supervisor = Supervisor(command, directory, dict(os.environ))
    for sig in STOP_SIGNALS:
        signal.signal(sig, supervisor.on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # (a stop that came first: now)
    status = run_to_the_end(supervisor)
    sys.stdout.flush()
    os._exit(status)


def run_to_the_end(supervisor: Supervisor) -> int:
    """Run the attempt and record its status in ``exit``, whatever happens: without one the
    daemon would wait for it. The status."""
    try:
        status = supervisor.run()
    except BaseException as e:
        supervisor.say(f"bastion: the attempt's wrapper failed: {type(e).__name__}: {e}")
        status = 1
    _write(os.path.join(supervisor.directory, "exit"), str(status))
    return status
