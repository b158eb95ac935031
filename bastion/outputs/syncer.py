"""The syncer: a local directory mirrored to a job's outputs in the bucket, O(changed bytes).

A manifest (name -> size and modification time, as last uploaded or restored) says what the
bucket already has; a sync stats the directory (no bucket request), uploads what differs,
and removes from the bucket what the job removed (a rotated-out checkpoint), so a steady
sync costs no request at all. A file that changes while it uploads is not entered in the
manifest: the next sync uploads it again, and the final one, run after the job's processes
have ended, sees it at rest. ``.bastion/checkpoint.json`` goes last in every sync, so the
checkpoint it names is in the bucket before the report that points at it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass

from bastion.bucket.outputs import _PART, CHECKPOINT, SUMMARIES, OutputPaths

log = logging.getLogger(__name__)

Signature = tuple[int, int]  # (size, mtime in ns)
SYNC_SECONDS = 5.0  # between two syncs while the job runs
STATS = ".stats"  # beside a kept manifest: the attempt's SyncStats so far


@dataclass
class SyncStats:
    """What one attempt's syncer did, for the job's history (one summary per worker)."""

    attempt: int = 0
    worker: int = 0
    purpose: str = "run"  # or "cleanup": the job's cleanup command, after its last attempt
    restored_files: int = 0
    restored_bytes: int = 0
    synced_files: int = 0
    synced_bytes: int = 0
    removed_files: int = 0
    syncs: int = 0
    requests: int = 0  # uploads, downloads, deletes and listings: what the bucket billed
    failures: int = 0
    last_sync: float = 0.0
    final: bool = False  # the last sync after the job ended ran to its end
    last_error: str = ""


class Syncer:
    """Mirrors ``local_dir`` to worker ``worker``'s outputs of ``job``. Thread-safe: the
    periodic thread and the final sync never overlap (one lock)."""

    def __init__(
        self,
        paths: OutputPaths,
        job: str,
        local_dir: str,
        worker: int = 0,
        attempt: int = 0,
        manifest_path: str | None = None,
    ) -> None:
        self.paths = paths
        self.job = job
        self.local_dir = os.path.abspath(local_dir)
        self.worker = worker
        # Kept on disk beside the directory when a second process syncs what a first restored
        # (the Docker runner restores, its watcher syncs): the watcher uploads nothing restored.
        self.manifest_path = manifest_path
        self.manifest: dict[str, Signature] = self._load_manifest()
        # Its stats too: the attempt's summary counts what every process did (the runner's
        # restore, the watcher's syncs, the final sync by whoever holds the lock then).
        self.stats = self._load_stats() or SyncStats(attempt=attempt, worker=worker)
        self._lock = threading.Lock()
        os.makedirs(self.local_dir, exist_ok=True)

    def _load_manifest(self) -> dict[str, Signature]:
        if not self.manifest_path:
            return {}
        try:
            with open(self.manifest_path) as f:
                data = json.load(f)
            return {str(k): (int(v[0]), int(v[1])) for k, v in data.items()}
        except (OSError, ValueError, TypeError, IndexError, AttributeError):
            return {}

    def _load_stats(self) -> SyncStats | None:
        if not self.manifest_path:
            return None
        try:
            with open(self.manifest_path + STATS) as f:
                return SyncStats(**json.load(f))
        except (OSError, ValueError, TypeError):
            return None

    def _save_manifest(self) -> None:
        if not self.manifest_path:
            return
        for path, data in (
            (self.manifest_path, self.manifest),
            (self.manifest_path + STATS, asdict(self.stats)),
        ):
            with open(path + ".tmp", "w") as f:
                json.dump(data, f)
            os.replace(path + ".tmp", path)

    # -- restore ---------------------------------------------------------------------------

    def restore(self) -> SyncStats:
        """Fetch the worker's files into the directory (before the command starts); the
        manifest then says they are in the bucket, so the first sync uploads nothing."""
        with self._lock:
            self.stats.requests += 1
            for name, remote in sorted(self.paths.list(self.job, self.worker).items()):
                if name.startswith(SUMMARIES + "/"):
                    continue  # Bastion's own records stay in the bucket
                local = self._local(name)
                if local is None:
                    log.warning("outputs: %r is not a path inside the directory; skipped", name)
                    continue
                self.paths.download(self.job, name, local, self.worker)
                self.stats.requests += 1
                st = os.stat(local)
                self.manifest[name] = (st.st_size, st.st_mtime_ns)
                self.stats.restored_files += 1
                self.stats.restored_bytes += remote.size
            self._save_manifest()
        return self.stats

    def _local(self, name: str) -> str | None:
        path = os.path.normpath(os.path.join(self.local_dir, name))
        return path if path.startswith(self.local_dir + os.sep) else None

    # -- sync ------------------------------------------------------------------------------

    def scan(self) -> dict[str, Signature]:
        """Every regular file below the directory (links are not followed)."""
        found: dict[str, Signature] = {}
        pending = [("", self.local_dir)]
        while pending:
            rel, path = pending.pop()
            try:
                entries = list(os.scandir(path))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            for entry in entries:
                name = f"{rel}/{entry.name}" if rel else entry.name
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_dir(follow_symlinks=False):
                        pending.append((name, entry.path))
                    elif entry.is_file(follow_symlinks=False) and _PART not in entry.name:
                        st = entry.stat(follow_symlinks=False)
                        found[name] = (st.st_size, st.st_mtime_ns)
        return found

    def sync(self, final: bool = False) -> SyncStats:
        """Upload what changed since the manifest, remove what the job removed. A failed
        upload is counted and tried again next sync; it never raises."""
        with self._lock:
            current = self.scan()
            changed = [name for name, sig in current.items() if self.manifest.get(name) != sig]
            changed.sort(key=lambda name: (name == CHECKPOINT, name))  # the report goes last
            for name in changed:
                self._upload(name, current[name])
            removed = [name for name in self.manifest if name not in current]
            if removed:
                try:
                    self.paths.delete(self.job, removed, self.worker)
                    self.stats.requests += len(removed)
                    self.stats.removed_files += len(removed)
                    for name in removed:
                        del self.manifest[name]
                except Exception as e:  # the bucket is down: next sync
                    self._failed("removing", removed[0], e)
            self.stats.syncs += 1
            self.stats.last_sync = time.time()
            if final:
                self.stats.final = not any(self.manifest.get(n) != s for n, s in current.items())
            if changed or removed or final:
                self._save_manifest()
        return self.stats

    def _upload(self, name: str, before: Signature) -> None:
        path = os.path.join(self.local_dir, name)
        try:
            self.paths.upload(self.job, name, path, self.worker)
            self.stats.requests += 1
            st = os.stat(path)
        except FileNotFoundError:
            return  # removed since the scan: the next sync removes it from the bucket
        except Exception as e:
            self._failed("uploading", name, e)
            return
        self.stats.synced_files += 1
        self.stats.synced_bytes += before[0]
        if (st.st_size, st.st_mtime_ns) == before:
            self.manifest[name] = before  # (changed while uploading: the next sync again)

    def _failed(self, what: str, name: str, error: Exception) -> None:
        self.stats.failures += 1
        self.stats.last_error = f"{what} {name}: {type(error).__name__}: {error}"[:300]
        log.warning("outputs of %s: %s", self.job, self.stats.last_error)

    def write_summary(self) -> None:
        """The attempt's summary in the bucket (``bastion history`` shows it); best effort."""
        try:
            self.paths.write_summary(self.job, self.stats.attempt, self.worker, asdict(self.stats))
        except Exception as e:
            log.warning("outputs of %s: summary not written: %s", self.job, e)


class Periodic:
    """Runs ``syncer.sync()`` every ``seconds`` in a daemon thread until :meth:`stop`."""

    def __init__(self, syncer: Syncer, seconds: float = SYNC_SECONDS) -> None:
        self.syncer = syncer
        self.seconds = seconds
        self._stopped = threading.Event()
        self._first = seconds
        self._thread = threading.Thread(target=self._run, name="bastion-outputs", daemon=True)

    def start(self, first: float | None = None) -> Periodic:
        """``first``: seconds before the first sync (default: the period)."""
        self._first = self.seconds if first is None else first
        self._thread.start()
        return self

    def _run(self) -> None:
        if not self._stopped.wait(self._first):
            self._sync()
        while not self._stopped.wait(self.seconds):
            self._sync()

    def _sync(self) -> None:
        try:
            self.syncer.sync()
        except Exception:  # never let the thread die: the final sync still runs
            log.exception("outputs: sync failed")

    def stop(self) -> None:
        """No sync starts after this returns... except one already under way, which the
        final sync (same lock) waits for."""
        self._stopped.set()
