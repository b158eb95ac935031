"""What a user needs to know before trusting what the bucket says: is a daemon acting on the
root, does the root exist, and is the quota file the daemon runs on the one in the bucket.

All of it is read from the bucket (the lease record ``ROOT/lease``, ``ROOT/history/daemon``,
``ROOT/history/quota-last-good``), so it works from any machine. Staleness is judged by wall
clock against the lease's own ``renewed`` and ``duration``: a user's view, good for a message,
never used to decide anything (the daemons fence themselves on their own monotonic clocks).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import fsspec

from bastion.bucket.store import Store

PROBE_SECONDS = 8.0  # how long a verb waits for an unreachable bucket (BASTION_PROBE_SECONDS)


def probe_seconds() -> float:
    """The probe's bound: ``BASTION_PROBE_SECONDS`` where a slow link or a starved machine
    needs more than the default (a bad value is named, not ignored)."""
    text = os.environ.get("BASTION_PROBE_SECONDS", "").strip()
    if not text:
        return PROBE_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise RootProblem(
            f"BASTION_PROBE_SECONDS={text!r} is not a number of seconds in (0, 3600]; "
            "unset it or give e.g. 30"
        )
    return seconds


class RootProblem(Exception):
    """The root cannot be used (missing, not a directory, unreadable, unreachable); one line."""


class NoDaemon(RuntimeError):
    """No daemon acts on the root (``logs --follow`` gave up waiting for one)."""


class NoDaemonWarning(UserWarning):
    """Client.submit wrote the spec, but no daemon acts on the root to run it."""


def human_time(stamp: float, now: float | None = None) -> str:
    """``2024-05-01 12:00:03 UTC (5m ago)``."""
    now = time.time() if now is None else now
    text = dt.datetime.fromtimestamp(stamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{text} ({human_duration(now - stamp)} ago)" if now >= stamp else text


def human_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


_EPOCH = re.compile(r"\bt=(1[0-9]{9}(?:\.[0-9]+)?)\b")


def humanize_epochs(text: str) -> str:
    """``submitted t=1714564803`` -> ``submitted 2024-05-01 12:00:03 UTC``."""
    return _EPOCH.sub(
        lambda m: dt.datetime.fromtimestamp(float(m.group(1)), dt.UTC).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        ),
        text,
    )


@dataclass
class DaemonStatus:
    """``acting`` is None when it cannot be told (a daemon run with --lease_seconds=0)."""

    acting: bool | None
    message: str
    record: dict[str, Any] | None = None

    @property
    def stopped(self) -> bool:
        return self.acting is False


def daemon_status(store: Store, now: float | None = None) -> DaemonStatus:
    now = time.time() if now is None else now
    root = store.root_url
    fix = f"start one: bastion start --root={root}"
    lease = store.lease.read()
    if lease is None:
        if store.daemon_info.read():
            return DaemonStatus(None, f"a daemon without a lease ran on {root}; cannot tell")
        return DaemonStatus(False, f"no daemon has ever run on {root}; {fix}")
    record, _ = lease
    if not record:
        return DaemonStatus(None, f"the lease of {root} is unreadable; cannot tell", record)
    who = f"{record.get('host', '?')} pid {record.get('pid', '?')}"
    try:
        renewed = float(record.get("renewed", 0))
        duration = float(record.get("duration", 60))
    except (TypeError, ValueError):
        return DaemonStatus(None, f"the lease of {root} is unreadable; cannot tell", record)
    if record.get("released"):
        return DaemonStatus(
            False,
            f"no daemon has held {root} since {human_time(renewed, now)} "
            f"(the daemon on {who} stopped); {fix}",
            record,
        )
    if now - renewed > duration:
        return DaemonStatus(
            False,
            f"no daemon has held {root} since {human_time(renewed, now)} "
            f"(the daemon on {who} stopped renewing its lease); {fix}",
            record,
        )
    return DaemonStatus(
        True,
        f"the daemon on {who} holds {root} (renewed {human_duration(now - renewed)} ago)",
        record,
    )


# -- the root itself ---------------------------------------------------------------------------


def _local_path(root: str) -> str | None:
    if fsspec.utils.get_protocol(root) in ("file", "local"):
        return fsspec.core.strip_protocol(root) if "://" in root else os.path.abspath(root)
    return None


def check_root(root: str, reading: bool) -> None:
    """Before a Store is made (which creates a local root's directories): RootProblem when the
    root is a file, missing (for a reading verb), or a bucket that does not answer in time."""
    fix = "check --root or $BASTION_ROOT"
    path = _local_path(root)
    if path is not None:
        if os.path.exists(path) and not os.path.isdir(path):
            raise RootProblem(f"root {root} is a file, not a directory; {fix}")
        if reading and not os.path.isdir(path):
            raise RootProblem(
                f"no Bastion root at {root} (the directory does not exist); {fix} "
                "(`bastion start` or `bastion launch` create one)"
            )
        if reading and not os.access(path, os.R_OK | os.X_OK):
            raise RootProblem(f"root {root} is not readable by this user; {fix}")
        return
    # The filesystem's code is imported before the clock starts: that is CPU, not the network,
    # and a machine busy starting a burst of jobs took longer than the bound to import gcsfs.
    protocol = fsspec.utils.get_protocol(root)
    try:
        fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as e:
        raise RootProblem(f"root {root}: {protocol}:// cannot be opened ({brief(e)}); {fix}") from e
    names = _probe_bucket(root, probe_seconds())
    if reading and not names:
        raise RootProblem(f"no Bastion root at {root} (nothing there); {fix}")


def _probe_bucket(root: str, bound: float) -> list[str]:
    """The names at a bucket root, listed within ``bound`` seconds (retried on errors until
    then); RootProblem when it does not answer in time."""
    result: dict[str, Any] = {}

    def probe() -> None:
        last: BaseException | None = None
        try:
            store = Store(root)  # in the thread: making a bucket's client can hang too
        except Exception as e:
            result["error"] = e
            return
        result["client"] = True
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            try:
                store.fs.invalidate_cache(store.root)
                result["names"] = store.fs.ls(store.root, detail=False)
                return
            except FileNotFoundError:
                result["names"] = []
                return
            except Exception as e:  # transient or not: try again until the deadline
                last = e
                time.sleep(0.5)
        result["error"] = last

    thread = threading.Thread(target=probe, name="probe-root", daemon=True)
    thread.start()
    thread.join(bound + 1)  # a probe still hanging then is left behind (daemon thread)
    if "client" in result and not {"names", "error"} & result.keys():
        # The client came (late: a loaded machine's credentials): the listing itself gets its
        # whole bound, as it did before the client was made in here.
        thread.join(bound + 1)
    if "names" not in result:
        error = result.get("error")
        why = f" ({brief(error)})" if error else ""
        raise RootProblem(
            f"cannot reach {root} within {bound:g}s{why}; check the URL, the network "
            "and the credentials (gcloud auth application-default login, AWS_*); on a slow "
            "link set BASTION_PROBE_SECONDS"
        )
    return list(result["names"])


def brief(error: BaseException | None) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ") if error else ""
    return text if len(text) <= 200 else text[:199] + "…"


def is_local_objects(store: Store) -> bool:
    return store.is_local
