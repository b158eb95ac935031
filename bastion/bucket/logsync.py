"""Incremental log upload: local mirror files -> ``ROOT/logs/<log>``, new bytes only.

A job's output is appended to a local mirror file; each sync appends the bytes written since
the last sync to the bucket object. The remote object is ``base + mirror``, where ``base`` is
the remote size when the mirror was created (kept beside the mirror, so a restarted daemon
knows which mirror bytes are already uploaded from one size query, without re-uploading).

The daemon's own lines (an attempt's banner) wait in memory until the next sync or output
append: a log that has only such lines has no file at all, its lines are uploaded from
memory and its base moves past them. Admitting a burst of a thousand jobs thus creates no
local file (it made two thousand, the largest part of the admitting cycle), and the files a
job's output needs are made in the pool thread that copies it. Losing unsynced lines in a
crash loses nothing real: the daemon uploads a job's log before its state, so the state
that the next daemon reads predates them and it writes them again.
"""

from __future__ import annotations

import logging
import os
import threading

from bastion.bucket.store import Store

_MAX_CHUNK = 8 << 20  # bound memory per log per sync; the rest goes next cycle

log = logging.getLogger(__name__)


# Said by a line of ours that follows output without a final newline: the newline before
# the line is ours, not the job's (see LogSync.write).
ADDED_NEWLINE = "(bastion added the newline before this line: the output did not end with one)"


def _noting_added_newline(line: bytes) -> bytes:
    """``=== [bastion] ... ===\\n`` with :data:`ADDED_NEWLINE` inside its closing ``===``."""
    body = line.rstrip(b"\n")
    note = ADDED_NEWLINE.encode()
    if body.endswith(b" ==="):
        return body[: -len(b" ===")] + b" " + note + b" ===\n"
    return body + b" " + note + b"\n"


class LogSync:
    def __init__(self, store: Store, directory: str) -> None:
        self.store = store
        self.directory = directory
        self._uploaded: dict[str, int] = {}  # log -> mirror bytes known to be in the bucket
        self._attached: dict[str, str] = {}  # log -> mirror outside our directory
        self._sizes: dict[str, int] | None = None  # remote sizes, from one listing
        self._bases: dict[str, int] = {}  # log -> its mirror's base (fixed for the mirror's life)
        self._fresh: set[str] = set()  # logs whose base is not on disk yet
        self._pending: dict[str, bytearray] = {}  # log -> our own lines not in its file yet
        # The cycle writes lines in the main thread while the pool uploads other logs: what
        # is pending and what is on disk change together, under the log's own lock.
        self._locks: dict[str, threading.RLock] = {}
        os.makedirs(directory, exist_ok=True)

    def _remote_size(self, log_name: str) -> int:
        """Size of a log in the bucket. Only the daemon holding the lease writes logs, so one
        listing at start (one request per 1,000 logs) plus our own appends stay exact, and a
        burst of new jobs costs no size query each."""
        if self._sizes is None:
            self._sizes = {name: info.size for name, info in self.store.logs.list().items()}
        return self._sizes.get(log_name, 0)

    def forget_remote(self) -> None:
        """Another daemon may have written logs meanwhile: re-learn sizes from the bucket."""
        self._sizes = None
        self._uploaded.clear()

    def attach(self, log_name: str, path: str) -> None:
        """Sync a mirror another daemon created (adopting its running attempt)."""
        if path != os.path.join(self.directory, log_name) and os.path.exists(path + ".base"):
            self._attached[log_name] = path
            self._bases.pop(log_name, None)
            self._fresh.discard(log_name)

    def _lock(self, log_name: str) -> threading.RLock:
        lock = self._locks.get(log_name)
        if lock is None:
            lock = self._locks.setdefault(log_name, threading.RLock())  # atomic: one wins
        return lock

    def _mirror(self, log_name: str) -> str:
        return self._attached.get(log_name) or os.path.join(self.directory, log_name)

    def knows(self, log_name: str) -> bool:
        """Whether the log's base is known here (else learning it may read the bucket)."""
        return log_name in self._bases

    def _known(self, log_name: str) -> None:
        """Learn the log's base without touching the disk for a new log: its ``.base`` file
        and mirror are made by ``_persist``, in the upload's pool thread (a burst of a
        thousand admitted jobs then creates no file in the cycle's main thread)."""
        if log_name in self._bases:
            return
        with self._lock(log_name):
            self._learn_base(log_name)

    def _learn_base(self, log_name: str) -> None:
        if log_name in self._bases:
            return
        path = self._mirror(log_name)
        try:
            with open(path + ".base") as f:
                self._bases[log_name] = int(f.read().strip() or 0)
        except FileNotFoundError:
            self._bases[log_name] = self._remote_size(log_name)
            self._fresh.add(log_name)
            self._uploaded[log_name] = 0

    def _persist(self, log_name: str) -> str:
        """Put what is only in memory on disk: the base first (a mirror without one would be
        uploaded from offset 0 by a restarted daemon), then the daemon's own pending lines."""
        self._known(log_name)
        path = self._mirror(log_name)
        if log_name not in self._fresh and log_name not in self._pending:
            return path
        with self._lock(log_name):
            if log_name in self._fresh:
                with open(path + ".base", "w") as f:
                    f.write(str(self._bases[log_name]))
                self._fresh.discard(log_name)
            pending = self._pending.get(log_name)
            if pending:
                with open(path, "ab") as f:
                    f.write(pending)
                del self._pending[log_name]
        return path

    def path(self, log_name: str) -> str:
        """The mirror file for ``log_name``, its base recorded on disk. The mirror itself is
        made by its first write (a missing mirror is an empty one)."""
        return self._persist(log_name)

    def _size(self, log_name: str) -> int:
        """Bytes in the mirror, including lines not yet written to its file."""
        with self._lock(log_name):
            pending = len(self._pending.get(log_name, b""))
            if log_name in self._fresh:  # no file can exist before the base is on disk
                return pending
            try:
                return os.path.getsize(self._mirror(log_name)) + pending
            except FileNotFoundError:  # not written yet
                return pending

    def base(self, log_name: str) -> int:
        """Remote offset where the mirror's first byte lands."""
        self._known(log_name)
        return self._bases[log_name]

    def write(self, log_name: str, text: str) -> None:
        """Append a line of our own (attempt markers) to the mirror, on a line of its own even
        when the job's last output had no final newline. Kept in memory until the next sync
        or output append puts it on disk (a line lost in a crash belongs to a state that
        was not written either: the log's bytes are uploaded before the job's state).

        When the output did not end with a newline, the one we put before the marker is not
        the job's, and the marker says so (:data:`ADDED_NEWLINE`). We chose this over keeping
        the newline out of the bucket (the marker glued to the output's last line, split off
        only when ``bastion logs`` renders it): the log object is read by any bucket tool
        (``gsutil cat``, a notebook) and by tools that find markers at the start of a line,
        and a marker glued to a partial line would be lost to them. The job's bytes are still
        exact: they are what lies between the markers, less the newline before any marker
        that carries this note."""
        self._known(log_name)
        line = (text if text.endswith("\n") else text + "\n").encode()
        with self._lock(log_name):
            pending = self._pending.get(log_name)
            if pending:
                last = pending[-1:]
            elif log_name in self._fresh:
                last = b""
            else:
                last = self._last_byte(self._mirror(log_name))
            if last not in (b"", b"\n"):
                line = b"\n" + _noting_added_newline(line)
            self._pending.setdefault(log_name, bytearray()).extend(line)

    @staticmethod
    def _last_byte(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                if f.seek(0, os.SEEK_END) == 0:
                    return b""
                f.seek(-1, os.SEEK_END)
                return f.read(1)
        except FileNotFoundError:
            return b""

    def append(self, log_name: str, data: bytes) -> None:
        """Append a job's output (copied from its runner) to the mirror."""
        with open(self._persist(log_name), "ab") as f:
            f.write(data)

    def total(self, log_name: str) -> int:
        """Size of the whole log: what the bucket holds plus what is still only local. The
        daemon derives each attempt's output offset from it, so it keeps no cursor."""
        return self.base(log_name) + self._size(log_name)

    def sync(self, log_name: str) -> int:
        """Upload what the mirror gained since the last sync; returns the bytes uploaded."""
        self._known(log_name)
        with self._lock(log_name):
            if log_name in self._fresh:
                return self._sync_fresh(log_name)
        path = self._persist(log_name)
        size = self._size(log_name)
        done = self._uploaded.get(log_name)
        if done is None:  # after a restart or an uncertain upload: ask the bucket
            done = max(0, self.store.logs.size(log_name) - self.base(log_name))
            self._uploaded[log_name] = done
        if size <= done:
            return 0
        with open(path, "rb") as f:
            f.seek(done)
            chunk = f.read(min(size - done, _MAX_CHUNK))
        try:
            self.store.logs.append(log_name, chunk, size=self.base(log_name) + done)
        except Exception:
            self._uploaded.pop(log_name, None)  # we may or may not have appended: re-ask
            self._sizes = None
            raise
        self._uploaded[log_name] = done + len(chunk)
        if self._sizes is not None:
            self._sizes[log_name] = self._sizes.get(log_name, 0) + len(chunk)
        return len(chunk)

    def _sync_fresh(self, log_name: str) -> int:
        """A log with no file yet holds only our own lines, in memory: upload them from there.
        Once all are up the mirror is rebased past them, so a job's output, if any, starts a
        mirror file after them: admitting a job creates no local file at all."""
        pending = self._pending.get(log_name)
        if not pending:
            return 0
        base = self._bases[log_name]
        done = self._uploaded.get(log_name)
        if done is None:  # an uncertain upload: ask the bucket how far it got
            done = max(0, self.store.logs.size(log_name) - base)
        chunk = bytes(pending[done : done + _MAX_CHUNK])
        if chunk:
            try:
                self.store.logs.append(log_name, chunk, size=base + done)
            except Exception:
                self._uploaded.pop(log_name, None)
                self._sizes = None
                raise
            if self._sizes is not None:
                self._sizes[log_name] = self._sizes.get(log_name, 0) + len(chunk)
        done += len(chunk)
        if done >= len(pending):
            self._bases[log_name] = base + len(pending)
            del self._pending[log_name]
            done = 0
        self._uploaded[log_name] = done
        return len(chunk)

    def flush(self, log_name: str) -> None:
        """Upload everything the mirror holds."""
        while self._uploaded.get(log_name, -1) < self._size(log_name):
            if not self.sync(log_name):
                break

    def close(self, log_name: str) -> None:
        """Final upload, then forget the mirror (the bucket holds the whole log now)."""
        path = self._mirror(log_name)
        if not os.path.exists(path + ".base") and log_name not in self._fresh:
            return
        self.flush(log_name)
        self._pending.pop(log_name, None)  # (none left unless the upload gave up)
        for leftover in (path, path + ".base"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        self._uploaded.pop(log_name, None)
        self._attached.pop(log_name, None)
        self._bases.pop(log_name, None)
        self._fresh.discard(log_name)
        self._locks.pop(log_name, None)

    def mirrors(self) -> list[str]:
        own = [n[: -len(".base")] for n in os.listdir(self.directory) if n.endswith(".base")]
        return sorted(set(own) | set(self._attached) | set(self._pending))
