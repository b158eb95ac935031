"""Assembling and starting the daemon: work directory, lock, logging, runners, quota source.

Daemon-wide runner settings come from a TOML file (``--settings``)::

    default_runner = "local"          # for jobs whose spec names no runner
    start_give_up_seconds = 600       # a start failing transiently this long fails its job

    [runners.local]
    gpus = [0, 1]                     # default: what nvidia-smi reports

    [runners.docker]
    image = "python:3.11-slim"        # for jobs that name no image
    docker_host = "unix:///run/docker.sock"
    network = "host"

Every runner also gets ``root`` (the daemon's root URL) and ``work_dir``.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import sys
import time
import tomllib
from collections.abc import Mapping
from typing import Any

from bastion.bucket.store import Store
from bastion.daemon import DEFAULT_START_GIVE_UP_SECONDS, Daemon
from bastion.daemon.readiness import check_runners
from bastion.lease import Lease, process_identity
from bastion.quota_source import QuotaSource, machine_pool
from bastion.runners.base import RunnerError, known_kinds
from bastion.runners.instances import Runners, instance_types_kind

log = logging.getLogger("bastion")


def default_work_dir(root: str) -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    return os.path.join(base, "bastion", hashlib.sha1(root.encode()).hexdigest()[:12])


def _lock_work_dir(work_dir: str, root: str = "") -> int:
    """One daemon per work directory on this machine: a second one would start jobs twice.
    The refusal says which daemon holds the root and how to stop it (after the demo, its
    daemon holds the default root: a user following the README meets this first)."""
    fd = os.open(os.path.join(work_dir, "daemon.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        pid = holder or "?"
        raise SystemExit(
            f"bastion: a daemon (pid {pid}) already runs on {root or work_dir} from this "
            f"machine (work dir {work_dir}); it runs the root's jobs, so there is no need for "
            f"another: use it (bastion status), or stop it first with: kill {pid}"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _setup_logging(path: str) -> None:
    """The daemon's log file (mirrored to ``ROOT/logs/<bastion-name>``). Lines can carry
    names from the bucket that are not UTF-8 (a spec file named ``b'bad\\xff'`` is listed as
    ``'bad\\udcff'``): the file writes them as ``\\udcff`` instead of failing with "Logging
    error: surrogates not allowed" and losing the line that says why the spec was rejected."""
    handler = logging.FileHandler(path, encoding="utf-8", errors="backslashreplace")
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


class SettingsError(ValueError):
    """A daemon settings file that cannot be used; the message names the file and key."""


def load_settings(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise SettingsError(f"{path}: cannot read the settings file: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: not valid TOML: {e}") from None
    unknown = set(data) - {"default_runner", "start_give_up_seconds", "runners"}
    if unknown:
        raise SettingsError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}; "
            "use default_runner, start_give_up_seconds and [runners.KIND] tables"
        )
    give_up = data.get("start_give_up_seconds", DEFAULT_START_GIVE_UP_SECONDS)
    if isinstance(give_up, bool) or not isinstance(give_up, int | float) or not give_up >= 0:
        raise SettingsError(
            f"{path}: start_give_up_seconds = {give_up!r} must be a number of seconds >= 0 "
            f"(default {DEFAULT_START_GIVE_UP_SECONDS:g})"
        )
    runners = data.get("runners", {})
    if not isinstance(runners, Mapping):
        raise SettingsError(f"{path}: runners must be a table of [runners.KIND] tables")
    for kind in runners:
        if kind not in known_kinds():
            raise SettingsError(
                f"{path}: [runners.{kind}]: unknown runner kind; use one of "
                f"{', '.join(known_kinds())}"
            )
    try:
        instance_types_kind(runners)
    except RunnerError as e:
        raise SettingsError(f"{path}: {e}") from None
    default = data.get("default_runner", "local")
    if default not in known_kinds():
        raise SettingsError(
            f"{path}: default_runner = {default!r} is not a runner kind; use one of "
            f"{', '.join(known_kinds())}"
        )
    return data


def build_daemon(
    root: str,
    work_dir: str | None = None,
    quota_file: str | None = None,
    grace_seconds: float = 30.0,
    gpus: list[int] | None = None,
    lease_seconds: float | None = None,
    settings: Mapping[str, Any] | None = None,
) -> Daemon:
    """The daemon with its parts; with ``lease_seconds`` it acts only while it holds the lease."""
    store = Store(root)
    work_dir = os.path.abspath(work_dir or default_work_dir(store.root_url))
    os.makedirs(work_dir, exist_ok=True)
    settings = settings or {}
    per_kind: dict[str, dict[str, Any]] = {}
    for kind in known_kinds():
        options = dict((settings.get("runners") or {}).get(kind, {}))
        options.setdefault("root", store.root_url)
        options.setdefault("work_dir", work_dir)
        if gpus is not None:
            options.setdefault("gpus", gpus)
        per_kind[kind] = options
    runners = Runners(
        per_kind,
        default=settings.get("default_runner", "local"),
        configured=frozenset(settings.get("runners") or {}),
    )
    local = runners.get("local")  # the machine's pool is what the local runner can hand out
    quota = QuotaSource(store, quota_file, machine_pool(getattr(local, "gpus", [])))
    lease = None
    if lease_seconds:
        # (renewals on connections of their own: never queued behind a burst's requests)
        lease = Lease(
            store.own_connection("bastion-lease"),
            process_identity(work_dir),
            duration=lease_seconds,
        )
    return Daemon(
        store,
        runners,
        work_dir,
        quota,
        grace_seconds=grace_seconds,
        lease=lease,
        start_give_up_seconds=float(
            settings.get("start_give_up_seconds", DEFAULT_START_GIVE_UP_SECONDS)
        ),
    )


def start_daemon(
    root: str,
    work_dir: str | None,
    quota_file: str | None,
    poll_seconds: float,
    once: bool,
    grace_seconds: float,
    lease_seconds: float = 60.0,
    settings_file: str | None = None,
) -> int:
    settings = load_settings(settings_file)
    work_dir = os.path.abspath(work_dir or default_work_dir(root))
    os.makedirs(work_dir, exist_ok=True)
    lock = _lock_work_dir(work_dir, root)
    daemon = build_daemon(
        root, work_dir, quota_file, grace_seconds, lease_seconds=lease_seconds, settings=settings
    )
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
    check_runners(daemon.runners)
    daemon.ctx.info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "pool": daemon.quota.machine_pool,
        "quota_file": daemon.quota.url,
        "poll_seconds": poll_seconds,
        "work_dir": work_dir,
        "log": daemon.store.logs.url(daemon.daemon_log),
    }
    try:
        daemon.run(poll_seconds, once=once)
        daemon.close()
    finally:
        os.close(lock)
    return 0
