"""Following a job's log as it is written (``bastion logs --follow``, ``Client.follow_log``):
retrying a bucket that fails for a while, and giving up when no daemon acts on the root."""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator

from bastion.jobstate import Outcome
from launch.api import (
    LOG_CHUNK,
    MAX_FOLLOW_FAILURES,
    NO_DAEMON_SECONDS,
    Client,
    JobInfo,
    NoDaemon,
    UnknownJob,
)


def follow_log(
    client: Client,
    name: str,
    poll_seconds: float = 1.0,
    timeout: float | None = None,
    no_daemon_timeout: float | None = NO_DAEMON_SECONDS,
    on_poll: Callable[[JobInfo], None] | None = None,
) -> Iterator[str]:
    """Yield log text as it is written; returns once the job is finished. ``on_poll`` sees
    the job at every poll while it is not finished (the CLI says what it waits for).

    A failed bucket request is retried (the bucket may be briefly unreachable); only
    ``MAX_FOLLOW_FAILURES`` failures in a row give up. When no daemon acts on the root
    (its lease is absent, released or stale) for ``no_daemon_timeout`` seconds in a row,
    raises NoDaemon saying since when (None: wait forever)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    info = client.get(name)
    offset: int | None = None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    failures = 0
    no_daemon_since: float | None = None
    while True:
        try:
            if offset is None and info.state is not None and info.state.attempt > 0:
                offset = info.state.log_start
            if offset is not None:
                for data in client.store.logs.read_chunks(name, offset, LOG_CHUNK):
                    offset += len(data)
                    yield decoder.decode(data)
            if info.finished:
                if info.state and info.state.outcome is Outcome.REJECTED:
                    yield f"[bastion] job {name} was rejected: {info.state.reason}\n"
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield tail
                return
            if on_poll is not None:
                on_poll(info)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {name!r} still {info.status} after {timeout}s")
            if no_daemon_timeout is not None:
                status = client.daemon_status()
                if not status.stopped:
                    no_daemon_since = None
                elif no_daemon_since is None:
                    no_daemon_since = time.monotonic()
                elif time.monotonic() - no_daemon_since >= no_daemon_timeout:
                    raise NoDaemon(
                        f"job {name} is {info.status} and nothing will change: {status.message}"
                    )
            time.sleep(poll_seconds)
            info = client.get(name)
            failures = 0
        except (UnknownJob, TimeoutError, NoDaemon):
            raise
        except Exception:
            failures += 1
            if failures >= MAX_FOLLOW_FAILURES:
                raise
            time.sleep(min(30.0, poll_seconds * 2**failures))
