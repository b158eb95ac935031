"""Real processes on real directories: the CLI and the daemon run as subprocesses."""

from __future__ import annotations

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

REPO = Path(__file__).resolve().parent.parent


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1,
             what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


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

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "launch.cli", *args], env=self.env, cwd=REPO,
            capture_output=True, text=True, timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"bastion {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def start(self, *args: str, poll: float = 0.2) -> subprocess.Popen[bytes]:
        out = open(self.tmp / f"daemon-{len(self.daemons)}.out", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch.cli", "start", f"--poll_seconds={poll}",
             f"--work_dir={self.work_dir}", *args],
            env=self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )
        self.daemons.append(proc)
        return proc

    def daemon_output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.tmp.glob("daemon-*.out")))

    def once(self, *args: str) -> None:
        self.cli("start", "--once", f"--work_dir={self.work_dir}", *args)

    def state(self, name: str) -> dict[str, Any] | None:
        path = Path(self.root, "jobs", "states", name)
        return json.loads(path.read_text()) if path.exists() else None

    def complete(self, name: str) -> dict[str, Any] | None:
        path = Path(self.root, "jobs", "complete", name)
        return json.loads(path.read_text()) if path.exists() else None

    def wait_complete(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        return wait_for(lambda: self.complete(name), timeout, what=f"{name} to complete\n"
                        f"{self.daemon_output()[-3000:]}")

    def log(self, name: str) -> str:
        path = Path(self.root, "logs", name)
        return path.read_text() if path.exists() else ""

    def job_processes(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("BASTION_ROOT") == self.root and proc.pid != os.getpid():
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def close(self) -> None:
        for proc in self.daemons:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for proc in self.job_processes():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
