"""Where a job's outputs live in the bucket: the only code that knows ``ROOT/outputs/...``.

    ROOT/outputs/<job>/<path>                     worker 0's files (and a one-host job's)
    ROOT/outputs/<job>/workers/<k>/<path>         worker k's files, kept apart (k >= 1)
    ROOT/outputs/<job>/.bastion/attempts/<a>-w<k>.json   what attempt a's syncer restored
                                                  and synced on worker k (the history's lines)

Unlike the rest of the bucket, names starting with "." are the job's own (``.bastion/
checkpoint.json``, ``.hydra/``), so this lists with fsspec's ``find`` rather than the store's
listings, which leave dot-names out as temporary parts. Files are streamed (``put_file`` /
``get_file``), never read into memory: a checkpoint may be many gigabytes. On a local root an
upload goes to a temporary name beside the target and is renamed, so a reader never sees half
a file; a GCS or S3 object appears only once complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bastion.bucket.local import LocalObjects

if TYPE_CHECKING:
    from bastion.bucket.store import Store

OUTPUTS = "outputs"
WORKERS = "workers"
RESERVED = ".bastion"  # Bastion's part of a job's outputs: checkpoint.json, attempt summaries
SUMMARIES = f"{RESERVED}/attempts"
CHECKPOINT = f"{RESERVED}/checkpoint.json"
_PART = ".bastion-part-"  # temporary uploads on a local root: never listed


@dataclass(frozen=True)
class OutputFile:
    """One file of a job's outputs as the bucket lists it."""

    name: str  # relative to the worker's top (``ckpt/step-100``)
    size: int
    mtime: float  # epoch seconds, as the bucket reports it (0.0 when it does not)
    token: str  # new on every write: what ``--download`` compares


class OutputPaths:
    """A job's output directory in the bucket, composed into :class:`Store` as
    ``store.outputs``. Every call is counted on the store, like every other bucket call."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _top(self, job: str, worker: int = 0) -> str:
        parts = [self.store.root, OUTPUTS, job]
        if worker:
            parts += [WORKERS, str(int(worker))]
        return "/".join(parts)

    def reachable_elsewhere(self) -> bool:
        """Whether another process (the job's supervisor, an agent) can open this root: a
        local path, or a protocol fsspec loads by name. A filesystem registered only in this
        process (tests' fault-injecting ones) cannot be, so its jobs get no outputs."""
        from fsspec.registry import known_implementations

        protocol = self.store.root_url.partition("://")[0] if "://" in self.store.root_url else ""
        return protocol in ("", "file") or protocol in known_implementations

    def url(self, job: str, worker: int = 0) -> str:
        """``ROOT/outputs/<job>/`` (worker k: ``.../workers/<k>/``): $BASTION_OUTPUT_URL."""
        parts = [OUTPUTS, job] + ([WORKERS, str(int(worker))] if worker else [])
        return self.store.bucket.url(*parts) + "/"

    def list(self, job: str, worker: int | None = 0) -> dict[str, OutputFile]:
        """The files of ``worker`` (None: every worker's, names as in the bucket, e.g.
        ``workers/1/log.txt``) by name relative to its top; one recursive listing. Worker 0's
        listing leaves out the other workers' directories and nothing else."""
        self.store.bucket.count("list")
        top = self._top(job, worker or 0)
        fs = self.store.fs
        with contextlib.suppress(Exception):
            fs.invalidate_cache(top)
        try:
            entries = fs.find(top, detail=True)
        except FileNotFoundError:
            return {}
        found = {}
        for path, entry in entries.items():
            name = path.rstrip("/")[len(top) + 1 :]
            if not name or entry.get("type") == "directory" or _PART in name:
                continue
            if worker == 0 and name.startswith(WORKERS + "/"):
                continue
            found[name] = OutputFile(
                name, int(entry.get("size") or 0), _mtime(entry), self.store.objects.token(entry)
            )
        return found

    def upload(self, job: str, name: str, local_path: str, worker: int = 0) -> None:
        """Stream a local file to ``name``; readers see the old or the whole new file."""
        self.store.bucket.count("write")
        target = f"{self._top(job, worker)}/{name}"
        if _is_local(self.store):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            part = os.path.join(os.path.dirname(target), f"{_PART}{uuid.uuid4().hex[:8]}")
            try:
                shutil.copyfile(local_path, part)
                os.replace(part, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
            return
        self.store.fs.put_file(local_path, target)

    def download(self, job: str, name: str, local_path: str, worker: int | None = 0) -> None:
        """Stream ``name`` to ``local_path`` through a temporary file beside it."""
        self.store.bucket.count("read")
        source = f"{self._top(job, worker or 0)}/{name}"
        os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
        part = f"{local_path}{_PART}{uuid.uuid4().hex[:8]}"
        try:
            self.store.fs.get_file(source, part)
            os.replace(part, local_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)

    def delete(self, job: str, names: list[str], worker: int | None = 0) -> None:
        top = self._top(job, worker or 0)
        for name in names:
            self.store.bucket.count("delete")
            with contextlib.suppress(FileNotFoundError):
                self.store.fs.rm_file(f"{top}/{name}")

    def delete_all(self, job: str) -> int:
        """Every file of every worker of ``job``; returns how many there were."""
        names = list(self.list(job, worker=None))
        self.delete(job, names, worker=None)
        if _is_local(self.store):
            shutil.rmtree(self._top(job), ignore_errors=True)
        return len(names)

    # -- what each attempt restored and synced ---------------------------------------------

    def write_summary(
        self, job: str, attempt: int, worker: int, record: dict[str, Any], purpose: str = "run"
    ) -> None:
        self.store.bucket.count("write")
        suffix = "" if purpose == "run" else f"-{purpose}"
        path = f"{self._top(job)}/{SUMMARIES}/a{int(attempt)}-w{int(worker)}{suffix}.json"
        data = json.dumps(record, sort_keys=True).encode()
        if _is_local(self.store):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            part = f"{path}{_PART}"
            with open(part, "wb") as f:
                f.write(data)
            os.replace(part, path)
            return
        self.store.fs.pipe_file(path, data)

    def read_summaries(self, job: str) -> list[dict[str, Any]]:
        """Every attempt's summary, oldest attempt first (then by worker)."""
        files = self.list(job)
        records = []
        for name in files:
            if not (name.startswith(SUMMARIES + "/") and name.endswith(".json")):
                continue
            self.store.bucket.count("read")
            try:
                record = json.loads(self.store.fs.cat_file(f"{self._top(job)}/{name}"))
            except (OSError, ValueError):
                continue  # a summary half-written by a killed syncer: the next one replaces it
            if isinstance(record, dict):
                records.append(record)
        return sorted(records, key=lambda r: (int(r.get("attempt", 0)), int(r.get("worker", 0))))

    def read_checkpoint(self, job: str) -> dict[str, Any] | None:
        """The job's ``.bastion/checkpoint.json`` as last synced; None if absent or unreadable."""
        self.store.bucket.count("read")
        try:
            record = json.loads(self.store.fs.cat_file(f"{self._top(job)}/{CHECKPOINT}"))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None


def _is_local(store: Store) -> bool:
    return isinstance(store.objects, LocalObjects)


def _mtime(entry: dict[str, Any]) -> float:
    """The object's modification time in epoch seconds, whatever the backend calls it."""
    value = entry.get("mtime") or entry.get("updated") or entry.get("LastModified") or 0
    if isinstance(value, int | float):
        return float(value)
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
