"""Object primitives per fsspec backend: the few things a bucket must do that fsspec lacks.

fsspec gives one interface for listing, reading and writing; what differs between a local
directory, GCS and S3 is how to replace an object atomically, create it only if absent,
replace it only if nobody else changed it (compare-and-swap on a generation), and append.
One class per backend, picked by ``objects_for(fs)`` from a small registry, like fsspec's own.
These classes know nothing of Bastion's paths; ``bastion.bucket.store`` does.

Anyone who can write to the bucket can put anything in it. On a local root that includes
symbolic links, FIFOs, directories and devices where objects are expected: LocalObjects opens
only regular files, never follows a link inside the root, never blocks, and reads at most what
the caller allows; anything else raises UnacceptableObject, whose message says what it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.asyn import sync
from fsspec.implementations.local import LocalFileSystem

from bastion.registry import Registry
from bundlers.base import format_size

log = logging.getLogger(__name__)


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


def _hidden(name: str) -> bool:
    return any(part.startswith(".") for part in name.split("/"))


def _kind(mode: int) -> str:
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
            if not name or entry.get("type") == "directory" or _hidden(name):
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
            return self.read(path) == data
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

    def append(self, path: str, data: bytes, size: int | None = None) -> None:
        """Add ``data`` at the end. ``size``: the object's current size when the caller knows
        it (0: it does not exist yet), which saves a request per append."""
        old = b"" if size == 0 else (self.read(path) or b"")
        self.write(path, old + data)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    def delete_many(self, paths: list[str]) -> None:
        """Delete every path (absent ones too); raises the first failure after trying all.
        Generic: one request each; GCS batches them (100 per request)."""
        failures = []
        for path in paths:
            try:
                self.delete(path)
            except Exception as e:
                failures.append(e)
        if failures:
            raise failures[0]


_NEW = os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


LOCK_WAIT_SECONDS = 5.0  # a condition holder that is frozen (SIGSTOP) must not freeze us


def _lock_within(fd: int, path: str, seconds: float = LOCK_WAIT_SECONDS) -> None:
    """``flock`` with a bound: the critical section is a stat and a rename (microseconds), so
    a lock held for seconds belongs to a frozen or stopped process; give up with an OSError
    (a transient failure the caller retries) instead of blocking the daemon forever."""
    deadline = time.monotonic() + seconds
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise OSError(
                    f"{path}: the lock of a conditional write is held for over {seconds:g}s "
                    "(its holder is frozen or stopped); try again"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


_THREAD_LOCKS: dict[str, threading.Lock] = {}


def _thread_lock(directory: str) -> threading.Lock:
    """This process's lock for conditional writes in ``directory`` (one per directory)."""
    lock = _THREAD_LOCKS.get(directory)
    if lock is None:
        lock = _THREAD_LOCKS.setdefault(directory, threading.Lock())  # atomic: one wins
    return lock


class LocalObjects(Objects):
    """A local directory: rename for atomicity, link for create, a lock file for conditions.

    Every operation opens the object's directory one component at a time from ``root`` with
    O_NOFOLLOW, then works relative to that directory (``dir_fd``): a symbolic link planted at
    ``history/jobs/NAME`` or ``logs`` cannot send a write outside the root. Objects are opened
    with O_NOFOLLOW (a link is refused, never followed) and O_NONBLOCK (a FIFO cannot hang the
    daemon), then checked with fstat to be regular files. Without a ``root`` (a quota file given
    by path) directories and links are followed, as the admin who named the file intends; only
    regular files are still read."""

    @staticmethod
    def token(info: dict[str, Any]) -> str:
        return f"{info.get('ino')}:{info.get('mtime')}:{info.get('size')}"

    def _confined(self, path: str) -> bool:
        return self.root is not None and path.startswith(self.root + "/")

    @contextlib.contextmanager
    def _directory(self, path: str, create: bool = False) -> Iterator[tuple[int, str]]:
        """(fd of the directory holding ``path``, its last component); FileNotFoundError when
        that directory does not exist and ``create`` is False."""
        directory, name = path.rsplit("/", 1)
        if not self._confined(path):
            if create:
                os.makedirs(directory, exist_ok=True)
            fd = os.open(directory or "/", _DIRECTORY)
        else:
            assert self.root is not None
            if create:
                os.makedirs(self.root, exist_ok=True)
            fd = os.open(self.root, _DIRECTORY)  # the root itself may be a link: its owner's
            done = self.root
            try:
                for part in directory[len(self.root) + 1 :].split("/") if directory != done else []:
                    done += "/" + part
                    if part in ("", ".", ".."):
                        raise UnacceptableObject(self._name(path), "is not a plain path")
                    parent, fd = fd, self._subdirectory(fd, part, done, create)
                    os.close(parent)
            except BaseException:
                os.close(fd)
                raise
        try:
            yield fd, name
        finally:
            os.close(fd)

    def _subdirectory(self, fd: int, part: str, path: str, create: bool) -> int:
        """Open ``part`` of directory ``fd`` without following a link."""
        try:
            return os.open(part, _DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            return os.open(part, _DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISREG(mode):  # a file where a directory belongs: as a missing one
                raise
            raise UnacceptableObject(
                self._name(path), _kind(mode), "Bastion follows no links in its root"
            ) from None

    def _open(self, dir_fd: int, name: str, path: str, flags: int, mode: int = 0o666) -> int:
        """Open a regular file in directory ``dir_fd``: never a link (unless unconfined), never
        blocking; UnacceptableObject naming what it is otherwise."""
        nofollow = os.O_NOFOLLOW if self._confined(path) else 0
        flags |= os.O_NONBLOCK | os.O_CLOEXEC | nofollow
        try:
            fd = os.open(name, flags, mode, dir_fd=dir_fd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            raise UnacceptableObject(self._name(path), _kind(st.st_mode)) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise UnacceptableObject(self._name(path), _kind(st.st_mode))
        return fd

    def _lstat_token(self, fd: int, name: str) -> tuple[int, str] | None:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return st.st_size, self.token({"ino": st.st_ino, "mtime": st.st_mtime, "size": st.st_size})

    # -- reading ---------------------------------------------------------------------------

    def list(self, directory: str) -> dict[str, ObjectInfo]:
        """Every name but dot-names, whatever it is (a directory or FIFO in jobs/active/ is
        listed so that the daemon rejects it): lstat only, nothing is opened."""
        found = {}
        try:
            with self._directory(directory + "/.") as (fd, _), os.scandir(fd) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue  # temporary files and the lock
                    with contextlib.suppress(FileNotFoundError):  # removed since listed
                        st = entry.stat(follow_symlinks=False)
                        token = self.token(
                            {"ino": st.st_ino, "mtime": st.st_mtime, "size": st.st_size}
                        )
                        found[entry.name] = ObjectInfo(entry.name, st.st_size, token)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return found

    def find(self, directory: str) -> dict[str, ObjectInfo]:
        """Every regular file below ``directory`` by relative name, through scandir (a fifth
        of fsspec's walk, which stats each entry again); links are neither listed nor
        followed, dot-names are left out."""
        found: dict[str, ObjectInfo] = {}
        pending = [("", directory)]
        while pending:
            rel, path = pending.pop()
            try:
                entries = list(os.scandir(path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                name = f"{rel}/{entry.name}" if rel else entry.name
                with contextlib.suppress(FileNotFoundError):  # removed since listed
                    if entry.is_dir(follow_symlinks=False):
                        pending.append((name, entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        token = self.token(
                            {"ino": st.st_ino, "mtime": st.st_mtime, "size": st.st_size}
                        )
                        found[name] = ObjectInfo(name, st.st_size, token)
        return found

    def info(self, path: str) -> ObjectInfo | None:
        try:
            with self._directory(path) as (fd, name):
                sized = self._lstat_token(fd, name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(path.rsplit("/", 1)[-1], *sized) if sized else None

    def read(self, path: str, start: int | None = None, limit: int | None = None) -> bytes | None:
        found = self._read_opened(path, start, limit)
        return None if found is None else found[0]

    def read_with_token(self, path: str, limit: int | None = None) -> tuple[bytes, str] | None:
        """The token from ``fstat`` of the very file read (a writer replaces it by rename, so
        the open file never changes): the listing's token of these bytes, in one request."""
        found = self._read_opened(path, None, limit)
        if found is None:
            return None
        data, st = found
        return data, self.token({"ino": st.st_ino, "mtime": st.st_mtime, "size": st.st_size})

    def _read_opened(
        self, path: str, start: int | None, limit: int | None
    ) -> tuple[bytes, os.stat_result] | None:
        try:
            with self._directory(path) as (dir_fd, name):
                fd = self._open(dir_fd, name, path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if limit is not None and st.st_size > limit:
                raise self._too_large(path, st.st_size, limit)
            f.seek(start or 0)
            data = f.read(-1 if limit is None else limit + 1)  # it may have grown meanwhile
        return self._within(path, data, limit), st

    # -- writing: a temporary file in the same directory, renamed over the object ------------

    def _temp(self, fd: int, data: bytes) -> str:
        """A short name (``.tmp-`` and 16 hex digits): ``.<name>.tmp`` exceeded NAME_MAX for a
        250-character object name."""
        tmp = f".tmp-{uuid.uuid4().hex[:16]}"
        out = os.open(tmp, os.O_WRONLY | os.O_EXCL | _NEW, 0o666, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as f:
                f.write(data)
        except BaseException:
            os.unlink(tmp, dir_fd=fd)
            raise
        return tmp

    def _replace(self, fd: int, name: str, data: bytes) -> None:
        """Atomic: readers see the old or the new bytes, never half. rename replaces a link
        planted at ``name`` itself, not what it points to."""
        tmp = self._temp(fd, data)
        try:
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)
            raise

    def write(self, path: str, data: bytes) -> None:
        with self._directory(path, create=True) as (fd, name):
            self._replace(fd, name, data)

    def create(self, path: str, data: bytes) -> bool:
        with self._directory(path, create=True) as (fd, name):
            tmp = self._temp(fd, data)
            try:
                os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)  # atomic create-if-absent
            except FileExistsError:
                try:
                    return self.read(path) == data  # idempotent, as on a bucket that retries
                except UnacceptableObject:
                    return False  # a link or a directory holds the name
            finally:
                os.unlink(tmp, dir_fd=fd)
        return True

    def write_if(self, path: str, data: bytes, expected: str | None) -> str:
        """Compare and swap under the directory's lock file. The new bytes are written to a
        temporary file first, so the lock covers a stat and a rename only; threads of this
        process queue on a lock of their own before the file lock, so a burst of a thousand
        state writes waits in line instead of polling the file lock."""
        directory = path.rsplit("/", 1)[0]
        with self._directory(path, create=True) as (fd, name):
            tmp = self._temp(fd, data)
            try:
                with _thread_lock(directory):
                    lock = self._open(fd, ".lock", directory + "/.lock", os.O_WRONLY | _NEW)
                    try:
                        _lock_within(lock, path)
                        current = self._lstat_token(fd, name)
                        if (current and current[1]) != expected:
                            raise PreconditionFailed(f"{path} changed since it was read")
                        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
                        tmp = ""
                        after = self._lstat_token(fd, name)
                        return after[1] if after else ""
                    finally:
                        os.close(lock)
            finally:
                if tmp:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp, dir_fd=fd)

    def append(self, path: str, data: bytes, size: int | None = None) -> None:
        """O_APPEND on the object itself, which must be a regular file (O_NOFOLLOW)."""
        with self._directory(path, create=True) as (dir_fd, name):
            fd = self._open(dir_fd, name, path, os.O_WRONLY | os.O_APPEND | _NEW)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def delete(self, path: str) -> None:
        """Unlinks what is there, a link itself (never its target); a directory planted where
        an object belongs (e.g. in jobs/active/) is removed with its contents, without
        following links (shutil.rmtree with dir_fd)."""
        try:
            with self._directory(path) as (fd, name):
                try:
                    os.unlink(name, dir_fd=fd)
                except IsADirectoryError:
                    shutil.rmtree(name, dir_fd=fd)
        except (FileNotFoundError, NotADirectoryError):
            return


class GcsObjects(Objects):
    """GCS via gcsfs: generation preconditions on multipart uploads, compose for appends,
    listings split into name ranges fetched in parallel."""

    PAGE = 1000  # GCS returns at most 1,000 names per page
    SPLIT_EVERY = 800  # names per range: room to grow by a quarter before it takes two pages
    RANGES_IN_FLIGHT = 16
    _FIELDS = "items(name,size,generation),prefixes,nextPageToken"  # a tenth of the bytes

    def __init__(self, fs: AbstractFileSystem) -> None:
        super().__init__(fs)
        # (directory, recursive) -> names that split its listing
        self._splits: dict[tuple[str, bool], list[str]] = {}

    def list(self, directory: str) -> dict[str, ObjectInfo]:
        """One page after another is 10 round trips for 10,000 names. The names seen last time
        split the key space into ranges of 800 names (startOffset inclusive, endOffset
        exclusive, the first and last open), listed concurrently: one round trip in a steady
        state, and still every name whatever was added or deleted since, as the ranges cover
        the whole key space (a range that grew past a page takes more pages, in turn)."""
        return self._ranged(directory, recursive=False)

    def find(self, directory: str) -> dict[str, ObjectInfo]:
        """As ``list``, at every depth (no delimiter): the same ranges, the same one round trip
        in a steady state (the agents' records of every running attempt: one listing)."""
        return self._ranged(directory, recursive=True)

    def _ranged(self, directory: str, recursive: bool) -> dict[str, ObjectInfo]:
        bucket, key, _ = self.fs.split_path(directory)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        memo = (directory, recursive)
        splits = self._splits.get(memo, [])
        bounds = list(zip([None, *splits], [*splits, None], strict=True))
        delimiter = None if recursive else "/"
        try:
            pages = sync(self.fs.loop, self._list_ranges, bucket, prefix, bounds, delimiter)
        except FileNotFoundError:
            return {}
        found = {}
        names = []
        for items in pages:
            for item in items:
                names.append(item["name"])
                name = item["name"][len(prefix) :]
                if not name or _hidden(name) or (not recursive and "/" in name):
                    continue
                size, token = int(item.get("size") or 0), str(item["generation"])
                found[name] = ObjectInfo(name, size, token)
        if len(names) > self.SPLIT_EVERY:
            self._splits[memo] = names[self.SPLIT_EVERY :: self.SPLIT_EVERY]
        else:  # one page does: remember nothing for small directories
            self._splits.pop(memo, None)
        return found

    def read_with_token(self, path: str, limit: int | None = None) -> tuple[bytes, str] | None:
        """One GET: the download's ``x-goog-generation`` header is the generation of the bytes
        it carries (the listing's token). Without the header (an emulator that omits it), or
        for an empty object (a range request on it is refused), the generic info-then-read."""
        try:
            headers, data = sync(self.fs.loop, self._download, path, limit)
        except FileNotFoundError:
            return None
        except Exception as e:
            if getattr(e, "code", None) != 416:
                raise
            return super().read_with_token(path, limit)
        generation = headers.get("x-goog-generation") if headers else None
        if not generation:
            return super().read_with_token(path, limit)
        return self._within(path, data, limit), str(generation)

    async def _download(self, path: str, limit: int | None) -> tuple[Any, bytes]:
        """(response headers, bytes): at most ``limit + 1`` bytes, so an oversized object is
        refused without downloading it whole."""
        head = {} if limit is None else {"Range": f"bytes=0-{limit}"}
        return await self.fs._call("GET", self.fs.url(path), headers=head)

    async def _list_ranges(
        self,
        bucket: str,
        prefix: str,
        bounds: list[tuple[str | None, str | None]],
        delimiter: str | None = "/",
    ) -> list[list[dict[str, Any]]]:
        gate = asyncio.Semaphore(self.RANGES_IN_FLIGHT)

        async def one(start: str | None, end: str | None) -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = []
            token = None
            async with gate:
                while True:
                    page = await self.fs._call(
                        "GET",
                        "b/{}/o",
                        bucket,
                        prefix=prefix,
                        delimiter=delimiter,
                        startOffset=start,
                        endOffset=end,
                        maxResults=self.PAGE,
                        pageToken=token,
                        fields=self._FIELDS,
                        json_out=True,
                    )
                    items.extend(page.get("items", []))
                    token = page.get("nextPageToken")
                    if not token:
                        return items

        tasks = [asyncio.ensure_future(one(start, end)) for start, end in bounds]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # one range failed: the listing has; stop retrying the others
                task.cancel()
            raise

    BATCH = 100  # deletes per batch request (GCS's limit)

    def delete_many(self, paths: list[str]) -> None:
        """GCS batch requests: up to 100 deletes in one round trip (gcsfs's own batching; an
        emulator gets one request each). An absent object counts as deleted."""
        results = sync(self.fs.loop, self.fs._delete_files, list(paths), self.BATCH)
        failures = [
            r
            for r in results
            if isinstance(r, Exception)
            and not isinstance(r, FileNotFoundError)
            and "No such object" not in str(r)
        ]
        if failures:
            raise failures[0]

    def write_if(self, path: str, data: bytes, expected: str | None) -> str:
        bucket, key, _ = self.fs.split_path(path)
        body = (
            b"--==0==\nContent-Type: application/json; charset=UTF-8\n\n"
            + json.dumps({"name": key}).encode()
            + b"\n--==0==\nContent-Type: application/octet-stream\n\n"
            + data
            + b"\n--==0==--"
        )
        try:
            result = self.fs.call(
                "POST",
                f"{self.fs._location}/upload/storage/v1/b/{bucket}/o",
                uploadType="multipart",
                ifGenerationMatch=expected or "0",
                headers={"Content-Type": 'multipart/related; boundary="==0=="'},
                data=body,
                json_out=True,
            )
        except Exception as e:
            if getattr(e, "code", None) == 412 or isinstance(e, FileExistsError):
                if self.read(path) == data:  # our own first try succeeded, then was retried
                    current = self.info(path)
                    return current.token if current else ""
                raise PreconditionFailed(f"{path} changed since it was read") from e
            raise
        self.fs.invalidate_cache(path)
        return str(result["generation"])

    def append(self, path: str, data: bytes, size: int | None = None) -> None:
        """Upload the bytes as a part, compose [object, part] into the object: O(new bytes).

        The compose is sent exactly once per try (no client-side retry): when its answer is
        lost, the object's size says whether it happened, so bytes are never appended twice.
        With ``size`` known, a new log costs one request and a growing one three.
        """
        if size is None:
            before = self.info(path)
            size = before.size if before else 0
        if size == 0:
            self.write(path, data)
            return
        directory, name = path.rsplit("/", 1)
        part = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.part"
        self.write(part, data)
        try:
            for attempt in range(5):
                try:
                    self._compose(path, part)
                    return
                except Exception as e:
                    now = self.info(path)
                    if now is None:  # deleted under us (by hand): start it again
                        self.write(path, data)
                        return
                    if now.size == size + len(data):
                        return
                    if attempt == 4:
                        raise
                    log.warning("compose of %s failed (%s); retrying", path, e)
                    time.sleep(min(8.0, 0.5 * 2**attempt))
        finally:
            self.delete(part)

    def _compose(self, path: str, part: str) -> None:
        """compose [path, part] -> path, sent exactly once (see append)."""
        bucket, key, _ = self.fs.split_path(path)
        body = {
            "kind": "storage#composeRequest",
            "sourceObjects": [{"name": key}, {"name": self.fs.split_path(part)[1]}],
            "destination": {"name": key, "bucket": bucket},
        }
        url = self.fs._format_path("b/{}/o/{}/compose", [bucket, key])
        sync(self.fs.loop, self._post_once, url, {}, body)
        self.fs.invalidate_cache(path)

    async def _post_once(self, url: str, params: dict[str, str], body: dict[str, Any]) -> None:
        """One POST without gcsfs's retry loop: a lost answer must surface to our check."""
        await self.fs._set_session()
        headers = self.fs._get_headers({"Content-Type": "application/json"})
        async with self.fs.session.request(
            "POST",
            url,
            params=params,
            json=body,
            headers=headers,
            timeout=self.fs.requests_timeout,
        ) as response:
            content = await response.read()
            if response.status >= 400:
                error = OSError(f"POST {url}: HTTP {response.status}: {content[:300]!r}")
                error.code = response.status  # type: ignore[attr-defined]
                raise error


class UnknownBucket(ValueError):
    """A root whose protocol has no backend: its conditional writes and appends would not be
    atomic, so two writers could overwrite each other without either noticing."""


# protocol -> class, or "module:Class" imported on first use (as fsspec's own registry does);
# plugins: entry point group ``bastion.buckets``
BUCKETS: Registry[type[Objects]] = Registry(
    "bucket protocol",
    group="bastion.buckets",
    builtins={
        "gs": GcsObjects,
        "gcs": GcsObjects,
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
