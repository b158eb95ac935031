"""The local runner's small process and file helpers: finding an attempt's wrapper by its
command line, whether a group's leader is gone, the start claim, atomic JSON records."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import psutil

from bastion import leftovers
from bastion.runners.base import Handle, StartRefused, TryAgain
from bastion.runners.launcher import LAUNCHER_ARG

if TYPE_CHECKING:
    from bastion.bucket.store import Store

CREATE_TIME_TOLERANCE = 0.05


def process_of(directory: str, pid: int | None) -> psutil.Process | None:
    """The wrapper process of the attempt in ``directory`` (see ``is_wrapper``)."""
    candidates = [psutil.Process(pid)] if pid and psutil.pid_exists(pid) else []
    if not candidates:  # the kill landed between fork and the wrapper's first line
        candidates = list(psutil.process_iter())
    for proc in candidates:
        with contextlib.suppress(psutil.Error):
            if is_wrapper(proc, directory):
                return proc
    return None


def is_wrapper(proc: psutil.Process, directory: str) -> bool:
    """Whether ``proc`` is the wrapper of the attempt in ``directory``. One the runner exec'd
    has it in its argv (``-c`` second, the directory last); one the launcher forked has the
    launcher's argv, and holds the attempt's liveness lock open (its job never does)."""
    cmdline = proc.cmdline()
    if len(cmdline) >= 6 and cmdline[-1] == directory and cmdline[1] == "-c":
        return True
    if LAUNCHER_ARG not in cmdline:
        return False
    lock = os.path.realpath(os.path.join(directory, ALIVE_LOCK))  # (as /proc names it)
    return any(f.path == lock for f in proc.open_files())


def leader_gone(handle: Handle) -> bool:
    """True when our leader is gone or an unreaped zombie of ours: what is left in its group
    is ours (the kernel reuses a group id only once the group is empty)."""
    try:
        leader = psutil.Process(int(handle["pid"]))
        drift = abs(leader.create_time() - float(handle["create_time"]))
        return drift <= CREATE_TIME_TOLERANCE and leader.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


@contextlib.contextmanager
def claim(directory: str, name: str) -> Iterator[None]:
    """Whoever starts an attempt holds this lock from before the look for an earlier start
    until its handle is recorded, so two daemons of one root on this host (a standby that took
    over from a frozen holder) never both start it. A holder that is frozen keeps the others
    waiting (TryAgain, next cycle); one that died releases it with its file descriptors."""
    fd = os.open(os.path.join(directory, ".claim"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TryAgain(f"attempt {name} is being started by another process") from None
        yield
    finally:
        os.close(fd)


def being_claimed(directory: str) -> bool:
    """Whether a start holds the attempt's claim now (this process's or another's): the
    attempt is being started, so its directory without a launch record is no ended attempt.
    A holder that died released it; a frozen one still holds it, and may yet start it."""
    return _locked(os.path.join(directory, ".claim"))  # no file: nobody began to start it


def _locked(path: str) -> bool:
    """Whether some process holds an exclusive lock on ``path`` now (False: no such file).
    Tested with a shared lock, so two processes that test at once never see each other."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (releases the lock when we took it)
    return False


ALIVE_LOCK = ".alive"


def hold_alive(directory: str) -> int:
    """A descriptor holding the attempt's liveness lock, for its wrapper to inherit and hold
    for as long as it lives (its job does not inherit it). A process sees another's wrapper
    by its pid only in its own PID namespace; the lock is seen from every namespace on the
    host, so a daemon in a container never judges ended a wrapper it cannot see."""
    fd = os.open(os.path.join(directory, ALIVE_LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def held_alive(directory: str) -> bool:
    """Whether a live wrapper (in any PID namespace on this host) holds the attempt's
    liveness lock. A wrapper that ended, or was killed, let go of it with its descriptors
    (no lock file: started by an older runner, or never started)."""
    return _locked(os.path.join(directory, ALIVE_LOCK))


def unpack_bundle(record: Mapping[str, Any], store: Callable[[], Store], work: str) -> None:
    """The job runs inside its code: a tar bundle is fetched, verified and extracted into
    the attempt's working directory (removed with the attempt)."""
    from bundlers import Bundle, BundleError, fetch

    try:
        bundle = Bundle.from_json(dict(record))
        if bundle.kind != "tar":
            raise BundleError(
                f"the local runner runs tar bundles; this job's is a {bundle.kind} image "
                f"({bundle.uri}): launch it with --runner=docker"
            )
        fetch(bundle, store(), work)
    except BundleError as e:  # a digest that does not match will not match next time
        raise StartRefused(str(e)) from None


def in_group(process: leftovers.Process, groups: set[int]) -> bool:
    try:
        return os.getpgid(process.pid) in groups
    except OSError:
        return False


def write_json(path: str, data: Any) -> None:
    """Atomically, from any number of writers at once: each writes a file of its own and
    renames it. (A start and a concurrent look that found its wrapper both write
    ``handle.json``; with one shared temporary name one's rename found the file gone.)"""
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
