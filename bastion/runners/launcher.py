"""The local runner's launcher: one long-lived process that has imported the attempt wrapper
(bastion/outputs/supervise.py) and forks a wrapper for each attempt.

Why: an exec'd wrapper is a fresh interpreter that imports the bucket stack (fsspec, the
store) before it runs anything: about 0.1 s of CPU per attempt, so the 1,000 jobs of a sweep
took a minute of a 2-core host to start. A fork of a process that has imported it costs a
millisecond or two, and the child runs the same code as the exec'd wrapper did.

What the runner gets is the wrapper it knew, but for its parent and its command line: a
session of its own (its pid is its group) and its pid written to the attempt's directory
before the launcher answers, the attempt's liveness lock held for as long as it lives,
outliving the daemon and the launcher. Its command line is the launcher's, so the runner
knows it by the lock it holds (``localproc.is_wrapper``), not by its argv.

One request at a time on a Unix socket pair: a JSON object ``{argv, env, cwd}`` sent with
three descriptors (stdin, output, liveness lock), answered ``{"pid": N}`` or
``{"error": "..."}``. The launcher ends when the daemon does (its end of the socket closes).

In its supervising mode (``shared`` last in its argv; the local runner's default) it forks
nothing: it runs each attempt's supervisor in a thread of its own (bastion/runners/
localshared.py), answers ``{"pid": its own, "shared": true}``, and when the daemon ends it
lives on until its last attempt has ended.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from bastion.outputs.supervise import stop_signals_held

LAUNCHER_ARG = "bastion-launcher"  # in the argv of the launcher and of the wrappers it forks
SHARED_ARG = "shared"  # last in a launcher's argv: it supervises attempts (localshared.py)
MAX_REQUEST = 128 << 10  # the wrapper's argv and environment (more: exec'd by the runner)
ANSWER_SECONDS = 30.0  # a fork and a small write: far less, unless the launcher hangs
_CODE = "from bastion.runners.launcher import serve; serve()"


class LauncherLost(Exception):
    """The launcher ended after it was sent a request: whether it forked is unknown."""


class Launcher:
    """The daemon's end: starts the launcher on first use, again if it ended before a
    request reached it; ``spawn`` is safe from the effects pool's threads (one at a time).
    ``shared``: the launcher supervises the attempts itself (bastion/runners/localshared.py)
    rather than fork a wrapper for each; it is let go, never killed, once it has attempts:
    it ends with its last one."""

    def __init__(self, log_path: str, shared: bool = False) -> None:
        self.log_path = log_path
        self.shared = shared
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._let_go: list[subprocess.Popen[bytes]] = []  # shared ones that run on: reaped
        self.answered = 0  # answers received, from every launcher this one started

    def spawn(self, argv: Sequence[str], env: dict[str, str], cwd: str, fds: Sequence[int]) -> int:
        """Fork a wrapper running ``argv``'s supervisor (its last argument is the attempt's
        directory); its pid. OSError when no launcher runs here (the caller execs the
        wrapper itself); LauncherLost when the request went out and no answer came back."""
        request = json.dumps({"argv": list(argv), "env": env, "cwd": cwd}).encode()
        if len(request) > MAX_REQUEST:  # (one message: a socket's buffer bounds it)
            raise OSError(errno.EMSGSIZE, "the wrapper's request is too large for the launcher")
        with self._lock:
            sock = self._running()
            try:
                socket.send_fds(sock, [request], list(fds))
            except (BrokenPipeError, ConnectionError):  # it had ended: nothing was forked,
                self._stop()  # so a new one may
                sock = self._running()
                socket.send_fds(sock, [request], list(fds))
            try:
                answer = sock.recv(1 << 16)
            except OSError as e:
                self._stop()
                raise LauncherLost(f"the launcher did not answer: {e}") from e
            if not answer:
                self._stop()
                raise LauncherLost("the launcher ended before it answered")
            self.answered += 1
        reply = json.loads(answer)
        if "pid" not in reply:
            raise OSError(reply.get("error") or "the launcher could not fork")
        return int(reply["pid"])

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _running(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(self.log_path, "ab") as errors:
                self._proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _CODE,
                        LAUNCHER_ARG,
                        str(theirs.fileno()),
                        *([SHARED_ARG] if self.shared else []),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,  # a Ctrl-C to the daemon's group is not for it
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(ANSWER_SECONDS)  # a launcher that hangs must not hold every start
        self._sock = ours
        return ours

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the launcher reads its end, and exits
            self._sock = None
        self._let_go = [p for p in self._let_go if p.poll() is None]
        if self._proc is not None and self.shared:  # (it ends with its last attempt)
            self._let_go.append(self._proc)
            self._proc = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


# -- the launcher's side -------------------------------------------------------------------


def serve() -> None:
    """The launcher's loop (``python -c ... bastion-launcher FD [shared]``)."""
    # What every wrapper imports (the bucket stack above all; the wrapper's own module is
    # imported at the top), imported once, here
    import bastion.bucket.store  # noqa: F401

    # What the imports made is never collected: frozen, the children's collections do not
    # visit it (each visit writes to the objects' pages, and a forked child copies each page
    # it writes to)
    gc.freeze()
    shared = _shared_supervisor() if sys.argv[-1] == SHARED_ARG else None
    sock = socket.socket(fileno=int(sys.argv[-2] if shared else sys.argv[-1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if shared is None:
        signal.signal(signal.SIGCHLD, _reap)
    else:  # (its threads wait for their own children)
        shared.install_signals(lambda: _take_no_more(sock))
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_REQUEST, 3)
        except OSError:
            data, fds = b"", []
        if not data:  # the daemon ended
            if shared is not None:
                sock.close()
                shared.wait_all()  # (its attempts outlive the daemon, as wrappers do)
            return
        taken = False
        try:
            request = json.loads(data)
            if shared is not None:
                answer: dict[str, Any] = {"pid": shared.take(request, fds), "shared": True}
                taken = True
            else:
                answer = {"pid": _fork(request, fds, sock)}
        except Exception as e:  # (answered: the runner raises it)
            answer = {"error": f"{type(e).__name__}: {e}"}
        finally:
            for fd in [] if taken else fds:  # (an attempt taken owns its descriptors)
                with contextlib.suppress(OSError):
                    os.close(fd)
        with contextlib.suppress(OSError):
            sock.send(json.dumps(answer).encode())
        if taken:
            shared.begin()


def _take_no_more(sock: socket.socket) -> None:
    """Its loop's next read finds the end (a stop signal's handler: a read it interrupted
    is tried again, and ends)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)


def _shared_supervisor() -> Any:
    from bastion.runners.localshared import SharedSupervisor

    return SharedSupervisor()


def _reap(_signum: int, _frame: Any) -> None:
    """Wrappers are the launcher's children until it ends: their exits are collected, so
    they do not stay zombies (the runner reads their status from their directory)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _fork(request: dict[str, Any], fds: list[int], sock: socket.socket) -> int:
    argv, env, cwd = list(request["argv"]), dict(request["env"]), str(request["cwd"])
    if len(fds) != 3:
        raise ValueError(f"expected 3 descriptors, got {len(fds)}")
    directory = argv[-1]
    in_session, session_made = os.pipe()
    with stop_signals_held():  # (the wrapper takes them once its handlers are set)
        pid = os.fork()
        if pid == 0:  # the wrapper
            try:
                os.close(in_session)
                _become_wrapper(argv, env, cwd, fds, sock, session_made)
            finally:
                os._exit(1)  # (supervise.main never returns; this is for a failure before it)
    # Answered once the wrapper leads a session of its own: the runner signals its group by
    # its pid, which before the wrapper's setsid is no group at all (the signal would be lost)
    os.close(session_made)
    try:
        os.read(in_session, 1)  # EOF: the wrapper closed its end after setsid (or died)
    finally:
        os.close(in_session)
    # Written before the answer, so a daemon that dies after it finds the attempt by its pid;
    # answered whatever happens now (an error would have the runner exec a second wrapper),
    # and the wrapper writes it too, first thing
    path = os.path.join(directory, "pid")
    with contextlib.suppress(OSError):
        with open(path + ".launcher", "w") as f:
            f.write(str(pid))
        os.replace(path + ".launcher", path)
    return pid


def _become_wrapper(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    fds: list[int],
    sock: socket.socket,
    session_made: int,
) -> None:
    stdin, output, alive = fds
    os.setsid()
    os.close(session_made)  # (the launcher answers now)
    for sig in (signal.SIGCHLD, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    os.dup2(stdin, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    sock.close()
    keep = {0, 1, 2, alive}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv[1:]
    from bastion.outputs.supervise import main

    main(argv[1:])
