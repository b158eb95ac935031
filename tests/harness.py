"""Real processes on real directories: the CLI and the daemon run as subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bastion.bucket.store import Store
from bastion.runners.launcher import LAUNCHER_ARG, SHARED_ARG

REPO = Path(__file__).resolve().parent.parent


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def processes_with_env(key: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment has ``key=value`` (how tests find their jobs)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(key) == value:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def kill_shared_supervisors(under: Path | str) -> None:
    """The local runner's shared supervisors (bastion/runners/localshared.py) whose log is
    under ``under``: killed before a test's jobs are, since one still starts the attempts it
    was handed after a look for the test's processes, and outlives the test's runner."""
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            argv = proc.cmdline()
            shared = LAUNCHER_ARG in argv and argv[-1] == SHARED_ARG
            if shared and os.readlink(f"/proc/{proc.pid}/fd/2").startswith(str(under)):
                proc.kill()


def gated(marker: Path, gate: Path) -> str:
    """A job that records its start, prints numbered ticks until ``gate`` exists, then ends."""
    return (
        f"echo $BASTION_JOB_NAME >> {marker}; i=0; "
        f"while [ ! -e {gate} ]; do i=$((i+1)); echo tick $i; sleep 0.1; done; echo end $i"
    )


def ticks_complete(log: str) -> list[str]:
    """Problems with a gated job's output in ``log``: lost, repeated or reordered lines."""
    lines = [ln for ln in log.splitlines() if ln.startswith(("tick ", "end "))]
    if not lines or not lines[-1].startswith("end "):
        return [f"no end line in {lines[-3:]}"]
    n = int(lines[-1].split()[1])
    expected = [f"tick {i}" for i in range(1, n + 1)] + [f"end {n}"]
    return [] if lines == expected else [f"expected tick 1..{n}, end {n}; got {lines}"]


def unshare_refused() -> str:
    """Why a PID namespace of our own cannot be made here ("" when it can): tests skip with it."""
    try:
        proc = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"unshare cannot run: {e}"
    if proc.returncode:
        return f"unshare --pid --fork --mount-proc is refused (root needed): {proc.stderr.strip()}"
    return ""


def pid_namespace(pid: int | str = "self") -> int:
    """The inode of the PID namespace of process ``pid`` (what the lease records)."""
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


# The init of a PidNamespace: it only reaps what is reparented to it, so the daemons started
# in it can be killed and started again while their jobs live on.
_REAPER = (
    "import os, time\n"
    "while True:\n"
    "    try:\n"
    "        os.waitpid(-1, 0)\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.2)\n"
)

# Bind-mounts "$1" on "$2" in the new mount namespace, then runs the rest (as pid 1 if exec'd).
_PRIVATE = 'if [ -n "$1" ]; then mount --bind "$1" "$2" || exit 97; fi; shift 2; exec "$@"'


def _in_new_namespace(private: tuple[Path, Path] | None, argv: list[str]) -> list[str]:
    """``argv`` as pid 1 of a new PID and mount namespace (its own /proc); with ``private``
    (source, target), the target path shows the source inside it only: two such namespaces
    see one path, each its own directory, as two containers with the same default paths."""
    source, target = (str(private[0]), str(private[1])) if private else ("", "")
    return [
        "unshare",
        "--pid",
        "--mount-proc",
        "--kill-child",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        _PRIVATE,
        "sh",
        source,
        target,
        *argv,
    ]


class PidNamespace:
    """A PID namespace of its own (with its own /proc), kept alive by a reaping init: a
    container on this host whose supervisor may restart the daemon in it."""

    def __init__(self, private: tuple[Path, Path] | None = None) -> None:
        argv = _in_new_namespace(private, [sys.executable, "-c", _REAPER])
        self.launcher = subprocess.Popen(argv)
        init = wait_for(
            lambda: next(iter(psutil.Process(self.launcher.pid).children()), None),
            timeout=10,
            what="the namespace's init",
        )
        self.init_pid = init.pid
        wait_for(
            lambda: pid_namespace(self.init_pid) != pid_namespace(),
            timeout=10,
            what="the namespace's init to be in its namespace",
        )
        self.inode = pid_namespace(self.init_pid)

    def enter(self, argv: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.init_pid), "--pid", "--mount", "--", *argv]

    def close(self) -> None:
        if self.launcher.poll() is None:
            self.launcher.kill()  # --kill-child: the init dies, and the kernel ends the rest
            self.launcher.wait()


class NamespacedDaemon:
    """A daemon in a PID namespace of its own, driven like a Popen: signals go to the daemon
    process itself (by its pid here), its exit comes from the launcher that waits for it."""

    def __init__(self, launcher: subprocess.Popen[bytes]) -> None:
        self.launcher = launcher

        def daemon() -> psutil.Process | None:
            with contextlib.suppress(psutil.Error):
                for proc in psutil.Process(launcher.pid).children(recursive=True):
                    if "launch.cli" in proc.cmdline():
                        return proc
            if launcher.poll() is not None:
                raise AssertionError(f"the namespaced daemon exited {launcher.returncode}")
            return None

        self.process: psutil.Process = wait_for(daemon, timeout=20, what="the daemon to start")
        self.pid = self.process.pid
        self.pid_ns = pid_namespace(self.pid)
        with open(f"/proc/{self.pid}/status") as f:
            nspid = next(line for line in f if line.startswith("NSpid:"))
        self.ns_pid = int(nspid.split()[-1])  # its pid inside its own namespace

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
        if sig in (signal.SIGCONT, signal.SIGKILL):
            # nsenter stops itself when its child stops, and only a SIGCONT of its own resumes
            # it (to reap the child, say after a kill -9)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.launcher.pid, signal.SIGCONT)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        return self.launcher.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.launcher.wait(timeout)


def lease_names(record: dict[str, Any], daemon: subprocess.Popen[bytes] | NamespacedDaemon) -> bool:
    """Whether the lease ``record`` was written by ``daemon`` (its pid is namespace-local)."""
    if isinstance(daemon, NamespacedDaemon):
        return (record.get("pid_ns"), record.get("pid")) == (daemon.pid_ns, daemon.ns_pid)
    return record.get("pid") == daemon.pid and record.get("pid_ns") in (None, pid_namespace())


class Bastion:
    """One ROOT, one work dir, and the CLI and daemon processes that use them."""

    def __init__(self, tmp: Path, root: str | None = None) -> None:
        self.tmp = tmp
        self.root = root or str(tmp / "root")
        self.work_dir = str(tmp / "work")
        self.env = {
            **os.environ,
            "BASTION_ROOT": self.root,
            "BASTION_USER": "tester",
            "XDG_STATE_HOME": str(tmp / "state"),
            "PYTHONPATH": str(REPO),
        }
        self.daemons: list[subprocess.Popen[bytes] | NamespacedDaemon] = []
        self._store: Store | None = None

    def cli(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "launch.cli", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"bastion {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def start(
        self,
        *args: str,
        poll: float = 0.2,
        work_dir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """A daemon subprocess; ``env`` overrides variables (e.g. a proxy's emulator host)."""
        proc = self._launch(self._daemon_argv(args, poll, work_dir), env)
        self.daemons.append(proc)
        return proc

    def start_namespaced(
        self,
        *args: str,
        poll: float = 0.2,
        work_dir: str | None = None,
        env: dict[str, str] | None = None,
        namespace: PidNamespace | None = None,
        private: tuple[Path, Path] | None = None,
    ) -> NamespacedDaemon:
        """A daemon in a PID namespace of its own: in ``namespace`` (it can be killed and
        started there again while its jobs run on), or else as pid 1 of a new one, with
        ``private`` bind-mounted there (a container: killing it ends everything in it)."""
        argv = self._daemon_argv(args, poll, work_dir)
        launcher = self._launch(
            namespace.enter(argv) if namespace else _in_new_namespace(private, argv), env
        )
        daemon = NamespacedDaemon(launcher)
        self.daemons.append(daemon)
        return daemon

    def _daemon_argv(self, args: tuple[str, ...], poll: float, work_dir: str | None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "launch.cli",
            "start",
            f"--poll_seconds={poll}",
            f"--work_dir={work_dir or self.work_dir}",
            *args,
        ]

    def _launch(self, argv: list[str], env: dict[str, str] | None) -> subprocess.Popen[bytes]:
        out = open(self.tmp / f"daemon-{len(self.daemons)}.out", "wb")  # noqa: SIM115
        return subprocess.Popen(
            argv, env={**self.env, **(env or {})}, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )

    def daemon_output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.tmp.glob("daemon-*.out")))

    def once(self, *args: str) -> None:
        self.cli("start", "--once", f"--work_dir={self.work_dir}", *args)

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.root)
        return self._store

    def read(self, *parts: str) -> bytes | None:
        """Any object under the root, through fsspec (works for a directory and gs://)."""
        return self.store.objects.read("/".join((self.store.root, *parts)))

    def put(self, *parts: str, data: str | bytes) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self.store.objects.write("/".join((self.store.root, *parts)), raw)

    def exists(self, *parts: str) -> bool:
        return self.read(*parts) is not None

    def listdir(self, *parts: str) -> list[str]:
        return sorted(self.store.objects.list("/".join((self.store.root, *parts))))

    def state(self, name: str) -> dict[str, Any] | None:
        raw = self.read("jobs", "states", name)
        return json.loads(raw) if raw else None

    def complete(self, name: str) -> dict[str, Any] | None:
        raw = self.read("jobs", "complete", name)
        return json.loads(raw) if raw else None

    def wait_complete(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        try:
            return wait_for(lambda: self.complete(name), timeout, what=f"{name} to complete")
        except AssertionError as e:
            raise AssertionError(f"{e}\ndaemon output:\n{self.daemon_output()[-4000:]}") from None

    def log(self, name: str) -> str:
        raw = self.read("logs", name)
        return raw.decode(errors="replace") if raw else ""

    def job_processes(self) -> list[psutil.Process]:
        return [p for p in processes_with_env("BASTION_ROOT", self.root) if p.pid != os.getpid()]

    def close(self) -> None:
        for proc in self.daemons:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        kill_all(self.job_processes())
