"""The local runner: a job is ``bash -c COMMAND`` in its own session on the daemon's machine.

Each attempt owns a directory named after the attempt, in a directory shared by every daemon
of this root on this host (so a standby daemon in another work directory still finds what the
old holder started). Starting happens under an exclusive lock on the directory's ``.claim``:
the holder looks for an earlier start and, finding none, starts the process; anyone else waits
(next cycle) and then adopts it. Inside:

- ``launch.json``: written *before* the process starts (host, GPUs);
- ``pid``: written by the wrapper itself before it runs the command, so an attempt started just
  before a ``kill -9`` of the daemon (before ``handle.json`` was written) is still found, and a
  directory with no ``pid`` and no process naming it means the command never ran;
- ``handle.json``: pid and create time, recorded after the start;
- ``output``: the command's stdout and stderr, which the daemon reads by offset;
- ``exit``: the exit status, written by the wrapper, so a restarted daemon (no longer the
  parent, unable to ``wait``) still learns how an adopted attempt ended;
- ``left_behind``: what was still running when the wrapper had ended (the history line that
  names it, when its SIGKILL is due), so a restarted daemon finishes the job.

Every process of an attempt carries ``BASTION_ATTEMPT_NAME`` in its environment. A stop
signals the process group; whatever is still alive once the wrapper has ended is found by
that marker, gets SIGTERM, SIGKILL after ``leftover_grace``, and is named in the attempt's
history (bastion/runners/localremains.py); ``delete`` is true only once a fresh scan finds
none. How a wrapper is started (forked by the host's launcher, or exec'd):
bastion/runners/localstart.py.

Processes are identified by (pid, create time), so a recycled pid is never signalled. Runners
know nothing of quotas: they are told what to start and how many GPUs it may use; which GPUs,
the host's GPU ledger says (bastion/runners/gpus.py), shared with the Docker runner.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psutil

from bastion.outputs.checkpoint import read_checkpoint_time
from bastion.outputs.supervise import JOB_GROUP_FILE, STOP_FILE
from bastion.runners.base import (
    Attempt,
    AttemptPhase,
    Handle,
    Observation,
    Owned,
    Runner,
    RunnerError,
    TryAgain,
    name_prefix,
)
from bastion.runners.fence import fenced
from bastion.runners.gpus import GpuLedger, ledger_of
from bastion.runners.launcher import LAUNCHER_ARG, SHARED_ARG
from bastion.runners.localproc import (
    CREATE_TIME_TOLERANCE,
    being_claimed,
    claim,
    held_alive,
    is_wrapper,
    process_of,
    read_int,
    read_json,
    write_json,
)
from bastion.runners.localremains import Remains
from bastion.runners.localshared import LOOK_SIGNAL, SHARED_MARK
from bastion.runners.localstart import Starter

log = logging.getLogger(__name__)
# A start (a frozen daemon's, another daemon's on this host) holds the claim of an attempt that
# has no process yet: it is PROVISIONING. Judging it ended would requeue the job while that
# start can still run it: twice.
BEING_STARTED = "being started by another process"

# The wrapper (bastion/outputs/supervise.py) records its pid before the command runs, restores
# the job's outputs, runs the command in a process group of its own, syncs the outputs, warns
# the job on our SIGTERM and kills it at the stop's deadline, syncs once more, then records the
# exit status. It gets FINAL_SYNC_SECONDS past the deadline for that last sync before it is
# killed too.
FINAL_SYNC_SECONDS = 30.0
LEFTOVER_GRACE = 10.0  # seconds from SIGTERM to SIGKILL for what outlived the command
_OPTIONS: frozenset[str] = frozenset()  # the local runner takes no per-job options
SHARED, FORKED = "shared", "forked"  # [runners.local] supervisor


def detect_gpus() -> list[int]:
    """GPU indices reported by nvidia-smi, or [] on a machine without one."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [int(line) for line in out.split() if line.strip().isdigit()]


def default_attempts_dir(root_url: str) -> str:
    """Shared by every daemon of ``root_url`` on this host (see the module docstring)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    digest = hashlib.sha1(root_url.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(base, "bastion", "attempts", digest)


def from_settings(settings: Mapping[str, Any]) -> LocalRunner:
    """Settings: ``root`` (the daemon's root URL), ``attempts_dir`` (default: per root, in the
    user's state directory), ``gpus`` (indices this runner hands out; default: nvidia-smi),
    ``leftover_grace`` (seconds between the SIGTERM and the SIGKILL of what an attempt left
    running after its command ended; default 10), ``launcher`` (default true: wrappers are
    forked by one launcher process, bastion/runners/launcher.py; false: each is exec'd),
    ``supervisor`` (``"shared"``, the default: the launcher supervises every attempt itself,
    bastion/runners/localshared.py; ``"forked"``: it forks a wrapper for each; with
    ``launcher = false`` each attempt's wrapper is exec'd either way).
    ``gpu_ledger``: the host's GPU ledger, which the daemon's ``Runners`` hands to every
    runner (bastion/runners/gpus.py)."""
    root = str(settings.get("root") or "")
    attempts_dir = settings.get("attempts_dir") or default_attempts_dir(root)
    gpus = settings.get("gpus")
    grace = settings.get("leftover_grace", LEFTOVER_GRACE)
    launcher = settings.get("launcher", True)
    supervisor = settings.get("supervisor", SHARED)
    if supervisor not in (SHARED, FORKED):
        raise RunnerError(
            f"[runners.local] supervisor = {supervisor!r}: give {SHARED!r} (one process "
            f"supervises every attempt) or {FORKED!r} (a wrapper process forked for each)"
        )
    if not isinstance(launcher, bool):
        raise RunnerError(
            f"[runners.local] launcher = {launcher!r}: give true (wrappers forked by one "
            "launcher process) or false (each wrapper a new interpreter)"
        )
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
        raise RunnerError(
            f"[runners.local] leftover_grace = {grace!r}: give a number of seconds, 0 or more"
        )
    return LocalRunner(
        str(attempts_dir),
        gpus=None if gpus is None else list(gpus),
        root=root,
        leftover_grace=float(grace),
        ledger=ledger_of(settings),
        launcher=launcher,
        shared=supervisor == SHARED,
    )


class LocalRunner(Runner):
    accepted_options = _OPTIONS
    kind = "local"
    cheap_polls = True  # files and /proc

    def __init__(
        self,
        attempts_dir: str,
        gpus: Sequence[int] | None = None,
        root: str = "",
        leftover_grace: float = LEFTOVER_GRACE,
        ledger: GpuLedger | None = None,
        launcher: bool = True,
        shared: bool = True,
    ) -> None:
        self.attempts_dir = os.path.abspath(attempts_dir)  # wrappers' argv names it: one spelling
        self.prefix = name_prefix(root) if root else ""
        self.root = root
        self.host = socket.gethostname()
        self.gpus = list(detect_gpus() if gpus is None else gpus)
        # attempt -> (pid, creation time) of its wrapper, when known to be it (forked by the
        # launcher, or recognised once): no look at its command line or files on each poll
        self._known: dict[str, tuple[int, float]] = {}
        self.starter = Starter(self.attempts_dir, self.host, root, launcher, shared)
        self.ledger = ledger or GpuLedger()  # the host's GPUs, shared with other runners
        self.remains = Remains(self.prefix, self._dir, leftover_grace)
        os.makedirs(self.attempts_dir, exist_ok=True)
        self.ledger.join(self.kind, self._holding)  # a restarted daemon: live GPUs stay taken

    @property
    def leftover_grace(self) -> float:
        """Seconds from SIGTERM to SIGKILL for what outlived an attempt's command."""
        return self.remains.grace

    # -- the contract ----------------------------------------------------------------------

    def start(self, attempt: Attempt) -> Handle:
        unknown = set(attempt.options) - _OPTIONS
        if unknown:
            raise RunnerError(
                f"runner option(s) {', '.join(sorted(unknown))} are not understood by the local "
                "runner (it takes none); drop them or pick another runner kind"
            )
        with fenced(self.attempts_dir, attempt.fence):
            return self._start(attempt)

    def _start(self, attempt: Attempt) -> Handle:
        directory = self._dir(attempt.name)
        created = True
        try:
            os.mkdir(directory)
        except FileNotFoundError:
            os.makedirs(self.attempts_dir, exist_ok=True)
            os.mkdir(directory)
        except FileExistsError:
            created = False
        with claim(directory, attempt.name):
            # Under the claim, look again: whoever held it before us may have started it, even
            # when we made the directory (a start frozen between its mkdir and its claim).
            looked = not created or os.path.exists(os.path.join(directory, "launch.json"))
            found = self._find(attempt.name) if looked else None
            if found is not None:
                return found
            try:
                gpus = self.ledger.allocate(
                    attempt.name,
                    int(attempt.resources.get("gpu") or 0),
                    self.gpus,
                    where=self.host,
                )
            except (RunnerError, TryAgain):
                if created:  # leave no trace of an attempt that never started
                    shutil.rmtree(directory, ignore_errors=True)
                raise
            try:
                handle = self.starter.spawn(attempt, directory, gpus)
            except BaseException:
                self.ledger.free(attempt.name)  # nothing started: its GPUs stay free
                raise
            self._known[attempt.name] = (handle["pid"], handle["create_time"])
            return handle

    def poll(self, handle: Handle) -> Observation:
        if handle.get("host") != self.host:
            return Observation(
                AttemptPhase.LOST,
                f"it ran on host {handle.get('host')}, not on {self.host}",
                None,
                True,
            )
        checkpoint = read_checkpoint_time(os.path.join(self._dir(handle["name"]), "outputs"))
        if int(handle.get("pid") or 0) <= 0:  # listed before it started: look again
            found = self._find(handle["name"])
            if found is None and being_claimed(self._dir(handle["name"])):
                return Observation(AttemptPhase.PROVISIONING, BEING_STARTED)
            handle = found or handle
        if self._alive(handle):
            return Observation(AttemptPhase.RUNNING, checkpoint=checkpoint)
        self._finish(handle)
        left = self.remains.record(handle)
        if not left.get("pids"):
            self._free_gpus(handle["name"])
        note = str(left.get("note") or "")
        directory = self._dir(handle["name"])
        return _ended(directory, note, checkpoint)

    def stop(self, handle: Handle, deadline: float) -> None:
        if handle.get("host") != self.host or not self._alive(handle):
            return
        name = handle["name"]
        told = self.remains.note_deadline(name, deadline)  # (its leftovers' grace too)
        if time.time() >= deadline + FINAL_SYNC_SECONDS:
            self._kill(handle)  # the wrapper did not end the job and sync in time
        elif not self.remains.warned(name) or told != deadline:
            # The wrapper warns the job once and kills it at the deadline (told again when the
            # deadline moves: a cancel that forces an update's stop)
            self.remains.mark_warned(name)
            with contextlib.suppress(OSError):
                write_json(os.path.join(self._dir(name), STOP_FILE), {"deadline": deadline})
            self._signal(handle, signal.SIGTERM)

    def delete(self, handle: Handle) -> bool:
        if handle.get("host") != self.host:
            return True  # nothing of it is on this host
        if self._alive(handle):
            self._kill(handle)
            return False  # gone once the next call finds it dead
        self._finish(handle)
        if not self.remains.gone(handle):
            return False  # ended, not yet verified gone: asked again next cycle
        self._free_gpus(handle["name"])
        self.remains.forget(handle["name"])
        shutil.rmtree(self._dir(handle["name"]), ignore_errors=True)
        return not os.path.exists(self._dir(handle["name"]))

    def list_owned(self) -> list[Owned]:
        owned = []
        for name in sorted(os.listdir(self.attempts_dir)):
            if name.startswith(".") or not name.startswith(self.prefix):
                continue  # (.fence is the host's fencing token, never an attempt)
            handle = self._find(name)
            if handle is None and being_claimed(self._dir(name)):
                continue  # another process is starting it: listed once it has (or gave up)
            if handle is None:  # claimed, never started: nothing runs, only a directory
                handle = {"name": name, "host": self.host, "pid": 0, "create_time": 0}
            owned.append(Owned(name, handle, finished=not self._alive(handle)))
        return owned

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        try:
            with open(os.path.join(self._dir(handle["name"]), "output"), "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    # -- starting and finding ----------------------------------------------------------------

    def _dir(self, name: str) -> str:
        return os.path.join(self.attempts_dir, name)

    def close(self) -> None:
        self.starter.close()

    def _find(self, name: str) -> Handle | None:
        """The handle of an attempt whose command ran or runs; None if it never started."""
        directory = self._dir(name)
        recorded = read_json(os.path.join(directory, "handle.json"))
        if recorded is not None:
            return recorded
        launch = read_json(os.path.join(directory, "launch.json")) or {
            "name": name,
            "host": self.host,
            "gpus": [],
        }
        pid = read_int(os.path.join(directory, "pid"))
        proc = process_of(directory, pid)
        if proc is None and pid is None:
            return None
        if proc is None and os.path.exists(os.path.join(directory, "exit")) is False and pid:
            handle = {**launch, "pid": pid, "create_time": 0.0}  # ran, gone, no status: killed
        else:
            handle = {
                **launch,
                "pid": proc.pid if proc else pid,
                "create_time": proc.create_time() if proc else 0.0,
            }
        if os.path.exists(os.path.join(directory, SHARED_MARK)):
            handle["shared"] = True
        write_json(os.path.join(directory, "handle.json"), handle)
        return handle

    # -- processes ---------------------------------------------------------------------------

    def _alive(self, handle: Handle) -> bool:
        """The wrapper lives: seen here, or holding its liveness lock from a PID namespace
        this process cannot see into (then it is stopped through its stop file). A shared
        supervisor outlives the attempt: only its lock says whether the attempt runs."""
        if handle.get("shared"):
            return held_alive(self._dir(handle["name"]))
        return self._wrapper_pid(handle) > 0 or held_alive(self._dir(handle["name"]))

    def _wrapper_pid(self, handle: Handle) -> int:
        """The pid of the attempt's live wrapper here, 0 when none: the handle's pid when it
        is our child or its process is the wrapper, else the wrapper found by its command line.
        The pid may be another PID namespace's (a daemon in a container started the attempt
        and this one, outside it, adopted it), or a recycled one (another attempt's wrapper
        now holds it): only the process found is ever signalled, never the handle's pid."""
        pid = int(handle.get("pid") or 0)
        if pid <= 0:
            return 0
        name = handle["name"]
        child = self.starter.children.get(name)
        if child is not None and child.pid == pid:
            return pid if child.poll() is None else 0  # our own child: no psutil lookup
        directory = self._dir(name)
        try:
            proc = psutil.Process(pid)
            created = proc.create_time()
            same = abs(created - float(handle["create_time"])) <= CREATE_TIME_TOLERANCE
            # Not our child: only this attempt's wrapper counts as ours (one we started or
            # already recognised is known by its pid and creation time)
            if same and (self._known.get(name) == (pid, created) or is_wrapper(proc, directory)):
                self._known[name] = (pid, created)
                return pid if proc.status() != psutil.STATUS_ZOMBIE else 0
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        if os.path.exists(os.path.join(directory, "exit")):
            return 0  # the command ended (its wrapper wrote this): no scan needed
        wrapper = process_of(directory, None)
        with contextlib.suppress(psutil.Error):
            if wrapper is not None and wrapper.status() != psutil.STATUS_ZOMBIE:
                return wrapper.pid
        return 0

    def _signal(self, handle: Handle, sig: int) -> None:
        """A wrapper's own. A shared supervisor's stop signals are every attempt's: it is
        told through the stop file, and only nudged to look at it now."""
        if handle.get("shared"):
            self._nudge(handle)
            return
        pid = self._wrapper_pid(handle)
        if pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    def _kill(self, handle: Handle) -> None:
        """SIGKILL the wrapper's group and, while the wrapper lives (so the group is still
        the job's), the job's own group."""
        directory = self._dir(handle["name"])
        job_group = read_int(os.path.join(directory, JOB_GROUP_FILE))
        if handle.get("shared"):  # its supervisor, which others share, is never killed
            self._kill_shared(handle, directory, job_group)
            return
        if self._wrapper_pid(handle) <= 0:
            if held_alive(directory):  # alive where its pids mean nothing here: its wrapper
                with contextlib.suppress(OSError):  # kills its job at this deadline
                    write_json(os.path.join(directory, STOP_FILE), {"deadline": time.time()})
            return
        if job_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job_group, signal.SIGKILL)
        self._signal(handle, signal.SIGKILL)

    def _nudge(self, handle: Handle) -> None:
        """``LOOK_SIGNAL`` to the attempt's shared supervisor, known by its pid and creation
        time and command line (a recycled pid is never signalled; from another PID namespace, or
        gone, it is not sent: the supervisor looks within a second anyway)."""
        try:
            proc = psutil.Process(int(handle["pid"]))
            if abs(proc.create_time() - float(handle["create_time"])) > CREATE_TIME_TOLERANCE:
                return
            if proc.cmdline()[-3:] != [LAUNCHER_ARG, proc.cmdline()[-2], SHARED_ARG]:
                return  # (its default action ends a process: only ever to a supervisor)
            os.kill(proc.pid, LOOK_SIGNAL)
        except (psutil.Error, OSError, KeyError, TypeError, ValueError):
            pass

    def _kill_shared(self, handle: Handle, directory: str, job_group: int | None) -> None:
        """While the attempt runs (its group is the job's): SIGKILL the job's group, and
        tell its supervisor the deadline is now (it ends the attempt, syncs, lets go)."""
        if not held_alive(directory):
            return
        with contextlib.suppress(OSError):
            write_json(os.path.join(directory, STOP_FILE), {"deadline": time.time()})
        self._nudge(handle)
        if job_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job_group, signal.SIGKILL)

    def _finish(self, handle: Handle) -> None:
        """The leader is gone: forget our child (what it left behind: :class:`Remains`)."""
        pid = int(handle.get("pid") or 0)
        children = self.starter.children
        child = children.get(handle.get("name", ""))
        if child is not None and child.pid == pid:
            del children[handle["name"]]
        self._known.pop(handle.get("name", ""), None)

    def _free_gpus(self, name: str) -> None:
        """Only once nothing of the attempt runs: a process it left behind may hold them."""
        self.ledger.free(name)

    def _holding(self) -> list[tuple[str, list[int]]]:
        """For the ledger: the GPUs of this root's attempts that still run here."""
        return [
            (owned.name, list(owned.handle.get("gpus") or []))
            for owned in self.list_owned()
            if not owned.finished
        ]


def _ended(directory: str, note: str, checkpoint: float | None) -> Observation:
    """An attempt whose wrapper is gone, from what it left in its directory."""
    code = read_int(os.path.join(directory, "exit"))
    if code == 0:
        return Observation(AttemptPhase.SUCCEEDED, "exited with status 0", 0, note=note)
    if code is None and read_int(os.path.join(directory, JOB_GROUP_FILE)) is None:
        # Its wrapper died before it ran the command (restoring outputs, or killed with its
        # container): the job never ran, so it is no failure of the job's; requeued.
        gone = "its wrapper ended before the command started"
        return Observation(AttemptPhase.LOST, gone, None, True, note=note)
    if code is None:
        killed = "was killed before it could report its status"
        return Observation(AttemptPhase.FAILED, killed, note=note, checkpoint=checkpoint)
    reason = f"exited with status {code}"
    return Observation(AttemptPhase.FAILED, reason, code, note=note, checkpoint=checkpoint)
