"""The TPU queued-resource runner (kind ``tpu-qr``): one ``queuedResources`` request per attempt.

Queued resources are how to wait for scarce capacity (the request waits in the zone's queue
instead of failing on a stockout) and the only way to get several slices at once (per-job
option ``num_replicas``). Everything else is the TPU VM runner's
(:mod:`bastion.runners.google.tpu`): the node body, labels, startup script, agents' records,
one listing per zone per cycle.

Create: ``queuedResources.create(queuedResourceId=<attempt name>, requestId=uuid5(...))`` with
one ``tpu.nodeSpec``: for one slice, ``nodeId`` = the attempt name; for ``num_replicas`` = N > 1,
``multisliceParams{nodeCount: N, nodeIdPrefix}`` and no ``nodeId`` (the API's rule: a node id
is for a single node; what it makes of this is one multislice, nodes ``<prefix>-0`` ...
``<prefix>-(N-1)`` with their DCN coordination, :func:`node_prefix`). One startup script
serves every slice: the agent (``--num_slices=N``) reads its slice from the TPU metadata
attribute ``tpu-env`` (``MEGASCALE_SLICE_ID``) and numbers itself ``slice * hosts +
agent-worker-number``, so every worker of every slice writes its own records, and gives the
command ``MEGASCALE_*`` and ``BASTION_SLICE`` / ``BASTION_NUM_SLICES`` (:mod:`bastion.agent`).
The queued resource stays the unit this runner owns, polls and deletes; its nodes carry the
attempt's labels (runner ``tpu-qr``), so the ``tpu`` runner never takes them for its own.
Queued resources an older daemon made (one ``nodeSpec`` per slice, ids ``<name>-s<i>``, no
runner label) are still adopted, polled, counted (workers: every spec's hosts times its
``nodeCount``) and deleted the same way. ``spot{}`` for spot jobs, else
``guaranteed{}`` when the settings or options say ``guaranteed`` (``reservation``: a
``reservationName``), and ``queueingPolicy.validUntilDuration`` = ``queue_seconds`` (setting
or option; default 3600), the deadline after which the service fails the request. A retried
create is deduplicated by its ``requestId`` (same operation) or answers 409 (adopted).

Poll, from the zone's listing of queued resources (one call per zone per cycle):

- CREATING / ACCEPTED / WAITING_FOR_RESOURCES: QUEUED, "waiting for capacity in ZONE"; past
  a client-side deadline, ``queue_seconds`` + ``queue_margin_seconds`` (setting, default 300)
  after the create was issued (the handle's ``created``; the handle's ``queue_seconds``, fixed at
  start), FAILED, retryable, "queued resource
  waited past its deadline of N s in ZONE": a service that never expires the request (or
  forgets it in ACCEPTED) cannot hold the job forever;
- PROVISIONING: PROVISIONING; ACTIVE: the agents' records (all slices' workers), with the
  TPU runner's deadline for every worker to start (``start_timeout_seconds``);
- FAILED (e.g. past its validUntil): FAILED, retryable, with ``failedData.error``'s message;
  a capacity failure (code 8/9) blocks the zone like a stockout; any other failure, and the
  client-side deadline, back the zone off exponentially
  (:class:`bastion.runners.kit.failover.Failover`); either way the next attempt (the
  daemon requeues it) tries the next zone, and waits when every zone is blocked;
- SUSPENDING / SUSPENDED by the SERVICE: PREEMPTED (after the agents' last flush); by the
  USER, or DELETING, or absent: what the agents reported, or LOST.

Stop and delete: ``delete(force=true)`` (nodes first), re-issued while not DELETING; delete is
True once ``get`` answers 404.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any

from googleapiclient.errors import HttpError

from bastion.runners.base import MAX_ATTEMPT_NAME, Attempt, AttemptPhase, Handle, Observation
from bastion.runners.google.api import GoogleApi, quota_failure
from bastion.runners.google.gce import request_id
from bastion.runners.google.tpu import accelerator_type, hosts, node_body, parent, tpu_client
from bastion.runners.google.zonal import ZonalConfig, ZonalProvisioner, ZonalRunner

_WAITING = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "STATE_UNSPECIFIED"})
_ENDED = frozenset({"FAILED", "SUSPENDING", "SUSPENDED", "DELETING"})
_CAPACITY_CODES = frozenset({8, 9})


def node_prefix(name: str, slices: int) -> str:
    """The ``multisliceParams.nodeIdPrefix`` of an attempt of ``slices`` slices: the attempt's
    name when its nodes ``<prefix>-0 ... <prefix>-(slices-1)`` fit in 63 characters, else
    its head and a hash of the whole name (distinct attempts keep distinct prefixes)."""
    room = MAX_ATTEMPT_NAME - len(f"-{slices - 1}")
    if len(name) <= room:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name[: room - 9].rstrip('-')}-{digest}"


def from_settings(settings: Mapping[str, Any]) -> QueuedRunner:
    return QueuedRunner(settings)


def _node(qr: dict) -> dict:
    specs = (qr.get("tpu") or {}).get("nodeSpec") or [{}]
    return specs[0].get("node") or {}


def _slices(options: Mapping[str, Any]) -> int:
    return max(1, int(options.get("num_replicas", 1)))


class QueuedResources:
    """The ``tpu-qr`` runner's provider: ``projects.locations.queuedResources``."""

    noun = "queued resource"

    def __init__(self, config: ZonalConfig, api: GoogleApi) -> None:
        self.config, self.api = config, api
        self.queue_margin = float(config.settings.get("queue_margin_seconds", 300))

    def _option(self, attempt: Attempt, key: str, default: Any = None) -> Any:
        return attempt.options.get(key, self.config.settings.get(key, default))

    def list_zone(self, zone: str) -> list[dict]:
        qrs = self.api.client.queuedResources()
        return self.api.paginate(
            lambda token: qrs.list(
                parent=parent(self.config, zone), pageSize=self.config.page_size, pageToken=token
            ),
            "queuedResources",
        )

    def labels(self, resource: dict) -> dict[str, str]:
        """A queued resource has no labels of its own: its node template's say whose it is."""
        return _node(resource).get("labels") or {}

    def job_of(self, resource: dict) -> str | None:
        return (_node(resource).get("metadata") or {}).get("bastion-job-name")

    def workers(self, attempt: Attempt) -> int:
        return hosts(accelerator_type(attempt.options)) * _slices(attempt.options)

    def extra(self, attempt: Attempt) -> dict[str, Any]:
        """The request's ``queue_seconds``, for the client-side deadline (:meth:`poll`)."""
        return {"queue_seconds": int(self._option(attempt, "queue_seconds", 3600))}

    def create(
        self, flow: ZonalProvisioner, attempt: Attempt, zone: str, workers: int
    ) -> str | None:
        slices = _slices(attempt.options)
        spec: dict[str, Any] = {"parent": parent(self.config, zone)}
        if slices == 1:
            spec["nodeId"] = attempt.name
            script = flow.script(attempt, workers)
        else:  # one multislice: the API makes <prefix>-0 ... and sets up their DCN mesh
            spec["multisliceParams"] = {
                "nodeCount": slices,
                "nodeIdPrefix": node_prefix(attempt.name, slices),
            }
            script = flow.script(attempt, workers, [f"--num_slices={slices}"])
        spec["node"] = node_body(flow, attempt, script)
        body: dict[str, Any] = {
            "tpu": {"nodeSpec": [spec]},
            "queueingPolicy": {
                "validUntilDuration": f"{int(self._option(attempt, 'queue_seconds', 3600))}s"
            },
        }
        kind, reservation = flow.capacity(attempt)
        reservation = reservation or self.config.settings.get("reservation")
        if kind == "spot":
            body["spot"] = {}
        elif self._option(attempt, "guaranteed") or kind == "reserved":
            body["guaranteed"] = {}  # v2 has no guaranteed.reserved: the reservation's name says
            spec["node"].pop("schedulingConfig", None)  # it breaks queued resources
        if reservation and kind != "spot":
            body["reservationName"] = str(reservation)
        request = self.api.client.queuedResources().create(
            parent=parent(self.config, zone),
            queuedResourceId=attempt.name,
            requestId=request_id(self.config.root, attempt.name, "create"),
            body=body,
        )
        return self.api.execute(request, retries=0).get("name")

    def quota_reason(self, error: HttpError) -> str | None:
        return quota_failure(error)

    # -- poll ----------------------------------------------------------------------------------
    def poll(self, flow: ZonalProvisioner, handle: Handle) -> Observation:
        zone, name = handle["zone"], handle["name"]
        qr = flow.listing(zone).get(name)
        if qr is None:
            return flow.channel.gone(handle, f"queued resource {name} is gone from {zone}")
        st = qr.get("state") or {}
        state = st.get("state", "STATE_UNSPECIFIED")
        if state in _WAITING:
            queue_seconds = int(
                handle.get("queue_seconds") or self.config.settings.get("queue_seconds", 3600)
            )
            created = flow.created(handle)
            if created is not None and time.time() > created + queue_seconds + self.queue_margin:
                return flow.create_failed(
                    handle,
                    f"queued resource waited past its deadline of {queue_seconds} s in {zone}",
                )
            return Observation(AttemptPhase.QUEUED, f"waiting for capacity in {zone}")
        if state == "PROVISIONING":
            return Observation(AttemptPhase.PROVISIONING, f"provisioning in {zone}")
        if state == "ACTIVE":
            return flow.up(handle)
        if state == "FAILED":
            error = (st.get("failedData") or {}).get("error") or {}
            message = str(error.get("message") or "queued resource failed")
            if error.get("code") in _CAPACITY_CODES:
                return flow.stockout(handle, message)
            return flow.create_failed(
                handle,
                f"queued resource failed in {zone}: error code {error.get('code')}: {message}",
            )
        if state in ("SUSPENDING", "SUSPENDED") and st.get("stateInitiator") == "SERVICE":
            return flow.channel.preempted(handle, f"queued resource {name} {state} by the service")
        return flow.channel.gone(handle, f"queued resource {name} {state}")

    # -- delete, list --------------------------------------------------------------------------
    def going(self, resource: dict) -> bool:
        return (resource.get("state") or {}).get("state") == "DELETING"

    def request_delete(self, handle: Handle) -> None:
        name = f"{parent(self.config, handle['zone'])}/queuedResources/{handle['name']}"
        self.api.delete(self.api.client.queuedResources().delete(name=name, force=True))

    def inventory(self, resource: dict) -> tuple[int, bool]:
        specs = (resource.get("tpu") or {}).get("nodeSpec") or []
        workers = sum(
            hosts(s.get("node", {}).get("acceleratorType", "v4-8"))
            * int((s.get("multisliceParams") or {}).get("nodeCount", 1))
            for s in specs
        )
        return max(1, workers), (resource.get("state") or {}).get("state") in _ENDED


class QueuedRunner(ZonalRunner):
    """Kind ``tpu-qr``: :class:`QueuedResources` in the zonal flow (no behaviour of its own)."""

    kind = "tpu-qr"

    def __init__(self, settings: Mapping[str, Any], client: Any = None) -> None:
        super().__init__(
            self.kind, settings, "BASTION_TPU_API_ENDPOINT", tpu_client, QueuedResources, client
        )
