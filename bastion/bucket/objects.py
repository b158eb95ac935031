"""Object primitives per fsspec backend: the few things a bucket must do that fsspec lacks.

fsspec gives one interface for listing, reading and writing; what differs between a local
directory, GCS and S3 is how to replace an object atomically, create it only if absent,
replace it only if nobody else changed it (compare-and-swap on a generation), and append.
This module holds the interface every backend implements (``Objects``, also the generic
fsspec backend), what they share (``ObjectInfo``, the errors) and the registry that picks one
per protocol (``objects_for``), like fsspec's own. One module per backend: ``local.py`` (a
directory), ``gcs.py``, ``s3.py``. None of them knows Bastion's paths; ``bastion.bucket.store``
does. What a cycle does to many objects at once (``read_many_with_token``, ``write_many_if``,
``delete_many``) is derived here from the single-object primitives; a backend that can send
many requests from one call overrides it.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from bastion.registry import Registry
from bastion.retry import each, read_back
from bundlers.base import format_size

# What ``read_many_with_token`` gives for one path: its bytes and token, None when absent, or
# the error that path's read raised (in its place: the other paths are read all the same).
T = TypeVar("T")
TokenRead: TypeAlias = tuple[bytes, str] | Exception | None
# What ``write_many_if`` gives for one object: its new token, or the error its write raised.
TokenWrite: TypeAlias = str | Exception
# One conditional write: (path, bytes, the token it must still have; None: absent).
ConditionalWrite: TypeAlias = tuple[str, bytes, str | None]
# What ``create_many`` gives for one object: True created, False another object holds the
# name, or the error its write raised.
Created: TypeAlias = bool | Exception


class PreconditionFailed(Exception):
    """A conditional write lost: the object changed (or appeared) since it was read."""


class UnacceptableObject(ValueError):
    """An object Bastion will not read or write: not a regular file (a symbolic link, a
    directory, a FIFO, a device), or over the caller's size limit. The message is for users
    (it becomes a rejected job's reason): ``<path> <what>; <rule>``, a few dozen characters."""

    REGULAR = "objects must be regular files"

    def __init__(self, path: str, what: str, rule: str = REGULAR) -> None:
        if len(path) > 120:
            path = f"{path[:100]}…({len(path)} characters)"
        super().__init__(f"{path} {what}; {rule}")
        self.path, self.what, self.rule = path, what, rule


_KINDS = (
    (stat.S_ISLNK, "is a symbolic link"),
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO"),
    (stat.S_ISSOCK, "is a socket"),
    (stat.S_ISCHR, "is a character device"),
    (stat.S_ISBLK, "is a block device"),
)


def hidden_name(name: str) -> bool:
    """Temporary files and parts start with ".": listings leave them out."""
    return any(part.startswith(".") for part in name.split("/"))


def in_range(name: str, start: str | None, end: str | None) -> bool:
    """Whether ``start <= name < end`` (an open bound is None): the order of a bucket's
    listing, as GCS and S3 sort names by their UTF-8 bytes, which is Python's str order."""
    return (start is None or name >= start) and (end is None or name < end)


def first_in_range(
    found: dict[str, ObjectInfo], start: str | None, end: str | None, limit: int | None
) -> dict[str, ObjectInfo]:
    """The entries of a listing in [start, end), the first ``limit`` by name, in name order."""
    names = sorted(name for name in found if in_range(name, start, end))
    return {name: found[name] for name in names[:limit]}


def object_kind(mode: int) -> str:
    """What a non-regular file is, for an UnacceptableObject message."""
    return next((what for test, what in _KINDS if test(mode)), "is not a regular file")


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about one object: enough to tell whether it changed."""

    name: str
    size: int
    token: str  # generation (GCS), ETag (S3) or inode:mtime:size (local); new on every write


class Objects:
    """Generic fsspec backend: plain writes, best-effort conditions, read-modify-write append."""

    def __init__(self, fs: AbstractFileSystem) -> None:
        self.fs = fs
        self.root: str | None = None  # Bastion's root, to name objects relative to it

    def _name(self, path: str) -> str:
        """``path`` as a user knows it: relative to the root."""
        if self.root and path.startswith(self.root + "/"):
            return path[len(self.root) + 1 :]
        return path

    def _too_large(self, path: str, size: int, limit: int) -> UnacceptableObject:
        return UnacceptableObject(
            self._name(path), f"is {format_size(size)}", f"the limit is {format_size(limit)}"
        )

    @staticmethod
    def token(info: dict[str, Any]) -> str:
        for key in ("generation", "ETag", "etag"):
            if info.get(key):
                return str(info[key]).strip('"')
        return f"{info.get('mtime')}:{info.get('size')}"

    def list(self, directory: str) -> dict[str, ObjectInfo]:
        self.fs.invalidate_cache(directory)
        try:
            entries = self.fs.ls(directory, detail=True)
        except FileNotFoundError:
            return {}
        found = {}
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "directory" or name.startswith("."):
                continue  # temporary files and parts start with "."
            found[name] = ObjectInfo(name, int(entry.get("size") or 0), self.token(entry))
        return found

    def list_range(
        self,
        directory: str,
        start: str | None = None,
        end: str | None = None,
        limit: int | None = None,
    ) -> dict[str, ObjectInfo]:
        """As ``list``, only the names in [start, end), the first ``limit`` of them by name, in
        name order. Derived here from ``list``; the backends override it so that a range costs
        what it returns, not the whole directory (100,000 submission markers waiting, of which
        a cycle takes 1,000 in: a full listing each cycle made the intake quadratic)."""
        return first_in_range(self.list(directory), start, end, limit)

    def find(self, directory: str) -> dict[str, ObjectInfo]:
        """Every object under ``directory`` at any depth, by its name relative to it
        (``a/b/c``); names with a part starting with "." (temporary files) are left out."""
        self.fs.invalidate_cache(directory)
        try:
            entries = self.fs.find(directory, detail=True)
        except FileNotFoundError:
            return {}
        found = {}
        top = directory.rstrip("/")
        for path, entry in entries.items():
            name = path.rstrip("/")[len(top) + 1 :]
            if not name or entry.get("type") == "directory" or hidden_name(name):
                continue
            found[name] = ObjectInfo(name, int(entry.get("size") or 0), self.token(entry))
        return found

    def info(self, path: str) -> ObjectInfo | None:
        self.fs.invalidate_cache(path)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        return ObjectInfo(path.rsplit("/", 1)[-1], int(info.get("size") or 0), self.token(info))

    def read(self, path: str, start: int | None = None, limit: int | None = None) -> bytes | None:
        """The object from ``start`` on; None when absent. ``limit``: refuse a larger object
        (UnacceptableObject), downloading at most ``limit + 1`` bytes of it."""
        end = None if limit is None else (start or 0) + limit + 1
        try:
            data = self.fs.cat_file(path, start=start, end=end)
        except FileNotFoundError:
            return None
        except Exception as e:
            if (start or end) and getattr(e, "code", None) == 416:  # nothing at or after start
                return b""
            raise
        return self._within(path, data, limit)

    def read_with_token(self, path: str, limit: int | None = None) -> tuple[bytes, str] | None:
        """The object and a token no newer than its bytes; None when absent. For a reader that
        later compares the token with a listing's to tell whether the object changed since.

        Generic: info, then read. When the object changes in between, the token is older than
        the bytes, so the next listing's token differs and the object is read again: a change
        may cost one read too many, never go unseen. Backends that get the token with the bytes
        in one request (GCS, a local directory) override this."""
        info = self.info(path)
        if info is None:
            return None
        data = self.read(path, limit=limit)
        return None if data is None else (data, info.token)

    def read_many_with_token(
        self, paths: Sequence[str], limit: int | None = None, pool: Executor | None = None
    ) -> list[TokenRead]:
        """``read_with_token`` of every path, in order; a path whose read fails has its
        exception in its place. For a cycle that reads a burst's specs: one call for all.

        Generic: one read per path, in ``pool`` when given (one thread per request in
        flight), else one after another. GCS overrides it to send every request from one
        call into gcsfs's event loop, without a thread hop per request; a local directory
        reads in the calling thread (a read is a few system calls: threads only contend)."""

        return each(self.read_with_token, ((path, limit) for path in paths), pool)

    def _within(self, path: str, data: bytes, limit: int | None) -> bytes:
        """``data`` if within ``limit``; else UnacceptableObject with the object's whole size."""
        if limit is None or len(data) <= limit:
            return data
        whole = self.info(path)
        raise self._too_large(path, whole.size if whole else len(data), limit)

    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    def create(self, path: str, data: bytes) -> bool:
        """Write only if absent; False when another object already exists there.

        Creating the same bytes twice succeeds: a bucket client retries a create whose answer
        was lost, and the retry must not report its own first try as a conflict."""
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            # A retried request may have created it on its first try: then it is ours.
            return read_back(lambda: self.read(path), lambda now: now == data).ours
        return True

    def write_if(self, path: str, data: bytes, expected: str | None) -> str:
        """Replace only if the object's token is ``expected`` (None: absent); new token."""
        current = self.info(path)
        if (current.token if current else None) != expected:
            raise PreconditionFailed(f"{path} changed (token {current and current.token})")
        self.write(path, data)
        try:
            after = self.info(path)
        except Exception:  # written; the next conditional write re-reads to learn the token
            return ""
        return after.token if after else ""

    def write_many_if(
        self, writes: Sequence[ConditionalWrite], pool: Executor | None = None
    ) -> list[TokenWrite]:
        """``write_if`` of each (path, bytes, expected), in order; a write that fails has its
        exception in its place (PreconditionFailed among them), the others are written. For a
        cycle that writes a burst's states: one call for all.

        Generic: one write per object, in ``pool`` when given, else one after another. GCS
        sends every upload from one call into gcsfs's event loop; a local directory writes in
        the calling thread."""

        return each(self.write_if, writes, pool)

    def create_many(
        self, items: Sequence[tuple[str, bytes]], pool: Executor | None = None
    ) -> list[Created]:
        """``create`` of each (path, bytes), in order; a create that fails has its exception in
        its place, the others are written. For a group's specs and their markers: one call.

        Generic: one create per object, in ``pool`` when given. GCS and S3 send them as
        ``write_many_if`` with every object to be absent (``created_by_writes``); a local
        directory creates in the calling thread."""

        return each(self.create, items, pool)

    def append(self, path: str, data: bytes, size: int | None = None) -> None:
        """Add ``data`` at the end. ``size``: the object's current size when the caller knows
        it (0: it does not exist yet), which saves a request per append."""
        old = b"" if size == 0 else (self.read(path) or b"")
        self.write(path, old + data)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    def delete_many(self, paths: list[str]) -> list[str]:
        """Delete every path; returns those it could not delete (an absent path counts as
        deleted, and is no error). Generic: one ``fs.rm`` of the whole list, which filesystems
        that batch (gcsfs, s3fs) send in few requests; when it fails it does not say which paths
        it deleted, so each path is then deleted on its own to learn which could not be. GCS
        and S3 override this with their batch requests; a local directory deletes each."""
        if not paths:
            return []
        try:
            self.fs.rm(list(paths))
            return []
        except Exception:  # a missing path, or a failed request: find which, one by one
            return self._delete_each(paths)

    def _delete_each(self, paths: list[str]) -> list[str]:
        failed = []
        for path in paths:
            try:
                self.delete(path)
            except Exception:
                failed.append(path)
        return failed


async def in_flight(
    calls: Sequence[Callable[[], Awaitable[T]]], most: int
) -> list[T | BaseException]:
    """For a backend's event loop: every call awaited, at most ``most`` under way at once,
    the answers in order, a failed one's exception in its place (a burst's thousand
    requests, not a thousand at once)."""
    gate = asyncio.Semaphore(most)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return await asyncio.gather(*(one(call) for call in calls), return_exceptions=True)


class UnknownBucket(ValueError):
    """A root whose protocol has no backend: its conditional writes and appends would not be
    atomic, so two writers could overwrite each other without either noticing."""


# protocol -> class, or "module:Class" imported on first use (as fsspec's own registry does);
# plugins: entry point group ``bastion.buckets``
BUCKETS: Registry[type[Objects]] = Registry(
    "bucket protocol",
    group="bastion.buckets",
    builtins={
        "gs": "bastion.bucket.gcs:GcsObjects",
        "gcs": "bastion.bucket.gcs:GcsObjects",
        "s3": "bastion.bucket.s3:S3Objects",
        "s3a": "bastion.bucket.s3:S3Objects",
        # in-process only (one daemon and its users in one Python): the generic backend's
        # read-modify-write is then safe enough for tests and notebooks
        "memory": Objects,
    },
    error=UnknownBucket,
    hints={"s3": "pip install 'bastion[s3]'", "s3a": "pip install 'bastion[s3]'"},
)


def register(protocol: str, objects: type[Objects] | str, clobber: bool = False) -> None:
    BUCKETS.register(protocol, objects, clobber=clobber)


def objects_for(
    fs: AbstractFileSystem, root: str | None = None, reads_only: bool = False
) -> Objects:
    """The backend of ``fs``. ``root``: on a local filesystem, the directory within which no
    link is followed. ``reads_only``: the caller only reads (a quota file in another place),
    so a protocol without a backend gets the generic one instead of an error."""
    objects = _objects_for(fs, reads_only)
    objects.root = root.rstrip("/") if root else None
    return objects


def _objects_for(fs: AbstractFileSystem, reads_only: bool) -> Objects:
    if isinstance(fs, LocalFileSystem):
        from bastion.bucket.local import LocalObjects  # imports this module: not at the top

        return LocalObjects(fs)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    for protocol in protocols:
        entry = BUCKETS.find(protocol)
        if entry is not None:
            return entry(fs)
    if reads_only:
        return Objects(fs)
    raise UnknownBucket(
        f"{protocols[0]}:// has no Bastion bucket backend, so writes to it could not be made "
        f"atomic; use one of {', '.join(f'{p}://' for p in BUCKETS.names())} or a local path, "
        "or register a backend (entry point group bastion.buckets)"
    )


def created_by_writes(objects: Objects, items: Sequence[tuple[str, bytes]]) -> list[Created]:
    """``create_many`` as one ``write_many_if`` whose every object must be absent: for a
    backend that sends a batch of conditional writes from one call. A lost precondition is a
    name another object holds (``write_if`` has read back a first try of ours that a retry
    lost), so False, as ``create`` answers."""
    written = objects.write_many_if([(path, data, None) for path, data in items])
    return [
        False if isinstance(w, PreconditionFailed) else w if isinstance(w, Exception) else True
        for w in written
    ]
