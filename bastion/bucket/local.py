"""A local directory as a bucket: rename for atomicity, link for create-if-absent, a lock file
for compare-and-swap, O_APPEND for logs.

Anyone who can write to the root can put anything in it: symbolic links, FIFOs, directories and
devices where objects are expected. LocalObjects opens only regular files, never follows a link
inside the root, never blocks, and reads at most what the caller allows; anything else raises
UnacceptableObject, whose message says what it is.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from typing import Any

from bastion.bucket.objects import (
    ConditionalWrite,
    Created,
    ObjectInfo,
    Objects,
    PreconditionFailed,
    TokenRead,
    TokenWrite,
    UnacceptableObject,
    in_range,
    object_kind,
)
from bastion.retry import read_back

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
        return _token(info.get("ino"), info.get("mtime"), info.get("size"))

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
                self._name(path), object_kind(mode), "Bastion follows no links in its root"
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
            raise UnacceptableObject(self._name(path), object_kind(st.st_mode)) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise UnacceptableObject(self._name(path), object_kind(st.st_mode))
        return fd

    def _lstat_token(self, fd: int, name: str) -> tuple[int, str] | None:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return st.st_size, _stat_token(st)

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
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:  # removed since listed
                        continue
                    found[entry.name] = ObjectInfo(entry.name, st.st_size, _stat_token(st))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return found

    def list_range(
        self,
        directory: str,
        start: str | None = None,
        end: str | None = None,
        limit: int | None = None,
    ) -> dict[str, ObjectInfo]:
        """Names first, then lstat for only those in the range and within ``limit``."""
        found = {}
        try:
            with self._directory(directory + "/.") as (fd, _):
                with os.scandir(fd) as entries:
                    names = sorted(
                        e.name
                        for e in entries
                        if not e.name.startswith(".") and in_range(e.name, start, end)
                    )
                for name in names:
                    if limit is not None and len(found) >= limit:
                        break
                    sized = self._lstat_token(fd, name)
                    if sized is not None:  # removed since listed
                        found[name] = ObjectInfo(name, *sized)
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
                        found[name] = ObjectInfo(name, st.st_size, _stat_token(st))
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
        return data, _stat_token(st)

    def read_many_with_token(
        self, paths: Sequence[str], limit: int | None = None, pool: Executor | None = None
    ) -> list[TokenRead]:
        """In the calling thread, the pool unused: a local read costs tens of microseconds of
        CPU, and 48 threads taking turns at the GIL cost more than the reads (a cycle's 1,000
        spec reads: see the commit that added this)."""
        return super().read_many_with_token(paths, limit, None)

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
                try:  # idempotent, as on a bucket that retries
                    return read_back(lambda: self.read(path), lambda now: now == data).ours
                except UnacceptableObject:
                    return False  # a link or a directory holds the name
            finally:
                os.unlink(tmp, dir_fd=fd)
        return True

    def write_many_if(
        self, writes: Sequence[ConditionalWrite], pool: Executor | None = None
    ) -> list[TokenWrite]:
        """In the calling thread, the pool unused, as ``read_many_with_token``."""
        return super().write_many_if(writes, None)

    def create_many(
        self, items: Sequence[tuple[str, bytes]], pool: Executor | None = None
    ) -> list[Created]:
        """In the calling thread, the pool unused, as ``read_many_with_token``."""
        return super().create_many(items, None)

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

    def delete_many(self, paths: list[str]) -> list[str]:
        """One unlink each (microseconds: nothing to batch), through ``delete``'s link-safe
        path; the paths that could not be deleted."""
        return self._delete_each(paths)


def _stat_token(st: os.stat_result) -> str:
    """``LocalObjects.token`` of what ``st`` says, made without the info dict fsspec's
    listings give (a listing makes one per object: 20,000 in a `bastion list`)."""
    return _token(st.st_ino, st.st_mtime, st.st_size)


def _token(ino: object, mtime: object, size: object) -> str:
    return f"{ino}:{mtime}:{size}"
