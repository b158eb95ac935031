"""The local runner's shared supervisor: the launcher (bastion/runners/launcher.py) in its
supervising mode runs every attempt it is handed in a thread of its own, where the forking
mode forks a wrapper process for each.

Why: a wrapper forked from a Python process copies every page its Python touches (reference
counts are writes): 8-10 ms of CPU per attempt on a 2-core host, so a burst of 1,000 starts
took 6-12 s however little the daemon did. A thread of a process that already runs costs
what the wrapper's own work costs (restoring outputs, one ``bash`` forked by vfork).

What the runner sees is the wrapper it knew, but shared: each attempt's ``pid`` file names
this process, and its liveness lock is held by this process until that attempt has ended,
synced its outputs and written its ``exit``; ``shared`` in the directory says so, for a
daemon that finds the attempt without its handle. The runner judges a shared attempt alive
by its lock, stops it through its stop file (a stop signal would reach every attempt: it
sends ``LOOK_SIGNAL`` for the attempts to look at their stop files now, else each looks
within ``SHARED_LOOK_SECONDS``), and never sends this process any other signal.

This process outlives the daemon, as wrappers do: when the daemon's end of the socket
closes, it takes no more attempts and ends with its last one. A SIGTERM, SIGINT or SIGHUP
sent to it (a host shutting down) stops every attempt it runs, each as its runner's stop
would (warned, killed at the grace's end, synced), and it takes no more (the runner starts
another supervisor for its next attempt).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bastion.outputs.supervise import STOP_SIGNALS, Supervisor, run_to_the_end

if TYPE_CHECKING:
    from bastion.bucket.store import Store

SHARED_MARK = "shared"  # in the attempt's directory: its supervisor is a shared one
LOOK_SIGNAL = signal.SIGUSR1  # from the runner: "a stop file was written, look now"
# How often each attempt looks at its stop file unasked: its runner nudges it when it writes
# one, so this is for a runner that cannot (another PID namespace's). A look a second for each
# of 1,000 running attempts, each a thread waking and taking the GIL, took 8% of a core.
SHARED_LOOK_SECONDS = 5.0


class SharedSupervisor:
    """The attempts this process supervises, by directory."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._running: dict[str, Supervisor] = {}
        self._taken: list[tuple[Supervisor, list[int]]] = []  # answered, not yet begun
        self._take_no_more: Callable[[], None] = lambda: None
        self._nudges = os.pipe()  # a byte per LOOK_SIGNAL: the looker looks
        os.set_blocking(self._nudges[1], False)
        self._stores: dict[str, Store] = {}
        self._stores_lock = threading.Lock()  # (a client made slowly holds up no one else)

    def install_signals(self, take_no_more: Callable[[], None]) -> None:
        """Its stop signals stop every attempt, and call ``take_no_more`` (the launcher
        ends its loop: it ends with its last attempt, as a wrapper stopped ends)."""
        self._take_no_more = take_no_more
        threading.Thread(target=self._looker, name="stop files", daemon=True).start()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._stop_all)
        signal.signal(LOOK_SIGNAL, self._look_all)

    def take(self, request: dict[str, Any], fds: list[int]) -> int:
        """Take the attempt ``request`` describes (the wrapper's argv, its environment and
        working directory; ``fds``: stdin, output, liveness lock, which it now owns); this
        process's pid, written to the attempt's ``pid`` first. Its supervision begins with
        :meth:`begin`, once the runner has its answer."""
        argv, env, cwd = list(request["argv"]), dict(request["env"]), str(request["cwd"])
        if len(fds) != 3:
            raise ValueError(f"expected 3 descriptors, got {len(fds)}")
        command, directory = argv[-2], argv[-1]
        pid = os.getpid()
        _write(os.path.join(directory, SHARED_MARK), "")
        _write(os.path.join(directory, "pid"), str(pid))
        supervisor = Supervisor(
            command,
            directory,
            env,
            cwd=cwd,
            stdio=(fds[0], fds[1]),
            store_of=self._store,
            look_seconds=SHARED_LOOK_SECONDS,
        )
        with self._lock:
            self._running[directory] = supervisor
            self._taken.append((supervisor, fds))
        return pid

    def begin(self) -> None:
        """Supervise the attempts taken, each in a thread. After the answer: a thread's start
        waits for the new thread to run, which under a busy GIL is a switch interval or more,
        and the runner's next start need not wait for it. A thread that cannot start (the
        host's limit) ends its attempt with the reason, as a wrapper that failed does."""
        with self._lock:
            taken, self._taken = self._taken, []
        for supervisor, fds in taken:
            name = f"attempt {os.path.basename(supervisor.directory)}"
            thread = threading.Thread(target=self._attempt, args=(supervisor, fds), name=name)
            try:
                thread.start()
            except RuntimeError as e:  # (can't start new thread)
                supervisor.say(f"bastion: the attempt's supervisor could not start: {e}")
                with contextlib.suppress(OSError):
                    _write(os.path.join(supervisor.directory, "exit"), "1")
                self._ended(supervisor, fds)

    def wait_all(self) -> None:
        """Until every attempt taken has ended."""
        with self._lock:
            while self._running:
                self._lock.wait()

    def _attempt(self, supervisor: Supervisor, fds: list[int]) -> None:
        try:
            run_to_the_end(supervisor)
        finally:
            self._ended(supervisor, fds)

    def _ended(self, supervisor: Supervisor, fds: list[int]) -> None:
        with self._lock:
            self._running.pop(supervisor.directory, None)
            self._lock.notify_all()
        for fd in fds:  # the liveness lock last: the attempt has ended once it is let go
            with contextlib.suppress(OSError):
                os.close(fd)

    def _stop_all(self, signum: int, _frame: Any) -> None:
        with self._lock:
            running = list(self._running.values())
        for supervisor in running:
            supervisor.on_signal(signum, None)
        self._take_no_more()

    def _look_all(self, _signum: int, _frame: Any) -> None:
        """The runner wrote a stop file: the looker looks now (nudges that come while it
        looks make one more look, not one each: a thousand stops at once are a few looks).
        A byte down a pipe, no lock: a handler that took one (``Event.set``) was run again,
        by the next of a thousand nudges, while it held it, and waited for itself forever."""
        with contextlib.suppress(OSError):  # (full: a look is due anyway)
            os.write(self._nudges[1], b"\0")

    def _looker(self) -> None:
        """Each attempt not yet stopping whose stop file is there is told to stop (one stat
        each; a stopping one reads its deadline again itself, every STOPPING_LOOK_SECONDS)."""
        while True:
            os.read(self._nudges[0], 4096)  # (every nudge so far: one look)
            with self._lock:
                running = list(self._running.values())
            for supervisor in running:
                if supervisor.stop_asked_at is None:
                    supervisor.look_for_a_stop()

    def _store(self, root: str) -> Store:
        """One bucket client per root, for every attempt (each made its own before)."""
        from bastion.bucket.store import Store

        with self._stores_lock:
            store = self._stores.get(root)
            if store is None:
                store = self._stores[root] = Store(root)
            return store


def _write(path: str, text: str) -> None:
    tmp = f"{path}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
