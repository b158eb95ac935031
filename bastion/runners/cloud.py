"""What the cloud runners (TPU VM: :mod:`bastion.runners.tpu`, GPU VM: :mod:`bastion.runners.gce`)
share: the API client, labels, one zone listing per cycle, zone/region blocks, the provisioning
record, bounded retries, and the agents' records in the bucket.

Settings (``from_settings`` of either runner; keys both understand):

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
  1 = "spot"}`` (AXLearn's practice: a job within its project's quota gets the reservation, a
  job borrowing idle quota gets spot capacity, which the cloud may take back as the quota
  policy may). Values: ``"spot"``, ``"on-demand"``, ``"reserved"`` (TPU nodes'
  ``schedulingConfig.reserved``), ``"reservation:<name>"`` (a named reservation: queued
  resources' ``reservationName``, GCE ``reservationAffinity``). A job's own ``spot`` or
  ``reservation`` option wins; a tier not listed uses ``spot``.
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

Why the pieces are here:

- *One list call per zone per cycle*: a poll never asks the API about one attempt; it looks the
  attempt up in the zone's listing, made once per daemon cycle (``begin_cycle``; used
  without a daemon, once per ``listing_ttl``) for every attempt polled meanwhile. Cost per
  cycle is O(zones), not O(jobs).
- *Provisioning record before every create* (``Store.write_provision``): a daemon killed between
  the create call and its own state write finds the zone (and the create operation) of the
  attempt again on restart, and ``start`` adopts by name; a 409 on create is adoption too
  (even a phantom one), so nothing is ever created twice.
- *Blocks*: a stockout blocks its zone, a quota error its region, any other failed create its
  zone with exponential backoff (:meth:`CloudRunner.create_failed`), in memory with an expiry,
  so the next attempt (the daemon requeues a failed create as a new one) tries elsewhere and a
  ``start`` with every zone blocked raises :class:`TryAgain` naming each reason and until when,
  without calling the API: no hot loop of creates, whatever the error. (A create call that
  fails synchronously with 429/5xx past its retries is not a block: the same attempt tries the
  same zone again next cycle, since its create may have happened after all.)
"""

from __future__ import annotations

import abc
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google_auth_httplib2 import AuthorizedHttp
from googleapiclient import discovery
from googleapiclient.errors import HttpError
from googleapiclient.http import build_http

from bastion.runners import startup
from bastion.runners.base import (
    Attempt,
    Fenced,
    Handle,
    NoCapacity,
    Observation,
    Owned,
    Phase,
    Runner,
    RunnerError,
    TryAgain,
    name_prefix,
    root_tag,
)
from bastion.runners.remote import RemoteRecords
from bastion.store import ObjectInfo, Store

LISTING_TTL = 1.0
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})


def retryable(error: HttpError) -> bool:
    """429 and 5xx, and a 403 whose reason is a rate limit (cloud.md 2.6: Compute answers a
    burst of calls with 403 rateLimitExceeded, which is not a refusal of the request)."""
    if error.status_code in RETRYABLE_STATUS:
        return True
    details = error.error_details if isinstance(error.error_details, list) else []
    return error.status_code == 403 and any(
        isinstance(d, dict) and d.get("reason") in RATE_LIMIT_REASONS for d in details
    )


def build_client(api: str, version: str, endpoint: str | None, credentials: str | None = None):
    """A googleapiclient resource from the packaged (static, offline) discovery document."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    if endpoint and credentials != "default":
        creds = AnonymousCredentials()
    else:
        creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    options = {"api_endpoint": endpoint} if endpoint else None
    return discovery.build(api, version, static_discovery=True, cache_discovery=False,
                           credentials=creds, client_options=options)  # fmt: skip


_LABEL_BAD = re.compile(r"[^a-z0-9_-]+")


def label_value(text: str) -> str:
    """A legal GCP label value: lowercase ``[a-z0-9_-]``, at most 63 characters."""
    return _LABEL_BAD.sub("-", text.lower()).strip("-")[:63]


RUNNER_LABEL = "bastion-runner"
ATTEMPT_LABEL = "bastion-attempt-name"


def labels_for(attempt: Attempt, tag: str, kind: str) -> dict[str, str]:
    """What a resource is, in labels: ``bastion-root`` (this daemon's root), ``bastion-runner``
    (the runner kind that made it) and ``bastion-attempt-name`` (the attempt it is) decide
    ownership (:meth:`CloudRunner._ours`); job and attempt number are for people.

    An attempt name is an RFC 1035 label of at most 63 characters (lowercase letters, digits,
    hyphens): a legal label value as it is, checked here rather than silently changed."""
    if label_value(attempt.name) != attempt.name:
        raise RunnerError(f"attempt name {attempt.name!r} is not a legal label value")
    return {"bastion-root": tag, RUNNER_LABEL: kind, ATTEMPT_LABEL: attempt.name,
            "bastion-job": label_value(attempt.job) or "job",
            "bastion-attempt": str(attempt.attempt)}  # fmt: skip


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _brief(text: str, limit: int = 200) -> str:
    """One line of at most ``limit`` characters (an API's message can be long)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def last_lines(text: str, lines: int = 8, limit: int = 800) -> str:
    """The last non-blank ``lines`` of ``text`` as one line (" | " between them), at most
    ``limit`` characters from its end: what a failure reason can carry."""
    kept = [" ".join(line.split()) for line in text.splitlines() if line.strip()][-lines:]
    joined = " | ".join(kept)
    return joined if len(joined) <= limit else "..." + joined[-(limit - 3):]


class Blocks:
    """Zones and regions not to create in until an expiry, with the reason to show; and each
    zone's failed creates in a row, which make its next backoff longer."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock  # expiries
        self.wall = wall  # "until when", for people
        self._until: dict[str, tuple[float, str]] = {}
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def block(self, key: str, reason: str, seconds: float) -> str:
        """Block ``key`` (``zone:Z``, ``region:R``, ``backoff:Z``) for ``seconds``; the reason as
        shown, with the time (UTC) the block ends."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(self.wall() + seconds))
        shown = f"{reason}; blocked until {stamp}"
        with self._lock:
            self._until[key] = (self.clock() + seconds, shown)
        return shown

    def back_off(self, zone: str, reason: str, base: float, cap: float) -> str:
        """A create failed in ``zone``: block it for ``base * 2**k`` seconds (at most ``cap``),
        ``k`` being its failures in a row before this one."""
        with self._lock:
            k = self._failures.get(zone, 0)
            self._failures[zone] = k + 1
        seconds = min(base * 2 ** min(k, 40), cap)
        n = "1 failed create" if k == 0 else f"{k + 1} failed creates in a row"
        return self.block(f"backoff:{zone}", f"{reason} ({n} in {zone}: backing off "
                          f"{seconds:.0f} s)", seconds)  # fmt: skip

    def succeeded(self, zone: str) -> None:
        """A create in ``zone`` came up: its next failure backs off from the start again."""
        with self._lock:
            self._failures.pop(zone, None)

    def failures(self, zone: str) -> int:
        with self._lock:
            return self._failures.get(zone, 0)

    def reason(self, zone: str) -> str | None:
        """Why ``zone`` is blocked (its own block, its region's or its backoff; the one that
        lasts longest), or None."""
        now = self.clock()
        keys = (f"zone:{zone}", f"region:{region_of(zone)}", f"backoff:{zone}")
        with self._lock:
            found = [self._until.get(key, (0.0, "")) for key in keys]
        live = [(until, why) for until, why in found if until > now]
        return max(live)[1] if live else None


class CloudRunner(Runner):
    """Shared flow; subclasses say how to list, create, read states and delete."""

    api_env = ""  # BASTION_*_API_ENDPOINT
    resource_noun = "resource"  # what one attempt occupies, for the job's history

    def __init__(self, settings: Mapping[str, Any], client: Any = None) -> None:
        self.root = str(settings.get("root") or "")
        self.project = str(settings.get("project") or "")
        self.zones = [str(z) for z in settings.get("zones") or []]
        if not (self.root and self.project and self.zones):
            raise RunnerError(f"the {self.kind} runner needs settings root, project and zones")
        self.settings = dict(settings)
        self.tag = root_tag(self.root)
        self.store = Store(self.root)
        self.spot = bool(settings.get("spot", False))
        self.heartbeat_timeout = float(settings.get("heartbeat_timeout", 120))
        self.zone_block_seconds = float(settings.get("zone_block_seconds", 600))
        self.backoff_seconds = float(settings.get("backoff_seconds", 30))
        self.backoff_max_seconds = float(settings.get("backoff_max_seconds", 1800))
        self.num_retries = int(settings.get("num_retries", 5))
        self.listing_ttl = float(settings.get("listing_ttl", LISTING_TTL))
        self.flush_seconds = float(settings.get("flush_seconds", 45))
        self.start_timeout = float(settings.get("start_timeout_seconds", 900))
        self.page_size = int(settings.get("page_size", 500))
        self.endpoint = settings.get("api_endpoint") or os.environ.get(self.api_env) or None
        self.client = client or self._build(settings.get("credentials"))
        self.blocks = Blocks()
        self.sleep: Callable[[float], None] = time.sleep  # tests make backoff instant
        self._listings: dict[str, tuple[float, dict[str, dict]]] = {}
        self._zone_locks = {z: threading.Lock() for z in self.zones}
        self._records: dict[str, RemoteRecords] = {}
        self._agent_listing: tuple[float, dict[tuple[str, str], dict[str, ObjectInfo]]] = (
            float("-inf"), {})  # fmt: skip
        self._agents_lock = threading.Lock()
        self._per_cycle = False  # set once a daemon drives the cycles (begin_cycle)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._ended_at: dict[str, float] = {}  # attempt -> when its end was first seen
        self._stopped: set[str] = set()  # attempts we asked to stop (their end is ours)
        self._failed_creates: set[str] = set()  # attempts whose failed create was counted
        self._created: dict[str, float | None] = {}  # attempt -> its provisioning record's time
        self._package_url: str | None = None
        self._up_at: dict[str, float] = {}  # attempt -> when this daemon first saw it up
        self._not_started: dict[str, Observation] = {}  # attempts failed by start_timeout

    # -- subclass hooks ----------------------------------------------------------------------
    @abc.abstractmethod
    def _build(self, credentials: str | None) -> Any: ...

    @abc.abstractmethod
    def _list_zone(self, zone: str) -> list[dict]:
        """Every resource of this root in ``zone`` (all pages): raw API dicts."""

    @abc.abstractmethod
    def _create(self, attempt: Attempt, zone: str, workers: int) -> str | None:
        """Issue the create call (no retry of quota errors); the operation's name."""

    @abc.abstractmethod
    def _workers(self, attempt: Attempt) -> int: ...

    @abc.abstractmethod
    def _quota_reason(self, error: HttpError) -> str | None:
        """The quota named by a create error, or None when it is not a quota error."""

    # -- API plumbing ------------------------------------------------------------------------
    def execute(self, request: Any, retries: int | None = None) -> Any:
        """googleapiclient retries 429/5xx with exponential backoff, bounded by ``retries``.

        httplib2 is not thread-safe and the daemon polls, starts and deletes from a thread
        pool: a shared connection mixes answers up or hangs. Each thread gets its own
        connection (same credentials), with googleapiclient's default timeout."""
        request._sleep = self.sleep
        http = getattr(self._local, "http", None)
        if http is None:
            creds = getattr(request.http, "credentials", None)
            http = build_http() if creds is None else AuthorizedHttp(creds, http=build_http())
            self._local.http = http
        return request.execute(
            http=http, num_retries=self.num_retries if retries is None else retries
        )

    def begin_cycle(self) -> None:
        """From now on listings last exactly one cycle: each zone and the agents' records are
        listed once per cycle, however long it takes (a time-to-live either lists twice in a
        slow cycle or reuses a stale listing in the next quick one)."""
        with self._lock:
            self._per_cycle = True
            self._listings.clear()
            self._agent_listing = (float("-inf"), {})

    def _stale(self, at: float) -> bool:
        if at == float("-inf"):
            return True
        return not self._per_cycle and time.monotonic() - at > self.listing_ttl

    def listing(self, zone: str, fresh: bool = False) -> dict[str, dict]:
        """The zone's resources by short name, listed once per cycle (without a daemon: at
        most once per ``listing_ttl``) for all callers (concurrent polls of one zone wait for
        one call instead of making their own)."""
        with self._zone_locks.setdefault(zone, threading.Lock()):
            at, items = self._listings.get(zone, (float("-inf"), {}))
            if fresh or self._stale(at):
                found = self._list_zone(zone)
                items = {r["name"].rsplit("/", 1)[-1]: r for r in found if self._ours(r)}
                self._listings[zone] = (time.monotonic(), items)
            return items

    def invalidate(self, zone: str) -> None:
        self._listings.pop(zone, None)

    def current(self, handle: Handle) -> dict | None:
        """The attempt's resource as its zone's listing shows it, None once gone. A daemon's
        deletes read the cycle's listing (a listing made after the last cycle's delete calls
        had come back, so absent means deleted): a thousand jobs ending cost a thousand delete
        calls and no ``get`` each. Without a daemon driving cycles, a fresh listing."""
        return self.listing(handle["zone"], fresh=not self._per_cycle).get(handle["name"])

    def deleted(self, zone: str) -> None:
        """A delete call was made in ``zone``: without a daemon the next look lists afresh;
        with one, the next cycle's listing shows it (re-listing the zone after each of a
        thousand deletes would be a listing per job)."""
        if not self._per_cycle:
            self.invalidate(zone)

    def _labels(self, resource: dict) -> dict[str, str]:
        """The labels that say whose the listed resource is."""
        return resource.get("labels") or {}

    def _ours(self, resource: dict) -> bool:
        """Whether the listed resource is an attempt of this runner: labelled with this root,
        with this runner's kind, and with an attempt name that is the resource's own name (a
        node a queued resource made for an attempt carries that attempt's labels under a
        name of its own: it is a part of the attempt, which another runner owns, never an
        attempt of this one). Never a daemon's own VM (``bastion-role``, :mod:`bastion.vm`).

        Resources made before the runner label existed (an older daemon) have no
        ``bastion-runner``: :meth:`_legacy_ours` decides from what the API says of them."""
        labels = self._labels(resource)
        if labels.get("bastion-root") != self.tag or labels.get("bastion-role"):
            return False
        kind = labels.get(RUNNER_LABEL)
        if kind is None:
            return self._legacy_ours(resource)
        attempt = labels.get(ATTEMPT_LABEL)
        return kind == self.kind and attempt in (None, resource["name"].rsplit("/", 1)[-1])

    def _legacy_ours(self, resource: dict) -> bool:
        """A resource of this root without a runner label (made by an older daemon): ours
        when the API's own fields do not say another runner made it (see the subclasses)."""
        return True

    def find(self, name: str, zones: list[str] | None = None) -> tuple[str, dict] | None:
        for zone in zones or self.zones:
            if (found := self.listing(zone).get(name)) is not None:
                return zone, found
        return None

    # -- start -------------------------------------------------------------------------------
    def start(self, attempt: Attempt) -> Handle:
        """Adopt the attempt if it exists in any zone; else create it in the first unblocked
        zone (the recorded one first), writing the provisioning record before the call."""
        workers = self._workers(attempt)
        record = self.store.read_provision(attempt.job, attempt.name) or {}
        zones = list(self.zones)
        if record.get("zone") in zones:
            zones.remove(record["zone"])
            zones.insert(0, record["zone"])
        if (found := self.find(attempt.name, zones)) is not None:
            handle = self._handle(attempt.job, attempt.name, found[0], workers, record.get("op"))
            return self._created_at(handle, record.get("time"))
        reasons = []
        for zone in zones:
            if (why := self.blocks.reason(zone)) is not None:
                reasons.append(why)
                continue
            created = time.time()
            self.store.write_provision(attempt.job, attempt.name, {
                "kind": self.kind, "name": attempt.name, "zone": zone, "workers": workers,
                "root_tag": self.tag, "time": created})  # fmt: skip
            self._check_term(attempt)
            try:
                op = self._create_with_retries(attempt, zone, workers)
            except HttpError as e:
                if e.status_code == 409:  # ours already (a lost answer, a phantom 409): adopt
                    self.invalidate(zone)
                    handle = self._handle(attempt.job, attempt.name, zone, workers, None)
                    return self._created_at(handle, created)
                if (quota := self._quota_reason(e)) is not None:
                    why = f"quota {quota} exhausted in region {region_of(zone)} (zone {zone})"
                    self.blocks.block(f"region:{region_of(zone)}", why, self.zone_block_seconds)
                    reasons.append(why)
                    continue
                if retryable(e):
                    raise TryAgain(f"creating {attempt.name} in {zone}: {e}") from e
                raise RunnerError(f"cannot create {attempt.name} in {zone}: {e}") from e
            self.invalidate(zone)
            self.store.write_provision(attempt.job, attempt.name, {
                "kind": self.kind, "name": attempt.name, "zone": zone, "workers": workers,
                "root_tag": self.tag, "time": created, "op": op})  # fmt: skip
            handle = self._handle(attempt.job, attempt.name, zone, workers, op)
            return self._created_at(handle, created)
        raise NoCapacity("waiting for capacity: " + "; ".join(dict.fromkeys(reasons)))

    @staticmethod
    def _created_at(handle: Handle, created: float | None) -> Handle:
        """The handle carries when its create was issued (wall clock, the daemon's): the
        deadlines of :mod:`bastion.runners.queued` and :mod:`bastion.runners.gce` count
        from it without a request per poll."""
        if created is not None:
            handle["created"] = created
        return handle

    def created(self, handle: Handle) -> float | None:
        """When the attempt's create was issued: the handle's ``created``, else (a handle
        from before it had one) its provisioning record's time, read once."""
        if handle.get("created") is not None:
            return float(handle["created"])
        name = handle["name"]
        with self._lock:
            if name in self._created:
                return self._created[name]
        record = self.store.read_provision(handle["job"], name) or {}
        found = float(record["time"]) if record.get("time") is not None else None
        with self._lock:
            self._created[name] = found
        return found

    def _check_term(self, attempt: Attempt) -> None:
        """The cloud APIs take no fencing token, so the lease itself is read just before a
        create: a daemon that froze mid-start and resumes after a newer one took over (and
        perhaps ran and deleted this very attempt) is refused here instead of recreating the
        node. What is left is the instant between this read and the call; a node made in it
        belongs to no live attempt and the successor's sweep deletes it."""
        if attempt.fence <= 0:
            return
        found = self.store.read_lease()
        term = int((found[0] if found else {}).get("term") or 0)
        if term > attempt.fence:
            raise Fenced(f"lease term {term} is newer than this daemon's {attempt.fence}: "
                         f"not creating {attempt.name}")  # fmt: skip

    def _create_with_retries(self, attempt: Attempt, zone: str, workers: int) -> str | None:
        """Creates are retried here, not by googleapiclient: a 429 that names a quota must not
        be repeated (it is a block, not a rate limit). A retried create is safe: the name (TPU)
        or the requestId (GCE) makes a repeat a 409 or the same operation."""
        for retry in range(self.num_retries + 1):
            try:
                return self._create(attempt, zone, workers)
            except HttpError as e:
                if (not retryable(e) or self._quota_reason(e) is not None
                        or retry == self.num_retries):  # fmt: skip
                    raise
                self.sleep(min(2**retry, 30) * 0.5)
        raise AssertionError("unreachable")

    def capacity(self, attempt: Attempt) -> tuple[str, str | None]:
        """("spot" | "on-demand" | "reserved", reservation name or None) for the attempt: its
        own options first, then the ``tiers`` setting for its tier, then ``spot``."""
        options = attempt.options
        if options.get("reservation"):
            return "reserved", str(options["reservation"])
        if "spot" in options:
            return ("spot" if options["spot"] else "on-demand"), None
        tiers = {str(k): str(v) for k, v in (self.settings.get("tiers") or {}).items()}
        said = tiers.get(str(attempt.tier)) if attempt.tier is not None else None
        if said is None:
            return ("spot" if self.spot else "on-demand"), None
        if said.startswith("reservation:"):
            return "reserved", said.split(":", 1)[1]
        if said not in ("spot", "on-demand", "reserved"):
            raise RunnerError(
                f"runner {self.kind}: tiers.{attempt.tier} = {said!r} is not spot, on-demand, "
                "reserved or reservation:<name>; fix the daemon's runner settings"
            )
        return said, None

    def is_spot(self, attempt: Attempt) -> bool:
        return self.capacity(attempt)[0] == "spot"

    def _handle(self, job: str, name: str, zone: str, workers: int, op: str | None) -> Handle:
        return {"name": name, "job": job, "zone": zone, "workers": workers, "op": op}

    # -- the agents' records -----------------------------------------------------------------
    def records(self, handle: Handle) -> RemoteRecords:
        with self._lock:
            found = self._records.get(handle["name"])
            if found is None:
                found = RemoteRecords(self.store, handle["job"], handle["name"],
                                      int(handle["workers"]), self.heartbeat_timeout)  # fmt: skip
                self._records[handle["name"]] = found
            return found

    def agent_listing(self) -> dict[tuple[str, str], dict[str, ObjectInfo]]:
        """Every live attempt's agent records, listed at most once per ``listing_ttl`` for all
        polls (one listing of ``ROOT/agents/`` per cycle, whatever the number of jobs)."""
        with self._agents_lock:
            at, found = self._agent_listing
            if self._stale(at):
                found = self.store.list_agents()
                self._agent_listing = (time.monotonic(), found)
            return found

    def _attempt_records(self, handle: Handle) -> dict[str, ObjectInfo]:
        return self.agent_listing().get((handle["job"], handle["name"]), {})

    def agents(self, handle: Handle) -> Observation | None:
        """What the agents say (None: none started yet)."""
        return self.records(handle).observe(self._attempt_records(handle), time.time())

    def gone(self, handle: Handle, why: str) -> Observation:
        """The machines are gone (or going) without a preemption: what the agents reported
        if they all finished, else LOST (requeued as a new attempt)."""
        seen = self.agents(handle)
        if seen is not None and seen.finished and seen.phase is not Phase.LOST:
            return seen
        return Observation(Phase.LOST, why, retryable=True)

    def preempted(self, handle: Handle, why: str) -> Observation:
        """Preempted: not the job's failure, unless every worker had already succeeded."""
        return self.ended(handle, Observation(Phase.PREEMPTED, why, retryable=True))

    def ended(self, handle: Handle, outcome: Observation) -> Observation:
        """The cloud ended the machines (a preemption, a dead man's switch): ``outcome``,
        unless every worker had already succeeded.

        The agents flush their last output and exit records within the spot window, after
        the cloud already says so; the daemon reads the log to its end once an attempt is
        finished and never again, so the attempt is reported finished only once every
        started worker has its exit record, or ``flush_seconds`` after the end was seen."""
        name = handle["name"]
        seen = self.agents(handle)
        if seen is not None and seen.phase is Phase.SUCCEEDED:
            return seen
        if seen is not None and not self._flushed(handle):
            first = self._ended_at.setdefault(name, time.monotonic())
            if time.monotonic() - first < self.flush_seconds:
                return Observation(Phase.RUNNING, f"{outcome.reason}; the agents are flushing",
                                   workers=seen.workers)  # fmt: skip
        self._ended_at.pop(name, None)
        return outcome

    def _flushed(self, handle: Handle) -> bool:
        listing = self._attempt_records(handle)
        started = [w for w in range(int(handle["workers"]))
                   if Store.run_name(w, "started") in listing]  # fmt: skip
        return all(Store.run_name(w, "exit") in listing for w in started)

    def stockout(self, handle: Handle, message: str) -> Observation:
        zone = handle["zone"]
        self.blocks.block(f"zone:{zone}", f"stockout in {zone}", self.zone_block_seconds)
        return Observation(Phase.FAILED, f"stockout in {zone}: {message}", retryable=True)

    def create_failed(
        self, handle: Handle, why: str, phase: Phase = Phase.FAILED, brief: str | None = None
    ) -> Observation:
        """The attempt's create failed in its zone for a reason that may pass (neither a
        stockout nor a quota): ``phase`` (FAILED, or PREEMPTED while creating), retryable, and
        the zone backs off exponentially (:meth:`Blocks.back_off`), so that the daemon's new
        attempt tries the next zone and, once every zone is blocked, waits instead of making
        create calls in a loop. Counted once per attempt, however often it is polled; not at
        all when we stopped the attempt ourselves (a create cut short by our own delete).
        ``brief``: the block's reason, when the first 200 characters of ``why`` would not do."""
        zone, name = handle["zone"], handle["name"]
        with self._lock:
            count = name not in self._failed_creates and name not in self._stopped
            self._failed_creates.add(name)
        if count:
            self.blocks.back_off(zone, brief or _brief(why), self.backoff_seconds,
                                 self.backoff_max_seconds)  # fmt: skip
        return Observation(phase, why, retryable=True)

    def came_up(self, handle: Handle) -> None:
        """The attempt's machines are up and every worker started: creates work in its zone."""
        self.blocks.succeeded(handle["zone"])

    def up(self, handle: Handle) -> Observation:
        """The attempt's machines are up (READY, RUNNING, ACTIVE): what its agents say, and
        "waiting for workers to start (k of N)" while some have not said ``started``.

        A worker that never starts (its startup script failed: an image whose Python cannot
        run the agent, a package install that failed or hangs) would otherwise hold the
        machines and the quota forever with nothing running: ``start_timeout`` seconds after
        this daemon first saw the machines up, the attempt fails (:meth:`not_started`)."""
        name, n = handle["name"], int(handle["workers"])
        with self._lock:
            failed = self._not_started.get(name)
            first = self._up_at.setdefault(name, time.monotonic())
        if failed is not None:
            return failed
        seen = self.agents(handle)
        if seen is not None and seen.finished:
            return seen
        listing = self._attempt_records(handle)
        waiting = [w for w in range(n) if Store.run_name(w, "started") not in listing]
        if not waiting and seen is not None:
            self.came_up(handle)
            return seen
        if time.monotonic() - first > self.start_timeout:
            return self.not_started(handle, waiting)
        return Observation(Phase.RUNNING, f"waiting for workers to start ({n - len(waiting)} "
                           f"of {n})", workers=seen.workers if seen else ())  # fmt: skip

    def not_started(self, handle: Handle, waiting: list[int]) -> Observation:
        """FAILED, retryable (a new attempt may land on a healthy host; the zone backs off,
        so a broken image costs a bounded rate of attempts, not a hot loop), naming the first
        silent worker, the last lines its startup script printed, and what to fix."""
        w, job = waiting[0], handle["job"]
        who = (f"worker {w}" if len(waiting) == 1
               else f"workers {', '.join(map(str, waiting))}")  # fmt: skip
        brief = (f"{who} did not start within {self.start_timeout:g} s of its "
                 f"{self.resource_noun} coming up: fix its startup (the {self.kind} runner "
                 "settings python, image / runtime_version, package_url) or raise "
                 "start_timeout_seconds")  # fmt: skip
        said = self.startup_output(handle, w)
        why = brief + (f"; worker {w}'s startup script printed: {said}" if said
                       else f"; worker {w} left no startup output")  # fmt: skip
        why += f" (all of it: bastion logs {job} --worker={w})"
        seen = self.create_failed(handle, why, brief=brief)
        with self._lock:
            self._not_started[handle["name"]] = seen
        return seen

    def startup_output(self, handle: Handle, worker: int) -> str | None:
        """The last lines the worker's startup script printed, as one line: what the script
        copied to the bucket (:func:`bastion.runners.startup.bootstrap_lines`)."""
        try:
            data = self.store.read_bootstrap(handle["job"], handle["name"], worker)
        except OSError:
            return None
        return last_lines(data.decode(errors="replace")) if data else None

    def transient(self, handle: Handle, state: str, detail: str = "") -> Observation:
        """A state between create and delete other than up (a TPU node REPAIRING after a
        maintenance event, RESTARTING, ...): the agents' word once any started (a worker that
        stays silent is lost after ``heartbeat_timeout``), else PROVISIONING."""
        what = f"{self.resource_noun} {state}{f' ({detail})' if detail else ''} in {handle['zone']}"
        seen = self.agents(handle)
        if seen is None:
            return Observation(Phase.PROVISIONING, what)
        if seen.finished:
            return seen
        return Observation(Phase.RUNNING, f"{seen.reason}; {what}", workers=seen.workers)

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        """Worker 0's output (the job's log), from the cycle's listing of the records."""
        return self.records(handle).read_output(
            offset, limit, worker=0, listing=self._attempt_records(handle)
        )

    def describe(self, handle: Handle) -> str | None:
        zone = handle.get("zone")
        where = f" in {zone}" if zone else ""
        n = int(handle.get("workers", 1))
        return f"{self.resource_noun} {handle['name']} ({n} worker{'' if n == 1 else 's'}){where}"

    def stop(self, handle: Handle, deadline: float) -> None:
        """Delete the resource: the VMs' shutdown gives every agent SIGTERM, and it flushes.
        The attempt's end is ours from now on (no backoff, no dead man's switch)."""
        with self._lock:
            self._stopped.add(handle["name"])
        resource = self.listing(handle["zone"]).get(handle["name"])
        if resource is not None and not self._going(resource):
            self._request_delete(handle)

    def delete(self, handle: Handle) -> bool:
        """Delete the resource; once it is verified gone (absent from the zone's listing, see
        :meth:`current`), its agents' records too (their output stays). A handle without a
        zone stands for records alone (see list_owned)."""
        if handle.get("zone"):
            resource = self.current(handle)
            if resource is not None:
                if not self._going(resource):
                    self._request_delete(handle)
                return False
        self.store.delete_agent_records(handle["job"], handle["name"])
        self.forget(handle["name"])
        return True

    @abc.abstractmethod
    def _going(self, resource: dict) -> bool:
        """The listed resource is being deleted already (no second delete call)."""

    @abc.abstractmethod
    def _request_delete(self, handle: Handle) -> None:
        """One delete call (a 404 is fine), then :meth:`deleted`."""

    def list_owned(self) -> list[Owned]:
        """The resources in every zone, plus attempts whose agents' records outlived their
        resource (a daemon that died between the two deletions): the sweep deletes those."""
        owned = self._list_resources()
        names = {item.name for item in owned}
        for (job, name), records in self.agent_listing().items():
            if name not in names and name.startswith(name_prefix(self.root)):
                workers = 1 + max((p[0] for r in records if (p := Store.parse_run_name(r))),
                                  default=0)  # fmt: skip
                owned.append(Owned(name, self._handle(job, name, "", workers, None), True))
        return owned

    @abc.abstractmethod
    def _list_resources(self) -> list[Owned]:
        """Every resource of this root in the configured zones."""

    def owned(self, resource: dict, zone: str, workers: int, finished: bool) -> Owned:
        """The item the sweep sees: named after the attempt (its label, which :meth:`_ours`
        holds equal to the resource's name; a legacy resource's own name)."""
        name = resource["name"].rsplit("/", 1)[-1]
        name = self._labels(resource).get(ATTEMPT_LABEL) or name
        job = self.job_of(resource) or name
        return Owned(name, self._handle(job, name, zone, workers, None), finished)

    @abc.abstractmethod
    def job_of(self, resource: dict) -> str | None:
        """The full job name (kept in metadata: labels hold only a slug)."""

    def script(self, attempt: Attempt, workers: int, extra_args: Sequence[str] = ()) -> str:
        """The startup script; ``extra_args`` go to the agent (e.g. ``--num_slices``)."""
        return startup.script(
            root=self.root, job=attempt.job, attempt=attempt.name, num_workers=workers,
            command=attempt.command, env=attempt.env,
            python=str(self.settings.get("python") or "python3"),
            package_url=self.package_url(),
            bootstrap_url=self.store.bootstrap_url(attempt.job, attempt.name),
            agent_args=list(self.settings.get("agent_args") or []) + list(extra_args)
            + ([f"--bundle={json.dumps(dict(attempt.bundle), sort_keys=True)}"]
               if attempt.bundle else []),
        )  # fmt: skip

    def package_url(self) -> str | None:
        """``package_url`` from the settings, else the daemon's own code published into the
        root once (content-addressed; see :mod:`bastion.runners.startup`), unless
        ``publish_package`` is false."""
        if self.settings.get("package_url") or not self.settings.get("publish_package", True):
            return self.settings.get("package_url")
        with self._lock:
            if self._package_url is None:
                self._package_url = self.store.put_package(*startup.package_wheel())
            return self._package_url

    def forget(self, name: str) -> None:
        with self._lock:
            self._records.pop(name, None)
            self._stopped.discard(name)
            self._failed_creates.discard(name)
            self._created.pop(name, None)
            self._ended_at.pop(name, None)
            self._up_at.pop(name, None)
            self._not_started.pop(name, None)

    def close(self) -> None:
        with self._lock:
            self._records.clear()
