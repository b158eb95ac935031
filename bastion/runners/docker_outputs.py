"""The Docker runner's part of a job's outputs (composed into DockerRunner).

Before the container is made, the job's outputs are restored from the bucket into a host
directory named after the attempt (``<work_dir>/docker-outputs/<attempt>``), bound into the
container at the same path as ``$BASTION_OUTPUT_DIR``; once it runs, a detached watcher
(:mod:`bastion.outputs.watch`) syncs the directory from the host every few seconds and once
more when the container has ended, so a restarted daemon, a kill at the deadline or a
removed container lose nothing the job finished writing. The directory is removed with the
attempt, only once no watcher holds it (its final sync is done).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys

from bastion.outputs.checkpoint import read_checkpoint_time
from bastion.outputs.supervise import sync_seconds
from bastion.outputs.syncer import STATS, Syncer
from bastion.outputs.watch import RESTORED, SYNCED, final_sync, watching
from bastion.runners.base import Attempt, TryAgain


class DockerOutputs:
    def __init__(self, root: str, work_dir: str, docker_host: str | None) -> None:
        self.root = root
        from bastion.runners.local import default_attempts_dir

        # Beside the daemon's work (or, without one, this root's shared state on this host)
        self.base = os.path.join(
            os.path.abspath(work_dir or default_attempts_dir(root)), "docker-outputs"
        )
        self.docker_host = docker_host

    def dir(self, name: str) -> str:
        return os.path.join(self.base, name)

    def prepare(self, attempt: Attempt) -> dict[str, str]:
        """Restore the outputs (once per attempt: a start adopted after a lost answer finds
        them restored) and return the variables the container gets."""
        directory = self.dir(attempt.name)
        done = directory + RESTORED
        url = attempt.env.get("BASTION_OUTPUT_URL")
        if not url:
            return {}  # (a daemon that gives no outputs)
        if not os.path.exists(done):
            from bastion.bucket.store import Store

            shutil.rmtree(directory, ignore_errors=True)  # a restore cut short: again
            for kept in (".manifest.json", ".manifest.json" + STATS):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory + kept)
            try:
                Syncer(
                    Store(self.root).outputs,
                    attempt.job,
                    directory,
                    attempt=attempt.attempt,
                    manifest_path=directory + ".manifest.json",
                ).restore()
            except Exception as e:  # the bucket is down: the daemon tries the start again
                raise TryAgain(f"restoring the outputs from {url}: {e}") from e
            with open(done, "w"):
                pass
        os.makedirs(directory, exist_ok=True)
        return {"BASTION_OUTPUT_DIR": directory}

    def bind(self, name: str) -> str:
        return f"{self.dir(name)}:{self.dir(name)}:rw"

    def watch(self, attempt: Attempt) -> None:
        """Start the watcher (a second one exits at once: the first holds the lock)."""
        if not attempt.env.get("BASTION_OUTPUT_URL"):
            return
        argv = [
            sys.executable,
            "-m",
            "bastion.outputs.watch",
            f"--root={self.root}",
            f"--job={attempt.job}",
            f"--attempt={attempt.attempt}",
            f"--container={attempt.name}",
            f"--dir={self.dir(attempt.name)}",
            f"--sync_seconds={sync_seconds(dict(attempt.env))}",
            f"--purpose={attempt.env.get('BASTION_PURPOSE') or 'run'}",
        ]
        if self.docker_host:
            argv.append(f"--docker_host={self.docker_host}")
        log = open(self.dir(attempt.name) + ".watch.log", "ab")  # noqa: SIM115 (the child's)
        with log:
            subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the daemon
                close_fds=True,
            )

    def checkpoint(self, name: str) -> float | None:
        return read_checkpoint_time(self.dir(name))

    def release(self, name: str, job: str, attempt: int) -> bool:
        """Remove the attempt's directory once its final sync is done; False while its
        watcher is at work. A watcher that is gone (it crashed, the host rebooted) left the
        final sync undone: done here, under the same lock."""
        directory = self.dir(name)
        if os.path.exists(directory + RESTORED) and not os.path.exists(directory + SYNCED):
            with watching(directory) as mine:
                if not mine:
                    return False
                final_sync(self.root, job, attempt, directory)
        shutil.rmtree(directory, ignore_errors=True)
        kept = (".manifest.json", ".manifest.json" + STATS, ".watch", ".watch.log")
        for suffix in (RESTORED, SYNCED, *kept):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory + suffix)
        return not os.path.exists(directory)
