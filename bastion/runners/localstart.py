"""How the local runner starts an attempt's wrapper (bastion/outputs/supervise.py).

The attempt's directory gets ``launch.json`` (host, GPUs) before anything runs, its bundle
unpacked into ``work/``, and ``output`` for the command's stdout and stderr. The wrapper is
forked by the host's launcher (bastion/runners/launcher.py: a fork of a process that has the
wrapper imported, where a new interpreter took a tenth of a second of CPU) when one runs here
and exec would take its argv and environment; else it is exec'd here, which refuses what exec
refuses, with the reason. Either way it holds the attempt's liveness lock for as long as it
lives, and ``handle.json`` records its pid and creation time.

The local runner composes one :class:`Starter`; the claim, the fence and the GPUs are the
runner's, decided before it is asked.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psutil

from bastion.exec_limits import exec_limit_problem
from bastion.outputs.supervise import stop_signals_held, wrapper_argv
from bastion.runners.base import Attempt, Handle, TryAgain, exec_refusal
from bastion.runners.launcher import Launcher, LauncherLost
from bastion.runners.localproc import (
    held_alive,
    hold_alive,
    read_int,
    unpack_bundle,
    write_json,
)
from bastion.runners.localshared import SHARED_MARK

if TYPE_CHECKING:
    from bastion.bucket.store import Store

log = logging.getLogger("bastion.runners.local")


class Starter:
    """Starts wrappers for one runner: ``host`` is recorded in each handle, ``root`` is the
    bucket bundles are fetched from, ``launcher`` whether wrappers are forked by one."""

    def __init__(
        self, attempts_dir: str, host: str, root: str, launcher: bool, shared: bool = False
    ) -> None:
        self.host = host
        self.root = root
        self._store: Any = None  # made on the first bundle to fetch
        # wrappers exec'd here, by attempt: our children, reaped when polled
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        log_path = os.path.join(attempts_dir, ".launcher.log")
        self._launcher = Launcher(log_path, shared) if launcher else None

    def spawn(self, attempt: Attempt, directory: str, gpus: list[int]) -> Handle:
        """Start the attempt's wrapper in ``directory`` (made and claimed by the caller);
        its handle, recorded in ``handle.json``."""
        handle: Handle = {"name": attempt.name, "host": self.host, "gpus": gpus}
        write_json(os.path.join(directory, "launch.json"), handle)
        work = os.path.join(directory, "work")
        os.makedirs(work, exist_ok=True)
        if attempt.bundle:
            unpack_bundle(attempt.bundle, self._bundle_store, work)
        env = {
            **os.environ,
            **attempt.env,
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
            "BASTION_ATTEMPT_NAME": attempt.name,
            "BASTION_OUTPUT_DIR": os.path.join(directory, "outputs"),
        }
        output = os.open(
            os.path.join(directory, "output"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
        stdin = os.open(os.devnull, os.O_RDONLY)
        argv = wrapper_argv(attempt.name, attempt.command, directory)
        alive = hold_alive(directory)  # the wrapper holds it for as long as it lives
        lost: LauncherLost | None = None
        shared = False
        try:
            pid, shared = self._launch(argv, env, work, (stdin, output, alive))
        except LauncherLost as e:
            lost, pid = e, 0
        finally:
            os.close(output)
            os.close(stdin)
            os.close(alive)
        if lost is not None:
            pid = self._after_lost(directory, lost)
            shared = os.path.exists(os.path.join(directory, SHARED_MARK))
        try:
            created = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:  # already gone: it cannot be confused with anything
            created = 0.0
        handle.update(pid=pid, create_time=created)
        if shared:
            handle["shared"] = True
        write_json(os.path.join(directory, "handle.json"), handle)
        return handle

    def close(self) -> None:
        if self._launcher is not None:
            self._launcher.close()

    def _launch(
        self, argv: list[str], env: dict[str, str], cwd: str, fds: tuple[int, ...]
    ) -> tuple[int, bool]:
        """The wrapper's pid, and whether it is a shared supervisor: the launcher when one
        runs here and exec would take the wrapper's argv and environment (it forks a wrapper,
        or supervises the attempt itself); else a wrapper exec'd here, which refuses what
        exec refuses with its reason (E2BIG names the variable)."""
        directory = argv[-1]
        if self._launcher is not None and _exec_takes(env, argv):
            try:
                return self._launcher.spawn(argv, env, cwd, fds), self._launcher.shared
            except OSError as e:
                log.warning("the launcher could not start the attempt (%s); exec'ing a wrapper", e)
        try:
            with stop_signals_held():
                proc = subprocess.Popen(
                    argv,
                    stdin=fds[0],
                    stdout=fds[1],
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    cwd=cwd,
                    close_fds=True,
                    pass_fds=(fds[2],),
                )
        except OSError as e:  # exec refused: E2BIG, no /bin/sh... never cured by a retry
            refused = exec_refusal(e, argv[0], env, argv)
            if refused is None:
                raise  # EAGAIN, ENOMEM: transient, the daemon backs off and tries again
            raise refused from None
        self.children[os.path.basename(directory)] = proc
        return proc.pid, False

    def _after_lost(self, directory: str, lost: LauncherLost) -> int:
        """The launcher got the request and ended without an answer: did it fork? A wrapper
        it forked holds the attempt's liveness lock (we let go of ours) and writes its pid
        first: then that is the attempt. Else nothing runs, and the start is tried again;
        a launcher that never answered at all cannot run here, and wrappers are exec'd."""
        name = os.path.basename(directory)
        if held_alive(directory) or os.path.exists(os.path.join(directory, "pid")):
            pid = _pid_soon(directory, 10.0)
            if pid is not None:
                return pid
            raise TryAgain(f"starting {name}: {lost}; its wrapper has not written its pid")
        if self._launcher is not None and not self._launcher.answered:
            log.error(
                "the local runner's launcher ended before its first answer (its errors: %s); "
                "every wrapper is exec'd from now on",
                self._launcher.log_path,
            )
            self._launcher.close()
            self._launcher = None
        raise TryAgain(f"starting {name}: {lost}; nothing was started")

    def _bundle_store(self) -> Store:
        if self._store is None:
            from bastion.bucket.store import Store

            self._store = Store(self.root)
        return self._store


def _exec_takes(env: Mapping[str, str], argv: Sequence[str]) -> bool:
    """Whether exec takes this argv and environment (what it refuses is refused by an exec
    here, with the reason, not by a forked wrapper that could only fail)."""
    if any("\0" in a for a in argv) or exec_limit_problem(env, argv) is not None:
        return False
    return all(k and "=" not in k and "\0" not in k + v for k, v in env.items())


def _pid_soon(directory: str, seconds: float = 2.0) -> int | None:
    """The pid a wrapper writes first thing, if one appears within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        pid = read_int(os.path.join(directory, "pid"))
        if pid is not None or time.monotonic() >= deadline:
            return pid
        time.sleep(0.05)
