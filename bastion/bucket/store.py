"""The bucket store: the only code that knows Bastion's object paths.

Everything goes through fsspec, so a local directory, ``gs://`` (gcsfs) and ``s3://`` (s3fs)
share one implementation; what a backend does differently (atomic replace, create-if-absent,
compare-and-swap, append) lives in ``bastion.bucket.objects`` and one module per backend.

A ``Store`` is one namespace per prefix of the root, each a small class in its own module,
all reading and writing through one ``CountedObjects`` (every request counted: see
``Store.ops``):

    store.specs         jobs/active/          bastion/bucket/jobs.py
    store.states        jobs/states/
    store.requests      jobs/user_states/     (cancel requests and submission markers)
    store.complete      jobs/complete/
    store.logs          logs/                 bastion/bucket/logs.py
    store.history       history/jobs/         bastion/bucket/history.py
    store.decisions     history/decisions/
    store.queue         history/queue
    store.daemon_info   history/daemon
    store.usage         history/usage
    store.capabilities  history/capabilities
    store.snapshot      history/snapshot/     bastion/bucket/snapshot.py
    store.finished_runs history/runs/
    store.quota         project-quotas/, history/quota-last-good, any quota URL
    store.lease         lease                 bastion/bucket/control.py
    store.agents        agents/               bastion/bucket/runs.py
    store.runs          runs/
    store.bundles       bundles/              bastion/bucket/artifacts.py
    store.packages      packages/
    store.outputs       outputs/              bastion/bucket/outputs.py
    store.reports       usage/, status/       bastion/bucket/status_paths.py
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
from typing import Any

import fsspec
from fsspec.asyn import AsyncFileSystem

from bastion.bucket.artifacts import Bundles, Packages
from bastion.bucket.control import Lease, QuotaFiles
from bastion.bucket.counted import REQUEST_TIMEOUT_SECONDS, CountedObjects, default_options
from bastion.bucket.history import Decisions, FinishedRuns, History, JsonRecord, Queue
from bastion.bucket.jobs import JOB_DIRECTORIES, JOBS, Complete, Requests, Specs, States
from bastion.bucket.logs import Logs
from bastion.bucket.objects import (
    ObjectInfo,
    Objects,
    PreconditionFailed,
    UnacceptableObject,
    objects_for,
)
from bastion.bucket.outputs import OutputPaths
from bastion.bucket.runs import Agents, Runs
from bastion.bucket.snapshot import Snapshot
from bastion.bucket.status_paths import ReportObjects

__all__ = [
    "REQUEST_TIMEOUT_SECONDS",
    "ObjectInfo",
    "PreconditionFailed",
    "Store",
    "UnacceptableObject",
    "resolve_root",
]


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


class Store:
    """One root: its namespaces, and the backend and request counts they share."""

    def __init__(self, root: str, **storage_options: Any) -> None:
        fs, path = fsspec.core.url_to_fs(root, **default_options(root, storage_options))
        path = path.rstrip("/")
        self.bucket = CountedObjects(fs, objects_for(fs, path), path, root)
        self.specs = Specs(self.bucket)
        self.states = States(self.bucket)
        self.requests = Requests(self.bucket)
        self.complete = Complete(self.bucket)
        self.logs = Logs(self.bucket)
        self.history = History(self.bucket)
        self.decisions = Decisions(self.bucket)
        self.queue = Queue(self.bucket)
        self.daemon_info = JsonRecord(self.bucket, "daemon")
        self.usage = JsonRecord(self.bucket, "usage")
        self.capabilities = JsonRecord(self.bucket, "capabilities")
        self.finished_runs = FinishedRuns(self.bucket)
        self.snapshot = Snapshot(self.bucket)
        self.quota = QuotaFiles(self.bucket)
        self.lease = Lease(self.bucket)
        self.agents = Agents(self.bucket)
        self.runs = Runs(self.bucket, self.agents)
        self.bundles = Bundles(self.bucket)
        self.packages = Packages(self.bucket)
        self.outputs = OutputPaths(self)  # ROOT/outputs/<job>/...: bastion/bucket/outputs.py
        self.reports = ReportObjects(self)  # ROOT/usage/ (the ledger) and ROOT/status/ (page)
        self._own_loop: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
        if self.bucket.is_local:  # so a user browsing the root sees the layout
            for sub in JOB_DIRECTORIES:
                os.makedirs(self.bucket.path(JOBS, sub), exist_ok=True)

    def own_connection(self, name: str) -> Store:
        """This root through connections of its own: for a remote bucket (gcsfs, s3fs), a
        filesystem instance with its own session and its own event loop thread ``name``, so
        its requests never wait in this store's queue (every request of an fsspec filesystem
        goes through one event loop and one connection pool, where a burst's starts put
        thousands). The lease's renewals need it. A bucket that is itself overloaded still
        delays them (the GCS emulator behind the benchmark's proxy took 16-64 s for one
        during a 1,000-job burst, with or without this); a lapse then makes the daemon stand
        down and recover. A local root has no queue to wait in: the store itself."""
        fs = self.bucket.fs
        if not isinstance(fs, AsyncFileSystem):
            return self
        options = {k: v for k, v in fs.storage_options.items() if k != "loop"}
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
        thread.start()
        own = Store(self.root_url, **options, skip_instance_cache=True, loop=loop)
        own._own_loop = (loop, thread)
        return own

    def close(self) -> None:
        """Stops what this store runs for itself: the event loop thread of an
        ``own_connection`` (the client's own finalizer then closes its sockets). A daemon
        closed in a process that goes on (tests, the benchmarks) leaves no thread behind.
        Other stores run nothing of their own: a no-op."""
        if self._own_loop is None:
            return
        (loop, thread), self._own_loop = self._own_loop, None
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

    @property
    def root_url(self) -> str:
        """The root as the user gave it (``gs://b/x``, a path): for messages."""
        return self.bucket.root_url

    @property
    def root(self) -> str:
        """The root as the backend names it (no protocol, no trailing "/")."""
        return self.bucket.root

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self.bucket.fs

    @property
    def objects(self) -> Objects:
        return self.bucket.objects

    @property
    def ops(self) -> collections.Counter[str]:
        """Requests so far, by kind: benchmarks check that a steady cycle only lists."""
        return self.bucket.ops

    @property
    def is_local(self) -> bool:
        """A local directory rather than a bucket."""
        return self.bucket.is_local
