"""The store's primitives: one backend, one root, and a count of every request.

Every namespace of the store (``specs``, ``states``, ``logs``...) reads and writes through one
``CountedObjects``, so "a steady-state cycle only lists" stays an invariant we measure
(benchmarks/, ``Store.ops``), not a hope. Paths are ``(root, *parts)`` joined by "/"; only the
namespaces under ``bastion/bucket/`` choose the parts.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import threading
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, BinaryIO

import fsspec
from fsspec import AbstractFileSystem

from bastion.bucket.local import LocalObjects
from bastion.bucket.objects import Created, ObjectInfo, Objects, TokenRead, TokenWrite

REQUEST_TIMEOUT_SECONDS = 60.0  # one bucket request; gcsfs retries transient failures itself


def default_options(root: str, options: dict[str, Any]) -> dict[str, Any]:
    """Every bucket call gets a timeout: a hung request must not hang the daemon's cycle."""
    if fsspec.utils.get_protocol(root) in ("gs", "gcs"):
        import aiohttp

        options.setdefault(
            "requests_timeout",
            # sock_read: a stalled read raises an error gcsfs retries; total bounds the rest
            aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS, sock_connect=10, sock_read=20),
        )
    return options


class CountedObjects:
    """The backend's primitives on paths relative to the root, each counted by kind
    (``list``, ``read``, ``write``, ``delete``, ``info``, ``append``)."""

    def __init__(self, fs: AbstractFileSystem, objects: Objects, root: str, root_url: str) -> None:
        self.fs = fs
        self.objects = objects
        self.root = root
        self.root_url = root_url
        self.ops: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    @property
    def is_local(self) -> bool:
        """A local directory: its own calls follow no link (fsspec's would)."""
        return isinstance(self.objects, LocalObjects)

    def count(self, op: str) -> None:
        with self._lock:
            self.ops[op] += 1

    def path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def url(self, *parts: str) -> str:
        """A URL a user can paste into gsutil/ls, for messages."""
        return "/".join((self.root_url.rstrip("/"), *parts))

    def list(self, *parts: str) -> dict[str, ObjectInfo]:
        self.count("list")
        return self.objects.list(self.path(*parts))

    def list_range(
        self,
        *parts: str,
        start: str | None = None,
        end: str | None = None,
        limit: int | None = None,
    ) -> dict[str, ObjectInfo]:
        """The names in [start, end), the first ``limit`` by name (Objects.list_range)."""
        self.count("list")
        return self.objects.list_range(self.path(*parts), start, end, limit)

    def find(self, *parts: str) -> dict[str, ObjectInfo]:
        """Every object below, at any depth, by relative name (one listing)."""
        self.count("list")
        return self.objects.find(self.path(*parts))

    def read(self, *parts: str, limit: int | None = None) -> bytes | None:
        """The object's bytes, None when absent. UnacceptableObject: over ``limit``, or on a
        local root not a regular file (a link, directory, FIFO...)."""
        self.count("read")
        return self.objects.read(self.path(*parts), limit=limit)

    def read_with_token(self, *parts: str, limit: int | None = None) -> tuple[bytes, str] | None:
        """The bytes and their listing token (see Objects.read_with_token)."""
        self.count("read")
        return self.objects.read_with_token(self.path(*parts), limit=limit)

    def read_many_with_token(
        self,
        paths: Sequence[tuple[str, ...]],
        limit: int | None = None,
        pool: Executor | None = None,
    ) -> list[TokenRead]:
        """``read_with_token`` of each path, in order, a failed one's exception in its place
        (Objects.read_many_with_token): one call, a read counted per path."""
        if not paths:  # (a quiet cycle: no call at all, not even a hop into an event loop)
            return []
        with self._lock:
            self.ops["read"] += len(paths)
        return self.objects.read_many_with_token([self.path(*p) for p in paths], limit, pool)

    def read_range(self, start: int, *parts: str) -> bytes:
        self.count("read")
        return self.objects.read(self.path(*parts), start=start) or b""

    def write(self, data: bytes, *parts: str) -> None:
        """Replace an object atomically: readers see the old or the new bytes, never half."""
        self.count("write")
        self.objects.write(self.path(*parts), data)

    def write_if(self, data: bytes, expected: str | None, *parts: str) -> str:
        """Compare-and-swap on the object's token; returns the new token."""
        self.count("write")
        return self.objects.write_if(self.path(*parts), data, expected)

    def write_many_if(
        self,
        writes: Sequence[tuple[tuple[str, ...], bytes, str | None]],
        pool: Executor | None = None,
    ) -> list[TokenWrite]:
        """``write_if`` of each (path, bytes, expected), in order, a failed one's exception in
        its place (Objects.write_many_if): one call, a write counted per object."""
        if not writes:
            return []
        with self._lock:
            self.ops["write"] += len(writes)
        full = [(self.path(*parts), data, expected) for parts, data, expected in writes]
        return self.objects.write_many_if(full, pool)

    def create_many(
        self, items: Sequence[tuple[tuple[str, ...], bytes]], pool: Executor | None = None
    ) -> list[Created]:
        """``create`` of each (path, bytes), in order, a failed one's exception in its place
        (Objects.create_many): one call, a write counted per object."""
        if not items:
            return []
        with self._lock:
            self.ops["write"] += len(items)
        return self.objects.create_many([(self.path(*parts), data) for parts, data in items], pool)

    def create(self, data: bytes, *parts: str) -> bool:
        """Write only if absent; False when the object already exists."""
        self.count("write")
        return self.objects.create(self.path(*parts), data)

    def put_file(self, local: os.PathLike[str], *parts: str) -> None:
        """Stream a local file to the object (a GCS/S3 object appears only once complete; a
        local root is written atomically, through its own symlink-safe write)."""
        if self.is_local:
            with open(local, "rb") as f:
                self.write(f.read(), *parts)
            return
        self.count("write")
        self.fs.put_file(os.fspath(local), self.path(*parts))

    def append(self, data: bytes, *parts: str, size: int | None = None) -> None:
        self.count("append")
        self.objects.append(self.path(*parts), data, size=size)

    def delete(self, *parts: str) -> None:
        self.count("delete")
        self.objects.delete(self.path(*parts))

    def delete_many(self, paths: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        """Batch requests on GCS (100 deletes each) and S3 (1,000), counted once here; returns
        the paths that could not be deleted (an absent one is deleted)."""
        self.count("delete")
        full = {self.path(*parts): parts for parts in paths}
        failed = self.objects.delete_many(list(full))
        return [full[path] for path in failed if path in full]

    def remove_local_tree(self, *parts: str) -> None:
        """On a local root, the directory left behind once its objects are deleted (buckets
        have no directories); nothing elsewhere."""
        if self.is_local:
            shutil.rmtree(self.path(*parts), ignore_errors=True)

    def remove_local_directory(self, *parts: str) -> None:
        """On a local root, an empty directory (a non-empty one stays)."""
        if self.is_local:
            with contextlib.suppress(OSError):
                os.rmdir(self.path(*parts))

    def info(self, *parts: str) -> ObjectInfo | None:
        self.count("info")
        return self.objects.info(self.path(*parts))

    def size(self, *parts: str) -> int:
        info = self.info(*parts)
        return info.size if info else 0

    def open(self, *parts: str, follow_links: bool = True) -> BinaryIO:
        """A binary file object to stream (FileNotFoundError when absent). ``follow_links``
        False: on a local root a link planted where the object belongs is not followed."""
        self.count("read")
        path = self.path(*parts)
        if self.is_local and not follow_links:
            return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")
        opened: Any = self.fs.open(path, "rb")
        return opened
