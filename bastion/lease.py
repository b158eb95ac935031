"""One daemon per root: a lease object written only with compare-and-swap, and self-fencing.

The rules, and why no two daemons ever act at once:

- **Holder.** Before each renewal write the holder reads its monotonic clock (``sent``). When
  the write succeeds, the lease is valid until ``sent + duration - margin`` on the holder's
  clock. The holder renews on its own thread every third of the duration (counted from when
  the last renewal was sent), so no cycle length can lose it; on a bucket, through connections
  of its own (``Store.own_connection``), so the daemon's other requests never queue ahead of
  it. Before every effect that starts or stops anything, the daemon asks :meth:`Lease.valid`
  with the time the effect may take; when it cannot prove the lease valid for that long it
  starts nothing more and drops what it knows.
- **Standby.** A waiter never trusts the holder's clock: it takes over only after the lease
  object has stayed unchanged (same token) for a whole ``duration`` on its *own* monotonic
  clock, counted from when it first *saw* that token, which is after the holder's write
  completed, hence after ``sent``. So the standby takes over no earlier than
  ``sent + duration``, strictly later than the holder stopped acting
  (``sent + duration - margin``), even if the holder is frozen (SIGSTOP, a long GC, a VM
  pause): a frozen holder wakes to an expired lease on its own clock and acts no more.
  ``margin`` covers clock-rate differences and the longest single effect.
- **Identity** is unique per daemon process (host, pid, process start time, boot id, PID
  namespace, and a random id), never "host plus path": a VM cloned from the holder's image has
  the same host name and paths, and two containers on one host (host networking) have the same
  host name, boot id and paths besides. A restarted installation takes over at once only when
  it proves the old process gone: same host, same boot id (the same running kernel), same work
  directory, same PID and time namespace (a pid means something only inside its namespace: the
  holder's pid missing from *our* namespace proves nothing), and that pid no longer alive with
  that start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot: exact, unlike a
  wall-clock create time). Anything else waits the full duration. A lease written before the
  namespace was recorded cannot prove the same namespace, so it is never taken early: an
  upgrade waits one lease term once, rather than risk two daemons acting at once.
- **Term.** Each takeover writes a ``term`` above the previous record's (with compare-and-swap,
  so terms are unique and increase): the wall clock in milliseconds, or the previous term plus
  one if that is not above it, so a lease object deleted and made anew still gets a term above
  those of its earlier life. Time bounds when a holder *decides*; a start already under
  way when it froze may resume at any later time, so runners refuse a start whose term is older
  than one they have seen start something (bastion/runners/fence.py).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psutil

from bastion.bucket.objects import PreconditionFailed
from bastion.bucket.store import Store

log = logging.getLogger("bastion.lease")


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _namespace(kind: str) -> int | None:
    """The inode of this process's ``kind`` namespace (``pid``, ``time``); None if unknown.

    For ``pid``, also None when the /proc mounted here is another PID namespace's (a namespace
    made without its own /proc): ``/proc/<pid>`` would then name other processes than our pids.
    """
    try:
        if kind == "pid" and int(os.readlink("/proc/self")) != os.getpid():
            return None
        return os.stat(f"/proc/self/ns/{kind}").st_ino
    except (OSError, ValueError):
        return None


def start_ticks(pid: int | str) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``: when the process started, in clock ticks since boot.
    None when no such process is visible here (or /proc cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # fields[0] is field 3
    except (IndexError, ValueError):
        return None


def process_identity(work_dir: str) -> dict[str, Any]:
    """Who this daemon process is, as written into the lease."""
    me = psutil.Process()
    return {
        "owner": f"{socket.gethostname()}:{me.pid}:{uuid.uuid4().hex[:12]}",
        "host": socket.gethostname(),
        "pid": me.pid,
        "pid_started": me.create_time(),
        "pid_start_ticks": start_ticks("self"),
        "pid_ns": _namespace("pid"),
        "time_ns": _namespace("time"),
        "boot_id": _boot_id(),
        "work_dir": work_dir,
    }


def provably_gone(record: dict[str, Any], me: dict[str, Any]) -> bool:
    """The lease's holder was an earlier process of this installation and is dead for sure.

    Only a process of the same kernel and the same PID namespace can say "that pid is not
    alive": in a container (its own PID namespace, the host's name and boot id) another
    daemon's pid is absent, or names an unrelated process, whether or not that daemon lives."""
    if not me.get("boot_id") or record.get("boot_id") != me["boot_id"]:
        return False  # another machine (or a reboot we cannot see through): wait it out
    if record.get("host") != me.get("host") or record.get("work_dir") != me.get("work_dir"):
        return False
    if me.get("pid_ns") is None or record.get("pid_ns") != me["pid_ns"]:
        return False  # another PID namespace, or a lease that does not say which: wait it out
    if record.get("time_ns") != me.get("time_ns"):
        return False  # start ticks are shifted by a time namespace's offset: not comparable
    try:
        pid, started = int(record["pid"]), int(record["pid_start_ticks"])
    except (KeyError, TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    ticks = start_ticks(pid)
    if ticks is not None:
        return ticks != started  # alive: gone only if the pid was reused since
    try:  # /proc says nothing (hidden, unreadable): only the kernel's "no such process" proves
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


class Lease:
    def __init__(
        self,
        store: Store,
        identity: dict[str, Any] | str,
        duration: float = 60.0,
        margin: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.identity = identity if isinstance(identity, dict) else {"owner": identity}
        self.owner = str(self.identity["owner"])
        self.duration = duration
        self.margin = duration / 4 if margin is None else margin
        self.clock = clock
        self.token: str | None = None  # set while we hold it
        self.term = 0  # the takeover count of the lease we hold (or last held)
        self._valid_until = 0.0
        self._seen: tuple[str, float] | None = None  # (token, first seen) of another's lease
        self._waiting_for = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the daemon asks ----------------------------------------------------------------

    @property
    def held(self) -> bool:
        return self.token is not None and self.valid()

    def valid(self, need: float = 0.0) -> bool:
        """True when the lease is certainly ours for ``need`` more seconds."""
        return self.token is not None and self.clock() + need < self._valid_until

    def hold(self) -> bool:
        """Acquire if we do not hold it (and start renewing); True while this daemon may act."""
        if self.token is not None:
            if self.valid():
                return True
            self._lose("the lease expired before it could be renewed")
            return False
        if not self._try_acquire(self.clock()):
            return False
        self._start_renewing()
        return True

    def release(self) -> None:
        self._stop_renewing()
        with self._lock:
            token, self.token = self.token, None
        if token is None:
            return
        try:
            self.store.lease.write({**self._record(), "released": True}, token)
        except Exception as e:
            log.warning("could not release the lease: %s", e)

    def close(self) -> None:
        """Released, and the connections of its own closed (``Store.own_connection``):
        the lease is not used again."""
        self.release()
        self.store.close()

    # -- renewing ------------------------------------------------------------------------------

    def _start_renewing(self) -> None:
        self._stop_renewing()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="lease", daemon=True)
        self._thread.start()

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def _renew_loop(self) -> None:
        """A renewal every third of the duration from when the last one was sent, not from
        when its answer came: a renewal slowed by a loaded bucket (a burst's requests ahead
        of it) delays the next by nothing, so its validity is not spent waiting twice."""
        stop = self._stop
        sent = self._valid_until - (self.duration - self.margin)  # (the take's)
        while not stop.wait(max(0.0, sent + self.duration / 3 - self.clock())):
            sent = self.clock()
            if self.token is None or not self.renew():
                return

    def renew(self) -> bool:
        """One renewal write; False once the lease is lost."""
        sent = self.clock()
        with self._lock:
            token = self.token
        if token is None:
            return False
        try:
            new = self.store.lease.write(self._record(), token)
        except PreconditionFailed:
            self._lose("the lease was taken by another daemon")
            return False
        except Exception as e:  # bucket unreachable: valid until it would expire, then paused
            log.warning(
                "could not renew the lease (%s); still valid for %.0fs",
                e,
                max(0.0, self._valid_until - self.clock()),
            )
            if not self.valid():
                self._lose("the lease could not be renewed before it expired")
                return False
            return True
        with self._lock:
            if self.token == token:
                self.token = new
                self._valid_until = sent + self.duration - self.margin
        return True

    def _lose(self, why: str) -> None:
        with self._lock:
            if self.token is None:
                return
            self.token = None
            self._valid_until = 0.0
        log.error("%s on %s; acting no more", why, self.store.root_url)

    # -- acquiring -----------------------------------------------------------------------------

    def _record(self) -> dict[str, Any]:
        return {
            **self.identity,
            "renewed": time.time(),
            "duration": self.duration,
            "term": self.term,
        }

    def _try_acquire(self, now: float) -> bool:
        try:
            current = self.store.lease.read()
            if current is None:
                return self._take(None, now, "no lease existed", 0)
            record, token = current
            term = _term(record)
            if record.get("released"):
                return self._take(token, now, f"lease of {record.get('owner')} was released", term)
            if provably_gone(record, self.identity):
                return self._take(token, now, f"the holder {record.get('owner')} is gone", term)
            if self._seen is None or self._seen[0] != token:
                self._seen = (token, now)
            waited = now - self._seen[1]
            if waited >= self.duration:
                return self._take(
                    token,
                    now,
                    f"lease of {record.get('owner')} expired (unchanged for {waited:.0f}s)",
                    term,
                )
            holder = str(record.get("owner"))
            if holder != self._waiting_for:
                log.warning(
                    "another daemon (%s) holds the lease on %s; waiting until it is "
                    "released or unchanged for %.0fs",
                    holder,
                    self.store.root_url,
                    self.duration,
                )
                self._waiting_for = holder
        except Exception as e:
            log.warning("could not read the lease: %s", e)
        return False

    def _take(self, expected: str | None, now: float, why: str, previous_term: int) -> bool:
        term = max(previous_term + 1, time.time_ns() // 1_000_000)
        try:
            token = self.store.lease.write({**self._record(), "term": term}, expected)
        except PreconditionFailed:
            log.info("another daemon took the lease first")
            self._seen = None
            return False
        with self._lock:
            self.token = token
            self.term = term
            self._valid_until = now + self.duration - self.margin
        self._seen = None
        self._waiting_for = ""
        log.info("took the lease on %s (term %d): %s", self.store.root_url, term, why)
        return True


def _term(record: dict[str, Any]) -> int:
    try:
        return max(0, int(record.get("term") or 0))
    except (TypeError, ValueError):
        return 0


def default_identity(work_dir: str) -> dict[str, Any]:
    return process_identity(os.path.abspath(work_dir))
