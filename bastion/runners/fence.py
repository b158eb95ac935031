"""A fencing token on this host: no start from a daemon older than one that already started.

The lease (bastion/lease.py) makes a holder stop *deciding* before a standby may take over,
but a start already under way when the holder froze (SIGSTOP, a VM pause, a thread starved
for longer than the lease's margin) resumes later, outside any time bound. Time cannot fence
that; a token can (the fencing-token argument: the resource refuses a request whose token is
older than one it has seen). Each lease takeover increments the lease's ``term``; a runner
whose attempts live on this host keeps the highest term that started anything in
``DIR/.fence`` and refuses starts from a lower one.

The check and the start must not be separated by a bump, so a start holds a shared lock on the
fence file from the check until its process exists; a newer term bumps under the exclusive
lock, once per process (the other starts of a burst wait for it inside the process). A
holder frozen in the middle of a start therefore blocks the bump (the newer daemon is told to
try again; when the frozen start resumes it finishes, and the newer daemon adopts it by name),
and once the bump is done every older start is refused. Locks are never waited on for
long: a frozen process holding one must not freeze the daemon that asks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator

from bastion.runners.base import Fenced, TryAgain

_WAIT_SECONDS = 0.5  # for a lock held by a live start on this host (a fork takes milliseconds)


@contextlib.contextmanager
def fenced(directory: str, term: int) -> Iterator[None]:
    """Hold while starting as a daemon of lease ``term`` (0: no lease, nothing is checked)."""
    if term <= 0:
        yield
        return
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, ".fence"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        for _ in range(2):  # a bump, then the shared hold under the new value
            _lock(fd, fcntl.LOCK_SH)
            seen = _read(fd)
            if term < seen:
                raise Fenced(
                    f"a daemon with lease term {seen} has started attempts on this host; this "
                    f"one holds term {term} and must act no more"
                )
            if term == seen:
                yield
                return
            fcntl.flock(fd, fcntl.LOCK_UN)
            _raise_to(fd, term)
        raise TryAgain("the host's fence moved while this start waited for it")
    finally:
        os.close(fd)


# A burst's starts under a new term all see the old one: one of this process raises it, the
# others wait here holding no lock, then find it raised. (Each taking the exclusive lock itself
# waited for the shared ones of the starts that came after the raise, and was told to try
# again: a burst of 1,000 on a freshly bumped host took 69 s instead of 2.)
_raising = threading.Lock()


def _raise_to(fd: int, term: int) -> None:
    with _raising:
        if _read(fd) >= term:
            return  # raised meanwhile (by a start of this process): take the shared lock again
        _lock(fd, fcntl.LOCK_EX)
        try:
            if _read(fd) < term:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(term).encode(), 0)
                os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def current(directory: str) -> int:
    """The highest term that started anything here (0: none)."""
    try:
        fd = os.open(os.path.join(directory, ".fence"), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return 0
    try:
        return _read(fd)
    finally:
        os.close(fd)


def _lock(fd: int, how: int) -> None:
    deadline = time.monotonic() + _WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TryAgain(
                    "another daemon's start on this host holds the fence (frozen?); "
                    "trying again next cycle"
                ) from None
            time.sleep(0.01)


def _read(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0)
    except ValueError:
        return 0
