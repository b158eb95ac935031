"""Incremental log upload: local mirror files -> ``ROOT/logs/<log>``, new bytes only.

A process writes its output to a local mirror file; each sync appends the bytes written since
the last sync to the bucket object. The remote object is ``base + mirror``, where ``base`` is
the remote size when the mirror was created (kept beside the mirror, so a restarted daemon
knows which mirror bytes are already uploaded from one size query, without re-uploading).
"""

from __future__ import annotations

import logging
import os

from bastion.store import Store

_MAX_CHUNK = 8 << 20  # bound memory per log per sync; the rest goes next cycle

log = logging.getLogger(__name__)


class LogSync:
    def __init__(self, store: Store, directory: str) -> None:
        self.store = store
        self.directory = directory
        self._uploaded: dict[str, int] = {}  # log -> mirror bytes known to be in the bucket
        self._attached: dict[str, str] = {}  # log -> mirror outside our directory
        self._sizes: dict[str, int] | None = None  # remote sizes, from one listing
        self._bases: dict[str, int] = {}  # log -> its mirror's base (fixed for the mirror's life)
        os.makedirs(directory, exist_ok=True)

    def _remote_size(self, log_name: str) -> int:
        """Size of a log in the bucket. Only the daemon holding the lease writes logs, so one
        listing at start (one request per 1,000 logs) plus our own appends stay exact, and a
        burst of new jobs costs no size query each."""
        if self._sizes is None:
            self._sizes = {name: info.size for name, info in self.store.list_logs().items()}
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

    def _mirror(self, log_name: str) -> str:
        return self._attached.get(log_name) or os.path.join(self.directory, log_name)

    def path(self, log_name: str) -> str:
        """The mirror file for ``log_name``; its base is recorded on first use. The mirror
        itself is made by its first write (a missing mirror is an empty one): a burst of a
        thousand admitted jobs then creates two files each, not three (file creation is the
        admitting cycle's largest cost on a slow disk)."""
        path = self._mirror(log_name)
        if not os.path.exists(path + ".base"):
            base = self._remote_size(log_name)
            with open(path + ".base", "w") as f:
                f.write(str(base))
            self._uploaded[log_name] = 0
            self._bases[log_name] = base
        return path

    @staticmethod
    def _size(path: str) -> int:
        try:
            return os.path.getsize(path)
        except FileNotFoundError:  # not written yet
            return 0

    def base(self, log_name: str) -> int:
        """Remote offset where the mirror's first byte lands."""
        path = self.path(log_name)
        if log_name not in self._bases:
            with open(path + ".base") as f:
                self._bases[log_name] = int(f.read().strip() or 0)
        return self._bases[log_name]

    def write(self, log_name: str, text: str) -> None:
        """Append a line of our own (attempt markers) to the mirror, on a line of its own even
        when the job's last output had no final newline."""
        path = self.path(log_name)
        line = text if text.endswith("\n") else text + "\n"
        with open(path, "a+b") as f:
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode())

    def append(self, log_name: str, data: bytes) -> None:
        """Append a job's output (copied from its runner) to the mirror."""
        with open(self.path(log_name), "ab") as f:
            f.write(data)

    def total(self, log_name: str) -> int:
        """Size of the whole log: what the bucket holds plus what is still only local. The
        daemon derives each attempt's output offset from it, so it keeps no cursor."""
        path = self.path(log_name)
        return self.base(log_name) + self._size(path)

    def sync(self, log_name: str) -> int:
        """Upload what the mirror gained since the last sync; returns the bytes uploaded."""
        path = self.path(log_name)
        size = self._size(path)
        done = self._uploaded.get(log_name)
        if done is None:  # after a restart or an uncertain upload: ask the bucket
            done = max(0, self.store.log_size(log_name) - self.base(log_name))
            self._uploaded[log_name] = done
        if size <= done:
            return 0
        with open(path, "rb") as f:
            f.seek(done)
            chunk = f.read(min(size - done, _MAX_CHUNK))
        try:
            self.store.append_log(log_name, chunk, size=self.base(log_name) + done)
        except Exception:
            self._uploaded.pop(log_name, None)  # we may or may not have appended: re-ask
            self._sizes = None
            raise
        self._uploaded[log_name] = done + len(chunk)
        if self._sizes is not None:
            self._sizes[log_name] = self._sizes.get(log_name, 0) + len(chunk)
        return len(chunk)

    def flush(self, log_name: str) -> None:
        """Upload everything the mirror holds."""
        path = self.path(log_name)
        while self._uploaded.get(log_name, -1) < self._size(path):
            if not self.sync(log_name):
                break

    def close(self, log_name: str) -> None:
        """Final upload, then forget the mirror (the bucket holds the whole log now)."""
        path = self._mirror(log_name)
        if not os.path.exists(path + ".base"):
            return
        self.flush(log_name)
        for leftover in (path, path + ".base"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        self._uploaded.pop(log_name, None)
        self._attached.pop(log_name, None)
        self._bases.pop(log_name, None)

    def mirrors(self) -> list[str]:
        own = [n[: -len(".base")] for n in os.listdir(self.directory) if n.endswith(".base")]
        return sorted(set(own) | set(self._attached))
