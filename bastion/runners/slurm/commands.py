"""Slurm's client commands as the runner calls them: counted, with Slurm's own words on a
refusal, and accounting asked once per finished job.

Why apart: every command goes through :meth:`SlurmCommands.run`, so the cost per cycle is
visible in one place (``calls``, for the benchmark and the cost tests), and the difference
between "Slurm cannot be reached" (try again next cycle) and "Slurm refused" (the user acts)
is decided once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

from bastion.runners.base import RunnerError, TryAgain
from bastion.runners.slurm.squeue import (
    SQUEUE_FORMAT,
    Row,
    exit_code,
    jobcomp,
    parse_squeue,
    scontrol_state,
)

COMMAND_TIMEOUT = 60.0
# Slurm cannot be reached (a transient condition; the same call may work next cycle).
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted|"
    r"Connection refused|Communication connection failure|Slurm backup controller in standby",
    re.IGNORECASE,
)


def brief(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class SlurmCommands:
    """``sbatch``, ``squeue``, ``scancel``, ``sacct``, ``scontrol`` from ``bin_dir`` or PATH."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.bin_dir = str(settings.get("bin_dir") or "")
        self.jobcomp_file = str(settings.get("jobcomp_file") or "")
        self._lock = threading.Lock()
        self._accounting: dict[int, tuple[str, int | None]] = {}  # job id -> (state, code)
        self.calls: dict[str, int] = {}  # Slurm commands run, by name (figures, tests)

    def _binary(self, name: str) -> str:
        if self.bin_dir:
            return os.path.join(self.bin_dir, name)
        found = shutil.which(name)
        if found is None:
            raise RunnerError(
                f"{name} is not on PATH: install Slurm's client commands on the "
                "daemon's machine (Debian: slurm-client) or set [runners.slurm] "
                "bin_dir"
            )
        return found

    def run(self, name: str, *args: str, input: str | None = None) -> str:
        """Run one Slurm command; its stdout. Slurm unreachable: TryAgain; any other refusal:
        RunnerError with Slurm's own message."""
        argv = [self._binary(name), *args]
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
        try:
            done = subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
            )
        except FileNotFoundError:
            raise RunnerError(
                f"{argv[0]} not found: install Slurm's client commands or fix "
                "[runners.slurm] bin_dir"
            ) from None
        except subprocess.TimeoutExpired:
            raise TryAgain(f"{name} did not answer within {COMMAND_TIMEOUT:.0f} s") from None
        if done.returncode != 0:
            message = brief(done.stderr or done.stdout or f"exit status {done.returncode}")
            if _UNREACHABLE.search(message):
                raise TryAgain(f"{name}: the Slurm controller is unreachable: {message}")
            raise RunnerError(f"{name} refused: {message}")
        return done.stdout

    def squeue(self, *args: str) -> list[Row]:
        """Every user's jobs Slurm still lists (pending ones give the queue's order)."""
        return parse_squeue(self.run("squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT, *args))

    def account(self, job_id: int) -> tuple[str, int | None] | None:
        """(state, exit code) of a job that left squeue: sacct, else the job-completion
        file; asked once per job."""
        with self._lock:
            if job_id in self._accounting:
                return self._accounting[job_id]
        found = None
        try:
            out = self.run("sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,ExitCode")
            for line in out.splitlines():
                state, _, code = line.partition("|")
                if state.strip():
                    found = (state.split()[0], exit_code(code))
                    break
        except (RunnerError, TryAgain):
            pass
        if found is None and self.jobcomp_file:
            found = jobcomp(self.jobcomp_file, job_id)
        if found is not None:
            with self._lock:
                self._accounting[job_id] = found
        return found

    def exit_code(self, job_id: int) -> int | None:
        """The job's exit code (``scontrol show job``), once per job."""
        with self._lock:
            if job_id in self._accounting:
                return self._accounting[job_id][1]
        try:
            out = self.run("scontrol", "show", "job", "-o", str(job_id))
        except (RunnerError, TryAgain):
            return None
        found = scontrol_state(out)
        with self._lock:
            self._accounting[job_id] = found
        return found[1]
