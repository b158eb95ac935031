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

from bastion.store import Store

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
        self.daemons: list[subprocess.Popen[bytes]] = []
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
        out = open(self.tmp / f"daemon-{len(self.daemons)}.out", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "launch.cli",
                "start",
                f"--poll_seconds={poll}",
                f"--work_dir={work_dir or self.work_dir}",
                *args,
            ],
            env={**self.env, **(env or {})},
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        self.daemons.append(proc)
        return proc

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
