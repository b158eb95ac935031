"""Assembling and starting the daemon: work directory, lock, logging, runner, quota source."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import sys
import time

from bastion.daemon import Daemon
from bastion.lease import Lease
from bastion.quotas import QuotaSource, machine_pool
from bastion.runners.local import LocalRunner
from bastion.store import Store

log = logging.getLogger("bastion")


def default_work_dir(root: str) -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    return os.path.join(base, "bastion", hashlib.sha1(root.encode()).hexdigest()[:12])


def _lock_work_dir(work_dir: str) -> int:
    """One daemon per work directory on this machine: a second one would start jobs twice."""
    fd = os.open(os.path.join(work_dir, "daemon.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        raise SystemExit(
            f"bastion: another daemon (pid {holder or '?'}) already runs on "
            f"{work_dir}; stop it first"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _setup_logging(path: str) -> None:
    handler = logging.FileHandler(path)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {socket.gethostname()} %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    if not root.handlers:  # absl's app.run installs a stderr handler; plain callers get one
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        root.addHandler(console)
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def build_daemon(
    root: str,
    work_dir: str | None = None,
    quota_file: str | None = None,
    grace_seconds: float = 30.0,
    gpus: list[int] | None = None,
    lease_seconds: float | None = None,
) -> Daemon:
    """The daemon with its parts; with ``lease_seconds`` it acts only while it holds the lease."""
    store = Store(root)
    work_dir = os.path.abspath(work_dir or default_work_dir(store.root_url))
    os.makedirs(work_dir, exist_ok=True)
    runner = LocalRunner(work_dir, gpus=gpus)
    quota = QuotaSource(store, quota_file, machine_pool(runner.gpus))
    lease = None
    if lease_seconds:
        host = socket.gethostname()
        lease = Lease(
            store,
            owner=f"{host}:{os.getpid()}:{work_dir}",
            duration=lease_seconds,
            # Our predecessor on this host and work dir is dead: we hold its flock.
            same_owner=lambda r: str(r.get("owner", "")).split(":", 2)[::2] == [host, work_dir],
        )
    return Daemon(store, runner, work_dir, quota, grace_seconds=grace_seconds, lease=lease)


def start_daemon(
    root: str,
    work_dir: str | None,
    quota_file: str | None,
    poll_seconds: float,
    once: bool,
    grace_seconds: float,
    lease_seconds: float = 60.0,
) -> int:
    work_dir = os.path.abspath(work_dir or default_work_dir(root))
    os.makedirs(work_dir, exist_ok=True)
    lock = _lock_work_dir(work_dir)
    daemon = build_daemon(root, work_dir, quota_file, grace_seconds, lease_seconds=lease_seconds)
    _setup_logging(daemon.daemon_log_path())
    log.info(
        "bastion daemon pid %d on %s: root %s, work dir %s, quota %s, poll %ss",
        os.getpid(),
        socket.gethostname(),
        root,
        work_dir,
        daemon.quota.url,
        poll_seconds,
    )
    daemon.info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "pool": daemon.quota.machine_pool,
        "quota_file": daemon.quota.url,
        "poll_seconds": poll_seconds,
        "work_dir": work_dir,
        "log": daemon.store.url("logs", daemon.daemon_log),
    }
    try:
        daemon.run(poll_seconds, once=once)
    finally:
        os.close(lock)
    return 0
