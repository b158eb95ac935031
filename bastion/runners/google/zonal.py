"""The zonal flow of the Google runners, composed from a provider's plain functions and the kit.

Settings (every Google runner understands these):

- ``root``: the daemon's root URL (required); the agents on the VMs write there.
- ``project``: the cloud project (required).
- ``zones``: zones to try, in order (required). A zone stocked out is skipped for
  ``zone_block_seconds`` (default 600); a region whose quota is exhausted likewise.
- ``backoff_seconds`` (default 30), ``backoff_max_seconds`` (default 1800): a create that
  failed in a zone for any other reason (an operation error such as code 13 INTERNAL, a node or
  VM preempted while it was being created, a queued resource failed or past its deadline)
  blocks that zone for ``backoff_seconds * 2**k`` up to ``backoff_max_seconds``, ``k`` being
  the zone's failed creates in a row before this one; a create there whose workers all
  start resets ``k`` (one that comes up but whose workers never start does not: see
  ``start_timeout_seconds``).
- ``start_timeout_seconds`` (default 900: a bare image's ``pip install`` of the agent): how
  long after the node, VM or queued resource is up (READY, RUNNING, ACTIVE; as this daemon
  first saw it) every worker has to report ``started``. Past it the attempt fails, retryable
  (requeued as a new attempt; its zone backs off like a failed create), with "worker K did
  not start within N s" and the last lines its startup script printed (Compute's serial port
  output for a GCE VM; for TPU VMs what the script copied to the bucket, which ``bastion logs
  NAME --worker=K`` shows too). Until then the job reads "waiting for workers to start (k of
  N)".
- ``network``, ``subnetwork``, ``service_account``: where the VMs live and who they act as.
- ``spot``: default for jobs whose options do not say (a job's ``options["spot"]`` wins).
- ``tiers``: capacity per quota tier the job was admitted on, e.g. ``{0 = "reserved",
  1 = "spot"}`` (:mod:`bastion.runners.kit.capacity`). Values: ``"spot"``, ``"on-demand"``,
  ``"reserved"`` (TPU nodes' ``schedulingConfig.reserved``), ``"reservation:<name>"`` (a named
  reservation: queued resources' ``reservationName``, GCE ``reservationAffinity``). A job's own
  ``spot`` or ``reservation`` option wins; a tier not listed uses ``spot``.
- ``api_endpoint``: the API's base URL. Default: ``$BASTION_TPU_API_ENDPOINT`` /
  ``$BASTION_COMPUTE_API_ENDPOINT``, else Google's. With Google's endpoint the credentials are
  google-auth's standard chain (``google.auth.default()``); with an explicit endpoint (a
  stand-in, a private test server) they are ``AnonymousCredentials`` and no token is sent.
  A private *Google* endpoint that needs auth: set ``credentials: default``.
- ``flush_seconds``: how long a preempted attempt waits for its agents' last output and exit
  records before it is reported PREEMPTED (default 45: the 30 s spot window and a margin).
- ``heartbeat_timeout``: seconds without an agent heartbeat before a worker is lost (default 120).
- ``python``: the interpreter the startup script uses on the VM (default ``python3``): Python
  3.10 or newer, with pip when the agent has to be installed; the script checks both first
  and exits with one line naming this setting (and ``image`` / ``runtime_version``) if not.
- ``package_url``: the daemon's package (a wheel) the startup script installs on a VM where
  ``import bastion`` fails (see :mod:`bastion.runners.startup`). Default: the daemon's own code,
  published into ``ROOT/packages/<sha256>/`` on the first start (``publish_package = false``:
  do not publish; the VM image must have bastion).
- ``agent_args``: extra flags for the agent (e.g. ``["--chunk_seconds=2"]``).
- ``num_retries``: retries of 429/5xx answers per call (default 5, googleapiclient's backoff).

The flow (:class:`ZonalProvisioner`):

- *One list call per zone per cycle*: a poll never asks the API about one attempt; it looks the
  attempt up in the zone's listing (:class:`bastion.runners.kit.listing.CycleListing`).
- *Provisioning record before every create* (``store.runs.write_provision``): a daemon killed
  between the create call and its own state write finds the zone (and the create operation) of the
  attempt again on restart, and ``start`` adopts by name; a 409 on create is adoption too
  (even a phantom one), so nothing is ever created twice.
- *Blocks* (:mod:`bastion.runners.kit.failover`): a stockout blocks its zone, a quota error its
  region, any other failed create its zone with exponential backoff, so the next attempt tries
  elsewhere and a ``start`` with every zone blocked raises :class:`NoCapacity` naming each
  reason and until when, without calling the API. (A create call that fails synchronously
  with 429/5xx past its retries is not a block: the same attempt tries the same zone again
  next cycle, since its create may have happened after all.)
- *Ownership by labels* (:func:`bastion.runners.google.api.ours`), never by a name prefix alone.

A provider (:class:`ZonalProvider`) is a small object of plain functions over one API
resource; :class:`ZonalRunner` is the :class:`Runner` that holds a provider, the flow and the
agent channel. Handles are ``{name, job, zone, workers, op, created?, ...provider's extra}``,
built whole by ``start`` and never changed after.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from googleapiclient.errors import HttpError

from bastion.bucket.store import Store
from bastion.runners import startup
from bastion.runners.base import (
    Attempt,
    AttemptPhase,
    Handle,
    NoCapacity,
    Observation,
    Owned,
    Runner,
    RunnerError,
    TryAgain,
    name_prefix,
    root_tag,
)
from bastion.runners.google.api import (
    ATTEMPT_LABEL,
    GoogleApi,
    ours,
    refusal,
    region_of,
    retryable,
    short_name,
)
from bastion.runners.kit.capacity import capacity
from bastion.runners.kit.channel import AgentChannel
from bastion.runners.kit.failover import Failover
from bastion.runners.kit.lease_fence import check_term
from bastion.runners.kit.listing import CycleListing
from bastion.runners.kit.retry import retry

LISTING_TTL = 1.0


@dataclass(frozen=True)
class ZonalConfig:
    """The settings every zonal runner reads (see the module's docstring)."""

    kind: str
    settings: Mapping[str, Any]
    root: str
    project: str
    zones: tuple[str, ...]
    tag: str
    endpoint: str | None
    page_size: int
    num_retries: int
    listing_ttl: float

    @classmethod
    def parse(cls, kind: str, settings: Mapping[str, Any], api_env: str) -> ZonalConfig:
        root = str(settings.get("root") or "")
        project = str(settings.get("project") or "")
        zones = tuple(str(z) for z in settings.get("zones") or [])
        if not (root and project and zones):
            raise RunnerError(f"the {kind} runner needs settings root, project and zones")
        return cls(
            kind=kind,
            settings=dict(settings),
            root=root,
            project=project,
            zones=zones,
            tag=root_tag(root),
            endpoint=settings.get("api_endpoint") or os.environ.get(api_env) or None,
            page_size=int(settings.get("page_size", 500)),
            num_retries=int(settings.get("num_retries", 5)),
            listing_ttl=float(settings.get("listing_ttl", LISTING_TTL)),
        )


class ZonalProvider(Protocol):
    """One API resource type (TPU nodes, queued resources, Compute instances) as plain
    functions. ``flow`` is the :class:`ZonalProvisioner` whose shared stages (the listing,
    the agent channel, failover, capacity, the startup script) the provider may use.

    Optional functions (looked up, with these defaults): ``labels(resource)`` (the labels
    that say whose a listed resource is; default its ``labels``), ``legacy_ours(resource)``
    (a resource of this root without a runner label, an older daemon's: ours? default yes),
    ``extra(attempt)`` (keys the provider's poll reads from the handle, fixed at start;
    default none), ``startup_output(handle, worker)`` (the provider's own record of a
    worker's startup; default none: the bucket's copy)."""

    noun: str  # what one attempt occupies, for people: "TPU node", "VM"

    def list_zone(self, zone: str) -> list[dict]:
        """Every resource of this root in ``zone`` (all pages): raw API dicts."""

    def job_of(self, resource: dict) -> str | None:
        """The full job name (kept in metadata: labels hold only a slug)."""

    def workers(self, attempt: Attempt) -> int:
        """Hosts the attempt runs on (one agent each)."""

    def create(
        self, flow: ZonalProvisioner, attempt: Attempt, zone: str, workers: int
    ) -> str | None:
        """Issue the create call once (the flow retries); the operation's name."""

    def quota_reason(self, error: HttpError) -> str | None:
        """The quota named by a create error, or None when it is not a quota error."""

    def poll(self, flow: ZonalProvisioner, handle: Handle) -> Observation:
        """The attempt's phase from the zone's listing (the provider's phase table)."""

    def going(self, resource: dict) -> bool:
        """The listed resource is being deleted already (no second delete call)."""

    def request_delete(self, handle: Handle) -> None:
        """One delete call (a 404 is fine)."""

    def inventory(self, resource: dict) -> tuple[int, bool]:
        """(workers, finished) of a listed resource, for ``list_owned``."""


class ZonalProvisioner:
    """Start across zones, stop, verified delete and ownership for one provider."""

    def __init__(self, config: ZonalConfig, provider: ZonalProvider, api: GoogleApi) -> None:
        settings = config.settings
        self.config, self.provider, self.api = config, provider, api
        self.kind, self.tag, self.zones = config.kind, config.tag, list(config.zones)
        self.store = Store(config.root)
        self.spot = bool(settings.get("spot", False))
        self.channel = AgentChannel(
            self.store,
            heartbeat_timeout=float(settings.get("heartbeat_timeout", 120)),
            flush_seconds=float(settings.get("flush_seconds", 45)),
            start_timeout=float(settings.get("start_timeout_seconds", 900)),
            listing_ttl=config.listing_ttl,
        )
        self.failover = Failover(
            block_seconds=float(settings.get("zone_block_seconds", 600)),
            backoff_seconds=float(settings.get("backoff_seconds", 30)),
            backoff_max_seconds=float(settings.get("backoff_max_seconds", 1800)),
            region_of=region_of,
        )
        self.listings: CycleListing[str, dict[str, dict]] = CycleListing(
            self._load_zone, config.listing_ttl
        )
        self._lock = threading.Lock()
        self._created: dict[str, float | None] = {}  # attempt -> its provisioning record's time
        self._package_url: str | None = None

    # -- the cycle's listing -------------------------------------------------------------------
    def begin_cycle(self) -> None:
        """From now on each zone and the agents' records are listed once per cycle."""
        self.listings.begin_cycle()
        self.channel.begin_cycle()

    def _load_zone(self, zone: str) -> dict[str, dict]:
        found = self.provider.list_zone(zone)
        return {short_name(r): r for r in found if self.ours(r)}

    def ours(self, resource: dict) -> bool:
        provider = self.provider
        legacy = getattr(provider, "legacy_ours", None)
        return ours(
            self.labels(resource),
            short_name(resource),
            self.tag,
            self.kind,
            lambda: legacy is None or legacy(resource),
        )

    def labels(self, resource: dict) -> dict[str, str]:
        """The labels that say whose the listed resource is (the provider's, if it says)."""
        if (labels := getattr(self.provider, "labels", None)) is not None:
            return labels(resource)
        return resource.get("labels") or {}

    def listing(self, zone: str, fresh: bool = False) -> dict[str, dict]:
        """The zone's resources of this runner by short name, listed once per cycle."""
        return self.listings.get(zone, fresh)

    def current(self, handle: Handle) -> dict | None:
        """The attempt's resource as its zone's listing shows it, None once gone. A daemon's
        deletes read the cycle's listing (made after the last cycle's delete calls had come
        back, so absent means deleted); without a daemon driving cycles, a fresh listing."""
        return self.listing(handle["zone"], fresh=not self.listings.per_cycle).get(handle["name"])

    def find(self, name: str, zones: Sequence[str]) -> tuple[str, dict] | None:
        for zone in zones:
            if (found := self.listing(zone).get(name)) is not None:
                return zone, found
        return None

    # -- start ---------------------------------------------------------------------------------
    def handle(
        self,
        attempt: Attempt | None,
        job: str,
        name: str,
        zone: str,
        workers: int,
        op: str | None,
        created: float | None = None,
    ) -> Handle:
        """The attempt's whole handle (the provider's extra keys when started from
        ``attempt``); never changed once returned."""
        handle: Handle = {"name": name, "job": job, "zone": zone, "workers": workers, "op": op}
        if created is not None:
            handle["created"] = created  # when the create was issued: deadlines count from it
        extra = getattr(self.provider, "extra", None)
        if attempt is not None and extra is not None:
            handle.update(extra(attempt))
        return handle

    def start(self, attempt: Attempt) -> Handle:
        """Adopt the attempt if it exists in any zone; else create it in the first unblocked
        zone (the recorded one first), writing the provisioning record before the call."""
        workers = self.provider.workers(attempt)
        record = self.store.runs.read_provision(attempt.job, attempt.name) or {}
        zones = list(self.zones)
        if record.get("zone") in zones:
            zones.remove(record["zone"])
            zones.insert(0, record["zone"])
        if (found := self.find(attempt.name, zones)) is not None:
            return self.handle(
                attempt,
                attempt.job,
                attempt.name,
                found[0],
                workers,
                record.get("op"),
                record.get("time"),
            )
        reasons = []
        for zone in zones:
            if (why := self.failover.reason(zone)) is not None:
                reasons.append(why)
                continue
            created = time.time()
            provision = {
                "kind": self.kind,
                "name": attempt.name,
                "zone": zone,
                "workers": workers,
                "root_tag": self.tag,
                "time": created,
            }
            self.store.runs.write_provision(attempt.job, attempt.name, provision)
            check_term(self.store, attempt)
            try:
                op = self._create(attempt, zone, workers)
            except HttpError as e:
                if e.status_code == 409:  # ours already (a lost answer, a phantom 409): adopt
                    self.listings.invalidate(zone)
                    return self.handle(
                        attempt, attempt.job, attempt.name, zone, workers, None, created
                    )
                if (quota := self.provider.quota_reason(e)) is not None:
                    why = f"quota {quota} exhausted in region {region_of(zone)} (zone {zone})"
                    self.failover.quota(region_of(zone), why)
                    reasons.append(why)
                    continue
                if retryable(e):
                    raise TryAgain(f"creating {attempt.name} in {zone}: {e}") from e
                if (refused := refusal(e)) is not None:
                    raise refused from e
                raise RunnerError(f"cannot create {attempt.name} in {zone}: {e}") from e
            self.listings.invalidate(zone)
            self.store.runs.write_provision(attempt.job, attempt.name, {**provision, "op": op})
            return self.handle(attempt, attempt.job, attempt.name, zone, workers, op, created)
        raise NoCapacity("waiting for capacity: " + "; ".join(dict.fromkeys(reasons)))

    def _create(self, attempt: Attempt, zone: str, workers: int) -> str | None:
        """Creates are retried here, not by googleapiclient: a 429 that names a quota must not
        be repeated (it is a block, not a rate limit). A retried create is safe: the name (TPU)
        or the requestId (GCE) makes a repeat a 409 or the same operation."""
        return retry(
            lambda: self.provider.create(self, attempt, zone, workers),
            retries=self.api.num_retries,
            should_retry=lambda e: retryable(e) and self.provider.quota_reason(e) is None,
            sleep=lambda seconds: self.api.sleep(seconds),
        )

    def created(self, handle: Handle) -> float | None:
        """When the attempt's create was issued: the handle's ``created``, else (a handle
        from before it had one) its provisioning record's time, read once."""
        if handle.get("created") is not None:
            return float(handle["created"])
        name = handle["name"]
        with self._lock:
            if name in self._created:
                return self._created[name]
        record = self.store.runs.read_provision(handle["job"], name) or {}
        found = float(record["time"]) if record.get("time") is not None else None
        with self._lock:
            self._created[name] = found
        return found

    def capacity(self, attempt: Attempt) -> tuple[str, str | None]:
        return capacity(attempt, self.config.settings.get("tiers"), self.spot, self.kind)

    def script(self, attempt: Attempt, workers: int, extra_args: Sequence[str] = ()) -> str:
        """The startup script; ``extra_args`` go to the agent (e.g. ``--num_slices``)."""
        settings = self.config.settings
        bundle = (
            [f"--bundle={json.dumps(dict(attempt.bundle), sort_keys=True)}"]
            if attempt.bundle
            else []
        )
        return startup.script(
            root=self.config.root,
            job=attempt.job,
            attempt=attempt.name,
            num_workers=workers,
            command=attempt.command,
            env=attempt.env,
            python=str(settings.get("python") or "python3"),
            package_url=self.package_url(),
            bootstrap_url=self.store.runs.bootstrap_url(attempt.job, attempt.name),
            agent_args=list(settings.get("agent_args") or []) + list(extra_args) + bundle,
        )

    def package_url(self) -> str | None:
        """``package_url`` from the settings, else the daemon's own code published into the
        root once (content-addressed; see :mod:`bastion.runners.startup`), unless
        ``publish_package`` is false."""
        settings = self.config.settings
        if settings.get("package_url") or not settings.get("publish_package", True):
            return settings.get("package_url")
        with self._lock:
            if self._package_url is None:
                self._package_url = self.store.packages.put(*startup.package_wheel())
            return self._package_url

    # -- what poll composes --------------------------------------------------------------------
    def up(self, handle: Handle) -> Observation:
        """The machines are up: the agent channel's word, with the start deadline
        (:meth:`bastion.runners.kit.channel.AgentChannel.up`)."""
        return self.channel.up(
            handle,
            came_up=lambda: self.failover.came_up(handle["zone"]),
            timed_out=lambda waiting: self.not_started(handle, waiting),
        )

    def not_started(self, handle: Handle, waiting: list[int]) -> Observation:
        """FAILED, retryable (a new attempt may land on a healthy host; the zone backs off,
        so a broken image costs a bounded rate of attempts, not a hot loop), naming the first
        silent worker, the last lines its startup script printed, and what to fix."""
        w, job = waiting[0], handle["job"]
        who = f"worker {w}" if len(waiting) == 1 else f"workers {', '.join(map(str, waiting))}"
        brief = (
            f"{who} did not start within {self.channel.start_timeout:g} s of its "
            f"{self.provider.noun} coming up: fix its startup (the {self.kind} runner "
            "settings python, image / runtime_version, package_url) or raise "
            "start_timeout_seconds"
        )
        own = getattr(self.provider, "startup_output", None)
        said = (own and own(handle, w)) or self.channel.startup_output(handle, w)
        why = brief + (
            f"; worker {w}'s startup script printed: {said}"
            if said
            else f"; worker {w} left no startup output"
        )
        why += f" (all of it: bastion logs {job} --worker={w})"
        return self.create_failed(handle, why, reason=brief)

    def transient(self, handle: Handle, state: str, detail: str = "") -> Observation:
        """A state between create and delete other than up (see the agent channel)."""
        what = f"{self.provider.noun} {state}{f' ({detail})' if detail else ''} in {handle['zone']}"
        return self.channel.transient(handle, what)

    def stockout(self, handle: Handle, message: str) -> Observation:
        return self.failover.stockout(handle["zone"], message)

    def create_failed(
        self,
        handle: Handle,
        why: str,
        phase: AttemptPhase = AttemptPhase.FAILED,
        reason: str | None = None,
    ) -> Observation:
        return self.failover.create_failed(handle["name"], handle["zone"], why, phase, reason)

    def provision_op(self, handle: Handle) -> str | None:
        """The create operation's name: the handle's, else the provisioning record's."""
        if handle.get("op"):
            return handle["op"]
        return (self.store.runs.read_provision(handle["job"], handle["name"]) or {}).get("op")

    # -- stop, delete, list --------------------------------------------------------------------
    def stop(self, handle: Handle, deadline: float) -> None:
        """Delete the resource: the VMs' shutdown gives every agent SIGTERM, and it flushes.
        The attempt's end is ours from now on (no backoff, no dead man's switch). A handle
        without a zone (records alone, see list_owned) has no machines left to stop."""
        self.failover.stopped(handle["name"])
        if not handle.get("zone"):
            return
        resource = self.listing(handle["zone"]).get(handle["name"])
        if resource is not None and not self.provider.going(resource):
            self._request_delete(handle)

    def delete(self, handle: Handle) -> bool:
        """Delete the resource; once it is verified gone (absent from the zone's listing, see
        :meth:`current`), its agents' records too (their output stays). A handle without a
        zone stands for records alone (see list_owned)."""
        if handle.get("zone"):
            resource = self.current(handle)
            if resource is not None:
                if not self.provider.going(resource):
                    self._request_delete(handle)
                return False
        self.channel.delete(handle)
        self.forget(handle["name"])
        return True

    def _request_delete(self, handle: Handle) -> None:
        self.provider.request_delete(handle)
        self.listings.deleted(handle["zone"])

    def list_owned(self) -> list[Owned]:
        """The resources in every zone, plus attempts whose agents' records outlived their
        resource (a daemon that died between the two deletions): the sweep deletes those."""
        owned = []
        for zone in self.zones:
            for resource in self.listing(zone).values():
                workers, finished = self.provider.inventory(resource)
                owned.append(self.owned(resource, zone, workers, finished))
        names = {item.name for item in owned}
        for job, name, workers in self.channel.owned_records(name_prefix(self.config.root), names):
            owned.append(Owned(name, self.handle(None, job, name, "", workers, None), True))
        return owned

    def owned(self, resource: dict, zone: str, workers: int, finished: bool) -> Owned:
        """The item the sweep sees: named after the attempt (its label, which :meth:`ours`
        holds equal to the resource's name; a legacy resource's own name)."""
        name = self.labels(resource).get(ATTEMPT_LABEL) or short_name(resource)
        job = self.provider.job_of(resource) or name
        return Owned(name, self.handle(None, job, name, zone, workers, None), finished)

    def describe(self, handle: Handle) -> str | None:
        zone = handle.get("zone")
        where = f" in {zone}" if zone else ""
        n = int(handle.get("workers", 1))
        return f"{self.provider.noun} {handle['name']} ({n} worker{'' if n == 1 else 's'}){where}"

    def forget(self, name: str) -> None:
        self.channel.forget(name)
        self.failover.forget(name)
        with self._lock:
            self._created.pop(name, None)

    def close(self) -> None:
        self.channel.close()


class ZonalRunner(Runner):
    """A Google runner whose attempts live in zones: a provider composed with the flow.

    ``ZonalRunner(kind, settings, make_provider)``: ``make_provider(config, api)`` makes the
    provider; ``make_client(config)`` the API client (unless ``client`` is given)."""

    def __init__(
        self,
        kind: str,
        settings: Mapping[str, Any],
        api_env: str,
        make_client: Callable[[ZonalConfig], Any],
        make_provider: Callable[[ZonalConfig, GoogleApi], ZonalProvider],
        client: Any = None,
    ) -> None:
        self.kind = kind
        self.config = ZonalConfig.parse(kind, settings, api_env)
        self.api = GoogleApi(client or make_client(self.config), self.config.num_retries)
        self.provider = make_provider(self.config, self.api)
        self.flow = ZonalProvisioner(self.config, self.provider, self.api)
        # what tools, tests and benchmarks look at
        self.channel, self.blocks = self.flow.channel, self.flow.failover.blocks
        self.settings, self.store = self.config.settings, self.flow.store
        self.root, self.tag = self.config.root, self.config.tag
        self.endpoint, self.listing_ttl = self.config.endpoint, self.config.listing_ttl

    @property
    def client(self) -> Any:
        return self.api.client

    @property
    def sleep(self) -> Callable[[float], None]:
        """The pause between retries of API calls (tests make it instant)."""
        return self.api.sleep

    @sleep.setter
    def sleep(self, value: Callable[[float], None]) -> None:
        self.api.sleep = value

    def package_url(self) -> str | None:
        return self.flow.package_url()

    def start(self, attempt: Attempt) -> Handle:
        return self.flow.start(attempt)

    def poll(self, handle: Handle) -> Observation:
        if not handle.get("zone"):  # records alone (list_owned): the machines are gone
            return self.channel.gone(handle, f"{self.provider.noun} {handle['name']} is gone")
        return self.provider.poll(self.flow, handle)

    def stop(self, handle: Handle, deadline: float) -> None:
        self.flow.stop(handle, deadline)

    def delete(self, handle: Handle) -> bool:
        return self.flow.delete(handle)

    def list_owned(self) -> list[Owned]:
        return self.flow.list_owned()

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        return self.channel.read_output(handle, offset, limit)

    def begin_cycle(self) -> None:
        self.flow.begin_cycle()

    def describe(self, handle: Handle) -> str | None:
        return self.flow.describe(handle)

    def close(self) -> None:
        self.flow.close()
