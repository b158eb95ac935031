"""Every process an attempt started, found by the environment marker it inherited.

A job can leave its process group and its session (``setsid``, a server that daemonizes,
``nohup ... &`` in a subshell): a signal to its group no longer reaches it, and when its
parent dies it is reparented to init, out of reach of ``wait``. What it does not shed by
accident is its environment: every process an attempt starts inherits
``BASTION_ATTEMPT_NAME=<attempt>`` (set by the local runner's wrapper and by the agent), and
``/proc/<pid>/environ`` keeps the environment a process was started with, so a scan of
``/proc`` finds them all, on a restarted daemon too. A process started with ``env -i`` or
``env -u BASTION_ATTEMPT_NAME`` on purpose is not found (nor is one that the job hands to
another service, such as ``systemd-run`` or a container engine).

The process group stays the first reach (one signal ends a well-behaved job and its
children, within the job's grace); the marker catches what is still alive once the attempt's
main process has ended: SIGTERM, then SIGKILL after a grace, then a fresh scan that must find
nothing before the attempt counts as gone.

Why not a cgroup (which would also catch ``env -i``): putting each attempt in a cgroup of
its own needs a cgroup v2 subtree the daemon may write, that is root, or a subtree systemd
delegated to the daemon's unit (``Delegate=yes``). The daemon normally runs as a user, under
systemd (which owns the rest of the tree) or in a container (``/sys/fs/cgroup`` read-only);
hybrid hosts mount v2 without controllers beside v1 (the machine these tests run on has it at
``/sys/fs/cgroup/unified``, writable by root alone). It would be a second mechanism that only
some daemons get and only root can test, while the marker works for every daemon and is
verifiable by a scan; so the marker is the one mechanism, and its limit is documented.

Cost: a scan reads ``/proc/<pid>/environ`` of every process on the machine (1.7 ms for the
86 processes of the test machine). It runs only when an attempt's command has ended, never
while attempts merely run, and one scan answers every attempt that ended before it began
(:class:`Scanner`): polling 300 ended attempts from 48 threads took one scan (and 0.14 to
0.24 s, as without any), deleting them none; a fresh scan per poll took 110 scans and 0.9 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

MARKER = "BASTION_ATTEMPT_NAME"
_NEEDLE = f"{MARKER}=".encode()
_CREATE_TIME_TOLERANCE = 0.05
_LISTED = 5  # processes named in a history line; the rest are counted


@dataclass(frozen=True)
class Process:
    """One marked process: (pid, create time) names it, so a recycled pid is never signalled."""

    pid: int
    create_time: float
    name: str
    worker: str | None = None  # its BASTION_WORKER, for the agent's workers on one machine
    ppid: int = 0  # its parent when the scan saw it

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid})"


def scan(prefix: str = "") -> dict[str, list[Process]]:
    """Every live process (zombies excluded) whose marker starts with ``prefix``, by marker.
    The calling process is never listed."""
    found: dict[str, list[Process]] = {}
    me = os.getpid()
    try:
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except FileNotFoundError:  # no procfs (macOS): psutil asks the kernel its own way
        return _scan_psutil(prefix)
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or another user's (we could not signal it anyway)
            continue
        value = _value(environ, _NEEDLE)
        if value is None or not value.startswith(prefix):
            continue
        process = _identify(pid, _value(environ, b"BASTION_WORKER="))
        if process is not None:
            found.setdefault(value, []).append(process)
    return found


def _value(environ: bytes, needle: bytes) -> str | None:
    """The first ``KEY=value`` entry's value (what getenv returns), or None."""
    at = environ.find(needle)
    while at > 0 and environ[at - 1] != 0:  # KEY= inside another entry: look further
        at = environ.find(needle, at + 1)
    if at < 0:
        return None
    end = environ.find(b"\0", at)
    return environ[at + len(needle) : end if end >= 0 else None].decode(errors="replace")


def _identify(pid: int, worker: str | None) -> Process | None:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return Process(pid, proc.create_time(), proc.name(), worker, proc.ppid())
    except psutil.Error:
        return None


def _scan_psutil(prefix: str) -> dict[str, list[Process]]:
    found: dict[str, list[Process]] = {}
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            environ = proc.environ()
            value = environ.get(MARKER)
            if value is not None and value.startswith(prefix):
                process = _identify(proc.pid, environ.get("BASTION_WORKER"))
                if process is not None:
                    found.setdefault(value, []).append(process)
    return found


class Scanner:
    """Scans shared by everyone who asks: an asker names the moment from which a scan is good
    enough for it (``since``, wall-clock seconds; default: now). For what an attempt left
    behind, that is when its main process ended: every attempt that ended before the last
    scan began is answered by it, so a cycle's polls of many ended attempts cost one scan.
    Askers that come while a scan runs wait for it, and share the next one if it is too old."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self._started = float("-inf")
        self._found: dict[str, list[Process]] = {}

    def find(self, marker: str, since: float | None = None) -> list[Process]:
        since = time.time() if since is None else since
        with self._lock:
            if self._started < since:
                self._started = time.time()
                self._found = scan(self.prefix)
            return list(self._found.get(marker, ()))


def alive(process: Process) -> bool:
    try:
        proc = psutil.Process(process.pid)
        if abs(proc.create_time() - process.create_time) > _CREATE_TIME_TOLERANCE:
            return False  # the pid was recycled
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def send(processes: Iterable[Process], sig: int) -> None:
    """Signal each process that is still the one that was found."""
    for process in processes:
        if alive(process):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, sig)


def describe(processes: list[Process]) -> str:
    """``killed 1 process left behind: sleep (pid 4242)``, for the attempt's history."""
    count = len(processes)
    named = ", ".join(str(p) for p in processes[:_LISTED])
    more = f" and {count - _LISTED} more" if count > _LISTED else ""
    return f"killed {count} process{'es' if count != 1 else ''} left behind: {named}{more}"


def end(
    marker: str,
    grace: float,
    worker: str | None = None,
    group: int = 0,
    group_termed: bool = False,
) -> list[Process]:
    """Blocking, for the agent: SIGTERM every process carrying ``marker`` (and ``worker``, when
    given) and the process ``group`` of the command that has ended (unless a stop already
    sent it SIGTERM: a second one means "now" to many programs), SIGKILL what is left after
    ``grace`` seconds, and wait until a scan finds none (bounded: a process stuck in the
    kernel cannot hold the caller for ever). Returns what the scans found."""
    ended: dict[int, Process] = {}
    deadline = time.monotonic() + grace
    give_up = deadline + 10.0
    killing = False
    if group > 0 and not group_termed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
    while True:
        found = [p for p in scan(marker).get(marker, []) if worker is None or p.worker == worker]
        if not found or time.monotonic() > give_up:
            return list(ended.values())
        fresh = [p for p in found if p.pid not in ended]
        ended.update((p.pid, p) for p in fresh)
        if not killing and time.monotonic() >= deadline:
            killing = True
            if group > 0:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)
        if killing:
            send(found, signal.SIGKILL)
        else:
            send([p for p in fresh if not (group_termed and _group_of(p) == group)], signal.SIGTERM)
        time.sleep(0.05)


def _group_of(process: Process) -> int:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return 0
