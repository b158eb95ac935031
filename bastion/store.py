"""The bucket store: the only code that knows Bastion's object paths.

Everything goes through fsspec, so a local directory, ``gs://`` (gcsfs) and ``s3://`` (s3fs)
share one implementation. Every call is counted, because "a steady-state cycle only lists" is
an invariant we measure (benchmarks/bench_cycle.py), not a hope.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from bastion.jobspec import name_problem

ACTIVE, STATES, USER_STATES, COMPLETE = "active", "states", "user_states", "complete"
DAEMON_LOG = "_bastion"  # names starting with "_" are never job names
CLEANUP_SUFFIX = ".cleanup"


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about one object: enough to tell whether it changed."""

    name: str
    size: int
    token: str  # generation, ETag or (mtime, size, inode): differs after every rewrite


def _token(info: dict[str, Any]) -> str:
    for key in ("generation", "ETag", "etag", "md5Hash"):
        if info.get(key):
            return f"{key}:{info[key]}"
    return f"{info.get('mtime')}:{info.get('size')}:{info.get('ino')}"


def default_root() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return os.path.join(base, "bastion")


def resolve_root(root: str | None) -> str:
    """--root, else $BASTION_ROOT, else a local directory in the user's data home."""
    return root or os.environ.get("BASTION_ROOT") or default_root()


class Store:
    def __init__(self, root: str, **storage_options: Any) -> None:
        self.root_url = root
        self.fs, path = fsspec.core.url_to_fs(root, **storage_options)
        self.root = path.rstrip("/")
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.ops: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        if self.is_local:
            for sub in (
                f"jobs/{ACTIVE}",
                f"jobs/{STATES}",
                f"jobs/{USER_STATES}",
                f"jobs/{COMPLETE}",
                "logs",
                "history/jobs",
                "history/decisions",
            ):
                os.makedirs(self._path(sub), exist_ok=True)

    # -- bookkeeping -----------------------------------------------------------------------

    def _count(self, op: str) -> None:
        with self._lock:
            self.ops[op] += 1

    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def url(self, *parts: str) -> str:
        """A URL a user can paste into gsutil/ls, for messages."""
        return "/".join((self.root_url.rstrip("/"), *parts))

    # -- primitives ------------------------------------------------------------------------

    def _list(self, directory: str) -> dict[str, ObjectInfo]:
        self._count("list")
        path = self._path(directory)
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return {}
        found = {}
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "directory" or name.startswith("."):
                continue  # temporary files of atomic writes start with "."
            found[name] = ObjectInfo(name, int(entry.get("size") or 0), _token(entry))
        return found

    def _read(self, *parts: str) -> bytes | None:
        self._count("read")
        try:
            return self.fs.cat_file(self._path(*parts))
        except FileNotFoundError:
            return None

    def _write(self, data: bytes, *parts: str) -> None:
        """Replace an object atomically: readers see the old or the new bytes, never half."""
        self._count("write")
        path = self._path(*parts)
        if self.is_local:
            directory, name = path.rsplit("/", 1)
            tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, data)

    def _create(self, data: bytes, *parts: str) -> bool:
        """Write only if absent; False when the object already exists."""
        self._count("write")
        path = self._path(*parts)
        if self.is_local:
            directory, name = path.rsplit("/", 1)
            tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            try:
                os.link(tmp, path)  # atomic create-if-absent
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            return True
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    def _delete(self, *parts: str) -> None:
        self._count("delete")
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(*parts))

    def _size(self, *parts: str) -> int:
        self._count("info")
        try:
            return int(self.fs.size(self._path(*parts)) or 0)
        except FileNotFoundError:
            return 0

    def _read_range(self, start: int, *parts: str) -> bytes:
        self._count("read")
        try:
            return self.fs.cat_file(self._path(*parts), start=start)
        except FileNotFoundError:
            return b""

    def _append(self, data: bytes, *parts: str) -> None:
        self._count("append")
        path = self._path(*parts)
        if self.is_local:
            with open(path, "ab") as f:
                f.write(data)
            return
        # Generic fallback: read-modify-write (O(object size)); backends with a native
        # append (GCS compose) override this.
        try:
            old = self.fs.cat_file(path)
        except FileNotFoundError:
            old = b""
        self.fs.pipe_file(path, old + data)

    # -- job specs (written by users) ------------------------------------------------------

    def list_specs(self) -> dict[str, ObjectInfo]:
        return self._list(f"jobs/{ACTIVE}")

    def read_spec(self, name: str) -> bytes | None:
        return self._read("jobs", ACTIVE, name)

    def submit_spec(self, name: str, data: bytes) -> bool:
        """Create a spec; False when a job of that name is already active."""
        return self._create(data, "jobs", ACTIVE, name)

    def replace_spec(self, name: str, data: bytes) -> None:
        self._write(data, "jobs", ACTIVE, name)

    def delete_spec(self, name: str) -> None:
        self._delete("jobs", ACTIVE, name)

    # -- job states (written only by the daemon) -------------------------------------------

    def list_states(self) -> dict[str, ObjectInfo]:
        return self._list(f"jobs/{STATES}")

    def read_state(self, name: str) -> bytes | None:
        return self._read("jobs", STATES, name)

    def write_state(self, name: str, data: bytes) -> None:
        self._write(data, "jobs", STATES, name)

    def delete_state(self, name: str) -> None:
        self._delete("jobs", STATES, name)

    # -- user requests (cancel) ------------------------------------------------------------

    def list_requests(self) -> dict[str, ObjectInfo]:
        return self._list(f"jobs/{USER_STATES}")

    def read_request(self, name: str) -> bytes | None:
        return self._read("jobs", USER_STATES, name)

    def write_request(self, name: str, data: bytes) -> None:
        self._write(data, "jobs", USER_STATES, name)

    def delete_request(self, name: str) -> None:
        self._delete("jobs", USER_STATES, name)

    # -- completed jobs --------------------------------------------------------------------

    def list_complete(self) -> dict[str, ObjectInfo]:
        return self._list(f"jobs/{COMPLETE}")

    def read_complete(self, name: str) -> dict[str, Any] | None:
        raw = self._read("jobs", COMPLETE, name)
        return json.loads(raw) if raw else None

    def write_complete(self, name: str, record: dict[str, Any]) -> None:
        self._write(json.dumps(record, sort_keys=True).encode(), "jobs", COMPLETE, name)

    # -- logs and history ------------------------------------------------------------------

    @staticmethod
    def log_name(name: str, cleanup: bool = False) -> str:
        return name + CLEANUP_SUFFIX if cleanup else name

    def log_size(self, log: str) -> int:
        return self._size("logs", log)

    def read_log(self, log: str, start: int = 0) -> bytes:
        return self._read_range(start, "logs", log)

    def append_log(self, log: str, data: bytes) -> None:
        self._append(data, "logs", log)

    def append_history(self, name: str, event: dict[str, Any]) -> None:
        self._append((json.dumps(event, sort_keys=True) + "\n").encode(), "history", "jobs", name)

    def read_history(self, name: str) -> Iterator[dict[str, Any]]:
        raw = self._read("history", "jobs", name) or b""
        for line in raw.decode(errors="replace").splitlines():
            if line.strip():
                yield json.loads(line)

    # -- scheduler decision log and usage ledger ------------------------------------------

    def write_decisions(self, now: float, record: dict[str, Any]) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f".{int(now * 1e6) % 10**6:06d}"
        self._write(json.dumps(record, sort_keys=True).encode(), "history", "decisions", stamp)

    def list_decisions(self) -> list[str]:
        return sorted(self._list("history/decisions"))

    def read_decisions(self, stamp: str) -> dict[str, Any] | None:
        raw = self._read("history", "decisions", stamp)
        return json.loads(raw) if raw else None

    def prune_decisions(self, keep: int) -> None:
        """Keep the newest ``keep`` records (names sort by time)."""
        for stamp in self.list_decisions()[:-keep]:
            self._delete("history", "decisions", stamp)

    def write_daemon_info(self, info: dict[str, Any]) -> None:
        self._write(json.dumps(info, sort_keys=True).encode(), "history", "daemon")

    def read_daemon_info(self) -> dict[str, Any] | None:
        raw = self._read("history", "daemon")
        return json.loads(raw) if raw else None

    def write_last_good_quota(self, text: str) -> None:
        self._write(text.encode(), "history", "quota-last-good")

    def read_last_good_quota(self) -> str | None:
        raw = self._read("history", "quota-last-good")
        return raw.decode() if raw else None

    def read_usage(self) -> dict[str, Any] | None:
        raw = self._read("history", "usage")
        return json.loads(raw) if raw else None

    def write_usage(self, data: dict[str, Any]) -> None:
        self._write(json.dumps(data, sort_keys=True).encode(), "history", "usage")

    # -- quota file ------------------------------------------------------------------------

    def default_quota_url(self) -> str:
        return self.url("project-quotas", "project-quotas.config")

    def url_token(self, url: str) -> str | None:
        """Change token of any object (the quota file may live in another bucket)."""
        self._count("info")
        fs, path = fsspec.core.url_to_fs(url)
        fs.invalidate_cache(path)
        try:
            return _token(fs.info(path))
        except FileNotFoundError:
            return None

    def read_url(self, url: str) -> bytes:
        self._count("read")
        fs, path = fsspec.core.url_to_fs(url)
        return fs.cat_file(path)


def is_job_name(name: str) -> bool:
    return name_problem(name) is None
