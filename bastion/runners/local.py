"""The local runner: a job is ``bash -c COMMAND`` in its own session on the daemon's machine.

Each attempt runs under a tiny ``sh`` wrapper that writes the command's exit status to a file,
so a daemon restarted after ``kill -9`` (no longer the parent, so unable to ``wait``) still
learns how an adopted attempt ended. Processes are identified by (pid, create time), so a
recycled pid is never mistaken for our job. Runners know nothing of quotas: they are told what
to start and which GPUs the job may use.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

# `trap : TERM INT` makes the wrapper wait for the command before exiting on a signal (the
# trap resets to the default in the child on exec), so a group-wide SIGTERM still records 143.
_WRAPPER = (
    'trap : TERM INT; bash -c "$1"; status=$?; '
    'printf "%s" "$status" > "$2.tmp" && mv "$2.tmp" "$2"; exit "$status"'
)
_CREATE_TIME_TOLERANCE = 0.05


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one attempt (or one cleanup) of a job."""

    key: str  # unique per (job, attempt, kind): names the attempt's work directory
    command: str
    env: Mapping[str, str]
    log_path: str
    gpus: int = 0


def detect_gpus() -> list[int]:
    """GPU indices reported by nvidia-smi, or [] on a machine without one."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [int(line) for line in out.split() if line.strip().isdigit()]


class LocalRunner:
    kind = "local"

    def __init__(self, work_dir: str, gpus: Sequence[int] | None = None) -> None:
        self.work_dir = work_dir
        self.host = socket.gethostname()
        self.gpus = list(detect_gpus() if gpus is None else gpus)
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # reaped by poll()
        self._gpus_in_use: dict[str, list[int]] = {}  # handle key -> GPU indices
        self._lock = threading.Lock()  # guards GPU allocation when attempts start in parallel
        self._log_dirs: set[str] = set()  # directories known to exist
        os.makedirs(os.path.join(work_dir, "attempts"), exist_ok=True)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, launch: Launch) -> dict[str, Any]:
        """Start an attempt; returns the handle to persist in the job state.

        Attempts are named by ``launch.key`` (job, submission, attempt). If a daemon started
        this very attempt and died before it could record the handle, the attempt's directory
        holds it, and that attempt is adopted instead of started a second time. Safe to call
        from several threads at once."""
        attempt_dir = os.path.join(self.work_dir, "attempts", launch.key)
        recorded = os.path.join(attempt_dir, "handle.json")
        exit_file = os.path.join(attempt_dir, "exit_status")
        try:
            os.mkdir(attempt_dir)  # a fresh directory: nothing recorded, nothing stale
        except FileNotFoundError:  # attempts/ itself was removed under us
            os.makedirs(attempt_dir)
        except FileExistsError:
            if os.path.exists(recorded):
                with open(recorded) as f:
                    handle = json.load(f)
                self.adopt(handle)
                return handle
            for stale in (exit_file, exit_file + ".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stale)
        gpus = self._allocate_gpus(launch.key, launch.gpus)
        try:
            env = {**os.environ, **launch.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
            log_dir = os.path.dirname(launch.log_path)
            if log_dir not in self._log_dirs:
                os.makedirs(log_dir, exist_ok=True)
                self._log_dirs.add(log_dir)
            log = os.open(launch.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            stdin = os.open(os.devnull, os.O_RDONLY)
            try:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", _WRAPPER, "bastion-job", launch.command, exit_file],
                    stdin=stdin,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    cwd=attempt_dir,
                    close_fds=True,
                )
            finally:
                os.close(log)
                os.close(stdin)
        except BaseException:
            with self._lock:
                self._gpus_in_use.pop(launch.key, None)  # nothing started: the GPUs stay free
            raise
        self._children[proc.pid] = proc
        handle = {
            "kind": self.kind,
            "key": launch.key,
            "host": self.host,
            "pid": proc.pid,
            "pgid": proc.pid,
            "create_time": psutil.Process(proc.pid).create_time(),
            "exit_file": exit_file,
            "log_path": launch.log_path,
            "gpus": gpus,
        }
        with open(recorded + ".tmp", "w") as f:
            json.dump(handle, f)
        os.replace(recorded + ".tmp", recorded)
        return handle

    def live_attempts(self) -> list[dict[str, Any]]:
        """Handles of attempts in our work dir whose processes still run."""
        root = os.path.join(self.work_dir, "attempts")
        found = []
        for key in sorted(os.listdir(root)):
            try:
                with open(os.path.join(root, key, "handle.json")) as f:
                    handle = json.load(f)
            except (OSError, ValueError):
                continue
            if self._alive(handle):
                found.append(handle)
        return found

    def adopt(self, handle: Mapping[str, Any]) -> bool:
        """Take over an attempt started by an earlier daemon; False if it is not ours/alive."""
        if handle.get("host") != self.host:
            return False
        with self._lock:
            self._gpus_in_use[handle["key"]] = list(handle.get("gpus") or [])
        return True

    def poll(self, handle: Mapping[str, Any]) -> tuple[bool, int | None]:
        """(finished, exit status); status is None when the attempt died without reporting."""
        if self._alive(handle):
            return False, None
        self._finish(handle)
        return True, self._read_exit_status(handle)

    def signal(self, handle: Mapping[str, Any], sig: int) -> None:
        """Send ``sig`` to the attempt's whole process group (its grandchildren too)."""
        if not self._alive(handle):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(handle["pgid"]), sig)

    def terminate(self, handle: Mapping[str, Any]) -> None:
        self.signal(handle, signal.SIGTERM)

    def kill(self, handle: Mapping[str, Any]) -> None:
        self.signal(handle, signal.SIGKILL)

    # -- internals -------------------------------------------------------------------------

    def _alive(self, handle: Mapping[str, Any]) -> bool:
        pid = int(handle["pid"])
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            return False  # our child, now reaped
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - float(handle["create_time"])) > _CREATE_TIME_TOLERANCE:
                return False  # the pid was recycled by another process
            return proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def _finish(self, handle: Mapping[str, Any]) -> None:
        """The leader is gone: kill what it left behind in its group and free its GPUs."""
        self._children.pop(int(handle["pid"]), None)
        with self._lock:
            self._gpus_in_use.pop(handle.get("key", ""), None)
        if self._group_id_reused(handle):
            return  # the kernel reuses a group id only once the group is empty: nothing left
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(handle["pgid"]), signal.SIGKILL)

    @staticmethod
    def _group_id_reused(handle: Mapping[str, Any]) -> bool:
        """True when another process now owns our leader's pid (so our group is empty)."""
        try:
            leader = psutil.Process(int(handle["pgid"]))
            return abs(leader.create_time() - float(handle["create_time"])) > _CREATE_TIME_TOLERANCE
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    @staticmethod
    def _read_exit_status(handle: Mapping[str, Any]) -> int | None:
        try:
            with open(handle["exit_file"]) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def _allocate_gpus(self, key: str, count: int) -> list[int]:
        if count <= 0:
            return []
        with self._lock:
            busy = {gpu for gpus in self._gpus_in_use.values() for gpu in gpus}
            free = [gpu for gpu in self.gpus if gpu not in busy]
            if len(free) < count:
                raise RuntimeError(
                    f"job needs {count} GPUs but only {len(free)} of {len(self.gpus)} are free "
                    f"on {self.host}"
                )
            self._gpus_in_use[key] = free[:count]
            return free[:count]
