"""The gke runner itself: start (create-if-absent), poll, stop, delete and the sweep, composed
of the cluster's listings (:mod:`.cluster`), the manifest (:mod:`.manifest`), the phase mapping
(:mod:`.observe`) and the runner kit's agent channel.

Start adopts the attempt's JobSet if this root's listing has it, else writes the provisioning
record, checks the lease term and creates it; 409 is adoption once the existing JobSet's labels
say it is this attempt. Stop is ``DELETE`` with ``propagationPolicy=Foreground`` and the grace
period (the pods' agents get SIGTERM and flush); at the deadline the remaining pods are deleted
with grace 0. Delete is verified by a later listing (a Foreground-deleting JobSet stays listed,
with a ``deletionTimestamp``, until the garbage collector removed its pods).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from bastion.bucket.store import Store
from bastion.retry import read_back
from bastion.runners import startup
from bastion.runners.base import (
    Attempt,
    Handle,
    Observation,
    Owned,
    Runner,
    RunnerError,
    TryAgain,
    root_tag,
)
from bastion.runners.gke.cluster import Cluster
from bastion.runners.gke.errors import refusal
from bastion.runners.gke.manifest import Placement
from bastion.runners.gke.manifest import manifest as build_manifest
from bastion.runners.gke.observe import observe, true_conditions
from bastion.runners.gke.shape import (
    ATTEMPT_LABEL,
    JOB_ANNOTATION,
    ROOT_LABEL,
    jobset_name,
    shape,
)
from bastion.runners.kit.channel import AgentChannel
from bastion.runners.kit.lease_fence import check_term

LISTING_TTL = 1.0


class GkeRunner(Runner):
    kind = "gke"

    def __init__(self, settings: Mapping[str, Any], api_client: Any = None) -> None:
        self.settings = dict(settings)
        self.root = str(settings.get("root") or "")
        if not self.root:
            raise RunnerError("the gke runner needs the setting root")
        self.tag = root_tag(self.root)
        self.store = Store(self.root)
        self.listing_ttl = float(settings.get("listing_ttl", LISTING_TTL))
        self.grace = int(settings.get("termination_grace_seconds", 60))
        self.cluster = Cluster(self.settings, self.tag, self.kind, self.listing_ttl, api_client)
        self.namespace = self.cluster.namespace
        self.channel = AgentChannel(
            self.store,
            heartbeat_timeout=float(settings.get("heartbeat_timeout", 120)),
            flush_seconds=float(settings.get("flush_seconds", 45)),
            start_timeout=float(settings.get("start_timeout", 1800)),
            listing_ttl=self.listing_ttl,
        )
        self._lock = threading.Lock()
        self._package_url: str | None = None

    @property
    def calls(self) -> int:
        """API calls made so far (for the benchmark and the cost tests)."""
        return self.cluster.calls

    def begin_cycle(self) -> None:
        self.cluster.begin_cycle()
        self.channel.begin_cycle()

    # -- start ---------------------------------------------------------------------------------
    def start(self, attempt: Attempt) -> Handle:
        """Adopt the attempt's JobSet if this root's listing has it, else write the
        provisioning record, check the lease term and create it (409: adopt if ours)."""
        sh = shape(self._options(attempt))
        name = jobset_name(attempt.name)
        record = self.store.runs.read_provision(attempt.job, attempt.name) or {}
        handle = self._handle(attempt.job, attempt.name, name, sh, record.get("time"))
        if name in self.cluster.jobsets(fresh=not self.cluster.per_cycle):
            return handle
        body = self.manifest(attempt, sh)
        created = time.time()
        self.store.runs.write_provision(
            attempt.job,
            attempt.name,
            {
                "kind": self.kind,
                "name": attempt.name,
                "jobset": name,
                "namespace": self.namespace,
                "workers": sh["slices"] * sh["hosts"],
                "root_tag": self.tag,
                "time": created,
            },
        )
        check_term(self.store, attempt)  # the apiserver takes no fencing token
        try:
            self.cluster.create_jobset(body)
        except Exception as e:
            if getattr(e, "status", None) == 409:
                self._adopt_existing(name, attempt)
            elif hasattr(e, "status"):
                raise refusal(e, "create", f"JobSet {name} in namespace {self.namespace}") from e
            else:
                raise TryAgain(f"creating JobSet {name}: {e}") from e
        self.cluster.created()
        handle["created"] = created
        return handle

    def _adopt_existing(self, name: str, attempt: Attempt) -> None:
        """A 409: the JobSet exists. Ours (a lost answer, a daemon killed after the create)
        when its labels name this root and attempt; anything else is a name clash."""

        def labels_of(found: dict[str, Any]) -> dict[str, str]:
            return (found.get("metadata") or {}).get("labels") or {}

        back = read_back(
            lambda: self._jobset_or_none(name),
            lambda found: (
                labels_of(found).get(ROOT_LABEL) == self.tag
                and labels_of(found).get(ATTEMPT_LABEL) == attempt.name
            ),
        )
        if back.found is None:  # deleted in between: create next cycle
            raise TryAgain(f"JobSet {name} existed and is gone now")
        if not back.ours:
            raise RunnerError(
                f"a JobSet named {name} already exists in namespace "
                f"{self.namespace} and is not this attempt's (labels {labels_of(back.found)}); "
                "delete it or use another namespace"
            )

    def _jobset_or_none(self, name: str) -> dict[str, Any] | None:
        """The JobSet ``name`` as the apiserver has it; None when it does not exist."""
        try:
            return self.cluster.get_jobset(name)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise

    def _options(self, attempt: Attempt) -> dict[str, Any]:
        """The job's options over the settings' defaults (``instance_type``, ``num_replicas``):
        a spec that names no machine runs on the cluster's default one."""
        defaults = {
            k: self.settings[k]
            for k in ("instance_type", "num_replicas", "topology")
            if k in self.settings
        }
        if any(
            attempt.options.get(k) for k in ("instance_type", "accelerator_type", "machine_type")
        ):
            defaults.pop("instance_type", None)
        return {**defaults, **attempt.options}

    def _handle(
        self, job: str, attempt: str, name: str, sh: Mapping[str, Any], created: float | None
    ) -> Handle:
        handle: Handle = {
            "name": attempt,
            "job": job,
            "jobset": name,
            "namespace": self.namespace,
            "slices": sh["slices"],
            "workers": sh["slices"] * sh["hosts"],
            "what": sh["what"],
        }
        if created is not None:
            handle["created"] = created
        return handle

    def package_url(self) -> str | None:
        if self.settings.get("package_url") or not self.settings.get("publish_package", True):
            return self.settings.get("package_url")
        with self._lock:
            if self._package_url is None:
                self._package_url = self.store.packages.put(*startup.package_wheel())
            return self._package_url

    def manifest(self, attempt: Attempt, sh: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JobSet for the attempt (a plain dict, as the apiserver stores it)."""
        where = Placement(
            root=self.root,
            tag=self.tag,
            kind=self.kind,
            namespace=self.namespace,
            grace=self.grace,
            package_url=self.package_url(),
            settings=self.settings,
        )
        return build_manifest(attempt, sh or shape(self._options(attempt)), where)

    # -- poll ----------------------------------------------------------------------------------
    def poll(self, handle: Handle) -> Observation:
        name = handle.get("jobset") or jobset_name(handle["name"])
        js = self.cluster.jobsets().get(name)
        if js is None:
            why = f"JobSet {name} is gone from namespace {self.namespace}"
            return self.channel.gone(handle, why, wait_flush=True)
        if (js.get("metadata") or {}).get("deletionTimestamp"):
            return self.channel.gone(handle, f"JobSet {name} is being deleted", wait_flush=True)
        return observe(
            self.channel, handle, js, lambda: self.cluster.pods().get(handle["name"], [])
        )

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        return self.channel.read_output(handle, offset, limit)

    def describe(self, handle: Handle) -> str | None:
        n, slices = int(handle.get("workers", 1)), int(handle.get("slices", 1))
        hosts = n // max(1, slices)
        what = handle.get("what", "")
        size = f"{hosts} host{'' if hosts == 1 else 's'}" + (
            f" x {slices} slices" if slices > 1 else ""
        )
        context = self.settings.get("context")
        where = f"namespace {handle.get('namespace', self.namespace)}" + (
            f" of {context}" if context else ""
        )
        return f"JobSet {handle.get('jobset', handle['name'])} ({what}, {size}) in {where}"

    # -- stop and delete -----------------------------------------------------------------------
    def stop(self, handle: Handle, deadline: float) -> None:
        """Foreground delete with the grace period; past the deadline, the pods at once."""
        name = handle.get("jobset") or jobset_name(handle["name"])
        js = self.cluster.jobsets().get(name)
        if js is not None and not (js.get("metadata") or {}).get("deletionTimestamp"):
            self.cluster.delete_jobset(name, self.grace)
        if time.time() >= deadline:
            self.cluster.kill_pods(handle["name"])

    def delete(self, handle: Handle) -> bool:
        """True once the JobSet is absent from a listing made after the delete call (the
        cycle's; without a daemon a fresh one); then the agents' records go too."""
        if handle.get("jobset") or not handle.get("records_only"):
            name = handle.get("jobset") or jobset_name(handle["name"])
            per_cycle = self.cluster.per_cycle
            js = self.cluster.jobsets(fresh=not per_cycle).get(name)
            if js is not None:
                if not (js.get("metadata") or {}).get("deletionTimestamp"):
                    self.cluster.delete_jobset(name, self.grace)
                if per_cycle or not self._gone_soon(name):
                    return False
        self.channel.delete(handle)
        return True

    def _gone_soon(self, name: str, seconds: float = 5.0) -> bool:
        """Without a daemon (a tool, a test) there is no next cycle to verify the deletion:
        list again for a few seconds (the garbage collector removes the pods in well under a
        second once they stopped). A daemon never waits: its next cycle's listing tells."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if name not in self.cluster.jobsets(fresh=True):
                return True
        return False

    def list_owned(self) -> list[Owned]:
        """This root's JobSets (by their labels), plus attempts whose agents' records outlived
        their JobSet (a daemon that died between the two deletions)."""
        owned = [self._owned(name, js) for name, js in self.cluster.jobsets().items()]
        names = {item.name for item in owned}
        for job, attempt, workers in self.channel.owned_records(f"bst-{self.tag}-", names):
            provision = self.store.runs.read_provision(job, attempt) or {}
            if provision.get("kind") != self.kind:
                continue  # another runner's attempt: its records are that runner's to sweep
            handle = {"name": attempt, "job": job, "workers": workers, "records_only": True}
            owned.append(Owned(attempt, handle, True))
        return owned

    def _owned(self, name: str, js: dict[str, Any]) -> Owned:
        meta = js.get("metadata") or {}
        attempt = meta["labels"][ATTEMPT_LABEL]
        job = (meta.get("annotations") or {}).get(JOB_ANNOTATION) or attempt
        rjobs = (js.get("spec") or {}).get("replicatedJobs") or [{}]
        slices = int(rjobs[0].get("replicas") or 1)
        hosts = int(((rjobs[0].get("template") or {}).get("spec") or {}).get("parallelism") or 1)
        handle = self._handle(
            job, attempt, name, {"slices": slices, "hosts": hosts, "what": ""}, None
        )
        ended = bool(set(true_conditions(js)) & {"Completed", "Failed"})
        return Owned(attempt, handle, ended)

    def forget(self, name: str) -> None:
        self.channel.forget(name)

    def close(self) -> None:
        self.channel.close()
        self.cluster.close()
