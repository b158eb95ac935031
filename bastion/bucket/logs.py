"""``ROOT/logs/``: one object per job (its output, appended by the daemon), one per job's
cleanup, and one per daemon installation (``_bastion-<host>-<hash>``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from bastion.bucket.counted import CountedObjects
from bastion.bucket.objects import ObjectInfo

LOGS = "logs"
DAEMON_LOG_PREFIX = "_bastion-"  # names starting with "_" are never job names
CLEANUP_SUFFIX = ".cleanup"


def job_log_name(name: str, cleanup: bool = False) -> str:
    """The log of job ``name``, or of its cleanup."""
    return name + CLEANUP_SUFFIX if cleanup else name


def daemon_log_name(host: str, work_dir: str) -> str:
    """One log object per daemon installation: restarts append, two daemons never mix."""
    return f"{DAEMON_LOG_PREFIX}{host}-{hashlib.sha1(work_dir.encode()).hexdigest()[:6]}"


class Logs:
    """Append-only logs; readers stream them in bounded pieces."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def url(self, log: str) -> str:
        return self._bucket.url(LOGS, log)

    def list(self) -> dict[str, ObjectInfo]:
        return self._bucket.list(LOGS)

    def size(self, log: str) -> int:
        return self._bucket.size(LOGS, log)

    def read(self, log: str, start: int = 0) -> bytes:
        return self._bucket.read_range(start, LOGS, log)

    def append(self, log: str, data: bytes, size: int | None = None) -> None:
        """Append to a log; ``size``, if known, is its current size (saves a request)."""
        self._bucket.append(data, LOGS, log, size=size)

    def read_chunks(self, log: str, start: int = 0, chunk: int = 1 << 20) -> Iterator[bytes]:
        """A log from ``start`` to its current end, in pieces of at most ``chunk`` bytes, so a
        reader's memory stays bounded whatever the log's size; nothing when it is absent.
        For the client (launch/): the daemon does not use it."""
        info = self._bucket.info(LOGS, log)
        if info is None:
            return
        end = info.size
        try:  # a link planted in logs/ of a local root is not followed
            f = self._bucket.open(LOGS, log, follow_links=False)
        except FileNotFoundError:
            return
        with f:
            f.seek(start)
            position = start
            while position < end:
                data = f.read(min(chunk, end - position))
                if not data:
                    return
                position += len(data)
                yield data
