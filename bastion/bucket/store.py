"""The bucket store: the only code that knows Bastion's object paths.

Everything goes through fsspec, so a local directory, ``gs://`` (gcsfs) and ``s3://`` (s3fs)
share one implementation; what a backend does differently (atomic replace, create-if-absent,
compare-and-swap, append) lives in ``bastion.bucket.objects``. Every call is counted, because "a
steady-state cycle only lists" is an invariant we measure (benchmarks/), not a hope.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import fsspec

from bastion.bucket.local import LocalObjects
from bastion.bucket.objects import (
    ObjectInfo,
    Objects,
    PreconditionFailed,
    UnacceptableObject,
    objects_for,
)
from bastion.jobspec import MAX_SPEC_BYTES

__all__ = ["ObjectInfo", "PreconditionFailed", "Store", "UnacceptableObject", "resolve_root"]

ACTIVE, STATES, USER_STATES, COMPLETE = "active", "states", "user_states", "complete"
DAEMON_LOG_PREFIX = "_bastion-"  # names starting with "_" are never job names
CLEANUP_SUFFIX = ".cleanup"
T = TypeVar("T")
# A submission marker in jobs/user_states/: "_submitted-<ms, 13 digits>-<8 hex>-<job name>".
# Names starting with "_" are never job names, so markers and cancel requests share one
# listing (see bastion/bucket/specwatch.py for why markers exist).
MARKER_PREFIX = "_submitted-"
_HEX = frozenset("0123456789abcdef")


def configure_emulator_env() -> None:
    """gcsfs probes the bucket type over gRPC (60 s timeouts) unless told not to; an emulator
    has no gRPC endpoint, so users pointing at one would hang. Must run before gcsfs loads."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


configure_emulator_env()


def default_root() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return os.path.join(base, "bastion")


def resolve_root(root: str | None) -> str:
    """--root, else $BASTION_ROOT, else a local directory in the user's data home."""
    return root or os.environ.get("BASTION_ROOT") or default_root()


REQUEST_TIMEOUT_SECONDS = 60.0  # one bucket request; gcsfs retries transient failures itself


def _default_options(root: str, options: dict[str, Any]) -> dict[str, Any]:
    """Every bucket call gets a timeout: a hung request must not hang the daemon's cycle."""
    if fsspec.utils.get_protocol(root) in ("gs", "gcs"):
        import aiohttp

        options.setdefault(
            "requests_timeout",
            # sock_read: a stalled read raises an error gcsfs retries; total bounds the rest
            aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS, sock_connect=10, sock_read=20),
        )
    return options


class Store:
    def __init__(self, root: str, **storage_options: Any) -> None:
        self.root_url = root
        self.fs, path = fsspec.core.url_to_fs(root, **_default_options(root, storage_options))
        self.root = path.rstrip("/")
        self.objects = objects_for(self.fs, self.root)
        self.ops: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        if isinstance(self.objects, LocalObjects):  # so a user browsing the root sees the layout
            for sub in (ACTIVE, STATES, USER_STATES, COMPLETE):
                os.makedirs(self._path("jobs", sub), exist_ok=True)

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
        return self.objects.list(self._path(directory))

    def _read(self, *parts: str, limit: int | None = None) -> bytes | None:
        """The object's bytes, None when absent. UnacceptableObject: over ``limit``, or on a
        local root not a regular file (a link, directory, FIFO...)."""
        self._count("read")
        return self.objects.read(self._path(*parts), limit=limit)

    def _read_with_token(self, *parts: str, limit: int | None = None) -> tuple[bytes, str] | None:
        """The bytes and their listing token (see Objects.read_with_token)."""
        self._count("read")
        return self.objects.read_with_token(self._path(*parts), limit=limit)

    def _write(self, data: bytes, *parts: str) -> None:
        """Replace an object atomically: readers see the old or the new bytes, never half."""
        self._count("write")
        self.objects.write(self._path(*parts), data)

    def _write_if(self, data: bytes, expected: str | None, *parts: str) -> str:
        """Compare-and-swap on the object's token; returns the new token."""
        self._count("write")
        return self.objects.write_if(self._path(*parts), data, expected)

    def _create(self, data: bytes, *parts: str) -> bool:
        """Write only if absent; False when the object already exists."""
        self._count("write")
        return self.objects.create(self._path(*parts), data)

    def _delete(self, *parts: str) -> None:
        self._count("delete")
        self.objects.delete(self._path(*parts))

    def _info(self, *parts: str) -> ObjectInfo | None:
        self._count("info")
        return self.objects.info(self._path(*parts))

    def _size(self, *parts: str) -> int:
        info = self._info(*parts)
        return info.size if info else 0

    def _read_range(self, start: int, *parts: str) -> bytes:
        self._count("read")
        return self.objects.read(self._path(*parts), start=start) or b""

    def _append(self, data: bytes, *parts: str, size: int | None = None) -> None:
        self._count("append")
        self.objects.append(self._path(*parts), data, size=size)

    # -- job specs (written by users) ------------------------------------------------------

    def list_specs(self) -> dict[str, ObjectInfo]:
        return self._list(f"jobs/{ACTIVE}")

    def read_spec(self, name: str) -> bytes | None:
        """A spec's bytes, at most MAX_SPEC_BYTES. UnacceptableObject (its message is the
        rejection reason) for a larger one and, on a local root, for anything but a regular
        file: a link to a secret must never have its content copied into jobs/complete/."""
        return self._read_spec_with(self._read, name)

    def read_spec_with_token(self, name: str) -> tuple[bytes, str] | None:
        """As ``read_spec``, with the listing token of the bytes read (one request on GCS and
        on a local root): for a spec named by a submission marker, whose token no listing
        gave."""
        return self._read_spec_with(self._read_with_token, name)

    def _read_spec_with(self, reader: Callable[..., T], name: str) -> T:
        try:
            return reader("jobs", ACTIVE, name, limit=MAX_SPEC_BYTES)
        except UnacceptableObject as e:
            if e.rule == UnacceptableObject.REGULAR:
                raise UnacceptableObject(e.path, e.what, "specs must be regular files") from None
            raise

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

    def write_state(self, name: str, data: bytes, expected: str | None = None) -> str:
        """Write a state only if it is still at ``expected`` (None: absent); new token.

        Raises PreconditionFailed when someone else wrote it since: a stale daemon must not
        overwrite what the current one decided."""
        return self._write_if(data, expected, "jobs", STATES, name)

    def read_state_with_token(self, name: str) -> tuple[bytes, str] | None:
        info = self._info("jobs", STATES, name)
        raw = self._read("jobs", STATES, name) if info else None
        return (raw, info.token) if info and raw is not None else None

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

    # -- submission markers: "look at this spec", beside the cancel requests -----------------

    @staticmethod
    def marker_name(name: str, now: float | None = None) -> str:
        """A new marker for job ``name``: unique (a later write of the same spec gets its own,
        so deleting a consumed marker never drops a newer one), and sorting by the writer's
        clock for a human listing the bucket (the daemon trusts no clock: it takes them all)."""
        stamp = int((time.time() if now is None else now) * 1000)
        return f"{MARKER_PREFIX}{stamp:013d}-{uuid.uuid4().hex[:8]}-{name}"

    @staticmethod
    def is_marker(entry: str) -> bool:
        """Whether a jobs/user_states/ entry is a submission marker (else a cancel request)."""
        return entry.startswith(MARKER_PREFIX)

    @staticmethod
    def marked_job(marker: str) -> str | None:
        """The job a marker names; None when the marker is not of the form marker_name
        writes (any bucket writer can put anything there)."""
        stamp, _, rest = marker.removeprefix(MARKER_PREFIX).partition("-")
        unique, _, name = rest.partition("-")
        if len(stamp) != 13 or not stamp.isdigit() or len(unique) != 8 or set(unique) - _HEX:
            return None
        return name or None

    def write_marker(self, name: str) -> str:
        """After a spec is created or replaced: tells the daemon to read it next cycle."""
        marker = self.marker_name(name)
        body = {"name": name, "time": time.time()}  # for a human; the daemon reads the name
        self._write(json.dumps(body, sort_keys=True).encode(), "jobs", USER_STATES, marker)
        return marker

    def delete_markers(self, markers: list[str]) -> None:
        """Consumed markers, in one batch request per 100 on GCS (counted once here)."""
        self._count("delete")
        self.objects.delete_many([self._path("jobs", USER_STATES, m) for m in markers])

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

    @staticmethod
    def daemon_log_name(host: str, work_dir: str) -> str:
        """One log object per daemon installation: restarts append, two daemons never mix."""
        return f"{DAEMON_LOG_PREFIX}{host}-{hashlib.sha1(work_dir.encode()).hexdigest()[:6]}"

    def list_logs(self) -> dict[str, ObjectInfo]:
        return self._list("logs")

    def log_size(self, log: str) -> int:
        return self._size("logs", log)

    def read_log(self, log: str, start: int = 0) -> bytes:
        return self._read_range(start, "logs", log)

    def append_log(self, log: str, data: bytes, size: int | None = None) -> None:
        """Append to a log; ``size``, if known, is its current size (saves a request)."""
        self._append(data, "logs", log, size=size)

    def save_history(self, name: str, submission: str, events: list[dict[str, Any]]) -> None:
        """A finished submission's events, one object each under history/jobs/<name>/.

        A plain overwrite, so saving again after a failure whose answer was lost is harmless;
        ``submission`` sorts by time (see read_history)."""
        lines = "".join(json.dumps(event, sort_keys=True) + "\n" for event in events)
        self._write(lines.encode(), "history", "jobs", name, submission)

    def read_history(self, name: str) -> Iterator[dict[str, Any]]:
        """Every finished submission's events under this name, oldest first."""
        for submission in sorted(self._list(f"history/jobs/{name}")):
            raw = self._read("history", "jobs", name, submission) or b""
            for line in raw.decode(errors="replace").splitlines():
                if line.strip():
                    yield json.loads(line)

    # -- scheduler decision log and usage ledger ------------------------------------------

    def write_decisions(self, now: float, record: dict[str, Any]) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f".{int(now * 1e6) % 10**6:06d}"
        self._write(json.dumps(record, sort_keys=True).encode(), "history", "decisions", stamp)

    def list_decisions(self) -> list[str]:
        return sorted(self._list("history/decisions"))

    def prune_decisions(self, keep: int) -> None:
        """Keep the newest ``keep`` records (names sort by time)."""
        for stamp in self.list_decisions()[:-keep]:
            self._delete("history", "decisions", stamp)

    def write_queue(self, summary: dict[str, Any]) -> None:
        """``ROOT/history/queue``: what every waiting job shares and changes whenever any job
        moves (positions, free capacity, usage); one object, so a job's state need not."""
        self._write(json.dumps(summary, sort_keys=True).encode(), "history", "queue")

    def read_queue(self) -> dict[str, Any] | None:
        raw = self._read("history", "queue")
        try:
            summary = json.loads(raw) if raw else None
        except ValueError:
            return None  # torn or foreign: shown as unknown, never fatal to a reader
        return summary if isinstance(summary, dict) else None

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

    # -- bundles: users' code, content-addressed (written by the CLI, read by runners) -------

    @staticmethod
    def bundle_name(digest: str) -> str:
        """``sha256:<hex>`` -> ``sha256-<hex>.tar.gz``; ValueError for anything else, so a
        record from a spec can never name a path outside bundles/."""
        algorithm, _, hexdigest = digest.partition(":")
        if algorithm != "sha256" or len(hexdigest) != 64 or hexdigest.strip("0123456789abcdef"):
            raise ValueError(f"{digest!r} is not a digest of the form sha256:<64 hex digits>")
        return f"sha256-{hexdigest}.tar.gz"

    def bundle_url(self, digest: str) -> str:
        return self.url("bundles", self.bundle_name(digest))

    def bundle_info(self, digest: str) -> ObjectInfo | None:
        return self._info("bundles", self.bundle_name(digest))

    def bundle_exists(self, digest: str) -> bool:
        return self.bundle_info(digest) is not None

    def put_bundle(self, digest: str, data: bytes | os.PathLike[str], size: int) -> bool:
        """Store a bundle unless an object of that digest and ``size`` is already there: True
        when this call uploaded it. ``data``: the bytes, or a local file streamed to a bucket
        (a GCS/S3 object appears only once complete; a local root is written atomically).
        Content-addressed, so two users racing upload the same bytes; a wrong-sized leftover
        (a truncated or tampered object) is replaced rather than trusted."""
        info = self.bundle_info(digest)
        if info is not None and info.size == size:
            return False
        name = self.bundle_name(digest)
        if isinstance(data, bytes):
            self._write(data, "bundles", name)
        elif isinstance(self.objects, LocalObjects):  # its write is the symlink-safe one
            with open(data, "rb") as f:
                self._write(f.read(), "bundles", name)
        else:
            self._count("write")
            self.fs.put_file(os.fspath(data), self._path("bundles", name))
        return True

    def read_bundle(self, digest: str) -> bytes | None:
        return self._read("bundles", self.bundle_name(digest))

    def open_bundle(self, digest: str) -> Any:
        """A binary file object to stream a bundle (FileNotFoundError when absent); callers
        verify the digest of what they read, so nothing unverified is ever used."""
        self._count("read")
        return self.fs.open(self._path("bundles", self.bundle_name(digest)), "rb")

    def delete_bundle(self, digest: str) -> None:
        self._delete("bundles", self.bundle_name(digest))

    # -- the lease: one daemon per root ------------------------------------------------------

    def read_lease(self) -> tuple[dict[str, Any], str] | None:
        """The lease record and its token, or None when nobody ever held it."""
        info = self._info("lease")
        raw = self._read("lease") if info else None
        if info is None or raw is None:
            return None
        try:
            return json.loads(raw), info.token
        except ValueError:
            return {}, info.token  # unreadable: treat as held by nobody we know

    def write_lease(self, record: dict[str, Any], expected: str | None) -> str:
        return self._write_if(json.dumps(record, sort_keys=True).encode(), expected, "lease")

    # -- quota file ------------------------------------------------------------------------

    def default_quota_url(self) -> str:
        return self.url("project-quotas", "project-quotas.config")

    def _objects_of(self, url: str) -> tuple[Objects, str]:
        """The objects of any URL; this root's own (which follow no link) for a local path
        inside the root, such as the default quota file."""
        fs, path = fsspec.core.url_to_fs(url, **_default_options(url, {}))
        local = isinstance(fs, type(self.fs)) and isinstance(self.objects, LocalObjects)
        if local and path.startswith(self.root + "/"):
            return self.objects, path
        return objects_for(fs, reads_only=True), path

    def url_token(self, url: str) -> str | None:
        """Change token of any object (the quota file may live in another bucket)."""
        self._count("info")
        objects, path = self._objects_of(url)
        info = objects.info(path)
        return info.token if info else None

    def read_url(self, url: str) -> bytes:
        """Through the backend's primitives, so every backend's timeouts and errors apply."""
        self._count("read")
        objects, path = self._objects_of(url)
        data = objects.read(path)
        if data is None:
            raise FileNotFoundError(url)
        return data

    # -- runs: what remote attempts report ---------------------------------------------------
    #
    # The agents' records of a live attempt, apart from its output so that one listing of
    # ROOT/agents/ per cycle covers every running attempt (O(running), not O(output)):
    #
    #   agents/<job>/<attempt>/workers/<w>/started    the agent's claim, create-if-absent
    #   agents/<job>/<attempt>/workers/<w>/heartbeat  replaced every few seconds while it runs
    #   agents/<job>/<attempt>/workers/<w>/progress   {chunks, bytes}: replaced after each chunk
    #   agents/<job>/<attempt>/workers/<w>/exit       {code, preempted, time, reason, chunks}
    #
    # deleted with the attempt's machines; its output and provisioning record stay:
    #
    #   runs/<job>/<attempt>/provision.json           written by a cloud runner before create
    #   runs/<job>/<attempt>/workers/<w>/log/<seq:08d>  output chunks, in order; rewritten
    #                                                 under the same name when a write's answer
    #                                                 was lost (idempotent)
    #
    # Names in a listing are relative to the attempt; run_name/parse_run_name are the only
    # code that builds or reads them, so readers (runners/kit/records.py) know no paths.

    RUN_RECORDS = ("started", "heartbeat", "progress", "exit")

    @staticmethod
    def run_name(worker: int, kind: str, seq: int | None = None) -> str:
        """``workers/<w>/<kind>`` for a record; ``workers/<w>/log/<seq>`` for a chunk."""
        if kind == "log":
            return f"workers/{worker}/log/{seq:08d}"
        return f"workers/{worker}/{kind}"

    @staticmethod
    def parse_run_name(name: str) -> tuple[int, str, int | None] | None:
        """(worker, kind, seq) of a name in a run listing; None for anything else."""
        parts = name.split("/")
        if len(parts) < 3 or parts[0] != "workers" or not parts[1].isdigit():
            return None
        if len(parts) == 3 and parts[2] in Store.RUN_RECORDS:
            return int(parts[1]), parts[2], None
        if len(parts) == 4 and parts[2] == "log" and len(parts[3]) == 8 and parts[3].isdigit():
            return int(parts[1]), "log", int(parts[3])
        return None

    def _run_parts(self, job: str, attempt: str, name: str) -> tuple[str, ...]:
        """Output chunks live under runs/ (kept), records under agents/ (deleted with the
        attempt's machines), so that listing every live attempt's records stays small."""
        parsed = self.parse_run_name(name)
        top = "runs" if parsed is not None and parsed[1] == "log" else "agents"
        return (top, job, attempt, *name.split("/"))

    def list_run(self, job: str, attempt: str) -> dict[str, ObjectInfo]:
        """The attempt's output chunks in one recursive listing (one request per 1,000
        objects on a bucket): names relative to the attempt, e.g. ``workers/0/log/00000003``."""
        self._count("list")
        found = self.objects.find(self._path("runs", job, attempt))
        return {name: info for name, info in found.items() if name != "provision.json"}

    def list_agent_records(self, job: str, attempt: str) -> dict[str, ObjectInfo]:
        """One attempt's records (``workers/0/heartbeat``, ...)."""
        self._count("list")
        return self.objects.find(self._path("agents", job, attempt))

    def list_agents(self) -> dict[tuple[str, str], dict[str, ObjectInfo]]:
        """Every live attempt's records in one listing, by (job, attempt)."""
        self._count("list")
        found: dict[tuple[str, str], dict[str, ObjectInfo]] = {}
        for name, info in self.objects.find(self._path("agents")).items():
            parts = name.split("/", 2)
            if len(parts) == 3:
                record = ObjectInfo(parts[2], info.size, info.token)
                found.setdefault((parts[0], parts[1]), {})[parts[2]] = record
        return found

    def delete_agent_records(self, job: str, attempt: str) -> None:
        """The attempt's records (its machines are gone); its output stays in runs/."""
        for name in self.list_agent_records(job, attempt):
            self._delete("agents", job, attempt, *name.split("/"))
        if isinstance(self.objects, LocalObjects):
            import shutil

            shutil.rmtree(self._path("agents", job, attempt), ignore_errors=True)
            with contextlib.suppress(OSError):  # the job's directory, once it is empty
                os.rmdir(self._path("agents", job))

    # A worker's startup script copies what it printed before the agent took over to
    # ``runs/<job>/<attempt>/workers/<w>/bootstrap`` (kept with the output): the one trace of
    # a worker whose interpreter or package install failed, since no agent ever wrote a word.

    def bootstrap_url(self, job: str, attempt: str, worker: int | None = None) -> str:
        """Where worker ``worker``'s startup script copies its own output; with None, the URL
        with ``{worker}`` in the worker's place (the script learns its index at boot)."""
        w = "{worker}" if worker is None else str(int(worker))
        return self.url("runs", job, attempt, "workers", w, "bootstrap")

    @staticmethod
    def bootstrap_worker(name: str) -> int | None:
        """The worker of a ``workers/<w>/bootstrap`` name in a run listing; None otherwise."""
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "workers" and parts[1].isdigit():
            return int(parts[1]) if parts[2] == "bootstrap" else None
        return None

    def read_bootstrap(
        self, job: str, attempt: str, worker: int, tail: int = 16384
    ) -> bytes | None:
        """The last ``tail`` bytes of what the worker's startup script printed; None when it
        copied nothing (no such worker, or a script that never got that far)."""
        parts = ("runs", job, attempt, "workers", str(int(worker)), "bootstrap")
        info = self._info(*parts)
        if info is None:
            return None
        return self._read_range(max(0, info.size - tail), *parts)

    def write_provision(self, job: str, attempt: str, record: dict[str, Any]) -> None:
        self._write(
            json.dumps(record, sort_keys=True).encode(), "runs", job, attempt, "provision.json"
        )

    def read_provision(self, job: str, attempt: str) -> dict[str, Any] | None:
        raw = self._read("runs", job, attempt, "provision.json")
        return json.loads(raw) if raw else None

    def claim_run_worker(self, job: str, attempt: str, worker: int, record: dict[str, Any]) -> bool:
        """Write ``started`` only if absent: False when this worker of this attempt already
        started (a startup script run again after a reboot must not start the command twice).
        A retry of our own create whose answer was lost finds the same bytes and succeeds."""
        data = json.dumps(record, sort_keys=True).encode()
        return self._create(data, *self._run_parts(job, attempt, self.run_name(worker, "started")))

    def write_run_record(
        self, job: str, attempt: str, worker: int, kind: str, record: dict[str, Any]
    ) -> None:
        """Replace a worker's ``heartbeat``, ``progress`` or ``exit`` record."""
        assert kind in ("heartbeat", "progress", "exit"), kind
        data = json.dumps(record, sort_keys=True).encode()
        self._write(data, *self._run_parts(job, attempt, self.run_name(worker, kind)))

    def read_run_record(
        self, job: str, attempt: str, worker: int, kind: str
    ) -> dict[str, Any] | None:
        """A worker's started/heartbeat/exit record; None when absent or unreadable (a record
        is replaced whole, so unreadable means damaged: treat it as never written)."""
        raw = self._read(*self._run_parts(job, attempt, self.run_name(worker, kind)))
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def write_run_chunk(self, job: str, attempt: str, worker: int, seq: int, data: bytes) -> None:
        """A plain overwrite: rewriting a chunk whose answer was lost stores the same bytes."""
        self._write(data, *self._run_parts(job, attempt, self.run_name(worker, "log", seq)))

    def read_run_chunk(
        self, job: str, attempt: str, worker: int, seq: int, start: int = 0
    ) -> bytes:
        return self._read_range(
            start, *self._run_parts(job, attempt, self.run_name(worker, "log", seq))
        )

    def delete_run(self, job: str, attempt: str) -> None:
        """Every object of the attempt, records and output (idempotent)."""
        self.delete_agent_records(job, attempt)
        for name in self.list_run(job, attempt):
            self._delete(*self._run_parts(job, attempt, name))
        self._delete("runs", job, attempt, "provision.json")
        if isinstance(self.objects, LocalObjects):
            import shutil

            shutil.rmtree(self._path("runs", job, attempt), ignore_errors=True)

    # -- read-only helpers for the client (launch/): streaming a log -------------------------
    #
    # Nothing here writes; the daemon does not use these.

    def read_log_chunks(self, log: str, start: int = 0, chunk: int = 1 << 20) -> Iterator[bytes]:
        """A log from ``start`` to its current end, in pieces of at most ``chunk`` bytes, so a
        reader's memory stays bounded whatever the log's size; nothing when it is absent."""
        info = self._info("logs", log)
        if info is None:
            return
        end = info.size
        self._count("read")
        path = self._path("logs", log)
        try:
            if isinstance(self.objects, LocalObjects):  # a link planted in logs/ is not followed
                f = os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")
            else:
                f = self.fs.open(path, "rb")
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

    # -- the daemon's own package, content-addressed (for the cloud VMs' startup script) -----
    #
    # ``ROOT/packages/<sha256>/<wheel file name>``: the directory is the digest of the wheel's
    # bytes, the file keeps the name pip needs. Written once; a VM installs exactly this.

    def put_package(self, filename: str, data: bytes) -> str:
        """Store the wheel unless it is there already; its URL either way."""
        if "/" in filename or not filename.endswith(".whl"):
            raise ValueError(f"{filename!r} is not a wheel file name")
        digest = hashlib.sha256(data).hexdigest()
        info = self._info("packages", digest, filename)
        if info is None or info.size != len(data):
            self._write(data, "packages", digest, filename)
        return self.url("packages", digest, filename)
